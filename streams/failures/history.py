"""The clusterer's restore, reading the broker: failures.clusters from its beginning to its end,
then the EpisodeAnalysed events of the episodes that log took in, then ``ClusterStage.restore``.

    outgoing = restore_from_log(stage, consumer_factory, timeout_s=300)   # blocking: run it in an executor

``consumer_factory(extra)`` returns a confluent_kafka Consumer for the deployment's broker with
the ``extra`` settings applied (the edge builds it from infra.kafka_clients; nothing here reads
settings or builds clients). The reads assign partitions directly, commit nothing and never join
the consumer group.

"The end" is where a Fetch reply says the partition ends (librdkafka's partition EOF, from the
reply's high watermark), not ListOffsets "latest", which Tansu under-reports when the last batch
holds several records.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping

from confluent_kafka import KafkaError, TopicPartition

from schemas.exceptions import SchemaError
from streams.deadletter import Outgoing, RawMessage
from streams.exceptions import ClustererError
from streams.failures.collector import ClusterLog, ClusterStage

log = logging.getLogger("sepa.streams.failures.history")
ConsumerFactory = Callable[[dict], object]  # extra confluent_kafka settings -> Consumer

READ_SETTINGS = {"enable.partition.eof": True, "enable.auto.commit": False, "auto.offset.reset": "earliest",
                 "fetch.wait.max.ms": 100}


class Analysed(Mapping):
    """episode id -> EpisodeAnalysed, held as bytes and decoded when asked (a restore asks once each)."""

    def __init__(self, codec):
        self.codec = codec
        self.values: dict[str, bytes] = {}

    def add(self, value: bytes, wanted: set[str]) -> None:
        try:
            event = self.codec.decode(value)
        except SchemaError:
            return  # dead-lettered when it was consumed
        episode_id = event.get("episode_id")
        if episode_id in wanted and episode_id not in self.values:  # the first copy is the one taken in
            self.values[episode_id] = value

    def __getitem__(self, episode_id: str) -> dict:
        return self.codec.decode(self.values[episode_id])

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def read_partition(consumer_factory: ConsumerFactory, topic: str, partition: int, timeout_s: float,
                   done: Callable[[], bool] = lambda: False) -> Iterator[RawMessage]:
    """Every message of one partition, from its beginning to its end as of the read, in offset
    order; stops early once ``done()`` (checked after each message) says so. Raises
    ClustererError when the broker refuses or the end is not reached within ``timeout_s``."""
    consumer = consumer_factory(dict(READ_SETTINGS))
    try:
        # offset 0 (out of range: auto.offset.reset=earliest) answers ~0.5 s sooner than
        # OFFSET_BEGINNING, which waits for a ListOffsets round trip first
        consumer.assign([TopicPartition(topic, partition, 0)])
        deadline = time.monotonic() + timeout_s
        read = 0
        while True:
            if time.monotonic() > deadline:
                raise ClustererError(f"reading {topic}[{partition}] for the clusterer's restore: not at its end "
                                     f"after {timeout_s:.0f} s ({read} messages read)")
            for msg in consumer.consume(1000, timeout=0.1):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return
                    raise ClustererError(f"reading {topic}[{partition}] for the clusterer's restore: {err}")
                read += 1
                yield RawMessage(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value())
                if done():
                    return
    finally:
        consumer.close()


def restore_from_log(stage: ClusterStage, consumer_factory: ConsumerFactory, timeout_s: float) -> list[Outgoing]:
    """Reads the history and re-executes it into ``stage``; returns the events to publish (what
    the last step derives beyond the log's end). Raises ClustererError when it cannot."""
    t0 = time.monotonic()
    history = ClusterLog(stage.codec)
    for raw in read_partition(consumer_factory, stage.output_topic, 0, timeout_s):
        history.add(raw)
    wanted = history.intake_episodes()
    analysed = Analysed(stage.codec)
    if wanted:
        keys = {e.encode() for e in wanted}
        for raw in read_partition(consumer_factory, stage.input_topic, 0, timeout_s,
                                  done=lambda: len(analysed) == len(wanted)):
            if raw.key is None or raw.key in keys:
                analysed.add(raw.value, wanted)
    out = stage.restore(history, analysed)
    log.info("failure-clusterer: restored from %s in %.1f s: %d events (%s), %d episodes taken in, %d events "
             "re-derived beyond its end", stage.output_topic, time.monotonic() - t0, len(history.events),
             ", ".join(f"{k}={v}" for k, v in sorted(history.stats.items())), stage.clusterer.updates, len(out))
    return out
