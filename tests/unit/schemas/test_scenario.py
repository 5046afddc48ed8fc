import json

import pytest

from schemas.exceptions import ScenarioError
from schemas.scenario import Distractor, ScenarioSpec


def spec(**kw):
    base = dict(env_name="Lift", horizon=100, instruction="lift the cube")
    base.update(kw)
    return ScenarioSpec(**base)


def test_scenario_id_is_stable_and_content_based():
    a = spec(placement_x_range=[-0.1, 0.1], distractors=[Distractor(kind="box", size=0.02, x=0.1, y=0)])
    b = spec(placement_x_range=(-0.1, 0.1), distractors=(Distractor(kind="box", size=0.02, x=0.1, y=0.0),))
    assert a == b
    assert a.scenario_id == b.scenario_id
    assert a.scenario_id.startswith("scn-") and len(a.scenario_id) == 4 + 16
    assert spec(horizon=101).scenario_id != spec().scenario_id
    assert spec(seed=1).scenario_id != spec().scenario_id


def test_scenario_id_golden():
    # Guards the canonical form: changing it re-identifies every stored scenario.
    assert spec().scenario_id == spec(horizon=100).scenario_id
    assert spec().scenario_id == "scn-" + __import__("hashlib").sha256(json.dumps({
        "env_name": "Lift", "robot": "Panda", "horizon": 100, "instruction": "lift the cube",
        "placement_x_range": None, "placement_y_range": None, "pose_offset_xyz": [0.0, 0.0, 0.0],
        "object_friction": None, "object_mass": None, "object_rgba": None, "object_size_scale": 1.0,
        "distractors": [], "seed": 0}, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def test_parent_id_not_in_hash_and_mutate_links_parent():
    parent = spec()
    child = parent.mutate(object_mass=0.5)
    assert child.parent_id == parent.scenario_id
    assert child.scenario_id != parent.scenario_id
    assert spec(parent_id="scn-whatever").scenario_id == parent.scenario_id
    with pytest.raises(ScenarioError):
        parent.mutate(parent_id="x")


def test_round_trip_plain_json():
    s = spec(placement_x_range=(-0.05, 0.05), placement_y_range=(0.0, 0.02), pose_offset_xyz=(0.01, 0, 0),
             object_friction=0.3, object_mass=0.2, object_rgba=(0, 1, 0, 1), object_size_scale=1.2,
             distractors=(Distractor(kind="ball", size=0.02, x=0.1, y=-0.1),), seed=9, parent_id="scn-0")
    d = json.loads(json.dumps(s.to_dict()))
    assert d["benchmark"] == "robosuite" and d["scenario_id"] == s.scenario_id
    assert ScenarioSpec.from_dict(d) == s


def test_to_dict_has_exactly_the_avro_fields():
    import pathlib
    avsc = pathlib.Path(__file__).resolve().parents[3] / "schemas" / "avro" / "ScenarioSpec.avsc"
    fields = [f["name"] for f in json.loads(avsc.read_text())["fields"]]
    assert sorted(spec().to_dict()) == sorted(fields)


@pytest.mark.parametrize("kw, quoted", [
    ({"env_name": "Wipe"}, "'Wipe'"),
    ({"robot": "Sawyer"}, "'Sawyer'"),
    ({"horizon": 0}, "0"),
    ({"horizon": 10.5}, "10.5"),
    ({"instruction": "  "}, "'  '"),
    ({"placement_x_range": (0.1, -0.1)}, "(0.1, -0.1)"),
    ({"placement_y_range": (0.0, 0.9)}, "(0.0, 0.9)"),
    ({"pose_offset_xyz": (0.0, 0.0)}, "(0.0, 0.0)"),
    ({"object_friction": -1.0}, "-1.0"),
    ({"object_mass": float("nan")}, "nan"),
    ({"object_rgba": (1, 0, 0, 2)}, "(1, 0, 0, 2)"),
    ({"object_size_scale": 3.0}, "3.0"),
    ({"env_name": "PickPlaceCan", "object_size_scale": 1.5}, "1.5"),
    ({"seed": -1}, "-1"),
    ({"distractors": ({"kind": "box"},)}, "{'kind': 'box'}"),
])
def test_validation_quotes_the_bad_value(kw, quoted):
    with pytest.raises(ValueError) as err:
        spec(**kw)
    assert quoted in str(err.value)


def test_distractor_validation():
    with pytest.raises(ScenarioError, match="'pyramid'"):
        Distractor(kind="pyramid", size=0.02, x=0, y=0)
    with pytest.raises(ScenarioError, match="0.5"):
        Distractor(kind="box", size=0.5, x=0, y=0)


def test_from_dict_refuses_tampering_and_unknown_keys():
    d = spec().to_dict()
    d["horizon"] = 200
    with pytest.raises(ScenarioError, match="does not match"):
        ScenarioSpec.from_dict(d)
    with pytest.raises(ScenarioError, match="unknown"):
        ScenarioSpec.from_dict({**spec().to_dict(), "colour": "red"})
    with pytest.raises(ScenarioError, match="benchmark"):
        ScenarioSpec.from_dict({**spec().to_dict(), "benchmark": "libero"})
    with pytest.raises(ScenarioError, match="missing"):
        ScenarioSpec.from_dict({"env_name": "Lift"})
