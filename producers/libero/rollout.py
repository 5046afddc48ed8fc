"""One LIBERO episode, step by step: producers/episode.py's loop with LIBERO's success rule (this
module and that one import no robosuite, so they run in the LIBERO venv).

    episode = Episode(env, policy, seed=3, keyframe_every=0)
    for step in episode:        # StepRecord per control step
        recorder.step(step.action, step.signals, step.reward, step.success, step.keyframe)
    episode.outcome             # EpisodeOutcome

An episode ends on the first of: LIBERO's goal check held for ``success_hold_steps`` consecutive
steps (``spec.success_hold_steps``, 0 = 1: the first success ends it, as in LIBERO's and openpi's
evaluations; termination "success"), the horizon ("timeout", or "success" if the last step is a
success), an exception from the policy ("policy_error") or the simulator ("env_error"). A final
keyframe that fails to render is left out; the outcome stays what the episode did.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from producers import episode
from producers.episode import CAMERA_SIZE, EpisodeOutcome, StepRecord, SuccessRule, collect

__all__ = ["Episode", "EpisodeOutcome", "StepRecord", "run_episode"]


class Episode(episode.Episode):
    def __init__(self, env: Any, policy: Any, seed: int, *, keyframe_every: int = 0, keyframe_size: int = 128,
                 cameras: tuple[str, ...] = (), camera_size: int = CAMERA_SIZE, policy_cameras: tuple[str, ...] = (),
                 policy_camera_size: int = CAMERA_SIZE):
        # LIBERO's success: the hold (at least 1) ends the episode early; at the horizon the last step decides
        rule = SuccessRule(hold_steps=max(1, env.spec.success_hold_steps), hold_steps_at_horizon=1)
        super().__init__(env, policy, seed, rule=rule, keyframe_every=keyframe_every, keyframe_size=keyframe_size,
                         cameras=cameras, camera_size=camera_size, policy_cameras=policy_cameras,
                         policy_camera_size=policy_camera_size)
        self.hold = rule.hold_steps

    def final_keyframe(self) -> np.ndarray | None:
        try:
            return super().final_keyframe()
        except Exception:  # a frame is evidence, not the episode: its loss must not change the outcome
            return None


def run_episode(env: Any, policy: Any, seed: int, **kwargs: Any) -> tuple[EpisodeOutcome, list[StepRecord]]:
    """Runs a whole episode; kwargs as for Episode. Returns (outcome, step records)."""
    return collect(Episode(env, policy, seed, **kwargs))
