"""Success of the scripted LIBERO models per task, on the base scenarios and one mutation per axis.
Runs in the LIBERO venv (no broker: episodes only, through the same Episode loop the worker uses).

    <libero venv>/bin/python -m producers.libero.bench [--suite libero_object] [--tasks 0,1] [--seeds 10]
        [--models oracle,scripted-expert,scripted-novice,scripted-clumsy] [--axes base,layout,...]
        [--horizon 280] [--json out.json]

Prints one row per (task, model, axis): successes / episodes. Axes: "base" and the keys of
producers.libero.mutations.PROBE (layout, material, distractor, paraphrase, camera, lighting).
A mutated scenario whose env cannot be built (e.g. a distractor that does not fit) is reported
with its error, not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from producers.libero.env import LiberoEnv, libero_package_dir
from producers.libero.mutations import PROBE
from producers.libero.rollout import run_episode
from producers.libero.tasks import TaskCatalog
from producers.libero.worker import load_libero_models


def run(suite: str, task_indexes: list[int], seeds: int, model_ids: list[str], axes: list[str],
        horizon: int | None, log=print) -> list[dict]:
    catalog = TaskCatalog(libero_package_dir())
    models = load_libero_models()
    names = catalog.tasks(suite)
    rows = []
    for ti in task_indexes:
        base = catalog.base_scenario(suite, names[ti], horizon)
        for axis in axes:
            spec = base if axis == "base" else PROBE[axis](base)
            t0 = time.monotonic()
            try:
                env = LiberoEnv(spec, catalog)
            except Exception as exc:
                rows.append({"task": names[ti], "index": ti, "axis": axis, "scenario_id": spec.scenario_id,
                             "error": repr(exc)})
                log(f"{ti:2d} {names[ti][:44]:44s} {axis:10s} env error: {exc!r}")
                continue
            try:
                for model_id in model_ids:
                    model = models[model_id]
                    outcomes = [run_episode(env, model.make_policy(), seed)[0] for seed in range(seeds)]
                    ok = sum(o.success for o in outcomes)
                    rows.append({"task": names[ti], "index": ti, "axis": axis, "scenario_id": spec.scenario_id,
                                 "model": model_id, "successes": ok, "episodes": seeds,
                                 "terminations": [o.termination for o in outcomes]})
                    log(f"{ti:2d} {names[ti][:44]:44s} {axis:10s} {model_id:16s} {ok:3d}/{seeds}")
            finally:
                env.close()
            log(f"   ({time.monotonic() - t0:.0f} s)")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m producers.libero.bench")
    parser.add_argument("--suite", default="libero_object")
    parser.add_argument("--tasks", default=None, help="comma-separated task indexes (default: all)")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--models", default="oracle,scripted-expert,scripted-novice,scripted-clumsy")
    parser.add_argument("--axes", default="base," + ",".join(PROBE))
    parser.add_argument("--horizon", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    catalog = TaskCatalog(libero_package_dir())
    n = len(catalog.tasks(args.suite))
    tasks = [int(x) for x in args.tasks.split(",")] if args.tasks else list(range(n))
    axes = args.axes.split(",")
    unknown = [a for a in axes if a != "base" and a not in PROBE]
    if unknown:
        print(f"error: unknown axes {unknown}; known: base, {', '.join(PROBE)}", file=sys.stderr)
        return 2
    rows = run(args.suite, tasks, args.seeds, args.models.split(","), axes, args.horizon,
               log=lambda line: print(line, flush=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
