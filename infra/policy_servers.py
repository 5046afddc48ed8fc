"""The policy servers of registered learned policies, started by `up` and stopped by `down`.

    wanted = local_policies(load_models(settings.models_file))   # websocket models with a policy: DIR on this host
    pids = start_policy_servers(settings, wanted)                # model_id -> pid; waits until each answers
    stop_policy_servers(pids)

A models.yaml entry of kind websocket that names a trained ``policy`` directory and a ``uri`` on
127.0.0.1 (or localhost) is one we can serve ourselves: `up` starts ``producers.learned.server``
for it in the LeRobot venv, on the uri's port and host, each in a session of its own with its log
at ``<memory_dir>/run/policy-<model_id>.log``, and returns once every one accepts connections.
A uri that already answers is someone else's server (a `sepa-eval lerobot serve` of the user's):
it is left alone and not started again. A server on another host is the user's to run.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from infra.embedded_broker import stop_pid
from infra.exceptions import LeRobotSetupError, PipelineError
from infra.lerobot_venv import LeRobotVenv
from infra.processes import POLICY_SERVER_MARKER as MARKER
from infra.processes import is_running
from infra.settings import Settings
from producers.sim.models import WEBSOCKET, ModelConfig

ROOT = Path(__file__).resolve().parents[1]
LOCAL_HOSTS = ("127.0.0.1", "localhost")
READY_TIMEOUT_S = 60.0  # importing torch and loading the weights takes ~5 s here
STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ServedPolicy:
    model_id: str
    policy: Path
    host: str
    port: int

    @property
    def uri(self) -> str:
        return f"ws://{self.host}:{self.port}"


def local_policies(models: Iterable[ModelConfig]) -> list[ServedPolicy]:
    """The registered learned policies whose server is ours to start: kind websocket, a policy
    directory, and a ws:// uri with a port on this host."""
    out = []
    for m in models:
        if m.kind != WEBSOCKET or m.policy is None or m.uri is None:
            continue
        parts = urlsplit(m.uri)
        if parts.scheme != "ws" or parts.hostname not in LOCAL_HOSTS or parts.port is None:
            continue
        out.append(ServedPolicy(m.model_id, Path(m.policy).expanduser(), parts.hostname, parts.port))
    return out


def log_path(settings: Settings, model_id: str) -> Path:
    return settings.run_dir / f"policy-{model_id}.log"


def answers(host: str, port: int, timeout: float = 0.5) -> bool:
    """Something accepts connections there."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def start_policy_servers(settings: Settings, wanted: list[ServedPolicy], running: dict[str, int] | None = None,
                         venv: LeRobotVenv | None = None, timeout_s: float = READY_TIMEOUT_S) -> dict[str, int]:
    """Starts a server for each of ``wanted`` not in ``running`` (model_id -> pid of a server we
    started before) whose uri does not answer yet; returns model_id -> pid of those it started,
    once each accepts connections. Raises (and stops what it started) when the LeRobot venv is
    missing, or a server exits or stays silent past ``timeout_s``, naming it and its log's tail."""
    running = running or {}
    todo = [p for p in wanted if not is_running(running.get(p.model_id), MARKER) and not answers(p.host, p.port)]
    if not todo:
        return {}
    venv = venv or LeRobotVenv.at()
    if not venv.ready():
        raise LeRobotSetupError(f"models {', '.join(p.model_id for p in todo)} are learned policies served here, and "
                                f"LeRobot is not set up at {venv.root}: run `sepa-eval lerobot setup`")
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    started: dict[str, tuple[subprocess.Popen, ServedPolicy]] = {}
    try:
        for p in todo:
            with open(log_path(settings, p.model_id), "ab") as log:
                started[p.model_id] = (subprocess.Popen(
                    [str(venv.python), "-m", MARKER, "--policy", str(p.policy), "--host", p.host, "--port",
                     str(p.port)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, cwd=ROOT, env=venv.environ(ROOT)), p)
        deadline = time.monotonic() + timeout_s
        waiting = dict(started)
        while waiting:
            for model_id, (process, p) in list(waiting.items()):
                if process.poll() is not None:
                    raise PipelineError(f"the policy server of {model_id} ({p.policy}) exited with code "
                                        f"{process.returncode} at start: {_tail(log_path(settings, model_id))}")
                if answers(p.host, p.port):
                    del waiting[model_id]
            if waiting and time.monotonic() > deadline:
                raise PipelineError(f"the policy server of {', '.join(waiting)} did not answer within {timeout_s:g} s: "
                                    f"{_tail(log_path(settings, next(iter(waiting))))}")
            time.sleep(0.2)
    except BaseException:
        stop_policy_servers({m: process.pid for m, (process, _) in started.items()})
        raise
    return {m: process.pid for m, (process, _) in started.items()}


def stop_policy_servers(pids: dict[str, int], timeout_s: float = STOP_TIMEOUT_S) -> list[str]:
    """Stops the servers we started (SIGTERM, then SIGKILL); the model ids of those that ran."""
    stopped = []
    for model_id, pid in pids.items():
        if is_running(pid, MARKER):
            stop_pid(pid, timeout_s)
            stopped.append(model_id)
    return stopped


def _tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"no log at {path}"
    return f"last lines of {path}: " + " | ".join(text) if text else f"{path} is empty"
