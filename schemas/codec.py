"""Confluent wire format for every topic: magic byte 0, 4-byte big-endian schema id, Avro body.

Kafka Connect, the ClickHouse Kafka engine (AvroConfluent) and other tools read this framing.
Schema ids come from the checked-in manifest, or from a Schema Registry when one is configured
(schemas/registry.py). Decoding reads older versions with the current schema (Avro resolution),
so consumers always see the current shape.

Every consumer refuses a malformed message for the same reason, in the same words: the checks
(Codec.frame, then the body in Codec.decode) run in one order, the magic byte is read unsigned,
and fastavro's messages are stripped of the stream reprs (memory addresses) they can carry. A
replay therefore reproduces each dead letter exactly.
"""

from __future__ import annotations

import io
import math
import re
import struct
from dataclasses import dataclass
from typing import Protocol

import fastavro

from schemas import loader
from schemas.catalog import MAX_MESSAGE_BYTES, Topic
from schemas.exceptions import DecodeError, InvalidEvent, SchemaError, UnknownEventType
from schemas.manifest import SchemaVersion, current_manifest

MAGIC = 0
_HEADER = struct.Struct(">BI")  # unsigned magic byte, big-endian schema id
# Header plus the shortest envelope start (a one-character event_id and its length byte).
MIN_FRAMED_BYTES = _HEADER.size + 2
_OBJECT_REPR = re.compile(r"<[^<>]*? at 0x[0-9a-fA-F]+>")  # fastavro puts stream reprs in its errors


class SchemaIds(Protocol):
    def latest(self, event_type: str) -> SchemaVersion: ...
    def by_id(self, schema_id: int) -> SchemaVersion: ...


class Codec:
    def __init__(self, schema_ids: SchemaIds | None = None):
        self.schema_ids = schema_ids or current_manifest()
        self._writers: dict[str, tuple[bytes, dict]] = {}
        self._framing: dict[int, tuple[SchemaVersion, bytes]] = {}  # schema id -> writer, its event_type bytes

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
        if buf.tell() > MAX_MESSAGE_BYTES:  # no topic would take it, and no consumer would read it
            raise InvalidEvent(f"{event_type} {event['envelope'].get('event_id', '')}: {buf.tell()} bytes encoded, "
                               f"over the {MAX_MESSAGE_BYTES}-byte limit of every topic")
        return buf.getvalue()

    def frame(self, data: bytes | None, topic: Topic | None = None) -> Frame:
        """The cheap checks, without decoding the body; raises DecodeError with the reason.

        In this order, for every consumer (the evidence sink's fast path, Codec.decode, the stream
        processors' Intake), so the same bytes always get the same reason: length (at most
        MAX_MESSAGE_BYTES, whatever a broker accepted), magic byte,
        known schema id, an event type the topic carries (when the topic is given), a readable and
        non-empty envelope.event_id, an envelope.event_type that is the schema id's event type.
        """
        if data is None or len(data) < MIN_FRAMED_BYTES:
            raise DecodeError(f"message of {len(data or b'')} bytes is too short for a framed event")
        if len(data) > MAX_MESSAGE_BYTES:
            raise DecodeError(f"message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES}-byte limit of every topic")
        magic, schema_id = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise DecodeError(f"magic byte {magic} is not the Confluent framing byte {MAGIC}")
        known = self._framing.get(schema_id)
        if known is None:
            try:
                writer = self.schema_ids.by_id(schema_id)
            except SchemaError as exc:
                raise DecodeError(str(exc)) from None
            known = self._framing[schema_id] = (writer, avro_string(writer.event_type.encode()))
        writer, type_bytes = known
        if topic is not None and writer.event_type not in topic.event_types:
            raise DecodeError(f"{writer.event_type} (schema id {schema_id}) does not belong on topic {topic.name} "
                              f"(it carries {', '.join(topic.event_types)})")
        try:
            event_id, pos = read_string(data, _HEADER.size)
        except ValueError as exc:
            raise DecodeError(f"{writer.event_type} (schema id {schema_id}): unreadable envelope.event_id: "
                              f"{exc}") from None
        if not event_id:
            raise DecodeError(f"{writer.event_type} (schema id {schema_id}): empty envelope.event_id")
        if not data.startswith(type_bytes, pos):
            try:
                said = read_string(data, pos)[0].decode("utf-8", "backslashreplace")
            except ValueError as exc:
                said = f"unreadable ({exc})"
            raise DecodeError(f"{writer.event_type} (schema id {schema_id}): envelope.event_type {said!r} is not "
                              f"{writer.event_type}, the event type of schema id {schema_id}")
        return Frame(writer, event_id)

    def decode(self, data: bytes | None, topic: Topic | None = None) -> dict:
        """Decode and check one framed event; raises DecodeError naming what was wrong.

        With a topic, an event type that topic does not carry is refused before the body is read.
        """
        writer = self.frame(data, topic).writer
        latest = self.schema_ids.latest(writer.event_type)
        reader = None if writer.version == latest.version else loader.parsed_schema(writer.event_type)
        buf = io.BytesIO(data)
        buf.seek(_HEADER.size)
        try:
            event = fastavro.schemaless_reader(buf, writer.parsed, reader)
        except Exception as exc:  # fastavro raises EOFError, ValueError, UnicodeDecodeError, ...
            raise DecodeError(body_reason(writer, exc)) from exc
        if buf.tell() != len(data):
            raise DecodeError(f"{writer.event_type} (schema id {writer.schema_id}): {len(data) - buf.tell()} "
                              "trailing bytes after the Avro body")
        return event


@dataclass(frozen=True)
class Frame:
    """What a message's framing and the start of its envelope say (Codec.frame)."""

    writer: SchemaVersion
    event_id: bytes


def body_reason(writer: SchemaVersion, exc: Exception) -> str:
    """The reason for a body fastavro cannot read: the same text for the same bytes in every run
    (fastavro's messages can embed the repr of its input stream, with a memory address)."""
    detail = _OBJECT_REPR.sub("the input", str(exc)).strip()
    what = "it ends before its record does (EOFError" if isinstance(exc, EOFError) else f"({type(exc).__name__}"
    return (f"{writer.event_type} (schema id {writer.schema_id}): undecodable body: {what}"
            + (f": {detail})" if detail else ")"))


def avro_string(raw: bytes) -> bytes:
    """raw as an Avro string: zigzag varint length, then the bytes."""
    return encode_long(len(raw)) + raw


def encode_long(n: int) -> bytes:
    """One Avro long: zigzag, then a base-128 varint."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_long(data: bytes, pos: int) -> tuple[int, int]:
    """Decode one zigzag varint at pos; returns (value, next position). ValueError if malformed."""
    shift = result = 0
    while True:
        if pos >= len(data):
            raise ValueError(f"varint runs past the end of a {len(data)}-byte message")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def read_string(data: bytes, pos: int) -> tuple[bytes, int]:
    """Decode one Avro string (or bytes) at pos; returns (raw bytes, next position)."""
    length, pos = read_long(data, pos)
    if length < 0 or pos + length > len(data):
        raise ValueError(f"string of length {length} runs past the end of a {len(data)}-byte message")
    return data[pos:pos + length], pos + length


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
