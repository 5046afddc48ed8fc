"""A broker this process starts for itself and stops when done: benches and manual runs.

    with local_broker("tansu", work_dir) as bootstrap:   # or "kafka": Apache Kafka from Maven jars
        ...

The embedded Tansu broker is what ``sepa-eval up`` runs; Apache Kafka is the single-node KRaft
broker the tests use (infra/apache_kafka.py; its jars are fetched once, at install time or first use).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.embedded_broker import TansuBroker

KINDS = ("tansu", "kafka")


@contextmanager
def local_broker(kind: str, work_dir: Path) -> Iterator[str]:
    """Starts a ``kind`` broker with its files under ``work_dir``; yields its bootstrap servers."""
    if kind == "tansu":
        with TansuBroker(work_dir / "broker.log") as broker:
            yield broker.bootstrap_servers
    elif kind == "kafka":
        from infra.apache_kafka import ApacheKafkaBroker, fetch_jars

        with ApacheKafkaBroker(work_dir / "kafka", jars_dir=fetch_jars()) as broker:
            yield broker.bootstrap_servers
    else:
        raise ValueError(f"broker kind must be one of {KINDS}, got {kind!r}")
