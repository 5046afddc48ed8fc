"""The Apache Kafka test broker (infra/apache_kafka.py) against the clients the project uses.

The broker is a real Kafka 4.x node, which no longer speaks old protocol versions, so these tests
check each client path we depend on: confluent-kafka idempotent and transactional producers and
group consumers, and aiokafka (what faust runs on) as producer and group consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.apache_kafka import ApacheKafkaBroker
from infra.exceptions import KafkaLauncherError

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]

PARTITIONS = 3


def _new_topic(bootstrap: str, partitions: int = PARTITIONS) -> str:
    topic = f"test-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[
        topic
    ].result(timeout=30)
    # CreateTopics returns once the controller has the topic; the broker answers metadata for it
    # once it has applied that record, a moment later on a loaded machine.
    deadline = time.monotonic() + 30
    while len(admin.list_topics(topic, timeout=10).topics[topic].partitions) != partitions:
        assert time.monotonic() < deadline, f"{topic} has not {partitions} partitions after 30 s"
        time.sleep(0.2)
    return topic


def _produce(bootstrap: str, topic: str, records: list[tuple[str, str]], **config) -> dict[str, set[int]]:
    """Produce (key, value) records; return the partitions each key was written to."""
    errors: list[KafkaError] = []
    partitions_by_key: dict[str, set[int]] = defaultdict(set)

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(error)
        else:
            partitions_by_key[message.key().decode()].add(message.partition())

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **config})
    for key, value in records:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(30) == 0, "messages still queued after 30 s"
    assert errors == []
    return partitions_by_key


def _consume(bootstrap: str, topic: str, group: str, expected: int, **config) -> list[Message]:
    """Read in a consumer group until `expected` messages arrived (or 60 s), then commit them."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        **config,
    })
    messages: list[Message] = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(messages) < expected and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=1):
                assert message.error() is None, message.error()
                messages.append(message)
        # Linger briefly: a broker that delivers duplicates or extra records shows it here.
        messages.extend(m for m in consumer.consume(num_messages=500, timeout=1) if m.error() is None)
        if messages:
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return messages


def _committed(bootstrap: str, topic: str, group: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return [tp.offset for tp in consumer.committed(partitions, timeout=10)]
    finally:
        consumer.close()


def _values_by_key(messages: list[Message]) -> dict[str, list[str]]:
    by_key: dict[str, list[str]] = defaultdict(list)
    for message in messages:
        by_key[message.key().decode()].append(message.value().decode())
    return by_key


def test_keyed_messages_come_back_complete_and_in_key_order(apache_kafka: str) -> None:
    topic = _new_topic(apache_kafka)
    keys = [f"robot-{n:02d}" for n in range(25)]
    # Keys interleaved, so per-key order is only kept if the broker and both clients keep it.
    records = [(key, f"{key}/{seq:03d}") for seq in range(40) for key in keys]
    assert len(records) == 1000

    partitions_by_key = _produce(apache_kafka, topic, records)
    assert all(len(partitions) == 1 for partitions in partitions_by_key.values())
    assert set().union(*partitions_by_key.values()) == set(range(PARTITIONS))

    group = f"group-{topic}"
    messages = _consume(apache_kafka, topic, group, expected=1000)

    assert len(messages) == 1000
    assert len({(m.partition(), m.offset()) for m in messages}) == 1000, "duplicates"
    by_key = _values_by_key(messages)
    assert sorted(by_key) == keys
    for key, values in by_key.items():
        assert values == [f"{key}/{seq:03d}" for seq in range(40)], f"{key} out of order"
    for message in messages:
        assert {message.partition()} == partitions_by_key[message.key().decode()]

    per_partition = defaultdict(int)
    for message in messages:
        per_partition[message.partition()] += 1
    assert _committed(apache_kafka, topic, group) == [per_partition[p] for p in range(PARTITIONS)]


def test_aiokafka_consumes_in_a_group(apache_kafka: str) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTopicPartition

    topic = _new_topic(apache_kafka)
    keys = [f"run-{n}" for n in range(10)]
    _produce(apache_kafka, topic, [(key, f"{key}/{seq:03d}") for seq in range(30) for key in keys])
    group = f"aio-{topic}"

    async def consume() -> tuple[list, list[int]]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=apache_kafka, group_id=group,
            auto_offset_reset="earliest", enable_auto_commit=False,
        )
        await consumer.start()
        try:
            records: list = []
            deadline = time.monotonic() + 60
            while len(records) < 300 and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=1000)).values():
                    records.extend(batch)
            await consumer.commit()
            committed = [
                await consumer.committed(AioTopicPartition(topic, p)) for p in range(PARTITIONS)
            ]
            return records, committed
        finally:
            await consumer.stop()

    records, committed = asyncio.run(consume())

    assert len(records) == 300
    by_key: dict[str, list[str]] = defaultdict(list)
    for record in records:
        by_key[record.key.decode()].append(record.value.decode())
    assert sorted(by_key) == keys
    for key, values in by_key.items():
        assert values == [f"{key}/{seq:03d}" for seq in range(30)], f"{key} out of order"
    assert sum(committed) == 300
    assert _committed(apache_kafka, topic, group) == committed


def test_aiokafka_idempotent_producer_writes_what_confluent_reads(apache_kafka: str) -> None:
    from aiokafka import AIOKafkaProducer

    topic = _new_topic(apache_kafka)

    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=apache_kafka, enable_idempotence=True)
        await producer.start()
        try:
            for seq in range(50):
                await producer.send(topic, key=b"episode-1", value=f"{seq:03d}".encode())
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(produce())
    messages = _consume(apache_kafka, topic, f"group-{topic}", expected=50)
    assert [m.value().decode() for m in messages] == [f"{seq:03d}" for seq in range(50)]


def test_transactional_producer_commits_and_aborts(apache_kafka: str) -> None:
    topic = _new_topic(apache_kafka)
    producer = Producer({"bootstrap.servers": apache_kafka, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    for batch, outcome in (("a", "commit"), ("b", "abort"), ("c", "commit")):
        producer.begin_transaction()
        for seq in range(10):
            producer.produce(topic, key=batch, value=f"{batch}{seq}")
        if outcome == "commit":
            producer.commit_transaction(30)
        else:
            producer.flush(30)  # make sure the aborted records really reached the log
            producer.abort_transaction(30)

    committed = _consume(apache_kafka, topic, f"rc-{topic}", expected=20,
                         **{"isolation.level": "read_committed"})
    everything = _consume(apache_kafka, topic, f"ru-{topic}", expected=30,
                          **{"isolation.level": "read_uncommitted"})

    assert sorted(m.value().decode() for m in committed) == sorted(
        f"{batch}{seq}" for batch in "ac" for seq in range(10)
    )
    assert len(everything) == 30, "aborted records were never written, so the abort proved nothing"


def test_killed_broker_restarts_at_the_same_address_with_its_data(tmp_path: Path) -> None:
    broker = ApacheKafkaBroker(tmp_path, heap_mb=256)
    try:
        bootstrap = broker.start()
        with _log_on_failure(broker):
            _kill_and_restart(broker, bootstrap)
    finally:
        broker.stop()
    assert broker.log_path.read_text().count("Kafka Server started") == 2


@contextlib.contextmanager
def _log_on_failure(broker: ApacheKafkaBroker):
    """A failure here once showed only a client's view (the broker gone a second after it was
    ready): say whether the JVM still runs and what it logged."""
    try:
        yield
    except AssertionError as error:
        raise AssertionError(f"{error}\n{broker.describe()}") from error


def _kill_and_restart(broker: ApacheKafkaBroker, bootstrap: str) -> None:
    topic = _new_topic(bootstrap)
    _produce(bootstrap, topic, [(f"k{n % 7}", str(n)) for n in range(100)], acks="all")
    group = f"group-{topic}"
    assert len(_consume(bootstrap, topic, group, expected=100)) == 100
    committed_before = _committed(bootstrap, topic, group)

    broker.kill()
    assert broker.start() == bootstrap

    assert _committed(bootstrap, topic, group) == committed_before
    again = _consume(bootstrap, topic, f"second-{topic}", expected=100)
    assert sorted(int(m.value()) for m in again) == list(range(100))


def test_broker_that_cannot_start_raises_with_its_log(tmp_path: Path) -> None:
    broker = ApacheKafkaBroker(tmp_path, heap_mb=1)  # the JVM refuses a 1 MiB heap
    with pytest.raises(KafkaLauncherError, match="Too small maximum heap"):
        broker.start(timeout=30)
    assert broker.pid is not None
    with pytest.raises(KafkaLauncherError):
        broker.start(timeout=30)
