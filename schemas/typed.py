"""The edge between the dicts fastavro reads and writes and the typed records of schemas/records.py.

    event = codec.decode(data)            # a dict, as fastavro reads it (the sink stores these)
    cycle = to_record(event)              # records.CycleStarted: checked once, frozen
    cycle.benchmark_version, cycle.envelope.event_time
    codec.encode(to_avro(cycle))          # and back

``to_record`` refuses a dict that is not exactly its schema's record (a key missing without a
default, a key the schema does not have, a wrong nesting) with an InvalidEvent naming the path,
so a renamed or missing field fails where the event enters, never as a KeyError or a silent
default deep inside a processor. The hot path (one Step event per control step, read by the
failure detector and the sink) stays on dicts, and fastavro's decode is its check: measured here,
a Step's record costs ~50 us against ~15 us for its decode, which would triple the detector's
per-step intake.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from types import MappingProxyType
from typing import Any

from schemas import loader
from schemas.exceptions import InvalidEvent
from schemas.records import RECORDS


@cache
def _named() -> dict[str, dict]:
    """Every record schema by its full name, as written in the .avsc files (named references kept)."""
    import json

    out: dict[str, dict] = {}

    def visit(schema) -> None:
        if isinstance(schema, list):
            for s in schema:
                visit(s)
        elif isinstance(schema, dict):
            if schema.get("type") == "record":
                out[f"{loader.NAMESPACE}.{schema['name']}"] = schema
                for f in schema["fields"]:
                    visit(f["type"])
            elif schema.get("type") in ("array", "map"):
                visit(schema.get("items") or schema.get("values"))

    for path in sorted(loader.AVRO_DIR.glob("*.avsc")):
        visit(json.loads(path.read_text()))
    return out


def _resolve(schema):
    if isinstance(schema, str) and schema.startswith(f"{loader.NAMESPACE}."):
        return _named()[schema]
    return schema


def _convert(schema, value: Any, path: str) -> Any:
    schema = _resolve(schema)
    if isinstance(schema, list):  # ["null", T]: the unions of these schemas
        if value is None:
            return None
        branches = [s for s in schema if s != "null"]
        return _convert(branches[0], value, path) if len(branches) == 1 else value
    if not isinstance(schema, dict):
        return value  # primitives: fastavro checked them on decode and checks them again on encode
    kind = schema["type"]
    if kind == "record":
        return _record(schema, value, path)
    if kind == "array":
        if not isinstance(value, (list, tuple)):
            raise InvalidEvent(f"{path} must be an array, got {type(value).__name__}")
        return tuple(_convert(schema["items"], v, f"{path}[{i}]") for i, v in enumerate(value))
    if kind == "map":
        if not isinstance(value, dict | MappingProxyType):
            raise InvalidEvent(f"{path} must be a map, got {type(value).__name__}")
        return MappingProxyType({k: _convert(schema["values"], v, f"{path}.{k}") for k, v in value.items()})
    return value


def _record(schema: dict, value: Any, path: str):
    cls = RECORDS[schema["name"]]
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise InvalidEvent(f"{path} must be a {schema['name']} record, got {type(value).__name__}")
    fields = {f["name"]: f for f in schema["fields"]}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise InvalidEvent(f"{path}: {schema['name']} has no field {', '.join(map(repr, unknown))} "
                           f"(its fields: {', '.join(fields)})")
    missing = [name for name, f in fields.items() if name not in value and "default" not in f]
    if missing:
        raise InvalidEvent(f"{path}: {schema['name']} is missing {', '.join(map(repr, missing))}")
    kwargs = {}
    for name, f in fields.items():
        raw = value[name] if name in value else f["default"]
        kwargs[name] = _convert(f["type"], raw, f"{path}.{name}")
    return cls(**kwargs)


def to_record(event: dict, record_name: str | None = None):
    """The typed record of one event dict (its event type from its envelope), or of one shared
    record (``record_name``, e.g. "ScenarioSpec"); a record is returned as it is. Raises InvalidEvent
    naming the path at fault."""
    if type(event).__name__ in RECORDS and isinstance(event, RECORDS[type(event).__name__]):
        return event  # a record is checked already
    if record_name is None:
        try:
            record_name = event["envelope"]["event_type"]
        except (KeyError, TypeError):
            raise InvalidEvent(f"not an event (no envelope.event_type): {str(event)[:200]}") from None
    schema = _named().get(f"{loader.NAMESPACE}.{record_name}")
    if schema is None:
        raise InvalidEvent(f"no record {record_name!r} in schemas/avro")
    return _record(schema, event, record_name)


def to_avro(record) -> Any:
    """The plain value fastavro writes: records as dicts, tuples as lists, mappings as dicts."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_avro(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, tuple):
        return [to_avro(v) for v in record]
    if isinstance(record, dict | MappingProxyType):
        return {k: to_avro(v) for k, v in record.items()}
    return record
