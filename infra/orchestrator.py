"""The run orchestrator: what a run publishes, and the waiting on the events of that run.

A run publishes RolloutRequested events (the rollout worker that `sepa-eval up` started serves
them) and then waits on the evidence log, never on the processes:

1. ``wait_for_episodes``: every requested episode has its EpisodeEnded in rollout_episodes;
2. ``wait_until_settled``: every ended episode has its EpisodeAnalysed (failure_episodes), and
   every failed analysed episode (success=false, analysed=true, termination not env_error or
   aborted) has its intake ClusterAssigned (failure_clusters, intake=true): the failure moments
   of every episode are stored and the clusterer has taken in every failure, in a cluster or as
   noise. Only then is the derived state a finished one that a report may print.

A timeout names what is missing (which requests, which episodes, which table). The CLI's `run` and
`rollout` are thin callers; the evolving loop (cycles, sweeps) builds on the same waits.

    requests = request_rollouts(publisher, store, scenario, ["oracle"], seeds=[0, 1], run_id="run")
    wait_for_episodes(store, requests, deadline)
    settled = wait_until_settled(store, requests, deadline)
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from consumers.evidence.store import EvidenceStore
from consumers.state import online as q
from infra import processes
from infra.exceptions import NotRunning, OutOfSpace, RequestRefused, ReviewRefused, WaitTimeout
from infra.settings import Settings
from producers.episode import HARNESS_TERMINATIONS
from producers.publisher import Publisher
from producers.rollout_worker import rollout_request, sweep_request
from producers.seeds import held_out_seeds, selection_seeds
from producers.sim.models import ModelConfig
from schemas.catalog import BY_NAME
from schemas.events import make_event, stable_id

POLL_S = 0.5
# How many missing ids a timeout error quotes.
QUOTED_IDS = 5

Progress = Callable[[int, int], None]  # (done, total)
Check = Callable[[], None]  # raises when a process the wait relies on has died


def deadline_in(seconds: float) -> float:
    return time.monotonic() + seconds


def still_coming(settings: Settings, store: EvidenceStore, requests: list[dict]) -> Check:
    """A check for the waits: the rollout worker and the pipeline still run, and no request was
    refused by the rollout worker (dead-lettered: its episodes will never come)."""
    state = processes.RunState.read(settings)
    topic = BY_NAME["rollout.requests"].full_name(settings.topic_prefix)

    def check() -> None:
        _require_alive(settings, state, (processes.ROLLOUT, processes.PIPELINE))
        refused = q.refused_requests(store, topic, [r["request_id"] for r in requests])
        if refused:
            raise RequestRefused("; ".join(f"the rollout worker refused {rid}: {reason}"
                                           for rid, reason in refused.items()))
    return check


def still_running(settings: Settings) -> Check:
    """A check for the evolving loop's waits: every process `up` started still runs."""
    state = processes.RunState.read(settings)

    def check() -> None:
        _require_alive(settings, state, processes.CHILDREN)
    return check


def _require_alive(settings: Settings, state: processes.RunState, children) -> None:
    """Raises NotRunning naming the first of ``children`` that `up` started and that has stopped,
    and why when its log says (a full disk); OutOfSpace when the disk under the memory dir is full
    while they all run (the sink retries a store that cannot write, and the waits would sit)."""
    full = processes.out_of_space(settings)
    if full:
        raise OutOfSpace(f"{full}: the evidence store cannot take more events; free some space, then "
                         "`sepa-eval up` and run again")
    for child in children:
        if state.pid_of(child) is not None and not state.alive(child):
            why = processes.why_stopped(child, settings)
            raise NotRunning(f"the {child.label} (pid {state.pid_of(child)}) has stopped"
                             f"{': ' + why if why else ''}; see {child.log(settings)}")


def register_models(publisher: Publisher, models: list[ModelConfig], producer: str = "sync-models") -> None:
    """ModelRegistered for every model (ids from (model_id, version): re-registering dedups)."""
    for m in models:
        publisher.publish(make_event("ModelRegistered", (m.model_id, m.version), producer, producer,
                                     model_id=m.model_id, version=m.version, kind=m.kind,
                                     description=m.description, params=m.params()))
    publisher.flush()


def check_models(requested: list[str], models: list[ModelConfig]) -> None:
    """Refuses a model the registry does not know, before anything is published."""
    known = {m.model_id for m in models}
    unknown = [m for m in requested if m not in known]
    if unknown:
        raise ValueError(f"model {', '.join(map(repr, unknown))} is not in the model registry; known: {sorted(known)}")


def request_rollouts(publisher: Publisher, store: EvidenceStore, scenario: dict, model_ids: list[str],
                     seeds: list[int], run_id: str, purpose: str = "adhoc", keyframe_every: int = 0) -> list[dict]:
    """One RolloutRequested per model. Request ids come from (scenario, model, seeds, purpose, run),
    so asking again is the same request; one whose episodes have all ended already is not published
    again. Returns every request (published or not)."""
    requests = [rollout_request(scenario, model_id, seeds, purpose=purpose, keyframe_every=keyframe_every,
                                run_id=run_id) for model_id in model_ids]
    done = _ended_per_request(store, [r["request_id"] for r in requests])
    for request in requests:
        if done.get(request["request_id"], 0) < len(request["seeds"]):
            publisher.publish(request)
    publisher.flush()
    return requests


def request_sweeps(publisher: Publisher, store: EvidenceStore, scenarios: list[dict], models: list[ModelConfig],
                   seeds: list[int]) -> list[dict]:
    """The sweep of every model over every scenario on ``seeds`` (selection or held-out seeds,
    producers/seeds.py; sweep_request: one request per model version, scenario and seeds, whoever
    asks). A request whose episodes have all ended is not published again. Returns every request
    (published or not), scenarios first."""
    requests = [sweep_request(scenario, m.model_id, m.version, seeds) for scenario in scenarios for m in models]
    done = _ended_per_request(store, [r["request_id"] for r in requests])
    for request in requests:
        if done.get(request["request_id"], 0) < len(request["seeds"]):
            publisher.publish(request)
    publisher.flush()
    return requests


@dataclass(frozen=True)
class Settled:
    """The run's episodes once the failure analysis has caught up with them."""

    episodes: int  # ended
    failed: int  # failed, analysed, of a termination the clusterer takes in
    fragile: int  # successes with failure moments (the clusterer takes them in too)
    analysed: int
    moments: int  # failure moments of the run's episodes (from their EpisodeAnalysed)
    clustered: int  # failed and fragile episodes with their intake ClusterAssigned


def wait_for_episodes(store: EvidenceStore, requests: list[dict], deadline: float,
                      progress: Progress | None = None, check: Check | None = None) -> int:
    """Until every requested episode's EpisodeEnded is in the evidence log; returns their number."""
    expected = {r["request_id"]: len(r["seeds"]) for r in requests}
    total = sum(expected.values())
    while True:
        ended = _ended_per_request(store, list(expected))
        done = sum(min(ended.get(rid, 0), n) for rid, n in expected.items())
        if progress is not None:
            progress(done, total)
        if done >= total:
            return total
        if check is not None:
            check()
        if time.monotonic() > deadline:
            short = [f"{rid}: {ended.get(rid, 0)} of {n}" for rid, n in expected.items() if ended.get(rid, 0) < n]
            raise WaitTimeout(f"{total - done} of {total} requested episodes have not ended in the evidence log "
                              f"(rollout_episodes) in time; requests short of episodes: {_quote(short)}")
        time.sleep(POLL_S)


def wait_until_settled(store: EvidenceStore, requests: list[dict], deadline: float,
                       progress: Progress | None = None, check: Check | None = None,
                       fragile: bool = False) -> Settled:
    """Until every ended episode of the requests is analysed and every failed one clustered
    (``fragile``: the clusterer takes in successes with failure moments too, and is waited for)."""
    request_ids = [r["request_id"] for r in requests]
    while True:
        state = settle_state(store, request_ids, fragile)
        if progress is not None:
            progress(state.analysed_count + state.clustered_count, state.total)
        if not state.unanalysed and not state.unclustered:
            return state.settled
        if check is not None:
            check()
        if time.monotonic() > deadline:
            missing = []
            if state.unanalysed:
                missing.append(f"{len(state.unanalysed)} of {len(state.ended)} ended episodes have no EpisodeAnalysed "
                               f"in failure_episodes (the failure detector's): {_quote(state.unanalysed)}")
            if state.unclustered:
                missing.append(f"{len(state.unclustered)} of {len(state.to_cluster)} failed (or fragile) episodes have "
                               f"no intake ClusterAssigned in failure_clusters (the clusterer's): "
                               f"{_quote(state.unclustered)}")
            raise WaitTimeout("the failure analysis did not catch up in time: " + "; ".join(missing))
        time.sleep(POLL_S)


@dataclass(frozen=True)
class SettleState:
    ended: list[str]
    analysed: dict[str, tuple[bool, bool, str, int]]  # episode -> (success, analysed, termination, moments)
    clustered: set[str]
    fragile: bool = False  # the clusterer takes in successes with failure moments too

    @property
    def to_cluster(self) -> list[str]:
        """The episodes the clusterer takes in: failures, and successes with failure moments (fragile wins)."""
        return sorted(e for e, a in self.analysed.items() if taken_in(*a, fragile=self.fragile))

    @property
    def unanalysed(self) -> list[str]:
        return [e for e in self.ended if e not in self.analysed]

    @property
    def unclustered(self) -> list[str]:
        return [e for e in self.to_cluster if e not in self.clustered]

    @property
    def analysed_count(self) -> int:
        return len(self.ended) - len(self.unanalysed)

    @property
    def clustered_count(self) -> int:
        return len(self.to_cluster) - len(self.unclustered)

    @property
    def total(self) -> int:
        return len(self.ended) + len(self.to_cluster)

    @property
    def settled(self) -> Settled:
        return Settled(episodes=len(self.ended), failed=sum(not self.analysed[e][0] for e in self.to_cluster),
                       fragile=sum(bool(self.analysed[e][0]) for e in self.to_cluster), analysed=len(self.analysed),
                       moments=sum(m for *_, m in self.analysed.values()), clustered=self.clustered_count)


# Episodes of the requests whose EpisodeEnded is stored (EpisodeEnded carries no request_id:
# EpisodeStarted names the request).
ENDED_OF_REQUESTS = (
    "SELECT request_id, episode_id FROM (SELECT DISTINCT request_id, episode_id FROM {database}.rollout_episodes FINAL "
    "WHERE envelope.event_type = 'EpisodeStarted' AND has({requests:Array(String)}, request_id)) "
    "WHERE episode_id IN (SELECT episode_id FROM {database}.rollout_episodes FINAL "
    "WHERE envelope.event_type = 'EpisodeEnded') ORDER BY request_id, episode_id")


def ended_episodes(store: EvidenceStore, request_ids: list[str]) -> list[tuple[str, str]]:
    """(request_id, episode_id) of every ended episode of the requests."""
    return [(r, e) for r, e in store.query(ENDED_OF_REQUESTS, {"requests": request_ids})]


def taken_in(success: bool, analysed: bool, termination: str, moments: int, fragile: bool) -> bool:
    """Whether the clusterer takes an analysed episode in (streams/failures/collector.py's rule)."""
    return (not success or (fragile and moments > 0)) and analysed and termination not in HARNESS_TERMINATIONS


def settle_state(store: EvidenceStore, request_ids: list[str], fragile: bool = False) -> SettleState:
    """Where the failure analysis of the requests' ended episodes stands, read from the evidence log."""
    ended = sorted({e for _, e in ended_episodes(store, request_ids)})
    if not ended:
        return SettleState([], {}, set(), fragile)
    analysed = {e: (bool(s), bool(a), t, int(m)) for e, s, a, t, m in store.query(
        "SELECT episode_id, any(success), any(analysed), any(termination), any(length(moments)) "
        "FROM {database}.failure_episodes FINAL WHERE has({episodes:Array(String)}, episode_id) "
        "GROUP BY episode_id", {"episodes": ended})}
    failed = [e for e, a in analysed.items() if taken_in(*a, fragile=fragile)]
    clustered = {row[0] for row in store.query(
        "SELECT DISTINCT episode_id FROM {database}.failure_clusters FINAL "
        "WHERE envelope.event_type = 'ClusterAssigned' AND intake AND has({episodes:Array(String)}, episode_id)",
        {"episodes": failed})} if failed else set()
    return SettleState(ended, analysed, clustered, fragile)


def episode_outcomes(store: EvidenceStore, request_ids: list[str]) -> list[tuple[int, str, str, int, bool]]:
    """(seed, episode_id, termination, steps, success) of the requests' ended episodes, by seed."""
    episode_ids = [e for _, e in ended_episodes(store, request_ids)]
    rows = store.query(
        "SELECT s.seed, episode_id, e.termination, e.steps, e.success FROM "
        "(SELECT episode_id, any(seed) AS seed FROM {database}.rollout_episodes FINAL "
        " WHERE envelope.event_type = 'EpisodeStarted' AND has({episodes:Array(String)}, episode_id) "
        " GROUP BY episode_id) AS s JOIN "
        "(SELECT episode_id, any(termination) AS termination, any(steps) AS steps, any(success) AS success "
        " FROM {database}.rollout_episodes FINAL WHERE envelope.event_type = 'EpisodeEnded' "
        " AND has({episodes:Array(String)}, episode_id) GROUP BY episode_id) AS e USING (episode_id) "
        "ORDER BY s.seed, episode_id", {"episodes": episode_ids})
    return [(int(seed), e, t, int(n), bool(ok)) for seed, e, t, n, ok in rows]


def _ended_per_request(store: EvidenceStore, request_ids: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for request_id, _ in ended_episodes(store, request_ids):
        counts[request_id] = counts.get(request_id, 0) + 1
    return counts


def _quote(ids: list[str]) -> str:
    shown = ", ".join(ids[:QUOTED_IDS])
    return shown + (f" and {len(ids) - QUOTED_IDS} more" if len(ids) > QUOTED_IDS else "")


# --- the evolving loop ------------------------------------------------------------------------
#
#   result = evolve(store, publisher, models, EvolveConfig(cycles=2, run_id="run-7"), on_event=print)
#
# A cycle: sweep every registered model over the active benchmark (seeds 0..sweep_seeds-1; a
# (scenario, model version, seeds) already swept is not run again), wait until every sweep episode is
# analysed and every failure clustered, open the cycle (CycleStarted, naming the clusterer's log
# position the mutator seeds from), wait for the mutator's answer and for the gate's decision on
# every candidate it proposed (the critics validate them meanwhile), measure the benchmark it left on
# held-out seeds (producers/seeds.py: nothing chose on them) and report the cycle on those. The
# first cycle of an empty log first promotes the base scenarios (through the gate, as candidates
# of generator "base").

BASE_OPERATOR = "base"
ORCHESTRATOR = "orchestrator"
# Decisions the gate leaves a candidate in that end a cycle's wait (a deferred candidate is re-tried
# by the gate later; one in review waits for a person).
CYCLE_SETTLED = ("promoted", "rejected", "deferred", "review", "approved", "retired")
# How long a command waits for one stage (a sweep's episodes, the gate's decisions) by default.
STAGE_TIMEOUT_S = 1800.0
# After the last candidate is decided, the log is read again once it has been quiet this long, so
# retirements the gate published with the promotions are in.
QUIET_S = 2.0
GENERATOR_ARMS = ("failure-guided", "blind", "coverage")  # what a cycle may ask the mutator for


@dataclass(frozen=True, kw_only=True)
class EvolveConfig:
    run_id: str
    cycles: int = 2
    sweep_seeds: int = 20  # seeds 0..n-1 per model x active scenario; the critics' control arm reuses them
    measure_seeds: int = 20  # held-out seeds per model x active scenario (producers/seeds.py): the scores shown
    max_candidates: int = 4  # per cycle
    generator: str = "failure-guided"  # or a baseline arm: "blind" (random draws), "coverage" (a fixed grid)
    seed: int = 0
    base: tuple[dict, ...] = ()  # ScenarioSpec records of the base benchmark (promoted when nothing is)
    stage_timeout_s: float = STAGE_TIMEOUT_S  # each wait of a cycle gives up after this long
    fragile: bool = True  # the clusterer takes in fragile successes (Settings.cluster_fragile_successes)
    # no new cycle starts once the log's episodes plus a cycle's mean cost so far would pass this
    rollout_budget: int | None = None
    # no new cycle starts once every adjacent pair of ranked models is separated on held-out seeds
    stop_when_separated: bool = True

    def __post_init__(self) -> None:
        if self.generator not in GENERATOR_ARMS:
            raise ValueError(f"EvolveConfig.generator must be one of {', '.join(GENERATOR_ARMS)}, "
                             f"got {self.generator!r}")
        for name in ("cycles", "sweep_seeds", "measure_seeds", "max_candidates"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"EvolveConfig.{name} must be an integer >= 1, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class CycleReport:
    cycle: int
    cycle_id: str
    version_before: int
    version_after: int
    proposed: tuple[str, ...]
    infeasible: int
    decided: dict  # candidate status -> count (promoted, rejected, deferred, review)
    promoted: tuple[str, ...]
    retired: tuple[str, ...]
    scores: tuple  # ModelScore of the benchmark after the cycle (pooled over its scenarios), held-out seeds
    rollouts: int  # episodes run during the cycle (sweeps, validation and measurement)
    seconds: float
    in_sample: tuple = ()  # the same on the selection seeds: biased (they chose the scenarios), for contrast
    pairs: tuple = ()  # AdjacentPair per neighbours in the held-out order: which the benchmark separates
    focus: tuple[str, ...] = ()  # ranked models tied at the top on the cycle's sweep: seeded from first


def base_candidate(scenario: dict, run_id: str) -> dict:
    return make_event("CandidateProposed", (scenario["scenario_id"],), ORCHESTRATOR, run_id,
                      scenario_id=scenario["scenario_id"], parent_scenario_id="", operator=BASE_OPERATOR, params={},
                      source_cluster_id=None, scenario=scenario, mutator_version=ORCHESTRATOR, factor="base",
                      generator="base", cycle_id="", feasibility_json="{}")


def evolve(store: EvidenceStore, publisher: Publisher, models: list[ModelConfig], config: EvolveConfig,
           on_event: Callable[[str, object], None] = lambda kind, value: None,
           check: Check | None = None) -> list[CycleReport]:
    """Runs ``config.cycles`` cycles; ``on_event(kind, value)`` hears each stage ("base", "sweep",
    "settled", "cycle", "generated", "decided", "report") as it passes."""
    _ensure_base(store, publisher, config, on_event, check)
    reports = []
    for k in range(1, config.cycles + 1):
        # a budget is a cap: no cycle starts that the cycles so far say would cross it
        spent = _episodes_spent(store)
        expected = sum(r.rollouts for r in reports) / len(reports) if reports else 0
        if config.rollout_budget is not None and spent + expected > config.rollout_budget:
            on_event("budget", config.rollout_budget)
            break
        reports.append(_cycle(store, publisher, models, config, k, on_event, check))
        on_event("report", reports[-1])
        pairs = reports[-1].pairs
        if config.stop_when_separated and pairs and all(p.separated for p in pairs):
            on_event("separated", pairs)
            break
    return reports


def _ensure_base(store, publisher, config: EvolveConfig, on_event, check) -> None:
    if q.active_benchmark(store) is not None:
        return
    if not config.base:
        raise RequestRefused("nothing is promoted yet and no base scenario was given")
    for scenario in config.base:
        publisher.publish(base_candidate(scenario, config.run_id))
    publisher.flush()
    on_event("base", [s["scenario_id"] for s in config.base])
    wanted = {s["scenario_id"] for s in config.base}
    _wait(lambda: wanted <= set(q.active_scenarios(store)), config.stage_timeout_s, check,
          lambda: f"the gate has not promoted the base scenarios {sorted(wanted - set(q.active_scenarios(store)))}")


def _cycle(store, publisher, models: list[ModelConfig], config: EvolveConfig, k: int, on_event, check) -> CycleReport:
    started = time.monotonic()
    spent_before = _episodes_spent(store)
    benchmark = q.active_benchmark(store)
    version = benchmark.version
    requests = request_sweeps(publisher, store, [dict(a.spec) for a in benchmark.scenarios], models,
                              selection_seeds(config.sweep_seeds))
    # the version as it stands is measured meanwhile (a no-op when the last cycle measured it)
    measures = request_sweeps(publisher, store, [dict(a.spec) for a in benchmark.scenarios], models,
                              held_out_seeds(config.measure_seeds))
    on_event("sweep", {"version": version, "scenarios": len(benchmark.scenarios), "requests": len(requests)})
    deadline = deadline_in(config.stage_timeout_s)
    wait_for_episodes(store, requests, deadline, check=check)
    settled = wait_until_settled(store, requests, deadline, check=check, fragile=config.fragile)
    on_event("settled", settled)

    cycle_id = f"{config.run_id}-c{k}"
    focus = tied_top(store, version, models)
    started_event = cycle_started(store, config, k, version, models, focus)
    if started_event is None:  # a rerun: the cycle as it was opened
        opened = next(c for c in q.cycles(store) if c.cycle_id == cycle_id)
        position, focus = opened.clusters_position, tuple(opened.focus_models)
    else:
        publisher.publish(started_event)
        publisher.flush()
        position = started_event["clusters_position"]
    on_event("cycle", {"cycle_id": cycle_id, "clusters_position": position, "focus": focus})

    def answer():
        return next((c for c in q.cycles(store) if c.cycle_id == cycle_id and c.answered), None)

    _wait(lambda: answer() is not None, config.stage_timeout_s, check,
          lambda: f"the mutator has not answered cycle {cycle_id} (no CandidatesGenerated in benchmark_cycles)")
    generated = answer()
    on_event("generated", generated)

    def pending():
        by_id = {c.scenario_id: c for c in q.candidates(store, cycle_id=cycle_id)}
        return [sid for sid in generated.proposed if sid not in by_id or by_id[sid].status not in CYCLE_SETTLED]

    _wait(lambda: not pending(), config.stage_timeout_s, check,
          lambda: f"cycle {cycle_id}: the gate has not decided {', '.join(pending())} (their verdicts: "
                  f"{_verdicts_of(store, pending())})")

    def judging():  # the gate may decide before the last verdict (the semantic one, when not required)
        return [c.scenario_id for c in q.candidates(store, cycle_id=cycle_id)
                if c.scenario_id in generated.proposed and not critics_finished(c.verdicts)]

    _wait(lambda: not judging(), config.stage_timeout_s, check,
          lambda: f"cycle {cycle_id}: the critics have not finished with {', '.join(judging())} (their verdicts: "
                  f"{_verdicts_of(store, judging())})")
    _wait_quiet(store)
    candidates = q.candidates(store, cycle_id=cycle_id)
    decided: dict[str, int] = {}
    for c in candidates:
        decided[c.status] = decided.get(c.status, 0) + 1
    after = q.active_benchmark(store)
    # what the cycle made, measured on seeds that chose none of it
    measures += request_sweeps(publisher, store, [dict(a.spec) for a in after.scenarios], models,
                               held_out_seeds(config.measure_seeds))
    on_event("measure", {"version": after.version, "requests": len({r["request_id"] for r in measures})})
    wait_for_episodes(store, measures, deadline_in(config.stage_timeout_s), check=check)
    made = [v for v in q.benchmark_versions(store) if v.version > version]
    report = CycleReport(
        cycle=k, cycle_id=cycle_id, version_before=version, version_after=after.version,
        proposed=generated.proposed, infeasible=generated.infeasible, decided=decided,
        promoted=tuple(s for v in made for s in v.promoted), retired=tuple(s for v in made for s in v.retired),
        scores=tuple(q.pooled_scores(q.scores(store, version=after.version, seeds=q.HELD_OUT))),
        in_sample=tuple(q.pooled_scores(q.scores(store, version=after.version, seeds=q.SELECTION))),
        pairs=tuple(q.adjacent_pairs(store, after.version, model_ids=[m.model_id for m in models
                                                                       if m.kind != q.ORACLE_KIND])),
        rollouts=_episodes_spent(store) - spent_before, seconds=time.monotonic() - started, focus=tuple(focus))
    on_event("decided", report)
    return report


def tied_top(store: EvidenceStore, version: int, models: list[ModelConfig]) -> tuple[str, ...]:
    """The ranked models at or above the saturation rate on the version's selection sweep, when
    two or more are: a benchmark that passes them all cannot order them, so the cycle goes after
    their rare failures (CycleStarted.focus_models). Read on the selection seeds, which choose;
    whether that separated them is read on held-out seeds (CycleReport.pairs)."""
    ranked = [m.model_id for m in models if m.kind != q.ORACLE_KIND]
    pooled = q.pooled_scores(q.scores(store, version=version, model_ids=ranked, seeds=q.SELECTION))
    top = tuple(sorted(s.model_id for s in pooled if s.episodes and s.success_rate >= q.SATURATION_RATE))
    return top if len(top) >= 2 else ()


def cycle_started(store: EvidenceStore, config: EvolveConfig, k: int, version: int,
                  models: list[ModelConfig], focus: tuple[str, ...] = ()) -> dict | None:
    """The CycleStarted of cycle k, or None when the log holds it already (a rerun after a crash):
    the cycle goes on from the position it started at, since the clusters log has grown since and a
    new position would be a different event under the same id."""
    cycle_id = f"{config.run_id}-c{k}"
    if any(c.cycle_id == cycle_id for c in q.cycles(store)):
        return None
    return make_event(
        "CycleStarted", (cycle_id,), ORCHESTRATOR, config.run_id, cycle_id=cycle_id, cycle=k,
        benchmark_version=version, clusters_position=q.cluster_log_length(store), generator=config.generator,
        max_candidates=config.max_candidates, seed=int(stable_id("cycle", config.seed, k)[:12], 16),
        models=[m.model_id for m in models], focus_models=list(focus))


def critics_finished(verdicts) -> bool:
    """Whether the critics published every verdict they will for a candidate (consumers/critics/
    worker.py): robustness, and unless it rejected, safety and semantic. A cycle ends only then, so
    what two runs of one seed hold does not depend on how soon the last verdict landed."""
    by_critic = {v.critic: v for v in verdicts}
    robustness = by_critic.get("robustness")
    if robustness is None:
        return False
    return robustness.passed is False or {"safety", "semantic"} <= set(by_critic)


def loop_time(store: EvidenceStore, started: datetime, wall_s: float, processes: int) -> str:
    """The loop's wall time against the time its rollouts took: the own time (start to end, in the
    process that ran each) of the episodes started since it ``started``, over the pool's processes.
    What is left is the loop's own overhead (waiting for the sink, critics and gate, the steps
    between stages); the recorder's cost counts as rollout time (bench/rollout.py puts the pool at
    ~0.87 of its bare loops)."""
    rollouts = q.episode_seconds(store, since=started) / processes
    if rollouts <= 0:
        return f"loop wall time {wall_s:.0f} s; no timed rollouts"
    return (f"loop wall time {wall_s:.0f} s; its rollouts {rollouts:.0f} s over {processes} rollout processes; "
            f"the loop's overhead beyond them {wall_s / rollouts - 1:.0%}")


def _episodes_spent(store: EvidenceStore) -> int:
    return sum(r.ended_episodes for r in q.rollouts_spent(store))


def _verdicts_of(store: EvidenceStore, scenario_ids: list[str]) -> str:
    if not scenario_ids:
        return "none"
    by = defaultdict(list)
    for v in q.verdicts(store, scenario_ids=scenario_ids):
        by[v.scenario_id].append(f"{v.critic} {'ran' if v.ran else 'not run'}/{v.passed}")
    return "; ".join(f"{sid}: {', '.join(by[sid]) or 'none yet'}" for sid in scenario_ids)


def _wait(done: Callable[[], bool], timeout_s: float, check: Check | None, missing: Callable[[], str]) -> None:
    deadline = deadline_in(timeout_s)
    while not done():
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise WaitTimeout(f"{missing()} after {timeout_s:.0f} s")
        time.sleep(POLL_S)


def _wait_quiet(store: EvidenceStore) -> None:
    """Until the decisions table has not changed for QUIET_S (the gate's retirements land with its
    promotions, a moment apart at most)."""
    last, since = None, time.monotonic()
    while True:
        n = len(q.decisions(store))
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= QUIET_S:
            return
        time.sleep(POLL_S)


# --- reviews, and the gate's decisions from the command line ------------------------------------
#
#   event = review_decision(store, "scn-1a2b", approved=True, reviewer="ada", note="looks right")
#   publisher.publish(event); publisher.flush()
#   wait_for_decisions(store, [event["envelope"]["event_id"]], timeout_s=30)
#
# A scenario gets one ReviewDecided (its id comes from the scenario alone), and only while the
# gate's ReviewRequested is its latest decision: the log is checked before anything is published.
# The gate (streams/gate) turns an approval into Promoted, a rejection into Rejected.

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
        """The robustness verdict's checks (from its evidence), else those the gate recorded."""
        for text in (self.robustness.evidence_json if self.robustness else "", self.review.checks_json):
            try:
                value = json.loads(text) if text else {}
            except json.JSONDecodeError:
                continue
            checks = value.get("checks", value.get(ROBUSTNESS)) if isinstance(value, dict) else None
            if isinstance(checks, dict) and checks:
                return checks
        return {}


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
                            f"{_quote(waiting) if waiting else 'none'})")
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

    _wait(lambda: not missing(), timeout_s, check,
          lambda: f"{len(missing())} published decision(s) are not in the evidence log (benchmark_decisions): "
                  f"{_quote(sorted(missing()))}; is the pipeline (the evidence sink) running?")
