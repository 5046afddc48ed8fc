import dataclasses
from datetime import UTC, datetime
from types import MappingProxyType

import pytest

from schemas import loader, records, records_codegen
from schemas.codec import Codec
from schemas.exceptions import InvalidEvent
from schemas.typed import _named, _resolve, to_avro, to_record

WHEN = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)


def example(schema, name: str = "x"):
    """A value of every field of ``schema``, none left to its default, so a round trip shows each."""
    schema = _resolve(schema)
    if isinstance(schema, list):
        return example(next(s for s in schema if s != "null"), name)
    if isinstance(schema, dict):
        kind = schema["type"]
        if schema.get("logicalType") == "timestamp-micros":
            return WHEN
        if kind == "record":
            return {f["name"]: example(f["type"], f["name"]) for f in schema["fields"]}
        if kind == "array":
            return [example(schema["items"], name), example(schema["items"], name)]
        if kind == "map":
            return {"k1": example(schema["values"], name), "k2": example(schema["values"], name)}
        if kind == "enum":
            return schema["symbols"][-1]
        return example(kind, name)
    return {"string": f"{name}-value", "int": 7, "long": 2**40, "double": 0.25, "float": 0.5, "boolean": True,
            "bytes": b"\x00\x01"}[schema]


def event_example(event_type: str) -> dict:
    event = example(f"{loader.NAMESPACE}.{event_type}")
    event["envelope"]["event_type"] = event_type
    event["envelope"]["schema_version"] = 1
    return event


def test_the_generated_records_are_what_the_schemas_give():
    assert records_codegen.main(["check"]) == 0


@pytest.mark.parametrize("event_type", loader.event_types())
def test_every_event_type_round_trips_through_its_record(event_type):
    codec = Codec()
    decoded = codec.decode(codec.encode(event_example(event_type)))
    record = to_record(decoded)
    assert type(record) is records.RECORDS[event_type]
    assert record.envelope.event_type == event_type
    assert to_avro(record) == decoded
    assert codec.decode(codec.encode(to_avro(record))) == decoded


def test_records_are_frozen_with_tuples_and_read_only_maps():
    cycle = to_record(event_example("CycleStarted"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cycle.seed = 3
    assert isinstance(cycle.models, tuple)
    proposed = to_record(event_example("CandidateProposed"))
    assert isinstance(proposed.scenario, records.ScenarioSpec)
    assert isinstance(proposed.scenario.distractors[0], records.Distractor)
    assert isinstance(proposed.scenario.perturbations, MappingProxyType)
    with pytest.raises(TypeError):
        proposed.scenario.perturbations["new"] = 1.0


def test_a_record_is_its_own_record():
    cycle = to_record(event_example("CycleStarted"))
    assert to_record(cycle) is cycle


def test_a_missing_field_is_named_at_the_edge():
    event = event_example("CycleStarted")
    del event["benchmark_version"]
    with pytest.raises(InvalidEvent, match=r"CycleStarted: CycleStarted is missing 'benchmark_version'"):
        to_record(event)


def test_a_field_left_out_that_has_a_default_takes_it():
    event = event_example("CycleStarted")
    del event["focus_models"]
    assert to_record(event).focus_models == ()


def test_an_unknown_or_renamed_field_is_named_with_the_fields_it_could_be():
    event = event_example("RolloutRequested")
    event["scenario"]["env"] = event["scenario"].pop("env_name")
    with pytest.raises(InvalidEvent, match=r"RolloutRequested\.scenario: ScenarioSpec has no field 'env'.*env_name"):
        to_record(event)


def test_a_wrong_nesting_is_named_by_its_path():
    event = event_example("RolloutRequested")
    event["scenario"]["distractors"] = [{"kind": "box"}]
    with pytest.raises(InvalidEvent, match=r"RolloutRequested\.scenario\.distractors\[0\]: Distractor is missing"):
        to_record(event)
    event["scenario"] = "scn-1"
    with pytest.raises(InvalidEvent, match=r"RolloutRequested\.scenario must be a ScenarioSpec record, got str"):
        to_record(event)


def test_not_an_event_and_an_unknown_record_are_refused():
    with pytest.raises(InvalidEvent, match="not an event"):
        to_record({"cycle_id": "c"})
    with pytest.raises(InvalidEvent, match="no record 'Nope'"):
        to_record({}, "Nope")


def test_every_record_of_the_schemas_has_a_class():
    assert {name.split(".")[-1] for name in _named()} == set(records.RECORDS)
