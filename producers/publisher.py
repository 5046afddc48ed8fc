"""Publish events to their catalog topic, keyed by the topic's key field, Confluent-framed.

Every producer in the project (rollout workers, the recorder API, synthetic traffic, replay,
stream processors' side outputs) publishes through this one class.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, Message, Producer

from producers.exceptions import PublishError
from schemas.catalog import topic_for
from schemas.codec import Codec, event_type_of


class Publisher:
    def __init__(self, producer: Producer, topic_prefix: str, codec: Codec | None = None):
        self.producer = producer
        self.prefix = topic_prefix
        self.codec = codec or Codec()
        self.published = 0
        self._failures: list[str] = []

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._failures.append(f"{msg.topic()} key={msg.key()!r}: {err}")

    def publish(self, event: dict) -> None:
        topic = topic_for(event_type_of(event))
        self.publish_raw(topic.full_name(self.prefix), topic.message_key(event),
                         self.codec.encode(event))

    def publish_raw(self, topic: str, key: bytes | None, value: bytes) -> None:
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, on_delivery=self._on_delivery)
                break
            except BufferError:  # local queue full: let librdkafka drain it
                self.producer.poll(0.05)
        self.published += 1
        if self.published % 1000 == 0:
            self.producer.poll(0)

    def flush(self, timeout: float = 60.0) -> None:
        remaining = self.producer.flush(timeout)
        if remaining:
            raise PublishError(f"{remaining} events still undelivered after {timeout}s")
        if self._failures:
            failures, self._failures = self._failures, []
            raise PublishError(f"{len(failures)} events were refused by the broker; first: {failures[:3]}")
