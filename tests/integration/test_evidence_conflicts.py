"""The evidence sink as the checker of "an event id names one content", against real brokers and
a real chDB store: duplicates count once, conflicts are dead-lettered and the first content stays,
records ClickHouse refuses are dead-lettered with its own words, consumer errors are not messages."""

from __future__ import annotations

import io
import logging
import threading
import time
import uuid
from datetime import timedelta

import fastavro
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from consumers.evidence.exceptions import ReplayError
from consumers.evidence.sink import EvidenceSink
from consumers.replay import compare, rebuild
from consumers.state import table_counts
from infra.kafka_clients import consumer_config, ensure_topics, make_producer
from producers.publisher import Publisher
from producers.synthetic import episodes
from schemas.catalog import BY_NAME
from schemas.codec import Codec
from schemas.events import make_event
from schemas.manifest import current_manifest

SESSION_MS = 6000  # Apache Kafka refuses less (group.min.session.timeout.ms)
CODEC = Codec()


def make_sink(store, broker, prefix, group: str | None = None, **consumer_extra) -> EvidenceSink:
    consumer = Consumer(consumer_config(broker, group or f"sink-{prefix}", SESSION_MS, **consumer_extra))
    return EvidenceSink(store, consumer, make_producer(broker), CODEC, prefix)


def drain(store, broker, prefix):
    return make_sink(store, broker, prefix).run(threading.Event(), idle_exit_s=2.0)


def publish(broker, prefix, events) -> None:
    publisher = Publisher(make_producer(broker), prefix, CODEC)
    for event in events:
        publisher.publish(event)
    publisher.flush()


def publish_raw(broker, topic: str, key: bytes, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": broker})
    for value in values:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


class Batches:
    """One sink over the topics' partitions, assigned (no group join to wait for): each take(n)
    consumes exactly n more messages and stores them as one batch. No producer: its dead letters
    go straight into the store."""

    def __init__(self, store, broker, prefix, topics: list[str]):
        consumer = Consumer(consumer_config(broker, f"batch-{prefix}", SESSION_MS))
        self.sink = EvidenceSink(store, consumer, None, CODEC, prefix)
        metadata = consumer.list_topics(timeout=10).topics
        consumer.assign([TopicPartition(prefix + t, p, OFFSET_BEGINNING)
                         for t in topics for p in metadata[prefix + t].partitions])

    def take(self, n: int):
        messages, deadline = [], time.monotonic() + 30
        while len(messages) < n and time.monotonic() < deadline:
            messages += [m for m in self.sink.consumer.consume(n - len(messages), 1.0) if m.error() is None]
        assert len(messages) == n
        return self.sink.process(messages)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sink.consumer.close()


def raw_rows(store, table: str, event_id: str) -> list[tuple]:
    """Every physical row under the id, merges or not (no FINAL)."""
    return store.query(f"SELECT * FROM {{database}}.{table} WHERE envelope.event_id = {{id:String}}",
                       parameters={"id": event_id})


def dead_letters(store) -> list[tuple[str, bytes]]:
    rows = store.query("SELECT reason, original FROM {database}.dead_letters FINAL ORDER BY source_offset",
                       column_formats={"original": "bytes"})
    return [(reason, bytes(original)) for reason, original in rows]


def ended_episode(seed: int) -> dict:
    return next(e for e in episodes(1, 2, seed=seed, run_id="r") if e["envelope"]["event_type"] == "EpisodeEnded")


def at_another_time(event: dict, delta: timedelta) -> dict:
    return {**event, "envelope": {**event["envelope"], "event_time": event["envelope"]["event_time"] + delta}}


def flipped(event: dict) -> dict:
    """The same event id with another content: the outcome turned round."""
    return {**event, "success": not event["success"], "termination": "timeout" if event["success"] else "success"}


def test_the_same_event_twice_is_stored_once_without_a_dead_letter(broker, prefix, store):
    event = ended_episode(1)
    with Batches(store, broker, prefix, ["rollout.episodes"]) as batches:
        publish(broker, prefix, [event])
        assert batches.take(1).stored == 1
        publish(broker, prefix, [event])
        second = batches.take(1)
    assert (second.stored, second.duplicates, second.dead_lettered) == (0, 1, 0)
    assert len(raw_rows(store, "rollout_episodes", event["envelope"]["event_id"])) == 1
    assert dead_letters(store) == []


def test_a_different_content_under_a_known_id_is_dead_lettered_and_the_first_stays(broker, prefix, store):
    first = ended_episode(2)
    second = flipped(first)
    event_id = first["envelope"]["event_id"]
    with Batches(store, broker, prefix, ["rollout.episodes"]) as batches:
        publish(broker, prefix, [first])
        batches.take(1)
        publish(broker, prefix, [second])
        totals = batches.take(1)
    assert (totals.conflicts, totals.dead_lettered) == (1, 1)
    assert totals.stored == 1  # the dead letter
    assert len(raw_rows(store, "rollout_episodes", event_id)) == 1

    (row,) = store.query("SELECT success FROM {database}.rollout_episodes FINAL WHERE envelope.event_id = {id:String}",
                         parameters={"id": event_id})
    assert row[0] is first["success"]
    (reason, original), = dead_letters(store)
    assert original == CODEC.encode(second)
    assert event_id in reason and "rollout_episodes" in reason and "different content" in reason
    assert "differs in success, termination" in reason


def test_the_same_content_at_another_event_time_or_schema_version_is_a_duplicate(broker, prefix, store):
    events = list(episodes(1, 3, seed=3, run_id="r"))
    started, step = events[0], events[1]
    later = at_another_time(step, timedelta(hours=1))
    batches = Batches(store, broker, prefix, ["rollout.episodes", "rollout.steps"])
    publish(broker, prefix, [started, step])
    batches.take(2)
    # The EpisodeStarted again, written with its first schema version (without variant, simulator,
    # and an older ScenarioSpec): upcast to the current version, it is the same content.
    v1 = next(v for v in current_manifest().history("EpisodeStarted") if v.version == 1)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, v1.parsed, started)
    old_encoding = b"\x00" + v1.schema_id.to_bytes(4, "big") + body.getvalue()
    assert old_encoding != CODEC.encode(started)
    publish_raw(broker, f"{prefix}rollout.episodes", started["episode_id"].encode(), [old_encoding])
    publish(broker, prefix, [later])
    with batches:
        totals = batches.take(2)

    assert (totals.stored, totals.duplicates, totals.dead_lettered) == (0, 2, 0)
    (row,) = raw_rows(store, "rollout_steps", step["envelope"]["event_id"])
    stored_time = row[0]["event_time"]
    assert stored_time.replace(tzinfo=None) == step["envelope"]["event_time"].replace(tzinfo=None)  # the first stays
    assert dead_letters(store) == []


def test_conflicts_and_duplicates_inside_one_batch(broker, prefix, store):
    first = ended_episode(4)
    other = flipped(first)
    third = {**first, "steps": first["steps"] + 1}
    publish(broker, prefix, [first, other, first, third])
    # One id under two keys (a cluster id that changed): caught when both share a batch.
    assigned = make_event("ClusterAssigned", ("ep-1", "run-a"), "clusterer", "r", cluster_id="c1", episode_id="ep-1",
                          scenario_id="s", distance=0.1, embedding=[0.5, 0.5], clusterer_version="1")
    moved = {**assigned, "cluster_id": "c2"}
    publish(broker, prefix, [assigned, moved])
    with Batches(store, broker, prefix, ["rollout.episodes", "failures.clusters"]) as batches:
        stats = batches.take(6)

    assert (stats.duplicates, stats.conflicts, stats.dead_lettered) == (1, 3, 3)
    assert stats.stored == 2 + 3  # the first EpisodeEnded and ClusterAssigned, and the dead letters
    assert len(raw_rows(store, "rollout_episodes", first["envelope"]["event_id"])) == 1
    (success, steps), = store.query("SELECT success, steps FROM {database}.rollout_episodes FINAL")
    assert (success, steps) == (first["success"], first["steps"])
    (cluster,), = store.query("SELECT cluster_id FROM {database}.failure_clusters FINAL")
    assert cluster == "c1"
    reasons = sorted(reason for reason, _ in dead_letters(store))
    assert [r.rsplit("differs in ", 1)[1] for r in reasons] == [
        "cluster_id); the first content stays", "steps); the first content stays",
        "success, termination); the first content stays"]


def test_replay_rebuild_reproduces_the_digest_with_conflicts_and_duplicates(broker, prefix, store):
    good = list(episodes(6, 10, seed=5, run_id="r"))
    ended = ended_episode(6)
    step = good[1]
    later = at_another_time(step, timedelta(days=1))
    publish(broker, prefix, good + [ended, flipped(ended), later, ended])
    drain(store, broker, prefix)
    assert table_counts(store)["dead_letters"] == 1
    target = store.database + "_rebuild"
    rebuilt = rebuild(store, lambda group: Consumer(consumer_config(broker, group, SESSION_MS)), CODEC, prefix,
                      target, broker=broker)
    try:
        before, after, differences = compare(store, rebuilt)
        assert differences == {} and before == after
        assert dead_letters(rebuilt) == dead_letters(store)
    finally:
        rebuilt.command("DROP DATABASE IF EXISTS {database}")


def out_of_range_step(step: dict) -> bytes:
    """A Step whose int field t holds 2**40: fastavro decodes it (Python ints have no range), and
    ClickHouse's Avro parser refuses it."""
    version = current_manifest().latest("Step")
    wide = {**version.schema, "fields": [{**f, "type": "long"} if f["name"] == "t" else f
                                         for f in version.schema["fields"]]}
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(wide), {**step, "t": 2 ** 40})
    return b"\x00" + version.schema_id.to_bytes(4, "big") + body.getvalue()


def test_a_record_clickhouse_refuses_is_dead_lettered_with_its_words_and_the_batch_lands(broker, prefix, store):
    events = list(episodes(2, 20, seed=7, run_id="r"))
    steps = [e for e in events if e["envelope"]["event_type"] == "Step"]
    bad_step = {**steps[0], "envelope": {**steps[0]["envelope"], "event_id": "out-of-range"}}
    bad = out_of_range_step(bad_step)
    assert CODEC.decode(bad)["t"] == 2 ** 40  # Python accepts it
    topic = f"{prefix}rollout.steps"
    key = steps[0]["episode_id"].encode()
    publish_raw(broker, topic, key, [CODEC.encode(s) for s in steps[:10]] + [bad]
                + [CODEC.encode(s) for s in steps[10:20]])
    publish(broker, prefix, [e for e in events if e["envelope"]["event_type"] != "Step"] + steps[20:])

    assert drain(store, broker, prefix).dead_lettered == 1
    counts = table_counts(store)
    assert (counts["rollout_steps"], counts["rollout_episodes"]) == (40, 4)
    (reason, original), = dead_letters(store)
    assert original == bad
    assert reason.startswith("ClickHouse refused it for rollout_steps: ")
    assert "Value out of range for Avro int: 1099511627776" in reason and reason.endswith("(code 1001 STD_EXCEPTION)")
    assert store.database not in reason and "_staging_" not in reason and "(version" not in reason

    # ... and the pipeline carries on: the same group takes the next messages.
    publish(broker, prefix, episodes(1, 5, seed=8, run_id="r"))
    drain(store, broker, prefix)
    assert table_counts(store)["rollout_steps"] == 45


def test_the_live_sink_logs_consumer_errors_and_takes_topics_created_later(broker, store, caplog):
    prefix = f"t{uuid.uuid4().hex[:10]}."  # no topics yet
    sink = make_sink(store, broker, prefix, **{"topic.metadata.refresh.interval.ms": 1000})
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="consumers.evidence.sink"):
        worker = threading.Thread(target=sink.run, args=(stop,))
        worker.start()
        try:
            deadline = time.monotonic() + 30
            while sink.totals.consumer_errors == 0 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert sink.totals.consumer_errors > 0
            ensure_topics(broker, prefix)
            publish(broker, prefix, episodes(2, 5, seed=9, run_id="r"))
            deadline = time.monotonic() + 60
            while sink.totals.stored < 14 and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            stop.set()
            worker.join(60)
    assert not worker.is_alive()
    assert sink.totals.stored == 14 and sink.totals.dead_lettered == 0
    assert any("UNKNOWN_TOPIC_OR_PART" in r.getMessage() and prefix in r.getMessage() for r in caplog.records)
    assert table_counts(store)["dead_letters"] == 0


def test_replay_on_missing_topics_fails_at_once_naming_them_and_drops_nothing(broker, store):
    prefix = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(broker, prefix, tuple(t for t in BY_NAME.values() if t.name != "benchmark.cycles"))
    target = store.with_database(store.database + "_rebuild")
    target.command("CREATE DATABASE {database}")
    target.command("CREATE TABLE {database}.earlier (x Int32) ENGINE = Memory")
    try:
        started = time.monotonic()
        with pytest.raises(ReplayError) as caught:
            rebuild(store, lambda group: Consumer(consumer_config(broker, group, SESSION_MS)), CODEC, prefix,
                    target.database, broker=broker, timeout_s=10)
        assert time.monotonic() - started < 15
        message = str(caught.value)
        assert "\n" not in message
        assert f"topic {prefix}benchmark.cycles does not exist on broker {broker}" in message
        assert target.query("EXISTS TABLE {database}.earlier") == [(1,)]
    finally:
        target.command("DROP DATABASE IF EXISTS {database}")


def test_replay_from_an_unreachable_broker_fails_within_its_timeout(store):
    broker = "127.0.0.1:9"  # discard port: nothing listens
    started = time.monotonic()
    with pytest.raises(ReplayError, match=f"cannot list the topics on broker {broker} within 3 s"):
        rebuild(store, lambda group: Consumer(consumer_config(broker, group, SESSION_MS)), CODEC, "x.",
                store.database + "_rebuild", broker=broker, timeout_s=3)
    assert time.monotonic() - started < 10


def test_the_checks_hold_through_the_store_owner_endpoint(broker, prefix, store):
    """`sepa-eval sink` beside a running pipeline reaches the store through its endpoint."""
    from consumers.evidence.endpoint import RemoteStore, serve

    server = serve(store)
    try:
        remote = RemoteStore(f"http://127.0.0.1:{server.server_port}", store.database)
        first = ended_episode(31)
        publish(broker, prefix, [first, first, flipped(first)])
        totals = drain(remote, broker, prefix)
        assert (totals.duplicates, totals.conflicts) == (1, 1)
        assert len(raw_rows(store, "rollout_episodes", first["envelope"]["event_id"])) == 1
        assert len(dead_letters(store)) == 1
    finally:
        server.shutdown()
