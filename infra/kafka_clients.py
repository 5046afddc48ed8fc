"""Kafka client configuration and topic administration, shared by every producer and consumer.

confluent-kafka (librdkafka) everywhere but the faust workers. The session timeout is short
because Tansu joins a group in about max(1 s, session.timeout / 2). The edge (infra/) builds the
clients from these configs, and the one codec (``make_codec``), and hands them, or the configs, to
the code below it.

librdkafka retries an unreachable broker forever and logs each attempt to stderr, so a command
first asks the broker (``require_broker``) and stops with one line naming it when it does not answer.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.exceptions import BrokerError, BrokerUnreachable
from infra.offset_holes import ContiguousConsumer
from infra.settings import Settings
from schemas.catalog import MAX_MESSAGE_BYTES, TOPICS, Topic
from schemas.codec import Codec
from schemas.registry import schema_ids_for


def make_codec(settings: Settings) -> Codec:
    """The codec every client of this process frames events with: a Schema Registry's ids when
    ``schema_registry_url`` is set, the manifest's otherwise. Built once per process, at the edge."""
    return Codec(schema_ids_for(settings.schema_registry_url))


def require_broker(bootstrap: str, timeout: float, where: str = "") -> None:
    """Raises BrokerUnreachable (one line, naming the broker and ``where`` it came from) unless
    the broker answers a metadata request within ``timeout`` seconds."""
    try:
        # log_level 0: a refused connection is the answer we are asking for, not stderr noise.
        AdminClient({**QUIET, "bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=timeout)
    except KafkaException as exc:
        source = f" ({where})" if where else ""
        raise BrokerUnreachable(f"the Kafka broker at {bootstrap}{source} did not answer within {timeout:g} s: "
                                f"{_reason(exc)}") from exc


def _reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if hasattr(error, "str") else str(exc)


# librdkafka's own log lines (a closed connection at `down`, a purged queue) went to stderr beside
# our one-line errors: what matters reaches us as errors and delivery reports, which we report.
QUIET = {"log_level": 3, "log.connection.close": False}


def producer_config(bootstrap: str, **extra) -> dict:
    return {
        **QUIET,
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,  # acks=all and no duplicates from internal retries
        "linger.ms": 20,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 500000,
        "compression.type": "lz4",
        "message.max.bytes": MAX_MESSAGE_BYTES,  # what every topic takes (schemas/catalog.py)
        **extra,
    }


def consumer_config(bootstrap: str, group_id: str, session_timeout_ms: int, **extra) -> dict:
    return {
        **QUIET,
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


def make_consumer(bootstrap: str, group_id: str, session_timeout_ms: int, **extra) -> ContiguousConsumer:
    """A consumer of our topics, reading every partition without holes (infra/offset_holes.py says
    why the embedded broker needs it)."""
    return ContiguousConsumer(consumer_config(bootstrap, group_id, session_timeout_ms, **extra))


def ensure_topics(bootstrap: str, prefix: str, topics: tuple[Topic, ...] = TOPICS,
                  timeout: float = 15.0) -> list[str]:
    """Create the catalog's topics that do not exist yet; returns the names created."""
    admin = AdminClient({**QUIET, "bootstrap.servers": bootstrap, "log_level": 0})
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise BrokerUnreachable(f"the Kafka broker at {bootstrap} did not list its topics within {timeout:g} s: "
                                f"{_reason(exc)}") from exc
    # replication_factor -1: the broker's default.replication.factor (1 on a single broker; a
    # cluster sets it, with min.insync.replicas, for every topic it holds).
    wanted = [NewTopic(t.full_name(prefix), num_partitions=t.partitions, replication_factor=-1,
                       config={"retention.ms": str(t.retention_ms), "max.message.bytes": str(MAX_MESSAGE_BYTES)})
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


def group_members(bootstrap: str, group_id: str, timeout: float) -> list[str]:
    """Member ids of a consumer group; empty when the broker does not say (or the group has none)."""
    admin = AdminClient({**QUIET, "bootstrap.servers": bootstrap, "log_level": 0})
    try:
        description = admin.describe_consumer_groups([group_id], request_timeout=timeout)[group_id].result()
    except KafkaException:
        return []
    return [m.member_id for m in description.members]


def topic_message_counts(bootstrap: str, names: list[str], timeout: float = 10.0) -> dict[str, int]:
    """Messages retained per topic (high minus low watermark, summed over partitions).

    Tansu under-reports ListOffsets "latest" when the last batch holds several records, but the
    high watermark carried in a Fetch reply is right, so we fetch once per partition and read
    the cached watermarks.
    """
    admin = AdminClient({**QUIET, "bootstrap.servers": bootstrap, "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise BrokerUnreachable(f"the Kafka broker at {bootstrap} did not list its topics within {timeout:g} s: "
                                f"{_reason(exc)}") from exc
    partitions = [TopicPartition(name, p, -2) for name in names if name in metadata
                  for p in metadata[name].partitions]
    counts = {name: 0 for name in names if name in metadata}
    if not partitions:
        return counts
    consumer = Consumer({**QUIET, "bootstrap.servers": bootstrap, "group.id": "sepa-eval-counts",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    try:
        consumer.assign(partitions)
        seen: set[tuple[str, int]] = set()
        pending = {(tp.topic, tp.partition) for tp in partitions}
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
