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
