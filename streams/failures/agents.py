"""Thin faust agents over the failure stages: batch, call the pure stage, publish what it returns.

- ``failure-detector``: rollout.steps + rollout.episodes -> failures.moments (+ deadletter).
  Per-episode detectors live in the stage, in agent memory; no faust Table per step.
- ``failure-clusterer``: failures.moments + rollout.episodes -> failures.clusters (+ deadletter).

Batches come from ``stream.take_events(batch_max, within=batch_within_s)``: the events of a batch
are acknowledged only after the batch has been processed and its output handed to the producer.
Outputs are Confluent-framed bytes (schemas.codec), sent through faust topics with raw serializers,
keyed by the catalog key (episode_id, cluster_id, source topic for dead letters). A timer calls the
stages' ``tick`` for work that waits on time (overdue ends, settled episodes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import faust

from streams.deadletter import Outgoing, RawMessage
from streams.exceptions import SummaryError
from streams.failures.collector import ClusterStage
from streams.failures.router import DetectorStage
from streams.failures.summaries import LlmSummarizer

log = logging.getLogger("sepa.streams.failures.agents")


@dataclass(frozen=True)
class Batching:
    batch_max: int  # events per batch
    batch_within_s: float  # wait at most this long to fill a batch, s
    tick_interval_s: float  # how often the stages' time-based work runs, s
    stats_interval_s: float = 30.0  # how often the stages' counters are logged (when they changed), s


def _log_stats(name: str, stage, last: dict) -> None:
    current = dict(stage.stats)
    if current != last.get("stats"):
        last["stats"] = current
        log.info("%s: %s", name, ", ".join(f"{k}={v}" for k, v in sorted(current.items())))


def raw_message(event) -> RawMessage:
    msg = event.message
    return RawMessage(msg.topic, msg.partition, msg.offset, msg.key, msg.value)


async def publish(outputs: dict[str, faust.types.TopicT], messages: Iterable[Outgoing]) -> None:
    for m in messages:
        await outputs[m.topic].send(key=m.key, value=m.value)


def register_detector(app: faust.App, source: faust.types.TopicT, outputs: dict[str, faust.types.TopicT],
                      stage: DetectorStage, batching: Batching) -> None:
    @app.agent(source, name="failure-detector")
    async def detect_failures(stream):
        async for batch in stream.take_events(batching.batch_max, within=batching.batch_within_s):
            await publish(outputs, stage.process([raw_message(e) for e in batch]))

    @app.timer(interval=batching.tick_interval_s, name="failure-detector-tick")
    async def detector_tick():
        await publish(outputs, stage.tick())

    last: dict = {}

    @app.timer(interval=batching.stats_interval_s, name="failure-detector-stats")
    async def detector_stats():
        _log_stats("failure-detector", stage, last)


def register_clusterer(app: faust.App, source: faust.types.TopicT, outputs: dict[str, faust.types.TopicT],
                       stage: ClusterStage, batching: Batching, llm: LlmSummarizer | None = None) -> None:
    async def summarize() -> None:
        if llm is None:
            return
        loop = asyncio.get_running_loop()
        for request in stage.take_summary_requests():
            try:
                text = await loop.run_in_executor(None, llm.summarize, request.stats, request.feature_summary)
            except SummaryError as exc:
                log.warning("keeping the feature summary: %s", exc)
                continue
            message = stage.llm_summary(request, text)
            if message is not None:
                await publish(outputs, [message])

    @app.agent(source, name="failure-clusterer")
    async def cluster_failures(stream):
        async for batch in stream.take_events(batching.batch_max, within=batching.batch_within_s):
            await publish(outputs, stage.process([raw_message(e) for e in batch]))
            await summarize()

    @app.timer(interval=batching.tick_interval_s, name="failure-clusterer-tick")
    async def clusterer_tick():
        await publish(outputs, stage.tick())
        await summarize()

    last: dict = {}

    @app.timer(interval=batching.stats_interval_s, name="failure-clusterer-stats")
    async def clusterer_stats():
        _log_stats("failure-clusterer", stage, last)
