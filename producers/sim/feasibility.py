"""Feasibility pre-check of a candidate scenario: can the task be attempted at all?

    result = check_feasibility(spec)                  # FeasibilityResult
    result.feasible, result.reason                    # False, "cube out of reach on seed 0: ..."
    result.measures                                   # worst values over the seeds, by name
    result.to_json()                                  # CandidateProposed.feasibility_json

A candidate that fails this is counted, not proposed: its validation rollouts would measure a
broken scene, not a hard task. The checks, in order (the first that fails is the reason):

1. Spec level, no simulation: the place target (lift then place) within the arm's reach radius
   of the robot base and clear of every distractor; no two distractors' footprints overlapping.
2. The scene builds (robosuite accepts the model).
3. On each of ``config.seeds``:
   - the reset succeeds (robosuite's sampler finds a spot for every object);
   - nothing interpenetrates at spawn: no contact involving an object deeper than
     ``max_spawn_penetration_m`` once the objects are placed, before they settle;
   - every object rests on the surface after the settle steps: slower than
     ``max_rest_speed_m_s``, its lowest point within ``max_rest_gap_m`` of the surface (not on
     another object, not sunk, not fallen off);
   - no distractor's footprint overlaps the manipulated object's (horizontal gap >=
     ``min_footprint_gap_m``);
   - the target is reachable: the oracle's own approach and descent brings the grip site within
     ``max_reach_miss_m`` of the grasp point (where the oracle closes), within
     ``reach_check_steps`` control steps.
4. The oracle solves it: a whole oracle episode succeeds on all the seeds but one (at least one;
   ``min_oracle_successes`` sets another count), as LIBERO's pre-check asks. A scene can be sound
   and still beyond the oracle (a cube too slippery for its grip, a horizon it cannot finish in);
   the robustness critic would reject such a candidate only after spending validation rollouts of
   every model on it, and its slot in the cycle would go to nothing. Two of the three default
   seeds, not three: an oracle that solves a scenario 95% of the time fails two of three less than
   1% of the time.

Measures are functions of (spec, seeds) alone (the simulation is deterministic), so the same
candidate gets the same feasibility_json; the wall time of the check is in ``cost_s`` and kept
out of it. Cost on this machine: ~0.1 s to build the env (the first in a process ~0.8 s) plus
~0.1 s per seed for checks 1-3, and an oracle episode (~0.2-0.6 s) per seed for check 4;
``bench`` figures in the generate report.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mujoco
import numpy as np

from producers.fixed_order import dot, norm
from producers.sim.envs import SimEnv, make_env
from producers.sim.exceptions import EnvError
from producers.sim.policies import GRASP_DZ_M, OracleScripted
from producers.sim.rollout import run_episode
from schemas.scenario import Distractor, ScenarioSpec

# Where robosuite mounts the Panda relative to the Lift/Stack table centre (x, y), m. Measured:
# the oracle reaches the grasp point of a cube 0.81 m from it and misses by 5 cm at 0.86 m.
ROBOT_BASE_XY_FROM_TABLE = (-0.56, 0.0)


@dataclass(frozen=True, kw_only=True)
class FeasibilityConfig:
    """Thresholds of the pre-check (see the module docstring for what each bounds)."""

    seeds: tuple[int, ...] = (0, 1, 2)
    max_spawn_penetration_m: float = 0.003
    max_rest_speed_m_s: float = 0.02
    max_rest_gap_m: float = 0.005
    min_footprint_gap_m: float = 0.0
    reach_check_steps: int = 90
    max_reach_miss_m: float = 0.025
    # horizontal distance from the robot base a place target may be at (the measured reach, above)
    max_reach_radius_m: float = 0.82
    # of ``seeds``: whole oracle episodes that must succeed; None: all but one (at least one); 0: not checked
    min_oracle_successes: int | None = None

    def __post_init__(self) -> None:
        if not self.seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in self.seeds):
            raise ValueError(f"FeasibilityConfig.seeds must be non-negative integers, got {self.seeds!r}")
        object.__setattr__(self, "seeds", tuple(self.seeds))
        for name in ("max_spawn_penetration_m", "max_rest_speed_m_s", "max_rest_gap_m", "max_reach_miss_m",
                     "max_reach_radius_m"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"FeasibilityConfig.{name} must be a positive number, got {v!r}")
        if isinstance(self.reach_check_steps, bool) or not isinstance(self.reach_check_steps, int) \
                or self.reach_check_steps < 1:
            raise ValueError(f"FeasibilityConfig.reach_check_steps must be a positive integer, "
                             f"got {self.reach_check_steps!r}")
        m = self.min_oracle_successes
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or not 0 <= m <= len(self.seeds)):
            raise ValueError(f"FeasibilityConfig.min_oracle_successes must be an integer in [0, "
                             f"{len(self.seeds)}] (the number of seeds) or None, got {m!r}")

    @property
    def oracle_successes_needed(self) -> int:
        m = self.min_oracle_successes
        return max(1, len(self.seeds) - 1) if m is None else m


@dataclass(frozen=True)
class FeasibilityResult:
    """``measures``: the worst value of each measure over the seeds checked (m, m/s), plus
    ``seeds_checked``; ``reason`` says which check failed, with the value and the threshold."""

    scenario_id: str
    feasible: bool
    reason: str
    measures: dict[str, float] = field(default_factory=dict)
    cost_s: float = 0.0  # wall time of the check; not part of to_json()

    def to_json(self) -> str:
        return json.dumps({"feasible": self.feasible, "reason": self.reason, **self.measures},
                          sort_keys=True, separators=(",", ":"))


class _Infeasible(Exception):
    pass


# -- footprints (horizontal shapes) ---------------------------------------------------------

@dataclass(frozen=True)
class _Footprint:
    """A circle (half=None) or a rectangle (half-extents, yaw) in the table plane."""

    centre: np.ndarray
    radius: float = 0.0
    half: tuple[float, float] | None = None
    yaw: float = 0.0


def _axes(f: _Footprint) -> list[np.ndarray]:
    c, s = math.cos(f.yaw), math.sin(f.yaw)
    return [np.array([c, s]), np.array([-s, c])]


def _point_rect_distance(p: np.ndarray, f: _Footprint) -> float:
    """Signed distance from p to rectangle f (negative inside)."""
    ax = _axes(f)
    d = p - f.centre
    local = np.array([abs(float(dot(d, ax[0]))), abs(float(dot(d, ax[1])))]) - np.array(f.half)
    outside = float(norm(np.maximum(local, 0.0)))
    inside = float(min(max(local[0], local[1]), 0.0))
    return outside + inside


def footprint_gap(a: _Footprint, b: _Footprint) -> float:
    """Horizontal clearance between two footprints, m; negative when they overlap."""
    if a.half is None and b.half is None:
        return float(norm(a.centre - b.centre)) - a.radius - b.radius
    if a.half is None:
        return _point_rect_distance(a.centre, b) - a.radius
    if b.half is None:
        return _point_rect_distance(b.centre, a) - b.radius
    # rectangles: separating-axis gap (exact when they overlap, a lower bound otherwise)
    d = b.centre - a.centre
    gaps = []
    for axis in _axes(a) + _axes(b):
        ra = sum(h * abs(float(dot(axis, e))) for h, e in zip(a.half, _axes(a), strict=True))
        rb = sum(h * abs(float(dot(axis, e))) for h, e in zip(b.half, _axes(b), strict=True))
        gaps.append(abs(float(dot(d, axis))) - ra - rb)
    return max(gaps)


def _distractor_footprint(d: Distractor, ref_xy: np.ndarray) -> _Footprint:
    centre = ref_xy + np.array([d.x, d.y])
    if d.kind == "box":  # placed axis-aligned
        return _Footprint(centre, half=(d.size, d.size))
    return _Footprint(centre, radius=d.size)


def _body_footprint(env: SimEnv, body: int) -> _Footprint:
    """The footprint of a free body's largest collision geom, as placed now."""
    m, d = env.model, env.data
    geoms = [g for g in np.flatnonzero(m.body_rootid[m.geom_bodyid] == body)
             if m.geom_contype[g] or m.geom_conaffinity[g]]
    g = max(geoms, key=lambda i: float(m.geom_rbound[i]))
    centre = np.array(d.geom_xpos[g][:2])
    kind = int(m.geom_type[g])
    if kind == mujoco.mjtGeom.mjGEOM_BOX:
        r = d.geom_xmat[g].reshape(3, 3)
        return _Footprint(centre, half=(float(m.geom_size[g][0]), float(m.geom_size[g][1])),
                          yaw=math.atan2(r[1, 0], r[0, 0]))
    if kind in (mujoco.mjtGeom.mjGEOM_SPHERE, mujoco.mjtGeom.mjGEOM_CYLINDER, mujoco.mjtGeom.mjGEOM_CAPSULE):
        return _Footprint(centre, radius=float(m.geom_size[g][0]))
    half = m.geom_aabb[g][3:5]
    return _Footprint(centre, radius=float(max(half)))


def _lowest_z(env: SimEnv, body: int) -> float:
    """World height of the lowest point of a free body's collision geoms (their bounding boxes)."""
    m, d = env.model, env.data
    lowest = math.inf
    for g in np.flatnonzero(m.body_rootid[m.geom_bodyid] == body):
        if not (m.geom_contype[g] or m.geom_conaffinity[g]):
            continue
        row = d.geom_xmat[g].reshape(3, 3)[2]  # world z of each local axis
        centre, half = m.geom_aabb[g][:3], m.geom_aabb[g][3:]
        z = float(d.geom_xpos[g][2] + dot(row, centre) - dot(np.abs(row), half))
        lowest = min(lowest, z)
    return lowest


# -- the check ------------------------------------------------------------------------------

def _spec_checks(spec: ScenarioSpec, cfg: FeasibilityConfig, measures: dict[str, float]) -> None:
    ref = np.zeros(2)  # distractor and place-target x/y share the placement reference
    prints = [(f"distractor{i}", _distractor_footprint(d, ref)) for i, d in enumerate(spec.distractors)]
    worst = math.inf
    for i, (na, fa) in enumerate(prints):
        for nb, fb in prints[i + 1:]:
            gap = footprint_gap(fa, fb)
            worst = min(worst, gap)
            if gap < cfg.min_footprint_gap_m:
                measures["min_distractor_gap_m"] = _r(gap)
                raise _Infeasible(f"{na} and {nb} overlap: footprint gap {gap:.4f} m < {cfg.min_footprint_gap_m} m")
    if prints and math.isfinite(worst):
        measures["min_distractor_gap_m"] = _r(worst)
    if spec.place_target_xy is not None:
        target = np.asarray(spec.place_target_xy, dtype=float)
        radius = float(norm(target - np.asarray(ROBOT_BASE_XY_FROM_TABLE)))
        measures["place_target_radius_m"] = _r(radius)
        if radius > cfg.max_reach_radius_m:
            raise _Infeasible(f"place target {tuple(spec.place_target_xy)} is {radius:.3f} m from the robot base, "
                              f"beyond the reach radius {cfg.max_reach_radius_m} m")
        # the placed object needs room: its own half-size, conservatively the default cube's
        spot = _Footprint(target, radius=0.03 * spec.object_size_scale)
        for name, fp in prints:
            gap = footprint_gap(spot, fp)
            if gap < cfg.min_footprint_gap_m:
                raise _Infeasible(f"place target {tuple(spec.place_target_xy)} is covered by {name}: "
                                  f"gap {gap:.4f} m")


def _r(v: float) -> float:
    return round(float(v), 6)


def _worst(measures: dict[str, float], name: str, value: float, larger_is_worse: bool = True) -> None:
    v = _r(value)
    if name not in measures or (v > measures[name] if larger_is_worse else v < measures[name]):
        measures[name] = v


def _check_seed(env: SimEnv, seed: int, cfg: FeasibilityConfig, measures: dict[str, float]) -> None:
    try:
        obs = env.reset(seed)
    except EnvError as exc:
        raise _Infeasible(f"reset fails on seed {seed}: {exc.__cause__ or exc!r}") from None
    _worst(measures, "max_spawn_penetration_m", env.spawn_penetration_m)
    if env.spawn_penetration_m > cfg.max_spawn_penetration_m:
        raise _Infeasible(f"objects interpenetrate at spawn on seed {seed}: contact {env.spawn_penetration_m:.4f} m "
                          f"deep > {cfg.max_spawn_penetration_m} m")
    surface = env.surface_z()
    bodies = env.object_bodies()
    for name, body in bodies.items():
        adr = env.model.jnt_dofadr[env.model.body_jntadr[body]]
        speed = float(norm(env.data.qvel[adr:adr + 3]))
        gap = _lowest_z(env, body) - surface
        _worst(measures, "max_rest_speed_m_s", speed)
        _worst(measures, "max_rest_gap_m", abs(gap))
        if speed > cfg.max_rest_speed_m_s:
            raise _Infeasible(f"{name} still moving after the settle steps on seed {seed}: {speed:.4f} m/s > "
                              f"{cfg.max_rest_speed_m_s} m/s")
        if abs(gap) > cfg.max_rest_gap_m:
            where = "above" if gap > 0 else "below"
            raise _Infeasible(f"{name} does not rest on the surface on seed {seed}: its lowest point is "
                              f"{abs(gap):.4f} m {where} it (> {cfg.max_rest_gap_m} m)")
    target = env.manipulated_name
    target_print = _body_footprint(env, bodies[target])
    for name, body in bodies.items():
        if not name.startswith("distractor"):
            continue
        gap = footprint_gap(target_print, _body_footprint(env, body))
        _worst(measures, "min_target_distractor_gap_m", gap, larger_is_worse=False)
        if gap < cfg.min_footprint_gap_m:
            raise _Infeasible(f"{name} overlaps {target} on seed {seed}: footprint gap {gap:.4f} m")
    _worst(measures, "max_reach_miss_m", _reach_miss(env, obs, seed, cfg))
    if measures["max_reach_miss_m"] > cfg.max_reach_miss_m:
        raise _Infeasible(f"{target} not reachable on seed {seed}: the oracle's grip site gets no closer than "
                          f"{measures['max_reach_miss_m']:.4f} m to the grasp point (> {cfg.max_reach_miss_m} m)")


def _reach_miss(env: SimEnv, obs: dict, seed: int, cfg: FeasibilityConfig) -> float:
    """Closest the oracle's grip site gets to the grasp point before it closes (or gives up),
    from the state reset(seed) left (``obs``)."""
    oracle = OracleScripted()
    oracle.reset(seed, env.spec)
    signals = env.signals()
    target = env.manipulated_name
    best = math.inf
    for _ in range(min(cfg.reach_check_steps, env.spec.horizon)):
        obs, _, _, _ = env.step(oracle.act(obs, signals))
        signals = env.signals()
        obj = next(p["pos"] for p in signals["object_poses"] if p["name"] == target)
        grasp = np.asarray(obj) + np.array([0.0, 0.0, GRASP_DZ_M])
        best = min(best, float(norm(np.asarray(signals["eef_pos"]) - grasp)))
        if oracle.phase not in ("approach", "descend"):
            break
    return best


def _check_oracle_solves(env: SimEnv, cfg: FeasibilityConfig, measures: dict[str, Any]) -> None:
    """Whole oracle episodes, seed by seed, until enough succeed or too many have failed."""
    need = cfg.oracle_successes_needed
    if not need:
        return
    solved, failed = 0, []
    for seed in cfg.seeds:
        outcome, _ = run_episode(env, OracleScripted(), seed)
        if outcome.success:
            solved += 1
        else:
            failed.append(f"seed {seed}: {outcome.termination} after {outcome.steps} steps"
                          + (f", {outcome.error}" if outcome.error else ""))
        if solved >= need or len(cfg.seeds) - len(failed) < need:
            break
    measures["oracle_solved"] = solved
    measures["oracle_tried"] = solved + len(failed)
    if solved < need:
        raise _Infeasible(f"the oracle does not solve it: {solved} of {solved + len(failed)} episodes "
                          f"succeeded, {need} needed ({'; '.join(failed)})")


def check_feasibility(spec: ScenarioSpec, config: FeasibilityConfig | None = None,
                      env_factory: Callable[[ScenarioSpec], SimEnv] | None = None) -> FeasibilityResult:
    """Runs the checks on ``spec``. ``env_factory`` (default make_env) builds the env; an env
    built by the default factory is closed afterwards."""
    cfg = config or FeasibilityConfig()
    t0 = time.perf_counter()
    measures: dict[str, Any] = {}
    env: SimEnv | None = None
    try:
        _spec_checks(spec, cfg, measures)
        try:
            env = (env_factory or make_env)(spec)
        except EnvError as exc:
            raise _Infeasible(f"the scene does not build: {exc.__cause__ or exc!r}") from None
        checked = 0
        for seed in cfg.seeds:
            _check_seed(env, seed, cfg, measures)
            checked += 1
        measures["seeds_checked"] = checked
        _check_oracle_solves(env, cfg, measures)
        feasible, reason = True, ""
    except _Infeasible as exc:
        feasible, reason = False, str(exc)
    finally:
        if env is not None and env_factory is None:
            env.close()
    return FeasibilityResult(spec.scenario_id, feasible, reason, measures, round(time.perf_counter() - t0, 3))
