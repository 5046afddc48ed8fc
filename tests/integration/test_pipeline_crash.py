"""kill -9 of the pipeline (the embedded store's owner): `up` starts a new one on a new port, and the
processes that reach the store through its endpoint (streams worker, critics) start afresh with
it instead of retrying the dead one's port forever; the rollout worker, which does not, is left
alone. The stack then serves and stores as before."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from stack_helpers import processes_holding, sepa


def _pids(memory_dir) -> dict:
    status = json.loads(sepa(memory_dir, "status", "--json").stdout)
    return {name: status[name]["pid"] for name in ("pipeline", "streams", "rollout_worker", "critics")}


@pytest.mark.slow  # two `up`s and a `down`: ~3 min
def test_up_after_the_pipeline_died_restarts_what_asked_it_and_the_stack_serves(tmp_path):
    memory_dir = tmp_path / "m"
    try:
        assert sepa(memory_dir, "up").returncode == 0
        before = _pids(memory_dir)
        assert all(before.values()), before
        os.kill(before["pipeline"], signal.SIGKILL)
        time.sleep(1)

        again = sepa(memory_dir, "up")
        assert again.returncode == 0, again.stdout + again.stderr
        after = _pids(memory_dir)
        assert all(after.values()), after
        changed = {name for name in before if before[name] != after[name]}
        assert changed == {"pipeline", "streams", "critics"}, (before, after)
        for name in ("streams", "critics"):
            assert f"(pid {after[name]})" in again.stdout, again.stdout

        rollout = sepa(memory_dir, "rollout", "--model", "scripted-novice", "--episodes", "1", "--horizon", "30")
        assert rollout.returncode == 0, rollout.stdout + rollout.stderr
        assert json.loads(sepa(memory_dir, "status", "--json").stdout)["evidence"]["rollout_episodes"] == 2
        # the sweeper reads the store for every registration: through the new pipeline
        offset = (memory_dir / "run" / "streams.log").stat().st_size
        assert sepa(memory_dir, "sync-models").returncode == 0
        time.sleep(5)
        since = (memory_dir / "run" / "streams.log").read_text()[offset:]
        assert "did not answer" not in since and "is not running" not in since, since[-2000:]
    finally:
        sepa(memory_dir, "down")
    assert processes_holding(memory_dir) == []
