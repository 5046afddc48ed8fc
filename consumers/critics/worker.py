"""The critics worker: validates every proposed candidate and publishes its CriticVerdicts.

    worker = CriticsWorker(consumer, publisher, store, codec, CriticsConfig(), judge=None)
    worker.run(stop)            # until stop is set; `sepa-eval critics` runs it, `up` starts it

It reads scenarios.candidates (a Kafka consumer built at the edge) and, for each CandidateProposed
that is not a base scenario, runs the three critics in order:

1. robustness (consumers/critics/sequential.py): asks for validation rollouts of the candidate for
   every registered model and the oracle, and of the parent (the control arm) for the registered
   models, on the same seeds 0, 1, ...; the sweeps already ran the parent on the first seeds, so
   the control arm is mostly there. After every look the sequential rule says continue (request
   the next seeds), accept or reject.
   A candidate the rule rejects only because it ran out of seeds, every test still under the
   nominal alpha, is borderline: its verdict says so (passed null) and the gate asks a person.
2. safety (consumers/critics/safety.py), once robustness accepted (or found it borderline): the oracle's validation
   episodes, from their EpisodeAnalysed (quality, moments).
3. semantic (consumers/critics/semantic.py), once safety passed: the VLM judge over the keyframes
   of the oracle's first successful validation episode; with no judge configured, a verdict that
   says "not run" (missing evidence, never a pass).

Everything a critic needs is read from the evidence log (consumers/state/online.py), never kept
here: a restarted worker re-reads its uncommitted candidates, finds the rollouts and verdicts that
exist, and carries on; a seed some request in the log already asks for (its episode not ended
yet) is not asked for again, a verdict already in the log is not judged again. A candidate's
offset is committed once its last verdict is published, in offset order per partition (the same
discipline as the failure detector's acknowledgements).
Verdicts and requests take their event time from their evidence (the latest episode used, the
candidate), so a re-derived one is byte-identical to the first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from confluent_kafka import Consumer, TopicPartition

from consumers.critics.safety import SafetyConfig, judge_safety
from consumers.critics.semantic import CRITIC as SEMANTIC
from consumers.critics.semantic import SemanticConfig, SemanticJudge, SemanticVerdict
from consumers.critics.sequential import ACCEPT, CONTINUE, PASSED, REJECT, SequentialConfig, decide
from consumers.evidence.store import EvidenceStore
from consumers.state import online as q
from producers.commits import Committer
from producers.episode import CAMERA_SIZE
from producers.publisher import Publisher
from schemas import records
from schemas.catalog import BY_NAME
from schemas.codec import Codec
from schemas.events import dead_letter, make_event, stable_id
from schemas.exceptions import SchemaError
from schemas.typed import to_avro, to_record

log = logging.getLogger(__name__)
CONSUMER = "critics"
CANDIDATES = BY_NAME["scenarios.candidates"]  # decoded against it: the same reasons as the sink's
GROUP_ID = "sepa-critics"
ROBUSTNESS, SAFETY = "robustness", "safety"
ORACLE_KIND = "oracle"


@dataclass(frozen=True, kw_only=True)
class CriticsConfig:
    sequential: SequentialConfig = field(default_factory=SequentialConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    semantic: SemanticConfig = field(default_factory=SemanticConfig)
    oracle_keyframe_every: int = 40  # the oracle's candidate rollouts render a keyframe this often (steps)
    poll_interval_s: float = 1.0  # how often pending candidates are looked at again, s
    run_id: str = "critics"
    # The model ids the rollout workers serve (their registry file's), given at the edge; a model
    # registered in the log but not served (a stray ModelRegistered) is left out of validation with
    # a warning, since its rollouts would be refused and the candidate would wait forever. None:
    # every registered model.
    served_models: frozenset[str] | None = None


@dataclass
class _Pending:
    event: records.CandidateProposed | None  # None: a dead-lettered message, held for its offset
    partition: tuple[str, int]
    offset: int
    # requests this process published that the log does not show yet: request id -> ((scenario, model), seeds)
    unlanded: dict[str, tuple[tuple[str, str], tuple[int, ...]]] = field(default_factory=dict)
    done: bool = False

    def __post_init__(self) -> None:
        if self.event is not None:
            self.event = to_record(self.event)  # checked once, where the candidate enters


def borderline(decision, config: SequentialConfig) -> bool:
    """Rejected only because the rule ran out of seeds, with every check that did not pass still under
    the nominal alpha (its spending bound was stricter): too close to call, so a person decides."""
    return (decision.action == REJECT and decision.seeds >= config.max_seeds
            and any(c.status != PASSED for c in decision.checks.values())
            and all(c.status == PASSED or c.p_value < config.alpha for c in decision.checks.values()))


def validation_request(candidate: records.CandidateProposed | Mapping, scenario: Mapping, model_id: str,
                       seeds: list[int], keyframe_every: int, run_id: str) -> dict:
    """The RolloutRequested for one arm of one look. Its id and time come from the candidate, so
    deriving it again after a restart gives the same event."""
    candidate = to_record(candidate)
    request_id = "req-" + stable_id("validation", candidate.scenario_id, scenario["scenario_id"], model_id,
                                    tuple(seeds))[:20]
    return make_event("RolloutRequested", (request_id,), CONSUMER, run_id,
                      event_time=candidate.envelope.event_time, request_id=request_id,
                      scenario_id=scenario["scenario_id"], scenario=dict(scenario), model_id=model_id, seeds=seeds,
                      purpose="validation", keyframe_every=keyframe_every, cameras=[], camera_size=CAMERA_SIZE)


class CriticsWorker:
    def __init__(self, consumer: Consumer, publisher: Publisher, store: EvidenceStore, codec: Codec,
                 config: CriticsConfig, topic_prefix: str, judge: SemanticJudge | None = None):
        self.consumer, self.publisher, self.store, self.codec = consumer, publisher, store, codec
        self.committer = Committer(consumer)
        self.config = config
        self.prefix = topic_prefix
        self.judge = judge
        self.pending: OrderedDict[str, _Pending] = OrderedDict()  # by scenario id, in arrival order
        self.stats = {"candidates": 0, "verdicts": 0, "requests": 0, "dead_letters": 0}
        self._warned: set[str] = set()  # registered models not served, warned about once

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event, on_assigned=None) -> None:
        """Until ``stop`` is set; ``on_assigned()`` is called once the group gave this worker its
        partitions (the readiness `sepa-eval up` waits for)."""
        def assigned(consumer, partitions) -> None:
            if on_assigned is not None:
                on_assigned()

        self.consumer.subscribe([f"{self.prefix}scenarios.candidates"], on_assign=assigned,
                                on_revoke=self._on_revoke)
        last = 0.0
        try:
            while not stop.is_set():
                for msg in self.consumer.consume(num_messages=100, timeout=self.config.poll_interval_s):
                    if msg.error() is None:
                        self._take(msg)
                self.committer.retry()
                if time.monotonic() - last >= self.config.poll_interval_s:
                    last = time.monotonic()
                    self.advance_all()
                    self._commit()
        finally:
            self.publisher.flush()
            self.consumer.close()

    def _on_revoke(self, consumer, partitions) -> None:
        # Another worker takes these candidates over from their committed offsets.
        gone = {(p.topic, p.partition) for p in partitions}
        for sid in [s for s, p in self.pending.items() if p.partition in gone]:
            del self.pending[sid]

    def _take(self, msg) -> None:
        try:
            event = to_record(self.codec.decode(msg.value(), CANDIDATES))
        except SchemaError as exc:
            _, ts = msg.timestamp()
            self.publisher.publish(dead_letter(CONSUMER, self.config.run_id, msg.topic(), msg.partition(),
                                               msg.offset(), msg.key(), msg.value(), str(exc), ts))
            self.stats["dead_letters"] += 1
            event = None
        tp = (msg.topic(), msg.partition())
        sid = event.scenario_id if event else f"~dead@{msg.partition()}:{msg.offset()}"
        pending = _Pending(event, tp, msg.offset(), done=event is None or event.generator == "base")
        if sid not in self.pending:
            self.pending[sid] = pending
            self.stats["candidates"] += 1

    def advance_all(self) -> None:
        for sid, p in list(self.pending.items()):
            if not p.done:
                try:
                    p.done = self.advance(p)
                except Exception:  # one candidate's trouble (a bad spec, a store hiccup) must not stop the others
                    log.exception("candidate %s: critics failed this round; retrying", sid)
        self.publisher.flush()

    def _commit(self) -> None:
        """Commits, per partition, past the longest prefix of done candidates (offset order)."""
        by_tp: dict[tuple[str, int], list[_Pending]] = {}
        for p in self.pending.values():
            by_tp.setdefault(p.partition, []).append(p)
        offsets = []
        for tp, items in by_tp.items():
            items.sort(key=lambda p: p.offset)
            upto = None
            for p in items:
                if not p.done:
                    break
                upto = p.offset + 1
            if upto is not None:
                offsets.append(TopicPartition(tp[0], tp[1], upto))
                for p in items:
                    if p.offset < upto:
                        self.pending.pop(p.event.scenario_id if p.event else f"~dead@{tp[1]}:{p.offset}", None)
        if offsets:
            self.committer.commit(offsets)

    # -- one candidate ----------------------------------------------------------------------

    def _served(self, registered: list) -> list:
        """The registered models a rollout worker serves (all of them without served_models)."""
        served = self.config.served_models
        if served is None:
            return registered
        for m in registered:
            if m.model_id not in served and m.model_id not in self._warned:
                self._warned.add(m.model_id)
                log.warning("model %s %s is registered but no rollout worker serves it (not in its registry file): "
                            "left out of validation", m.model_id, m.version)
        return [m for m in registered if m.model_id in served]

    def advance(self, p: _Pending) -> bool:
        """One step of the critics for a candidate; True once every verdict it needs is published."""
        candidate = p.event
        sid = candidate.scenario_id
        have = {v.critic: v for v in q.verdicts(self.store, scenario_ids=[sid])}
        registered = self._served(q.models(self.store))
        oracles = [m.model_id for m in registered if m.kind == ORACLE_KIND]
        ranked = [m.model_id for m in registered if m.kind != ORACLE_KIND]
        if not oracles or not ranked:
            log.info("candidate %s waits: %d oracle(s), %d ranked model(s) registered", sid, len(oracles), len(ranked))
            return False
        oracle = oracles[0]

        robust = have.get(ROBUSTNESS)
        if robust is None:
            verdict = self._robustness(p, oracle, ranked)
            if verdict is None:
                return False
            robust = verdict
        if robust.passed is False:
            return True  # rejected: nothing more to judge (borderline ones get safety and semantic for the reviewer)
        if SAFETY not in have and not self._safety(p, oracle, ranked):
            return False
        if SEMANTIC not in have:
            self._semantic(p, oracle, [*ranked, oracle])
        return True

    def _robustness(self, p: _Pending, oracle: str, ranked: list[str]):
        candidate = p.event
        sid, parent_id = candidate.scenario_id, candidate.parent_scenario_id
        # What is in flight is read before what has ended: a seed whose episode ends in between is
        # then in flight and ended, never neither (which would ask for it again).
        flying = self._in_flight(p, [sid, parent_id], [oracle, *ranked])
        trials = q.trials(self.store, model_ids=[oracle, *ranked], scenario_ids=[sid, parent_id], seeds=q.SELECTION)
        outcome = {(t.scenario_id, t.model_id, t.seed): t for t in trials if t.valid and t.seed is not None}
        cfg = self.config.sequential
        n = 0
        while n < cfg.max_seeds and all((sid, m, n) in outcome for m in (oracle, *ranked)) \
                and all((parent_id, m, n) in outcome for m in ranked):
            n += 1
        decision = decide([outcome[(sid, oracle, s)].success for s in range(n)],
                          {m: [(outcome[(sid, m, s)].success, outcome[(parent_id, m, s)].success) for s in range(n)]
                           for m in ranked}, cfg)
        if decision.action == CONTINUE:
            self._request(p, oracle, ranked, decision.next_seeds, outcome, flying)
            return None
        used = [outcome[(sid, m, s)] for m in (oracle, *ranked) for s in range(decision.seeds)] + \
               [outcome[(parent_id, m, s)] for m in ranked for s in range(decision.seeds)]
        fields = decision.verdict_fields(cfg)
        if borderline(decision, cfg):
            evidence = replace(decision.evidence(cfg), borderline=True)
            why = (f"borderline, undecided at {decision.seeds} seeds per arm (every test under the nominal "
                   f"{cfg.alpha}): {decision.reason}")
            fields = fields | {"passed": None, "reason": why, "evidence_json": evidence.to_json()}
        event = self._verdict(candidate, fields, used)
        self.publisher.publish(event)
        self.stats["verdicts"] += 1
        log.info("candidate %s: robustness %s at look %d (%d seeds per arm): %s", sid, decision.action,
                 decision.look, decision.seeds, decision.reason)
        return _Published(passed=True if decision.action == ACCEPT else None if fields["passed"] is None else False)

    def _in_flight(self, p: _Pending, scenario_ids: list[str], model_ids: list[str]) -> dict[tuple[str, str], set[int]]:
        """(scenario, model) -> seeds asked for and not ended: by requests in the log, and by this
        process's requests the log does not show yet."""
        if p.unlanded:
            for request_id in q.requested(self.store, list(p.unlanded)):
                del p.unlanded[request_id]
        flying = q.in_flight_seeds(self.store, scenario_ids, model_ids)
        for key, seeds in p.unlanded.values():
            flying.setdefault(key, set()).update(seeds)
        return flying

    def _request(self, p: _Pending, oracle: str, ranked: list[str], upto: int, outcome: dict,
                 flying: dict[tuple[str, str], set[int]]) -> None:
        """Requests the seeds below ``upto`` that no arm has yet: per arm, the seeds that are neither
        ended (valid) nor in flight (asked for by any request in the log, or by this process before
        the log shows it, whose episode has not ended). So a look is asked for once, a look served
        halfway is not asked for again (by this worker or by one restarted in its place), and the
        parent's seeds the sweep ran, or another candidate's control arm is running, are reused."""
        candidate = p.event
        sid, parent_id = candidate.scenario_id, candidate.parent_scenario_id
        arms = [(to_avro(candidate.scenario), m, self.config.oracle_keyframe_every if m == oracle else 0)
                for m in (oracle, *ranked)]
        if any((parent_id, m, s) not in outcome for m in ranked for s in range(upto)):
            parent = self._parent_spec(parent_id)
            if parent is None:
                log.warning("candidate %s: the parent %s is not in the log; no control arm", sid, parent_id)
                return
            arms += [(parent, m, 0) for m in ranked]
        wanted = []
        for spec, model, keyframes in arms:
            key = (spec["scenario_id"], model)
            seeds = [s for s in range(upto) if (*key, s) not in outcome and s not in flying.get(key, ())]
            if seeds:
                wanted.append(validation_request(candidate, spec, model, seeds, keyframes, self.config.run_id))
        # a request already in the log (its episodes ended, some invalid) is not run again
        known = q.requested(self.store, [r["request_id"] for r in wanted]) if wanted else set()
        for request in wanted:
            if request["request_id"] not in known:
                self.publisher.publish(request)
                p.unlanded[request["request_id"]] = ((request["scenario_id"], request["model_id"]),
                                                     tuple(request["seeds"]))
                self.stats["requests"] += 1

    def _parent_spec(self, parent_id: str) -> dict | None:
        return q.scenario_spec(self.store, parent_id)

    def _oracle_episodes(self, candidate: records.CandidateProposed, oracle: str) -> list:
        sid = candidate.scenario_id
        return [t for t in q.trials(self.store, model_ids=[oracle], scenario_ids=[sid], seeds=q.SELECTION) if t.valid]

    def _safety(self, p: _Pending, oracle: str, ranked: list[str]) -> bool:
        episodes = self._oracle_episodes(p.event, oracle)
        analysed = q.analysed_episodes(self.store, [t.episode_id for t in episodes])
        if len(analysed) < len(episodes):
            return False  # the detector has not decided every episode yet
        verdict = judge_safety(analysed, oracle, self.config.safety)
        self.publisher.publish(self._verdict(p.event, verdict.fields(), episodes))
        self.stats["verdicts"] += 1
        return True

    def _semantic(self, p: _Pending, oracle: str, evaluated: list[str]) -> None:
        candidate = p.event
        episodes = self._oracle_episodes(candidate, oracle)
        if self.judge is None:
            verdict = SemanticVerdict(False, None, None, "none", "not run: no judge configured")
        else:
            won = [t for t in episodes if t.success]
            frames = q.episode_keyframes(self.store, won[0].episode_id) if won else []
            verdict = self.judge.judge(candidate.scenario.instruction, frames, evaluated)
        self.publisher.publish(self._verdict(candidate, verdict.fields(), episodes))
        self.stats["verdicts"] += 1

    def _verdict(self, candidate: records.CandidateProposed, fields: dict, evidence_trials: list) -> dict:
        times = [t.ended_at for t in evidence_trials if getattr(t, "ended_at", None) is not None]
        at = max(times, default=candidate.envelope.event_time)
        return make_event("CriticVerdict", (candidate.scenario_id, fields["critic"], fields["critic_version"]),
                          CONSUMER, self.config.run_id, event_time=at, scenario_id=candidate.scenario_id, **fields)


@dataclass(frozen=True)
class _Published:
    """A verdict this process just published (the log will show it shortly)."""

    passed: bool | None  # None: borderline
