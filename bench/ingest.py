"""Ingest benchmark: synthetic step events -> broker -> evidence sink -> ClickHouse (chDB).

Prints, from one run:
  1. produced events/s: generate + encode + publish N step events, until the broker acked all;
  2. landed events/s: the sink draining that backlog into the store (first message to last commit);
  3. the sink's CPU time per 100k events (its whole process: a figure that load on a shared
     machine disturbs less than the rates), and the landed / produced ratio;
  4. end-to-end lag at a paced rate (default 10,000 events/s, from a separate producer process):
     p50/p99/max of ClickHouse's insert time minus the event's own time.

Usage:
    python bench/ingest.py                      # embedded Tansu broker
    python bench/ingest.py --broker kafka       # Apache Kafka from the Maven-assembled jars
    python bench/ingest.py --events 200000 --rate 10000 --lag-seconds 15
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer  # noqa: E402

from consumers.evidence.sink import EvidenceSink  # noqa: E402
from consumers.evidence.store import ClickHouseStore, migrate  # noqa: E402
from infra.kafka_clients import consumer_config, ensure_topics, make_producer  # noqa: E402
from infra.local_broker import local_broker  # noqa: E402
from producers.publisher import Publisher  # noqa: E402
from producers.synthetic import episodes  # noqa: E402
from schemas.codec import Codec  # noqa: E402

STEPS_PER_EPISODE = 500


def step_events(n: int, seed: int, run_id: str):
    """n Step events (episode start/end markers dropped: this measures the step path)."""
    count = 0
    for event in episodes(n // STEPS_PER_EPISODE + 1, STEPS_PER_EPISODE, seed, run_id):
        if event["envelope"]["event_type"] == "Step":
            yield event
            count += 1
            if count == n:
                return


def produce_backlog(bootstrap: str, prefix: str, n: int) -> float:
    publisher = Publisher(make_producer(bootstrap), prefix)
    start = time.perf_counter()
    for event in step_events(n, seed=1, run_id="bench-backlog"):
        publisher.publish(event)
    publisher.flush()
    return n / (time.perf_counter() - start)


def produce_paced(bootstrap: str, prefix: str, rate: int, seconds: float) -> None:
    """Runs in its own process so the sink's process is not sharing its GIL."""
    publisher = Publisher(make_producer(bootstrap, **{"linger.ms": 5}), prefix)
    start = time.perf_counter()
    tick = 0.01  # publish in 10 ms slices so the rate is even, not bursty
    for i, event in enumerate(step_events(int(rate * seconds), seed=2, run_id="bench-lag")):
        due = start + i / rate
        if i % int(rate * tick) == 0:
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            event["envelope"]["event_time"] = event["envelope"]["event_time"].__class__.now(
                event["envelope"]["event_time"].tzinfo)
        publisher.publish(event)
        publisher.producer.poll(0)
    publisher.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--lag-seconds", type=float, default=15.0)
    parser.add_argument("--broker", choices=["tansu", "kafka"], default="tansu")
    parser.add_argument("--produce-paced", nargs=2, metavar=("BOOTSTRAP", "PREFIX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce_paced:
        produce_paced(*args.produce_paced, args.rate, args.lag_seconds)
        return 0

    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sepa-bench-")))
        bootstrap = stack.enter_context(local_broker(args.broker, work))
        store = ClickHouseStore.connect(None, work / "evidence", "bench")
        migrate(store)

        prefix = "bench."
        ensure_topics(bootstrap, prefix)
        produced_rate = produce_backlog(bootstrap, prefix, args.events)
        codec = Codec()
        sink = EvidenceSink(store, Consumer(consumer_config(bootstrap, "bench-backlog", 6000)),
                            make_producer(bootstrap), codec, prefix)
        cpu_started = time.process_time()
        totals = sink.run(threading.Event(), idle_exit_s=3.0)
        sink_cpu = time.process_time() - cpu_started  # this process: consumer, inserter and chDB threads
        landed = store.query("SELECT count() FROM {database}.rollout_steps FINAL")[0][0]
        landed_rate = totals.stored / (totals.last_commit_at - totals.first_message_at)

        lag_prefix = "lag."
        ensure_topics(bootstrap, lag_prefix)
        stop = threading.Event()
        lag_sink = EvidenceSink(store, Consumer(consumer_config(bootstrap, "bench-lag", 6000)),
                                make_producer(bootstrap), codec, lag_prefix, linger_ms=50)
        sink_thread = threading.Thread(target=lag_sink.run, args=(stop,))
        sink_thread.start()
        time.sleep(5)  # let the group join before the paced producer starts
        producer = subprocess.run([sys.executable, __file__, "--rate", str(args.rate), "--lag-seconds",
                                   str(args.lag_seconds), "--produce-paced", bootstrap, lag_prefix])
        time.sleep(3)
        stop.set()
        sink_thread.join()
        if producer.returncode:
            print("paced producer failed", file=sys.stderr)
            return 1
        p50, p99, worst, n_lag = store.query(
            "SELECT quantile(0.5)(lag), quantile(0.99)(lag), max(lag), count() FROM (SELECT "
            "dateDiff('microsecond', envelope.event_time, _ingested_at) / 1e6 AS lag "
            "FROM {database}.rollout_steps FINAL WHERE envelope.run_id = 'bench-lag')")[0]

    print(f"broker: {args.broker}   events: {args.events} steps   store: chDB")
    print(f"produced:  {produced_rate:10,.0f} events/s (generate + encode + publish, acked)")
    print(f"landed:    {landed_rate:10,.0f} events/s (sink: backlog -> ClickHouse, {landed} rows)")
    print(f"sink CPU:  {sink_cpu * 100_000 / totals.stored:10.2f} s per 100k events (steadier than rates on a "
          "shared machine)")
    print(f"ratio landed/produced: {landed_rate / produced_rate:.2f}")
    print(f"lag at {args.rate:,} events/s for {args.lag_seconds:.0f} s ({n_lag} events): "
          f"p50 {p50:.3f} s   p99 {p99:.3f} s   max {worst:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
