"""The LIBERO part of the mutator: operators over LiberoScenario (producers/libero/mutations.py),
the failure types that choose them, and their parameter ranges.

    family = libero_family(LiberoChooserConfig())        # what the chooser uses for a LIBERO parent
    cand = family.operators["material"](parent, seed, rng, family.config)
    cand.spec                                              # a LiberoScenario, parent_id = parent's id

The chooser (streams/mutations/chooser.py) is the same for every benchmark: it picks the operator
family by the parent scenario's benchmark (``family_for``) and draws from it as it does for
robosuite (failure types -> operators, ``exploration``, seeded by operators.rng_for). What differs
is here:

Failure type -> operator (FAILURE_OPERATORS): slip, drop, excessive_force -> material;
knocked_object, collision, wrong_object -> distractor; grasp_miss, out_of_reach, joint_limit ->
layout; timeout and stall have no LIBERO operator (LIBERO's horizons are openpi's per-suite
limits, not a factor we vary), so such a cluster gets an exploration draw.

Operators (name -> factor; every one changes one factor against the parent):
- ``layout`` -> pose: the target shifted from its init state, away from where the hand was at the
  failures (site eef_x/y -> object_x/y, carried on), or turned about z; blind: any shift or turn.
- ``material`` -> friction | mass | colour: a lower friction, a mass scale > 1, or a tint.
- ``distractor`` -> distractors: one object of LIBERO's own set that is not in the task, on the
  line from the object at the failures towards the hand (the path the hand took), just clear of
  the target. Positions are in the task's workspace frame; for LIBERO-Object's floor scenes that
  is the world frame in x/y (measured: a distractor at workspace (0, 0) rests at world
  (-0.02, 0.01)), which is the frame of the site's positions.
- ``paraphrase`` -> instruction: one of producers/libero/mutations.PARAPHRASES.
- ``camera`` -> camera, ``lighting`` -> lighting: pixel-only changes (they matter to VLAs, not to
  the privileged scripted policies). They and ``paraphrase`` change only perception factors
  (operators.PERCEPTION_FACTORS): exploration draws them only when a registered model sees pixels
  or reads words (ChooserConfig.perceiving).

The guided ranges are first guesses around LIBERO-PRO/-Plus magnitudes, not calibrated like the
robosuite ones: the feasibility pre-check (the oracle must still succeed) drops the too-hard ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from producers.fixed_order import norm
from producers.libero import mutations as lm
from schemas.exceptions import LiberoScenarioError
from schemas.libero_scenario import LiberoScenario
from streams.mutations.exceptions import OperatorError
from streams.mutations.operators import Candidate, FailureSeed, OperatorFamily, _r, _s, _variant

BENCHMARK = "libero"

FAILURE_OPERATORS: dict[str, tuple[str, ...]] = {
    "slip": ("material",),
    "drop": ("material",),
    "excessive_force": ("material",),
    "knocked_object": ("distractor",),
    "collision": ("distractor",),
    "wrong_object": ("distractor",),
    "grasp_miss": ("layout",),
    "out_of_reach": ("layout",),
    "joint_limit": ("layout",),
}
# A hand closer than this (horizontally) to the object at the failure was above it: no path there.
MIN_PATH_M = 0.03
# Distractors stay this far inside the perturbation's +-0.5 m range (LIBERO-Object's floor scene).
DISTRACTOR_ABS_M = 0.3


@dataclass(frozen=True, kw_only=True)
class LiberoOperatorConfig:
    """Parameter ranges (lo, hi) of the LIBERO operators: ``guided_*`` with a failure seed,
    ``blind_*`` without. Metres, radians, factors."""

    guided_layout_push_m: tuple[float, float] = (0.03, 0.08)
    guided_layout_yaw_rad: tuple[float, float] = (0.4, 1.2)  # magnitude; the sign is drawn
    blind_layout_abs_m: float = 0.12
    blind_layout_yaw_abs_rad: float = math.pi
    guided_material_weights: tuple[float, float, float] = (0.5, 0.4, 0.1)  # friction, mass, colour
    blind_material_weights: tuple[float, float, float] = (1.0, 1.0, 1.0)
    guided_friction: tuple[float, float] = (0.1, 0.4)  # log-uniform
    guided_mass_scale: tuple[float, float] = (2.0, 5.0)
    blind_friction: tuple[float, float] = (0.01, 2.0)
    blind_mass_scale: tuple[float, float] = (0.2, 8.0)
    guided_distractor_distance_m: tuple[float, float] = (0.07, 0.11)  # from the target's centre
    blind_distractor_abs_m: float = 0.25
    camera_shift_abs_m: float = 0.06
    camera_turn_abs_rad: float = 0.1
    light_diffuse_scale: tuple[float, float] = (0.3, 0.6)


@dataclass(frozen=True, kw_only=True)
class LiberoChooserConfig:
    """The chooser's LIBERO settings: what exploration draws from, and the operators' ranges."""

    exploration_operators: tuple[str, ...] = ("camera", "distractor", "layout", "lighting", "material", "paraphrase")
    operators: LiberoOperatorConfig = LiberoOperatorConfig()

    def __post_init__(self) -> None:
        unknown = set(self.exploration_operators) - set(OPERATORS)
        if unknown or not self.exploration_operators:
            raise ValueError(f"LiberoChooserConfig.exploration_operators must be some of {sorted(OPERATORS)}, "
                             f"got {self.exploration_operators!r}")


def _candidate(parent: LiberoScenario, seed: FailureSeed | None, operator: str, factor: str,
               params: dict[str, Any], make: Callable[[], LiberoScenario]) -> Candidate:
    try:
        child = make()
    except (LiberoScenarioError, ValueError) as exc:
        raise OperatorError(f"{operator} made an invalid {factor} variant of {parent.scenario_id}: {exc}") from exc
    return Candidate(spec=child, parent=parent, operator=operator, factor=factor,
                     params={k: _s(v) for k, v in params.items()},
                     generator="failure-guided" if seed is not None else "blind",
                     source_cluster_id=seed.cluster_id if seed is not None else None)


def _site_xy(seed: FailureSeed | None, prefix: str) -> np.ndarray | None:
    if seed is None:
        return None
    x, y = seed.site.get(f"{prefix}_x"), seed.site.get(f"{prefix}_y")
    return None if x is None or y is None else np.array([x, y])


def _unit(v: np.ndarray | None, rng: np.random.Generator) -> tuple[np.ndarray, bool]:
    n = 0.0 if v is None else float(norm(v))
    if n < 1e-3:
        a = float(rng.uniform(0.0, 2 * math.pi))
        return np.array([math.cos(a), math.sin(a)]), False
    return v / n, True


def _uniform(rng: np.random.Generator, lo_hi: tuple[float, float]) -> float:
    return float(rng.uniform(lo_hi[0], lo_hi[1]))


def _log_uniform(rng: np.random.Generator, lo_hi: tuple[float, float]) -> float:
    return float(math.exp(rng.uniform(math.log(lo_hi[0]), math.log(lo_hi[1]))))


# -- the operators ------------------------------------------------------------------------------

def layout(parent: LiberoScenario, seed: FailureSeed | None, rng: np.random.Generator,
           cfg: LiberoOperatorConfig) -> Candidate:
    variant = ("shift", "turn")[int(rng.integers(2))]
    if variant == "turn":
        if seed is not None:
            yaw = _uniform(rng, cfg.guided_layout_yaw_rad) * (1 if rng.random() < 0.5 else -1)
        else:
            yaw = _uniform(rng, (-cfg.blind_layout_yaw_abs_rad, cfg.blind_layout_yaw_abs_rad))
        yaw = _r(yaw)
        return _candidate(parent, seed, "layout", "pose", {"variant": "turn", "yaw_rad": yaw},
                          lambda: lm.layout(parent, yaw_rad=yaw))
    if seed is not None:
        obj, hand = _site_xy(seed, "object"), _site_xy(seed, "eef")
        direction, informed = _unit(None if obj is None or hand is None else obj - hand, rng)
        push = _uniform(rng, cfg.guided_layout_push_m)
        delta = direction * push
        params = {"variant": "shift", "direction": "away_from_hand" if informed else "random", "push_m": push}
    else:
        delta = rng.uniform(-cfg.blind_layout_abs_m, cfg.blind_layout_abs_m, 2)
        params = {"variant": "shift", "direction": "random"}
    dx, dy = _r(delta[0]), _r(delta[1])
    return _candidate(parent, seed, "layout", "pose", {**params, "dx_m": dx, "dy_m": dy},
                      lambda: lm.layout(parent, dx_m=dx, dy_m=dy))


def material(parent: LiberoScenario, seed: FailureSeed | None, rng: np.random.Generator,
             cfg: LiberoOperatorConfig, *, factors: Collection[str] | None = None) -> Candidate:
    variant = _variant("material", rng, ("friction", "mass", "colour"), factors,
                       cfg.guided_material_weights if seed is not None else cfg.blind_material_weights)
    if variant == "friction":
        mu = _r(_log_uniform(rng, cfg.guided_friction if seed is not None else cfg.blind_friction))
        return _candidate(parent, seed, "material", "friction", {"variant": "friction", "friction": mu},
                          lambda: lm.material(parent, friction=mu))
    if variant == "mass":
        k = _r(_uniform(rng, cfg.guided_mass_scale) if seed is not None else _log_uniform(rng, cfg.blind_mass_scale))
        return _candidate(parent, seed, "material", "mass", {"variant": "mass", "mass_scale": k},
                          lambda: lm.material(parent, mass_scale=k))
    tint = tuple(_r(v) for v in rng.uniform(0.2, 1.0, 3))
    return _candidate(parent, seed, "material", "colour", {"variant": "colour", "tint_rgb": list(tint)},
                      lambda: lm.material(parent, tint=tint))


def _free_categories(parent: LiberoScenario) -> list[str]:
    """LIBERO object categories neither in the task (its name) nor already a distractor."""
    used = {n.split(".")[1] for n in parent.perturbations if n.startswith("distractor.")}
    return [c for c in lm.DISTRACTOR_CATEGORIES if c not in parent.env_name and c not in used]


def distractor(parent: LiberoScenario, seed: FailureSeed | None, rng: np.random.Generator,
               cfg: LiberoOperatorConfig) -> Candidate:
    free = _free_categories(parent)
    if not free:
        raise OperatorError(f"distractor: every LIBERO object category is in {parent.scenario_id} already")
    category = free[int(rng.integers(len(free)))]
    obj = _site_xy(seed, "object")
    if seed is not None and obj is not None:
        hand = _site_xy(seed, "eef")
        towards = None if hand is None or float(norm(hand - obj)) < MIN_PATH_M else hand - obj
        direction, informed = _unit(towards, rng)
        along = _uniform(rng, cfg.guided_distractor_distance_m)
        xy = np.clip(obj + direction * along, -DISTRACTOR_ABS_M, DISTRACTOR_ABS_M)
        params = {"category": category, "path_from": "site_eef" if informed else "random_direction",
                  "distance_from_object_m": along}
    else:
        xy = rng.uniform(-cfg.blind_distractor_abs_m, cfg.blind_distractor_abs_m, 2)
        params = {"category": category, "path_from": "random"}
    x, y = _r(xy[0]), _r(xy[1])
    return _candidate(parent, seed, "distractor", "distractors", {**params, "xy": [x, y]},
                      lambda: lm.distractor(parent, category, x_m=x, y_m=y))


def paraphrase(parent: LiberoScenario, seed: FailureSeed | None, rng: np.random.Generator,
               cfg: LiberoOperatorConfig) -> Candidate:
    options = lm.paraphrases(parent.instruction)
    if not options:
        raise OperatorError(f"paraphrase: no template fits {parent.instruction!r}")
    i = int(rng.integers(len(options)))
    return _candidate(parent, seed, "paraphrase", "instruction",
                      {"paraphraser": "template", "template": str(i), "instruction": options[i]},
                      lambda: lm.paraphrase(parent, i))


def camera(parent: LiberoScenario, seed: FailureSeed | None, rng: np.random.Generator,
           cfg: LiberoOperatorConfig) -> Candidate:
    shift = {k: _r(v) for k, v in zip(("dx_m", "dy_m", "dz_m"),
                                       rng.uniform(-cfg.camera_shift_abs_m, cfg.camera_shift_abs_m, 3), strict=True)}
    pitch = _r(rng.uniform(-cfg.camera_turn_abs_rad, cfg.camera_turn_abs_rad))
    deltas = {**shift, "pitch_rad": pitch}
    return _candidate(parent, seed, "camera", "camera", {"camera": "agentview", **deltas},
                      lambda: lm.camera(parent, "agentview", **deltas))


def lighting(parent: LiberoScenario, seed: FailureSeed | None, rng: np.random.Generator,
             cfg: LiberoOperatorConfig) -> Candidate:
    scale = _r(_uniform(rng, cfg.light_diffuse_scale))
    return _candidate(parent, seed, "lighting", "lighting", {"diffuse_scale": scale},
                      lambda: lm.lighting(parent, diffuse_scale=scale))


Operator = Callable[[LiberoScenario, "FailureSeed | None", np.random.Generator, LiberoOperatorConfig], Candidate]
OPERATORS: dict[str, Operator] = {
    "layout": layout,
    "material": material,
    "distractor": distractor,
    "paraphrase": paraphrase,
    "camera": camera,
    "lighting": lighting,
}
# operator -> the factors its candidates may change (the module docstring's list)
OPERATOR_FACTORS: dict[str, tuple[str, ...]] = {
    "layout": ("pose",), "material": ("friction", "mass", "colour"), "distractor": ("distractors",),
    "paraphrase": ("instruction",), "camera": ("camera",), "lighting": ("lighting",),
}


def libero_family(config: LiberoChooserConfig) -> OperatorFamily:
    return OperatorFamily(BENCHMARK, OPERATORS, FAILURE_OPERATORS, tuple(config.exploration_operators),
                          config.operators, OPERATOR_FACTORS)
