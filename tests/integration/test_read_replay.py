"""Replay rebuilds the evolving benchmark's state (versions, promotions, candidates, clusters):
the world's events go through a real broker and the evidence sink, then into an empty store."""

import read_world as world
from sinks import drain, rebuild_from

from consumers.replay import compare
from consumers.state import benchmark_versions, derived_state
from infra.kafka_clients import ensure_topics, make_producer
from producers.publisher import Publisher


def _replay_round_trip(broker: str, store, prefix: str) -> None:
    ensure_topics(broker, prefix)
    publisher = Publisher(make_producer(broker), prefix)
    for event in world.build().events:
        publisher.publish(event)
    publisher.flush()
    drain(store, broker, prefix, dead_letters=False)
    assert [v.version for v in benchmark_versions(store)] == [1, 2, 3]
    rebuilt = rebuild_from(store, broker, prefix, store.database + "_rebuild")
    try:
        before, after, differences = compare(store, rebuilt)
        assert differences == {} and before == after
        assert derived_state(rebuilt)["benchmark_versions"][-1][:2] == [3, ["scn-slip"]]
    finally:
        rebuilt.command("DROP DATABASE IF EXISTS {database}")


def test_replay_rebuilds_versions_and_promotions(tansu, store):
    _replay_round_trip(tansu, store, "replayread.")
