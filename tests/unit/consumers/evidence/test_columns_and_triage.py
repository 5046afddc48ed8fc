import pytest

from consumers.evidence.avro_container import read_long, read_string
from consumers.evidence.columns import clickhouse_type, table_columns
from consumers.evidence.sink import Accepted, Refused, triage
from schemas.catalog import BY_NAME, TOPICS
from schemas.codec import Codec
from schemas.events import make_event
from schemas.manifest import current_manifest


def test_every_topic_maps_to_a_table_without_conflicts():
    for topic in TOPICS:
        columns = table_columns(topic)
        assert columns["envelope"].startswith("Tuple(event_id String")
        assert topic.key_field in columns


def test_null_unions_of_complex_types_are_refused():
    with pytest.raises(ValueError, match="Nullable"):
        clickhouse_type(["null", {"type": "array", "items": "double"}])
    assert clickhouse_type(["null", "string"]) == "Nullable(String)"
    assert clickhouse_type({"type": "long", "logicalType": "timestamp-micros"}) == "DateTime64(6, 'UTC')"


def test_varint_reader_matches_avro_zigzag():
    assert read_long(b"\x00", 0) == (0, 1)
    assert read_long(b"\x01", 0) == (-1, 1)
    assert read_long(b"\x80\x01", 0) == (64, 2)
    assert read_string(b"\x06abc", 0) == (b"abc", 4)
    with pytest.raises(ValueError):
        read_string(b"\x06ab", 0)


def _promoted():
    return make_event("Promoted", ("s1",), "gate", "r", scenario_id="s1", reason="ok", evidence_event_ids=[],
                      gate_version="1")


def test_triage_accepts_a_framed_event_on_its_topic():
    data = Codec().encode(_promoted())
    verdict = triage(data, BY_NAME["benchmark.decisions"], current_manifest())
    assert isinstance(verdict, Accepted)
    assert verdict.table == "benchmark_decisions" and verdict.body == data[5:]


@pytest.mark.parametrize("mutate, reason", [
    (lambda d: b"not avro at all", "magic byte"),
    (lambda d: d[:3], "too short"),
    (lambda d: d[:1] + (4242).to_bytes(4, "big") + d[5:], "schema id 4242"),
    (lambda d: d[:5] + b"\x7f\x01", "unreadable envelope"),
])
def test_triage_refuses_with_a_reason(mutate, reason):
    verdict = triage(mutate(Codec().encode(_promoted())), BY_NAME["benchmark.decisions"], current_manifest())
    assert isinstance(verdict, Refused)
    assert reason in verdict.reason


def test_triage_refuses_an_event_on_the_wrong_topic():
    verdict = triage(Codec().encode(_promoted()), BY_NAME["rollout.steps"], current_manifest())
    assert isinstance(verdict, Refused) and "does not belong on topic rollout.steps" in verdict.reason
