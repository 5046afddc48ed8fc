"""Selection and measurement on disjoint seeds (producers/seeds.py): scores read either split; the
gate decides on the selection seeds only, so a held-out episode cannot move a decision; an episode
whose start is missing has no known seed and measures nothing."""

from __future__ import annotations

from evidence_factory import EvidenceLog, spec, store_events

from consumers import state as q
from producers.seeds import HELD_OUT_FROM, held_out_seeds, is_held_out, selection_seeds
from schemas.libero_scenario import INIT_STATES_PER_TASK
from streams.gate.agent import gate_state


def test_scores_read_the_selection_seeds_the_held_out_seeds_or_all(store):
    log = EvidenceLog()
    base = spec("base")
    log.register("weak", "scripted")
    log.promoted(base, 1)
    for seed in selection_seeds(10):  # the seeds that chose: weak failed on all of them
        log.episode("weak", base, seed, success=False)
    for i, seed in enumerate(held_out_seeds(10)):  # fresh seeds: it does better
        log.episode("weak", base, seed, success=i < 6)
    log.episode("weak", base, HELD_OUT_FROM + 99, success=True, started=False)  # no start: no known seed
    store_events(store, log.events)

    def rate(seeds):
        [s] = q.scores(store, version=1, seeds=seeds)
        return s.successes, s.episodes

    assert rate(q.SELECTION) == (0, 10)
    assert rate(q.HELD_OUT) == (6, 10)
    assert rate(None) == (6, 20)  # every seed (the start-less episode belongs to no version)
    assert {t.seed for t in q.trials(store, seeds=q.HELD_OUT)} == set(held_out_seeds(10))
    # what the gate reads: the selection seeds' 0/10, whatever the held-out seeds say
    assert gate_state(store).success == {(base["scenario_id"], "weak"): (0, 10)}


def test_the_split_is_one_boundary():
    assert not is_held_out(None) and not is_held_out(HELD_OUT_FROM - 1) and is_held_out(HELD_OUT_FROM)
    assert set(selection_seeds(500)).isdisjoint(held_out_seeds(500))
    # LIBERO's start is its init state, seed mod 50: measurement does not start where a sweep does
    assert {s % INIT_STATES_PER_TASK for s in held_out_seeds(25)}.isdisjoint(
        {s % INIT_STATES_PER_TASK for s in selection_seeds(20)})


def test_adjacent_pairs_are_ordered_by_held_out_success_and_told_apart_after_holm(store):
    log = EvidenceLog()
    base = spec("base")
    for model in ("a", "b", "c", "oracle"):
        log.register(model, "oracle" if model == "oracle" else "scripted")
    log.promoted(base, 1)
    wins = {"a": range(20), "b": range(4), "c": range(3), "oracle": range(20)}  # of 20 held-out seeds
    for model, won in wins.items():
        for i, seed in enumerate(held_out_seeds(20)):
            log.episode(model, base, seed, success=i in won)
        for seed in selection_seeds(20):  # in-sample, c looks best: the order must not come from here
            log.episode(model, base, seed, success=model == "c")
    store_events(store, log.events)
    first, second = q.adjacent_pairs(store, 1)  # the oracle is not ranked
    assert (first.better, first.worse, first.separated) == ("a", "b", True)
    assert (first.test.only_1, first.test.only_2) == (16, 0) and first.holm_p < 0.001
    assert (second.better, second.worse, second.separated) == ("b", "c", False)


def test_the_models_tied_at_the_top_are_read_on_the_selection_seeds(store):
    """tied_top: two or more ranked models at >= 95% on the version's selection sweep (the oracle
    apart), whatever the held-out seeds say; one model alone at the top is no tie."""
    from infra.orchestrator import tied_top
    from producers.sim.models import ModelConfig
    from producers.sim.policies import Skill

    log = EvidenceLog()
    base = spec("base")
    models = [ModelConfig(model_id=m, version="1", kind="oracle" if m == "oracle" else "scripted", skill=Skill())
              for m in ("oracle", "a", "b", "c")]
    for m in models:
        log.register(m.model_id, m.kind)
    log.promoted(base, 1)
    won = {"oracle": 20, "a": 20, "b": 19, "c": 12}  # of 20 selection seeds
    for m, k in won.items():
        for i, seed in enumerate(selection_seeds(20)):
            log.episode(m, base, seed, success=i < k)
        for seed in held_out_seeds(20):  # on fresh seeds b falls off: not what chooses
            log.episode(m, base, seed, success=m != "b")
    store_events(store, log.events)
    assert tied_top(store, 1, models) == ("a", "b")
    assert tied_top(store, 1, [m for m in models if m.model_id != "b"]) == ()
