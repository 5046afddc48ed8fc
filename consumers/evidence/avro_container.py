"""Avro object container files built from raw message bodies, for ClickHouse's own Avro parser.

The sink never decodes Avro in Python on the fast path: a Confluent-framed message is a 5-byte
header plus a schemaless Avro body, and an object container is the writer schema plus blocks of
concatenated bodies. ClickHouse (C++) parses the container on INSERT ... FORMAT Avro.
"""

from __future__ import annotations

import os


def _long(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _bytes(b: bytes) -> bytes:
    return _long(len(b)) + b


def object_container(schema_json: str, bodies: list[bytes]) -> bytes:
    """One container with one block holding every body, uncompressed."""
    # A random sync marker: a body that is longer or shorter than it claims cannot realign by chance.
    sync = os.urandom(16)
    metadata = (_long(2) + _bytes(b"avro.schema") + _bytes(schema_json.encode())
                + _bytes(b"avro.codec") + _bytes(b"null") + _long(0))
    payload = b"".join(bodies)
    return b"Obj\x01" + metadata + sync + _long(len(bodies)) + _long(len(payload)) + payload + sync


def read_long(data: bytes, pos: int) -> tuple[int, int]:
    """Decode one zigzag varint at pos; returns (value, next position). IndexError if truncated."""
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def read_string(data: bytes, pos: int) -> tuple[bytes, int]:
    length, pos = read_long(data, pos)
    if length < 0 or pos + length > len(data):
        raise ValueError(f"string of length {length} runs past the end of a {len(data)}-byte message")
    return data[pos:pos + length], pos + length
