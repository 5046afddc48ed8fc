"""Rollout benchmark: what the env step, instrumentation and publishing cost, and how many
published steps/s a pool of worker processes makes.

Prints, from one run (Lift, embedded Tansu broker):
  1. SimEnv.step alone, robosuite's stock step against the lean step (producers/sim/lean_step.py
     _LeanControlStep), alternating on the same seeds and actions: per-process steps/s of the
     simulator, per wall second and per CPU second;
  2. per-step time of the bare loop (oracle policy + env.step + the signals it reads), and of the
     same loop instrumented (Step event built + Avro-encoded + published), side by side on the
     same seeds, in pairs run back to back: the median overhead ratio with the recorder's Step
     batches and with every event sent as it is recorded, the time spent inside the recorder,
     and the cost of each part of one Step event (encoded alone, caches warm);
  3. the cost of signals() alone (a VLA policy would not need it: then it is instrumentation too);
  4. env steps/s of published step events with a pool of N worker processes, no keyframes
     (scripted-clumsy, horizon 200, 4 episodes per process, one task per episode):
       - steady state: the pool's processes were spawned, imported the simulator and built the
         scenario's env before the clock starts (RolloutPool.warm); that is what a running worker
         does for every request of a scenario it has seen;
       - first request of a new scenario: the same, but each process builds the env (~3 s) inside
         the timed window;
     the clock runs from submitting the request to every process having flushed its producer
     (every event acknowledged by the broker); the Step events are then read back from the broker
     and counted, and the count must equal the steps the pool reports. On a shared machine the
     wall-clock rate depends on what else runs, so the CPU time the pool's processes used in the
     window (from /proc) is printed too: steps per CPU-second is what the work itself costs;
  5. keyframe cost (128x128 offscreen render + PNG + store) per frame.

Usage:
    python bench/rollout.py [--episodes 6] [--processes 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import timeit
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition  # noqa: E402

from infra.embedded_broker import TansuBroker  # noqa: E402
from infra.kafka_clients import ensure_topics, make_producer, producer_config  # noqa: E402
from producers.keyframes import KeyframeStore  # noqa: E402
from producers.publisher import Publisher  # noqa: E402
from producers.recorder import EpisodeIdentity, EpisodeRecorder  # noqa: E402
from producers.recording_signals import SIGNAL_FIELDS  # noqa: E402
from producers.rollout_worker import RolloutPool, rollout_request, simulate_seeds  # noqa: E402
from producers.sim.envs import make_env  # noqa: E402
from producers.sim.policies import make_policy  # noqa: E402
from schemas.codec import Codec  # noqa: E402
from schemas.events import make_event  # noqa: E402
from schemas.scenario import ScenarioSpec  # noqa: E402

HORIZON = 150
POOL_HORIZON = 200
POOL_MODEL = "scripted-clumsy"
EPISODES_PER_PROCESS = 4
POOL_ROUNDS = 3  # bare and recorded requests, alternated
REPEATS = 5


def loop(env, seed: int, recorder: EpisodeRecorder | None) -> tuple[int, float, float]:
    """One oracle episode of HORIZON steps: (steps, seconds, seconds inside recorder.step)."""
    policy = make_policy("oracle")
    obs = env.reset(seed)
    signals = env.signals()
    policy.reset(seed, env.spec)
    recording = 0.0
    start = time.perf_counter()
    for _ in range(HORIZON):
        action = np.asarray(policy.act(obs, signals), dtype=float)
        obs, reward, _, info = env.step(action)
        signals = env.signals()
        if recorder is not None:
            t0 = time.perf_counter()
            recorder.step(action, signals, reward, info["success"])
            recording += time.perf_counter() - t0
    if recorder is not None:  # the batch end() sends is instrumentation too
        t0 = time.perf_counter()
        recorder.publish_pending()
        recording += time.perf_counter() - t0
    return HORIZON, time.perf_counter() - start, recording


def env_steps_per_s(env, seed: int, lean: bool) -> tuple[float, float]:
    """SimEnv.step alone on fixed pseudo-random actions: (steps per wall second, per CPU second)."""
    env.robosuite_env.lean_step = lean
    try:
        actions = np.random.default_rng(0).uniform(-0.5, 0.5, size=(HORIZON, 7))
        env.reset(seed)
        wall, cpu = time.perf_counter(), time.process_time()
        for action in actions:
            env.step(action)
        return HORIZON / (time.perf_counter() - wall), HORIZON / (time.process_time() - cpu)
    finally:
        env.robosuite_env.lean_step = True


def event_costs(publisher: Publisher, signals: dict) -> tuple[float, float, float]:
    """Microseconds to build, encode, and hand one Step event to the producer."""
    fields = {name: signals[name] for name in SIGNAL_FIELDS}

    def build():
        return make_event("Step", ("ep-bench", 1), "bench", "bench", episode_id="ep-bench", t=1, action=[0.1] * 7,
                          reward=0.0, keyframe_sha256=None, **fields)

    event = build()
    codec = Codec()
    value = codec.encode(event)
    topic = f"{publisher.prefix}rollout.steps"
    n = 2000
    build_us = min(timeit.repeat(build, number=n, repeat=5)) / n * 1e6
    encode_us = min(timeit.repeat(lambda: codec.encode(event), number=n, repeat=5)) / n * 1e6
    publish_us = min(timeit.repeat(lambda: publisher.publish_raw(topic, b"ep-bench", value), number=n,
                                   repeat=3)) / n * 1e6
    publisher.flush()
    return build_us, encode_us, publish_us


def count_steps(bootstrap: str, topic: str, episode_ids: set[str], expected: int, timeout_s: float = 60.0) -> int:
    """Step events of these episodes on the broker, read from the beginning of the topic."""
    codec = Codec()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    seen: set[tuple[str, int]] = set()
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        start = last = time.monotonic()
        while time.monotonic() - start < timeout_s and (len(seen) < expected or time.monotonic() - last < 2.0):
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            last = time.monotonic()
            event = codec.decode(msg.value())
            if event.get("episode_id") in episode_ids:
                seen.add((event["episode_id"], event["t"]))
    finally:
        consumer.close()
    return len(seen)


def cpu_seconds(pids: list[int]) -> float | None:
    """CPU time (user + system, all threads) the processes have used so far; None without /proc."""
    total = 0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    except (OSError, IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def timed(pids: list[int], work):
    """(work(), wall seconds, CPU seconds the pool's processes ``pids`` used meanwhile or None)."""
    cpu0 = cpu_seconds(pids)
    start = time.perf_counter()
    result = work()
    wall = time.perf_counter() - start
    cpu1 = cpu_seconds(pids)
    return result, wall, (cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None)


def run_bare(pool: RolloutPool, request: dict) -> int:
    """The request's episodes in the pool's processes, one task per seed as RolloutPool.run hands
    them out, with nothing recorded or published: the steps run."""
    return sum(f.result() for f in [pool.executor.submit(simulate_seeds, request, [seed])
                                    for seed in request["seeds"]])


def cpu_note(steps: int, cpu: float | None) -> str:
    return "" if not cpu else f"; the workers used {cpu:.1f} CPU-s = {steps / cpu:,.0f} steps per CPU-second"


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

        stock_rates, lean_rates = [], []
        for seed in range(5):  # alternate so drift in machine load hits both equally
            stock_rates.append(env_steps_per_s(env, seed, lean=False))
            lean_rates.append(env_steps_per_s(env, seed, lean=True))

        # Side by side: for each (repeat, seed) the three variants run back to back, in rotated order,
        # and each instrumented run is compared with the bare run next to it. On a shared machine one
        # episode can run 10% slower than its neighbour for no reason of its own; the median of
        # these paired ratios is what stays put from run to run.
        variants = (None, EpisodeRecorder.batch_steps, 1)  # bare, batched Step events, one at a time
        per_step = {v: [] for v in variants}  # seconds per step of each run
        inside = {v: [] for v in variants}  # seconds inside the recorder per step
        ratios = {v: [] for v in variants[1:]}
        for rep in range(REPEATS):
            for seed in range(args.episodes):
                times = {}
                for batch_steps in variants[(rep + seed) % 3:] + variants[:(rep + seed) % 3]:
                    recorder = None
                    if batch_steps is not None:
                        identity = EpisodeIdentity(f"bench-{batch_steps}-{rep}", "robosuite", "Lift", spec.to_dict(),
                                                   "oracle", "1", seed)
                        recorder = EpisodeRecorder(publisher, identity, batch_steps=batch_steps)
                        recorder.start()
                    n, t, t_rec = loop(env, seed, recorder)
                    if recorder is not None:
                        recorder.end(False, "timeout")
                    times[batch_steps] = t
                    per_step[batch_steps].append(t / n)
                    inside[batch_steps].append(t_rec / n)
                for v in ratios:
                    ratios[v].append(times[v] / times[None] - 1)
        runs = REPEATS * args.episodes
        publisher.flush()
        env.reset(0)
        for _ in range(30):
            env.step(np.array([0.0, 0.0, -0.5, 0.0, 0.0, 0.0, -1.0]))
        build_us, encode_us, publish_us = event_costs(publisher, env.signals())
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

        t0 = time.perf_counter()
        pool = RolloutPool(producer_config(bootstrap), prefix, Codec(), Path(tmp) / "kf", args.processes)
        steady_spec = ScenarioSpec(env_name="Lift", horizon=POOL_HORIZON, instruction="lift the cube")
        pids = pool.warm(steady_spec.to_dict())  # spawn + imports + env build in every process: not timed
        pool.warm(steady_spec.to_dict(), keyframes=False)  # the env the bare loops run in
        warm_s = time.perf_counter() - t0
        seeds = list(range(EPISODES_PER_PROCESS * args.processes))
        published, published_steps = set(), 0
        rounds = []  # (bare, recorded) per round: each a (steps, wall s, CPU s)
        try:
            for rep in range(POOL_ROUNDS):  # alternated, so drift in machine load hits both alike
                request = rollout_request(steady_spec.to_dict(), POOL_MODEL, seeds, run_id=f"bench-steady-{rep}")
                bare = timed(pids, lambda: run_bare(pool, request))  # noqa: B023  (called at once, in this iteration)
                summaries, wall, cpu = timed(pids, lambda: pool.run(request))  # noqa: B023
                rounds.append((bare, (sum(s.steps for s in summaries), wall, cpu)))
                published.update(s.episode_id for s in summaries)
                published_steps += sum(s.steps for s in summaries)
            cold_spec = steady_spec.mutate(placement_x_range=(-0.02, 0.02))  # a scenario no process has seen
            cold_request = rollout_request(cold_spec.to_dict(), POOL_MODEL, seeds, run_id="bench-cold")
            cold, cold_s, cold_cpu = timed(pids, lambda: pool.run(cold_request))
        finally:
            pool.close()
        cold_steps = sum(s.steps for s in cold)
        published.update(s.episode_id for s in cold)
        published_steps += cold_steps
        on_broker = count_steps(bootstrap, f"{prefix}rollout.steps", published, published_steps)

    bare_ms = statistics.median(per_step[None]) * 1000
    stock, lean = (statistics.median(r[0] for r in stock_rates), statistics.median(r[0] for r in lean_rates))
    stock_cpu, lean_cpu = (statistics.median(r[1] for r in stock_rates), statistics.median(r[1] for r in lean_rates))
    print(f"SimEnv.step alone (Lift, {HORIZON} random actions x 5 seeds each, median): robosuite stock step "
          f"{stock:6.1f} steps/s, lean step {lean:6.1f} steps/s ({lean / stock:.2f}x, identical results); "
          f"per CPU-second {stock_cpu:.0f} vs {lean_cpu:.0f}")
    print(f"bare loop (Lift, oracle, {HORIZON} steps x {runs} episodes, median): {bare_ms:.3f} ms/step "
          f"({1000 / bare_ms:.1f} steps/s)")
    for v, label in ((EpisodeRecorder.batch_steps, "Step events in the recorder's batches (batch_steps="
                     f"{EpisodeRecorder.batch_steps})"),
                     (1, "each Step event sent as it is recorded (batch_steps=1)")):
        q1, median, q3 = statistics.quantiles(ratios[v], n=4)
        us = statistics.median(inside[v]) * 1e6
        print(f"instrumented, {label}: {statistics.median(per_step[v]) * 1000:.3f} ms/step; overhead against the "
              f"bare run next to it: median {100 * median:+.1f}% (quartiles {100 * q1:+.1f}% .. {100 * q3:+.1f}% "
              f"over {runs} pairs); time inside the recorder {us:.0f} us/step = {100 * us / 1000 / bare_ms:.1f}% "
              "of the bare step")
    print(f"one Step event: build {build_us:.1f} us + Avro encode {encode_us:.1f} us + produce {publish_us:.1f} us")
    print(f"signals() alone: {signals_ms:.3f} ms/step = {100 * signals_ms / bare_ms:.1f}% of the bare loop")
    print(f"pool of {args.processes} (pids {pids}): spawn + imports + env build took {warm_s:.1f} s, not timed")
    wall_ratios = [(r[0] / r[1]) / (b[0] / b[1]) for b, r in rounds]
    cpu_ratios = [(r[0] / r[2]) / (b[0] / b[2]) for b, r in rounds if b[2] and r[2]]
    for rep, (bare, recorded) in enumerate(rounds):
        print(f"  round {rep}: bare loops {bare[0]} steps in {bare[1]:.2f} s = {bare[0] / bare[1]:,.0f} env steps/s"
              f"{cpu_note(bare[0], bare[2])}; recorded and published {recorded[0]} steps in {recorded[1]:.2f} s = "
              f"{recorded[0] / recorded[1]:,.0f} env steps/s{cpu_note(recorded[0], recorded[2])}")
    print(f"  steady state ({POOL_MODEL}, {len(seeds)} episodes, horizon {POOL_HORIZON}, no keyframes but each "
          f"failure's final one), the pool against the bare loops it runs (the same episodes in the same "
          f"processes, nothing recorded or published), median of {len(rounds)} rounds: ratio "
          f"{statistics.median(wall_ratios):.2f} of the env steps/s"
          + (f", ratio {statistics.median(cpu_ratios):.2f} of the steps per CPU-second" if cpu_ratios else ""))
    print(f"  new scenario:  {cold_steps} published steps in {cold_s:.1f} s = {cold_steps / cold_s:,.0f} "
          f"env steps/s (each process builds the env inside the timed window){cpu_note(cold_steps, cold_cpu)}")
    print(f"  Step events read back from the broker: {on_broker} of {published_steps}"
          + ("" if on_broker == published_steps else "  MISMATCH"))
    print(f"keyframe 128x128 render + PNG + store: {keyframe_ms:.1f} ms/frame")
    return 0 if on_broker == published_steps else 1


if __name__ == "__main__":
    sys.exit(main())
