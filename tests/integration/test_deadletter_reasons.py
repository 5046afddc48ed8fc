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


def raw_then_events(broker: str, prefix: str, codec: Codec, key: bytes, values: list[bytes], events: list[dict],
                    **producer_config) -> list:
    """The raw values on rollout.steps under ``key``, then the events; returns the raw values'
    delivery errors."""
    refused = []
    producer = Producer({"bootstrap.servers": broker, **producer_config})
    for value in values:  # before valid steps of the same episode, on one partition
        producer.produce(f"{prefix}rollout.steps", key=key, value=value,
                         on_delivery=lambda err, msg: refused.append(err) if err else None)
    producer.flush(60)
    publisher = Publisher(make_producer(broker), prefix, codec)
    for event in events:
        publisher.publish(event)
    publisher.flush()
    return refused


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
    raw_then_events(broker, prefix, codec, steps[0]["episode_id"].encode(), list(payloads.values()), events)

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


def test_a_value_of_any_size_is_dead_lettered_and_the_sink_goes_on(broker, prefix, store, request):
    """A 10 MB value: Apache Kafka refuses it (every topic is created with max.message.bytes at
    MAX_MESSAGE_BYTES); Tansu takes it, and then the sink dead-letters it by size, keeping an
    excerpt with the size and hash (a dead letter of the whole value could not be sent, and the sink
    used to restart on it forever), and stores the events after it. The stream processors' Intake
    gives the same reason."""
    import hashlib

    from schemas.catalog import DEAD_LETTER_EXCERPT_BYTES, MAX_MESSAGE_BYTES

    codec = Codec()
    events = list(episodes(1, 4, seed=22, run_id="r"))
    steps = [e for e in events if e["envelope"]["event_type"] == "Step"]
    huge = codec.encode(steps[0])[:5] + bytes(range(256)) * (40 * 1024)  # a framed header, 10 MiB
    topic = f"{prefix}rollout.steps"
    refused = raw_then_events(broker, prefix, codec, steps[0]["episode_id"].encode(), [huge], events,
                              **{"message.max.bytes": 20_000_000, "log_level": 0})

    reasons, _ = sink_reasons(store, broker, prefix, make_producer(broker))
    stored = store.query("SELECT count() FROM {database}.rollout_steps FINAL")[0][0]
    assert stored == len(steps), "the events after the huge value were stored"
    if "kafka" in request.node.callspec.id:
        assert refused and refused[0].name() in ("MSG_SIZE_TOO_LARGE", "RECORD_TOO_LARGE"), refused
        assert reasons == {}
        return
    assert not refused, "Tansu takes any size: the consumers must cope"
    [(original, reason)] = reasons.items()
    assert original == huge[:DEAD_LETTER_EXCERPT_BYTES]
    said = f"message of {len(huge)} bytes is over the {MAX_MESSAGE_BYTES}-byte limit of every topic"
    assert reason == f"{said} [value of {len(huge)} bytes, sha256 {hashlib.sha256(huge).hexdigest()}; its first " \
                     f"{DEAD_LETTER_EXCERPT_BYTES} bytes kept]"
    expected = {BY_NAME["rollout.steps"].full_name(prefix): BY_NAME["rollout.steps"]}
    _, dead = Intake(Codec(), "failure-detector", "streams", expected).decode(RawMessage(topic, 0, 1, b"k", huge))
    assert dead["reason"] == reason and dead["original"] == original
    assert len(Codec().encode(dead)) < MAX_MESSAGE_BYTES
