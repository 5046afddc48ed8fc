"""What must hold for the failure clusterer in real ``faust -A streams.app worker`` processes on
real brokers (the embedded Tansu and Apache Kafka), configured through SEPA_* like any deployment:

- kill -9 mid-stream, then a restart: every failed episode is taken in, no event id carries two
  contents, and failures.clusters holds exactly what an uninterrupted clusterer makes of the same
  input (the pure ClusterStage over the same order): same positions, ids, bytes, so the same final
  clusters (ids, sizes, memberships);
- the same log processed again (``sepa-eval replay --republish``: both topics copied into fresh
  ones, the input read again from offset 0) adds nothing;
- two workers: the one holding failures.episodes (one partition) clusters, the other stands by;
  kill -9 of the active one and the standby restores and carries on with the same ids.

EpisodeAnalysed events are synthetic (tests/analysed_episodes.py), published at a steady rate.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from analysed_episodes import analysed_episodes, is_failure
from confluent_kafka import Consumer, TopicPartition
from marks import slow_on_kafka
from steady_publisher import publish_steadily
from test_streams_restart import TopicReader, start_worker, wait_for_line

from infra.kafka_clients import ensure_topics, make_producer
from producers.publisher import Publisher
from schemas.codec import Codec
from streams.deadletter import RawMessage
from streams.failures.clusterer import ClustererConfig, OnlineFailureClusterer
from streams.failures.collector import ClusterStage, CollectorConfig
from streams.failures.embedding import EmbeddingConfig
from streams.failures.summaries import FeatureDescriber

pytestmark = pytest.mark.timeout(240)  # the Apache Kafka variant is marked kafka by the broker fixture

EPISODES = 300
EPISODES_PER_S = 30
ACTIVE = "failure-clusterer: active on"
STANDBY = "failure-clusterer: standby"


def expected_output(events: list[dict], prefix: str, codec: Codec) -> dict[str, bytes]:
    """event_id -> bytes of what an uninterrupted clusterer (the app's defaults) publishes."""
    ecfg = EmbeddingConfig()
    stage = ClusterStage(OnlineFailureClusterer(ClustererConfig(), FeatureDescriber(ecfg), "streams"), ecfg,
                         CollectorConfig(), prefix, "streams", codec=codec)
    out = stage.process(RawMessage(prefix + "failures.episodes", 0, i, e["episode_id"].encode(), codec.encode(e))
                        for i, e in enumerate(events))
    return {codec.decode(o.value)["envelope"]["event_id"]: o.value for o in out}


def clusters_of(values, codec: Codec) -> dict[str, set[str]]:
    """cluster id -> episodes whose latest assignment (by position) names it, as the read side derives it."""
    latest = {}
    for event in sorted((codec.decode(v) for v in values), key=lambda e: e["position"]):
        if event["envelope"]["event_type"] == "ClusterAssigned":
            latest[event["episode_id"]] = event["cluster_id"]
    out: dict[str, set[str]] = {}
    for episode_id, cluster_id in latest.items():
        out.setdefault(cluster_id, set()).add(episode_id)
    return out


def committed(broker: str, topic: str) -> int:
    """The streams app's (consumer group sepa-streams) committed offset on ``topic``[0]."""
    probe = Consumer({"bootstrap.servers": broker, "group.id": "sepa-streams", "enable.auto.commit": False})
    try:
        (tp,) = probe.committed([TopicPartition(topic, 0)], timeout=10)
        return max(tp.offset, 0)
    finally:
        probe.close()


def wait_until(predicate, what: str, timeout: float, workers=(), poll=None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for worker, log_path in workers:
            assert worker.poll() is None, f"a worker exited with {worker.returncode}; see {log_path}"
        assert time.monotonic() < deadline, f"{what} within {timeout} s; see {[str(p) for _, p in workers]}"
        if poll is not None:
            poll()
        else:
            time.sleep(0.2)


def wait_for_output(reader: TopicReader, expected: dict[str, bytes], published: threading.Event, worker, log_path,
                    timeout: float) -> None:
    """Until the whole expected output is in, or something else is (then the checks say what)."""
    deadline = time.monotonic() + timeout
    while not (published.is_set() and set(expected) <= set(reader.copies)) and time.monotonic() < deadline:
        assert worker.poll() is None, f"the worker exited with {worker.returncode}; see {log_path}"
        reader.poll(0.5)
        if any(event_id not in expected or any(c != expected[event_id] for c in copies)
               for event_id, copies in reader.copies.items()):
            return
    reader.poll(2.0)  # anything emitted late, twice, or never expected


def stop(worker) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except Exception:
            worker.kill()
            worker.wait()


def final_clusterer_stats(log_path: Path) -> dict[str, int]:
    lines = re.findall(r"failure-clusterer: ((?:\w+=\d+, )*\w+=\d+)\s*$", log_path.read_text(errors="replace"), re.M)
    assert lines, f"the worker logged no clusterer counters; see {log_path}"
    return {k: int(v) for k, v in (item.split("=") for item in lines[-1].split(", "))}


def check_log(reader: TopicReader, expected: dict[str, bytes], events: list[dict], codec: Codec, where) -> None:
    missing, unexpected = set(expected) - set(reader.copies), set(reader.copies) - set(expected)
    assert (len(missing), len(unexpected)) == (0, 0), f"see {where}"
    changed = {event_id for event_id, copies in reader.copies.items() if any(c != expected[event_id] for c in copies)}
    assert changed == set(), f"{len(changed)} event ids carry a content other than the uninterrupted run's"
    values = [copies[0] for copies in reader.copies.values()]
    intakes = Counter(e["episode_id"] for e in map(codec.decode, values)
                      if e["envelope"]["event_type"] == "ClusterAssigned" and e["intake"])
    assert intakes == Counter(e["episode_id"] for e in events if is_failure(e))  # each failed episode, once
    assert clusters_of(values, codec) == clusters_of(expected.values(), codec)


@pytest.mark.slow  # one of the default run's longest (README, Test)
@slow_on_kafka
def test_kill_9_of_the_clusterer_mid_stream_then_a_replay_change_no_cluster(broker, prefix, tmp_path):
    codec = Codec()
    events = analysed_episodes(EPISODES, seed=50, run_id="restart")
    expected = expected_output(events, prefix, codec)
    assert len(clusters_of(expected.values(), codec)) >= 4
    episodes_topic, clusters_topic = prefix + "failures.episodes", prefix + "failures.clusters"

    logs = [tmp_path / f"worker-{i}.log" for i in (1, 2, 3)]
    reader = TopicReader(broker, clusters_topic, codec)
    published, killed = threading.Event(), threading.Event()
    # the last third is held until the kill, so the kill lands mid-stream however loaded the machine
    publisher = threading.Thread(target=publish_steadily, args=(broker, prefix, events, published, EPISODES_PER_S, 5),
                                 kwargs={"gates": [(2 * len(events) // 3, killed)]}, daemon=True)
    worker = start_worker(broker, prefix, tmp_path / "mem", logs[0])
    try:
        wait_for_line(logs[0], ACTIVE, worker, timeout=90)
        publisher.start()
        wait_until(lambda: committed(broker, episodes_topic) >= EPISODES // 4, "a quarter of the input committed",
                   90, [(worker, logs[0])], poll=lambda: reader.poll(0.5))
        worker.kill()  # SIGKILL: no final commit, no flush
        worker.wait()
        at_kill = reader.poll(0.5)
        killed.set()
        assert 0 < at_kill < len(expected), "the kill must land mid-stream"

        worker = start_worker(broker, prefix, tmp_path / "mem", logs[1])
        wait_for_output(reader, expected, published, worker, logs[1], 120)
        stop(worker)
        check_log(reader, expected, events, codec, logs[1])
        restored = re.search(r"active on .*: (\d+) events restored", logs[1].read_text()).group(1)
        assert 0 < int(restored) <= at_kill + 50
        stats = final_clusterer_stats(logs[1])
        assert stats["messages"] < EPISODES, "the restarted worker read everything again: nothing was committed"

        # replay --republish: both topics copied into fresh ones, in their order, the input read from 0
        again = prefix[:-1] + "r."
        ensure_topics(broker, again)
        copier = Publisher(make_producer(broker), again)
        copies_before = {event_id: list(copies) for event_id, copies in reader.copies.items()}
        sizes = {clusters_topic: sum(map(len, copies_before.values())), episodes_topic: EPISODES}
        for topic, name in ((clusters_topic, "failures.clusters"), (episodes_topic, "failures.episodes")):
            source = TopicReader(broker, topic, codec)
            copied, deadline = 0, time.monotonic() + 30
            while copied < sizes[topic] and time.monotonic() < deadline:
                for msg in source.consumer.consume(1000, timeout=0.2):
                    copier.publish_raw(again + name, msg.key(), msg.value())
                    copied += 1
            source.close()
            assert copied == sizes[topic], f"copied {copied} of {sizes[topic]} messages of {topic}"
        copier.flush()
        replayed = TopicReader(broker, again + "failures.clusters", codec)
        worker = start_worker(broker, again, tmp_path / "mem-r", logs[2])
        wait_until(lambda: committed(broker, again + "failures.episodes") >= EPISODES, "the input re-read", 90,
                   [(worker, logs[2])], poll=lambda: replayed.poll(0.5))
        replayed.poll(1.0)
        stop(worker)
        assert {k: len(v) for k, v in replayed.copies.items()} == {k: len(v) for k, v in copies_before.items()}
        assert all(c == expected[k] for k, copies in replayed.copies.items() for c in copies)  # nothing new
        stats = final_clusterer_stats(logs[2])
        assert stats["already_taken_in"] == sum(map(is_failure, events)) and stats.get("taken_in", 0) == 0
        replayed.close()
    finally:
        killed.set()
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        reader.close()
        if publisher.is_alive():
            publisher.join(60)
    print(f"{len(expected)} cluster events, {at_kill} out at the kill, {restored} restored; "
          f"replay: {stats}")


@pytest.mark.slow  # one of the default run's longest, on both brokers (README, Test)
def test_a_second_clusterer_stands_by_and_takes_over_with_the_same_ids(broker, prefix, tmp_path):
    codec = Codec()
    events = analysed_episodes(EPISODES, seed=51, run_id="singleton")
    expected = expected_output(events, prefix, codec)
    episodes_topic = prefix + "failures.episodes"
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    reader = TopicReader(broker, prefix + "failures.clusters", codec)
    published, killed = threading.Event(), threading.Event()
    # the last third is held until the kill, so the kill lands mid-stream however loaded the machine
    publisher = threading.Thread(target=publish_steadily, args=(broker, prefix, events, published, EPISODES_PER_S, 5),
                                 kwargs={"gates": [(2 * len(events) // 3, killed)]}, daemon=True)
    workers = [start_worker(broker, prefix, tmp_path / f"mem-{i}", log) for i, log in enumerate(logs)]
    pairs = list(zip(workers, logs, strict=True))

    def said(text: str) -> list[int]:
        return [i for i, log in enumerate(logs) if text in log.read_text(errors="replace")]

    try:
        wait_until(lambda: len(said(ACTIVE)) == 1 and len(said(STANDBY)) == 1, "one active and one standby", 90,
                   pairs)
        (active,), (standby,) = said(ACTIVE), said(STANDBY)
        assert active != standby
        publisher.start()
        wait_until(lambda: committed(broker, episodes_topic) >= EPISODES // 3, "a third of the input committed", 90,
                   pairs, poll=lambda: reader.poll(0.5))
        assert said(ACTIVE) == [active]  # the standby took nothing in meanwhile
        workers[active].kill()
        workers[active].wait()
        at_kill = reader.poll(0.5)
        killed.set()
        assert 0 < at_kill < len(expected), "the kill must land mid-stream"
        wait_for_output(reader, expected, published, workers[standby], logs[standby], 120)
        stop(workers[standby])
        assert said(ACTIVE) == [0, 1]  # the standby became active
        check_log(reader, expected, events, codec, logs[standby])
    finally:
        killed.set()
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        reader.close()
        if publisher.is_alive():
            publisher.join(60)
    took_over = logs[standby].read_text().split(ACTIVE)[1].splitlines()[0]
    print(f"{len(expected)} cluster events, {at_kill} out when the active worker was killed; standby: {took_over}")
