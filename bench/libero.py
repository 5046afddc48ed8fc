"""LIBERO benchmark: what the recorder costs against the bare LIBERO step loop, and how many LIBERO
steps a worker with 2 processes publishes per second.

Prints, from one run (libero_object, embedded Tansu broker started here, the LIBERO venv that
`sepa-eval libero setup` built):
  1. per-step time of the bare loop (the oracle + LiberoEnv.step + the signals the oracle reads)
     and of the same loop instrumented (each step recorded: Step events built, Avro-encoded and
     published in the recorder's batches, EpisodeStarted/EpisodeEnded with execution quality,
     the producer flushed), side by side on the same seeds in pairs run back to back, alternating
     which runs first: the median overhead ratio with its quartiles in wall time and in the
     process's CPU time (what the work costs, whatever else the machine runs), and the time
     inside the recorder per step;
     and the cost of signals() alone (a VLA reads images, not signals: for it they are
     instrumentation too);
  2. the frames a pixel policy costs: per-step time of an episode of a policy that plays 8-action
     chunks from a policy server (bench/policy_server.py, no latency) and sees two 64x64 cameras,
     with its cameras rendered at every step and only at the steps it asks the server
     (WebSocketPolicy.looks_now), in pairs run back to back on the same seeds;
  3. steps/s published by the LIBERO worker (infra/libero_worker.py) with 2 pool processes,
     serving a request of N seeds of the oracle after a first request warmed its envs (steady
     state); the clock runs from publishing the request to the last EpisodeEnded read back, and
     every Step event of the request is counted on the topic.

Usage (from the project's venv):
    python bench/libero.py [--seeds 6] [--processes 2] [--task 0] [--pairs 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# This file is bench/libero.py: with bench/ on the path, `import libero` would find it, not LIBERO.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(ROOT))

LOOP_STEPS = 150  # steps per timed loop: the oracle's episodes take 110-190 steps


def inner_overhead(bootstrap: str, prefix: str, task: int, pairs: int) -> dict:
    """Runs in the LIBERO venv: the paired bare / instrumented loops."""
    from infra.kafka_clients import make_producer
    from producers.libero.env import LiberoEnv, libero_package_dir
    from producers.libero.policies import ScriptedPickPlace
    from producers.libero.tasks import TaskCatalog
    from producers.publisher import Publisher
    from producers.recorder import EpisodeIdentity, EpisodeRecorder

    catalog = TaskCatalog(libero_package_dir())
    spec = catalog.base_scenario("libero_object", catalog.tasks("libero_object")[task], horizon=LOOP_STEPS)
    env = LiberoEnv(spec, catalog)
    publisher = Publisher(make_producer(bootstrap), prefix)

    def loop(seed: int, record: bool) -> tuple[float, float, float]:
        obs = env.reset(seed)
        signals = env.signals()
        policy = ScriptedPickPlace()
        policy.reset(seed, spec)
        rec = None
        if record:
            ident = EpisodeIdentity(run_id=f"bench-{uuid.uuid4().hex[:8]}", benchmark="libero", task=spec.task,
                                    scenario=spec.to_dict(), model_id="oracle", model_version="1", seed=seed)
            rec = EpisodeRecorder(publisher, ident)
            rec.start()
        inside = 0.0
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(LOOP_STEPS):
            action = policy.act(obs, signals)
            obs, reward, _, info = env.step(action)
            signals = env.signals()
            if rec is not None:
                r0 = time.perf_counter()
                rec.step(action, signals, reward, info["success"])
                inside += time.perf_counter() - r0
        if rec is not None:
            r0 = time.perf_counter()
            rec.end(info["success"], "success" if info["success"] else "timeout")
            inside += time.perf_counter() - r0
        if rec is not None:
            publisher.flush()  # the producer's work on this episode's events counts too
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        return elapsed / LOOP_STEPS, inside / LOOP_STEPS, cpu / LOOP_STEPS

    loop(0, True)  # warm: numba-free, but the first episode fills caches and the producer connects
    ratios, cpu_ratios, bare_s, inst_s, inside_s = [], [], [], [], []
    for i in range(pairs):
        seed = i + 1
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {rec: loop(seed, rec) for rec in order}
        bare, inst = got[False][0], got[True][0]
        ratios.append(inst / bare - 1.0)
        cpu_ratios.append(got[True][2] / got[False][2] - 1.0)
        bare_s.append(bare)
        inst_s.append(inst)
        inside_s.append(got[True][1])
    env.reset(1)
    t0 = time.perf_counter()
    for _ in range(200):
        env.signals()
    signals_ms = (time.perf_counter() - t0) / 200 * 1000
    env.close()
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    qc = statistics.quantiles(cpu_ratios, n=4) if len(cpu_ratios) >= 2 else [cpu_ratios[0]] * 3
    return {"cpu_overhead_median": statistics.median(cpu_ratios), "cpu_overhead_q1": qc[0], "cpu_overhead_q3": qc[2],
            "pairs": pairs, "bare_ms": statistics.median(bare_s) * 1000,
            "instrumented_ms": statistics.median(inst_s) * 1000,
            "overhead_median": statistics.median(ratios), "overhead_q1": q[0], "overhead_q3": q[2],
            "recorder_ms_per_step": statistics.median(inside_s) * 1000, "signals_ms": signals_ms,
            "bare_steps_per_s": 1.0 / statistics.median(bare_s)}


def _events(bootstrap: str, topic: str, want, timeout_s: float) -> list[dict]:
    """Reads the topic from the beginning until want(events) holds (or the timeout)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from schemas.codec import Codec

    codec = Codec()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    events = []
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.2):
                if not msg.error():
                    events.append(codec.decode(msg.value()))
            if want(events):
                break
    finally:
        consumer.close()
    return events


class EveryStep:
    """A policy seen without looks_now(): the episode renders its cameras at every step."""

    def __init__(self, policy):
        self.policy, self.name = policy, policy.name

    def reset(self, seed, spec):
        self.policy.reset(seed, spec)

    def act(self, obs, signals):
        return self.policy.act(obs, signals)


def inner_frames(task: int, pairs: int) -> dict:
    """Runs in the LIBERO venv: a chunk player's episodes, frames at every step vs when it looks."""
    from bench.policy_server import LatencyPolicyServer
    from producers.episode import Episode, SuccessRule
    from producers.libero.env import KEYFRAME_CAMERA, WRIST_CAMERA, LiberoEnv, libero_package_dir
    from producers.libero.tasks import TaskCatalog
    from producers.websocket_policy import WebSocketPolicy

    catalog = TaskCatalog(libero_package_dir())
    spec = catalog.base_scenario("libero_object", catalog.tasks("libero_object")[task], horizon=LOOP_STEPS)
    env = LiberoEnv(spec, catalog, keyframes=True)
    cameras = (KEYFRAME_CAMERA, WRIST_CAMERA)
    layout = {"observation/image": (f"{KEYFRAME_CAMERA}_image",), "observation/wrist_image": (f"{WRIST_CAMERA}_image",),
              "observation/state": ("eef_pos",)}
    with LatencyPolicyServer(latency_s=0.0, chunk=8) as server:
        def episode(seed: int, every_step: bool) -> float:
            policy = WebSocketPolicy(server.uri, env.action_dim, observation=layout, name="chunk-player")
            episode = Episode(env, EveryStep(policy) if every_step else policy, seed,
                              rule=SuccessRule(hold_steps=1, hold_steps_at_horizon=1),
                              policy_cameras=cameras, policy_camera_size=64)
            t0 = time.perf_counter()
            steps = sum(1 for _ in episode)
            policy.close()
            return (time.perf_counter() - t0) / max(steps, 1)

        episode(0, False)  # warm: the renderer's GL context and the connection
        every, looks = [], []
        for i in range(pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {flag: episode(i + 1, flag) for flag in order}
            every.append(got[True])
            looks.append(got[False])
    env.close()
    return {"pairs": pairs, "every_ms": statistics.median(every) * 1000, "looks_ms": statistics.median(looks) * 1000,
            "ratio": statistics.median(e / q for e, q in zip(every, looks, strict=True))}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=6, help="episodes in the timed request")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--task", type=int, default=0, help="libero_object task index")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--inner", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner == "overhead":
        print(json.dumps(inner_overhead(args.bootstrap, args.prefix, args.task, args.pairs)))
        return 0
    if args.inner == "frames":
        print(json.dumps(inner_frames(args.task, args.pairs)))
        return 0

    from infra.embedded_broker import TansuBroker
    from infra.kafka_clients import ensure_topics, make_producer
    from infra.libero_venv import LiberoVenv
    from infra.libero_worker import start_libero_worker, worker_environ
    from infra.settings import load_settings
    from producers.libero.tasks import TaskCatalog
    from producers.publisher import Publisher
    from producers.rollout_worker import rollout_request

    venv = LiberoVenv.at()
    if not venv.ready():
        print(f"LIBERO is not set up at {venv.root}: run `sepa-eval libero setup`", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, TansuBroker(Path(tmp) / "broker.log") as broker:
        bootstrap, prefix = broker.bootstrap_servers, f"b{uuid.uuid4().hex[:8]}."
        ensure_topics(bootstrap, prefix)
        settings = load_settings(environ={}, memory_dir=Path(tmp) / "mem", bootstrap_servers=bootstrap,
                                 topic_prefix=prefix)
        env = worker_environ(settings, bootstrap, venv)
        out = subprocess.run([str(venv.python), str(Path(__file__).resolve()), "--inner", "overhead",
                              "--bootstrap", bootstrap, "--prefix", prefix, "--task", str(args.task),
                              "--pairs", str(args.pairs)], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        o = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"1. bare LIBERO loop (oracle + step + signals): {o['bare_ms']:.2f} ms/step "
              f"({o['bare_steps_per_s']:.0f} steps/s in one process)")
        print(f"   instrumented (recorder, Step batches to Tansu): {o['instrumented_ms']:.2f} ms/step")
        print(f"   overhead: median {100 * o['overhead_median']:+.1f}% (quartiles {100 * o['overhead_q1']:+.1f}% .. "
              f"{100 * o['overhead_q3']:+.1f}%) over {o['pairs']} paired runs of {LOOP_STEPS} steps")
        print(f"   overhead in CPU time (the process's, librdkafka's threads included): median "
              f"{100 * o['cpu_overhead_median']:+.1f}% (quartiles {100 * o['cpu_overhead_q1']:+.1f}% .. "
              f"{100 * o['cpu_overhead_q3']:+.1f}%)")
        print(f"   inside the recorder: {o['recorder_ms_per_step']:.3f} ms/step "
              f"({100 * o['recorder_ms_per_step'] / o['bare_ms']:.1f}% of a bare step); "
              f"signals(): {o['signals_ms']:.3f} ms")

        out = subprocess.run([str(venv.python), str(Path(__file__).resolve()), "--inner", "frames",
                              "--task", str(args.task), "--pairs", str(args.pairs)], env=env, capture_output=True,
                             text=True)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        f = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"2. a pixel policy playing 8-action chunks, two 64x64 cameras: {f['every_ms']:.1f} ms/step with "
              f"frames at every step, {f['looks_ms']:.1f} ms/step with frames when it asks the server: "
              f"{f['ratio']:.2f}x (median of {f['pairs']} paired episodes of {LOOP_STEPS} steps)")

        catalog = TaskCatalog(venv.package_dir)
        spec = catalog.base_scenario("libero_object", catalog.tasks("libero_object")[args.task])
        worker_pid = start_libero_worker(settings, bootstrap, processes=args.processes)
        try:
            publisher = Publisher(make_producer(bootstrap), prefix)

            def serve(seeds: list[int], run_id: str) -> tuple[float, int, int]:
                request = rollout_request(spec.to_dict(), "oracle", seeds, run_id=run_id)
                t0 = time.monotonic()
                publisher.publish(request)
                publisher.flush()

                def done(events):
                    return sum(e["envelope"]["event_type"] == "EpisodeEnded" and e["envelope"]["run_id"] == run_id
                               for e in events) >= len(seeds)

                episodes = _events(bootstrap, f"{prefix}rollout.episodes", done, 900)
                wall = time.monotonic() - t0
                ended = [e for e in episodes if e["envelope"]["event_type"] == "EpisodeEnded"
                         and e["envelope"]["run_id"] == run_id]
                ids = {e["episode_id"] for e in ended}
                expected = sum(e["steps"] for e in ended)
                steps = _events(bootstrap, f"{prefix}rollout.steps",
                                lambda ev: sum(s["episode_id"] in ids for s in ev) >= expected, 120)
                return wall, sum(s["episode_id"] in ids for s in steps), expected

            serve(list(range(args.processes)), "warm")  # every process builds its env
            wall, counted, expected = serve(list(range(100, 100 + args.seeds)), "timed")
            print(f"3. LIBERO worker, {args.processes} processes, {args.seeds} oracle episodes: {counted} Step events "
                  f"read back ({expected} expected) in {wall:.1f} s = {counted / wall:.0f} steps/s published "
                  f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
        finally:
            if worker_pid:
                os.killpg(worker_pid, 15)
                time.sleep(2)
                try:
                    os.killpg(worker_pid, 9)
                except ProcessLookupError:
                    pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
