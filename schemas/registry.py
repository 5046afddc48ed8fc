"""Schema ids from a Confluent Schema Registry, for deployments that run one.

Subjects follow the RecordNameStrategy (``sepa.Step``, ``sepa.Promoted``...), because one topic
carries several event types. Our own manifest stays the source of the schemas; the registry only
assigns the ids that go into the framing, so Kafka Connect and ClickHouse's AvroConfluent format
can resolve them.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request

from schemas import loader
from schemas.exceptions import SchemaError, UnknownSchemaId
from schemas.manifest import Manifest, SchemaVersion, current_manifest

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryError(SchemaError):
    """The Schema Registry refused a request or could not be reached."""


class RegistrySchemaIds:
    def __init__(self, url: str, manifest: Manifest | None = None, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.manifest = manifest or current_manifest()
        self.timeout = timeout
        self._latest: dict[str, SchemaVersion] = {}
        self._by_id: dict[int, SchemaVersion] = {}

    @property
    def versions(self) -> list[SchemaVersion]:
        return list(self._by_id.values())

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise RegistryError(f"{method} {self.url}{path}: HTTP {exc.code}: {exc.read()[:300]!r}") from exc
        except OSError as exc:
            raise RegistryError(f"{method} {self.url}{path}: {exc}") from exc

    def latest(self, event_type: str) -> SchemaVersion:
        if event_type not in self._latest:
            local = self.manifest.latest(event_type)
            reply = self._call("POST", f"/subjects/{loader.NAMESPACE}.{event_type}/versions",
                               {"schema": json.dumps(local.schema)})
            registered = dataclasses.replace(local, schema_id=int(reply["id"]))
            self._latest[event_type] = registered
            self._by_id[registered.schema_id] = registered
        return self._latest[event_type]

    def by_id(self, schema_id: int) -> SchemaVersion:
        if schema_id not in self._by_id:
            try:
                schema = json.loads(self._call("GET", f"/schemas/ids/{schema_id}")["schema"])
            except RegistryError as exc:
                raise UnknownSchemaId(f"schema id {schema_id}: {exc}") from exc
            fingerprint = _fingerprint(schema)
            known = [v for v in self.manifest.versions if v.fingerprint == fingerprint]
            if not known:
                raise UnknownSchemaId(f"schema id {schema_id} in {self.url} matches no version in the manifest")
            self._by_id[schema_id] = dataclasses.replace(known[0], schema_id=schema_id)
        return self._by_id[schema_id]


def _fingerprint(schema: dict) -> str:
    import fastavro

    return fastavro.schema.fingerprint(fastavro.schema.to_parsing_canonical_form(schema), "SHA-256")


def schema_ids_for(registry_url: str | None):
    """The manifest's ids, or a registry's when one is configured (decided at the edge)."""
    return RegistrySchemaIds(registry_url) if registry_url else current_manifest()
