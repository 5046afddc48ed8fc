"""The failure-clusterer agent's pure core: EpisodeAnalysed in, positioned cluster events out, and
the restore that rebuilds the clusterer from its own output.

    stage = ClusterStage(OnlineFailureClusterer(...), EmbeddingConfig(), CollectorConfig(), "sepa.", "streams")
    outgoing = stage.process(raw_messages)      # failures.episodes -> ClusterAssigned / ClusterUpdated, DeadLetters
    log = ClusterLog(codec); log.add(raw)       # every message of failures.clusters, from the beginning
    outgoing = stage.restore(log, analysed)     # re-executes the log; returns what it lacks at its end

Input: failures.episodes carries one EpisodeAnalysed per ended episode, on one partition, so the
clusterer sees every episode once it is decided, in one order. A *failed* episode (success false,
analysed, termination not in ``skip_terminations``), and a *fragile success* (a success with
failure moments, recovered or not; ``fragile_successes``), is embedded from its moments, quality
and scenario and taken in at once; anything else (and any episode on a held-out seed, producers/seeds.py:
measurement never chooses) is counted and passed over; an episode already taken
in (a re-delivery, or input re-read after a restart) is skipped. An episode that cannot be
embedded (a failure type this version does not know) is dead-lettered with the reason.

Restore: the output log is the clusterer's history. ``restore`` re-executes it in position order
on a blank clusterer, from the EpisodeAnalysed events of the episodes it took in: an intake
(ClusterAssigned intake=true) takes the episode in again, the re-clustering its schedule runs
follows by itself, a recorded re-clustering that no intake explains (``recluster_idle_s``) runs
again, a language-model summary keeps its position. Every re-derived event must equal the
recorded one at its position (content: every field but envelope.event_time), else restore
raises ClustererError naming the first difference. Events the last re-executed step derives
beyond the log's end (a crash between two of one step's sends) are returned, to be published.

Clustering is global: failures.episodes has one partition, so exactly one worker's clusterer is
active (see streams/failures/agents.py).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from producers.episode import HARNESS_TERMINATIONS
from producers.seeds import is_held_out
from schemas.catalog import BY_NAME
from schemas.codec import Codec
from schemas.exceptions import SchemaError
from streams.deadletter import Intake, Outgoing, RawMessage
from streams.exceptions import ClustererError, ConfigError
from streams.failures.clusterer import OnlineFailureClusterer
from streams.failures.embedding import EmbeddingConfig, FailedEpisode, embed, facts
from streams.failures.summaries import ClusterStats

log = logging.getLogger("sepa.streams.failures.collector")
CONSUMER = "failure-clusterer"
INPUT_TOPIC = "failures.episodes"
OUTPUT_TOPIC = "failures.clusters"


@dataclass(frozen=True, kw_only=True)
class CollectorConfig:
    skip_terminations: tuple[str, ...] = HARNESS_TERMINATIONS  # not policy failures: not clustered
    # A success with failure moments (a miss it recovered from, a collision on the way) is a fragile
    # win: binary success hides it, and at a saturated benchmark it is most of what there is to mine.
    # Off here (the clusterer of failures); the product turns it on (infra/streams_worker.py).
    fragile_successes: bool = False
    # Re-cluster after this long without input when episodes came in since the last re-clustering,
    # s; None (the default) = only on the intake schedule, so the clusters are a function of the
    # input alone (a report taken once every episode is in stays true later).
    recluster_idle_s: float | None = None
    restore_timeout_s: float = 300.0  # reading failures.clusters / failures.episodes at a restore, s

    def __post_init__(self) -> None:
        if self.recluster_idle_s is not None and not self.recluster_idle_s > 0:
            raise ConfigError(f"CollectorConfig.recluster_idle_s must be > 0 or None, got {self.recluster_idle_s!r}")
        if not self.restore_timeout_s > 0:
            raise ConfigError(f"CollectorConfig.restore_timeout_s must be > 0, got {self.restore_timeout_s!r}")
        if not all(isinstance(t, str) for t in self.skip_terminations):
            raise ConfigError(f"CollectorConfig.skip_terminations must be strings, got {self.skip_terminations!r}")


@dataclass(frozen=True)
class SummaryRequest:
    """A cluster revision whose summary a language model may rewrite (run it off the event loop)."""

    cluster_id: str
    revision: int
    stats: ClusterStats
    feature_summary: str


def _content(event: dict) -> dict:
    """An event without its envelope.event_time: what "the same content" compares."""
    return {**event, "envelope": {k: v for k, v in event["envelope"].items() if k != "event_time"}}


def _difference(derived: dict, logged: dict) -> str:
    a, b = _content(derived), _content(logged)
    for name in sorted(set(a) | set(b)):
        if a.get(name) != b.get(name):
            if name == "envelope":
                keys = sorted(k for k in set(a[name]) | set(b[name]) if a[name].get(k) != b[name].get(k))
                return f"envelope {', '.join(keys)}: re-derived {[a[name].get(k) for k in keys]!r}, " \
                       f"logged {[b[name].get(k) for k in keys]!r}"
            return f"{name}: re-derived {str(a.get(name))[:120]}, logged {str(b.get(name))[:120]}"
    return "no difference"


@dataclass(frozen=True)
class Recorded:
    """One event of the output log: its bytes and what a restore decides on without decoding it again."""

    position: int
    event_type: str
    event_id: str
    intake_of: str | None  # the episode a ClusterAssigned(intake=true) takes in
    llm: bool  # a language model's summary
    value: bytes


class ClusterLog:
    """failures.clusters as read from the beginning: the clusterer's events by position.

    A re-sent event (same position, same content) counts once. A different event at a position
    already held (only a fenced-off former owner could write one) is a conflict: the first in
    offset order stands, the other is counted and logged. Undecodable messages are counted. Holds
    bytes, not decoded events, so a long history restores in bounded memory."""

    def __init__(self, codec: Codec):
        self.codec = codec
        self.events: dict[int, Recorded] = {}
        self.stats: Counter = Counter()

    def add(self, raw: RawMessage) -> None:
        self.stats["messages"] += 1
        try:
            event = self.codec.decode(raw.value)
        except SchemaError as exc:
            self.stats["undecodable"] += 1
            log.warning("%s[%s]@%s is not a cluster event, passed over: %s", raw.topic, raw.partition, raw.offset,
                        exc)
            return
        event_type = event["envelope"]["event_type"]
        if event_type not in ("ClusterAssigned", "ClusterUpdated"):
            self.stats["foreign"] += 1
            return
        position = event["position"]
        held = self.events.get(position)
        if held is None:
            intake = event["episode_id"] if event_type == "ClusterAssigned" and event["intake"] else None
            self.events[position] = Recorded(position, event_type, event["envelope"]["event_id"], intake,
                                             event_type == "ClusterUpdated" and event["summary_source"] == "llm",
                                             raw.value)
        elif held.value == raw.value or _content(self.codec.decode(held.value)) == _content(event):
            self.stats["duplicates"] += 1
        else:
            self.stats["conflicts"] += 1
            log.error("%s[%s]@%s: a second, different event at position %d (%s, kept: %s): %s", raw.topic,
                      raw.partition, raw.offset, position, event["envelope"]["event_id"], held.event_id,
                      _difference(event, self.codec.decode(held.value)))

    def intake_episodes(self) -> set[str]:
        return {r.intake_of for r in self.events.values() if r.intake_of is not None}

    def ordered(self) -> list[Recorded]:
        """The events at positions 0..n-1; raises ClustererError at the first missing position."""
        n = len(self.events)
        if n and max(self.events) != n - 1:
            gap = next(p for p in range(n + 1) if p not in self.events)
            raise ClustererError(f"{OUTPUT_TOPIC} lacks position {gap} of the clusterer's output (it holds "
                                 f"{n} positions up to {max(self.events)}): its history cannot be re-executed")
        return [self.events[p] for p in range(n)]


class ClusterStage:
    """Decode, embed failed episodes, cluster, restore. Synchronous; one active per deployment."""

    def __init__(self, clusterer: OnlineFailureClusterer, embedding_config: EmbeddingConfig,
                 config: CollectorConfig, topic_prefix: str, run_id: str, codec: Codec | None = None,
                 clock: Callable[[], float] = time.monotonic, want_llm_summaries: bool = False):
        self.clusterer = clusterer
        self.embedding_config = embedding_config
        self.config = config
        self.codec = codec or Codec()
        self.clock = clock
        self.want_llm_summaries = want_llm_summaries
        self.input_topic = BY_NAME[INPUT_TOPIC].full_name(topic_prefix)
        self.output_topic = BY_NAME[OUTPUT_TOPIC].full_name(topic_prefix)
        self.intake = Intake(self.codec, CONSUMER, run_id, {self.input_topic: BY_NAME[INPUT_TOPIC]})
        self.stats: Counter = Counter()
        self.summary_requests: list[SummaryRequest] = []
        self._last_input = clock()
        self._idle_due = False

    # -- agent entry points -------------------------------------------------------------------

    def process(self, messages: Iterable[RawMessage]) -> list[Outgoing]:
        out: list[Outgoing] = []
        for raw in messages:
            self.stats["messages"] += 1
            self._last_input = self.clock()
            event, dead = self.intake.admit(raw)
            if dead is not None:
                self.stats["dead_lettered"] += 1
                out.append(dead)
                continue
            passed = self.passed_over(event)
            if passed is not None:
                self.stats[passed] += 1
                continue
            if self.clusterer.knows(event["episode_id"]):
                self.stats["already_taken_in"] += 1
                continue
            try:
                events = self.take_in(self.clusterer, event)
            except (ClustererError, ValueError, KeyError) as exc:
                self.stats["dead_lettered"] += 1
                out.append(self.intake.refuse(raw, f"EpisodeAnalysed {event['episode_id']}: cannot be clustered: "
                                                   f"{type(exc).__name__}: {exc}"))
                continue
            self.stats["taken_in"] += 1
            self._idle_due = True
            out += self._publishable(events)
        return out

    def tick(self) -> list[Outgoing]:
        """The idle re-clustering, when configured and due."""
        idle = self.config.recluster_idle_s
        if idle is None or not self._idle_due or self.clock() - self._last_input < idle:
            return []
        self._idle_due = False
        events = self.clusterer.recluster()
        if events:
            self.stats["idle_reclusterings"] += 1
        return self._publishable(events)

    # -- intake ---------------------------------------------------------------------------------

    def passed_over(self, event: dict) -> str | None:
        """Why an EpisodeAnalysed is not a failure to cluster (a counter name), or None."""
        if event["success"] and not (self.config.fragile_successes and event["moments"]):
            return "successes"
        if not event["analysed"]:
            return "not_analysed"
        if event["termination"] in self.config.skip_terminations:
            return "skipped_terminations"
        if is_held_out(event.get("seed")):
            return "held_out"  # a measurement episode: clustering it would let it choose scenarios
        return None

    def take_in(self, clusterer: OnlineFailureClusterer, event: dict) -> list[dict]:
        episode = FailedEpisode.from_analysed(event)
        x = embed(episode, self.embedding_config)
        return clusterer.add(episode.episode_id, episode.scenario_id, x, facts(episode),
                             event_time=event["envelope"]["event_time"])

    def _publishable(self, events: list[dict]) -> list[Outgoing]:
        if self.want_llm_summaries:
            self._request_summaries(events)
        # Our own events always match their schema (their inputs were checked at the intake); a
        # failure here is a bug, raised rather than dropped: a dropped event would leave a gap.
        return [Outgoing.of(e, self.codec) for e in events]

    # -- restore --------------------------------------------------------------------------------

    def restore(self, history: ClusterLog, analysed: Mapping[str, dict]) -> list[Outgoing]:
        """Re-executes ``history`` on a blank clusterer (see the module docstring) and makes it this
        stage's clusterer; ``analysed.get(episode_id)`` gives each intake's EpisodeAnalysed.
        Returns the re-derived events beyond the log's end, to publish."""
        clusterer = self.clusterer.blank()
        logged = history.ordered()
        pending: deque[dict | None] = deque()  # derived, not compared yet; None: a recorded summary
        for recorded in logged:
            if not pending:
                pending.extend(self._re_execute(clusterer, recorded, analysed))
            mine = pending.popleft()
            if mine is None or self.codec.encode(mine) == recorded.value:
                continue
            theirs, mine = self.codec.decode(recorded.value), self.codec.decode(self.codec.encode(mine))
            if _content(mine) != _content(theirs):  # bytes differ, content too (not only the time)
                raise ClustererError(
                    f"restore: position {recorded.position} of {self.output_topic} ({recorded.event_type} "
                    f"{recorded.event_id}) differs from what re-executing the log derives: "
                    f"{_difference(mine, theirs)}. The log was written by another clusterer version or "
                    f"configuration ({theirs.get('clusterer_version')}); a changed clusterer needs its own "
                    "ClustererConfig.namespace and output topic")
        tail = list(pending)
        self.clusterer = clusterer
        self.summary_requests = []
        self._idle_due = False
        self.stats["restored_events"] = len(logged)
        self.stats["restored_intakes"] = clusterer.updates
        self.stats["restore_tail"] += len(tail)
        for name, n in history.stats.items():
            if name != "messages":
                self.stats[f"log_{name}"] = n
        return [Outgoing.of(e, self.codec) for e in tail]

    def _re_execute(self, clusterer: OnlineFailureClusterer, recorded: Recorded,
                    analysed: Mapping[str, dict]) -> list[dict | None]:
        """The events of the step that emitted ``recorded`` first."""
        p = recorded.position
        if recorded.intake_of is not None:
            episode_id = recorded.intake_of
            event = analysed.get(episode_id)
            if event is None:
                raise ClustererError(f"restore: position {p} takes in episode {episode_id}, whose EpisodeAnalysed "
                                     f"is not on {self.input_topic}")
            passed = self.passed_over(event)
            if passed is not None or clusterer.knows(episode_id):
                raise ClustererError(f"restore: position {p} takes in episode {episode_id}, which re-executing "
                                     f"passes over ({passed or 'already taken in'})")
            return self.take_in(clusterer, event)
        if recorded.llm:
            clusterer.skip_position()
            return [None]
        events = clusterer.recluster()
        if not events:
            raise ClustererError(f"restore: position {p} ({recorded.event_type} {recorded.event_id}) belongs to "
                                 "a re-clustering that re-executing the log does not produce")
        return events

    def forget(self) -> None:
        """Stand by: another worker owns the input. A later restore rebuilds everything."""
        self.clusterer = self.clusterer.blank()
        self.summary_requests = []
        self._idle_due = False

    # -- optional language-model summaries ------------------------------------------------------

    def _request_summaries(self, events: list[dict]) -> None:
        for e in events:
            if e["envelope"]["event_type"] != "ClusterUpdated" or e["size"] == 0:
                continue
            cluster = self.clusterer.clusters.get(e["cluster_id"])
            if cluster is not None:
                self.summary_requests.append(SummaryRequest(cluster.id, cluster.revision,
                                                            self.clusterer.stats(cluster), e["summary"]))

    def take_summary_requests(self) -> list[SummaryRequest]:
        requests, self.summary_requests = self.summary_requests, []
        return requests

    def llm_summary(self, request: SummaryRequest, text: str) -> Outgoing | None:
        """The ClusterUpdated (summary_source "llm") for a request, at the next position, if the
        cluster is still at that revision; None when it has changed since (a newer revision gets
        its own request)."""
        event = self.clusterer.summary_event(request.cluster_id, request.revision, text)
        if event is None:
            return None
        return Outgoing.of(event, self.codec)
