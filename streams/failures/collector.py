"""The failure-clusterer agent's pure core: gathers each episode's start, moments and end, embeds
each failed episode once it has settled, and feeds the online clusterer.

    stage = ClusterStage(OnlineFailureClusterer(...), EmbeddingConfig(), CollectorConfig(), run_id="streams")
    outgoing = stage.process(raw_messages)   # ClusterAssigned / ClusterUpdated and DeadLetters
    outgoing += stage.tick()                  # settled episodes; a re-clustering when one is due

FailureMoments (failures.moments) and EpisodeEnded (rollout.episodes) travel on different topics,
and the detector may be far behind the episodes topic (a backlog at start-up), so the end alone
does not mean all of an episode's moments are in. The detector emits an episode's end-only
moments (``on_end``: timeout last) after all of its other moments, on the same partition, so:

- a failed episode that ended by "timeout" is complete when its EpisodeEnded and its timeout
  moment are both in: it is embedded then;
- any other failed episode (policy_error, ...; or one the detector did not analyse) is embedded
  ``settle_s`` after the later of its EpisodeEnded and its last moment.

Moments arriving after embedding are counted (``stats["late_moments"]``), not re-embedded.
Successful episodes and those ended by ``skip_terminations`` are not failures: they are dropped as
soon as their EpisodeEnded arrives.

Clustering is global: run this stage in exactly one worker (see streams.app).
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from schemas.catalog import BY_NAME
from schemas.codec import Codec
from schemas.exceptions import SchemaError
from streams.deadletter import Intake, Outgoing, RawMessage
from streams.exceptions import ClustererError, ConfigError
from streams.failures.clusterer import OnlineFailureClusterer
from streams.failures.embedding import EmbeddingConfig, FailedEpisode, embed
from streams.failures.summaries import ClusterStats

log = logging.getLogger("sepa.streams.failures.collector")
CONSUMER = "failure-clusterer"
INPUT_TOPICS = ("failures.moments", "rollout.episodes")
OUTPUT_TOPIC = "failures.clusters"


@dataclass(frozen=True, kw_only=True)
class CollectorConfig:
    settle_s: float = 30.0  # without a timeout moment to close it: wait this long after the end / last moment, s
    idle_timeout_s: float = 3600.0  # an episode with no EpisodeEnded and no event for this long is dropped, s
    max_open_episodes: int = 100_000  # beyond this the least recently active episode is dropped
    remember_finished: int = 100_000  # embedded episode ids remembered to count late moments
    recluster_interval_s: float = 30.0  # re-cluster at least this often while episodes await a cluster, s
    skip_terminations: tuple[str, ...] = ("env_error", "aborted")  # not policy failures: not embedded

    def __post_init__(self) -> None:
        for name in ("settle_s", "idle_timeout_s", "recluster_interval_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"CollectorConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("max_open_episodes", "remember_finished"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"CollectorConfig.{name} must be an integer >= 1, got {getattr(self, name)!r}")


@dataclass
class _Gathered:
    moments: dict[str, dict] = field(default_factory=dict)  # by event id: re-deliveries count once
    scenario: dict | None = None
    ended: dict | None = None
    settle_from: float = 0.0
    last_seen: float = 0.0
    closed: bool = False  # the detector's last word on it (the timeout moment) is in


@dataclass(frozen=True)
class SummaryRequest:
    """A cluster revision whose summary a language model may rewrite (run it off the event loop)."""

    cluster_id: str
    revision: int
    stats: ClusterStats
    feature_summary: str


class ClusterStage:
    """Decode, gather, embed settled failed episodes, cluster. Synchronous; one per process."""

    def __init__(self, clusterer: OnlineFailureClusterer, embedding_config: EmbeddingConfig,
                 config: CollectorConfig, topic_prefix: str, run_id: str, codec: Codec | None = None,
                 clock: Callable[[], float] = time.monotonic, want_llm_summaries: bool = False):
        self.clusterer = clusterer
        self.embedding_config = embedding_config
        self.config = config
        self.codec = codec or Codec()
        self.clock = clock
        self.want_llm_summaries = want_llm_summaries
        expected = {BY_NAME[name].full_name(topic_prefix): BY_NAME[name] for name in INPUT_TOPICS}
        self.intake = Intake(self.codec, CONSUMER, run_id, expected)
        self.open: OrderedDict[str, _Gathered] = OrderedDict()
        self.finished: OrderedDict[str, bool] = OrderedDict()  # episode id -> it was embedded
        self.stats: Counter = Counter()
        self.summary_requests: list[SummaryRequest] = []
        self._last_recluster = clock()

    # -- agent entry points -------------------------------------------------------------------

    def process(self, messages: Iterable[RawMessage]) -> list[Outgoing]:
        out: list[Outgoing] = []
        for raw in messages:
            self.stats["messages"] += 1
            event, dead = self.intake.admit(raw)
            if dead is not None:
                out.append(dead)
                continue
            self.on_event(event)
        return out + self.tick()

    def tick(self) -> list[Outgoing]:
        """Embeds and clusters every settled episode; re-clusters when episodes wait too long."""
        out: list[Outgoing] = []
        for event in self.flush():
            try:
                out.append(Outgoing(OUTPUT_TOPIC, event["cluster_id"].encode(), self.codec.encode(event)))
            except SchemaError:
                log.exception("cluster event does not match its schema; dropped: %s", str(event)[:300])
                self.stats["unencodable"] += 1
        return out

    # -- gathering ------------------------------------------------------------------------------

    def on_event(self, event: dict) -> None:
        event_type = event["envelope"]["event_type"]
        episode_id = event["episode_id"]
        if episode_id in self.finished:
            if event_type == "FailureMoment":
                # a successful episode's moments (a collision on the way) are not failures to cluster
                self.stats["late_moments" if self.finished[episode_id] else "moments_of_non_failures"] += 1
            return
        g = self.open.get(episode_id)
        if g is None:
            g = self.open[episode_id] = _Gathered()
            while len(self.open) > self.config.max_open_episodes:
                old, _ = self.open.popitem(last=False)
                self.stats["evicted"] += 1
                log.warning("dropping episode %s: more than %d open", old, self.config.max_open_episodes)
        else:
            self.open.move_to_end(episode_id)
        now = self.clock()
        g.last_seen = now
        if event_type == "FailureMoment":
            g.moments[event["envelope"]["event_id"]] = event
            g.settle_from = now
            if event["failure_type"] == "timeout":
                g.closed = True
        elif event_type == "EpisodeStarted":
            g.scenario = event["scenario"]
        elif event_type == "EpisodeEnded" and g.ended is None:
            if event["success"] or event["termination"] in self.config.skip_terminations:
                del self.open[episode_id]
                self._remember(episode_id, embedded=False)
                self.stats["not_failures"] += 1
                return
            g.ended, g.settle_from = event, max(g.settle_from, now)

    def flush(self) -> list[dict]:
        """Cluster events for every episode settled by now."""
        now = self.clock()
        events: list[dict] = []
        for episode_id, g in list(self.open.items()):
            if g.ended is not None and ((g.closed and g.ended["termination"] == "timeout")
                                        or now - g.settle_from >= self.config.settle_s):
                del self.open[episode_id]
                self._remember(episode_id, embedded=True)
                events += self._embed(episode_id, g)
            elif g.ended is None and now - g.last_seen >= self.config.idle_timeout_s:
                del self.open[episode_id]
                self.stats["idle_dropped"] += 1
        if self.clusterer.pending and now - self._last_recluster >= self.config.recluster_interval_s:
            events += self.clusterer.recluster()
        if any(e["envelope"]["event_type"] == "ClusterUpdated" for e in events):
            self._last_recluster = now
            if self.want_llm_summaries:
                self._request_summaries(events)
        return events

    def _remember(self, episode_id: str, embedded: bool) -> None:
        self.finished[episode_id] = embedded
        while len(self.finished) > self.config.remember_finished:
            self.finished.popitem(last=False)

    def _embed(self, episode_id: str, g: _Gathered) -> list[dict]:
        ended = g.ended
        episode = FailedEpisode(episode_id, ended["scenario_id"], ended["model_id"], ended["steps"],
                                ended["termination"], sorted(g.moments.values(), key=lambda m: m["step"]),
                                ended["quality"], g.scenario)
        try:
            x = embed(episode, self.embedding_config)
            self.stats["embedded"] += 1
            return self.clusterer.add(episode_id, episode.scenario_id, x)
        except (ClustererError, KeyError, ValueError) as exc:
            self.stats["unembeddable"] += 1
            log.warning("episode %s not clustered: %s: %s", episode_id, type(exc).__name__, exc)
            return []

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
        """The ClusterUpdated (summary_source "llm") for a request, if the cluster is still at that
        revision; None when it has changed since (a newer revision gets its own request)."""
        cluster = self.clusterer.clusters.get(request.cluster_id)
        if cluster is None or cluster.revision != request.revision:
            return None
        event = self.clusterer.updated_event(cluster, text, "llm")
        return Outgoing(OUTPUT_TOPIC, cluster.id.encode(), self.codec.encode(event))
