"""Pool processes that do not outlive the worker that spawned them.

A rollout worker killed with SIGKILL (OOM killer, kill -9, a crashed host process) runs no
cleanup: its spawned pool processes (~1.6 GB each with their envs) and multiprocessing's resource
tracker were re-parented to init and survived ``up``, a rerun and ``down``. Linux can deliver a
signal to a process when its parent dies (prctl PR_SET_PDEATHSIG); a pool's initializer asks for
SIGKILL, so the kernel ends the pool with its worker, and the resource tracker, whose pipe the
pool held open too, then exits by itself.

    ProcessPoolExecutor(..., initializer=init, initargs=(os.getpid(), ...))
    def init(parent_pid, ...):
        die_with_parent(parent_pid)

(The signal fires when the *thread* that spawned the process ends; the pools spawn their
processes from the worker's main thread, at construction.)
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies; exits at once if the parent is already gone
    (it died before the request took effect). A no-op off Linux."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(errno)}")
    if os.getppid() != parent_pid:
        os._exit(1)
