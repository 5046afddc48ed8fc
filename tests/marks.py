"""Marks shared by the test modules."""

import pytest

# A long test's Apache Kafka run goes to the slow suite (CI runs it): the default run keeps its
# embedded-broker run, and the other tests keep Apache Kafka in the default run.
slow_on_kafka = pytest.mark.parametrize(
    "broker", ["tansu", pytest.param("kafka", marks=[pytest.mark.kafka, pytest.mark.slow])], indirect=True)
