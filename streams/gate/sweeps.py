"""The sweeper in the streams worker: a newly registered model version is evaluated unasked.

    runner = SweepRunner(store_factory, codec, SweeperConfig(sweep_seeds=20), topic_prefix="sepa.")
    register_sweeper(app, registry_topic, outputs, runner)

It reads models.registry (one partition: one sweeper at a time, registrations in order). For a
ModelRegistered of (model_id, version) it asks for the sweep of that version over every scenario of
the active benchmark (read from the evidence log through the store_factory the gate uses) on which
the version has no trials yet and whose sweep is not requested yet. The requests are
``producers.rollout_worker.sweep_request``'s, the ones the orchestrator's cycle and `sepa-eval eval`
publish: the same ids and the same content whoever asks, so when both ask, it is one request (the
rollout worker runs an id it has served once, the evidence log counts it once).

Not swept: a registration of a model the rollout workers' registry file does not hold
(``served_models``: dead-lettered, since nothing could serve its sweeps), a registration older
than the model's latest one (a replay of old registrations, or a version replaced since), and
anything before the first promotion (no active benchmark yet: the orchestrator's first cycle
sweeps every registered model once the base scenarios are promoted).
The rollout worker runs the version its registry file holds (a request names the model, not the
version), so sweeps are asked for the latest registration only.

Each request takes its event time from the registration (a re-read registration re-derives the same
events). A registration that cannot be decided because the store does not answer is retried for
``store_retry_s`` before it is given up (logged); a malformed message is dead-lettered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import faust

from consumers.evidence.store import EvidenceStore
from consumers.state import online as q
from producers.rollout_worker import sweep_request
from producers.seeds import selection_seeds
from schemas import records
from schemas.catalog import BY_NAME
from schemas.codec import Codec
from schemas.typed import to_record
from streams.deadletter import Intake, Outgoing, RawMessage
from streams.exceptions import ConfigError

log = logging.getLogger("sepa.streams.sweeps")
CONSUMER = "sweeper"
SOURCE_TOPIC = "models.registry"


@dataclass(frozen=True, kw_only=True)
class SweeperConfig:
    sweep_seeds: int = 20  # seeds 0..n-1 per active scenario (Settings.sweep_seeds: the orchestrator's too)
    store_retry_s: float = 60.0  # how long a registration is retried while the store does not answer, s
    run_id: str = "sweeper"  # of its dead letters
    # The models the rollout workers serve (their registry file's); a registration of any other is
    # dead-lettered: its sweeps could never be served. None: every registered model.
    served_models: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.sweep_seeds, bool) or not isinstance(self.sweep_seeds, int) or self.sweep_seeds < 1:
            raise ConfigError(f"SweeperConfig.sweep_seeds must be an integer >= 1, got {self.sweep_seeds!r}")
        if not self.store_retry_s >= 0:
            raise ConfigError(f"SweeperConfig.store_retry_s must be >= 0, got {self.store_retry_s!r}")


class SweepRunner:
    def __init__(self, store_factory: Callable[[], EvidenceStore], codec: Codec, config: SweeperConfig,
                 topic_prefix: str = "sepa."):
        self.store_factory = store_factory
        self.codec = codec
        self.config = config
        source = BY_NAME[SOURCE_TOPIC]
        self.intake = Intake(codec, CONSUMER, config.run_id, {source.full_name(topic_prefix): source})
        self.stats = {"registrations": 0, "requests": 0}

    @cached_property
    def store(self) -> EvidenceStore:  # opened on the first message, in the worker's thread
        return self.store_factory()

    def on_message(self, raw: RawMessage) -> list[Outgoing]:
        event, dead = self.intake.admit_record(raw)
        if dead is not None:
            return [dead]
        served = self.config.served_models
        if served is not None and event.model_id not in served:
            return [self.intake.refuse(raw, f"ModelRegistered {event.envelope.event_id}: model "
                                            f"{event.model_id!r} is not in the model registry file the rollout "
                                            f"workers serve (served: {', '.join(sorted(served)) or 'none'})")]
        self.stats["registrations"] += 1
        deadline = time.monotonic() + self.config.store_retry_s
        while True:
            try:
                requests = self.sweeps(event)
                break
            except Exception:
                if time.monotonic() > deadline:
                    log.exception("%s@%s: no sweep asked for; the store did not answer for %.0f s (the next "
                                  "cycle's sweep covers it)", event.model_id, event.version,
                                  self.config.store_retry_s)
                    return []
                log.warning("%s@%s: the store did not answer; retrying", event.model_id, event.version,
                            exc_info=True)
                time.sleep(1.0)
        self.stats["requests"] += len(requests)
        if requests:
            log.info("%s@%s registered: sweeping %d active scenario(s) on %d seeds", event.model_id,
                     event.version, len(requests), self.config.sweep_seeds)
        return [Outgoing.of(r, self.codec) for r in requests]

    def sweeps(self, registered: records.ModelRegistered | dict) -> list[dict]:
        """The sweep requests a registration calls for (none when it is not the model's latest, when
        nothing is promoted yet, or when the version has trials or a request on every active scenario)."""
        registered = to_record(registered)
        model_id, version = registered.model_id, registered.version
        at = registered.envelope.event_time
        newer = [v for v in q.model_versions(self.store, model_id=model_id)
                 if v.version != version and v.registered_at is not None and v.registered_at > at]
        if newer:
            log.info("%s@%s: not swept, %s@%s is registered since", model_id, version, model_id, newer[-1].version)
            return []
        benchmark = q.active_benchmark(self.store)
        if benchmark is None:
            return []
        ids = list(benchmark.scenario_ids)
        # the sweep feeds the next cycle's failure clusters: selection seeds (an `eval` on held-out
        # seeds is no sweep); the model is measured by the loop's next cycle or by `eval`
        tried = {s.scenario_id for s in q.scores(self.store, model_ids=[model_id], scenario_ids=ids,
                                                  model_versions={model_id: version}, seeds=q.SELECTION)
                 if s.episodes or s.invalid}
        seeds = selection_seeds(self.config.sweep_seeds)
        wanted = [sweep_request(dict(a.spec), model_id, version, seeds, event_time=at)
                  for a in benchmark.scenarios if a.scenario_id not in tried]
        if not wanted:
            return []
        asked = q.requested(self.store, [r["request_id"] for r in wanted])
        return [r for r in wanted if r["request_id"] not in asked]


def register_sweeper(app: faust.App, source: faust.types.TopicT, outputs: dict[str, faust.types.TopicT],
                     runner: SweepRunner) -> None:
    from streams.failures.agents import register_blocking_agent

    register_blocking_agent(app, source, outputs, "sweeper", runner.on_message)
