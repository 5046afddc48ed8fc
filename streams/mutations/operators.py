"""Mutation operators: from a failure seed and a parent scenario, a child scenario that changes
exactly one factor, with the parameters that made it.

    seed = FailureSeed.from_event(cluster_updated)      # a ClusterUpdated dict; None: the blind arm
    rng = rng_for(7, "guided", seed.cluster_id, 0)       # numpy Generator from a stable seed
    cand = OPERATORS["material"](parent, seed, rng, OperatorConfig())
    cand.spec, cand.factor, cand.params                  # child ScenarioSpec, "friction", {...}
    cand.event_fields()                                  # CandidateProposed fields (no envelope)

Pure: no broker, no simulator (the feasibility pre-check is the chooser's next step). Same
parent, seed and generator state -> the same candidate. Every generated number is rounded
(``ROUND_DIGITS``) so ids and params read cleanly.

Operators (name -> factors it may change):
- ``pose`` -> placement | pose: moves where the target starts further away from the gripper's
  start, beyond where the cluster's failing episodes had their object (site object_x/y minus
  object_dx/dy = the object's start, relative to the placement reference): along the line from
  the gripper's start through that point, turned by up to ``guided_pose_spread_rad``; a narrow
  placement range there, or a pose offset by that much. Perception degrades with distance
  (Skill.range_noise_per_m) and misses grow with it; the pre-check drops what the arm cannot
  reach.
- ``material`` -> friction | mass | colour: a lower sliding friction (the env gives the object
  OBJECT_GEOM_PRIORITY so it wins over the finger pads' friction 2), a heavier object, or another
  colour (colour and the instruction change nothing for the scripted policies, which see poses,
  not pixels or words: they are for vision-language policies and the semantic critic).
- ``distractor`` -> distractors: one more free body in the path the failing episodes took: on
  the line from where the hand was at the failure (site eef_x/y; the gripper's start pose when
  that was above the object) to the object, just clear of the object's footprint.
- ``paraphrase`` -> instruction: an OpenAI-compatible chat model when a client is configured,
  else a deterministic template; ``params["paraphraser"]`` says which ("llm" or "template") and
  an LLM failure falls back to a template with the reason recorded.
- ``horizon_extension`` -> hold | place: a longer, multi-stage variant of the task, not a bigger
  step limit: lift and hold (``success_hold_steps``, the horizon extended by the hold so that
  holding, not speed, is what is tested) or, Lift only, lift then place at a target.
- ``time_budget`` -> time_budget: a smaller horizon (for timeout clusters: make slow worse).

An operator that may change more than one factor takes ``factors``, the ones this draw may change
(the chooser's coverage rule: the factors the active benchmark tests least); without it, each
variant is drawn with its weight.

With a seed (failure-guided) each operator draws from its ``guided_*`` ranges of OperatorConfig,
centred on the failure; without one (the blind arm) from its ``blind_*`` ranges, which span what a
ScenarioSpec allows. The guided ranges come from the calibration in producers/sim/bench.py
(--calibrate): where the registered models' success falls off while the oracle's does not.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from producers.fixed_order import norm
from schemas.exceptions import LiberoScenarioError
from schemas.libero_scenario import LiberoScenario, is_libero
from schemas.scenario import (
    DISTRACTOR_KINDS,
    GRIPPER_START_XY,
    MAX_DISTRACTOR_ABS_M,
    MAX_HORIZON,
    MAX_PLACEMENT_ABS_M,
    MAX_POSE_OFFSET_ABS_M,
    MAX_SUCCESS_HOLD_STEPS,
    OBJECT_GEOM_PRIORITY,
    PLACEMENT_REFERENCE_XY,
    Distractor,
    ScenarioError,
    ScenarioSpec,
)
from streams.mutations.exceptions import OperatorError, SeedError
from streams.mutations.operator_config import OperatorConfig

MUTATOR_VERSION = "1"
ROUND_DIGITS = 4  # 0.1 mm, 0.1 g, 1e-4 of a friction coefficient
GENERATORS = ("failure-guided", "blind", "coverage", "composition", "base")
FACTORS = ("placement", "pose", "friction", "mass", "colour", "distractors", "instruction", "horizon", "hold",
           "place", "time_budget", "composition", "camera", "lighting")  # the last two: LIBERO's pixel-only axes
# Active scenarios changing one factor, at most: the gate's breadth check turns a further one away
# (streams/gate/gate.py), so the chooser does not spend a candidate on an operator whose every
# factor is there already.
MAX_ACTIVE_PER_FACTOR = 2
# Conservative horizontal half-extent of a task object (the Lift cube's half-diagonal is 0.03 m).
OBJECT_RADIUS_M = 0.03
# A hand closer than this (horizontally) to the object at the failure was above it: no path there.
MIN_PATH_M = 0.03


def rng_for(seed: int, *keys: Any) -> np.random.Generator:
    """A numpy Generator from a stable seed: sha256 of (seed, keys) as JSON, so the same seed and
    keys give the same stream in any process and Python version."""
    digest = hashlib.sha256(json.dumps([seed, *keys], sort_keys=True, default=str).encode()).digest()
    return np.random.default_rng(np.frombuffer(digest[:16], dtype=np.uint32).tolist())


def _r(v: float) -> float:
    return round(float(v), ROUND_DIGITS)


def _s(v: Any) -> str:
    """A parameter as a string: numbers rounded, sequences as JSON."""
    if isinstance(v, (list, tuple)):
        return json.dumps([_r(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x for x in v])
    if isinstance(v, float):
        return repr(_r(v))
    return str(v)


def scenario_from_dict(d: Mapping[str, Any]) -> ScenarioSpec | LiberoScenario:
    """A ScenarioSpec record as the scenario of its benchmark: a LiberoScenario when its
    ``benchmark`` is "libero", else a robosuite ScenarioSpec. Raises ScenarioError or
    LiberoScenarioError (both ValueErrors) naming what is wrong."""
    d = dict(d)
    return LiberoScenario.from_dict(d) if is_libero(d) else ScenarioSpec.from_dict(d)


# What only a model that sees pixels or reads the instruction takes in. The scripted models and the
# oracle read object poses, so a change of one of these alone cannot make them fail: without a
# perceiving model registered, no arm spends a slot on one (chooser.family_for, coverage.LAST).
PERCEPTION_FACTORS = frozenset({"colour", "instruction", "camera", "lighting"})


@dataclass(frozen=True)
class OperatorFamily:
    """One benchmark's operators (name -> operator(parent, seed, rng, config) -> Candidate), the
    failure types that choose them, what exploration draws from, the operators' config and the
    factors each operator may change (none given: the chooser's coverage rule leaves it alone).
    ``perception_operators``: those whose every factor is a PERCEPTION_FACTOR; exploration leaves
    them out when no registered model perceives (ChooserConfig.perceiving). The chooser picks the
    family by the parent's benchmark (chooser.family_for)."""

    benchmark: str
    operators: Mapping[str, Callable]
    failure_operators: Mapping[str, tuple[str, ...]]
    exploration_operators: tuple[str, ...]
    config: Any
    operator_factors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def perception_operators(self) -> tuple[str, ...]:
        return tuple(op for op, reach in self.operator_factors.items() if reach and set(reach) <= PERCEPTION_FACTORS)


# -- the failure seed ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FailureSeed:
    """What a mutator uses of one ClusterUpdated event."""

    cluster_id: str
    size: int
    revision: int
    dominant_failure_type: str
    failure_types: dict[str, float]
    root_types: dict[str, float]
    site: dict[str, float]
    scenario_counts: dict[str, int]
    representative_scenario: ScenarioSpec | LiberoScenario | None
    model_counts: dict[str, int] = field(default_factory=dict)  # the cluster's episodes per model

    @classmethod
    def from_event(cls, event: Mapping[str, Any]) -> FailureSeed:
        """From a ClusterUpdated dict; refuses one without a cluster id or with malformed maps."""
        if not isinstance(event, Mapping):
            raise SeedError(f"a failure seed must be a ClusterUpdated mapping, got {type(event).__name__}")
        cid = event.get("cluster_id")
        if not isinstance(cid, str) or not cid:
            raise SeedError(f"ClusterUpdated without a cluster_id: {cid!r}")

        def num_map(name: str, kind: type = float) -> dict:
            raw = event.get(name) or {}
            if not isinstance(raw, Mapping):
                raise SeedError(f"cluster {cid}: {name} must be a map, got {raw!r}")
            out = {}
            for k, v in raw.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise SeedError(f"cluster {cid}: {name}[{k!r}] must be a finite number, got {v!r}")
                out[str(k)] = kind(v)
            return out

        counts = {}
        for name in ("size", "revision"):
            v = event.get(name, 0) or 0
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise SeedError(f"cluster {cid}: {name} must be a non-negative integer, got {v!r}")
            counts[name] = v
        rep = event.get("representative_scenario") or {}
        spec = None
        if isinstance(rep, Mapping) and rep.get("env_name"):
            try:
                spec = scenario_from_dict(rep)
            except (ScenarioError, LiberoScenarioError) as exc:
                raise SeedError(f"cluster {cid}: representative_scenario is not a usable scenario: {exc}") from exc
        return cls(cluster_id=cid, size=counts["size"], revision=counts["revision"],
                   dominant_failure_type=str(event.get("dominant_failure_type", "") or ""),
                   failure_types=num_map("failure_types"), root_types=num_map("root_types"),
                   site=num_map("site"), scenario_counts=num_map("scenario_counts", int),
                   representative_scenario=spec, model_counts=num_map("model_counts", int))

    def _xy(self, prefix: str, env_name: str) -> np.ndarray | None:
        x, y = self.site.get(f"{prefix}_x"), self.site.get(f"{prefix}_y")
        if x is None or y is None:
            return None
        return np.array([x, y]) - np.asarray(PLACEMENT_REFERENCE_XY[env_name])

    def object_xy(self, env_name: str) -> np.ndarray | None:
        """Where the target was at the failures, relative to the placement reference."""
        return self._xy("object", env_name)

    def object_start_xy(self, env_name: str) -> np.ndarray | None:
        """Where the target started in the failing episodes (object position minus its offset)."""
        at = self.object_xy(env_name)
        if at is None:
            return None
        return at - np.array([self.site.get("object_dx", 0.0), self.site.get("object_dy", 0.0)])

    def eef_xy(self, env_name: str) -> np.ndarray | None:
        """Where the hand was at the failures, relative to the placement reference."""
        return self._xy("eef", env_name)


# -- candidates ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """A child scenario and how it was made. ``params``: strings (CandidateProposed.params)."""

    spec: ScenarioSpec | LiberoScenario
    parent: ScenarioSpec | LiberoScenario
    operator: str
    factor: str
    params: dict[str, str]
    generator: str
    source_cluster_id: str | None = None

    def __post_init__(self) -> None:
        if self.factor not in FACTORS:
            raise OperatorError(f"factor must be one of {FACTORS}, got {self.factor!r}")
        if self.generator not in GENERATORS:
            raise OperatorError(f"generator must be one of {GENERATORS}, got {self.generator!r}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.params.items()):
            raise OperatorError(f"params must map strings to strings, got {self.params!r}")

    @property
    def scenario_id(self) -> str:
        return self.spec.scenario_id

    def event_fields(self) -> dict[str, Any]:
        """CandidateProposed fields but envelope, cycle_id and feasibility_json."""
        return {"scenario_id": self.spec.scenario_id, "parent_scenario_id": self.parent.scenario_id,
                "operator": self.operator, "params": dict(self.params), "source_cluster_id": self.source_cluster_id,
                "scenario": self.spec.to_dict(), "mutator_version": MUTATOR_VERSION, "factor": self.factor,
                "generator": self.generator}


def _uniform(rng: np.random.Generator, lo_hi: tuple[float, float]) -> float:
    return float(rng.uniform(lo_hi[0], lo_hi[1]))


def _log_uniform(rng: np.random.Generator, lo_hi: tuple[float, float]) -> float:
    return float(math.exp(rng.uniform(math.log(lo_hi[0]), math.log(lo_hi[1]))))


def _candidate(parent: ScenarioSpec, seed: FailureSeed | None, operator: str, factor: str,
               params: dict[str, Any], **changes: Any) -> Candidate:
    try:
        child = parent.mutate(**changes)
    except ScenarioError as exc:
        raise OperatorError(f"{operator} made an invalid {factor} variant of {parent.scenario_id}: {exc}") from exc
    return Candidate(spec=child, parent=parent, operator=operator, factor=factor,
                     params={k: _s(v) for k, v in params.items()},
                     generator="failure-guided" if seed is not None else "blind",
                     source_cluster_id=seed.cluster_id if seed is not None else None)


def _placement_centre(parent: ScenarioSpec) -> np.ndarray:
    xs, ys = parent.placement_x_range, parent.placement_y_range
    return np.array([(xs[0] + xs[1]) / 2 if xs else 0.0, (ys[0] + ys[1]) / 2 if ys else 0.0])


def _unit(v: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    """v normalised, or a random unit vector (and False) when v is too short to have a direction."""
    n = float(norm(v))
    if n < 1e-3:
        a = float(rng.uniform(0.0, 2 * math.pi))
        return np.array([math.cos(a), math.sin(a)]), False
    return v / n, True


# -- the operators ------------------------------------------------------------------------------

def _variant(operator: str, rng: np.random.Generator, names: tuple[str, ...], factors: Collection[str] | None,
             weights: Any = None) -> str:
    """One of the operator's variants ``names``, among ``factors`` (all, when None), drawn by
    ``weights``, or uniformly when None (without a draw when one is left). OperatorError when none
    may be drawn."""
    allowed = np.array([factors is None or n in factors for n in names], dtype=float)
    w = allowed * (1.0 if weights is None else np.asarray(weights, dtype=float))
    if not w.sum():
        raise OperatorError(f"{operator} changes {', '.join(names)}; none of them may be drawn here "
                            f"(asked for {', '.join(sorted(factors)) if factors is not None else 'any'})")
    if weights is not None:
        return names[int(rng.choice(len(names), p=w / w.sum()))]
    left = [n for n, ok in zip(names, w, strict=True) if ok]
    return left[int(rng.integers(len(left)))] if len(left) > 1 else left[0]


def pose(parent: ScenarioSpec, seed: FailureSeed | None, rng: np.random.Generator, cfg: OperatorConfig, *,
         factors: Collection[str] | None = None) -> Candidate:
    variant = _variant("pose", rng, ("placement", "pose"), factors)
    centre0 = _placement_centre(parent)
    if seed is not None:
        env = parent.env_name
        start = seed.object_start_xy(env)
        origin = "site" if start is not None else "parent"
        start = centre0 + np.asarray(parent.pose_offset_xyz[:2]) if start is None else start
        hand = np.asarray(GRIPPER_START_XY[env]) - np.asarray(PLACEMENT_REFERENCE_XY[env])
        away, informed = _unit(start - hand, rng)
        turn = _uniform(rng, (-cfg.guided_pose_spread_rad, cfg.guided_pose_spread_rad))
        c_, s_ = math.cos(turn), math.sin(turn)
        direction = np.array([c_ * away[0] - s_ * away[1], s_ * away[0] + c_ * away[1]])
        push = _uniform(rng, cfg.guided_pose_push_m)
        if variant == "placement":
            half = _uniform(rng, cfg.guided_placement_half_width_m)
            lim = MAX_PLACEMENT_ABS_M - half
            c = np.clip(start + direction * push, -lim, lim)
            return _candidate(parent, seed, "pose", "placement",
                              {"variant": "placement", "from": origin,
                               "direction": "away_from_gripper" if informed else "random", "turn_rad": turn,
                               "centre_xy": [c[0], c[1]], "half_width_m": half, "push_m": push},
                              placement_x_range=(_r(c[0] - half), _r(c[0] + half)),
                              placement_y_range=(_r(c[1] - half), _r(c[1] + half)))
        delta = direction * push
    else:
        if variant == "placement":
            half = _uniform(rng, cfg.blind_placement_half_width_m)
            lim = min(cfg.blind_placement_abs_m, MAX_PLACEMENT_ABS_M - half)
            c = rng.uniform(-lim, lim, 2)
            return _candidate(parent, None, "pose", "placement",
                              {"variant": "placement", "from": "random", "centre_xy": [c[0], c[1]],
                               "half_width_m": half},
                              placement_x_range=(_r(c[0] - half), _r(c[0] + half)),
                              placement_y_range=(_r(c[1] - half), _r(c[1] + half)))
        delta = rng.uniform(-cfg.blind_pose_offset_abs_m, cfg.blind_pose_offset_abs_m, 2)
        origin, informed, push = "random", False, float(norm(delta))
    old = parent.pose_offset_xyz
    offset = tuple(_r(v) for v in np.clip(np.array([old[0] + delta[0], old[1] + delta[1]]),
                                          -MAX_POSE_OFFSET_ABS_M, MAX_POSE_OFFSET_ABS_M)) + (old[2],)
    params = {"variant": "pose", "from": origin, "direction": "away_from_gripper" if informed else "random",
              "offset_xyz": list(offset), "push_m": push}
    if seed is not None:
        params["turn_rad"] = turn
    return _candidate(parent, seed, "pose", "pose", params,
                      pose_offset_xyz=offset)


def material(parent: ScenarioSpec, seed: FailureSeed | None, rng: np.random.Generator,
             cfg: OperatorConfig, *, factors: Collection[str] | None = None) -> Candidate:
    variant = _variant("material", rng, ("friction", "mass", "colour"), factors,
                       cfg.guided_material_weights if seed is not None else cfg.blind_material_weights)
    if variant == "friction":
        mu = _r(_log_uniform(rng, cfg.guided_friction if seed is not None else cfg.blind_friction))
        return _candidate(parent, seed, "material", "friction",
                          {"variant": "friction", "friction": mu, "geom_priority": OBJECT_GEOM_PRIORITY,
                           "parent_friction": parent.object_friction if parent.object_friction is not None
                           else "default"},
                          object_friction=mu)
    if variant == "mass":
        kg = _r(_uniform(rng, cfg.guided_mass_kg) if seed is not None else _log_uniform(rng, cfg.blind_mass_kg))
        return _candidate(parent, seed, "material", "mass",
                          {"variant": "mass", "mass_kg": kg,
                           "parent_mass_kg": parent.object_mass if parent.object_mass is not None else "default"},
                          object_mass=kg)
    rgba = tuple(_r(v) for v in rng.uniform(0.0, 1.0, 3)) + (1.0,)
    return _candidate(parent, seed, "material", "colour", {"variant": "colour", "rgba": list(rgba)},
                      object_rgba=rgba)


def _footprint_radius(kind: str, size: float) -> float:
    return size * math.sqrt(2) if kind == "box" else size


def distractor(parent: ScenarioSpec, seed: FailureSeed | None, rng: np.random.Generator,
               cfg: OperatorConfig) -> Candidate:
    kind = DISTRACTOR_KINDS[int(rng.integers(len(DISTRACTOR_KINDS)))]
    env = parent.env_name
    if seed is not None:
        size = _r(_uniform(rng, cfg.guided_distractor_size_m))
        obj = seed.object_xy(env)
        obj_from = "site" if obj is not None else "parent"
        obj = _placement_centre(parent) if obj is None else obj
        hand = seed.eef_xy(env)
        if hand is not None and float(norm(hand - obj)) >= MIN_PATH_M:
            path_from = "site_eef"
        else:
            hand = np.asarray(GRIPPER_START_XY[env]) - np.asarray(PLACEMENT_REFERENCE_XY[env])
            path_from = "gripper_start"
        direction, _ = _unit(hand - obj, rng)
        clearance = _uniform(rng, cfg.guided_distractor_clearance_m)
        along = OBJECT_RADIUS_M + _footprint_radius(kind, size) + clearance
        side = np.array([-direction[1], direction[0]]) * _uniform(rng, (-0.01, 0.01))
        xy = np.clip(obj + direction * along + side, -MAX_DISTRACTOR_ABS_M, MAX_DISTRACTOR_ABS_M)
        params = {"kind": kind, "size_m": size, "xy": [xy[0], xy[1]], "object_from": obj_from,
                  "path_from": path_from, "distance_from_object_m": along}
    else:
        size = _r(_uniform(rng, cfg.blind_distractor_size_m))
        xy = rng.uniform(-cfg.blind_distractor_abs_m, cfg.blind_distractor_abs_m, 2)
        params = {"kind": kind, "size_m": size, "xy": [xy[0], xy[1]], "path_from": "random"}
    added = Distractor(kind=kind, size=size, x=_r(xy[0]), y=_r(xy[1]))
    params["count"] = len(parent.distractors) + 1
    return _candidate(parent, seed, "distractor", "distractors", params,
                      distractors=parent.distractors + (added,))


def paraphrase(parent: ScenarioSpec, seed: FailureSeed | None, rng: np.random.Generator,
               cfg: OperatorConfig) -> Candidate:
    text, params = cfg.paraphraser.paraphrase(parent, rng)
    return _candidate(parent, seed, "paraphrase", "instruction", {**params, "instruction": text}, instruction=text)


def horizon_extension(parent: ScenarioSpec, seed: FailureSeed | None, rng: np.random.Generator,
                      cfg: OperatorConfig, *, factors: Collection[str] | None = None) -> Candidate:
    can_place = parent.env_name == "Lift" and parent.place_target_xy is None
    variant = _variant("horizon_extension", rng, ("hold", "place") if can_place else ("hold",), factors)
    if variant == "hold":
        lo, hi = cfg.guided_hold_steps if seed is not None else cfg.blind_hold_steps
        hold = min(int(rng.integers(lo, hi + 1)), MAX_SUCCESS_HOLD_STEPS)
        horizon = min(parent.horizon + hold, MAX_HORIZON)
        return _candidate(parent, seed, "horizon_extension", "hold",
                          {"variant": "hold", "hold_steps": hold, "horizon": horizon,
                           "parent_horizon": parent.horizon},
                          success_hold_steps=hold, horizon=horizon)
    if seed is not None:
        start = seed.object_start_xy(parent.env_name)
        origin = "site" if start is not None else "parent"
        start = _placement_centre(parent) if start is None else start
        angle = float(rng.uniform(0.0, 2 * math.pi))
        distance = _uniform(rng, cfg.guided_place_distance_m)
        xy = np.clip(start + distance * np.array([math.cos(angle), math.sin(angle)]),
                     -MAX_PLACEMENT_ABS_M, MAX_PLACEMENT_ABS_M)
        params = {"variant": "place", "from": origin, "distance_m": distance, "angle_rad": angle}
    else:
        xy = rng.uniform(-cfg.blind_place_abs_m, cfg.blind_place_abs_m, 2)
        params = {"variant": "place", "from": "random"}
    target = (_r(xy[0]), _r(xy[1]))
    return _candidate(parent, seed, "horizon_extension", "place", {**params, "place_target_xy": list(target)},
                      place_target_xy=target)


def time_budget(parent: ScenarioSpec, seed: FailureSeed | None, rng: np.random.Generator,
                cfg: OperatorConfig) -> Candidate:
    fraction = _uniform(rng, cfg.guided_time_fraction if seed is not None else cfg.blind_time_fraction)
    floor = cfg.min_time_budget_steps if seed is not None else 1
    horizon = max(floor, round(parent.horizon * fraction))
    if horizon >= parent.horizon:
        raise OperatorError(f"time_budget: parent {parent.scenario_id} has horizon {parent.horizon}, "
                            f"already at or below the budget floor {floor}")
    return _candidate(parent, seed, "time_budget", "time_budget",
                      {"horizon": horizon, "parent_horizon": parent.horizon, "fraction": fraction},
                      horizon=horizon)


Operator = Callable[[ScenarioSpec, "FailureSeed | None", np.random.Generator, OperatorConfig], Candidate]
# operator -> the factors its candidates may change (the module docstring's list)
OPERATOR_FACTORS: dict[str, tuple[str, ...]] = {
    "pose": ("placement", "pose"), "material": ("friction", "mass", "colour"), "distractor": ("distractors",),
    "paraphrase": ("instruction",), "horizon_extension": ("hold", "place"), "time_budget": ("time_budget",),
}
OPERATORS: dict[str, Operator] = {
    "pose": pose,
    "material": material,
    "distractor": distractor,
    "paraphrase": paraphrase,
    "horizon_extension": horizon_extension,
    "time_budget": time_budget,
}
