"""Measures the simulation core: step rate with and without signal extraction, keyframe
render time, and success rates of the registered models on base Lift and a harder variant;
with ``--calibrate``, the registered models' success on base Lift and on single-factor variants
of it (the table models.yaml is calibrated by).

Usage:
    python -m producers.sim.bench                  # 20 seeds per model and scenario
    python -m producers.sim.bench --seeds 5 --skip-models
    nice -n 10 python -m producers.sim.bench --calibrate [--base-seeds 40] [--seeds 24] [--processes 2]

Prints one JSON document (``--calibrate``: a table, then the JSON). Timings are wall clock on this
machine; run it on an idle one.
"""

from __future__ import annotations

import argparse
import json
import time
from multiprocessing import Pool

import numpy as np

from producers.sim.envs import make_env
from producers.sim.models import load_models
from producers.sim.policies import OracleScripted
from producers.sim.rollout import run_episode
from schemas.scenario import Distractor, ScenarioSpec

BASE_LIFT = ScenarioSpec(env_name="Lift", horizon=150, instruction="lift the red cube")
# Wide placement and a small, heavier, more slippery cube.
HARD_LIFT = BASE_LIFT.mutate(placement_x_range=(-0.12, 0.12), placement_y_range=(-0.12, 0.12),
                             object_size_scale=0.6, object_mass=0.3, object_friction=0.3)


def step_rates(repeats: int = 3) -> dict:
    """Replays one recorded oracle episode (150 steps), alternating passes without and with
    signals() after every step; also times signals() alone."""
    env = make_env(BASE_LIFT)
    _, steps = run_episode(env, OracleScripted(), 0, stop_on_success=False)
    actions = [np.array(s.action) for s in steps]
    bare, with_signals, signal_s = [], [], []
    for _ in range(repeats):
        env.reset(0)
        t0 = time.perf_counter()
        for a in actions:
            env.step(a)
        bare.append(len(actions) / (time.perf_counter() - t0))
        env.reset(0)
        t0 = time.perf_counter()
        for a in actions:
            env.step(a)
            t1 = time.perf_counter()
            env.signals()
            signal_s.append(time.perf_counter() - t1)
        with_signals.append(len(actions) / (time.perf_counter() - t0))
    t0 = time.perf_counter()
    for seed in range(10):
        env.reset(seed)
    reset_ms = (time.perf_counter() - t0) / 10 * 1000
    env.close()
    return {"bare_steps_per_s": round(float(np.median(bare)), 1),
            "with_signals_steps_per_s": round(float(np.median(with_signals)), 1),
            "signals_ms_mean": round(float(np.mean(signal_s)) * 1000, 3),
            "reset_ms_mean": round(reset_ms, 1)}


def keyframe_ms(n: int = 30, size: int = 128) -> dict:
    env = make_env(BASE_LIFT, keyframes=True)
    env.reset(0)
    t0 = time.perf_counter()
    env.render_keyframe(size)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n):
        env.render_keyframe(size)
    per = (time.perf_counter() - t0) / n
    env.close()
    return {"size": size, "first_ms_incl_context": round(first * 1000, 1), "ms_mean": round(per * 1000, 1)}


def success_rates(seeds: int) -> dict:
    out: dict = {}
    for label, spec in (("base_lift", BASE_LIFT), ("hard_lift", HARD_LIFT)):
        env = make_env(spec)
        out[label] = {"scenario_id": spec.scenario_id}
        for model in load_models():
            t0 = time.perf_counter()
            ok = sum(run_episode(env, model.make_policy(), s)[0].success for s in range(seeds))
            out[label][model.model_id] = {"success": f"{ok}/{seeds}",
                                          "seconds": round(time.perf_counter() - t0, 1)}
        env.close()
    return out


# The base of the loop's benchmark and single-factor variants of it, by (label, factor, changes):
# candidates of each factor the mutation operators produce, at settings that are hard for the
# weaker models (and some that are not, or that are too hard for the oracle).
CALIBRATION_BASE = ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube")
CALIBRATION_VARIANTS: tuple[tuple[str, str, dict], ...] = (
    ("base", "base", {}),
    ("placement far x+0.15..0.2", "placement", dict(placement_x_range=(0.15, 0.2), placement_y_range=(-0.05, 0.05))),
    ("placement far y+0.2..0.25", "placement", dict(placement_x_range=(-0.03, 0.03), placement_y_range=(0.2, 0.25))),
    ("placement out x+0.25..0.3", "placement", dict(placement_x_range=(0.25, 0.3), placement_y_range=(-0.03, 0.03))),
    ("pose offset +0.1,+0.15", "pose", dict(pose_offset_xyz=(0.1, 0.15, 0.0))),
    ("friction 0.025", "friction", dict(object_friction=0.025)),
    ("friction 0.02", "friction", dict(object_friction=0.02)),
    ("mass 6 kg", "mass", dict(object_mass=6.0)),
    ("colour blue", "colour", dict(object_rgba=(0.1, 0.2, 0.9, 1.0))),
    ("size 0.5", "size", dict(object_size_scale=0.5)),
    ("distractor box on path", "distractors", dict(distractors=(Distractor(kind="box", size=0.02, x=-0.065, y=0.0),))),
    ("distractor cylinder near", "distractors",
     dict(distractors=(Distractor(kind="cylinder", size=0.015, x=-0.05, y=-0.03),))),
    ("distractor box 10 cm", "distractors", dict(distractors=(Distractor(kind="box", size=0.02, x=-0.1, y=0.02),))),
    ("hold 100 (h300)", "hold", dict(success_hold_steps=100, horizon=300)),
    ("place +0.1,+0.1", "place", dict(place_target_xy=(0.1, 0.1))),
    ("place +0.15,-0.15", "place", dict(place_target_xy=(0.15, -0.15))),
    ("horizon 70", "time_budget", dict(horizon=70)),
    ("horizon 60", "time_budget", dict(horizon=60)),
)

_pool_envs: dict = {}


def _calibration_task(task: tuple[dict, str, list[int]]) -> list[tuple[bool, int]]:
    spec_dict, model_id, seeds = task
    spec = ScenarioSpec.from_dict(spec_dict)
    env = _pool_envs.get(spec.scenario_id)
    if env is None:
        env = _pool_envs[spec.scenario_id] = make_env(spec)
    model = next(m for m in load_models() if m.model_id == model_id)
    out = []
    for seed in seeds:
        outcome, _ = run_episode(env, model.make_policy(), seed)
        out.append((outcome.success, outcome.steps))
    return out


def calibration(base_seeds: int = 40, seeds: int = 24, processes: int = 2) -> dict:
    """Success of every registered model on each CALIBRATION_VARIANTS scenario: base_seeds seeds
    on the base, ``seeds`` on each variant (seeds 0..n-1, as a sweep runs them)."""
    models = [m.model_id for m in sorted(load_models(), key=lambda m: (m.rank is None, m.rank or 0))]
    specs = [(label, factor, CALIBRATION_BASE.mutate(**changes) if changes else CALIBRATION_BASE)
             for label, factor, changes in CALIBRATION_VARIANTS]
    tasks, keys = [], []
    for label, _, spec in specs:
        n = base_seeds if label == "base" else seeds
        for model_id in models:
            for part in range(processes):
                tasks.append((spec.to_dict(), model_id, list(range(part, n, processes))))
                keys.append((label, model_id))
    t0 = time.perf_counter()
    with Pool(processes) as pool:
        results = pool.map(_calibration_task, tasks, chunksize=1)
    wall = time.perf_counter() - t0
    rows: dict = {}
    for (label, model_id), res in zip(keys, results, strict=True):
        rows.setdefault(label, {}).setdefault(model_id, []).extend(res)
    from producers.sim.feasibility import check_feasibility

    table = []
    for label, factor, spec in specs:
        feasibility = check_feasibility(spec)
        cells = {}
        for model_id in models:
            res = rows[label][model_id]
            ok = sum(1 for s, _ in res if s)
            cells[model_id] = {"success": ok, "n": len(res), "rate": round(ok / len(res), 3),
                               "median_steps_success": int(np.median([n for s, n in res if s])) if ok else None}
        table.append({"variant": label, "factor": factor, "scenario_id": spec.scenario_id, "models": cells,
                      "feasible": feasibility.feasible, "infeasible_reason": feasibility.reason,
                      "feasibility_s": feasibility.cost_s})
    episodes = sum(len(t[2]) for t in tasks)
    return {"models_best_first": models, "table": table, "episodes": episodes, "wall_s": round(wall, 1),
            "processes": processes}


def print_calibration(report: dict) -> None:
    models = report["models_best_first"]
    print("variant".ljust(28) + "factor".ljust(13) + "".join(m.removeprefix("scripted-")[:9].rjust(10) for m in models)
          + "  feasible")
    for row in report["table"]:
        cells = "".join(f"{c['success']}/{c['n']}".rjust(10) for c in (row["models"][m] for m in models))
        print(row["variant"].ljust(28) + row["factor"].ljust(13) + cells + ("  yes" if row["feasible"] else "  NO"))
    print(f"{report['episodes']} episodes in {report['wall_s']} s on {report['processes']} processes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--calibrate", action="store_true", help="only the model x variant success table")
    parser.add_argument("--base-seeds", type=int, default=40)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    if args.calibrate:
        report = calibration(args.base_seeds, args.seeds, args.processes)
        print_calibration(report)
        print(json.dumps(report, indent=2))
        return
    report = {"steps": step_rates(), "keyframe": keyframe_ms()}
    if not args.skip_models:
        report["success"] = success_rates(args.seeds)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
