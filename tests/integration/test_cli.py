"""The README's main job, as a user runs it: `sepa-eval run` on the embedded default, then
`status` (through the pipeline's endpoint), `down`, and `status` again (chDB opened directly)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sepa(memory_dir: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPA_")}
    return subprocess.run([sys.executable, "-m", "infra.cli", "--memory-dir", str(memory_dir), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_run_evaluates_models_in_simulation_and_the_streams_find_failures(tmp_path):
    try:
        result = sepa(tmp_path, "run", "--episodes", "1")
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        report = (tmp_path / "report.md").read_text()
        for model in ("oracle", "scripted-novice", "scripted-clumsy"):
            assert f"| {model} |" in report

        deadline = time.monotonic() + 90
        while True:
            status = json.loads(sepa(tmp_path, "status", "--json").stdout)
            if status["evidence"]["failure_moments"] > 0 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert status["pipeline"]["pid"] and status["streams"]["pid"] and status["broker"]["answering"]
        assert status["evidence"]["models_registry"] == 4
        assert status["evidence"]["rollout_episodes"] == 6  # 3 models x (started + ended)
        assert status["evidence"]["failure_moments"] > 0, "the clumsy model's failures were not detected"
    finally:
        down = sepa(tmp_path, "down")
    assert down.returncode == 0
    after = json.loads(sepa(tmp_path, "status", "--json").stdout)
    assert after["pipeline"]["pid"] is None and not after["broker"]["answering"]
    assert after["evidence"]["rollout_episodes"] == 6  # the log outlives the processes


def test_commands_without_a_broker_say_how_to_get_one(tmp_path):
    result = sepa(tmp_path, "synth", "--episodes", "1")
    assert result.returncode == 1
    assert "sepa-eval up" in result.stderr
