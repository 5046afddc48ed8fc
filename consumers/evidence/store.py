"""The evidence store: one append-only ClickHouse table per topic, reached through clickhouse-connect.

``chdb://<dir>`` (embedded, in this process) or ``http(s)://`` (a ClickHouse server): the same
client API, the same SQL. Every read of an evidence table goes through ``FINAL`` so an event that
was delivered twice counts once, whatever background merges have done.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any, Protocol

import clickhouse_connect

from consumers.evidence import chdb_dir
from consumers.evidence.avro_container import object_container
from consumers.evidence.exceptions import MigrationError, StoreQueryError, StoreUnavailable

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "infra" / "migrations"


class EvidenceStore(Protocol):
    """What every command needs from the store, wherever it lives."""

    database: str

    def command(self, sql: str, parameters: dict | None = None) -> Any: ...
    def query(self, sql: str, parameters: dict | None = None,
              column_formats: dict | None = None) -> list[tuple]: ...
    def insert_container(self, table: str, container: bytes) -> None: ...
    def with_database(self, database: str) -> EvidenceStore: ...


class ClickHouseStore:
    """Direct access through a clickhouse-connect client (chDB in-process or HTTP)."""

    def __init__(self, client, database: str, lock: threading.RLock | None = None):
        self.client = client
        self.database = database
        # chDB is one engine per process; serialising calls keeps the endpoint threads simple.
        self._lock = lock or threading.RLock()

    @classmethod
    def connect(cls, url: str | None, chdb_path: Path, database: str) -> ClickHouseStore:
        embedded = url is None or url.startswith("chdb://")
        path = (Path(url[len("chdb://"):]) if url else chdb_path) if embedded else None
        try:
            if path is not None:
                path.mkdir(parents=True, exist_ok=True)
                chdb_dir.clear_empty_staging_definitions(path)
                client = clickhouse_connect.get_client(dsn=f"chdb://{path.resolve()}")
            else:
                client = clickhouse_connect.get_client(dsn=url)
        except Exception as exc:
            where = url or f"chdb://{chdb_path}"
            said = chdb_dir.open_failure(path, exc) if path is not None and path.is_dir() else " ".join(
                str(exc).split())
            raise StoreUnavailable(f"cannot open evidence store {where}: {said}") from exc
        return cls(client, database)

    def with_database(self, database: str) -> ClickHouseStore:
        return ClickHouseStore(self.client, database, self._lock)

    def command(self, sql: str, parameters: dict | None = None) -> Any:
        with self._lock:
            try:
                return self.client.command(sql.replace("{database}", self.database), parameters=parameters)
            except Exception as exc:
                raise StoreQueryError(f"{_first_line(sql)}: {exc}") from exc

    def query(self, sql: str, parameters: dict | None = None,
              column_formats: dict | None = None) -> list[tuple]:
        with self._lock:
            try:
                result = self.client.query(sql.replace("{database}", self.database), parameters=parameters,
                                           column_formats=column_formats)
            except Exception as exc:
                raise StoreQueryError(f"{_first_line(sql)}: {exc}") from exc
            return [tuple(row) for row in result.result_rows]

    def insert_container(self, table: str, container: bytes) -> None:
        with self._lock:
            try:
                self.client.raw_insert(f"{self.database}.{table}", None, insert_block=container, fmt="Avro",
                                       settings={"input_format_avro_allow_missing_fields": 1})
            except Exception as exc:
                raise StoreQueryError(f"insert into {self.database}.{table}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self.client.close()


def insert_bodies(store: EvidenceStore, table: str, schema_json: str, bodies: list[bytes]) -> None:
    store.insert_container(table, object_container(schema_json, bodies))


def _first_line(sql: str) -> str:
    return sql.strip().splitlines()[0][:120] if sql.strip() else "(empty statement)"


# --- migrations -------------------------------------------------------------------------------

def migration_files() -> list[tuple[int, str, str]]:
    files = []
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        version, _, name = path.stem.partition("_")
        if not version.isdigit():
            raise MigrationError(f"{path.name}: migration files are named NNNN_description.sql")
        files.append((int(version), path.stem, path.read_text()))
    return files


def statements(sql: str) -> list[str]:
    body = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";\n") if s.strip().rstrip(";")]


def migrate(store: EvidenceStore) -> list[str]:
    """Apply the migrations not yet applied to store.database; returns their names."""
    store.command("CREATE DATABASE IF NOT EXISTS {database}")
    store.command("CREATE TABLE IF NOT EXISTS {database}.schema_migrations (version UInt32, name String, "
                  "checksum String, applied_at DateTime64(6, 'UTC') DEFAULT now64(6)) "
                  "ENGINE = MergeTree ORDER BY version")
    applied = {v: (n, c) for v, n, c in store.query(
        "SELECT version, name, checksum FROM {database}.schema_migrations")}
    done = []
    for version, name, sql in migration_files():
        checksum = hashlib.sha256(sql.encode()).hexdigest()
        if version in applied:
            if applied[version][1] != checksum:
                raise MigrationError(f"migration {name} changed after it was applied to {store.database}; "
                                     "write a new migration instead")
            continue
        for statement in statements(sql):
            store.command(statement.rstrip(";"))
        store.command("INSERT INTO {database}.schema_migrations (version, name, checksum) VALUES "
                      "({v:UInt32}, {n:String}, {c:String})", parameters={"v": version, "n": name, "c": checksum})
        done.append(name)
    return done
