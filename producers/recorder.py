"""The recorder: turn any gym-style reset/step loop into SEPA-Eval events.

Eval farms run their own simulators and policies; this is their API. The robosuite worker uses
it too, so both publish the same events with the same guarantees (stable ids: re-running the
same episode re-publishes identical facts, which the evidence log counts once).

    identity = EpisodeIdentity(run_id="farm-7", benchmark="libero", task="libero_spatial/3",
                               scenario=task_scenario("libero", "libero_spatial/3", "pick up the bowl", 300),
                               model_id="my-vla", model_version="2.1", seed=0)
    with EpisodeRecorder(publisher, identity, keyframes=KeyframeStore(path)) as rec:
        obs = env.reset()
        for t in range(horizon):
            action = policy(obs)
            obs, reward, done, info = env.step(action)
            rec.step(action, signals_from(env), reward, success=info["success"])
            if done: break
        rec.end(success=info["success"], termination="success" if info["success"] else "timeout")

``signals`` is a dict with the Step schema's signal fields (eef_pos, eef_quat, gripper_opening,
gripper_force, object_poses, contacts, joint_torques, joint_pos, goal_distance, object_lift).

Step events leave in small batches: ``step`` stamps the step's time and keeps it, and every
``batch_steps`` steps, or once the oldest kept step is ``batch_ms`` old, the batch is built,
encoded and handed to the producer in one go (``end`` sends what is left first, so EpisodeEnded
follows its last step). A step that comes ``batch_ms`` or more after the one before it (a slow
policy) leaves at once: waiting would only delay it. Why batches: between two simulator steps
the CPU caches hold the simulator, not the encoder; built and encoded one at a time, right after
a step, an event costs ~4x what it costs in a batch, and the recorder's share of a robosuite step
halves with batches (bench/rollout.py).
The delay this adds is at most ``batch_ms`` (plus one fast step), about the producer's own linger.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import numpy as np

from producers.keyframes import KeyframeStore
from producers.publisher import Publisher
from producers.quality import execution_quality
from schemas.events import make_event, stable_id

TERMINATIONS = ("success", "timeout", "policy_error", "env_error", "aborted")
SIGNAL_FIELDS = ("eef_pos", "eef_quat", "gripper_opening", "gripper_force", "object_poses", "contacts",
                 "joint_torques", "joint_pos", "goal_distance", "object_lift")


def task_scenario(benchmark: str, task: str, instruction: str, horizon: int) -> dict:
    """A ScenarioSpec record for a task that has no SEPA scenario (an eval farm's own benchmark)."""
    content = {"benchmark": benchmark, "env_name": task, "robot": "", "horizon": horizon,
               "instruction": instruction, "placement_x_range": [], "placement_y_range": [],
               "pose_offset_xyz": [0.0, 0.0, 0.0], "object_friction": None, "object_mass": None,
               "object_rgba": [], "object_size_scale": 1.0, "distractors": [], "seed": 0}
    # fields added in ScenarioSpec v2 take their defaults and stay out of the hash, as in
    # producers.sim.scenario, so a task's id does not change with the schema version
    defaults = {"success_hold_steps": 0, "place_target_xy": [], "suite": "", "init_state_index": 0,
                "perturbations": {}}
    return {"scenario_id": "scn-" + stable_id(*sorted(content.items()))[:16], "parent_id": None, **content,
            **defaults}


@dataclass(frozen=True)
class EpisodeIdentity:
    run_id: str
    benchmark: str
    task: str
    scenario: dict  # an Avro ScenarioSpec record
    model_id: str
    model_version: str
    seed: int
    request_id: str | None = None
    producer: str = "recorder"

    @cached_property  # read for every Step event
    def episode_id(self) -> str:
        # No wall clock and no run id unless there is no request: the same request re-run
        # (a redelivered rollout request) yields the same episode and the same events.
        origin = self.request_id or self.run_id
        return "ep-" + stable_id(self.scenario["scenario_id"], self.model_id, self.model_version, self.seed,
                                 origin)[:24]


@dataclass
class EpisodeRecorder:
    publisher: Publisher
    identity: EpisodeIdentity
    keyframes: KeyframeStore | None = None
    batch_steps: int = 10
    batch_ms: float = 50.0
    _pending: list[tuple] = field(default_factory=list)  # steps kept for the next batch
    _pending_since: float = 0.0
    _last_step_at: float = 0.0  # time.monotonic() of the last step (or of start)
    _signals: list[dict] = field(default_factory=list)
    _actions: list[list[float]] = field(default_factory=list)
    _successes: list[bool] = field(default_factory=list)
    _reward: float = 0.0
    _ended: dict | None = None

    def __post_init__(self) -> None:
        if self.batch_steps < 1 or self.batch_ms < 0:
            raise ValueError(f"batch_steps must be >= 1 and batch_ms >= 0, got {self.batch_steps!r}, "
                             f"{self.batch_ms!r}")

    def __enter__(self) -> EpisodeRecorder:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._ended is None:
            error = f"{exc_type.__name__}: {exc}" if exc_type else "the episode was never ended"
            self.end(success=False, termination="aborted", error=error)

    def _event(self, event_type: str, key: tuple, **fields) -> dict:
        ident = self.identity
        return make_event(event_type, key, ident.producer, ident.run_id, **fields)

    def start(self) -> None:
        ident = self.identity
        self._last_step_at = time.monotonic()
        self.publisher.publish(self._event(
            "EpisodeStarted", (ident.episode_id,), episode_id=ident.episode_id, request_id=ident.request_id,
            benchmark=ident.benchmark, task=ident.task, scenario_id=ident.scenario["scenario_id"],
            scenario=ident.scenario, instruction=ident.scenario["instruction"], model_id=ident.model_id,
            model_version=ident.model_version, seed=ident.seed))

    def step(self, action: Any, signals: dict, reward: float, success: bool = False,
             keyframe: np.ndarray | None = None) -> None:
        if self._ended is not None:
            raise RuntimeError(f"episode {self.identity.episode_id} already ended")
        t = len(self._actions)
        action = np.asarray(action, dtype=float).ravel().tolist()
        sha = self.keyframes.put(keyframe) if keyframe is not None and self.keyframes else None
        self._signals.append(signals)
        self._actions.append(action)
        self._successes.append(bool(success))
        self._reward += float(reward)
        now = time.monotonic()
        if not self._pending:
            self._pending_since = now
        self._pending.append((t, action, float(reward), sha, signals, datetime.now(UTC)))
        slow = (now - self._last_step_at) * 1000 >= self.batch_ms
        self._last_step_at = now
        if slow or len(self._pending) >= self.batch_steps or (now - self._pending_since) * 1000 >= self.batch_ms:
            self.publish_pending()

    def publish_pending(self) -> None:
        """Hands the Step events kept for the current batch to the publisher (Publisher.flush then
        waits for the broker to have them)."""
        pending, self._pending = self._pending, []
        episode_id, ident = self.identity.episode_id, self.identity
        for t, action, reward, sha, signals, at in pending:
            self.publisher.publish(make_event(
                "Step", (episode_id, t), ident.producer, ident.run_id, event_time=at, episode_id=episode_id, t=t,
                action=action, reward=reward, keyframe_sha256=sha, **{name: signals[name] for name in SIGNAL_FIELDS}))

    def end(self, success: bool, termination: str, error: str | None = None,
            final_keyframe: np.ndarray | None = None) -> dict:
        if termination not in TERMINATIONS:
            raise ValueError(f"termination must be one of {TERMINATIONS}, got {termination!r}")
        self.publish_pending()
        ident = self.identity
        quality = execution_quality(self._signals, self._actions, self._successes)
        sha = self.keyframes.put(final_keyframe) if final_keyframe is not None and self.keyframes else None
        self._ended = self._event(
            "EpisodeEnded", (ident.episode_id,), episode_id=ident.episode_id,
            scenario_id=ident.scenario["scenario_id"], model_id=ident.model_id, success=bool(success),
            termination=termination, steps=len(self._actions), total_reward=self._reward, quality=quality,
            error=error, final_keyframe_sha256=sha)
        self.publisher.publish(self._ended)
        return self._ended
