"""The evidence sink and a replay rebuild as the tests build them (the edge's job in the product:
infra/pipeline.py, infra/cli/events.py)."""

from __future__ import annotations

import threading

from confluent_kafka import Consumer

from consumers.evidence.sink import EvidenceSink
from consumers.replay import rebuild
from infra.kafka_clients import consumer_config, make_producer
from schemas.codec import Codec

SESSION_MS = 6000


def make_sink(store, broker: str, prefix: str, group: str | None = None, dead_letters: bool = True,
              **kw) -> EvidenceSink:
    """A sink in its own consumer group; ``dead_letters`` False stores them directly (as a replay)."""
    consumer = Consumer(consumer_config(broker, group or f"sink-{prefix}", SESSION_MS))
    return EvidenceSink(store, consumer, make_producer(broker) if dead_letters else None, Codec(), prefix, **kw)


def drain(store, broker: str, prefix: str, idle_exit_s: float = 3.0, **kw) -> EvidenceSink:
    """Runs a sink until nothing arrived for ``idle_exit_s``."""
    sink = make_sink(store, broker, prefix, **kw)
    sink.run(threading.Event(), idle_exit_s=idle_exit_s)
    return sink


def rebuild_from(store, broker: str, prefix: str, database: str):
    return rebuild(store, lambda group: Consumer(consumer_config(broker, group, SESSION_MS)), Codec(), prefix,
                   database, broker=broker)
