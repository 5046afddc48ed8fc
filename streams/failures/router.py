"""The failure-detector agent's pure core: per-episode detectors kept in memory, fed by the
rollout.steps and rollout.episodes topics.

    stage = DetectorStage(DetectorConfig(), RouterConfig(), topic_prefix="sepa.", run_id="streams")
    outgoing = stage.process(raw_messages)   # FailureMoments (failures.moments), EpisodeAnalysed
                                             # (failures.episodes) and DeadLetters
    outgoing += stage.tick(backlogged)        # every second or so: overdue ends, idle episodes
    stage.releasable()                        # {(topic, partition): offset below which all may be acked}

Both topics are keyed by episode_id with the same partition count, so one worker sees all of an
episode's events, but not in a fixed order across the two topics. So:

- Steps that arrive before their EpisodeStarted are buffered (``max_buffered_steps``) and
  replayed into the detector when it is created (from EpisodeStarted, or EpisodeEnded if the start
  never came: both carry scenario_id and model_id).
- An EpisodeEnded whose last steps are still in flight waits until step ``steps - 1`` arrives or
  ``end_grace_s`` passes; then the detector's ``on_end`` runs.
- Anything undecodable, non-finite or refused by the detector becomes a DeadLetter (consumer
  "failure-detector"); the episode's other events are still processed.

Every episode whose EpisodeEnded arrives is decided once, and then (after ``on_end``) gets one
EpisodeAnalysed on failures.episodes (key episode_id, id stable(EpisodeAnalysed, episode_id),
event_time and run_id of its EpisodeEnded, so a re-read re-emits it byte for byte): its end
(success, termination, steps, quality), its scenario (from EpisodeStarted; an empty ScenarioSpec,
every string empty, when the start was never seen) and every moment with its recovery
(EpisodeDetector.outcomes). ``analysed=false`` with the ``reason`` when it could not be analysed
(more than ``max_buffered_steps`` steps before its start: a re-read reproduces that); analysed
with a ``reason`` when steps were missing at the decision (the end grace passed, or a memory bound
dropped it after its end came). Episodes decided before and re-read in part (a tail, or a start
and end without steps) get none: theirs was emitted then. Episodes dropped before their end came
(idle, memory bounds) get none either: an EpisodeAnalysed answers an EpisodeEnded.

Restarts lose nothing. Detector state lives in memory, so a message may be acknowledged (its offset
committed) only once its episode is *decided*: finished and its moments handed to the producer, or
dropped by a bound. ``releasable()`` gives, per partition, the offset of the first message of the
earliest undecided episode (or the end of what was delivered): faust commits the contiguous acked
prefix, so after a crash or a rebalance every undecided episode is re-read from its first event
and analysed again, and re-emitted moments carry the same event ids. An episode's EpisodeStarted /
EpisodeEnded are held until every step of it is releasable too (also when they are read again
after a rebalance, the episode already decided), so a partition read from a committed offset can
only show, of an episode decided before:
- all of it: analysed again, the same moments;
- a tail of its steps (first step seen t > 0): ``stats["replayed_tail"]``, ignored;
- its start and/or end with no step at all: after ``end_grace_s``, ``stats["replayed_without_steps"]``,
  ignored (no detector runs on an episode none of whose steps were seen).
Time-based decisions wait while an input partition has a backlog (``tick(backlogged)``, more than
``backlog_messages`` unread): after a restart the small episodes topic is read long before the
steps that belong with it.
Memory is bounded: episodes idle for ``idle_timeout_s``, beyond ``max_open_episodes``, or holding
more than ``max_held_messages`` unacknowledged messages are dropped (counted) and released.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from schemas.catalog import BY_NAME
from schemas.codec import Codec
from schemas.events import make_event
from schemas.exceptions import SchemaError
from schemas.loader import shared_schema
from streams.deadletter import Intake, Outgoing, RawMessage
from streams.exceptions import ConfigError, StreamsError
from streams.failures.detector import DETECTOR_VERSION, PRODUCER, DetectorConfig, EpisodeDetector

log = logging.getLogger("sepa.streams.failures.router")
CONSUMER = "failure-detector"
INPUT_TOPICS = ("rollout.steps", "rollout.episodes")
TP = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True, kw_only=True)
class RouterConfig:
    end_grace_s: float = 10.0  # wait this long after EpisodeEnded for steps still in flight, s
    max_buffered_steps: int = 5000  # steps held for an episode whose detector does not exist yet
    # An episode with no event for this long is dropped, s. It holds back its partitions' commits
    # meanwhile; faust logs a stalled commit after 300 s (broker_commit_livelock_soft_timeout).
    idle_timeout_s: float = 300.0
    max_open_episodes: int = 50_000  # beyond this the least recently active episode is dropped
    remember_finished: int = 100_000  # finished episode ids remembered to ignore late re-deliveries
    # Messages delivered but not yet acknowledged (they wait for their episode or an earlier one):
    # beyond this the episode holding the most back is dropped. Bounds the agent's memory.
    max_held_messages: int = 200_000
    # A partition more than this many messages behind its end is "backlogged": its episodes' clocks
    # (end grace, idle timeout) wait. A smaller lag (live traffic always has some) is read within
    # about a second, well inside end_grace_s. Too low only delays a forced end; too high cuts
    # episodes short after a restart.
    backlog_messages: int = 1000

    def __post_init__(self) -> None:
        for name in ("end_grace_s", "idle_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"RouterConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("max_buffered_steps", "max_open_episodes", "remember_finished", "max_held_messages",
                     "backlog_messages"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"RouterConfig.{name} must be an integer >= 1, got {getattr(self, name)!r}")


def _zero(avro_type):
    if isinstance(avro_type, list):  # a union: its first branch (null for our optional fields)
        return _zero(avro_type[0])
    if isinstance(avro_type, dict):
        kind = avro_type.get("type")
        return [] if kind == "array" else {} if kind == "map" else None
    return {"null": None, "string": "", "boolean": False, "int": 0, "long": 0, "float": 0.0,
            "double": 0.0}.get(avro_type)


def empty_scenario() -> dict:
    """The ScenarioSpec record of an episode whose EpisodeStarted was never seen: every string
    empty (scenario_id, benchmark, env_name, robot, instruction: not known), every other field at
    its schema default (object_size_scale 1, no offset) or else its zero (horizon 0)."""
    return {f["name"]: "" if f["type"] == "string" else f["default"] if "default" in f else _zero(f["type"])
            for f in shared_schema("ScenarioSpec")["fields"]}


@dataclass
class _Episode:
    detector: EpisodeDetector | None = None
    buffer: list[dict] = field(default_factory=list)
    started: dict | None = None
    ended: dict | None = None
    ended_at: float = 0.0
    last_seen: float = 0.0
    first_t: int | None = None
    unanalysable: str | None = None  # why this episode is not analysed
    partition: int | None = None  # of its first message (both input topics are co-partitioned)
    held: set = field(default_factory=set)  # partitions where it holds the releasable offset back
    last_step: tuple[TP, int] | None = None  # partition and offset of its latest step


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
        self.steps_topic = BY_NAME["rollout.steps"].full_name(topic_prefix)
        self.episodes: OrderedDict[str, _Episode] = OrderedDict()  # least recently active first
        # Decided episodes, oldest first, with the partition and offset of their last step (None: none seen).
        self.finished: OrderedDict[str, tuple[TP, int] | None] = OrderedDict()
        self.stats: Counter = Counter()
        # Acknowledgement bookkeeping, per partition: the offset after the last message delivered,
        # and the first offset of each episode holding it back (in offset order = insertion order).
        self.delivered: dict[TP, int] = {}
        self.holds: dict[TP, OrderedDict[str, int]] = {}
        # Decided episodes whose EpisodeStarted/Ended wait for their last step (partition, offset).
        self.waiting: dict[str, tuple[TP, int]] = {}

    # -- agent entry points -------------------------------------------------------------------

    def process(self, messages: Iterable[RawMessage]) -> list[Outgoing]:
        out: list[Outgoing] = []
        delivered = self.delivered
        for raw in messages:
            self.stats["messages"] += 1
            tp = (raw.topic, raw.partition)
            delivered[tp] = raw.offset + 1
            event, dead = self.intake.admit(raw)
            if dead is not None:
                out.append(dead)
                continue
            try:
                out.extend(self._outgoing(self.on_event(event, (tp, raw.offset))))
            except (StreamsError, SchemaError, ArithmeticError, LookupError, TypeError, ValueError) as exc:
                out.append(self.intake.refuse(
                    raw, f"failure detector refused {event['envelope']['event_type']}: {type(exc).__name__}: {exc}"))
        out.extend(self._outgoing(self._bound_held()))
        return out

    def tick(self, backlogged: Collection[TP] = ()) -> list[Outgoing]:
        """Time-based work. ``backlogged``: input partitions with messages not yet delivered; their
        episodes' clocks (end grace, idle timeout) wait until the backlog is read."""
        return self._outgoing(self.expire(backlogged))

    def _outgoing(self, events: list[dict]) -> list[Outgoing]:
        return [Outgoing.of(e, self.codec) for e in events]

    def releasable(self) -> dict[TP, int]:
        """Per partition delivered so far, the offset below which every message may be acknowledged:
        the first message of the earliest undecided episode there, or the end of what was delivered."""
        return {tp: self._releasable(tp) for tp in self.delivered}

    def forget(self) -> None:
        """After a rebalance faust seeks every partition back to its committed offset: drop the open
        episodes (they are delivered again from their start) and the acknowledgement bookkeeping.
        Decided episodes stay decided."""
        if self.episodes:
            self.stats["forgotten"] += len(self.episodes)
        self.episodes.clear()
        self.delivered.clear()
        self.holds.clear()
        self.waiting.clear()

    # -- routing --------------------------------------------------------------------------------

    def on_event(self, event: dict, at: tuple[TP, int] | None = None) -> list[dict]:
        """Events (FailureMoment and EpisodeAnalysed dicts) that one decoded Step / EpisodeStarted /
        EpisodeEnded yields. ``at``: the (partition, offset) it was read from, held until the
        episode is decided."""
        event_type = event["envelope"]["event_type"]
        episode_id = event["episode_id"]
        if episode_id in self.finished:
            self.stats["after_finish"] += 1
            if at is not None and event_type != "Step":
                self._hold_decided(episode_id, at)
            return []
        out: list[dict] = []
        ep = self._episode(episode_id, out)
        if at is not None:
            self._hold(episode_id, ep, at, event_type == "Step")
        if event_type == "Step":
            moments = self._step(episode_id, ep, event)
            return out + moments if out else moments
        if event_type == "EpisodeStarted":
            if ep.started is None:
                ep.started = event
            if ep.detector is None:
                out += self._create(episode_id, ep, event["scenario_id"], event["model_id"])
            return out
        if event_type == "EpisodeEnded":
            if ep.ended is not None:
                return out
            ep.ended, ep.ended_at = event, self.clock()
            if ep.detector is None:
                out += self._create(episode_id, ep, event["scenario_id"], event["model_id"])
            return out + self._maybe_finish(episode_id, ep)
        self.stats["ignored_" + event_type] += 1
        return out

    def _episode(self, episode_id: str, out: list[dict]) -> _Episode:
        """The open episode of this id (created if new); ``out`` gets what evicting another yields."""
        ep = self.episodes.get(episode_id)
        if ep is None:
            ep = self.episodes[episode_id] = _Episode()
            while len(self.episodes) > self.config.max_open_episodes:
                old = next(iter(self.episodes))
                self.stats["evicted"] += 1
                log.warning("dropping episode %s: more than %d open episodes", old, self.config.max_open_episodes)
                out += self._drop(old, self.episodes[old], f"more than {self.config.max_open_episodes} open episodes")
        else:
            self.episodes.move_to_end(episode_id)
        ep.last_seen = self.clock()
        return ep

    def _drop(self, episode_id: str, ep: _Episode, why: str) -> list[dict]:
        """Decides an episode a memory bound drops. One whose end came is finished with what it has
        (its EpisodeAnalysed says steps were missing and why); one without an end just goes."""
        if ep.ended is not None and ep.detector is not None:
            return self._maybe_finish(episode_id, ep, force=True, why=why)
        self._decide(episode_id, ep)
        return []

    def _step(self, episode_id: str, ep: _Episode, step: dict) -> list[dict]:
        if ep.first_t is None:
            ep.first_t = step["t"]
            if step["t"] != 0:
                # Reading starts mid-episode only from a committed offset inside an episode decided
                # before (module docstring): its moments were published then.
                self.stats["replayed_tail"] += 1
                log.debug("episode %s: first step seen is t=%d, decided before; ignored", episode_id, step["t"])
                self._decide(episode_id, ep)
                return []
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

    def _maybe_finish(self, episode_id: str, ep: _Episode, force: bool = False, why: str = "") -> list[dict]:
        if ep.ended is None or ep.detector is None:
            return []
        detector = ep.detector
        complete = detector.last_t + 1 >= ep.ended["steps"]
        if not (complete or force or ep.unanalysable):
            return []
        self._decide(episode_id, ep)
        if ep.unanalysable:
            self.stats["not_analysed"] += 1
            log.info("episode %s not analysed: %s", episode_id, ep.unanalysable)
            return [self._analysed(ep, analysed=False, reason=ep.unanalysable)]
        if not complete and ep.first_t is None:
            # Not one of its steps arrived: they were committed before (module docstring), or lost.
            self.stats["replayed_without_steps"] += 1
            log.debug("episode %s: ended with %d steps, none seen; ignored", episode_id, ep.ended["steps"])
            return []
        reason = ""
        if not complete:
            self.stats["ended_with_missing_steps"] += 1
            why = f"when it was dropped: {why}" if why else f"within the end grace of {self.config.end_grace_s:g} s"
            reason = (f"steps missing: {detector.steps_seen} of {ep.ended['steps']} arrived "
                      f"(last t={detector.last_t}) {why}")
            log.warning("episode %s analysed with steps missing: %s", episode_id, reason)
        self.stats["finished"] += 1
        moments = detector.on_end(ep.ended)
        return moments + [self._analysed(ep, analysed=True, reason=reason)]

    def _analysed(self, ep: _Episode, analysed: bool, reason: str) -> dict:
        """The EpisodeAnalysed of a decided episode (module docstring)."""
        end, started = ep.ended, ep.started
        env = end["envelope"]
        return make_event(
            "EpisodeAnalysed", (end["episode_id"],), PRODUCER, env["run_id"], event_time=env["event_time"],
            episode_id=end["episode_id"], scenario_id=end["scenario_id"], model_id=end["model_id"],
            scenario=started["scenario"] if started is not None else empty_scenario(), success=end["success"],
            termination=end["termination"], steps=end["steps"], quality=end["quality"], analysed=analysed,
            reason=reason, moments=ep.detector.outcomes() if analysed else [], detector_version=DETECTOR_VERSION,
            seed=started["seed"] if started is not None else None)

    def expire(self, backlogged: Collection[TP] = ()) -> list[dict]:
        """Finishes ends overdue by ``end_grace_s``; drops episodes idle for ``idle_timeout_s``.
        Episodes in a ``backlogged`` partition (index) are not timed: their events may be unread."""
        now = self.clock()
        waiting = {partition for _, partition in backlogged}
        out: list[dict] = []
        for episode_id, ep in list(self.episodes.items()):
            if ep.partition in waiting:
                ep.last_seen = now
                if ep.ended is not None:
                    ep.ended_at = now
            elif ep.ended is not None and now - ep.ended_at >= self.config.end_grace_s:
                out += self._maybe_finish(episode_id, ep, force=True)
            elif ep.ended is None and now - ep.last_seen >= self.config.idle_timeout_s:
                self._decide(episode_id, ep)
                self.stats["idle_dropped"] += 1
                log.warning("dropping episode %s: no event for %.0f s and no EpisodeEnded", episode_id,
                            now - ep.last_seen)
        return out

    # -- acknowledgement ------------------------------------------------------------------------

    def _hold(self, episode_id: str, ep: _Episode, at: tuple[TP, int], is_step: bool) -> None:
        tp, offset = at
        if ep.partition is None:
            ep.partition = tp[1]
        if tp not in ep.held:
            ep.held.add(tp)
            held = self.holds.setdefault(tp, OrderedDict())
            held.pop(episode_id, None)  # a decided one of the same id, forgotten since (remember_finished)
            self.waiting.pop(episode_id, None)
            held[episode_id] = offset
        if is_step:
            ep.last_step = at

    def _hold_decided(self, episode_id: str, at: tuple[TP, int]) -> None:
        """The EpisodeStarted/Ended of an episode decided before, read again (faust seeks back to
        the committed offsets after a rebalance): held as at its decision, until its last step is
        releasable, so that no commit passes its start while its steps may still be read again
        (a worker resuming from such a commit would analyse it without its scenario)."""
        last_step = self.finished[episode_id]
        tp, offset = at
        if last_step is None or last_step[0] == tp:
            return
        held = self.holds.setdefault(tp, OrderedDict())
        if episode_id not in held:
            held[episode_id] = offset
            self.waiting[episode_id] = last_step

    def _decide(self, episode_id: str, ep: _Episode) -> None:
        """Finished or dropped: forget it, remember it as decided, let its messages be acknowledged.
        Its EpisodeStarted/Ended stay held until its last step is releasable (module docstring)."""
        del self.episodes[episode_id]
        self.finished[episode_id] = ep.last_step
        while len(self.finished) > self.config.remember_finished:
            self.finished.popitem(last=False)
        waits = False
        for tp in ep.held:
            if ep.last_step is None or tp[0] == self.steps_topic:
                self.holds[tp].pop(episode_id, None)
            else:
                waits = True
        if waits:
            self.waiting[episode_id] = ep.last_step

    def _releasable(self, tp: TP) -> int:
        held = self.holds.get(tp)
        while held:
            episode_id, offset = next(iter(held.items()))
            if episode_id in self.episodes:
                return offset
            wait = self.waiting.get(episode_id)
            if wait is not None and wait[0] != tp and self._releasable(wait[0]) <= wait[1]:
                return offset
            del held[episode_id]
            self.waiting.pop(episode_id, None)
        return self.delivered.get(tp, 0)

    def _bound_held(self) -> list[dict]:
        """Drops the episode holding back the most messages while more than max_held_messages wait;
        returns what finishing the dropped ones yields (``_drop``)."""
        out: list[dict] = []
        while True:
            held = {tp: end - self._releasable(tp) for tp, end in self.delivered.items()}
            if sum(held.values()) <= self.config.max_held_messages:
                return out
            tp = max(held, key=held.__getitem__)
            episode_id = next(iter(self.holds[tp]))
            if episode_id not in self.episodes:  # a decided episode waiting for its steps' partition
                episode_id = next(iter(self.holds[self.waiting[episode_id][0]]))
            self.stats["held_dropped"] += 1
            log.warning("dropping episode %s: more than %d messages wait for acknowledgement",
                        episode_id, self.config.max_held_messages)
            out += self._drop(episode_id, self.episodes[episode_id],
                              f"more than {self.config.max_held_messages} messages waited for acknowledgement")
