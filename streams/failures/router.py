"""The failure-detector agent's pure core: per-episode detectors kept in memory, fed by the
rollout.steps and rollout.episodes topics.

    stage = DetectorStage(DetectorConfig(), RouterConfig(), topic_prefix="sepa.", run_id="streams")
    outgoing = stage.process(raw_messages)   # FailureMoments (failures.moments) and DeadLetters
    outgoing += stage.tick()                  # every second or so: overdue ends, idle episodes

Both topics are keyed by episode_id with the same partition count, so one worker sees all of an
episode's events, but not in a fixed order across the two topics. So:

- Steps that arrive before their EpisodeStarted are buffered (``max_buffered_steps``) and
  replayed into the detector when it is created (from EpisodeStarted, or EpisodeEnded if the start
  never came: both carry scenario_id and model_id).
- An EpisodeEnded whose last steps are still in flight waits until step ``steps - 1`` arrives or
  ``end_grace_s`` passes; then the detector's ``on_end`` runs.
- An episode whose first step seen is not t=0 (this worker started or took over the partition
  mid-episode: detector state lives in memory, not in a changelog) is not analysed: every failure
  type is defined relative to the episode's start, which this worker did not see. It is counted in
  ``stats["joined_late"]``; a replay of the topics analyses it.
- Anything undecodable, non-finite or refused by the detector becomes a DeadLetter (consumer
  "failure-detector"); the episode's other events are still processed.
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
from streams.exceptions import ConfigError, StreamsError
from streams.failures.detector import DetectorConfig, EpisodeDetector

log = logging.getLogger("sepa.streams.failures.router")
CONSUMER = "failure-detector"
INPUT_TOPICS = ("rollout.steps", "rollout.episodes")
OUTPUT_TOPIC = "failures.moments"


@dataclass(frozen=True, kw_only=True)
class RouterConfig:
    end_grace_s: float = 10.0  # wait this long after EpisodeEnded for steps still in flight, s
    max_buffered_steps: int = 5000  # steps held for an episode whose detector does not exist yet
    idle_timeout_s: float = 1800.0  # an episode with no event for this long is dropped, s
    max_open_episodes: int = 50_000  # beyond this the least recently active episode is dropped
    remember_finished: int = 100_000  # finished episode ids remembered to ignore late re-deliveries

    def __post_init__(self) -> None:
        for name in ("end_grace_s", "idle_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"RouterConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("max_buffered_steps", "max_open_episodes", "remember_finished"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"RouterConfig.{name} must be an integer >= 1, got {getattr(self, name)!r}")


@dataclass
class _Episode:
    detector: EpisodeDetector | None = None
    buffer: list[dict] = field(default_factory=list)
    ended: dict | None = None
    ended_at: float = 0.0
    last_seen: float = 0.0
    first_t: int | None = None
    unanalysable: str | None = None  # why this episode is not analysed


class DetectorStage:
    """Decode, route to per-episode detectors, encode moments. Synchronous; one per agent."""

    def __init__(self, detector_config: DetectorConfig, config: RouterConfig, topic_prefix: str, run_id: str,
                 codec: Codec | None = None, clock: Callable[[], float] = time.monotonic):
        self.detector_config = detector_config
        self.config = config
        self.prefix = topic_prefix
        self.codec = codec or Codec()
        self.clock = clock
        expected = {BY_NAME[name].full_name(topic_prefix): BY_NAME[name] for name in INPUT_TOPICS}
        self.intake = Intake(self.codec, CONSUMER, run_id, expected)
        self.episodes: OrderedDict[str, _Episode] = OrderedDict()  # least recently active first
        self.finished: OrderedDict[str, None] = OrderedDict()
        self.stats: Counter = Counter()

    # -- agent entry points -------------------------------------------------------------------

    def process(self, messages: Iterable[RawMessage]) -> list[Outgoing]:
        out: list[Outgoing] = []
        for raw in messages:
            self.stats["messages"] += 1
            event, dead = self.intake.admit(raw)
            if dead is not None:
                out.append(dead)
                continue
            try:
                moments = self.on_event(event)
                out.extend(Outgoing(OUTPUT_TOPIC, m["episode_id"].encode(), self.codec.encode(m)) for m in moments)
            except (StreamsError, SchemaError, ArithmeticError, LookupError, TypeError, ValueError) as exc:
                out.append(self.intake.refuse(
                    raw, f"failure detector refused {event['envelope']['event_type']}: {type(exc).__name__}: {exc}"))
        return out

    def tick(self) -> list[Outgoing]:
        return [Outgoing(OUTPUT_TOPIC, m["episode_id"].encode(), self.codec.encode(m)) for m in self.expire()]

    # -- routing --------------------------------------------------------------------------------

    def on_event(self, event: dict) -> list[dict]:
        """Moments (FailureMoment dicts) that one decoded Step / EpisodeStarted / EpisodeEnded yields."""
        event_type = event["envelope"]["event_type"]
        episode_id = event["episode_id"]
        if episode_id in self.finished:
            self.stats["after_finish"] += 1
            return []
        ep = self._episode(episode_id)
        if event_type == "Step":
            return self._step(episode_id, ep, event)
        if event_type == "EpisodeStarted":
            if ep.detector is None:
                return self._create(episode_id, ep, event["scenario_id"], event["model_id"])
            return []
        if event_type == "EpisodeEnded":
            if ep.ended is not None:
                return []
            ep.ended, ep.ended_at = event, self.clock()
            out = []
            if ep.detector is None:
                out = self._create(episode_id, ep, event["scenario_id"], event["model_id"])
            return out + self._maybe_finish(episode_id, ep)
        self.stats["ignored_" + event_type] += 1
        return []

    def _episode(self, episode_id: str) -> _Episode:
        ep = self.episodes.get(episode_id)
        if ep is None:
            ep = self.episodes[episode_id] = _Episode()
            while len(self.episodes) > self.config.max_open_episodes:
                old, _ = self.episodes.popitem(last=False)
                self.stats["evicted"] += 1
                log.warning("dropping episode %s: more than %d open episodes", old, self.config.max_open_episodes)
        else:
            self.episodes.move_to_end(episode_id)
        ep.last_seen = self.clock()
        return ep

    def _step(self, episode_id: str, ep: _Episode, step: dict) -> list[dict]:
        if ep.first_t is None:
            ep.first_t = step["t"]
            if step["t"] != 0:
                ep.unanalysable = f"first step seen is t={step['t']}, not 0"
                self.stats["joined_late"] += 1
        if ep.unanalysable:
            return self._maybe_finish(episode_id, ep)
        if ep.detector is not None:
            return ep.detector.on_step(step) + self._maybe_finish(episode_id, ep)
        if len(ep.buffer) >= self.config.max_buffered_steps:
            ep.unanalysable = f"more than {self.config.max_buffered_steps} steps before EpisodeStarted"
            ep.buffer.clear()
            self.stats["buffer_overflow"] += 1
            return []
        ep.buffer.append(step)
        return []

    def _create(self, episode_id: str, ep: _Episode, scenario_id: str, model_id: str) -> list[dict]:
        ep.detector = EpisodeDetector(self.detector_config, episode_id, scenario_id, model_id)
        self.stats["episodes"] += 1
        out: list[dict] = []
        if not ep.unanalysable:
            for step in sorted(ep.buffer, key=lambda s: s["t"]):
                out += ep.detector.on_step(step)
        ep.buffer.clear()
        return out

    def _maybe_finish(self, episode_id: str, ep: _Episode, force: bool = False) -> list[dict]:
        if ep.ended is None or ep.detector is None:
            return []
        complete = ep.detector.last_t + 1 >= ep.ended["steps"]
        if not (complete or force or ep.unanalysable):
            return []
        del self.episodes[episode_id]
        self.finished[episode_id] = None
        while len(self.finished) > self.config.remember_finished:
            self.finished.popitem(last=False)
        if ep.unanalysable:
            self.stats["not_analysed"] += 1
            log.info("episode %s not analysed: %s", episode_id, ep.unanalysable)
            return []
        if not complete:
            self.stats["ended_with_missing_steps"] += 1
            log.warning("episode %s ended with %d steps but only up to t=%d arrived within %.0f s",
                        episode_id, ep.ended["steps"], ep.detector.last_t, self.config.end_grace_s)
        self.stats["finished"] += 1
        return ep.detector.on_end(ep.ended)

    def expire(self) -> list[dict]:
        """Finishes ends overdue by ``end_grace_s``; drops episodes idle for ``idle_timeout_s``."""
        now = self.clock()
        out: list[dict] = []
        for episode_id, ep in list(self.episodes.items()):
            if ep.ended is not None and now - ep.ended_at >= self.config.end_grace_s:
                out += self._maybe_finish(episode_id, ep, force=True)
            elif ep.ended is None and now - ep.last_seen >= self.config.idle_timeout_s:
                del self.episodes[episode_id]
                self.stats["idle_dropped"] += 1
                log.warning("dropping episode %s: no event for %.0f s and no EpisodeEnded", episode_id,
                            now - ep.last_seen)
        return out
