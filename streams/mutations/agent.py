"""The mutator in the streams worker: one answer per evolution cycle.

    runner = MutatorRunner(store_factory, codec, MutatorConfig(), check=check_feasibility)
    register_mutator(app, cycles_topic, outputs, runner)

The orchestrator opens a cycle with CycleStarted (benchmark.cycles: one partition, so one worker
mutates at a time and in cycle order). The mutator answers it from the log: the failures the
clusterer took in before the cycle's ``clusters_position``, clustered again in episode-id order so
that the answer does not depend on the order they arrived in (settled_clusters.py), the active
benchmark at the cycle's version as the parents, and the cycle's seed.
Failure-guided cycles draw operators from the clusters' failure types (streams/mutations/chooser.py),
the clusters of the cycle's ``focus_models`` (ranked models tied at the top) first, and never an
operator whose factors the benchmark tests to the gate's cap (chooser.Coverage); after a cycle
that promoted nothing, half its slots go to the failures and the others, with any whose variant
the pre-check refused, to the coverage grid's feasible points on factors the benchmark does not
test yet (those candidates say generator "coverage"). When none of the cycle's models sees pixels
or reads words (no policy server), exploration draws no operator only such a model feels;
blind cycles the same operators with random parameters and no seed, coverage cycles the next
points of a fixed grid of factors and magnitudes over the base scenarios (streams/mutations/coverage.py).
Every candidate goes through the feasibility pre-check ``check`` the edge passes (robosuite:
producers/sim/feasibility.py; LIBERO: producers/libero/feasibility.py in the LIBERO venv, through
infra/libero_feasibility.py);
the feasible ones are published as CandidateProposed, and CandidatesGenerated records the seeds
used, what was proposed and why the others were refused. Everything is a function of the log and
the cycle, with the cycle's event time, so answering the same cycle again (a restart before the
commit) publishes the same events; a cycle already answered in the log is skipped.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

import faust

from consumers.evidence.store import EvidenceStore
from consumers.state import online as q
from consumers.state.registry import models as registered_models
from producers.sim.models import WEBSOCKET
from schemas import records
from schemas.codec import Codec
from schemas.events import make_event
from schemas.exceptions import LiberoScenarioError, ScenarioError
from schemas.libero_scenario import LiberoScenario
from schemas.scenario import ScenarioSpec
from schemas.typed import to_record
from streams.deadletter import Intake, Outgoing, RawMessage
from streams.failures.clusterer import ClustererConfig
from streams.failures.embedding import EmbeddingConfig
from streams.mutations.chooser import (
    ChooserConfig,
    Coverage,
    Generated,
    Proposal,
    blind_candidates,
    guided_candidates,
    propose,
)
from streams.mutations.coverage import GENERATOR as COVERAGE
from streams.mutations.coverage import GRID, LAST, coverage_candidates
from streams.mutations.operators import MUTATOR_VERSION, scenario_from_dict
from streams.mutations.settled_clusters import SettledClustering

log = logging.getLogger("sepa.streams.mutations")
PRODUCER = "mutator"
BLIND = "blind"


@dataclass(frozen=True, kw_only=True)
class MutatorConfig:
    chooser: ChooserConfig = field(default_factory=ChooserConfig)
    log_wait_s: float = 120.0  # how long to wait for the clusters up to the cycle's position to be in the log, s
    # the clusterer's configuration, re-run over each cycle's failures (the streams worker's own)
    clustering: SettledClustering = field(default_factory=lambda: SettledClustering(ClustererConfig(),
                                                                                      EmbeddingConfig()))
    run_id: str = "mutator"


class MutatorRunner:
    def __init__(self, store_factory: Callable[[], EvidenceStore], codec: Codec, config: MutatorConfig,
                 check: Callable | None = None, topic_prefix: str = "sepa."):
        self.store_factory = store_factory
        self.codec = codec
        self.config = config
        self.check = check
        self.intake = Intake(codec, PRODUCER, config.run_id)
        self.stats = {"cycles": 0, "proposed": 0, "infeasible": 0}

    @cached_property
    def store(self) -> EvidenceStore:  # opened on the first message, in the worker's thread
        return self.store_factory()

    def on_message(self, raw: RawMessage) -> list[Outgoing]:
        event, dead = self.intake.admit_record(raw)
        if dead is not None:
            return [dead]
        if not isinstance(event, records.CycleStarted):
            return []  # our own answers share the topic
        try:
            return [Outgoing.of(e, self.codec) for e in self.answer(event)]
        except Exception as exc:  # faust would ack and move on: answer, so the orchestrator is not left waiting
            log.exception("cycle %s could not be answered", event.cycle_id)
            return [Outgoing.of(make_event(
                "CandidatesGenerated", (event.cycle_id,), PRODUCER, self.config.run_id,
                event_time=event.envelope.event_time, cycle_id=event.cycle_id, generator=event.generator,
                seeds=[], proposed=[], infeasible={"(mutator)": f"{type(exc).__name__}: {exc}"},
                mutator_version=MUTATOR_VERSION), self.codec)]

    def answer(self, cycle: records.CycleStarted | dict) -> list[dict]:
        """CandidateProposed events and the cycle's CandidatesGenerated (empty if answered before)."""
        cycle = to_record(cycle)
        cycle_id = cycle.cycle_id
        if any(c.cycle_id == cycle_id for c in q.cycles(self.store) if c.answered):
            return []
        self._wait_for_clusters(cycle.clusters_position)
        benchmark = q.active_benchmark(self.store, version=cycle.benchmark_version)
        parents: dict[str, ScenarioSpec | LiberoScenario] = {}
        for a in benchmark.scenarios if benchmark else ():
            try:  # robosuite and LIBERO scenarios alike; the chooser picks each one's operators
                parents[a.scenario_id] = scenario_from_dict(a.spec)
            except (ScenarioError, LiberoScenarioError) as exc:  # a scenario no operator family knows
                log.info("cycle %s: not mutating %s: %s", cycle_id, a.scenario_id, exc)
        exclude = set(parents) | {c.scenario_id for c in q.candidates(self.store)}
        cfg = replace(self.config.chooser, perceiving=self._perceiving(cycle))
        n = cycle.max_candidates
        if cycle.generator == COVERAGE:  # the grid is walked over the base, whatever is active now
            felt = [f for f in GRID if cfg.perceiving or f not in LAST]
            proposal = self._propose(coverage_candidates(self._bases(), n, exclude, factors=felt), n)
        elif cycle.generator == BLIND:
            proposal = self._propose(blind_candidates(list(parents.values()), n, cycle.seed, cfg, exclude)
                                     if parents else None, n)
        elif self._stalled(cycle):
            proposal = self._explore(self._guided(cycle, cfg, parents, exclude, benchmark), cycle, benchmark,
                                     exclude, cfg.perceiving)
        else:
            proposal = self._propose(self._guided(cycle, cfg, parents, exclude, benchmark), n)
        at = cycle.envelope.event_time
        events = [make_event("CandidateProposed", (c.candidate.scenario_id,), PRODUCER, self.config.run_id,
                             event_time=at, **c.candidate.event_fields(), cycle_id=cycle_id,
                             feasibility_json=c.feasibility.to_json())
                  for c in proposal.proposed]
        infeasible = {c.candidate.scenario_id: c.feasibility.reason for c in proposal.infeasible}
        events.append(make_event(
            "CandidatesGenerated", (cycle_id,), PRODUCER, self.config.run_id, event_time=at, cycle_id=cycle_id,
            generator=cycle.generator, seeds=sorted({c.candidate.source_cluster_id for c in proposal.proposed
                                                        if c.candidate.source_cluster_id}),
            proposed=[c.candidate.scenario_id for c in proposal.proposed], infeasible=infeasible,
            mutator_version=MUTATOR_VERSION))
        self.stats["cycles"] += 1
        self.stats["proposed"] += len(proposal.proposed)
        self.stats["infeasible"] += len(infeasible)
        log.info("cycle %s (%s): %d proposed, %d infeasible, %d skipped draws, pre-check %.1f s", cycle_id,
                 cycle.generator, len(proposal.proposed), len(infeasible), len(proposal.skipped), proposal.cost_s)
        return events

    def _guided(self, cycle: records.CycleStarted, cfg: ChooserConfig, parents, exclude: set[str], benchmark):
        """Failure-guided candidates from the failures taken in before the cycle's position,
        re-clustered in episode-id order (settled_clusters.py); each names the live cluster that
        holds most of its cluster's episodes. A log with cluster summaries and no intakes (clusters
        written by something other than our clusterer) is read as it stands."""
        tested = Counter(a.factor for a in (benchmark.scenarios if benchmark else ()))
        labels = q.cluster_assignments(self.store, before_position=cycle.clusters_position)
        if not labels:
            seeds = q.cluster_events(self.store, before_position=cycle.clusters_position)
            return guided_candidates(seeds, cycle.seed, cfg, parents, exclude, focus=cycle.focus_models,
                                     coverage=Coverage(dict(tested)))
        settled = self.config.clustering.clusters(q.analysed_episodes(self.store, sorted(labels)))
        generated = guided_candidates(settled.events, cycle.seed, cfg, parents, exclude, focus=cycle.focus_models,
                                      coverage=Coverage(dict(tested)))
        generated.candidates = [settled.to_live(c, labels) for c in generated.candidates]
        return generated

    def _bases(self) -> list[ScenarioSpec | LiberoScenario]:
        return [scenario_from_dict(c.scenario) for c in q.candidates(self.store) if c.generator == "base"]

    def _stalled(self, cycle: records.CycleStarted) -> bool:
        """Whether the run's previous cycle changed nothing: it started at this cycle's version."""
        before = [c for c in q.cycles(self.store, run_id=cycle.envelope.run_id) if c.cycle == cycle.cycle - 1]
        return bool(before) and before[0].benchmark_version == cycle.benchmark_version

    def _propose(self, generated: Generated | None, n: int) -> Proposal:
        """The first ``n`` generated candidates that pass the feasibility pre-check (a refused
        variant gives its slot to the next one drawn, not to nothing)."""
        proposal = Proposal([], [], 0.0, list(generated.skipped) if generated else [])
        self._fill(proposal, generated.candidates if generated else [], n)
        return proposal

    def _fill(self, proposal: Proposal, candidates: list, n: int) -> None:
        """Checks ``candidates`` in turn into ``proposal`` until it holds ``n`` feasible ones."""
        for cand in candidates:
            if len(proposal.proposed) >= n:
                return
            proposal.extend(propose([cand], self.check))

    def _perceiving(self, cycle: records.CycleStarted) -> bool:
        """Whether one of the cycle's models (every registered one, for a cycle that names none)
        sees pixels or reads the instruction: a policy server (websocket). The scripted models
        and the oracle read object poses, so a paraphrase or a camera change cannot fail them."""
        kinds = {m.model_id: m.kind for m in registered_models(self.store)}
        return any(kinds.get(m) == WEBSOCKET for m in (cycle.models or kinds))

    def _explore(self, generated: Generated | None, cycle: records.CycleStarted, benchmark,
                 exclude: set[str], perceiving: bool) -> Proposal:
        """After a cycle that promoted nothing, the failures have led where the gate does not follow
        (their variants are no harder on fresh seeds, or redundant): half the slots go to the
        failures, and every slot they leave (half, and any whose variant the pre-check refused) to
        the coverage grid's next feasible points on factors the benchmark does not test yet, so the
        arm keeps widening instead of circling one axis. Without a perceiving model, the grid's
        colour and instruction points are left out. Slots the grid cannot fill (a LIBERO base is
        not on it) go back to the failures."""
        n = cycle.max_candidates
        failures = generated.candidates if generated else []
        proposal = self._propose(generated, n - max(1, n // 2))
        checked = {c.candidate.scenario_id for c in proposal.proposed + proposal.infeasible}
        active = {a.factor for a in (benchmark.scenarios if benchmark else ())}
        tried = exclude | {c.scenario_id for c in failures}
        while len(proposal.proposed) < n:
            tested = active | {c.candidate.factor for c in proposal.proposed}
            grid = coverage_candidates(self._bases(), n - len(proposal.proposed), tried,
                                       factors=[f for f in GRID if f not in tested and (perceiving or f not in LAST)])
            proposal.skipped += grid.skipped
            if not grid.candidates:
                break
            tried |= {c.spec.scenario_id for c in grid.candidates}
            self._fill(proposal, grid.candidates, n)
        self._fill(proposal, [c for c in failures if c.scenario_id not in checked], n)
        return proposal

    def _wait_for_clusters(self, position: int) -> None:
        """The sink writes the clusterer's output a moment after it was published: wait until every
        cluster event before ``position`` is in the log, so the cycle reads the state it names."""
        deadline = time.monotonic() + self.config.log_wait_s
        while q.cluster_log_length(self.store) < position:
            if time.monotonic() > deadline:
                log.warning("cluster events up to position %d are not all in the log after %.0f s; mutating "
                            "from what is there", position, self.config.log_wait_s)
                return
            time.sleep(0.2)


def register_mutator(app: faust.App, source: faust.types.TopicT, outputs: dict[str, faust.types.TopicT],
                     runner: MutatorRunner) -> None:
    from streams.failures.agents import register_blocking_agent

    register_blocking_agent(app, source, outputs, "mutator", runner.on_message)
