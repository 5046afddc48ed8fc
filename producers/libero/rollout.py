"""One LIBERO episode, step by step: the rollout contract of producers/sim/rollout.py for the
LIBERO venv (that module imports robosuite 1.5's envs, which this venv does not have).

    episode = Episode(env, policy, seed=3, keyframe_every=0)
    for step in episode:        # StepRecord per control step
        recorder.step(step.action, step.signals, step.reward, step.success, step.keyframe)
    episode.outcome             # EpisodeOutcome

An episode ends on the first of: LIBERO's goal check held for ``success_hold_steps`` consecutive
steps (``spec.success_hold_steps``, 0 = 1: the first success ends it, as in LIBERO's and openpi's
evaluations; termination "success"), the horizon ("timeout", or "success" if the last step is a
success), an exception from the policy ("policy_error") or the simulator ("env_error").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class StepRecord:
    """One control step: the action taken at ``t`` and the state it led to (as producers.sim.rollout's)."""

    t: int
    action: list[float]
    reward: float
    signals: dict[str, Any]
    success: bool
    keyframe: np.ndarray | None = None


@dataclass(frozen=True)
class EpisodeOutcome:
    seed: int
    success: bool
    termination: str  # success, timeout, policy_error, env_error
    steps: int
    total_reward: float
    time_to_success: int | None
    error: str | None = None
    final_keyframe: np.ndarray | None = field(default=None, repr=False)


class Episode:
    def __init__(self, env: Any, policy: Any, seed: int, *, keyframe_every: int = 0, keyframe_size: int = 128):
        if keyframe_every < 0:
            raise ValueError(f"keyframe_every must be >= 0, got {keyframe_every!r}")
        self.env, self.policy, self.seed = env, policy, seed
        self.keyframe_every, self.keyframe_size = keyframe_every, keyframe_size
        self.hold = max(1, env.spec.success_hold_steps)
        self.outcome: EpisodeOutcome | None = None

    def __iter__(self) -> Iterator[StepRecord]:
        env, policy, horizon = self.env, self.policy, self.env.spec.horizon
        total, streak, success = 0.0, 0, False
        try:
            obs = env.reset(self.seed)
            signals = env.signals()
        except Exception as exc:
            self._finish(False, "env_error", 0, total, None, f"reset: {exc!r}")
            return
        try:
            policy.reset(self.seed, env.spec)
        except Exception as exc:
            self._finish(False, "policy_error", 0, total, None, f"policy reset: {exc!r}")
            return
        for t in range(horizon):
            try:
                action = np.asarray(policy.act(obs, signals), dtype=float)
                if action.shape != (env.action_dim,) or not np.all(np.isfinite(action)):
                    raise ValueError(f"policy returned {action!r}, not {env.action_dim} finite floats")
            except Exception as exc:
                self._finish(False, "policy_error", t, total, None, f"step {t}: {exc!r}")
                return
            try:
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
                             keyframe=keyframe)
            if streak >= self.hold:
                self._finish(True, "success", t + 1, total, t + 1 - streak, None)
                return
        self._finish(success, "success" if success else "timeout", horizon, total,
                     (horizon - streak) if success else None, None)

    def _finish(self, success: bool, termination: str, steps: int, total: float, tts: int | None,
                error: str | None) -> None:
        frame = None
        if self.env.keyframes and termination in ("success", "timeout"):
            try:
                frame = self.env.render_keyframe(self.keyframe_size)
            except Exception:  # a frame is evidence, not the episode: its loss must not change the outcome
                frame = None
        self.outcome = EpisodeOutcome(seed=self.seed, success=success, termination=termination, steps=steps,
                                      total_reward=total, time_to_success=tts, error=error, final_keyframe=frame)


def run_episode(env: Any, policy: Any, seed: int, **kwargs: Any) -> tuple[EpisodeOutcome, list[StepRecord]]:
    episode = Episode(env, policy, seed, **kwargs)
    steps = list(episode)
    return episode.outcome, steps
