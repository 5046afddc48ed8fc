"""One batch into one evidence table, checked so that an event id never names two contents.

The batch's raw Avro bodies go first into a staging table, where ClickHouse's own parser decodes
them into the evidence table's typed columns. Staging tables use the Memory engine, one per
evidence table and sink instance (two sinks never share one), in a database of their own,
<evidence database>_sink_staging; a sink drops its tables when it stops (one killed leaves
empty ones behind, harmless). A first query, over keys and ids alone, asks whether any
staged id is already stored under its key; Python sees whether one repeats in the batch. In the
usual case neither, and the rows move from staging into the evidence table in one INSERT ... SELECT. Otherwise a
second query returns just those rows with their content hashes and the stored rows' hashes,
and only the new ones are inserted.

Content is every column except envelope.event_time and _ingested_at, compared as typed values
(a hash per column): an event re-encoded by another schema version, or re-emitted at another
wall-clock time, is the same content. Map entries compare in their encoded order (a producer that
re-emits the same fact builds its maps the same way).

A container ClickHouse refuses is taken apart: every message is decoded in Python first (so a
malformed body gets the same reason as in every other consumer, schemas.codec), then what Python
accepts is inserted in halves until the messages ClickHouse refuses on their own are isolated;
those are refused with ClickHouse's own error text. An error that is the store's rather than the
record's (the store unreachable, a missing table, out of memory) is raised: nothing is committed
and the batch is retried.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple

from consumers.evidence.avro_container import object_container
from consumers.evidence.chdb_dir import STAGING_SUFFIX
from consumers.evidence.exceptions import StoreQueryError
from consumers.evidence.store import EvidenceStore
from schemas import loader
from schemas.catalog import Topic
from schemas.codec import Codec, encode_long
from schemas.exceptions import DecodeError

SEQ = "_seq"  # staging-only column: the message's position in the batch
INGESTED_AT = "_ingested_at"
# ClickHouse error codes that are the store's fault, never the record's: retried, not dead-lettered.
STORE_SIDE_ERRORS = frozenset({
    8,    # THERE_IS_NO_COLUMN
    10,   # NOT_FOUND_COLUMN_IN_BLOCK
    16,   # NO_SUCH_COLUMN_IN_TABLE
    47,   # UNKNOWN_IDENTIFIER
    60,   # UNKNOWN_TABLE
    81,   # UNKNOWN_DATABASE
    159,  # TIMEOUT_EXCEEDED
    164,  # READONLY
    202,  # TOO_MANY_SIMULTANEOUS_QUERIES
    209,  # SOCKET_TIMEOUT
    210,  # NETWORK_ERROR
    236,  # ABORTED
    241,  # MEMORY_LIMIT_EXCEEDED
    242,  # TABLE_IS_READ_ONLY
    243,  # NOT_ENOUGH_SPACE
    252,  # TOO_MANY_PARTS
    319,  # UNKNOWN_STATUS_OF_INSERT
    394,  # QUERY_WAS_CANCELLED
    425,  # SYSTEM_ERROR
    497,  # ACCESS_DENIED
    516,  # AUTHENTICATION_FAILED
    999,  # KEEPER_EXCEPTION
    1000,  # POCO_EXCEPTION
})
_CLICKHOUSE_ERROR = re.compile(r"Code: (\d+)\. DB::Exception: ")
_VERSION = re.compile(r"\s*\(version [^()]*(?:\([^()]*\)[^()]*)?\)")  # "(version 24.8.4.13 (official build))"
_FILE = re.compile(r"\s*\(in file/uri [^)]*\)")
_CONTEXT = re.compile(r":? While executing ")
_ERROR_NAME = re.compile(r"\s*\(([A-Z][A-Z0-9_]+)\)(?:\s*\.?\s*\(\1\))*\s*\.?\s*$")
REASON_CHARS = 600  # of ClickHouse's error text kept in a dead letter's reason


class Accepted(NamedTuple):
    """A message that passed the cheap checks: framed, its schema id known, its envelope sane."""

    table: str
    schema_id: int
    event_id: bytes
    value: bytes  # the whole framed message

    @property
    def body(self) -> bytes:
        return self.value[5:]


class Pending(NamedTuple):
    """One accepted message of a batch, at its position in the batch."""

    seq: int
    msg: object  # the consumed message (confluent_kafka.Message), or None for a sink's own dead letter
    accepted: Accepted


@dataclass
class TableOutcome:
    stored: int = 0
    duplicates: int = 0
    conflicts: list[tuple[Pending, str]] = field(default_factory=list)
    refused: list[tuple[Pending, str]] = field(default_factory=list)  # by the codec or by ClickHouse


class StagedTable:
    """Writes batches into one evidence table through its own staging table."""

    def __init__(self, store: EvidenceStore, topic: Topic, codec: Codec, instance: str):
        self.store = store
        self.topic = topic
        self.table = topic.table
        self.codec = codec
        self.staging = f"{topic.table}_{instance}"
        # Staging tables live in a database of their own, so the evidence database holds exactly
        # the migrated tables (dashboards, exports and `SHOW TABLES` never see a sink's scratch).
        self._staging_store = store.with_database(f"{store.database}{STAGING_SUFFIX}")
        self._staged = f"`{self._staging_store.database}`.`{self.staging}`"
        self._schemas: dict[int, tuple[str, str]] = {}  # schema id -> (writer schema, writer schema + _seq)
        self._columns: list[str] | None = None  # the evidence table's columns, _ingested_at aside
        self._content: list[str] = []  # display names of the content columns, in hash order
        self._known_sql = self._check_sql = self._move_sql = ""

    # --- setup ------------------------------------------------------------------------------

    def _ready(self) -> None:
        if self._columns is not None:
            return
        rows = self.store.query("SELECT name FROM system.columns WHERE database = {db:String} AND table = {t:String} "
                                "ORDER BY position", parameters={"db": self.store.database, "t": self.table})
        columns = [name for (name,) in rows if name != INGESTED_AT]
        if not columns:
            raise StoreQueryError(f"evidence table {self.store.database}.{self.table} does not exist (not migrated?)")
        self._staging_store.command("CREATE DATABASE IF NOT EXISTS {database}")
        self.store.command(f"CREATE TABLE IF NOT EXISTS {self._staged} AS {{database}}.{self.table} ENGINE = Memory")
        self.store.command(f"ALTER TABLE {self._staged} ADD COLUMN IF NOT EXISTS {SEQ} Int64")
        envelope = [f["name"] for f in loader.shared_schema("Envelope")["fields"] if f["name"] != "event_time"]
        self._content = list(chain.from_iterable(
            [f"envelope.{name}" for name in envelope] if c == "envelope" else [c] for c in columns))
        self._columns = columns
        self._known_sql, self._check_sql = self._check_statements()
        self._move_sql = (f"INSERT INTO {{database}}.{self.table} ({_names(columns)}) "
                          f"SELECT {_names(columns)} FROM {self._staged}")

    def _check_statements(self) -> tuple[str, str]:
        """Two queries over the staged batch. The first (cheap: keys and ids only) asks whether
        any staged id is stored under its key (repeats within the batch are seen in Python). Only
        when one is, or ids repeat, the second returns the rows that are not new with a hash per
        content column, and the stored row's hashes when there is one."""
        key = f"`{self.topic.table_key}`"
        staging = self._staged
        stored_rows = (f"FROM {{database}}.{self.table}\n"
                       f"  WHERE {key} IN (SELECT {key} FROM {staging})\n"  # few keys: cheap primary-key pruning
                       f"    AND ({key}, envelope.event_id) IN (SELECT {key}, envelope.event_id FROM {staging})")
        repeated = f"SELECT envelope.event_id FROM {staging} GROUP BY envelope.event_id HAVING count() > 1"
        known = f"SELECT 1 {stored_rows}\nLIMIT 1"
        staged = ", ".join(f"cityHash64(tuple({_ref('s', c)}))" for c in self._content)
        stored = ", ".join(f"cityHash64(tuple({_ref(None, c)}))" for c in self._content)
        check = (
            f"SELECT s.{SEQ}, [{staged}], st.hashes, st.found\n"
            f"FROM {staging} AS s\n"
            f"LEFT JOIN (\n"
            f"  SELECT envelope.event_id AS id, any([{stored}]) AS hashes, 1 AS found\n"
            f"  {stored_rows}\n"
            f"  GROUP BY id\n"
            f") AS st ON s.envelope.event_id = st.id\n"
            f"WHERE st.found = 1 OR s.envelope.event_id IN ({repeated})"
        )
        return known, check

    def _schema_json(self, schema_id: int) -> tuple[str, str]:
        if schema_id not in self._schemas:
            schema = self.codec.schema_ids.by_id(schema_id).schema
            with_seq = {**schema, "fields": [*schema["fields"], {"name": SEQ, "type": "long"}]}
            self._schemas[schema_id] = (json.dumps(schema), json.dumps(with_seq))
        return self._schemas[schema_id]

    def drop(self) -> None:
        if self._columns is not None:
            self.store.command(f"DROP TABLE IF EXISTS {self._staged}")
            self._columns = None

    # --- one batch --------------------------------------------------------------------------

    def write(self, items: list[Pending]) -> TableOutcome:
        """Store the new events of items (in batch order); report duplicates, conflicts, refusals."""
        self._ready()
        outcome = TableOutcome()
        self._truncate()
        staged = self._stage(items, outcome)
        if not staged:
            return outcome
        ids = {p.accepted.event_id for p in staged}
        if len(ids) == len(staged) and not self.store.query(self._known_sql):  # the usual case: all new
            self.store.command(self._move_sql)
            outcome.stored = len(staged)
            return outcome
        verdicts = {seq: (tuple(h), tuple(st) if found else None)
                    for seq, h, st, found in self.store.query(self._check_sql)}
        new: list[Pending] = []
        first: dict[bytes, tuple] = {}  # event id -> content hashes of its first copy in this batch
        for item in staged:
            if item.seq not in verdicts:
                new.append(item)
                continue
            hashes, stored = verdicts[item.seq]
            reference = stored if stored is not None else first.get(item.accepted.event_id)
            if reference is None:
                first[item.accepted.event_id] = hashes
                new.append(item)
            elif hashes == reference:
                outcome.duplicates += 1
            else:
                outcome.conflicts.append((item, self._conflict_reason(item, hashes, reference)))
        if len(new) == len(staged):
            self.store.command(self._move_sql)
        elif new:
            # Rare (re-deliveries, conflicts): insert the new ones again rather than ship a list
            # of positions to ClickHouse.
            for schema_id, group in _by_schema(new):
                self.store.insert_container(self.table, object_container(
                    self._schema_json(schema_id)[0], [p.accepted.body for p in group]))
        outcome.stored = len(new)
        return outcome

    def _conflict_reason(self, item: Pending, hashes: tuple, reference: tuple) -> str:
        differing = [name for name, a, b in zip(self._content, hashes, reference, strict=True) if a != b]
        event_type = self.codec.schema_ids.by_id(item.accepted.schema_id).event_type
        return (f"{event_type} {item.accepted.event_id.decode('utf-8', 'backslashreplace')}: this event id "
                f"already names a different content in {self.table} (differs in {', '.join(differing)}); "
                "the first content stays")

    def _truncate(self) -> None:
        self.store.command(f"TRUNCATE TABLE {self._staged}")

    def _insert_staged(self, schema_id: int, group: list[Pending]) -> None:
        seqs = _seq_bytes(max(p.seq for p in group))
        pieces: list = [b""] * (2 * len(group))  # each body, then its position (the _seq field)
        pieces[0::2] = [p.accepted.value[5:] for p in group]
        pieces[1::2] = [seqs[p.seq] for p in group]
        self._staging_store.insert_container(self.staging, object_container(self._schema_json(schema_id)[1], pieces,
                                                                            count=len(group)))

    def _stage(self, items: list[Pending], outcome: TableOutcome) -> list[Pending]:
        """Parse items into staging; returns those staged, records the refused in outcome."""
        groups = _by_schema(items)
        try:
            for schema_id, group in groups:
                self._insert_staged(schema_id, group)
            return items
        except StoreQueryError as exc:
            store_side_error(exc)  # raises when the store, not the data, is at fault
        # Find the bad ones. Probes leave rows in staging; it is emptied and refilled afterwards.
        good: list[Pending] = []
        for schema_id, group in groups:
            decodable = []
            for item in group:
                try:
                    self.codec.decode(item.accepted.value, self.topic)
                    decodable.append(item)
                except DecodeError as exc:
                    outcome.refused.append((item, str(exc)))
            good.extend(self._isolate(schema_id, decodable, outcome))
        self._truncate()
        good.sort(key=lambda p: p.seq)
        for schema_id, group in _by_schema(good):
            self._insert_staged(schema_id, group)  # these each went in before: a failure now is the store's
        return good

    def _isolate(self, schema_id: int, items: list[Pending], outcome: TableOutcome) -> list[Pending]:
        """Insert items in halves until each message ClickHouse refuses is alone; returns the rest."""
        if not items:
            return []
        try:
            self._insert_staged(schema_id, items)
            return items
        except StoreQueryError as exc:
            if len(items) == 1:
                outcome.refused.append((items[0], self.refusal_reason(exc)))
                return []
        middle = len(items) // 2
        return self._isolate(schema_id, items[:middle], outcome) + self._isolate(schema_id, items[middle:], outcome)

    def refusal_reason(self, exc: StoreQueryError) -> str:
        """ClickHouse's own words for refusing one record, without what varies between runs (the
        server version, temporary file names, the staging table's and the database's names)."""
        code, name, detail = store_side_error(exc)
        detail = detail.replace(f"{self._staging_store.database}.{self.staging}", self.table)
        detail = detail.replace(self.staging, self.table).replace(f"{self.store.database}.", "")
        return f"ClickHouse refused it for {self.table}: {detail[:REASON_CHARS]} (code {code}{name})"


def store_side_error(exc: StoreQueryError) -> tuple[int, str, str]:
    """(code, " NAME" or "", message) of a ClickHouse refusal that is the record's fault; re-raises
    exc when the store is at fault (no ClickHouse exception at all, or a code in STORE_SIDE_ERRORS).

    The message is the innermost exception's text, without the version, the input file name and
    the pipeline context ("While executing ...") that follow it."""
    text = _VERSION.sub("", str(exc))
    matches = list(_CLICKHOUSE_ERROR.finditer(text))
    if not matches or int(matches[-1].group(1)) in STORE_SIDE_ERRORS:
        raise exc
    code = int(matches[-1].group(1))
    name = _ERROR_NAME.search(text)
    detail = text[matches[-1].end():]
    detail = _CONTEXT.split(detail, 1)[0]
    detail = _FILE.sub("", detail)
    detail = _ERROR_NAME.sub("", detail)
    detail = " ".join(detail.split()).rstrip(" .:")
    return code, f" {name.group(1)}" if name else "", detail


def _by_schema(items: Iterable[Pending]) -> list[tuple[int, list[Pending]]]:
    groups: dict[int, list[Pending]] = defaultdict(list)
    for item in items:
        groups[item.accepted.schema_id].append(item)
    return list(groups.items())


def _names(columns: list[str]) -> str:
    return ", ".join(f"`{c}`" for c in columns)


def _ref(alias: str | None, column: str) -> str:
    parts = [f"`{p}`" for p in column.split(".")]
    return ".".join([alias, *parts] if alias else parts)


_SEQ_CACHE: list[bytes] = []


def _seq_bytes(highest: int) -> list[bytes]:
    """The Avro encodings of 0..highest (at least), by index."""
    while len(_SEQ_CACHE) <= highest:
        _SEQ_CACHE.append(encode_long(len(_SEQ_CACHE)))
    return _SEQ_CACHE
