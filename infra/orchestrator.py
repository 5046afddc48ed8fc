"""The run orchestrator: what a run publishes (models, rollout and sweep requests), and the evolving
loop built on it. The waiting on the events of a run is infra/waits.py's, reviews are
infra/reviews.py's; what the loop reads of the store it asks through consumers/state/online.py.
The CLI's `run`, `rollout` and `loop` are thin callers.

    requests = request_rollouts(publisher, store, scenario, ["oracle"], seeds=[0, 1], run_id="run")
    wait_for_episodes(store, requests, deadline)  # infra/waits.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from consumers.evidence.store import EvidenceStore
from consumers.state import online as q
from infra.exceptions import RequestRefused
from infra.waits import POLL_S, Check, deadline_in, poll_until, requests_topic, wait_for_episodes, wait_until_settled
from producers.episode import CAMERA_SIZE
from producers.publisher import Publisher
from producers.rollout_worker import rollout_request, sweep_request
from producers.seeds import held_out_seeds, selection_seeds
from producers.sim.models import ModelConfig
from schemas.events import make_event, stable_id


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
                     seeds: list[int], run_id: str, purpose: str = "adhoc", keyframe_every: int = 0,
                     cameras: tuple[str, ...] = (), camera_size: int = CAMERA_SIZE) -> list[dict]:
    """One RolloutRequested per model. Request ids come from (scenario, model, seeds, purpose, run,
    and the cameras when any), so asking again is the same request; one whose episodes have all
    ended already is not published again. Returns every request (published or not)."""
    requests = [rollout_request(scenario, model_id, seeds, purpose=purpose, keyframe_every=keyframe_every,
                                run_id=run_id, cameras=cameras, camera_size=camera_size) for model_id in model_ids]
    done = q.ended_per_request(store, [r["request_id"] for r in requests])
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
    left = episodes_left(store, requests)
    for request in requests:
        if left[request["request_id"]]:
            publisher.publish(request)
    publisher.flush()
    return requests


def episodes_left(store: EvidenceStore, requests: list[dict]) -> dict[str, int]:
    """request_id -> how many of its episodes have not ended yet (what running it would cost)."""
    done = q.ended_per_request(store, [r["request_id"] for r in requests])
    return {r["request_id"]: max(0, len(r["seeds"]) - done.get(r["request_id"], 0)) for r in requests}


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
    # a cap on the log's episodes: a cycle proposes only as many candidates as the cycles so far say
    # fit in what is left (cycle_size), and none starts when not one would
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
        if self.rollout_budget is not None and (not isinstance(self.rollout_budget, int) or self.rollout_budget < 1):
            raise ValueError(f"EvolveConfig.rollout_budget must be None or an integer >= 1, "
                             f"got {self.rollout_budget!r}")


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
    opening: int = 0  # of ``rollouts``, the episodes its opening sweeps ran (the rest: its candidates')


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
        opening = sum(episodes_left(store, opening_sweeps(store, models, config)).values())
        size = cycle_size(config, reports, spent=q.episodes_spent(store), opening=opening)
        if size < 1:
            on_event("budget", config.rollout_budget)
            break
        reports.append(_cycle(store, publisher, models, config, k, on_event, check, size, opening))
        on_event("report", reports[-1])
        pairs = reports[-1].pairs
        if config.stop_when_separated and pairs and all(p.separated for p in pairs):
            on_event("separated", pairs)
            break
    return reports


def opening_sweeps(store: EvidenceStore, models: list[ModelConfig], config: EvolveConfig) -> list[dict]:
    """The sweeps a cycle opens with: every model over the active benchmark on the selection seeds
    (they choose) and on the held-out seeds (they measure the version as it stands)."""
    scenarios = [dict(a.spec) for a in q.active_benchmark(store).scenarios]
    return [sweep_request(scenario, m.model_id, m.version, seeds) for seeds in
            (selection_seeds(config.sweep_seeds), held_out_seeds(config.measure_seeds))
            for scenario in scenarios for m in models]


def cycle_size(config: EvolveConfig, reports: list[CycleReport], *, spent: int, opening: int) -> int:
    """How many candidates the next cycle may propose under the rollout budget, the log having
    ``spent`` episodes and the cycle's opening sweeps needing ``opening`` more: what is left once
    those are paid for, over what a candidate cost in the cycles so far (its
    validation, and the measurement of a promotion, on average). The last cycle of a budget is
    thus a smaller one rather than none: a loop stopped with a third of its budget unspent
    measured less than it could. Without a budget, or before any cycle has run, the whole
    ``max_candidates`` (a first cycle starts whenever the log is within the budget)."""
    if config.rollout_budget is None:
        return config.max_candidates
    if spent >= config.rollout_budget:
        return 0
    costs = [(r.rollouts - r.opening) / len(r.proposed) for r in reports if r.proposed]
    if not costs:
        return config.max_candidates
    left = config.rollout_budget - spent - opening
    return max(0, min(config.max_candidates, int(left // (sum(costs) / len(costs)))))


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
    poll_until(lambda: wanted <= set(q.active_scenarios(store)), config.stage_timeout_s, check,
               lambda: f"the gate has not promoted the base scenarios "
                       f"{sorted(wanted - set(q.active_scenarios(store)))}")


def _cycle(store, publisher, models: list[ModelConfig], config: EvolveConfig, k: int, on_event, check,
           size: int, opening: int) -> CycleReport:
    """Cycle k, proposing at most ``size`` candidates; ``opening``: episodes its sweeps will run."""
    started = time.monotonic()
    spent_before = q.episodes_spent(store)
    benchmark = q.active_benchmark(store)
    version = benchmark.version
    requests = request_sweeps(publisher, store, [dict(a.spec) for a in benchmark.scenarios], models,
                              selection_seeds(config.sweep_seeds))
    # the version as it stands is measured meanwhile (a no-op when the last cycle measured it)
    measures = request_sweeps(publisher, store, [dict(a.spec) for a in benchmark.scenarios], models,
                              held_out_seeds(config.measure_seeds))
    on_event("sweep", {"version": version, "scenarios": len(benchmark.scenarios), "requests": len(requests)})
    deadline = deadline_in(config.stage_timeout_s)
    wait_for_episodes(store, requests, deadline, check=check, requests_topic=requests_topic(publisher.prefix))
    settled = wait_until_settled(store, requests, deadline, check=check, fragile=config.fragile)
    on_event("settled", settled)

    cycle_id = f"{config.run_id}-c{k}"
    focus = tied_top(store, version, models)
    started_event = cycle_started(store, config, k, version, models, focus, size)
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

    poll_until(lambda: answer() is not None, config.stage_timeout_s, check,
               lambda: f"the mutator has not answered cycle {cycle_id} (no CandidatesGenerated in benchmark_cycles)")
    generated = answer()
    on_event("generated", generated)

    def pending():
        by_id = {c.scenario_id: c for c in q.candidates(store, cycle_id=cycle_id)}
        return [sid for sid in generated.proposed if sid not in by_id or by_id[sid].status not in CYCLE_SETTLED]

    poll_until(lambda: not pending(), config.stage_timeout_s, check,
               lambda: f"cycle {cycle_id}: the gate has not decided {', '.join(pending())} (their verdicts: "
                       f"{q.verdicts_of(store, pending())})")

    def judging():  # the gate may decide before the last verdict (the semantic one, when not required)
        return [c.scenario_id for c in q.candidates(store, cycle_id=cycle_id)
                if c.scenario_id in generated.proposed and not critics_finished(c.verdicts)]

    poll_until(lambda: not judging(), config.stage_timeout_s, check,
               lambda: f"cycle {cycle_id}: the critics have not finished with {', '.join(judging())} (their verdicts: "
                       f"{q.verdicts_of(store, judging())})")
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
    wait_for_episodes(store, measures, deadline_in(config.stage_timeout_s), check=check,
                      requests_topic=requests_topic(publisher.prefix))
    made = [v for v in q.benchmark_versions(store) if v.version > version]
    report = CycleReport(
        cycle=k, cycle_id=cycle_id, version_before=version, version_after=after.version,
        proposed=generated.proposed, infeasible=generated.infeasible, decided=decided,
        promoted=tuple(s for v in made for s in v.promoted), retired=tuple(s for v in made for s in v.retired),
        scores=tuple(q.pooled_scores(q.scores(store, version=after.version, seeds=q.HELD_OUT))),
        in_sample=tuple(q.pooled_scores(q.scores(store, version=after.version, seeds=q.SELECTION))),
        pairs=tuple(q.adjacent_pairs(store, after.version, model_ids=[m.model_id for m in models
                                                                       if m.kind != q.ORACLE_KIND])),
        rollouts=q.episodes_spent(store) - spent_before, seconds=time.monotonic() - started, focus=tuple(focus),
        opening=opening)
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
                  models: list[ModelConfig], focus: tuple[str, ...] = (), size: int | None = None) -> dict | None:
    """The CycleStarted of cycle k, or None when the log holds it already (a rerun after a crash):
    the cycle goes on from the position it started at, since the clusters log has grown since and a
    new position would be a different event under the same id."""
    cycle_id = f"{config.run_id}-c{k}"
    if any(c.cycle_id == cycle_id for c in q.cycles(store)):
        return None
    return make_event(
        "CycleStarted", (cycle_id,), ORCHESTRATOR, config.run_id, cycle_id=cycle_id, cycle=k,
        benchmark_version=version, clusters_position=q.cluster_log_length(store), generator=config.generator,
        max_candidates=size or config.max_candidates, seed=int(stable_id("cycle", config.seed, k)[:12], 16),
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
