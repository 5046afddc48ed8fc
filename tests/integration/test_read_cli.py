"""report, diff and status as a user runs them: on an empty memory dir, and on one holding a small
evolved benchmark (tests/integration/read_world.py, written by a child process: chDB lets one
process open one directory, and this one holds the test session's)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def sepa(memory_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPA_")} | {"SEPA_LIBERO_WORKER": "false"}
    return subprocess.run([sys.executable, "-m", "infra.cli", "--memory-dir", str(memory_dir), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def memory(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("memory")
    paths = [str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    subprocess.run([sys.executable, str(ROOT / "tests" / "integration" / "read_world.py"), str(path)], cwd=ROOT,
                   check=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)})
    return path


def test_an_empty_memory_dir_gives_a_clear_message_and_creates_nothing(tmp_path):
    empty = tmp_path / "nothing-here"
    report = sepa(empty, "report")
    assert report.returncode == 1 and "Traceback" not in report.stderr
    assert "no evidence under" in report.stderr and "sepa-eval run" in report.stderr
    diff = sepa(empty, "diff", "a", "b")
    assert diff.returncode == 2 and len(diff.stderr.strip().splitlines()) == 1
    status = sepa(empty, "status", "--json")
    assert status.returncode == 0 and "Traceback" not in status.stderr
    figures = json.loads(status.stdout)
    assert "no evidence under" in figures["evidence"]["error"] and figures["memory"] is None
    plain = sepa(empty, "status")
    assert plain.returncode == 0 and "no evidence under" in plain.stderr
    assert not empty.exists()


def test_status_prints_memory_and_evolution_figures(memory):
    result = sepa(memory, "status", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["evidence"]["rollout_episodes"] == 320
    figures = status["memory"]
    assert (figures["episodes"], figures["clusters"], figures["candidates"], figures["promotions"]) == (160, 1, 5, 2)
    assert figures["benchmark_version"] == 3 and figures["failures_by_type"] == {"slip": 31, "grasp_miss": 4}
    assert figures["funnel"]["failure-guided"]["rejected"] == 1 and figures["open_reviews"] == 1
    assert "error" in status["lag"]  # no broker here: the lag says why it is missing
    text = sepa(memory, "status")
    assert "benchmark v3" in text.stdout and "slip 31" in text.stdout


def test_report_writes_markdown_html_and_figures(memory, tmp_path):
    out = tmp_path / "report"
    result = sepa(memory, "report", "--output", str(out), "--ranking", "strong,medium,weak")
    assert result.returncode == 0, result.stderr
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    assert "| v3 | 1 | strong | weak | 60% | 1 / 3 | 1.00 |" in (out / "report.md").read_text()
    assert (out / "report.html").stat().st_size < 5 * 1024 * 1024


def test_diff_verdicts_and_exit_codes(memory):
    # the world holds selection seeds only: diff reads held-out seeds unless told, and says so
    held_out = sepa(memory, "diff", "strong", "weak")
    assert held_out.returncode == 2
    assert "model 'strong' has no episodes in the evidence log on held-out seeds" in held_out.stderr
    regression = sepa(memory, "diff", "strong", "weak", "--seeds", "all", "--fail-on-regression")
    assert regression.returncode == 1, regression.stdout + regression.stderr
    assert "significant regressions (Holm, family-wise alpha 0.05): scn-slip" in regression.stdout
    assert sepa(memory, "diff", "strong", "weak", "--seeds", "all").returncode == 0  # reported, not failed
    improvement = sepa(memory, "diff", "weak", "strong", "--seeds", "selection", "--fail-on-regression", "--json")
    assert improvement.returncode == 0
    verdict = json.loads(improvement.stdout)
    (slip,) = verdict["scenarios"]
    assert (slip["scenario_id"], slip["test"], slip["pairs"], slip["verdict"]) == ("scn-slip", "mcnemar", 20,
                                                                                  "improvement")
    assert (slip["a_only_successes"], slip["b_only_successes"]) == (0, 12)
    assert slip["p_value"] == pytest.approx(2 / 2 ** 12) and verdict["correction"].startswith("Holm")
    # On v1 (the saturated base) the strong and weak models are not told apart.
    v1 = json.loads(sepa(memory, "diff", "strong", "weak", "--version", "1", "--seeds", "all", "--json").stdout)
    assert v1["regressions"] == [] and v1["scenarios"][0]["verdict"] == "no significant difference"


@pytest.mark.parametrize("args,needle", [(("strong", "nobody"), "model 'nobody' has no episodes"),
                                         (("strong", "strong"), "two different models"),
                                         (("strong", "weak", "--version", "9"), "version 9 does not exist"),
                                         (("strong", "weak", "--seeds", "fresh"), "--seeds must be held-out")])
def test_diff_bad_input_exits_2_with_one_line(memory, args, needle):
    result = sepa(memory, "diff", *args, *(() if "--seeds" in args else ("--seeds", "all")))
    assert result.returncode == 2
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
