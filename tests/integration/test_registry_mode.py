"""Schema Registry mode end to end: with SEPA_SCHEMA_REGISTRY_URL set, every producer frames its
events with the registry's ids and the sink resolves them: sync-models, synth, a rollout through
the rollout worker `up` started (its request and its pool's episodes), and the streams worker's
failure moments. The registry is a stand-in speaking the real REST API (registry_stand_in.py),
whose ids (1001...) are not the manifest's (1...31): an event framed from the manifest would
carry an id the registry does not know, and the sink would dead-letter it."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from registry_stand_in import FIRST_ID, SchemaRegistry
from stack_helpers import clean_env, processes_holding, sepa

from infra.kafka_clients import ensure_topics
from producers.sim.models import load_models
from schemas.catalog import TOPICS

LANDING_S = 180.0


def framed_ids(bootstrap: str, topics: list[str]) -> dict[str, set[int]]:
    """The schema ids in the framing of every message on the topics, per topic."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ids-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    ids: dict[str, set[int]] = {t: set() for t in topics}
    try:
        metadata = consumer.list_topics(timeout=10).topics
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in topics for p in metadata[t].partitions])
        last = time.monotonic()
        while time.monotonic() - last < 3.0:
            for msg in consumer.consume(500, timeout=0.3):
                if not msg.error():
                    ids[msg.topic()].add(int.from_bytes(msg.value()[1:5], "big"))
                    last = time.monotonic()
    finally:
        consumer.close()
    return ids


@pytest.mark.slow  # one of the default run's longest (README, Test)
def test_every_producer_publishes_with_registry_ids_that_the_sink_resolves(tansu, tmp_path):
    prefix = f"g{uuid.uuid4().hex[:10]}."
    ensure_topics(tansu, prefix)
    memory_dir = tmp_path / "m"
    with SchemaRegistry() as registry:
        env = clean_env(SEPA_BOOTSTRAP_SERVERS=tansu, SEPA_TOPIC_PREFIX=prefix,
                        SEPA_SCHEMA_REGISTRY_URL=registry.url)
        try:
            up = sepa(memory_dir, "up", env=env)
            assert up.returncode == 0, up.stderr
            for command in (["sync-models"], ["synth", "--episodes", "4", "--steps", "80", "--seed", "3"],
                            ["rollout", "--model", "scripted-clumsy", "--episodes", "1", "--horizon", "40",
                             "--timeout", "90"]):
                result = sepa(memory_dir, *command, env=env)
                assert result.returncode == 0, (command, result.stdout, result.stderr)

            deadline = time.monotonic() + LANDING_S
            while True:
                evidence = json.loads(sepa(memory_dir, "status", "--json", env=env).stdout)["evidence"]
                if evidence["failure_moments"] > 0 or time.monotonic() > deadline:
                    break
                time.sleep(2)
        finally:
            down = sepa(memory_dir, "down", env=env)
        assert down.returncode == 0 and processes_holding(memory_dir) == []
        # the broker still answers, but nothing would serve a request: refused before publishing
        orphan = sepa(memory_dir, "rollout", "--model", "oracle", env=env)
        assert orphan.returncode == 1 and orphan.stderr.startswith("error: no rollout worker is running under")

        assert evidence["dead_letters"] == 0, "an event the sink could not resolve"
        assert evidence["models_registry"] == len(load_models()) and evidence["rollout_requests"] == 1
        assert evidence["rollout_episodes"] == 2 * (4 + 1)
        assert evidence["failure_moments"] > 0, "the streams worker published no moment"

        used = framed_ids(tansu, [t.full_name(prefix) for t in TOPICS])
        for name in ("models.registry", "rollout.requests", "rollout.episodes", "rollout.steps", "failures.moments"):
            ids = used[prefix + name]
            assert ids and min(ids) >= FIRST_ID and ids <= set(registry.schemas), (name, ids)
        assert used[prefix + "deadletter"] == set()
        assert {"sepa.ModelRegistered", "sepa.RolloutRequested", "sepa.EpisodeStarted", "sepa.Step",
                "sepa.EpisodeEnded", "sepa.FailureMoment"} <= set(registry.subjects)
