"""The model registry file: which policies exist, at which version, with which skill.

    models = load_models(DEFAULT_MODELS_PATH)        # list[ModelConfig], in file order
    policy = models[0].make_policy()
    event_params = models[0].params()                 # dict[str, str] for ModelRegistered.params
    by_skill = skill_order(models)                    # model ids, best first (the ``rank`` keys)

``rank`` (optional) records a model's known true skill: 0 for the oracle, 1 for the best scripted
model, and so on. Ranked models must be strictly ordered: a larger rank is at least as bad in every
Skill component and worse in one (``Skill.at_least_as_good_as``), so "true skill" is not a matter
of weighting components. The oracle is rank 0 by definition (exact and noiseless, it never misses
a grasp, so it has no retries to compare). A model of unknown skill (an external policy) leaves
``rank`` out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from producers.sim.exceptions import ModelConfigError
from producers.sim.policies import POLICY_KINDS, OracleScripted, Policy, ScriptedPolicy, Skill

DEFAULT_MODELS_PATH = Path(__file__).parent / "configs" / "models.yaml"
_KEYS = {"model_id", "version", "kind", "description", "skill", "rank"}
_OPTIONAL_KEYS = {"description", "rank"}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    model_id: str
    version: str
    kind: str  # one of policies.POLICY_KINDS
    skill: Skill
    description: str = ""
    rank: int | None = None  # known true skill, 0 = the oracle, larger = worse; None = unknown

    def __post_init__(self) -> None:
        for name in ("model_id", "version"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip():
                raise ModelConfigError(f"{name} must be a non-empty string, got {v!r}")
        if self.kind not in POLICY_KINDS:
            raise ModelConfigError(f"model {self.model_id!r}: kind must be one of {POLICY_KINDS}, got {self.kind!r}")
        if not isinstance(self.skill, Skill):
            raise ModelConfigError(f"model {self.model_id!r}: skill must be a Skill, got {self.skill!r}")
        if self.kind == "oracle" and self.skill != Skill():
            raise ModelConfigError(f"model {self.model_id!r}: an oracle has perfect skill, got {self.skill!r}")
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int)
                                      or self.rank < 0):
            raise ModelConfigError(f"model {self.model_id!r}: rank must be a non-negative integer, got {self.rank!r}")
        if not isinstance(self.description, str):
            raise ModelConfigError(f"model {self.model_id!r}: description must be a string, "
                                   f"got {self.description!r}")

    def make_policy(self) -> Policy:
        """A fresh policy instance named after model_id."""
        if self.kind == "oracle":
            return OracleScripted(name=self.model_id)
        return ScriptedPolicy(self.skill, name=self.model_id)

    def params(self) -> dict[str, str]:
        """The skill as ModelRegistered.params (a string map)."""
        return self.skill.to_params()


def _entry(path: Path, index: int, raw: Any) -> ModelConfig:
    where = f"{path} models[{index}]"
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{where}: must be a mapping, got {raw!r}")
    missing, unknown = _KEYS - _OPTIONAL_KEYS - set(raw), set(raw) - _KEYS
    if missing or unknown:
        raise ModelConfigError(f"{where}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
    skill_raw = raw["skill"]
    if not isinstance(skill_raw, dict):
        raise ModelConfigError(f"{where}: skill must be a mapping, got {skill_raw!r}")
    try:
        skill = Skill(**skill_raw)
        return ModelConfig(model_id=raw["model_id"], version=raw["version"], kind=raw["kind"], skill=skill,
                           description=raw.get("description", ""), rank=raw.get("rank"))
    except ModelConfigError as exc:
        raise ModelConfigError(f"{where}: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ModelConfigError(f"{where}: {exc}") from exc


def load_models(path: str | Path = DEFAULT_MODELS_PATH) -> list[ModelConfig]:
    """Parses a models.yaml; refuses unknown or missing keys, bad values and duplicate model_ids."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ModelConfigError(f"cannot read {path}: {exc}") from exc
    if not isinstance(doc, dict) or set(doc) != {"models"} or not isinstance(doc["models"], list):
        raise ModelConfigError(f"{path}: expected a mapping with one key 'models' holding a list")
    models = [_entry(path, i, raw) for i, raw in enumerate(doc["models"])]
    seen: set[str] = set()
    for m in models:
        if m.model_id in seen:
            raise ModelConfigError(f"{path}: duplicate model_id {m.model_id!r}")
        seen.add(m.model_id)
    if not models:
        raise ModelConfigError(f"{path}: lists no models")
    _check_ranks(path, models)
    return models


def _check_ranks(path: Path, models: list[ModelConfig]) -> None:
    ranked = sorted((m for m in models if m.rank is not None), key=lambda m: m.rank)
    for m in ranked:
        if (m.kind == "oracle") != (m.rank == 0):
            raise ModelConfigError(f"{path}: rank 0 is the oracle's and only the oracle's, got {m.model_id!r} "
                                   f"(kind {m.kind!r}) at rank {m.rank}")
    for better, worse in zip(ranked, ranked[1:], strict=False):
        if better.rank == worse.rank:
            raise ModelConfigError(f"{path}: models {better.model_id!r} and {worse.model_id!r} share rank {worse.rank}")
        if better.kind == "oracle":
            continue  # best by definition: exact, noiseless, it has no miss to re-try
        if not better.skill.at_least_as_good_as(worse.skill) or better.skill == worse.skill:
            raise ModelConfigError(
                f"{path}: {worse.model_id!r} (rank {worse.rank}) must be worse than {better.model_id!r} "
                f"(rank {better.rank}) in no Skill component better and in one worse: "
                f"{worse.skill!r} against {better.skill!r}")


def skill_order(models: list[ModelConfig]) -> list[str]:
    """The ranked models' ids, best (lowest rank) first."""
    return [m.model_id for m in sorted((m for m in models if m.rank is not None), key=lambda m: m.rank)]
