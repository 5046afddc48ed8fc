"""The recorder's contract: Step batches (what leaves when, in which order, stamped with which
time), episode identity (variants, refusing a second different episode under a used id), signals
checked at step() with the field named, and an aborted episode that always ends."""

import copy
import itertools
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from producers.exceptions import EpisodeConflict, SignalError
from producers.recorder import EpisodeIdentity, EpisodeRecorder, simulator_versions, task_scenario
from producers.recording_signals import SIGNAL_FIELDS
from schemas.codec import Codec

SIGNALS = {"eef_pos": [0.1, 0.2, 0.3], "eef_quat": [0.0, 0.0, 0.0, 1.0], "gripper_opening": 0.08,
           "gripper_force": 0.0,
           "object_poses": [{"name": "cube", "pos": [0.0, 0.0, 0.82], "quat": [0.0, 0.0, 0.0, 1.0]}],
           "contacts": [{"a": "cube", "b": "table", "normal_force": 2.5}], "joint_torques": [0.0] * 7,
           "joint_pos": [0.0] * 7, "goal_distance": 0.3, "object_lift": 0.0}
SCENARIO = task_scenario("farm", "task-1", "do it", 50)
_runs = itertools.count()


class Collect:
    """A publisher that keeps what it is given (the recorder's side of Publisher)."""

    def __init__(self):
        self.events, self.codec = [], Codec()

    def publish(self, event: dict) -> None:
        self.codec.encode(event)  # every event must match its schema
        self.events.append(event)

    def types(self) -> list[str]:
        return [e["envelope"]["event_type"] for e in self.events]

    def timeless(self) -> list[dict]:
        return [dict(e, envelope={k: v for k, v in e["envelope"].items() if k != "event_time"}) for e in self.events]


def identity(run_id: str | None = None, **kwargs) -> EpisodeIdentity:
    """A fresh identity (its own run) unless ``run_id`` is given: recorders in one process remember ids."""
    return EpisodeIdentity(run_id or f"run-{next(_runs)}-{time.monotonic_ns()}", "farm", "task-1", SCENARIO, "vla",
                           "1", 3, **kwargs)


def _recorder(ident: EpisodeIdentity | None = None, sink: Collect | None = None, **kwargs):
    sink = sink or Collect()
    return EpisodeRecorder(sink, ident or identity(), **kwargs), sink


def _step(recorder: EpisodeRecorder, n: int, signals: dict = SIGNALS, action=(0.0,) * 7) -> None:
    for _ in range(n):
        recorder.step(list(action), signals, 0.5)


# -- batches --------------------------------------------------------------------------------------

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
    ident = identity()

    def run(batch_steps):
        recorder, sink = _recorder(ident, batch_steps=batch_steps)
        with recorder:
            _step(recorder, 7)
            recorder.end(True, "success")
        return sink.timeless()

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


# -- identity -------------------------------------------------------------------------------------

def test_ids_without_a_variant_stay_what_they_were_and_a_variant_makes_a_new_one():
    # pinned: computed by the recorder before variants existed
    assert identity("run-1").episode_id == "ep-f5afaaa977f5bfc2a1ef2aa3"
    assert identity("run-1", request_id="req-9").episode_id == "ep-15177ca35cf87ebd7abdc904"
    assert identity("run-1", simulator="robosuite 1.5.2").episode_id == "ep-f5afaaa977f5bfc2a1ef2aa3"
    ids = {identity("run-1", variant=v).episode_id for v in ("", "greedy", "temperature=0.7")}
    assert len(ids) == 3


def test_episode_started_records_the_variant_and_the_simulator():
    versions = simulator_versions("numpy", "fastavro")
    assert versions == f"numpy {np.__version__}, fastavro {__import__('fastavro').__version__}"
    recorder, sink = _recorder(identity(variant="greedy", simulator=versions))
    recorder.start()
    (started,) = sink.events
    assert (started["variant"], started["simulator"]) == ("greedy", versions)
    with pytest.raises(TypeError, match="variant"):
        identity(variant=None)


def _episode(ident: EpisodeIdentity, sink: Collect, gripper: float, steps: int = 6) -> None:
    recorder, _ = _recorder(ident, sink, batch_steps=2)
    with recorder:
        _step(recorder, steps, action=(0.0,) * 6 + (gripper,))
        recorder.end(False, "timeout")


def test_two_policy_variants_under_one_identity_in_one_process_are_refused_loudly():
    ident, first, second = identity(), Collect(), Collect()
    _episode(ident, first, gripper=-1.0)
    with pytest.raises(EpisodeConflict, match=rf"{ident.episode_id}.*step 0 differs.*variant"):
        _episode(ident, second, gripper=1.0)  # another policy, same scenario/model/seed/run
    # nothing of the second copy's own content went out: at most a re-sent, identical start
    assert second.timeless() == first.timeless()[:len(second.events)] and second.types() == ["EpisodeStarted"]


def test_a_conflict_found_late_publishes_nothing_more_of_the_copy():
    ident, first, second = identity(), Collect(), Collect()
    _episode(ident, first, gripper=-1.0)
    recorder, _ = _recorder(ident, second, batch_steps=2)
    with pytest.raises(EpisodeConflict, match="step 5 differs"), recorder:
        _step(recorder, 5, action=(0.0,) * 6 + (-1.0,))  # the same so far: re-sent as it was
        _step(recorder, 1, action=(0.0,) * 6 + (1.0,))
    # the start and steps 0-4, identical, went out again (a re-delivery); step 5 and the end did not
    assert second.timeless() == first.timeless()[:6] and "EpisodeEnded" not in second.types()
    with pytest.raises(EpisodeConflict, match="refused"):
        recorder.step([0.0] * 7, SIGNALS, 0.0)


def test_a_copy_that_ends_earlier_or_runs_on_is_a_conflict():
    ident = identity()
    _episode(ident, Collect(), gripper=-1.0, steps=6)
    with pytest.raises(EpisodeConflict, match="ended after 4 steps, the copy before recorded 6"):
        _episode(ident, Collect(), gripper=-1.0, steps=4)
    with pytest.raises(EpisodeConflict, match="step 6 is beyond the 6 steps recorded before"):
        _episode(ident, Collect(), gripper=-1.0, steps=7)


def test_policy_variants_with_a_variant_are_two_episodes():
    run_id, first, second = f"run-{next(_runs)}", Collect(), Collect()
    _episode(identity(run_id, variant="open"), first, gripper=-1.0)
    _episode(identity(run_id, variant="closed"), second, gripper=1.0)
    ids = {e["episode_id"] for e in first.events} | {e["episode_id"] for e in second.events}
    assert len(ids) == 2 and first.types() == second.types() == ["EpisodeStarted"] + ["Step"] * 6 + ["EpisodeEnded"]


def test_the_same_episode_recorded_again_is_accepted_and_publishes_identical_events():
    ident, first, again = identity(), Collect(), Collect()
    _episode(ident, first, gripper=-1.0)
    _episode(ident, again, gripper=-1.0)
    assert again.timeless() == first.timeless() and len(again.events) == 8


def test_a_different_start_under_a_used_id_publishes_nothing():
    ident = identity(simulator="mujoco 3.9.0")
    _episode(ident, Collect(), gripper=-1.0)
    sink = Collect()
    moved = EpisodeIdentity(ident.run_id, ident.benchmark, ident.task, ident.scenario, ident.model_id,
                            ident.model_version, ident.seed, simulator="mujoco 3.10.0")
    assert moved.episode_id == ident.episode_id
    with pytest.raises(EpisodeConflict, match="EpisodeStarted differs"):
        EpisodeRecorder(sink, moved).start()
    assert sink.events == []


# -- signals --------------------------------------------------------------------------------------

def _with(**changes) -> dict:
    signals = copy.deepcopy(SIGNALS)
    signals.update(changes)
    return signals


def _without(name: str) -> dict:
    signals = copy.deepcopy(SIGNALS)
    del signals[name]
    return signals


BAD = [
    (_without("contacts"), r"lack contacts"),
    (_with(eef_pos=[0.1, 0.2]), r"'eef_pos'\] must hold 3 numbers, got 2"),
    (_with(eef_pos="0.1 0.2 0.3"), r"'eef_pos'\] must be a list of numbers"),
    (_with(joint_pos=[0.0] * 6 + [math.nan]), r"'joint_pos'\]\[6\] must be finite"),
    (_with(joint_torques=[0.0] * 6), r"joint_pos and joint_torques must both hold 7 numbers"),
    (_with(eef_quat=[0.0, 0.0, 0.0, 0.0]), r"'eef_quat'\] must be a unit quaternion \(x, y, z, w\)"),
    (_with(gripper_opening=80.0), r"'gripper_opening'\] must be in metres"),
    (_with(gripper_force=-1.0), r"'gripper_force'\] \(N\) must be >= 0"),
    (_with(goal_distance=None), r"'goal_distance'\] \(m\) must be a number"),
    (_with(object_poses=[]), r"'object_poses'\] must be a non-empty list"),
    (_with(object_poses=[{"name": "cube", "pos": [0.0, 0.0, 0.82]}]), r"'object_poses'\]\[0\] must be a dict"),
    (_with(object_poses=[{"name": "cube", "pos": [0.0, 0.0], "quat": [0, 0, 0, 1]}]),
     r"'object_poses'\]\[0\]\['pos'\] must hold 3"),
    (_with(contacts=[{"a": "finger", "b": "cube", "normal_force": 1.0}]),
     r"'contacts'\]\[0\] must join two different groups of \['cube', 'gripper', 'robot', 'table'\]"),
    (_with(contacts=[{"a": "cube", "b": "table", "normal_force": math.inf}]),
     r"'contacts'\]\[0\]\['normal_force'\] \(N\) must be finite"),
    (_with(contacts=[{"a": "gripper", "b": "table"}]), r"'contacts'\]\[0\] must be a dict with a, b, normal_force"),
    (_with(contacts=[{"a": ["gripper"], "b": "table", "normal_force": 1.0}]), r"'contacts'\]\[0\] must join"),
    (_with(contacts=[{"a": "cube", "b": "cube", "normal_force": 1.0}]), r"'contacts'\]\[0\] must join two different"),
    (_with(eef_pos=[0.1, None, 0.3]), r"'eef_pos'\]\[1\] must be a number"),
    (_with(gripper_opening=True), r"'gripper_opening'\] \(m\) must be a number"),
    (_with(object_poses=[{"name": "cube", "pos": [0.0, 0.0, 0.82], "quat": [0.0, 0.0, 0.0, 2.0]}]),
     r"'object_poses'\]\[0\]\['quat'\] must be a unit quaternion"),
]


@pytest.mark.parametrize("signals,message", BAD)
@pytest.mark.parametrize("at", [0, 1])  # the first step sets what the next ones are checked against
def test_a_malformed_signal_is_refused_at_step_naming_the_field(signals, message, at):
    recorder, sink = _recorder()
    recorder.start()
    _step(recorder, at)
    with pytest.raises(SignalError, match=message) as refused:
        recorder.step([0.0] * 7, signals, 0.0)
    assert f"step {at}:" in str(refused.value) and recorder.identity.episode_id in str(refused.value)
    recorder.step([0.0] * 7, SIGNALS, 0.0)  # nothing of the refused step was kept
    assert recorder.end(False, "timeout")["steps"] == at + 1


def test_the_fast_check_gives_what_the_full_check_gives_on_robosuite_signals():
    trace = json.loads((Path(__file__).parents[1] / "streams" / "failures" / "data" / "lift_regrasp.json").read_text())
    signals = [{k: v for k, v in row.items() if k in SIGNAL_FIELDS} for row in trace["steps"]]
    recorder, _ = _recorder()
    recorder.start()
    recorder.step([0.0] * 7, signals[0], 0.0)
    assert len(signals) > 100
    for s in signals[1:]:
        assert recorder._fast(s, recorder._shape) == recorder._clean(s) == s


@pytest.mark.parametrize("second,message", [
    (_with(object_poses=[{"name": "box", "pos": [0.0, 0.0, 0.82], "quat": [0, 0, 0, 1]}]),
     r"must name \('cube',\) in that order \(the target first\)"),
    (_with(object_lift=0.05), r"object_lift'\] must follow the target's height.*is the target the first object pose"),
    (_with(joint_pos=[0.0] * 6, joint_torques=[0.0] * 6), r"must both hold 7 numbers at every step"),
])
def test_what_the_first_step_fixes_holds_for_the_whole_episode(second, message):
    recorder, _ = _recorder()
    recorder.start()
    recorder.step([0.0] * 7, SIGNALS, 0.0)
    with pytest.raises(SignalError, match=message):
        recorder.step([0.0] * 7, second, 0.0)


def test_a_bad_action_or_reward_is_refused_naming_it():
    recorder, _ = _recorder()
    recorder.start()
    with pytest.raises(SignalError, match=r"step 0: action\[2\] must be finite"):
        recorder.step([0.0, 0.0, math.nan], SIGNALS, 0.0)
    with pytest.raises(SignalError, match=r"step 0: action must hold at least 1"):
        recorder.step([], SIGNALS, 0.0)
    with pytest.raises(SignalError, match=r"step 0: reward must be finite"):
        recorder.step([0.0], SIGNALS, math.inf)


def test_a_step_missing_contacts_ends_the_episode_at_once_aborted_with_the_field_named():
    recorder, sink = _recorder(batch_steps=10)
    with pytest.raises(SignalError, match="lack contacts"), recorder:
        _step(recorder, 3)
        recorder.step([0.0] * 7, _without("contacts"), 0.0)
    assert sink.types() == ["EpisodeStarted"] + ["Step"] * 3 + ["EpisodeEnded"]
    end = sink.events[-1]
    assert (end["termination"], end["steps"], end["success"]) == ("aborted", 3, False)
    assert "SignalError" in end["error"] and "lack contacts" in end["error"]


class FailingPublisher(Collect):
    """Refuses Step events from the ``after``-th one on, as a broken encoder or client would."""

    def __init__(self, after: int):
        super().__init__()
        self.after, self.steps = after, 0

    def publish(self, event: dict) -> None:
        if event["envelope"]["event_type"] == "Step":
            self.steps += 1
            if self.steps > self.after:
                raise RuntimeError("broker gone")
        super().publish(event)


@pytest.mark.parametrize("where", ["in step", "in end"])
def test_an_episode_whose_step_batch_cannot_be_sent_still_ends_aborted_with_the_error(where):
    sink = FailingPublisher(after=2)
    recorder, _ = _recorder(sink=sink, batch_steps=4 if where == "in step" else 100)
    with pytest.raises(RuntimeError, match="broker gone"), recorder:
        _step(recorder, 6)
        recorder.end(True, "success")
    end = sink.events[-1]
    assert sink.types()[0] == "EpisodeStarted" and sink.types()[-1] == "EpisodeEnded"
    assert (end["termination"], end["success"], end["steps"]) == ("aborted", False, 4 if where == "in step" else 6)
    assert "broker gone" in end["error"]


def test_arrays_and_tuples_are_taken_and_what_was_recorded_does_not_change_afterwards():
    as_lists, as_arrays = _recorder(), _recorder()
    signals = copy.deepcopy(SIGNALS)
    arrays = dict(signals, eef_pos=np.array(signals["eef_pos"]), joint_pos=np.zeros(7, dtype=np.float32),
                  joint_torques=tuple(signals["joint_torques"]), gripper_force=np.float32(0.0))
    for (recorder, _), given in ((as_lists, signals), (as_arrays, arrays)):
        recorder.start()
        recorder.step(np.zeros(7), given, np.float64(0.5))
        recorder.end(False, "timeout")
    signals["eef_pos"][0] = 9.0  # the caller reuses its buffers
    signals["object_poses"][0]["pos"][2] = 9.0
    steps = [[e for e in sink.events if e["envelope"]["event_type"] == "Step"][0] for _, sink in (as_lists, as_arrays)]
    assert steps[0]["eef_pos"] == steps[1]["eef_pos"] == [0.1, 0.2, 0.3]
    assert steps[0]["object_poses"][0]["pos"] == [0.0, 0.0, 0.82]
    assert {k: v for k, v in steps[0].items() if k not in ("envelope", "episode_id")} == \
        {k: v for k, v in steps[1].items() if k not in ("envelope", "episode_id")}


# -- camera frames -------------------------------------------------------------------------------

def test_camera_frames_are_stored_by_hash_and_the_step_names_them(tmp_path):
    from producers.keyframes import KeyframeStore

    store = KeyframeStore(tmp_path)
    recorder, sink = _recorder(keyframes=store)
    recorder.start()
    rng = np.random.default_rng(0)
    seen = [{"agentview": rng.integers(0, 255, (16, 16, 3), dtype=np.uint8),
             "wrist": rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)} for _ in range(3)]
    for frames in seen:
        recorder.step([0.0] * 7, SIGNALS, 0.5, frames=frames)
    recorder.end(False, "timeout")
    steps = [e for e in sink.events if e["envelope"]["event_type"] == "Step"]
    assert [sorted(s["frames"]) for s in steps] == [["agentview", "wrist"]] * 3
    for step, frames in zip(steps, seen, strict=True):
        for camera, image in frames.items():
            assert np.array_equal(store.get(step["frames"][camera]), image)


def test_steps_without_cameras_carry_no_frames_and_frames_need_a_store():
    recorder, sink = _recorder()
    recorder.start()
    _step(recorder, 2)
    with pytest.raises(ValueError, match="keyframe store"):
        recorder.step([0.0] * 7, SIGNALS, 0.5, frames={"agentview": np.zeros((16, 16, 3), np.uint8)})
    recorder.end(False, "timeout")
    assert [e["frames"] for e in sink.events if e["envelope"]["event_type"] == "Step"] == [{}, {}]
