"""producers.commits.commit: a commit the group refused because it moved on (a broker bounce, a
rebalance) is logged and the worker goes on; a coordinator on the move is asked again; any other
error is raised. (The real case, a 3-broker cluster losing the steps leader mid-run, is
tests/integration/test_kafka_cluster.py.)"""

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from producers.commits import commit

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
