"""Replay rebuilds the evolving benchmark's state (versions, promotions, candidates, clusters):
the world's events go through a real broker and the evidence sink, then into an empty store."""

import threading

import read_world as world

from consumers.benchmark_state import benchmark_versions, derived_state
from consumers.evidence.sink import EvidenceSink
from consumers.replay import compare, rebuild
from infra.kafka_clients import ensure_topics, make_producer
from producers.publisher import Publisher

SESSION_MS = 6000


def _replay_round_trip(broker: str, store, prefix: str) -> None:
    ensure_topics(broker, prefix)
    publisher = Publisher(make_producer(broker), prefix)
    for event in world.build().events:
        publisher.publish(event)
    publisher.flush()
    sink = EvidenceSink(store, broker, prefix, SESSION_MS, group_id=f"sink-{prefix}", publish_dead_letters=False)
    sink.run(threading.Event(), idle_exit_s=3.0)
    assert [v.version for v in benchmark_versions(store)] == [1, 2, 3]
    rebuilt = rebuild(store, broker, prefix, SESSION_MS, store.database + "_rebuild")
    try:
        before, after, differences = compare(store, rebuilt)
        assert differences == {} and before == after
        assert derived_state(rebuilt)["benchmark_versions"][-1][:2] == [3, ["scn-slip"]]
    finally:
        rebuilt.command("DROP DATABASE IF EXISTS {database}")


def test_replay_rebuilds_versions_and_promotions(tansu, store):
    _replay_round_trip(tansu, store, "replayread.")
