"""The memory dir on a tmpfs that a ballast file fills while the stack runs: the next `run` stops
with one line saying the disk is full; once there is space again, `up` and `status` work with no
manual step, and what the store held before the disk filled is still there. Needs root (mount);
CI runs as root."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from stack_helpers import processes_holding, sepa

SIZE = "256m"


def fill(directory) -> None:
    """Writes a ballast file until the disk under ``directory`` is full."""
    chunk = b"\0" * (1 << 20)
    with open(directory / "ballast", "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
    with open(directory / "ballast-tail", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        for pid in processes_holding(mount):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow  # up, a run until it meets the full disk, then status, up, a rollout and down: ~3 min
@pytest.mark.timeout(1200)
def test_a_full_disk_is_named_and_once_space_is_back_up_works_with_the_data_kept(small_disk):
    memory_dir = small_disk / "m"
    try:
        assert sepa(memory_dir, "up").returncode == 0
        first = sepa(memory_dir, "rollout", "--model", "oracle", "--episodes", "1", "--horizon", "30")
        assert first.returncode == 0, first.stdout + first.stderr
        fill(small_disk)
        result = sepa(memory_dir, "run", "--cycles", "1", "--sweep-seeds", "4", "--max-candidates", "1",
                      "--timeout", "300", timeout=900)
        assert result.returncode == 1, result.stdout[-2000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "out of disk space" in lines[0], result.stderr[-3000:]
        sepa(memory_dir, "down")
        (small_disk / "ballast").unlink()
        (small_disk / "ballast-tail").unlink()

        before = json.loads(sepa(memory_dir, "status", "--json").stdout)["evidence"]
        assert "error" not in before, before
        assert before["rollout_episodes"] >= 2, "the episode stored before the disk filled"
        up = sepa(memory_dir, "up")
        assert up.returncode == 0, up.stdout + up.stderr
        after = json.loads(sepa(memory_dir, "status", "--json").stdout)["evidence"]
        assert all(after[table] >= n for table, n in before.items()), (before, after)
        rollout = sepa(memory_dir, "rollout", "--model", "oracle", "--episodes", "1", "--horizon", "30")
        assert rollout.returncode == 0, rollout.stdout + rollout.stderr
    finally:
        sepa(memory_dir, "down")
