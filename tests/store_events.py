"""Putting events into an evidence store the way the sink does: Avro bodies in one object container
per table and schema (consumers.evidence.store.insert_bodies), parsed by ClickHouse itself."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable

from consumers.evidence.store import EvidenceStore, insert_bodies
from schemas.catalog import topic_for
from schemas.codec import Codec
from schemas.manifest import current_manifest

HEADER_BYTES = 5  # Confluent framing: magic byte + 4-byte schema id


def store_events(store: EvidenceStore, events: Iterable[dict], codec: Codec | None = None) -> int:
    """Encode each event with the codec and insert it into its topic's table; returns the count."""
    codec = codec or Codec()
    groups: dict[tuple[str, str], list[bytes]] = defaultdict(list)
    for event in events:
        event_type = event["envelope"]["event_type"]
        groups[(topic_for(event_type).table, event_type)].append(codec.encode(event)[HEADER_BYTES:])
    for (table, event_type), bodies in groups.items():
        schema_json = json.dumps(current_manifest().latest(event_type).schema)
        insert_bodies(store, table, schema_json, bodies)
    return sum(len(b) for b in groups.values())


def _blank(schema) -> object:
    if isinstance(schema, list):  # a union: null when it may be, else its first branch
        return None if "null" in schema else _blank(schema[0])
    if isinstance(schema, dict):
        kind = schema["type"]
        if kind == "record":
            return {f["name"]: f["default"] if "default" in f else _blank(f["type"]) for f in schema["fields"]}
        if kind == "enum":
            return schema["symbols"][0]
        if kind == "array":
            return []
        if kind == "map":
            return {}
        return _blank(kind)
    return {"string": "", "int": 0, "long": 0, "float": 0.0, "double": 0.0, "boolean": False, "bytes": b"",
            "null": None}[schema]


def event(event_type: str, natural_key: tuple, event_time, **fields) -> dict:
    """A schema-complete event: every field the caller leaves out takes its Avro default, or an
    empty value of its type."""
    from schemas import loader
    from schemas.events import make_event

    blank = _blank(loader.expanded_schema(event_type))
    blank.pop("envelope")
    return make_event(event_type, natural_key, "test", "test-run", event_time=event_time, **{**blank, **fields})


class Collect:
    """A publisher that checks each event against its schema and keeps it (the recorder's side of
    producers.publisher.Publisher), for recording episodes without a broker."""

    def __init__(self):
        self.events, self.codec = [], Codec()

    def publish(self, event: dict) -> None:
        self.codec.encode(event)
        self.events.append(event)
