"""`sepa-eval eval --model M [--ci]` against a real broker, the real evidence sink, a real rollout
worker (one simulator process, in a thread here) and a real chDB store: the model's sweeps over the
active benchmark, success per scenario with intervals, and with --ci exit 1 on a significant
regression against its previous version on the same benchmark version (paired on seeds, Holm),
naming the scenario; exit 0 with a note when there is no previous version; bad input exit 2."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from cli_in_process import StandIns, cli_env, sepa
from confluent_kafka import Consumer
from evidence_factory import EvidenceLog, store_events
from sinks import make_sink

from consumers import state as q
from infra import processes
from infra.kafka_clients import consumer_config, ensure_topics, make_producer, producer_config
from producers.publisher import Publisher
from producers.rollout_worker import GROUP_ID, MAX_POLL_INTERVAL_MS, RolloutPool, RolloutWorker
from producers.seeds import held_out_seeds
from schemas.codec import Codec
from schemas.events import utc_now
from schemas.scenario import ScenarioSpec

SEEDS = 6  # 6 of 6 discordant pairs: exact McNemar p = 2 * 0.5**6 = 0.031 < 0.05
# 30 control steps: no policy lifts and holds the cube that fast, so the new version fails every seed.
HORIZON = 30
MODELS = """models:
  - model_id: oracle
    version: "1"
    kind: oracle
    rank: 0
    skill: {}
  - model_id: m
    version: "2"
    kind: scripted
    skill: {target_noise_m: 0.004, action_noise: 0.1}
"""


@pytest.fixture
def stack(tansu, store, tmp_path):
    prefix = f"e{uuid.uuid4().hex[:10]}."
    ensure_topics(tansu, prefix)
    models = tmp_path / "models.yaml"
    models.write_text(MODELS)
    stop = threading.Event()
    sink = make_sink(store, tansu, prefix)
    pool = RolloutPool(producer_config(tansu), prefix, Codec(), tmp_path / "kf", processes=1, models_path=models)
    consumer = Consumer(consumer_config(tansu, GROUP_ID, 6000, **{"max.poll.interval.ms": MAX_POLL_INTERVAL_MS}))
    worker = RolloutWorker(pool, consumer, Publisher(make_producer(tansu), prefix), Codec())
    threads = [threading.Thread(target=sink.run, args=(stop,), daemon=True),
               threading.Thread(target=worker.run, args=(stop,), daemon=True)]
    for t in threads:
        t.start()
    memory = tmp_path / "m"
    stand_ins = StandIns(memory)
    stand_ins.start(processes.PIPELINE, processes.ROLLOUT)
    yield memory, cli_env(tansu, prefix, store, models), worker
    stand_ins.stop()
    stop.set()
    for t in threads:
        t.join(timeout=30)
    pool.close()


def one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_eval_sweeps_the_model_and_ci_fails_on_a_regression_against_its_previous_version(stack, store):
    memory, env, worker = stack
    unknown = sepa(memory, env, "eval", "--model", "nobody")
    assert unknown.exit_code == 2 and "'nobody' is not in the model registry" in one_line(unknown)
    empty = sepa(memory, env, "eval", "--model", "m")
    assert empty.exit_code == 2 and "there is no active benchmark" in one_line(empty)

    # the active benchmark, and m's previous version, which solved it on every seed an hour ago
    scenario = ScenarioSpec(env_name="Lift", horizon=HORIZON, instruction="lift the cube").to_dict()
    log = EvidenceLog(start=utc_now() - timedelta(hours=1))
    log.promoted(scenario, 1)
    for seed in held_out_seeds(SEEDS):  # eval measures on held-out seeds, as the loop does
        log.episode("m", scenario, seed, success=True, model_version="1")
    store_events(store, log.events)

    result = sepa(memory, env, "eval", "--model", "m", "--seeds", str(SEEDS), "--ci")
    assert result.exit_code == 1, result.output
    sid = scenario["scenario_id"]
    assert "m@2 on benchmark v1" in result.stdout and "0/6 = 0.00 [0.00, 0.39]" in result.stdout
    assert f"regression against m@1 (Holm, family-wise alpha 0.05) on: {sid}" in result.stdout
    trials = q.trials(store, model_ids=["m"], model_versions=q.ALL_VERSIONS)
    assert sorted((t.model_version, t.seed, t.success) for t in trials if t.model_version == "2") == [
        ("2", s, False) for s in held_out_seeds(SEEDS)]
    assert [m.version for m in q.models(store) if m.model_id == "m"] == ["2"]  # eval registered what it ran

    served = worker.served
    again = sepa(memory, env, "eval", "--model", "m", "--seeds", str(SEEDS))
    assert again.exit_code == 0 and "0/6" in again.stdout  # without --ci a regression is printed, not failed
    assert worker.served == served  # the sweep ran already: not asked for again

    first = sepa(memory, env, "eval", "--model", "oracle", "--seeds", "2", "--ci")
    assert first.exit_code == 0, first.output
    assert "no previous version of oracle has episodes on benchmark v1: nothing to compare with" in first.stdout
