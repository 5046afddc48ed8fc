"""What must hold: kill -9 of the sink mid-stream loses and duplicates nothing; 100k events replay
into an empty store with an identical digest. Real brokers, real chDB, a real `sepa-eval` process."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from consumers.evidence.sink import EvidenceSink
from consumers.replay import compare, rebuild
from infra.kafka_clients import consumer_config, make_producer
from producers.publisher import Publisher
from producers.synthetic import episodes
from schemas.codec import Codec

CLI = [sys.executable, "-m", "infra.cli"]
ROOT = Path(__file__).resolve().parents[2]


def cli_env(broker: str, prefix: str, memory_dir: Path, **extra) -> dict:
    return {**os.environ, "SEPA_BOOTSTRAP_SERVERS": broker, "SEPA_TOPIC_PREFIX": prefix,
            "SEPA_MEMORY_DIR": str(memory_dir), **extra}


def publish_synthetic(broker, prefix, n_episodes, steps, seed) -> int:
    publisher = Publisher(make_producer(broker), prefix)
    for event in episodes(n_episodes, steps, seed, run_id=f"seed-{seed}"):
        publisher.publish(event)
    publisher.flush()
    return publisher.published


@pytest.mark.slow  # one of the default run's longest, on both brokers (README, Test)
def test_kill_9_mid_stream_then_restart_stores_every_event_exactly_once(broker, prefix, tmp_path):
    n_episodes, steps = 300, 100
    publish_synthetic(broker, prefix, n_episodes, steps, seed=11)
    env = cli_env(broker, prefix, tmp_path, SEPA_SINK_BATCH_MAX="1500")

    first = subprocess.Popen(CLI + ["sink"], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    stored_before_kill = 0
    deadline = time.monotonic() + 120
    for line in first.stderr:
        match = re.search(r"total stored (\d+)", line)
        if match:
            stored_before_kill = int(match.group(1))
            if stored_before_kill >= 6000:
                break
        assert time.monotonic() < deadline, "the sink never got going"
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    assert 0 < stored_before_kill < n_episodes * (steps + 2), "the kill must land mid-stream"

    second = subprocess.run(CLI + ["sink", "--until-idle", "4"], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]

    status = subprocess.run(CLI + ["status", "--json"], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    evidence = json.loads(status.stdout)["evidence"]
    assert evidence["rollout_steps"] == n_episodes * steps
    assert evidence["rollout_episodes"] == n_episodes * 2
    assert evidence["dead_letters"] == 0


@pytest.mark.slow  # one of the default run's longest, on both brokers (README, Test)
def test_100k_events_replay_into_an_empty_store_with_the_same_digest(broker, prefix, store):
    published = publish_synthetic(broker, prefix, 500, 198, seed=12)
    assert published == 100_000
    consumer = Consumer(consumer_config(broker, f"live-{prefix}", 6000))
    EvidenceSink(store, consumer, make_producer(broker), Codec(), prefix).run(threading.Event(), idle_exit_s=4)
    assert store.query("SELECT count() FROM {database}.rollout_steps FINAL")[0][0] == 99_000
    rebuilt = rebuild(store, lambda group: Consumer(consumer_config(broker, group, 6000)), Codec(), prefix,
                      store.database + "_rebuild", broker=broker)
    try:
        before, after, differences = compare(store, rebuilt)
        assert differences == {}
        assert before == after
    finally:
        rebuilt.command("DROP DATABASE IF EXISTS {database}")
