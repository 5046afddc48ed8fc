"""Is the evolved benchmark a better measuring instrument, or only a harder one? Each version of
the benchmark the loop built, against model families it never saw and a broad reference suite.

Per arm (bench/evolution.py's run_arm: the whole product on the embedded default, the loop with
the models of models.yaml), after the loop, on held-out seeds (producers/seeds.py) that chose
nothing:

- the models: the four ranked models of models.yaml (the loop ran with them: "tuned on") and three
  families it never saw (bench/evolution.py UNSEEN_FAMILIES: each member at least as bad as the
  one before in every skill component, so each family has a true order);
- the reference suite: every factor of the coverage grid (streams/mutations/coverage.py) at
  magnitudes of its own, between the grid's (REFERENCE), kept where the oracle solves >= 90%
  of its seeds; it is measured once, in the first arm, and its scores serve every arm;
- for the base and for every benchmark version the arm made (each distinct set of active
  scenarios): per family, Spearman of its success against the family's true order and its spread;
  over all models, the Spearman of the version's ranking with the reference suite's; the spread
  of all models (best - worst) per rollout spent on one model (scenarios x seeds).

Goal (issue 17): the final version agrees with the reference suite at least as well as every
version before it and at least 0.9, and spreads the models more per rollout than the suite.

Usage:
    python bench/validity.py [--arms failure-guided,coverage] [--seeds 10] [--cycles 3]
                             [--budget 1500] [--sweep-seeds 20] [--max-candidates 4] [--seed 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.evolution import BASELINE_ARMS, run_arm, unseen_models  # noqa: E402
from consumers import state as q  # noqa: E402
from consumers.statistics import spearman  # noqa: E402
from infra import orchestrator, waits  # noqa: E402
from producers.seeds import held_out_seeds  # noqa: E402
from producers.sim.models import load_models, skill_order  # noqa: E402
from schemas.scenario import ScenarioSpec  # noqa: E402
from streams.mutations.coverage import fixed_variant  # noqa: E402

# factor -> magnitudes of the reference suite: every factor, milder and harsher, none a grid point
# of the coverage arm (colour and instruction have too few values; no model here feels them)
REFERENCE: dict[str, tuple[float, ...]] = {
    "placement": (0.13, 0.19), "pose": (0.08, 0.12), "friction": (0.1, 0.035), "mass": (2.5, 5.0),
    "distractors": (0.085, 0.065), "hold": (60, 100), "place": (0.12, 0.18), "time_budget": (0.5, 0.4),
    "colour": (2,), "instruction": (2,),
}
ORACLE_SOLVABLE = 0.9
AGREEMENT_TARGET = 0.9
WAIT_S = 3600.0
MEASURE_SEEDS = orchestrator.EvolveConfig(run_id="-").measure_seeds  # what run_arm's loop measured each version on


def reference_suite(base: dict) -> list[dict]:
    spec = ScenarioSpec.from_dict(base)
    return [fixed_variant(spec, f, m).to_dict() for f, ms in REFERENCE.items() for m in ms]


def families() -> dict[str, list[str]]:
    """family -> its model ids, best first; "models.yaml" is the family the loop ran with."""
    models = load_models()
    oracle = next(m.model_id for m in models if m.kind == "oracle")
    out = {"models.yaml": [m for m in skill_order(models) if m != oracle]}
    out.update({f: [m.model_id for m in ms] for f, ms in unseen_models().items()})
    return out


def success_rates(store, model_ids: list[str], scenario_ids: list[str], seeds: list[int]) -> dict[str, float]:
    """model -> success over its valid trials on these scenarios and seeds (the same count each)."""
    wanted = set(seeds)
    won: dict[str, list[int]] = {m: [0, 0] for m in model_ids}
    for t in q.trials(store, model_ids=model_ids, scenario_ids=scenario_ids, seeds=q.HELD_OUT):
        if t.valid and t.seed in wanted:
            won[t.model_id][0] += t.success
            won[t.model_id][1] += 1
    return {m: k / n if n else float("nan") for m, (k, n) in won.items()}


def instrument(rates: dict[str, float], fams: dict[str, list[str]], suite: dict[str, float] | None,
               rollouts_per_model: int) -> dict:
    """What a set of scenarios says of the models: per family Spearman vs true order and spread;
    vs the suite over all models and over the unseen ones; spread of all per rollout."""
    out: dict = {"families": {}, "rollouts_per_model": rollouts_per_model}
    for fam, ids in fams.items():
        r = [rates[m] for m in ids]
        out["families"][fam] = {"rates": r, "spearman": spearman([-i for i in range(len(ids))], r),
                                "spread": max(r) - min(r)}
    everyone = [m for ids in fams.values() for m in ids]
    unseen = [m for fam, ids in fams.items() if fam != "models.yaml" for m in ids]
    spread = max(rates[m] for m in everyone) - min(rates[m] for m in everyone)
    out["spread_all"] = spread
    out["spread_per_rollout"] = spread / rollouts_per_model if rollouts_per_model else float("nan")
    if suite is not None:
        out["vs_suite"] = spearman([suite[m] for m in everyone], [rates[m] for m in everyone])
        out["vs_suite_unseen"] = spearman([suite[m] for m in unseen], [rates[m] for m in unseen])
    return out


def measure_validity(store, publisher, base: dict, settings, n_seeds: int, reference: dict | None) -> dict:
    """The validity figures of one arm's log; ``reference``: the suite measured by an earlier arm."""
    models = load_models()
    ranked = [m for m in models if m.kind != "oracle"]
    oracle = [m for m in models if m.kind == "oracle"]
    unseen = [m for ms in unseen_models().values() for m in ms]
    fams = families()
    everyone_ids = [m for ids in fams.values() for m in ids]
    seeds = held_out_seeds(n_seeds)
    check = waits.still_running(settings)
    versions, seen = [], set()
    for v in q.benchmark_versions(store):
        key = tuple(sorted(v.scenario_ids))
        if key and key not in seen:
            seen.add(key)
            versions.append((v.version, key, sorted({a.factor for a in v.scenarios})))
    specs = {a.scenario_id: dict(a.spec) for v in q.benchmark_versions(store) for a in v.scenarios}
    scenario_ids = sorted({s for _, key, _ in versions for s in key})
    # The loop measured the ranked models and the oracle on MEASURE_SEEDS held-out seeds of every
    # version (the same requests again: nothing runs); the unseen families are new.
    requests = orchestrator.request_sweeps(publisher, store, [specs[s] for s in scenario_ids], ranked + oracle,
                                           held_out_seeds(MEASURE_SEEDS))
    requests += orchestrator.request_sweeps(publisher, store, [specs[s] for s in scenario_ids], unseen, seeds)
    if reference is None:
        suite = reference_suite(base)
        requests += orchestrator.request_sweeps(publisher, store, suite, models + unseen, seeds)
    t0 = time.monotonic()
    waits.wait_for_episodes(store, requests, waits.deadline_in(WAIT_S), check=check)
    print(f"  validity sweeps: {len(requests)} requests in {time.monotonic() - t0:.0f} s", flush=True)
    if reference is None:
        kept, dropped = [], {}
        for spec in suite:
            o = success_rates(store, [m.model_id for m in oracle], [spec["scenario_id"]], seeds)[oracle[0].model_id]
            if o >= ORACLE_SOLVABLE:
                kept.append(spec)
            else:
                dropped[spec["scenario_id"]] = o
        rates = success_rates(store, everyone_ids, [s["scenario_id"] for s in kept], seeds)
        reference = {"rates": rates, "scenarios": len(kept), "dropped_oracle": dropped,
                     **instrument(rates, fams, None, len(kept) * n_seeds)}
    out = {"reference": reference, "versions": []}
    for version, key, factors in versions:
        rates = success_rates(store, everyone_ids, list(key), seeds)
        out["versions"].append({"version": version, "scenarios": len(key), "factors": factors,
                                **instrument(rates, fams, reference["rates"], len(key) * n_seeds)})
    return {"validity": out}


def _f(v, fmt="{:.2f}") -> str:
    return "-" if v is None or (isinstance(v, float) and v != v) else fmt.format(v)


def print_arm(arm: str, validity: dict) -> None:
    ref = validity["reference"]
    fams = list(ref["families"])
    head = (f"{'':<24}{'scen':>5}" + "".join(f"{('rho ' + f)[:14]:>15}" for f in fams)
            + f"{'rho suite':>11}{'(unseen)':>10}{'spread':>8}{'roll/model':>11}{'pp/roll':>9}")
    print(f"\n{arm}: held-out seeds; rho = Spearman (vs each family's true order; vs the reference suite "
          "over all models and over the unseen ones)")
    print(head)
    rows = [(f"v{v['version']} ({', '.join(v['factors'])})"[:23], v) for v in validity["versions"]]
    rows.append(("reference suite", ref))
    for label, r in rows:
        cells = "".join(f"{_f(r['families'][f]['spearman']) + ' / ' + _f(r['families'][f]['spread'], '{:.0%}'):>15}"
                        for f in fams)
        print(f"{label:<24}{r.get('scenarios', 0):>5}{cells}{_f(r.get('vs_suite')):>11}"
              f"{_f(r.get('vs_suite_unseen')):>10}{_f(r['spread_all'], '{:.0%}'):>8}{r['rollouts_per_model']:>11}"
              f"{100 * r['spread_per_rollout']:>9.2f}")
    if ref["dropped_oracle"]:
        print(f"  suite scenarios dropped (oracle < {ORACLE_SOLVABLE:.0%}): {ref['dropped_oracle']}")
    final, earlier = validity["versions"][-1], validity["versions"][:-1]
    agree = final.get("vs_suite")
    best_before = max((v["vs_suite"] for v in earlier if v.get("vs_suite") is not None), default=None)
    ok = (agree is not None and agree >= AGREEMENT_TARGET, agree is not None and (best_before is None
                                                                                   or agree >= best_before),
          final["spread_per_rollout"] > ref["spread_per_rollout"])
    print(f"  goal: final v{final['version']} agrees with the suite >= {AGREEMENT_TARGET} "
          f"{'met' if ok[0] else 'MISSED'}; >= every earlier version ({_f(best_before)}) "
          f"{'met' if ok[1] else 'MISSED'}; more spread per rollout than the suite {'met' if ok[2] else 'MISSED'}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default="failure-guided,coverage")
    parser.add_argument("--seeds", type=int, default=10, help="held-out seeds per model x scenario measured")
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--budget", type=int, default=1500)
    parser.add_argument("--blind-cycles", type=int, default=9)
    parser.add_argument("--sweep-seeds", type=int, default=20)
    parser.add_argument("--max-candidates", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="keep the arms' memory dirs here")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="sepa-validity-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    results: dict[str, dict] = {}
    reference = None
    try:
        for arm in (a.strip() for a in args.arms.split(",")):
            cycles, budget = args.cycles, args.budget
            if arm in BASELINE_ARMS and "failure-guided" in results:
                cycles, budget = args.blind_cycles, results["failure-guided"]["rollouts"]
            print(f"arm {arm}: {cycles} cycles at most, budget {budget} rollouts", flush=True)

            def after(store, publisher, base, settings, reference=reference):
                return measure_validity(store, publisher, base, settings, args.seeds, reference)
            results[arm] = run_arm(arm, args, work, cycles, budget, after=after)
            reference = results[arm]["validity"]["reference"]
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results, default=str), file=sys.stderr)
    for arm, r in results.items():
        print(f"\n{arm}: {r['rollouts']} loop rollouts, {r['promoted']} promoted ({', '.join(r['promoted_factors'])}), "
              f"v{r['version']}, {r['seconds']:.0f} s")
        print_arm(arm, r["validity"])
    print(f"total wall time {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
