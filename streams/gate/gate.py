"""The promotion gate's pure core: candidates and their critics' verdicts in, decisions out.

    gate = PromotionGate(GateConfig(semantic_required=False))
    decisions = gate.decide(state, now)     # Promoted / Rejected / Deferred / ReviewRequested / Retired dicts

``state`` (GateState) is what the evidence log says: the candidates, their verdicts, the reviews,
the active benchmark with its version, and the success counts per model x scenario. The gate keeps
nothing between calls: every decision is a function of the log, so a restarted gate decides
nothing twice (a decision already in the log takes its candidate out of ``pending``) and loses
nothing (verdicts are in the log, not in the gate).

The checks, in order (the seed system's gates, decided sequentially; the first that fails decides):

1. robustness: the robustness critic's verdict (consumers/critics). Its evidence says whether the
   candidate is solvable (the oracle solves it), reproducible (a model fails it reliably),
   harder than its parent for some model (paired seeds) and discriminative (the models differ).
   A rejection rejects; a verdict the sequential rule could not settle within its budget
   ("undecided") is borderline and asks a person (ReviewRequested).
2. safety: the safety critic's verdict; unsafe for the oracle rejects.
3. semantic: the VLM judge, when one is configured (``semantic_required``). A judge that did not
   really run (timeout, refusal, malformed reply: ``ran`` false) is missing evidence: Deferred,
   re-tried when a verdict comes, never promoted without it. Without a judge configured the
   decision records "semantic: not run".
4. not redundant: a scenario changing the same factor, active or promoted just before in the same
   cycle, measures the same thing when, model for model, its outcomes and the candidate's differ on
   at most ``redundancy_tolerance`` of the selection seeds both ran (paired, seed for seed: two
   rates of 10-20 seeds each agree within 0.10 by chance about as often as not, and equal rates
   from different failures are two tests, not one). With fewer than ``redundancy_min_pairs``
   shared seeds for some model, the per-model success rates are compared instead.
5. breadth: at most ``max_per_factor`` active scenarios change one factor, those promoted just
   before in the same cycle counted. A benchmark that is all distractor variants ranks models by
   attention alone, and a model's order on it tells little about the rest of its skill (issue 17
   measured an evolved benchmark of three distractor scenarios agreeing less with a broad suite
   than the static base did). The base and compositions are not capped.

A verdict missing ``verdict_timeout_s`` after the candidate was proposed -> Deferred (once per
reason); so is, at once, a robustness verdict whose evidence does not read as its record
(schemas/verdict_evidence.py), the reason naming the key at fault. Candidates of one evolution
cycle are decided together, in scenario-id order, once every one of them is ready, so the
benchmark versions they get do not depend on which critic finished first. Every Promoted and
Retired yields the next benchmark version. After promotions, active scenarios that every
registered model passes (``retire_min_success`` over at least ``retire_min_episodes``) are
retired, as long as a scenario that still discriminates stays active.

Event times come from the evidence a decision rests on: a cycle's decisions are all dated when
the last of its candidates became ready (its latest verdict or review, or its proposal plus the
timeout), so deciding the same log again yields byte-identical events.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from schemas.events import make_event
from schemas.verdict_evidence import RobustnessEvidence
from streams.exceptions import ConfigError
from streams.mutations.operators import MAX_ACTIVE_PER_FACTOR

GATE_VERSION = "gate/1.0"
PRODUCER = "promotion-gate"
ROBUSTNESS, SAFETY, SEMANTIC = "robustness", "safety", "semantic"
TERMINAL = ("Promoted", "Rejected")
BASE_GENERATOR = "base"
UNCAPPED_FACTORS = ("base", "composition")  # the breadth check counts every other factor


@dataclass(frozen=True, kw_only=True)
class GateConfig:
    semantic_required: bool = False  # a VLM judge is configured: its verdict is required evidence
    verdict_timeout_s: float = 1800.0  # a verdict missing this long after the proposal -> Deferred, s
    # outcomes differing on at most this share of the shared seeds, for every model = redundant
    redundancy_tolerance: float = 0.10
    redundancy_min_pairs: int = 8  # shared seeds per model the paired comparison needs
    max_per_factor: int = MAX_ACTIVE_PER_FACTOR  # active scenarios changing one factor, at most (breadth)
    # every registered model at or above this success rate ... (below the report's "saturated", 0.95:
    # consumers/state/scope.py, SATURATION_RATE, says why)
    retire_min_success: float = 0.90
    retire_min_episodes: int = 10  # ... over at least this many episodes each: saturated, retired
    run_id: str = "gate"

    def __post_init__(self) -> None:
        for name in ("verdict_timeout_s", "redundancy_tolerance"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"GateConfig.{name} must be a finite number >= 0, got {value!r}")
        if not 0.0 < self.retire_min_success <= 1.0:
            raise ConfigError(f"GateConfig.retire_min_success must be in (0, 1], got {self.retire_min_success!r}")
        if not isinstance(self.max_per_factor, int) or isinstance(self.max_per_factor, bool) \
                or self.max_per_factor < 1:
            raise ConfigError(f"GateConfig.max_per_factor must be an integer >= 1, got {self.max_per_factor!r}")
        if not isinstance(self.redundancy_min_pairs, int) or self.redundancy_min_pairs < 1:
            raise ConfigError(f"GateConfig.redundancy_min_pairs must be an integer >= 1, "
                              f"got {self.redundancy_min_pairs!r}")
        if not isinstance(self.retire_min_episodes, int) or self.retire_min_episodes < 1:
            raise ConfigError(f"GateConfig.retire_min_episodes must be an integer >= 1, "
                              f"got {self.retire_min_episodes!r}")


@dataclass(frozen=True)
class Candidate:
    scenario_id: str
    parent_scenario_id: str
    scenario: dict  # the ScenarioSpec record
    factor: str
    generator: str  # failure-guided | blind | composition | base
    cycle_id: str
    source_cluster_id: str | None
    event_id: str  # of its CandidateProposed
    proposed_at: datetime


@dataclass(frozen=True)
class Verdict:
    critic: str
    ran: bool
    passed: bool | None
    score: float | None
    reason: str
    # The robustness verdict's evidence, decoded once where GateState is built (streams/gate/agent.py);
    # None for the other critics (the gate reads nothing of theirs) and for unreadable evidence.
    evidence: RobustnessEvidence | None
    event_id: str
    event_time: datetime
    evidence_error: str | None = None  # why the evidence could not be read (InvalidEvidence's message)


@dataclass(frozen=True)
class Review:
    approved: bool
    reviewer: str
    note: str
    event_id: str
    event_time: datetime


@dataclass(frozen=True)
class ActiveScenario:
    scenario_id: str
    scenario: dict
    factor: str
    parent_scenario_id: str


@dataclass
class GateState:
    """The log as the gate reads it (built by the agent from consumers.state.online queries)."""

    version: int  # the current benchmark version (0: nothing promoted yet)
    candidates: dict[str, Candidate]
    verdicts: dict[str, dict[str, Verdict]]  # scenario_id -> critic -> its latest verdict
    decisions: dict[str, set[str]]  # scenario_id -> decision event types already in the log
    deferred_reasons: dict[str, set[str]]  # scenario_id -> reasons already deferred for
    reviews: dict[str, Review]  # scenario_id -> its ReviewDecided
    active: dict[str, ActiveScenario]
    models: tuple[str, ...]  # registered model ids (the oracle included)
    success: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)  # (scenario, model) -> (k, n)
    # (scenario, model) -> {(seed, variant): success} on selection seeds, for active scenarios and candidates
    outcomes: dict[tuple[str, str], dict[tuple[int, str], bool]] = field(default_factory=dict)
    promoted_at: dict[str, datetime] = field(default_factory=dict)  # scenario_id -> its Promoted's event time
    decided_at: dict[str, datetime] = field(default_factory=dict)  # scenario_id -> its latest decision's event time

    def pending(self) -> list[Candidate]:
        """Candidates with no terminal decision yet."""
        return [c for c in self.candidates.values() if not self.decisions.get(c.scenario_id, set()) & set(TERMINAL)]


@dataclass(frozen=True)
class _Outcome:
    kind: str  # Promoted | Rejected | Deferred | ReviewRequested | wait
    reason: str
    checks: dict
    evidence: tuple[str, ...]
    at: datetime | None


class PromotionGate:
    def __init__(self, config: GateConfig):
        self.config = config

    # -- entry point ------------------------------------------------------------------------

    def decide(self, state: GateState, now: datetime) -> list[dict]:
        """Every decision the log now calls for, in the order to publish them."""
        out: list[dict] = []
        version = state.version
        promoted: dict[str, dict[str, datetime]] = {}  # cycle -> scenario -> its Promoted's time, this call
        for batch in self._ready_batches(state, now):
            # A cycle is decided once its last candidate is ready, so every decision in it is dated
            # then: versions numbered in scenario-id order (not in the order critics finished) then
            # also read in time order, and a cycle's promotions share one time. Decisions of the
            # cycle already in the log count too: a gate cut off halfway through publishing a cycle
            # dates the rest as it dated the first, never earlier.
            key = _cycle_of(batch[0][0])
            logged = [at for sid, at in state.decided_at.items()
                      if sid in state.candidates and _cycle_of(state.candidates[sid]) == key]
            decided_at = max([o.at for _, o in batch] + logged)
            for candidate, outcome in batch:
                outcome = replace(outcome, at=decided_at)
                if outcome.kind == "Promoted":
                    version += 1
                    promoted.setdefault(_cycle_of(candidate), {})[candidate.scenario_id] = outcome.at
                out.append(self._event(candidate, outcome, version))
        return out + self._retirements(state, version, promoted)

    # -- per candidate ----------------------------------------------------------------------

    def _ready_batches(self, state: GateState, now: datetime) -> list[list[tuple[Candidate, _Outcome]]]:
        """Candidates grouped by cycle (oldest first); a cycle's group is returned only when every
        one of its pending candidates has an outcome other than "wait"."""
        by_cycle: dict[str, list[Candidate]] = {}
        for c in state.pending():
            by_cycle.setdefault(_cycle_of(c), []).append(c)
        batches = []
        for key in sorted(by_cycle, key=lambda k: (min(c.proposed_at for c in by_cycle[k]), k)):
            outcomes: list[tuple[Candidate, _Outcome]] = []
            for c in sorted(by_cycle[key], key=lambda c: c.scenario_id):
                # a sibling promoted before this one is as much the benchmark as an active scenario
                siblings = [p for p, o in outcomes if o.kind == "Promoted"]
                outcomes.append((c, self._judge(state, c, now, siblings)))
            if any(o.kind == "wait" for _, o in outcomes):
                continue
            batch = [(c, o) for c, o in outcomes if not self._already(state, c, o)]
            if batch:
                batches.append(batch)
        return batches

    def _already(self, state: GateState, c: Candidate, o: _Outcome) -> bool:
        done = state.decisions.get(c.scenario_id, set())
        if o.kind == "Deferred":
            return o.reason in state.deferred_reasons.get(c.scenario_id, set())
        if o.kind == "ReviewRequested":
            return "ReviewRequested" in done
        return False

    def _judge(self, state: GateState, c: Candidate, now: datetime, siblings: list[Candidate]) -> _Outcome:
        if c.generator == BASE_GENERATOR:
            return _Outcome("Promoted", "base benchmark scenario", {"base": True}, (c.event_id,), c.proposed_at)
        review = state.reviews.get(c.scenario_id)
        if review is not None and "ReviewRequested" in state.decisions.get(c.scenario_id, set()):
            kind = "Promoted" if review.approved else "Rejected"
            why = "approved" if review.approved else "rejected"
            note = f": {review.note}" if review.note else ""
            return _Outcome(kind, f"{why} in review by {review.reviewer}{note}",
                            {"review": {"approved": review.approved}}, (c.event_id, review.event_id),
                            review.event_time)
        verdicts = state.verdicts.get(c.scenario_id, {})
        checks: dict = {}
        evidence: list[str] = [c.event_id]
        deadline = c.proposed_at + timedelta(seconds=self.config.verdict_timeout_s)

        def missing(critic: str) -> _Outcome:
            if now < deadline:
                return _Outcome("wait", "", checks, (), None)
            return _Outcome("Deferred", f"{critic} verdict missing {self.config.verdict_timeout_s:.0f} s after the "
                            "proposal", checks, tuple(evidence), deadline)

        robust = verdicts.get(ROBUSTNESS)
        if robust is None or not robust.ran:
            return missing(ROBUSTNESS)
        evidence.append(robust.event_id)
        if robust.evidence is None:
            # Evidence that does not read as the robustness record (schemas/verdict_evidence.py: a key
            # missing, renamed or mistyped, not JSON) is a verdict the gate cannot use, whatever it says:
            # Deferred at once with the reason (naming the key and the verdict; the tick logs it), as a
            # judge that did not really run is; never promoted or rejected on it. The candidate stays
            # pending, so a later verdict decides it.
            return _Outcome("Deferred", f"robustness verdict unusable: {robust.evidence_error or 'no evidence'}",
                            checks, tuple(evidence), robust.event_time)
        checks[ROBUSTNESS] = robust.evidence.checks
        if robust.passed is False:
            return _Outcome("Rejected", f"robustness: {robust.reason}", checks, tuple(evidence), robust.event_time)
        # Undecided at the rule's last look with every test near its level: a person decides, once the
        # other critics have had their say.
        borderline = robust.passed is None or robust.evidence.borderline
        latest = robust.event_time

        safety = verdicts.get(SAFETY)
        if safety is None or not safety.ran:
            return missing(SAFETY)
        evidence.append(safety.event_id)
        checks[SAFETY] = {"passed": safety.passed, "score": safety.score, "reason": safety.reason}
        latest = max(latest, safety.event_time)
        if safety.passed is False:
            return _Outcome("Rejected", f"safety: {safety.reason}", checks, tuple(evidence), latest)

        semantic = verdicts.get(SEMANTIC)
        if self.config.semantic_required:
            if semantic is None:
                return missing(SEMANTIC)
            evidence.append(semantic.event_id)
            latest = max(latest, semantic.event_time)
            checks[SEMANTIC] = {"ran": semantic.ran, "passed": semantic.passed, "score": semantic.score,
                                "reason": semantic.reason}
            if not semantic.ran:
                # A judge that did not really run is missing evidence: deferred, never a pass.
                return _Outcome("Deferred", f"semantic judge did not run: {semantic.reason}", checks,
                                tuple(evidence), latest)
            if semantic.passed is False:
                return _Outcome("Rejected", f"semantic: {semantic.reason}", checks, tuple(evidence), latest)
        else:
            checks[SEMANTIC] = {"ran": False, "reason": "not run: no judge configured"}

        twin, how = self._redundant_with(state, c, robust.evidence, siblings)
        checks["redundancy"] = {"tolerance": self.config.redundancy_tolerance, "twin": twin, "compared_on": how}
        if twin is not None:
            what = "active scenario" if twin in state.active else "scenario promoted before it in this cycle"
            tol = f"{self.config.redundancy_tolerance:.0%}"
            if how == "paired seeds":
                why = f"every model's outcomes differ on at most {tol} of the seeds both ran"
            else:
                why = f"every model within {tol}"
            return _Outcome("Rejected", f"redundant with {what} {twin} (same factor {c.factor!r}, {why})",
                            checks, tuple(evidence), latest)
        crowd = self._same_factor(state, c, siblings)
        checks["breadth"] = {"max_per_factor": self.config.max_per_factor, "same_factor": crowd}
        if len(crowd) >= self.config.max_per_factor:
            return _Outcome("Rejected", f"breadth: {len(crowd)} scenarios already test factor {c.factor!r} "
                            f"({', '.join(crowd)}; at most {self.config.max_per_factor})",
                            checks, tuple(evidence), latest)
        if borderline:
            return _Outcome("ReviewRequested", f"borderline: {robust.reason}", checks, tuple(evidence), latest)
        return _Outcome("Promoted", f"passed robustness, safety{', semantic' if self.config.semantic_required else ''}"
                        ", redundancy and breadth checks", checks, tuple(evidence), latest)

    def _same_factor(self, state: GateState, c: Candidate, siblings: list[Candidate]) -> list[str]:
        """The active scenarios and earlier-promoted siblings changing the candidate's factor, when
        that factor is capped (not the base's, not a composition's)."""
        if c.factor in UNCAPPED_FACTORS:
            return []
        return sorted({*(sid for sid, a in state.active.items() if a.factor == c.factor),
                       *(s.scenario_id for s in siblings if s.factor == c.factor)})

    def _redundant_with(self, state: GateState, c: Candidate, robustness: RobustnessEvidence,
                        siblings: list[Candidate]) -> tuple[str | None, str | None]:
        """(the scenario of the same factor the candidate measures again, how that was compared):
        an active one or a sibling promoted before it, first by id. Compared seed for seed where
        every model has ``redundancy_min_pairs`` shared seeds; else on success rates (the robustness
        verdict's own counts for the candidate: consumers/critics/sequential.py)."""
        others = sorted({*(sid for sid, a in state.active.items()
                           if a.factor == c.factor and sid != c.parent_scenario_id),
                         *(s.scenario_id for s in siblings if s.factor == c.factor)})
        for sid in others:
            shared = {m: state.outcomes[(c.scenario_id, m)].keys() & state.outcomes.get((sid, m), {}).keys()
                      for m in state.models if (c.scenario_id, m) in state.outcomes}
            if shared and all(len(keys) >= self.config.redundancy_min_pairs for keys in shared.values()):
                if all(self._differ(state, c.scenario_id, sid, m, keys) <= self.config.redundancy_tolerance
                       for m, keys in shared.items()):
                    return sid, "paired seeds"
            elif self._rates_agree(state, c, sid, robustness):
                return sid, "success rates"
        return None, None

    @staticmethod
    def _differ(state: GateState, a: str, b: str, model: str, keys: set) -> float:
        """The share of the shared seeds on which the two scenarios' outcomes differ for the model."""
        return sum(state.outcomes[(a, model)][k] != state.outcomes[(b, model)][k] for k in keys) / len(keys)

    def _rates_agree(self, state: GateState, c: Candidate, sid: str, robustness: RobustnessEvidence) -> bool:
        n = robustness.seeds_per_arm
        rates = {m: v.candidate_successes / n for m, v in robustness.models.items()} if n else {}
        other = {m: state.success[(sid, m)] for m in rates if (sid, m) in state.success}
        if not rates or len(other) < len(rates):
            return False
        return all(abs(rates[m] - k / total) <= self.config.redundancy_tolerance for m, (k, total) in other.items()
                   if total)

    # -- retirement -------------------------------------------------------------------------

    def _retirements(self, state: GateState, version: int, promoted: dict[str, dict[str, datetime]]) -> list[dict]:
        """Retired for the active scenarios every registered model passes, riding with a cycle's
        promotions (they passed the discriminative check: they take the saturated ones' place).

        A function of the log, not of which of the cycle's decisions this call happens to make, so
        a gate cut off halfway through publishing a cycle's decisions re-derives the same Retired
        events after a restart: the reason names every promotion of the cycle (in the log or made
        now), the time is the latest of them, and the latest cycle is looked at again on every tick
        (a Retired lost after its promotions landed is published then). Base scenarios ride with no
        cycle."""
        cfg = self.config
        models = state.models
        took: dict[str, dict[str, datetime]] = {}  # cycle -> scenario -> its Promoted's time (log and now)
        order: dict[str, tuple] = {}
        for c in state.candidates.values():
            if c.generator == BASE_GENERATOR:
                continue
            key = _cycle_of(c)
            order[key] = min(order.get(key, (c.proposed_at, key)), (c.proposed_at, key))
            at = state.promoted_at.get(c.scenario_id) or promoted.get(key, {}).get(c.scenario_id)
            if at is not None:
                took.setdefault(key, {})[c.scenario_id] = at
        latest = max(order, key=order.get) if order else None
        cycles = sorted({k for k in promoted if k in took} | ({latest} if latest in took else set()), key=order.get)
        active = set(state.active) | {sid for by in promoted.values() for sid in by}

        def saturated(sid: str) -> bool:
            counts = [state.success.get((sid, m)) for m in models]
            return bool(models) and all(k is not None and k[1] >= cfg.retire_min_episodes
                                        and k[0] / k[1] >= cfg.retire_min_success for k in counts)

        retired: list[dict] = []
        for key in cycles:
            names = sorted(took[key])
            at = max(took[key].values())
            for sid in sorted(active - set(names)):
                if not saturated(sid):
                    continue
                version += 1
                active.discard(sid)
                counts = {m: list(state.success[(sid, m)]) for m in models}
                reason = (f"every registered model passes it (>= {cfg.retire_min_success:.0%} over >= "
                          f"{cfg.retire_min_episodes} episodes); promoted {', '.join(names)} take its place")
                retired.append(make_event("Retired", (sid, version), PRODUCER, cfg.run_id, event_time=at,
                                          scenario_id=sid, reason=reason, evidence_event_ids=[],
                                          gate_version=GATE_VERSION,
                                          checks_json=json.dumps({"success": counts}, sort_keys=True),
                                          benchmark_version=version))
        return retired

    # -- events -----------------------------------------------------------------------------

    def _event(self, c: Candidate, o: _Outcome, version: int) -> dict:
        common = {"scenario_id": c.scenario_id, "reason": o.reason, "evidence_event_ids": list(o.evidence),
                  "gate_version": GATE_VERSION, "checks_json": json.dumps(o.checks, sort_keys=True, default=str)}
        run_id = self.config.run_id
        if o.kind == "Promoted":
            return make_event("Promoted", (c.scenario_id, version), PRODUCER, run_id, event_time=o.at, **common,
                              benchmark_version=version, scenario=c.scenario,
                              parent_scenario_id=c.parent_scenario_id, source_cluster_id=c.source_cluster_id or "",
                              factor=c.factor)
        key = (c.scenario_id, o.reason) if o.kind == "Deferred" else (c.scenario_id,)
        return make_event(o.kind, key, PRODUCER, run_id, event_time=o.at, **common)


def _cycle_of(c: Candidate) -> str:
    """The group a candidate is decided in: its evolution cycle, or itself when it has none."""
    return c.cycle_id or f"~{c.scenario_id}"
