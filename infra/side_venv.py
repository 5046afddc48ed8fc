"""What the venvs beside the project's share: LIBERO's (robosuite 1.4) and LeRobot's (Python 3.12,
torch) cannot live in the project's environment, so each is built under the cache dir from the
package registries, and processes in them get a small, explicit environment."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# What a process in a side venv keeps of ours: the BLAS variables stay as the machine set them
# (older OpenBLAS builds crash or compute wrong results on some processors without them).
KEPT_ENVIRON = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def default_cache_root() -> Path:
    return Path.home() / ".cache" / "sepa-eval"


def base_environ() -> dict[str, str]:
    return {k: os.environ[k] for k in KEPT_ENVIRON if k in os.environ}


def run(cmd: list[str], what: str, log, error: type[Exception]) -> None:
    """Runs one build step; raises ``error`` with the command and the tail of its output."""
    log(f"{what}: {' '.join(cmd)}")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise error(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}")
