"""How an Avro event maps onto a ClickHouse evidence table.

One table per topic. Its columns mirror the Avro fields of every event type on that topic (the
envelope as a named Tuple), so ClickHouse's own Avro parser can ingest the raw message bodies and
queries read typed columns. A field that one event type of the topic lacks takes its default.
"""

from __future__ import annotations

from schemas import loader
from schemas.catalog import TOPICS, Topic

PRIMITIVES = {
    "string": "String", "bytes": "String", "int": "Int32", "long": "Int64",
    "float": "Float32", "double": "Float64", "boolean": "Bool",
}
INGESTED_AT = "_ingested_at DateTime64(6, 'UTC') DEFAULT now64(6)"


def clickhouse_type(avro_type, named: dict | None = None) -> str:
    named = {} if named is None else named
    if isinstance(avro_type, str):
        if avro_type in PRIMITIVES:
            return PRIMITIVES[avro_type]
        return clickhouse_type(named[avro_type], named)
    if isinstance(avro_type, list):
        branches = [b for b in avro_type if b != "null"]
        if len(branches) != 1:
            raise ValueError(f"only [null, T] unions map to ClickHouse, got {avro_type}")
        inner = clickhouse_type(branches[0], named)
        if inner.startswith(("Array(", "Tuple(", "Map(")):
            raise ValueError(f"ClickHouse has no Nullable({inner}); make the field non-null: {avro_type}")
        return f"Nullable({inner})"
    kind = avro_type["type"]
    if avro_type.get("logicalType") == "timestamp-micros":
        return "DateTime64(6, 'UTC')"
    if kind == "record":
        named[avro_type["name"]] = avro_type
        named[f"{avro_type.get('namespace', loader.NAMESPACE)}.{avro_type['name']}"] = avro_type
        fields = ", ".join(f"{f['name']} {clickhouse_type(f['type'], named)}" for f in avro_type["fields"])
        return f"Tuple({fields})"
    if kind == "array":
        return f"Array({clickhouse_type(avro_type['items'], named)})"
    if kind == "map":
        return f"Map(String, {clickhouse_type(avro_type['values'], named)})"
    if kind == "enum":
        return "LowCardinality(String)"
    if kind in PRIMITIVES:
        return PRIMITIVES[kind]
    raise ValueError(f"no ClickHouse mapping for Avro type {avro_type}")


def table_columns(topic: Topic) -> dict[str, str]:
    """Column name -> ClickHouse type for the topic's table; raises on a type conflict."""
    columns: dict[str, str] = {}
    for event_type in topic.event_types:
        named: dict = {}
        for field in loader.expanded_schema(event_type)["fields"]:
            ch_type = clickhouse_type(field["type"], named)
            if columns.setdefault(field["name"], ch_type) != ch_type:
                raise ValueError(f"{topic.name}: field {field['name']} is {columns[field['name']]} in one "
                                 f"event type and {ch_type} in {event_type}")
    return columns


def create_table_sql(topic: Topic) -> str:
    cols = ",\n  ".join(f"`{name}` {ch_type}" for name, ch_type in table_columns(topic).items())
    return (f"CREATE TABLE IF NOT EXISTS {{database}}.{topic.table} (\n  {cols},\n  {INGESTED_AT}\n)\n"
            f"ENGINE = ReplacingMergeTree\n"
            f"ORDER BY ({topic.table_key}, envelope.event_id)")


def all_tables_sql() -> str:
    return ";\n\n".join(create_table_sql(t) for t in TOPICS) + ";\n"


if __name__ == "__main__":
    # Prints the DDL the current schemas imply: the starting point of a new migration file.
    print(all_tables_sql(), end="")
