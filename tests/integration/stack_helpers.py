"""Running `sepa-eval` as a user does, and looking at the processes it leaves (Linux /proc)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def clean_env(**extra: str) -> dict[str, str]:
    """Our environment without SEPA_* variables (and COLUMNS), plus ``extra``. The LIBERO worker is
    off: where LIBERO is set up (CI builds it) `up` would start it, and these tests are not about it
    (tests/integration/test_libero.py is)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPA_") and k != "COLUMNS"}
    return {**env, "SEPA_LIBERO_WORKER": "false", **extra}


def sepa_command(memory_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "infra.cli", "--memory-dir", str(memory_dir), *args]


def sepa(memory_dir: Path, *args: str, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(sepa_command(memory_dir, *args), cwd=ROOT, env=env or clean_env(), capture_output=True,
                          text=True, timeout=timeout)


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A = LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            # /proc/net/tcp prints the address as host-order 32-bit words
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def processes_holding(directory: Path) -> list[int]:
    """Pids (other than ours) with a file under ``directory`` open: what a stack there left running."""
    directory = str(directory.resolve())
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            targets = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue
        if any(t.startswith(directory + "/") for t in targets):
            pids.append(int(proc.name))
    return pids


def run_chdb(memory_dir: Path, code: str) -> str:
    """Python in a process of its own against the memory dir's chDB (one chDB directory per process)."""
    script = ("import sys\nfrom consumers.evidence.store import ClickHouseStore\n"
              f"store = ClickHouseStore.connect(None, __import__('pathlib').Path({str(memory_dir / 'evidence')!r}), "
              "'sepa')\n" + code)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout
