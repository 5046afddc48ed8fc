"""Our LeRobot export, read and rebuilt by LeRobot 0.6.1 itself (in its own venv): the same files
its writer makes from the same frames and arrays (stats, episodes, info, data, videos byte for
byte), the stats its compute_episode_stats and aggregate_stats give, and frames its loader decodes
back close to the raw ones. tests/integration/lerobot_parity.py holds both halves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lerobot_parity  # noqa: E402


def test_lerobot_reads_and_rebuilds_our_export_as_its_own(lerobot_venv, chdb_store, tmp_path):
    lerobot_parity.export_both(tmp_path, chdb_store)
    proc = subprocess.run([str(lerobot_venv.python), lerobot_parity.__file__, "--lerobot-side", str(tmp_path)],
                          env=lerobot_venv.environ(), capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    failed = [line for line in proc.stdout.splitlines() if "FAIL" in line]
    assert proc.returncode == 0 and "all checks passed" in proc.stdout, (
        f"exit {proc.returncode}; {failed or proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    assert proc.stdout.count("  ok    ") >= 50  # every check ran (74 when written)
