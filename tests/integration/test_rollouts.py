"""Rollouts end to end: determinism across processes, policy-server failures, the worker loop, an
external policy named in models.yaml swept through the rollout worker into the evidence log."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import threading
import time
import uuid
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from openpi_client import msgpack_numpy
from websockets.sync.server import serve

from infra.kafka_clients import consumer_config, ensure_topics, make_producer, producer_config
from producers.publisher import Publisher
from producers.rollout_worker import (
    GROUP_ID,
    MAX_POLL_INTERVAL_MS,
    RolloutPool,
    RolloutWorker,
    cache_info,
    rollout_request,
    run_seeds,
    sweep_request,
)
from producers.sim.envs import make_env
from producers.sim.rollout import Episode
from producers.websocket_policy import WebSocketPolicy
from schemas.catalog import BY_NAME, DEAD_LETTER_EXCERPT_BYTES
from schemas.codec import Codec
from schemas.events import make_event
from schemas.scenario import ScenarioSpec
from streams.deadletter import Intake, RawMessage

SESSION_MS = 6000


def fresh_prefix(bootstrap: str) -> str:
    name = f"r{uuid.uuid4().hex[:10]}."
    ensure_topics(bootstrap, name)
    return name


def consume(bootstrap: str, topics: list[str], idle_s: float = 2.0, timeout_s: float = 30.0) -> list[dict]:
    """Every event on the topics, in (topic, partition, offset) order, read without a consumer group
    until nothing new arrived for idle_s (Tansu's watermarks are not exact enough to stop on)."""
    codec = Codec()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    records: dict[tuple, dict] = {}
    try:
        metadata = consumer.list_topics(timeout=10).topics
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in metadata[t].partitions])
        start = last = time.monotonic()
        while time.monotonic() - start < timeout_s and time.monotonic() - last < idle_s:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                records[(msg.topic(), msg.partition(), msg.offset())] = codec.decode(msg.value())
                last = time.monotonic()
    finally:
        consumer.close()
    return [records[k] for k in sorted(records)]


def without_event_time(events: list[dict]) -> list[dict]:
    out = []
    for event in events:
        event = dict(event, envelope={k: v for k, v in event["envelope"].items() if k != "event_time"})
        out.append(event)
    return out


def digest(events: list[dict]) -> str:
    return hashlib.sha256(json.dumps(events, sort_keys=True, default=repr).encode()).hexdigest()


def lift_spec(horizon: int) -> ScenarioSpec:
    return ScenarioSpec(env_name="Lift", horizon=horizon, instruction="lift the cube")


# 1. The same request in two processes publishes the same events.

def test_same_request_in_two_processes_publishes_identical_events(tansu, tmp_path):
    request = rollout_request(lift_spec(60).to_dict(), "scripted-novice", [3])
    prefixes = [fresh_prefix(tansu), fresh_prefix(tansu)]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx) as pool:
        futures = [pool.submit(run_seeds, producer_config(tansu), p, Codec(), request, [3], str(tmp_path / f"kf{i}"))
                   for i, p in enumerate(prefixes)]
        summaries = [f.result(timeout=120) for f in futures]
    assert summaries[0] == summaries[1]
    assert len(summaries[0]) == 1 and summaries[0][0].seed == 3 and summaries[0][0].error is None

    streams = [without_event_time(consume(tansu, [f"{p}rollout.steps", f"{p}rollout.episodes"]))
               for p in prefixes]
    for events, summary in zip(streams, summaries, strict=True):
        types = [e["envelope"]["event_type"] for e in events]
        assert types.count("EpisodeStarted") == 1 and types.count("EpisodeEnded") == 1
        assert types.count("Step") == summary[0].steps > 0
    assert streams[0] == streams[1]
    assert digest(streams[0]) == digest(streams[1])
    # The comparison can fail: any changed field changes the digest.
    tampered = [dict(e) for e in streams[1]]
    step = next(i for i, e in enumerate(tampered) if e["envelope"]["event_type"] == "Step")
    tampered[step] = dict(tampered[step], reward=tampered[step]["reward"] + 1.0)
    assert digest(tampered) != digest(streams[0])


# 2. A policy over the openpi WebSocket protocol, against servers that misbehave.

class PolicyServer:
    """An openpi-speaking server: metadata on connect, then one reply per request."""

    def __init__(self, reply, close_after: int | None = None, hang_after: int | None = None):
        self.reply, self.close_after, self.hang_after = reply, close_after, hang_after
        self.release = threading.Event()  # a hung server's handler waits on it
        self.requests = 0
        self.prompts: list[str] = []
        self.keys: set[str] = set()  # every observation key a request carried
        self.last: dict = {}  # the last request
        self.server = serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        host, port = self.server.socket.getsockname()[:2]
        self.uri = f"ws://{host}:{port}"

    def _handle(self, conn) -> None:
        conn.send(msgpack_numpy.packb({}))
        for message in conn:
            self.requests += 1
            obs = msgpack_numpy.unpackb(message)
            self.last = obs
            self.prompts.append(obs.get("prompt"))
            self.keys |= set(obs)
            if self.close_after is not None and self.requests > self.close_after:
                conn.close()
                return
            if self.hang_after is not None and self.requests > self.hang_after:
                self.release.wait(30)  # never answers while the test runs
                return
            reply = self.reply()
            conn.send(msgpack_numpy.packb(reply if isinstance(reply, dict) else {"actions": reply}))

    def __enter__(self) -> PolicyServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def lift_env():
    env = make_env(lift_spec(20))
    yield env
    env.close()


def run_against(env, uri: str, seed: int = 0, observation=None, cameras=(), reply_timeout_s: float = 30):
    policy = WebSocketPolicy(uri, action_dim=env.action_dim, connect_timeout_s=5, observation=observation,
                             reply_timeout_s=reply_timeout_s)
    episode = Episode(env, policy, seed, policy_cameras=cameras, policy_camera_size=32)
    steps = list(episode)
    policy.close()
    return episode.outcome, steps


def test_well_behaved_policy_server_runs_to_timeout(lift_env):
    with PolicyServer(lambda: np.zeros((4, 7))) as server:
        outcome, steps = run_against(lift_env, server.uri)
    assert outcome.termination == "timeout" and outcome.error is None and not outcome.success
    assert outcome.steps == 20 and len(steps) == 20
    assert server.requests == 5  # one request per 4-action chunk
    assert server.prompts[0] == "lift the cube"
    assert all(s.action == [0.0] * 7 for s in steps)


def test_a_pixel_policy_gets_its_cameras_frames_with_every_request():
    env = make_env(lift_spec(20), keyframes=True)  # rendering needs it (the rollout worker's envs have it)
    layout = {"observation/image": ("agentview_image",), "observation/wrist_image": ("robot0_eye_in_hand_image",),
              "observation/state": ("robot0_eef_pos",)}
    with PolicyServer(lambda: np.zeros((4, 7))) as server:
        outcome, steps = run_against(env, server.uri, observation=layout, cameras=("agentview", "robot0_eye_in_hand"))
    env.close()
    assert outcome.termination == "timeout" and server.requests == 5
    image, wrist = server.last["observation/image"], server.last["observation/wrist_image"]
    assert image.dtype == np.uint8 and image.shape == wrist.shape == (32, 32, 3)
    assert image.std() > 5 and not np.array_equal(image, wrist)  # two real views, not blank frames
    assert server.last["observation/state"].shape == (3,)


def test_a_chunk_player_s_cameras_are_rendered_only_at_the_steps_it_asks_the_server():
    """Between requests the policy plays its chunk open loop and would not see a frame: 20 steps of
    4-action chunks render each camera 5 times, not 20."""
    env = make_env(lift_spec(20), keyframes=True)
    rendered = []
    render = env.render_keyframe
    env.render_keyframe = lambda *args: rendered.append(args) or render(*args)
    layout = {"observation/image": ("agentview_image",), "observation/state": ("robot0_eef_pos",)}
    with PolicyServer(lambda: np.zeros((4, 7))) as server:
        outcome, _ = run_against(env, server.uri, observation=layout, cameras=("agentview",))
    env.close()
    assert outcome.termination == "timeout" and server.requests == 5
    assert rendered[:-1] == [(32, "agentview")] * 5 and len(rendered[-1]) == 1  # and the timeout's final frame


def test_server_that_disconnects_ends_the_episode_as_env_error_naming_it(lift_env):
    with PolicyServer(lambda: np.zeros((4, 7)), close_after=3) as server:
        outcome, steps = run_against(lift_env, server.uri)
    assert outcome.termination == "env_error" and not outcome.success  # the harness's failure, not the policy's
    assert len(steps) == 12  # three chunks of four actions, then the fourth request fails
    assert "step 12" in outcome.error and "PolicyServerUnavailable" in outcome.error
    assert server.uri in outcome.error and "failed" in outcome.error


def test_a_server_that_hangs_ends_the_episode_as_env_error_instead_of_hanging_the_worker(lift_env):
    with PolicyServer(lambda: np.zeros((4, 7)), hang_after=2) as server:
        outcome, steps = run_against(lift_env, server.uri, reply_timeout_s=1.0)
    assert outcome.termination == "env_error" and len(steps) == 8
    assert f"policy server {server.uri} did not answer within 1 s" in outcome.error


def test_an_error_reply_ends_the_episode_as_policy_error_with_the_servers_reason(lift_env):
    with PolicyServer(lambda: {"error": "observation/image must be uint8"}) as server:
        outcome, steps = run_against(lift_env, server.uri)
    assert outcome.termination == "policy_error" and steps == []
    assert "refused the request: observation/image must be uint8" in outcome.error


@pytest.mark.parametrize("reply, cause", [
    (lambda: np.zeros((4, 3)), "shape (4, 3), expected (H, 7)"),
    (lambda: np.full((4, 7), np.nan), "non-finite"),
])
def test_malformed_action_chunk_ends_the_episode_as_policy_error(lift_env, reply, cause):
    with PolicyServer(reply) as server:
        outcome, steps = run_against(lift_env, server.uri)
    assert outcome.termination == "policy_error" and not outcome.success
    assert steps == [] and outcome.steps == 0
    assert cause in outcome.error and "step 0" in outcome.error


def test_unreachable_server_is_an_env_error(lift_env):
    with PolicyServer(lambda: np.zeros((4, 7))) as server:
        uri = server.uri
    outcome, steps = run_against(lift_env, uri)
    assert outcome.termination == "env_error" and steps == []
    assert "cannot reach the policy server" in outcome.error


# 3. The worker dead-letters a bad request and keeps serving.

def test_worker_dead_letters_an_unknown_model_and_a_huge_value_and_serves_the_next_request(tansu, tmp_path):
    prefix = fresh_prefix(tansu)
    spec = lift_spec(30).to_dict()
    bad = rollout_request(spec, "no-such-model", [0], run_id="bad")
    good = rollout_request(spec, "scripted-novice", [1], run_id="good")
    # 10 MiB that Tansu takes (Apache Kafka would refuse it): the worker used to die on it, trying to
    # dead-letter the whole value, and again after every restart
    huge = Codec().encode(bad)[:5] + b"\x01" * (10 * 1024 * 1024)
    raw = Producer({"bootstrap.servers": tansu, "message.max.bytes": 20_000_000, "log_level": 0})
    raw.produce(f"{prefix}rollout.requests", key=bad["request_id"].encode(), value=huge)
    # a well-formed event of a type rollout.requests does not carry: the sink's reason, word for word
    misplaced = Codec().encode(make_event("Promoted", ("s",), "gate", "r", scenario_id="s", reason="x",
                                          evidence_event_ids=[], gate_version="1"))
    raw.produce(f"{prefix}rollout.requests", key=bad["request_id"].encode(), value=misplaced)
    raw.flush(60)
    publisher = Publisher(make_producer(tansu), prefix)
    publisher.publish(bad)  # the key of the two before it: one partition, the dead letters in this order
    publisher.publish(good)
    publisher.flush()

    pool = RolloutPool(producer_config(tansu), prefix, Codec(), tmp_path, processes=1)
    consumer = Consumer(consumer_config(tansu, GROUP_ID, SESSION_MS, **{"max.poll.interval.ms": MAX_POLL_INTERVAL_MS}))
    worker = RolloutWorker(pool, consumer, Publisher(make_producer(tansu), prefix), Codec())
    stop = threading.Event()
    assigned = threading.Event()  # the readiness signal `sepa-eval up` waits for
    thread = threading.Thread(target=worker.run, args=(stop,), kwargs={"on_assigned": assigned.set}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 90
        while worker.served < 4 and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.2)
        assert worker.served == 4 and assigned.is_set()  # every message, the refused ones too
    finally:
        stop.set()
        thread.join(timeout=15)
        pool.close()
    assert not thread.is_alive()

    dead = consume(tansu, [f"{prefix}deadletter"])
    assert len(dead) == 3
    assert {d["source_topic"] for d in dead} == {f"{prefix}rollout.requests"}
    assert dead[0]["reason"].startswith(f"message of {len(huge)} bytes is over the") and "sha256" in dead[0]["reason"]
    assert dead[0]["original"] == huge[:DEAD_LETTER_EXCERPT_BYTES]
    topic = f"{prefix}rollout.requests"
    _, intake = Intake(Codec(), "x", "r", {topic: BY_NAME["rollout.requests"]}).decode(
        RawMessage(topic, 0, 1, None, misplaced))
    assert dead[1]["reason"] == intake["reason"] and "does not belong on topic rollout.requests" in dead[1]["reason"]
    assert "KeyError" in dead[2]["reason"] and "no-such-model" in dead[2]["reason"]
    assert Codec().decode(dead[2]["original"])["request_id"] == bad["request_id"]

    episodes = consume(tansu, [f"{prefix}rollout.episodes"])
    by_type = {e["envelope"]["event_type"]: e for e in episodes}
    assert [e["envelope"]["event_type"] for e in episodes] == ["EpisodeStarted", "EpisodeEnded"]
    assert by_type["EpisodeStarted"]["request_id"] == good["request_id"]
    assert by_type["EpisodeStarted"]["model_id"] == "scripted-novice" and by_type["EpisodeStarted"]["seed"] == 1
    ended = by_type["EpisodeEnded"]
    assert ended["episode_id"] == by_type["EpisodeStarted"]["episode_id"]
    assert ended["termination"] in ("success", "timeout") and 0 < ended["steps"] <= 30
    assert all(e.get("request_id") != bad["request_id"] for e in episodes)


# 4. A pool process keeps its env between episodes and requests; the events do not change.

def test_a_cached_env_publishes_what_a_fresh_process_publishes(tansu, tmp_path):
    spec = lift_spec(40).to_dict()
    request = rollout_request(spec, "scripted-novice", [1, 3], run_id="cached")
    cached_prefix, fresh_prefix_ = fresh_prefix(tansu), fresh_prefix(tansu)

    pool = RolloutPool(producer_config(tansu), cached_prefix, Codec(), tmp_path / "kf", processes=1)
    try:
        [pid] = pool.warm(spec)
        pool.run(rollout_request(spec, "scripted-clumsy", [5], run_id="history"))  # the env has a past
        cached = pool.run(request)
        assert pool.executor.submit(cache_info).result() == (pid, [(spec["scenario_id"], True)])
    finally:
        pool.close()

    # each seed in a process of its own, which builds its env for that one episode
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx, max_tasks_per_child=1) as fresh_pool:
        futures = [fresh_pool.submit(run_seeds, producer_config(tansu), fresh_prefix_, Codec(), request, [seed],
                                     str(tmp_path / "kf2"))
                   for seed in (1, 3)]
        fresh = sorted((s for f in futures for s in f.result(timeout=120)), key=lambda s: s.seed)
    assert cached == fresh and [s.seed for s in cached] == [1, 3]

    episode_ids = {s.episode_id for s in cached}
    streams = []
    for prefix in (cached_prefix, fresh_prefix_):
        events = without_event_time(consume(tansu, [f"{prefix}rollout.steps", f"{prefix}rollout.episodes"]))
        streams.append(sorted((e for e in events if e["episode_id"] in episode_ids),
                              key=lambda e: (e["episode_id"], e["envelope"]["event_type"], e.get("t", -1))))
    assert len(streams[0]) == sum(s.steps for s in cached) + 2 * len(cached)
    assert digest(streams[0]) == digest(streams[1])


# 5. An external policy in models.yaml (kind websocket) is swept like any model: through the rollout
#    worker, in its layout, into the evidence log; a request it served already is not run again.

WEBSOCKET_MODELS = """models:
  - model_id: oracle
    version: "1"
    kind: oracle
    rank: 0
    skill: {{}}
  - model_id: ws-policy
    version: "4"
    kind: websocket
    uri: {uri}
    action_dim: 7
    observation: {{observation/state: [robot0_eef_pos, robot0_gripper_qpos]}}
"""


def test_a_websocket_model_is_swept_through_the_rollout_worker_into_the_evidence_log(tansu, store, tmp_path):
    from sinks import make_sink

    from consumers import state as q

    prefix = fresh_prefix(tansu)
    stop = threading.Event()
    sink = make_sink(store, tansu, prefix)
    sink_thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    sink_thread.start()
    spec = lift_spec(20).to_dict()
    with PolicyServer(lambda: np.zeros((4, 7))) as server:
        models = tmp_path / "models.yaml"
        models.write_text(WEBSOCKET_MODELS.format(uri=server.uri))
        request = sweep_request(spec, "ws-policy", "4", [0, 1])
        publisher = Publisher(make_producer(tansu), prefix)
        publisher.publish(request)
        publisher.publish(request)  # asked twice (the orchestrator and the sweeper): run once
        publisher.flush()
        pool = RolloutPool(producer_config(tansu), prefix, Codec(), tmp_path / "kf", processes=1, models_path=models)
        consumer = Consumer(consumer_config(tansu, GROUP_ID, SESSION_MS,
                                            **{"max.poll.interval.ms": MAX_POLL_INTERVAL_MS}))
        worker = RolloutWorker(pool, consumer, Publisher(make_producer(tansu), prefix), Codec())
        thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 120
            while worker.served < 2 and time.monotonic() < deadline and thread.is_alive():
                time.sleep(0.2)
            assert worker.served == 2 and worker.skipped == 1
            while len(q.trials(store, model_ids=["ws-policy"])) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            stop.set()
            thread.join(timeout=15)
            sink_thread.join(timeout=30)
            pool.close()
    trials = q.trials(store, model_ids=["ws-policy"])
    assert [(t.seed, t.model_version, t.termination, t.steps, t.request_id) for t in trials] == [
        (0, "4", "timeout", 20, request["request_id"]), (1, "4", "timeout", 20, request["request_id"])]
    assert server.requests == 10  # two episodes of five 4-action chunks: the second copy ran nothing
    assert server.keys == {"observation/state", "prompt"}  # the layout models.yaml names
    assert q.rollouts_spent(store)[0].ended_episodes == 2


# 6. A websocket model served in lock-step (models.yaml batch / concurrency): several envs per
#    process, one call for all their observations, and every episode the one batch 1 publishes.



def test_a_batched_model_publishes_the_episodes_batch_one_publishes(tansu, tmp_path):
    from bench.policy_server import LatencyPolicyServer
    from bench.policy_serving import MODEL

    spec = lift_spec(25).to_dict()
    request = rollout_request(spec, "ws-reach", [0, 1, 2, 3, 4], run_id="lockstep")
    streams, servers = {}, {}
    for name, batch in [("single", 1), ("batched", 2)]:
        prefix = fresh_prefix(tansu)
        models = tmp_path / f"{name}.yaml"
        with LatencyPolicyServer(latency_s=0.0, chunk=5, serial=False) as server:
            models.write_text(MODEL.format(uri=server.uri, batch=batch, concurrency=batch))
            pool = RolloutPool(producer_config(tansu), prefix, Codec(), tmp_path / f"kf-{name}", processes=1,
                               models_path=models)
            try:
                summaries = pool.run(request)
            finally:
                pool.close()
        servers[name] = server
        assert [(s.seed, s.steps, s.error) for s in summaries] == [(seed, 25, None) for seed in range(5)]
        events = without_event_time(consume(tansu, [f"{prefix}rollout.steps", f"{prefix}rollout.episodes"]))
        streams[name] = sorted(events, key=lambda e: (e["episode_id"], e["envelope"]["event_type"], e.get("t", -1)))

    # one observation per call at batch 1; calls of two at a time in lock-step (five seeds over
    # four lanes: the lane that takes the fifth runs its last episode alone)
    assert set(servers["single"].batch_sizes) == {1}
    assert max(servers["batched"].batch_sizes) == 2
    assert servers["batched"].observations == servers["single"].observations == 5 * 5
    assert len(streams["batched"]) == 5 * (25 + 2)
    assert digest(streams["batched"]) == digest(streams["single"])
    # each seed its own start state, whatever the batch (LeRobot's eval once let the batch size
    # bound the distinct start states)
    first_steps = [e for e in streams["batched"] if e["envelope"]["event_type"] == "Step" and e["t"] == 0]
    assert len({json.dumps(e["object_poses"], sort_keys=True) for e in first_steps}) == 5


def test_a_batched_model_whose_server_is_gone_ends_each_episode_as_an_env_error(tansu, tmp_path):
    from bench.policy_serving import MODEL

    with PolicyServer(lambda: np.zeros((4, 7))) as server:
        uri = server.uri  # closed on exit: nothing listens there any more
    models = tmp_path / "models.yaml"
    models.write_text(MODEL.format(uri=uri, batch=2, concurrency=1))
    pool = RolloutPool(producer_config(tansu), fresh_prefix(tansu), Codec(), tmp_path / "kf", processes=1,
                       models_path=models)
    try:
        summaries = pool.run(rollout_request(lift_spec(10).to_dict(), "ws-reach", [0, 1, 2], run_id="gone"))
    finally:
        pool.close()
    assert [(s.seed, s.termination, s.steps) for s in summaries] == [(seed, "env_error", 0) for seed in range(3)]
    assert all(f"cannot reach the policy server at {uri}" in s.error for s in summaries)
