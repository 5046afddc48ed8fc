"""The clusterer agent's pure core, fed Confluent-framed EpisodeAnalysed as failures.episodes
delivers them: intake at once, dead letters, and the restore from its own output after a crash at
any point (the log holds a prefix of the outputs, the committed input offset lags behind), after a
re-read of the whole input, and its refusal of a log it cannot reproduce. No broker."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from analysed_episodes import analysed_episodes, is_failure

from producers.seeds import HELD_OUT_FROM
from schemas.codec import Codec
from schemas.events import make_event
from streams.deadletter import RawMessage
from streams.exceptions import ClustererError, ConfigError
from streams.failures.clusterer import NOISE_ID, ClustererConfig, OnlineFailureClusterer
from streams.failures.collector import ClusterLog, ClusterStage, CollectorConfig
from streams.failures.embedding import EmbeddingConfig
from streams.failures.summaries import FeatureDescriber

PREFIX = "t."
CODEC = Codec()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stage(clock=None, clusterer: ClustererConfig | None = None, want_llm_summaries=False, **collector) -> ClusterStage:
    ecfg = EmbeddingConfig()
    return ClusterStage(OnlineFailureClusterer(clusterer or ClustererConfig(), FeatureDescriber(ecfg), "run-s"), ecfg,
                        CollectorConfig(**collector), PREFIX, "run-s", clock=clock or Clock(),
                        want_llm_summaries=want_llm_summaries)


def wire(events: list[dict]) -> list[RawMessage]:
    return [RawMessage(PREFIX + "failures.episodes", 0, i, e["episode_id"].encode(), CODEC.encode(e))
            for i, e in enumerate(events)]


def as_log(outgoing) -> ClusterLog:
    history = ClusterLog(CODEC)
    for i, o in enumerate(outgoing):
        history.add(RawMessage(PREFIX + "failures.clusters", 0, i, o.key, o.value))
    return history


def by_id(events: list[dict]) -> dict[str, dict]:
    return {e["episode_id"]: CODEC.decode(CODEC.encode(e)) for e in events}


INPUT = analysed_episodes(160, seed=21)
MESSAGES = wire(INPUT)


def test_each_failed_episode_is_taken_in_at_once_and_the_rest_is_counted():
    s = stage()
    out = s.process(MESSAGES)
    events = [CODEC.decode(o.value) for o in out]
    assert all(o.topic == "failures.clusters" and o.key == e["cluster_id"].encode()
               for o, e in zip(out, events, strict=True))
    assert [e["position"] for e in events] == list(range(len(events)))
    failed = [e["episode_id"] for e in INPUT if is_failure(e)]
    assert [e["episode_id"] for e in events if e["envelope"]["event_type"] == "ClusterAssigned" and e["intake"]] \
        == failed
    assert {e["envelope"]["event_time"] for e in events} <= {e["envelope"]["event_time"] for e in INPUT}
    assert s.stats["taken_in"] == len(failed)
    assert s.stats["successes"] + s.stats["not_analysed"] + s.stats["skipped_terminations"] == len(INPUT) - len(failed)
    assert s.stats["not_analysed"] > 0 and s.stats["skipped_terminations"] > 0
    assert len(s.clusterer.clusters) == 4 and s.process(MESSAGES) == []  # re-read: everything known
    assert s.stats["already_taken_in"] == len(failed)


def test_a_failure_on_a_held_out_seed_is_passed_over_measurement_never_chooses():
    failed = [e for e in INPUT if is_failure(e)][:6]
    held_out = [{**e, "seed": HELD_OUT_FROM + i} for i, e in enumerate(failed[:3])]
    chosen = [{**e, "seed": i} for i, e in enumerate(failed[3:])]
    s = stage()
    out = [CODEC.decode(o.value) for o in s.process(wire(held_out + chosen))]
    taken = [e["episode_id"] for e in out if e["envelope"]["event_type"] == "ClusterAssigned" and e["intake"]]
    assert taken == [e["episode_id"] for e in chosen]
    assert s.stats["held_out"] == 3 and s.stats["taken_in"] == 3


def test_what_cannot_be_clustered_is_dead_lettered_with_the_reason():
    s = stage()
    event = next(e for e in analysed_episodes(20, seed=22) if is_failure(e))
    event["moments"][0]["failure_type"] = "teleported"
    wrong = make_event("ClusterAssigned", ("x",), "test", "r", cluster_id="c", episode_id="e", scenario_id="s",
                       distance=0.0, embedding=[], clusterer_version="v")
    raws = wire([event]) + [RawMessage(PREFIX + "failures.episodes", 0, 1, b"k", b"junk"),
                            RawMessage(PREFIX + "failures.episodes", 0, 2, b"e", CODEC.encode(wrong))]
    dead = [CODEC.decode(o.value) for o in s.process(raws)]
    assert [d["source_offset"] for d in dead] == [0, 1, 2] and {d["consumer"] for d in dead} == {"failure-clusterer"}
    assert "unknown failure type 'teleported'" in dead[0]["reason"] and event["episode_id"] in dead[0]["reason"]
    assert "does not belong on topic failures.episodes" in dead[2]["reason"]
    assert s.clusterer.updates == 0 and s.clusterer.position == 0


def crash_run(rng: random.Random) -> tuple[list, list, int]:
    """An uninterrupted run's outputs per input message, and a crash point: the log holds the
    outputs of inputs before ``i`` and the first ``j`` of input ``i``'s; ``committed`` <= i."""
    s = stage()
    per_input = [s.process([raw]) for raw in MESSAGES]
    producing = [k for k, out in enumerate(per_input) if out]
    i = rng.choice(producing)
    j = rng.randrange(len(per_input[i]))  # at least one of its outputs is missing
    committed = rng.randint(0, i)
    log = [o for out in per_input[:i] for o in out] + per_input[i][:j]
    return per_input, log, committed, s


@pytest.mark.parametrize("seed", range(12))
def test_a_restore_after_a_crash_anywhere_carries_on_as_if_nothing_happened(seed):
    rng = random.Random(seed)
    per_input, log, committed, uninterrupted = crash_run(rng)
    expected = [o for out in per_input for o in out]
    restarted = stage()
    published = restarted.restore(as_log(log), by_id(INPUT))
    published += restarted.process(MESSAGES[committed:])  # faust resumes from the committed offset
    assert [o.value for o in log + published] == [o.value for o in expected]  # byte-identical, same order
    assert restarted.clusterer.state() == uninterrupted.clusterer.state()
    assert restarted.stats["restored_events"] == len(log)


def test_a_crash_inside_a_reclusterings_sends_is_completed_by_the_restore():
    s = stage()
    per_input = [s.process([raw]) for raw in MESSAGES]
    i = next(k for k, out in enumerate(per_input) if len(out) >= 4)  # an intake and its re-clustering
    log = [o for out in per_input[:i] for o in out] + per_input[i][:2]
    restarted = stage()
    tail = restarted.restore(as_log(log), by_id(INPUT))
    assert [o.value for o in tail] == [o.value for o in per_input[i][2:]]
    assert restarted.stats["restore_tail"] == len(per_input[i]) - 2
    assert restarted.process(MESSAGES[:i + 1]) == []  # the input of that step, re-delivered: taken in already


def test_a_restore_counts_re_sent_events_once_and_keeps_the_first_of_two_contents():
    s = stage()
    out = s.process(MESSAGES[:60])
    history = as_log(out + out[:5])
    assert history.stats["duplicates"] == 5
    forged = CODEC.decode(out[3].value)
    forged["distance"] += 1.0
    history.add(RawMessage(PREFIX + "failures.clusters", 0, 999, b"x", CODEC.encode(forged)))
    assert history.stats["conflicts"] == 1 and history.events[3].value == out[3].value
    restarted = stage()
    assert restarted.restore(history, by_id(INPUT)) == []
    assert restarted.clusterer.state() == s.clusterer.state()
    assert restarted.stats["log_conflicts"] == 1 and restarted.stats["log_duplicates"] == 5


def test_re_reading_the_whole_input_after_a_restore_adds_nothing():
    s = stage()
    out = s.process(MESSAGES)
    restarted = stage()
    assert restarted.restore(as_log(out), by_id(INPUT)) == []
    assert restarted.process(MESSAGES) == []  # as after `sepa-eval replay --republish`
    assert restarted.clusterer.state() == s.clusterer.state()
    more = wire(analysed_episodes(40, seed=23))
    assert [o.value for o in restarted.process(more)] == [o.value for o in s.process(more)]


def test_a_log_the_clusterer_cannot_reproduce_is_refused_naming_the_position():
    s = stage()
    out = s.process(MESSAGES[:80])
    events = [CODEC.decode(o.value) for o in out]
    p = next(i for i, e in enumerate(events) if e["envelope"]["event_type"] == "ClusterUpdated")
    tampered = [CODEC.encode({**e, "size": e["size"] + 1}) if i == p else o.value
                for i, (e, o) in enumerate(zip(events, out, strict=True))]
    history = ClusterLog(CODEC)
    for i, value in enumerate(tampered):
        history.add(RawMessage(PREFIX + "failures.clusters", 0, i, b"k", value))
    with pytest.raises(ClustererError, match=f"position {p} .*size: re-derived"):
        stage().restore(history, by_id(INPUT))
    with pytest.raises(ClustererError, match="position 0 .*event_id.*another clusterer version or configuration"):
        stage(clusterer=ClustererConfig(namespace="other")).restore(as_log(out), by_id(INPUT))
    gap = as_log(out[:3] + out[4:])
    with pytest.raises(ClustererError, match="lacks position 3"):
        stage().restore(gap, by_id(INPUT))
    first = events[0]["episode_id"]
    with pytest.raises(ClustererError, match=f"{first}, whose EpisodeAnalysed is not on t.failures.episodes"):
        stage().restore(as_log(out), {k: v for k, v in by_id(INPUT).items() if k != first})
    fresh = stage()
    with pytest.raises(ClustererError):
        fresh.restore(history, by_id(INPUT))
    assert fresh.clusterer.updates == 0  # a failed restore leaves the stage as it was


def test_an_idle_reclustering_is_recorded_and_re_executed_from_the_log():
    clock = Clock()
    every_50 = ClustererConfig(recluster_every=50, recluster_fraction=10.0)  # 50 intakes from the start
    s = stage(clock, clusterer=every_50, recluster_idle_s=30.0)
    out = s.process(MESSAGES[:30])
    assert s.clusterer.revision == 0 and s.clusterer.pending == s.clusterer.updates > 0
    clock.now += 29.0
    assert s.tick() == []
    clock.now += 1.0
    idle = s.tick()
    assert idle and s.stats["idle_reclusterings"] == 1 and s.clusterer.revision == 1
    assert s.clusterer.pending < s.clusterer.updates - 10 and s.clusterer.clusters
    assert s.tick() == []  # nothing came in since
    out += idle + s.process(MESSAGES[30:])
    restarted = stage(clusterer=every_50, recluster_idle_s=30.0)
    assert restarted.restore(as_log(out), by_id(INPUT)) == []
    assert restarted.clusterer.state() == s.clusterer.state()


def test_llm_summaries_keep_their_positions_through_a_restore():
    s = stage(want_llm_summaries=True)
    out = s.process(MESSAGES[:50])
    requests = s.take_summary_requests()
    assert requests and len({(r.cluster_id, r.revision) for r in requests}) == len(requests)
    latest = requests[-1]
    message = s.llm_summary(latest, "Grasps close beside the object.")
    event = CODEC.decode(message.value)
    assert event["summary_source"] == "llm" and event["position"] == len(out)
    stale = [r for r in requests if r.cluster_id == latest.cluster_id and r.revision < latest.revision]
    assert stale and s.llm_summary(stale[0], "old") is None  # that cluster has changed since
    out += [message] + s.process(MESSAGES[50:])
    restarted = stage(want_llm_summaries=True)
    assert restarted.restore(as_log(out), by_id(INPUT)) == []
    assert restarted.clusterer.state() == s.clusterer.state() and restarted.take_summary_requests() == []


def test_forget_stands_by_and_a_restore_rebuilds():
    s = stage()
    out = s.process(MESSAGES)
    state = s.clusterer.state()
    s.forget()
    assert s.clusterer.updates == 0 and s.clusterer.label_of(INPUT[0]["episode_id"]) is None
    assert s.restore(as_log(out), by_id(INPUT)) == [] and s.clusterer.state() == state


def test_event_times_come_from_the_input():
    s = stage()
    events = [CODEC.decode(o.value) for o in s.process(MESSAGES[:40])]
    times = {e["episode_id"]: e["envelope"]["event_time"] for e in INPUT}
    for e in events:
        if e["envelope"]["event_type"] == "ClusterAssigned" and e["intake"]:
            assert e["envelope"]["event_time"] == times[e["episode_id"]]
    later = s.process(wire([{**e, "envelope": {**e["envelope"], "event_time": e["envelope"]["event_time"]
                                               + timedelta(days=1)}} for e in INPUT[:40]]))
    assert later == []  # known episodes: their new times change nothing
    assert NOISE_ID in {e["cluster_id"] for e in events}


@pytest.mark.parametrize("field,value", [("recluster_idle_s", 0.0), ("restore_timeout_s", -1.0)])
def test_collector_config_refuses_bad_values(field, value):
    with pytest.raises(ConfigError, match=field):
        CollectorConfig(**{field: value})


def test_fragile_successes_are_taken_in_when_asked_and_only_then():
    fragile = [e for e in INPUT if e["success"] and e["moments"] and e["analysed"]]
    clean = [e for e in INPUT if e["success"] and not e["moments"]]
    assert fragile and clean  # the synthetic input has both
    on, off = stage(fragile_successes=True), stage()
    intakes = {}
    for name, s in (("on", on), ("off", off)):
        events = [CODEC.decode(o.value) for o in s.process(MESSAGES)]
        intakes[name] = {e["episode_id"] for e in events if e["envelope"]["event_type"] == "ClusterAssigned"
                         and e["intake"]}
    assert {e["episode_id"] for e in fragile} <= intakes["on"]
    assert not {e["episode_id"] for e in fragile} & intakes["off"]
    assert not {e["episode_id"] for e in clean} & intakes["on"]  # a clean success is nothing to mine
