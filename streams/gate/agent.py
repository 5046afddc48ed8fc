"""The promotion gate in the streams worker: reads the log, decides, publishes, one worker at a time.

    register_gate(app, decisions, verdicts, outputs, GateRunner(store_factory, codec, PromotionGate(...)), 1.0, prefix)

Which worker decides: the one that holds the single partition of benchmark.decisions (the gate's
own output topic, which also carries reviewers' ReviewDecided). A second worker in the group gets
no partition and stands by; when the first dies, Kafka hands the partition over and the standby
decides from the same log. The agent on that topic only wakes the gate (a review arrived); the
timer runs the gate every ``tick_interval_s`` while this worker holds the partition. A second
agent checks that each CriticVerdict judges a scenario the log knows, and dead-letters it if not.

Each tick (in an executor: the store is blocking I/O): build GateState from the evidence log
(consumers.state.online), ask PromotionGate for the decisions it calls for, publish them, and
then wait until the log shows them before deciding again, so the next benchmark version is
counted from a log that holds the last one (read your own writes). Decisions are a function of the
log, so deciding again after a crash re-derives the same events, which the evidence log counts once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime
from functools import cached_property, lru_cache

import faust
from faust.types import TP

from consumers.evidence.store import EvidenceStore
from consumers.state import online as q
from schemas import records
from schemas.catalog import BY_NAME
from schemas.codec import Codec
from schemas.events import utc_now
from schemas.exceptions import InvalidEvidence
from schemas.verdict_evidence import RobustnessEvidence
from streams.deadletter import Intake, Outgoing, RawMessage
from streams.failures.agents import register_blocking_agent
from streams.gate.gate import ROBUSTNESS, ActiveScenario, Candidate, GateState, PromotionGate, Review, Verdict

log = logging.getLogger("sepa.streams.gate")
OUTPUT_TOPIC = "benchmark.decisions"
VERDICTS_TOPIC = "critics.verdicts"
CONSUMER = "promotion-gate"
# A critic publishes its verdict after reading the CandidateProposed off the topic, so the sink may
# store the verdict first: a verdict's candidate gets this long to show in the log before the verdict
# is called a reference to nothing.
REFERENCE_GRACE_S = 30.0


def gate_state(store: EvidenceStore) -> GateState:
    """What PromotionGate needs, read from the evidence log."""
    benchmark = q.active_benchmark(store)
    active = {a.scenario_id: ActiveScenario(a.scenario_id, dict(a.spec), a.factor, a.parent_scenario_id)
              for a in (benchmark.scenarios if benchmark else ())}
    candidates, verdicts = {}, {}
    for c in q.candidates(store):
        candidates[c.scenario_id] = Candidate(c.scenario_id, c.parent_scenario_id, dict(c.scenario), c.factor,
                                              c.generator, c.cycle_id, c.source_cluster_id, c.event_id,
                                              c.proposed_at)
        latest = {}
        for v in sorted(c.verdicts, key=lambda v: (v.event_time, v.event_id)):
            latest[v.critic] = v
        verdicts[c.scenario_id] = {critic: _verdict(v) for critic, v in latest.items()}
    decided: dict[str, set[str]] = {}
    deferred: dict[str, set[str]] = {}
    reviews: dict[str, Review] = {}
    promoted_at: dict[str, datetime] = {}
    decided_at: dict[str, datetime] = {}
    for d in q.decisions(store):
        decided.setdefault(d.scenario_id, set()).add(d.event_type)
        decided_at[d.scenario_id] = max(d.event_time, decided_at.get(d.scenario_id, d.event_time))
        if d.event_type == "Promoted":
            promoted_at[d.scenario_id] = d.event_time
        if d.event_type == "Deferred":
            deferred.setdefault(d.scenario_id, set()).add(d.reason)
        elif d.event_type == "ReviewDecided":
            reviews[d.scenario_id] = Review(d.approved, d.reviewer, d.note, d.event_id, d.event_time)
    registered = tuple(m.model_id for m in q.models(store))
    success = {(s.scenario_id, s.model_id): (s.successes, s.episodes)
               for s in q.scores(store, model_ids=registered or None, seeds=q.SELECTION) if s.scenario_id in active}
    state = GateState(version=benchmark.version if benchmark else 0, candidates=candidates, verdicts=verdicts,
                      decisions=decided, deferred_reasons=deferred, reviews=reviews, active=active,
                      models=registered, success=success, promoted_at=promoted_at,
                      decided_at=decided_at)
    # Seed for seed, for the redundancy check: the scenarios a pending candidate may measure again
    # and the candidates themselves (their validation episodes), on the selection seeds.
    pending = [c.scenario_id for c in state.pending()]
    if pending:
        for t in q.trials(store, model_ids=registered or None, scenario_ids=[*active, *pending], seeds=q.SELECTION):
            if t.valid and t.pair_key is not None:
                state.outcomes.setdefault((t.scenario_id, t.model_id), {})[t.pair_key] = t.success
    return state


def _verdict(v) -> Verdict:
    """The gate's Verdict of a stored one, the robustness evidence decoded into its record here, at
    the boundary; the other critics' evidence is not read (the gate uses nothing of it). Unreadable
    robustness evidence gives no evidence and the error: the gate defers the candidate on it."""
    evidence, error = _robustness_evidence(v.evidence_json, v.event_id) if v.critic == ROBUSTNESS else (None, None)
    return Verdict(v.critic, v.ran, v.passed, v.score, v.reason, evidence, v.event_id, v.event_time, error)


@lru_cache(maxsize=2048)
def _robustness_evidence(text: str, event_id: str) -> tuple[RobustnessEvidence | None, str | None]:
    """Decoded once per verdict, though every tick reads the log again (so a bad one is logged once)."""
    try:
        return RobustnessEvidence.from_json(text, verdict=event_id), None
    except InvalidEvidence as exc:
        log.warning("%s: the gate cannot use this verdict; while it is a pending candidate's latest robustness "
                    "verdict, the candidate is deferred", exc)
        return None, str(exc)


class GateRunner:
    """One gate tick at a time, and the ids of its last decisions until the log shows them."""

    def __init__(self, store_factory: Callable[[], EvidenceStore], codec: Codec, gate: PromotionGate,
                 clock: Callable[[], datetime] = utc_now, topic_prefix: str = "sepa.", run_id: str = "gate",
                 reference_grace_s: float = REFERENCE_GRACE_S):
        self.store_factory = store_factory
        self.codec = codec
        self.gate = gate
        self.clock = clock
        self.reference_grace_s = reference_grace_s
        self.awaiting: set[str] = set()
        self.stats = {"ticks": 0, "decisions": 0}
        sources = (BY_NAME[OUTPUT_TOPIC], BY_NAME[VERDICTS_TOPIC])
        self.intake = Intake(codec, CONSUMER, run_id, {s.full_name(topic_prefix): s for s in sources})

    @cached_property
    def store(self) -> EvidenceStore:  # opened on the first message, in the worker's thread
        return self.store_factory()

    def on_decision(self, raw: RawMessage) -> list[Outgoing]:
        """A message on benchmark.decisions: the gate's own decisions pass; a ReviewDecided must
        answer a ReviewRequested the log holds (`sepa-eval review` checks that before publishing),
        otherwise it is dead-lettered with the reason (the gate never acts on it: it reads reviews
        of candidates in review only)."""
        event, dead = self.intake.admit_record(raw)
        if dead is not None:
            return [dead]
        if not isinstance(event, records.ReviewDecided):
            return []
        scenario_id = event.scenario_id
        if q.decisions(self.store, scenario_ids=[scenario_id], event_types=("ReviewRequested",)):
            return []
        return [self.intake.refuse(raw, f"ReviewDecided {event.envelope.event_id}: no review of "
                                        f"{scenario_id!r} was requested (no ReviewRequested for it in the "
                                        "evidence log)")]

    def on_verdict(self, raw: RawMessage) -> list[Outgoing]:
        """A CriticVerdict must judge a scenario the log has proposed (or run, or promoted): the gate
        reads verdicts through their candidates only, so a verdict about nothing would sit in the log
        unexplained. Refused with the reason once the grace for the sink to store its candidate is over."""
        event, dead = self.intake.admit_record(raw)
        if dead is not None:
            return [dead]
        scenario_id = event.scenario_id
        deadline = time.monotonic() + self.reference_grace_s
        while q.scenario_spec(self.store, scenario_id) is None:
            if time.monotonic() >= deadline:
                return [self.intake.refuse(raw, f"CriticVerdict {event.envelope.event_id} ({event.critic}): "
                                                f"no scenario {scenario_id!r} in the evidence log (no candidate, "
                                                f"promotion or rollout of it after {self.reference_grace_s:g} s)")]
            time.sleep(0.5)
        return []

    def tick(self) -> list[Outgoing]:
        """The decisions to publish now (none while the last ones are not in the log yet)."""
        self.stats["ticks"] += 1
        if self.awaiting:
            landed = {d.event_id for d in q.decisions(self.store)}
            self.awaiting -= landed
            if self.awaiting:
                return []
        events = self.gate.decide(gate_state(self.store), self.clock())
        self.awaiting = {e["envelope"]["event_id"] for e in events}
        self.stats["decisions"] += len(events)
        for e in events:
            log.info("%s %s: %s", e["envelope"]["event_type"], e["scenario_id"], e["reason"])
        return [Outgoing.of(e, self.codec) for e in events]


def register_gate(app: faust.App, source: faust.types.TopicT, verdicts: faust.types.TopicT,
                  outputs: dict[str, faust.types.TopicT], runner: GateRunner, tick_interval_s: float,
                  prefix: str) -> None:
    owned = TP(BY_NAME[OUTPUT_TOPIC].full_name(prefix), 0)
    lock = asyncio.Lock()

    # The timer decides; holding this partition is what makes this worker the gate. The agent
    # checks what reviewers publish there.
    register_blocking_agent(app, source, outputs, "promotion-gate", runner.on_decision)
    register_blocking_agent(app, verdicts, outputs, "verdict-references", runner.on_verdict)

    @app.timer(interval=tick_interval_s, name="promotion-gate-tick")
    async def gate_tick():
        try:
            if owned not in app.consumer.assignment():
                return
        except Exception:  # the consumer is not started yet
            return
        if lock.locked():
            return
        async with lock:
            try:
                messages = await asyncio.get_running_loop().run_in_executor(None, runner.tick)
            except Exception:
                log.exception("gate tick failed; trying again at the next tick")
                return
            for m in messages:
                await outputs[m.topic].send(key=m.key, value=m.value)
