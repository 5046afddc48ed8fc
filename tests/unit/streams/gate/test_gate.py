"""The gate's pure core: each check decides, cycles are decided together, versions and event ids
are a function of the log, and a verdict that did not really run is never a pass."""

import json
from datetime import UTC, datetime, timedelta

from schemas.verdict_evidence import RobustnessEvidence
from streams.gate.gate import ActiveScenario, Candidate, GateConfig, GateState, PromotionGate, Review, Verdict

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MODELS = ("oracle", "expert", "novice")


def candidate(sid: str, cycle: str = "c1", factor: str = "friction", generator: str = "failure-guided",
              at: datetime = T0) -> Candidate:
    return Candidate(sid, "scn-base", {"scenario_id": sid}, factor, generator, cycle, "fc-1", f"ev-{sid}", at)


def verdict(critic: str, passed: bool | None = True, ran: bool = True, decision: str = "accept",
            successes: dict | None = None, minutes: int = 5) -> Verdict:
    """A verdict shaped as the critics write it (the robustness evidence of consumers/critics/sequential.py)."""
    wins = successes or {"oracle": 8, "expert": 7, "novice": 2}
    evidence = {"action": decision, "checks": {"solvable": {"status": "passed"}}, "seeds_per_arm": 8,
                "models": {m: {"candidate_successes": k} for m, k in wins.items()},
                "borderline": decision == "undecided"}
    return Verdict(critic, ran, passed, 1.0 if passed else 0.0, f"{critic} says {passed}",
                   RobustnessEvidence.from_dict(evidence) if critic == "robustness" else None,
                   f"v-{critic}", T0 + timedelta(minutes=minutes))


def state(candidates, verdicts=None, active=None, success=None, version=1, decisions=None, reviews=None):
    return GateState(version=version, candidates={c.scenario_id: c for c in candidates}, verdicts=verdicts or {},
                     decisions=decisions or {}, deferred_reasons={}, reviews=reviews or {},
                     active=active or {"scn-base": ActiveScenario("scn-base", {}, "base", "")}, models=MODELS,
                     success=success or {})


def good(sid):
    return {"robustness": verdict("robustness"), "safety": verdict("safety")}


def kinds(events):
    return [(e["envelope"]["event_type"], e["scenario_id"]) for e in events]


def test_a_candidate_passing_every_check_is_promoted_with_the_next_version():
    events = PromotionGate(GateConfig()).decide(state([candidate("scn-a")], {"scn-a": good("scn-a")}), T0)
    assert kinds(events) == [("Promoted", "scn-a")]
    assert events[0]["benchmark_version"] == 2 and events[0]["parent_scenario_id"] == "scn-base"
    assert events[0]["envelope"]["event_time"] == T0 + timedelta(minutes=5)  # the latest verdict's time


def test_each_failing_check_rejects_with_its_reason():
    gate = PromotionGate(GateConfig())
    robust_no = {"robustness": verdict("robustness", passed=False, decision="reject")}
    unsafe = {"robustness": verdict("robustness"), "safety": verdict("safety", passed=False)}
    events = gate.decide(state([candidate("scn-a"), candidate("scn-b")], {"scn-a": robust_no, "scn-b": unsafe}), T0)
    assert kinds(events) == [("Rejected", "scn-a"), ("Rejected", "scn-b")]
    assert events[0]["reason"].startswith("robustness:") and events[1]["reason"].startswith("safety:")


def test_a_cycle_waits_for_all_its_candidates_then_versions_them_in_id_order():
    gate = PromotionGate(GateConfig())
    cands = [candidate("scn-b"), candidate("scn-a")]
    assert gate.decide(state(cands, {"scn-b": good("scn-b")}), T0) == []  # scn-a still validating
    late = {"robustness": verdict("robustness", minutes=30), "safety": verdict("safety", minutes=30)}
    events = gate.decide(state(cands, {"scn-b": good("scn-b"), "scn-a": late}), T0)
    assert [(e["scenario_id"], e["benchmark_version"]) for e in events] == [("scn-a", 2), ("scn-b", 3)]
    # decided when the last of them was ready: scn-b's verdict came 25 minutes earlier, yet v3 is
    # not dated before v2
    assert {e["envelope"]["event_time"] for e in events} == {T0 + timedelta(minutes=30)}


def test_a_missing_verdict_defers_after_the_timeout_and_never_promotes():
    gate = PromotionGate(GateConfig(verdict_timeout_s=600))
    s = state([candidate("scn-a")], {"scn-a": {"robustness": verdict("robustness")}})
    assert gate.decide(s, T0 + timedelta(seconds=599)) == []
    events = gate.decide(s, T0 + timedelta(seconds=601))
    assert kinds(events) == [("Deferred", "scn-a")] and "safety" in events[0]["reason"]
    assert events[0]["envelope"]["event_time"] == T0 + timedelta(seconds=600)  # deterministic


def test_a_judge_that_did_not_run_is_missing_evidence_not_a_pass():
    gate = PromotionGate(GateConfig(semantic_required=True))
    failed_call = {**good("scn-a"), "semantic": verdict("semantic", passed=None, ran=False)}
    assert kinds(gate.decide(state([candidate("scn-a")], {"scn-a": failed_call}), T0)) == [("Deferred", "scn-a")]
    judged_no = {**good("scn-a"), "semantic": verdict("semantic", passed=False)}
    assert kinds(gate.decide(state([candidate("scn-a")], {"scn-a": judged_no}), T0)) == [("Rejected", "scn-a")]


def test_without_a_judge_the_decision_says_semantic_was_not_run():
    events = PromotionGate(GateConfig()).decide(state([candidate("scn-a")], {"scn-a": good("scn-a")}), T0)
    assert '"not run: no judge configured"' in events[0]["checks_json"]


def test_borderline_asks_for_review_and_a_review_decides():
    gate = PromotionGate(GateConfig())
    borderline = {"robustness": verdict("robustness", passed=None, decision="undecided"), "safety": verdict("safety")}
    s = state([candidate("scn-a")], {"scn-a": borderline})
    assert kinds(gate.decide(s, T0)) == [("ReviewRequested", "scn-a")]
    s.decisions = {"scn-a": {"ReviewRequested"}}
    assert gate.decide(s, T0) == []  # asked once
    s.reviews = {"scn-a": Review(True, "ana", "looks right", "rv-1", T0 + timedelta(hours=1))}
    events = gate.decide(s, T0)
    assert kinds(events) == [("Promoted", "scn-a")] and "ana" in events[0]["reason"]


def test_a_candidate_measuring_what_an_active_scenario_measures_is_redundant():
    active = {"scn-base": ActiveScenario("scn-base", {}, "base", ""),
              "scn-old": ActiveScenario("scn-old", {}, "friction", "scn-base")}
    success = {("scn-old", "oracle"): (10, 10), ("scn-old", "expert"): (9, 10), ("scn-old", "novice"): (3, 10)}
    events = PromotionGate(GateConfig()).decide(
        state([candidate("scn-a")], {"scn-a": good("scn-a")}, active=active, success=success), T0)
    assert kinds(events) == [("Rejected", "scn-a")] and "scn-old" in events[0]["reason"]


def test_saturated_scenarios_retire_once_a_promotion_takes_their_place():
    success = {("scn-base", m): (20, 20) for m in MODELS}
    events = PromotionGate(GateConfig()).decide(
        state([candidate("scn-a")], {"scn-a": good("scn-a")}, success=success), T0)
    assert kinds(events) == [("Promoted", "scn-a"), ("Retired", "scn-base")]
    assert [e["benchmark_version"] for e in events] == [2, 3]


def test_base_scenarios_are_promoted_without_verdicts():
    events = PromotionGate(GateConfig()).decide(
        state([candidate("scn-l", cycle="", factor="base", generator="base")], version=0, active={}), T0)
    assert kinds(events) == [("Promoted", "scn-l")] and events[0]["benchmark_version"] == 1


def test_deciding_the_same_log_twice_gives_identical_events():
    s = state([candidate("scn-a"), candidate("scn-b")], {"scn-a": good("scn-a"), "scn-b": good("scn-b")})
    first = PromotionGate(GateConfig()).decide(s, T0)
    again = PromotionGate(GateConfig()).decide(s, T0 + timedelta(hours=3))
    assert first == again


def test_a_decided_candidate_is_not_decided_again():
    s = state([candidate("scn-a")], {"scn-a": good("scn-a")}, decisions={"scn-a": {"Promoted"}})
    assert PromotionGate(GateConfig()).decide(s, T0) == []


def test_redundancy_reads_the_robustness_critics_own_evidence():
    """The verdict as consumers/critics/sequential.py writes it: the weak model lost all 10 seeds."""
    from loop_harness import critic_verdicts

    robust, safety, _ = critic_verdicts("scn-a", T0, accept=True)
    verdicts = {v["critic"]: Verdict(v["critic"], v["ran"], v["passed"], v["score"], v["reason"],
                                     RobustnessEvidence.from_json(v["evidence_json"])
                                     if v["critic"] == "robustness" else None, v["envelope"]["event_id"],
                                     v["envelope"]["event_time"]) for v in (robust, safety)}
    active = {"scn-base": ActiveScenario("scn-base", {}, "base", ""),
              "scn-old": ActiveScenario("scn-old", {}, "friction", "scn-base")}
    models = ("oracle", "strong", "weak")
    twin = {("scn-old", "oracle"): (20, 20), ("scn-old", "strong"): (19, 20), ("scn-old", "weak"): (1, 20)}
    s = state([candidate("scn-a")], {"scn-a": verdicts}, active=active, success=twin)
    s.models = models
    events = PromotionGate(GateConfig()).decide(s, T0)
    assert kinds(events) == [("Rejected", "scn-a")] and "redundant with active scenario scn-old" in events[0]["reason"]
    s.success = {**twin, ("scn-old", "weak"): (12, 20)}  # measures something else
    assert kinds(PromotionGate(GateConfig()).decide(s, T0)) == [("Promoted", "scn-a")]


def test_a_retirement_is_the_same_whichever_of_its_cycles_decisions_the_log_already_has():
    gate = PromotionGate(GateConfig())
    success = {("scn-base", m): (20, 20) for m in MODELS}
    cands = [candidate("scn-a"), candidate("scn-b", factor="mass")]
    verdicts = {"scn-a": good("scn-a"), "scn-b": good("scn-b")}
    full = gate.decide(state(cands, verdicts, success=success), T0)
    assert kinds(full) == [("Promoted", "scn-a"), ("Promoted", "scn-b"), ("Retired", "scn-base")]
    assert "promoted scn-a, scn-b take its place" in full[2]["reason"]
    base = ActiveScenario("scn-base", {}, "base", "")
    for landed in (1, 2):  # a gate cut off after one promotion, or after both (the Retired lost)
        s = state(cands, verdicts, success=success, version=1 + landed,
                  decisions={e["scenario_id"]: {"Promoted"} for e in full[:landed]},
                  active={"scn-base": base, **{e["scenario_id"]: ActiveScenario(e["scenario_id"], {}, "x", "scn-base")
                                               for e in full[:landed]}})
        s.promoted_at = {e["scenario_id"]: e["envelope"]["event_time"] for e in full[:landed]}
        assert gate.decide(s, T0) == full[landed:], f"{landed} landed"
    s.active.pop("scn-base")  # everything landed: nothing more
    s.decisions = {"scn-a": {"Promoted"}, "scn-b": {"Promoted"}, "scn-base": {"Promoted", "Retired"}}
    assert gate.decide(s, T0) == []


def test_a_cycle_cut_off_halfway_dates_the_rest_as_it_dated_the_first():
    gate = PromotionGate(GateConfig())
    late = {"robustness": verdict("robustness", minutes=30), "safety": verdict("safety", minutes=30)}
    cands = [candidate("scn-a"), candidate("scn-b", factor="mass")]
    verdicts = {"scn-a": late, "scn-b": good("scn-b")}  # the first published was the last ready
    full = gate.decide(state(cands, verdicts), T0)
    assert kinds(full) == [("Promoted", "scn-a"), ("Promoted", "scn-b")]
    s = state(cands, verdicts, version=2, decisions={"scn-a": {"Promoted"}},
              active={"scn-base": ActiveScenario("scn-base", {}, "base", ""),
                      "scn-a": ActiveScenario("scn-a", {}, "friction", "scn-base")})
    s.promoted_at = s.decided_at = {"scn-a": full[0]["envelope"]["event_time"]}
    # scn-b's own verdicts are 25 minutes older than scn-a's: v3 must still not predate v2
    assert gate.decide(s, T0) == full[1:]


def _outcomes(scenario: str, failures: dict[str, set[int]], seeds: int = 10) -> dict:
    """(scenario, model) -> {(seed, variant): success}: each model fails on the seeds given."""
    return {(scenario, m): {(s, ""): s not in failures.get(m, set()) for s in range(seeds)} for m in MODELS}


def test_redundancy_is_judged_seed_for_seed_where_both_ran_the_same_seeds():
    active = {"scn-base": ActiveScenario("scn-base", {}, "base", ""),
              "scn-old": ActiveScenario("scn-old", {}, "friction", "scn-base")}
    novice_fails = {"novice": {0, 1, 2, 3, 4, 5, 6, 7}}
    same = state([candidate("scn-a")], {"scn-a": good("scn-a")}, active=active)
    same.outcomes = {**_outcomes("scn-a", novice_fails), **_outcomes("scn-old", {"novice": {0, 1, 2, 3, 4, 5, 6}})}
    events = PromotionGate(GateConfig()).decide(same, T0)
    assert kinds(events) == [("Rejected", "scn-a")]
    assert "differ on at most 10% of the seeds both ran" in events[0]["reason"]
    assert json.loads(events[0]["checks_json"])["redundancy"]["compared_on"] == "paired seeds"
    # The same rates from failures on other seeds: two tests, not one (rates alone called it redundant).
    other = state([candidate("scn-a")], {"scn-a": good("scn-a")}, active=active)
    other.outcomes = {**_outcomes("scn-a", novice_fails), **_outcomes("scn-old", {"novice": {2, 3, 4, 5, 6, 7, 8, 9}})}
    other.success = {("scn-old", "oracle"): (8, 8), ("scn-old", "expert"): (7, 8), ("scn-old", "novice"): (2, 8)}
    assert kinds(PromotionGate(GateConfig()).decide(other, T0)) == [("Promoted", "scn-a")]


def test_a_sibling_promoted_before_it_in_the_cycle_makes_a_candidate_redundant():
    cands = [candidate("scn-a"), candidate("scn-b"), candidate("scn-c", factor="mass")]
    s = state(cands, {c.scenario_id: good(c.scenario_id) for c in cands})
    fails = {"novice": {1, 3, 5, 7, 9}}
    s.outcomes = {**_outcomes("scn-a", fails), **_outcomes("scn-b", fails), **_outcomes("scn-c", fails)}
    events = PromotionGate(GateConfig()).decide(s, T0)
    assert kinds(events) == [("Promoted", "scn-a"), ("Rejected", "scn-b"), ("Promoted", "scn-c")]
    assert "scenario promoted before it in this cycle scn-a" in events[1]["reason"]
    assert [e["benchmark_version"] for e in events if e["envelope"]["event_type"] == "Promoted"] == [2, 3]
    # After a restart with scn-a's promotion in the log, scn-b meets it as an active scenario: the same outcome.
    s.decisions, s.version = {"scn-a": {"Promoted"}}, 2
    s.active = {**s.active, "scn-a": ActiveScenario("scn-a", {}, "friction", "scn-base")}
    again = PromotionGate(GateConfig()).decide(s, T0)
    assert kinds(again) == [("Rejected", "scn-b"), ("Promoted", "scn-c")]
    assert "active scenario scn-a" in again[0]["reason"]


def test_at_most_max_per_factor_scenarios_test_one_factor():
    """Three distractor scenarios measuring different things: two go in, the third is turned away
    for breadth; a composition is not capped, and the cap is the config's."""
    cands = [candidate(f"scn-{x}", factor="distractors") for x in "abc"] + [candidate("scn-d", factor="composition")]
    s = state(cands, {c.scenario_id: good(c.scenario_id) for c in cands})
    s.outcomes = {**_outcomes("scn-a", {"novice": {0, 1, 2, 3}}), **_outcomes("scn-b", {"novice": {4, 5, 6, 7}}),
                  **_outcomes("scn-c", {"novice": {8, 9, 10, 11}}), **_outcomes("scn-d", {"novice": {0, 4, 8}})}
    events = PromotionGate(GateConfig()).decide(s, T0)
    assert kinds(events) == [("Promoted", "scn-a"), ("Promoted", "scn-b"), ("Rejected", "scn-c"),
                             ("Promoted", "scn-d")]
    assert "breadth: 2 scenarios already test factor 'distractors' (scn-a, scn-b; at most 2)" in events[2]["reason"]
    assert json.loads(events[2]["checks_json"])["breadth"]["same_factor"] == ["scn-a", "scn-b"]
    wide = PromotionGate(GateConfig(max_per_factor=3)).decide(s, T0)
    assert [k for k, _ in kinds(wide)] == ["Promoted"] * 4
    # An active scenario of the factor counts as much as a sibling.
    s.active = {**s.active, "scn-old": ActiveScenario("scn-old", {}, "distractors", "scn-base")}
    s.outcomes.update(_outcomes("scn-old", {"novice": {12, 13, 14, 15}}))
    assert kinds(PromotionGate(GateConfig()).decide(s, T0))[:3] == [("Promoted", "scn-a"), ("Rejected", "scn-b"),
                                                                    ("Rejected", "scn-c")]


def test_max_per_factor_must_be_a_positive_integer():
    import pytest

    from streams.exceptions import ConfigError
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="max_per_factor"):
            GateConfig(max_per_factor=bad)
