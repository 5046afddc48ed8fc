"""ClickHouse's refusals, reduced to the text a dead letter keeps: the same for the same record in
every run, and the store's own failures told apart (they are retried, never dead-lettered)."""

import pytest

from consumers.evidence.exceptions import StoreQueryError
from consumers.evidence.staging import store_side_error

AVRO_INT = ("insert into test_1a2b.rollout_steps: Code: 1001. DB::Exception: std::exception. Code: 1001, "
            "type: avro::Exception, e.what() = Value out of range for Avro int: 1099511627776 (version 26.9.2.1). "
            "(STD_EXCEPTION)")
NESTED = ("insert into db._staging_x: Code: 117. DB::Exception: Code: 117. DB::Exception: The number of leaves in "
          "record doesn't match the number of elements in tuple: column scenario: (while reading header): "
          "(in file/uri /tmp/tmpx0a9v7u4.raw): While executing AvroRowInputFormat: While executing File: data for "
          "INSERT was parsed from file. (INCORRECT_DATA) (version 26.9.2.1). (INCORRECT_DATA)")
OVER_HTTP = ("HTTPDriver for http://localhost:8123 received ClickHouse error code 27\n Code: 27. DB::Exception: "
             "Cannot parse input: expected '\"' before: 'x': (at row 1)\n: While executing AvroRowInputFormat. "
             "(CANNOT_PARSE_INPUT_ASSERTION_FAILED) (version 24.8.4.13 (official build))\n")


@pytest.mark.parametrize("text, expected", [
    (AVRO_INT, (1001, " STD_EXCEPTION", "std::exception. Code: 1001, type: avro::Exception, "
                                         "e.what() = Value out of range for Avro int: 1099511627776")),
    (NESTED, (117, " INCORRECT_DATA", "The number of leaves in record doesn't match the number of elements in "
                                      "tuple: column scenario: (while reading header)")),
    (OVER_HTTP, (27, " CANNOT_PARSE_INPUT_ASSERTION_FAILED",
                 "Cannot parse input: expected '\"' before: 'x': (at row 1)")),
])
def test_a_refusal_keeps_clickhouse_words_without_what_varies(text, expected):
    assert store_side_error(StoreQueryError(text)) == expected
    other_run = text.replace("tmpx0a9v7u4", "tmpq1w2e3r4").replace("26.9.2.1", "26.10.1.1")
    assert store_side_error(StoreQueryError(other_run)) == expected


@pytest.mark.parametrize("text", [
    "insert into db.t: HTTPConnectionPool(host='localhost', port=8123): Max retries exceeded",  # no answer at all
    "Code: 241. DB::Exception: Memory limit (total) exceeded: would use 3.50 GiB. (MEMORY_LIMIT_EXCEEDED)",
    "Code: 60. DB::Exception: Table db._staging_x does not exist. (UNKNOWN_TABLE)",
])
def test_the_store_own_failures_are_raised_not_reasons(text):
    exc = StoreQueryError(text)
    with pytest.raises(StoreQueryError) as raised:
        store_side_error(exc)
    assert raised.value is exc
