"""The coverage sweep: every factor at a few fixed magnitudes, in the style of LIBERO-Plus, as a
baseline for failure-guided generation and as the way to build a broad reference suite.

    spec = fixed_variant(base, "friction", 0.06)         # one factor of the base at one magnitude
    gen = coverage_candidates([base], n=4, exclude=seen) # Generated: the next n grid points not yet proposed

No failure, no randomness: a grid point is (factor, magnitude) applied to a base scenario, and a
cycle of the coverage arm proposes the next ``n`` grid points that are not in ``exclude`` (the
scenarios proposed before), so the arm walks the grid in order across cycles. The grid is walked
level by level (every factor at its middle magnitude, then the hardest, then the mildest), and
colour and instruction come after all the rest, and only for cycles with a model that sees pixels
or reads words (a policy server, issue 19): the scripted models and the oracle read poses.

Magnitudes (``fixed_variant``), for a robosuite parent:
- placement: the object's start range (1 cm half width) moved this far (m) from the parent's
  centre, away from the gripper's start;
- pose: the object's pose offset moved this far (m) sideways (across the line from the gripper);
- friction, mass: the object's sliding friction, its mass (kg);
- distractors: one more box (2 cm half size) this far (m) from the object's centre, towards the
  gripper's start: in the approach;
- hold: lift, then hold this many steps (the horizon extended by as much);
- place (Lift): lift, then place at a target this far (m) from the object's start, sideways;
- time_budget: the horizon cut to this fraction of the parent's;
- colour: COLOURS[i]; instruction: the paraphrase template i of the task.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import numpy as np

from producers.fixed_order import norm
from schemas.libero_scenario import LiberoScenario
from schemas.scenario import (
    GRIPPER_START_XY,
    MAX_HORIZON,
    PLACEMENT_REFERENCE_XY,
    Distractor,
    ScenarioError,
    ScenarioSpec,
)
from streams.mutations.chooser import Generated, Skipped
from streams.mutations.exceptions import OperatorError
from streams.mutations.operators import PERCEPTION_FACTORS, Candidate, _placement_centre, _r, _s
from streams.mutations.paraphrasers import _TEMPLATES, _task_kind

GENERATOR = "coverage"
PLACEMENT_HALF_WIDTH_M = 0.01
DISTRACTOR_HALF_SIZE_M = 0.02
COLOURS = ((0.1, 0.3, 0.9, 1.0), (0.1, 0.8, 0.2, 1.0), (0.95, 0.85, 0.1, 1.0))  # blue, green, yellow
# factor -> (middle, hardest, mildest): the order each level is walked in
GRID: dict[str, tuple[float, ...]] = {
    "placement": (0.16, 0.22, 0.10),
    "pose": (0.10, 0.14, 0.06),
    "friction": (0.06, 0.025, 0.3),
    "mass": (3.5, 6.0, 1.5),
    "distractors": (0.075, 0.06, 0.10),
    "hold": (80, 120, 40),
    "place": (0.15, 0.20, 0.10),
    "time_budget": (0.45, 0.35, 0.6),
    "colour": (0, 1, 2),
    "instruction": (0, 1, 2),
}
# walked after every level of the rest, and left out when no model perceives (agent.py)
LAST = tuple(f for f in GRID if f in PERCEPTION_FACTORS)
OPERATOR_OF = {"placement": "pose", "pose": "pose", "friction": "material", "mass": "material",
               "colour": "material", "distractors": "distractor", "hold": "horizon_extension",
               "place": "horizon_extension", "time_budget": "time_budget", "instruction": "paraphrase"}


def grid_order(grid: dict[str, tuple[float, ...]] = GRID) -> list[tuple[str, float]]:
    """(factor, magnitude) in the order the arm walks them."""
    first = [f for f in grid if f not in LAST]
    rest = [f for f in grid if f in LAST]
    levels = max(len(v) for v in grid.values())
    return [(f, grid[f][i]) for group in (first, rest) for i in range(levels) for f in group if i < len(grid[f])]


def _away_from_gripper(parent: ScenarioSpec) -> np.ndarray:
    """Unit vector from the gripper's start to the parent's placement centre (+x when they line up)."""
    centre = _placement_centre(parent)
    hand = np.asarray(GRIPPER_START_XY[parent.env_name]) - np.asarray(PLACEMENT_REFERENCE_XY[parent.env_name])
    v = centre - hand
    n = float(norm(v))
    return v / n if n > 1e-3 else np.array([1.0, 0.0])


def fixed_variant(parent: ScenarioSpec, factor: str, magnitude: float) -> ScenarioSpec:
    """``parent`` with ``factor`` set to ``magnitude`` (see the module's list). Raises
    OperatorError naming the factor when the variant is not a valid scenario or the factor does
    not apply (place on a task other than Lift)."""
    away = _away_from_gripper(parent)
    side = np.array([-away[1], away[0]])
    centre = _placement_centre(parent)
    try:
        if factor == "placement":
            c = centre + away * magnitude
            h = PLACEMENT_HALF_WIDTH_M
            return parent.mutate(placement_x_range=(_r(c[0] - h), _r(c[0] + h)),
                                 placement_y_range=(_r(c[1] - h), _r(c[1] + h)))
        if factor == "pose":
            old = parent.pose_offset_xyz
            return parent.mutate(pose_offset_xyz=(_r(old[0] + side[0] * magnitude),
                                                  _r(old[1] + side[1] * magnitude), old[2]))
        if factor == "friction":
            return parent.mutate(object_friction=_r(magnitude))
        if factor == "mass":
            return parent.mutate(object_mass=_r(magnitude))
        if factor == "colour":
            return parent.mutate(object_rgba=COLOURS[int(magnitude)])
        if factor == "distractors":
            xy = centre - away * magnitude
            return parent.mutate(distractors=parent.distractors + (
                Distractor(kind="box", size=DISTRACTOR_HALF_SIZE_M, x=_r(xy[0]), y=_r(xy[1])),))
        if factor == "hold":
            steps = int(magnitude)
            return parent.mutate(success_hold_steps=steps, horizon=min(parent.horizon + steps, MAX_HORIZON))
        if factor == "place":
            if parent.env_name != "Lift" or parent.place_target_xy is not None:
                raise OperatorError(f"coverage: place applies to a Lift scenario without a place target, "
                                    f"not {parent.scenario_id}")
            t = centre + side * magnitude
            return parent.mutate(place_target_xy=(_r(t[0]), _r(t[1])))
        if factor == "time_budget":
            return parent.mutate(horizon=max(1, round(parent.horizon * magnitude)))
        if factor == "instruction":
            templates = _TEMPLATES[_task_kind(parent)]
            return parent.mutate(instruction=templates[int(magnitude) % len(templates)])
    except ScenarioError as exc:
        raise OperatorError(f"coverage: {factor} at {magnitude} is not a valid variant of "
                            f"{parent.scenario_id}: {exc}") from exc
    raise OperatorError(f"coverage: unknown factor {factor!r}; the grid has {sorted(GRID)}")


def coverage_candidates(parents: Sequence[ScenarioSpec | LiberoScenario], n: int,
                        exclude: Iterable[str] = (), factors: Collection[str] | None = None) -> Generated:
    """The next ``n`` grid points, over the parents in id order, whose scenarios are not in
    ``exclude`` (and whose factor is in ``factors``, when given), and the grid points skipped with
    why (LIBERO parents are not on the grid)."""
    seen = set(exclude)
    out = Generated([], [])
    for parent in sorted(parents, key=lambda p: p.scenario_id):
        if isinstance(parent, LiberoScenario):
            out.skipped.append(Skipped(parent.scenario_id, "coverage: the grid is robosuite's; a LIBERO parent "
                                                           "is not swept"))
            continue
        for factor, magnitude in grid_order():
            if len(out.candidates) >= n:
                return out
            if factors is not None and factor not in factors:
                continue
            try:
                spec = fixed_variant(parent, factor, magnitude)
            except OperatorError as exc:
                out.skipped.append(Skipped(f"{parent.scenario_id} {factor}={magnitude}", str(exc)))
                continue
            if spec.scenario_id in seen or spec.scenario_id == parent.scenario_id:
                continue
            seen.add(spec.scenario_id)
            out.candidates.append(Candidate(
                spec=spec, parent=parent, operator=OPERATOR_OF[factor], factor=factor,
                params={"magnitude": _s(float(magnitude)), "level": _s(GRID[factor].index(magnitude)),
                        "chosen_by": GENERATOR},
                generator=GENERATOR))
    return out
