"""ContiguousConsumer on real brokers (infra/offset_holes.py).

Apache Kafka makes holes that never fill: a committed transaction's marker takes an offset that a
read_committed consumer never sees. The consumer reads the partition again from each hole until
its wait is over, then reads past it, delivering every record once and in order. On Tansu, several
producers and a live consumer in a group: every message, none twice (the race that made Tansu's
holes is timing-dependent, so this one checks that nothing is lost or doubled, whatever happens)."""

from __future__ import annotations

import logging
import multiprocessing
import time
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.kafka_clients import consumer_config, make_consumer, producer_config
from infra.offset_holes import ContiguousConsumer, Holes


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"holes-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the result: its futures die with it
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result()
    return name


def _read(consumer, wanted: int, timeout_s: float = 60.0) -> list:
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < wanted and time.monotonic() < deadline:
        got += [m for m in consumer.consume(100, 0.2) if m.error() is None]
    return got


@pytest.mark.kafka
def test_holes_that_never_fill_are_waited_for_then_read_past_once_each(apache_kafka, caplog):
    topic = _topic(apache_kafka, 1)
    producer = Producer({"bootstrap.servers": apache_kafka, "transactional.id": f"holes-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    for txn in range(3):  # offsets 0-2, marker 3, 4-6, marker 7, 8-10, marker 11
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic, value=f"{txn}-{i}".encode())
        producer.commit_transaction(30)
    consumer = ContiguousConsumer(consumer_config(apache_kafka, f"g-{uuid.uuid4().hex[:8]}", 6000),
                                  Holes(wait_s=0.5))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        with caplog.at_level(logging.WARNING, logger="infra.offset_holes"):
            got = _read(consumer, 9)
            got += _read(consumer, 1, timeout_s=2.0)  # nothing more, and nothing twice
    finally:
        consumer.close()
    assert [m.offset() for m in got] == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    assert [m.value().decode() for m in got] == [f"{t}-{i}" for t in range(3) for i in range(3)]
    given_up = [r.getMessage() for r in caplog.records if "never arrived" in r.getMessage()]
    assert len(given_up) == 2 and f"{topic}[0]: offsets 3 to 3" in given_up[0], given_up


def _produce(bootstrap: str, topic: str, producer_id: int, n: int) -> None:
    producer = Producer(producer_config(bootstrap, **{"linger.ms": 1}))
    for k in range(n):
        producer.produce(topic, key=f"{producer_id}-{k // 50}".encode(), value=f"{producer_id}:{k}".encode())
        if k % 20 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def test_a_live_consumer_gets_every_message_of_concurrent_producers_once(tansu):
    topic, producers, per_producer = _topic(tansu, 4), 4, 5000
    # the consumer joins within seconds and reads at the tail while they write
    writers = [multiprocessing.get_context("spawn").Process(target=_produce, args=(tansu, topic, i, per_producer))
               for i in range(producers)]
    for w in writers:
        w.start()
    consumer = make_consumer(tansu, f"g-{uuid.uuid4().hex[:8]}", 6000)
    try:
        consumer.subscribe([topic])
        got = _read(consumer, producers * per_producer, timeout_s=180.0)
        for w in writers:
            w.join(60)
        got += _read(consumer, 1, timeout_s=2.0)
    finally:
        consumer.close()
    values = [m.value().decode() for m in got]
    assert len(values) == len(set(values)), "a message delivered twice"
    assert set(values) == {f"{i}:{k}" for i in range(producers) for k in range(per_producer)}
