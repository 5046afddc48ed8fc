"""Manual smoke test of the faust worker against the embedded broker (not collected by pytest).

Starts Tansu, creates the catalog's topics, publishes synthetic episodes plus one undecodable
message, and synthetic EpisodeAnalysed events (tests/analysed_episodes.py) for the clusterer, runs
``faust -A infra.streams_worker worker`` (settings from SEPA_* like any deployment), and reads
failures.moments, failures.clusters and deadletter until clusters appear or the time is up.

Usage:
    .venv/bin/python tests/unit/streams/worker_smoke.py [episodes=100] [seconds=90]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer

from infra.embedded_broker import TansuBroker
from infra.kafka_clients import ensure_topics, make_producer
from producers import synthetic
from producers.publisher import Publisher
from schemas.codec import Codec

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))
from analysed_episodes import analysed_episodes  # noqa: E402

# What `sepa-eval up` runs (infra/supervisor.py command()): the faust edge with its web server off.
STREAMS_WORKER = [sys.executable, "-m", "faust", "-A", "infra.streams_worker", "worker", "--without-web", "-l", "info"]


def main(episodes: int, seconds: float) -> int:
    work = Path(tempfile.mkdtemp(prefix="sepa-worker-smoke-"))
    broker = TansuBroker(work / "tansu.log").start()
    boot = broker.bootstrap_servers
    worker = None
    try:
        ensure_topics(boot, "sepa.")
        pub = Publisher(make_producer(boot), "sepa.")
        for event in synthetic.episodes(episodes, 120, seed=3, run_id="smoke"):
            pub.publish(event)
        pub.publish_raw("sepa.rollout.steps", b"bad-episode", b"\x00\x00\x00\x00\x01garbage")
        for event in analysed_episodes(episodes, seed=3, run_id="smoke"):
            pub.publish(event)
        pub.flush()
        env = dict(os.environ, SEPA_BOOTSTRAP_SERVERS=boot, SEPA_MEMORY_DIR=str(work / "mem"))
        t0 = time.monotonic()
        with open(work / "worker.log", "w") as log:
            worker = subprocess.Popen(STREAMS_WORKER,
                                      cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        codec = Codec()
        reader = Consumer({"bootstrap.servers": boot, "group.id": "smoke-reader", "auto.offset.reset": "earliest",
                           "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
        reader.subscribe(["sepa.failures.moments", "sepa.failures.clusters", "sepa.deadletter"])
        counts: dict[str, int] = {}
        first = last = None
        while time.monotonic() - t0 < seconds and worker.poll() is None:
            for msg in reader.consume(500, timeout=0.5):
                if msg.error():
                    continue
                event = codec.decode(msg.value())
                kind = event["envelope"]["event_type"]
                counts[kind] = counts.get(kind, 0) + 1
                if kind == "FailureMoment":
                    first = first or time.monotonic() - t0
                    last = time.monotonic() - t0
                elif kind == "ClusterUpdated":
                    print(f"cluster {event['cluster_id']} size {event['size']}: {event['summary']}")
                elif kind == "DeadLetter":
                    print(f"dead letter {event['source_topic']}@{event['source_offset']}: {event['reason'][:100]}")
            if counts.get("ClusterUpdated") and last and time.monotonic() - t0 > last + 10:
                break
        reader.close()
        print(f"counts {counts}; moments from {first} s to {last} s after launch; log {work / 'worker.log'}")
        ok = counts.get("FailureMoment", 0) > 0 and counts.get("DeadLetter", 0) == 1 and counts.get("ClusterUpdated")
        return 0 if ok else 1
    finally:
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        broker.stop()


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(int(args[0]) if args else 100, float(args[1]) if len(args) > 1 else 90.0))
