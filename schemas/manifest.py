"""Deterministic schema ids and the version history of every event schema.

schemas/manifest.json records, per event type, each version ever published: its schema id, its
fingerprint and its full expanded schema. Ids are assigned once, in order, and never reused, so
framed messages stay decodable forever without a Schema Registry.

Usage:
    python -m schemas.manifest check     # exit 1 when a schema changed without a new version
    python -m schemas.manifest update    # append new versions (after a backward-compat check)
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import fastavro
from fastavro.utils import generate_many

from schemas import loader
from schemas.exceptions import IncompatibleSchema, ManifestOutdated, UnknownEventType, UnknownSchemaId

MANIFEST_PATH = Path(__file__).parent / "manifest.json"
COMPAT_SAMPLES = 25  # random records per old version read back with the new schema


@dataclass(frozen=True)
class SchemaVersion:
    event_type: str
    version: int
    schema_id: int
    fingerprint: str
    schema: dict  # expanded, as written

    @cached_property
    def parsed(self) -> dict:
        return fastavro.parse_schema(self.schema)


class Manifest:
    def __init__(self, versions: list[SchemaVersion]):
        self.versions = versions
        self._by_id = {v.schema_id: v for v in versions}
        self._latest: dict[str, SchemaVersion] = {}
        for v in sorted(versions, key=lambda v: v.version):
            self._latest[v.event_type] = v

    @classmethod
    def load(cls, path: Path = MANIFEST_PATH) -> Manifest:
        if not path.exists():
            return cls([])
        raw = json.loads(path.read_text())
        return cls([SchemaVersion(**entry) for entry in raw["versions"]])

    def save(self, path: Path = MANIFEST_PATH) -> None:
        fields = ("event_type", "version", "schema_id", "fingerprint", "schema")
        entries = [{f: getattr(v, f) for f in fields} for v in sorted(self.versions, key=lambda v: v.schema_id)]
        path.write_text(json.dumps({"versions": entries}, indent=1, sort_keys=True) + "\n")

    def latest(self, event_type: str) -> SchemaVersion:
        try:
            return self._latest[event_type]
        except KeyError:
            raise UnknownEventType(f"event type {event_type!r} is not in {MANIFEST_PATH.name}") from None

    def by_id(self, schema_id: int) -> SchemaVersion:
        try:
            return self._by_id[schema_id]
        except KeyError:
            raise UnknownSchemaId(f"schema id {schema_id} is not in {MANIFEST_PATH.name}") from None

    def history(self, event_type: str) -> list[SchemaVersion]:
        return sorted((v for v in self.versions if v.event_type == event_type), key=lambda v: v.version)

    def outdated(self) -> list[str]:
        """Event types whose .avsc differs from their latest manifest version (or are missing)."""
        return [t for t in loader.event_types()
                if t not in self._latest or self._latest[t].fingerprint != loader.fingerprint(t)]

    def check(self) -> None:
        stale = self.outdated()
        if stale:
            raise ManifestOutdated(
                f"schemas changed without a new manifest version: {', '.join(stale)}; "
                "run `python -m schemas.manifest update`")
        for event_type in loader.event_types():
            for old in self.history(event_type)[:-1]:
                check_backward_compatible(old, loader.parsed_schema(event_type))

    def update(self) -> list[SchemaVersion]:
        added = []
        next_id = max(self._by_id, default=0) + 1
        for event_type in self.outdated():
            previous = self._latest.get(event_type)
            if previous is not None:
                check_backward_compatible(previous, loader.parsed_schema(event_type))
            entry = SchemaVersion(
                event_type=event_type,
                version=(previous.version + 1) if previous else 1,
                schema_id=next_id,
                fingerprint=loader.fingerprint(event_type),
                schema=loader.expanded_schema(event_type))
            next_id += 1
            added.append(entry)
        self.__init__(self.versions + added)
        return added


def check_backward_compatible(old: SchemaVersion, new_parsed: dict) -> None:
    """Backward compatible = the new schema reads what the old one wrote (Avro resolution)."""
    for i, record in enumerate(generate_many(old.parsed, COMPAT_SAMPLES)):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, old.parsed, record)
        buf.seek(0)
        try:
            fastavro.schemaless_reader(buf, old.parsed, new_parsed)
        except Exception as exc:  # fastavro raises several types for resolution failures
            raise IncompatibleSchema(
                f"{old.event_type}: the current schema cannot read version {old.version} "
                f"(schema id {old.schema_id}), sample {i}: {exc}") from exc


@lru_cache(maxsize=1)
def current_manifest() -> Manifest:
    return Manifest.load()


def main(argv: list[str]) -> int:
    manifest = Manifest.load()
    if argv[:1] == ["update"]:
        added = manifest.update()
        manifest.save()
        for v in added:
            print(f"{v.event_type} v{v.version} -> schema id {v.schema_id}")
        return 0
    if argv[:1] == ["check"]:
        manifest.check()
        print(f"manifest up to date: {len(loader.event_types())} event types")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
