"""report, diff and status through the pipeline's store endpoint (RemoteStore), the way they run
while `sepa-eval up` owns the embedded store: in process against consumers.evidence.endpoint.serve,
and as sepa-eval processes that find the endpoint in the memory dir's run state (served here by the
test process, which owns the session's chDB)."""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import read_world as world
from evidence_factory import store_events

from consumers import state as bs
from consumers.diff import compare_models
from consumers.evidence.endpoint import RemoteStore, serve
from consumers.report_data import gather

ROOT = Path(__file__).resolve().parents[2]
RANKING = ["strong", "medium", "weak"]


@pytest.fixture
def served(store):
    store_events(store, world.build().events)
    server = serve(store)
    try:
        yield store, RemoteStore(f"http://127.0.0.1:{server.server_port}", store.database)
    finally:
        server.shutdown()
        server.server_close()


def test_the_read_side_answers_the_same_through_the_endpoint(served):
    direct, remote = served
    assert bs.derived_state(remote) == bs.derived_state(direct)
    assert bs.memory_figures(remote) == bs.memory_figures(direct)
    through, here = gather(remote, ranking=RANKING), gather(direct, ranking=RANKING)
    assert replace(through, generated_at=here.generated_at) == here
    assert compare_models(remote, "strong", "weak@1") == compare_models(direct, "strong", "weak@1")


def _sepa(memory: Path, database: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPA_")} | {"SEPA_LIBERO_WORKER": "false"}
    env["SEPA_CLICKHOUSE_DATABASE"] = database
    return subprocess.run([sys.executable, "-m", "infra.cli", "--memory-dir", str(memory), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_status_report_and_diff_processes_reach_the_store_through_the_endpoint(served, tmp_path):
    direct, remote = served
    memory = tmp_path / "memory"
    (memory / "run").mkdir(parents=True)
    # what `sepa-eval up` leaves behind: the pipeline's pid and its endpoint. A sleeping process whose
    # command line carries the pipeline's marker stands in for it (`up` checks the marker, not just the pid).
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "infra.pipeline"])
    try:
        (memory / "run" / "state.json").write_text(json.dumps({"pipeline_pid": stand_in.pid, "store_url": remote.url}))
        _read_through_the_endpoint(memory, direct, remote, tmp_path, stand_in.pid)
    finally:
        stand_in.kill()
        stand_in.wait()


def _read_through_the_endpoint(memory, direct, remote, tmp_path, pipeline_pid: int) -> None:
    status = _sepa(memory, direct.database, "status", "--json")
    assert status.returncode == 0, status.stderr
    figures = json.loads(status.stdout)
    assert (figures["pipeline"]["pid"], figures["pipeline"]["store"]) == (pipeline_pid, remote.url)
    assert figures["memory"]["episodes"] == 160 and figures["memory"]["benchmark_version"] == 3
    assert figures["memory"]["model_versions"] == {m: "1" for m in world.MODELS}
    report = _sepa(memory, direct.database, "report", "--output", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    assert "| v3 | 1 | strong | weak |" in (tmp_path / "report" / "report.md").read_text()
    diff = _sepa(memory, direct.database, "diff", "strong@1", "weak", "--seeds", "all", "--json")
    assert diff.returncode == 0, diff.stderr
    assert json.loads(diff.stdout)["regressions"] == ["scn-slip"]
    assert not (memory / "evidence").exists()  # nothing opened a store of its own in the memory dir
