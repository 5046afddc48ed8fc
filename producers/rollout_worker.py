"""Rollout requests -> simulated episodes -> events, in a pool of worker processes.

A RolloutRequested names a scenario, a model and seeds. Each seed is a task for the pool's
processes, which record their episodes through the recorder. The request's offset is committed
only after every episode was published and acknowledged, so a worker that dies mid-request runs
it again on restart: same seeds, same events, same ids, counted once. A request id this process
has served already (the same sweep asked for twice: ``sweep_request`` ids do not depend on the
asker) is committed without running it again.

Models come from the registry file (``models_path``, default the built-in models.yaml): a
scripted policy, the oracle, or an external policy behind an openpi WebSocket server (kind
"websocket"), all run the same way. A websocket model with ``batch`` or ``concurrency`` above 1
is run in lanes instead (run_lanes): each process steps batch x concurrency envs, each on a
thread of its own, and sends their observations in one call per batch (producers/lockstep.py).
A policy server's latency is then paid once per call, not once per env.

The pool's processes live as long as the pool and keep what is costly to make: each keeps its
last ENV_CACHE_SIZE envs by (scenario_id, keyframes), so a scenario's env is built (~3 s) once
per process, not once per request (an episode is a function of (scenario, seed) alone, whatever
the env ran before), and one Kafka producer per producer config. ``RolloutPool.warm`` builds a
scenario's env in every process ahead of the first request.

Nothing here builds settings or reads the environment: the edge (``sepa-eval rollout-worker``,
which ``sepa-eval up`` starts) passes the producer config, the consumer and the codec in. The
codec travels to the pool's processes with each task, so a Schema Registry's ids reach them too.

    sepa-eval rollout --env Lift --model oracle --episodes 10   # publishes a request, waits for its episodes
    sepa-eval rollout-worker                                     # serves rollout.requests
"""

from __future__ import annotations

import functools
import json
import logging
import math
import multiprocessing
import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, wait
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition

from producers.adapters import adapter_for
from producers.commits import Committer
from producers.env_cache import EnvCache
from producers.episode import CAMERA_SIZE, requested_cameras
from producers.keyframes import KeyframeStore
from producers.lockstep import Batcher, Lane
from producers.parent_death import die_with_parent
from producers.publisher import Publisher
from producers.recorder import EpisodeIdentity, EpisodeSummary, record_episode, simulator_versions
from producers.sim.models import ModelConfig, registered_models
from schemas.catalog import BY_NAME
from schemas.codec import Codec
from schemas.events import dead_letter, make_event, refusal_reason, stable_id
from schemas.exceptions import SchemaError

log = logging.getLogger(__name__)
PRODUCER = "robosuite-worker"
GROUP_ID = "sepa-rollout-workers"  # the consumer group the edge builds the worker's consumer in
# A request can take minutes: the group must not evict a worker that is busy running one.
MAX_POLL_INTERVAL_MS = 3_600_000
# Envs each pool process keeps, least recently used dropped first (a robosuite env holds ~10 MB).
ENV_CACHE_SIZE = 4
# How long RolloutPool.warm waits for every process to have built its env.
WARM_TIMEOUT_S = 300.0
# Envelope producer and run_id of every sweep request (sweep_request): the same for every asker.
SWEEPS = "sweeps"
# Request ids a worker remembers having served, newest kept: a request published twice (the
# orchestrator's sweep and the sweeper's, the same id) is run once per worker process.
SERVED_MEMORY = 10_000
REQUESTS = BY_NAME["rollout.requests"]  # decoded against it: the same reasons as the sink's



def rollout_request(scenario: dict, model_id: str, seeds: list[int], purpose: str = "adhoc",
                    keyframe_every: int = 0, run_id: str = "cli", cameras: tuple[str, ...] = (),
                    camera_size: int = CAMERA_SIZE) -> dict:
    """An ad-hoc (or validation) request; ``cameras`` asks for frames at every step (demonstrations)."""
    # cameras are part of the id only when asked for: the ids of requests without them do not change
    extra = (tuple(cameras), camera_size) if cameras else ()
    request_id = "req-" + stable_id(scenario["scenario_id"], model_id, tuple(seeds), purpose, run_id, *extra)[:20]
    return make_event("RolloutRequested", (request_id,), PRODUCER, run_id, request_id=request_id,
                      scenario_id=scenario["scenario_id"], scenario=scenario, model_id=model_id, seeds=seeds,
                      purpose=purpose, keyframe_every=keyframe_every, cameras=list(cameras), camera_size=camera_size)


def sweep_request(scenario: dict, model_id: str, model_version: str, seeds: list[int],
                  event_time: datetime | None = None) -> dict:
    """The sweep of one model version over one scenario, whoever asks for it (the orchestrator's
    cycle, `sepa-eval eval`, the streams worker's sweeper on a new registration). Its id and its
    content depend on neither the run nor the asker (envelope producer and run_id are SWEEPS), so
    every sweep of the same version over the same scenario and seeds is the same request, and a
    re-sweep dedups; its episodes carry run_id SWEEPS. The request names no model version: the
    rollout worker runs the version its registry file holds (``model_version`` is in the id)."""
    request_id = "req-" + stable_id("sweep", scenario["scenario_id"], model_id, model_version, tuple(seeds))[:20]
    return make_event("RolloutRequested", (request_id,), SWEEPS, SWEEPS, event_time=event_time,
                      request_id=request_id, scenario_id=scenario["scenario_id"], scenario=scenario,
                      model_id=model_id, seeds=list(seeds), purpose="sweep", keyframe_every=0, cameras=[],
                      camera_size=CAMERA_SIZE)


# -- what a pool process keeps between requests ---------------------------------------------

_envs = EnvCache(ENV_CACHE_SIZE)
_producers: dict[str, Producer] = {}
_warm_barrier: Any = None
# Lane i's thread and envs, for as long as the process: an env is only ever stepped and rendered
# on the thread that built it (its GL context is that thread's).
_lanes: list[tuple[ThreadPoolExecutor, EnvCache]] = []
_turn = threading.Lock()  # the lane that steps (producers/lockstep.py): one at a time per process


def _init_process(parent_pid: int, barrier: Any) -> None:
    """Pool process initializer: dies with the worker, keeps the warm-up barrier and pays the
    imports up front."""
    global _warm_barrier
    die_with_parent(parent_pid)
    _warm_barrier = barrier
    import producers.sim.envs  # noqa: F401  (robosuite, MuJoCo, numba: ~3 s)


def _cached_env(adapter: Any, scenario: dict, keyframes: bool) -> Any:
    """This process's env for the scenario, built on first use."""
    return _envs.get((scenario["scenario_id"], keyframes), lambda: adapter.make_env(scenario, keyframes=keyframes))


def _drop_env(scenario: dict, keyframes: bool) -> None:
    _envs.drop((scenario["scenario_id"], keyframes))


def _cached_producer(producer_config: dict) -> Producer:
    key = json.dumps(producer_config, sort_keys=True, default=str)
    producer = _producers.get(key)
    if producer is None:
        producer = _producers[key] = Producer(producer_config)
    return producer


def warm_env(scenario: dict, keyframes: bool) -> int:
    """Pool task: builds the scenario's env in this process and runs one throwaway step (and
    frame), then waits at the barrier until every process has, so each process gets exactly one of
    the pool's warm-up tasks. Returns the pid. The step pays what a process pays once, on its first
    episode (~1.5 CPU-s: numba's compiled arithmetic loaded from its cache, the GL context and its
    shaders); an episode is a function of (scenario, seed) alone, so it changes no later episode."""
    env = _cached_env(adapter_for(scenario["benchmark"]), scenario, keyframes)
    env.reset(0)
    env.step(np.zeros(env.action_dim))
    if keyframes:
        env.render_keyframe()
    if _warm_barrier is not None:
        _warm_barrier.wait(WARM_TIMEOUT_S)
    return os.getpid()


def cache_info() -> tuple[int, list[tuple[str, bool]]]:
    """Pool task: this process's pid and the (scenario_id, keyframes) of its cached envs, oldest first."""
    return os.getpid(), _envs.keys()


@functools.cache
def _simulator() -> str:
    """What every episode of this process ran on (EpisodeStarted.simulator)."""
    return simulator_versions("robosuite", "mujoco")


def _requested_model(request: dict, models_path: str | None) -> ModelConfig:
    models = registered_models(models_path or None)
    if request["model_id"] not in models:
        raise KeyError(f"model {request['model_id']!r} is not registered; known: {sorted(models)}")
    return models[request["model_id"]]


def _identity(request: dict, adapter: Any, model: ModelConfig, seed: int) -> EpisodeIdentity:
    scenario = request["scenario"]
    return EpisodeIdentity(run_id=request["envelope"]["run_id"], benchmark=adapter.name, task=scenario["env_name"],
                           scenario=scenario, model_id=model.model_id, model_version=model.version, seed=seed,
                           request_id=request["request_id"], producer=PRODUCER, simulator=_simulator())


def run_seeds(producer_config: dict, prefix: str, codec: Codec, request: dict, seeds: list[int],
              keyframe_root: str, models_path: str | None = None) -> list[EpisodeSummary]:
    """One process's share of a request, published (framed by ``codec``) and acknowledged before it
    returns. Runs in a pool process, with that process's cached env and producer."""
    from producers.sim.rollout import Episode  # robosuite: imported by the pool's processes only

    model = _requested_model(request, models_path)
    scenario, keyframe_every = request["scenario"], request["keyframe_every"]
    adapter = adapter_for(scenario["benchmark"])
    publisher = Publisher(_cached_producer(producer_config), prefix, codec)
    keyframes = KeyframeStore(Path(keyframe_root))
    summaries = []
    try:
        for seed in seeds:
            # Every episode ends with a keyframe (RolloutRequested: keyframe_every 0 = the final one
            # only): the report shows clusters by their representative's, the judge reads them.
            env = _cached_env(adapter, scenario, True)
            cameras, camera_size = requested_cameras(request, env)
            summary = record_episode(Episode(env, model.make_policy(), seed, keyframe_every=keyframe_every,
                                             cameras=cameras, camera_size=camera_size,
                                             policy_cameras=model.cameras, policy_camera_size=model.camera_size),
                                     publisher, _identity(request, adapter, model, seed), keyframes)
            if summary.termination == "env_error":  # the simulator raised: do not reuse that env
                _drop_env(scenario, True)
            summaries.append(summary)
    except BaseException:
        _drop_env(scenario, True)
        raise
    publisher.flush()
    return summaries


def simulate_seeds(request: dict, seeds: list[int], models_path: str | None = None) -> int:
    """Pool task: the request's episodes as the simulator alone runs them (reset, policy, step,
    signals), nothing recorded, rendered or published; returns the steps run. What run_seeds costs
    beyond it is the worker's own overhead (bench/rollout.py prints the two side by side)."""
    from producers.sim.rollout import Episode

    model = _requested_model(request, models_path)
    scenario = request["scenario"]
    env = _cached_env(adapter_for(scenario["benchmark"]), scenario, False)
    steps = 0
    for seed in seeds:
        episode = Episode(env, model.make_policy(), seed)
        steps += sum(1 for _ in episode)
    return steps


def _lane(index: int) -> tuple[ThreadPoolExecutor, EnvCache]:
    while len(_lanes) <= index:
        _lanes.append((ThreadPoolExecutor(1, thread_name_prefix=f"lane{len(_lanes)}"), EnvCache(ENV_CACHE_SIZE)))
    return _lanes[index]


def run_lanes(producer_config: dict, prefix: str, codec: Codec, request: dict, seeds: list[int],
              keyframe_root: str, models_path: str | None = None) -> list[EpisodeSummary]:
    """Pool task for a model served in lock-step: ``seeds`` over up to batch x concurrency lanes, each
    taking the next seed when its episode ends, ``concurrency`` calls in flight of up to ``batch``
    observations each. Every episode is the one run_seeds would publish (it is a function of
    (scenario, seed) alone), published and acknowledged before this returns."""
    from producers.websocket_policy import PolicyServerConnection

    model = _requested_model(request, models_path)
    lanes = min(model.lanes, len(seeds))
    connections = [PolicyServerConnection(model.uri, model.action_dim, batched=model.batch > 1)
                   for _ in range(math.ceil(lanes / model.batch))]
    batchers = [Batcher(c.infer, _turn) for c in connections]
    handles = [batchers[i % len(batchers)].join() for i in range(lanes)]  # all join before any asks
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for seed in seeds:
        todo.put(seed)
    publisher = Publisher(_cached_producer(producer_config), prefix, codec)
    keyframes = KeyframeStore(Path(keyframe_root))
    futures = [_lane(i)[0].submit(_run_lane, i, handles[i], todo, request, model, publisher, keyframes)
               for i in range(lanes)]
    wait(futures)  # every lane, even when one raised: none is left running on a closed connection
    for connection in connections:
        connection.close()
    summaries = [s for f in futures for s in f.result()]
    publisher.flush()
    return sorted(summaries, key=lambda s: s.seed)


def _run_lane(index: int, lane: Lane, todo: queue.SimpleQueue, request: dict, model: ModelConfig,
              publisher: Publisher, keyframes: KeyframeStore) -> list[EpisodeSummary]:
    from producers.sim.rollout import Episode

    scenario = request["scenario"]
    adapter = adapter_for(scenario["benchmark"])
    envs = _lane(index)[1]
    key = (scenario["scenario_id"], True)
    summaries = []
    with lane:  # its turn to step; on the way out it leaves, and the other lanes stop waiting for it
        try:
            while True:
                try:
                    seed = todo.get_nowait()
                except queue.Empty:
                    return summaries
                env = envs.get(key, lambda: adapter.make_env(scenario, keyframes=True))
                cameras, camera_size = requested_cameras(request, env)
                summary = record_episode(Episode(env, model.make_policy(lane), seed,
                                                 keyframe_every=request["keyframe_every"], cameras=cameras,
                                                 camera_size=camera_size, policy_cameras=model.cameras,
                                                 policy_camera_size=model.camera_size),
                                         publisher, _identity(request, adapter, model, seed), keyframes)
                if summary.termination == "env_error":
                    envs.drop(key)
                summaries.append(summary)
        except BaseException:
            envs.drop(key)
            raise


class RolloutPool:
    """Splits a request's seeds across worker processes (spawned: MuJoCo and GL state do not fork).

    The processes are started with the pool, import the simulator in the background at once, and
    live until close()."""

    def __init__(self, producer_config: dict, prefix: str, codec: Codec, keyframe_root: Path, processes: int = 2,
                 models_path: Path | None = None):
        self.producer_config, self.prefix, self.codec = dict(producer_config), prefix, codec
        self.keyframe_root = str(keyframe_root)
        self.models_path = str(models_path) if models_path is not None else None  # None: the built-in models.yaml
        self.processes = processes
        ctx = multiprocessing.get_context("spawn")
        self.executor = ProcessPoolExecutor(processes, mp_context=ctx, initializer=_init_process,
                                            initargs=(os.getpid(), ctx.Barrier(processes)))
        for _ in range(processes):  # the executor starts a process per task while none is idle
            self.executor.submit(os.getpid)

    def warm(self, scenario: dict, keyframes: bool = True) -> list[int]:
        """Builds the scenario's env in every process (blocks until done); returns their pids."""
        futures = [self.executor.submit(warm_env, scenario, keyframes) for _ in range(self.processes)]
        return sorted(f.result() for f in futures)

    def run(self, request: dict) -> list[EpisodeSummary]:
        """Runs the request's episodes, one task per seed: a process that is done takes the next
        seed, so episodes that end early (success) do not leave a process idle while another
        still has a fixed share to run. Returns when every episode is published and acknowledged."""
        futures = [self.executor.submit(task, self.producer_config, self.prefix, self.codec, request, seeds,
                                        self.keyframe_root, self.models_path)
                   for task, seeds in self._tasks(request)]
        try:
            summaries = [s for f in futures for s in f.result()]
        except BaseException:
            for f in futures:  # the request failed: do not run the seeds no process has started
                f.cancel()
            raise
        return sorted(summaries, key=lambda s: s.seed)

    def _tasks(self, request: dict) -> list[tuple[Callable, list[int]]]:
        """One run_seeds task per seed; for a model run in lanes, one run_lanes task per process,
        the seeds dealt round-robin (the lanes of a process keep themselves busy)."""
        model = registered_models(self.models_path).get(request["model_id"])
        seeds = list(request["seeds"])
        if model is None or model.lanes == 1:  # an unknown model: run_seeds dead-letters it
            return [(run_seeds, [seed]) for seed in seeds]
        shares = [seeds[i::self.processes] for i in range(self.processes)]
        return [(run_lanes, share) for share in shares if share]

    def close(self) -> None:
        self.executor.shutdown()


def serves(request: dict, benchmarks: tuple[str, ...]) -> bool:
    """Whether a worker for these benchmarks serves this request (a scenario without a benchmark
    is a robosuite one, as the Avro default says)."""
    return request.get("scenario", {}).get("benchmark", "robosuite") in benchmarks


class RolloutWorker:
    """Serves rollout.requests: one request at a time, committed after its episodes are published.

    Requests of another benchmark (LIBERO: its own worker in its own venv and consumer group,
    producers/libero/worker.py) are skipped and committed, not dead-lettered.

    ``consumer`` is a built confluent-kafka Consumer in group GROUP_ID with auto-commit off and a
    poll interval of at least MAX_POLL_INTERVAL_MS; ``publisher`` carries its dead letters."""

    benchmarks = ("robosuite",)

    def __init__(self, pool: RolloutPool, consumer: Consumer, publisher: Publisher, codec: Codec):
        self.pool, self.consumer, self.publisher, self.codec = pool, consumer, publisher, codec
        self.topic = BY_NAME["rollout.requests"].full_name(publisher.prefix)
        self.served = 0  # messages taken off the topic and committed
        self.skipped = 0  # of them, requests of another benchmark or served by this process already
        self._served_ids: OrderedDict[str, None] = OrderedDict()  # the last SERVED_MEMORY request ids run

    def run(self, stop: threading.Event, on_assigned: Callable[[], None] | None = None) -> None:
        """Serves until ``stop`` is set. ``on_assigned`` is called once, when the group first gave this
        worker its partitions (a readiness signal for whoever started it)."""
        told = threading.Event()

        def assigned(consumer, partitions) -> None:
            if on_assigned is not None and not told.is_set():
                told.set()
                on_assigned()

        self.consumer.subscribe([self.topic], on_assign=assigned)
        committer = Committer(self.consumer)
        try:
            while not stop.is_set():
                msg = self.consumer.poll(0.5)
                committer.retry()
                if msg is None or msg.error():
                    continue
                try:
                    request = self.codec.decode(msg.value(), REQUESTS)
                    if not serves(request, self.benchmarks):
                        self.skipped += 1  # another benchmark's worker serves it
                    elif request["request_id"] in self._served_ids:
                        # The same id is the same request (same scenario, model, seeds): its episodes
                        # were published and acknowledged by this process already.
                        log.info("request %s: served already, not run again", request["request_id"])
                        self.skipped += 1
                    else:
                        summaries = self.pool.run(request)
                        self._remember(request["request_id"])
                        log.info("request %s: %d episodes, %d successes", request["request_id"], len(summaries),
                                 sum(s.success for s in summaries))
                except (SchemaError, KeyError, ValueError) as exc:
                    self._dead_letter(msg, refusal_reason(exc))
                committer.commit([TopicPartition(msg.topic(), msg.partition(), msg.offset() + 1)])
                self.served += 1
        finally:
            self.consumer.close()

    def _remember(self, request_id: str) -> None:
        self._served_ids[request_id] = None
        while len(self._served_ids) > SERVED_MEMORY:
            self._served_ids.popitem(last=False)

    def _dead_letter(self, msg, reason: str) -> None:
        log.warning("dead-letter %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), reason)
        _, timestamp_ms = msg.timestamp()
        self.publisher.publish(dead_letter(PRODUCER, "worker", msg.topic(), msg.partition(), msg.offset(), msg.key(),
                                           msg.value(), reason, timestamp_ms))
        self.publisher.flush()
