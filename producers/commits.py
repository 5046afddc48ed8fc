"""Committing a consumer's offsets when its group may have moved on without it.

    committer = Committer(consumer)
    committer.commit([TopicPartition(topic, partition, offset + 1)])
    ...
    msg = consumer.poll(0.5)
    committer.retry()  # what the group refused, once more, for the partitions still held

A broker bounce (the group coordinator fails over) or a long pause makes the group forget a member:
the commit fails with UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION or REBALANCE_IN_PROGRESS. The work was
done and its events published and acknowledged; whoever holds the partition next gets the message
again and redoes it into the same events, which the evidence log counts once. So the worker logs it
and goes on (its next poll rejoins the group) instead of dying with the work done. A coordinator on
the move (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, any retriable error) is asked again for a while.

When the rebalance gives the partition back to the same member (cooperative-sticky keeps a
member's partitions, and its position with them), nobody reads that message again: the refused
offset would stay uncommitted until the partition's next message, and on a partition with no next
message the group's lag would never reach zero (a farm's "is it done?" would wait for ever).
Committer keeps what was refused and commits it again after the next poll, for the partitions the
consumer still holds; a partition that went elsewhere is forgotten (its new holder redoes it).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

log = logging.getLogger(__name__)

GROUP_MOVED_ON = frozenset({KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION,
                            KafkaError.REBALANCE_IN_PROGRESS, KafkaError._ASSIGNMENT_LOST})
COORDINATOR_MOVING = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                                KafkaError.COORDINATOR_LOAD_IN_PROGRESS})
RETRY_S = 60.0


def commit(consumer: Consumer, offsets: list[TopicPartition], retry_s: float = RETRY_S) -> bool:
    """Commits synchronously; False (logged) when the group had moved on, re-raises what is not a
    group's or coordinator's doing, or a coordinator still moving after ``retry_s``."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
            return True
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() in GROUP_MOVED_ON:
                log.warning("commit of %s not taken (%s): the group moved on; committed again if this member "
                            "still holds the partition, else its new holder redoes it into the same events",
                            _where(offsets), error.name())
                return False
            if (error.code() in COORDINATOR_MOVING or error.retriable()) and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise


def _where(offsets: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in offsets)


class Committer:
    """commit(), remembering the offsets the group refused until ``retry`` commits them again."""

    def __init__(self, consumer: Consumer, retry_s: float = RETRY_S):
        self.consumer, self.retry_s = consumer, retry_s
        self.refused: dict[tuple[str, int], TopicPartition] = {}

    def commit(self, offsets: list[TopicPartition]) -> bool:
        taken = commit(self.consumer, offsets, self.retry_s)
        for tp in offsets:
            if taken:
                self.refused.pop((tp.topic, tp.partition), None)
            else:
                self.refused[(tp.topic, tp.partition)] = tp
        return taken

    def retry(self) -> None:
        """After a poll (which serves the rebalance): commits again what was refused on the partitions
        this consumer still holds, and forgets the others."""
        if not self.refused:
            return
        held = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        again = [tp for key, tp in self.refused.items() if key in held]
        self.refused.clear()
        if again and self.commit(again):
            log.info("commit of %s taken on retry", _where(again))
