"""The migrations are the source of truth the sink writes to; the Avro schemas are the contract.
A migrated store must hold, per topic, exactly the columns the schemas imply (consumers.evidence.columns)."""

from consumers.evidence.columns import table_columns
from schemas.catalog import TOPICS


def _normalise(ch_type: str) -> str:
    return ch_type.replace(" ", "")


def test_every_table_has_the_columns_its_schemas_imply(store):
    for topic in TOPICS:
        rows = store.query("SELECT name, type FROM system.columns WHERE database = {db:String} "
                           "AND table = {t:String} AND name != '_ingested_at' ORDER BY position",
                           parameters={"db": store.database, "t": topic.table})
        stored = {name: _normalise(ch_type) for name, ch_type in rows}
        wanted = {name: _normalise(ch_type) for name, ch_type in table_columns(topic).items()}
        assert stored == wanted, f"{topic.table}: migrations and schemas disagree"
