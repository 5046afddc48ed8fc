"""The detector agent's pure core, fed Confluent-framed bytes as the broker would deliver them:
routing to per-episode detectors, dead letters, out-of-order arrival. No broker. (The clusterer's
core: test_cluster_stage.py.)"""

from __future__ import annotations

import copy
import math
import random

import pytest
from failure_traces import Scene, ended

from producers.synthetic import episodes as synthetic_episodes
from producers.synthetic import interleaved
from producers.synthetic import scenario as synthetic_scenario
from schemas.codec import Codec
from schemas.events import make_event, stable_id
from streams.deadletter import RawMessage
from streams.failures.detector import DETECTOR_VERSION, DetectorConfig, EpisodeDetector
from streams.failures.router import DetectorStage, RouterConfig, empty_scenario

PREFIX = "t."
CODEC = Codec()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def started(scene: Scene, scenario: dict | None = None) -> dict:
    spec = scenario or synthetic_scenario(0)
    return make_event("EpisodeStarted", (scene.episode_id,), "test", scene.run_id, episode_id=scene.episode_id,
                      request_id=None, benchmark="robosuite", task="Lift", scenario_id="scn-1", scenario=spec,
                      instruction="lift", model_id="model-1", model_version="1", seed=1)


class Wire:
    """Frames events into RawMessages with increasing offsets per topic."""

    def __init__(self):
        self.offsets: dict[str, int] = {}

    def raw(self, topic: str, key: str, value: bytes) -> RawMessage:
        offset = self.offsets.get(topic, 0)
        self.offsets[topic] = offset + 1
        return RawMessage(PREFIX + topic, 0, offset, key.encode(), value)

    def event(self, event: dict) -> RawMessage:
        et = event["envelope"]["event_type"]
        topic = {"Step": "rollout.steps", "EpisodeStarted": "rollout.episodes", "EpisodeEnded": "rollout.episodes",
                 "FailureMoment": "failures.moments"}[et]
        return self.raw(topic, event["episode_id"], CODEC.encode(event))


def detector_stage(clock=None, **router) -> DetectorStage:
    return DetectorStage(DetectorConfig(), RouterConfig(**router), PREFIX, "run-s", clock=clock or Clock())


def decoded(outgoing) -> list[tuple[str, bytes, dict]]:
    return [(o.topic, o.key, CODEC.decode(o.value)) for o in outgoing]


def on(topic: str, outgoing) -> list[dict]:
    """The decoded events of ``outgoing`` sent to ``topic``."""
    return [e for t, _, e in decoded(outgoing) if t == topic]


def moment_types(outgoing) -> list[str]:
    return [e["failure_type"] for e in on("failures.moments", outgoing)]


def slip_scene(episode_id="ep-1") -> Scene:
    return Scene(episode_id=episode_id).approach(30).close_on_cube(11).lift_by(0.10, 10).hold(5).slip(5).hold(3)


# -- detector stage --------------------------------------------------------------------------------

def test_moments_are_published_keyed_by_episode_as_soon_as_their_step_arrives():
    scene = slip_scene()
    wire, stage = Wire(), detector_stage()
    out = stage.process([wire.event(started(scene))])
    per_step = []
    for step in scene.steps:
        per_step.append(decoded(stage.process([wire.event(step)])))
    out += stage.process([wire.event(ended(scene, success=False))])
    slip_step = next(i for i, o in enumerate(per_step) if o)
    assert [(t, k, e["failure_type"]) for t, k, e in per_step[slip_step]] == [("failures.moments", b"ep-1", "slip")]
    assert [(t, k, e["envelope"]["event_type"]) for t, k, e in decoded(out)] == [
        ("failures.moments", b"ep-1", "FailureMoment"), ("failures.episodes", b"ep-1", "EpisodeAnalysed")]
    assert moment_types(out) == ["timeout"]
    assert stage.episodes == {} and stage.stats["finished"] == 1


def test_undecodable_and_non_finite_messages_are_dead_lettered_and_the_episode_goes_on():
    scene = slip_scene()
    wire, stage = Wire(), detector_stage()
    garbage = wire.raw("rollout.steps", "ep-1", b"\x00\x00\x00\x00\x07not avro")
    nan_top = copy.deepcopy(scene.steps[3])
    nan_top["gripper_force"] = math.nan
    nan_nested = copy.deepcopy(scene.steps[4])
    nan_nested["object_poses"][0]["pos"][2] = math.inf
    wrong_topic = wire.raw("rollout.steps", "ep-1", CODEC.encode(started(scene)))
    messages = [wire.event(started(scene))] + [wire.event(s) for s in scene.steps[:3]]
    messages += [garbage, wire.event(nan_top), wire.event(nan_nested), wrong_topic]
    messages += [wire.event(s) for s in scene.steps[5:]] + [wire.event(ended(scene, success=False))]
    out = decoded(stage.process(messages))
    dead = [e for topic, _, e in out if topic == "deadletter"]
    assert len(dead) == 4
    assert all(d["consumer"] == "failure-detector" and d["source_topic"] == "t.rollout.steps" for d in dead)
    assert dead[0]["original"] == garbage.value and dead[0]["source_offset"] == garbage.offset
    assert dead[0]["source_key"] == b"ep-1"
    assert "gripper_force" in dead[1]["reason"]
    assert "object_poses[0].pos[2]" in dead[2]["reason"]
    assert "does not belong" in dead[3]["reason"]
    moments = [e["failure_type"] for topic, _, e in out if topic == "failures.moments"]
    assert moments == ["slip", "drop", "timeout"]  # steps 3 and 4 were lost, the rest analysed


def test_steps_before_their_start_are_buffered_and_an_early_end_waits_for_the_last_steps():
    scene = slip_scene()
    in_order = detector_stage()
    wire = Wire()
    expected = decoded(in_order.process([wire.event(started(scene))] + [wire.event(s) for s in scene.steps]
                                        + [wire.event(ended(scene, success=False))]))
    clock = Clock()
    stage = detector_stage(clock)
    wire = Wire()
    half = len(scene.steps) // 2
    out = stage.process([wire.event(s) for s in scene.steps[:half]])  # the start is late
    assert out == []
    out += stage.process([wire.event(started(scene)), wire.event(ended(scene, success=False))])  # end is early
    out += stage.process([wire.event(s) for s in scene.steps[half:]])
    assert [(k, e["envelope"]["event_id"]) for _, k, e in decoded(out)] == \
        [(k, e["envelope"]["event_id"]) for _, k, e in expected]


def test_an_end_whose_last_steps_never_come_is_finished_after_the_grace_period():
    scene = slip_scene()
    clock = Clock()
    stage = detector_stage(clock, end_grace_s=10.0)
    wire = Wire()
    stage.process([wire.event(started(scene))] + [wire.event(s) for s in scene.steps[:-5]])
    assert stage.process([wire.event(ended(scene, success=False))]) == []
    clock.now += 9.0
    assert stage.tick() == []
    clock.now += 2.0
    out = stage.tick()
    assert moment_types(out) == ["timeout"]
    assert stage.stats["ended_with_missing_steps"] == 1
    (analysed,) = on("failures.episodes", out)
    assert analysed["analysed"] is True
    assert analysed["reason"] == (f"steps missing: {len(scene.steps) - 5} of {len(scene.steps)} arrived "
                                  f"(last t={len(scene.steps) - 6}) within the end grace of 10 s")
    assert [m["failure_type"] for m in analysed["moments"]] == ["slip", "drop", "timeout"]


def test_a_tail_of_an_episode_decided_before_is_ignored_and_redelivery_adds_nothing():
    scene = slip_scene()
    wire, stage = Wire(), detector_stage()
    out = stage.process([wire.event(s) for s in scene.steps[20:]] + [wire.event(ended(scene, success=False))])
    assert out == [] and stage.stats["replayed_tail"] == 1 and stage.episodes == {}
    assert stage.stats["after_finish"] == len(scene.steps) - 20  # the rest of the tail and its end
    assert "joined_late" not in stage.stats and "not_analysed" not in stage.stats
    full = Scene(episode_id="ep-2").approach(30).close_on_cube(11).lift_by(0.10, 10).hold(5).slip(5)
    msgs = [wire.event(started(full))] + [wire.event(s) for s in full.steps] + \
        [wire.event(ended(full, success=False))]
    first = stage.process(msgs)
    assert moment_types(first) == ["slip", "drop", "timeout"] and len(on("failures.episodes", first)) == 1
    after = stage.stats["after_finish"]
    assert stage.process(msgs) == []  # at-least-once re-delivery of the whole episode
    assert stage.stats["after_finish"] == after + len(msgs)


def test_idle_episodes_without_an_end_are_dropped():
    clock = Clock()
    stage = detector_stage(clock, idle_timeout_s=60.0)
    wire = Wire()
    stage.process([wire.event(s) for s in Scene().hold(3).steps])
    clock.now += 61.0
    assert stage.tick() == [] and stage.episodes == {} and stage.stats["idle_dropped"] == 1


def test_idle_and_evicted_episodes_release_their_messages_and_stay_decided():
    clock = Clock()
    stage = detector_stage(clock, idle_timeout_s=60.0, max_open_episodes=2)
    wire = Wire()
    a, b, c = (Scene(episode_id=f"ep-{i}").hold(3) for i in range(3))
    stage.process([wire.event(started(a)), wire.event(a.steps[0]), wire.event(started(b)), wire.event(b.steps[0])])
    assert stage.releasable() == {("t.rollout.episodes", 0): 0, ("t.rollout.steps", 0): 0}
    stage.process([wire.event(started(c))])  # a third open episode: the least recently active goes
    assert stage.stats["evicted"] == 1 and list(stage.episodes) == ["ep-1", "ep-2"]
    assert stage.releasable() == {("t.rollout.episodes", 0): 1, ("t.rollout.steps", 0): 1}
    stage.process([wire.event(a.steps[1])])  # the evicted episode's later steps are not analysed
    assert stage.stats["after_finish"] == 1 and "replayed_tail" not in stage.stats
    clock.now += 61.0
    assert stage.tick() == [] and stage.episodes == {} and stage.stats["idle_dropped"] == 2
    assert stage.releasable() == {("t.rollout.episodes", 0): 3, ("t.rollout.steps", 0): 3}


# -- acknowledgement: what a restart re-reads ---------------------------------------------------------

STEPS_TP, EPISODES_TP = ("t.rollout.steps", 0), ("t.rollout.episodes", 0)


def test_messages_are_releasable_once_their_episode_and_every_earlier_one_is_decided():
    wire, stage = Wire(), detector_stage()
    a, b = slip_scene("ep-a"), slip_scene("ep-b")
    stage.process([wire.event(started(a)), wire.event(a.steps[0]), wire.event(started(b))])
    stage.process([wire.event(s) for s in b.steps] + [wire.event(ended(b, success=False))])  # b is done
    assert stage.stats["finished"] == 1
    assert stage.releasable() == {EPISODES_TP: 0, STEPS_TP: 0}  # a, still open, began everything
    stage.process([wire.event(s) for s in a.steps[1:]] + [wire.event(ended(a, success=False))])
    assert stage.releasable() == {EPISODES_TP: 4, STEPS_TP: 2 * len(a.steps)}
    garbage = wire.raw("rollout.steps", "ep-x", b"junk")  # dead letters hold nothing back
    stage.process([garbage])
    assert stage.releasable()[STEPS_TP] == garbage.offset + 1


def test_an_episodes_start_and_end_wait_until_every_step_of_it_is_releasable():
    wire, stage = Wire(), detector_stage()
    a, b = slip_scene("ep-a"), slip_scene("ep-b")
    # b's steps begin before a's, but its start is published after a's end: b holds the steps
    stage.process([wire.event(b.steps[0]), wire.event(started(a))] + [wire.event(s) for s in a.steps]
                  + [wire.event(ended(a, success=False))])
    assert stage.stats["finished"] == 1 and list(stage.episodes) == ["ep-b"]
    assert stage.releasable() == {STEPS_TP: 0, EPISODES_TP: 0}  # a's start waits for a's steps
    stage.process([wire.event(started(b))] + [wire.event(s) for s in b.steps[1:]]
                  + [wire.event(ended(b, success=False))])
    assert stage.releasable() == {STEPS_TP: 2 * len(a.steps), EPISODES_TP: 4}


def test_an_end_whose_steps_were_all_committed_before_is_ignored_after_the_grace():
    clock = Clock()
    stage = detector_stage(clock, end_grace_s=10.0)
    wire = Wire()
    scene = slip_scene()
    assert stage.process([wire.event(started(scene)), wire.event(ended(scene, success=False))]) == []
    clock.now += 11.0
    assert stage.tick() == [] and stage.stats["replayed_without_steps"] == 1
    assert "ended_with_missing_steps" not in stage.stats and stage.releasable() == {EPISODES_TP: 2}
    empty = Scene(episode_id="ep-0")  # an episode of zero steps is analysed at its end, as the detector does
    out = stage.process([wire.event(started(empty)), wire.event(ended(empty, success=False, steps=0))])
    alone = EpisodeDetector(DetectorConfig(), "ep-0", "scn-1", "model-1").on_end(ended(empty, False, steps=0))
    assert [e["envelope"]["event_id"] for e in on("failures.moments", out)] == \
        [m["envelope"]["event_id"] for m in alone]
    assert stage.stats["finished"] == 1 and stage.episodes == {} and len(out) == 2
    assert [e["episode_id"] for e in on("failures.episodes", out)] == ["ep-0"]  # not ep-1: decided before


def test_an_early_end_waits_while_its_partition_has_a_backlog():
    clock = Clock()
    stage = detector_stage(clock, end_grace_s=10.0)
    wire = Wire()
    scene = slip_scene()
    stage.process([wire.event(started(scene)), wire.event(ended(scene, success=False))]
                  + [wire.event(s) for s in scene.steps[:5]])
    for _ in range(10):  # a restart reads the small episodes topic long before the steps
        clock.now += 30.0
        assert stage.tick(backlogged={STEPS_TP}) == []
    out = stage.process([wire.event(s) for s in scene.steps[5:]])
    assert moment_types(out) == ["slip", "drop", "timeout"]


def test_the_episode_holding_back_the_most_messages_is_dropped_beyond_the_bound():
    wire, stage = Wire(), detector_stage(max_held_messages=25)
    stuck, busy = Scene(episode_id="ep-stuck").hold(2), slip_scene("ep-busy")
    stage.process([wire.event(started(stuck)), wire.event(stuck.steps[0]), wire.event(started(busy))])
    stage.process([wire.event(s) for s in busy.steps[:22]])
    assert "held_dropped" not in stage.stats  # 2 + 23 wait
    stage.process([wire.event(busy.steps[22])])
    assert stage.stats["held_dropped"] == 1 and list(stage.episodes) == ["ep-busy"]
    assert stage.releasable() == {EPISODES_TP: 1, STEPS_TP: 1}  # busy, open, holds from its first step


def test_forgetting_after_a_rebalance_keeps_decided_episodes_decided():
    wire, stage = Wire(), detector_stage()
    a, b = slip_scene("ep-a"), slip_scene("ep-b")
    first = [wire.event(started(a))] + [wire.event(s) for s in a.steps] + [wire.event(ended(a, success=False))]
    assert len(stage.process(first + [wire.event(started(b)), wire.event(b.steps[0])])) == 4  # 3 moments, 1 analysed
    stage.forget()
    assert stage.episodes == {} and stage.releasable() == {} and stage.stats["forgotten"] == 1
    assert stage.process(first) == []  # faust seeks back: a comes again, b from its start
    again = [wire.event(started(b))] + [wire.event(s) for s in b.steps] + [wire.event(ended(b, success=False))]
    assert moment_types(stage.process(again)) == ["slip", "drop", "timeout"]


def test_a_decided_episodes_start_read_again_after_a_rebalance_still_waits_for_its_steps():
    wire, stage = Wire(), detector_stage()
    a, b = slip_scene("ep-a"), slip_scene("ep-b")
    starts = [wire.event(started(a)), wire.event(started(b))]
    steps = [wire.event(s) for s in a.steps] + [wire.event(s) for s in b.steps[:3]]
    end_a = wire.event(ended(a, success=False))
    stage.process(starts + steps + [end_a])
    assert stage.stats["finished"] == 1 and stage.releasable() == {EPISODES_TP: 1, STEPS_TP: len(a.steps)}
    stage.forget()  # nothing was committed: faust delivers everything again, the small topic first
    assert stage.process(starts + [end_a]) == []
    # a is decided, but its steps come again: a commit past its start now would leave a worker that
    # resumes from it a's steps and end without its start (an analysis without a scenario)
    assert stage.releasable() == {EPISODES_TP: 0}
    stage.process(steps)
    assert stage.releasable() == {EPISODES_TP: 1, STEPS_TP: len(a.steps)}  # a is done; b holds from its start


def _traffic(seed: int) -> list[dict]:
    """Six rollout workers' synthetic episodes (different lengths), interleaved round robin."""
    return interleaved(*(synthetic_episodes(3, 20 + 9 * w, seed=seed * 10 + w, run_id=f"w{w}") for w in range(6)))


def _deliver(rng, pending: dict, stage, clock, out: list, stop_after: int | None = None) -> int:
    """Delivers from the partitions in random interleaving and batch sizes (each partition in order),
    ticking with the clock advancing; returns how many batches were delivered."""
    batches = 0
    while any(pending.values()) and (stop_after is None or batches < stop_after):
        tp = rng.choice([tp for tp, queue in pending.items() if queue])
        size = rng.randint(1, 40)
        batch, pending[tp] = pending[tp][:size], pending[tp][size:]
        out += stage.process(batch)
        clock.now += rng.choice([0.0, 0.1, 3.0, 30.0])
        out += stage.tick(backlogged={tp for tp, queue in pending.items() if queue})
        batches += 1
    return batches


@pytest.mark.parametrize("seed", range(8))
def test_a_crash_at_any_commit_then_a_restart_emits_every_moment_the_detector_finds_and_nothing_else(seed):
    """The restart story without a broker: commit = what releasable() allowed at some batch; outputs
    up to that commit survive (faust flushes before committing), later ones may or may not."""
    rng = random.Random(seed)
    events = _traffic(seed)
    appended: dict[tuple[str, int], list[tuple[float, dict]]] = {}
    for i, event in enumerate(events):
        topic = "rollout.steps" if event["envelope"]["event_type"] == "Step" else "rollout.episodes"
        tp = (PREFIX + topic, int(event["episode_id"][-1], 16) % 2)
        # a producer's batches to the two topics reach the broker in either order
        when = i + (rng.choice([0, 0, 5, 40]) if topic == "rollout.episodes" else 0)
        appended.setdefault(tp, []).append((when, event))
    messages = {tp: [RawMessage(tp[0], tp[1], offset, e["episode_id"].encode(), CODEC.encode(e))
                     for offset, (_, e) in enumerate(sorted(queue, key=lambda x: x[0]))]
                for tp, queue in appended.items()}
    expected, analysed = {}, {}
    for episode_id in dict.fromkeys(e["episode_id"] for e in events):
        start, *steps, end = [CODEC.decode(CODEC.encode(e)) for e in events if e["episode_id"] == episode_id]
        detector = EpisodeDetector(DetectorConfig(), episode_id, start["scenario_id"], start["model_id"])
        for step in steps:
            detector.on_step(step)
        detector.on_end(end)
        expected.update((m["envelope"]["event_id"], CODEC.encode(m)) for m in detector.moments)
        alone = detector_stage().process([Wire().event(e) for e in (start, *steps, end)])
        (analysed[episode_id],) = [o.value for o in alone if o.topic == "failures.episodes"]

    clock, out = Clock(), []
    first = detector_stage(clock)
    pending = {tp: list(queue) for tp, queue in messages.items()}
    committed, survived = {tp: 0 for tp in messages}, 0
    ends = {tp: {m.offset: m.key.decode() for m in queue if CODEC.decode(m.value)["envelope"]["event_type"]
                 == "EpisodeEnded"} for tp, queue in messages.items()}
    for _ in range(rng.randint(1, 25)):  # the commits faust makes, then the crash
        _deliver(rng, pending, first, clock, out, stop_after=rng.randint(1, 4))
        committed.update(first.releasable())
        survived = len(out)
        # nothing is acknowledged before its effect was handed over: a committed end's analysis is out
        told = {o.key.decode() for o in out if o.topic == "failures.episodes"}
        assert {ends[tp][o] for tp in ends for o in ends[tp] if o < committed[tp]} <= told
    out = out[:rng.randint(survived, len(out))]

    second = detector_stage(clock)
    pending = {tp: queue[committed[tp]:] for tp, queue in messages.items()}
    _deliver(rng, pending, second, clock, out)
    clock.now += 60.0
    out += second.tick()
    emitted = [(CODEC.decode(o.value)["envelope"]["event_id"], o.value) for o in out if o.topic == "failures.moments"]
    assert {event_id for event_id, _ in emitted} == set(expected)
    assert all(value == expected[event_id] for event_id, value in emitted)
    told = [(o.key.decode(), o.value) for o in out if o.topic == "failures.episodes"]
    assert {episode_id for episode_id, _ in told} == set(analysed)  # every ended episode, at least once
    assert all(value == analysed[episode_id] for episode_id, value in told)  # byte for byte the same
    assert not {"joined_late", "not_analysed", "ended_with_missing_steps", "idle_dropped", "evicted"} & set(
        first.stats | second.stats)
    assert second.episodes == {}


@pytest.mark.parametrize("seed", range(12))
def test_a_rebalance_then_a_crash_at_any_commit_emits_every_moment_and_analysis_the_detector_makes(seed):
    """Scale-out without a broker: a worker keeps its partitions through a rebalance (forget, then
    faust seeks back to the last commit and delivers again), commits on, and crashes; a fresh one
    resumes from its last commit. Episodes decided before the rebalance are re-read as decided:
    their start and end must still wait for their steps, or a commit passes a start whose steps
    come again after the crash (an EpisodeAnalysed without its scenario, a second content)."""
    rng = random.Random(seed)
    events = _traffic(seed)
    queues: dict[tuple[str, int], list[dict]] = {}
    for event in events:
        topic = "rollout.steps" if event["envelope"]["event_type"] == "Step" else "rollout.episodes"
        queues.setdefault((PREFIX + topic, int(event["episode_id"][-1], 16) % 2), []).append(event)
    messages = {tp: [RawMessage(tp[0], tp[1], offset, e["episode_id"].encode(), CODEC.encode(e))
                     for offset, e in enumerate(queue)] for tp, queue in queues.items()}
    expected, analysed = {}, {}
    for episode_id in dict.fromkeys(e["episode_id"] for e in events):
        alone = detector_stage().process([Wire().event(e) for e in events if e["episode_id"] == episode_id])
        expected.update((CODEC.decode(o.value)["envelope"]["event_id"], o.value) for o in alone
                        if o.topic == "failures.moments")
        (analysed[episode_id],) = [o.value for o in alone if o.topic == "failures.episodes"]

    clock, out = Clock(), []
    first = detector_stage(clock)
    pending = {tp: list(queue) for tp, queue in messages.items()}
    committed = {tp: 0 for tp in messages}

    def commits(times: int) -> None:
        for _ in range(times):
            _deliver(rng, pending, first, clock, out, stop_after=rng.randint(1, 4))
            committed.update(first.releasable())

    commits(rng.randint(1, 12))
    _deliver(rng, pending, first, clock, out, stop_after=rng.randint(1, 30))  # decided, not yet committed
    first.forget()  # the rebalance: faust seeks back to the committed offsets and delivers again
    pending = {tp: queue[committed[tp]:] for tp, queue in messages.items()}
    for tp in [tp for tp in pending if "episodes" in tp[0]]:  # the small topic comes in first
        out += first.process(pending[tp][:rng.randint(0, len(pending[tp]))])
        pending[tp] = [m for m in pending[tp] if m.offset >= first.delivered.get(tp, committed[tp])]
    committed.update(first.releasable())
    commits(rng.randint(0, 12))  # then the crash (every output so far survives: the worst case)

    second = detector_stage(clock)
    pending = {tp: queue[committed[tp]:] for tp, queue in messages.items()}
    _deliver(rng, pending, second, clock, out)
    clock.now += 60.0
    out += second.tick()
    emitted = [(CODEC.decode(o.value)["envelope"]["event_id"], o.value) for o in out if o.topic == "failures.moments"]
    assert {event_id for event_id, _ in emitted} == set(expected)
    assert all(value == expected[event_id] for event_id, value in emitted)
    told = [(o.key.decode(), o.value) for o in out if o.topic == "failures.episodes"]
    assert {episode_id for episode_id, _ in told} == set(analysed)
    assert [episode_id for episode_id, value in told if value != analysed[episode_id]] == []


# -- EpisodeAnalysed --------------------------------------------------------------------------------

def recovering_scene(episode_id="ep-1") -> Scene:
    """Misses beside the cube, reopens, grasps it and lifts: a success after a recovery."""
    scene = Scene(episode_id=episode_id)
    scene.move_to([0.06, 0.0, 0.93], 20).move_to([0.06, 0.0, 0.83], 10).close_empty(12)
    return scene.approach(30).close_on_cube(11).lift_by(0.15, 15).hold(10)


def test_each_ended_episode_gets_one_episode_analysed_with_its_end_scenario_and_moments():
    scene, spec = recovering_scene(), synthetic_scenario(3)
    wire, stage = Wire(), detector_stage()
    end = ended(scene, success=True)
    out = stage.process([wire.event(started(scene, spec))] + [wire.event(s) for s in scene.steps]
                        + [wire.event(end)])
    moments = on("failures.moments", out)
    assert [(t, k) for t, k, _ in decoded(out)][-1] == ("failures.episodes", b"ep-1")  # after the moments
    (a,) = on("failures.episodes", out)
    assert a["envelope"]["event_id"] == stable_id("EpisodeAnalysed", "ep-1")
    assert a["envelope"]["event_time"] == end["envelope"]["event_time"]  # the input's time: re-emittable
    assert a["envelope"]["run_id"] == end["envelope"]["run_id"] and a["envelope"]["producer"] == "failure-detector"
    assert a["scenario"] == CODEC.decode(CODEC.encode(started(scene, spec)))["scenario"]
    assert a["quality"] == end["quality"]
    assert (a["episode_id"], a["scenario_id"], a["model_id"], a["success"], a["termination"], a["steps"]) == \
        ("ep-1", "scn-1", "model-1", True, "success", scene.t)
    assert (a["analysed"], a["reason"], a["detector_version"]) == (True, "", DETECTOR_VERSION)
    assert a["seed"] == 1  # the start's: the clusterer passes over held-out seeds
    assert [(m["moment_id"], m["failure_type"], m["step"], m["severity"], m["features"]) for m in a["moments"]] == \
        [(m["envelope"]["event_id"], m["failure_type"], m["step"], m["severity"], m["features"]) for m in moments]
    (miss,) = a["moments"]
    assert miss["failure_type"] == "grasp_miss" and miss["recovery"] == "regrasped"
    assert miss["step"] < miss["recovered_step"] < scene.t
    again = detector_stage().process([Wire().event(e) for e in [started(scene, spec), *scene.steps, end]])
    assert [o.value for o in again if o.topic == "failures.episodes"] == \
        [o.value for o in out if o.topic == "failures.episodes"]  # a re-read re-emits it byte for byte


def test_an_episode_whose_start_never_came_is_analysed_with_an_empty_scenario():
    scene = slip_scene()
    wire, stage = Wire(), detector_stage()
    out = stage.process([wire.event(s) for s in scene.steps] + [wire.event(ended(scene, success=False))])
    (a,) = on("failures.episodes", out)
    assert a["analysed"] is True and [m["failure_type"] for m in a["moments"]] == ["slip", "drop", "timeout"]
    assert a["scenario"] == empty_scenario()
    assert (a["scenario"]["scenario_id"], a["scenario"]["env_name"], a["scenario"]["horizon"]) == ("", "", 0)
    assert a["scenario_id"] == "scn-1"  # the end says which scenario it was
    assert a["seed"] is None  # no start, no known seed


def test_an_episode_with_too_many_steps_before_its_start_is_told_not_analysed():
    scene = slip_scene()
    wire, stage = Wire(), detector_stage(max_buffered_steps=10)
    out = stage.process([wire.event(s) for s in scene.steps[:20]] + [wire.event(started(scene))]
                        + [wire.event(s) for s in scene.steps[20:]] + [wire.event(ended(scene, success=False))])
    assert on("failures.moments", out) == []
    (a,) = on("failures.episodes", out)
    assert (a["analysed"], a["reason"], a["moments"]) == (False, "more than 10 steps before EpisodeStarted", [])
    assert a["termination"] == "timeout" and a["scenario"]["scenario_id"] == started(scene)["scenario"]["scenario_id"]


def test_an_ended_episode_dropped_by_a_memory_bound_is_analysed_with_what_it_had():
    wire, stage = Wire(), detector_stage(max_open_episodes=1)
    a, b = slip_scene("ep-a"), slip_scene("ep-b")
    stage.process([wire.event(started(a))] + [wire.event(s) for s in a.steps[:-3]]
                  + [wire.event(ended(a, success=False))])  # its last 3 steps are late
    assert stage.releasable()[EPISODES_TP] == 0
    out = stage.process([wire.event(started(b))])  # a second open episode: a is dropped
    (told,) = on("failures.episodes", out)
    assert told["episode_id"] == "ep-a" and told["analysed"] is True
    assert told["reason"].startswith(f"steps missing: {len(a.steps) - 3} of {len(a.steps)} arrived")
    assert told["reason"].endswith("when it was dropped: more than 1 open episodes")
    assert moment_types(out) == ["timeout"] and stage.stats["evicted"] == 1
    assert stage.releasable()[EPISODES_TP] == 2  # a's messages go in the call that published its analysis


def test_an_end_that_waits_is_acknowledged_only_with_the_call_that_publishes_its_analysis():
    clock = Clock()
    stage = detector_stage(clock, end_grace_s=10.0)
    wire = Wire()
    scene = slip_scene()
    stage.process([wire.event(started(scene))] + [wire.event(s) for s in scene.steps[:-1]]
                  + [wire.event(ended(scene, success=False))])
    assert stage.releasable() == {EPISODES_TP: 0, STEPS_TP: 0}
    clock.now += 5.0
    assert stage.tick() == [] and stage.releasable() == {EPISODES_TP: 0, STEPS_TP: 0}
    out = stage.process([wire.event(scene.steps[-1])])
    assert len(on("failures.episodes", out)) == 1
    assert stage.releasable() == {EPISODES_TP: 2, STEPS_TP: len(scene.steps)}


def test_a_step_the_detector_cannot_read_is_dead_lettered_not_fatal():
    scene = slip_scene()
    wire, stage = Wire(), detector_stage()
    broken = copy.deepcopy(scene.steps[2])
    broken["object_poses"] = [{"name": "cube", "pos": [0.0], "quat": [0.0, 0.0, 0.0, 1.0]}]  # schema-valid, 1-d
    messages = [wire.event(started(scene))] + [wire.event(s) for s in scene.steps[:2]] + [wire.event(broken)]
    messages += [wire.event(s) for s in scene.steps[3:]] + [wire.event(ended(scene, success=False))]
    out = decoded(stage.process(messages))
    dead = [e for topic, _, e in out if topic == "deadletter"]
    assert len(dead) == 1 and "IndexError" in dead[0]["reason"] and dead[0]["source_offset"] == 2
    assert [e["failure_type"] for t, _, e in out if t == "failures.moments"] == ["slip", "drop", "timeout"]
