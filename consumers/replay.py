"""Replay: rebuild an evidence store from the topics, or republish the store's log into topics.

- rebuild: consume every topic from the beginning into an empty database, re-apply the live store's
  recorded prunes (consumers/prune.py says what a replay after a prune can and cannot rebuild),
  and compare the derived state's digest with the live store's. Replaying must reproduce it exactly.
- republish: the embedded broker forgets every topic on restart; the evidence log does not. This
  re-encodes each stored event (same ids, same times, same bytes) into the topics.
- republish_in_flight: what a fresh embedded broker must carry again for the loop to go on, and no
  more (a whole republish would have every consumer redo its work): the requests whose episodes
  have not all ended, the candidates no decision answered yet, the events of the episodes that
  ended without an EpisodeAnalysed, and the clusterer's history (failures.clusters and
  failures.episodes, which it restores from and skips what it took in). `up` calls it after it
  started a new embedded broker, before the streams worker.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC

from confluent_kafka import Consumer, KafkaException

from consumers.evidence.columns import table_columns
from consumers.evidence.exceptions import ConsumerFailed, ReplayError
from consumers.evidence.sink import EvidenceSink
from consumers.evidence.store import EvidenceStore, migrate
from consumers.prune import reapply_prunes
from consumers.state import derived_state, state_digest
from producers.publisher import Publisher
from schemas import loader
from schemas.catalog import BY_NAME, TOPICS, Topic
from schemas.codec import Codec

PAGE_ROWS = 20000
REPLAY_IDLE_EXIT_S = 4.0
REPLAY_TIMEOUT_S = 30.0  # to reach the broker, list the topics, and join the replay's consumer group


def rebuild(store: EvidenceStore, make_consumer: Callable[[str], Consumer], codec: Codec, topic_prefix: str,
            target_database: str, *, broker: str, timeout_s: float = REPLAY_TIMEOUT_S) -> EvidenceStore:
    """Drop and recreate target_database, then fill it from the topics with a fresh consumer group.

    make_consumer(group_id) builds the consumer (at the edge); broker names the cluster in errors.
    Every catalog topic must be readable before anything is dropped: otherwise ReplayError, one
    line naming the topic and the broker, within about timeout_s.
    """
    if target_database == store.database:
        raise ValueError(f"refusing to rebuild into the live database {target_database!r}")
    consumer = make_consumer(f"sepa-replay-{uuid.uuid4().hex[:12]}")
    try:
        _require_topics(consumer, [t.full_name(topic_prefix) for t in TOPICS], broker, timeout_s)
    except BaseException:
        consumer.close()
        raise
    target = store.with_database(target_database)
    target.command("DROP DATABASE IF EXISTS {database}")
    migrate(target)
    sink = EvidenceSink(target, consumer, None, codec, topic_prefix, fail_on_consumer_error=True)
    try:
        sink.run(threading.Event(), idle_exit_s=REPLAY_IDLE_EXIT_S, join_timeout_s=timeout_s)
    except ConsumerFailed as exc:
        raise ReplayError(f"replay from broker {broker} stopped, {target_database} is incomplete: {exc}") from exc
    reapply_prunes(store, target)
    return target


def _require_topics(consumer: Consumer, names: list[str], broker: str, timeout_s: float) -> None:
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        detail = error.str() if hasattr(error, "str") else str(error)
        raise ReplayError(f"cannot list the topics on broker {broker} within {timeout_s:.0f} s: {detail}") from None
    missing = [n for n in names if n not in metadata.topics or metadata.topics[n].error is not None]
    if missing:
        more = f" (and {len(missing) - 1} more: {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise ReplayError(f"topic {missing[0]} does not exist on broker {broker}{more}; nothing was rebuilt")


def compare(live: EvidenceStore, rebuilt: EvidenceStore) -> tuple[str, str, dict]:
    before, after = derived_state(live), derived_state(rebuilt)
    differences = {k: {"live": before[k], "rebuilt": after[k]} for k in before if before[k] != after[k]}
    return state_digest(before), state_digest(after), differences


def stored_events(store: EvidenceStore, topic: Topic, where: str = "", parameters: dict | None = None,
                  order: str = "envelope.event_time, envelope.event_id") -> Iterator[dict]:
    """Every stored event of the topic (those ``where`` selects), rebuilt into its schema's shape,
    oldest first (or in ``order``)."""
    columns = list(table_columns(topic))
    byte_columns = {c: "bytes" for c in _bytes_fields(topic)}
    offset = 0
    while True:
        rows = store.query(
            f"SELECT {', '.join(f'`{c}`' for c in columns)} FROM {{database}}.{topic.table} FINAL "
            f"{f'WHERE {where} ' if where else ''}"
            f"ORDER BY {order} LIMIT {PAGE_ROWS} OFFSET {offset}",
            parameters, column_formats=byte_columns or None)
        for row in rows:
            record = dict(zip(columns, row, strict=True))
            event_type = record["envelope"]["event_type"]
            fields = [f["name"] for f in loader.expanded_schema(event_type)["fields"]]
            event = {name: record[name] for name in fields}
            event_time = event["envelope"]["event_time"]
            if event_time.tzinfo is None:  # ClickHouse hands DateTime64(6,'UTC') back naive
                event["envelope"] = {**event["envelope"], "event_time": event_time.replace(tzinfo=UTC)}
            yield event
        if len(rows) < PAGE_ROWS:
            return
        offset += PAGE_ROWS


def _bytes_fields(topic: Topic) -> list[str]:
    return sorted({f["name"] for t in topic.event_types for f in loader.expanded_schema(t)["fields"]
                   if f["type"] == "bytes" or (isinstance(f["type"], list) and "bytes" in f["type"])})


def republish(store: EvidenceStore, publisher: Publisher) -> dict[str, int]:
    counts = {}
    for topic in TOPICS:
        n = 0
        for event in stored_events(store, topic):
            publisher.publish(event)
            n += 1
        counts[topic.name] = n
    publisher.flush()
    return counts


# Requests with fewer ended episodes than seeds.
UNSERVED_REQUESTS = (  # an EpisodeStarted names its request, an EpisodeEnded its episode only
    "SELECT r.request_id FROM (SELECT DISTINCT request_id, length(seeds) AS seeds FROM {database}.rollout_requests "
    "FINAL) AS r LEFT JOIN (SELECT request_id, uniqExact(episode_id) AS ended FROM {database}.rollout_episodes FINAL "
    "WHERE envelope.event_type = 'EpisodeStarted' AND episode_id IN (SELECT episode_id FROM "
    "{database}.rollout_episodes FINAL WHERE envelope.event_type = 'EpisodeEnded') GROUP BY request_id) AS e "
    "ON r.request_id = e.request_id WHERE ifNull(e.ended, 0) < r.seeds ORDER BY r.request_id")
UNANALYSED_EPISODES = (
    "SELECT DISTINCT episode_id FROM {database}.rollout_episodes FINAL WHERE envelope.event_type = 'EpisodeEnded' "
    "AND episode_id NOT IN (SELECT episode_id FROM {database}.failure_episodes FINAL)")


def republish_in_flight(store: EvidenceStore, publisher: Publisher) -> dict[str, int]:
    """Re-publish what the loop still waits on (module docstring); per topic, how many events."""
    from consumers.state import candidates, refused_requests

    counts: dict[str, int] = {}

    def publish(topic_name: str, where: str, parameters: dict, **order: str) -> None:
        for event in stored_events(store, BY_NAME[topic_name], where, parameters, **order):
            publisher.publish(event)
            counts[topic_name] = counts.get(topic_name, 0) + 1

    unserved = [r for (r,) in store.query(UNSERVED_REQUESTS)]
    # a request a worker refused (dead-lettered) would only be refused again
    refused = refused_requests(store, BY_NAME["rollout.requests"].full_name(publisher.prefix), unserved)
    requests = [r for r in unserved if r not in refused]
    if requests:
        publish("rollout.requests", "has({ids:Array(String)}, request_id)", {"ids": requests})
    pending = [c.scenario_id for c in candidates(store) if c.status == "pending" and c.generator != "base"]
    if pending:
        publish("scenarios.candidates", "has({ids:Array(String)}, scenario_id)", {"ids": pending})
    episodes = [e for (e,) in store.query(UNANALYSED_EPISODES)]
    if episodes:
        # the detector reads an episode's start, steps and end; in that order per episode key
        publish("rollout.episodes", "has({ids:Array(String)}, episode_id) AND envelope.event_type = 'EpisodeStarted'",
                {"ids": episodes})
        publish("rollout.steps", "has({ids:Array(String)}, episode_id)", {"ids": episodes}, order="episode_id, t")
        publish("rollout.episodes", "has({ids:Array(String)}, episode_id) AND envelope.event_type = 'EpisodeEnded'",
                {"ids": episodes})
    # The clusterer restores itself from failures.clusters and the EpisodeAnalysed events that log
    # took in, then takes in what failures.episodes holds beyond them: its whole history, or a blank
    # clusterer would number its clusters from 0 again, under ids the log holds with other content.
    publish("failures.clusters", "", {}, order="position")
    publish("failures.episodes", "", {})
    publisher.flush()
    return counts
