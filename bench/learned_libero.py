"""Policies that see and read, on LIBERO: a multi-task family trained on our own export of oracle
demonstrations of libero_object (ten tasks; the instruction alone says which object to pick), served
by `up` as a user's VLA is, and measured on seeds that chose nothing.

1. The product up on a memory dir (the LIBERO worker too) and oracle demonstrations with two
   cameras on every task of the suite: one RolloutRequested per task with ``cameras`` set, as
   `sepa-eval rollout --benchmark libero --cameras ...` asks. Exported for LeRobot (successes).
2. One policy per budget (demonstrations x steps), trained from one seed with the instruction as an
   input (producers.learned.train; a budget's demonstrations are taken in turn from every task).
3. The product up again with the family registered (websocket models whose servers `up` starts),
   and every learned policy and the oracle swept on held-out seeds (producers/seeds.py) of the
   suite's tasks and of one variant per probe axis (producers/libero/mutations.py's PROBE):
   camera, lighting and paraphrase are what no pose-reading model feels.

With --evolved DIR (the memory dir of a finished `sepa-eval run --benchmark libero` whose models
file, SEPA_MODELS_FILE, was this bench's models-with-learned.yaml), the family is measured in that
dir on held-out seeds of the run's base tasks, of the benchmark the run left (every active
scenario) and of a reference suite (the probe variants of every base task, one per axis of
--probes; nothing in it came from the loop): it prints the promoted factors, the oracle on every
promoted scenario, and the Spearman of the base's and the evolved benchmark's ranking of the family
with the suite's.

Demonstrations start from LIBERO's init states 0..demos-1 of each task; the held-out seeds start
from init states 25 on (producers/seeds.py), which no demonstration saw when --demos <= 25.

Prints per policy its budget and training time and, per scenario set, its success with 95% Wilson
intervals; then the Spearman of the family's base rates with the budget order.

Usage:
    python bench/learned_libero.py [--demos 5] [--budgets 10x500,30x1500,50x3000] [--seeds 2]
                                   [--probes camera,lighting,paraphrase,layout] [--size 64] [--seed 0]
                                   [--keep DIR]
    python bench/learned_libero.py --keep DIR --evolved LOOP_DIR [--seeds 2] [--probes ...]

With --keep DIR, a second run reuses what the first left there: its demonstrations and the
policies already trained.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.evolution import stack  # noqa: E402
from bench.learned import CAMERAS, rate, train, venv_and_work  # noqa: E402
from bench.learned_loop import models_with_family  # noqa: E402
from bench.validity import success_rates  # noqa: E402
from consumers import state as q  # noqa: E402
from consumers.exports.lerobot import export_lerobot  # noqa: E402
from consumers.exports.output import ExportFilters  # noqa: E402
from consumers.statistics import spearman  # noqa: E402
from infra import orchestrator, waits  # noqa: E402
from infra.cli.loop import libero_base  # noqa: E402
from producers.libero.mutations import PROBE  # noqa: E402
from producers.seeds import held_out_seeds, selection_seeds  # noqa: E402
from producers.sim.models import DEFAULT_MODELS_PATH, load_models  # noqa: E402
from schemas.libero_scenario import LiberoScenario  # noqa: E402

WAIT_S = 7200.0
SUITE = "libero_object"
MODELS_FILE = "models-with-learned.yaml"


def record_demos(work: Path, n: int, size: int) -> Path:
    """n oracle demonstrations per task through the product, exported for LeRobot."""
    with stack(work / "memory", DEFAULT_MODELS_PATH) as (store, publisher, settings):
        t0 = time.monotonic()
        requests = [r for scenario in libero_base(SUITE, None)
                    for r in orchestrator.request_rollouts(publisher, store, scenario, ["oracle"], selection_seeds(n),
                                                           run_id="demos", cameras=CAMERAS, camera_size=size)]
        waits.wait_for_episodes(store, requests, waits.deadline_in(WAIT_S),
                                check=waits.still_running(settings, libero=True),
                                requests_topic=waits.requests_topic(settings.topic_prefix))
        demos = work / "demos"
        shutil.rmtree(demos, ignore_errors=True)
        summary = export_lerobot(store, demos, settings.memory_dir / "keyframes",
                                 ExportFilters(outcome="success", model_id="oracle"))
    print(f"demonstrations: {summary.episodes} oracle successes of {n * len(requests)} ({len(requests)} tasks), "
          f"{summary.frames} frames in {time.monotonic() - t0:.0f} s -> {demos}", flush=True)
    return demos


def probe_sets(base: list[dict], probes: list[str]) -> dict[str, list[dict]]:
    """"base" and one variant of every task per probe axis."""
    sets = {"base": base}
    for axis in probes:
        sets[axis] = [PROBE[axis](LiberoScenario.from_dict(s)).to_dict() for s in base]
    return sets


def measure(memory: Path, models_path: Path, names: list[str], probes: list[str], n_seeds: int,
            evolved: bool = False) -> dict:
    """The family and the oracle on held-out seeds of every set: the suite's tasks ("base") and
    their probe variants; with ``evolved``, the base is the loop's in ``memory`` and the benchmark it
    left is a set too ("evolved")."""
    seeds = held_out_seeds(n_seeds)
    with stack(memory, models_path) as (store, publisher, settings):
        models = [m for m in load_models(models_path) if m.model_id in names or m.kind == "oracle"]
        orchestrator.register_models(publisher, models)
        loop = {}
        if evolved:
            base = [dict(c.scenario) for c in q.candidates(store, generator="base")]
            benchmark = q.active_benchmark(store)
            sets = {**probe_sets(base, probes), "evolved": [dict(a.spec) for a in benchmark.scenarios]}
            promoted = [a for a in benchmark.scenarios if a.factor != "base"]
            loop = {"version": benchmark.version, "factors": sorted({a.factor for a in promoted}),
                    "promoted": [(a.scenario_id, a.factor) for a in promoted]}
        else:
            sets = probe_sets(list(libero_base(SUITE, None)), probes)
        unique = {s["scenario_id"]: s for ss in sets.values() for s in ss}
        t0 = time.monotonic()
        requests = orchestrator.request_sweeps(publisher, store, list(unique.values()), models, seeds)
        waits.wait_for_episodes(store, requests, waits.deadline_in(WAIT_S),
                                check=waits.still_running(settings, libero=True),
                                requests_topic=waits.requests_topic(settings.topic_prefix))
        print(f"measurement: {len(requests)} requests in {time.monotonic() - t0:.0f} s", flush=True)
        everyone = [*names, "oracle"]
        rates = {label: success_rates(store, everyone, [s["scenario_id"] for s in ss], seeds)
                 for label, ss in sets.items()}
        if evolved:
            suite = [s["scenario_id"] for axis in probes for s in sets[axis]]
            rates["suite"] = success_rates(store, everyone, suite, seeds)
            loop["oracle_promoted"] = {sid: success_rates(store, ["oracle"], [sid], seeds)["oracle"]
                                       for sid, _ in loop["promoted"]}
        return {"seeds": len(seeds), "tasks": len(sets["base"]), "sizes": {k: len(v) for k, v in sets.items()},
                "rates": rates, "loop": loop}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demos", type=int, default=5, help="oracle demonstrations per task")
    parser.add_argument("--budgets", default="10x500,30x1500,50x3000", help="demonstrations x steps, ...")
    parser.add_argument("--seeds", type=int, default=2, help="held-out seeds per model x task x scenario")
    parser.add_argument("--probes", default="camera,lighting,paraphrase,layout",
                        help=f"probe axes besides the base, of {', '.join(PROBE)}")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path)
    parser.add_argument("--evolved", type=Path, metavar="LOOP_DIR",
                        help="measure the family in the memory dir of a finished `run --benchmark libero`")
    args = parser.parse_args(argv)
    probes = [p.strip() for p in args.probes.split(",") if p.strip()]
    unknown = [p for p in probes if p not in PROBE]
    if unknown:
        parser.error(f"--probes: unknown axis {unknown}; the axes: {', '.join(PROBE)}")
    if args.evolved is not None and not (args.evolved / "evidence").is_dir():
        parser.error(f"--evolved: {args.evolved} is not the memory dir of a run (it has no evidence/)")
    venv, work = venv_and_work(args.keep, "sepa-learned-libero-")
    if venv is None:
        return 2
    t0 = time.monotonic()
    try:
        demos = work / "demos" if (work / "demos" / "meta" / "info.json").exists() else None
        demos = demos or record_demos(work, args.demos, args.size)
        family, trained = {}, {}
        for b in args.budgets.split(","):
            episodes, steps = (int(x) for x in b.split("x"))
            name = f"pixel-bc-libero-{episodes}x{steps}"
            record = work / name / "policy.json"  # a kept dir's policy of this seed is not trained again
            kept = json.loads(record.read_text())["training"] if record.exists() else None
            trained[name] = (kept if kept and kept["seed"] == args.seed
                             else train(venv, demos, work / name, episodes, steps, args.seed, words=True))
            family[name] = work / name
            print(f"{name}: trained in {trained[name]['wall_s']:.0f} s on {trained[name]['episodes']} "
                  f"demonstrations (loss {trained[name]['final_loss']:.3f})", flush=True)
        models_path = work / MODELS_FILE
        if args.evolved is None:
            models_with_family(models_path, family, args.size)
        elif not models_path.exists():
            parser.error(f"--evolved: {work} holds no {MODELS_FILE}, the models file the loop ran with")
        result = measure(args.evolved or work / "memory", models_path, list(family), probes, args.seeds,
                         evolved=args.evolved is not None)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    report(result, trained, probes, time.monotonic() - t0)
    return 0


def report(result: dict, trained: dict, probes: list[str], seconds: float) -> None:
    sizes, loop = result["sizes"], result["loop"]
    print(f"\n{SUITE}: {result['tasks']} tasks; {result['seeds']} held-out seeds per policy and scenario")
    labels = ["base", *probes, *(["evolved", "suite"] if loop else [])]
    sizes = {**sizes, "suite": sum(sizes[p] for p in probes)}
    print(f"{'policy':28s} {'train s':>8s}  " + "  ".join(f"{label:18s}" for label in labels))
    for name in [*trained, "oracle"]:
        wall = f"{trained[name]['wall_s']:.0f}" if name in trained else "-"
        cells = [rate(round(result["rates"][label][name] * result["seeds"] * sizes[label]),
                      result["seeds"] * sizes[label]) for label in labels]
        print(f"{name:28s} {wall:>8s}  " + "  ".join(f"{c:18s}" for c in cells))
    names = list(trained)

    def rho(a: str, b: list[float]) -> str:
        r = spearman([result["rates"][a][m] for m in names], b)
        return "- (tied)" if r is None else f"{r:.2f}"
    print(f"base: Spearman of the family's rates with the budget order {rho('base', list(range(len(names))))}")
    if loop:
        suite = [result["rates"]["suite"][m] for m in names]
        print(f"the loop's benchmark v{loop['version']}: promoted {len(loop['promoted'])} over factors "
              f"{', '.join(loop['factors']) or 'none'}; oracle on each, held-out: "
              + ", ".join(f"{factor} {loop['oracle_promoted'][sid]:.2f}" for sid, factor in loop["promoted"]))
        print(f"Spearman with the suite's ranking of the family: base {rho('base', suite)}, "
              f"evolved {rho('evolved', suite)}")
    print(f"total wall time {seconds:.0f} s")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
