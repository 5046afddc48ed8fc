"""producers.commits.commit: a commit the group refused because it moved on (a broker bounce, a
rebalance) is logged and the worker goes on; a coordinator on the move is asked again; any other
error is raised. (The real case, a 3-broker cluster losing the steps leader mid-run, is
tests/integration/test_kafka_cluster.py.)"""

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from producers.commits import Committer, commit

OFFSETS = [TopicPartition("sepa.rollout.requests", 0, 7)]


class Refusing:
    """A consumer whose commits fail with the given errors, then succeed."""

    def __init__(self, *codes: int):
        self.codes = list(codes)
        self.committed = []

    def commit(self, offsets, asynchronous):
        if self.codes:
            raise KafkaException(KafkaError(self.codes.pop(0)))
        self.committed.append(offsets)


def test_a_group_that_moved_on_is_logged_not_raised(caplog):
    consumer = Refusing(KafkaError.UNKNOWN_MEMBER_ID)
    assert commit(consumer, OFFSETS) is False
    assert "sepa.rollout.requests[0]@7 not taken (UNKNOWN_MEMBER_ID)" in caplog.text


def test_a_moving_coordinator_is_asked_again():
    consumer = Refusing(KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE)
    assert commit(consumer, OFFSETS, retry_s=10) is True and consumer.committed == [OFFSETS]


def test_other_errors_are_raised():
    with pytest.raises(KafkaException):
        commit(Refusing(KafkaError.TOPIC_AUTHORIZATION_FAILED), OFFSETS)


class Rebalanced(Refusing):
    """Refuses the first commit (the group moved on), then holds ``held`` after the rebalance."""

    def __init__(self, held):
        super().__init__(KafkaError.ILLEGAL_GENERATION)
        self.held = held

    def assignment(self):
        return self.held


def test_a_refused_offset_is_committed_again_while_the_partition_is_still_held():
    # cooperative-sticky gave the partition back to this member: nobody reads the message again,
    # so without the retry the group would never commit past it.
    consumer = Rebalanced([TopicPartition("sepa.rollout.requests", 0)])
    committer = Committer(consumer)
    assert committer.commit(OFFSETS) is False
    committer.retry()
    assert consumer.committed == [OFFSETS] and committer.refused == {}


def test_a_refused_offset_of_a_partition_that_went_elsewhere_is_forgotten():
    consumer = Rebalanced([TopicPartition("sepa.rollout.requests", 1)])
    committer = Committer(consumer)
    committer.commit(OFFSETS)
    committer.retry()
    assert consumer.committed == [] and committer.refused == {}


def test_a_later_commit_replaces_the_refused_one():
    consumer = Rebalanced([TopicPartition("sepa.rollout.requests", 0)])
    committer = Committer(consumer)
    committer.commit(OFFSETS)
    later = [TopicPartition("sepa.rollout.requests", 0, 9)]
    committer.commit(later)
    committer.retry()  # nothing left to retry: offset 7 must not move the group back from 9
    assert consumer.committed == [later]
