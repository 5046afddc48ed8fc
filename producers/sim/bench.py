"""Measures the simulation core: step rate with and without signal extraction, keyframe
render time, and success rates of the registered models on base Lift and a harder variant.

Usage:
    python -m producers.sim.bench                  # 20 seeds per model and scenario
    python -m producers.sim.bench --seeds 5 --skip-models

Prints one JSON document. Timings are wall clock on this machine; run it on an idle one.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from producers.sim.envs import make_env
from producers.sim.models import load_models
from producers.sim.policies import OracleScripted
from producers.sim.rollout import run_episode
from producers.sim.scenario import ScenarioSpec

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--skip-models", action="store_true")
    args = parser.parse_args()
    report = {"steps": step_rates(), "keyframe": keyframe_ms()}
    if not args.skip_models:
        report["success"] = success_rates(args.seeds)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
