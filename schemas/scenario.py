"""A simulated task variant: which robosuite task, and every change made to it.

``ScenarioSpec`` mirrors ``schemas/avro/ScenarioSpec.avsc``; ``to_dict()`` / ``from_dict()`` are
the converters at the edge. ``scenario_id`` is a content hash of every field but ``parent_id``,
so the same variant gets the same id wherever and whenever it is made, and a mutation (a child
with ``parent_id`` set) gets a new one.

Coordinates: placement ranges and distractor x/y are metres relative to the task's placement
reference (Lift/Stack: the table centre; PickPlaceCan: the centre of the start bin), exactly as
robosuite's placement samplers take them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from schemas.exceptions import ScenarioError

BENCHMARK = "robosuite"
ENV_NAMES = ("Lift", "Stack", "PickPlaceCan")
ROBOTS = ("Panda",)
DISTRACTOR_KINDS = ("box", "cylinder", "ball")
# Envs whose manipulated object is a generated box and can therefore be rescaled.
SCALABLE_ENVS = ("Lift", "Stack")
# Unset = None here, [] in the Avro record.
OPTIONAL_ARRAYS = ("placement_x_range", "placement_y_range", "object_rgba", "place_target_xy")
# Fields added after the first schema version: left out of the content hash while at their default,
# so every scenario made before them keeps its id.
LATER_FIELDS = {"success_hold_steps": 0, "place_target_xy": None}
# ScenarioSpec fields of other benchmarks (LIBERO); a robosuite scenario leaves them at these values.
OTHER_BENCHMARK_FIELDS = {"suite": "", "init_state_index": 0, "perturbations": {}}

# Bounds a spec must respect. They keep the scene buildable, not "realistic".
MAX_HORIZON = 10_000
MAX_PLACEMENT_ABS_M = 0.35  # the Lift/Stack table is 0.8 m square; bins are 0.39 x 0.49 m
MAX_POSE_OFFSET_ABS_M = 0.25
FRICTION_RANGE = (1e-3, 5.0)  # sliding friction coefficient
MASS_RANGE_KG = (1e-3, 20.0)
SIZE_SCALE_RANGE = (0.5, 2.0)
DISTRACTOR_SIZE_RANGE_M = (0.005, 0.08)  # half-size (box, cylinder) or radius (ball)
MAX_DISTRACTOR_ABS_M = 0.35
MAX_SUCCESS_HOLD_STEPS = 1000
# Geom priority given to the manipulated object when object_friction is set. MuJoCo combines two
# geoms' frictions with max() unless one has a higher priority; the finger pads have friction 2
# and priority 0, so without this a lower object friction would do nothing.
OBJECT_GEOM_PRIORITY = 2
# World x/y (m) of each task's placement reference (robosuite's defaults: Lift/Stack table centre,
# PickPlaceCan start-bin centre), and of the grip site at the start of an episode (the Panda's
# initial pose, measured), for code that reasons about scenes without building them.
PLACEMENT_REFERENCE_XY = {"Lift": (0.0, 0.0), "Stack": (0.0, 0.0), "PickPlaceCan": (0.1, -0.25)}
GRIPPER_START_XY = {"Lift": (-0.1, 0.0), "Stack": (-0.1, 0.0), "PickPlaceCan": (-0.04, -0.09)}


def _float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ScenarioError(f"{name} must be finite, got {value!r}")
    return out


def _in_range(name: str, value: float, lo: float, hi: float) -> float:
    if not lo <= value <= hi:
        raise ScenarioError(f"{name} must be in [{lo}, {hi}], got {value!r}")
    return value


def _float_tuple(name: str, value: Any, n: int) -> tuple[float, ...]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != n:
        raise ScenarioError(f"{name} must be {n} numbers, got {value!r}")
    return tuple(_float(name, v) for v in value)


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{name} must be an integer, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class Distractor:
    """A free rigid body on the work surface that the robot can hit and push.

    ``size`` is the half-size of a box (cube), the radius and half-height of a cylinder, or the
    radius of a ball, in metres. ``x``/``y`` are relative to the placement reference.
    """

    kind: str
    size: float
    x: float
    y: float

    def __post_init__(self) -> None:
        if self.kind not in DISTRACTOR_KINDS:
            raise ScenarioError(f"distractor kind must be one of {DISTRACTOR_KINDS}, got {self.kind!r}")
        set_ = object.__setattr__
        set_(self, "size", _in_range("distractor size", _float("distractor size", self.size),
                                     *DISTRACTOR_SIZE_RANGE_M))
        for axis in ("x", "y"):
            v = _float(f"distractor {axis}", getattr(self, axis))
            set_(self, axis, _in_range(f"distractor {axis}", v, -MAX_DISTRACTOR_ABS_M, MAX_DISTRACTOR_ABS_M))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "size": self.size, "x": self.x, "y": self.y}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Distractor:
        if not isinstance(d, dict):
            raise ScenarioError(f"a distractor must be a mapping, got {d!r}")
        keys = {"kind", "size", "x", "y"}
        if set(d) != keys:
            raise ScenarioError(f"a distractor needs exactly the keys {sorted(keys)}, got {sorted(d)}")
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class ScenarioSpec:
    """One task variant. Validated and normalised (tuples of floats) on construction.

    Fields (all keyword-only):
        env_name: "Lift" | "Stack" | "PickPlaceCan".
        robot: "Panda".
        horizon: control steps (20 Hz) before the episode times out.
        instruction: the natural-language task given to a policy.
        placement_x_range / placement_y_range: (lo, hi) metres for the manipulated object's
            initial position, or None for robosuite's default range.
        pose_offset_xyz: metres added to the manipulated object's position after each reset.
        object_friction: sliding friction of the manipulated object (made to win against the
            finger pads' friction 2 with a higher geom priority), or None to keep robosuite's.
        object_mass: kg of the manipulated object, or None.
        object_rgba: colour of the manipulated object (replaces its texture), or None.
        object_size_scale: scales the manipulated object's geometry (Lift, Stack only).
        distractors: free bodies placed on the work surface.
        seed: builds the world (e.g. Lift's cube size); episodes are seeded by SimEnv.reset(seed).
        success_hold_steps: consecutive steps the success must hold before the episode ends as a
            success (lift and hold); 0 = the rollout default.
        place_target_xy: (x, y) metres from the placement reference where the object must be put
            down after the lift (Lift only: lift then place); None = the task's own goal.
        parent_id: the scenario this one was mutated from; not part of scenario_id.
    """

    env_name: str
    robot: str = "Panda"
    horizon: int
    instruction: str
    placement_x_range: tuple[float, float] | None = None
    placement_y_range: tuple[float, float] | None = None
    pose_offset_xyz: tuple[float, float, float] = (0.0, 0.0, 0.0)
    object_friction: float | None = None
    object_mass: float | None = None
    object_rgba: tuple[float, float, float, float] | None = None
    object_size_scale: float = 1.0
    distractors: tuple[Distractor, ...] = field(default_factory=tuple)
    seed: int = 0
    success_hold_steps: int = 0
    place_target_xy: tuple[float, float] | None = None
    parent_id: str | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.env_name not in ENV_NAMES:
            raise ScenarioError(f"env_name must be one of {ENV_NAMES}, got {self.env_name!r}")
        if self.robot not in ROBOTS:
            raise ScenarioError(f"robot must be one of {ROBOTS}, got {self.robot!r}")
        horizon = _int("horizon", self.horizon)
        if not 1 <= horizon <= MAX_HORIZON:
            raise ScenarioError(f"horizon must be in [1, {MAX_HORIZON}], got {horizon!r}")
        if not isinstance(self.instruction, str) or not self.instruction.strip():
            raise ScenarioError(f"instruction must be a non-empty string, got {self.instruction!r}")
        for name in ("placement_x_range", "placement_y_range"):
            value = getattr(self, name)
            if value is None:
                continue
            lo, hi = _float_tuple(name, value, 2)
            if lo > hi:
                raise ScenarioError(f"{name} must be (lo, hi) with lo <= hi, got {value!r}")
            if max(abs(lo), abs(hi)) > MAX_PLACEMENT_ABS_M:
                raise ScenarioError(f"{name} must lie within +-{MAX_PLACEMENT_ABS_M} m, got {value!r}")
            set_(self, name, (lo, hi))
        offset = _float_tuple("pose_offset_xyz", self.pose_offset_xyz, 3)
        if max(abs(v) for v in offset) > MAX_POSE_OFFSET_ABS_M:
            raise ScenarioError(f"pose_offset_xyz must lie within +-{MAX_POSE_OFFSET_ABS_M} m, "
                                f"got {self.pose_offset_xyz!r}")
        set_(self, "pose_offset_xyz", offset)
        if self.object_friction is not None:
            set_(self, "object_friction", _in_range(
                "object_friction", _float("object_friction", self.object_friction), *FRICTION_RANGE))
        if self.object_mass is not None:
            set_(self, "object_mass", _in_range(
                "object_mass", _float("object_mass", self.object_mass), *MASS_RANGE_KG))
        if self.object_rgba is not None:
            rgba = _float_tuple("object_rgba", self.object_rgba, 4)
            if not all(0.0 <= v <= 1.0 for v in rgba):
                raise ScenarioError(f"object_rgba values must be in [0, 1], got {self.object_rgba!r}")
            set_(self, "object_rgba", rgba)
        scale = _in_range("object_size_scale", _float("object_size_scale", self.object_size_scale),
                          *SIZE_SCALE_RANGE)
        if scale != 1.0 and self.env_name not in SCALABLE_ENVS:
            raise ScenarioError(f"object_size_scale is only supported for {SCALABLE_ENVS}, "
                                f"got {scale!r} for {self.env_name!r}")
        set_(self, "object_size_scale", scale)
        if isinstance(self.distractors, (str, bytes, dict)) or not hasattr(self.distractors, "__iter__"):
            raise ScenarioError(f"distractors must be a sequence of Distractor, got {self.distractors!r}")
        distractors = tuple(self.distractors)
        for d in distractors:
            if not isinstance(d, Distractor):
                raise ScenarioError(f"distractors must hold Distractor values, got {d!r}")
        set_(self, "distractors", distractors)
        hold = _int("success_hold_steps", self.success_hold_steps)
        if not 0 <= hold <= MAX_SUCCESS_HOLD_STEPS:
            raise ScenarioError(f"success_hold_steps must be in [0, {MAX_SUCCESS_HOLD_STEPS}], got {hold!r}")
        if self.place_target_xy is not None:
            if self.env_name != "Lift":
                raise ScenarioError(f"place_target_xy (lift then place) is only supported for Lift, "
                                    f"got {self.env_name!r}")
            xy = _float_tuple("place_target_xy", self.place_target_xy, 2)
            if max(abs(v) for v in xy) > MAX_PLACEMENT_ABS_M:
                raise ScenarioError(f"place_target_xy must lie within +-{MAX_PLACEMENT_ABS_M} m, "
                                    f"got {self.place_target_xy!r}")
            set_(self, "place_target_xy", xy)
        seed = _int("seed", self.seed)
        if not 0 <= seed < 2**63:
            raise ScenarioError(f"seed must be in [0, 2**63), got {seed!r}")
        if self.parent_id is not None and (not isinstance(self.parent_id, str) or not self.parent_id):
            raise ScenarioError(f"parent_id must be None or a non-empty string, got {self.parent_id!r}")

    # -- identity -------------------------------------------------------------------------

    def _content(self) -> dict[str, Any]:
        return {
            "env_name": self.env_name,
            "robot": self.robot,
            "horizon": self.horizon,
            "instruction": self.instruction,
            "placement_x_range": list(self.placement_x_range) if self.placement_x_range else None,
            "placement_y_range": list(self.placement_y_range) if self.placement_y_range else None,
            "pose_offset_xyz": list(self.pose_offset_xyz),
            "object_friction": self.object_friction,
            "object_mass": self.object_mass,
            "object_rgba": list(self.object_rgba) if self.object_rgba else None,
            "object_size_scale": self.object_size_scale,
            "distractors": [d.to_dict() for d in self.distractors],
            "seed": self.seed,
            "success_hold_steps": self.success_hold_steps,
            "place_target_xy": list(self.place_target_xy) if self.place_target_xy else None,
        }

    def _hashed_content(self) -> dict[str, Any]:
        content = self._content()
        for name, default in LATER_FIELDS.items():
            if content[name] == default:
                del content[name]
        return content

    @property
    def scenario_id(self) -> str:
        """"scn-" + the first 16 hex digits of sha256(canonical JSON of every field but parent_id;
        fields added later count only when they differ from their default)."""
        canonical = json.dumps(self._hashed_content(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return "scn-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def mutate(self, **changes: Any) -> ScenarioSpec:
        """A child variant: ``changes`` applied and ``parent_id`` set to this scenario's id."""
        if "parent_id" in changes:
            raise ScenarioError(f"mutate() sets parent_id itself, got parent_id={changes['parent_id']!r}")
        return dataclasses.replace(self, parent_id=self.scenario_id, **changes)

    # -- edge converters (Avro ScenarioSpec) ----------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types, exactly the fields of the Avro ScenarioSpec record."""
        content = self._content()
        for name in OPTIONAL_ARRAYS:  # Avro has these as arrays, empty = unset (no Nullable(Array))
            content[name] = content[name] or []
        return {"scenario_id": self.scenario_id, "parent_id": self.parent_id, "benchmark": BENCHMARK, **content,
                **{k: (dict(v) if isinstance(v, dict) else v) for k, v in OTHER_BENCHMARK_FIELDS.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ScenarioSpec:
        """Inverse of to_dict(). Refuses unknown keys, another benchmark, and a scenario_id that
        does not match the content (a record that was edited without re-hashing)."""
        if not isinstance(d, dict):
            raise ScenarioError(f"a scenario must be a mapping, got {type(d).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields - {"scenario_id", "benchmark"} - set(OTHER_BENCHMARK_FIELDS)
        if unknown:
            raise ScenarioError(f"unknown scenario keys {sorted(unknown)}")
        for name, default in OTHER_BENCHMARK_FIELDS.items():
            if name in d and d[name] != default:
                raise ScenarioError(f"{name} is not a robosuite scenario field (it is {d[name]!r}; "
                                    f"a robosuite scenario leaves it {default!r})")
        benchmark = d.get("benchmark", BENCHMARK)
        if benchmark != BENCHMARK:
            raise ScenarioError(f"benchmark must be {BENCHMARK!r}, got {benchmark!r}")
        missing = {"env_name", "horizon", "instruction"} - set(d)
        if missing:
            raise ScenarioError(f"scenario is missing required keys {sorted(missing)}")
        kwargs = {k: v for k, v in d.items() if k in fields}
        for name in OPTIONAL_ARRAYS:
            if name in kwargs and kwargs[name] is not None and len(kwargs[name]) == 0:
                kwargs[name] = None
        raw = kwargs.get("distractors", ())
        if isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__iter__"):
            raise ScenarioError(f"distractors must be a list, got {raw!r}")
        kwargs["distractors"] = tuple(Distractor.from_dict(x) for x in raw)
        spec = cls(**kwargs)
        claimed = d.get("scenario_id")
        if claimed is not None and claimed != spec.scenario_id:
            raise ScenarioError(f"scenario_id {claimed!r} does not match its content ({spec.scenario_id!r})")
        return spec
