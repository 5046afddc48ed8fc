"""The mutator on LIBERO failure seeds: LIBERO operators chosen by failure type, one factor changed,
deterministic, and candidates whose specs are LIBERO scenarios with the parent as parent."""

from dataclasses import replace

import pytest

from schemas.libero_scenario import LiberoScenario, parse_perturbation
from schemas.scenario import ScenarioSpec
from streams.mutations.chooser import ChooserConfig, blind_candidates, family_for, guided_candidates
from streams.mutations.libero_operators import FAILURE_OPERATORS, OPERATORS, LiberoChooserConfig
from streams.mutations.operators import FailureSeed

BASE = LiberoScenario(suite="libero_object", env_name="pick_up_the_alphabet_soup_and_place_it_in_the_basket",
                      instruction="pick up the alphabet soup and place it in the basket", horizon=280)
SITE = {"eef_x": -0.15, "eef_y": -0.01, "eef_z": 0.25, "object_x": -0.12, "object_y": -0.24, "object_z": 0.04,
        "object_dx": 0.0, "object_dy": 0.0}


def cluster(cid, root, size=5, rep=True, **kw):
    event = {"cluster_id": cid, "size": size, "revision": 1, "dominant_failure_type": max(root, key=root.get),
             "failure_types": dict(root), "root_types": dict(root), "site": dict(SITE),
             "scenario_counts": {BASE.scenario_id: size},
             "representative_scenario": BASE.to_dict() if rep else {"scenario_id": "", "env_name": "",
                                                                    "horizon": 0, "instruction": ""}}
    event.update(kw)
    return event


CLUSTERS = [cluster("c-slip", {"slip": 1.0}, size=7), cluster("c-knock", {"knocked_object": 0.7, "collision": 0.3}),
            cluster("c-miss", {"grasp_miss": 0.6, "out_of_reach": 0.4}, size=4),
            cluster("c-time", {"timeout": 1.0}, size=3)]
NO_EXPLORATION = ChooserConfig(exploration=0.0, candidates_per_cluster=4)


def test_a_libero_representative_makes_a_libero_seed_and_family():
    seed = FailureSeed.from_event(CLUSTERS[0])
    assert isinstance(seed.representative_scenario, LiberoScenario)
    assert seed.representative_scenario == BASE
    assert family_for(BASE, ChooserConfig()).benchmark == "libero"
    assert family_for(ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube"),
                      ChooserConfig()).benchmark == "robosuite"


@pytest.mark.parametrize("cid, operators", [("c-slip", {"material"}), ("c-knock", {"distractor"}),
                                            ("c-miss", {"layout"})])
def test_failure_types_choose_the_libero_operators(cid, operators):
    got = guided_candidates([c for c in CLUSTERS if c["cluster_id"] == cid], seed=1, config=NO_EXPLORATION)
    assert len(got.candidates) == 4, got.skipped
    assert got.candidates[0].params["chosen_by"].startswith("failure:")
    for c in got.candidates:
        assert c.source_cluster_id == cid and c.generator == "failure-guided"
        if c.params["chosen_by"] == "exploration":  # a factor drawn again gives way to breadth (Coverage)
            continue
        cause = c.params["chosen_by"].removeprefix("failure:")
        assert c.operator in operators and c.operator in FAILURE_OPERATORS[cause]


def test_a_failure_type_without_a_libero_operator_explores_libero_operators_only():
    got = guided_candidates([CLUSTERS[3]], seed=1, config=NO_EXPLORATION)
    assert got.candidates
    assert {c.operator for c in got.candidates} <= set(LiberoChooserConfig().exploration_operators)
    assert {c.params["chosen_by"] for c in got.candidates} == {"exploration"}


PERCEPTION = {"camera", "lighting", "paraphrase"}


def test_camera_lighting_and_paraphrase_are_explored_only_when_a_registered_model_perceives():
    """Pixel and word changes fail only a policy that sees or reads (#19): exploration draws them
    with one registered, never for the scripted models alone."""
    clusters = [cluster(f"c{i:02d}", {"timeout": 1.0}) for i in range(12)]
    wide = ChooserConfig(exploration=1.0, candidates_per_cluster=3, max_clusters=12)
    seen = {c.operator for c in guided_candidates(clusters, seed=5, config=wide).candidates}
    assert PERCEPTION <= seen
    blind = {c.operator for c in guided_candidates(clusters, seed=5, config=replace(wide, perceiving=False)).candidates}
    assert blind and not blind & PERCEPTION


def test_candidates_are_libero_scenarios_changing_one_factor_of_the_parent():
    got = guided_candidates(CLUSTERS, seed=3, config=ChooserConfig(candidates_per_cluster=4))
    assert len(got.candidates) >= 12
    for c in got.candidates:
        record = c.spec.to_dict()
        again = LiberoScenario.from_dict(record)
        assert again == c.spec and again.scenario_id == c.scenario_id
        assert c.spec.parent_id == BASE.scenario_id == c.parent.scenario_id
        fields = c.event_fields()
        assert fields["parent_scenario_id"] == BASE.scenario_id and fields["scenario"] == record
        assert fields["source_cluster_id"] == c.source_cluster_id and all(isinstance(v, str)
                                                                           for v in fields["params"].values())
        changed = {parse_perturbation(n).axis for n in c.spec.perturbations}
        if c.operator == "paraphrase":
            assert not changed and c.spec.instruction != BASE.instruction
        else:
            assert c.spec.instruction == BASE.instruction
            assert changed == {{"layout": "layout", "material": "material", "distractor": "distractor",
                                 "camera": "camera", "lighting": "light"}[c.operator]}


def test_the_same_inputs_and_seed_give_the_same_candidates():
    def ids(seed):
        g = guided_candidates(CLUSTERS, seed=seed)
        return [(c.scenario_id, c.operator, c.params) for c in g.candidates]
    assert ids(5) == ids(5) and ids(5) != ids(6)


def test_a_distractor_lies_between_the_target_and_the_hand_and_is_not_a_task_object():
    got = guided_candidates([CLUSTERS[1]], seed=2, config=NO_EXPLORATION)
    distractors = [c for c in got.candidates if c.operator == "distractor"]
    assert distractors
    for c in distractors:
        assert c.params["path_from"] == "site_eef" and c.params["category"] not in BASE.env_name
        x, y = (c.spec.perturbations[f"distractor.{c.params['category']}.{a}"] for a in ("x_m", "y_m"))
        # the hand is at +y of the object here: the distractor lies on that side, 7-11 cm away
        assert y > SITE["object_y"] + 0.05 and abs(x - SITE["object_x"]) < 0.05


def test_a_layout_shift_pushes_the_target_on_away_from_the_hand():
    got = guided_candidates([CLUSTERS[2]], seed=4, config=ChooserConfig(exploration=0.0, candidates_per_cluster=8))
    shifts = [c for c in got.candidates if c.operator == "layout" and c.params["variant"] == "shift"]
    assert shifts
    for c in shifts:
        assert c.params["direction"] == "away_from_hand"
        assert c.spec.perturbations.get("layout.target.dy_m", 0.0) < 0  # the object is at -y of the hand


def test_blind_candidates_of_a_libero_parent_use_libero_operators():
    got = blind_candidates([BASE], n=8, seed=0)
    assert len(got.candidates) == 8
    for c in got.candidates:
        assert c.operator in OPERATORS and c.generator == "blind" and c.source_cluster_id is None
        assert LiberoScenario.from_dict(c.spec.to_dict()).parent_id == BASE.scenario_id


def test_a_libero_exploration_set_names_libero_operators():
    with pytest.raises(ValueError, match="exploration_operators"):
        LiberoChooserConfig(exploration_operators=("time_budget",))


def test_a_composition_of_libero_scenarios_is_refused_by_name():
    from streams.mutations.chooser import compose
    from streams.mutations.exceptions import CompositionError

    a, b = (LiberoScenario.from_dict(c.spec.to_dict()) for c in blind_candidates([BASE], n=2, seed=0).candidates)
    with pytest.raises(CompositionError, match="LIBERO"):
        compose(BASE, [(a, BASE), (b, BASE)])


def test_perception_operators_are_those_whose_every_factor_is_perceived():
    """One set of perception factors decides both benchmarks' perception operators: material
    reaches colour too, but its friction and mass variants fail pose readers."""
    robosuite = family_for(ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube"), ChooserConfig())
    libero = family_for(BASE, ChooserConfig())
    assert set(robosuite.perception_operators) == {"paraphrase"}
    assert set(libero.perception_operators) == PERCEPTION
