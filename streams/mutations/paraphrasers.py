"""Paraphrasers: the new instruction of the ``paraphrase`` operator (streams.mutations.operators),
from a template or an OpenAI-compatible chat model. Kept apart from the operators because the
language-model client and its fallback are their own concern; OperatorConfig.paraphraser holds one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from schemas.scenario import ScenarioSpec


class Paraphraser(Protocol):
    def paraphrase(self, spec: ScenarioSpec, rng: np.random.Generator) -> tuple[str, dict[str, str]]:
        """(new instruction, params saying how it was made)."""


_TEMPLATES = {
    "lift": ("pick up the cube", "lift the cube off the table", "grasp the cube and raise it",
             "raise the block above the table", "take hold of the cube and lift it up"),
    "hold": ("lift the cube and hold it up", "pick up the cube and keep it in the air",
             "raise the cube and hold it steady"),
    "place": ("pick up the cube and put it down at the marked spot", "lift the cube and place it at the target",
              "move the cube to the target spot on the table"),
    "Stack": ("stack the red cube on the green cube", "put the red block on top of the green one",
              "place the red cube onto the green cube"),
    "PickPlaceCan": ("put the can in its bin", "move the can into the other bin",
                     "pick up the can and drop it in its bin"),
}


def _task_kind(spec: ScenarioSpec) -> str:
    if spec.env_name != "Lift":
        return spec.env_name
    if spec.place_target_xy is not None:
        return "place"
    return "hold" if spec.success_hold_steps else "lift"


class TemplateParaphraser:
    """A template for the task, never the parent's own wording. Deterministic given the rng."""

    def paraphrase(self, spec: ScenarioSpec, rng: np.random.Generator) -> tuple[str, dict[str, str]]:
        kind = _task_kind(spec)
        options = [t for t in _TEMPLATES[kind] if t != spec.instruction.strip().lower()]
        i = int(rng.integers(len(options)))
        return options[i], {"paraphraser": "template", "template": f"{kind}:{_TEMPLATES[kind].index(options[i])}"}


@dataclass
class LLMParaphraser:
    """Paraphrases with an OpenAI-compatible chat model through an ``openai`` client (built at the
    edge and passed in). A failed, empty, overlong or unchanged answer falls back to the template,
    with ``llm_error`` saying why. Models are not deterministic: the candidate records the
    requested and served model so a difference between runs can be traced."""

    client: Any
    model: str
    timeout_s: float = 20.0
    max_chars: int = 200
    fallback: TemplateParaphraser = field(default_factory=TemplateParaphraser)

    PROMPT = ("Rewrite this instruction for a robot arm in different words, keeping exactly its meaning. "
              "Answer with the rewritten instruction only, one sentence, no quotes.")

    def paraphrase(self, spec: ScenarioSpec, rng: np.random.Generator) -> tuple[str, dict[str, str]]:
        try:
            reply = self.client.chat.completions.create(
                model=self.model, temperature=0, max_tokens=60, timeout=self.timeout_s,
                messages=[{"role": "system", "content": self.PROMPT}, {"role": "user", "content": spec.instruction}])
            choice = reply.choices[0]
            text = (choice.message.content or "").strip().strip('"').strip()
            error = None
            if not text:
                error = "empty answer"
            elif len(text) > self.max_chars:
                error = f"answer of {len(text)} characters (> {self.max_chars})"
            elif text.lower() == spec.instruction.strip().lower():
                error = "answer repeats the instruction"
            if error is None:
                return text, {"paraphraser": "llm", "model": self.model, "served_model": str(reply.model),
                              "finish_reason": str(choice.finish_reason)}
        except Exception as exc:  # any client failure is recorded, never raised into the mutator
            error = f"{type(exc).__name__}: {exc}"
        text, params = self.fallback.paraphrase(spec, rng)
        return text, {**params, "llm_model": self.model, "llm_error": error[:200]}
