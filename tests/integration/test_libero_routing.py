"""Each benchmark's worker serves its own requests: the robosuite worker skips and commits a LIBERO
request (the LIBERO worker, in its own consumer group, serves it), dead-lettering nothing."""

from __future__ import annotations

import threading
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from infra.kafka_clients import consumer_config, ensure_topics, make_producer
from producers.publisher import Publisher
from producers.rollout_worker import GROUP_ID, MAX_POLL_INTERVAL_MS, REQUESTS, RolloutWorker, rollout_request
from schemas.codec import Codec
from schemas.libero_scenario import LiberoScenario
from schemas.scenario import ScenarioSpec


class RecordingPool:
    """Stands in for the process pool (the simulator is not what this test is about)."""

    def __init__(self):
        self.requests: list[str] = []

    def run(self, request: dict) -> list:
        self.requests.append(request["scenario"]["benchmark"])
        return []


def test_the_robosuite_worker_skips_libero_requests_and_commits_them(tansu):
    prefix = f"g{uuid.uuid4().hex[:10]}."
    ensure_topics(tansu, prefix)
    libero = LiberoScenario(suite="libero_object", env_name="pick_up_the_milk_and_place_it_in_the_basket",
                            instruction="pick up the milk and place it in the basket", horizon=50)
    lift = ScenarioSpec(env_name="Lift", horizon=20, instruction="lift the cube")
    publisher = Publisher(make_producer(tansu), prefix)
    publisher.publish(rollout_request(libero.to_dict(), "oracle", [0], run_id="routing"))
    publisher.publish(rollout_request(lift.to_dict(), "oracle", [0], run_id="routing"))
    publisher.flush()

    pool = RecordingPool()
    consumer = Consumer(consumer_config(tansu, GROUP_ID, 6000, **{"max.poll.interval.ms": MAX_POLL_INTERVAL_MS}))
    worker = RolloutWorker(pool, consumer, Publisher(make_producer(tansu), prefix), Codec())
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while worker.served < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    thread.join(30)
    assert pool.requests == ["robosuite"] and worker.skipped == 1

    consumer = Consumer({"bootstrap.servers": tansu, "group.id": GROUP_ID, "enable.auto.commit": False})
    partitions = [TopicPartition(REQUESTS.full_name(prefix), p) for p in range(REQUESTS.partitions)]
    committed = consumer.committed(partitions, timeout=10)
    consumer.close()
    # both requests committed: the LIBERO one is not served again
    assert sum(max(0, tp.offset) for tp in committed) == 2
    reader = Consumer({"bootstrap.servers": tansu, "group.id": f"r-{uuid.uuid4().hex}", "enable.auto.commit": False})
    reader.assign([TopicPartition(f"{prefix}deadletter", 0, OFFSET_BEGINNING)])
    assert reader.consume(10, timeout=2.0) == []
    reader.close()
