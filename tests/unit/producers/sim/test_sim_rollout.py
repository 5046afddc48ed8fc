import numpy as np
import pytest

from producers.quality import execution_quality
from producers.sim.envs import SIGNAL_KEYS
from producers.sim.policies import OracleScripted
from producers.sim.rollout import SUCCESS_HOLD_STEPS, Episode, run_episode


class Broken:
    name = "broken"

    def reset(self, seed, spec):
        pass

    def act(self, obs, signals):
        return np.zeros(5)


def test_success_ends_the_episode_after_the_hold(lift_env):
    out, steps = run_episode(lift_env, OracleScripted(), 0)
    assert out.termination == "success" and out.success and out.error is None
    assert out.steps == len(steps) and out.time_to_success == out.steps - SUCCESS_HOLD_STEPS
    assert all(s.success for s in steps[-SUCCESS_HOLD_STEPS:]) and not steps[out.time_to_success - 1].success
    assert [s.t for s in steps] == list(range(len(steps)))
    assert all(set(s.signals) == set(SIGNAL_KEYS) and len(s.action) == 7 for s in steps)
    assert out.final_keyframe is None  # a success keeps its last frame only when it renders keyframes
    q = execution_quality([s.signals for s in steps], [s.action for s in steps], [s.success for s in steps])
    assert 0.3 < q["path_efficiency"] <= 1.0 and q["regrasp_count"] == 0
    assert q["peak_contact_force"] > 10.0  # it squeezed the cube
    assert q["time_to_success"] == out.time_to_success


def test_keyframe_every(lift_env):
    episode = Episode(lift_env, OracleScripted(), 0, keyframe_every=10, keyframe_size=64)
    frames = [s.t for s in episode if s.keyframe is not None]
    assert frames and all(t % 10 == 0 for t in frames)
    assert episode.outcome.final_keyframe.shape == (64, 64, 3)


def test_cameras_render_every_step_before_the_action_and_change_nothing(lift_env):
    with_cameras = Episode(lift_env, OracleScripted(), 2, cameras=("agentview", "robot0_eye_in_hand"), camera_size=32)
    records = list(with_cameras)
    plain = list(Episode(lift_env, OracleScripted(), 2))
    assert [r.action for r in records] == [r.action for r in plain]  # rendering moves no physics
    assert with_cameras.outcome.termination == "success"
    assert all(set(r.frames) == {"agentview", "robot0_eye_in_hand"} for r in records)
    assert all(f.shape == (32, 32, 3) and f.dtype == np.uint8 for r in records for f in r.frames.values())
    # the wrist camera rides with the hand: its view changes as the arm moves to the cube
    wrist = [r.frames["robot0_eye_in_hand"].astype(int) for r in records]
    assert np.abs(wrist[0] - wrist[len(wrist) // 2]).mean() > 1.0
    assert all(r.frames is None for r in plain)


def test_an_unknown_camera_ends_the_episode_as_env_error_naming_the_cameras(lift_env):
    episode = Episode(lift_env, OracleScripted(), 0, cameras=("nosuchcam",))
    assert list(episode) == []
    assert episode.outcome.termination == "env_error"
    assert "nosuchcam" in episode.outcome.error and "agentview" in episode.outcome.error


def test_policy_error_is_reported_not_raised(lift_env):
    out, steps = run_episode(lift_env, Broken(), 0)
    assert out.termination == "policy_error" and not out.success and steps == []
    assert "step 0" in out.error and "7 finite floats" in out.error


def test_episode_arguments_validated(lift_env):
    with pytest.raises(ValueError, match="-1"):
        Episode(lift_env, OracleScripted(), 0, keyframe_every=-1)
