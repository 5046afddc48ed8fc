"""The evolution loop as the log records it: candidates with their critic verdicts and where the
gate (or a reviewer) left them, the funnel from generated to promoted per generator, the cycles
the orchestrator opened, and the reviews waiting for a person."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from consumers.evidence.store import EvidenceStore
from consumers.state.scope import DECISION_STATUS, _scope, _utc, _where
from consumers.state.versions import Decision, decisions

# --- candidates, verdicts, the funnel ------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    event_id: str
    event_time: datetime
    scenario_id: str
    critic: str  # semantic | safety | robustness
    critic_version: str
    ran: bool  # False: the critic did not really run (missing evidence, never a pass)
    score: float | None
    passed: bool | None
    backend: str
    reason: str
    rollouts: int  # rollouts this critic requested for the verdict
    evidence_json: str


def verdicts(store: EvidenceStore, *, scenario_ids: Sequence[str] | None = None, run_id: str | None = None,
             as_of: datetime | None = None) -> list[Verdict]:
    """Critic verdicts, oldest first."""
    params: dict = {}
    conditions = _scope(run_id, as_of, params)
    if scenario_ids is not None:
        params["scenarios"] = list(scenario_ids)
        conditions.append("scenario_id IN {scenarios:Array(String)}")
    rows = store.query(
        "SELECT envelope.event_id, envelope.event_time, scenario_id, critic, critic_version, ran, score, passed, "
        f"backend, reason, rollouts, evidence_json FROM {{database}}.critic_verdicts FINAL{_where(conditions)} "
        "ORDER BY envelope.event_time, envelope.event_id", parameters=params)
    return [Verdict(r[0], _utc(r[1]), r[2], r[3], r[4], bool(r[5]), r[6], None if r[7] is None else bool(r[7]),
                    r[8], r[9], int(r[10]), r[11]) for r in rows]


@dataclass(frozen=True)
class Candidate:
    scenario_id: str
    parent_scenario_id: str
    operator: str
    factor: str
    generator: str  # failure-guided | blind | composition | base
    cycle_id: str
    source_cluster_id: str | None
    params: Mapping[str, str]
    proposed_at: datetime
    scenario: Mapping  # the ScenarioSpec record
    event_id: str  # of its (first) CandidateProposed
    # promoted | rejected | deferred | review | approved (review approved, not yet promoted) |
    # retired | pending (no decision yet)
    status: str
    decided_at: datetime | None
    verdicts: tuple[Verdict, ...]

    @property
    def rollouts(self) -> int:
        return sum(v.rollouts for v in self.verdicts)


def _status(history: list[Decision]) -> tuple[str, datetime | None]:
    if not history:
        return "pending", None
    last = history[-1]
    if last.event_type == "ReviewDecided":
        return ("approved" if last.approved else "rejected"), last.event_time
    return DECISION_STATUS[last.event_type], last.event_time


def candidates(store: EvidenceStore, *, cycle_id: str | None = None, generator: str | None = None,
               run_id: str | None = None, as_of: datetime | None = None) -> list[Candidate]:
    """Proposed candidates with their verdicts and where the gate (or a reviewer) left them."""
    params: dict = {}
    conditions = _scope(run_id, as_of, params)
    if cycle_id is not None:
        params["cycle"] = cycle_id
        conditions.append("cycle_id = {cycle:String}")
    if generator is not None:
        params["generator"] = generator
        conditions.append("generator = {generator:String}")
    rows = store.query(
        "SELECT scenario_id, argMin(parent_scenario_id, k), argMin(operator, k), argMin(factor, k), "
        "argMin(generator, k), argMin(cycle_id, k), argMin(source_cluster_id, k), argMin(params, k), min(t), "
        "argMin(scenario, k), argMin(envelope.event_id, k) FROM "
        "(SELECT *, envelope.event_time AS t, (envelope.event_time, envelope.event_id) AS k "
        f" FROM {{database}}.scenario_candidates FINAL{_where(conditions)}) GROUP BY scenario_id ORDER BY min(t), "
        "scenario_id", parameters=params)
    if not rows:
        return []
    ids = [r[0] for r in rows]
    history: dict[str, list[Decision]] = defaultdict(list)
    for d in decisions(store, scenario_ids=ids, as_of=as_of):
        history[d.scenario_id].append(d)
    judged: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts(store, scenario_ids=ids, as_of=as_of):
        judged[v.scenario_id].append(v)
    out = []
    for r in rows:
        status, decided_at = _status(history[r[0]])
        out.append(Candidate(r[0], r[1], r[2], r[3], r[4], r[5], r[6], dict(r[7]), _utc(r[8]), r[9], r[10], status,
                             decided_at, tuple(judged[r[0]])))
    return out


@dataclass(frozen=True)
class Funnel:
    """proposed -> verdicts -> decisions, for one generator (or every one: generator "all")."""

    generator: str
    infeasible: int  # generated but refused by the feasibility pre-check (never proposed)
    proposed: int
    with_verdicts: int
    promoted: int
    rejected: int
    deferred: int
    review: int
    approved: int
    retired: int
    pending: int
    rollouts: int  # rollouts the critics requested for these candidates


def funnel(store: EvidenceStore, *, cycle_id: str | None = None, run_id: str | None = None,
           as_of: datetime | None = None, proposed: Sequence[Candidate] | None = None) -> list[Funnel]:
    """One row per generator, then the total (generator "all"). ``proposed``: the candidates of
    the same scope when the caller has read them already."""
    if proposed is None:
        proposed = candidates(store, cycle_id=cycle_id, run_id=run_id, as_of=as_of)
    infeasible = _infeasible_counts(store, cycle_id=cycle_id, run_id=run_id, as_of=as_of)
    by_generator: dict[str, list[Candidate]] = defaultdict(list)
    for c in proposed:
        by_generator[c.generator].append(c)
    names = sorted(set(by_generator) | set(infeasible))
    rows = [_funnel_row(g, by_generator[g], infeasible.get(g, 0)) for g in names]
    rows.append(_funnel_row("all", proposed, sum(infeasible.values())))
    return rows


def _funnel_row(generator: str, group: Sequence[Candidate], infeasible: int) -> Funnel:
    count = defaultdict(int)
    for c in group:
        count[c.status] += 1
    return Funnel(generator, infeasible, len(group), sum(1 for c in group if c.verdicts), count["promoted"],
                  count["rejected"], count["deferred"], count["review"], count["approved"], count["retired"],
                  count["pending"], sum(c.rollouts for c in group))


def _infeasible_counts(store: EvidenceStore, *, cycle_id: str | None, run_id: str | None,
                       as_of: datetime | None) -> dict[str, int]:
    params: dict = {}
    conditions = ["envelope.event_type = 'CandidatesGenerated'", *_scope(run_id, as_of, params)]
    if cycle_id is not None:
        params["cycle"] = cycle_id
        conditions.append("cycle_id = {cycle:String}")
    rows = store.query(f"SELECT generator, sum(length(mapKeys(infeasible))) FROM {{database}}.benchmark_cycles FINAL"
                       f"{_where(conditions)} GROUP BY generator", parameters=params)
    return {g: int(n) for g, n in rows}


@dataclass(frozen=True)
class Cycle:
    cycle_id: str
    cycle: int
    benchmark_version: int
    generator: str
    started_at: datetime
    models: tuple[str, ...]
    proposed: tuple[str, ...]  # from CandidatesGenerated (empty until the mutator answered)
    infeasible: int
    answered: bool
    clusters_position: int = 0  # where in failures.clusters the mutator reads from
    focus_models: tuple[str, ...] = ()  # ranked models tied at the top: their clusters were seeded from first


def cycles(store: EvidenceStore, *, run_id: str | None = None, as_of: datetime | None = None) -> list[Cycle]:
    """Evolution cycles in the order they started."""
    params: dict = {}
    rows = store.query(
        "SELECT cycle_id, anyIf(cycle, t = 'CycleStarted'), anyIf(benchmark_version, t = 'CycleStarted'), "
        "anyIf(generator, t = 'CycleStarted'), minIf(at, t = 'CycleStarted'), anyIf(models, t = 'CycleStarted'), "
        "anyIf(proposed, t = 'CandidatesGenerated'), sumIf(length(mapKeys(infeasible)), t = 'CandidatesGenerated'), "
        "countIf(t = 'CandidatesGenerated') > 0, anyIf(clusters_position, t = 'CycleStarted'), "
        "anyIf(focus_models, t = 'CycleStarted') FROM (SELECT *, envelope.event_type AS t, envelope.event_time AS at "
        f"FROM {{database}}.benchmark_cycles FINAL{_where(_scope(run_id, as_of, params))}) GROUP BY cycle_id "
        "HAVING countIf(t = 'CycleStarted') > 0 ORDER BY minIf(at, t = 'CycleStarted'), cycle_id", parameters=params)
    return [Cycle(r[0], int(r[1]), int(r[2]), r[3], _utc(r[4]), tuple(r[5]), tuple(r[6]), int(r[7]), bool(r[8]),
                  int(r[9]), tuple(r[10])) for r in rows]


# --- reviews ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpenReview:
    scenario_id: str
    requested_at: datetime
    reason: str
    checks_json: str
    evidence_event_ids: tuple[str, ...]
    event_id: str


def open_reviews(store: EvidenceStore, *, run_id: str | None = None, as_of: datetime | None = None) -> list[OpenReview]:
    """ReviewRequested decisions no ReviewDecided (or later gate decision) has answered yet."""
    history: dict[str, list[Decision]] = defaultdict(list)
    for d in decisions(store, run_id=run_id, as_of=as_of):
        history[d.scenario_id].append(d)
    out = []
    for scenario_id in sorted(history):
        last = history[scenario_id][-1]
        if last.event_type == "ReviewRequested":
            out.append(OpenReview(scenario_id, last.event_time, last.reason, last.checks_json,
                                  last.evidence_event_ids, last.event_id))
    return out
