"""A LIBERO scenario: which task of which suite, from which init state, and every change made to it.

    spec = LiberoScenario(suite="libero_object", env_name="pick_up_the_ketchup_and_place_it_in_the_basket",
                          instruction="pick up the ketchup and place it in the basket", horizon=280)
    child = spec.perturb(**{"layout.target.dx_m": 0.04})      # parent_id = spec.scenario_id
    record = child.to_dict()                                   # the Avro ScenarioSpec record
    LiberoScenario.from_dict(record) == child

Plain Python: imports in the project's venv and in the LIBERO venv alike. ``scenario_id`` is
"scn-" + 16 hex digits of sha256 over the canonical JSON of the content (every field but
parent_id, the benchmark included, so a LIBERO scenario never shares an id with a robosuite one);
a mutation is a child with ``parent_id`` set, as for robosuite scenarios.

Episodes and init states: an episode with seed ``s`` starts from LIBERO's stored init state
``(init_state_index + s) % 50`` of the task (LIBERO's own protocol runs episode i from init state
i), so seeds 0..N-1 of a scenario cover N of the task's fixed initial states; the seed also seeds
the policy. Perturbations apply on top of whichever init state the seed picks.

Perturbations (``perturbations``: name -> float; the Avro map). A name is
``<axis>.<subject>.<parameter>``; the unit is in the parameter's suffix:

    layout.<object>.dx_m, .dy_m        shift the object from its init-state position, world x/y, m
    layout.<object>.yaw_rad            turn it about the world z axis, rad
    material.<object>.friction         sliding friction of its collision geoms (made to win against
                                       the finger pads with a higher geom priority)
    material.<object>.mass_scale       factor on its mass and inertia
    material.<object>.tint_r/.tint_g/.tint_b   factor (0..1) on the colour channel of its materials
    distractor.<category>.x_m, .y_m    add one object of LIBERO's own object set (e.g. ketchup,
                                       orange_juice, chocolate_pudding) resting at x/y of the task's
                                       workspace frame (the frame of its BDDL regions), m; both
                                       are required
    distractor.<category>.yaw_rad      its yaw, rad (default 0)
    camera.<camera>.dx_m/.dy_m/.dz_m   move a camera (agentview, robot0_eye_in_hand), world frame, m
    camera.<camera>.pitch_rad/.yaw_rad turn it about its own x (pitch) / the world z (yaw) axis, rad
    light.all.diffuse_scale            factor on every light's diffuse colour
    light.all.ambient                  ambient light added to every light (0..1)
    light.all.dx_m/.dy_m/.dz_m         move every light, m

``<object>`` is ``target`` (the object the task's goal predicate names first) or an object
instance of the task (``basket_1``). Camera and light perturbations change only pixels: they matter
to pixel policies (VLAs), not to the privileged scripted policies. An instruction paraphrase is a
child with another ``instruction`` (producers/libero/mutations.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from schemas.exceptions import LiberoScenarioError

BENCHMARK = "libero"
SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
# openpi's LIBERO example: the longest training demo of each suite plus a margin, control steps at 20 Hz.
DEFAULT_HORIZONS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520,
                    "libero_90": 400}
# LIBERO stores 50 fixed initial states per task.
INIT_STATES_PER_TASK = 50
MAX_HORIZON = 5000
MAX_SUCCESS_HOLD_STEPS = 1000
CAMERAS = ("agentview", "robot0_eye_in_hand")
TARGET = "target"

# (axis, parameter) -> (low, high): every perturbation name and its allowed range.
PERTURBATION_RANGES: dict[tuple[str, str], tuple[float, float]] = {
    ("layout", "dx_m"): (-0.2, 0.2),
    ("layout", "dy_m"): (-0.2, 0.2),
    ("layout", "yaw_rad"): (-math.pi, math.pi),
    ("material", "friction"): (1e-3, 5.0),
    ("material", "mass_scale"): (0.1, 10.0),
    ("material", "tint_r"): (0.0, 1.0),
    ("material", "tint_g"): (0.0, 1.0),
    ("material", "tint_b"): (0.0, 1.0),
    ("distractor", "x_m"): (-0.5, 0.5),
    ("distractor", "y_m"): (-0.5, 0.5),
    ("distractor", "yaw_rad"): (-math.pi, math.pi),
    ("camera", "dx_m"): (-0.3, 0.3),
    ("camera", "dy_m"): (-0.3, 0.3),
    ("camera", "dz_m"): (-0.3, 0.3),
    ("camera", "pitch_rad"): (-0.6, 0.6),
    ("camera", "yaw_rad"): (-0.6, 0.6),
    ("light", "diffuse_scale"): (0.0, 3.0),
    ("light", "ambient"): (0.0, 1.0),
    ("light", "dx_m"): (-3.0, 3.0),
    ("light", "dy_m"): (-3.0, 3.0),
    ("light", "dz_m"): (-3.0, 3.0),
}
AXES = ("layout", "material", "distractor", "camera", "light")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Perturbation:
    """One parsed perturbation name: axis, subject, parameter."""

    axis: str
    subject: str
    parameter: str


def parse_perturbation(name: str) -> Perturbation:
    """Splits and checks a perturbation name (see the module docstring)."""
    parts = name.split(".") if isinstance(name, str) else []
    if len(parts) != 3 or not all(_NAME.match(p) for p in parts):
        raise LiberoScenarioError(f"perturbation name {name!r} must be <axis>.<subject>.<parameter> in lower case, "
                                  f"e.g. 'layout.target.dx_m'")
    axis, subject, parameter = parts
    if axis not in AXES:
        raise LiberoScenarioError(f"perturbation {name!r}: axis must be one of {AXES}")
    if (axis, parameter) not in PERTURBATION_RANGES:
        known = sorted(p for a, p in PERTURBATION_RANGES if a == axis)
        raise LiberoScenarioError(f"perturbation {name!r}: {axis} takes the parameters {known}")
    if axis == "camera" and subject not in CAMERAS:
        raise LiberoScenarioError(f"perturbation {name!r}: camera must be one of {CAMERAS}")
    if axis == "light" and subject != "all":
        raise LiberoScenarioError(f"perturbation {name!r}: light perturbations apply to 'all' lights")
    if axis == "distractor" and subject == TARGET:
        raise LiberoScenarioError(f"perturbation {name!r}: a distractor names a LIBERO object category")
    return Perturbation(axis, subject, parameter)


def _check_perturbations(raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise LiberoScenarioError(f"perturbations must be a mapping of name -> number, got {raw!r}")
    out: dict[str, float] = {}
    for name in sorted(raw):
        p = parse_perturbation(name)
        value = raw[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise LiberoScenarioError(f"perturbation {name!r} must be a finite number, got {value!r}")
        lo, hi = PERTURBATION_RANGES[(p.axis, p.parameter)]
        if not lo <= value <= hi:
            raise LiberoScenarioError(f"perturbation {name!r} must be in [{lo}, {hi}], got {value!r}")
        out[name] = float(value)
    distractors = {parse_perturbation(n).subject for n in out if n.startswith("distractor.")}
    for category in sorted(distractors):
        for axis in ("x_m", "y_m"):
            if f"distractor.{category}.{axis}" not in out:
                raise LiberoScenarioError(f"distractor {category!r} needs both x_m and y_m, "
                                          f"missing distractor.{category}.{axis}")
    return out


# Avro ScenarioSpec fields that only robosuite scenarios use; a LIBERO scenario leaves them so.
ROBOSUITE_FIELDS = {"robot": "Panda", "placement_x_range": [], "placement_y_range": [],
                    "pose_offset_xyz": [0.0, 0.0, 0.0], "object_friction": None, "object_mass": None,
                    "object_rgba": [], "object_size_scale": 1.0, "distractors": [], "seed": 0,
                    "place_target_xy": []}


@dataclass(frozen=True, kw_only=True)
class LiberoScenario:
    """One LIBERO task variant. Validated and normalised on construction.

    suite: one of SUITES. env_name: the task's name in its suite (the BDDL file's stem).
    instruction: the language given to a policy (the task's own, or a paraphrase).
    horizon: control steps (20 Hz) after the settle steps before the episode times out.
    init_state_index: the init state of seed 0 (seed s starts from (index + s) % 50).
    perturbations: name -> value, see the module docstring.
    success_hold_steps: consecutive steps LIBERO's goal check must hold to end as a success
        (0 = 1: the first success ends the episode, as LIBERO's and openpi's evaluations do).
    parent_id: the scenario this one was mutated from; not part of scenario_id.
    """

    suite: str
    env_name: str
    instruction: str
    horizon: int
    init_state_index: int = 0
    perturbations: dict[str, float] = field(default_factory=dict)
    success_hold_steps: int = 0
    parent_id: str | None = None

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise LiberoScenarioError(f"suite must be one of {SUITES}, got {self.suite!r}")
        if not isinstance(self.env_name, str) or not re.match(r"^[A-Za-z0-9_]+$", self.env_name or ""):
            raise LiberoScenarioError(f"env_name must be a LIBERO task name (letters, digits, _), "
                                      f"got {self.env_name!r}")
        if not isinstance(self.instruction, str) or not self.instruction.strip():
            raise LiberoScenarioError(f"instruction must be a non-empty string, got {self.instruction!r}")
        for name, hi in (("horizon", MAX_HORIZON), ("init_state_index", INIT_STATES_PER_TASK - 1),
                         ("success_hold_steps", MAX_SUCCESS_HOLD_STEPS)):
            value = getattr(self, name)
            lo = 1 if name == "horizon" else 0
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise LiberoScenarioError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
        object.__setattr__(self, "perturbations", _check_perturbations(self.perturbations))
        if self.parent_id is not None and (not isinstance(self.parent_id, str) or not self.parent_id):
            raise LiberoScenarioError(f"parent_id must be None or a non-empty string, got {self.parent_id!r}")

    # -- identity -------------------------------------------------------------------------

    def _content(self) -> dict[str, Any]:
        return {"benchmark": BENCHMARK, "suite": self.suite, "env_name": self.env_name,
                "instruction": self.instruction, "horizon": self.horizon, "init_state_index": self.init_state_index,
                "perturbations": dict(sorted(self.perturbations.items())),
                "success_hold_steps": self.success_hold_steps}

    @property
    def scenario_id(self) -> str:
        canonical = json.dumps(self._content(), sort_keys=True, separators=(",", ":"), allow_nan=False)
        return "scn-" + hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def task(self) -> str:
        """"<suite>/<task name>": EpisodeStarted.task."""
        return f"{self.suite}/{self.env_name}"

    def init_state_for(self, seed: int) -> int:
        """The LIBERO init state an episode with this seed starts from."""
        return (self.init_state_index + int(seed)) % INIT_STATES_PER_TASK

    def mutate(self, **changes: Any) -> LiberoScenario:
        """A child variant: ``changes`` applied and ``parent_id`` set to this scenario's id."""
        if "parent_id" in changes:
            raise LiberoScenarioError(f"mutate() sets parent_id itself, got parent_id={changes['parent_id']!r}")
        return dataclasses.replace(self, parent_id=self.scenario_id, **changes)

    def perturb(self, **values: float) -> LiberoScenario:
        """A child with these perturbations added to (or replacing) this one's."""
        return self.mutate(perturbations={**self.perturbations, **values})

    # -- edge converters (Avro ScenarioSpec) ----------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Exactly the fields of the Avro ScenarioSpec record (robosuite-only fields at their defaults)."""
        content = self._content()
        return {"scenario_id": self.scenario_id, "parent_id": self.parent_id,
                **{k: (list(v) if isinstance(v, list) else v) for k, v in ROBOSUITE_FIELDS.items()}, **content}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LiberoScenario:
        """Inverse of to_dict(). Refuses another benchmark, robosuite-only fields that are set,
        unknown keys, and a scenario_id that does not match the content."""
        if not isinstance(d, dict):
            raise LiberoScenarioError(f"a scenario must be a mapping, got {type(d).__name__}")
        if d.get("benchmark") != BENCHMARK:
            raise LiberoScenarioError(f"benchmark must be {BENCHMARK!r}, got {d.get('benchmark')!r}")
        own = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - own - set(ROBOSUITE_FIELDS) - {"scenario_id", "benchmark"}
        if unknown:
            raise LiberoScenarioError(f"unknown scenario keys {sorted(unknown)}")
        for name, default in ROBOSUITE_FIELDS.items():
            value = d.get(name, default)
            if (list(value) if isinstance(value, tuple) else value) != default:
                raise LiberoScenarioError(f"{name} is a robosuite scenario field; a LIBERO scenario leaves it "
                                          f"{default!r}, got {value!r}")
        missing = {"suite", "env_name", "instruction", "horizon"} - set(d)
        if missing:
            raise LiberoScenarioError(f"scenario is missing required keys {sorted(missing)}")
        spec = cls(**{k: v for k, v in d.items() if k in own})
        claimed = d.get("scenario_id")
        if claimed is not None and claimed != spec.scenario_id:
            raise LiberoScenarioError(f"scenario_id {claimed!r} does not match its content ({spec.scenario_id!r})")
        return spec


def is_libero(scenario: dict[str, Any]) -> bool:
    """Whether an Avro ScenarioSpec record is a LIBERO scenario."""
    return isinstance(scenario, dict) and scenario.get("benchmark") == BENCHMARK
