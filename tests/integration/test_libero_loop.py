"""The evolving loop on LIBERO, in the LIBERO venv that `sepa-eval libero setup` builds: the
mutator's candidates from a LIBERO failure seed are checked in the LIBERO venv from the project's
venv (infra/libero_feasibility.py), as the streams worker checks them, and the mutator answers a
cycle from a log whose benchmark and clusters are LIBERO's with LIBERO candidates.

Without a LIBERO venv these tests are skipped, unless SEPA_TEST_REQUIRE_LIBERO=1 (CI) makes that a
failure.
"""

from __future__ import annotations

import json
import uuid

import pytest
from evidence_factory import EvidenceLog, store_events

from consumers import state as q
from consumers.evidence.store import migrate
from infra.libero_feasibility import scenario_feasibility
from schemas.codec import Codec
from schemas.libero_scenario import LiberoScenario
from streams.mutations.agent import MutatorConfig, MutatorRunner
from streams.mutations.chooser import ChooserConfig, guided_candidates, propose
from streams.mutations.libero_operators import OPERATORS

SOUP = LiberoScenario(suite="libero_object", env_name="pick_up_the_alphabet_soup_and_place_it_in_the_basket",
                      instruction="pick up the alphabet soup and place it in the basket", horizon=280)
# where libero_object task 0's hand and soup are (world frame, m) at its init state 0
SITE = {"eef_x": -0.15, "eef_y": -0.01, "eef_z": 0.25, "object_x": -0.12, "object_y": -0.24, "object_z": 0.04,
        "object_dx": 0.0, "object_dy": 0.0}


@pytest.mark.slow  # one of the default run's longest (README, Test)
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
    checked = proposal.proposed + proposal.infeasible
    # the knock's operator first; a second distractor gives way to an untested factor half the time
    assert checked[0].candidate.operator == "distractor"
    for c in checked:
        assert c.candidate.operator in OPERATORS
        assert c.candidate.operator == "distractor" or c.candidate.params["chosen_by"] == "exploration"
        report = json.loads(c.feasibility.to_json())
        assert report["seeds_checked"] == 3 and report["feasible"] == (report["seeds_passed"] == 3)
        assert c.feasibility.reason == "" if c.feasibility.feasible else c.feasibility.reason
    assert proposal.proposed, [c.feasibility.reason for c in proposal.infeasible]
    bad = check(broken)
    assert not bad.feasible and "interpenetrate" in bad.reason and bad.measures["seeds_passed"] == 0


@pytest.mark.slow  # one of the default run's longest (README, Test)
def test_the_mutator_answers_a_cycle_from_a_libero_log_with_libero_candidates(libero_venv, chdb_store):
    log = EvidenceLog()
    for model, kind in (("oracle", "oracle"), ("scripted-novice", "scripted")):
        log.register(model, kind)
    base = SOUP.to_dict()
    log.candidate(base, "", "base", generator="base")
    log.promoted(base, 1)
    log.cluster_updated("fc-knock", 5, "ep-knock", "knocked_object", base, model_counts={"scripted-novice": 5})
    log.cycle("run-c1", 1, 1, [])
    events = []
    for e in log.events:
        if e["envelope"]["event_type"] == "ClusterUpdated":
            e = {**e, "site": SITE}
        events.append(e)
    cycle = {**next(e for e in events if e["envelope"]["event_type"] == "CycleStarted"), "max_candidates": 2,
             "seed": 7}
    events = [e for e in events if e["envelope"]["event_type"] not in ("CycleStarted", "CandidatesGenerated")]
    store = chdb_store.with_database(f"lmut_{uuid.uuid4().hex[:10]}")
    try:
        migrate(store)
        store_events(store, [*events, cycle])
        runner = MutatorRunner(lambda: store, Codec(), MutatorConfig(chooser=ChooserConfig(exploration=0.0)),
                               check=scenario_feasibility(None, venv_root=libero_venv.root))
        answer = runner.answer(cycle)
        proposed = [e for e in answer if e["envelope"]["event_type"] == "CandidateProposed"]
        generated = answer[-1]
        assert generated["envelope"]["event_type"] == "CandidatesGenerated"
        assert len(proposed) + len(generated["infeasible"]) == 2, generated
        assert proposed, generated["infeasible"]
        for e in proposed:
            spec = LiberoScenario.from_dict(dict(e["scenario"]))
            assert spec.parent_id == SOUP.scenario_id == e["parent_scenario_id"]
            assert e["source_cluster_id"] == "fc-knock" and e["operator"] in OPERATORS
            assert e["operator"] == "distractor" or e["params"]["chosen_by"] == "exploration"
            assert json.loads(e["feasibility_json"]) == {"feasible": True, "reason": "", "seeds_checked": 3,
                                                         "seeds_passed": 3}
        assert generated["seeds"] == ["fc-knock"] and generated["proposed"] == [e["scenario_id"] for e in proposed]
        # the events round-trip the codec and the log
        codec = Codec()
        assert all(codec.decode(codec.encode(e)) == e for e in answer)
        store_events(store, answer)
        assert runner.answer(cycle) == [], "a cycle answered in the log is not answered again"
        assert {c.scenario_id for c in q.candidates(store)} >= {e["scenario_id"] for e in proposed}
    finally:
        store.command("DROP DATABASE IF EXISTS {database}")


def test_run_takes_its_libero_base_from_the_suites_tasks(libero_venv):
    from infra.cli.loop import libero_base

    every = libero_base("libero_object", None)
    assert len(every) == 10 and all(s["benchmark"] == "libero" and s["suite"] == "libero_object" for s in every)
    [soup] = libero_base("libero_object", "0")
    assert LiberoScenario.from_dict(soup) == SOUP
    assert [s["scenario_id"] for s in libero_base("libero_object", "0,3")] == [every[0]["scenario_id"],
                                                                               every[3]["scenario_id"]]
