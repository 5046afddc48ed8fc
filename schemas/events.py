"""Building events: envelopes, stable event ids, timestamps.

An event is a plain dict shaped by its Avro schema (``envelope`` first). Event ids come from the
event's natural key, so the same fact produced twice (a retry, a replay, a re-run with the same
seed) carries the same id and the evidence log counts it once.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from schemas.manifest import current_manifest


def stable_id(*parts: object) -> str:
    """A 32-hex id derived from the parts; the same parts always give the same id."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:32]


def utc_now() -> datetime:
    return datetime.now(UTC)


def envelope(event_type: str, natural_key: tuple, producer: str, run_id: str,
             event_time: datetime | None = None) -> dict:
    if event_time is not None and event_time.tzinfo is None:
        raise ValueError(f"{event_type}: event_time must be timezone-aware, got naive {event_time!r}")
    return {
        "event_id": stable_id(event_type, *natural_key),
        "event_type": event_type,
        "event_time": event_time or utc_now(),
        "producer": producer,
        "run_id": run_id,
        "schema_version": current_manifest().latest(event_type).version,
    }


def make_event(event_type: str, natural_key: tuple, producer: str, run_id: str,
               event_time: datetime | None = None, **fields) -> dict:
    return {"envelope": envelope(event_type, natural_key, producer, run_id, event_time), **fields}


def dead_letter(consumer: str, run_id: str, topic: str, partition: int, offset: int, key: bytes | None,
                value: bytes | None, reason: str, timestamp_ms: int | None = None) -> dict:
    """The DeadLetter event every consumer emits for a message it cannot accept.

    Its id comes from (consumer, topic, partition, offset) and its time from the message's own
    timestamp when known, so judging the same message again (after a crash, in a replay) yields
    an identical event that the evidence log counts once.
    """
    if partition is None or offset is None:
        raise ValueError(f"a dead letter needs the message's partition and offset, got {partition!r} and {offset!r} "
                         f"on {topic!r}: a consumer error is not a message")
    event_time = datetime.fromtimestamp(timestamp_ms / 1000, UTC) if timestamp_ms and timestamp_ms > 0 else None
    return make_event("DeadLetter", (consumer, topic, partition, offset), consumer, run_id, event_time=event_time,
                      source_topic=topic, source_partition=int(partition), source_offset=int(offset),
                      source_key=key, original=value or b"", reason=reason[:2000], consumer=consumer)
