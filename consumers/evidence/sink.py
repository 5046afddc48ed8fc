"""The evidence sink: every topic -> one append-only ClickHouse table per topic.

    sink = EvidenceSink(store, consumer, producer, codec, topic_prefix)   # clients built at the edge
    sink.run(stop)                                                        # until stop is set

At least once, counted once: a batch is stored, its dead letters acknowledged, then (and only
then) its offsets are committed; a crash in between re-delivers the batch, and the re-delivered
copies are recognised as duplicates and stored once.

Fast path: each message's framing and the envelope's first two fields are checked in Python
(``Codec.frame``, the same checks and reasons as every other consumer), then the raw Avro bodies
go to ClickHouse in an object container and its C++ parser does the decoding (staging.py). A
message written with an older schema version is upcast in Python first (TopicGate).

How a message with a known event id is decided (an event id names one content forever):
- "Known" means stored in the topic's table under the same key, or earlier in the same batch.
  Event ids derive from natural keys that include the message key, so both copies of an id sit
  under one key, on one partition, read in order by one sink: the first copy in partition order
  is the one kept, live and in a replay alike. An id reused under another key is only seen
  when both copies share a batch (RolloutRequested, whose id comes from the request id and whose
  key is the scenario, is today's one event type where that could happen).
- Content is every column except envelope.event_time and _ingested_at, compared as typed values
  in ClickHouse after the upcast, so it does not depend on the schema version that wrote it.
- Same content (a byte-identical re-delivery, or a re-emission at another event_time): a
  duplicate, counted once, not dead-lettered.
- Different content: a conflict. The first content stays; the message is dead-lettered with
  its original bytes and a reason naming the event id, the table and the columns that differ.

Dead letters: a message that fails the cheap checks, that Python cannot decode, or that
ClickHouse refuses (its own error text; the bad ones are isolated by inserting halves) goes to the
deadletter topic; the rest of its batch lands. A dead letter about a message on the deadletter
topic itself, or any dead letter when the sink has no producer (a replay, whose topics already
hold their dead letters), is stored straight into the dead_letters table instead. An error that
is the store's (unreachable, out of memory) is raised and nothing is committed.

Consumer errors (for example UNKNOWN_TOPIC_OR_PART while a topic does not exist yet) are not
messages: the live sink logs them and carries on; with ``fail_on_consumer_error`` (a replay) the
first one stops the run with ConsumerFailed.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from consumers.evidence.exceptions import ConsumerFailed
from consumers.evidence.staging import Accepted, Pending, StagedTable, TableOutcome
from consumers.evidence.store import EvidenceStore
from producers.commits import Committer
from schemas.catalog import BY_NAME, TOPICS, Topic
from schemas.codec import Codec, SchemaIds
from schemas.events import dead_letter as dead_letter_event
from schemas.exceptions import DecodeError, SchemaError

log = logging.getLogger(__name__)

SINK_NAME = "evidence-sink"
GROUP_ID = "sepa-evidence-sink"
CONSUMER_ERROR_LOG_EVERY_S = 60.0  # the same consumer error on the same topic is logged at most this often
DEADLETTER = BY_NAME["deadletter"]

__all__ = ["Accepted", "BatchStats", "EvidenceSink", "Refused", "TopicGate", "triage"]


class Refused(NamedTuple):
    reason: str


class TopicGate:
    """The cheap checks for one topic (schemas.codec.Codec.frame): framing, a known schema id, an
    event type this topic carries, an envelope whose event_id is not empty and whose event_type
    matches the schema id. Runs once per message on the hot path; the body is not decoded.

    A message written with an older version of its schema is decoded in Python (Avro resolution
    fills the fields it lacks with the current schema's defaults) and re-encoded with the current
    version, so the table holds what the contract says the event is, whichever version wrote it.
    """

    def __init__(self, topic: Topic, codec: Codec):
        self.topic = topic
        self.codec = codec
        self._current: dict[str, int] = {}  # event type -> its current schema id

    def check(self, value: bytes | None) -> Accepted | Refused:
        try:
            frame = self.codec.frame(value, self.topic)
        except DecodeError as exc:
            return Refused(str(exc))
        event_type = frame.writer.event_type
        current = self._current.get(event_type)
        if current is None:
            current = self._current[event_type] = self.codec.schema_ids.latest(event_type).schema_id
        if frame.writer.schema_id != current:
            try:
                value = self.codec.encode(self.codec.decode(value, self.topic))
            except SchemaError as exc:
                return Refused(str(exc))
        return Accepted(self.topic.table, current, frame.event_id, value)


def triage(value: bytes | None, topic: Topic, schema_ids: SchemaIds) -> Accepted | Refused:
    return TopicGate(topic, Codec(schema_ids)).check(value)


@dataclass
class BatchStats:
    first_message_at: float | None = None  # time.monotonic(), for throughput figures
    last_commit_at: float | None = None
    consumed: int = 0
    stored: int = 0
    duplicates: int = 0  # known ids with the same content: counted once, not stored again
    conflicts: int = 0  # known ids with another content: dead-lettered (also counted in dead_lettered)
    dead_lettered: int = 0
    consumer_errors: int = 0
    reasons: list[str] = field(default_factory=list)


@dataclass
class Prepared:
    """One batch after the cheap checks: accepted messages per table, and the sink's own dead
    letters that go straight into the dead_letters table."""

    stats: BatchStats
    tables: dict[str, list[Pending]]
    direct: list[bytes] = field(default_factory=list)  # framed DeadLetter events


class EvidenceSink:
    """Consumes every catalog topic into the store.

    consumer: a confluent Consumer built at the edge (its group, offsets reset to earliest,
    auto-commit off); the sink subscribes it and closes it when run() returns.
    producer: for dead letters; None stores them straight into the dead_letters table (a replay).
    """

    def __init__(self, store: EvidenceStore, consumer: Consumer, producer: Producer | None, codec: Codec,
                 topic_prefix: str, batch_max: int = 20000, linger_ms: int = 200, run_id: str = "sink",
                 fail_on_consumer_error: bool = False):
        self.store = store
        self.consumer = consumer
        self.committer = Committer(consumer)
        self.producer = producer
        self.codec = codec
        self.prefix = topic_prefix
        self.batch_max = batch_max
        self.linger_s = linger_ms / 1000
        self.run_id = run_id
        self.fail_on_consumer_error = fail_on_consumer_error
        self.deadletter_topic = DEADLETTER.full_name(topic_prefix)
        self._gates = {t.full_name(topic_prefix): TopicGate(t, codec) for t in TOPICS}
        instance = uuid.uuid4().hex[:12]  # staging tables are this sink's own
        self._tables = {t.table: StagedTable(store, t, codec, instance) for t in TOPICS}
        self._error_logged: dict[tuple, float] = {}
        self.totals = BatchStats()

    def topics(self) -> list[str]:
        return [t.full_name(self.prefix) for t in TOPICS]

    def run(self, stop: threading.Event, idle_exit_s: float | None = None,
            join_timeout_s: float | None = None) -> BatchStats:
        """Consume until stop is set (or, with idle_exit_s, until nothing arrived for that long and
        the group has committed every partition to its end).
        With join_timeout_s, raise ConsumerFailed when no partition is assigned within that time.

        Two stages overlap: while ClickHouse stores batch k (in a worker thread; chDB and
        librdkafka release the GIL), this thread consumes and checks batch k+1. Batch k's offsets
        are committed only once it is stored, and always before batch k+1's.
        """
        assigned = threading.Event()
        self.consumer.subscribe(self.topics(), on_assign=lambda consumer, parts: assigned.set())
        started = last_message = time.monotonic()
        in_flight: Future | None = None
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sink-insert") as inserter:
                while not stop.is_set():
                    messages = self._messages(self.consumer.consume(num_messages=self.batch_max,
                                                                    timeout=self.linger_s))
                    self.committer.retry()
                    batch = self.prepare(messages) if messages else None
                    if in_flight is not None:
                        self.finish(*in_flight.result())
                        in_flight = None
                        # idleness counts from the last batch done, not consumed: a store slower than
                        # idle_exit_s must not end the run before its own dead letters come back
                        last_message = time.monotonic()
                    now = time.monotonic()
                    if batch is not None:
                        last_message = now
                        in_flight = inserter.submit(lambda b=batch, m=messages: (self.store_batch(b), m))
                    elif not assigned.is_set():
                        if join_timeout_s is not None and now - started > join_timeout_s:
                            raise ConsumerFailed(f"no partition of {self.prefix}* was assigned within "
                                                 f"{join_timeout_s:.0f} s")
                        last_message = now  # idleness counts from the group join
                    elif idle_exit_s is not None and now - last_message > idle_exit_s:
                        if self._drained():
                            break
                        last_message = now  # look again after another idle spell
                if in_flight is not None:
                    self.finish(*in_flight.result())
        finally:
            try:
                self.consumer.close()
                if self.producer is not None:
                    self.producer.flush(10)
            finally:
                self._drop_staging()
        return self.totals

    def _drained(self) -> bool:
        """Whether the group has committed every partition of our topics up to its end.

        Idleness alone is not enough: a sink started beside a killed one (still a member until its
        session times out) holds only part of the partitions at first, and would end before the
        rebalance hands it the rest. Our own dead letters are flushed first so they count.
        """
        if self.producer is not None:
            self.producer.flush(10)
        # Fetching paused: a watermark query otherwise waits behind each partition's long-poll fetch.
        held = self.consumer.assignment()
        self.consumer.pause(held)
        try:
            topics = self.consumer.list_topics(timeout=10).topics
            parts = [TopicPartition(name, p) for name in self.topics() if name in topics
                     for p in topics[name].partitions]
            for tp in self.consumer.committed(parts, timeout=10):
                low, high = self.consumer.get_watermark_offsets(tp, timeout=10, cached=False)
                if high > low and tp.offset < high:
                    log.info("idle, but %s[%d] is committed to %d of %d: waiting for it", tp.topic,
                             tp.partition, max(tp.offset, low), high)
                    return False
        except KafkaException as exc:
            raise ConsumerFailed(f"could not read the committed offsets of {self.prefix}*: "
                                 f"{exc.args[0].str() if exc.args else exc}") from exc
        finally:
            self.consumer.resume(held)
        return True

    def process(self, messages: list[Message]) -> BatchStats:
        """Store one batch, dead-letter what cannot be stored, then commit the batch's offsets."""
        messages = self._messages(messages)
        stats = self.store_batch(self.prepare(messages))
        self.finish(stats, messages)
        return stats

    def prepare(self, messages: list[Message]) -> Prepared:
        """The cheap checks; refused messages are dead-lettered here, the rest grouped per table."""
        prepared = Prepared(BatchStats(consumed=len(messages)), defaultdict(list))
        if self.totals.first_message_at is None:
            self.totals.first_message_at = time.monotonic()
        for seq, msg in enumerate(messages):
            verdict = self._gates[msg.topic()].check(msg.value())
            if isinstance(verdict, Refused):
                self._dead_letter(msg, verdict.reason, prepared)
            else:
                prepared.tables[verdict.table].append(Pending(seq, msg, verdict))
        return prepared

    def store_batch(self, prepared: Prepared) -> BatchStats:
        stats = prepared.stats
        for table, items in prepared.tables.items():
            outcome = self._tables[table].write(items)
            self._account(outcome, stats)
            for item, reason in outcome.conflicts + outcome.refused:
                self._dead_letter(item.msg, reason, prepared)
        if prepared.direct:
            self._store_direct(prepared.direct, stats)
        return stats

    def finish(self, stats: BatchStats, messages: list[Message]) -> None:
        """Dead letters acknowledged, then offsets committed: the batch is done."""
        if stats.dead_lettered and self.producer is not None:
            remaining = self.producer.flush(30)
            if remaining:
                raise RuntimeError(f"{remaining} dead letters unacknowledged; not committing the batch")
        self._commit(messages)
        self.totals.last_commit_at = time.monotonic()
        self._add_to_totals(stats)
        log.info("committed batch of %d: stored %d, duplicates %d, dead-lettered %d (total stored %d)",
                 stats.consumed, stats.stored, stats.duplicates, stats.dead_lettered, self.totals.stored)

    # --- internals --------------------------------------------------------------------------

    def _messages(self, consumed: list[Message]) -> list[Message]:
        """The messages among what consume() returned; its error events are not messages."""
        messages = []
        for msg in consumed:
            err = msg.error()
            if err is None:
                messages.append(msg)
            elif err.code() != KafkaError._PARTITION_EOF:
                self._consumer_error(msg, err)
        return messages

    def _consumer_error(self, msg: Message, err: KafkaError) -> None:
        self.totals.consumer_errors += 1
        text = f"consumer error on {msg.topic() or 'the consumer'}: {err.str()} ({err.name()})"
        if self.fail_on_consumer_error or err.fatal():
            raise ConsumerFailed(text)
        key = (msg.topic(), err.code())
        now = time.monotonic()
        if now - self._error_logged.get(key, -math.inf) >= CONSUMER_ERROR_LOG_EVERY_S:
            self._error_logged[key] = now
            log.warning("%s; carrying on", text)

    def _account(self, outcome: TableOutcome, stats: BatchStats) -> None:
        stats.stored += outcome.stored
        stats.duplicates += outcome.duplicates
        stats.conflicts += len(outcome.conflicts)

    def _dead_letter(self, msg: Message, reason: str, prepared: Prepared) -> None:
        stats = prepared.stats
        stats.dead_lettered += 1
        stats.reasons.append(reason)
        log.warning("dead-letter %s[%s]@%s: %s", msg.topic(), msg.partition(), msg.offset(), reason)
        _, timestamp_ms = msg.timestamp()
        event = dead_letter_event(SINK_NAME, self.run_id, msg.topic(), msg.partition(), msg.offset(), msg.key(),
                                  msg.value(), reason, timestamp_ms)
        framed = self.codec.encode(event)
        if self.producer is None or msg.topic() == self.deadletter_topic:
            prepared.direct.append(framed)  # re-publishing a dead letter's dead letter would loop
        else:
            self.producer.produce(self.deadletter_topic, key=msg.topic().encode(), value=framed)

    def _store_direct(self, framed: list[bytes], stats: BatchStats) -> None:
        """The sink's own dead letters, through the same checks as every stored event."""
        gate = self._gates[self.deadletter_topic]
        items = []
        for value in framed:
            verdict = gate.check(value)
            if isinstance(verdict, Refused):  # our own encoding: a bug, not data
                raise RuntimeError(f"the sink's own dead letter fails its checks: {verdict.reason}")
            items.append(Pending(len(items), None, verdict))
        outcome = self._tables[DEADLETTER.table].write(items)
        self._account(outcome, stats)
        for item, reason in outcome.conflicts + outcome.refused:
            # A verdict that contradicts an earlier verdict on the same message: keep the first.
            log.warning("own dead letter %s not stored: %s", item.accepted.event_id.decode(), reason)

    def _commit(self, messages: list[Message]) -> None:
        last: dict[tuple[str, int], int] = {}
        for msg in messages:
            key = (msg.topic(), msg.partition())
            last[key] = max(last.get(key, -1), msg.offset())
        offsets = [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
        if offsets:
            self.committer.commit(offsets)

    def _add_to_totals(self, stats: BatchStats) -> None:
        for name in ("consumed", "stored", "duplicates", "conflicts", "dead_lettered"):
            setattr(self.totals, name, getattr(self.totals, name) + getattr(stats, name))

    def _drop_staging(self) -> None:
        for table in self._tables.values():
            try:
                table.drop()
            except Exception as exc:  # the store may be the reason run() is ending
                log.warning("could not drop staging table %s: %s", table.staging, exc)
