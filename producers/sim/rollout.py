"""Run one episode of a policy in a SimEnv, step by step: what a rollout worker publishes.

    env = make_env(spec, keyframes=True)
    episode = Episode(env, make_policy("oracle"), seed=3, keyframe_every=0)
    for step in episode:                  # StepRecord per control step, as it happens
        publish(step)                     # step.signals has exactly envs.SIGNAL_KEYS
    episode.outcome                       # EpisodeOutcome, set when the iteration ends

    outcome, steps = run_episode(env, policy, seed)   # the same, collected

An episode ends on the first of: success held for ``success_hold_steps`` consecutive steps
(termination "success"), the scenario's horizon ("timeout"; "success" if by then the success has
held that many consecutive steps up to the last one), an exception from the policy
("policy_error") or the simulator ("env_error"). Errors are caught and reported in the outcome
with their message, never swallowed.

The hold is the scenario's ``success_hold_steps`` (lift and hold: e.g. 60 steps = 3 s holding the
cube up), or SUCCESS_HOLD_STEPS when the scenario leaves it 0; an explicit ``success_hold_steps``
argument overrides both. A tighter time budget is simply a smaller ``horizon``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from producers.sim.envs import SimEnv
from producers.sim.perturb import Push, apply_perturbations
from producers.sim.policies import Policy

# Consecutive steps success_relative() must hold before an episode ends as a success
# (0.25 s at 20 Hz: a cube tossed up 4 cm does not count).
SUCCESS_HOLD_STEPS = 5

TERMINATIONS = ("success", "timeout", "policy_error", "env_error", "aborted")


@dataclass(frozen=True)
class StepRecord:
    """One control step: the action taken at ``t`` and the state it led to."""

    t: int
    action: list[float]
    reward: float
    signals: dict[str, Any]
    success: bool  # success_relative() after this step
    keyframe: np.ndarray | None = None  # uint8 (size, size, 3) when t % keyframe_every == 0


@dataclass(frozen=True)
class EpisodeOutcome:
    seed: int
    success: bool
    termination: str  # one of TERMINATIONS
    steps: int
    total_reward: float
    time_to_success: int | None  # first step of the success streak that ended the episode
    error: str | None = None
    final_keyframe: np.ndarray | None = field(default=None, repr=False)


def hold_steps(spec: Any) -> int:
    """Consecutive success steps that make an episode of ``spec`` a success."""
    return spec.success_hold_steps or SUCCESS_HOLD_STEPS


class Episode:
    """Iterate to run the episode; read ``outcome`` afterwards."""

    def __init__(self, env: SimEnv, policy: Policy, seed: int, *, perturbations: Sequence[Push] = (),
                 keyframe_every: int = 0, keyframe_size: int = 128, stop_on_success: bool = True,
                 success_hold_steps: int | None = None):
        if keyframe_every < 0:
            raise ValueError(f"keyframe_every must be >= 0, got {keyframe_every!r}")
        if success_hold_steps is None:
            success_hold_steps = hold_steps(env.spec)
        if success_hold_steps < 1:
            raise ValueError(f"success_hold_steps must be >= 1, got {success_hold_steps!r}")
        self.env, self.policy, self.seed = env, policy, seed
        self.perturbations = tuple(perturbations)
        self.keyframe_every = keyframe_every
        self.keyframe_size = keyframe_size
        self.stop_on_success = stop_on_success
        self.success_hold_steps = success_hold_steps
        self.initial_signals: dict[str, Any] | None = None
        self.outcome: EpisodeOutcome | None = None

    def __iter__(self) -> Iterator[StepRecord]:
        env, policy = self.env, self.policy
        total, streak, t = 0.0, 0, 0
        success = False
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
            self._finish(False, "policy_error", 0, total, None, f"policy reset: {exc!r}")
            return
        for t in range(env.spec.horizon):
            try:
                action = np.asarray(policy.act(obs, signals), dtype=float)
                if action.shape != (env.action_dim,) or not np.all(np.isfinite(action)):
                    raise ValueError(f"policy returned {action!r}, not {env.action_dim} finite floats")
            except Exception as exc:
                self._finish(False, "policy_error", t, total, None, f"step {t}: {exc!r}")
                return
            try:
                apply_perturbations(env, self.perturbations, t)
                obs, reward, done, info = env.step(action)
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
            if self.stop_on_success and streak >= self.success_hold_steps:
                self._finish(True, "success", t + 1, total, t + 1 - streak, None)
                return
        held = streak >= self.success_hold_steps
        self._finish(held, "success" if held else "timeout", env.spec.horizon, total,
                     (env.spec.horizon - streak) if held else None, None)

    def _finish(self, success: bool, termination: str, steps: int, total: float, tts: int | None,
                error: str | None) -> None:
        frame = None
        if self.env.keyframes and termination in ("success", "timeout"):
            frame = self.env.render_keyframe(self.keyframe_size)
        self.outcome = EpisodeOutcome(seed=self.seed, success=success, termination=termination, steps=steps,
                                      total_reward=total, time_to_success=tts, error=error, final_keyframe=frame)


def run_episode(env: SimEnv, policy: Policy, seed: int, **kwargs: Any) -> tuple[EpisodeOutcome, list[StepRecord]]:
    """Runs a whole episode; kwargs as for Episode. Returns (outcome, step records)."""
    episode = Episode(env, policy, seed, **kwargs)
    steps = list(episode)
    if episode.outcome is None:  # every path through Episode.__iter__ sets it
        raise RuntimeError(f"episode seed {seed} ended without an outcome")
    return episode.outcome, steps
