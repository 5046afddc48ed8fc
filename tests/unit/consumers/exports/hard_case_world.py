"""A small evidence log with every kind of episode the exports must tell apart, built from real
events (producers.synthetic for starts, steps and ends; EpisodeAnalysed as the detector emits it)
and stored through the store's Avro insert, as the sink stores them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from producers.keyframes import KeyframeStore
from producers.synthetic import episodes as synthetic_episodes
from schemas.events import make_event
from tests.store_events import store_events

STEPS = 12
KEYFRAME_EVERY = 4


@dataclass(frozen=True)
class World:
    ended: dict[str, dict]  # episode_id -> EpisodeEnded
    started: dict[str, dict]
    steps: dict[str, list[dict]]
    kinds: dict[str, str]  # episode_id -> failed | recovered | clean_success | harness | unanalysed_failed
    keyframes: Path


def _moment(episode_id: str, failure_type: str, step: int, recovered_step: int = -1, recovery: str = "") -> dict:
    return {"moment_id": f"m-{episode_id}-{failure_type}-{step}", "failure_type": failure_type, "step": step,
            "severity": 0.5, "features": {"eef_x": 0.1, "object_z": 0.82}, "recovered_step": recovered_step,
            "recovery": recovery}


def build_world(store, keyframe_root: Path, base_time: datetime | None = None, n_episodes: int = 8,
                seed: int = 3) -> World:
    """world_events(), stored."""
    world, events = world_events(keyframe_root, base_time, n_episodes, seed)
    store_events(store, events)
    return world


def world_events(keyframe_root: Path, base_time: datetime | None = None, n_episodes: int = 8,
                 seed: int = 3) -> tuple[World, list[dict]]:
    """Episodes of each kind, two days apart from base_time backwards (the first is the oldest),
    with keyframe files written under keyframe_root."""
    base_time = base_time or datetime.now(UTC)
    events = list(synthetic_episodes(n_episodes, STEPS, seed, "export-test"))
    keyframes = KeyframeStore(keyframe_root)
    rng = np.random.default_rng(seed)
    started, ended, steps = {}, {}, {}
    order: list[str] = []
    for event in events:
        kind = event["envelope"]["event_type"]
        episode_id = event["episode_id"]
        if kind == "EpisodeStarted":
            started[episode_id] = event
            order.append(episode_id)
            steps[episode_id] = []
        elif kind == "Step":
            steps[episode_id].append(event)
        else:
            ended[episode_id] = event

    kinds = {}
    plan = ["failed", "recovered", "clean_success", "harness", "unanalysed_failed", "failed", "recovered", "failed"]
    analysed = []
    for index, episode_id in enumerate(order):
        kind = plan[index % len(plan)]
        kinds[episode_id] = kind
        at = base_time - timedelta(days=2 * (len(order) - index))
        success = kind in ("recovered", "clean_success")
        termination = {"failed": "timeout", "unanalysed_failed": "timeout", "harness": "env_error"}.get(kind, "success")
        started[episode_id] = _at(started[episode_id], at)
        for i, step in enumerate(steps[episode_id]):
            sha = None
            if i % KEYFRAME_EVERY == 0:
                frame = rng.integers(0, 255, size=(16, 16, 3), dtype=np.uint8)
                sha = keyframes.put(frame)
            steps[episode_id][i] = {**_at(step, at + timedelta(milliseconds=50 * (i + 1))), "keyframe_sha256": sha}
        end = ended[episode_id]
        ended[episode_id] = {**_at(end, at + timedelta(seconds=5)), "success": success, "termination": termination,
                             "total_reward": float(success)}
        if kind == "failed":
            moments = [_moment(episode_id, "grasp_miss", 3), _moment(episode_id, "timeout", STEPS - 1)]
        elif kind == "recovered":
            moments = [_moment(episode_id, "slip", 5, recovered_step=8, recovery="regrasped")]
        elif kind == "clean_success":
            moments = [_moment(episode_id, "collision", 2)]  # flagged but never recovered: not a hard case
        else:
            moments = []
        if kind != "unanalysed_failed":
            e = ended[episode_id]
            analysed.append(make_event(
                "EpisodeAnalysed", (episode_id,), "failure-detector", "export-test",
                event_time=e["envelope"]["event_time"], episode_id=episode_id, scenario_id=e["scenario_id"],
                model_id=e["model_id"], scenario=started[episode_id]["scenario"], success=success,
                termination=termination, steps=STEPS, quality=e["quality"], analysed=True, reason="",
                moments=moments, detector_version="test"))
    all_events = ([started[e] for e in order] + [s for e in order for s in steps[e]]
                  + [ended[e] for e in order] + analysed)
    return World(ended, started, steps, kinds, keyframe_root), all_events


def _at(event: dict, when: datetime) -> dict:
    return {**event, "envelope": {**event["envelope"], "event_time": when}}


def with_kind(world: World, *kinds: str) -> list[str]:
    return [e for e, k in world.kinds.items() if k in kinds]


__all__ = ["World", "build_world", "world_events", "with_kind", "STEPS", "KEYFRAME_EVERY"]
