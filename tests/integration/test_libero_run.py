"""`sepa-eval run --benchmark libero` end to end: up with the LIBERO worker, the base from a
libero_object task, a sweep, the mutator's LIBERO candidates checked in the LIBERO venv, their
validation on the LIBERO worker, the gate's decisions, the report of the finished state."""

from __future__ import annotations

import json
import re

import pytest
from stack_helpers import clean_env, processes_holding, run_chdb, sepa

from producers.sim.models import DEFAULT_MODELS_PATH

RUN_TIMEOUT_S = 1500


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)  # ~10 min alone on 2 cores, ~17 beside another slow test
def test_run_on_libero_goes_round_the_loop_on_libero_scenarios_only(libero_venv, tmp_path):
    memory_dir = tmp_path / "m"
    # a registry of the user's own (one model renamed): the LIBERO worker must serve the one `up`
    # was given, as the robosuite worker does, or that model's LIBERO requests are refused
    models = tmp_path / "models.yaml"
    models.write_text(DEFAULT_MODELS_PATH.read_text().replace("model_id: scripted-expert", "model_id: my-expert"))
    env = clean_env(SEPA_LIBERO_WORKER="true", SEPA_MODELS_FILE=str(models))
    try:
        result = sepa(memory_dir, "run", "--benchmark", "libero", "--tasks", "0", "--cycles", "1",
                      "--sweep-seeds", "20", "--measure-seeds", "4", "--max-candidates", "1", env=env,
                      timeout=RUN_TIMEOUT_S)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        # demonstrations with pixels on two tasks of the suite, one request each, from one command
        demos = sepa(memory_dir, "rollout", "--model", "oracle", "--benchmark", "libero", "--tasks", "0,1",
                     "--episodes", "1", "--seed", "100", "--cameras", "agentview,robot0_eye_in_hand",
                     "--camera-size", "32", env=env, timeout=600)
        assert demos.returncode == 0, demos.stdout[-3000:] + demos.stderr[-3000:]
        assert len(re.findall(r"oracle on scn-\w+: 1/1 successes", demos.stdout)) == 2, demos.stdout
    finally:
        sepa(memory_dir, "down", env=env)
    facts = json.loads(run_chdb(memory_dir, """
import json
from consumers import state as q
rows = store.query("SELECT DISTINCT scenario.benchmark, purpose FROM {database}.rollout_requests FINAL")
held_out = q.scores(store, version=q.current_version(store), seeds=q.HELD_OUT)
print(json.dumps({
    "measured": sorted({s.episodes + s.invalid for s in held_out}),
    "requested": sorted([b, p] for b, p in rows),
    "candidates": {c.scenario_id: c.status for c in q.candidates(store)},
    "answered": [c.answered for c in q.cycles(store)],
    "models": sorted({s.model_id for s in held_out}),
    "framed": store.query("SELECT uniqExact(episode_id) FROM {database}.rollout_steps FINAL "
                          "WHERE length(mapKeys(frames)) = 2")[0][0],
}))
"""))
    assert facts["answered"] == [True], facts
    assert "my-expert" in facts["models"] and "scripted-expert" not in facts["models"], facts["models"]
    assert facts["measured"] == [4], "every model measured on 4 held-out seeds of every active scenario"
    # every rollout of the run, sweeps and validation alike, was of a LIBERO scenario
    assert {b for b, _ in facts["requested"]} == {"libero"}, facts["requested"]
    # the critics validated LIBERO candidates; adhoc: the demonstrations
    assert {p for _, p in facts["requested"]} == {"sweep", "validation", "adhoc"}, facts["requested"]
    assert facts["framed"] == 2, "both demonstrations kept their cameras' frames at every step"
    assert len(facts["candidates"]) > 1, "the mutator proposed LIBERO candidates besides the base"
    assert [s for s, status in facts["candidates"].items() if status == "pending"] == [], facts["candidates"]
    assert "cycle 1:" in result.stdout and (memory_dir / "report.md").exists()
    assert processes_holding(memory_dir) == []
