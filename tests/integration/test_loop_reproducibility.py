"""The deterministic parts of the loop give the same answer for the same log, without the simulator:
the mutator's answer to a cycle (its feasibility pre-check stood in for), and the critics' verdicts
and the gate's decisions of two independent worlds fed the same candidates and the same outcomes
(every event id, every content, every event time). tests/integration/test_cli.py runs the whole
loop twice with the simulator (slow)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import numpy as np
from evidence_factory import EvidenceLog, store_events
from loop_harness import BASE, MODELS, LoopWorld, child, harder_for, never

from consumers import state as q
from consumers.evidence.store import migrate
from producers.sim.feasibility import FeasibilityResult
from schemas.codec import Codec
from schemas.typed import to_record
from streams.mutations.agent import MutatorConfig, MutatorRunner


def feasible(spec) -> FeasibilityResult:
    """The pre-check stood in for: everything builds (the simulator is not the point here)."""
    return FeasibilityResult(spec.scenario_id, True, "", {"seeds_checked": 1.0})


def mutator_log() -> tuple[list[dict], dict]:
    log = EvidenceLog()
    for model, kind in MODELS.items():
        log.register(model, kind)
    log.candidate(BASE, "", "base", generator="base")
    log.promoted(BASE, 1)
    clusters = (("fc-slip", "slip", 6), ("fc-miss", "grasp_miss", 4), ("fc-knock", "knocked_object", 3))
    for cluster, kind, size in clusters:
        log.cluster_updated(cluster, size, f"ep-{cluster}", kind, BASE, revision=1, model_counts={"weak": size})
    log.cycle("run-c1", 1, 1, [])
    cycle = next(e for e in log.events if e["envelope"]["event_type"] == "CycleStarted")
    cycle = {**cycle, "max_candidates": 4, "seed": 1234}
    events = [e for e in log.events if e["envelope"]["event_type"] not in ("CycleStarted", "CandidatesGenerated")]
    return events + [cycle], cycle


def test_the_same_log_and_seed_give_the_same_mutator_answer(chdb_store):
    events, cycle = mutator_log()
    answers, stores = [], []
    try:
        for _ in range(2):
            store = chdb_store.with_database(f"mut_{uuid.uuid4().hex[:10]}")
            stores.append(store)
            migrate(store)
            store_events(store, events)
            runner = MutatorRunner(lambda s=store: s, Codec(), MutatorConfig(), check=feasible)
            answers.append(runner.answer(cycle))
            again = runner.answer(cycle)  # a restart before the answer reached the log
            assert again == answers[-1]
            store_events(store, answers[-1])
            assert runner.answer(cycle) == [], "a cycle answered in the log is not answered again"
        first, second = answers
        assert first == second
        proposed = [e for e in first if e["envelope"]["event_type"] == "CandidateProposed"]
        assert len(proposed) == 4 and len({e["scenario_id"] for e in proposed}) == 4
        assert {e["parent_scenario_id"] for e in proposed} == {BASE["scenario_id"]}
        assert first[-1]["proposed"] == [e["scenario_id"] for e in proposed]
    finally:
        for s in stores:
            s.command("DROP DATABASE IF EXISTS {database}")


def test_two_worlds_fed_the_same_candidates_and_outcomes_decide_identically(tansu, store, chdb_store, tmp_path):
    harder, unsolvable = child(object_friction=0.1), child(object_mass=3.0)
    outcomes = {harder["scenario_id"]: harder_for("weak"), unsolvable["scenario_id"]: never}
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    other = chdb_store.with_database(f"twin_{uuid.uuid4().hex[:10]}")
    migrate(other)
    worlds = [LoopWorld(tansu, s, tmp_path / name, outcomes, t0=t0).start()
              for s, name in ((store, "a"), (other, "b"))]
    try:
        for w in worlds:
            w.register()
            w.promote_base()
        for w in worlds:
            w.sweep(BASE, range(10))
            w.critics().start()
            w.propose(harder, seconds=10)
            w.propose(unsolvable, seconds=11)
        for w in worlds:
            w.until(lambda w=w: {len(w.verdicts(harder["scenario_id"])), len(w.verdicts(unsolvable["scenario_id"]))}
                    == {3, 1}, "every verdict")
        decided = []
        for w in worlds:
            events = w.tick_gate()
            w.until(lambda w=w, n=len(events): len(q.decisions(w.store)) == 1 + n, "the decisions")
            decided.append(events)
        assert decided[0] == decided[1]
        assert sorted((e["envelope"]["event_type"], e["benchmark_version"] if "benchmark_version" in e else None)
                      for e in decided[0]) == [("Promoted", 2), ("Rejected", None), ("Retired", 3)]

        def log_of(w):
            return ([(v.event_id, v.event_time, v.critic, v.passed, v.reason, v.evidence_json)
                     for v in q.verdicts(w.store)],
                    sorted(w.store.query("SELECT request_id, scenario_id, model_id, seeds, envelope.event_time "
                                         "FROM {database}.rollout_requests FINAL")))
        assert log_of(worlds[0]) == log_of(worlds[1])
    finally:
        for w in worlds:
            w.stop()
        other.command("DROP DATABASE IF EXISTS {database}")


def test_coverage_cycles_walk_the_grid_over_the_base_in_order(chdb_store):
    """The coverage arm's mutator answer is the grid's next points over the base: the first cycle
    the first four, the next cycle (its answer in the log) the four after, whatever is active."""
    from streams.mutations.coverage import grid_order

    log = EvidenceLog()
    for model, kind in MODELS.items():
        log.register(model, kind)
    log.candidate(BASE, "", "base", generator="base")
    log.promoted(BASE, 1)
    log.cycle("cov-c1", 1, 1, [], generator="coverage")
    log.cycle("cov-c2", 2, 1, [], generator="coverage")
    cycles = {e["cycle_id"]: {**e, "max_candidates": 4}
              for e in log.events if e["envelope"]["event_type"] == "CycleStarted"}
    events = [e for e in log.events if e["envelope"]["event_type"] not in ("CycleStarted", "CandidatesGenerated")]
    store = chdb_store.with_database(f"cov_{uuid.uuid4().hex[:10]}")
    try:
        migrate(store)
        store_events(store, events)
        runner = MutatorRunner(lambda: store, Codec(), MutatorConfig(), check=feasible)
        walked = []
        for cycle_id in ("cov-c1", "cov-c2"):
            answer = runner.answer(cycles[cycle_id])
            store_events(store, answer)
            proposed = [e for e in answer if e["envelope"]["event_type"] == "CandidateProposed"]
            assert {e["generator"] for e in proposed} == {"coverage"}
            assert {e["parent_scenario_id"] for e in proposed} == {BASE["scenario_id"]}
            walked += [(e["factor"], float(e["params"]["magnitude"])) for e in proposed]
        assert walked == [(f, float(m)) for f, m in grid_order()[:8]]
    finally:
        store.command("DROP DATABASE IF EXISTS {database}")


def test_the_mutator_answers_the_same_whatever_order_the_failures_arrived_in(chdb_store):
    """#17: the live clusterer depends on arrival order (two rollout processes deliver a sweep's
    failures differently each run), so the mutator re-clusters the failures taken in before the
    cycle's position in episode-id order: two logs holding the same failures in different orders
    get the same candidates."""
    from analysed_episodes import analysed_episodes, is_failure

    from schemas.scenario import ScenarioSpec
    from streams.failures.clusterer import ClustererConfig, OnlineFailureClusterer
    from streams.failures.embedding import EmbeddingConfig, FailedEpisode, embed, facts

    base = ScenarioSpec.from_dict(BASE)
    specs = {}
    failures = []
    for e in (e for e in analysed_episodes(160, seed=9) if is_failure(e)):
        spec = specs.setdefault(e["scenario_id"], base.mutate(horizon=base.horizon + 10 * (len(specs) + 1)).to_dict())
        failures.append({**e, "scenario_id": spec["scenario_id"], "scenario": spec})
    answers, live_positions, stores = [], [], []
    try:
        for order_seed in (1, 2):
            log = EvidenceLog()
            for model, kind in MODELS.items():
                log.register(model, kind)
            log.candidate(BASE, "", "base", generator="base")
            log.promoted(BASE, 1)
            order = [failures[i] for i in np.random.default_rng(order_seed).permutation(len(failures))]
            clusterer = OnlineFailureClusterer(ClustererConfig())
            clustered = []
            for e in order:
                episode = FailedEpisode.from_analysed(e)
                clustered += clusterer.add(episode.episode_id, episode.scenario_id, embed(episode, EmbeddingConfig()),
                                           facts(episode))
            live_positions.append(sorted((e["cluster_id"], e["size"]) for e in clustered
                                         if e["envelope"]["event_type"] == "ClusterUpdated"))
            log.cycle("run-c1", 1, 1, [])
            cycle = next(e for e in log.events if e["envelope"]["event_type"] == "CycleStarted")
            cycle = {**cycle, "max_candidates": 4, "seed": 77, "clusters_position": clusterer.position}
            events = [e for e in log.events if e["envelope"]["event_type"] not in ("CycleStarted",
                                                                                    "CandidatesGenerated")]
            store = chdb_store.with_database(f"ord_{uuid.uuid4().hex[:10]}")
            stores.append(store)
            migrate(store)
            store_events(store, events + order + clustered)
            runner = MutatorRunner(lambda s=store: s, Codec(), MutatorConfig(), check=feasible)
            answers.append(runner.answer(cycle))
        assert live_positions[0] != live_positions[1], "the two orders gave different live clusters"

        def proposed(answer):
            return [(e["scenario_id"], e["operator"], e["params"]) for e in answer
                    if e["envelope"]["event_type"] == "CandidateProposed"]
        assert proposed(answers[0]), "the failures seed candidates"
        assert proposed(answers[0]) == proposed(answers[1])
        for answer, live in zip(answers, live_positions, strict=True):  # each names a live cluster of its log
            named = {e["source_cluster_id"] for e in answer if e["envelope"]["event_type"] == "CandidateProposed"}
            assert named <= {cid for cid, _ in live}
    finally:
        for s in stores:
            s.command("DROP DATABASE IF EXISTS {database}")


def test_a_guided_cycle_after_one_that_promoted_nothing_explores_untested_factors(chdb_store):
    """#17: failure guidance alone circled one axis (its later candidates were no harder on fresh
    seeds, and the gate turned them away). After a cycle that changed nothing, half the slots go to
    the coverage grid's points on factors the benchmark does not test; after a cycle that promoted,
    the cycle is failure-guided only."""
    events, first = mutator_log()
    store = chdb_store.with_database(f"exp_{uuid.uuid4().hex[:10]}")
    try:
        migrate(store)
        store_events(store, events)
        runner = MutatorRunner(lambda: store, Codec(), MutatorConfig(), check=feasible)
        store_events(store, runner.answer(first))
        second = {**first, "cycle_id": "run-c2", "cycle": 2}

        def proposed(answer):
            return [e for e in answer if e["envelope"]["event_type"] == "CandidateProposed"]
        stalled = proposed(runner.answer(second))
        assert [e["generator"] for e in stalled] == ["failure-guided"] * 2 + ["coverage"] * 2
        guided_factors = {e["factor"] for e in stalled[:2]}
        assert not {e["factor"] for e in stalled[2:]} & (guided_factors | {"base"})
        assert {e["parent_scenario_id"] for e in stalled[2:]} == {BASE["scenario_id"]}
        earlier = {e.scenario_id for e in q.candidates(store)}
        assert not {e["scenario_id"] for e in stalled} & earlier, "nothing proposed before is proposed again"

        nowhere = chdb_store.with_database(f"exp_{uuid.uuid4().hex[:10]}")  # no base on the grid to explore
        try:
            migrate(nowhere)
            store_events(nowhere, [e for e in events if e["envelope"]["event_type"] != "CandidateProposed"])
            blocked = MutatorRunner(lambda: nowhere, Codec(), MutatorConfig(), check=feasible)
            store_events(nowhere, blocked.answer(first))
            refilled = proposed(blocked.answer(second))
            assert [e["generator"] for e in refilled] == ["failure-guided"] * 4, "the failures take the slots back"
        finally:
            nowhere.command("DROP DATABASE IF EXISTS {database}")

        log = EvidenceLog()
        log.promoted(child(object_friction=0.1), 2, parent_id=BASE["scenario_id"], factor="friction")
        store_events(store, log.events)
        moved = proposed(runner.answer({**second, "benchmark_version": 2}))
        assert moved and {e["generator"] for e in moved} == {"failure-guided"}
    finally:
        store.command("DROP DATABASE IF EXISTS {database}")


@contextlib.contextmanager
def mutator_db(chdb_store):
    """A database of its own holding mutator_log()'s events: (store, its first cycle)."""
    events, first = mutator_log()
    store = chdb_store.with_database(f"mut_{uuid.uuid4().hex[:10]}")
    try:
        migrate(store)
        store_events(store, events)
        yield store, first
    finally:
        store.command("DROP DATABASE IF EXISTS {database}")


def refusing(refused) -> Callable:
    """A pre-check that refuses the specs ``refused(spec)`` is true for, and passes the rest."""
    def check(spec) -> FeasibilityResult:
        ok = not refused(spec)
        return FeasibilityResult(spec.scenario_id, ok, "" if ok else "refused for the test", {"seeds_checked": 1.0})
    return check


def test_slots_whose_variants_the_pre_check_refuses_go_to_the_grid_after_a_cycle_that_promoted_nothing(chdb_store):
    """#17: a stalled cycle's failure-guided variants that the pre-check refused (a pose the arm
    cannot reach) took their slots and their factors with them, so the cycle explored less than it
    could. Now the grid fills every slot left, with feasible points on factors nobody tests."""
    material_or_clutter = refusing(lambda spec: spec.distractors or spec.object_friction is not None
                                   or spec.object_mass is not None)
    with mutator_db(chdb_store) as (store, first):
        runner = MutatorRunner(lambda: store, Codec(), MutatorConfig(), check=material_or_clutter)
        store_events(store, runner.answer(first))
        answer = runner.answer({**first, "cycle_id": "run-c2", "cycle": 2})
        proposed = [e for e in answer if e["envelope"]["event_type"] == "CandidateProposed"]
        generated = next(e for e in answer if e["envelope"]["event_type"] == "CandidatesGenerated")
        assert generated["infeasible"], "some variants were refused"
        assert len(proposed) == first["max_candidates"], "every refused slot is filled"
        explored = [e["factor"] for e in proposed if e["generator"] == "coverage"]
        assert explored and len(set(explored)) == len(explored)
        assert not set(explored) & ({e["factor"] for e in proposed if e["generator"] != "coverage"}
                                    | {"base", "friction", "mass", "distractors"})


def test_exploration_knows_whether_a_registered_model_perceives(chdb_store):
    """Only a policy server sees pixels and reads the instruction; the scripted models and the oracle
    read poses. The mutator asks the registry, for the cycle's models."""
    with mutator_db(chdb_store) as (store, first):
        runner = MutatorRunner(lambda: store, Codec(), MutatorConfig(), check=feasible)
        scripted = to_record({**first, "models": list(MODELS)})
        assert not runner._perceiving(scripted)
        log = EvidenceLog()
        log.register("a-vla", "websocket")
        store_events(store, log.events)
        assert runner._perceiving(to_record({**first, "models": [*MODELS, "a-vla"]}))
        assert not runner._perceiving(scripted), "a perceiving model outside the cycle does not count"
        assert runner._perceiving(to_record({**first, "models": []})), "a cycle naming no models: every registered"


def test_a_variant_the_pre_check_refuses_gives_its_slot_to_the_next_one_drawn(chdb_store):
    """Any cycle proposes the first ``max_candidates`` feasible candidates it drew: an unreachable
    pose variant does not leave its slot empty."""
    moved_object = refusing(lambda spec: any(spec.pose_offset_xyz) or spec.placement_x_range)
    with mutator_db(chdb_store) as (store, first):
        answer = MutatorRunner(lambda: store, Codec(), MutatorConfig(), check=moved_object).answer(first)
        proposed = [e for e in answer if e["envelope"]["event_type"] == "CandidateProposed"]
        generated = next(e for e in answer if e["envelope"]["event_type"] == "CandidatesGenerated")
        assert generated["infeasible"] and len(proposed) == first["max_candidates"]
        assert {e["generator"] for e in proposed} == {"failure-guided"}
