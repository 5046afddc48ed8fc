"""The mutator's per-benchmark feasibility check at the edge, without a LIBERO venv: a LIBERO
candidate is infeasible with a reason naming the setup command, a robosuite one goes to the
robosuite check. (With the LIBERO venv: tests/integration/test_libero_loop.py.)"""

import json

from infra.libero_feasibility import libero_feasibility, scenario_feasibility
from producers.sim.feasibility import FeasibilityResult
from schemas.libero_scenario import LiberoScenario
from schemas.scenario import ScenarioSpec
from streams.mutations.chooser import guided_candidates, propose

SOUP = LiberoScenario(suite="libero_object", env_name="pick_up_the_alphabet_soup_and_place_it_in_the_basket",
                      instruction="pick up the alphabet soup and place it in the basket", horizon=280)
LIFT = ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube")


def test_without_a_libero_venv_a_libero_candidate_is_infeasible_and_says_how_to_set_it_up(tmp_path):
    check = scenario_feasibility(None, venv_root=tmp_path / "no-venv")
    result = check(SOUP.perturb(**{"layout.target.dx_m": 0.03}))
    assert not result.feasible and "sepa-eval libero setup" in result.reason
    assert json.loads(result.to_json())["feasible"] is False


def test_a_robosuite_candidate_goes_to_the_robosuite_check(tmp_path):
    seen = []

    def robosuite_check(spec):
        seen.append(spec.scenario_id)
        return FeasibilityResult(spec.scenario_id, True, "", {"seeds_checked": 3})

    check = scenario_feasibility(robosuite_check, venv_root=tmp_path / "no-venv")
    assert check(LIFT).feasible and seen == [LIFT.scenario_id]


def test_propose_counts_libero_candidates_infeasible_without_the_venv(tmp_path):
    slip = {"cluster_id": "c-slip", "size": 4, "revision": 1, "dominant_failure_type": "slip",
            "failure_types": {"slip": 1.0}, "root_types": {"slip": 1.0}, "site": {},
            "scenario_counts": {SOUP.scenario_id: 4}, "representative_scenario": SOUP.to_dict()}
    cands = guided_candidates([slip], seed=0).candidates
    proposal = propose(cands, scenario_feasibility(None, venv_root=tmp_path / "no-venv"))
    assert not proposal.proposed and len(proposal.infeasible) == len(cands) > 0
    assert all("sepa-eval libero setup" in c.feasibility.reason for c in proposal.infeasible)


def test_a_venv_without_libero_python_is_reported_not_raised(tmp_path):
    from infra.libero_venv import LiberoVenv

    result = libero_feasibility(SOUP, LiberoVenv(tmp_path))
    assert not result.feasible and result.scenario_id == SOUP.scenario_id
