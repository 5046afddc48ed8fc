"""producers/episode.py, the loop robosuite and LIBERO share, on a scripted stand-in env: each
benchmark's success rule, the before-step hook, and the import set the LIBERO venv needs."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from producers.episode import Episode, SuccessRule, collect
from producers.libero.rollout import Episode as LiberoEpisode


@dataclass(frozen=True)
class Spec:
    horizon: int
    success_hold_steps: int = 0


class ScriptedEnv:
    """Succeeds at the steps listed in ``successes``; records what was done to it."""

    action_dim = 2

    def __init__(self, horizon: int, successes: set[int], keyframes: bool = False, render_fails: bool = False,
                 hold: int = 0):
        self.spec = Spec(horizon, hold)
        self.successes, self.keyframes, self.render_fails = successes, keyframes, render_fails
        self.calls: list[str] = []

    def reset(self, seed: int) -> dict:
        self.t = 0
        return {}

    def step(self, action):
        self.calls.append(f"step {self.t}")
        info = {"success": self.t in self.successes}
        self.t += 1
        return {}, 1.0, self.t >= self.spec.horizon, info

    def signals(self) -> dict:
        return {"t": self.t}

    def render_keyframe(self, size: int = 128):
        if self.render_fails:
            raise RuntimeError("no GL")
        return np.zeros((size, size, 3), dtype=np.uint8)


class Still:
    def reset(self, seed, spec) -> None:
        pass

    def act(self, obs, signals):
        return [0.0, 0.0]


def run(env, hold: int, at_horizon: int, **kwargs):
    return collect(Episode(env, Still(), 0, rule=SuccessRule(hold, at_horizon), **kwargs))


def test_a_held_success_ends_the_episode_at_the_step_it_completes():
    outcome, steps = run(ScriptedEnv(10, {3, 4, 5}), hold=3, at_horizon=3)
    assert (outcome.success, outcome.termination, outcome.steps, outcome.time_to_success) == (True, "success", 6, 3)
    assert [s.success for s in steps] == [False] * 3 + [True] * 3


def test_at_the_horizon_each_rule_decides_on_its_own_hold():
    # two success steps up to the last one: short of a hold of 3 (robosuite), enough for the last step (LIBERO)
    robosuite, _ = run(ScriptedEnv(6, {4, 5}), hold=3, at_horizon=3)
    libero, _ = run(ScriptedEnv(6, {4, 5}), hold=3, at_horizon=1)
    assert (robosuite.success, robosuite.termination, robosuite.time_to_success) == (False, "timeout", None)
    assert (libero.success, libero.termination, libero.steps, libero.time_to_success) == (True, "success", 6, 4)
    missed, _ = run(ScriptedEnv(6, {2, 3}), hold=3, at_horizon=1)
    assert (missed.success, missed.termination) == (False, "timeout")


def test_liberos_episode_takes_its_hold_from_the_scenario_at_least_one():
    assert LiberoEpisode(ScriptedEnv(5, set()), Still(), 0).rule == SuccessRule(1, 1)
    assert LiberoEpisode(ScriptedEnv(5, set(), hold=4), Still(), 0).rule == SuccessRule(4, 1)


def test_before_step_runs_before_each_step_and_its_error_is_an_env_error():
    class Hooked(Episode):
        def before_step(self, t):
            self.env.calls.append(f"before {t}")
            if t == 2:
                raise RuntimeError("push failed")

    env = ScriptedEnv(5, set())
    episode = Hooked(env, Still(), 0, rule=SuccessRule(1, 1))
    outcome, steps = collect(episode)
    assert env.calls == ["before 0", "step 0", "before 1", "step 1", "before 2"]
    assert (outcome.termination, outcome.steps, len(steps)) == ("env_error", 2, 2)
    assert outcome.error == "step 2: RuntimeError('push failed')"


def test_a_lost_final_keyframe_ends_a_libero_episode_as_it_was_and_a_robosuite_one_not_quietly():
    outcome, _ = collect(LiberoEpisode(ScriptedEnv(3, {2}, keyframes=True, render_fails=True), Still(), 0))
    assert (outcome.termination, outcome.final_keyframe) == ("success", None)
    with pytest.raises(RuntimeError, match="no GL"):  # a timeout keeps its final frame
        run(ScriptedEnv(3, set(), keyframes=True, render_fails=True), hold=1, at_horizon=1)


def test_a_timeout_keeps_its_final_frame_and_a_success_only_when_the_episode_renders_keyframes():
    timeout, _ = run(ScriptedEnv(3, set(), keyframes=True), hold=1, at_horizon=1)
    success, _ = run(ScriptedEnv(3, {1}, keyframes=True), hold=1, at_horizon=1)
    rendered, _ = run(ScriptedEnv(3, {1}, keyframes=True), hold=1, at_horizon=1, keyframe_every=2)
    assert (timeout.termination, success.termination, rendered.termination) == ("timeout", "success", "success")
    assert timeout.final_keyframe is not None and rendered.final_keyframe is not None
    assert success.final_keyframe is None
    unrendered, _ = run(ScriptedEnv(3, set()), hold=1, at_horizon=1)  # an env built without keyframes
    assert unrendered.final_keyframe is None


def test_a_hold_below_one_is_refused():
    with pytest.raises(ValueError, match="success_hold_steps must be >= 1, got 0"):
        Episode(ScriptedEnv(3, set()), Still(), 0, rule=SuccessRule(1, 0))


def test_the_loop_imports_no_simulator():
    """What the LIBERO venv (robosuite 1.4, no robosuite 1.5 code) imports of it."""
    code = ("import sys, producers.episode, producers.libero.rollout; "
            "print(sorted(m for m in ('robosuite', 'mujoco', 'producers.sim') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_requested_cameras_are_checked_against_the_scene():
    from types import SimpleNamespace

    from producers.episode import requested_cameras

    env = SimpleNamespace(camera_names=("agentview", "robot0_eye_in_hand"))
    request = {"request_id": "req-1", "scenario": {"scenario_id": "lift-base"}, "camera_size": 64}
    assert requested_cameras({**request, "cameras": []}, env) == ((), 64)
    assert requested_cameras({**request, "cameras": ["agentview"]}, env) == (("agentview",), 64)
    with pytest.raises(ValueError, match=r"req-1.*\['wrist'\].*lift-base has: agentview, robot0_eye_in_hand"):
        requested_cameras({**request, "cameras": ["agentview", "wrist"]}, env)
    with pytest.raises(ValueError, match="twice"):
        requested_cameras({**request, "cameras": ["agentview", "agentview"]}, env)
    with pytest.raises(ValueError, match="16-1024"):
        requested_cameras({**request, "cameras": ["agentview"], "camera_size": 4}, env)


def test_the_default_camera_size_is_the_contracts():
    from producers.episode import CAMERA_SIZE
    from schemas import loader

    (field,) = [f for f in loader.expanded_schema("RolloutRequested")["fields"] if f["name"] == "camera_size"]
    assert field["default"] == CAMERA_SIZE
