"""The loop on policies that see: learned pixel policies registered beside the scripted models,
served by `up`, swept, clustered, mutated, validated and promoted on, as a user's VLAs would be.

1. Oracle demonstrations on Lift with two cameras, exported for LeRobot, and a family of policies
   trained on them, graded by budget (bench/learned.py's record_demos and train).
2. A models file: models.yaml's models plus the family, each a websocket model with its policy
   directory and a uri on 127.0.0.1, so `up` starts its server (infra/policy_servers.py).
3. The loop (bench/evolution.py's run_arm: the whole product on the embedded default), failure
   guided, with every model registered.
4. On held-out seeds that chose nothing: each learned policy and the oracle on the base, on the
   evolved benchmark and on a broad reference suite (bench/validity.py's: every factor at
   magnitudes of its own, kept where the oracle solves >= 90%); the promoted factors; the Spearman
   of the evolved benchmark's ranking of the family with the suite's, and with the budget order.

Usage:
    python bench/learned_loop.py [--demos 30] [--budgets 5x100,10x300,30x1500] [--cycles 2]
                                 [--budget 2500] [--sweep-seeds 10] [--seeds 10] [--size 64] [--seed 0]
                                 [--keep DIR]
    python bench/learned_loop.py --measure DIR [--seeds 10]    # a kept run's family measured again
"""

from __future__ import annotations

import argparse
import shutil
import socket
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.evolution import base_scenario, run_arm, stack  # noqa: E402
from bench.learned import CAMERAS, LAYOUT, record_demos, train, venv_and_work  # noqa: E402
from bench.validity import ORACLE_SOLVABLE, reference_suite, success_rates  # noqa: E402
from consumers import state as q  # noqa: E402
from consumers.statistics import spearman  # noqa: E402
from infra import orchestrator, waits  # noqa: E402
from producers.seeds import held_out_seeds  # noqa: E402
from producers.sim.models import DEFAULT_MODELS_PATH, load_models  # noqa: E402

WAIT_S = 3600.0
ARM = "failure-guided"
MODELS_FILE = "models-with-learned.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def models_with_family(path: Path, family: dict[str, Path], size: int) -> Path:
    """models.yaml plus each learned policy as a websocket model `up` serves."""
    doc = yaml.safe_load(DEFAULT_MODELS_PATH.read_text())
    layout = {k: list(v) for k, v in LAYOUT.items()}
    for name, policy in family.items():
        doc["models"].append({"model_id": name, "version": "1", "kind": "websocket",
                              "description": f"learned pixel policy {name} (bench/)", "uri": f"ws://127.0.0.1:{free_port()}",
                              "action_dim": 7, "cameras": list(CAMERAS), "camera_size": size,
                              "policy": str(policy), "observation": layout})
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def measure_family(names: list[str], n_seeds: int):
    """run_arm's ``after``: the family and the oracle on held-out seeds of the base, the evolved
    benchmark and the reference suite."""
    def after(store, publisher, base: dict, settings) -> dict:
        models = [m for m in load_models(settings.models_file) if m.model_id in names
                  or m.kind == "oracle"]
        oracle = next(m.model_id for m in models if m.kind == "oracle")
        benchmark = q.active_benchmark(store)
        evolved = [dict(a.spec) for a in benchmark.scenarios]
        suite = reference_suite(base)
        seeds = held_out_seeds(n_seeds)
        t0 = time.monotonic()
        requests = orchestrator.request_sweeps(publisher, store, [base, *evolved, *suite], models, seeds)
        waits.wait_for_episodes(store, requests, waits.deadline_in(WAIT_S), check=waits.still_running(settings),
                                requests_topic=waits.requests_topic(settings.topic_prefix))
        print(f"  measurement sweeps: {len(requests)} requests in {time.monotonic() - t0:.0f} s", flush=True)
        kept = [s["scenario_id"] for s in suite
                if success_rates(store, [oracle], [s["scenario_id"]], seeds)[oracle] >= ORACLE_SOLVABLE]
        everyone = [*names, oracle]
        return {"family": {
            "names": names, "seeds": len(seeds), "suite_kept": len(kept), "suite": len(suite),
            "base": success_rates(store, everyone, [base["scenario_id"]], seeds),
            "evolved": success_rates(store, everyone, [s["scenario_id"] for s in evolved], seeds),
            "reference": success_rates(store, everyone, kept, seeds),
            "factors": sorted({a.factor for a in benchmark.scenarios}),
            "oracle_promoted": {a.scenario_id: success_rates(store, [oracle], [a.scenario_id], seeds)[oracle]
                                for a in benchmark.scenarios if a.factor != "base"}}}
    return after


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demos", type=int, default=30)
    parser.add_argument("--budgets", default="5x100,10x300,30x1500", help="demonstrations x steps, ...")
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--budget", type=int, default=2500, help="rollouts the loop may spend before a new cycle")
    parser.add_argument("--sweep-seeds", type=int, default=10)
    parser.add_argument("--max-candidates", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=10, help="held-out seeds per model x scenario measured")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path)
    parser.add_argument("--measure", type=Path, metavar="DIR",
                        help="a work dir kept by --keep: measure its family on its log again (no training, no loop)")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    if args.measure is not None:
        report(measure_kept(args.measure, args.seeds), t0)
        return 0
    venv, work = venv_and_work(args.keep, "sepa-learned-loop-")
    if venv is None:
        return 2
    try:
        demos = record_demos(work, args.demos, args.size)
        family: dict[str, Path] = {}
        for b in args.budgets.split(","):
            episodes, steps = (int(x) for x in b.split("x"))
            name = f"pixel-bc-{episodes}x{steps}"
            training = train(venv, demos, work / name, episodes, steps, args.seed)
            family[name] = work / name
            print(f"{name}: trained in {training['wall_s']:.0f} s (loss {training['final_loss']:.3f})", flush=True)
        models_path = models_with_family(work / MODELS_FILE, family, args.size)
        result = run_arm(ARM, args, work, args.cycles, args.budget,
                         after=measure_family(list(family), args.seeds), models_path=models_path)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    report(result, t0)
    return 0


def measure_kept(work: Path, n_seeds: int) -> dict:
    """The family of a kept run (its models file, in budget order) measured again on its log: the
    benchmark as the loop left it (a run stopped early: as far as it got)."""
    models_path = work / MODELS_FILE
    if not models_path.exists():
        raise SystemExit(f"{work} is not a work dir kept by --keep: it has no {MODELS_FILE}")
    names = [m.model_id for m in load_models(models_path) if m.policy is not None]
    with stack(work / ARM, models_path) as (store, publisher, settings):
        return {**measure_family(names, n_seeds)(store, publisher, base_scenario(), settings),
                "scores": "not measured again (--measure)"}


def report(result: dict, t0: float) -> None:
    f = result["family"]
    print(f"\nheld-out seeds: {f['seeds']} per model x scenario; reference suite {f['suite_kept']} of {f['suite']} "
          f"scenarios (oracle >= {ORACLE_SOLVABLE:.0%}); evolved benchmark factors: {', '.join(f['factors'])}")
    print(f"oracle on each promoted scenario: {f['oracle_promoted']}")
    print(f"{'policy':24s} {'base':>6s} {'evolved':>8s} {'suite':>6s}")
    for name in [*f["names"], "oracle"]:
        print(f"{name:24s} {f['base'][name]:>6.2f} {f['evolved'][name]:>8.2f} {f['reference'][name]:>6.2f}")
    names = f["names"]
    budget_order = list(range(len(names)))  # --budgets is given smallest first
    for label in ("base", "evolved"):
        rates = [f[label][n] for n in names]
        print(f"{label}: Spearman with the suite's ranking of the family "
              f"{_rho(rates, [f['reference'][n] for n in names])}, with the budget order {_rho(rates, budget_order)}, "
              f"spread {max(rates) - min(rates):.0%}")
    print(f"scripted models, held-out, on the evolved benchmark: {result['scores']}")
    print(f"total wall time {time.monotonic() - t0:.0f} s")


def _rho(a: list[float], b: list[float]) -> str:
    rho = spearman(a, b)
    return "- (tied)" if rho is None else f"{rho:.2f}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
