"""The critics worker (consumers/critics/worker.py) against a real broker, the real evidence sink and
a chDB store, the rollouts served by a stand-in (tests/loop_harness.py): verdicts per candidate,
validation requests per look and never twice, the control arm reused from the sweep, a restart
mid-look that loses nothing and repeats nothing; the semantic judge misbehaving in every way the
issue names, recorded as a failed call, never a pass, never blocking the next candidate."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import openai
from evidence_factory import EvidenceLog, store_events
from loop_harness import BASE, MODELS, LoopWorld, Responder, child, harder_for, never
from openai_judge_server import OpenAIJudgeServer

from consumers import state as q
from consumers.critics.semantic import SemanticConfig, SemanticJudge
from consumers.critics.worker import CriticsConfig, CriticsWorker, _Pending, validation_request
from infra.kafka_clients import ensure_topics, make_producer
from producers.keyframes import KeyframeStore
from producers.publisher import Publisher
from schemas.codec import Codec
from schemas.events import make_event
from streams.gate.gate import GateConfig

GOOD = child(object_friction=0.1)  # the weak model loses every seed, the strong one none: promote
BAD = child(object_mass=2.0)  # the oracle cannot solve it: reject at the first look
BASE_ID, GOOD_ID, BAD_ID = BASE["scenario_id"], GOOD["scenario_id"], BAD["scenario_id"]
LOOK = 5  # SequentialConfig().look_seeds
RANKED = ("strong", "weak")


def validation_requests(world: LoopWorld) -> list[dict]:
    return [r for r in world.responder.requests if r["purpose"] == "validation"]


def test_critics_validate_per_look_reuse_the_sweep_and_a_restart_mid_look_repeats_nothing(tansu, store, tmp_path):
    world = LoopWorld(tansu, store, tmp_path, {GOOD_ID: harder_for("weak"), BAD_ID: never}).start()
    try:
        world.register()
        world.promote_base()
        world.sweep(BASE, range(LOOK))  # the control arm's first look exists; the second must be run
        world.responder.hold_from = LOOK + 2  # the second look is served halfway, then the worker dies
        first = world.critics().start()
        world.propose(GOOD, seconds=10)
        world.propose(BAD, seconds=11)
        world.until(lambda: "robustness" in world.verdicts(BAD_ID), "the unsolvable candidate's verdict")
        # seeds 5 and 6 of the second look ended for every arm (3 candidate arms, 2 control arms)
        world.until(lambda: world.ended(GOOD_ID) == 3 * (LOOK + 2) and world.ended(BASE_ID) == 3 * LOOK + 2 * 2,
                    "the second look served up to seed 6")
        assert world.verdicts(GOOD_ID) == {}
        first.stop()

        second = world.critics().start()
        world.until(second.assigned.is_set, "the second worker got the candidates' partitions")
        world.until(lambda: second.worker.stats["candidates"] >= 1, "the second worker re-read the open candidate")
        time.sleep(3 * second.worker.config.poll_interval_s)  # several rounds with the look still half served
        world.responder.hold_from = None
        world.until(lambda: set(world.verdicts(GOOD_ID)) == {"robustness", "safety", "semantic"},
                    "the promotable candidate's three verdicts")
        time.sleep(3 * second.worker.config.poll_interval_s)  # anything the worker would publish twice, now
        second.stop()
        world.until(lambda: len(world.responder.served) == sum(len(r["seeds"]) for r in world.responder.requests),
                    "every request served")

        good, bad = world.verdicts(GOOD_ID), world.verdicts(BAD_ID)
        assert good["robustness"].passed is True and good["robustness"].ran
        evidence = json.loads(good["robustness"].evidence_json)
        assert evidence["look"] == 2 and evidence["seeds_per_arm"] == 2 * LOOK
        assert good["safety"].ran and good["safety"].passed is True
        assert not good["semantic"].ran and good["semantic"].passed is None
        assert good["semantic"].reason == "not run: no judge configured"
        assert set(bad) == {"robustness"} and bad["robustness"].passed is False
        assert json.loads(bad["robustness"].evidence_json)["look"] == 1

        requests = validation_requests(world)
        ids = Counter(r["request_id"] for r in requests)
        assert [rid for rid, n in ids.items() if n > 1] == [], "a request was published twice"
        asked = Counter((r["scenario_id"], r["model_id"], s) for r in requests for s in r["seeds"])
        assert [k for k, n in asked.items() if n > 1] == [], "a seed was asked for twice"
        looks = sorted((r["scenario_id"], r["model_id"], tuple(r["seeds"])) for r in requests)
        expected = sorted(
            [(GOOD_ID, m, tuple(range(0, LOOK))) for m in ("oracle", *RANKED)]
            + [(GOOD_ID, m, tuple(range(LOOK, 2 * LOOK))) for m in ("oracle", *RANKED)]
            + [(BAD_ID, m, tuple(range(0, LOOK))) for m in ("oracle", *RANKED)]
            # the control arm: the parent for the ranked models only (not the oracle), and only the
            # seeds the sweep did not run
            + [(BASE_ID, m, tuple(range(LOOK, 2 * LOOK))) for m in RANKED])
        assert looks == expected
        assert world.dead_letters() == [], "a verdict or a request was re-published with another content"
        stored = store.query("SELECT scenario_id, critic, count() FROM {database}.critic_verdicts FINAL "
                             "GROUP BY scenario_id, critic ORDER BY scenario_id, critic")
        assert all(n == 1 for *_, n in stored) and len(stored) == 4
    finally:
        world.stop()


class PerTaskJudge(OpenAIJudgeServer):
    """The judge server misbehaving per candidate: each candidate's instruction names a behaviour."""

    def __init__(self, behaviours: dict[str, str], **kw):
        super().__init__(task="", **kw)
        self.by_task = behaviours

    def _parse(self, body, headers):
        request = super()._parse(body, headers)
        if request.role == "unrelated_control" and request.task in self.by_task:
            request.role = "judgment"  # a candidate's own task
        return request

    def _respond(self, request):
        self.behaviour = self.by_task.get(request.task, "good")  # calls come one at a time
        return super()._respond(request)


MISBEHAVING = ("timeout", "refusal", "length", "malformed")


def test_a_misbehaving_judge_is_a_recorded_failed_call_never_a_pass_and_the_gate_defers(tansu, store, tmp_path):
    # one candidate per behaviour, the timeout first (it must not hold up the ones after it)
    candidates = {b: child(instruction=f"lift the cube ({b})", object_friction=0.1) for b in (*MISBEHAVING, "good")}
    behaviours = {spec["instruction"]: b for b, spec in candidates.items()}
    world = LoopWorld(tansu, store, tmp_path, {s["scenario_id"]: harder_for("weak") for s in candidates.values()},
                      gate=GateConfig(semantic_required=True, run_id="gate")).start()
    with PerTaskJudge(behaviours, model="judge-vl", delay_s=4.0) as server:
        try:
            config = SemanticConfig(endpoint=server.base_url, model="judge-vl", timeout_s=1.0)
            client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=0, timeout=1.0)
            judge = SemanticJudge(client, config, world.keyframes)
            world.register()
            world.promote_base()
            world.sweep(BASE, range(2 * LOOK), models=("oracle", *RANKED))  # saturated: the base retires
            critics = world.critics(CriticsConfig(semantic=config, poll_interval_s=0.3), judge=judge).start()
            for i, spec in enumerate(candidates.values()):
                world.propose(spec, seconds=10 + i)
            ids = {b: s["scenario_id"] for b, s in candidates.items()}
            world.until(lambda: all("semantic" in world.verdicts(sid) for sid in ids.values()),
                        "a semantic verdict for every candidate")
            critics.stop()

            for b in MISBEHAVING:
                semantic = world.verdicts(ids[b])["semantic"]
                assert semantic.ran is False and semantic.passed is None and semantic.score is None, (b, semantic)
                assert semantic.reason.startswith("failed call ("), (b, semantic.reason)
                calls = json.loads(semantic.evidence_json)["calls"]
                assert len(calls) == 1 and calls[0]["ok"] is False and calls[0]["role"] == "judgment", b
            kinds = {b: json.loads(world.verdicts(ids[b])["semantic"].evidence_json)["calls"][0]["failure"]
                     for b in MISBEHAVING}
            assert kinds == {"timeout": "timeout", "refusal": "refusal", "length": "truncated",
                             "malformed": "malformed_json"}
            good = world.verdicts(ids["good"])["semantic"]
            assert good.ran and good.passed is True, good.reason
            # one call per failed candidate (a failed judgment stops there); the judged one and its two controls
            assert sorted(server.roles()) == ["blank_control", *["judgment"] * 5, "unrelated_control"]

            # the gate: the failed calls are missing evidence (deferred), the judged one promoted
            decided = world.tick_gate()
            world.until(lambda: len(q.decisions(store)) >= 1 + len(decided), "the decisions in the log")
            by = {d["scenario_id"]: d for d in decided}
            for b in MISBEHAVING:
                assert by[ids[b]]["envelope"]["event_type"] == "Deferred", b
                assert by[ids[b]]["reason"].startswith("semantic judge did not run: failed call"), b
            assert by[ids["good"]]["envelope"]["event_type"] == "Promoted"
            assert by[BASE_ID]["envelope"]["event_type"] == "Retired"
            assert world.tick_gate() == [] and world.new_gate() and world.tick_gate() == []  # deferred once
            assert world.dead_letters() == []
        finally:
            world.stop()


class LandsBetween:
    """The evidence store, with a batch of events landing right after the first of the worker's two
    reads of where a candidate's seeds stand (what is in flight, what has ended), whichever it
    makes first: the sink's timing, made deterministic."""

    READS = ("ARRAY JOIN r.seeds", "argMax(episode_id, k)")  # in_flight_seeds, trials

    def __init__(self, store, landing: list[dict]):
        self._store, self._landing = store, landing

    def __getattr__(self, name):
        return getattr(self._store, name)

    def query(self, sql, *args, **kw):
        rows = self._store.query(sql, *args, **kw)
        if self._landing and any(marker in sql for marker in self.READS):
            store_events(self._store, self._landing)
            self._landing = []
        return rows


class RecordingPublisher(Publisher):
    def __init__(self, *args):
        super().__init__(*args)
        self.events: list[dict] = []

    def publish(self, event: dict) -> None:
        self.events.append(event)
        super().publish(event)


def test_episodes_ending_between_the_workers_reads_are_not_asked_for_again(tansu, store, tmp_path):
    """Seeds 2-4 of the first look end while the worker reads the log: they must count as in flight
    or as ended, never as neither (which asked for them again, timing-dependent, in real runs)."""
    prefix = f"b{uuid.uuid4().hex[:10]}."
    ensure_topics(tansu, prefix)
    log = EvidenceLog()
    for model, kind in MODELS.items():
        log.register(model, kind)
    log.candidate(BASE, "", "base", generator="base")
    log.promoted(BASE, 1)
    for model in RANKED:
        request = log.request(BASE, model, list(range(2 * LOOK)))
        for seed in range(2 * LOOK):
            log.episode(model, BASE, seed, True, request_id=request)
    candidate = make_event("CandidateProposed", (GOOD_ID,), "mutator", "test", event_time=log.clock,
                           scenario_id=GOOD_ID, parent_scenario_id=BASE_ID, operator="material", params={},
                           source_cluster_id="fc-1", scenario=GOOD, mutator_version="test", factor="friction",
                           generator="failure-guided", cycle_id="c1", feasibility_json="{}")
    config = CriticsConfig()
    look1 = [validation_request(candidate, GOOD, m, list(range(LOOK)), config.oracle_keyframe_every
                                if m == "oracle" else 0, config.run_id) for m in ("oracle", *RANKED)]
    responder = Responder(tansu, prefix, {GOOD_ID: harder_for("weak")}, KeyframeStore(tmp_path), Codec())
    served = {r["request_id"]: [responder.episode(r, s) for s in range(LOOK)] for r in look1}
    started_only = [e for r in look1 for eps in served[r["request_id"]][2:] for e in eps
                    if e["envelope"]["event_type"] == "EpisodeStarted"]
    the_rest = [e for r in look1 for eps in served[r["request_id"]][2:] for e in eps
                if e["envelope"]["event_type"] != "EpisodeStarted"]
    store_events(store, [*log.events, candidate, *look1, *started_only,
                         *(e for r in look1 for eps in served[r["request_id"]][:2] for e in eps)])

    publisher = RecordingPublisher(make_producer(tansu), prefix, Codec())
    worker = CriticsWorker(None, publisher, LandsBetween(store, the_rest), Codec(), config, prefix)
    pending = _Pending(candidate, (f"{prefix}scenarios.candidates", 0), 0)
    assert worker.advance(pending) is False
    publisher.flush()
    asked = sorted((e["model_id"], tuple(e["seeds"])) for e in publisher.events)
    # the first look complete: the second is asked for, and nothing of the first again
    assert asked == sorted((m, tuple(range(LOOK, 2 * LOOK))) for m in ("oracle", *RANKED))


def test_a_registered_model_no_rollout_worker_serves_is_left_out_of_validation(tansu, store, tmp_path):
    """A stray ModelRegistered (a model not in the registry file the rollout workers serve) is left
    out of the validation arms: its rollouts would be refused, and the candidate waited forever (a
    `run` sat at "validating" for minutes with no word)."""
    prefix = f"g{uuid.uuid4().hex[:10]}."
    ensure_topics(tansu, prefix)
    log = EvidenceLog()
    for model, kind in MODELS.items():
        log.register(model, kind)
    log.register("ghost-model", "scripted")
    log.candidate(BASE, "", "base", generator="base")
    log.promoted(BASE, 1)
    candidate = make_event("CandidateProposed", (GOOD_ID,), "mutator", "test", event_time=log.clock,
                           scenario_id=GOOD_ID, parent_scenario_id=BASE_ID, operator="material", params={},
                           source_cluster_id="fc-1", scenario=GOOD, mutator_version="test", factor="friction",
                           generator="failure-guided", cycle_id="c1", feasibility_json="{}")
    store_events(store, [*log.events, candidate])
    asked = {}
    for served in (None, frozenset(MODELS)):
        publisher = RecordingPublisher(make_producer(tansu), prefix, Codec())
        worker = CriticsWorker(None, publisher, store, Codec(), CriticsConfig(served_models=served), prefix)
        assert worker.advance(_Pending(candidate, (f"{prefix}scenarios.candidates", 0), 0)) is False
        publisher.flush()
        asked[served] = {e["model_id"] for e in publisher.events if e["envelope"]["event_type"] == "RolloutRequested"}
    assert "ghost-model" in asked[None]  # without the registry file's word, every registered model is an arm
    assert asked[frozenset(MODELS)] == set(MODELS), asked
