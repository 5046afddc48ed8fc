"""The streams worker's sweeper (streams/gate/sweeps.py): a ModelRegistered read off a real broker,
decided against a real chDB store. A version without trials on the active benchmark gets the sweeps
the orchestrator would ask for (the same ids, the same content: the evidence sink stores them once,
no conflict), only where it has no trials and no request yet; nothing before the first promotion,
nothing for a registration a newer version has replaced; a malformed message is dead-lettered."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from evidence_factory import EvidenceLog, spec, store_events
from sinks import make_sink

from consumers import state as q
from infra import orchestrator
from infra.kafka_clients import ensure_topics, make_producer
from infra.settings import Settings
from producers.publisher import Publisher
from producers.rollout_worker import sweep_request
from producers.sim.models import ModelConfig
from producers.sim.policies import Skill
from schemas.codec import Codec
from schemas.events import make_event, utc_now
from streams.deadletter import RawMessage
from streams.gate.sweeps import SweeperConfig, SweepRunner

SEEDS = 3
LANDING_S = 60.0


def registration(model_id: str, version: str, at) -> dict:
    return make_event("ModelRegistered", (model_id, version), "sync-models", "sync-models", event_time=at,
                      model_id=model_id, version=version, kind="scripted", description="", params={})


def raw_messages(broker: str, topic: str, count: int) -> list[RawMessage]:
    """The first ``count`` messages of a one-partition topic, as faust hands them to the agent."""
    consumer = Consumer({"bootstrap.servers": broker, "group.id": f"read-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out, deadline = [], time.monotonic() + 30
    try:
        while len(out) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                out.append(RawMessage(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    assert len(out) == count, f"{topic}: {len(out)} of {count} messages"
    return out


def landed(store, table: str, count: int) -> None:
    deadline = time.monotonic() + LANDING_S
    while store.query(f"SELECT count() FROM {{database}}.{table} FINAL")[0][0] < count:
        assert time.monotonic() < deadline, f"{table} never reached {count}"
        time.sleep(0.2)


def without_time(event: dict) -> dict:
    return {**event, "envelope": {k: v for k, v in event["envelope"].items() if k != "event_time"}}


@pytest.fixture
def live(tansu, store):
    prefix = f"s{uuid.uuid4().hex[:10]}."
    ensure_topics(tansu, prefix)
    stop = threading.Event()
    sink = make_sink(store, tansu, prefix)
    thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    thread.start()
    yield prefix, Publisher(make_producer(tansu), prefix)
    stop.set()
    thread.join(timeout=30)


def test_a_new_model_version_is_swept_where_it_has_no_trials_with_the_orchestrators_requests(tansu, store, live):
    prefix, publisher = live
    codec = Codec()
    runner = SweepRunner(lambda: store, codec, SweeperConfig(sweep_seeds=SEEDS), topic_prefix=prefix)
    topic = f"{prefix}models.registry"
    t0 = (utc_now() - timedelta(hours=1)).replace(microsecond=0)
    first = registration("m", "1", t0)
    publisher.publish(first)
    publisher.publish_raw(topic, b"m", b"\x00\x00\x00\x00\x01not avro")  # framed, but no event
    publisher.flush()
    raw_first, raw_bad = raw_messages(tansu, topic, 2)

    # before the first promotion there is no benchmark to sweep
    assert runner.on_message(raw_first) == []

    log = EvidenceLog(start=t0)
    tried, untried = spec("tried"), spec("untried")
    log.promoted(tried, 1)
    log.promoted(untried, 2)
    for seed in range(SEEDS):  # m@1 ran on one of them already
        log.episode("m", tried, seed, success=True, model_version="1")
    store_events(store, log.events)

    [out] = runner.on_message(raw_first)
    request = codec.decode(out.value)
    assert (out.topic, out.key) == ("rollout.requests", request["request_id"].encode())
    assert request["scenario_id"] == untried["scenario_id"]
    expected = sweep_request(dict(q.active_benchmark(store).scenarios[1].spec), "m", "1", list(range(SEEDS)))
    assert without_time(request) == without_time(expected)
    assert request["envelope"]["event_time"] == t0  # the registration's: a re-read re-derives it

    # the orchestrator's sweep of the same version is the same request: the sink stores it once
    publisher.publish(request)
    [again] = orchestrator.request_sweeps(publisher, store, [dict(a.spec) for a in q.active_benchmark(store).scenarios
                                                             if a.scenario_id == untried["scenario_id"]],
                                          [ModelConfig(model_id="m", version="1", kind="scripted", skill=Skill())],
                                          list(range(SEEDS)))
    assert again["request_id"] == request["request_id"]
    landed(store, "rollout_requests", 1)
    time.sleep(2.0)  # the orchestrator's copy is stored (or dead-lettered) by now
    assert q.requested(store, [request["request_id"]]) == {request["request_id"]}
    conflicts = store.query("SELECT reason FROM {database}.dead_letters FINAL WHERE source_topic = {t:String}",
                            {"t": f"{prefix}rollout.requests"})
    assert conflicts == []  # the same content under the same id: a duplicate, not a conflict

    # asked already: a re-read of the registration asks for nothing more
    assert runner.on_message(raw_first) == []

    # a new version has trials nowhere: both scenarios; the old registration is not swept any more
    newer = registration("m", "2", t0 + timedelta(minutes=30))
    publisher.publish(newer)
    publisher.flush()
    landed(store, "models_registry", 1)
    raw_newer = raw_messages(tansu, topic, 3)[2]
    requests = [codec.decode(o.value) for o in runner.on_message(raw_newer)]
    assert sorted(r["scenario_id"] for r in requests) == sorted([tried["scenario_id"], untried["scenario_id"]])
    assert {r["request_id"] for r in requests}.isdisjoint({request["request_id"]})  # another version, other ids
    assert runner.on_message(raw_first) == []

    [dead] = runner.on_message(raw_bad)
    assert dead.topic == "deadletter"
    letter = codec.decode(dead.value)
    assert letter["source_topic"] == topic and letter["source_offset"] == 1
    assert runner.stats == {"registrations": 5, "requests": 3}


def test_a_registration_of_a_model_no_rollout_worker_serves_is_dead_lettered_not_swept(tansu, store, live):
    prefix, publisher = live
    codec = Codec()
    runner = SweepRunner(lambda: store, codec, SweeperConfig(sweep_seeds=SEEDS, served_models=frozenset({"m"})),
                         topic_prefix=prefix)
    topic = f"{prefix}models.registry"
    t0 = (utc_now() - timedelta(hours=1)).replace(microsecond=0)
    publisher.publish(registration("ghost-model", "1", t0))
    publisher.publish(registration("m", "1", t0))
    publisher.flush()
    raw_ghost, raw_served = raw_messages(tansu, topic, 2)
    log = EvidenceLog(start=t0)
    log.promoted(spec("active"), 1)
    store_events(store, log.events)

    [dead] = runner.on_message(raw_ghost)
    assert dead.topic == "deadletter"
    reason = codec.decode(dead.value)["reason"]
    assert "'ghost-model' is not in the model registry file" in reason and "served: m" in reason, reason
    assert [o.topic for o in runner.on_message(raw_served)] == ["rollout.requests"]
    assert runner.stats == {"registrations": 1, "requests": 1}


def test_the_streams_worker_runs_the_sweeper_with_the_settings_seeds(tmp_path):
    from infra.streams_config import streams_config
    from streams.app import StreamsConfig, make_app

    settings = Settings(memory_dir=tmp_path, sweep_seeds=7)
    config = streams_config(settings, "127.0.0.1:1")
    assert config.run_sweeper and config.sweeper.sweep_seeds == 7
    assert StreamsConfig(bootstrap_servers="127.0.0.1:1").run_sweeper is False  # the product turns it on
    app = make_app(StreamsConfig(bootstrap_servers="127.0.0.1:1", topic_prefix="x.", data_dir=tmp_path / "faust",
                                 run_detector=False, run_clusterer=False, run_sweeper=True),
                   store_factory=lambda: pytest.fail("building the app must not open the store"))
    assert set(app.agents) == {"sweeper"}
    assert set(app.agents["sweeper"].channel.topics) == {"x.models.registry"}  # one partition: one sweeper
