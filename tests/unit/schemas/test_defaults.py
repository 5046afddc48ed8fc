"""ClickHouse's Avro parser needs a record default to spell out every field of the record (it
refused a whole batch with "No value found in default for parent_id" when Promoted.scenario's
default named four of them); fastavro does not mind, so only this test would notice."""

from schemas import loader


def _record_defaults(node, path, named, found):
    if isinstance(node, dict):
        if node.get("type") == "record":
            named[node["name"]] = node
            for f in node["fields"]:
                ftype = f["type"]
                if isinstance(ftype, str):
                    ftype = named.get(ftype.split(".")[-1], ftype)
                if isinstance(ftype, dict) and ftype.get("type") == "record" and "default" in f:
                    found.append((f"{path}.{f['name']}", ftype, f["default"]))
                _record_defaults(f["type"], f"{path}.{f['name']}", named, found)
        else:
            for v in node.values():
                _record_defaults(v, path, named, found)
    elif isinstance(node, list):
        for v in node:
            _record_defaults(v, path, named, found)


def test_every_record_default_names_every_field_of_its_record():
    checked = 0
    for event_type in loader.event_types():
        found: list = []
        _record_defaults(loader.expanded_schema(event_type), event_type, {}, found)
        for path, record, default in found:
            assert set(default) == {f["name"] for f in record["fields"]}, f"{path}: default misses fields"
            checked += 1
    assert checked >= 2  # Promoted.scenario, ClusterUpdated.representative_scenario
