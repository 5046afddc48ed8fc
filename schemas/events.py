"""Building events: envelopes, stable event ids, timestamps.

An event is built as a plain dict shaped by its Avro schema (``envelope`` first), which the codec
checks on encode; consumers that act on it read it as its typed record (schemas/typed.py). Event
ids come from the event's natural key, so the same fact produced twice (a retry, a replay, a re-run
with the same seed) carries the same id and the evidence log counts it once.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from schemas.catalog import DEAD_LETTER_EXCERPT_BYTES
from schemas.manifest import current_manifest

MAX_REASON_CHARS = 2000


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


def refusal_reason(exc: BaseException) -> str:
    """What a consumer writes as a dead letter's reason for ``exc``: a codec refusal's own text,
    which is a function of the bytes alone (so every consumer gives the same bytes the same reason),
    else the exception's type and text."""
    from schemas.exceptions import SchemaError

    return str(exc) if isinstance(exc, SchemaError) else f"{type(exc).__name__}: {exc}"


def dead_letter(consumer: str, run_id: str, topic: str, partition: int, offset: int, key: bytes | None,
                value: bytes | None, reason: str, timestamp_ms: int | None = None) -> dict:
    """The DeadLetter event every consumer emits for a message it cannot accept.

    Its id comes from (consumer, topic, partition, offset) and its time from the message's own
    timestamp when known, so judging the same message again (after a crash, in a replay) yields
    an identical event that the evidence log counts once. A value over DEAD_LETTER_EXCERPT_BYTES is
    kept as its first DEAD_LETTER_EXCERPT_BYTES, the reason saying its size and sha256: a dead letter
    must be sendable whatever arrived (one of 10 MB used to kill every consumer that met it).
    """
    if partition is None or offset is None:
        raise ValueError(f"a dead letter needs the message's partition and offset, got {partition!r} and {offset!r} "
                         f"on {topic!r}: a consumer error is not a message")
    event_time = datetime.fromtimestamp(timestamp_ms / 1000, UTC) if timestamp_ms and timestamp_ms > 0 else None
    value = value or b""
    if len(value) > DEAD_LETTER_EXCERPT_BYTES:
        kept = (f" [value of {len(value)} bytes, sha256 {hashlib.sha256(value).hexdigest()}; its first "
                f"{DEAD_LETTER_EXCERPT_BYTES} bytes kept]")
        reason, value = reason[:MAX_REASON_CHARS - len(kept)] + kept, value[:DEAD_LETTER_EXCERPT_BYTES]
    if key is not None and len(key) > DEAD_LETTER_EXCERPT_BYTES:
        key = key[:DEAD_LETTER_EXCERPT_BYTES]
    return make_event("DeadLetter", (consumer, topic, partition, offset), consumer, run_id, event_time=event_time,
                      source_topic=topic, source_partition=int(partition), source_offset=int(offset),
                      source_key=key, original=value, reason=reason[:MAX_REASON_CHARS], consumer=consumer)
