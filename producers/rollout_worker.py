"""Rollout requests -> simulated episodes -> events, in a pool of worker processes.

A RolloutRequested names a scenario, a model and seeds. Seeds are split across processes; each
process builds the env once and records every episode through the recorder. The request's
offset is committed only after every episode was published and acknowledged, so a worker that
dies mid-request runs it again on restart: same seeds, same events, same ids, counted once.

    sepa-eval rollout --env Lift --model oracle --episodes 10        # direct, with progress
    sepa-eval rollout-worker                                          # serve rollout.requests
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from infra.kafka_clients import consumer_config, make_producer
from producers.adapters import adapter_for
from producers.keyframes import KeyframeStore
from producers.publisher import Publisher
from producers.recorder import EpisodeIdentity, EpisodeRecorder
from producers.sim.models import ModelConfig, load_models
from producers.sim.rollout import Episode
from schemas.codec import Codec
from schemas.events import dead_letter, make_event, stable_id
from schemas.exceptions import SchemaError

log = logging.getLogger(__name__)
PRODUCER = "robosuite-worker"
GROUP_ID = "sepa-rollout-workers"


@dataclass(frozen=True)
class EpisodeSummary:
    episode_id: str
    seed: int
    success: bool
    termination: str
    steps: int
    error: str | None


def rollout_request(scenario: dict, model_id: str, seeds: list[int], purpose: str = "adhoc",
                    keyframe_every: int = 0, run_id: str = "cli") -> dict:
    request_id = "req-" + stable_id(scenario["scenario_id"], model_id, tuple(seeds), purpose, run_id)[:20]
    return make_event("RolloutRequested", (request_id,), PRODUCER, run_id, request_id=request_id,
                      scenario_id=scenario["scenario_id"], scenario=scenario, model_id=model_id, seeds=seeds,
                      purpose=purpose, keyframe_every=keyframe_every)


def run_seeds(bootstrap: str, prefix: str, request: dict, seeds: list[int], keyframe_root: str,
              models_path: str | None = None) -> list[EpisodeSummary]:
    """One process's share of a request. Runs in a pool process: builds its own producer and env."""
    models = {m.model_id: m for m in (load_models(Path(models_path)) if models_path else load_models())}
    if request["model_id"] not in models:
        raise KeyError(f"model {request['model_id']!r} is not registered; known: {sorted(models)}")
    model: ModelConfig = models[request["model_id"]]
    adapter = adapter_for(request["scenario"]["benchmark"])
    env = adapter.make_env(request["scenario"], keyframes=request["keyframe_every"] > 0)
    publisher = Publisher(make_producer(bootstrap), prefix)
    keyframes = KeyframeStore(Path(keyframe_root))
    summaries = []
    try:
        for seed in seeds:
            identity = EpisodeIdentity(run_id=request["envelope"]["run_id"], benchmark=adapter.name,
                                       task=request["scenario"]["env_name"], scenario=request["scenario"],
                                       model_id=model.model_id,
                                       model_version=model.version, seed=seed, request_id=request["request_id"],
                                       producer=PRODUCER)
            episode = Episode(env, model.make_policy(), seed, keyframe_every=request["keyframe_every"])
            with EpisodeRecorder(publisher, identity, keyframes) as recorder:
                for record in episode:
                    recorder.step(record.action, record.signals, record.reward, record.success, record.keyframe)
                out = episode.outcome
                recorder.end(out.success, out.termination, out.error, out.final_keyframe)
            summaries.append(EpisodeSummary(identity.episode_id, seed, out.success, out.termination, out.steps,
                                            out.error))
        publisher.flush()
    finally:
        env.close()
    return summaries


class RolloutPool:
    """Splits a request's seeds across worker processes (spawned: MuJoCo and GL state do not fork)."""

    def __init__(self, bootstrap: str, prefix: str, keyframe_root: Path, processes: int = 2):
        self.bootstrap, self.prefix = bootstrap, prefix
        self.keyframe_root = str(keyframe_root)
        self.processes = processes
        self.executor = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))

    def run(self, request: dict) -> list[EpisodeSummary]:
        seeds = list(request["seeds"])
        shares = [seeds[i::self.processes] for i in range(self.processes) if seeds[i::self.processes]]
        futures = [self.executor.submit(run_seeds, self.bootstrap, self.prefix, request, share, self.keyframe_root)
                   for share in shares]
        return sorted((s for f in futures for s in f.result()), key=lambda s: s.seed)

    def close(self) -> None:
        self.executor.shutdown()


class RolloutWorker:
    """Serves rollout.requests: one request at a time, committed after its episodes are published."""

    def __init__(self, pool: RolloutPool, bootstrap: str, prefix: str, session_timeout_ms: int):
        self.pool, self.prefix = pool, prefix
        # A request can take minutes: the poll interval must outlast it or the group evicts us.
        self.consumer = Consumer(consumer_config(bootstrap, GROUP_ID, session_timeout_ms,
                                                 **{"max.poll.interval.ms": 3_600_000}))
        self.publisher = Publisher(make_producer(bootstrap), prefix)
        self.codec = Codec()
        self.served = 0

    def run(self, stop: threading.Event) -> None:
        self.consumer.subscribe([f"{self.prefix}rollout.requests"])
        try:
            while not stop.is_set():
                msg = self.consumer.poll(0.5)
                if msg is None or msg.error():
                    continue
                try:
                    request = self.codec.decode(msg.value())
                    summaries = self.pool.run(request)
                    log.info("request %s: %d episodes, %d successes", request["request_id"], len(summaries),
                             sum(s.success for s in summaries))
                except (SchemaError, KeyError, ValueError) as exc:
                    self._dead_letter(msg, f"{type(exc).__name__}: {exc}")
                self.consumer.commit(offsets=[TopicPartition(msg.topic(), msg.partition(), msg.offset() + 1)],
                                     asynchronous=False)
                self.served += 1
        finally:
            self.consumer.close()

    def _dead_letter(self, msg, reason: str) -> None:
        log.warning("dead-letter %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), reason)
        _, timestamp_ms = msg.timestamp()
        self.publisher.publish(dead_letter(PRODUCER, "worker", msg.topic(), msg.partition(), msg.offset(), msg.key(),
                                           msg.value(), reason, timestamp_ms))
        self.publisher.flush()
