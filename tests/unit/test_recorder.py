"""The recorder's Step batches: what leaves when, in which order, stamped with which time."""

import time

import pytest

from producers.recorder import EpisodeIdentity, EpisodeRecorder, task_scenario
from schemas.codec import Codec

SIGNALS = {"eef_pos": [0.1, 0.2, 0.3], "eef_quat": [0.0, 0.0, 0.0, 1.0], "gripper_opening": 0.08,
           "gripper_force": 0.0,
           "object_poses": [{"name": "cube", "pos": [0.0, 0.0, 0.82], "quat": [0.0, 0.0, 0.0, 1.0]}],
           "contacts": [{"a": "cube", "b": "table", "normal_force": 2.5}], "joint_torques": [0.0] * 7,
           "joint_pos": [0.0] * 7, "goal_distance": 0.3, "object_lift": 0.0}


class Collect:
    """A publisher that keeps what it is given (the recorder's side of Publisher)."""

    def __init__(self):
        self.events, self.codec = [], Codec()

    def publish(self, event: dict) -> None:
        self.codec.encode(event)  # every event must match its schema
        self.events.append(event)

    def types(self) -> list[str]:
        return [e["envelope"]["event_type"] for e in self.events]


def _recorder(**kwargs) -> tuple[EpisodeRecorder, Collect]:
    identity = EpisodeIdentity("run-1", "farm", "task-1", task_scenario("farm", "task-1", "do it", 50), "vla", "1", 3)
    sink = Collect()
    return EpisodeRecorder(sink, identity, **kwargs), sink


def _step(recorder: EpisodeRecorder, n: int) -> None:
    for _ in range(n):
        recorder.step([0.0] * 7, SIGNALS, 0.5)


def test_steps_leave_in_batches_and_end_sends_the_rest_before_episode_ended():
    recorder, sink = _recorder(batch_steps=3, batch_ms=60_000)
    recorder.start()
    _step(recorder, 2)
    assert sink.types() == ["EpisodeStarted"]
    _step(recorder, 1)
    assert sink.types() == ["EpisodeStarted"] + ["Step"] * 3
    _step(recorder, 2)
    recorder.end(False, "timeout")
    assert sink.types() == ["EpisodeStarted"] + ["Step"] * 5 + ["EpisodeEnded"]
    assert [e["t"] for e in sink.events[1:6]] == [0, 1, 2, 3, 4]
    assert sink.events[-1]["steps"] == 5


def test_a_batch_leaves_once_its_oldest_step_is_batch_ms_old():
    recorder, sink = _recorder(batch_steps=1000, batch_ms=30)
    recorder.start()
    _step(recorder, 1)
    assert sink.types() == ["EpisodeStarted"]
    time.sleep(0.05)
    _step(recorder, 1)
    assert sink.types() == ["EpisodeStarted", "Step", "Step"]


def test_a_step_that_comes_batch_ms_after_the_one_before_leaves_at_once():
    recorder, sink = _recorder(batch_steps=1000, batch_ms=30)
    recorder.start()
    time.sleep(0.05)  # a slow policy: nothing to gain by keeping its steps
    _step(recorder, 1)
    assert sink.types() == ["EpisodeStarted", "Step"]
    _step(recorder, 1)  # a fast one is kept again
    assert sink.types() == ["EpisodeStarted", "Step"]


def test_a_step_is_stamped_when_it_is_recorded_not_when_it_leaves():
    recorder, sink = _recorder(batch_steps=2, batch_ms=60_000)
    recorder.start()
    _step(recorder, 1)
    time.sleep(0.05)
    _step(recorder, 1)
    first, second = sink.events[1]["envelope"]["event_time"], sink.events[2]["envelope"]["event_time"]
    assert (second - first).total_seconds() >= 0.05


def test_batching_changes_nothing_but_when_events_leave():
    def run(batch_steps):
        recorder, sink = _recorder(batch_steps=batch_steps)
        with recorder:
            _step(recorder, 7)
            recorder.end(True, "success")
        for event in sink.events:
            event["envelope"].pop("event_time")
        return sink.events

    assert run(1) == run(4) == run(10)


def test_an_exception_inside_the_episode_sends_the_kept_steps_and_an_aborted_end():
    recorder, sink = _recorder(batch_steps=10)
    with pytest.raises(RuntimeError), recorder:
        _step(recorder, 4)
        raise RuntimeError("simulator died")
    assert sink.types() == ["EpisodeStarted"] + ["Step"] * 4 + ["EpisodeEnded"]
    assert sink.events[-1]["termination"] == "aborted"
    assert "simulator died" in sink.events[-1]["error"]


@pytest.mark.parametrize("kwargs", [{"batch_steps": 0}, {"batch_ms": -1.0}])
def test_bad_batch_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match="batch_steps must be >= 1"):
        _recorder(**kwargs)
