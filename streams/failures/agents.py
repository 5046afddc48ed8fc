"""Thin faust agents over the failure stages: batch, call the pure stage, publish what it returns.

- ``failure-detector``: rollout.steps + rollout.episodes -> failures.moments, failures.episodes
  (one EpisodeAnalysed per ended episode) (+ deadletter). Per-episode detectors live in the
  stage, in agent memory; no faust Table per step.
- ``failure-clusterer``: failures.episodes -> failures.clusters (+ deadletter). failures.episodes has
  one partition: the worker the group assigns it to is the active clusterer, every other one
  stands by (its agent gets no events). On getting the partition (every new consumer generation
  that includes it) the clusterer restores itself from its own output (streams/failures/history.py:
  failures.clusters from the beginning, re-executed) before it touches an input event, publishes
  what the log lacks at its end, and then resumes from the committed offset, skipping episodes
  it already took in. When it loses the partition it forgets its state.

Acknowledgement (faust commits, per partition, the offsets below the first unacknowledged one;
it flushes the producer before every commit):
- The detector takes batches with ``stream.noack_take`` and acknowledges an event only once the
  stage says so (``DetectorStage.releasable``: its episode and every earlier one in the partition
  decided, their moments and EpisodeAnalysed already handed to the producer). Open episodes are
  therefore re-read from their start after a crash or a rebalance; see streams/failures/router.py.
  One lock orders the agent and its timer, so no event is acknowledged before the moments and the
  EpisodeAnalysed it led to were sent.
  After a rebalance faust seeks back to the committed offsets: the stage forgets its open episodes
  and events of the previous generation are dropped unacknowledged (they come again).
- The clusterer takes ``stream.noack_take`` too and acknowledges a batch once its outputs were
  handed to the producer; a batch that arrives before a restore could succeed waits (unacknowledged,
  in order) for the next attempt; events of an earlier consumer generation are dropped (faust
  delivers them again from the committed offset). One lock orders agent, timer, restore and
  language-model summaries, so positions are published in the order they were given out.
  A restore first flushes the producer, so the log it reads holds everything this worker sent.
Outputs are Confluent-framed bytes (schemas.codec), sent through faust topics with raw serializers,
keyed by the catalog key (episode_id, cluster_id, source topic for dead letters). A timer calls the
stages' ``tick`` for work that waits on time (overdue ends; the clusterer's restore when it got the
partition without new input, its optional idle re-clustering).

Fencing: partition ownership is the singleton; a worker acts only for the consumer generation it
restored in. A former owner frozen past its session timeout (SIGSTOP, a stalled host) could still
send once it wakes, before it learns of the rebalance; its events then take positions the new owner
also uses. Event ids are (event type, namespace, position): one of the same type at a used position
is a second content under a known id, which the evidence sink refuses; a restore keeps the first
event at each position whatever its type (ClusterLog).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import faust
from faust.exceptions import ConsumerNotStarted

from streams.deadletter import Outgoing, RawMessage
from streams.exceptions import StreamsError, SummaryError
from streams.failures.collector import ClusterStage, SummaryRequest
from streams.failures.history import ConsumerFactory, restore_from_log
from streams.failures.router import DetectorStage
from streams.failures.summaries import LlmSummarizer

log = logging.getLogger("sepa.streams.failures.agents")


@dataclass(frozen=True)
class Batching:
    batch_max: int  # events per batch
    batch_within_s: float  # wait at most this long to fill a batch, s
    tick_interval_s: float  # how often the stages' time-based work runs, s
    stats_interval_s: float = 30.0  # how often the stages' counters are logged (when they changed), s


def _log_stats(name: str, stage, last: dict, force: bool = False) -> None:
    current = dict(stage.stats)
    if force or current != last.get("stats"):
        last["stats"] = current
        log.info("%s: %s", name, ", ".join(f"{k}={v}" for k, v in sorted(current.items())))


def raw_message(event) -> RawMessage:
    msg = event.message
    return RawMessage(msg.topic, msg.partition, msg.offset, msg.key, msg.value)


async def publish(outputs: dict[str, faust.types.TopicT], messages: Iterable[Outgoing]) -> None:
    for m in messages:
        await outputs[m.topic].send(key=m.key, value=m.value)


def register_blocking_agent(app: faust.App, source: faust.types.TopicT, outputs: dict[str, faust.types.TopicT],
                            name: str, on_message: Callable[[RawMessage], Iterable[Outgoing]]) -> None:
    """An agent for a stage that blocks (it reads the evidence store): ``on_message`` runs in a thread
    so the event loop keeps the consumer's heartbeats, and a message is acknowledged only after what
    it produced was handed to the producer."""

    @app.agent(source, name=name)
    async def handle(stream):
        loop = asyncio.get_running_loop()
        async for event in stream.events():
            await publish(outputs, await loop.run_in_executor(None, on_message, raw_message(event)))


class HeldEvents:
    """The detector's events not yet acknowledged, per (topic, partition) in offset order, for one
    consumer generation (faust's rebalance count)."""

    def __init__(self) -> None:
        self.stream = None  # the agent's stream: acknowledging through it keeps faust's sensors right
        self.generation: int | None = None
        self.events: dict[tuple[str, int], deque] = {}

    def admit(self, events: Sequence, generation: int) -> list:
        """The batch's events of this generation, now held; a new generation empties the holding
        (the caller makes the stage forget too). Stale events are dropped: faust delivers them again."""
        fresh = []
        for event in events:
            msg = event.message
            if msg.generation_id != generation:
                continue
            self.events.setdefault((msg.topic, msg.partition), deque()).append(event)
            fresh.append(event)
        return fresh

    def renew(self, generation: int) -> bool:
        """True (and empty) when ``generation`` is not the one the held events belong to."""
        if generation == self.generation:
            return False
        self.generation = generation
        self.events.clear()
        return True

    async def ack(self, releasable: Mapping[tuple[str, int], int]) -> int:
        """Acknowledges, in offset order, every held event below its partition's releasable offset."""
        n = 0
        for tp, held in self.events.items():
            upto = releasable.get(tp)
            while held and upto is not None and held[0].message.offset < upto:
                await self.stream.ack(held.popleft())
                n += 1
        return n

    def __len__(self) -> int:
        return sum(len(q) for q in self.events.values())


def backlogged(consumer, delivered: Mapping[tuple[str, int], int], min_lag: int) -> set[tuple[str, int]]:
    """Partitions whose high watermark (as of the last fetch) is more than ``min_lag`` messages
    beyond what the stage was delivered. One not delivered from yet is not counted: faust delivers
    round-robin from every partition of a fetch, so each partition's first messages come early."""
    out = set()
    for tp, upto in delivered.items():
        try:
            high = consumer.highwater(faust.types.TP(*tp))
        except (AssertionError, KeyError, ConsumerNotStarted):  # not assigned (any more), not started
            continue
        if high is not None and high - upto > min_lag:
            out.add(tp)
    return out


def register_detector(app: faust.App, source: faust.types.TopicT, outputs: dict[str, faust.types.TopicT],
                      stage: DetectorStage, batching: Batching) -> None:
    held = HeldEvents()
    lock = asyncio.Lock()  # process/tick, publish, acknowledge: one at a time

    def renew() -> int:
        generation = app.consumer_generation_id
        if held.renew(generation):
            stage.forget()
        return generation

    @app.agent(source, name="failure-detector")
    async def detect_failures(stream):
        held.stream = stream
        try:
            async for batch in stream.noack_take(batching.batch_max, within=batching.batch_within_s):
                async with lock:
                    batch = held.admit(batch, renew())
                    await publish(outputs, stage.process([raw_message(e) for e in batch]))
                    await held.ack(stage.releasable())
        finally:
            _log_stats("failure-detector", stage, {}, force=True)

    @app.timer(interval=batching.tick_interval_s, name="failure-detector-tick")
    async def detector_tick():
        if held.stream is None:
            return
        async with lock:
            renew()
            await publish(outputs, stage.tick(backlogged(app.consumer, stage.delivered,
                                                         stage.config.backlog_messages)))
            await held.ack(stage.releasable())

    last: dict = {}

    @app.timer(interval=batching.stats_interval_s, name="failure-detector-stats")
    async def detector_stats():
        _log_stats("failure-detector", stage, last)


async def summarize_requests(requests: list[SummaryRequest], llm: LlmSummarizer) -> list[tuple[SummaryRequest, str]]:
    """(request, text) for each request the model answered; it runs in an executor. When it
    fails, the feature summary already published stands."""
    loop = asyncio.get_running_loop()
    out = []
    for request in requests:
        try:
            text = await loop.run_in_executor(None, llm.summarize, request.stats, request.feature_summary)
        except SummaryError as exc:
            log.warning("keeping the feature summary: %s", exc)
            continue
        out.append((request, text))
    return out


async def llm_summaries(stage: ClusterStage, llm: LlmSummarizer) -> list[Outgoing]:
    """ClusterUpdated events (summary_source "llm") for the stage's pending summary requests."""
    answered = await summarize_requests(stage.take_summary_requests(), llm)
    return [m for m in (stage.llm_summary(request, text) for request, text in answered) if m is not None]


class ClustererSeat:
    """Whether this worker's clusterer is the active one: it holds the failures.episodes
    partition and its stage was restored for the current consumer generation."""

    RETRY_S = 30.0  # a failed restore is tried again after this long

    def __init__(self, app: faust.App, stage: ClusterStage, consumer_factory: ConsumerFactory):
        self.app = app
        self.stage = stage
        self.consumer_factory = consumer_factory
        self.tp = faust.types.TP(stage.input_topic, 0)
        self.generation: int | None = None  # the generation the stage is restored for
        self.standby_logged: int | None = None
        self.failed_at: float | None = None

    def assignment(self) -> set:
        try:
            return set(self.app.consumer.assignment())
        except (AttributeError, ConsumerNotStarted):  # not started yet
            return set()

    def holding(self) -> bool:
        return self.tp in self.assignment()

    async def ensure(self, outputs: dict[str, faust.types.TopicT]) -> bool:
        """True when active for the current generation, restoring first when needed."""
        generation = self.app.consumer_generation_id
        assignment = self.assignment()
        if self.tp not in assignment:
            if self.generation is not None:
                log.info("failure-clusterer: lost %s; standing by", self.tp.topic)
                self.stage.forget()
                self.generation = None
            if self.standby_logged != generation and assignment:
                log.info("failure-clusterer: standby (%s is assigned to another worker)", self.tp.topic)
                self.standby_logged = generation
            return False
        if self.generation == generation:
            return True
        loop = asyncio.get_running_loop()
        if self.failed_at is not None and loop.time() - self.failed_at < self.RETRY_S:
            return False
        self.generation = None
        await self.app.producer.flush()  # what this worker sent is in the log before it is read
        try:
            tail = await loop.run_in_executor(None, restore_from_log, self.stage, self.consumer_factory,
                                              self.stage.config.restore_timeout_s)
        except StreamsError as exc:
            self.failed_at = loop.time()
            log.error("failure-clusterer: cannot restore, clustering waits (retry in %.0f s): %s", self.RETRY_S, exc)
            return False
        self.failed_at = None
        await publish(outputs, tail)
        if self.app.consumer_generation_id != generation:
            return False  # a rebalance meanwhile: restore again for the new generation
        self.generation = generation
        log.info("failure-clusterer: active on %s (generation %s): %d events restored, %d episodes, %d published "
                 "to complete the log", self.tp.topic, generation, self.stage.stats["restored_events"],
                 self.stage.clusterer.updates, len(tail))
        return True


def register_clusterer(app: faust.App, source: faust.types.TopicT, outputs: dict[str, faust.types.TopicT],
                       stage: ClusterStage, batching: Batching, consumer_factory: ConsumerFactory,
                       llm: LlmSummarizer | None = None) -> ClustererSeat:
    seat = ClustererSeat(app, stage, consumer_factory)
    lock = asyncio.Lock()  # restore, process, publish, acknowledge: one at a time
    waiting: list = []  # events taken from the stream, not processed yet (in offset order)
    agent_stream: list = []

    async def drain() -> None:
        if not await seat.ensure(outputs):
            if not seat.holding():
                waiting.clear()  # a revoked partition's events: its next owner reads them
            return
        generation = app.consumer_generation_id
        batch = [e for e in waiting if e.message.generation_id == generation]
        waiting.clear()
        if batch:
            await publish(outputs, stage.process([raw_message(e) for e in batch]))
            for event in batch:
                await agent_stream[0].ack(event)

    async def summarize() -> None:
        if llm is None:
            return
        answered = await summarize_requests(stage.take_summary_requests(), llm)
        async with lock:
            if answered and await seat.ensure(outputs):
                await publish(outputs, [m for m in (stage.llm_summary(r, t) for r, t in answered) if m is not None])

    @app.agent(source, name="failure-clusterer")
    async def cluster_failures(stream):
        agent_stream[:] = [stream]
        try:
            async for batch in stream.noack_take(batching.batch_max, within=batching.batch_within_s):
                async with lock:
                    waiting.extend(batch)
                    await drain()
                await summarize()
        finally:
            _log_stats("failure-clusterer", stage, {}, force=True)

    @app.timer(interval=batching.tick_interval_s, name="failure-clusterer-tick")
    async def clusterer_tick():
        if not agent_stream:
            return
        async with lock:
            await drain()
            if seat.generation is not None:
                await publish(outputs, stage.tick())
        await summarize()

    last: dict = {}

    @app.timer(interval=batching.stats_interval_s, name="failure-clusterer-stats")
    async def clusterer_stats():
        _log_stats("failure-clusterer", stage, last)

    return seat
