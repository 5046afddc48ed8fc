"""A promotion gate restarted mid-cycle decides nothing twice and loses nothing: at every point its
publication can be cut (after any prefix of one tick's decisions), a new GateRunner over the same
log publishes exactly the rest, byte for byte, and benchmark versions stay contiguous. Then the same
over a real broker and the evidence sink, and a replay of those topics rebuilds the same state."""

from __future__ import annotations

import uuid
from datetime import timedelta

from evidence_factory import EvidenceLog, store_events
from loop_harness import BASE, MODELS, LoopWorld, child, critic_verdicts
from sinks import rebuild_from

from consumers import state as q
from consumers.evidence.store import migrate
from consumers.replay import compare
from schemas.codec import Codec
from schemas.events import make_event
from streams.gate.agent import GateRunner
from streams.gate.gate import GateConfig, PromotionGate

BASE_ID = BASE["scenario_id"]
HARDER = child(object_friction=0.1)
HEAVIER = child(object_mass=1.5)
UNSOLVABLE = child(object_mass=3.0)
CYCLE = "run-c1"


def cycle_log() -> tuple[list[dict], object]:
    """A saturated base (promoted, swept on 10 seeds by every model) and one cycle of three
    candidates with the critics' verdicts: two to promote, one to reject."""
    log = EvidenceLog()
    for model, kind in MODELS.items():
        log.register(model, kind)
    log.candidate(BASE, "", "base", generator="base")
    log.promoted(BASE, 1)
    for model in MODELS:
        request = log.request(BASE, model, list(range(10)))
        for seed in range(10):
            log.episode(model, BASE, seed, True, request_id=request)
    log.cycle(CYCLE, 1, 1, [s["scenario_id"] for s in (HARDER, HEAVIER, UNSOLVABLE)])
    for spec, factor in ((HARDER, "friction"), (HEAVIER, "mass"), (UNSOLVABLE, "mass")):
        log.candidate(spec, BASE_ID, factor, cycle_id=CYCLE, source_cluster_id="fc-1")
    at = log.clock + timedelta(minutes=5)
    for spec, accept in ((HARDER, True), (HEAVIER, True), (UNSOLVABLE, False)):
        log.events += critic_verdicts(spec["scenario_id"], at, accept)
    return log.events, at + timedelta(minutes=1)


def settle(store, clock) -> list[dict]:
    """Ticks a new gate (a restart before every tick) until it has nothing to say; its decisions are
    stored as the sink stores them. Returns them, in publication order."""
    codec, decided = Codec(), []
    for _ in range(10):
        runner = GateRunner(lambda: store, codec, PromotionGate(GateConfig(run_id="gate")), clock=lambda: clock)
        events = [codec.decode(m.value) for m in runner.tick()]
        if not events:
            return decided
        store_events(store, events)
        decided += events
    said = [(e["envelope"]["event_type"], e["scenario_id"]) for e in decided]
    raise AssertionError(f"the gate never went quiet: {said}")


def fresh(chdb_store, events: list[dict]):
    store = chdb_store.with_database(f"gate_{uuid.uuid4().hex[:10]}")
    migrate(store)
    store_events(store, events)
    return store


def test_a_gate_cut_after_any_prefix_of_its_decisions_publishes_exactly_the_rest(chdb_store):
    events, clock = cycle_log()
    store = fresh(chdb_store, events)
    stores = [store]
    try:
        reference = settle(store, clock)
        kinds = sorted((e["envelope"]["event_type"], e["scenario_id"]) for e in reference)
        assert kinds == sorted([("Promoted", HARDER["scenario_id"]), ("Promoted", HEAVIER["scenario_id"]),
                                ("Rejected", UNSOLVABLE["scenario_id"]), ("Retired", BASE_ID)])
        assert [v.version for v in q.benchmark_versions(store)] == [1, 2, 3, 4]
        promoted = {e["scenario_id"]: e for e in reference if e["envelope"]["event_type"] == "Promoted"}
        verdict_ids = {v.scenario_id: {v.event_id for v in q.verdicts(store, scenario_ids=[v.scenario_id])}
                       for v in q.verdicts(store)}
        for sid, e in promoted.items():  # every verdict the promotion rests on is named (safety, robustness)
            assert len(set(e["evidence_event_ids"]) & verdict_ids[sid]) == 2, e["evidence_event_ids"]

        for cut in range(len(reference)):
            restarted = fresh(chdb_store, events + reference[:cut])
            stores.append(restarted)
            rest = settle(restarted, clock)
            assert rest == reference[cut:], f"cut after {cut} of {len(reference)} decisions"
            assert [v.version for v in q.benchmark_versions(restarted)] == [1, 2, 3, 4]
    finally:
        for s in stores:
            s.command("DROP DATABASE IF EXISTS {database}")


def test_a_gate_restarted_mid_cycle_over_the_broker_decides_nothing_twice_and_replays(tansu, store, tmp_path):
    ids = {s["scenario_id"]: s for s in (HARDER, HEAVIER, UNSOLVABLE)}
    world = LoopWorld(tansu, store, tmp_path, {}).start()
    try:
        world.register()
        world.promote_base()
        world.sweep(BASE, range(10))
        proposed = [s["scenario_id"] for s in (HARDER, HEAVIER, UNSOLVABLE)]
        world.publish(make_event("CycleStarted", (CYCLE,), "orchestrator", "test", event_time=world.at(5),
                                 cycle_id=CYCLE, cycle=1, benchmark_version=1, clusters_position=0,
                                 generator="failure-guided", max_candidates=3, seed=7, models=list(MODELS)),
                      make_event("CandidatesGenerated", (CYCLE,), "mutator", "test", event_time=world.at(5),
                                 cycle_id=CYCLE, generator="failure-guided", seeds=["fc-1"], proposed=proposed,
                                 infeasible={}, mutator_version="test"))
        for i, spec in enumerate((HARDER, HEAVIER, UNSOLVABLE)):
            world.propose(spec, cycle_id=CYCLE, factor="mass" if spec is not HARDER else "friction", seconds=10 + i)
        at = world.at(120)
        world.publish(*critic_verdicts(HARDER["scenario_id"], at, True),
                      *critic_verdicts(UNSOLVABLE["scenario_id"], at, False))
        world.until(lambda: len(q.verdicts(store)) == 4, "the first verdicts")
        assert world.tick_gate() == [], "a cycle is decided together, once every candidate is ready"

        world.new_gate()  # restarted while the last candidate is still being validated
        world.publish(*critic_verdicts(HEAVIER["scenario_id"], at, True))
        world.until(lambda: len(q.verdicts(store)) == 7, "the last verdicts")
        out = world.gate.tick()
        decided = [world.codec.decode(m.value) for m in out]
        first_promotion = next(i for i, e in enumerate(decided) if e["envelope"]["event_type"] == "Promoted")
        for m in out[:first_promotion + 1]:  # the worker dies while publishing
            world.publisher.publish_raw(world.prefix + m.topic, m.key, m.value)
        world.publisher.flush()
        world.until(lambda: len(q.decisions(store)) == 1 + first_promotion + 1, "the published part")

        world.new_gate()
        rest = world.tick_gate()
        assert rest == decided[first_promotion + 1:], "the restarted gate publishes exactly what was left"
        world.until(lambda: len(q.decisions(store)) == 1 + len(decided), "every decision")
        for m in out:  # a restart before the log showed them: the same events again
            world.publisher.publish_raw(world.prefix + m.topic, m.key, m.value)
        world.publisher.flush()
        world.new_gate()
        assert world.tick_gate() == [], "nothing decided twice"
        assert [v.version for v in q.benchmark_versions(store)] == [1, 2, 3, 4]
        statuses = {c.scenario_id: c.status for c in q.candidates(store) if c.scenario_id in ids}
        assert sorted(statuses.values()) == ["promoted", "promoted", "rejected"]
        world.until(lambda: world.sink.totals.duplicates >= len(out), "the re-sent decisions counted once")
        assert world.dead_letters() == [], "a decision was re-published with another content"

        rebuilt = rebuild_from(store, tansu, world.prefix, store.database + "_rebuild")
        try:
            before, after, differences = compare(store, rebuilt)
            assert differences == {} and before == after
            assert q.benchmark_versions(rebuilt)[-1].version == 4
            assert [(c.cycle_id, c.answered, c.proposed) for c in q.cycles(rebuilt)] == [(CYCLE, True, tuple(proposed))]
        finally:
            rebuilt.command("DROP DATABASE IF EXISTS {database}")
    finally:
        world.stop()
