"""The recorder: turn any gym-style reset/step loop into SEPA-Eval events.

Eval farms run their own simulators and policies; this is their API. The robosuite worker uses
it too, so both publish the same events with the same guarantees (stable ids: re-running the
same episode re-publishes identical facts, which the evidence log counts once).

    identity = EpisodeIdentity(run_id="farm-7", benchmark="libero", task="libero_spatial/3",
                               scenario=task_scenario("libero", "libero_spatial/3", "pick up the bowl", 300),
                               model_id="my-vla", model_version="2.1", seed=0,
                               variant="temperature=0.7",            # only if it is not the only one
                               simulator=simulator_versions("robosuite", "mujoco"))
    with EpisodeRecorder(publisher, identity, keyframes=KeyframeStore(path)) as rec:
        obs = env.reset()
        for t in range(horizon):
            action = policy(obs)
            obs, reward, done, info = env.step(action)
            rec.step(action, signals_from(env), reward, success=info["success"])
            if done: break
        rec.end(success=info["success"], termination="success" if info["success"] else "timeout")

Identity. ``episode_id`` is a function of scenario, model, model version, seed and the request
(or, without one, the run), plus ``variant`` when it is set: two episodes that share all of the
former are different episodes only if ``variant`` tells them apart. Set it for policy variants
(sampling temperature, a checkpoint tag, a prompt) or the same seed run twice on purpose; leave it
empty otherwise (ids recorded without it stay what they were). ``simulator`` names the simulator
and physics engine versions ("robosuite 1.5.2, mujoco 3.9.0"; ``simulator_versions``); it goes
into EpisodeStarted, not into the id. Within one process the recorder refuses a second, different
episode under an id it has recorded: its EpisodeStarted, a step's content (times aside; compared
by hash when the step's batch leaves) or its EpisodeEnded differs from the first copy's, or it
runs longer or shorter. ``EpisodeConflict`` (from ``start``, ``step`` or ``end``) names the id and
says to set ``variant``; from then on nothing more of the conflicting copy is published, not even
an EpisodeEnded (what went out before was identical to the first copy: a re-delivery). A
deterministic re-run of the same episode (same content) is a re-delivery and is published again,
identically. The last ``REMEMBERED_STEPS`` steps' worth of episodes are remembered; older ids are
not checked, and other processes never are (downstream, the evidence sink dead-letters a
different content under a known event id).

Signals. ``signals`` is a dict with the Step schema's signal fields (``SIGNAL_FIELDS``, checked in
producers/recording_signals.py; other keys are ignored). ``step()`` checks them at once and raises
``SignalError`` naming the field: lists of finite numbers (tuples and numpy arrays are taken), the
lengths below, the object poses and contact groups. What the failure detector reads, and so what
every producer must mean:

- Frames and units: world frame, metres, newtons, radians; quaternions are (x, y, z, w), unit.
- ``eef_pos`` [3], ``eef_quat`` [4]: the grip site (between the finger pads), not the wrist.
- ``gripper_opening``: distance between the finger pads, m (a Panda opens ~0.08), >= 0.
- ``gripper_force``: normal force between the finger pads and the *target* object, N, >= 0
  (not the force on other objects, not the motor effort).
- ``object_poses``: non-empty [{name, pos [3], quat [4]}]; the first is the target (the object
  the task manipulates), then the other task objects and distractors; the same names in the
  same order at every step of the episode.
- ``contacts``: [{a, b, normal_force}], the normal force summed per pair of contact groups this
  step, only pairs in contact. Groups by name: "gripper" (hand and fingers), "robot" (the arm's
  other links), "table" (table, floor, fixed arena), and each object's name from
  ``object_poses``; a != b.
- ``joint_torques``, ``joint_pos`` [n]: the arm joints in chain order (N m, rad), n >= 1 and the
  same n for both at every step.
- ``goal_distance``: the task's distance still to go, m, >= 0, 0 when reached (Lift: height still
  to gain), measured relative to the episode's start; ``object_lift``: the target's height above
  its own height at the episode's start, m (it must follow the target's z in ``object_poses``).
- ``action``: finite numbers; ``action[-1]`` is the gripper command, -1 opens, +1 closes.

Step events leave in small batches: ``step`` stamps the step's time and keeps it, and every
``batch_steps`` steps, or once the oldest kept step is ``batch_ms`` old, the batch is built,
encoded and handed to the producer in one go (``end`` sends what is left first, so EpisodeEnded
follows its last step). A step that comes ``batch_ms`` or more after the one before it (a slow
policy) leaves at once: waiting would only delay it. Why batches: between two simulator steps
the CPU caches hold the simulator, not the encoder; built and encoded one at a time, right after
a step, an event costs ~4x what it costs in a batch, and the recorder's share of a robosuite step
halves with batches (bench/rollout.py).
The delay this adds is at most ``batch_ms`` (plus one fast step), about the producer's own linger.

An episode left by an exception (``with`` block) or whose Step batch could not be sent always
ends with an EpisodeEnded of termination "aborted" and the error text, unless it was refused as
a conflict.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from importlib import metadata
from typing import Any

import numpy as np

from producers.episode import TERMINATIONS, Episode
from producers.exceptions import EpisodeConflict, SignalError
from producers.keyframes import KeyframeStore
from producers.publisher import Publisher
from producers.quality import execution_quality
from producers.recording_signals import SignalChecks, _number, _numbers, _Shape
from schemas.events import make_event, stable_id

REMEMBERED_STEPS = 2_000_000  # per process; the oldest episodes beyond it are forgotten (8 bytes a step)


def task_scenario(benchmark: str, task: str, instruction: str, horizon: int) -> dict:
    """A ScenarioSpec record for a task that has no SEPA scenario (an eval farm's own benchmark)."""
    content = {"benchmark": benchmark, "env_name": task, "robot": "", "horizon": horizon,
               "instruction": instruction, "placement_x_range": [], "placement_y_range": [],
               "pose_offset_xyz": [0.0, 0.0, 0.0], "object_friction": None, "object_mass": None,
               "object_rgba": [], "object_size_scale": 1.0, "distractors": [], "seed": 0}
    # fields added in ScenarioSpec v2 take their defaults and stay out of the hash, as in
    # schemas.scenario, so a task's id does not change with the schema version
    defaults = {"success_hold_steps": 0, "place_target_xy": [], "suite": "", "init_state_index": 0,
                "perturbations": {}}
    return {"scenario_id": "scn-" + stable_id(*sorted(content.items()))[:16], "parent_id": None, **content,
            **defaults}


def simulator_versions(*distributions: str) -> str:
    """The installed versions of the distributions named, for EpisodeStarted.simulator:
    ``simulator_versions("robosuite", "mujoco")`` -> "robosuite 1.5.2, mujoco 3.9.0"."""
    return ", ".join(f"{name} {metadata.version(name)}" for name in distributions)


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
    variant: str = ""  # tells apart episodes that share all of the above (module docstring); part of the id
    simulator: str = ""  # simulator and physics engine versions; recorded, not part of the id

    def __post_init__(self) -> None:
        for name in ("variant", "simulator"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"EpisodeIdentity.{name} must be a string, got {getattr(self, name)!r}")

    @cached_property  # read for every Step event
    def episode_id(self) -> str:
        # No wall clock and no run id unless there is no request: the same request re-run
        # (a redelivered rollout request) yields the same episode and the same events.
        origin = self.request_id or self.run_id
        parts = (self.scenario["scenario_id"], self.model_id, self.model_version, self.seed, origin)
        return "ep-" + stable_id(*parts, *((self.variant,) if self.variant else ()))[:24]


# -- what this process has recorded, per episode id (the conflict check) ------------------------

class _Known:
    """The content recorded under one episode id: its start, per-step hashes, its end."""

    __slots__ = ("start", "steps", "end")

    def __init__(self, start: int):
        self.start = start
        self.steps = array("q")
        self.end: int | None = None


_known: OrderedDict[str, _Known] = OrderedDict()
_known_steps = [0]
_known_lock = threading.Lock()


def _content_hash(value) -> int:
    """A hash of nested dicts/lists of plain values, for comparing contents in this process."""
    if isinstance(value, dict):
        return hash(tuple((k, _content_hash(v)) for k, v in value.items()))
    if isinstance(value, list):
        return hash(tuple(_content_hash(v) for v in value))
    return hash(value)


def _step_hash(t: int, action: list, reward: float, sha: str | None, s: dict) -> int:
    """A hash of a Step's content (its time aside), spelled out: it runs at every step."""
    return hash((t, tuple(action), reward, sha, tuple(s["eef_pos"]), tuple(s["eef_quat"]), s["gripper_opening"],
                 s["gripper_force"], tuple((p["name"], tuple(p["pos"]), tuple(p["quat"])) for p in s["object_poses"]),
                 tuple((c["a"], c["b"], c["normal_force"]) for c in s["contacts"]), tuple(s["joint_torques"]),
                 tuple(s["joint_pos"]), s["goal_distance"], s["object_lift"]))


def _remember(episode_id: str, start: int) -> _Known:
    """The record of ``episode_id``: the one known (a re-run; the caller compares), or a new one."""
    with _known_lock:
        known = _known.get(episode_id)
        if known is not None:
            _known.move_to_end(episode_id)
            return known
        known = _known[episode_id] = _Known(start)
        while _known_steps[0] > REMEMBERED_STEPS and len(_known) > 1:
            _, old = _known.popitem(last=False)
            _known_steps[0] -= len(old.steps)
        return known



# -- the recorder -------------------------------------------------------------------------------

@dataclass
class EpisodeRecorder(SignalChecks):
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
    _shape: _Shape | None = None
    _known: _Known | None = None  # this id's record in the process
    _rerun: bool = False  # the id was recorded before: compare, do not extend what is known
    _refused: str | None = None  # why this copy publishes nothing more (a conflict)

    def __post_init__(self) -> None:
        if self.batch_steps < 1 or self.batch_ms < 0:
            raise ValueError(f"batch_steps must be >= 1 and batch_ms >= 0, got {self.batch_steps!r}, "
                             f"{self.batch_ms!r}")

    def __enter__(self) -> EpisodeRecorder:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._ended is None and self._refused is None:
            error = f"{exc_type.__name__}: {exc}" if exc_type else "the episode was never ended"
            try:
                self.end(success=False, termination="aborted", error=error)
            except Exception:
                if exc_type is None:
                    raise  # otherwise the exception that left the block is the one to see

    def _event(self, event_type: str, key: tuple, **fields) -> dict:
        ident = self.identity
        return make_event(event_type, key, ident.producer, ident.run_id, **fields)

    def _conflict(self, what: str) -> EpisodeConflict:
        self._pending = []
        self._refused = what
        return EpisodeConflict(
            f"episode {self.identity.episode_id} was already recorded in this process with different content "
            f"({what}): two different episodes share scenario {self.identity.scenario['scenario_id']}, model "
            f"{self.identity.model_id} {self.identity.model_version}, seed {self.identity.seed} and request/run "
            f"{self.identity.request_id or self.identity.run_id}. Set EpisodeIdentity.variant to tell them apart "
            "(policy variants, a repeated seed); nothing more of this copy is published")

    def start(self) -> None:
        ident = self.identity
        self._last_step_at = time.monotonic()
        started = self._event(
            "EpisodeStarted", (ident.episode_id,), episode_id=ident.episode_id, request_id=ident.request_id,
            benchmark=ident.benchmark, task=ident.task, scenario_id=ident.scenario["scenario_id"],
            scenario=ident.scenario, instruction=ident.scenario["instruction"], model_id=ident.model_id,
            model_version=ident.model_version, seed=ident.seed, variant=ident.variant, simulator=ident.simulator)
        env = started["envelope"]
        content = _content_hash({**started, "envelope": {k: v for k, v in env.items() if k != "event_time"}})
        self._known = _remember(ident.episode_id, content)
        self._rerun = len(self._known.steps) > 0 or self._known.end is not None  # compare, do not extend
        if self._known.start != content:
            raise self._conflict("its EpisodeStarted differs")
        self.publisher.publish(started)

    def step(self, action: Any, signals: dict, reward: float, success: bool = False,
             keyframe: np.ndarray | None = None, frames: dict[str, np.ndarray] | None = None) -> None:
        """Records one control step (the action taken and the signals after it; ``frames``, camera
        -> image, what the cameras saw before the action, stored by hash like keyframes). Raises
        SignalError naming the first missing or malformed signal (nothing is recorded then), and
        EpisodeConflict when this id was recorded before with a different step here."""
        if self._refused is not None:
            raise EpisodeConflict(f"episode {self.identity.episode_id} was refused: {self._refused}")
        if self._ended is not None:
            raise RuntimeError(f"episode {self.identity.episode_id} already ended")
        if self._known is None:
            raise RuntimeError(f"episode {self.identity.episode_id}: step() before start()")
        t = len(self._actions)
        try:
            action = _numbers(action, "action", min_length=1)
            reward = _number(reward, "reward")
        except SignalError as exc:
            raise SignalError(f"episode {self.identity.episode_id} step {t}: {exc}") from None
        clean = self._check(t, signals)
        sha = self.keyframes.put(keyframe) if keyframe is not None and self.keyframes else None
        if frames and self.keyframes is None:
            raise ValueError(f"episode {self.identity.episode_id} step {t}: camera frames need a keyframe store")
        frame_shas = {camera: self.keyframes.put(image) for camera, image in sorted(frames.items())} if frames else {}
        self._signals.append(clean)
        self._actions.append(action)
        self._successes.append(bool(success))
        self._reward += reward
        now = time.monotonic()
        if not self._pending:
            self._pending_since = now
        self._pending.append((t, action, reward, sha, frame_shas, clean, datetime.now(UTC)))
        slow = (now - self._last_step_at) * 1000 >= self.batch_ms
        self._last_step_at = now
        if slow or len(self._pending) >= self.batch_steps or (now - self._pending_since) * 1000 >= self.batch_ms:
            self.publish_pending()

    def _compare(self, t: int, action: list, reward: float, sha: str | None, frames: dict[str, str],
                 clean: dict) -> None:
        """Remembers the step's content (a first copy) or compares it with the copy before."""
        known = self._known
        content = _step_hash(t, action, reward, sha, clean)
        if frames:
            content = hash((content, tuple(frames.items())))
        if not self._rerun:
            known.steps.append(content)
            _known_steps[0] += 1
        elif t >= len(known.steps):
            raise self._conflict(f"step {t} is beyond the {len(known.steps)} steps recorded before")
        elif known.steps[t] != content:
            raise self._conflict(f"step {t} differs")


    def publish_pending(self) -> None:
        """Hands the Step events kept for the current batch to the publisher (Publisher.flush then
        waits for the broker to have them)."""
        pending, self._pending = self._pending, []
        episode_id, ident = self.identity.episode_id, self.identity
        for t, action, reward, sha, frames, signals, at in pending:
            self._compare(t, action, reward, sha, frames, signals)  # here, where the caches are warm for it
            self.publisher.publish(make_event(
                "Step", (episode_id, t), ident.producer, ident.run_id, event_time=at, episode_id=episode_id, t=t,
                action=action, reward=reward, keyframe_sha256=sha, frames=frames, **signals))

    def end(self, success: bool, termination: str, error: str | None = None,
            final_keyframe: np.ndarray | None = None) -> dict:
        """Publishes the episode's last Step events and its EpisodeEnded (returned). When the last
        batch cannot be sent, the episode ends "aborted" with the error and the exception is raised
        after the EpisodeEnded went out."""
        if termination not in TERMINATIONS:
            raise ValueError(f"termination must be one of {TERMINATIONS}, got {termination!r}")
        if self._refused is not None:
            raise EpisodeConflict(f"episode {self.identity.episode_id} was refused: {self._refused}")
        if self._ended is not None:
            raise RuntimeError(f"episode {self.identity.episode_id} already ended")
        failure = None
        try:
            self.publish_pending()
        except EpisodeConflict:
            raise
        except Exception as exc:
            failure = exc
            lost = f"Step events not published: {type(exc).__name__}: {exc}"
            success, termination, error = False, "aborted", f"{error}; {lost}" if error else lost
        ident = self.identity
        quality = execution_quality(self._signals, self._actions, self._successes)
        sha = self.keyframes.put(final_keyframe) if final_keyframe is not None and self.keyframes else None
        ended = self._event(
            "EpisodeEnded", (ident.episode_id,), episode_id=ident.episode_id,
            scenario_id=ident.scenario["scenario_id"], model_id=ident.model_id, success=bool(success),
            termination=termination, steps=len(self._actions), total_reward=self._reward, quality=quality,
            error=error, final_keyframe_sha256=sha)
        known = self._known
        if known is not None:
            content = _content_hash({k: v for k, v in ended.items() if k != "envelope"})
            if self._rerun and len(self._actions) != len(known.steps):
                raise self._conflict(f"it ended after {len(self._actions)} steps, the copy before recorded "
                                     f"{len(known.steps)}")
            if known.end is not None and known.end != content:
                raise self._conflict("its EpisodeEnded differs")
            known.end = content
        self._ended = ended
        self.publisher.publish(ended)
        if failure is not None:
            raise failure
        return ended


@dataclass(frozen=True)
class EpisodeSummary:
    """What a rollout worker logs and returns of one recorded episode."""

    episode_id: str
    seed: int
    success: bool
    termination: str
    steps: int
    error: str | None


def record_episode(episode: Episode, publisher: Publisher, identity: EpisodeIdentity,
                   keyframes: KeyframeStore | None) -> EpisodeSummary:
    """Runs ``episode`` (producers.episode's loop, robosuite or LIBERO) to its end through an
    EpisodeRecorder; the events are handed to the publisher, not yet flushed."""
    with EpisodeRecorder(publisher, identity, keyframes) as recorder:
        for record in episode:
            recorder.step(record.action, record.signals, record.reward, record.success, record.keyframe, record.frames)
        out = episode.outcome
        recorder.end(out.success, out.termination, out.error, out.final_keyframe)
    return EpisodeSummary(identity.episode_id, episode.seed, out.success, out.termination, out.steps, out.error)
