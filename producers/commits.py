"""Committing a consumer's offsets when its group may have moved on without it.

    from producers.commits import commit
    commit(consumer, [TopicPartition(topic, partition, offset + 1)])

A broker bounce (the group coordinator fails over) or a long pause makes the group forget a member:
the commit fails with UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION or REBALANCE_IN_PROGRESS. The work was
done and its events published and acknowledged; whoever holds the partition next gets the message
again and redoes it into the same events, which the evidence log counts once. So the worker logs it
and goes on (its next poll rejoins the group) instead of dying with the work done. A coordinator on
the move (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, any retriable error) is asked again for a while.
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
                log.warning("commit of %s not taken (%s): the group moved on; whoever holds the partition now "
                            "gets it again, and its events are counted once", _where(offsets), error.name())
                return False
            if (error.code() in COORDINATOR_MOVING or error.retriable()) and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise


def _where(offsets: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in offsets)
