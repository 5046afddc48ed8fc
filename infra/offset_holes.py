"""Reading every partition without holes, on a broker that may show a batch's successors first.

    consumer = ContiguousConsumer(consumer_config(bootstrap, group, session_timeout_ms))  # confluent-kafka
    read_contiguously()   # faust's aiokafka, once per process (infra/aiokafka_holes.py)

Tansu (the embedded broker, 0.6.0) appends a batch in two steps: it moves the partition's high
watermark past the batch's offsets, then writes the batch. A fetch in between lists the batches
written below the watermark and returns those after the missing one, and the consumer moves its
position past the batch it never saw. Measured here: 3 producers and 2 live consumers on one
4-partition topic, one consumer skipped 9 of 60000 messages (one batch); in a `run` under load an
EpisodeStarted never reached the critics, the gate or the store, and the cycle waited for ever.
The batch is written milliseconds later, so a reader that refetches from the offset it expected
gets it.

Both guards (this one for confluent-kafka, infra/aiokafka_holes.py for faust) hold back a
partition's messages beyond the offset expected next, and read the partition again from that
offset. On Apache Kafka our topics have no holes (no compaction, no
transactions: exactly_once is refused), and the guards never act. A hole still open after
``HOLE_WAIT_S`` is a produce that failed after reserving its offsets, and will never be filled:
the guard says so in the log, naming the topic, partition and offsets, and reads on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

log = logging.getLogger(__name__)

HOLE_WAIT_S = 10.0  # Tansu fills its holes in milliseconds; this is generous for a loaded machine


class Holes:
    """The holes being waited for, per partition: wait (read again) or give up and read on."""

    def __init__(self, wait_s: float = HOLE_WAIT_S, clock: Callable[[], float] = time.monotonic):
        self.wait_s = wait_s
        self.clock = clock
        self._open: dict[tuple[str, int], tuple[int, float]] = {}
        self._lock = threading.Lock()  # aiokafka's fetches and confluent's consumers may share one

    def wait(self, topic: str, partition: int, expected: int, found: int) -> bool:
        """True: read the partition again from ``expected``; False: the hole is given up on."""
        key, now = (topic, partition), self.clock()
        with self._lock:
            since = self._open.get(key)
            if since is None or since[0] != expected:
                self._open[key] = (expected, now)
                log.info("%s[%d]: the broker showed offset %d before %d; reading again from %d", topic, partition,
                         found, expected, expected)
                return True
            if now - since[1] < self.wait_s:
                return True
            del self._open[key]
        log.warning("%s[%d]: offsets %d to %d never arrived in %.0f s (a produce that failed after the broker "
                    "reserved them); reading on from %d", topic, partition, expected, found - 1, self.wait_s, found)
        return False

    def closed(self, topic: str, partition: int) -> None:
        with self._lock:
            self._open.pop((topic, partition), None)


class ContiguousConsumer(Consumer):
    """A confluent-kafka Consumer whose ``poll`` and ``consume`` deliver each partition's messages
    in offset order without holes (the module docstring says why). Where a partition starts is
    what librdkafka would start it at: the offset given to ``assign``/``seek``, else the group's
    committed offset, else (``auto.offset.reset`` earliest) the partition's first offset."""

    def __init__(self, config: dict, holes: Holes | None = None):
        super().__init__(config)
        self._from_earliest = config.get("auto.offset.reset", "latest") in ("earliest", "smallest", "beginning")
        self._holes = holes or Holes()
        self._next: dict[tuple[str, int], int] = {}

    def subscribe(self, topics, on_assign=None, on_revoke=None, on_lost=None):
        def assigned(consumer, partitions):
            self._forget(partitions)
            if on_assign is not None:
                on_assign(consumer, partitions)

        def revoked(consumer, partitions):
            self._forget(partitions)
            if on_revoke is not None:
                on_revoke(consumer, partitions)

        def lost(consumer, partitions):  # without on_lost, confluent-kafka calls on_revoke for them
            self._forget(partitions)
            callback = on_lost or on_revoke
            if callback is not None:
                callback(consumer, partitions)

        super().subscribe(topics, on_assign=assigned, on_revoke=revoked, on_lost=lost)

    def assign(self, partitions):
        self._forget(partitions)
        self._next.update({(p.topic, p.partition): p.offset for p in partitions if p.offset >= 0})
        super().assign(partitions)

    def seek(self, partition):
        super().seek(partition)
        self._forget([partition])
        if partition.offset >= 0:
            self._next[(partition.topic, partition.partition)] = partition.offset

    def poll(self, timeout: float = -1) -> Message | None:
        msg = super().poll(timeout)
        if msg is None or msg.error() is not None:
            return msg
        return msg if self._in_order(msg, set()) else None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        rewound: set[tuple[str, int]] = set()
        return [m for m in super().consume(num_messages, timeout)
                if m.error() is not None or self._in_order(m, rewound)]

    def _forget(self, partitions) -> None:
        for p in partitions:
            self._next.pop((p.topic, p.partition), None)
            self._holes.closed(p.topic, p.partition)

    def _in_order(self, msg: Message, rewound: set[tuple[str, int]]) -> bool:
        """Whether to deliver ``msg``; a message past a hole rewinds its partition to the hole."""
        key = (msg.topic(), msg.partition())
        if key in rewound:  # this batch's later messages of a partition just rewound
            return False
        expected = self._next.get(key)
        if expected is None:
            expected = self._start(*key)
        offset = msg.offset()
        if expected is not None and offset > expected and self._holes.wait(*key, expected, offset):
            try:
                super().seek(TopicPartition(*key, expected))
            except KafkaException as exc:  # the partition went elsewhere meanwhile: its new holder reads it
                log.info("%s[%d]: not rewound to %d: %s", *key, expected, exc)
            self._next[key] = expected
            rewound.add(key)
            return False
        self._holes.closed(*key)
        self._next[key] = offset + 1
        return True

    def _start(self, topic: str, partition: int) -> int | None:
        """Where librdkafka started this partition; None (take the first message as given) when
        the broker does not say or the consumer starts at the latest offset."""
        tp = TopicPartition(topic, partition)
        try:
            [committed] = self.committed([tp], timeout=10)
            low, _ = self.get_watermark_offsets(tp, timeout=10, cached=False)
        except KafkaException as exc:
            log.info("%s[%d]: start offset unknown (%s); taking the first message as the start", topic,
                     partition, exc)
            return None
        if committed.offset >= 0:
            return max(committed.offset, low)
        return low if self._from_earliest else None
