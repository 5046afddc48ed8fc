"""Synthetic rollout traffic: schema-valid episodes and steps, deterministic by seed.

Exercises and benchmarks the spine without a simulator. The same seed gives the same events
(ids and contents); only envelope.event_time is the wall clock, so lag can be measured.

Usage:
    sepa-eval synth --episodes 100 --steps 200 --seed 7
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from schemas.events import make_event, stable_id

PRODUCER = "synthetic"
MODELS = ("synthetic-strong", "synthetic-weak")


def scenario(index: int) -> dict:
    env_name = ("Lift", "Stack", "PickPlaceCan")[index % 3]
    spec = {
        "scenario_id": "", "parent_id": None, "benchmark": "synthetic", "env_name": env_name, "robot": "Panda",
        "horizon": 200, "instruction": f"synthetic {env_name.lower()} task {index}",
        "placement_x_range": [], "placement_y_range": [], "pose_offset_xyz": [0.0, 0.0, 0.0],
        "object_friction": None, "object_mass": None, "object_rgba": [], "object_size_scale": 1.0,
        "distractors": [], "seed": index,
    }
    spec["scenario_id"] = "scn-" + stable_id(*sorted(spec.items()))[:16]
    return spec


def episodes(n_episodes: int, steps_per_episode: int, seed: int, run_id: str,
             n_scenarios: int = 6) -> Iterator[dict]:
    """Yields EpisodeStarted, its Steps, EpisodeEnded for each episode, in order."""
    rng = np.random.default_rng(seed)
    scenarios = [scenario(i) for i in range(n_scenarios)]
    for e in range(n_episodes):
        spec = scenarios[int(rng.integers(n_scenarios))]
        model_id = MODELS[int(rng.integers(len(MODELS)))]
        episode_id = f"syn-{stable_id(seed, e)[:20]}"
        yield make_event("EpisodeStarted", (episode_id,), PRODUCER, run_id,
                         episode_id=episode_id, request_id=None, benchmark="synthetic",
                         task=spec["env_name"], scenario_id=spec["scenario_id"], scenario=spec,
                         instruction=spec["instruction"], model_id=model_id, model_version="1",
                         seed=seed * 100003 + e)
        yield from _steps(rng, episode_id, steps_per_episode, run_id)
        success = bool(rng.random() < (0.8 if model_id == MODELS[0] else 0.4))
        yield make_event("EpisodeEnded", (episode_id,), PRODUCER, run_id,
                         episode_id=episode_id, scenario_id=spec["scenario_id"], model_id=model_id,
                         success=success, termination="success" if success else "timeout",
                         steps=steps_per_episode, total_reward=float(success),
                         quality={"smoothness_jerk": float(rng.gamma(2.0)), "path_efficiency": float(rng.random()),
                                  "peak_contact_force": float(rng.gamma(3.0, 5.0)),
                                  "mean_contact_force": float(rng.gamma(2.0, 2.0)),
                                  "time_to_success": steps_per_episode if success else None,
                                  "regrasp_count": int(rng.integers(3)), "idle_steps": int(rng.integers(20))},
                         error=None, final_keyframe_sha256=None)


def _steps(rng: np.random.Generator, episode_id: str, n: int, run_id: str) -> Iterator[dict]:
    # One random walk per episode, drawn up front: vectorised draws keep synth cheap enough to
    # benchmark the sink rather than numpy.
    eef = np.cumsum(rng.normal(0, 0.005, size=(n, 3)), axis=0) + [0.0, 0.0, 1.0]
    actions = rng.normal(0, 0.3, size=(n, 7)).round(4).tolist()
    torques = rng.normal(0, 5.0, size=(n, 7)).round(3).tolist()
    joints = rng.normal(0, 1.0, size=(n, 7)).round(4).tolist()
    forces = rng.gamma(2.0, 2.0, size=n).round(3).tolist()
    lift = np.clip(np.cumsum(rng.normal(0, 0.002, size=n)), 0, None).round(4).tolist()
    eef_list = eef.round(4).tolist()
    for t in range(n):
        pos = eef_list[t]
        yield make_event("Step", (episode_id, t), PRODUCER, run_id,
                         episode_id=episode_id, t=t, action=actions[t], eef_pos=pos,
                         eef_quat=[0.0, 1.0, 0.0, 0.0], gripper_opening=0.04, gripper_force=forces[t],
                         object_poses=[{"name": "cube", "pos": [pos[0], pos[1], 0.82 + lift[t]],
                                        "quat": [0.0, 0.0, 0.0, 1.0]}],
                         contacts=[{"a": "gripper", "b": "cube", "normal_force": forces[t]}],
                         joint_torques=torques[t], joint_pos=joints[t], reward=0.0,
                         goal_distance=max(0.0, 0.04 - lift[t]), object_lift=lift[t], keyframe_sha256=None)


def interleaved(*streams: Iterable[dict]) -> list[dict]:
    """Events of producers running side by side (rollout workers, say): one from each in turn
    until every stream is exhausted. Each stream keeps its own order."""
    iterators = [iter(s) for s in streams]
    out: list[dict] = []
    while iterators:
        for it in list(iterators):
            try:
                out.append(next(it))
            except StopIteration:
                iterators.remove(it)
    return out
