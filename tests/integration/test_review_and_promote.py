"""`sepa-eval review list | approve | reject` and `sepa-eval promote` against a real broker, the real
evidence sink and a real chDB store: a review decision is checked against the log before it is
published (one per scenario; an unknown id or a scenario not in review is one line, exit 2), and the
gate's pure core, on a GateState read from that store, turns an approval into Promoted with the
next benchmark version and a rejection into Rejected; `promote` publishes exactly those decisions,
and refuses while a streams worker runs the gate."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta

import pytest
from cli_in_process import StandIns, cli_env, sepa
from evidence_factory import EvidenceLog, spec
from sinks import make_sink

from consumers import state as q
from infra import processes
from infra.kafka_clients import ensure_topics, make_producer
from infra.reviews import wait_for_decisions
from infra.settings import Settings
from infra.streams_config import gate_config
from producers.publisher import Publisher
from schemas.events import utc_now
from streams.gate.agent import gate_state
from streams.gate.gate import PromotionGate

CHECKS = {"solvable": {"name": "solvable", "status": "passed", "p_value": 0.001, "reason": "oracle 8/8"},
          "discriminative": {"name": "discriminative", "status": "pending", "p_value": 0.09,
                             "reason": "expert 6/8 vs clumsy 4/8"}}


@pytest.fixture
def world(tansu, store, tmp_path):
    """A sink storing a fresh prefix's topics into the test's database, stand-ins for the pipeline,
    and a log holding a promoted base and two candidates whose robustness verdicts are borderline."""
    prefix = f"v{uuid.uuid4().hex[:10]}."
    ensure_topics(tansu, prefix)
    stop = threading.Event()
    sink = make_sink(store, tansu, prefix)
    thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    thread.start()
    publisher = Publisher(make_producer(tansu), prefix)
    memory = tmp_path / "m"
    stand_ins = StandIns(memory)
    stand_ins.start(processes.PIPELINE)

    log = EvidenceLog(start=utc_now() - timedelta(hours=1))
    base = spec("base")
    for model, kind in (("oracle", "oracle"), ("expert", "scripted"), ("clumsy", "scripted")):
        log.register(model, kind)
    log.promoted(base, 1)
    for name in ("a", "b"):
        candidate = spec(name, parent=base["scenario_id"], object_friction=0.1)
        log.candidate(candidate, base["scenario_id"], "friction", cycle_id="c1", source_cluster_id="fc-1")
        log._emit("CriticVerdict", (candidate["scenario_id"], "robustness"), "critics",
                  scenario_id=candidate["scenario_id"], critic="robustness", critic_version="test", ran=True,
                  score=0.25, passed=None, backend="sequential", reason="borderline, undecided at 8 seeds per arm",
                  rollouts=40, evidence_json=json.dumps({"action": "reject", "borderline": True, "checks": CHECKS,
                                                         "seeds_per_arm": 8, "models": {}}))
        log._emit("CriticVerdict", (candidate["scenario_id"], "safety"), "critics",
                  scenario_id=candidate["scenario_id"], critic="safety", critic_version="test", ran=True,
                  score=1.0, passed=True, backend="rules", reason="oracle safe", rollouts=0, evidence_json="{}")
    for event in log.events:
        publisher.publish(event)
    publisher.flush()
    wait_for_decisions(store, [e["envelope"]["event_id"] for e in log.events if e["envelope"]["event_type"] ==
                               "Promoted"])
    yield store, publisher, memory, cli_env(tansu, prefix, store), stand_ins
    stand_ins.stop()
    stop.set()
    thread.join(timeout=30)


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_reviews_are_decided_once_through_the_log_and_the_gate_promotes_or_rejects_them(world):
    store, publisher, memory, env, stand_ins = world
    gate = PromotionGate(gate_config(Settings(memory_dir=memory)))
    asked = gate.decide(gate_state(store), utc_now())
    assert [(e["envelope"]["event_type"], e["scenario_id"]) for e in asked] == [
        ("ReviewRequested", "scn-a"), ("ReviewRequested", "scn-b")]
    for event in asked:  # what the streams worker's gate publishes
        publisher.publish(event)
    publisher.flush()
    wait_for_decisions(store, [e["envelope"]["event_id"] for e in asked])

    listed = sepa(memory, env, "review", "list")
    assert listed.exit_code == 0, listed.output
    assert "scn-a" in listed.stdout and "scn-b" in listed.stdout and "friction on scn-base" in listed.stdout
    assert "discriminative pending (p=0.09): expert 6/8 vs clumsy 4/8" in listed.stdout  # the evidence
    as_json = json.loads(sepa(memory, env, "review", "list", "--json").stdout)
    assert [r["scenario_id"] for r in as_json] == ["scn-a", "scn-b"] and as_json[0]["checks"] == CHECKS

    approved = sepa(memory, env, "review", "approve", "scn-a", "--note", "slips as it should", "--reviewer", "ada")
    assert approved.exit_code == 0, approved.output
    assert "scn-a approved by ada" in approved.stdout
    again = sepa(memory, env, "review", "reject", "scn-a", "--reviewer", "bob")
    assert again.exit_code == 2 and "scn-a was reviewed already: approved by ada" in one_line(again)
    rejected = sepa(memory, env, "review", "reject", "scn-b", "--reviewer", "bob")
    assert rejected.exit_code == 0, rejected.output
    unknown = sepa(memory, env, "review", "approve", "scn-nope")
    assert unknown.exit_code == 2 and "no candidate 'scn-nope' in the evidence log" in one_line(unknown)
    not_in_review = sepa(memory, env, "review", "approve", "scn-base")
    assert not_in_review.exit_code == 2 and "scn-base is not awaiting review: its latest decision is Promoted" \
        in one_line(not_in_review)
    assert json.loads(sepa(memory, env, "review", "list", "--json").stdout) == []
    assert "no candidate awaits review" in sepa(memory, env, "review", "list").stdout

    # the gate's pure core on the log as it now stands: the approval promotes, the rejection rejects
    decided = gate.decide(gate_state(store), utc_now())
    assert [(e["envelope"]["event_type"], e["scenario_id"], e.get("benchmark_version")) for e in decided] == [
        ("Promoted", "scn-a", 2), ("Rejected", "scn-b", None)]
    assert decided[0]["reason"] == "approved in review by ada: slips as it should"
    assert "rejected in review by bob" in decided[1]["reason"]

    # `promote` decides the same, and publishes; not while a streams worker runs the gate
    stand_ins.start(processes.STREAMS)
    busy = sepa(memory, env, "promote")
    assert busy.exit_code == 1 and "a streams worker runs the promotion gate" in one_line(busy)
    dry = sepa(memory, env, "promote", "--dry-run")
    assert dry.exit_code == 0 and "not published (dry run)" in dry.stdout and "v1 -> v2" in dry.stdout
    # the dry run published nothing
    assert [d.event_type for d in q.decisions(store, scenario_ids=["scn-a"])] == ["ReviewRequested", "ReviewDecided"]
    forced = sepa(memory, env, "promote", "--force")
    assert forced.exit_code == 0, forced.output
    assert "2 decision(s) published and stored; benchmark v1 -> v2" in forced.stdout
    stored = {d.event_id: d for d in q.decisions(store)}
    assert all(e["envelope"]["event_id"] in stored for e in decided)  # the very events the core derived
    assert q.active_benchmark(store).version == 2 and "scn-a" in q.active_scenarios(store)
    assert {c.scenario_id: c.status for c in q.candidates(store)}["scn-b"] == "rejected"
    nothing = sepa(memory, env, "promote", "--force")
    assert nothing.exit_code == 0 and "nothing to decide" in nothing.stdout
