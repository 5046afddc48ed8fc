"""Consumer lag per group: committed offsets against the end of each partition.

The end comes from the high watermark of a Fetch reply, not from ListOffsets: Tansu under-reports
ListOffsets "latest" when the last batch holds several records (the same trick as
infra.kafka_clients.topic_message_counts). Committed offsets come from OffsetFetch (AdminClient),
groups from ListGroups; both work against Tansu and Apache Kafka.

A group's lag covers the topics it has committed on: every partition of such a topic counts, a
partition it never committed on from its low watermark (everything there is still unread).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from infra.exceptions import BrokerError
from infra.kafka_clients import QUIET

# Groups this module (and topic_message_counts) use for their own reads: never reported.
OWN_GROUPS = ("sepa-eval-counts", "sepa-eval-lag")


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None  # None: the group never committed here
    low: int  # low watermark (the first offset retained)
    end: int  # high watermark (the next offset to be written)

    @property
    def lag(self) -> int:
        return max(0, self.end - (self.low if self.committed is None else max(self.committed, self.low)))


@dataclass(frozen=True)
class GroupLag:
    group: str
    partitions: tuple[PartitionLag, ...]

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)

    def by_topic(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.partitions:
            out[p.topic] = out.get(p.topic, 0) + p.lag
        return out


def partition_watermarks(bootstrap: str, topics: list[str],
                         timeout: float = 10.0) -> dict[tuple[str, int], tuple[int, int]]:
    """(low, high) watermark per partition of the given topics that exist, high from a Fetch reply."""
    admin = AdminClient({**QUIET, "bootstrap.servers": bootstrap})
    try:
        metadata = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise BrokerError(f"cannot read topic metadata from {bootstrap}: {exc}") from exc
    partitions = [TopicPartition(t, p, -2) for t in topics if t in metadata for p in metadata[t].partitions]
    if not partitions:
        return {}
    consumer = Consumer({**QUIET, "bootstrap.servers": bootstrap, "group.id": "sepa-eval-lag",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 50, "fetch.max.bytes": 1024 * 1024})
    out: dict[tuple[str, int], tuple[int, int]] = {}
    try:
        consumer.assign(partitions)
        pending = {(tp.topic, tp.partition) for tp in partitions}
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=len(partitions), timeout=0.2):
                key = (msg.topic(), msg.partition())
                if key in pending:
                    consumer.pause([TopicPartition(*key)])
                    pending.discard(key)
            for key in list(pending):
                low, high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
                if high >= 0 and low >= 0 and high == low:
                    pending.discard(key)  # an empty partition never returns a message
        for tp in partitions:
            key = (tp.topic, tp.partition)
            low, high = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
            if high < 0:
                low, high = consumer.get_watermark_offsets(TopicPartition(*key), timeout=timeout)
            out[key] = (max(low, 0), max(high, 0))
    finally:
        consumer.close()
    return out


def consumer_groups(bootstrap: str, timeout: float = 10.0) -> list[str]:
    admin = AdminClient({**QUIET, "bootstrap.servers": bootstrap})
    try:
        listed = admin.list_consumer_groups(request_timeout=timeout).result()
    except KafkaException as exc:
        raise BrokerError(f"cannot list consumer groups on {bootstrap}: {exc}") from exc
    return sorted(g.group_id for g in listed.valid if g.group_id not in OWN_GROUPS)


def committed_offsets(bootstrap: str, group: str, timeout: float = 10.0) -> dict[tuple[str, int], int]:
    """The group's committed offset on every partition it committed on."""
    admin = AdminClient({**QUIET, "bootstrap.servers": bootstrap})
    try:
        futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)], request_timeout=timeout)
        result = futures[group].result()
    except KafkaException as exc:
        raise BrokerError(f"cannot read the committed offsets of group {group} on {bootstrap}: {exc}") from exc
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions if tp.offset >= 0}


def consumer_lag(bootstrap: str, groups: list[str] | None = None, topic_prefix: str | None = None,
                 timeout: float = 10.0) -> list[GroupLag]:
    """Lag of each group (every group on the broker when None) on the topics it committed on;
    with topic_prefix, only topics under that prefix."""
    committed = {g: committed_offsets(bootstrap, g, timeout)
                 for g in (groups if groups is not None else consumer_groups(bootstrap, timeout))}
    topics = sorted({t for offsets in committed.values() for t, _ in offsets
                     if topic_prefix is None or t.startswith(topic_prefix)})
    marks = partition_watermarks(bootstrap, topics, timeout) if topics else {}
    out = []
    for group, offsets in sorted(committed.items()):
        mine = {t for t, _ in offsets if t in topics}
        parts = tuple(PartitionLag(t, p, offsets.get((t, p)), low, high)
                      for (t, p), (low, high) in sorted(marks.items()) if t in mine)
        out.append(GroupLag(group, parts))
    return out
