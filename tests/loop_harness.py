"""The evolving loop without the simulator: a stand-in rollout worker, the real critics worker, the
real gate runner, the real evidence sink, over a real broker and a real chDB store.

    world = LoopWorld(broker, store, prefix, tmp_path, outcomes={BASE_ID: all_succeed, ...})
    world.start()                                   # sink + responder threads
    world.register(MODELS); world.promote_base(BASE)
    world.sweep(BASE, seeds=range(10))              # the responder serves it
    critics = world.critics(); critics.start()      # the real CriticsWorker in a thread
    world.propose(candidate, cycle_id="c1")
    world.until(lambda: ..., "what we wait for")
    world.tick_gate()                               # one GateRunner tick, published
    world.stop()

The responder serves rollout.requests as the rollout worker does (EpisodeStarted, EpisodeEnded,
and the detector's EpisodeAnalysed per seed) with an outcome that is a fixed function of (model,
scenario, seed), event times taken from the request (so a re-served request is byte-identical),
and a keyframe PNG for the successful episodes of a request that asks for keyframes. ``hold_from``
holds back every seed at or above it until lowered: a look served halfway.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer
from sinks import SESSION_MS, make_sink

from consumers import state as q
from consumers.critics.worker import CriticsConfig, CriticsWorker
from infra.kafka_clients import consumer_config, ensure_topics, make_producer
from infra.orchestrator import base_candidate
from producers.keyframes import KeyframeStore
from producers.publisher import Publisher
from schemas.codec import Codec
from schemas.events import make_event, stable_id
from schemas.scenario import ScenarioSpec
from streams.gate.agent import GateRunner
from streams.gate.gate import GateConfig, PromotionGate

Outcome = Callable[[str, int], bool]  # (model_id, seed) -> success
QUALITY = {"smoothness_jerk": 0.5, "path_efficiency": 0.9, "peak_contact_force": 30.0, "mean_contact_force": 8.0,
           "time_to_success": None, "regrasp_count": 0, "idle_steps": 0}
MODELS = {"oracle": "oracle", "strong": "scripted", "weak": "scripted"}
WAIT_S = 90.0
POLL_S = 0.2
BASE = ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube").to_dict()


def always(model_id: str, seed: int) -> bool:
    return True


def never(model_id: str, seed: int) -> bool:
    return False


def harder_for(*losers: str) -> Outcome:
    """Every model but ``losers`` (and the oracle) succeeds on every seed; the losers never do."""
    return lambda model_id, seed: model_id not in losers


def child(instruction: str = "lift the cube", **changes) -> dict:
    """A candidate scenario mutated from BASE."""
    return ScenarioSpec.from_dict(BASE).mutate(instruction=instruction, **changes).to_dict()


def frame_png(store: KeyframeStore, key: str) -> str:
    """A small non-uniform keyframe (a judge's blank control must be told apart from it)."""
    digest = np.frombuffer(hashlib.sha256(key.encode()).digest(), dtype=np.uint8)
    img = np.zeros((32, 32, 3), dtype=np.uint8)
    img[:, :, 0] = np.arange(32, dtype=np.uint8)[:, None] * 8
    img[:, :, 1] = digest[:32][None, :]
    img[8:24, 8:24, 2] = 200
    return store.put(img)


class Responder:
    """rollout.requests -> EpisodeStarted, EpisodeEnded, EpisodeAnalysed, deterministic per request."""

    def __init__(self, broker: str, prefix: str, outcomes: dict[str, Outcome], keyframes: KeyframeStore,
                 codec: Codec):
        self.broker, self.prefix, self.outcomes, self.keyframes, self.codec = broker, prefix, outcomes, keyframes, codec
        self.requests: list[dict] = []  # every RolloutRequested message, as read
        self.served: list[tuple[str, int]] = []  # (request_id, seed)
        self.hold_from: int | None = None
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self._queue: list[tuple[dict, int]] = []
        self.thread = threading.Thread(target=self._run, name="responder", daemon=True)

    def _run(self) -> None:
        consumer = Consumer(consumer_config(self.broker, f"responder-{self.prefix}", SESSION_MS))
        publisher = Publisher(make_producer(self.broker), self.prefix, self.codec)
        consumer.subscribe([f"{self.prefix}rollout.requests"])
        try:
            while not self.stop_event.is_set():
                for msg in consumer.consume(num_messages=100, timeout=POLL_S):
                    if msg.error() is None:
                        request = self.codec.decode(msg.value())
                        self.requests.append(request)
                        self._queue += [(request, seed) for seed in request["seeds"]]
                waiting = []
                for request, seed in self._queue:
                    if self.hold_from is not None and seed >= self.hold_from:
                        waiting.append((request, seed))
                        continue
                    for event in self.episode(request, seed):
                        publisher.publish(event)
                    self.served.append((request["request_id"], seed))
                self._queue = waiting
                publisher.flush()
        except BaseException as exc:  # the test names it instead of hanging on a dead thread
            self.error = exc
            raise
        finally:
            consumer.close()

    def episode(self, request: dict, seed: int) -> list[dict]:
        scenario, model_id = request["scenario"], request["model_id"]
        outcome = self.outcomes[scenario["scenario_id"]]
        success = bool(outcome(model_id, seed))
        episode_id = "ep-" + stable_id(request["request_id"], seed)[:24]
        at = request["envelope"]["event_time"] + timedelta(seconds=1 + seed)
        keyframe = frame_png(self.keyframes, episode_id) if request["keyframe_every"] and success else None
        quality = {**QUALITY, "time_to_success": 40 if success else None}
        termination = "success" if success else "timeout"
        moments = [] if success else [{"moment_id": f"m-{episode_id}", "failure_type": "grasp_miss", "step": 12,
                                       "severity": 0.6, "features": {"eef_x": 0.1}, "recovered_step": -1,
                                       "recovery": ""}]
        common = {"episode_id": episode_id, "scenario_id": scenario["scenario_id"], "model_id": model_id}
        return [
            make_event("EpisodeStarted", (episode_id,), "responder", request["envelope"]["run_id"], event_time=at,
                       **common, request_id=request["request_id"],
                       benchmark=scenario.get("benchmark") or "robosuite", task=scenario["env_name"],
                       scenario=scenario, instruction=scenario["instruction"], model_version="1", seed=seed,
                       variant="", simulator="stand-in"),
            make_event("EpisodeEnded", (episode_id,), "responder", request["envelope"]["run_id"],
                       event_time=at + timedelta(milliseconds=500), **common, success=success,
                       termination=termination, steps=50, total_reward=float(success), quality=quality, error=None,
                       final_keyframe_sha256=keyframe),
            make_event("EpisodeAnalysed", (episode_id,), "detector", request["envelope"]["run_id"],
                       event_time=at + timedelta(milliseconds=500), **common, scenario=scenario, success=success,
                       termination=termination, steps=50, quality=quality, analysed=True, reason="",
                       moments=moments, detector_version="stand-in"),
        ]

    def requests_for(self, scenario_id: str) -> list[dict]:
        return [r for r in self.requests if r["scenario_id"] == scenario_id]


class CriticsThread:
    """The real CriticsWorker in a thread of its own, in the critics' consumer group of this world."""

    def __init__(self, world: LoopWorld, config: CriticsConfig, judge=None):
        self.stop_event = threading.Event()
        consumer = Consumer(consumer_config(world.broker, world.critics_group, SESSION_MS))
        self.worker = CriticsWorker(consumer, Publisher(make_producer(world.broker), world.prefix, world.codec),
                                    world.store, world.codec, config, world.prefix, judge=judge)
        self.assigned = threading.Event()
        self.thread = threading.Thread(target=self.worker.run, args=(self.stop_event, self.assigned.set),
                                       name="critics", daemon=True)

    def start(self) -> CriticsThread:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the critics worker did not stop"


class LoopWorld:
    def __init__(self, broker: str, store, tmp_path: Path, outcomes: dict[str, Outcome],
                 gate: GateConfig | None = None, t0: datetime | None = None, prefix: str | None = None):
        self.broker, self.store = broker, store
        self.prefix = prefix or f"l{uuid.uuid4().hex[:10]}."
        ensure_topics(broker, self.prefix)
        self.codec = Codec()
        self.t0 = t0 or datetime.now(UTC).replace(microsecond=0)
        self.keyframes = KeyframeStore(tmp_path / "keyframes")
        self.outcomes = {BASE["scenario_id"]: always, **outcomes}
        self.publisher = Publisher(make_producer(broker), self.prefix, self.codec)
        self.responder = Responder(broker, self.prefix, self.outcomes, self.keyframes, self.codec)
        self.sink_stop = threading.Event()
        self.sink = make_sink(store, broker, self.prefix)
        self.sink_thread = threading.Thread(target=self.sink.run, args=(self.sink_stop,), name="sink", daemon=True)
        self.critics_group = f"critics-{self.prefix}"
        self.gate_config = gate or GateConfig(run_id="gate")
        self.gate = self.new_gate()
        self.critics_threads: list[CriticsThread] = []
        self.gate_clock = self.t0 + timedelta(seconds=60)  # nothing times out unless a test moves it

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> LoopWorld:
        self.sink_thread.start()
        self.responder.thread.start()
        return self

    def stop(self) -> None:
        for c in self.critics_threads:
            if c.thread.is_alive():
                c.stop()
        self.responder.stop_event.set()
        self.responder.thread.join(timeout=30)
        self.sink_stop.set()
        self.sink_thread.join(timeout=60)

    def critics(self, config: CriticsConfig | None = None, judge=None) -> CriticsThread:
        thread = CriticsThread(self, config or CriticsConfig(poll_interval_s=0.3), judge)
        self.critics_threads.append(thread)
        return thread

    def new_gate(self) -> GateRunner:
        """A gate as a restarted streams worker builds it: nothing carried over."""
        self.gate = GateRunner(lambda: self.store, self.codec, PromotionGate(self.gate_config),
                               clock=lambda: self.gate_clock)
        return self.gate

    # -- what the test publishes ---------------------------------------------------------------
    def at(self, seconds: float) -> datetime:
        return self.t0 + timedelta(seconds=seconds)

    def publish(self, *events: dict) -> None:
        for event in events:
            self.publisher.publish(event)
        self.publisher.flush()

    def register(self, models: dict[str, str] = MODELS) -> None:
        self.publish(*(make_event("ModelRegistered", (m, "1"), "test", "test", event_time=self.at(0), model_id=m,
                                  version="1", kind=kind, description=f"{m} (stand-in)", params={})
                       for m, kind in models.items()))
        self.until(lambda: len(q.models(self.store)) == len(models), "the models are registered")

    def promote_base(self, scenario: dict = BASE) -> None:
        candidate = base_candidate(scenario, "test")
        candidate["envelope"]["event_time"] = self.at(0)
        self.publish(candidate)
        self.until(lambda: q.candidates(self.store), "the base candidate is in the log")
        self.tick_gate()
        self.until(lambda: scenario["scenario_id"] in q.active_scenarios(self.store), "the base is promoted")

    def sweep(self, scenario: dict, seeds: Iterable[int], models: Iterable[str] = MODELS) -> list[str]:
        requests = []
        for m in models:
            request_id = "req-" + stable_id("sweep", scenario["scenario_id"], m, tuple(seeds))[:20]
            requests.append(make_event("RolloutRequested", (request_id,), "orchestrator", "test",
                                       event_time=self.at(1), request_id=request_id,
                                       scenario_id=scenario["scenario_id"], scenario=scenario, model_id=m,
                                       seeds=list(seeds), purpose="sweep", keyframe_every=0))
        self.publish(*requests)
        total = len(requests) * len(list(seeds))
        self.until(lambda: self.ended(scenario["scenario_id"]) >= total, f"the sweep of {scenario['scenario_id']}")
        return [r["request_id"] for r in requests]

    def propose(self, scenario: dict, cycle_id: str = "c1", factor: str = "friction", seconds: float = 10) -> dict:
        event = make_event("CandidateProposed", (scenario["scenario_id"],), "mutator", "test",
                           event_time=self.at(seconds), scenario_id=scenario["scenario_id"],
                           parent_scenario_id=scenario["parent_id"], operator=factor, params={"factor": factor},
                           source_cluster_id="fc-1", scenario=scenario, mutator_version="test", factor=factor,
                           generator="failure-guided", cycle_id=cycle_id, feasibility_json="{}")
        self.publish(event)
        return event

    def tick_gate(self) -> list[dict]:
        """One gate tick; its decisions published (and returned, decoded)."""
        out = self.gate.tick()
        for m in out:
            self.publisher.publish_raw(self.prefix + m.topic, m.key, m.value)
        self.publisher.flush()
        return [self.codec.decode(m.value) for m in out]

    # -- reading ---------------------------------------------------------------------------
    def ended(self, scenario_id: str) -> int:
        return self.store.query("SELECT count() FROM {database}.rollout_episodes FINAL WHERE scenario_id = {s:String} "
                                "AND envelope.event_type = 'EpisodeEnded'", {"s": scenario_id})[0][0]

    def verdicts(self, scenario_id: str) -> dict[str, q.Verdict]:
        return {v.critic: v for v in q.verdicts(self.store, scenario_ids=[scenario_id])}

    def dead_letters(self) -> list[tuple[str, str]]:
        return self.store.query("SELECT source_topic, reason FROM {database}.dead_letters FINAL")

    def until(self, done: Callable[[], object], what: str, timeout_s: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            for name, thread in (("sink", self.sink_thread), ("responder", self.responder.thread)):
                assert thread.is_alive() or not thread.ident, f"the {name} thread died while waiting for {what}"
            assert self.responder.error is None, f"the responder failed: {self.responder.error!r}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(POLL_S)


# -- verdicts as the critics write them (for tests that drive the gate without the critics) ------

def verdict_event(scenario_id: str, at: datetime, fields: dict) -> dict:
    return make_event("CriticVerdict", (scenario_id, fields["critic"], fields["critic_version"]), "critics",
                      "critics", event_time=at, scenario_id=scenario_id, **fields)


def critic_verdicts(scenario_id: str, at: datetime, accept: bool) -> list[dict]:
    """The critics' verdicts on a candidate, from their own rules: accepted by robustness (the weak model
    loses every seed of 10), safe, semantic not run; or rejected by robustness at the first look
    (the oracle fails)."""
    from consumers.critics.safety import SafetyConfig, judge_safety
    from consumers.critics.semantic import SemanticVerdict
    from consumers.critics.sequential import SequentialConfig, decide

    cfg = SequentialConfig()
    if not accept:
        return [verdict_event(scenario_id, at, decide([False] * 5, {"strong": [(False, True)] * 5,
                                                                      "weak": [(False, True)] * 5}, cfg)
                              .verdict_fields(cfg))]
    robust = decide([True] * 10, {"strong": [(True, True)] * 10, "weak": [(False, True)] * 10}, cfg)
    episodes = [{"episode_id": f"ep-{scenario_id}-{i}", "model_id": "oracle", "scenario_id": scenario_id,
                 "success": True, "termination": "success", "steps": 50, "analysed": True, "moments": [],
                 "quality": {**QUALITY, "time_to_success": 40}} for i in range(10)]
    safety = judge_safety(episodes, "oracle", SafetyConfig())
    semantic = SemanticVerdict(False, None, None, "none", "not run: no judge configured")
    return [verdict_event(scenario_id, at, robust.verdict_fields(cfg)),
            verdict_event(scenario_id, at + timedelta(seconds=1), safety.fields()),
            verdict_event(scenario_id, at + timedelta(seconds=2), semantic.fields())]
