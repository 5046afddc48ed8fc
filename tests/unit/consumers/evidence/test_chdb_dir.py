"""A chDB directory after a crash on a full disk opens again with nothing done by hand, and an open
that fails says why (consumers/evidence/chdb_dir.py). Each open runs in a process of its own: chDB
lets one process open one directory."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]

OPEN = """
import sys, time
from pathlib import Path
from consumers.evidence.store import ClickHouseStore
from consumers.evidence.exceptions import StoreUnavailable
try:
    store = ClickHouseStore.connect(None, Path(sys.argv[1]), "sepa")
except StoreUnavailable as exc:
    print("refused:", exc)
    sys.exit(3)
if sys.argv[2] == "create":
    store.command("CREATE DATABASE IF NOT EXISTS sepa")
    store.command("CREATE TABLE sepa.kept (x Int64) ENGINE = MergeTree ORDER BY x")
    store.command("INSERT INTO sepa.kept VALUES (1), (2)")
    store.command("CREATE DATABASE IF NOT EXISTS sepa_sink_staging")
    store.command("CREATE TABLE sepa_sink_staging.steps_1 (x Int64) ENGINE = Memory")
elif sys.argv[2] == "hold":
    print("holding", flush=True)
    time.sleep(60)
print("rows", store.query("SELECT count() FROM sepa.kept")[0][0])
"""


def _open(path: Path, what: str = "read", **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", OPEN, str(path), what], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, **kw)


def test_empty_staging_definitions_left_by_a_full_disk_do_not_stop_the_store_from_opening(tmp_path):
    path = tmp_path / "evidence"
    assert _open(path, "create").returncode == 0
    staging = path / "metadata" / "sepa_sink_staging" / "steps_1.sql"
    assert staging.stat().st_size > 0
    staging.write_bytes(b"")  # what ENOSPC left: a definition cut to nothing
    opened = _open(path)
    assert opened.returncode == 0 and "rows 2" in opened.stdout, opened.stdout + opened.stderr
    assert not staging.exists()


def test_an_empty_definition_of_an_evidence_table_is_named_and_kept(tmp_path):
    path = tmp_path / "evidence"
    assert _open(path, "create").returncode == 0
    kept = path / "metadata" / "sepa" / "kept.sql"
    kept.write_bytes(b"")
    opened = _open(path)
    assert opened.returncode == 3, opened.stdout + opened.stderr
    assert "1 table definition(s) are empty, e.g." in opened.stdout and "kept.sql" in opened.stdout
    assert "another process" not in opened.stdout
    assert kept.exists()


def test_a_directory_held_by_another_process_says_so(tmp_path):
    path = tmp_path / "evidence"
    assert _open(path, "create").returncode == 0
    holder = subprocess.Popen([sys.executable, "-c", OPEN, str(path), "hold"], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "holding"
        opened = _open(path)
        assert opened.returncode == 3 and "another process owns this chDB directory" in opened.stdout, opened.stdout
    finally:
        holder.kill()
        holder.wait()
