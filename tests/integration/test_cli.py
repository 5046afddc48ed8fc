"""The CLI as a user and a script run it: `up` (one at a time per memory dir, done only when
every child answers, a dead child named with its log), rollouts served by the rollout worker `up`
started, `status`, `down`; every command that needs the broker failing fast in one unwrapped line
that names it; and `run` reporting a finished state."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from stack_helpers import ROOT, clean_env, listening, processes_holding, sepa, sepa_command

BROKER_COMMANDS = (["topics"], ["synth", "--episodes", "1"], ["sync-models"], ["rollout", "--model", "oracle"],
                   ["replay"], ["sink"])
# Python's start, the CLI's imports and broker_timeout_s (5 s), on a busy 2-core machine.
FAIL_FAST_S = 30.0


def run_chdb(memory_dir: Path, code: str) -> str:
    """Python in a process of its own against the memory dir's chDB (one chDB directory per process)."""
    script = ("import sys\nfrom consumers.evidence.store import ClickHouseStore\n"
              f"store = ClickHouseStore.connect(None, __import__('pathlib').Path({str(memory_dir / 'evidence')!r}), "
              "'sepa')\n" + code)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


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


def failure_analysis_is_emitted() -> bool:
    """`run` waits for EpisodeAnalysed (detector) and intake ClusterAssigned (clusterer) events."""
    sources = " ".join(p.read_text() for p in (ROOT / "streams" / "failures").glob("*.py"))
    return '"EpisodeAnalysed"' in sources and "intake=" in sources


@pytest.mark.skipif(not failure_analysis_is_emitted(),
                    reason="the detector does not emit EpisodeAnalysed and the clusterer no intake ClusterAssigned "
                           "yet (detector and clusterer branches); `run` waits for both")
def test_run_reports_a_finished_state_with_clusters(tmp_path):
    memory_dir = tmp_path / "m"
    try:
        result = sepa(memory_dir, "run", "--episodes", "4", timeout=900)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        report = (memory_dir / "report.md").read_text()
        for model in ("oracle", "scripted-novice", "scripted-clumsy"):
            assert f"| {model} |" in report
        counts = {t: int(n) for t, n in re.findall(r"^\| (\w+) \| (\d+) \|$", report, re.MULTILINE)}
        time.sleep(10)  # anything still on its way would land now
        status = json.loads(sepa(memory_dir, "status", "--json").stdout)
        assert counts == status["evidence"], "the report printed a moving state"
        assert counts["rollout_episodes"] == 24 and counts["failure_episodes"] == 12 and counts["failure_moments"] > 0
    finally:
        sepa(memory_dir, "down")
    clusters = run_chdb(memory_dir, "print(store.query(\"SELECT count() FROM sepa.failure_clusters FINAL WHERE "
                                    "envelope.event_type = 'ClusterUpdated' AND size > 0\")[0][0])")
    assert int(clusters) > 0, "a run with this many failures shows clusters"
