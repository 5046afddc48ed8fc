"""A dead letter's reason is a function of the message's bytes: the evidence sink (its fast check
and its fallback decode) and the stream processors' Intake give the same malformed message the
same reason, run after run, with no memory addresses or run-specific names in it."""

from __future__ import annotations

import threading

from confluent_kafka import Consumer, Producer

from consumers.evidence.sink import EvidenceSink
from infra.kafka_clients import consumer_config, make_producer
from producers.publisher import Publisher
from producers.synthetic import episodes
from schemas.catalog import BY_NAME
from schemas.codec import Codec
from schemas.events import make_event
from streams.deadletter import Intake, RawMessage

SESSION_MS = 6000


def malformed(codec: Codec, step: dict) -> dict[str, bytes]:
    good = codec.encode(step)
    promoted = make_event("Promoted", ("s",), "gate", "r", scenario_id="s", reason="x", evidence_event_ids=[],
                          gate_version="1")
    said_type = good.replace(b"\x08Step", b"\x08Stop", 1)
    assert said_type != good
    return {
        "short": good[:3],
        "bad magic": b"\xde\xad\xbe\xef garbage",
        "unknown schema id": b"\x00" + (4242).to_bytes(4, "big") + good[5:],
        "truncated body": good[:-15],
        "truncated mid-array": good[:len(good) // 2],
        "trailing bytes": good + b"\x00\x01",
        "wrong event type for the topic": codec.encode(promoted),
        "envelope says another type": said_type,
        "empty event id": codec.encode({**step, "envelope": {**step["envelope"], "event_id": ""}}),
    }


def sink_reasons(store, broker, prefix, producer) -> tuple[dict[bytes, str], list[str]]:
    """Run a sink with a fresh group; returns (original bytes -> stored reason, its own verdicts)."""
    consumer = Consumer(consumer_config(broker, f"reasons-{store.database}", SESSION_MS))
    sink = EvidenceSink(store, consumer, producer, Codec(), prefix)
    totals = sink.run(threading.Event(), idle_exit_s=3.0)
    assert totals.conflicts == 0  # a verdict that differed from an earlier one on the same message would be one
    rows = store.query("SELECT original, reason FROM {database}.dead_letters FINAL",
                       column_formats={"original": "bytes"})
    return {bytes(original): reason for original, reason in rows}, sorted(totals.reasons)


def test_the_same_bytes_get_the_same_reason_in_the_sink_and_in_the_intake(broker, prefix, store):
    codec = Codec()
    events = list(episodes(1, 4, seed=21, run_id="r"))
    steps = [e for e in events if e["envelope"]["event_type"] == "Step"]
    payloads = malformed(codec, steps[0])
    topic = f"{prefix}rollout.steps"
    producer = Producer({"bootstrap.servers": broker})
    for value in payloads.values():  # between valid steps of one episode, on one partition
        producer.produce(topic, key=steps[0]["episode_id"].encode(), value=value)
    producer.flush(30)
    publisher = Publisher(make_producer(broker), prefix, codec)
    for event in events:
        publisher.publish(event)
    publisher.flush()

    live, live_verdicts = sink_reasons(store, broker, prefix, make_producer(broker))
    again = store.with_database(store.database + "_again")
    again.command("CREATE DATABASE IF NOT EXISTS {database}")
    from consumers.evidence.store import migrate

    migrate(again)
    try:
        # A second sink, storing its own verdicts directly (as a replay does): the same reasons.
        second, second_verdicts = sink_reasons(again, broker, prefix, None)
    finally:
        again.command("DROP DATABASE IF EXISTS {database}")
    assert second_verdicts == live_verdicts and second == live

    expected = {BY_NAME["rollout.steps"].full_name(prefix): BY_NAME["rollout.steps"]}
    for name, value in payloads.items():
        intake_reasons = set()
        for _ in range(2):
            event, dead = Intake(Codec(), "failure-detector", "streams", expected).decode(
                RawMessage(topic, 0, 1, b"k", value))
            assert event is None, name
            intake_reasons.add(dead["reason"])
        assert intake_reasons == {live[value]}, name
        assert " at 0x" not in live[value] and prefix not in live[value], (name, live[value])
    assert live[payloads["bad magic"]] == "magic byte 222 is not the Confluent framing byte 0"
    assert "does not belong on topic rollout.steps" in live[payloads["wrong event type for the topic"]]
    assert "undecodable body" in live[payloads["truncated body"]]
    assert "trailing bytes" in live[payloads["trailing bytes"]]
    assert len(live) == len(payloads)
