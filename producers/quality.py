"""Execution quality of an episode, from its per-step signals and actions: how it was done,
not only whether it succeeded. Pure functions; the result mirrors the Avro ExecutionQuality.

    quality = execution_quality(signals_seq, actions_seq, successes_seq)
    # {"smoothness_jerk", "path_efficiency", "peak_contact_force", "mean_contact_force",
    #  "time_to_success", "regrasp_count", "idle_steps"}

``signals_seq[t]`` is SimEnv.signals() after step t, ``actions_seq[t]`` the action of step t,
``successes_seq[t]`` success_relative() after step t.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from producers.fixed_order import norm

ROBOT_GROUPS = ("gripper", "robot")


@dataclass(frozen=True, kw_only=True)
class QualityConfig:
    """Thresholds of the quality measures.

    control_hz: step rate; turns per-step differences into derivatives.
    idle_speed_mps: an end effector slower than this (m/s) is idle that step.
    gripper_close_above / gripper_open_below: the gripper command (action[-1]) counts as
        "close" once above the first and as "open" once below the second (hysteresis, so
        action noise around +-1 does not count as re-grasping).
    holding_force_n: gripper_force above this (N) means the gripper holds the object.
    min_path_m: paths shorter than this (m) count as no motion: path_efficiency 1.0.
    """

    control_hz: float = 20.0
    idle_speed_mps: float = 0.01
    gripper_close_above: float = 0.5
    gripper_open_below: float = -0.5
    holding_force_n: float = 1.0
    min_path_m: float = 1e-4


DEFAULT_QUALITY = QualityConfig()


def _eef_positions(signals: Sequence[dict[str, Any]]) -> np.ndarray:
    return np.asarray([s["eef_pos"] for s in signals], dtype=float).reshape(-1, 3)


def smoothness_jerk(eef_pos: np.ndarray, control_hz: float = DEFAULT_QUALITY.control_hz) -> float:
    """Mean squared jerk magnitude of the end effector, m^2/s^6 (third finite difference);
    0.0 with fewer than 4 positions. Lower is smoother."""
    p = np.asarray(eef_pos, dtype=float)
    if len(p) < 4:
        return 0.0
    jerk = np.diff(p, n=3, axis=0) * control_hz**3
    return float(np.mean(np.sum(jerk * jerk, axis=1)))


def path_efficiency(eef_pos: np.ndarray, min_path_m: float = DEFAULT_QUALITY.min_path_m) -> float:
    """Straight-line distance from first to last position over the travelled path, 0..1
    (1.0 when the end effector did not move: nothing was wasted)."""
    p = np.asarray(eef_pos, dtype=float)
    if len(p) < 2:
        return 1.0
    travelled = float(np.sum(np.linalg.norm(np.diff(p, axis=0), axis=1)))
    if travelled < min_path_m:
        return 1.0
    return min(1.0, float(norm(p[-1] - p[0])) / travelled)


def robot_contact_force(signals: dict[str, Any]) -> float:
    """Summed normal force (N) of this step's contacts that involve the gripper or the robot:
    the force the policy exerts, not objects resting on the table."""
    return float(sum(c["normal_force"] for c in signals["contacts"]
                     if c["a"] in ROBOT_GROUPS or c["b"] in ROBOT_GROUPS))


def regrasp_count(actions: Sequence[Sequence[float]], signals: Sequence[dict[str, Any]],
                  config: QualityConfig = DEFAULT_QUALITY) -> int:
    """Times the gripper closed again after having been opened while not holding anything.

    The first close is the grasp. A later open -> close transition counts as a regrasp when the
    gripper was not holding the object (gripper_force <= holding_force_n) at that transition,
    i.e. the policy missed or dropped and tried again; releasing a placed object and closing
    again on nothing also counts.
    """
    closed = False
    closes = 0
    regrasps = 0
    for action, sig in zip(actions, signals, strict=True):
        g = float(action[-1])
        if not closed and g > config.gripper_close_above:
            closed = True
            closes += 1
            if closes > 1 and float(sig["gripper_force"]) <= config.holding_force_n:
                regrasps += 1
        elif closed and g < config.gripper_open_below:
            closed = False
    return regrasps


def idle_steps(eef_pos: np.ndarray, config: QualityConfig = DEFAULT_QUALITY) -> int:
    """Steps whose end-effector speed is below idle_speed_mps (the first step, with no
    previous position, is not counted)."""
    p = np.asarray(eef_pos, dtype=float)
    if len(p) < 2:
        return 0
    speed = np.linalg.norm(np.diff(p, axis=0), axis=1) * config.control_hz
    return int(np.count_nonzero(speed < config.idle_speed_mps))


def time_to_success(successes: Sequence[bool]) -> int | None:
    """Index of the first step after which the task was a success, or None."""
    for t, s in enumerate(successes):
        if s:
            return t
    return None


def execution_quality(signals: Sequence[dict[str, Any]], actions: Sequence[Sequence[float]],
                      successes: Sequence[bool] | None = None,
                      config: QualityConfig = DEFAULT_QUALITY) -> dict[str, Any]:
    """All measures for one episode, keyed as the Avro ExecutionQuality record.

    peak_contact_force: max over steps of robot_contact_force (N).
    mean_contact_force: mean of robot_contact_force over the steps where it is non-zero (N),
        0.0 if the robot touched nothing.
    time_to_success: see time_to_success(); None without successes.
    """
    if len(signals) != len(actions):
        raise ValueError(f"{len(signals)} signal dicts but {len(actions)} actions")
    if successes is not None and len(successes) != len(signals):
        raise ValueError(f"{len(signals)} signal dicts but {len(successes)} success flags")
    eef = _eef_positions(signals)
    forces = np.array([robot_contact_force(s) for s in signals], dtype=float)
    touching = forces[forces > 0]
    return {
        "smoothness_jerk": smoothness_jerk(eef, config.control_hz),
        "path_efficiency": path_efficiency(eef, config.min_path_m),
        "peak_contact_force": float(forces.max()) if len(forces) else 0.0,
        "mean_contact_force": float(touching.mean()) if len(touching) else 0.0,
        "time_to_success": time_to_success(successes) if successes is not None else None,
        "regrasp_count": regrasp_count(actions, signals, config),
        "idle_steps": idle_steps(eef, config),
    }
