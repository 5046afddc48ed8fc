"""Writes schemas/records.py, the typed frozen record of every Avro schema, from schemas/avro.

    python -m schemas.records_codegen check    # exit 1 if records.py is not what the schemas give
    python -m schemas.records_codegen write    # regenerate it after changing a schema

The .avsc files stay the one definition of the contract; the records are derived from them, so a
field renamed in a schema is renamed in the code that reads it (or that code fails its tests), and
a record read from the wire is checked against the schema once, at the edge (schemas/typed.py).
A test runs ``check``, as ``python -m schemas.manifest check`` guards the versions.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from schemas import loader

TARGET = Path(__file__).parent / "records.py"
PRIMITIVES = {"string": "str", "int": "int", "long": "int", "double": "float", "float": "float",
              "boolean": "bool", "bytes": "bytes", "null": "None"}
HEADER = '''"""Typed, frozen records of every Avro schema in schemas/avro: GENERATED, do not edit.

Regenerate with ``python -m schemas.records_codegen write`` after changing a schema. Arrays are
tuples, maps are read-only mappings, enums are Literal strings. schemas/typed.py converts between
these records and the dicts fastavro reads and writes (``to_record``, ``to_avro``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Literal


def _empty_map() -> Mapping:
    return MappingProxyType({})
'''


def _short(name: str) -> str:
    return name.split(".")[-1]


def annotation(schema) -> str:
    """The Python annotation of one Avro type."""
    if isinstance(schema, str):
        return PRIMITIVES.get(schema) or _short(schema)
    if isinstance(schema, list):  # a union: None last, as Python code writes it
        return " | ".join(annotation(s) for s in sorted(schema, key=lambda s: s == "null"))
    kind = schema["type"]
    if schema.get("logicalType") == "timestamp-micros":
        return "datetime"
    if kind == "array":
        return f"tuple[{annotation(schema['items'])}, ...]"
    if kind == "map":
        return f"Mapping[str, {annotation(schema['values'])}]"
    if kind == "enum":
        return schema["name"]
    if kind == "record":
        return _short(schema["name"])
    return annotation(kind)


def default(schema, value) -> str:
    """The dataclass default for an Avro default: immutable (tuples, a read-only empty map). A
    record's default gives none: records are built from complete dicts, so none is needed."""
    kind = schema["type"] if isinstance(schema, dict) else None
    if kind == "map":
        if value:
            raise ValueError(f"a non-empty map default is not supported: {value!r}")
        return "field(default_factory=_empty_map)"
    if isinstance(value, dict):
        return ""
    if kind == "array":
        return repr(tuple(value))
    return repr(value)


def _docstring(doc: str) -> list[str]:
    doc = doc.replace(chr(34) * 3, chr(39) * 3)
    quote = chr(34) * 3
    wrapped = textwrap.wrap(doc, 96)
    if len(wrapped) == 1:
        return [f"    {quote}{doc}{quote}"]
    return [f"    {quote}{wrapped[0]}", *(f"    {w}" for w in wrapped[1:]), f"    {quote}"]


def _record_source(schema: dict) -> str:
    lines = ["", "", "@dataclass(frozen=True, slots=True, kw_only=True)", f"class {schema['name']}:"]
    lines += _docstring(schema.get("doc") or f"The Avro record {schema['name']}.")
    lines.append("")
    for f in schema["fields"]:
        line = f"    {f['name']}: {annotation(f['type'])}"
        value = default(f["type"], f["default"]) if "default" in f else ""
        lines.append(f"{line} = {value}" if value else line)
    return "\n".join(lines)


def _enum_source(schema: dict) -> str:
    symbols = [json.dumps(s) for s in schema["symbols"]]
    one_line = f"{schema['name']} = Literal[{', '.join(symbols)}]"
    if len(one_line) <= 120:
        return "\n\n" + one_line
    return "\n\n" + f"{schema['name']} = Literal[\n" + "".join(f"    {s},\n" for s in symbols) + "]"


def _nested_records(schema, out: list[dict]) -> None:
    """Records and enums defined inline (not in a file of their own), in definition order."""
    if isinstance(schema, list):
        for s in schema:
            _nested_records(s, out)
    elif isinstance(schema, dict):
        if schema.get("type") == "enum":
            out.append(schema)
        elif schema.get("type") == "record":
            for f in schema["fields"]:
                _nested_records(f["type"], out)
            out.append(schema)
        elif schema.get("type") == "array":
            _nested_records(schema["items"], out)
        elif schema.get("type") == "map":
            _nested_records(schema["values"], out)


def source() -> str:
    """The text of records.py for the schemas as they are now."""
    raw = {p.stem: json.loads(p.read_text()) for p in sorted(loader.AVRO_DIR.glob("*.avsc"))}
    order = [*loader.SHARED_TYPES, *sorted(set(raw) - set(loader.SHARED_TYPES))]
    parts, names = [HEADER], []
    for name in order:
        nested: list[dict] = []
        _nested_records(raw[name], nested)
        for record in nested:
            if record["type"] == "enum":
                parts.append(_enum_source(record))
                continue
            parts.append(_record_source(record))
            names.append(record["name"])
    parts.append("\n\n# Every record class by its Avro name.\nRECORDS: dict[str, type] = {\n"
                 + "".join(f"    {json.dumps(n)}: {n},\n" for n in names) + "}\n")
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    if argv not in (["check"], ["write"]):
        print("usage: python -m schemas.records_codegen check|write", file=sys.stderr)
        return 2
    text = source()
    if argv == ["write"]:
        TARGET.write_text(text)
        print(f"wrote {TARGET}")
        return 0
    if not TARGET.exists() or TARGET.read_text() != text:
        print(f"{TARGET} is not what schemas/avro gives: run `python -m schemas.records_codegen write`",
              file=sys.stderr)
        return 1
    print(f"{TARGET.name} matches schemas/avro")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
