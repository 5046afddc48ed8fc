"""The headline: from a saturated base, does the loop build a benchmark that separates the models
again, and does failure-guided generation beat the baselines on the same budget?

Each arm runs the whole product on the embedded default in a fresh memory dir: `up` (broker,
pipeline, streams worker with detector, clusterer, mutator and gate, rollout worker, critics),
the models of producers/sim/configs/models.yaml (four ranked scripted models and the oracle), the
base benchmark (Lift), then up to ``--cycles`` cycles of the loop (infra.orchestrator.evolve)
within ``--budget`` rollouts: a cycle proposes only as many candidates as the cost of a candidate so
far says fit in what is left once its sweeps are paid for, and none starts when not one would
(infra.orchestrator.cycle_size). The failure-guided arm
seeds the mutator from the failure clusters. Two baselines get the rollouts the guided arm spent as
their budget (up to ``--blind-cycles`` cycles each) and the same validation: the blind arm draws
the same operators with random parameters and no seed; the coverage arm walks a fixed grid of
every factor at three magnitudes over the base, in the style of LIBERO-Plus
(streams/mutations/coverage.py). Everything is then read back from the arm's evidence log:

- promoted: scenarios the loop promoted and that are still active (the base is not one);
- Spearman: the ranked scripted models' pooled success on the final benchmark against their known
  skill rank (models.yaml ``rank``; the oracle apart), and their spread best - worst (points), on
  held-out seeds (producers/seeds.py: they chose nothing), beside the same on the selection seeds
  (in-sample: biased, shown for the size of the bias);
- oracle: the lowest oracle success of any promoted scenario over its validation episodes;
- validation cost: rollouts per model per candidate, the parent's control arm included (counted
  even where the sweeps had already run those seeds), and the rollouts actually run;
- rollouts spent by purpose and the arm's wall time;
- unseen: three families of scripted models the loop never saw (UNSEEN_FAMILIES), measured after the
  loop on held-out seeds of the base and of the final benchmark: Spearman against each family's
  true order and spread, on each.

Targets (issue 10): Spearman 1.0 and spread >= 30 pp on the promoted benchmark within 3 cycles,
oracle >= 90% on every promoted scenario, <= 20 validation rollouts per model per candidate, and
the guided arm promoting more discriminative scenarios than the baselines for the same budget.

Usage:
    python bench/evolution.py [--cycles 3] [--budget 1500] [--sweep-seeds 20] [--max-candidates 4]
                              [--seed 0] [--arms failure-guided,blind,coverage] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from consumers import state as q  # noqa: E402
from consumers.statistics import spearman  # noqa: E402
from infra import orchestrator, processes, supervisor, waits  # noqa: E402
from infra.kafka_clients import make_codec, make_producer  # noqa: E402
from infra.settings import load_settings  # noqa: E402
from producers.adapters import RobosuiteAdapter  # noqa: E402
from producers.publisher import Publisher  # noqa: E402
from producers.seeds import held_out_seeds  # noqa: E402
from producers.sim.models import DEFAULT_MODELS_PATH, ModelConfig, load_models, skill_order  # noqa: E402
from producers.sim.policies import Skill  # noqa: E402

BASE_HORIZON = 200
# Models the loop never sees (not in models.yaml, never registered while it runs), in three families
# of known order: each model is at least as bad as the one before in every Skill component. One
# lies between models.yaml's ranks (its step formula, rank r = step r + 1, at other steps); one is
# weak in precision and noise and hardly distractible; one is steady but drawn to distractors.
# After its loop, each arm measures them on held-out seeds of the base and of the benchmark it
# built: does the evolved benchmark order models it was not built on?
UNSEEN_STEPS = (1.5, 3.0, 4.5)
UNSEEN_FAMILIES = {
    "between": lambda s: dict(target_noise_m=0.001 * s, range_noise_per_m=0.02 * s, action_noise=0.024 * s,
                              timing_jitter=0.04 * s, precision=1 - 0.04 * s, distractor_pull=0.2 * s, retries=1),
    "imprecise": lambda s: dict(target_noise_m=0.0015 * s, range_noise_per_m=0.02 * s, action_noise=0.036 * s,
                                timing_jitter=0.04 * s, precision=1 - 0.06 * s, distractor_pull=0.05 * s, retries=1),
    "distractible": lambda s: dict(target_noise_m=0.0008 * s, range_noise_per_m=0.015 * s, action_noise=0.018 * s,
                                   timing_jitter=0.03 * s, precision=1 - 0.03 * s, distractor_pull=0.22 * s, retries=1),
}
UNSEEN_SEEDS = 20
BASELINE_ARMS = ("blind", "coverage")  # given the rollouts the guided arm spent, over up to --blind-cycles
ORACLE_TARGET = 0.9
SPREAD_TARGET = 0.30
COST_TARGET = 20.0


def unseen_models() -> dict[str, list[ModelConfig]]:
    """family -> its models, best first."""
    return {family: [ModelConfig(model_id=f"unseen-{family}-{i}", version="1", kind="scripted",
                                 skill=Skill(**skill(step)), description=f"bench/evolution.py: {family}, step {step}")
                     for i, step in enumerate(UNSEEN_STEPS)]
            for family, skill in UNSEEN_FAMILIES.items()}


def models_file(memory: Path) -> Path:
    """models.yaml plus the unseen families: what the arm's rollout worker serves."""
    doc = yaml.safe_load(DEFAULT_MODELS_PATH.read_text())
    for family in unseen_models().values():
        doc["models"] += [{"model_id": m.model_id, "version": m.version, "kind": m.kind, "description": m.description,
                           "skill": dataclasses.asdict(m.skill)} for m in family]
    path = memory / "models-with-unseen.yaml"
    memory.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def measure_unseen(store, publisher, base: dict, settings) -> dict:
    """Each unseen family on held-out seeds of the base and of the final benchmark: Spearman against
    its true order and spread, on each."""
    benchmark = q.active_benchmark(store)
    finals = [dict(a.spec) for a in benchmark.scenarios]
    families = unseen_models()
    everyone = [m for family in families.values() for m in family]
    requests = orchestrator.request_sweeps(publisher, store, [base, *finals], everyone, held_out_seeds(UNSEEN_SEEDS))
    waits.wait_for_episodes(store, requests, waits.deadline_in(orchestrator.STAGE_TIMEOUT_S),
                            check=waits.still_running(settings))
    out = {}
    for family, members in families.items():
        ids = [m.model_id for m in members]
        for label, scenario_ids in (("base", [base["scenario_id"]]), ("evolved", [s["scenario_id"] for s in finals])):
            pooled = {s.model_id: s.success_rate for s in q.pooled_scores(
                q.scores(store, model_ids=ids, scenario_ids=scenario_ids, seeds=q.HELD_OUT))}
            rates = [pooled.get(m, float("nan")) for m in ids]
            out[f"{family} {label}"] = {"rates": rates, "spearman": spearman([-r for r in range(len(ids))], rates),
                                        "spread": max(rates) - min(rates)}
    return out


def run_arm(generator: str, args, work: Path, cycles: int, budget: int, after=None,
            models_path: Path | None = None) -> dict:
    """One arm: the loop, then ``measure`` of its log, then ``after(store, publisher, base,
    settings)`` (default: the unseen families, under "unseen") merged in while the broker is up.
    ``models_path``: the models the loop registers and the workers serve (default: models.yaml's
    registered, the unseen families served besides)."""
    memory = work / generator
    started = time.monotonic()
    with stack(memory, models_path or models_file(memory)) as (store, publisher, settings):
        # models.yaml's unless told: the unseen families are served, never registered
        models = load_models(models_path) if models_path else load_models()
        orchestrator.register_models(publisher, models)
        base = base_scenario()
        config = orchestrator.EvolveConfig(
            run_id=f"bench-{generator}", cycles=cycles, sweep_seeds=args.sweep_seeds,
            max_candidates=args.max_candidates, generator=generator, seed=args.seed,
            base=(base,), rollout_budget=budget, fragile=settings.cluster_fragile_successes)

        def hear(kind, value):
            if kind == "report":
                print(f"  [{generator}] cycle {value.cycle}: {len(value.proposed)} proposed, {value.decided}, "
                      f"promoted {len(value.promoted)}, retired {len(value.retired)}, v{value.version_after}, "
                      f"{value.rollouts} rollouts, {value.seconds:.0f} s", flush=True)
            elif kind == "budget":
                print(f"  [{generator}] stopped: the budget of {value} rollouts has no room for another candidate",
                      flush=True)
            elif kind == "separated":
                print(f"  [{generator}] stopped: every adjacent pair of ranked models is separated", flush=True)

        loop_started, since = time.monotonic(), datetime.now(UTC)
        reports = orchestrator.evolve(store, publisher, models, config, on_event=hear,
                                      check=waits.still_running(settings))
        print(f"  [{generator}] " + orchestrator.loop_time(store, since, time.monotonic() - loop_started,
                                                          settings.rollout_processes), flush=True)
        result = measure(store, models, reports, time.monotonic() - started)
        result.update(after(store, publisher, base, settings) if after is not None
                      else {"unseen": measure_unseen(store, publisher, base, settings)})
        return result


def base_scenario() -> dict:
    return RobosuiteAdapter().base_scenario("Lift", BASE_HORIZON)


@contextlib.contextmanager
def stack(memory: Path, served: Path):
    """The whole product up on the embedded default in ``memory`` (a kept one is opened again),
    serving the models of ``served``: (store, publisher, settings); down on leaving."""
    settings = load_settings(memory_dir=memory, environ={"SEPA_MODELS_FILE": str(served)})
    supervisor.up(settings)
    publisher = None
    try:
        store = processes.open_store(settings)
        publisher = Publisher(make_producer(processes.require_bootstrap(settings)), settings.topic_prefix,
                              make_codec(settings))
        yield store, publisher, settings
    finally:
        if publisher is not None:
            publisher.flush()
            del publisher  # the producer goes before the broker: else it logs refused reconnects at exit
        supervisor.down(settings)


def measure(store, models, reports, seconds: float) -> dict:
    oracle = next(m.model_id for m in models if m.kind == "oracle")
    ranking = [m for m in skill_order(models) if m != oracle]  # the ranked scripted models, best first
    benchmark = q.active_benchmark(store)
    promoted = [a for a in benchmark.scenarios if a.factor != "base"]
    pooled = {s.model_id: s for s in q.pooled_scores(q.scores(store, version=benchmark.version, seeds=q.HELD_OUT))}
    rates = [pooled[m].success_rate if m in pooled else float("nan") for m in ranking]
    rho = spearman([-r for r in range(len(ranking))], rates) if promoted else None
    spread = (max(rates) - min(rates)) if promoted else float("nan")
    # the same on the seeds that chose the scenarios, for contrast: the gap is the selection bias
    biased = {s.model_id: s for s in q.pooled_scores(q.scores(store, version=benchmark.version, seeds=q.SELECTION))}
    biased_rates = [biased[m].success_rate if m in biased else float("nan") for m in ranking]
    rho_in = spearman([-r for r in range(len(ranking))], biased_rates) if promoted else None
    spread_in = (max(biased_rates) - min(biased_rates)) if promoted else float("nan")
    oracle_rates = {}
    for a in promoted:
        trials = [t for t in q.trials(store, model_ids=[oracle], scenario_ids=[a.scenario_id]) if t.valid]
        oracle_rates[a.scenario_id] = sum(t.success for t in trials) / len(trials) if trials else float("nan")
    verdicts = [v for v in q.verdicts(store) if v.critic == "robustness"]
    n_models = len(models)
    cost = sum(v.rollouts for v in verdicts) / n_models / len(verdicts) if verdicts else float("nan")
    spent = {r.purpose: r.ended_episodes for r in q.rollouts_spent(store)}
    new_cost = spent.get("validation", 0) / n_models / len(verdicts) if verdicts else float("nan")
    discriminative = sum(1 for c in q.candidates(store) if c.status in ("promoted", "retired")
                         and c.generator != "base")
    return {"cycles": len(reports), "promoted": len(promoted), "promoted_ever": discriminative,
            "candidates": sum(len(r.proposed) for r in reports), "scores": dict(zip(ranking, rates, strict=True)),
            "spearman": rho, "spread": spread, "spearman_in_sample": rho_in, "spread_in_sample": spread_in,
            "scores_in_sample": dict(zip(ranking, biased_rates, strict=True)),
            "oracle_min": min(oracle_rates.values(), default=float("nan")),
            "oracle_score": pooled[oracle].success_rate if oracle in pooled else float("nan"),
            "oracle": oracle_rates, "cost_per_model_candidate": cost, "new_cost_per_model_candidate": new_cost,
            "rollouts": sum(spent.values()), "by_purpose": spent, "seconds": seconds,
            "version": benchmark.version, "promoted_ids": [a.scenario_id for a in promoted],
            "promoted_factors": [a.factor for a in promoted]}


def print_table(results: dict[str, dict]) -> None:
    arms = list(results)
    rows = [("cycles run", "cycles", "{:d}"), ("candidates proposed", "candidates", "{:d}"),
            ("promoted (active at the end)", "promoted", "{:d}"), ("promoted, ever", "promoted_ever", "{:d}"),
            ("Spearman vs true skill (4 ranked models), held-out", "spearman", "{:.2f}"),
            ("spread best-worst (pp), held-out", "spread", "{:.0%}"),
            ("Spearman, in-sample (selection seeds)", "spearman_in_sample", "{:.2f}"),
            ("spread, in-sample (selection seeds)", "spread_in_sample", "{:.0%}"),
            ("oracle on the final benchmark, held-out", "oracle_score", "{:.0%}"),
            ("oracle, worst promoted scenario", "oracle_min", "{:.0%}"),
            ("validation rollouts / model / candidate (control incl.)", "cost_per_model_candidate", "{:.1f}"),
            ("  of which run anew", "new_cost_per_model_candidate", "{:.1f}"),
            ("rollouts spent", "rollouts", "{:d}"), ("wall time (s)", "seconds", "{:.0f}")]
    width = max(len(label) for label, _, _ in rows) + 2
    print("\n" + "".ljust(width) + "".join(a.rjust(16) for a in arms) + ("ratio".rjust(10) if len(arms) == 2 else ""))
    for label, key, fmt in rows:
        cells = []
        for a in arms:
            v = results[a][key]
            cells.append(("-" if v is None or (isinstance(v, float) and v != v) else fmt.format(v)).rjust(16))
        ratio = ""
        if len(arms) == 2:
            a, b = (results[x][key] for x in arms)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b and a == a and b == b:
                ratio = f"{a / b:.2f}".rjust(10)
        print(label.ljust(width) + "".join(cells) + ratio)
    for a in arms:
        r = results[a]
        print(f"\n{a}: final benchmark v{r['version']}: {', '.join(r['promoted_ids']) or 'base only'} "
              f"({', '.join(r['promoted_factors'])}); per-model success {json.dumps(r['scores'])}")
        print(f"  oracle per promoted scenario: {json.dumps(r['oracle'])}; rollouts by purpose {r['by_purpose']}")
        print(f"  in-sample per-model success (selection seeds): {json.dumps(r['scores_in_sample'])}")
        for name, u in r.get("unseen", {}).items():
            rho = "- (all tied)" if u["spearman"] is None else f"{u['spearman']:.2f}"
            print(f"  unseen family {name}, held-out: success {', '.join(f'{x:.2f}' for x in u['rates'])} "
                  f"(best first by construction); Spearman {rho}, spread {u['spread']:.0%}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--budget", type=int, default=1500, help="rollouts an arm may spend before a new cycle")
    parser.add_argument("--sweep-seeds", type=int, default=20)
    parser.add_argument("--max-candidates", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", default="failure-guided,blind,coverage")
    parser.add_argument("--blind-cycles", type=int, default=9,
                        help="cycles a baseline arm (blind, coverage) may use to spend its budget")
    parser.add_argument("--keep", type=Path, help="keep the arms' memory dirs here")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="sepa-evolution-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results = {}
    try:
        for arm in (a.strip() for a in args.arms.split(",")):
            cycles, budget = args.cycles, args.budget
            if arm in BASELINE_ARMS and "failure-guided" in results:  # the same budget: what the guided arm spent
                cycles, budget = args.blind_cycles, results["failure-guided"]["rollouts"]
            print(f"arm {arm}: {cycles} cycles at most, budget {budget} rollouts", flush=True)
            results[arm] = run_arm(arm, args, work, cycles, budget)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, default=str), file=sys.stderr)  # everything, before anything can fail to print
    print_table(results)
    g = results.get("failure-guided")
    if g:
        ok = (g["spearman"] == 1.0, g["spread"] >= SPREAD_TARGET, g["oracle_min"] >= ORACLE_TARGET,
              g["cost_per_model_candidate"] <= COST_TARGET)
        print(f"\ntargets (failure-guided): Spearman 1.0 {'met' if ok[0] else 'MISSED'}, spread >= 30 pp "
              f"{'met' if ok[1] else 'MISSED'}, oracle >= 90% {'met' if ok[2] else 'MISSED'}, cost <= 20 "
              f"{'met' if ok[3] else 'MISSED'}")
    print(f"total wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
