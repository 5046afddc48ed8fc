"""Confluent wire format for every topic: magic byte 0, 4-byte big-endian schema id, Avro body.

Kafka Connect, the ClickHouse Kafka engine (AvroConfluent) and other tools read this framing.
Schema ids come from the checked-in manifest, or from a Schema Registry when one is configured
(schemas/registry.py). Decoding reads older versions with the current schema (Avro resolution),
so consumers always see the current shape.
"""

from __future__ import annotations

import io
import math
import struct
from typing import Protocol

import fastavro

from schemas import loader
from schemas.exceptions import DecodeError, InvalidEvent, SchemaError, UnknownEventType
from schemas.manifest import SchemaVersion, current_manifest

MAGIC = 0
_HEADER = struct.Struct(">bI")


class SchemaIds(Protocol):
    def latest(self, event_type: str) -> SchemaVersion: ...
    def by_id(self, schema_id: int) -> SchemaVersion: ...


class Codec:
    def __init__(self, schema_ids: SchemaIds | None = None):
        self.schema_ids = schema_ids or current_manifest()
        self._writers: dict[str, tuple[bytes, dict]] = {}

    def _writer(self, event_type: str) -> tuple[bytes, dict]:
        cached = self._writers.get(event_type)
        if cached is None:
            version = self.schema_ids.latest(event_type)
            cached = (_HEADER.pack(MAGIC, version.schema_id), loader.parsed_schema(event_type))
            self._writers[event_type] = cached
        return cached

    def encode(self, event: dict) -> bytes:
        try:
            event_type = event["envelope"]["event_type"]
        except (KeyError, TypeError):
            raise InvalidEvent(f"event has no envelope.event_type: {str(event)[:200]}") from None
        header, schema = self._writer(event_type)
        buf = io.BytesIO()
        buf.write(header)
        try:
            fastavro.schemaless_writer(buf, schema, event)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InvalidEvent(f"{event_type}: does not match its schema: {exc}") from exc
        return buf.getvalue()

    def decode(self, data: bytes | None) -> dict:
        """Decode and check one framed event; raises DecodeError naming what was wrong."""
        if not data or len(data) < _HEADER.size + 1:
            raise DecodeError(f"message of {len(data or b'')} bytes is too short for a framed event")
        magic, schema_id = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise DecodeError(f"magic byte {magic} is not the Confluent framing byte 0")
        try:
            writer = self.schema_ids.by_id(schema_id)
        except SchemaError as exc:
            raise DecodeError(str(exc)) from exc
        latest = self.schema_ids.latest(writer.event_type)
        reader = None if writer.version == latest.version else loader.parsed_schema(writer.event_type)
        buf = io.BytesIO(data)
        buf.seek(_HEADER.size)
        try:
            event = fastavro.schemaless_reader(buf, writer.parsed, reader)
        except Exception as exc:  # fastavro raises EOFError, ValueError, UnicodeDecodeError, ...
            raise DecodeError(f"{writer.event_type} (schema id {schema_id}): undecodable body: "
                              f"{type(exc).__name__}: {exc}") from exc
        if buf.tell() != len(data):
            raise DecodeError(f"{writer.event_type} (schema id {schema_id}): {len(data) - buf.tell()} "
                              "trailing bytes after the Avro body")
        check_envelope(writer.event_type, event["envelope"])
        return event


def check_envelope(event_type: str, env: dict) -> None:
    if env["event_type"] != event_type:
        raise DecodeError(f"envelope says event_type {env['event_type']!r} but the schema id is "
                          f"for {event_type!r}")
    if not env["event_id"]:
        raise DecodeError(f"{event_type}: empty envelope.event_id")


def require_finite(event: dict) -> None:
    """Physical signals must be numbers: stream processors dead-letter a NaN step rather than
    reason about it. (The evidence log stores it: it is schema-valid evidence.)"""
    env = event["envelope"]
    event_type = env["event_type"]
    for name, value in event.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise DecodeError(f"{event_type} {env['event_id']}: field {name} is {value}")
        if isinstance(value, list) and value and isinstance(value[0], float) \
                and not all(math.isfinite(v) for v in value):
            raise DecodeError(f"{event_type} {env['event_id']}: field {name} holds a non-finite value")


def event_type_of(event: dict) -> str:
    try:
        return event["envelope"]["event_type"]
    except (KeyError, TypeError):
        raise UnknownEventType(f"not an event: {str(event)[:200]}") from None
