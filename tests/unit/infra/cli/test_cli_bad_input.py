"""Bad input to `sepa-eval rollout` exits 2 with one line naming what was wrong, before anything
is started or published (it used to print a raw `[Errno 2]` and exit 1)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize(("args", "said"), [
    (["--scenario", "/nonexistent.json"], "error: --scenario /nonexistent.json: cannot read it (No such file"),
    (["--scenario", "{not_json}"], "not a JSON document"),
    (["--scenario", "{no_keys}"], "not a scenario: scenario is missing required keys ['horizon', 'instruction']"),
    (["--env", "Nope"], "error: --env: robosuite task must be one of ['Lift', 'Stack', 'PickPlaceCan'], got 'Nope'"),
])
def test_rollout_refuses_bad_input_in_one_line_with_exit_2(tmp_path, args, said):
    (tmp_path / "not_json").write_text("lift the cube")
    (tmp_path / "no_keys").write_text('{"env_name": "Lift"}')
    args = [a.format(not_json=tmp_path / "not_json", no_keys=tmp_path / "no_keys") for a in args]
    result = subprocess.run([sys.executable, "-m", "infra.cli", "--memory-dir", str(tmp_path / "m"), "rollout",
                             "--model", "oracle", *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "COLUMNS": "40", "HOME": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], result.stderr  # one line, whatever the terminal's width
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir()), "nothing was started"


def test_run_refuses_an_unknown_generator_in_one_line_before_starting_anything(tmp_path):
    result = subprocess.run([sys.executable, "-m", "infra.cli", "--memory-dir", str(tmp_path / "m"), "run",
                             "--generator", "nonsense"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "COLUMNS": "40", "HOME": str(tmp_path)})
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: --generator must be one of failure-guided, blind, coverage, got 'nonsense'"], \
        result.stderr
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir()), "nothing was started"


def test_run_refuses_a_budget_below_one_in_one_line_before_starting_anything(tmp_path):
    result = subprocess.run([sys.executable, "-m", "infra.cli", "--memory-dir", str(tmp_path / "m"), "run",
                             "--budget", "0"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "COLUMNS": "40", "HOME": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    # click's usage error: the usage, where to find help, then the error on one line at any width
    said = result.stderr.strip().splitlines()[-1]
    assert said == "Error: Invalid value for '--budget': Input should be greater than or equal to 1", result.stderr
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir()), "nothing was started"
