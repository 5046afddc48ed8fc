"""The LIBERO rollout worker: serves rollout.requests for LIBERO scenarios, in the LIBERO venv.

    pool = LiberoPool(producer_factory, prefix, keyframe_root, processes=2, models=models)
    worker = LiberoWorker(consumer, publisher, codec, pool)   # clients built at the edge
    worker.run(stop)                                           # infra/libero_worker.py does all this

A request whose scenario is not a LIBERO scenario is skipped and committed (the robosuite worker,
in its own consumer group, serves it); a LIBERO request with a bad scenario or an unknown model is
dead-lettered with the reason; every other request's seeds run in the pool, one task per seed,
each episode recorded through producers.recorder (EpisodeStarted, Step batches, EpisodeEnded with
its execution quality) exactly as the robosuite worker records its own. The request's offset is
committed only after every episode of it was published and acknowledged by the broker, so a
worker killed mid-request serves it again on restart: same scenario, model and seed give the
same events under the same ids (the episode id comes from the request id, not the wall clock),
and the evidence log counts each once.

Keyframes: every episode ends with a final keyframe (``keyframe_every`` 0, as RolloutRequested
defines it) and ``keyframe_every`` > 0 adds one every that many steps; frames are rendered only
then (a LIBERO step with cameras costs 10x one without), stored by content under the keyframe root.

A pool process that dies mid-request (the kernel killed it for memory, the simulator crashed)
breaks the pool: the worker starts new processes and runs the request again, and dead-letters it
after POOL_ATTEMPTS deaths in a row, so one such request never stops the worker or the loop.

Pool processes keep their envs (ENV_CACHE_SIZE, least recently used dropped; a LIBERO env takes
3-20 s to build) and one producer, made by the ``producer_factory`` the edge passes (a picklable
callable: pool processes are spawned).

Models: the scripted ones of the model registry (producers/sim/configs/models.yaml: the oracle
and the graded scripted-*), as LIBERO pick-and-place policies with the same Skill; the registry's
websocket models (a user's policy server, or one trained here on our export: producers/learned/)
with their own observation layout and cameras, rendered before every action, as the robosuite
worker serves them; and openpi policy servers by model id (``policy_servers``: model_id -> ws://
URI), sent openpi's LIBERO layout (producers/libero/policies.py).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from producers.commits import Committer
from producers.env_cache import EnvCache
from producers.episode import CAMERA_SIZE, requested_cameras
from producers.keyframes import KeyframeStore
from producers.libero.exceptions import LiberoError
from producers.parent_death import die_with_parent
from producers.publisher import Publisher
from producers.recorder import EpisodeIdentity, EpisodeSummary, record_episode
from schemas.catalog import BY_NAME
from schemas.events import dead_letter, refusal_reason
from schemas.exceptions import SchemaError
from schemas.libero_scenario import LiberoScenario, is_libero

log = logging.getLogger(__name__)
PRODUCER = "libero-worker"
GROUP_ID = "sepa-libero-workers"
ENV_CACHE_SIZE = 3
# A request whose pool processes die this many times in a row (killed for memory, a crash in the
# simulator) is dead-lettered: a request that kills every pool it meets must not stop the worker.
POOL_ATTEMPTS = 3
WARM_TIMEOUT_S = 600.0
OPENPI_VERSION = "server"  # model_version of an openpi policy server (the server names its checkpoint)
REQUESTS = BY_NAME["rollout.requests"]  # decoded against it: the same reasons as the sink's


@dataclass(frozen=True)
class LiberoModel:
    """A model this worker can run: scripted (a Skill), a registered websocket model (its registry
    entry: layout, cameras) or an openpi server (a URI)."""

    model_id: str
    version: str
    kind: str  # "oracle", "scripted", "websocket" or "openpi"
    skill: Any = None
    uri: str | None = None  # openpi only (a websocket model's is in its config)
    config: Any = None  # websocket: the registry's ModelConfig

    @property
    def cameras(self) -> tuple[tuple[str, ...], int]:
        """(cameras, side in pixels) rendered before every action into the policy's observation as
        ``<camera>_image``: a websocket model's own; none for the others (openpi's renders its own)."""
        if self.kind == "websocket":
            return tuple(self.config.cameras), self.config.camera_size
        return (), CAMERA_SIZE

    def make_policy(self) -> Any:
        from producers.libero.policies import OpenpiLiberoPolicy, ScriptedPickPlace

        if self.kind == "openpi":
            return OpenpiLiberoPolicy(self.uri, name=self.model_id)
        if self.kind == "websocket":
            return self.config.make_policy()
        return ScriptedPickPlace(self.skill, name=self.model_id)

    def episode(self, env: Any, seed: int, **kwargs: Any) -> Any:
        """One episode of this model on ``env`` (kwargs: producers/libero/rollout.py's Episode)."""
        from producers.libero.rollout import Episode

        cameras, size = self.cameras
        return Episode(env, self.make_policy(), seed, policy_cameras=cameras, policy_camera_size=size, **kwargs)


def load_libero_models(models_path: str | Path | None = None,
                       policy_servers: dict[str, str] | None = None) -> dict[str, LiberoModel]:
    """The registry's models (scripted and websocket) plus the openpi servers, by model id."""
    from producers.sim.models import WEBSOCKET, registered_models

    models = {m.model_id: LiberoModel(m.model_id, m.version, m.kind, skill=m.skill,
                                      config=m if m.kind == WEBSOCKET else None)
              for m in registered_models(models_path or None).values()}
    for model_id, uri in (policy_servers or {}).items():
        if not uri.startswith(("ws://", "wss://")):
            raise ValueError(f"policy server for {model_id!r} must be a ws:// or wss:// URI, got {uri!r}")
        models[model_id] = LiberoModel(model_id, OPENPI_VERSION, "openpi", uri=uri)
    return models


def episode_identity(request: dict, scenario: LiberoScenario, model: LiberoModel, seed: int,
                     simulator: str) -> EpisodeIdentity:
    """The recorder identity of one episode of a request. ``simulator`` (libero, robosuite and
    mujoco versions) goes into EpisodeStarted where the recorder takes it."""
    return EpisodeIdentity(run_id=request["envelope"]["run_id"], benchmark="libero", task=scenario.task,
                           scenario=request["scenario"], model_id=model.model_id, model_version=model.version,
                           seed=seed, request_id=request["request_id"], producer=PRODUCER, simulator=simulator)


# -- what a pool process keeps between requests ---------------------------------------------

_envs = EnvCache(ENV_CACHE_SIZE)
_publisher: Publisher | None = None
_simulator = ""
_warm_barrier: Any = None


def _init_process(parent_pid: int, barrier: Any, producer_factory: Callable[[], Any], prefix: str) -> None:
    """Pool process initializer: dies with the worker, imports LIBERO up front and makes this
    process's publisher."""
    global _warm_barrier, _publisher, _simulator
    die_with_parent(parent_pid)
    _warm_barrier = barrier
    from producers.libero.env import simulator_versions

    _simulator = simulator_versions()
    _publisher = Publisher(producer_factory(), prefix)


def _cached_env(scenario: LiberoScenario, keyframes: bool) -> Any:
    from producers.libero.env import LiberoEnv

    return _envs.get((scenario.scenario_id, keyframes), lambda: LiberoEnv(scenario, keyframes=keyframes))


def _drop_env(scenario: LiberoScenario, keyframes: bool) -> None:
    _envs.drop((scenario.scenario_id, keyframes))


def warm_env(scenario_record: dict, keyframes: bool) -> int:
    """Pool task: builds the scenario's env here, then waits until every process has."""
    _cached_env(LiberoScenario.from_dict(scenario_record), keyframes)
    if _warm_barrier is not None:
        _warm_barrier.wait(WARM_TIMEOUT_S)
    return os.getpid()


def ping() -> int:
    """Pool task: waits until every process runs one (each has run its initializer); the pid."""
    if _warm_barrier is not None:
        _warm_barrier.wait(WARM_TIMEOUT_S)
    return os.getpid()


def run_seeds(request: dict, seeds: list[int], keyframe_root: str,
              models: dict[str, LiberoModel]) -> list[EpisodeSummary]:
    """One process's share of a request, published and acknowledged before it returns."""
    if _publisher is None:
        raise RuntimeError("run_seeds runs in a LiberoPool process (its initializer makes the publisher)")
    model = models[request["model_id"]]
    scenario = LiberoScenario.from_dict(request["scenario"])
    keyframe_every = request["keyframe_every"]  # 0 = the final keyframe only (RolloutRequested's contract)
    keyframes = KeyframeStore(Path(keyframe_root))
    summaries = []
    try:
        for seed in seeds:
            env = _cached_env(scenario, True)
            identity = episode_identity(request, scenario, model, seed, _simulator)
            cameras, camera_size = requested_cameras(request, env)
            summary = record_episode(model.episode(env, seed, keyframe_every=keyframe_every, cameras=cameras,
                                                   camera_size=camera_size),
                                     _publisher, identity, keyframes)
            if summary.termination == "env_error":  # do not reuse an env whose simulation raised
                _drop_env(scenario, True)
            summaries.append(summary)
    except BaseException:
        _drop_env(scenario, True)
        raise
    _publisher.flush()
    return summaries


class LiberoPool:
    """Spawned processes (MuJoCo and GL state do not fork) that run a request's seeds."""

    def __init__(self, producer_factory: Callable[[], Any], prefix: str, keyframe_root: Path,
                 models: dict[str, LiberoModel], processes: int = 2):
        self.keyframe_root, self.models, self.processes = str(keyframe_root), models, processes
        self._producer_factory, self._prefix = producer_factory, prefix
        self.executor = self._start()

    def _start(self) -> ProcessPoolExecutor:
        ctx = multiprocessing.get_context("spawn")
        executor = ProcessPoolExecutor(self.processes, mp_context=ctx, initializer=_init_process,
                                       initargs=(os.getpid(), ctx.Barrier(self.processes), self._producer_factory,
                                                 self._prefix))
        for _ in range(self.processes):
            executor.submit(os.getpid)
        return executor

    def restart(self) -> None:
        """New processes for a pool one of whose processes died (the executor is then broken)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.executor = self._start()

    def ready(self) -> list[int]:
        """Blocks until every process has imported LIBERO and made its publisher; their pids."""
        return sorted(f.result() for f in [self.executor.submit(ping) for _ in range(self.processes)])

    def warm(self, scenario_record: dict, keyframes: bool = False) -> list[int]:
        futures = [self.executor.submit(warm_env, scenario_record, keyframes) for _ in range(self.processes)]
        return sorted(f.result() for f in futures)

    def run(self, request: dict) -> list[EpisodeSummary]:
        """Every seed of the request, one pool task each; returns once all are acknowledged."""
        futures = [self.executor.submit(run_seeds, request, [seed], self.keyframe_root, self.models)
                   for seed in request["seeds"]]
        try:
            summaries = [s for f in futures for s in f.result()]
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        return sorted(summaries, key=lambda s: s.seed)

    def close(self) -> None:
        self.executor.shutdown(cancel_futures=True)


class LiberoWorker:
    """Serves rollout.requests of LIBERO scenarios, one at a time, each committed after its
    episodes are acknowledged. ``consumer`` is subscribed here to ``<prefix>rollout.requests``
    (its group must be this worker's own, GROUP_ID by default: the robosuite workers' group
    sees every request too)."""

    def __init__(self, consumer: Any, publisher: Publisher, codec: Any, pool: LiberoPool, prefix: str,
                 on_ready: Callable[[], None] | None = None):
        self.consumer, self.publisher, self.codec, self.pool = consumer, publisher, codec, pool
        self.prefix = prefix
        self.on_ready = on_ready
        self.served = self.skipped = self.dead_lettered = 0

    def handle(self, request: dict) -> list[EpisodeSummary] | None:
        """Runs a decoded request; None when it is not a LIBERO request. Raises ValueError or
        KeyError (dead-lettered by run) for a bad scenario or an unknown model."""
        if not is_libero(request.get("scenario")):
            return None
        LiberoScenario.from_dict(request["scenario"])  # a bad scenario is refused before any episode
        if request["model_id"] not in self.pool.models:
            raise KeyError(f"model {request['model_id']!r} is not known to the LIBERO worker; known: "
                           f"{sorted(self.pool.models)}")
        if not request["seeds"]:
            raise ValueError(f"request {request['request_id']} has no seeds")
        for attempt in range(1, POOL_ATTEMPTS + 1):
            try:
                return self.pool.run(request)
            except BrokenProcessPool as exc:
                # The seeds a surviving process finished are published under the same episode ids
                # again: the evidence log counts each once, as after a worker's restart.
                log.warning("request %s: a pool process died (%s), attempt %d of %d; new pool processes",
                            request["request_id"], exc, attempt, POOL_ATTEMPTS)
                self.pool.restart()
        raise LiberoError(f"request {request['request_id']}: a pool process died on each of {POOL_ATTEMPTS} "
                          f"attempts (killed for memory? see the kernel log)")

    def run(self, stop: threading.Event) -> None:
        from confluent_kafka import TopicPartition

        self.consumer.subscribe([f"{self.prefix}rollout.requests"])
        committer = Committer(self.consumer)
        ready = False
        try:
            while not stop.is_set():
                msg = self.consumer.poll(0.5)
                committer.retry()
                if not ready and self.consumer.assignment():
                    ready = True
                    if self.on_ready:
                        self.on_ready()
                if msg is None or msg.error():
                    continue
                try:
                    summaries = self.handle(self.codec.decode(msg.value(), REQUESTS))
                    if summaries is None:
                        self.skipped += 1
                    else:
                        self.served += 1
                        log.info("request at %s[%d]@%d: %d episodes, %d successes", msg.topic(), msg.partition(),
                                 msg.offset(), len(summaries), sum(s.success for s in summaries))
                except (SchemaError, LiberoError, KeyError, ValueError) as exc:
                    self._dead_letter(msg, refusal_reason(exc))
                committer.commit([TopicPartition(msg.topic(), msg.partition(), msg.offset() + 1)])
        finally:
            self.consumer.close()

    def _dead_letter(self, msg: Any, reason: str) -> None:
        log.warning("dead-letter %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), reason)
        _, timestamp_ms = msg.timestamp()
        self.publisher.publish(dead_letter(PRODUCER, "worker", msg.topic(), msg.partition(), msg.offset(), msg.key(),
                                           msg.value(), reason, timestamp_ms))
        self.publisher.flush()
        self.dead_lettered += 1
