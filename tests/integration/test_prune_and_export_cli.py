"""The read-side housekeeping commands as a person runs them, each its own `sepa-eval` process on
one memory dir: sink the events from a real broker, export hard cases, prune, and `replay --verify`
from topics that still hold the pruned steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "consumers" / "exports"))
from hard_case_world import STEPS, with_kind, world_events  # noqa: E402
from test_hard_case_exports import check_lerobot_v3  # noqa: E402

from infra.kafka_clients import make_producer  # noqa: E402
from producers.publisher import Publisher  # noqa: E402

CLI = [sys.executable, "-m", "infra.cli"]


def _run(env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def memory(broker, prefix, tmp_path):
    world, events = world_events(tmp_path / "memory" / "keyframes", base_time=datetime.now(UTC))
    publisher = Publisher(make_producer(broker), prefix)
    for event in events:
        publisher.publish(event)
    publisher.flush()
    env = {**os.environ, "SEPA_BOOTSTRAP_SERVERS": broker, "SEPA_TOPIC_PREFIX": prefix,
           "SEPA_MEMORY_DIR": str(tmp_path / "memory")}
    sink = _run(env, "sink", "--until-idle", "4")
    assert sink.returncode == 0, sink.stderr[-2000:]
    return world, env, tmp_path


def test_export_prune_then_replay_verify(memory):
    world, env, tmp_path = memory
    exported = _run(env, "export-hard-cases", "--format", "lerobot", "--output", str(tmp_path / "lerobot"),
                    "--include-recovered")
    assert exported.returncode == 0, exported.stderr[-2000:]
    info = check_lerobot_v3(tmp_path / "lerobot")
    assert info["total_episodes"] == len(with_kind(world, "failed", "unanalysed_failed", "recovered"))

    dry = _run(env, "prune", "--older-than", "7d", "--dry-run")
    assert dry.returncode == 0 and "would free" in dry.stdout, dry.stdout + dry.stderr
    pruned = _run(env, "prune", "--older-than", "7d")
    assert pruned.returncode == 0 and "freed" in pruned.stdout, pruned.stdout + pruned.stderr

    # The broker still holds every step; the rebuilt store gets the prune re-applied.
    replay = _run(env, "replay", "--verify")
    assert replay.returncode == 0, replay.stdout + replay.stderr[-3000:]
    assert "identical" in replay.stdout

    jsonl = _run(env, "export-hard-cases", "--format", "jsonl", "--output", str(tmp_path / "jsonl"))
    assert jsonl.returncode == 0, jsonl.stderr[-2000:]
    lines = [json.loads(x) for x in (tmp_path / "jsonl" / "hard_cases.jsonl").read_text().splitlines()]
    assert any(not line["steps_complete"] and line["steps_stored"] == 0 for line in lines)
    assert all(line["steps_stored"] in (0, STEPS) for line in lines)


def test_bad_arguments_and_an_empty_memory_dir_give_clear_errors(tmp_path):
    env = {**os.environ, "SEPA_MEMORY_DIR": str(tmp_path / "empty")}
    empty = _run(env, "export-hard-cases", "--format", "jsonl", "--output", str(tmp_path / "out"))
    assert empty.returncode == 1 and "no episode in the evidence log matches" in empty.stderr
    assert "Traceback" not in empty.stderr
    nothing = _run(env, "prune", "--older-than", "30d")
    assert nothing.returncode == 0 and "nothing to prune" in nothing.stdout
    bad_age = _run(env, "prune", "--older-than", "thirty days")
    assert bad_age.returncode != 0 and "not an age" in bad_age.stderr
    bad_type = _run(env, "export-hard-cases", "--format", "jsonl", "--output", str(tmp_path / "o"),
                    "--failure-type", "wobble")
    assert bad_type.returncode == 1 and "unknown failure type 'wobble'" in bad_type.stderr
