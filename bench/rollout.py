"""Rollout benchmark: what instrumentation costs, and how many published steps/s two workers make.

Prints, from one run (Lift, oracle policy, embedded Tansu broker):
  1. per-step time of the bare loop (policy + env.step + the signals the scripted policy reads),
     and of the same loop instrumented (Step event built + Avro-encoded + published), side by
     side on the same seeds; the overhead ratio;
  2. the cost of signals() alone (a VLA policy would not need it: then it is instrumentation too);
  3. env steps/s of published step events with a pool of N worker processes, no keyframes;
  4. keyframe cost (128x128 offscreen render + PNG + store) per frame.

Usage:
    python bench/rollout.py [--episodes 6] [--processes 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from infra.embedded_broker import TansuBroker  # noqa: E402
from infra.kafka_clients import ensure_topics, make_producer  # noqa: E402
from producers.keyframes import KeyframeStore  # noqa: E402
from producers.publisher import Publisher  # noqa: E402
from producers.recorder import EpisodeIdentity, EpisodeRecorder  # noqa: E402
from producers.rollout_worker import RolloutPool, rollout_request  # noqa: E402
from producers.sim.envs import make_env  # noqa: E402
from producers.sim.policies import make_policy  # noqa: E402
from producers.sim.scenario import ScenarioSpec  # noqa: E402

HORIZON = 150


def loop(env, seed: int, recorder: EpisodeRecorder | None) -> tuple[int, float]:
    policy = make_policy("oracle")
    obs = env.reset(seed)
    signals = env.signals()
    policy.reset(seed, env.spec)
    start = time.perf_counter()
    for _ in range(HORIZON):
        action = np.asarray(policy.act(obs, signals), dtype=float)
        obs, reward, _, info = env.step(action)
        signals = env.signals()
        if recorder is not None:
            recorder.step(action, signals, reward, info["success"])
    return HORIZON, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=6)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    spec = ScenarioSpec(env_name="Lift", horizon=HORIZON, instruction="lift the cube")
    with tempfile.TemporaryDirectory(prefix="sepa-bench-") as tmp, TansuBroker(Path(tmp) / "b.log") as broker:
        bootstrap, prefix = broker.bootstrap_servers, "bench."
        ensure_topics(bootstrap, prefix)
        publisher = Publisher(make_producer(bootstrap), prefix)
        env = make_env(spec, keyframes=True)
        bare = inst = 0.0
        steps = 0
        for seed in range(args.episodes):  # alternate so drift in machine load hits both equally
            n, t = loop(env, seed, None)
            bare += t
            identity = EpisodeIdentity("bench", "robosuite", "Lift", spec.to_dict(), "oracle", "1", seed)
            recorder = EpisodeRecorder(publisher, identity)
            recorder.start()
            n, t = loop(env, seed, recorder)
            inst += t
            recorder.end(False, "timeout")
            steps += n
        publisher.flush()
        env.reset(0)
        t0 = time.perf_counter()
        for _ in range(500):
            env.signals()
        signals_ms = (time.perf_counter() - t0) / 500 * 1000
        keyframes = KeyframeStore(Path(tmp) / "kf")
        env.render_keyframe(128)  # the first call creates the GL context
        t0 = time.perf_counter()
        for _ in range(20):
            keyframes.put(env.render_keyframe(128))
        keyframe_ms = (time.perf_counter() - t0) / 20 * 1000
        env.close()

        pool = RolloutPool(bootstrap, prefix, Path(tmp) / "kf", args.processes)
        warm = rollout_request(spec.to_dict(), "oracle", [0] * args.processes, run_id="warm")
        pool.run(warm)  # spawn + imports + env build, not what we measure
        request = rollout_request(ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube").to_dict(),
                                  "scripted-clumsy", list(range(4 * args.processes)), run_id="bench")
        t0 = time.perf_counter()
        summaries = pool.run(request)
        pool_s = time.perf_counter() - t0
        pool.close()
        pool_steps = sum(s.steps for s in summaries)

    bare_ms, inst_ms = bare / steps * 1000, inst / steps * 1000
    print(f"steps per loop: {steps} (Lift, oracle, {args.episodes} seeds, each run bare and instrumented)")
    print(f"bare loop:          {bare_ms:7.3f} ms/step  ({1000 / bare_ms:6.1f} steps/s)")
    print(f"instrumented loop:  {inst_ms:7.3f} ms/step  ({1000 / inst_ms:6.1f} steps/s)")
    print(f"instrumentation overhead (event build + encode + publish): {100 * (inst_ms / bare_ms - 1):+.1f}%")
    print(f"signals() alone: {signals_ms:.3f} ms/step = {100 * signals_ms / bare_ms:.1f}% of the bare loop")
    print(f"pool of {args.processes}: {pool_steps} published steps in {pool_s:.1f} s = {pool_steps / pool_s:,.0f} "
          f"env steps/s (no keyframes)")
    print(f"keyframe 128x128 render + PNG + store: {keyframe_ms:.1f} ms/frame")
    return 0


if __name__ == "__main__":
    sys.exit(main())
