"""Scale-out benchmark: one rollout worker against two, in one consumer group on Apache Kafka.

A farm scales rollouts the Kafka way: `sepa-eval rollout-worker` processes on any host join the
group GROUP_ID on rollout.requests (12 partitions, keyed by request id), the group gives each a
share of the partitions, and a request is committed once its episodes are published. This bench
starts a single-node Apache Kafka (jars from Maven Central, infra/apache_kafka.py) and runs two
phases, each on a fresh topic prefix, with real `sepa-eval rollout-worker --processes 1` processes:

  1. the workers start and the group settles (stable, every requests partition held);
  2. warm-up: one 1-seed request on each of the 12 partitions, so every worker has imported the
     simulator and built the scenario's env before the clock starts (what a running farm has);
  3. timed: REQUESTS requests of SEEDS seeds each (Lift, scripted-clumsy, horizon 200), published
     at once and placed by their key as in production; the clock runs from the first publish to
     the group's committed offsets reaching the end of every partition.

Printed per phase: episodes/s and env steps/s (steps from the EpisodeEnded events read back), each
member's share of the requests (its committed offsets' advance on the partitions it held; the
group must not rebalance in the window), and the speed-up the split allows (total / largest
share). Then the 2-worker rate against the 1-worker rate, and against that ideal. Every
(request, seed) of the timed requests must have started exactly once.

The workers, the broker and this script share the machine: on 2 cores two one-process workers
are the most it can run at once, and the JVM broker takes its part of the CPU.

Usage:
    python bench/scale_out.py [--requests 48] [--seeds 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import (  # noqa: E402
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupState,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient  # noqa: E402

from infra.apache_kafka import ApacheKafkaBroker, fetch_jars  # noqa: E402
from infra.kafka_clients import QUIET, ensure_topics, producer_config  # noqa: E402
from infra.lag import committed_offsets  # noqa: E402
from producers.rollout_worker import GROUP_ID, rollout_request  # noqa: E402
from schemas.catalog import BY_NAME  # noqa: E402
from schemas.codec import Codec  # noqa: E402
from schemas.scenario import ScenarioSpec  # noqa: E402

REQUESTS_TOPIC = BY_NAME["rollout.requests"]
EPISODES_TOPIC = BY_NAME["rollout.episodes"]
SCENARIO = ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube").to_dict()
MODEL = "scripted-clumsy"
RUN_ID = "bench-scale-out"
WARM_SEED = 100_000  # warm-up seeds: far from the timed ones


# -- workers ----------------------------------------------------------------------------------

def start_worker(memory_dir: Path, bootstrap: str, prefix: str) -> subprocess.Popen:
    """`sepa-eval rollout-worker --processes 1` as a farm host runs it, configured through SEPA_*
    (nothing else of ours in its environment), its log in memory_dir/worker.log."""
    memory_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPA_") and k != "COLUMNS"}
    env.update(SEPA_BOOTSTRAP_SERVERS=bootstrap, SEPA_TOPIC_PREFIX=prefix)
    log = open(memory_dir / "worker.log", "ab")  # noqa: SIM115 (the child holds it; closed when we drop it)
    command = [sys.executable, "-m", "infra.cli", "--memory-dir", str(memory_dir), "rollout-worker", "--processes", "1"]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def stop_workers(workers: list[subprocess.Popen], timeout: float = 30) -> None:
    """SIGTERM (the worker finishes its request, commits and leaves the group), then SIGKILL."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def wait_for(condition, what: str, timeout: float, workers: list[subprocess.Popen], interval: float = 0.2):
    """The condition's first truthy value; fails at once when a worker exits."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        for worker in workers:
            if worker.poll() is not None:
                raise RuntimeError(f"a rollout worker exited with {worker.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:g} s")
        time.sleep(interval)
    return value


# -- the group --------------------------------------------------------------------------------

def group_assignment(bootstrap: str, prefix: str) -> dict[str, tuple[int, ...]] | None:
    """Member id -> the rollout.requests partitions it holds, while the group is stable (else None;
    also while the broker cannot describe it yet: its coordinator comes up with the first member)."""
    admin = AdminClient({**QUIET, "bootstrap.servers": bootstrap})
    try:
        description = admin.describe_consumer_groups([GROUP_ID], request_timeout=10)[GROUP_ID].result()
    except KafkaException:
        return None
    if description.state != ConsumerGroupState.STABLE:
        return None
    topic = REQUESTS_TOPIC.full_name(prefix)
    return {m.member_id: tuple(sorted(tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic))
            for m in description.members}


def settled(bootstrap: str, prefix: str, members: int) -> dict[str, tuple[int, ...]] | None:
    """The assignment once the group is stable with ``members`` members, each holding a share and
    together every requests partition (None before)."""
    assignment = group_assignment(bootstrap, prefix)
    if assignment is None or len(assignment) != members or not all(assignment.values()):
        return None
    held = sorted(p for parts in assignment.values() for p in parts)
    return assignment if held == list(range(REQUESTS_TOPIC.partitions)) else None


def committed(bootstrap: str, prefix: str) -> dict[int, int]:
    """The group's committed offset per rollout.requests partition (0 where it never committed)."""
    topic = REQUESTS_TOPIC.full_name(prefix)
    offsets = committed_offsets(bootstrap, GROUP_ID)
    return {p: offsets.get((topic, p), 0) for p in range(REQUESTS_TOPIC.partitions)}


# -- requests ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Placed:
    """A request as the broker stored it."""
    request_id: str
    seeds: tuple[int, ...]
    partition: int
    offset: int


def publish_requests(bootstrap: str, prefix: str, requests: list[dict],
                     partitions: list[int] | None = None) -> list[Placed]:
    """Publishes the requests (keyed by request id; on the given partitions when named) and
    returns where each landed."""
    codec, topic = Codec(), REQUESTS_TOPIC.full_name(prefix)
    producer = Producer(producer_config(bootstrap))
    placed: list[Placed] = []
    errors: list[str] = []
    for i, request in enumerate(requests):
        def delivered(err, msg, request=request):
            if err is not None:
                errors.append(str(err))
            else:
                placed.append(Placed(request["request_id"], tuple(request["seeds"]), msg.partition(), msg.offset()))
        extra = {"partition": partitions[i]} if partitions is not None else {}
        producer.produce(topic, key=REQUESTS_TOPIC.message_key(request), value=codec.encode(request),
                         on_delivery=delivered, **extra)
    producer.flush(30)
    if errors or len(placed) != len(requests):
        raise RuntimeError(f"{len(requests) - len(placed)} requests not delivered: {errors[:3]}")
    return placed


def served(bootstrap: str, prefix: str, placed: list[Placed]) -> bool:
    """Whether the group has committed past every one of these requests."""
    offsets = committed(bootstrap, prefix)
    return all(offsets[p.partition] > p.offset for p in placed)


def requests_for(seeds: list[list[int]], run_id: str = RUN_ID) -> list[dict]:
    """One ad-hoc request per list of seeds (its id: the scenario, model, seeds and run_id)."""
    return [rollout_request(SCENARIO, MODEL, s, run_id=run_id) for s in seeds]


# -- episodes, read back ----------------------------------------------------------------------

@dataclass
class EpisodeLog:
    """rollout.episodes from its beginning, read in the background: every copy of every episode."""
    bootstrap: str
    prefix: str
    # (request_id, seed) -> (event_id, episode_id) of each EpisodeStarted copy, in arrival order
    started: dict[tuple[str, int], list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))
    # episode_id -> (event_id, steps) of each EpisodeEnded copy
    ended: dict[str, list[tuple[str, int]]] = field(default_factory=lambda: defaultdict(list))

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        codec, topic = Codec(), EPISODES_TOPIC.full_name(self.prefix)
        consumer = Consumer({**QUIET, "bootstrap.servers": self.bootstrap, "group.id": f"scale-out-{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "isolation.level": "read_committed"})
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(EPISODES_TOPIC.partitions)])
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(500, 0.2):
                    if msg.error():
                        continue
                    event = codec.decode(msg.value(), EPISODES_TOPIC)
                    with self._lock:
                        if "request_id" in event:  # EpisodeStarted
                            self.started[(event["request_id"], event["seed"])].append(
                                (event["envelope"]["event_id"], event["episode_id"]))
                        else:
                            self.ended[event["episode_id"]].append((event["envelope"]["event_id"], event["steps"]))
        finally:
            consumer.close()

    def snapshot(self) -> tuple[dict, dict]:
        with self._lock:
            return ({k: list(v) for k, v in self.started.items()}, {k: list(v) for k, v in self.ended.items()})

    def wait_for(self, keys: set[tuple[str, int]], timeout: float = 30) -> None:
        """Until every (request, seed) has started and ended, as far as this reader has read."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            started, ended = self.snapshot()
            if all(k in started and all(e in ended for _, e in started[k]) for k in keys):
                return
            time.sleep(0.2)
        raise TimeoutError(f"episodes of {len(keys)} (request, seed) not all read back within {timeout:g} s")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


# -- one phase --------------------------------------------------------------------------------

@dataclass
class Phase:
    workers: int
    wall_s: float
    episodes: int
    steps: int
    shares: list[int]  # requests served by each member in the timed window, largest first

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s

    @property
    def ideal_speedup(self) -> float:
        """What the split allows over one worker: total requests / the largest member's share."""
        return sum(self.shares) / max(self.shares)


def run_phase(bootstrap: str, work_dir: Path, workers: int, requests: int, seeds: int) -> Phase:
    prefix = f"scale{workers}-{uuid.uuid4().hex[:6]}."
    ensure_topics(bootstrap, prefix)
    processes = [start_worker(work_dir / f"w{workers}-{i}", bootstrap, prefix) for i in range(workers)]
    log = EpisodeLog(bootstrap, prefix)
    try:
        wait_for(lambda: settled(bootstrap, prefix, workers), f"stable group of {workers}", 120, processes)
        every = list(range(REQUESTS_TOPIC.partitions))
        warm = publish_requests(bootstrap, prefix, requests_for([[WARM_SEED + p] for p in every], RUN_ID + "-warm"),
                                partitions=every)
        wait_for(lambda: served(bootstrap, prefix, warm), "warm-up served", 300, processes)
        assignment = settled(bootstrap, prefix, workers)
        if assignment is None:
            raise RuntimeError("the group is rebalancing after the warm-up")
        before = committed(bootstrap, prefix)
        timed = requests_for([[seeds * i + s for s in range(seeds)] for i in range(requests)])
        start = time.perf_counter()
        placed = publish_requests(bootstrap, prefix, timed)
        wait_for(lambda: served(bootstrap, prefix, placed), "timed requests served", 900, processes, interval=0.1)
        wall = time.perf_counter() - start
        if group_assignment(bootstrap, prefix) != assignment:
            raise RuntimeError("the group rebalanced in the timed window: the shares would be wrong")
        after = committed(bootstrap, prefix)
        shares = sorted((sum(after[p] - before[p] for p in parts) for parts in assignment.values()), reverse=True)
        keys = {(p.request_id, s) for p in placed for s in p.seeds}
        log.wait_for(keys)
        started, ended = log.snapshot()
    finally:
        stop_workers(processes)
        log.close()
    twice = sorted(k for k in keys if len(started[k]) != 1)
    if twice:
        raise AssertionError(f"{len(twice)} (request, seed) started more than once: {twice[:3]}")
    steps = sum(ended[started[k][0][1]][0][1] for k in keys)
    return Phase(workers, wall, len(keys), steps, shares)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per request")
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; {args.requests} requests x {args.seeds} seeds, {MODEL} on Lift (horizon 200), "
          f"one simulator process per worker, Apache Kafka single node")
    with tempfile.TemporaryDirectory(prefix="sepa-scale-out-") as tmp:
        with ApacheKafkaBroker(Path(tmp) / "kafka", jars_dir=fetch_jars()) as broker:
            phases = [run_phase(broker.bootstrap_servers, Path(tmp), n, args.requests, args.seeds) for n in (1, 2)]
    for phase in phases:
        print(f"{phase.workers} worker(s): {phase.episodes} episodes, {phase.steps} steps in {phase.wall_s:.1f} s: "
              f"{phase.episodes_per_s:.2f} episodes/s, {phase.steps / phase.wall_s:.0f} steps/s; "
              f"requests per member {phase.shares}, the split allows {phase.ideal_speedup:.2f}x; "
              "every (request, seed) started once")
    one, two = phases
    speedup = two.episodes_per_s / one.episodes_per_s
    print(f"2 workers against 1: {speedup:.2f}x episodes/s; ratio to what the split allows: "
          f"{speedup / two.ideal_speedup:.2f}")


if __name__ == "__main__":
    main()
