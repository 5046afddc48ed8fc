"""The evidence sink against real brokers and a real chDB store."""

import time

from confluent_kafka import Consumer, Producer
from marks import slow_on_kafka
from sinks import SESSION_MS, drain, rebuild_from

from consumers.replay import compare, republish
from consumers.state import derived_state, state_digest, table_counts
from infra.kafka_clients import consumer_config, make_producer
from producers.publisher import Publisher
from producers.synthetic import episodes
from schemas.catalog import TOPICS
from schemas.codec import Codec
from schemas.events import make_event


def publish(broker, prefix, events) -> Publisher:
    publisher = Publisher(make_producer(broker), prefix)
    for event in events:
        publisher.publish(event)
    publisher.flush()
    return publisher


def test_garbage_and_invalid_records_are_dead_lettered_and_neighbours_stored(broker, prefix, store):
    codec = Codec()
    good = list(episodes(2, 10, seed=1, run_id="r"))
    steps = [e for e in good if e["envelope"]["event_type"] == "Step"]
    truncated = codec.encode(steps[0])[:-15]
    wrong_topic = codec.encode(make_event("Promoted", ("s",), "t", "r", scenario_id="s", reason="x",
                                          evidence_event_ids=[], gate_version="1"))
    producer = Producer({"bootstrap.servers": broker})
    topic = f"{prefix}rollout.steps"
    # All on one key so they share a partition and interleave with valid steps of that episode.
    key = steps[0]["episode_id"].encode()
    producer.produce(topic, key=key, value=codec.encode(steps[1]))
    producer.produce(topic, key=key, value=b"\xde\xad\xbe\xef garbage")
    producer.produce(topic, key=key, value=truncated)
    producer.produce(topic, key=key, value=wrong_topic)
    producer.produce(topic, key=key, value=codec.encode(steps[2]))
    producer.flush()
    publish(broker, prefix, good)

    drain(store, broker, prefix)

    counts = table_counts(store)
    assert counts["rollout_steps"] == 20
    assert counts["rollout_episodes"] == 4
    reasons = sorted(r[0] for r in store.query("SELECT reason FROM {database}.dead_letters FINAL"))
    assert len(reasons) == 3
    assert any("magic byte" in r for r in reasons)
    assert any("does not belong on topic rollout.steps" in r for r in reasons)
    assert any("Step" in r and ("undecodable" in r or "trailing" in r) for r in reasons)
    originals = store.query("SELECT original, source_topic FROM {database}.dead_letters FINAL",
                            column_formats={"original": "bytes"})
    assert (b"\xde\xad\xbe\xef garbage", topic) in [(bytes(o), t) for o, t in originals]


def test_redelivered_events_count_once(broker, prefix, store):
    events = list(episodes(3, 20, seed=2, run_id="r"))
    publish(broker, prefix, events)
    publish(broker, prefix, events)  # a producer retrying everything
    drain(store, broker, prefix)
    assert table_counts(store)["rollout_steps"] == 60
    raw = store.query("SELECT count() FROM {database}.rollout_steps")[0][0]
    assert raw == 60  # the copies were recognised at insert, not only collapsed by FINAL
    assert table_counts(store)["dead_letters"] == 0


@slow_on_kafka
def test_replay_into_an_empty_store_gives_the_same_digest(broker, prefix, store):
    publish(broker, prefix, episodes(20, 30, seed=3, run_id="r"))
    drain(store, broker, prefix)
    rebuilt = rebuild_from(store, broker, prefix, store.database + "_rebuild")
    try:
        before, after, differences = compare(store, rebuilt)
        assert differences == {} and before == after
        # The digest can fail: one extra event in the rebuilt store changes it.
        publish(broker, prefix, episodes(1, 1, seed=99, run_id="extra"))
        drain(rebuilt, broker, prefix)
        assert state_digest(derived_state(rebuilt)) != before
    finally:
        rebuilt.command("DROP DATABASE IF EXISTS {database}")


def test_republish_then_rebuild_reproduces_the_store(broker, prefix, store):
    publish(broker, prefix, episodes(5, 10, seed=4, run_id="r"))
    producer = Producer({"bootstrap.servers": broker})
    producer.produce(f"{prefix}rollout.episodes", value=b"junk")
    producer.flush()
    drain(store, broker, prefix)
    fresh = prefix.rstrip(".") + "x."
    from infra.kafka_clients import ensure_topics

    ensure_topics(broker, fresh)
    counts = republish(store, Publisher(make_producer(broker), fresh))
    assert counts["rollout.steps"] == 50 and counts["deadletter"] == 1
    rebuilt = rebuild_from(store, broker, fresh, store.database + "_re")
    try:
        assert compare(store, rebuilt)[2] == {}
    finally:
        rebuilt.command("DROP DATABASE IF EXISTS {database}")


def test_an_idle_sink_waits_for_the_partitions_a_silent_member_holds(broker, prefix, store):
    """A sink restarted beside its killed predecessor (a member until its session times out) holds
    part of the partitions at first; `--until-idle` must not end before it has stored them all."""
    events = list(episodes(20, 5, seed=3, run_id="r"))
    publish(broker, prefix, events)
    # The silent member: joins the sink's group, takes every partition, and never reads or
    # commits again; it leaves the group only when its poll interval runs out.
    silent = Consumer(consumer_config(broker, f"sink-{prefix}", SESSION_MS,
                                      **{"max.poll.interval.ms": SESSION_MS + 2000}))
    assigned = []
    silent.subscribe([t.full_name(prefix) for t in TOPICS], on_assign=lambda c, parts: assigned.extend(parts))
    deadline = time.monotonic() + 60
    while not assigned and time.monotonic() < deadline:
        silent.poll(0.2)
    assert assigned, "the silent member never joined"
    try:
        drain(store, broker, prefix, idle_exit_s=2.0)
    finally:
        silent.close()

    counts = table_counts(store)
    assert counts["rollout_steps"] == 100
    assert counts["rollout_episodes"] == 40
