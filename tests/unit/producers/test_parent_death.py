"""A rollout worker killed with SIGKILL takes its pool with it (producers/parent_death.py): the pool
processes and multiprocessing's resource tracker used to be re-parented to init and live on with
their envs (~1.6 GB each)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WORKER = """
import os, sys
from pathlib import Path
from producers.rollout_worker import RolloutPool
from schemas.codec import Codec
pool = RolloutPool({"bootstrap.servers": "127.0.0.1:9"}, "t.", Codec(), Path(sys.argv[1]), processes=2)
[f.result() for f in [pool.executor.submit(os.getpid) for _ in range(4)]]  # both processes initialised
print(" ".join(map(str, sorted(pool.executor._processes))), flush=True)
sys.stdin.read()  # until killed
"""


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # ppid
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_pool_and_its_resource_tracker_die_with_a_killed_worker(tmp_path):
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[3])
    try:
        pool_pids = {int(p) for p in worker.stdout.readline().split()}
        assert len(pool_pids) == 2, pool_pids
        spawned = _children(worker.pid)
        assert pool_pids <= spawned and len(spawned) == 3, spawned  # the pool and the resource tracker
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in spawned) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in spawned if _alive(p)], "orphaned after the worker was killed"
    finally:
        if worker.poll() is None:
            worker.kill()
