"""A robustness verdict whose evidence does not read as its record (schemas/verdict_evidence.py) is
an error where the gate's agent builds GateState, not an empty dict: the gate does not crash, does
not promote or reject on it, and defers the candidate once, with a reason naming the key and the
verdict; its cycle's other candidates are decided as ever, and a later good verdict decides it."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from types import SimpleNamespace

from test_gate import T0, candidate, kinds, state, verdict

from streams.gate.agent import _verdict
from streams.gate.gate import GateConfig, PromotionGate

GOOD = {"action": "accept", "checks": {"solvable": {"status": "passed"}}, "seeds_per_arm": 8,
        "models": {"oracle": {"candidate_successes": 8}, "expert": {"candidate_successes": 7},
                   "novice": {"candidate_successes": 2}}}


def stored(event_id: str, evidence: dict | str, passed: bool | None = True, critic: str = "robustness",
           minutes: int = 5) -> SimpleNamespace:
    """A CriticVerdict as the evidence log gives it back (consumers.state's Verdict)."""
    text = evidence if isinstance(evidence, str) else json.dumps(evidence)
    return SimpleNamespace(critic=critic, ran=True, passed=passed, score=1.0, reason=f"{critic} says {passed}",
                           evidence_json=text, event_id=event_id, event_time=T0 + timedelta(minutes=minutes))


def test_the_boundary_decodes_robustness_evidence_only_and_keeps_the_error_of_a_bad_one():
    good = _verdict(stored("v-good-1", GOOD))
    assert good.evidence.seeds_per_arm == 8 and good.evidence_error is None
    bad = _verdict(stored("v-bad-1", {k: v for k, v in GOOD.items() if k != "seeds_per_arm"}))
    assert bad.evidence is None
    assert "verdict v-bad-1" in bad.evidence_error and "'seeds_per_arm' is missing" in bad.evidence_error
    safety = _verdict(stored("v-safety-1", "not even json", critic="safety"))  # the gate reads nothing of it
    assert safety.evidence is None and safety.evidence_error is None


def test_unreadable_evidence_defers_the_candidate_and_never_promotes_it(caplog):
    renamed = {**{k: v for k, v in GOOD.items() if k != "models"},
               "models": {"oracle": {"successes": 8}, "expert": {"candidate_successes": 7}}}
    gate = PromotionGate(GateConfig())
    for n, evidence in enumerate((renamed, "{", "", {**GOOD, "seeds_per_arm": "8"})):
        for passed in (True, None, False):
            event_id = f"v-unreadable-{n}-{passed}"
            with caplog.at_level(logging.WARNING, logger="sepa.streams.gate"):
                robust = _verdict(stored(event_id, evidence, passed=passed))
                assert _verdict(stored(event_id, evidence, passed=passed)) == robust  # decoded (and logged) once
            assert sum(event_id in r.getMessage() for r in caplog.records) == 1
            s = state([candidate("scn-a"), candidate("scn-b")],
                      {"scn-a": {"robustness": robust, "safety": verdict("safety")},
                       "scn-b": {"robustness": verdict("robustness"), "safety": verdict("safety")}})
            events = gate.decide(s, T0)
            assert kinds(events) == [("Deferred", "scn-a"), ("Promoted", "scn-b")], (evidence, passed)
            reason = events[0]["reason"]
            assert reason.startswith("robustness verdict unusable: robustness evidence of verdict " + event_id)
            assert events[0]["envelope"]["event_time"] == robust.event_time
            if n == 0:
                assert "'models.oracle.candidate_successes' is missing" in reason and "'successes'" in reason
            # deferred once for that reason; a good verdict later decides it
            s.deferred_reasons = {"scn-a": {reason}}
            s.decisions = {"scn-b": {"Promoted"}}
            assert gate.decide(s, T0) == []
            s.verdicts["scn-a"]["robustness"] = _verdict(stored(f"v-later-{n}-{passed}", GOOD, minutes=9))
            assert kinds(gate.decide(s, T0)) == [("Promoted", "scn-a")]
