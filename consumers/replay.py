"""Replay: rebuild an evidence store from the topics, or republish the store's log into topics.

- rebuild: consume every topic from the beginning into an empty database, re-apply the live store's
  recorded prunes (consumers/prune.py says what a replay after a prune can and cannot rebuild),
  and compare the derived state's digest with the live store's. Replaying must reproduce it exactly.
- republish: the embedded broker forgets every topic on restart; the evidence log does not. This
  re-encodes each stored event (same ids, same times, same bytes) into the topics.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC

from confluent_kafka import Consumer, KafkaException

from consumers.benchmark_state import derived_state, state_digest
from consumers.evidence.columns import table_columns
from consumers.evidence.exceptions import ConsumerFailed, ReplayError
from consumers.evidence.sink import EvidenceSink
from consumers.evidence.store import EvidenceStore, migrate
from consumers.prune import reapply_prunes
from producers.publisher import Publisher
from schemas import loader
from schemas.catalog import TOPICS, Topic
from schemas.codec import Codec

PAGE_ROWS = 20000
REPLAY_IDLE_EXIT_S = 4.0
REPLAY_TIMEOUT_S = 30.0  # to reach the broker, list the topics, and join the replay's consumer group


def rebuild(store: EvidenceStore, make_consumer: Callable[[str], Consumer], codec: Codec, topic_prefix: str,
            target_database: str, *, broker: str, timeout_s: float = REPLAY_TIMEOUT_S) -> EvidenceStore:
    """Drop and recreate target_database, then fill it from the topics with a fresh consumer group.

    make_consumer(group_id) builds the consumer (at the edge); broker names the cluster in errors.
    Every catalog topic must be readable before anything is dropped: otherwise ReplayError, one
    line naming the topic and the broker, within about timeout_s.
    """
    if target_database == store.database:
        raise ValueError(f"refusing to rebuild into the live database {target_database!r}")
    consumer = make_consumer(f"sepa-replay-{uuid.uuid4().hex[:12]}")
    try:
        _require_topics(consumer, [t.full_name(topic_prefix) for t in TOPICS], broker, timeout_s)
    except BaseException:
        consumer.close()
        raise
    target = store.with_database(target_database)
    target.command("DROP DATABASE IF EXISTS {database}")
    migrate(target)
    sink = EvidenceSink(target, consumer, None, codec, topic_prefix, fail_on_consumer_error=True)
    try:
        sink.run(threading.Event(), idle_exit_s=REPLAY_IDLE_EXIT_S, join_timeout_s=timeout_s)
    except ConsumerFailed as exc:
        raise ReplayError(f"replay from broker {broker} stopped, {target_database} is incomplete: {exc}") from exc
    reapply_prunes(store, target)
    return target


def _require_topics(consumer: Consumer, names: list[str], broker: str, timeout_s: float) -> None:
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        detail = error.str() if hasattr(error, "str") else str(error)
        raise ReplayError(f"cannot list the topics on broker {broker} within {timeout_s:.0f} s: {detail}") from None
    missing = [n for n in names if n not in metadata.topics or metadata.topics[n].error is not None]
    if missing:
        more = f" (and {len(missing) - 1} more: {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise ReplayError(f"topic {missing[0]} does not exist on broker {broker}{more}; nothing was rebuilt")


def compare(live: EvidenceStore, rebuilt: EvidenceStore) -> tuple[str, str, dict]:
    before, after = derived_state(live), derived_state(rebuilt)
    differences = {k: {"live": before[k], "rebuilt": after[k]} for k in before if before[k] != after[k]}
    return state_digest(before), state_digest(after), differences


def stored_events(store: EvidenceStore, topic: Topic) -> Iterator[dict]:
    """Every stored event of the topic, rebuilt into its schema's shape, oldest first."""
    columns = list(table_columns(topic))
    byte_columns = {c: "bytes" for c in _bytes_fields(topic)}
    offset = 0
    while True:
        rows = store.query(
            f"SELECT {', '.join(f'`{c}`' for c in columns)} FROM {{database}}.{topic.table} FINAL "
            f"ORDER BY envelope.event_time, envelope.event_id LIMIT {PAGE_ROWS} OFFSET {offset}",
            column_formats=byte_columns or None)
        for row in rows:
            record = dict(zip(columns, row, strict=True))
            event_type = record["envelope"]["event_type"]
            fields = [f["name"] for f in loader.expanded_schema(event_type)["fields"]]
            event = {name: record[name] for name in fields}
            event_time = event["envelope"]["event_time"]
            if event_time.tzinfo is None:  # ClickHouse hands DateTime64(6,'UTC') back naive
                event["envelope"] = {**event["envelope"], "event_time": event_time.replace(tzinfo=UTC)}
            yield event
        if len(rows) < PAGE_ROWS:
            return
        offset += PAGE_ROWS


def _bytes_fields(topic: Topic) -> list[str]:
    return sorted({f["name"] for t in topic.event_types for f in loader.expanded_schema(t)["fields"]
                   if f["type"] == "bytes" or (isinstance(f["type"], list) and "bytes" in f["type"])})


def republish(store: EvidenceStore, publisher: Publisher) -> dict[str, int]:
    counts = {}
    for topic in TOPICS:
        n = 0
        for event in stored_events(store, topic):
            publisher.publish(event)
            n += 1
        counts[topic.name] = n
    publisher.flush()
    return counts
