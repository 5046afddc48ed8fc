"""One episode of a policy in a benchmark env, step by step: the loop every rollout worker runs.

    episode = Episode(env, policy, seed, rule=SuccessRule(hold_steps=5, hold_steps_at_horizon=5))
    for step in episode:                  # StepRecord per control step, as it happens
        publish(step)
    episode.outcome                       # EpisodeOutcome, set when the iteration ends

    outcome, steps = collect(episode)     # the same, collected

Env-agnostic: it imports numpy only, so it runs in the project's venv (robosuite 1.5,
producers/sim/rollout.py) and in the LIBERO venv (robosuite 1.4, producers/libero/rollout.py).
The env is a BenchmarkEnv (producers/adapters.py): ``reset(seed)``, ``step(action)`` whose info
holds ``success``, ``signals()``, ``render_keyframe(size)``, ``spec.horizon``, ``action_dim``,
``keyframes``; the policy has ``reset(seed, spec)`` and ``act(obs, signals)``. A benchmark says
what counts as its success in a SuccessRule, and plugs in what it does before each step by
overriding ``before_step`` (robosuite's pushes) and how it keeps the final frame by overriding
``final_keyframe`` (LIBERO leaves out a frame that fails to render).

An episode ends on the first of: success held for ``rule.hold_steps`` consecutive steps
(termination "success"), the horizon ("timeout"; "success" if by then the success has held
``rule.hold_steps_at_horizon`` consecutive steps up to the last one), an exception from the policy
("policy_error") or the simulator ("env_error"). Errors are caught and reported in the outcome
with their message, never swallowed. An exception from the policy whose class says
``termination = "env_error"`` (a policy server that cannot be reached or hangs:
producers/websocket_policy.py PolicyServerUnavailable) is the harness failing, and ends the
episode so.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # numpy is this module's only import at run time
    from producers.adapters import BenchmarkEnv

# EpisodeEnded.termination's symbols (schemas/avro/EpisodeEnded.avsc; a unit test holds them equal).
TERMINATIONS = ("success", "timeout", "policy_error", "env_error", "aborted")
# The harness's doing, not the policy's: their trials are invalid (left out of success rates) and
# their episodes are never failures to cluster.
HARNESS_TERMINATIONS = ("env_error", "aborted")
# Side of the square camera frames, pixels, when nothing says otherwise: RolloutRequested.camera_size's
# Avro default, so a request, a model entry and an episode agree on it.
CAMERA_SIZE = 128


@dataclass(frozen=True)
class StepRecord:
    """One control step: the action taken at ``t`` and the state it led to."""

    t: int
    action: list[float]
    reward: float
    signals: dict[str, Any]
    success: bool  # the env's success check after this step (info["success"])
    keyframe: np.ndarray | None = None  # uint8 (size, size, 3) when t % keyframe_every == 0
    # camera -> uint8 (camera_size, camera_size, 3): what each camera saw when the policy chose ``action``
    frames: dict[str, np.ndarray] | None = None


@dataclass(frozen=True)
class EpisodeOutcome:
    seed: int
    success: bool
    termination: str  # one of TERMINATIONS
    steps: int
    total_reward: float
    time_to_success: int | None  # first step of the success streak that made the episode a success
    error: str | None = None
    final_keyframe: np.ndarray | None = field(default=None, repr=False)


@dataclass(frozen=True)
class SuccessRule:
    """What makes an episode a success: ``hold_steps`` consecutive success steps end it early as
    one; an episode that runs to its horizon is one when its last ``hold_steps_at_horizon`` steps
    were successes. Both are >= 1 (Episode checks them)."""

    hold_steps: int
    hold_steps_at_horizon: int


class Episode:
    """Iterate to run the episode; read ``outcome`` (and ``initial_signals``) afterwards.

    ``stop_on_success=False`` runs to the horizon whatever happens (the rule then decides there).
    ``cameras`` are rendered at every step before the policy acts (``camera_size`` square) and
    recorded: demonstrations with pixels. ``policy_cameras`` are rendered the same way and given to
    the policy in its observation as ``<camera>_image`` (robosuite's name for a camera observation):
    what a pixel policy sees; a policy with ``looks_now()`` (an action-chunk player) gets them only
    at the steps where it says it looks. Rendering changes no physics, so the episode of a policy
    that does not look is the same with or without either."""

    def __init__(self, env: BenchmarkEnv, policy: Any, seed: int, *, rule: SuccessRule, keyframe_every: int = 0,
                 keyframe_size: int = 128, stop_on_success: bool = True, cameras: tuple[str, ...] = (),
                 camera_size: int = CAMERA_SIZE, policy_cameras: tuple[str, ...] = (),
                 policy_camera_size: int = CAMERA_SIZE):
        if keyframe_every < 0:
            raise ValueError(f"keyframe_every must be >= 0, got {keyframe_every!r}")
        if (cameras or policy_cameras) and not env.keyframes:
            raise ValueError(f"cameras {list(cameras) + list(policy_cameras)} asked of an env built without "
                             "keyframes=True")
        for name in ("hold_steps", "hold_steps_at_horizon"):
            if getattr(rule, name) < 1:
                raise ValueError(f"success_hold_steps must be >= 1, got {getattr(rule, name)!r}")
        self.env, self.policy, self.seed = env, policy, seed
        self.rule = rule
        self.keyframe_every = keyframe_every
        self.keyframe_size = keyframe_size
        self.stop_on_success = stop_on_success
        self.cameras, self.camera_size = tuple(cameras), camera_size
        self.policy_cameras, self.policy_camera_size = tuple(policy_cameras), policy_camera_size
        self.initial_signals: dict[str, Any] | None = None
        self.outcome: EpisodeOutcome | None = None

    def before_step(self, t: int) -> None:
        """Called just before the env steps at ``t``; an exception is an env_error. Nothing here."""

    def final_keyframe(self) -> np.ndarray | None:
        """The frame an episode keeps at its end (see keeps_final_frame)."""
        return self.env.render_keyframe(self.keyframe_size)

    def keeps_final_frame(self, termination: str) -> bool:
        """Whether the episode ends with a keyframe: a timeout always does (the failure clusters and
        the report show a failure by its final frame); a success only when the episode renders
        keyframes anyway (``keyframe_every`` > 0: the semantic judge reads the oracle's validation
        rollouts whole). Nothing reads a sweep success's last frame, and on a CPU renderer that
        frame costs ~50 ms, a sixth of a short episode. Errors keep none: the sim may be broken."""
        return self.env.keyframes and (termination == "timeout"
                                       or (termination == "success" and self.keyframe_every > 0))

    def __iter__(self) -> Iterator[StepRecord]:
        env, policy, rule = self.env, self.policy, self.rule
        horizon = env.spec.horizon
        total, streak = 0.0, 0
        try:
            obs = env.reset(self.seed)
            signals = env.signals()
        except Exception as exc:
            self._finish(False, "env_error", 0, total, None, f"reset: {exc!r}")
            return
        self.initial_signals = signals
        try:
            policy.reset(self.seed, env.spec)
        except Exception as exc:
            self._finish(False, _blamed(exc), 0, total, None, f"policy reset: {exc!r}")
            return
        for t in range(horizon):
            try:
                frames, seen = self._views()
            except Exception as exc:
                self._finish(False, "env_error", t, total, None, f"step {t}: camera frames: {exc!r}")
                return
            if seen:
                obs = {**obs, **seen}
            try:
                action = np.asarray(policy.act(obs, signals), dtype=float)
                if action.shape != (env.action_dim,) or not np.all(np.isfinite(action)):
                    raise ValueError(f"policy returned {action!r}, not {env.action_dim} finite floats")
            except Exception as exc:
                self._finish(False, _blamed(exc), t, total, None, f"step {t}: {exc!r}")
                return
            try:
                self.before_step(t)
                obs, reward, _done, info = env.step(action)
                signals = env.signals()
                keyframe = None
                if self.keyframe_every and t % self.keyframe_every == 0:
                    keyframe = env.render_keyframe(self.keyframe_size)
            except Exception as exc:
                self._finish(False, "env_error", t, total, None, f"step {t}: {exc!r}")
                return
            total += reward
            success = bool(info["success"])
            streak = streak + 1 if success else 0
            yield StepRecord(t=t, action=action.tolist(), reward=reward, signals=signals, success=success,
                             keyframe=keyframe, frames=frames)
            if self.stop_on_success and streak >= rule.hold_steps:
                self._finish(True, "success", t + 1, total, t + 1 - streak, None)
                return
        held = streak >= rule.hold_steps_at_horizon
        self._finish(held, "success" if held else "timeout", horizon, total, (horizon - streak) if held else None,
                     None)

    def _views(self) -> tuple[dict[str, np.ndarray] | None, dict[str, np.ndarray]]:
        """(the recorded frames by camera, or None; the policy's images by observation key), each
        (camera, size) rendered once."""
        rendered: dict[tuple[str, int], np.ndarray] = {}

        def view(camera: str, size: int) -> np.ndarray:
            if (camera, size) not in rendered:
                rendered[camera, size] = self.env.render_keyframe(size, camera)
            return rendered[camera, size]

        frames = {camera: view(camera, self.camera_size) for camera in self.cameras}
        # a policy that plays an action chunk open loop looks only when it asks for the next one; on
        # a CPU renderer the frames it would not see cost more than the simulation (issue 19)
        looks = getattr(self.policy, "looks_now", None)
        if looks is not None and not looks():
            return frames or None, {}
        seen = {f"{camera}_image": view(camera, self.policy_camera_size) for camera in self.policy_cameras}
        return frames or None, seen

    def _finish(self, success: bool, termination: str, steps: int, total: float, tts: int | None,
                error: str | None) -> None:
        frame = None
        if self.keeps_final_frame(termination):
            frame = self.final_keyframe()
        self.outcome = EpisodeOutcome(seed=self.seed, success=success, termination=termination, steps=steps,
                                      total_reward=total, time_to_success=tts, error=error, final_keyframe=frame)


def _blamed(exc: BaseException) -> str:
    """policy_error, unless the policy's exception says the harness failed (``termination``)."""
    return "env_error" if getattr(exc, "termination", None) == "env_error" else "policy_error"


def requested_cameras(request: dict, env: BenchmarkEnv) -> tuple[tuple[str, ...], int]:
    """(cameras, frame size) that a RolloutRequested asks to record at every step, checked against
    the env: raises ValueError naming the request, the unknown camera and the scene's cameras."""
    cameras, size = tuple(request.get("cameras") or ()), int(request.get("camera_size", CAMERA_SIZE))
    if not cameras:
        return (), size
    unknown = [c for c in cameras if c not in env.camera_names]
    if unknown or len(set(cameras)) != len(cameras):
        what = f"unknown camera(s) {unknown}" if unknown else f"a camera twice ({list(cameras)})"
        raise ValueError(f"request {request.get('request_id')} asks for {what}; scenario "
                         f"{request['scenario']['scenario_id']} has: {', '.join(env.camera_names)}")
    if not 16 <= size <= 1024:
        raise ValueError(f"request {request.get('request_id')}: camera_size must be 16-1024 pixels, got {size}")
    return cameras, size


def collect(episode: Episode) -> tuple[EpisodeOutcome, list[StepRecord]]:
    """Runs a whole episode. Returns (outcome, step records)."""
    steps = list(episode)
    if episode.outcome is None:  # every path through Episode.__iter__ sets it
        raise RuntimeError(f"episode seed {episode.seed} ended without an outcome")
    return episode.outcome, steps
