"""What the venvs beside the project's share: LIBERO's (robosuite 1.4) and LeRobot's (Python 3.12,
torch) cannot live in the project's environment, so each is built under the cache dir from the
package registries, and processes in them get a small, explicit environment."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
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


def main(argv: list[str] | None, prog: str, at: Callable, build: Callable, check: Callable,
         error: type[Exception]) -> int:
    """``build | check | path`` of one side venv (``at(cache_root)`` locates it); exit 1 on ``error``."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("command", choices=("build", "check", "path"))
    parser.add_argument("--cache-root", type=Path, default=None)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            build(args.cache_root, force=args.force)
        elif args.command == "check":
            print(json.dumps(check(at(args.cache_root))))
        else:
            print(at(args.cache_root).python)
    except error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
