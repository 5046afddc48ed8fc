"""Synthetic EpisodeAnalysed events (failures.episodes), deterministic by seed, for clusterer tests.

    events = analysed_episodes(200, seed=3)   # dicts shaped by schemas/avro/EpisodeAnalysed.avsc

Failed episodes follow four failure profiles with distinct moments, sites and scenarios, so they
form four clusters: "slippery" (slip, drop, timeout; low friction), "miss" (grasp_miss, stall,
timeout; offset pose), "cluttered" (collision, knocked_object, timeout; distractors) and
"reach" (out_of_reach, timeout; far placement). Mixed in: successes (some with a recovered
grasp_miss), episodes the detector could not analyse, and env_error terminations, none of which
the clusterer takes in. Event times are fixed (one second apart), so the same seed gives
byte-identical events.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from producers.episode import HARNESS_TERMINATIONS
from producers.synthetic import scenario as synthetic_scenario
from schemas.events import make_event, stable_id

KINDS = ("slippery", "miss", "cluttered", "reach")
MODELS = ("model-a", "model-b")
T0 = datetime(2025, 1, 1, tzinfo=UTC)
STEPS = 200


def _scenario(kind: str, variant: int) -> dict:
    spec = synthetic_scenario(KINDS.index(kind) * 2 + variant)
    if kind == "slippery":
        spec.update(object_friction=0.1, object_mass=0.5)
    elif kind == "miss":
        spec.update(pose_offset_xyz=[0.05, 0.0, 0.0])
    elif kind == "cluttered":
        spec.update(distractors=[{"kind": "box", "size": 0.02, "x": 0.1 * i, "y": 0.1} for i in range(3)])
    else:
        spec.update(placement_x_range=[0.25, 0.3])
    spec["scenario_id"] = f"scn-{kind}-{variant}"
    return spec


def _moment(episode_id: str, failure_type: str, step: int, severity: float, rng, recovered_step: int = -1,
            recovery: str = "", **features) -> dict:
    site = {"eef_x": 0.1 + 0.01 * rng.normal(), "eef_y": 0.02 * rng.normal(), "eef_z": 0.9 + 0.01 * rng.normal(),
            "object_x": 0.1 + 0.01 * rng.normal(), "object_y": 0.01 * rng.normal(), "object_z": 0.82,
            "object_dx": 0.005 * rng.normal(), "object_dy": 0.005 * rng.normal()}
    feats = {"goal_distance_m": 0.04, "object_lift_m": 0.0, **site, **features}
    return {"moment_id": stable_id("FailureMoment", episode_id, failure_type, step), "failure_type": failure_type,
            "step": int(step), "severity": float(severity), "features": {k: float(v) for k, v in feats.items()},
            "recovered_step": recovered_step, "recovery": recovery}


def _failure_moments(kind: str, episode_id: str, rng) -> tuple[list[dict], float]:
    j = int(rng.integers(-8, 9))
    if kind == "slippery":
        return [_moment(episode_id, "slip", 60 + j, 0.6, rng, object_lift_m=0.08, grip_force_n=12.0),
                _moment(episode_id, "drop", 63 + j, 0.4, rng),
                _moment(episode_id, "timeout", STEPS - 1, 1.0, rng)], 40.0
    if kind == "miss":
        return [_moment(episode_id, "grasp_miss", 45 + j, 1.0, rng, peak_grip_force_n=2.0),
                _moment(episode_id, "stall", 110 + j, 1.0, rng),
                _moment(episode_id, "timeout", STEPS - 1, 1.0, rng)], 5.0
    if kind == "cluttered":
        return [_moment(episode_id, "collision", 30 + j, 0.5, rng, force_n=80.0),
                _moment(episode_id, "knocked_object", 32 + j, 0.4, rng, displacement_m=0.08),
                _moment(episode_id, "timeout", STEPS - 1, 1.0, rng)], 80.0
    return [_moment(episode_id, "out_of_reach", 70 + j, 0.8, rng, hand_to_target_m=0.2),
            _moment(episode_id, "timeout", STEPS - 1, 1.0, rng)], 10.0


def analysed_episodes(n: int, seed: int, run_id: str = "analysed", failure_share: float = 0.7) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        episode_id = f"ana-{stable_id(seed, i)[:16]}"
        kind = KINDS[int(rng.integers(len(KINDS)))]
        spec = _scenario(kind, int(rng.integers(2)))
        model_id = MODELS[int(rng.integers(len(MODELS)))]
        roll = rng.random()
        success, termination, analysed, reason = False, "timeout", True, ""
        moments, peak = _failure_moments(kind, episode_id, rng)
        if roll >= failure_share:
            success, termination, peak = True, "success", 5.0
            moments = [_moment(episode_id, "grasp_miss", 40, 1.0, rng, recovered_step=60, recovery="regrasped")] \
                if rng.random() < 0.5 else []
        elif roll >= failure_share - 0.03:
            analysed, reason, moments = False, "too many steps before EpisodeStarted", []
        elif roll >= failure_share - 0.05:
            termination, moments = "env_error", []
        quality = {"smoothness_jerk": 1.0, "path_efficiency": 0.5,
                   "peak_contact_force": peak * (1 + 0.1 * rng.normal()), "mean_contact_force": peak / 4,
                   "time_to_success": 150 if success else None,
                   "regrasp_count": 0, "idle_steps": 0}
        out.append(make_event("EpisodeAnalysed", (episode_id,), "failure-detector", run_id,
                              event_time=T0 + timedelta(seconds=i),
                              episode_id=episode_id, scenario_id=spec["scenario_id"], model_id=model_id,
                              scenario=spec, success=success, termination=termination, steps=STEPS,
                              quality=quality, analysed=analysed, reason=reason, moments=moments,
                              detector_version="synthetic"))
    return out


def kind_of(event: dict) -> str:
    """The failure profile an event was made from."""
    return event["scenario_id"].split("-")[1]


def is_failure(event: dict) -> bool:
    return not event["success"] and event["analysed"] and event["termination"] not in HARNESS_TERMINATIONS
