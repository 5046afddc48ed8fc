"""Avro object container files built from raw message bodies, for ClickHouse's own Avro parser.

The sink never decodes Avro in Python on the fast path: a Confluent-framed message is a 5-byte
header plus a schemaless Avro body, and an object container is the writer schema plus blocks of
concatenated bodies. ClickHouse (C++) parses the container on INSERT ... FORMAT Avro.
"""

from __future__ import annotations

import os

from schemas.codec import encode_long, read_long, read_string

__all__ = ["object_container", "read_long", "read_string"]


def _bytes(b: bytes) -> bytes:
    return encode_long(len(b)) + b


def object_container(schema_json: str, bodies: list, count: int | None = None) -> bytes:
    """One container with one block holding every body, uncompressed.

    bodies are bytes-like; with count, they are the pieces of count records (a body and what the
    writer schema appends to it), concatenated in order."""
    # A random sync marker: a body that is longer or shorter than it claims cannot realign by chance.
    sync = os.urandom(16)
    metadata = (encode_long(2) + _bytes(b"avro.schema") + _bytes(schema_json.encode())
                + _bytes(b"avro.codec") + _bytes(b"null") + encode_long(0))
    records = len(bodies) if count is None else count
    size = sum(map(len, bodies))
    # One join: the bodies are copied once (a batch is megabytes).
    return b"".join([b"Obj\x01", metadata, sync, encode_long(records), encode_long(size), *bodies, sync])
