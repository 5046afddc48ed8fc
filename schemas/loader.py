"""Load the Avro schemas in schemas/avro: the single source of truth for every event.

Shared record types (Envelope, ScenarioSpec, ...) are parsed first so event schemas can refer to
them by name. An *event type* is a record whose first field is ``envelope``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import fastavro

from schemas.exceptions import UnknownEventType

AVRO_DIR = Path(__file__).parent / "avro"
NAMESPACE = "sepa"

# Parse order matters: a type must be parsed before a schema that names it.
SHARED_TYPES = ("Envelope", "Distractor", "ObjectPose", "Contact", "ExecutionQuality", "ScenarioSpec", "MomentOutcome")


def _read(name: str) -> dict:
    return json.loads((AVRO_DIR / f"{name}.avsc").read_text())


@lru_cache(maxsize=1)
def _parsed() -> tuple[dict[str, dict], dict[str, dict]]:
    named: dict[str, dict] = {}
    for name in SHARED_TYPES:
        fastavro.parse_schema(_read(name), named_schemas=named)
    events: dict[str, dict] = {}
    for path in sorted(AVRO_DIR.glob("*.avsc")):
        if path.stem in SHARED_TYPES:
            continue
        raw = _read(path.stem)
        if raw["fields"][0]["name"] != "envelope":
            raise ValueError(f"{path}: an event schema must start with the envelope field")
        events[path.stem] = fastavro.parse_schema(raw, named_schemas=dict(named))
    return named, events


def event_types() -> tuple[str, ...]:
    return tuple(sorted(_parsed()[1]))


def parsed_schema(event_type: str) -> dict:
    try:
        return _parsed()[1][event_type]
    except KeyError:
        raise UnknownEventType(f"no schema for event type {event_type!r} in {AVRO_DIR}") from None


def _inline(node, seen: set[str]):
    """Replace the first reference to each shared type by its definition; Avro forbids defining
    a name twice, so later references stay by name."""
    if isinstance(node, str) and node.startswith(f"{NAMESPACE}."):
        short = node.split(".", 1)[1]
        if node in seen or short not in SHARED_TYPES:
            return node
        seen.add(node)
        return _inline(_read(short), seen)
    if isinstance(node, dict):
        if node.get("type") == "record" and "namespace" in node:
            seen.add(f"{node['namespace']}.{node['name']}")
        return {k: _inline(v, seen) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, seen) for v in node]
    return node


def expanded_schema(event_type: str) -> dict:
    """The schema with every named type inlined, defaults and docs kept: what a Schema Registry,
    the manifest's history and other tools (Kafka Connect, ClickHouse AvroConfluent) need."""
    parsed_schema(event_type)  # raises UnknownEventType
    return _inline(_read(event_type), set())


def canonical_form(event_type: str) -> str:
    return fastavro.schema.to_parsing_canonical_form(expanded_schema(event_type))


def fingerprint(event_type: str) -> str:
    return fastavro.schema.fingerprint(canonical_form(event_type), "SHA-256")


def shared_schema(name: str) -> dict:
    return _parsed()[0][f"{NAMESPACE}.{name}"]
