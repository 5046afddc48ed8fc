"""The evidence sink: every topic -> one append-only ClickHouse table per topic.

At least once, counted once: a batch is inserted, then (and only then) its offsets are committed;
a crash in between re-delivers the batch and the tables' (key, event_id) dedup absorbs it.

Fast path: each message's 5-byte Confluent header and the envelope's first two fields are checked
in Python, then the raw Avro bodies go to ClickHouse in an object container and its C++ parser
does the decoding. If ClickHouse rejects a container, the batch is decoded message by message in
Python to find the bad ones; those go to the dead-letter topic with the reason, the rest land.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from consumers.evidence.avro_container import read_string
from consumers.evidence.store import EvidenceStore, insert_bodies
from infra.kafka_clients import consumer_config, make_producer
from schemas.catalog import TOPICS, Topic
from schemas.codec import Codec, SchemaIds
from schemas.events import dead_letter as dead_letter_event
from schemas.exceptions import DecodeError, SchemaError
from schemas.manifest import current_manifest

log = logging.getLogger(__name__)

SINK_NAME = "evidence-sink"
GROUP_ID = "sepa-evidence-sink"


@dataclass(frozen=True)
class Accepted:
    table: str
    schema_id: int
    event_id: bytes
    body: bytes


@dataclass(frozen=True)
class Refused:
    reason: str


class TopicGate:
    """The cheap checks for one topic: framing, a known schema id, an event type this topic carries,
    an envelope whose event_id is not empty and whose event_type matches the schema id.

    This runs once per message on the hot path, so the envelope's first two Avro strings are read
    by hand: for each schema id the topic accepts we precompute the exact bytes its event_type
    field must hold.
    """

    def __init__(self, topic: Topic, schema_ids: SchemaIds):
        self.topic = topic
        self.schema_ids = schema_ids
        self._expected: dict[int, bytes] = {}  # schema id -> the event_type bytes it requires

    def _expected_type(self, schema_id: int) -> bytes | None:
        if schema_id not in self._expected:
            try:
                version = self.schema_ids.by_id(schema_id)
            except SchemaError:
                return None
            if version.event_type not in self.topic.event_types:
                return None
            self._expected[schema_id] = _avro_string(version.event_type.encode())
        return self._expected[schema_id]

    def check(self, value: bytes | None) -> Accepted | Refused:
        if value is None or len(value) < 7:
            return Refused(f"message of {len(value or b'')} bytes is too short for a framed event")
        if value[0] != 0:
            return Refused(f"magic byte {value[0]} is not the Confluent framing byte 0")
        schema_id = int.from_bytes(value[1:5], "big")
        expected_type = self._expected.get(schema_id) or self._expected_type(schema_id)
        if expected_type is None:
            return Refused(self._why_not_accepted(schema_id))
        try:
            event_id, pos = read_string(value, 5)
        except (IndexError, ValueError) as exc:
            return Refused(f"unreadable envelope.event_id: {exc}")
        if not event_id:
            return Refused("empty envelope.event_id")
        if not value.startswith(expected_type, pos):
            event_type = self.schema_ids.by_id(schema_id).event_type
            return Refused(f"envelope.event_type does not say {event_type}, which schema id {schema_id} is")
        return Accepted(self.topic.table, schema_id, event_id, value[5:])

    def _why_not_accepted(self, schema_id: int) -> str:
        try:
            event_type = self.schema_ids.by_id(schema_id).event_type
        except SchemaError as exc:
            return str(exc)
        return f"{event_type} (schema id {schema_id}) does not belong on topic {self.topic.name}"


def _avro_string(raw: bytes) -> bytes:
    n = len(raw) << 1  # zigzag of a non-negative length
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + raw


def triage(value: bytes | None, topic: Topic, schema_ids: SchemaIds) -> Accepted | Refused:
    return TopicGate(topic, schema_ids).check(value)


@dataclass
class BatchStats:
    first_message_at: float | None = None  # time.monotonic(), for throughput figures
    last_commit_at: float | None = None
    consumed: int = 0
    stored: int = 0
    dead_lettered: int = 0
    reasons: list[str] = field(default_factory=list)


class EvidenceSink:
    def __init__(self, store: EvidenceStore, bootstrap: str, topic_prefix: str, session_timeout_ms: int,
                 batch_max: int = 20000, linger_ms: int = 200, run_id: str = "sink",
                 group_id: str = GROUP_ID, schema_ids: SchemaIds | None = None,
                 publish_dead_letters: bool = True):
        self.store = store
        self.bootstrap = bootstrap
        self.prefix = topic_prefix
        self.batch_max = batch_max
        self.linger_s = linger_ms / 1000
        self.run_id = run_id
        self.schema_ids = schema_ids or current_manifest()
        # A replay rebuilds a store from topics that already hold their dead letters: it stores the
        # verdicts it reaches directly rather than publishing them a second time.
        self.publish_dead_letters = publish_dead_letters
        self.codec = Codec(self.schema_ids)
        self.consumer = Consumer(consumer_config(bootstrap, group_id, session_timeout_ms))
        self.producer = make_producer(bootstrap)
        self._schema_json: dict[int, str] = {}
        self._gates = {t.full_name(topic_prefix): TopicGate(t, self.schema_ids) for t in TOPICS}
        self.totals = BatchStats()

    def topics(self) -> list[str]:
        return [t.full_name(self.prefix) for t in TOPICS]

    def run(self, stop: threading.Event, idle_exit_s: float | None = None) -> BatchStats:
        """Consume until stop is set (or, with idle_exit_s, until nothing arrived for that long).

        Two stages overlap: while ClickHouse inserts batch k (in a worker thread; chDB and
        librdkafka release the GIL), this thread consumes and checks batch k+1. Batch k's offsets
        are committed only once its insert returned, and always before batch k+1's.
        """
        assigned = threading.Event()
        self.consumer.subscribe(self.topics(), on_assign=lambda consumer, parts: assigned.set())
        last_message = time.monotonic()
        in_flight: Future | None = None
        try:
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sink-insert") as inserter:
                while not stop.is_set():
                    messages = self.consumer.consume(num_messages=self.batch_max, timeout=self.linger_s)
                    messages = [m for m in messages if not _skippable_error(m)]
                    batch = self.prepare(messages) if messages else None
                    if in_flight is not None:
                        self.finish(*in_flight.result())
                        in_flight = None
                    if batch is not None:
                        last_message = time.monotonic()
                        in_flight = inserter.submit(lambda b=batch, m=messages: (self.store_batch(b), m))
                    elif not assigned.is_set():
                        last_message = time.monotonic()  # idleness counts from the group join
                    elif idle_exit_s is not None and time.monotonic() - last_message > idle_exit_s:
                        break
                if in_flight is not None:
                    self.finish(*in_flight.result())
        finally:
            self.consumer.close()
            self.producer.flush(10)
        return self.totals

    def process(self, messages: list[Message]) -> BatchStats:
        """Store one batch, dead-letter what cannot be stored, then commit the batch's offsets."""
        stats = self.store_batch(self.prepare(messages))
        self.finish(stats, messages)
        return stats

    def prepare(self, messages: list[Message]) -> tuple[BatchStats, dict]:
        """The cheap checks; refused messages are dead-lettered here, the rest grouped per insert."""
        stats = BatchStats(consumed=len(messages))
        if self.totals.first_message_at is None:
            self.totals.first_message_at = time.monotonic()
        groups: dict[tuple[str, int], list[tuple[Message, Accepted]]] = defaultdict(list)
        for msg in messages:
            if msg.error():
                self._dead_letter(msg, f"consumer error: {msg.error()}", stats)
                continue
            verdict = self._gates[msg.topic()].check(msg.value())
            # No dedup here: a copy that looks valid now may fail in ClickHouse later, and must not
            # have displaced a good copy. The tables' (key, event_id) dedup counts it once.
            if isinstance(verdict, Refused):
                self._dead_letter(msg, verdict.reason, stats)
            else:
                groups[(verdict.table, verdict.schema_id)].append((msg, verdict))
        return stats, groups

    def store_batch(self, prepared: tuple[BatchStats, dict]) -> BatchStats:
        stats, groups = prepared
        for (table, schema_id), items in groups.items():
            self._insert_group(table, schema_id, items, stats)
        return stats

    def finish(self, stats: BatchStats, messages: list[Message]) -> None:
        """Dead letters acknowledged, then offsets committed: the batch is done."""
        if stats.dead_lettered:
            remaining = self.producer.flush(30)
            if remaining:
                raise RuntimeError(f"{remaining} dead letters unacknowledged; not committing the batch")
        self._commit(messages)
        self.totals.last_commit_at = time.monotonic()
        self._add_to_totals(stats)
        log.info("committed batch of %d: stored %d, dead-lettered %d (total stored %d)",
                 stats.consumed, stats.stored, stats.dead_lettered, self.totals.stored)

    def _insert_group(self, table: str, schema_id: int, items: list, stats: BatchStats) -> None:
        schema_json = self._schema_json_for(schema_id)
        try:
            insert_bodies(self.store, table, schema_json, [a.body for _, a in items])
            stats.stored += len(items)
            return
        except Exception as exc:
            log.warning("container insert into %s refused (%s); checking %d messages one by one",
                        table, str(exc)[:200], len(items))
        good = []
        for msg, accepted in items:
            try:
                self.codec.decode(msg.value())
                good.append((msg, accepted))
            except DecodeError as exc:
                self._dead_letter(msg, str(exc), stats)
        if good:
            # A failure here is the store's, not the data's: let it propagate so nothing is committed.
            insert_bodies(self.store, table, schema_json, [a.body for _, a in good])
            stats.stored += len(good)

    def _schema_json_for(self, schema_id: int) -> str:
        if schema_id not in self._schema_json:
            self._schema_json[schema_id] = json.dumps(self.schema_ids.by_id(schema_id).schema)
        return self._schema_json[schema_id]

    def _dead_letter(self, msg: Message, reason: str, stats: BatchStats) -> None:
        stats.dead_lettered += 1
        stats.reasons.append(reason)
        log.warning("dead-letter %s[%s]@%s: %s", msg.topic(), msg.partition(), msg.offset(), reason)
        _, timestamp_ms = msg.timestamp()
        event = dead_letter_event(SINK_NAME, self.run_id, msg.topic(), msg.partition(), msg.offset(), msg.key(),
                            msg.value(), reason, timestamp_ms)
        framed = self.codec.encode(event)
        deadletter_topic = f"{self.prefix}deadletter"
        if msg.topic() == deadletter_topic or not self.publish_dead_letters:
            # Re-publishing would loop forever; store the verdict directly instead.
            insert_bodies(self.store, "dead_letters", self._schema_json_for(int.from_bytes(framed[1:5], "big")),
                          [framed[5:]])
        else:
            self.producer.produce(deadletter_topic, key=msg.topic().encode(), value=framed)

    def _commit(self, messages: list[Message]) -> None:
        last: dict[tuple[str, int], int] = {}
        for msg in messages:
            key = (msg.topic(), msg.partition())
            last[key] = max(last.get(key, -1), msg.offset())
        offsets = [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
        if offsets:
            self.consumer.commit(offsets=offsets, asynchronous=False)

    def _add_to_totals(self, stats: BatchStats) -> None:
        self.totals.consumed += stats.consumed
        self.totals.stored += stats.stored
        self.totals.dead_lettered += stats.dead_lettered


def _skippable_error(msg: Message) -> bool:
    err = msg.error()
    return err is not None and err.code() == KafkaError._PARTITION_EOF

