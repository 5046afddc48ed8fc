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
