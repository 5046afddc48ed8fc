"""What the gate's agent on benchmark.decisions does with a ReviewDecided: one answering a
ReviewRequested in the log passes; one for a scenario nobody asked a review of (a stray producer:
`sepa-eval review` refuses such input before publishing) is dead-lettered with the reason; the
gate's own decisions and undecodable bytes go the usual way."""

from __future__ import annotations

import threading

from evidence_factory import EvidenceLog, spec, store_events

from schemas.codec import Codec
from streams.deadletter import RawMessage
from streams.gate.agent import GateRunner
from streams.gate.gate import GateConfig, PromotionGate

TOPIC = "sepa.benchmark.decisions"


def test_a_review_decided_of_a_scenario_no_review_was_asked_for_is_dead_lettered(store):
    codec = Codec()
    runner = GateRunner(lambda: store, codec, PromotionGate(GateConfig(run_id="gate")))
    log = EvidenceLog()
    awaiting = spec("awaiting")
    log.promoted(spec("base"), 1)
    log.decision("ReviewRequested", awaiting["scenario_id"])
    log.review_decided(awaiting["scenario_id"], approved=True)
    log.review_decided("scn-ghost", approved=True)
    store_events(store, log.events[:-2])
    promoted, _, answering, stray = log.events

    def raw(event: dict, offset: int) -> RawMessage:
        return RawMessage(TOPIC, 0, offset, event["scenario_id"].encode(), codec.encode(event))

    assert runner.on_decision(raw(promoted, 0)) == []
    assert runner.on_decision(raw(answering, 2)) == []
    [dead] = runner.on_decision(raw(stray, 3))
    letter = codec.decode(dead.value)
    assert dead.topic == "deadletter" and letter["source_offset"] == 3
    assert "no review of 'scn-ghost' was requested" in letter["reason"], letter["reason"]
    [garbage] = runner.on_decision(RawMessage(TOPIC, 0, 4, b"k", b"not avro"))
    assert garbage.topic == "deadletter"


def test_a_verdict_about_a_scenario_the_log_never_saw_is_dead_lettered_after_the_grace(store):
    codec = Codec()
    runner = GateRunner(lambda: store, codec, PromotionGate(GateConfig(run_id="gate")), reference_grace_s=0.6)
    log = EvidenceLog()
    proposed = spec("proposed")
    log.candidate(proposed, "scn-base", "lighting")
    log.verdict(proposed["scenario_id"], "safety", passed=True)
    log.verdict("scn-ghost", "robustness", passed=True)
    _, known, ghost = log.events
    # The candidate lands while the verdict waits (the sink stored the verdict first).
    threading.Timer(0.2, store_events, (store, log.events[:1])).start()

    def raw(event: dict, offset: int) -> RawMessage:
        return RawMessage("sepa.critics.verdicts", 1, offset, event["scenario_id"].encode(), codec.encode(event))

    assert runner.on_verdict(raw(known, 0)) == []
    [dead] = runner.on_verdict(raw(ghost, 1))
    letter = codec.decode(dead.value)
    assert dead.topic == "deadletter" and letter["source_offset"] == 1
    assert "no scenario 'scn-ghost' in the evidence log" in letter["reason"], letter["reason"]
