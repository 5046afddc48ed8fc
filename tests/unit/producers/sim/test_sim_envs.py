import hashlib
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from producers.sim.envs import OBJECT_GEOM_PRIORITY, SIGNAL_KEYS, make_env
from producers.sim.exceptions import ActionError, EnvError, KeyframeError
from producers.sim.policies import make_policy
from producers.sim.rollout import run_episode
from schemas.scenario import Distractor, ScenarioSpec

REPO = pathlib.Path(__file__).resolve().parents[4]
EXPECTED_KEYS = {"eef_pos", "eef_quat", "gripper_opening", "gripper_force", "object_poses", "contacts",
                 "joint_torques", "joint_pos", "goal_distance", "object_lift"}

DET_SPEC = dict(env_name="Lift", horizon=40, instruction="lift", object_mass=0.2, object_friction=0.6,
                distractors=[dict(kind="cylinder", size=0.02, x=0.08, y=0.0)])


def _digest(env, seed: int) -> str:
    _, steps = run_episode(env, make_policy("scripted-novice"), seed, stop_on_success=False)
    payload = [[s.action, s.signals] for s in steps]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()


def _det_spec() -> ScenarioSpec:
    return ScenarioSpec.from_dict(DET_SPEC)


def test_signals_keys_exactly_and_types(lift_env):
    lift_env.reset(0)
    lift_env.step(np.zeros(7))
    s = lift_env.signals()
    assert set(s) == EXPECTED_KEYS == set(SIGNAL_KEYS)
    assert len(s["eef_pos"]) == 3 and len(s["eef_quat"]) == 4
    assert abs(np.linalg.norm(s["eef_quat"]) - 1) < 1e-6
    assert len(s["joint_torques"]) == 7 and len(s["joint_pos"]) == 7
    for key in ("gripper_opening", "gripper_force", "goal_distance", "object_lift"):
        assert type(s[key]) is float
    assert [p["name"] for p in s["object_poses"]] == ["cube"]
    assert set(s["object_poses"][0]) == {"name", "pos", "quat"}
    for c in s["contacts"]:
        assert set(c) == {"a", "b", "normal_force"} and c["a"] < c["b"] and c["normal_force"] >= 0
    assert {"a": "cube", "b": "table"} in [{"a": c["a"], "b": c["b"]} for c in s["contacts"]]
    json.dumps(s)  # plain JSON types only
    assert 0.03 < s["gripper_opening"] < 0.09  # starts open
    assert s["goal_distance"] == pytest.approx(0.04, abs=1e-3)  # Lift: 4 cm still to gain


def test_same_seed_same_rollout_two_envs(env_factory):
    a = env_factory(_det_spec())
    b = make_env(_det_spec())
    try:
        assert _digest(a, 5) == _digest(b, 5)
        assert _digest(a, 5) != _digest(a, 6)
    finally:
        b.close()


def test_episode_independent_of_history(env_factory):
    env = env_factory(_det_spec())
    first = _digest(env, 3)
    _digest(env, 4)
    assert _digest(env, 3) == first


def test_same_seed_same_rollout_across_processes(env_factory):
    here = _digest(env_factory(_det_spec()), 11)
    code = (
        "import sys; sys.path.insert(0, 'tests/unit/producers/sim'); "
        "from test_sim_envs import _digest, _det_spec; from producers.sim.envs import make_env; "
        "print(_digest(make_env(_det_spec()), 11))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == here


def test_keyframe_is_128_rgb_and_not_constant(lift_env):
    lift_env.reset(1)
    img = lift_env.render_keyframe(128)
    assert img.shape == (128, 128, 3) and img.dtype == np.uint8
    assert img.std() > 10 and len(np.unique(img.reshape(-1, 3), axis=0)) > 50


def test_keyframe_needs_keyframes_flag(env_factory):
    env = env_factory(_det_spec())
    env.reset(0)
    with pytest.raises(KeyframeError):
        env.render_keyframe()


def test_bad_actions_and_step_order(lift_spec):
    env = make_env(lift_spec.mutate(horizon=2))
    try:
        with pytest.raises(EnvError, match="before reset"):
            env.step(np.zeros(7))
        env.reset(0)
        with pytest.raises(ActionError):
            env.step(np.zeros(6))
        with pytest.raises(ActionError):
            env.step(np.array([0, 0, 0, 0, 0, 0, np.nan]))
        assert env.step(np.zeros(7))[2] is False
        assert env.step(np.zeros(7))[2] is True  # horizon reached
        with pytest.raises(EnvError, match="horizon"):
            env.step(np.zeros(7))
    finally:
        env.close()


def test_model_edits_applied(lift_spec, env_factory):
    spec = lift_spec.mutate(object_friction=0.2, object_mass=0.5, object_rgba=(0.0, 0.0, 1.0, 1.0))
    env = env_factory(spec)
    env.reset(0)
    m = env.model
    g = env._manip_contact_geoms
    assert np.all(m.geom_friction[g, 0] == 0.2) and np.all(m.geom_priority[g] == OBJECT_GEOM_PRIORITY)
    assert m.body_mass[env._manip_bodies].sum() == pytest.approx(0.5)
    assert np.all(m.geom_rgba[env._manip_visual_geoms] == [0, 0, 1, 1])
    # the finger pads keep friction 2 at priority 0: the object's setting is the one that counts
    pads = env._pads
    assert np.all(m.geom_friction[pads, 0] == 2.0) and np.all(m.geom_priority[pads] == 0)


def test_placement_range_and_pose_offset(lift_spec, env_factory):
    fixed = lift_spec.mutate(placement_x_range=(0.1, 0.1), placement_y_range=(-0.05, -0.05))
    env = env_factory(fixed)
    for seed in (0, 1):
        env.reset(seed)
        pos = env.signals()["object_poses"][0]["pos"]
        assert pos[0] == pytest.approx(0.1, abs=2e-3) and pos[1] == pytest.approx(-0.05, abs=2e-3)
    moved = env_factory(fixed.mutate(pose_offset_xyz=(-0.03, 0.02, 0.0)))
    moved.reset(0)
    pos = moved.signals()["object_poses"][0]["pos"]
    assert pos[0] == pytest.approx(0.07, abs=2e-3) and pos[1] == pytest.approx(-0.03, abs=2e-3)


def test_distractors_are_free_bodies_that_can_be_hit(lift_spec, env_factory):
    spec = lift_spec.mutate(placement_x_range=(0.0, 0.0), placement_y_range=(0.0, 0.0),
                            distractors=(Distractor(kind="box", size=0.025, x=0.0, y=0.12),
                                         Distractor(kind="ball", size=0.02, x=-0.1, y=-0.1)))
    env = env_factory(spec)
    env.reset(0)
    s = env.signals()
    names = [p["name"] for p in s["object_poses"]]
    assert names == ["cube", "distractor0", "distractor1"]
    start = np.array(s["object_poses"][1]["pos"])
    assert start[:2] == pytest.approx([0.0, 0.12], abs=2e-3)
    assert start[2] == pytest.approx(0.8 + 0.025, abs=3e-3)  # resting on the table top
    # sweep the open hand low along +y, through the box
    hit = False
    for _ in range(60):
        eef = np.array(env.signals()["eef_pos"])
        target = np.array([0.0, 0.25, 0.83])
        a = np.zeros(7)
        a[:3] = np.clip(10 * (target - eef), -1, 1)
        a[6] = -1
        env.step(a)
        pairs = {(c["a"], c["b"]) for c in env.signals()["contacts"]}
        hit = hit or ("distractor0", "gripper") in pairs
    end = np.array(env.signals()["object_poses"][1]["pos"])
    assert hit
    assert np.linalg.norm(end[:2] - start[:2]) > 0.02  # it was pushed


def test_size_scale_changes_geometry(lift_spec, env_factory):
    small, big = env_factory(lift_spec), env_factory(lift_spec.mutate(object_size_scale=1.5))
    small.reset(0)
    big.reset(0)
    gs = small.model.geom_size[small._manip_contact_geoms[0]]
    gb = big.model.geom_size[big._manip_contact_geoms[0]]
    assert gb == pytest.approx(gs * 1.5)
    # resting on the table, not sunk into it
    assert big.signals()["object_poses"][0]["pos"][2] == pytest.approx(0.8 + gb[2], abs=2e-3)


@pytest.mark.parametrize("env_name", ["Stack", "PickPlaceCan"])
def test_other_envs_build_step_and_report(env_name, env_factory):
    env = env_factory(ScenarioSpec(env_name=env_name, horizon=20, instruction="task",
                                   distractors=(Distractor(kind="cylinder", size=0.02, x=0.15, y=0.15),)))
    obs = env.reset(0)
    assert "goal_pos" in obs and obs["goal_pos"].shape == (3,)
    for _ in range(3):
        env.step(np.zeros(7))
    s = env.signals()
    assert set(s) == EXPECTED_KEYS
    names = [p["name"] for p in s["object_poses"]]
    assert names == (["cubeA", "cubeB", "distractor0"] if env_name == "Stack" else ["Can", "distractor0"])
    assert s["goal_distance"] > 0.02 and not env.success_relative()
