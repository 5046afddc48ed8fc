"""The model registry file: which policies exist, at which version, with which skill.

    models = load_models(DEFAULT_MODELS_PATH)        # list[ModelConfig], in file order
    policy = models[0].make_policy()
    event_params = models[0].params()                 # dict[str, str] for ModelRegistered.params
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from producers.sim.exceptions import ModelConfigError
from producers.sim.policies import POLICY_KINDS, OracleScripted, Policy, ScriptedPolicy, Skill

DEFAULT_MODELS_PATH = Path(__file__).parent / "configs" / "models.yaml"
_KEYS = {"model_id", "version", "kind", "description", "skill"}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    model_id: str
    version: str
    kind: str  # one of policies.POLICY_KINDS
    skill: Skill
    description: str = ""

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
    missing, unknown = _KEYS - {"description"} - set(raw), set(raw) - _KEYS
    if missing or unknown:
        raise ModelConfigError(f"{where}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
    skill_raw = raw["skill"]
    if not isinstance(skill_raw, dict):
        raise ModelConfigError(f"{where}: skill must be a mapping, got {skill_raw!r}")
    try:
        skill = Skill(**skill_raw)
        return ModelConfig(model_id=raw["model_id"], version=raw["version"], kind=raw["kind"], skill=skill,
                           description=raw.get("description", ""))
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
    return models
