"""Decoding at the edge of every stream processor, and the dead letters for what cannot be decoded.

    intake = Intake(Codec(), consumer="failure-detector", run_id="streams")
    event, dead = intake.decode(raw)          # exactly one of them is None
    record, dead = intake.admit_record(raw)   # the typed record (schemas/records.py), or the dead letter
    dead = intake.dead_letter(raw, reason)    # for an event decoded fine but refused later

A message is refused when it is not a framed Avro event of its topic's event types (the reason
is ``schemas.codec``'s, the same text the evidence sink gives the same bytes), or when a
physical signal is not finite (``schemas.codec.require_finite`` on the top-level fields, and here
also inside nested records: object poses, contacts, quality). The refused message is kept
(whole up to schemas.catalog.DEAD_LETTER_EXCERPT_BYTES, else an excerpt with its size and sha256)
in a DeadLetter event (schemas/avro/DeadLetter.avsc) with its topic, partition, offset, key and
the reason; its event id derives from (topic, partition, offset, consumer), so a re-processed
message dead-letters once.
"""

from __future__ import annotations

import logging
import math
from typing import Any, NamedTuple

from schemas.catalog import Topic, topic_for
from schemas.codec import Codec, require_finite
from schemas.events import dead_letter as dead_letter_event
from schemas.exceptions import InvalidEvent, SchemaError
from schemas.typed import to_record

log = logging.getLogger(__name__)


class RawMessage(NamedTuple):
    """One consumed Kafka message, as the agent received it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class Outgoing(NamedTuple):
    """One message to publish: catalog topic name (unprefixed), key, Confluent-framed value."""

    topic: str
    key: bytes
    value: bytes

    @classmethod
    def of(cls, event: dict, codec: Codec) -> Outgoing:
        """The event on its catalog topic, under the key the catalog gives that topic."""
        topic = topic_for(event["envelope"]["event_type"])
        return cls(topic.name, topic.message_key(event), codec.encode(event))


def _first_non_finite(value, path: str) -> str | None:
    """Path of the first NaN/inf float in nested dicts and lists, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    if isinstance(value, dict):
        for k, v in value.items():
            found = _first_non_finite(v, f"{path}.{k}")
            if found:
                return found
    elif isinstance(value, list) and value:
        if isinstance(value[0], float):
            try:
                if math.isfinite(sum(value)):  # one C-level pass; only a NaN/inf (or overflow) fails it
                    return None
            except TypeError:
                pass
        for i, v in enumerate(value):
            found = _first_non_finite(v, f"{path}[{i}]")
            if found:
                return found
    return None


def _nested_non_finite(event: dict, event_type: str) -> str | None:
    """Like require_finite, inside nested records (object poses, contacts, quality, scenario)."""
    for name, value in event.items():
        if name == "envelope":
            continue
        if isinstance(value, dict) or (isinstance(value, list) and value and isinstance(value[0], dict)):
            found = _first_non_finite(value, f"{event_type}.{name}")
            if found:
                return found
    return None


class Intake:
    """Decodes consumed messages for one consumer; builds its dead letters."""

    def __init__(self, codec: Codec, consumer: str, run_id: str, expected: dict[str, Topic] | None = None):
        self.codec = codec
        self.consumer = consumer
        self.run_id = run_id
        self.expected = expected or {}  # full topic name -> catalog topic (its event types)
        self.dead = 0

    def decode(self, raw: RawMessage) -> tuple[dict | None, dict | None]:
        try:
            # With the topic, decode refuses an event type the topic does not carry before reading
            # the body: the same checks in the same order as the evidence sink, the same reasons.
            event = self.codec.decode(raw.value, self.expected.get(raw.topic))
            require_finite(event)
        except SchemaError as exc:
            return None, self.dead_letter(raw, str(exc))
        event_type = event["envelope"]["event_type"]
        bad = _nested_non_finite(event, event_type)
        if bad:
            return None, self.dead_letter(raw, f"{event_type} {event['envelope']['event_id']}: {bad} is not finite")
        return event, None

    def dead_letter(self, raw: RawMessage, reason: str) -> dict:
        self.dead += 1
        return dead_letter_event(self.consumer, self.run_id, raw.topic, raw.partition, raw.offset, raw.key, raw.value,
                           reason)

    def refuse(self, raw: RawMessage, reason: str) -> Outgoing:
        """Log and dead-letter one message; returns the message to publish."""
        log.warning("dead-lettering %s[%s]@%s: %s", raw.topic, raw.partition, raw.offset, reason)
        return self.encode_dead(self.dead_letter(raw, reason))

    def admit(self, raw: RawMessage) -> tuple[dict | None, Outgoing | None]:
        """decode() for an agent: the event, or the dead letter to publish in its place."""
        event, dead = self.decode(raw)
        if dead is None:
            return event, None
        log.warning("dead-lettering %s[%s]@%s: %s", raw.topic, raw.partition, raw.offset, dead["reason"])
        return None, self.encode_dead(dead)

    def admit_record(self, raw: RawMessage) -> tuple[Any, Outgoing | None]:
        """admit() with the event as its typed, frozen record (schemas/typed.py): what the control
        processors (gate, sweeper, mutator) read. The failure detector stays on admit()'s dicts: it
        reads one Step per control step, and fastavro's decode is the check that path needs."""
        event, dead = self.admit(raw)
        if dead is not None:
            return None, dead
        try:
            return to_record(event), None
        except InvalidEvent as exc:
            return None, self.refuse(raw, str(exc))

    def encode_dead(self, dead: dict) -> Outgoing:
        return Outgoing.of(dead, self.codec)
