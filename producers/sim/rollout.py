"""Run one episode of a policy in a SimEnv, step by step: what a rollout worker publishes.

    env = make_env(spec, keyframes=True)
    episode = Episode(env, make_policy("oracle"), seed=3, keyframe_every=0)
    for step in episode:                  # StepRecord per control step, as it happens
        publish(step)                     # step.signals has exactly envs.SIGNAL_KEYS
    episode.outcome                       # EpisodeOutcome, set when the iteration ends

    outcome, steps = run_episode(env, policy, seed)   # the same, collected

The loop is producers/episode.py's (shared with LIBERO); what is robosuite's here: the pushes
(``perturbations``), applied before each step, and the success rule. An episode ends on the first
of: success held for ``success_hold_steps`` consecutive steps (termination "success"), the
scenario's horizon ("timeout"; "success" if by then the success has held that many consecutive
steps up to the last one), an exception from the policy ("policy_error") or the simulator
("env_error"). Errors are caught and reported in the outcome with their message, never swallowed.

The hold is the scenario's ``success_hold_steps`` (lift and hold: e.g. 60 steps = 3 s holding the
cube up), or SUCCESS_HOLD_STEPS when the scenario leaves it 0; an explicit ``success_hold_steps``
argument overrides both. A tighter time budget is simply a smaller ``horizon``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from producers import episode
from producers.episode import CAMERA_SIZE, TERMINATIONS, EpisodeOutcome, StepRecord, SuccessRule, collect
from producers.sim.envs import SimEnv
from producers.sim.perturb import Push, apply_perturbations
from producers.sim.policies import Policy

__all__ = ["SUCCESS_HOLD_STEPS", "TERMINATIONS", "Episode", "EpisodeOutcome", "StepRecord", "hold_steps",
           "run_episode"]

# Consecutive steps success_relative() must hold before an episode ends as a success
# (0.25 s at 20 Hz: a cube tossed up 4 cm does not count).
SUCCESS_HOLD_STEPS = 5


def hold_steps(spec: Any) -> int:
    """Consecutive success steps that make an episode of ``spec`` a success."""
    return spec.success_hold_steps or SUCCESS_HOLD_STEPS


class Episode(episode.Episode):
    """Iterate to run the episode; read ``outcome`` afterwards."""

    def __init__(self, env: SimEnv, policy: Policy, seed: int, *, perturbations: Sequence[Push] = (),
                 keyframe_every: int = 0, keyframe_size: int = 128, stop_on_success: bool = True,
                 success_hold_steps: int | None = None, cameras: tuple[str, ...] = (), camera_size: int = CAMERA_SIZE,
                 policy_cameras: tuple[str, ...] = (), policy_camera_size: int = CAMERA_SIZE):
        if success_hold_steps is None:
            success_hold_steps = hold_steps(env.spec)
        # robosuite's success: held for the hold, before the horizon and at it alike
        super().__init__(env, policy, seed, rule=SuccessRule(success_hold_steps, success_hold_steps),
                         keyframe_every=keyframe_every, keyframe_size=keyframe_size, stop_on_success=stop_on_success,
                         cameras=cameras, camera_size=camera_size, policy_cameras=policy_cameras,
                         policy_camera_size=policy_camera_size)
        self.perturbations = tuple(perturbations)
        self.success_hold_steps = success_hold_steps

    def before_step(self, t: int) -> None:
        apply_perturbations(self.env, self.perturbations, t)


def run_episode(env: SimEnv, policy: Policy, seed: int, **kwargs: Any) -> tuple[EpisodeOutcome, list[StepRecord]]:
    """Runs a whole episode; kwargs as for Episode. Returns (outcome, step records)."""
    return collect(Episode(env, policy, seed, **kwargs))
