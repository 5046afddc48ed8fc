"""The topic catalog: every topic, its key, the event types it carries, partitions, retention."""

from __future__ import annotations

from dataclasses import dataclass

DAY_MS = 24 * 3600 * 1000
FOREVER = -1
# The largest message value any topic takes: every topic is created with max.message.bytes at it,
# every producer of ours is configured to it (librdkafka's message.max.bytes, aiokafka's
# max_request_size) and every consumer refuses a larger value by dead-lettering it (the codec's
# first check). librdkafka's own default; a Step is ~2 kB.
MAX_MESSAGE_BYTES = 1_000_000
# How much of a refused value its DeadLetter keeps (with the whole value's size and sha256): enough
# to see what it was, and far below MAX_MESSAGE_BYTES so the dead letter itself can always be sent.
DEAD_LETTER_EXCERPT_BYTES = 64 * 1024


@dataclass(frozen=True)
class Topic:
    name: str  # without the configurable prefix
    key_field: str  # field of the event whose value is the message key (it picks the partition)
    event_types: tuple[str, ...]
    partitions: int
    retention_ms: int
    table: str  # evidence table in ClickHouse
    order_field: str = ""  # first column of the table's ORDER BY when it is not key_field

    def full_name(self, prefix: str) -> str:
        return f"{prefix}{self.name}"

    @property
    def table_key(self) -> str:
        return self.order_field or self.key_field

    def message_key(self, event: dict) -> bytes:
        return str(event[self.key_field]).encode()


TOPICS: tuple[Topic, ...] = (
    # Keyed by request: rollout workers in one consumer group share a scenario's sweeps (all its
    # models), and a request asked for twice (the same id) still lands on one worker, which runs it
    # once. Twelve partitions split evenly over 1, 2, 3, 4 or 6 workers. The table keeps the ORDER BY
    # migration 0001 gave it.
    Topic("rollout.requests", "request_id", ("RolloutRequested",), 12, 30 * DAY_MS, "rollout_requests",
          order_field="scenario_id"),
    Topic("rollout.episodes", "episode_id", ("EpisodeStarted", "EpisodeEnded"), 4, FOREVER, "rollout_episodes"),
    Topic("rollout.steps", "episode_id", ("Step",), 4, 14 * DAY_MS, "rollout_steps"),
    Topic("failures.moments", "episode_id", ("FailureMoment",), 3, FOREVER, "failure_moments"),
    # One partition each: the clusterer reads failures.episodes alone (a second clusterer in the group
    # gets no partition: a standby), and restores itself from failures.clusters in order.
    Topic("failures.episodes", "episode_id", ("EpisodeAnalysed",), 1, FOREVER, "failure_episodes"),
    Topic("failures.clusters", "cluster_id", ("ClusterAssigned", "ClusterUpdated"), 1, FOREVER, "failure_clusters"),
    Topic("scenarios.candidates", "scenario_id", ("CandidateProposed",), 3, FOREVER, "scenario_candidates"),
    Topic("critics.verdicts", "scenario_id", ("CriticVerdict",), 3, FOREVER, "critic_verdicts"),
    Topic("benchmark.decisions", "scenario_id",
          ("Promoted", "Rejected", "Deferred", "ReviewRequested", "ReviewDecided", "Retired"), 1, FOREVER,
          "benchmark_decisions"),
    Topic("benchmark.cycles", "cycle_id", ("CycleStarted", "CandidatesGenerated"), 1, FOREVER, "benchmark_cycles"),
    Topic("models.registry", "model_id", ("ModelRegistered",), 1, FOREVER, "models_registry"),
    Topic("deadletter", "source_topic", ("DeadLetter",), 1, FOREVER, "dead_letters"),
)

BY_NAME = {t.name: t for t in TOPICS}
BY_EVENT_TYPE = {event_type: t for t in TOPICS for event_type in t.event_types}


def topic_for(event_type: str) -> Topic:
    try:
        return BY_EVENT_TYPE[event_type]
    except KeyError:
        raise KeyError(f"event type {event_type!r} belongs to no topic in the catalog") from None


def topic_by_full_name(full_name: str, prefix: str) -> Topic:
    if not full_name.startswith(prefix) or full_name[len(prefix):] not in BY_NAME:
        raise KeyError(f"topic {full_name!r} is not in the catalog (prefix {prefix!r})")
    return BY_NAME[full_name[len(prefix):]]
