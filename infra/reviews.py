"""Reviews, and the gate's decisions from the command line: the candidates the gate asked a person
about, the ReviewDecided a person gives, and the wait until published decisions are in the evidence
log. Apart from the evolving loop: `sepa-eval review`, `approve` and `reject` use these alone.

    event = review_decision(store, "scn-1a2b", approved=True, reviewer="ada", note="looks right")
    publisher.publish(event); publisher.flush()
    wait_for_decisions(store, [event["envelope"]["event_id"]], timeout_s=30)

A scenario gets one ReviewDecided (its id comes from the scenario alone), and only while the
gate's ReviewRequested is its latest decision: the log is checked before anything is published.
The gate (streams/gate) turns an approval into Promoted, a rejection into Rejected.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from consumers.evidence.store import EvidenceStore
from consumers.state import online as q
from infra.exceptions import ReviewRefused
from infra.waits import Check, poll_until, quote_ids
from schemas.events import make_event
from schemas.exceptions import InvalidEvidence
from schemas.verdict_evidence import RobustnessEvidence

REVIEW_PRODUCER = "review"
ROBUSTNESS = "robustness"  # the critic whose checks a reviewer weighs
# How long a command that published decisions waits for the evidence log to show them, s.
DECISIONS_LANDING_S = 60.0


@dataclass(frozen=True)
class AwaitingReview:
    """A candidate the gate asked a person about, with what it rests on."""

    review: q.OpenReview
    candidate: q.Candidate | None
    robustness: q.Verdict | None  # its latest robustness verdict: the checks a reviewer weighs

    @property
    def checks(self) -> dict:
        """The robustness verdict's checks, read through its typed evidence; else (no verdict, or
        evidence the gate could not use either) the checks the gate recorded with the review."""
        if self.robustness is not None:
            try:
                evidence = RobustnessEvidence.from_json(self.robustness.evidence_json, verdict=self.robustness.event_id)
            except InvalidEvidence:
                evidence = None  # the gate deferred on it and said why; the review holds what it recorded
            if evidence is not None and evidence.checks:
                return {name: dict(check) for name, check in evidence.checks.items()}
        try:
            recorded = json.loads(self.review.checks_json) if self.review.checks_json else {}
        except json.JSONDecodeError:
            return {}
        checks = recorded.get(ROBUSTNESS) if isinstance(recorded, dict) else None
        return checks if isinstance(checks, dict) else {}


def awaiting_review(store: EvidenceStore) -> list[AwaitingReview]:
    """Candidates awaiting review (a ReviewRequested no ReviewDecided or later decision answered),
    by scenario id, with their candidate and robustness verdict."""
    reviews = q.open_reviews(store)
    if not reviews:
        return []
    ids = {r.scenario_id for r in reviews}
    candidates = {c.scenario_id: c for c in q.candidates(store) if c.scenario_id in ids}
    out = []
    for r in reviews:
        c = candidates.get(r.scenario_id)
        robust = [v for v in (c.verdicts if c else ()) if v.critic == ROBUSTNESS]
        out.append(AwaitingReview(r, c, robust[-1] if robust else None))
    return out


def review_decision(store: EvidenceStore, scenario_id: str, approved: bool, reviewer: str, note: str = "",
                    at: datetime | None = None) -> dict:
    """The ReviewDecided for a scenario awaiting review; ReviewRefused (naming why) for an unknown
    scenario, one not awaiting review, or one reviewed already."""
    if not reviewer.strip():
        raise ReviewRefused("a review decision needs a reviewer's name (--reviewer)")
    history = q.decisions(store, scenario_ids=[scenario_id])
    reviewed = [d for d in history if d.event_type == "ReviewDecided"]
    if reviewed:
        d = reviewed[0]
        raise ReviewRefused(f"{scenario_id} was reviewed already: {'approved' if d.approved else 'rejected'} by "
                            f"{d.reviewer} at {d.event_time:%Y-%m-%d %H:%M:%S} UTC (a scenario gets one review "
                            "decision)")
    if not history:
        if any(c.scenario_id == scenario_id for c in q.candidates(store)):
            raise ReviewRefused(f"{scenario_id} is not awaiting review: the gate has not decided it yet")
        waiting = [r.scenario_id for r in q.open_reviews(store)]
        raise ReviewRefused(f"no candidate {scenario_id!r} in the evidence log (awaiting review: "
                            f"{quote_ids(waiting) if waiting else 'none'})")
    last = history[-1]
    if last.event_type != "ReviewRequested":
        raise ReviewRefused(f"{scenario_id} is not awaiting review: its latest decision is {last.event_type} "
                            f"({last.reason})")
    return make_event("ReviewDecided", (scenario_id,), REVIEW_PRODUCER, REVIEW_PRODUCER, event_time=at,
                      scenario_id=scenario_id, approved=approved, reviewer=reviewer.strip(), note=note)


def wait_for_decisions(store: EvidenceStore, event_ids: list[str], timeout_s: float = DECISIONS_LANDING_S,
                       check: Check | None = None) -> None:
    """Until every decision event published is in the evidence log (benchmark_decisions)."""
    wanted = set(event_ids)

    def missing() -> set[str]:
        return wanted - {d.event_id for d in q.decisions(store)}

    poll_until(lambda: not missing(), timeout_s, check,
               lambda: f"{len(missing())} published decision(s) are not in the evidence log (benchmark_decisions): "
                       f"{quote_ids(sorted(missing()))}; is the pipeline (the evidence sink) running?")
