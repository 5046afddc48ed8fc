"""A small evolved benchmark, the same for every read-side test: four models, a saturated base
scenario, one promoted harder child, a rejected, a deferred and a reviewed candidate, a retirement."""

from __future__ import annotations

from evidence_factory import EvidenceLog, spec

from producers.seeds import held_out_seeds

MODELS = {"oracle": "oracle", "strong": "scripted", "medium": "scripted", "weak": "scripted"}
BASE = spec("base")
SLIP = spec("slip", parent="scn-base", object_friction=0.1)
FAR = spec("far", parent="scn-base", placement_x_range=[0.2, 0.3])
LATE = spec("late", parent="scn-base", horizon=100)
ODD = spec("odd", parent="scn-base", instruction="raise the block")
SEEDS = range(20)
# successes on the child per model (of 20 seeds, the first k succeed)
CHILD_SUCCESSES = {"oracle": 20, "strong": 16, "medium": 10, "weak": 4}
KEYFRAME = "ab" + "0" * 62
# held-out measurement of the child (measure()): of 20 held-out seeds, the first k succeed; closer
# together than on the selection seeds, as a promotion's winner's curse makes them
HELD_OUT_SUCCESSES = {"oracle": 20, "strong": 18, "medium": 14, "weak": 10}


def build(log: EvidenceLog | None = None, keyframe: str = KEYFRAME) -> EvidenceLog:
    """keyframe: the sha256 the weak model's failed base episode (the cluster's representative) ends on."""
    log = log or EvidenceLog()
    for model, kind in MODELS.items():
        log.register(model, kind)
    log.candidate(BASE, "", "base", generator="base")
    log.promoted(BASE, 1)
    failed = []
    for model in MODELS:
        request = log.request(BASE, model, list(SEEDS))
        for seed in SEEDS:
            fail = model == "weak" and seed == 19
            episode = log.episode(model, BASE, seed, not fail, request_id=request,
                                  moments=[("slip", 30, -1)] if fail else [("grasp_miss", 10, 20)] if seed == 0 else [],
                                  keyframe=keyframe if fail else None,
                                  quality={"regrasp_count": 1 if seed == 0 else 0})
            if fail:
                failed.append(episode)
    log.cluster_assigned("c1", failed[0], BASE["scenario_id"], "weak")
    log.cluster_updated("c1", 1, failed[0], "slip", BASE, revision=1)
    log.cluster_updated("c1", 3, failed[0], "slip", BASE, revision=2, summary="slips off a light cube")
    log.cluster_updated("c0", 2, failed[0], "drop", BASE, revision=1)
    log.cluster_updated("c0", 0, failed[0], "drop", BASE, revision=2)  # retired
    log.cycle("cyc-1", 1, 1, [s["scenario_id"] for s in (SLIP, FAR, LATE, ODD)], infeasible={"scn-x": "sinks"})
    for candidate, factor in ((SLIP, "friction"), (FAR, "placement"), (LATE, "time_budget"), (ODD, "instruction")):
        log.candidate(candidate, "scn-base", factor, cycle_id="cyc-1", source_cluster_id="c1")
    evidence = [log.verdict("scn-slip", "robustness", True, rollouts=160, score=0.9),
                log.verdict("scn-slip", "safety", True),
                log.verdict("scn-slip", "semantic", None, ran=False, reason="no endpoint configured")]
    log.verdict("scn-far", "robustness", False, rollouts=40, reason="not harder than its parent")
    for model in MODELS:
        request = log.request(SLIP, model, list(SEEDS), purpose="validation")
        for seed in SEEDS:
            ok = seed < CHILD_SUCCESSES[model]
            log.episode(model, SLIP, seed, ok, request_id=request,
                        moments=[] if ok else [("slip", 25, 40 if seed % 2 else -1)],
                        quality={"peak_contact_force": 40.0, "regrasp_count": 0 if ok else 2})
    log.promoted(SLIP, 2, parent_id="scn-base", factor="friction", source_cluster_id="c1", evidence=evidence)
    log.decision("Rejected", "scn-far", "not discriminative")
    log.decision("Deferred", "scn-late", "robustness verdict missing")
    log.decision("ReviewRequested", "scn-odd", "borderline semantic score")
    log.retired("scn-base", 3)
    return log


def measure(log: EvidenceLog) -> EvidenceLog:
    """The child measured on held-out seeds (producers/seeds.py), as the loop does after a cycle."""
    seeds = held_out_seeds(20)
    for model in MODELS:
        request = log.request(SLIP, model, seeds)
        for i, seed in enumerate(seeds):
            log.episode(model, SLIP, seed, i < HELD_OUT_SUCCESSES[model], request_id=request)
    return log


if __name__ == "__main__":  # PYTHONPATH=tests python tests/integration/read_world.py MEMORY_DIR
    import sys
    from pathlib import Path

    from evidence_factory import store_events

    from consumers.evidence.store import ClickHouseStore, migrate

    store = ClickHouseStore.connect(None, Path(sys.argv[1]) / "evidence", "sepa")
    migrate(store)
    store_events(store, build().events)
