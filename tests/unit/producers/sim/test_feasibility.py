"""The feasibility pre-check: feasible scenes pass with their measures, each kind of broken scene
fails with a reason naming what is wrong, and the measures are a function of the spec."""

import json

import mujoco
import numpy as np
import pytest

from producers.sim import feasibility
from producers.sim.feasibility import FeasibilityConfig, _Footprint, check_feasibility, footprint_gap
from schemas.scenario import Distractor, ScenarioSpec

LIFT = ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube")
CENTRED = dict(placement_x_range=(0.0, 0.0), placement_y_range=(0.0, 0.0))
TWO_SEEDS = FeasibilityConfig(seeds=(0, 1))


@pytest.mark.parametrize("spec", [
    LIFT,
    LIFT.mutate(place_target_xy=(0.1, 0.1), object_friction=0.02),
    LIFT.mutate(distractors=(Distractor(kind="box", size=0.025, x=-0.075, y=0.0),)),
    ScenarioSpec(env_name="PickPlaceCan", horizon=200, instruction="put the can in its bin"),
], ids=["base", "place", "distractor-on-path", "pickplace"])
def test_feasible_scenes_pass_with_measures(spec, env_factory):
    result = check_feasibility(spec, TWO_SEEDS, env_factory=env_factory)
    assert result.feasible and result.reason == "", result
    m = result.measures
    assert m["seeds_checked"] == 2
    assert m["max_rest_speed_m_s"] < 0.01 and m["max_rest_gap_m"] < 0.003 and m["max_spawn_penetration_m"] < 0.003
    assert m["max_reach_miss_m"] < 0.02
    assert m["oracle_solved"] >= 1  # of the two seeds, all but one
    assert json.loads(result.to_json())["feasible"] is True
    if spec.distractors:
        assert m["min_target_distractor_gap_m"] > 0


@pytest.mark.parametrize("spec, reason", [
    # a distractor where the cube must go: robosuite cannot place the cube
    (LIFT.mutate(**CENTRED, distractors=(Distractor(kind="box", size=0.02, x=0.0, y=0.0),)),
     "does not build: RandomizationError"),
    # the cube offset into a distractor after placement
    (LIFT.mutate(**CENTRED, pose_offset_xyz=(0.06, 0.0, 0.0),
                 distractors=(Distractor(kind="box", size=0.025, x=0.1, y=0.0),)),
     "interpenetrate at spawn"),
    (LIFT.mutate(pose_offset_xyz=(0.0, 0.0, -0.02)), "interpenetrate at spawn"),  # sunk into the table
    (LIFT.mutate(pose_offset_xyz=(0.0, 0.0, 0.1)), "cube still moving after the settle steps"),  # dropped
    (LIFT.mutate(placement_x_range=(0.33, 0.33), placement_y_range=(0.0, 0.0)), "cube not reachable"),
    (LIFT.mutate(distractors=(Distractor(kind="box", size=0.02, x=0.15, y=0.1),
                              Distractor(kind="ball", size=0.02, x=0.17, y=0.1))),
     "distractor0 and distractor1 overlap"),
    (LIFT.mutate(place_target_xy=(0.3, 0.3)), "beyond the reach radius"),
    # a sound scene beyond the oracle: a heavy, slippery cube slides out of its grip (a cycle's
    # material candidates were such, and the critic spent validation rollouts to reject them)
    (LIFT.mutate(object_friction=0.02, object_mass=6.0),
     "the oracle does not solve it: 0 of 2 episodes succeeded, 1 needed"),
    (LIFT.mutate(place_target_xy=(0.15, 0.15), distractors=(Distractor(kind="cylinder", size=0.03, x=0.16, y=0.15),)),
     "place target (0.15, 0.15) is covered by distractor0"),
], ids=["distractor-on-cube", "offset-into-distractor", "sunk", "dropped", "out-of-reach", "distractors-overlap",
        "place-out-of-reach", "beyond-the-oracle", "place-covered"])
def test_infeasible_scenes_fail_with_the_reason(spec, reason):
    result = check_feasibility(spec, TWO_SEEDS)
    assert not result.feasible
    assert reason in result.reason, result.reason
    assert json.loads(result.to_json())["reason"] == result.reason


def test_a_distractor_resting_on_the_cube_is_not_resting_on_the_surface(env_factory):
    # a ball dropped onto the cube from above (the spec cannot put it there; a raised z can)
    env = env_factory(LIFT.mutate(**CENTRED, distractors=(Distractor(kind="ball", size=0.015, x=0.2, y=0.2),)))
    env.reset(0)
    body = env.object_bodies()["distractor0"]
    adr = env.model.jnt_qposadr[env.model.body_jntadr[body]]
    cube_top = env.signals()["object_poses"][0]["pos"][2] + 0.02
    env.data.qpos[adr:adr + 3] = [0.0, 0.0, cube_top + 0.015]
    env.data.qvel[:] = 0.0
    mujoco.mj_forward(env.model, env.data)
    gap = feasibility._lowest_z(env, body) - env.surface_z()
    assert gap > 0.03  # what the rest check compares with max_rest_gap_m
    cube = feasibility._body_footprint(env, env.object_bodies()["cube"])
    assert feasibility.footprint_gap(cube, feasibility._body_footprint(env, body)) < 0


def test_measures_are_a_function_of_the_spec(env_factory):
    spec = LIFT.mutate(object_mass=3.0)
    a = check_feasibility(spec, TWO_SEEDS)
    b = check_feasibility(spec, TWO_SEEDS, env_factory=env_factory)
    assert a.to_json() == b.to_json() and a.feasible
    assert "cost" not in a.to_json() and a.cost_s > 0


def test_footprint_gaps():
    box = _Footprint(np.zeros(2), half=(0.02, 0.02))
    assert footprint_gap(box, _Footprint(np.array([0.05, 0.0]), radius=0.01)) == pytest.approx(0.02)
    assert footprint_gap(box, _Footprint(np.array([0.05, 0.0]), half=(0.02, 0.02))) == pytest.approx(0.01)
    turned = _Footprint(np.array([0.05, 0.0]), half=(0.02, 0.02), yaw=np.pi / 4)
    assert footprint_gap(box, turned) == pytest.approx(0.05 - 0.02 - 0.02 * np.sqrt(2))
    assert footprint_gap(box, _Footprint(np.array([0.01, 0.0]), radius=0.005)) < 0
    assert footprint_gap(_Footprint(np.zeros(2), radius=0.01), _Footprint(np.array([0.0, 0.03]), radius=0.01)) \
        == pytest.approx(0.01)


def test_config_validation_quotes_the_value():
    with pytest.raises(ValueError, match="-1"):
        FeasibilityConfig(seeds=(-1,))
    with pytest.raises(ValueError, match="max_reach_miss_m"):
        FeasibilityConfig(max_reach_miss_m=0)
    with pytest.raises(ValueError, match="min_oracle_successes .* got 3"):
        FeasibilityConfig(seeds=(0, 1), min_oracle_successes=3)
    assert FeasibilityConfig().oracle_successes_needed == 2  # of three seeds
    assert FeasibilityConfig(seeds=(4,)).oracle_successes_needed == 1
