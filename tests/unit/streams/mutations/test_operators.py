"""Mutation operators: one factor per child, parameters recorded as strings, informed by the
failure seed when there is one, and deterministic in their seed."""

import dataclasses
import json
import math

import numpy as np
import pytest

from schemas.scenario import OBJECT_GEOM_PRIORITY, Distractor, ScenarioSpec
from streams.mutations.exceptions import OperatorError, SeedError
from streams.mutations.operator_config import OperatorConfig
from streams.mutations.operators import FACTORS, OPERATORS, FailureSeed, rng_for
from streams.mutations.paraphrasers import LLMParaphraser, TemplateParaphraser

BASE = ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube")

# the ScenarioSpec fields each factor may change
FACTOR_FIELDS = {
    "placement": {"placement_x_range", "placement_y_range"},
    "pose": {"pose_offset_xyz"},
    "friction": {"object_friction"},
    "mass": {"object_mass"},
    "colour": {"object_rgba"},
    "distractors": {"distractors"},
    "instruction": {"instruction"},
    "hold": {"success_hold_steps", "horizon"},
    "place": {"place_target_xy"},
    "time_budget": {"horizon"},
}


def cluster(**kw):
    event = {"cluster_id": "cl-1", "size": 6, "revision": 3, "dominant_failure_type": "slip",
             "failure_types": {"slip": 1.0}, "root_types": {"slip": 1.0},
             "site": {"eef_x": -0.08, "eef_y": 0.04, "eef_z": 0.9, "object_x": 0.02, "object_y": -0.01,
                      "object_z": 0.83, "object_dx": 0.01, "object_dy": 0.0, "force_n": 22.0},
             "scenario_counts": {BASE.scenario_id: 6}, "representative_scenario": BASE.to_dict()}
    event.update(kw)
    return event


SEED = FailureSeed.from_event(cluster())


def changed_fields(child: ScenarioSpec, parent: ScenarioSpec) -> set[str]:
    return {f.name for f in dataclasses.fields(ScenarioSpec)
            if f.name != "parent_id" and getattr(child, f.name) != getattr(parent, f.name)}


@pytest.mark.parametrize("guided", [True, False], ids=["guided", "blind"])
@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_each_operator_changes_one_factor_and_records_it(name, guided):
    factors = set()
    for i in range(30):
        cand = OPERATORS[name](BASE, SEED if guided else None, rng_for(3, name, i), OperatorConfig())
        assert cand.factor in FACTORS and cand.operator == name
        assert changed_fields(cand.spec, BASE) <= FACTOR_FIELDS[cand.factor], (cand.factor, cand.spec)
        assert changed_fields(cand.spec, BASE), "a child that changes nothing"
        assert cand.spec.parent_id == BASE.scenario_id and cand.parent == BASE
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in cand.params.items())
        assert cand.generator == ("failure-guided" if guided else "blind")
        assert cand.source_cluster_id == ("cl-1" if guided else None)
        fields = cand.event_fields()
        assert fields["scenario"]["scenario_id"] == cand.scenario_id and fields["factor"] == cand.factor
        json.dumps(fields)
        factors.add(cand.factor)
    expected = {"pose": {"placement", "pose"}, "material": {"friction", "mass", "colour"},
                "horizon_extension": {"hold", "place"}}.get(name)
    if expected:
        assert factors == expected  # every variant of the operator shows up


def test_same_seed_same_candidate_other_seed_another():
    for name, op in OPERATORS.items():
        a = op(BASE, SEED, rng_for(7, "x"), OperatorConfig())
        b = op(BASE, SEED, rng_for(7, "x"), OperatorConfig())
        assert a == b and a.event_fields() == b.event_fields(), name
    others = {OPERATORS["material"](BASE, SEED, rng_for(s, "x"), OperatorConfig()).scenario_id for s in range(6)}
    assert len(others) > 1


def test_rng_for_is_stable():
    assert rng_for(1, "a", 2).integers(1 << 30) == rng_for(1, "a", 2).integers(1 << 30)
    assert rng_for(1, "a", 2).random() != rng_for(1, "a", 3).random()
    assert float(rng_for(0, "golden").random()) == pytest.approx(float(rng_for(0, "golden").random()))


def _variant(name, variant, seed, cfg=None, parent=BASE):
    for i in range(40):
        cand = OPERATORS[name](parent, seed, rng_for(11, name, i), cfg or OperatorConfig())
        if cand.params.get("variant", cand.factor) == variant:
            return cand
    raise AssertionError(f"{name} never drew {variant}")


def test_guided_pose_moves_the_object_further_from_the_hand_beyond_the_failures():
    start = np.array([0.02 - 0.01, -0.01])  # object_x/y minus object_dx/dy
    hand = np.array([-0.1, 0.0])  # the gripper's start (GRIPPER_START_XY, Lift)
    cfg = OperatorConfig()
    for i in range(8):
        cand = OPERATORS["pose"](BASE, SEED, rng_for(21, i), cfg)
        if cand.factor == "placement":
            where = np.array([sum(cand.spec.placement_x_range) / 2, sum(cand.spec.placement_y_range) / 2])
            width = cand.spec.placement_x_range[1] - cand.spec.placement_x_range[0]
            lo, hi = cfg.guided_placement_half_width_m
            assert 2 * lo - 1e-4 <= width <= 2 * hi + 1e-4
        else:
            where = np.array(cand.spec.pose_offset_xyz[:2])  # the default placement is centred on 0
            assert cand.spec.pose_offset_xyz[2] == 0.0
        push = float(cand.params["push_m"])
        turn = float(cand.params["turn_rad"])
        assert cfg.guided_pose_push_m[0] <= push <= cfg.guided_pose_push_m[1]
        assert abs(turn) <= cfg.guided_pose_spread_rad
        if cand.factor == "placement":
            assert np.linalg.norm(where - start) == pytest.approx(push, abs=2e-4)
            # further from the hand than the failures were, by at least the push's component
            assert np.linalg.norm(where - hand) >= np.linalg.norm(start - hand) + push * math.cos(turn) - 1e-3
        else:
            assert np.linalg.norm(where) == pytest.approx(push, abs=2e-4)
        assert cand.params["from"] == "site" and cand.params["direction"] == "away_from_gripper"


def test_pose_without_a_site_starts_from_the_parents_placement():
    seed = FailureSeed.from_event(cluster(site={}))
    cand = _variant("pose", "placement", seed)
    assert cand.params["from"] == "parent" and cand.params["direction"] == "away_from_gripper"
    blind = _variant("pose", "placement", None)
    assert blind.params["from"] == "random" and "turn_rad" not in blind.params


def test_guided_friction_is_low_and_matters():
    cand = _variant("material", "friction", SEED)
    cfg = OperatorConfig()
    assert cfg.guided_friction[0] <= cand.spec.object_friction <= cfg.guided_friction[1]
    assert cand.params["geom_priority"] == str(OBJECT_GEOM_PRIORITY) and cand.params["parent_friction"] == "default"
    mass = _variant("material", "mass", SEED)
    assert cfg.guided_mass_kg[0] <= mass.spec.object_mass <= cfg.guided_mass_kg[1]
    colour = _variant("material", "colour", SEED)
    assert len(colour.spec.object_rgba) == 4 and colour.spec.object_rgba[3] == 1.0


def test_guided_distractor_lies_between_the_hand_and_the_object():
    obj = np.array([0.02, -0.01])
    hand = np.array([-0.08, 0.04])
    for i in range(10):
        cand = OPERATORS["distractor"](BASE, SEED, rng_for(5, i), OperatorConfig())
        d = cand.spec.distractors[-1]
        xy = np.array([d.x, d.y])
        to_hand = (hand - obj) / np.linalg.norm(hand - obj)
        along = float(np.dot(xy - obj, to_hand))
        lateral = abs(float(np.cross(to_hand, xy - obj)))
        radius = d.size * math.sqrt(2) if d.kind == "box" else d.size
        assert along > 0.03 + radius  # on the hand's side, clear of the cube's footprint
        assert lateral <= 0.0101
        assert cand.params["path_from"] == "site_eef" and cand.params["count"] == "1"


def test_a_hand_above_the_object_falls_back_to_the_gripper_start():
    seed = FailureSeed.from_event(cluster(site={"eef_x": 0.02, "eef_y": -0.01, "object_x": 0.02, "object_y": -0.01}))
    cand = OPERATORS["distractor"](BASE, seed, rng_for(1), OperatorConfig())
    assert cand.params["path_from"] == "gripper_start"
    assert cand.spec.distractors[-1].x < 0.02  # towards the robot (-x)


def test_distractors_are_added_to_the_parents():
    parent = BASE.mutate(distractors=(Distractor(kind="ball", size=0.02, x=0.2, y=0.2),))
    cand = OPERATORS["distractor"](parent, SEED, rng_for(1), OperatorConfig())
    assert cand.spec.distractors[0] == parent.distractors[0] and len(cand.spec.distractors) == 2


def test_hold_extends_the_horizon_by_the_hold_and_place_is_lift_only():
    hold = _variant("horizon_extension", "hold", SEED)
    steps = hold.spec.success_hold_steps
    cfg = OperatorConfig()
    assert cfg.guided_hold_steps[0] <= steps <= cfg.guided_hold_steps[1]
    assert hold.spec.horizon == BASE.horizon + steps
    place = _variant("horizon_extension", "place", SEED)
    start = np.array([0.01, -0.01])
    distance = float(np.linalg.norm(np.array(place.spec.place_target_xy) - start))
    assert cfg.guided_place_distance_m[0] - 1e-3 <= distance <= cfg.guided_place_distance_m[1] + 1e-3
    stack = ScenarioSpec(env_name="Stack", horizon=250, instruction="stack")
    for i in range(6):
        assert OPERATORS["horizon_extension"](stack, SEED, rng_for(i), cfg).factor == "hold"


def test_time_budget_tightens_down_to_its_floor():
    cfg = OperatorConfig()
    cand = OPERATORS["time_budget"](BASE, SEED, rng_for(2), cfg)
    assert cfg.min_time_budget_steps <= cand.spec.horizon <= 0.45 * BASE.horizon + 1
    with pytest.raises(OperatorError, match="budget floor"):
        OPERATORS["time_budget"](BASE.mutate(horizon=60), SEED, rng_for(2), cfg)
    blind = OPERATORS["time_budget"](BASE.mutate(horizon=60), None, rng_for(2), cfg)
    assert blind.spec.horizon < 60


def test_template_paraphrase_never_repeats_the_parent():
    for i in range(10):
        cand = OPERATORS["paraphrase"](BASE, SEED, rng_for(i), OperatorConfig())
        assert cand.spec.instruction != BASE.instruction and cand.params["paraphraser"] == "template"
        assert cand.params["instruction"] == cand.spec.instruction
    place = OPERATORS["paraphrase"](BASE.mutate(place_target_xy=(0.1, 0.1)), SEED, rng_for(0), OperatorConfig())
    assert place.params["template"].startswith("place:")


class FakeClient:
    """An OpenAI-client-shaped object: chat.completions.create(...) returning what it is told."""

    def __init__(self, answer=None, error=None, served="judge-1"):
        self.answer, self.error, self.served, self.calls = answer, error, served, []
        self.chat = self
        self.completions = self

    def create(self, **kw):
        self.calls.append(kw)
        if self.error:
            raise self.error
        message = type("M", (), {"content": self.answer})()
        choice = type("C", (), {"message": message, "finish_reason": "stop"})()
        return type("R", (), {"choices": [choice], "model": self.served})()


def test_llm_paraphrase_is_recorded_as_such():
    client = FakeClient(answer="Raise the cube off the table.")
    cfg = OperatorConfig(paraphraser=LLMParaphraser(client, "para-model"))
    cand = OPERATORS["paraphrase"](BASE, SEED, rng_for(0), cfg)
    assert cand.spec.instruction == "Raise the cube off the table."
    assert cand.params["paraphraser"] == "llm" and cand.params["model"] == "para-model"
    assert cand.params["served_model"] == "judge-1" and cand.params["finish_reason"] == "stop"
    assert client.calls[0]["messages"][1]["content"] == BASE.instruction and client.calls[0]["temperature"] == 0


@pytest.mark.parametrize("client, error", [
    (FakeClient(error=TimeoutError("read timed out")), "TimeoutError: read timed out"),
    (FakeClient(answer=""), "empty answer"),
    (FakeClient(answer="Lift the cube"), "answer repeats the instruction"),
    (FakeClient(answer="x" * 500), "answer of 500 characters"),
])
def test_a_failed_llm_paraphrase_falls_back_to_a_template(client, error):
    cfg = OperatorConfig(paraphraser=LLMParaphraser(client, "para-model"))
    cand = OPERATORS["paraphrase"](BASE, SEED, rng_for(0), cfg)
    template = OPERATORS["paraphrase"](BASE, SEED, rng_for(0), OperatorConfig())
    assert cand.params["paraphraser"] == "template" and cand.params["llm_error"].startswith(error)
    assert cand.spec.instruction == template.spec.instruction and cand.params["llm_model"] == "para-model"


def test_failure_seed_validation_names_the_cluster_and_field():
    with pytest.raises(SeedError, match="cluster_id"):
        FailureSeed.from_event({"size": 1})
    with pytest.raises(SeedError, match="cl-1: site\\['eef_x'\\]"):
        FailureSeed.from_event(cluster(site={"eef_x": "left"}))
    with pytest.raises(SeedError, match="size must be a non-negative integer"):
        FailureSeed.from_event(cluster(size="big"))
    with pytest.raises(SeedError, match="representative_scenario"):
        FailureSeed.from_event(cluster(representative_scenario={"env_name": "Lift", "horizon": -1,
                                                                "instruction": "x"}))
    empty = FailureSeed.from_event(cluster(representative_scenario={"scenario_id": "", "env_name": "",
                                                                    "horizon": 0, "instruction": ""}))
    assert empty.representative_scenario is None


def test_template_paraphraser_is_deterministic():
    p = TemplateParaphraser()
    assert p.paraphrase(BASE, rng_for(4)) == p.paraphrase(BASE, rng_for(4))
