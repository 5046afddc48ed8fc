"""The failure machines alone, on hand-made StepSummary values (no Step events, no detector):
each emits its moment at the step its evidence completes, and the Episode marks its recovery."""

from __future__ import annotations

import pytest

from streams.failures.detector import DetectorConfig
from streams.failures.episode import NOT_RECOVERED, Episode, StepSummary, summarize
from streams.failures.failure_types import HELD, Grasp, Knocks, Limits, Stall, WrongObject

CFG = DetectorConfig()
CUBE = {"name": "cube", "pos": [0.0, 0.0, 0.83], "quat": [0.0, 0.0, 0.0, 1.0]}
REACHING = [0.0, 1.70, 0.0, -2.0, 0.0, 2.0, 0.0]  # shoulder pitch 0.063 rad from stretched
RELAXED = [0.0, 0.9, 0.0, -2.0, 0.0, 2.0, 0.0]


def feed(machine, ep: Episode, summaries: list[StepSummary]) -> None:
    for s in summaries:
        ep.begin(s)
        machine.on_step(s, ep)


def outcomes(ep: Episode) -> list[tuple]:
    return [(o["failure_type"], o["step"], o["recovered_step"], o["recovery"]) for o in ep.outcomes()]


def test_grasp_slip_is_recovered_by_the_next_hold():
    ep, grasp = Episode(CFG, "ep-1", "scn-1", "model-1"), Grasp(CFG)

    def s(t, closing, force=0.0, lift=0.0, opening=0.04):
        return StepSummary(t=t, closing=closing, force=force, lift=lift, opening=opening, poses=(CUBE,),
                           target="cube", target_pos=CUBE["pos"])

    feed(grasp, ep, [s(0, False, opening=0.078), s(1, True, opening=0.07), s(2, True, 40.0),
                     s(3, True, 40.0, 0.01), s(4, True, 40.0, 0.02)])
    assert grasp.phase == HELD and grasp.target_grasped and ep.moments == []
    feed(grasp, ep, [s(5, True, 0.0, 0.02)])  # touch lost while closing: a slip at the held lift
    (slip,) = ep.moments
    assert (slip["failure_type"], slip["step"]) == ("slip", 5)
    assert slip["severity"] == pytest.approx(0.02 / CFG.slip_severity_lift_m)
    assert slip["features"]["lift_at_slip_m"] == 0.02
    assert outcomes(ep) == [("slip", 5, NOT_RECOVERED, "")]
    feed(grasp, ep, [s(6, False, opening=0.078), s(7, True, opening=0.07), s(8, True, 40.0),
                     s(9, True, 40.0, 0.01)])
    assert outcomes(ep) == [("slip", 5, NOT_RECOVERED, "")]
    feed(grasp, ep, [s(10, True, 40.0, 0.02)])
    assert outcomes(ep) == [("slip", 5, 10, "regrasped")]


def test_grasp_closed_empty_is_a_miss_and_the_end_adds_nothing():
    ep, grasp = Episode(CFG, "ep-1", "scn-1", "model-1"), Grasp(CFG)
    feed(grasp, ep, [StepSummary(t=0, opening=0.078), StepSummary(t=1, closing=True, opening=0.04),
                     StepSummary(t=2, closing=True, opening=0.001, hand_target_xy=0.025)])
    (miss,) = ep.moments
    assert (miss["failure_type"], miss["step"], miss["features"]["variant"]) == ("grasp_miss", 2, 0.0)
    assert miss["severity"] == pytest.approx(0.025 / CFG.miss_severity_distance_m)
    grasp.on_end(2, ep)
    assert len(ep.moments) == 1


def test_stall_fires_once_over_a_still_window_and_recovers_on_progress():
    cfg = DetectorConfig(stall_window_steps=3)
    ep, stall = Episode(cfg, "ep-1", "scn-1", "model-1"), Stall(cfg)
    still = [StepSummary(t=t, goal=0.03, eef=(0.1, 0.0, 1.0)) for t in range(6)]
    feed(stall, ep, still)
    assert outcomes(ep) == [("stall", 3, NOT_RECOVERED, "")]  # first full window; then active, not re-fired
    assert ep.moments[0]["severity"] == 1.0  # no closer than at the start
    assert ep.moments[0]["features"]["start_goal_distance_m"] == 0.03
    feed(stall, ep, [StepSummary(t=6, goal=0.028, eef=(0.1, 0.0, 1.0))])  # 2 mm: not progress yet
    assert outcomes(ep) == [("stall", 3, NOT_RECOVERED, "")]
    feed(stall, ep, [StepSummary(t=7, goal=0.02, eef=(0.1, 0.0, 1.0))])
    assert outcomes(ep) == [("stall", 3, 7, "progressed")]


def test_out_of_reach_after_limit_min_steps_recovered_when_the_hand_reaches():
    ep, limits = Episode(CFG, "ep-1", "scn-1", "model-1"), Limits(CFG)

    def s(t, joints, xy):
        return StepSummary(t=t, goal=0.04, joint_pos=joints, hand_target_xy=xy, poses=(CUBE,), target="cube",
                           target_pos=CUBE["pos"])

    feed(limits, ep, [s(0, RELAXED, 0.1), s(1, REACHING, 0.1), s(2, REACHING, 0.1)])
    assert ep.moments == []
    feed(limits, ep, [s(3, REACHING, 0.1)])
    (m,) = ep.moments
    assert (m["failure_type"], m["step"], m["features"]["joint"]) == ("out_of_reach", 3, 1.0)
    assert m["features"]["hand_to_target_m"] == 0.1
    feed(limits, ep, [s(4, RELAXED, 0.01)])
    assert outcomes(ep) == [("out_of_reach", 3, 4, "reached")]


def test_a_wrong_grasped_object_is_not_also_knocked():
    ep = Episode(CFG, "ep-1", "scn-1", "model-1")
    grasp, wrong = Grasp(CFG), WrongObject(CFG)
    knocks = Knocks(CFG, grasp, wrong)
    other = {"name": "distractor0", "pos": [0.1, 0.1, 0.83], "quat": [0.0, 0.0, 0.0, 1.0]}
    moved = {**other, "pos": [0.2, 0.1, 0.83]}
    for t in range(3):
        s = StepSummary(t=t, closing=True, poses=(CUBE, other), target="cube", other_grip={"distractor0": 20.0})
        ep.begin(s)
        wrong.on_step(s, ep)
        knocks.on_step(s, ep)
    s = StepSummary(t=3, poses=(CUBE, moved), target="cube")
    ep.begin(s)
    wrong.on_step(s, ep)
    knocks.on_step(s, ep)
    assert outcomes(ep) == [("wrong_object", 2, NOT_RECOVERED, "")]
    assert ep.moments[0]["features"]["object_index"] == 1.0


def test_summarize_carries_the_hand_to_target_distance_over_a_step_without_poses():
    step = {"t": 0, "goal_distance": 0.04, "object_lift": 0.0, "gripper_force": 0.0, "gripper_opening": 0.078,
            "action": [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], "eef_pos": [0.03, 0.04, 0.93], "object_poses": [CUBE],
            "joint_pos": RELAXED, "joint_torques": [0.0] * 7,
            "contacts": [{"a": "gripper", "b": "table", "normal_force": 12.0},
                         {"a": "distractor0", "b": "gripper", "normal_force": 3.0}]}
    first = summarize(step, CFG)
    assert first.closing and first.target == "cube"
    assert first.hand_target_xy == pytest.approx(0.05) and first.hand_target_z == pytest.approx(0.10)
    assert first.other_grip == {"distractor0": 3.0} and first.other_press == 3.0
    assert (first.collide_force, first.collide_table, first.collide_object) == (12.0, True, False)
    assert first.max_robot_contact == first.world_contact == 12.0
    blind = summarize({**step, "t": 1, "object_poses": [], "eef_pos": [0.5, 0.5, 0.5]}, CFG, first)
    assert blind.target is None and blind.target_pos is None
    assert (blind.hand_target_xy, blind.hand_target_z) == (first.hand_target_xy, first.hand_target_z)
