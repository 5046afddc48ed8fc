import copy

import pytest

from schemas import loader
from schemas.exceptions import IncompatibleSchema
from schemas.manifest import Manifest, SchemaVersion, check_backward_compatible


def test_manifest_records_the_current_version_of_every_schema():
    # Fails when an .avsc changed without `python -m schemas.manifest update`.
    manifest = Manifest.load()
    assert manifest.outdated() == []
    manifest.check()


def test_schema_ids_are_unique_and_every_event_type_has_one():
    manifest = Manifest.load()
    ids = [v.schema_id for v in manifest.versions]
    assert len(ids) == len(set(ids))
    assert {v.event_type for v in manifest.versions} == set(loader.event_types())


def _version(schema: dict) -> SchemaVersion:
    return SchemaVersion("Promoted", 1, 999, "x", schema)


def test_adding_a_field_without_default_is_refused():
    old = loader.expanded_schema("Promoted")
    new = copy.deepcopy(old)
    new["fields"].append({"name": "approver", "type": "string"})
    import fastavro

    with pytest.raises(IncompatibleSchema, match="Promoted"):
        check_backward_compatible(_version(old), fastavro.parse_schema(new))


def test_adding_a_field_with_default_is_accepted():
    import fastavro

    old = loader.expanded_schema("Promoted")
    new = copy.deepcopy(old)
    new["fields"].append({"name": "approver", "type": "string", "default": ""})
    check_backward_compatible(_version(old), fastavro.parse_schema(new))


def test_update_appends_a_new_version_with_a_fresh_id(monkeypatch):
    manifest = Manifest.load()
    real = loader.fingerprint
    monkeypatch.setattr(loader, "fingerprint", lambda t: "changed" if t == "Retired" else real(t))
    before = manifest.latest("Retired").version
    added = manifest.update()
    assert [(v.event_type, v.version) for v in added] == [("Retired", before + 1)]
    assert added[0].schema_id == max(v.schema_id for v in Manifest.load().versions) + 1
    assert manifest.latest("Retired").version == before + 1
