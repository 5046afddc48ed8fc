"""Policy-serving benchmark: observations/s a rollout pool gets from a policy server that takes a
fixed time per call, with one observation per call and with the envs stepped in lock-step.

A VLA on a GPU answers a call in tens of milliseconds, about as fast for 16 observations as for
one. A worker that asks for one observation per call is then bound at 1/latency steps per env.
This bench serves Lift episodes from bench/policy_server.py (latency LATENCY_MS per call whatever
its batch, one action per observation, the same reach for every model) to a RolloutPool that
publishes to the embedded Tansu broker, and prints one line per setting with

    measured observations/s, bound = min(envs / latency, the simulator's own rate), ratio

where the simulator's own rate is what the pool's processes step with no policy server at all
(simulate_seeds with the oracle: reset, policy, step, signals; nothing recorded or published).

Two servers: ``serial`` answers one call at a time (one model on one GPU, as openpi's server does);
``concurrent`` answers calls side by side (replicas, or a server that batches across clients).
With a serial server one call carries every env (batch = envs); lock-step then pays the latency
and the stepping of all the envs one after the other, L + envs x step. With a concurrent server
each process keeps two calls in flight (concurrency 2), so half its envs step while the other
half wait. The unbatched lines (one observation per call, the openpi protocol as it is) run
as many envs as the pool has processes.

Usage:
    python bench/policy_serving.py [--latency-ms 50] [--processes 2] [--episodes 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.policy_server import LatencyPolicyServer  # noqa: E402
from infra.embedded_broker import TansuBroker  # noqa: E402
from infra.kafka_clients import ensure_topics, producer_config  # noqa: E402
from producers.rollout_worker import RolloutPool, rollout_request, simulate_seeds  # noqa: E402
from schemas.codec import Codec  # noqa: E402
from schemas.scenario import ScenarioSpec  # noqa: E402

HORIZON = 100
MODEL = """models:
  - model_id: oracle
    version: "1"
    kind: oracle
    rank: 0
    skill: {{}}
  - model_id: ws-reach
    version: "1"
    kind: websocket
    uri: {uri}
    action_dim: 7
    observation: {{observation/state: [robot0_eef_pos, robot0_gripper_qpos]}}
    batch: {batch}
    concurrency: {concurrency}
"""


@dataclass(frozen=True)
class Setting:
    serial: bool
    envs: int
    processes: int
    batch: int
    concurrency: int

    @property
    def server(self) -> str:
        return "serial" if self.serial else "concurrent"

    @property
    def layout(self) -> str:
        return f"{self.processes} proc x batch {self.batch} x {self.concurrency} in flight"


def settings(processes: int) -> list[Setting]:
    out = []
    for serial in (True, False):
        out.append(Setting(serial, 1, 1, 1, 1))  # one env: nothing to batch
        out.append(Setting(serial, processes, processes, 1, 1))  # unbatched: one env per process
        if serial:  # one call for every env: a second call would only queue behind it
            out += [Setting(serial, envs, 1, envs, 1) for envs in (4, 16)]
        else:  # per process several calls in flight, each of a share of its envs
            out.append(Setting(serial, 4, processes, 4 // processes // 2, 2))
            per_process = 16 // processes
            out += [Setting(serial, 16, processes, per_process // calls, calls) for calls in (2, 4, 8)]
    return out


def run(setting: Setting, spec: dict, bootstrap: str, tmp: Path, latency_s: float, episodes: int) -> tuple:
    """(observations/s measured, the simulator's own rate for these processes) for one setting."""
    with LatencyPolicyServer(latency_s, serial=setting.serial) as server:
        models = tmp / f"models-{id(setting)}.yaml"
        models.write_text(MODEL.format(uri=server.uri, batch=setting.batch, concurrency=setting.concurrency))
        pool = RolloutPool(producer_config(bootstrap), "bench.", Codec(), tmp / "kf", setting.processes,
                           models_path=models)
        try:
            pool.warm(spec)  # spawn, imports, env build: not timed
            seeds = list(range(setting.envs * episodes))
            bare = rollout_request(spec, "oracle", seeds, run_id=f"bare-{id(setting)}")
            start = time.perf_counter()
            bare_steps = sum(f.result() for f in [pool.executor.submit(simulate_seeds, bare, [seed], str(models))
                                                  for seed in seeds])
            simulator_rate = bare_steps / (time.perf_counter() - start)
            # every lane builds its own env (~3 s; lanes step side by side) on its first request of a
            # scenario, as a running worker does once per scenario: not timed
            warm_seeds = list(range(10_000, 10_000 + setting.envs))
            pool.run(rollout_request(spec, "ws-reach", warm_seeds, run_id=f"warm-{id(setting)}"))
            before = server.observations
            start = time.perf_counter()
            summaries = pool.run(rollout_request(spec, "ws-reach", seeds, run_id=f"served-{id(setting)}"))
            wall = time.perf_counter() - start
        finally:
            pool.close()
    observations = server.observations - before
    steps = sum(s.steps for s in summaries)
    if steps != observations or any(s.error for s in summaries):  # one action per observation
        raise SystemExit(f"{setting}: {steps} steps published but {observations} observations served "
                         f"({[s.error for s in summaries if s.error]})")
    return observations / wall, simulator_rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=2, help="episodes per env")
    args = parser.parse_args()
    latency_s = args.latency_ms / 1000
    spec = ScenarioSpec(env_name="Lift", horizon=HORIZON, instruction="lift the cube").to_dict()
    print(f"Lift, horizon {HORIZON}, {args.episodes} episodes per env, one action per observation, "
          f"server latency {args.latency_ms:g} ms per call whatever its batch")
    rates = {}
    with tempfile.TemporaryDirectory(prefix="sepa-bench-") as tmp, TansuBroker(Path(tmp) / "b.log") as broker:
        ensure_topics(broker.bootstrap_servers, "bench.")
        for setting in settings(args.processes):
            measured, simulator = run(setting, spec, broker.bootstrap_servers, Path(tmp), latency_s, args.episodes)
            bound = min(setting.envs / latency_s, simulator)
            rates[setting] = measured
            print(f"{setting.server:>10} server, {setting.envs:2d} envs ({setting.layout}): {measured:6.1f} "
                  f"observations/s; bound min({setting.envs / latency_s:.0f}, simulator {simulator:.0f}) = "
                  f"{bound:.0f}; ratio {measured / bound:.2f}", flush=True)
    for serial in (True, False):
        unbatched = next(v for s, v in rates.items() if s.serial == serial and s.batch == 1 and s.envs > 1)
        best = max(v for s, v in rates.items() if s.serial == serial and s.envs == 16)
        print(f"{'serial' if serial else 'concurrent':>10} server: lock-step at 16 envs serves {best / unbatched:.1f}x "
              f"the observations/s of one observation per call ({unbatched:.1f}/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
