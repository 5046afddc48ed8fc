"""Kafka client configuration and topic administration, shared by every producer and consumer.

confluent-kafka (librdkafka) everywhere but the faust workers. The session timeout is short
because Tansu joins a group in about max(1 s, session.timeout / 2).
"""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.exceptions import BrokerError
from schemas.catalog import TOPICS, Topic


def producer_config(bootstrap: str, **extra) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,  # acks=all and no duplicates from internal retries
        "linger.ms": 20,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 500000,
        "compression.type": "lz4",
        **extra,
    }


def consumer_config(bootstrap: str, group_id: str, session_timeout_ms: int, **extra) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,  # offsets are committed only after the work is stored
        "auto.offset.reset": "earliest",
        "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": max(300, session_timeout_ms // 6),
        "partition.assignment.strategy": "cooperative-sticky",
        "fetch.max.bytes": 52428800,
        "queued.max.messages.kbytes": 262144,
        **extra,
    }


def make_producer(bootstrap: str, **extra) -> Producer:
    return Producer(producer_config(bootstrap, **extra))


def ensure_topics(bootstrap: str, prefix: str, topics: tuple[Topic, ...] = TOPICS,
                  timeout: float = 15.0) -> list[str]:
    """Create the catalog's topics that do not exist yet; returns the names created."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = [NewTopic(t.full_name(prefix), num_partitions=t.partitions, replication_factor=1,
                       config={"retention.ms": str(t.retention_ms)})
              for t in topics if t.full_name(prefix) not in existing]
    if not wanted:
        return []
    created = []
    for name, future in admin.create_topics(wanted, request_timeout=timeout).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":  # a concurrent creator won the race
                raise BrokerError(f"could not create topic {name} on {bootstrap}: {exc}") from exc
    return created


def topic_message_counts(bootstrap: str, names: list[str], timeout: float = 10.0) -> dict[str, int]:
    """Messages retained per topic (high minus low watermark, summed over partitions).

    Tansu under-reports ListOffsets "latest" when the last batch holds several records, but the
    high watermark carried in a Fetch reply is right, so we fetch once per partition and read
    the cached watermarks.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=timeout).topics
    partitions = [TopicPartition(name, p, -2) for name in names if name in metadata
                  for p in metadata[name].partitions]
    counts = {name: 0 for name in names if name in metadata}
    if not partitions:
        return counts
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sepa-eval-counts",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    try:
        consumer.assign(partitions)
        seen: set[tuple[str, int]] = set()
        pending = {(tp.topic, tp.partition) for tp in partitions}
        import time

        deadline = time.monotonic() + timeout
        while pending - seen and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=len(partitions), timeout=0.2):
                seen.add((msg.topic(), msg.partition()))
                consumer.pause([TopicPartition(msg.topic(), msg.partition())])
            for topic, part in pending - seen:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, part), cached=True)
                if high >= 0 and low >= 0 and high == low:
                    seen.add((topic, part))  # an empty partition never returns a message
        for topic, part in pending:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, part), cached=True)
            if high < 0:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, part), timeout=timeout)
            counts[topic] += max(0, high - max(low, 0))
    finally:
        consumer.close()
    return counts
