"""`replay --republish` against a broker of the user's (SEPA_BOOTSTRAP_SERVERS) whose topics hold
events already: refused in one line naming them, since every event would be there twice and its
consumers would act on it again."""

from __future__ import annotations

import uuid

from stack_helpers import clean_env, sepa

from infra.kafka_clients import ensure_topics, make_producer
from producers.publisher import Publisher
from schemas.codec import Codec
from schemas.events import make_event


def test_republish_into_topics_that_hold_events_is_refused_in_one_line(tansu, tmp_path):
    prefix = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(tansu, prefix)
    publisher = Publisher(make_producer(tansu), prefix, Codec())
    publisher.publish(make_event("ModelRegistered", ("m", "1"), "sync-models", "sync-models", model_id="m",
                                 version="1", kind="scripted", description="", params={}))
    publisher.flush()
    result = sepa(tmp_path / "m", "replay", "--republish",
                  env=clean_env(SEPA_BOOTSTRAP_SERVERS=tansu, SEPA_TOPIC_PREFIX=prefix))
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: --republish: the topics at ") and f"{prefix}models.registry 1" in line, line
