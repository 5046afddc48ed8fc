"""The evolving loop on LIBERO, in the LIBERO venv that `sepa-eval libero setup` builds: the
mutator's candidates from a LIBERO failure seed are checked in the LIBERO venv from the project's
venv (infra/libero_feasibility.py), as the streams worker checks them.

Without a LIBERO venv these tests are skipped, unless SEPA_TEST_REQUIRE_LIBERO=1 (CI) makes that a
failure.
"""

from __future__ import annotations

import json

from infra.libero_feasibility import scenario_feasibility
from producers.libero.scenario import LiberoScenario
from streams.mutations.chooser import ChooserConfig, guided_candidates, propose

SOUP = LiberoScenario(suite="libero_object", env_name="pick_up_the_alphabet_soup_and_place_it_in_the_basket",
                      instruction="pick up the alphabet soup and place it in the basket", horizon=280)
# where libero_object task 0's hand and soup are (world frame, m) at its init state 0
SITE = {"eef_x": -0.15, "eef_y": -0.01, "eef_z": 0.25, "object_x": -0.12, "object_y": -0.24, "object_z": 0.04,
        "object_dx": 0.0, "object_dy": 0.0}


def test_libero_candidates_are_checked_in_the_libero_venv(libero_venv):
    knocks = {"cluster_id": "c-knock", "size": 5, "revision": 1, "dominant_failure_type": "knocked_object",
              "failure_types": {"knocked_object": 1.0}, "root_types": {"knocked_object": 1.0}, "site": SITE,
              "scenario_counts": {SOUP.scenario_id: 5}, "representative_scenario": SOUP.to_dict()}
    cands = guided_candidates([knocks], seed=0, config=ChooserConfig(exploration=0.0, candidates_per_cluster=2))
    # a second soup can where the target stands: the scene cannot be sound
    broken = SOUP.perturb(**{"distractor.alphabet_soup.x_m": -0.12, "distractor.alphabet_soup.y_m": -0.24})
    check = scenario_feasibility(None, venv_root=libero_venv.root)
    proposal = propose(cands.candidates, check)
    assert len(proposal.proposed) + len(proposal.infeasible) == 2
    for c in proposal.proposed + proposal.infeasible:
        assert c.candidate.operator == "distractor"
        report = json.loads(c.feasibility.to_json())
        assert report["seeds_checked"] == 3 and report["feasible"] == (report["seeds_passed"] == 3)
        assert c.feasibility.reason == "" if c.feasibility.feasible else c.feasibility.reason
    assert proposal.proposed, [c.feasibility.reason for c in proposal.infeasible]
    bad = check(broken)
    assert not bad.feasible and "interpenetrate" in bad.reason and bad.measures["seeds_passed"] == 0
