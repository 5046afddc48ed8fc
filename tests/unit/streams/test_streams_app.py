"""The faust app factory: settings the notes require, topics as raw bytes, agents per config.
Builds apps only; connects to nothing. The edge (settings -> app) is tested in
tests/unit/infra/test_streams_worker.py."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from streams.exceptions import ConfigError


@pytest.fixture(scope="module")
def app_module():
    return importlib.import_module("streams.app")


def config(app_module, tmp_path: Path, **over):
    return app_module.StreamsConfig(bootstrap_servers="127.0.0.1:9092,127.0.0.1:9093", topic_prefix="x.",
                                    data_dir=tmp_path / "faust", **over)


def no_consumers(extra: dict):
    raise AssertionError("building an app must not read the broker")


def test_defaults_follow_the_platform_notes(app_module, tmp_path):
    app = app_module.make_app(config(app_module, tmp_path), consumer_factory=no_consumers)
    assert app.conf.broker_session_timeout == 6.0
    assert app.conf.processing_guarantee.value == "at_least_once"
    assert [str(u) for u in app.conf.broker] == ["kafka://127.0.0.1:9092", "kafka://127.0.0.1:9093"]
    assert app.conf.topic_allow_declare is False and app.conf.web_enabled is False
    assert app.conf.stream_wait_empty is False  # the detector holds open episodes' acks back
    assert set(app.agents) == {"failure-detector", "failure-clusterer"}
    detector = app.agents["failure-detector"]
    assert set(detector.channel.topics) == {"x.rollout.steps", "x.rollout.episodes"}
    assert detector.channel.value_serializer == "raw" and detector.channel.key_serializer == "raw"
    assert set(app.agents["failure-clusterer"].channel.topics) == {"x.failures.episodes"}  # one partition
    assert app.failure_clusterer_seat.tp == ("x.failures.episodes", 0)
    assert (tmp_path / "faust").is_dir()


def test_the_clusterer_needs_a_consumer_factory_to_restore_from(app_module, tmp_path):
    with pytest.raises(ConfigError, match="consumer_factory"):
        app_module.make_app(config(app_module, tmp_path))


def test_exactly_once_is_refused_with_the_reason_and_nonsense_too(app_module, tmp_path):
    with pytest.raises(ConfigError, match="never commit"):  # faust-streaming 0.15.3: see streams/app.py
        config(app_module, tmp_path, processing_guarantee="exactly_once")
    with pytest.raises(ConfigError, match="at_most_once"):
        config(app_module, tmp_path, processing_guarantee="at_most_once")
    with pytest.raises(ConfigError, match="bootstrap"):
        app_module.StreamsConfig(bootstrap_servers="")


def test_a_detector_only_worker_has_no_clusterer(app_module, tmp_path):
    app = app_module.make_app(config(app_module, tmp_path, run_clusterer=False))
    assert set(app.agents) == {"failure-detector"}


class FakeStream:
    def __init__(self):
        self.acked = []

    async def ack(self, event):
        self.acked.append((event.message.topic, event.message.partition, event.message.offset))
        return True


def fake_event(topic: str, partition: int, offset: int, generation: int = 1):
    return SimpleNamespace(message=SimpleNamespace(topic=topic, partition=partition, offset=offset,
                                                   generation_id=generation))


def test_held_events_are_acked_in_offset_order_up_to_what_the_stage_releases():
    from streams.failures.agents import HeldEvents

    held, stream = HeldEvents(), FakeStream()
    held.stream = stream
    assert held.renew(1) is True and held.renew(1) is False
    batch = [fake_event("s", 0, 0), fake_event("e", 0, 0), fake_event("s", 0, 1), fake_event("s", 1, 0),
             fake_event("s", 0, 2), fake_event("s", 0, 3, generation=0)]  # the last from before a rebalance
    assert len(held.admit(batch, 1)) == 5 and len(held) == 5
    assert asyncio.run(held.ack({("s", 0): 2, ("e", 0): 0})) == 2
    assert stream.acked == [("s", 0, 0), ("s", 0, 1)]
    asyncio.run(held.ack({("s", 0): 3, ("e", 0): 1, ("s", 1): 1}))
    assert stream.acked[2:] == [("s", 0, 2), ("e", 0, 0), ("s", 1, 0)] and len(held) == 0
    held.admit([fake_event("s", 0, 4)], 1)
    assert held.renew(2) is True and len(held) == 0  # a rebalance: faust delivers them again


def test_backlogged_partitions_are_those_lagging_beyond_a_bound(app_module):
    from faust.exceptions import ConsumerNotStarted

    from streams.failures.agents import backlogged

    class Consumer:
        def highwater(self, tp):
            if tp.partition == 3:
                raise ConsumerNotStarted("not yet")
            return {0: 10, 1: 7, 2: None}[tp.partition]

    delivered = {("s", 0): 7, ("s", 1): 7, ("s", 2): 3, ("s", 3): 1}
    assert backlogged(Consumer(), delivered, 0) == {("s", 0)}
    assert backlogged(Consumer(), delivered, 3) == set()  # live traffic always lags a little
