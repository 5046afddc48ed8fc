"""The CLI as a user and a script run it: `up` (one at a time per memory dir, done only when
every child answers, a dead child named with its log), rollouts served by the rollout worker `up`
started, `status`, `down`; every command that needs the broker failing fast in one unwrapped line
that names it; and `run` evolving the benchmark for a cycle, reproducibly."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from stack_helpers import ROOT, clean_env, listening, processes_holding, run_chdb, sepa, sepa_command

BROKER_COMMANDS = (["topics"], ["synth", "--episodes", "1"], ["sync-models"], ["rollout", "--model", "oracle"],
                   ["replay"], ["sink"])
# Python's start, the CLI's imports and broker_timeout_s (5 s), on a busy 2-core machine.
FAIL_FAST_S = 30.0


@pytest.mark.parametrize("broker", ["unreachable", "embedded-not-running"])
def test_every_command_fails_fast_in_one_line_naming_the_broker(tmp_path, broker):
    memory_dir = tmp_path / "m"
    if broker == "unreachable":
        env, named = clean_env(SEPA_BOOTSTRAP_SERVERS="127.0.0.1:1"), "127.0.0.1:1"
        commands = [["up"], *BROKER_COMMANDS]
    else:
        env, named = clean_env(), f"embedded broker is not running under {memory_dir / 'run'}"
        commands = list(BROKER_COMMANDS)  # `up` would start one
    # A rebuild database that a failing replay must leave alone.
    run_chdb(memory_dir, "store.command('CREATE DATABASE IF NOT EXISTS sepa_rebuild')\n"
                         "store.command('CREATE TABLE sepa_rebuild.marker (x Int8) ENGINE = MergeTree ORDER BY x')")
    started = time.monotonic()
    running = [(c, subprocess.Popen(sepa_command(memory_dir, *c), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)) for c in commands]
    for command, process in running:
        out, errors = process.communicate(timeout=120)
        elapsed = time.monotonic() - started
        assert process.returncode == 1, (command, out, errors)
        assert elapsed < FAIL_FAST_S, f"{command} took {elapsed:.0f} s"
        lines = errors.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], (command, errors)
    assert not (memory_dir / "run" / "state.json").exists() or not json.loads(
        (memory_dir / "run" / "state.json").read_text()).get("pipeline_pid")

    status = sepa(memory_dir, "status", "--json", env=env, timeout=120)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["broker"]["answering"] is False and named in report["broker"]["error"]
    assert "marker" in run_chdb(memory_dir, "print(store.query('SHOW TABLES FROM sepa_rebuild'))")


def test_a_long_memory_dir_gives_one_unwrapped_unstyled_line(tmp_path):
    memory_dir = tmp_path.joinpath(*[f"a-rather-long-directory-name-{i}" for i in range(12)], "[red]x[/red]")
    result = sepa(memory_dir, "synth", env=clean_env(COLUMNS="40"), timeout=120)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "\x1b" not in result.stderr  # no terminal styling off a terminal
    assert f"{memory_dir / 'run'} (run `sepa-eval up`)" in result.stderr  # whole path, markup-like text as is


@pytest.mark.slow  # one of the default run's longest (README, Test)
def test_up_is_locked_waits_until_ready_and_its_rollout_worker_serves_requests(tmp_path):
    memory_dir = tmp_path / "m"
    try:
        # two `up` at once: one starts everything, the other waits for it and starts nothing
        ups = [subprocess.Popen(sepa_command(memory_dir, "up"), cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outputs = [p.communicate(timeout=300) for p in ups]
        assert [p.returncode for p in ups] == [0, 0], outputs
        said = sorted(out.split(" ", 1)[0] for out, _ in outputs)
        assert said == ["already", "started"], outputs
        assert len(re.findall(r"embedded broker \(pid", "".join(out for out, _ in outputs))) == 1

        status = json.loads(sepa(memory_dir, "status", "--json").stdout)
        assert status["broker"]["answering"]
        pids = {name: status[name]["pid"] for name in ("pipeline", "streams", "rollout_worker")}
        assert all(pids.values()), status
        assert listening(pids["streams"]) == [] and status["streams"]["web"] is None  # no faust web server

        unknown = sepa(memory_dir, "rollout", "--model", "nonexistent")
        assert unknown.returncode == 1 and "'nonexistent' is not in the model registry" in unknown.stderr

        # LIBERO's requests with no LIBERO worker up (this stack has it off): refused, not awaited
        libero = sepa(memory_dir, "rollout", "--model", "oracle", "--benchmark", "libero", "--tasks", "0")
        assert libero.returncode == 1, libero.stdout + libero.stderr
        said = libero.stderr
        assert "no LIBERO worker is running" in said or "LIBERO is not set up" in said, said

        rollout = sepa(memory_dir, "rollout", "--model", "scripted-novice", "--episodes", "2", "--horizon", "40")
        assert rollout.returncode == 0, rollout.stdout + rollout.stderr
        assert re.search(r"scripted-novice on scn-\w+: \d/2 successes", rollout.stdout), rollout.stdout
        served = re.findall(r"request (req-\w+): 2 episodes", (memory_dir / "run" / "rollout.log").read_text())
        assert len(served) == 1, "the rollout worker `up` started served the request"
        assert json.loads(sepa(memory_dir, "status", "--json").stdout)["evidence"]["rollout_episodes"] == 4

        # one request stored: the refused model published none
        assert json.loads(sepa(memory_dir, "status", "--json").stdout)["evidence"]["rollout_requests"] == 1
        again = sepa(memory_dir, "up")
        assert again.returncode == 0 and again.stdout.startswith("already running, nothing started")
    finally:
        down = sepa(memory_dir, "down")
    assert down.returncode == 0, down.stderr
    assert all(f"(pid {pid})" in down.stdout for pid in pids.values())
    assert processes_holding(memory_dir) == []  # no orphan: broker, pipeline, workers and simulators are gone
    after = json.loads(sepa(memory_dir, "status", "--json").stdout)
    assert not any(after[name]["pid"] for name in ("pipeline", "streams", "rollout_worker"))
    assert after["evidence"]["rollout_episodes"] == 4  # the log outlives the processes
    rollout = sepa(memory_dir, "rollout", "--model", "oracle", env=clean_env())
    assert rollout.returncode == 1 and "run `sepa-eval up`" in rollout.stderr


def test_up_names_a_child_that_dies_with_its_log_and_stops_what_it_started(tmp_path):
    memory_dir = tmp_path / "m"
    result = sepa(memory_dir, "up", env=clean_env(SEPA_CLICKHOUSE_URL="http://127.0.0.1:1"))
    assert result.returncode == 1
    assert re.match(r"error: the pipeline \(pid \d+\) exited with code 1 before it was ready; last lines of "
                    r"\S+pipeline.log:", result.stderr), result.stderr
    assert "cannot open evidence store http://127.0.0.1:1" in result.stderr  # the log's tail
    assert processes_holding(memory_dir) == []
    state = json.loads((memory_dir / "run" / "state.json").read_text())
    assert not any(state[k] for k in ("broker_pid", "pipeline_pid", "streams_pid", "rollout_pid")), state


# a stage that waits longer than --timeout fails the run naming what it waited for (a bare timeout of
# the command says nothing): 600 s is several times what any stage takes here
RUN_ARGS = ("run", "--cycles", "1", "--sweep-seeds", "20", "--max-candidates", "2", "--timeout", "600")
RUN_TIMEOUT_S = 900


def loop_facts(memory_dir: Path) -> dict:
    """What a finished `run` left in the evidence log (read after `down`)."""
    return json.loads(run_chdb(memory_dir, """
import json
from consumers import state as q
cycles = q.cycles(store)
candidates = [c for c in q.candidates(store) if c.generator != "base"]
print(json.dumps({
    "cycles": [[c.cycle_id, c.answered, list(c.proposed)] for c in cycles],
    "candidates": {c.scenario_id: c.status for c in candidates},
    # by version and id: their event times come from the episodes' wall clock, which differs run to run
    "decisions": sorted([d.event_type, d.scenario_id, d.benchmark_version, d.event_id]
                        for d in q.decisions(store, event_types=("Promoted", "Retired", "Rejected", "Deferred",
                                                                 "ReviewRequested"))),
    "validation_requests": sorted(r[0] for r in store.query(
        "SELECT DISTINCT request_id FROM {database}.rollout_requests FINAL WHERE purpose = 'validation'")),
    "episodes": store.query("SELECT count() FROM {database}.rollout_episodes FINAL "
                            "WHERE envelope.event_type = 'EpisodeEnded'")[0][0],
    "clusters": store.query("SELECT count() FROM {database}.failure_clusters FINAL "
                            "WHERE envelope.event_type = 'ClusterUpdated' AND size > 0")[0][0],
    "content_digest": q.content_digest(store),
    "content_state": q.content_state(store),
    "active": q.active_scenarios(store),
    "measured": {f"{s.model_id} {s.scenario_id}": s.episodes + s.invalid
                 for s in q.scores(store, version=q.current_version(store), seeds=q.HELD_OUT)},
    "held_out_intakes": store.query(
        "SELECT count() FROM {database}.failure_clusters FINAL WHERE envelope.event_type = 'ClusterAssigned' "
        "AND intake AND episode_id IN (SELECT episode_id FROM {database}.rollout_episodes FINAL "
        "WHERE envelope.event_type = 'EpisodeStarted' AND seed >= 1000000)")[0][0],
}))
"""))


def run_loop(memory_dir: Path) -> tuple[subprocess.CompletedProcess, dict, subprocess.CompletedProcess]:
    """`run --cycles 1` with small settings, then `status --json` and `replay --verify`, then `down`."""
    try:
        result = sepa(memory_dir, *RUN_ARGS, timeout=RUN_TIMEOUT_S)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        time.sleep(5)  # anything still on its way would land now
        status = json.loads(sepa(memory_dir, "status", "--json").stdout)
        replayed = sepa(memory_dir, "replay", "--verify", timeout=300)
    finally:
        sepa(memory_dir, "down")
    return result, status, replayed


@pytest.mark.slow  # one of the default run's longest (README, Test)
@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_run_evolves_the_benchmark_one_cycle_and_reports_what_the_log_holds(tmp_path):
    memory_dir = tmp_path / "m"
    result, status, replayed = run_loop(memory_dir)
    out = result.stdout
    report = (memory_dir / "report.md").read_text()
    counts = {t: int(n) for t, n in re.findall(r"^\| (\w+) \| (\d+) \|$", report, re.MULTILINE)}
    assert counts and counts == status["evidence"], "the report printed a moving state"
    assert replayed.returncode == 0 and "identical" in replayed.stdout, replayed.stdout + replayed.stderr

    facts = loop_facts(memory_dir)
    [(cycle_id, answered, proposed)] = facts["cycles"]
    assert cycle_id == "run-0-c1" and answered, facts["cycles"]
    assert proposed and sorted(proposed) == sorted(facts["candidates"]), "every proposed candidate is in the log"
    undecided = [sid for sid, status in facts["candidates"].items() if status == "pending"]
    assert undecided == [], f"candidates without a decision: {undecided}"
    promoted = sorted(sid for kind, sid, *_ in facts["decisions"] if kind == "Promoted" and sid in proposed)
    line = re.search(r"^cycle 1: (\d+) proposed .*; promoted (.*); retired (.*); benchmark v1 -> v(\d+);", out,
                     re.MULTILINE)
    assert line, out
    assert int(line.group(1)) == len(proposed)
    assert sorted(line.group(2).split(", ")) == (promoted or ["none"]), "the printed promotions are the log's"
    versions = sorted(v for kind, _, v, _ in facts["decisions"] if kind in ("Promoted", "Retired"))
    assert versions == list(range(1, len(versions) + 1)) and int(line.group(4)) == versions[-1]
    assert facts["clusters"] > 0, "a run with this many failures shows clusters"
    # the benchmark it left is measured on held-out seeds, which the clusterer passed over
    assert len(facts["measured"]) == 5 * len(facts["active"]) and set(facts["measured"].values()) == {20}, facts
    assert facts["held_out_intakes"] == 0
    assert "held-out seeds" in out, out
    timing = re.search(r"^loop wall time (\d+) s; its rollouts (\d+) s over 2 rollout processes; the loop's "
                       r"overhead beyond them (-?\d+)%$", out, re.MULTILINE)
    assert timing, out
    wall, rollouts = int(timing.group(1)), int(timing.group(2))
    assert 0 < rollouts <= wall + 1, timing.group(0)  # the processes' episodes fit in the loop's time
    assert "`sepa-eval down` stops it" in out, "run says the stack stays up and how to stop it"
    assert processes_holding(memory_dir) == []


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300)  # ~13 min beside another slow test on 2 cores
def test_two_runs_with_the_same_seed_promote_the_same_scenarios_with_the_same_versions(tmp_path):
    """What may vary between the two runs and what may not: the order in which the rollout worker's
    pool finishes episodes, and so the clusterer's output positions, vary; the candidates, the
    validation requests, every decision (ids, versions), the rollouts spent and every trial's
    outcome (the content digest `run` prints) do not."""
    facts, printed = [], []
    for name in ("first", "second"):
        result, _, _ = run_loop(tmp_path / name)
        facts.append(loop_facts(tmp_path / name))
        printed.append(re.search(r"^content digest ([0-9a-f]{64})$", result.stdout, re.MULTILINE).group(1))
    first, second = facts
    assert first["candidates"] == second["candidates"]
    assert first["decisions"] == second["decisions"], "same promotions, same versions, same decision ids"
    assert first["validation_requests"] == second["validation_requests"]
    assert first["episodes"] == second["episodes"], "the same rollouts spent"
    differing = {key: (value, second["content_state"].get(key)) for key, value in first["content_state"].items()
                 if second["content_state"].get(key) != value}
    assert differing == {}, f"the runs' content differs in {sorted(differing)}: {differing}"
    assert first["content_digest"] == second["content_digest"] == printed[0] == printed[1], \
        "run printed a content digest other than the log's after down"
