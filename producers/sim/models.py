"""The model registry file: which policies exist, at which version, with which skill.

    models = load_models(DEFAULT_MODELS_PATH)        # list[ModelConfig], in file order
    policy = models[0].make_policy()
    event_params = models[0].params()                 # dict[str, str] for ModelRegistered.params
    by_skill = skill_order(models)                    # model ids, best first (the ``rank`` keys)

Kinds: "oracle" and "scripted" are the built-in policies (``skill`` says how well a scripted one
executes); "websocket" is an external policy behind an openpi policy server, named by ``uri`` with
the ``action_dim`` it answers with and, optionally, the ``observation`` layout it expects (its
keys -> the simulator's observation keys, a list of them concatenated; left out: every observation
under its own name). It has no ``skill`` and no ``rank``; it is swept and validated like any model:

    - model_id: my-vla
      version: "3"
      kind: websocket
      uri: ws://127.0.0.1:8000
      action_dim: 7
      observation: {observation/state: [robot0_eef_pos, robot0_eef_quat, robot0_gripper_qpos],
                    observation/image: [agentview_image]}
      cameras: [agentview]   # optional: what the policy sees, rendered before every action
      camera_size: 128       # optional: side of its square frames, pixels
      policy: ~/policies/pixel-bc   # optional: a policy trained here (sepa-eval lerobot train)
      batch: 8          # optional: observations per call (a server that answers a stacked batch)
      concurrency: 2    # optional: calls each rollout process keeps in flight

``cameras`` are rendered before every action and given to the policy as ``<camera>_image``
(uint8, camera_size x camera_size x 3; robosuite's own name for a camera observation), so a layout
key naming one such image alone sends it as the image it is, not flattened into numbers. They are
part of the registration: a policy that sees other pixels is another model.

``batch`` and ``concurrency`` (both 1 when left out: one observation per call, the openpi
protocol as it is) make a rollout process step batch x concurrency envs in lock-step
(producers/lockstep.py). The episodes do not depend on them, only the time does, so they are not
part of the registration (``params``): a model is re-batched without a new version.

``rank`` (optional) records a model's known true skill: 0 for the oracle, 1 for the best scripted
model, and so on. Ranked models must be strictly ordered: a larger rank is at least as bad in every
Skill component and worse in one (``Skill.at_least_as_good_as``), so "true skill" is not a matter
of weighting components. The oracle is rank 0 by definition (exact and noiseless, it never misses
a grasp, so it has no retries to compare). A model of unknown skill (an external policy) leaves
``rank`` out.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from producers.episode import CAMERA_SIZE
from producers.sim.exceptions import ModelConfigError
from producers.sim.policies import POLICY_KINDS, OracleScripted, Policy, ScriptedPolicy, Skill

DEFAULT_MODELS_PATH = Path(__file__).parent / "configs" / "models.yaml"
WEBSOCKET = "websocket"
MODEL_KINDS = (*POLICY_KINDS, WEBSOCKET)
# The most envs a rollout process steps for one model (batch x concurrency): each lane keeps up to
# ENV_CACHE_SIZE (4) envs of ~10 MB, one per recent scenario.
MAX_LANES = 64
_OPTIONAL_KEYS = {"description", "rank", "observation", "batch", "concurrency", "cameras", "camera_size", "policy"}
# The keys of each kind (scripted and oracle: a skill; websocket: a policy server).
_SCRIPTED_KEYS = {"model_id", "version", "kind", "description", "skill", "rank"}
_WEBSOCKET_KEYS = {"model_id", "version", "kind", "description", "uri", "action_dim", "observation", "batch",
                   "concurrency", "cameras", "camera_size", "policy"}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    model_id: str
    version: str
    kind: str  # one of MODEL_KINDS
    skill: Skill | None = None  # scripted and oracle only
    description: str = ""
    rank: int | None = None  # known true skill, 0 = the oracle, larger = worse; None = unknown
    uri: str | None = None  # websocket only: the openpi policy server (ws:// or wss://)
    action_dim: int | None = None  # websocket only: the width of the actions it answers with
    # websocket only: the server's key -> the observation keys concatenated under it
    observation: dict[str, tuple[str, ...]] | None = field(default=None, hash=False)
    batch: int = 1  # websocket only: observations per call
    concurrency: int = 1  # websocket only: calls in flight per rollout process
    cameras: tuple[str, ...] = ()  # websocket only: cameras the policy sees, as obs["<camera>_image"]
    camera_size: int = CAMERA_SIZE  # websocket only: side of those frames, pixels
    # websocket only: the directory of a policy trained here (producers/learned/) that the server
    # serves; its training record (dataset sha256, budget, seed) goes into the registration
    policy: str | None = None
    training: dict | None = field(default=None, hash=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("model_id", "version"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip():
                raise ModelConfigError(f"{name} must be a non-empty string, got {v!r}")
        if self.kind not in MODEL_KINDS:
            raise ModelConfigError(f"model {self.model_id!r}: kind must be one of {MODEL_KINDS}, got {self.kind!r}")
        if self.kind == WEBSOCKET:
            self._check_policy_server()
        elif not isinstance(self.skill, Skill):
            raise ModelConfigError(f"model {self.model_id!r}: skill must be a Skill, got {self.skill!r}")
        elif (self.uri, self.action_dim, self.observation, self.batch, self.concurrency, self.cameras,
              self.camera_size, self.policy) != (None, None, None, 1, 1, (), CAMERA_SIZE, None):
            raise ModelConfigError(f"model {self.model_id!r}: uri, action_dim, observation, batch, concurrency, "
                                   f"cameras, camera_size and policy are for kind {WEBSOCKET!r}, not {self.kind!r}")
        if self.kind == "oracle" and self.skill != Skill():
            raise ModelConfigError(f"model {self.model_id!r}: an oracle has perfect skill, got {self.skill!r}")
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int)
                                      or self.rank < 0):
            raise ModelConfigError(f"model {self.model_id!r}: rank must be a non-negative integer, got {self.rank!r}")
        if not isinstance(self.description, str):
            raise ModelConfigError(f"model {self.model_id!r}: description must be a string, "
                                   f"got {self.description!r}")

    def _check_policy_server(self) -> None:
        where = f"model {self.model_id!r} (kind {WEBSOCKET!r})"
        if self.skill is not None or self.rank is not None:
            raise ModelConfigError(f"{where}: an external policy has no skill and no rank (rank orders models by "
                                   "their scripted Skill)")
        if not isinstance(self.uri, str) or not self.uri.startswith(("ws://", "wss://")):
            raise ModelConfigError(f"{where}: uri must be a ws:// or wss:// address, got {self.uri!r}")
        if isinstance(self.action_dim, bool) or not isinstance(self.action_dim, int) or self.action_dim < 1:
            raise ModelConfigError(f"{where}: action_dim must be a positive integer, got {self.action_dim!r}")
        for name in ("batch", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LANES:
                raise ModelConfigError(f"{where}: {name} must be an integer from 1 to {MAX_LANES}, got {value!r}")
        if self.lanes > MAX_LANES:
            raise ModelConfigError(f"{where}: batch x concurrency = {self.lanes} envs per rollout process, more "
                                   f"than {MAX_LANES}")
        cameras = self.cameras
        if not isinstance(cameras, (list, tuple)) or not all(isinstance(c, str) and c for c in cameras) \
                or len(set(cameras)) != len(cameras):
            raise ModelConfigError(f"{where}: cameras must be a list of distinct camera names, got {cameras!r}")
        object.__setattr__(self, "cameras", tuple(cameras))
        if isinstance(self.camera_size, bool) or not isinstance(self.camera_size, int) \
                or not 16 <= self.camera_size <= 1024:
            raise ModelConfigError(f"{where}: camera_size must be an integer from 16 to 1024, got {self.camera_size!r}")
        if self.policy is not None:
            record = Path(self.policy).expanduser() / "policy.json"
            try:
                training = json.loads(record.read_text())["training"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise ModelConfigError(f"{where}: policy {self.policy!r} is not a trained policy's directory "
                                       f"(its policy.json: {exc!r})") from exc
            object.__setattr__(self, "training", training)
        if self.observation is None:
            return
        if not isinstance(self.observation, dict) or not self.observation:
            raise ModelConfigError(f"{where}: observation must be a non-empty mapping of the server's keys to "
                                   f"observation keys, got {self.observation!r}")
        layout = {}
        for key, source in self.observation.items():
            keys = (source,) if isinstance(source, str) else source
            if not isinstance(key, str) or not key or key == "prompt" or not isinstance(keys, (list, tuple)) \
                    or not keys or not all(isinstance(k, str) and k for k in keys):
                raise ModelConfigError(f"{where}: observation {key!r}: {source!r} must be an observation key or a "
                                       "list of them (and 'prompt' is the instruction's)")
            layout[key] = tuple(keys)
        object.__setattr__(self, "observation", layout)

    @property
    def lanes(self) -> int:
        """Envs a rollout process steps in lock-step for this model (1: one at a time)."""
        return self.batch * self.concurrency

    def make_policy(self, lane: Any = None) -> Policy:
        """A fresh policy instance named after model_id; a websocket one calls its server through
        ``lane`` (a producers.lockstep lane) when given, else on a connection of its own."""
        if self.kind == "oracle":
            return OracleScripted(name=self.model_id)
        if self.kind == WEBSOCKET:
            from producers.websocket_policy import WebSocketPolicy  # openpi-client: only where it is used

            return WebSocketPolicy(self.uri, self.action_dim, observation=self.observation, name=self.model_id,
                                   lane=lane)
        return ScriptedPolicy(self.skill, name=self.model_id)

    def params(self) -> dict[str, str]:
        """ModelRegistered.params (a string map): the skill, or where the policy server is and what it takes."""
        if self.kind == WEBSOCKET:
            params = {"uri": self.uri, "action_dim": str(self.action_dim)}
            if self.training is not None:  # what it learned from and how long: a result names what it measured
                kept = {k: v for k, v in self.training.items() if k not in ("load_s", "wall_s", "dataset")}
                params["training"] = json.dumps(kept, sort_keys=True)
            if self.cameras:
                params["cameras"] = json.dumps(list(self.cameras))
                params["camera_size"] = str(self.camera_size)
            if self.observation is not None:
                params["observation"] = json.dumps({k: list(v) for k, v in self.observation.items()}, sort_keys=True)
            return params
        return self.skill.to_params()


def _entry(path: Path, index: int, raw: Any) -> ModelConfig:
    where = f"{path} models[{index}]"
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{where}: must be a mapping, got {raw!r}")
    keys = _WEBSOCKET_KEYS if raw.get("kind") == WEBSOCKET else _SCRIPTED_KEYS
    missing, unknown = keys - _OPTIONAL_KEYS - set(raw), set(raw) - keys
    if missing or unknown:
        kind = f" (kind {raw.get('kind')!r})" if raw.get("kind") in MODEL_KINDS else ""
        raise ModelConfigError(f"{where}{kind}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
    try:
        if raw["kind"] == WEBSOCKET:
            return ModelConfig(model_id=raw["model_id"], version=raw["version"], kind=WEBSOCKET,
                               description=raw.get("description", ""), uri=raw["uri"], action_dim=raw["action_dim"],
                               observation=raw.get("observation"), batch=raw.get("batch", 1),
                               concurrency=raw.get("concurrency", 1), cameras=raw.get("cameras", ()),
                               camera_size=raw.get("camera_size", CAMERA_SIZE), policy=raw.get("policy"))
        skill_raw = raw["skill"]
        if not isinstance(skill_raw, dict):
            raise ModelConfigError(f"{where}: skill must be a mapping, got {skill_raw!r}")
        skill = Skill(**skill_raw)
        return ModelConfig(model_id=raw["model_id"], version=raw["version"], kind=raw["kind"], skill=skill,
                           description=raw.get("description", ""), rank=raw.get("rank"))
    except ModelConfigError as exc:
        raise ModelConfigError(f"{where}: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ModelConfigError(f"{where}: {exc}") from exc


def load_models(path: str | Path | None = None) -> list[ModelConfig]:
    """Parses a models.yaml (None: the default one); refuses unknown or missing keys, bad values and
    duplicate model_ids."""
    path = Path(path) if path is not None else DEFAULT_MODELS_PATH
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


def registered_models(path: str | Path | None = None) -> dict[str, ModelConfig]:
    """load_models by model id, parsed again only when the file changed (its mtime or size): a
    rollout process asks for every episode it runs, and parsing the registry costs ~30 ms."""
    path = Path(path) if path is not None else DEFAULT_MODELS_PATH
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelConfigError(f"cannot read {path}: {exc}") from exc
    return dict(_parsed_registry(path.resolve(), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=8)
def _parsed_registry(path: Path, mtime_ns: int, size: int) -> tuple[tuple[str, ModelConfig], ...]:
    return tuple((m.model_id, m) for m in load_models(path))


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
