"""Policy faults and the labelled failure set: the faults do what they say, labels are the cause's,
and a saved set reads back as the same events."""

from __future__ import annotations

import numpy as np
import pytest

from producers.sim import failure_set
from producers.sim.faults import FreezeAt, PerceptionOffset, ReleaseWhenLifted
from streams.failures.detector import DetectorConfig, EpisodeDetector


class _Constant:
    name = "constant"

    def __init__(self, action):
        self.action = np.asarray(action, dtype=float)
        self.seen = []

    def reset(self, seed, spec):
        self.seen.clear()

    def act(self, obs, signals):
        self.seen.append(signals)
        return self.action.copy()


def _signals(lift=0.0):
    return {"eef_pos": [0.0, 0.0, 1.0], "object_lift": lift,
            "object_poses": [{"name": "cube", "pos": [0.1, 0.2, 0.83], "quat": [0, 0, 0, 1]},
                             {"name": "distractor0", "pos": [0.3, 0.3, 0.83], "quat": [0, 0, 0, 1]}]}


def test_perception_offset_moves_only_the_target_in_what_the_policy_sees(lift_spec):
    inner = _Constant([0.1] * 7)
    policy = PerceptionOffset(inner, (0.05, -0.02, 0.0))
    policy.reset(0, lift_spec)
    signals = _signals()
    policy.act({}, signals)
    seen = inner.seen[0]["object_poses"]
    assert seen[0]["pos"] == pytest.approx([0.15, 0.18, 0.83])
    assert seen[1]["pos"] == [0.3, 0.3, 0.83]
    assert signals["object_poses"][0]["pos"] == [0.1, 0.2, 0.83]  # the caller's signals are untouched
    assert policy.injected_at == 0


def test_freeze_holds_still_with_the_gripper_as_it_was(lift_spec):
    policy = FreezeAt(_Constant([0.5, 0.5, 0.5, 0.1, 0.1, 0.1, 1.0]), step=2)
    policy.reset(0, lift_spec)
    actions = [policy.act({}, _signals()) for _ in range(4)]
    assert actions[1][0] == 0.5 and policy.injected_at == 2
    assert actions[2].tolist() == actions[3].tolist() == [0.0] * 6 + [1.0]


def test_release_opens_for_good_once_lifted(lift_spec):
    policy = ReleaseWhenLifted(_Constant([0.2] * 6 + [1.0]), lift_m=0.05)
    policy.reset(0, lift_spec)
    assert policy.act({}, _signals(lift=0.01))[-1] == 1.0
    assert policy.act({}, _signals(lift=0.06))[-1] == -1.0
    assert policy.act({}, _signals(lift=0.0))[-1] == -1.0  # stays open
    assert policy.injected_at == 1


@pytest.fixture(scope="module")
def labelled():
    envs = {}
    try:
        yield [failure_set.run_case(failure_set.BY_NAME[name], 0, envs) for name in ("timeout", "grasp_miss")]
    finally:
        for env in envs.values():
            env.close()


def _detect(events):
    steps = [e for e in events if e["envelope"]["event_type"] == "Step"]
    end = next(e for e in events if e["envelope"]["event_type"] == "EpisodeEnded")
    det = EpisodeDetector(DetectorConfig(), end["episode_id"], end["scenario_id"], end["model_id"])
    return [m for s in steps for m in det.on_step(s)] + det.on_end(end)


def test_a_short_horizon_is_labelled_a_timeout_at_its_last_step(labelled):
    label, events = labelled[0]
    assert (label.expected, label.termination, label.success) == ("timeout", "timeout", False)
    assert label.cause_step == label.steps - 1
    assert [(m["failure_type"], m["step"]) for m in _detect(events)] == [("timeout", label.cause_step)]


def test_a_wrong_belief_of_where_the_cube_is_is_a_grasp_miss_near_its_cause(labelled):
    label, events = labelled[1]
    assert label.expected == "grasp_miss" and not label.success and label.cause_step is not None
    moments = _detect(events)
    miss = [m["step"] for m in moments if m["failure_type"] == "grasp_miss"]
    assert miss and abs(miss[0] - label.cause_step) <= 5
    assert {m["failure_type"] for m in moments} <= {"grasp_miss", *label.after}


def test_a_saved_set_loads_back_as_the_same_labels_and_events(labelled, tmp_path):
    failure_set.save(tmp_path, labelled)
    labels, events = failure_set.load(tmp_path)
    assert labels == [label for label, _ in labelled]
    steps = [e for _, evs in labelled for e in evs if e["envelope"]["event_type"] == "Step"]
    assert len(events["Step"]) == len(steps)
    assert events["Step"][5]["eef_pos"] == pytest.approx(steps[5]["eef_pos"], rel=1e-6)  # Avro float: 32 bits
    assert events["Step"][5]["envelope"] == steps[5]["envelope"]


def test_loading_a_directory_without_a_set_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="labels.jsonl"):
        failure_set.load(tmp_path)


def test_every_case_of_the_labelled_set_is_detected_as_its_cause_on_one_seed():
    """The whole set on seed 0, scored like bench/failure_mining.py: the expected type near its
    cause step, and nothing that is neither expected nor a consequence after the cause."""
    results = failure_set.generate(failure_set.CASES, 1, processes=2)
    assert {label.case for label, _ in results} == set(failure_set.BY_NAME)
    wrong = []
    for label, events in results:
        if label.expected is None and not label.success:
            continue  # an unlabelled baseline failure
        first = {}
        for m in sorted(_detect(events), key=lambda m: m["step"]):
            first.setdefault(m["failure_type"], m["step"])
        if label.expected is not None:
            step = first.pop(label.expected, None)
            if step is None or abs(step - label.cause_step) > 5:
                wrong.append((label.case, label.seed, "expected at", label.cause_step, "got", step))
        extra = {t: s for t, s in first.items() if t not in label.after or s < (label.cause_step or 0)}
        if extra:
            wrong.append((label.case, label.seed, "unexpected", extra))
    assert wrong == []
