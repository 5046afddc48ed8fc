"""Our scale mode tested the way Kafka tests itself (its transactions_test bounces brokers under a
consumer and asserts no loss and no duplicates): a 3-broker KRaft cluster from the same Maven jars,
replication factor 3, min.insync.replicas 2. During a `run`, the leader of most of rollout.steps'
partitions is killed with -9 and later started again. The evidence log must hold every event on
the topics exactly once, and the run must end with the same candidates and decisions as the same
run on the same cluster without the kill."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from stack_helpers import ROOT, clean_env, run_chdb, sepa, sepa_command

from infra.apache_kafka import KafkaCluster, fetch_jars
from infra.kafka_clients import topic_message_counts
from schemas.catalog import TOPICS
from schemas.codec import Codec

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(1800)]
RUN_ARGS = ("run", "--cycles", "1", "--sweep-seeds", "8", "--max-candidates", "2")
KILL_AFTER_STEPS = 1500  # on rollout.steps: mid-sweep
DOWN_FOR_S = 20.0


def _topic_event_ids(bootstrap: str, prefix: str) -> dict[str, list[str]]:
    """Every message's event id on every catalog topic, read committed, per table."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"audit-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    codec, ids = Codec(), {t.table: [] for t in TOPICS}
    table_of = {t.full_name(prefix): t.table for t in TOPICS}
    try:
        metadata = consumer.list_topics(timeout=10).topics
        consumer.assign([TopicPartition(name, p, OFFSET_BEGINNING) for name in table_of
                         for p in metadata[name].partitions])
        last = time.monotonic()
        while time.monotonic() - last < 5.0:
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error() is None:
                    ids[table_of[msg.topic()]].append(codec.decode(msg.value())["envelope"]["event_id"])
                    last = time.monotonic()
    finally:
        consumer.close()
    return ids


def _stored_event_ids(memory_dir) -> dict[str, list[str]]:
    return json.loads(run_chdb(memory_dir, f"""
import json
tables = {[t.table for t in TOPICS]!r}
print(json.dumps({{t: [r[0] for r in store.query(f"SELECT envelope.event_id FROM {{{{database}}}}.{{t}}")]
                   for t in tables}}))
"""))


def _decisions(memory_dir) -> dict:
    return json.loads(run_chdb(memory_dir, """
import json
from consumers import state as q
print(json.dumps({
    "candidates": sorted([c.scenario_id, c.status] for c in q.candidates(store)),
    "decisions": sorted([d.event_type, d.scenario_id, d.benchmark_version, d.event_id] for d in q.decisions(store)),
}))
"""))


def _run(memory_dir, env, cluster: KafkaCluster | None = None, prefix: str = "") -> tuple[str, float | None]:
    """`run` to its end; with a cluster, kill -9 the leader of most steps partitions mid-sweep and
    start it again DOWN_FOR_S later. Returns run's output and when the broker was killed."""
    process = subprocess.Popen(sepa_command(memory_dir, *RUN_ARGS), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    killed_at = None
    try:
        if cluster is not None:
            steps = f"{prefix}rollout.steps"
            while process.poll() is None:
                counts = topic_message_counts(cluster.bootstrap_servers, [steps]) if killed_at is None else {}
                if counts.get(steps, 0) >= KILL_AFTER_STEPS:
                    [(victim, _)] = Counter(cluster.leaders(steps).values()).most_common(1)
                    cluster.kill(victim)
                    killed_at = time.monotonic()
                    time.sleep(DOWN_FOR_S)
                    cluster.start(victim)
                    break
                time.sleep(1.0)
        out, _ = process.communicate(timeout=1500)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, out[-4000:]
    return out, killed_at


@pytest.mark.slow  # two runs on a 3-JVM cluster: ~12 min
def test_a_run_survives_kill_9_of_the_steps_leader_with_every_event_stored_once(tmp_path):
    fetch_jars()
    with KafkaCluster(tmp_path / "cluster") as cluster:
        bouncing, clean = tmp_path / "bounced", tmp_path / "clean"
        env = clean_env(SEPA_BOOTSTRAP_SERVERS=cluster.bootstrap_servers, SEPA_TOPIC_PREFIX="b.")
        try:
            _, killed_at = _run(bouncing, env, cluster, "b.")
        finally:
            sepa(bouncing, "down", env=env)
        assert killed_at is not None, "the run ended before the steps topic reached the kill point"

        on_topics, stored = _topic_event_ids(cluster.bootstrap_servers, "b."), _stored_event_ids(bouncing)
        for table, ids in stored.items():
            duplicates = [i for i, n in Counter(ids).items() if n > 1]
            assert duplicates == [], f"{table}: stored more than once: {duplicates[:5]}"
            missing = set(on_topics[table]) - set(ids)
            assert missing == set(), f"{table}: on the topic, not in the evidence log: {sorted(missing)[:5]}"
        assert stored["dead_letters"] == [], "nothing was dead-lettered"

        env_clean = clean_env(SEPA_BOOTSTRAP_SERVERS=cluster.bootstrap_servers, SEPA_TOPIC_PREFIX="c.")
        try:
            _run(clean, env_clean)
        finally:
            sepa(clean, "down", env=env_clean)
        assert _decisions(bouncing) == _decisions(clean)
