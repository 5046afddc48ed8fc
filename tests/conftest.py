"""Shared fixtures: real brokers (Tansu and Apache Kafka) and a real chDB evidence store.

Brokers are started once per session; each test gets its own topic prefix and its own
ClickHouse database, so tests never see each other's events.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from consumers.evidence.store import ClickHouseStore, migrate
from infra.embedded_broker import TansuBroker
from infra.kafka_clients import ensure_topics


@pytest.fixture(scope="session")
def tansu(tmp_path_factory):
    with TansuBroker(tmp_path_factory.mktemp("tansu") / "broker.log") as broker:
        yield broker.bootstrap_servers


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory):
    from infra.apache_kafka import ApacheKafkaBroker, fetch_jars

    jars = fetch_jars()
    with ApacheKafkaBroker(tmp_path_factory.mktemp("kafka"), jars_dir=jars) as broker:
        yield broker.bootstrap_servers


@pytest.fixture(params=["tansu", pytest.param("kafka", marks=pytest.mark.kafka)])
def broker(request) -> str:
    """The same test against each broker: the embedded default and Apache Kafka."""
    return request.getfixturevalue("tansu" if request.param == "tansu" else "apache_kafka")


@pytest.fixture
def prefix(broker) -> str:
    name = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(broker, name)
    return name


@pytest.fixture(scope="session")
def chdb_store(tmp_path_factory) -> ClickHouseStore:
    # chDB allows one directory per process: every test shares it, each in its own database.
    path: Path = tmp_path_factory.mktemp("chdb")
    return ClickHouseStore.connect(None, path, "unused")


@pytest.fixture
def store(chdb_store) -> ClickHouseStore:
    database = f"test_{uuid.uuid4().hex[:10]}"
    fresh = chdb_store.with_database(database)
    migrate(fresh)
    yield fresh
    fresh.command("DROP DATABASE IF EXISTS {database}")
