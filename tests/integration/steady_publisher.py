"""A publisher thread for the restart and scale-out tests: events at a steady rate, held at gates.

    threading.Thread(target=publish_steadily, args=(broker, prefix, events, done, 1200),
                     kwargs={"gates": [(len(events) // 3, joined)]})

A gate ``(index, event)`` holds the events from ``index`` on until the test sets ``event``, so a
step the test takes (a worker joining, a kill) lands before them however slow the machine: a
steady rate alone let a loaded machine finish publishing first, and the kill no longer landed
mid-stream. After a gate the rate goes on from there, not in a burst.
"""

from __future__ import annotations

import threading
import time

from infra.kafka_clients import make_producer
from producers.publisher import Publisher

GATE_TIMEOUT_S = 600.0  # a test that failed before opening a gate still lets the thread finish


def publish_steadily(broker: str, prefix: str, events: list[dict], done: threading.Event, per_s: float,
                     batch: int = 100, gates: list[tuple[int, threading.Event]] = ()) -> None:
    publisher = Publisher(make_producer(broker), prefix)
    pending = sorted(gates, key=lambda gate: gate[0])
    t0 = time.monotonic()
    for i in range(0, len(events), batch):
        while pending and i >= pending[0][0]:
            publisher.flush()
            pending.pop(0)[1].wait(GATE_TIMEOUT_S)
            t0 = time.monotonic() - i / per_s
        for event in events[i:i + batch]:
            publisher.publish(event)
        publisher.producer.poll(0)
        time.sleep(max(0.0, t0 + (i + batch) / per_s - time.monotonic()))
    publisher.flush()
    done.set()
