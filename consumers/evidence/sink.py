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
from dataclasses import dataclass, field
from datetime import UTC, datetime

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from consumers.evidence.avro_container import read_string
from consumers.evidence.store import EvidenceStore, insert_bodies
from infra.kafka_clients import consumer_config, make_producer
from schemas.catalog import TOPICS, Topic, topic_by_full_name
from schemas.codec import Codec
from schemas.events import make_event
from schemas.exceptions import DecodeError
from schemas.manifest import Manifest, current_manifest

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


def triage(value: bytes | None, topic: Topic, manifest: Manifest) -> Accepted | Refused:
    """The cheap checks: framing, a known schema id, an event type this topic carries, an envelope
    whose event_type matches the schema and whose event_id is not empty."""
    if value is None or len(value) < 6:
        return Refused(f"message of {len(value or b'')} bytes is too short for a framed event")
    if value[0] != 0:
        return Refused(f"magic byte {value[0]} is not the Confluent framing byte 0")
    schema_id = int.from_bytes(value[1:5], "big")
    try:
        version = manifest.by_id(schema_id)
    except Exception as exc:
        return Refused(str(exc))
    if version.event_type not in topic.event_types:
        return Refused(f"{version.event_type} (schema id {schema_id}) does not belong on topic {topic.name}")
    try:
        event_id, pos = read_string(value, 5)
        event_type, _ = read_string(value, pos)
    except (IndexError, ValueError) as exc:
        return Refused(f"{version.event_type}: unreadable envelope: {exc}")
    if not event_id:
        return Refused(f"{version.event_type}: empty envelope.event_id")
    if event_type != version.event_type.encode():
        return Refused(f"envelope says event_type {event_type[:40]!r} but schema id {schema_id} is "
                       f"{version.event_type}")
    return Accepted(topic.table, schema_id, event_id, value[5:])


@dataclass
class BatchStats:
    consumed: int = 0
    stored: int = 0
    duplicates_in_batch: int = 0
    dead_lettered: int = 0
    reasons: list[str] = field(default_factory=list)


class EvidenceSink:
    def __init__(self, store: EvidenceStore, bootstrap: str, topic_prefix: str, session_timeout_ms: int,
                 batch_max: int = 20000, linger_ms: int = 200, run_id: str = "sink",
                 group_id: str = GROUP_ID, manifest: Manifest | None = None,
                 publish_dead_letters: bool = True):
        self.store = store
        self.bootstrap = bootstrap
        self.prefix = topic_prefix
        self.batch_max = batch_max
        self.linger_s = linger_ms / 1000
        self.run_id = run_id
        self.manifest = manifest or current_manifest()
        # A replay rebuilds a store from topics that already hold their dead letters: it stores the
        # verdicts it reaches directly rather than publishing them a second time.
        self.publish_dead_letters = publish_dead_letters
        self.codec = Codec(self.manifest)
        self.consumer = Consumer(consumer_config(bootstrap, group_id, session_timeout_ms))
        self.producer = make_producer(bootstrap)
        self._schema_json: dict[int, str] = {}
        self.totals = BatchStats()

    def topics(self) -> list[str]:
        return [t.full_name(self.prefix) for t in TOPICS]

    def run(self, stop: threading.Event, idle_exit_s: float | None = None) -> BatchStats:
        """Consume until stop is set (or, with idle_exit_s, until nothing arrived for that long)."""
        assigned = threading.Event()
        self.consumer.subscribe(self.topics(), on_assign=lambda consumer, parts: assigned.set())
        last_message = time.monotonic()
        try:
            while not stop.is_set():
                messages = self.consumer.consume(num_messages=self.batch_max, timeout=self.linger_s)
                messages = [m for m in messages if not _skippable_error(m)]
                if messages:
                    last_message = time.monotonic()
                    self.process(messages)
                elif not assigned.is_set():
                    last_message = time.monotonic()  # idleness counts from the group join
                elif idle_exit_s is not None and time.monotonic() - last_message > idle_exit_s:
                    break
        finally:
            self.consumer.close()
            self.producer.flush(10)
        return self.totals

    def process(self, messages: list[Message]) -> BatchStats:
        """Store one batch, dead-letter what cannot be stored, then commit the batch's offsets."""
        stats = BatchStats(consumed=len(messages))
        groups: dict[tuple[str, int], list[tuple[Message, Accepted]]] = defaultdict(list)
        seen: set[bytes] = set()
        for msg in messages:
            if msg.error():
                self._dead_letter(msg, f"consumer error: {msg.error()}", stats)
                continue
            topic = topic_by_full_name(msg.topic(), self.prefix)
            verdict = triage(msg.value(), topic, self.manifest)
            if isinstance(verdict, Refused):
                self._dead_letter(msg, verdict.reason, stats)
            elif verdict.event_id in seen:
                stats.duplicates_in_batch += 1
            else:
                seen.add(verdict.event_id)
                groups[(verdict.table, verdict.schema_id)].append((msg, verdict))
        for (table, schema_id), items in groups.items():
            self._insert_group(table, schema_id, items, stats)
        if stats.dead_lettered:
            self.producer.flush(30)
        self._commit(messages)
        self._add_to_totals(stats)
        return stats

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
            self._schema_json[schema_id] = json.dumps(self.manifest.by_id(schema_id).schema)
        return self._schema_json[schema_id]

    def _dead_letter(self, msg: Message, reason: str, stats: BatchStats) -> None:
        stats.dead_lettered += 1
        stats.reasons.append(reason)
        log.warning("dead-letter %s[%s]@%s: %s", msg.topic(), msg.partition(), msg.offset(), reason)
        # The verdict's time is the message's own timestamp, so judging the same message again
        # (after a crash, in a replay) yields a byte-identical event that dedups.
        _, timestamp_ms = msg.timestamp()
        event = make_event(
            "DeadLetter", (SINK_NAME, msg.topic(), msg.partition(), msg.offset()), SINK_NAME, self.run_id,
            event_time=datetime.fromtimestamp(max(timestamp_ms, 0) / 1000, UTC),
            source_topic=msg.topic(), source_partition=msg.partition(), source_offset=msg.offset(),
            source_key=msg.key(), original=msg.value() or b"", reason=reason, consumer=SINK_NAME)
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
        self.totals.duplicates_in_batch += stats.duplicates_in_batch
        self.totals.dead_lettered += stats.dead_lettered


def _skippable_error(msg: Message) -> bool:
    err = msg.error()
    return err is not None and err.code() == KafkaError._PARTITION_EOF

