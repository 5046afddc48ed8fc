"""EpisodeDetector on hand-built and recorded Panda Lift traces: every failure type fires when
its evidence appears (and at that step), and stays silent on a clean lift; a moment the episode
later recovers from (a re-grasp, resumed progress, the hand reaching the target) is marked so."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from failure_traces import (
    CUBE_START,
    DISTRACTOR,
    DISTRACTOR_START,
    OPEN_M,
    Scene,
    clean_lift,
    ended,
    recorded,
)

import schemas
from schemas.codec import Codec
from schemas.events import stable_id
from streams.exceptions import ConfigError, DetectorError
from streams.failures.detector import (
    DETECTOR_VERSION,
    FAILURE_TYPES,
    MISS_CLOSED_EMPTY,
    MISS_ENDED_UNLIFTED,
    MISS_LOST_BEFORE_LIFT,
    MISS_REOPENED_UNLIFTED,
    NOT_RECOVERED,
    DetectorConfig,
    EpisodeDetector,
)

CFG = DetectorConfig()


def detector(scene: Scene | None = None, config: DetectorConfig = CFG) -> EpisodeDetector:
    return EpisodeDetector(config, scene.episode_id if scene else "ep-1", "scn-1", "model-1")


def run(scene: Scene, end: dict | None = None, config: DetectorConfig = CFG) -> list[tuple[int, dict]]:
    """Feeds every step, then the end; returns (t of the call that emitted it, moment)."""
    det = detector(scene, config)
    out = []
    for step in scene.steps:
        out += [(step["t"], m) for m in det.on_step(step)]
    if end is not None:
        out += [(-1, m) for m in det.on_end(end)]
    return out


def types(emitted) -> list[str]:
    return [m["failure_type"] for _, m in emitted]


def only(emitted, failure_type: str) -> list[dict]:
    return [m for _, m in emitted if m["failure_type"] == failure_type]


def first_step(scene: Scene, predicate, after: int = 0) -> int:
    return next(s["t"] for s in scene.steps[after:] if predicate(s))


# -- contract -----------------------------------------------------------------------------

def test_failure_types_mirror_the_avro_enum():
    avsc = json.loads((Path(schemas.__file__).parent / "avro" / "FailureMoment.avsc").read_text())
    enum = next(f["type"] for f in avsc["fields"] if f["name"] == "failure_type")
    assert tuple(enum["symbols"]) == FAILURE_TYPES


def test_moments_are_schema_valid_with_stable_ids():
    scene = clean_lift().slip(4)
    scene.hold(3)
    emitted = run(scene, ended(scene, success=False))
    assert {"slip", "drop", "timeout"} <= set(types(emitted))
    codec = Codec()
    for _, m in emitted:
        assert m["envelope"]["event_id"] == stable_id("FailureMoment", "ep-1", m["failure_type"], m["step"])
        assert m["detector_version"] == DETECTOR_VERSION
        assert 0.0 <= m["severity"] <= 1.0
        assert all(math.isfinite(v) for v in m["features"].values())
        assert {"goal_distance_m", "object_lift_m"} <= set(m["features"])
        decoded = codec.decode(codec.encode(m))
        assert decoded["failure_type"] == m["failure_type"] and decoded["step"] == m["step"]
    assert [m["envelope"]["event_id"] for _, m in emitted] == \
        [m["envelope"]["event_id"] for _, m in run(scene, ended(scene, success=False))]


# -- negatives on clean episodes ------------------------------------------------------------

def test_clean_hand_built_lift_flags_nothing():
    scene = clean_lift()
    assert run(scene, ended(scene, success=True)) == []


def test_clean_recorded_robosuite_lift_flags_nothing():
    trace, steps = recorded("lift_success")
    assert trace["success"] is True
    det = EpisodeDetector(CFG, "rec-1", "scn-1", "model-1")
    moments = [m for s in steps for m in det.on_step(s)]
    end = {"episode_id": "rec-1", "termination": "success", "success": True, "steps": len(steps)}
    moments += det.on_end(end)
    assert moments == [], [(m["failure_type"], m["step"]) for m in moments]


def test_recorded_robosuite_miss_is_a_grasp_miss_then_a_stall_then_a_timeout():
    trace, steps = recorded("lift_miss")
    assert trace["success"] is False
    det = EpisodeDetector(CFG, "rec-1", "scn-1", "model-1")
    moments = [m for s in steps for m in det.on_step(s)]
    moments += det.on_end({"episode_id": "rec-1", "termination": "timeout", "success": False, "steps": len(steps)})
    assert [m["failure_type"] for m in moments] == ["grasp_miss", "stall", "timeout"]
    miss = moments[0]
    close_t = next(s["t"] for s in steps if s["action"][-1] > 0)
    assert miss["features"]["variant"] == MISS_CLOSED_EMPTY
    assert miss["features"]["close_step"] == close_t
    assert close_t < miss["step"] <= close_t + CFG.grasp_settle_steps
    assert miss["severity"] == 1.0  # the hand was 6 cm beside the cube
    assert moments[2]["step"] == len(steps) - 1


# -- grasp_miss ---------------------------------------------------------------------------

def test_grasp_miss_when_fingers_shut_beside_the_cube_at_the_step_they_shut():
    scene = Scene()
    scene.move_to([0.06, 0.0, 0.93], 20).move_to([0.06, 0.0, 0.83], 10)
    close_t = scene.t
    scene.close_empty(12)
    emitted = run(scene)
    assert types(emitted) == ["grasp_miss"]
    (t, m), = emitted
    shut = first_step(scene, lambda s: s["gripper_opening"] <= CFG.closed_empty_opening_m, after=close_t)
    assert t == m["step"] == shut
    assert m["features"]["variant"] == MISS_CLOSED_EMPTY
    assert m["severity"] == pytest.approx(1.0)  # 6 cm >= miss_severity_distance_m


def test_grasp_miss_when_cube_is_touched_but_never_lifted_and_the_hand_reopens():
    scene = Scene().approach(30).close_on_cube(11).hold(10, force=30.0)  # too heavy: it never rises
    open_t = scene.t
    scene.release(3)
    emitted = run(scene)
    assert types(emitted) == ["grasp_miss"]
    (t, m), = emitted
    assert t == m["step"] == open_t
    assert m["features"]["variant"] == MISS_REOPENED_UNLIFTED
    assert m["severity"] == pytest.approx(1.0)


def test_a_touch_lost_while_closing_is_a_miss_once_the_fingers_shut_empty():
    scene = Scene().approach(30).close_on_cube(4)  # touched on the 4th step, still closing
    lost_t = scene.t
    scene.hold(1, force=0.0, opening=0.02).hold(3, opening=0.0)
    emitted = run(scene)
    assert [(t, m["failure_type"], m["features"]["variant"]) for t, m in emitted] == \
        [(lost_t + 1, "grasp_miss", MISS_CLOSED_EMPTY)]


def test_a_touch_lost_with_the_fingers_stopped_is_a_miss_at_once():
    scene = Scene().approach(30).close_on_cube(4).hold(2, force=8.0)  # a light, steady touch
    lost_t = scene.t
    scene.hold(1, force=0.0)
    emitted = run(scene)
    assert [(t, m["failure_type"], m["features"]["variant"]) for t, m in emitted] == \
        [(lost_t, "grasp_miss", MISS_LOST_BEFORE_LIFT)]


def test_a_first_finger_nudging_the_cube_before_the_grip_is_not_a_miss():
    scene = Scene().approach(30)
    scene.command = 1.0
    scene.hold(1, opening=0.07).hold(1, opening=0.06, force=5.5)  # one finger reaches it first
    scene.hold(1, opening=0.05, force=0.5)  # the cube slides towards the other finger
    scene.hold(1, opening=0.0405, force=24.0).hold(3, force=40.0)
    scene.lift_by(0.10, 10)
    assert run(scene, ended(scene, success=True)) == []


def test_a_pinched_cube_too_heavy_to_lift_that_slides_out_is_a_slip():
    scene = Scene().approach(30).close_on_cube(11)  # fingers stopped on it, 40 N, never rises
    lost_t = scene.t
    scene.hold(1, force=0.0, opening=0.02).hold(3, opening=0.0)
    emitted = run(scene)
    assert [(t, m["failure_type"]) for t, m in emitted] == [(lost_t, "slip")]
    assert emitted[0][1]["features"]["lift_at_slip_m"] == pytest.approx(0.0, abs=1e-9)


def test_a_pinched_cube_off_centre_is_not_held():
    scene = Scene().approach(30)
    scene.eef = [scene.eef[0] + 0.03, scene.eef[1], scene.eef[2]]  # a fingertip on the cube's edge
    scene.close_on_cube(11)
    lost_t = scene.t
    scene.hold(1, force=0.0, opening=0.02).hold(2, opening=0.0)
    assert [(t, m["failure_type"]) for t, m in run(scene)] == [(lost_t + 1, "grasp_miss")]


def test_grasp_miss_still_closed_on_an_unlifted_cube_is_told_only_by_the_end():
    scene = Scene().approach(30).close_on_cube(11).hold(10)
    det = detector(scene)
    assert [m for s in scene.steps for m in det.on_step(s)] == []
    moments = det.on_end(ended(scene, success=False, termination="policy_error"))
    assert [(m["failure_type"], m["step"], m["features"]["variant"]) for m in moments] == \
        [("grasp_miss", scene.t - 1, MISS_ENDED_UNLIFTED)]


# -- slip / drop ------------------------------------------------------------------------------

def test_slip_then_drop_each_at_its_own_step():
    scene = Scene().approach(30).close_on_cube(11).lift_by(0.10, 10).hold(5)
    held_lift = scene.lift
    slip_t = scene.t
    scene.slip(fall_steps=5)
    emitted = run(scene)
    assert types(emitted) == ["slip", "drop"]
    (t_slip, slip), (t_drop, drop) = emitted
    assert t_slip == slip["step"] == slip_t
    assert slip["features"]["lift_at_slip_m"] == pytest.approx(held_lift)
    assert slip["severity"] == pytest.approx(min(1.0, held_lift / CFG.slip_severity_lift_m))
    fell = first_step(scene, lambda s: held_lift - s["object_lift"] >= CFG.drop_fall_m, after=slip_t)
    assert t_drop == drop["step"] == fell > slip_t
    assert drop["features"]["commanded_release"] == 0.0


def test_a_slip_from_barely_above_the_table_is_a_slip_without_a_drop():
    scene = Scene().approach(30).close_on_cube(11).lift_by(0.01, 4).hold(3)
    scene.slip(fall_steps=2)
    assert types(run(scene)) == ["slip"]


def test_commanded_release_in_mid_air_is_a_drop_but_not_a_slip():
    scene = Scene().approach(30).close_on_cube(11).lift_by(0.15, 15).hold(5)
    scene.release(fall_steps=6)
    emitted = run(scene)
    assert types(emitted) == ["drop"]
    assert only(emitted, "drop")[0]["features"]["commanded_release"] == 1.0


def test_placing_the_cube_back_and_releasing_it_is_neither_slip_nor_drop():
    scene = Scene().approach(30).close_on_cube(11).lift_by(0.10, 10).hold(5)
    scene.move_to(list(scene.eef[:2]) + [scene.eef[2] - scene.lift], 10, carry=True)  # set it down
    scene.release(3).hold(5)
    assert run(scene) == []


# -- knocked_object ------------------------------------------------------------------------

def push_distractor(scene: Scene, dx: float, n: int = 6, force: float = 6.0) -> None:
    start = list(scene.distractor)
    for i in range(1, n + 1):
        scene.distractor = [start[0] + dx * i / n, start[1], start[2]]
        scene.extra_contacts = [{"a": DISTRACTOR, "b": "gripper", "normal_force": force}]
        scene.record()
    scene.extra_contacts = []


def test_distractor_pushed_5cm_is_knocked_at_the_step_it_passes_3cm():
    scene = Scene()
    scene.move_to([0.12, 0.05, 0.84], 20)
    push_t = scene.t
    push_distractor(scene, 0.05)
    clean_lift(scene)
    emitted = run(scene, ended(scene, success=True))
    assert types(emitted) == ["knocked_object"]
    (t, m), = emitted
    moved = first_step(scene, lambda s: s["object_poses"][1]["pos"][0] - DISTRACTOR_START[0]
                       >= CFG.knock_displacement_m, after=push_t)
    assert t == m["step"] == moved
    assert m["features"]["is_target"] == 0.0 and m["features"]["object_index"] == 1.0


def test_distractor_nudged_1cm_is_not_knocked():
    scene = Scene()
    scene.move_to([0.12, 0.05, 0.84], 20)
    push_distractor(scene, 0.01)
    clean_lift(scene)
    assert run(scene, ended(scene, success=True)) == []


def test_target_pushed_before_any_grasp_is_knocked_but_carrying_it_is_not():
    scene = Scene().approach(30)
    for _ in range(6):
        scene.cube = [scene.cube[0] + 0.01, scene.cube[1], scene.cube[2]]
        scene.eef = [scene.eef[0] + 0.01, scene.eef[1], scene.eef[2]]
        scene.record()
    emitted = run(scene)
    assert types(emitted) == ["knocked_object"]
    assert only(emitted, "knocked_object")[0]["features"]["is_target"] == 1.0
    carried = clean_lift()  # the cube moves 15 cm, but held
    carried.move_to([0.2, 0.2, carried.eef[2]], 10, carry=True)
    assert run(carried) == []


def test_a_toppled_distractor_is_knocked_by_rotation():
    scene = Scene().hold(3)
    s, c = math.sin(0.4), math.cos(0.4)  # 0.8 rad about x
    scene.hold(2, distractor_quat=[s, 0.0, 0.0, c])
    emitted = run(scene)
    assert types(emitted) == ["knocked_object"]
    assert only(emitted, "knocked_object")[0]["step"] == 3


# -- excessive_force / collision --------------------------------------------------------------

def test_crushing_grip_is_excessive_force_at_the_spike():
    scene = Scene().approach(30).close_on_cube(11)
    spike_t = scene.t
    scene.hold(1, force=95.0).hold(3, force=40.0)
    emitted = run(scene)
    assert [(t, m["failure_type"]) for t, m in emitted] == [(spike_t, "excessive_force")]
    m = only(emitted, "excessive_force")[0]
    assert m["features"]["by_grip"] == 1.0
    assert m["severity"] == pytest.approx(1 - CFG.max_grip_force_n / 95.0)


def test_sustained_torque_saturation_while_touching_is_excessive_force_a_spike_or_free_space_is_not():
    saturated = [0.1, -80.0, 0.0, 11.0, 0.1, 2.3, 0.0]
    spike = Scene().hold(5).hold(1, torques=saturated).hold(5, torques=[0.1, -40.0, 0.0, 11.0, 0.1, 2.3, 0.0])
    assert run(spike) == []
    in_free_space = Scene().hold(5).hold(6, torques=saturated)  # a fast wrist turn: the controller hurrying
    assert run(in_free_space) == []
    pressing = [{"a": "gripper", "b": "table", "normal_force": 6.0}]  # touching, below collision_force_n
    sustained = Scene().hold(5).hold(4, torques=saturated, extra_contacts=pressing)
    emitted = run(sustained)
    assert [(t, m["failure_type"]) for t, m in emitted] == [(5 + CFG.torque_min_steps - 1, "excessive_force")]
    feats = only(emitted, "excessive_force")[0]["features"]
    assert feats["by_torque"] == 1.0 and feats["max_torque_joint"] == 1.0


def test_hand_hitting_the_table_is_a_collision_a_light_touch_is_not():
    light = Scene().hold(3).hold(3, extra_contacts=[{"a": "gripper", "b": "table", "normal_force": 4.0}])
    assert run(light) == []
    hit = Scene().hold(3).hold(3, extra_contacts=[{"a": "gripper", "b": "table", "normal_force": 25.0}])
    emitted = run(hit)
    assert [(t, m["failure_type"]) for t, m in emitted] == [(3, "collision")]
    feats = only(emitted, "collision")[0]["features"]
    assert feats["with_table"] == 1.0 and feats["by_arm"] == 0.0 and feats["force_n"] == 25.0


def test_one_long_collision_is_one_moment_two_separate_ones_are_two():
    arm_hit = [{"a": DISTRACTOR, "b": "robot", "normal_force": 30.0}]
    long = Scene().hold(2).hold(10, extra_contacts=arm_hit)
    assert [t for t, _ in run(long)] == [2]
    gap = CFG.rearm_steps + 1
    two = Scene().hold(2).hold(2, extra_contacts=arm_hit).hold(gap, extra_contacts=[]).hold(2, extra_contacts=arm_hit)
    emitted = run(two)
    assert [(t, m["failure_type"]) for t, m in emitted] == [(2, "collision"), (4 + gap, "collision")]
    assert only(emitted, "collision")[0]["features"]["by_arm"] == 1.0


def test_arm_link_bumping_the_target_is_a_collision_fingers_gripping_it_are_not():
    scene = Scene().hold(2).hold(2, extra_contacts=[{"a": "cube", "b": "robot", "normal_force": 20.0}])
    assert types(run(scene)) == ["collision"]


# -- stall ------------------------------------------------------------------------------------

def test_stall_fires_one_window_after_the_hand_stops_without_progress():
    scene = Scene()
    scene.move_to([0.0, 0.0, 0.95], 4)  # 2.8 cm per step, then still
    last_move = scene.t - 1
    scene.hold(CFG.stall_window_steps + 10)
    emitted = run(scene)
    assert [(t, m["failure_type"]) for t, m in emitted] == [(last_move + CFG.stall_window_steps, "stall")]


def test_a_long_slow_approach_without_goal_progress_is_not_a_stall():
    scene = Scene()
    scene.move_to([0.0, 0.0, 0.93], 70).move_to(list(CUBE_START), 20)
    clean_lift(scene)
    assert run(scene, ended(scene, success=True)) == []


def test_holding_still_once_the_goal_is_reached_is_not_a_stall():
    scene = clean_lift().hold(CFG.stall_window_steps * 2)
    assert run(scene) == []


# -- out_of_reach / joint_limit -----------------------------------------------------------------

def test_stretched_elbow_is_out_of_reach_after_limit_min_steps():
    stretched = [0.03, 0.9, 0.0, -0.10, -0.03, 2.98, 0.84]
    scene = Scene().hold(4).hold(6, joints=stretched)
    emitted = run(scene)
    assert [(t, m["failure_type"]) for t, m in emitted] == [(4 + CFG.limit_min_steps - 1, "out_of_reach")]
    m = only(emitted, "out_of_reach")[0]
    assert m["features"]["joint"] == 3.0
    assert m["features"]["distance_to_limit_rad"] == pytest.approx(-0.0698 + 0.10)


def test_stretched_elbow_for_too_few_steps_or_at_the_goal_is_not_out_of_reach():
    stretched = [0.03, 0.9, 0.0, -0.10, -0.03, 2.98, 0.84]
    brief = Scene().hold(4).hold(CFG.limit_min_steps - 1, joints=stretched).hold(3, joints=[0.03, 0.9, 0.0, -2.0,
                                                                                           -0.03, 2.98, 0.84])
    assert run(brief) == []
    at_goal = Scene().hold(4, goal=0.0).hold(6, joints=stretched)
    assert run(at_goal) == []


def test_wrist_at_its_limit_is_a_joint_limit():
    at_limit = [0.03, 0.9, 0.0, -2.0, -0.03, 3.74, 0.84]
    scene = Scene().hold(2).hold(5, joints=at_limit)
    emitted = run(scene)
    assert [(t, m["failure_type"]) for t, m in emitted] == [(2 + CFG.limit_min_steps - 1, "joint_limit")]
    assert only(emitted, "joint_limit")[0]["features"]["joint"] == 5.0
    near = Scene().hold(2).hold(5, joints=[0.03, 0.9, 0.0, -2.0, -0.03, 3.6, 0.84])
    assert run(near) == []


# -- wrong_object -----------------------------------------------------------------------------

def test_closing_on_the_distractor_is_wrong_object_and_lifting_it_is_not_a_knock():
    scene = Scene()
    scene.move_to([0.12, 0.10, 0.93], 20, command=-1.0).move_to([0.12, 0.10, 0.83], 8)
    scene.command = 1.0
    scene.hold(2, opening=0.06)
    grip_t = scene.t
    scene.hold(4, opening=0.04, gripper_distractor_force=30.0)
    for _ in range(6):  # and carries it up 6 cm
        scene.eef = [scene.eef[0], scene.eef[1], scene.eef[2] + 0.01]
        scene.distractor = [scene.distractor[0], scene.distractor[1], scene.distractor[2] + 0.01]
        scene.record()
    emitted = run(scene)
    # one story: not also a grasp_miss (the fingers closed on something) nor a knock (it was grasped)
    assert [(t, m["failure_type"]) for t, m in emitted] == [
        (grip_t + CFG.wrong_grasp_confirm_steps - 1, "wrong_object")]
    wrong = only(emitted, "wrong_object")[0]
    assert wrong["features"]["object_index"] == 1.0 and wrong["severity"] == pytest.approx(30.0 / 40.0)


def test_brushing_the_distractor_with_an_open_hand_is_not_wrong_object():
    scene = Scene()
    scene.move_to([0.12, 0.05, 0.84], 10)
    scene.hold(4, gripper_distractor_force=6.0)
    assert run(scene) == []


# -- timeout ----------------------------------------------------------------------------------

def test_timeout_only_for_an_unsuccessful_episode_ended_by_the_horizon():
    scene = Scene().hold(10)
    emitted = run(scene, ended(scene, success=False, termination="timeout", steps=200))
    assert [(m["failure_type"], m["step"]) for _, m in emitted] == [("timeout", 199)]
    assert only(emitted, "timeout")[0]["severity"] == 1.0  # ended as far from the goal as it began
    assert run(scene, ended(scene, success=False, termination="policy_error")) == []
    assert run(clean_lift(), ended(clean_lift(), success=True)) == []


# -- several types, each once ---------------------------------------------------------------------

def test_several_types_fire_in_one_episode_and_each_moment_once():
    scene = Scene()
    scene.move_to([0.12, 0.05, 0.84], 20)
    push_distractor(scene, 0.05)
    scene.approach(30).close_on_cube(11).lift_by(0.10, 10).hold(5).slip(5)
    scene.hold(3, extra_contacts=[{"a": "gripper", "b": "table", "normal_force": 40.0}])
    det = detector(scene)
    first = [m for s in scene.steps for m in det.on_step(s)]
    again = [m for s in scene.steps for m in det.on_step(s)]  # re-delivered
    end = ended(scene, success=False)
    first += det.on_end(end)
    again += det.on_end(end)
    assert again == []
    assert [m["failure_type"] for m in first] == ["knocked_object", "slip", "drop", "collision", "timeout"]
    assert len({m["envelope"]["event_id"] for m in first}) == len(first)
    assert det.moments == first


def test_per_type_cap_suppresses_and_counts():
    cfg = replace(CFG, max_moments_per_type=2, rearm_steps=1)
    hit = [{"a": "gripper", "b": "table", "normal_force": 30.0}]
    scene = Scene()
    for _ in range(4):
        scene.hold(1, extra_contacts=hit).hold(2, extra_contacts=[])
    det = detector(scene, cfg)
    moments = [m for s in scene.steps for m in det.on_step(s)]
    assert [m["step"] for m in moments] == [0, 3]
    assert det.suppressed == {"collision": 2}


def test_wrong_episode_and_bad_config_are_refused_with_the_value():
    det = detector()
    other = Scene(episode_id="ep-2").hold(1).steps[0]
    with pytest.raises(DetectorError, match="ep-2"):
        det.on_step(other)
    with pytest.raises(ConfigError, match="-1.0"):
        DetectorConfig(drop_fall_m=-1.0)
    with pytest.raises(ConfigError, match="held_force_n"):
        DetectorConfig(held_force_n=1.0, contact_force_n=5.0)


def test_shoulder_leaning_fully_forward_short_of_the_cube_is_out_of_reach():
    leaning = [0.03, 1.76, 0.0, -0.3, -0.03, 2.3, 0.84]  # shoulder pitch at its 1.7628 rad limit
    emitted = run(Scene().hold(4).hold(5, joints=leaning))
    assert [(t, m["failure_type"]) for t, m in emitted] == [(4 + CFG.limit_min_steps - 1, "out_of_reach")]
    assert only(emitted, "out_of_reach")[0]["features"]["joint"] == 1.0


def test_a_stretched_arm_with_the_hand_over_the_cube_is_not_out_of_reach():
    stretched = [0.03, 0.9, 0.0, -0.10, -0.03, 2.98, 0.84]
    scene = Scene()
    scene.move_to([0.0, 0.01, 0.88], 15)
    scene.hold(6, joints=stretched)
    assert [m["failure_type"] for _, m in run(scene)] == []


# -- where a moment happened ----------------------------------------------------------------------

def test_every_moment_carries_its_site_the_hand_the_target_and_the_targets_offset():
    scene = clean_lift().slip(4)
    scene.hold(3)
    emitted = run(scene, ended(scene, success=False))
    assert {"slip", "drop", "timeout"} <= set(types(emitted))
    for _, m in emitted:
        step = scene.steps[m["step"]]
        eef, cube = step["eef_pos"], step["object_poses"][0]["pos"]
        f = m["features"]
        assert [f["eef_x"], f["eef_y"], f["eef_z"]] == pytest.approx(eef)
        assert [f["object_x"], f["object_y"], f["object_z"]] == pytest.approx(cube)
        assert [f["object_dx"], f["object_dy"]] == pytest.approx([cube[0] - CUBE_START[0], cube[1] - CUBE_START[1]])
        assert f["object_lift_m"] == pytest.approx(step["object_lift"])


# -- recovery: recorded robosuite traces ------------------------------------------------------------

def outcomes_of(name: str) -> tuple[dict, list[dict], list[dict]]:
    """(trace, steps, MomentOutcomes) of a recorded trace run through the detector to its end."""
    trace, steps = recorded(name)
    det = EpisodeDetector(CFG, "rec-1", "scn-1", "model-1")
    for s in steps:
        det.on_step(s)
    det.on_end({"episode_id": "rec-1", "termination": "success" if trace["success"] else "timeout",
                "success": trace["success"], "steps": len(steps)})
    assert [o["moment_id"] for o in det.outcomes()] == [m["envelope"]["event_id"] for m in det.moments]
    return trace, steps, det.outcomes()


def unrecovered(outcomes: list[dict]) -> list[str]:
    return [o["failure_type"] for o in outcomes if o["recovered_step"] == NOT_RECOVERED]


def closes(steps: list[dict]) -> list[int]:
    """Steps at which the gripper command goes from open to closing."""
    return [s["t"] for prev, s in zip(steps, steps[1:], strict=False) if prev["action"][-1] <= 0 < s["action"][-1]]


def test_recorded_miss_then_regrasp_then_success_recovers_the_miss_and_is_not_a_flagged_success():
    trace, steps, outcomes = outcomes_of("lift_regrasp")
    assert trace["success"] is True and trace["aims_x_m"] == [0.06, 0.0]
    first_close, second_close = closes(steps)
    (miss,) = outcomes
    assert miss["failure_type"] == "grasp_miss" and miss["features"]["variant"] == MISS_CLOSED_EMPTY
    assert first_close < miss["step"] < second_close
    assert miss["recovery"] == "regrasped"
    # held again: gripped at held_force_n with the cube lifted (or pinched), held_min_steps in a row
    gripped = [s["t"] for s in steps if s["t"] > second_close and s["gripper_force"] >= CFG.held_force_n]
    assert gripped[0] < miss["recovered_step"] <= gripped[0] + CFG.grasp_settle_steps
    assert steps[miss["recovered_step"]]["gripper_force"] >= CFG.held_force_n
    assert unrecovered(outcomes) == []  # a success after a recovery


def test_recorded_miss_without_a_retry_is_never_recovered():
    trace, _, outcomes = outcomes_of("lift_miss")
    assert trace["success"] is False
    assert [(o["failure_type"], o["recovered_step"], o["recovery"]) for o in outcomes] == \
        [("grasp_miss", -1, ""), ("stall", -1, ""), ("timeout", -1, "")]


def test_recorded_retry_that_misses_again_recovers_nothing():
    trace, steps, outcomes = outcomes_of("lift_miss_twice")
    assert trace["success"] is False
    first_close, second_close = closes(steps)
    assert [o["failure_type"] for o in outcomes] == ["grasp_miss", "grasp_miss", "stall", "timeout"]
    assert first_close < outcomes[0]["step"] < second_close < outcomes[1]["step"]
    assert unrecovered(outcomes) == ["grasp_miss", "grasp_miss", "stall", "timeout"]  # trying again is not holding


def test_recorded_stall_that_resumes_is_recovered_once_the_goal_progresses():
    trace, steps, outcomes = outcomes_of("lift_stall_resume")
    assert trace["success"] is True
    (stall,) = outcomes
    assert stall["failure_type"] == "stall" and stall["recovery"] == "progressed"
    frozen_until = trace["freeze_at"] + trace["freeze_steps"]
    assert trace["freeze_at"] < stall["step"] < frozen_until < stall["recovered_step"]
    at_stall = steps[stall["step"]]["goal_distance"]
    progressed = next(s["t"] for s in steps[stall["step"] + 1:]
                      if s["goal_distance"] <= at_stall - CFG.stall_min_progress_m
                      or s["goal_distance"] <= CFG.goal_reached_m)
    assert stall["recovered_step"] == progressed


# -- recovery: hand-built ---------------------------------------------------------------------------

def outcomes_for(scene: Scene, end: dict | None = None) -> list[tuple[str, int, int, str]]:
    det = detector(scene)
    for s in scene.steps:
        det.on_step(s)
    if end is not None:
        det.on_end(end)
    return [(o["failure_type"], o["step"], o["recovered_step"], o["recovery"]) for o in det.outcomes()]


def test_a_slip_and_its_drop_are_recovered_when_the_cube_is_grasped_again():
    scene = Scene().approach(30).close_on_cube(11).lift_by(0.10, 10).hold(5).slip(5)
    scene.command = -1.0
    scene.hold(4, opening=OPEN_M)
    scene.move_to(list(scene.cube), 6)  # back down to the fallen cube
    regrasp = scene.t
    scene.close_on_cube(11).lift_by(0.10, 10).hold(5)
    got = outcomes_for(scene, ended(scene, success=True))
    assert [(ftype, how) for ftype, _, _, how in got] == [("slip", "regrasped"), ("drop", "regrasped")]
    held = regrasp + 3 + CFG.held_min_steps  # touched on the 4th closing step, held after held_min_steps
    assert {recovered for _, _, recovered, _ in got} == {held}


def test_a_stall_that_never_resumes_stays_unrecovered():
    scene = Scene()
    scene.move_to([0.0, 0.0, 0.95], 4)
    scene.hold(CFG.stall_window_steps + 30)
    assert outcomes_for(scene) == [("stall", 3 + CFG.stall_window_steps, -1, "")]


def test_out_of_reach_is_recovered_when_the_hand_gets_to_the_target():
    stretched = [0.03, 0.9, 0.0, -0.10, -0.03, 2.98, 0.84]
    scene = Scene().hold(4).hold(6, joints=stretched)
    scene.joints = [0.03, 0.9, 0.0, -2.0, -0.03, 2.98, 0.84]
    scene.move_to([0.0, 0.0, 0.95], 10)
    arrived = next(s["t"] for s in scene.steps if math.hypot(s["eef_pos"][0], s["eef_pos"][1]) < CFG.reach_gap_m)
    assert outcomes_for(scene) == [("out_of_reach", 4 + CFG.limit_min_steps - 1, arrived, "reached")]


def test_harm_is_never_recovered_even_in_a_successful_episode():
    scene = Scene().hold(3).hold(3, extra_contacts=[{"a": "gripper", "b": "table", "normal_force": 25.0}])
    scene.extra_contacts = []
    clean_lift(scene)
    assert outcomes_for(scene, ended(scene, success=True)) == [("collision", 3, -1, "")]
