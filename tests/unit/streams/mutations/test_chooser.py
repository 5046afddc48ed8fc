"""Choosing operators from failure clusters, the blind arm, compositions, and the feasibility
pre-check before proposing."""

import pytest

from producers.sim.feasibility import FeasibilityConfig, check_feasibility
from schemas.scenario import Distractor, ScenarioSpec
from streams.mutations.chooser import (
    FAILURE_OPERATORS,
    ChooserConfig,
    blind_candidates,
    compose,
    family_for,
    guided_candidates,
    operator_weights,
    propose,
    propose_blind,
    propose_guided,
)
from streams.mutations.exceptions import CompositionError
from streams.mutations.operators import OPERATORS, FailureSeed

BASE = ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube")
SITE = {"eef_x": -0.08, "eef_y": 0.04, "eef_z": 0.9, "object_x": 0.02, "object_y": -0.01, "object_z": 0.83,
        "object_dx": 0.0, "object_dy": 0.0}


def cluster(cid, root, size=5, revision=1, rep=True, **kw):
    event = {"cluster_id": cid, "size": size, "revision": revision, "dominant_failure_type": max(root, key=root.get),
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


@pytest.mark.parametrize("cid, operators", [
    ("c-slip", {"material"}), ("c-knock", {"distractor"}), ("c-miss", {"pose"}),
    ("c-time", {"time_budget", "horizon_extension"}),
])
def test_failure_types_choose_their_operators(cid, operators):
    """On an untested benchmark the first draw follows the failure type; the later ones of the cycle
    either follow it too or, their factor being tested now by the cycle's own candidates, go to an
    untested factor and say so."""
    got = guided_candidates([c for c in CLUSTERS if c["cluster_id"] == cid], seed=1, config=NO_EXPLORATION)
    assert got.candidates and got.candidates[0].operator in operators
    for c in got.candidates:
        assert c.source_cluster_id == cid and c.generator == "failure-guided"
        if c.params["chosen_by"] == "exploration":
            assert c is not got.candidates[0]
            continue
        cause = c.params["chosen_by"].removeprefix("failure:")
        assert c.operator in operators and c.operator in FAILURE_OPERATORS[cause]


def test_operator_weights_follow_the_root_types():
    seed = FailureSeed.from_event(cluster("c", {"slip": 0.5, "timeout": 0.5}))
    assert operator_weights(seed) == {"material": 0.5, "time_budget": 0.25, "horizon_extension": 0.25}
    unknown = FailureSeed.from_event(cluster("c", {"env_error": 1.0}))
    assert operator_weights(unknown) == {}


def test_exploration_reaches_every_operator():
    cfg = ChooserConfig(exploration=1.0, candidates_per_cluster=3, max_clusters=20)
    many = [cluster(f"c{i:02d}", {"slip": 1.0}) for i in range(20)]
    got = guided_candidates(many, seed=3, config=cfg)
    assert {c.params["chosen_by"] for c in got.candidates} == {"exploration"}
    assert {c.operator for c in got.candidates} == set(OPERATORS)


def test_without_a_perceiving_model_exploration_draws_nothing_only_pixels_or_words_change():
    """#17: a paraphrase cannot fail a model that reads poses; with only such models registered,
    exploration spends no slot on it (and draws every other operator)."""
    many = [cluster(f"c{i:02d}", {"slip": 1.0}) for i in range(20)]
    got = guided_candidates(many, seed=3, config=ChooserConfig(exploration=1.0, candidates_per_cluster=3,
                                                              max_clusters=20, perceiving=False))
    assert {c.operator for c in got.candidates} == set(OPERATORS) - {"paraphrase"}
    assert not {c.factor for c in got.candidates} & {"colour", "instruction"}, "no tint either"
    blind = blind_candidates([BASE], 60, seed=3, config=ChooserConfig(perceiving=False))
    assert {c.factor for c in blind.candidates} >= {"friction", "mass"}
    assert not {c.factor for c in blind.candidates} & {"colour", "instruction"}


def test_the_default_exploration_share_is_about_a_fifth():
    # first draws, on a benchmark that tests nothing yet (later draws of a cycle also yield to
    # coverage: test_a_cycles_own_candidates_count_as_tested_for_its_later_draws)
    slip = [cluster("c-slip", {"slip": 1.0})]
    got = [guided_candidates(slip, seed=s, config=ChooserConfig(candidates_per_cluster=1)).candidates[0]
           for s in range(120)]
    explored = sum(c.params["chosen_by"] == "exploration" for c in got) / len(got)
    assert 0.08 < explored < 0.35


def test_same_inputs_and_seed_same_candidates():
    a = guided_candidates(CLUSTERS, seed=9).candidates
    b = guided_candidates(list(CLUSTERS), seed=9).candidates
    assert [c.event_fields() for c in a] == [c.event_fields() for c in b] and a
    assert [c.scenario_id for c in guided_candidates(CLUSTERS, seed=10).candidates] != [c.scenario_id for c in a]
    x = blind_candidates([BASE], 6, seed=9).candidates
    assert [c.event_fields() for c in x] == [c.event_fields() for c in blind_candidates([BASE], 6, seed=9).candidates]


def test_largest_live_clusters_first_latest_revision_only():
    clusters = [cluster("small", {"slip": 1.0}, size=2), cluster("big", {"slip": 1.0}, size=9),
                cluster("big", {"grasp_miss": 1.0}, size=9, revision=2),
                cluster("retired", {"slip": 1.0}, size=0, revision=5)]
    got = guided_candidates(clusters, seed=1, config=ChooserConfig(exploration=0.0, max_clusters=1))
    assert {c.source_cluster_id for c in got.candidates} == {"big"}
    assert {c.operator for c in got.candidates} == {"pose"}  # revision 2's types


def test_parent_from_the_scenario_counts_when_no_representative():
    parent = BASE.mutate(object_mass=0.3)
    c = cluster("c", {"slip": 1.0}, rep=False, scenario_counts={"scn-unknown": 9, parent.scenario_id: 4})
    got = guided_candidates([c], seed=1, parents={parent.scenario_id: parent})
    assert got.candidates and all(cand.parent == parent for cand in got.candidates)
    none = guided_candidates([c], seed=1)
    assert none.candidates == [] and "none of its scenarios" in none.skipped[0].reason


def test_a_malformed_cluster_is_skipped_with_the_reason():
    bad = cluster("bad", {"slip": 1.0}, site={"eef_x": None})
    got = guided_candidates([bad, CLUSTERS[0]], seed=1)
    assert got.skipped[0].key == "cluster bad" and "site['eef_x']" in got.skipped[0].reason
    assert {c.source_cluster_id for c in got.candidates} == {"c-slip"}


def test_excluded_and_repeated_scenarios_are_not_proposed():
    first = guided_candidates(CLUSTERS, seed=2).candidates
    again = guided_candidates(CLUSTERS, seed=2, exclude=[c.scenario_id for c in first]).candidates
    assert not {c.scenario_id for c in first} & {c.scenario_id for c in again}
    ids = [c.scenario_id for c in first]
    assert len(ids) == len(set(ids)) and BASE.scenario_id not in ids


def test_blind_candidates_use_no_seed():
    parents = [BASE, BASE.mutate(object_mass=0.3)]
    got = blind_candidates(parents, 12, seed=4)
    assert len(got.candidates) == 12
    assert all(c.source_cluster_id is None and c.generator == "blind" and c.params["chosen_by"] == "blind"
               for c in got.candidates)
    assert {c.parent.scenario_id for c in got.candidates} == {p.scenario_id for p in parents}


# -- compositions -------------------------------------------------------------------------------

def test_composition_of_promoted_factors_is_its_own_recorded_step():
    slippery = BASE.mutate(object_friction=0.02)
    place = BASE.mutate(place_target_xy=(0.1, 0.1))
    with_box = BASE.mutate(distractors=(Distractor(kind="box", size=0.02, x=-0.08, y=0.0),))
    cand = compose(BASE, [(slippery, BASE), (place, BASE), (with_box, BASE)])
    assert cand.factor == "composition" and cand.generator == "composition" and cand.operator == "composition"
    assert cand.params["parents"] == ",".join([slippery.scenario_id, place.scenario_id, with_box.scenario_id])
    assert cand.params["fields"] == "distractors,object_friction,place_target_xy"
    s = cand.spec
    assert (s.object_friction, s.place_target_xy, s.distractors) == (0.02, (0.1, 0.1), with_box.distractors)
    assert s.parent_id == BASE.scenario_id and cand.source_cluster_id is None


def test_compositions_refuse_conflicts_and_foreign_parents():
    a, b = BASE.mutate(object_friction=0.02), BASE.mutate(object_friction=0.03)
    with pytest.raises(CompositionError, match="object_friction"):
        compose(BASE, [(a, BASE), (b, BASE)])
    other = BASE.mutate(horizon=300)
    with pytest.raises(CompositionError, match="not from the base"):
        compose(BASE, [(a, BASE), (other.mutate(object_mass=3.0), other)])
    with pytest.raises(CompositionError, match="at least two"):
        compose(BASE, [(a, BASE)])
    hold = BASE.mutate(success_hold_steps=50, horizon=250)
    tight = BASE.mutate(horizon=70)
    with pytest.raises(CompositionError, match="horizon"):
        compose(BASE, [(hold, BASE), (tight, BASE)])


# -- feasibility before proposing ---------------------------------------------------------------

class _Result:
    def __init__(self, feasible, reason=""):
        self.feasible, self.reason = feasible, reason


def test_propose_splits_feasible_from_infeasible():
    cands = guided_candidates(CLUSTERS, seed=1).candidates
    bad_ids = {cands[0].scenario_id}
    proposal = propose(cands, check=lambda spec: _Result(spec.scenario_id not in bad_ids, "broken"))
    assert [c.candidate.scenario_id for c in proposal.infeasible] == [cands[0].scenario_id]
    assert [c.candidate for c in proposal.proposed] == cands[1:]
    assert proposal.infeasible[0].feasibility.reason == "broken" and proposal.cost_s >= 0


def test_propose_runs_the_real_pre_check():
    out_of_reach = BASE.mutate(placement_x_range=(0.33, 0.33), placement_y_range=(0.0, 0.0))
    blocked = compose(BASE, [(BASE.mutate(place_target_xy=(0.15, 0.15)), BASE),
                             (BASE.mutate(distractors=(Distractor(kind="cylinder", size=0.03, x=0.16, y=0.15),)),
                              BASE)])
    cands = [c for c in guided_candidates(CLUSTERS[:1], seed=1).candidates[:1]]
    cfg = FeasibilityConfig(seeds=(0,))
    far = compose(BASE, [(out_of_reach, BASE), (BASE.mutate(object_mass=3.0), BASE)])
    proposal = propose(cands + [far, blocked], check=lambda spec: check_feasibility(spec, cfg))
    assert [c.candidate for c in proposal.proposed] == cands
    reasons = [c.feasibility.reason for c in proposal.infeasible]
    assert "not reachable" in reasons[0] and "covered by distractor0" in reasons[1]
    assert proposal.mean_check_s > 0


def test_propose_guided_and_blind_generate_then_check():
    def check(spec):
        return _Result(spec.object_mass is None, "too heavy")

    guided = propose_guided(CLUSTERS + [cluster("bad", {"slip": 1.0}, site={"eef_x": None})], seed=1, check=check)
    assert guided.proposed and all(c.candidate.spec.object_mass is None for c in guided.proposed)
    assert all(c.feasibility.reason == "too heavy" for c in guided.infeasible)
    assert [s.key for s in guided.skipped] == ["cluster bad"]
    blind = propose_blind([BASE], 5, seed=1, check=check)
    assert len(blind.proposed) + len(blind.infeasible) == 5


def test_focus_models_put_their_clusters_first():
    """The largest cluster goes first, unless models tied at the top are named: then the cluster
    holding most of their episodes (their rare failures), and the rest after it."""
    clusters = [cluster("c-big", {"slip": 1.0}, size=9, model_counts={"clumsy": 9}),
                cluster("c-top", {"knocked_object": 1.0}, size=2, model_counts={"expert": 1, "skilled": 1}),
                cluster("c-mid", {"grasp_miss": 1.0}, size=4, model_counts={"novice": 3, "expert": 1})]
    cfg = ChooserConfig(exploration=0.0, candidates_per_cluster=1)
    plain = guided_candidates(clusters, seed=1, config=cfg)
    assert [c.source_cluster_id for c in plain.candidates] == ["c-big", "c-mid", "c-top"]
    focused = guided_candidates(clusters, seed=1, config=cfg, focus=("expert", "skilled"))
    assert [c.source_cluster_id for c in focused.candidates] == ["c-top", "c-mid", "c-big"]
    assert FailureSeed.from_event(clusters[1]).model_counts == {"expert": 1, "skilled": 1}


def test_an_operator_whose_factors_are_full_is_not_drawn_and_exploration_goes_where_nothing_is_tested():
    """Two distractor scenarios active (the gate's cap): a knocked-object cluster, whose only
    operator is the distractor, gets exploration draws instead, and those reach factors the
    benchmark does not test yet (the material operator's friction is tested, but not its mass)."""
    from streams.mutations.chooser import Coverage

    knock = [cluster("c-knock", {"knocked_object": 1.0}, size=6)]
    cfg = ChooserConfig(exploration=0.0, candidates_per_cluster=6)
    tested = Coverage({"distractors": 2, "friction": 1, "hold": 2, "place": 1, "base": 1})
    got = guided_candidates(knock, seed=3, config=cfg, coverage=tested).candidates
    assert got and all(c.params["chosen_by"] == "exploration" for c in got)
    # reaching an untested factor: pose (placement, pose), material (mass, colour), paraphrase, time budget
    assert {c.operator for c in got} <= {"pose", "material", "paraphrase", "time_budget"}
    family = family_for(BASE, cfg)
    assert tested.full("distractor", family) and not tested.full("material", family)
    assert not tested.new("horizon_extension", family) and tested.new("pose", family)


def test_an_operator_of_several_factors_changes_the_one_the_benchmark_tests_least():
    """An operator drawn for a factor nobody tests changes that factor, not a sibling the benchmark
    has already (exploration drawn for "place" made a hold half the time), and a failure's material
    draw after a mass scenario makes a friction one."""
    from streams.mutations.chooser import Coverage

    knock = [cluster("c-knock", {"knocked_object": 1.0}, size=6)]
    cfg = ChooserConfig(exploration=0.0, candidates_per_cluster=6)
    tested = Coverage({"distractors": 2, "friction": 1, "hold": 2, "base": 1})
    got = guided_candidates(knock, seed=3, config=cfg, coverage=tested).candidates
    assert len(got) == 6
    assert not {c.factor for c in got} & set(tested.factors), [c.factor for c in got]
    assert len({c.factor for c in got}) == 6, "each draw counts as tested for the next"

    slip = [cluster("c-slip", {"slip": 1.0})]
    one = ChooserConfig(exploration=0.0, candidates_per_cluster=1, perceiving=False)  # no colour
    factors = {guided_candidates(slip, seed=s, config=one, coverage=Coverage({"mass": 1})).candidates[0].factor
               for s in range(40)}
    assert factors == {"friction"}
    untested = {guided_candidates(slip, seed=s, config=one).candidates[0].factor for s in range(40)}
    assert {"friction", "mass"} <= untested, "with nothing tested, the variant is drawn by its weight"


def test_without_a_perceiving_model_colour_leaves_material_tested_once_friction_and_mass_are():
    """Colour is never tested when no model sees it; counted as material's, it kept material
    "new" for exploration forever."""
    from streams.mutations.chooser import Coverage

    tested = Coverage({"friction": 1, "mass": 1})
    blind_to_colour = family_for(BASE, ChooserConfig(perceiving=False))
    assert not tested.new("material", blind_to_colour) and tested.least("material", blind_to_colour) == ("friction",
                                                                                                          "mass")
    assert tested.new("material", family_for(BASE, ChooserConfig()))
    assert blind_to_colour.perception_operators == ("paraphrase",)


def test_an_operator_asked_for_a_factor_it_cannot_change_says_so():
    from streams.mutations.exceptions import OperatorError
    from streams.mutations.operators import horizon_extension, rng_for

    placed = BASE.mutate(place_target_xy=(0.1, 0.1))
    with pytest.raises(OperatorError, match=r"horizon_extension changes hold; none of them may be drawn here "
                                            r"\(asked for place\)"):
        horizon_extension(placed, None, rng_for(0, "t"), ChooserConfig().operators, factors=("place",))
    place = horizon_extension(BASE, None, rng_for(0, "t"), ChooserConfig().operators, factors=("place",))
    assert place.factor == "place"


def test_a_failure_the_benchmark_tests_n_times_keeps_its_operator_one_time_in_n_plus_one():
    """The knocked-object cluster's only operator is the distractor: with no distractor scenario it is
    always drawn, with one about half the time, with the rest going to untested factors."""
    from streams.mutations.chooser import Coverage

    knock = [cluster("c-knock", {"knocked_object": 1.0}, size=6)]
    cfg = ChooserConfig(exploration=0.0, candidates_per_cluster=1)

    def distractor_share(coverage: Coverage) -> float:
        ops = [guided_candidates(knock, seed=s, config=cfg, coverage=coverage).candidates[0].operator
               for s in range(200)]
        return ops.count("distractor") / len(ops)

    assert distractor_share(Coverage()) == 1.0
    assert 0.38 <= distractor_share(Coverage({"distractors": 1})) <= 0.62  # 1/2, binomial sd 0.035


def test_a_cycles_own_candidates_count_as_tested_for_its_later_draws():
    """Six draws from one knocked-object cluster: without this, all six were distractor scenarios,
    of which the gate would promote at most two (its breadth cap)."""
    knock = [cluster("c-knock", {"knocked_object": 1.0}, size=6)]
    got = guided_candidates(knock, seed=3, config=ChooserConfig(exploration=0.0, candidates_per_cluster=6)).candidates
    ops = [c.operator for c in got]
    assert ops[0] == "distractor" and ops.count("distractor") <= 2 and len(set(ops)) >= 3
