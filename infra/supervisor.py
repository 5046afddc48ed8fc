"""`up` and `down`: starting and stopping the children infra/processes.py names (the embedded
broker, the pipeline, the streams worker, the rollout worker and the critics). Kept apart from
infra/processes.py, which says what runs and how to reach it: this module is the one that changes
what runs.

Under ``<memory_dir>/run``, ``lock`` is held by `up` and `down`, so two of them never start or stop
things at once. `up` reports success only when every child has said it is ready (its
``ready/<name>-<pid>.json``); a child that dies first is named with the tail of its log, and what
this `up` started is stopped again.

Children get their settings one way: ``SEPA_*`` environment variables (``settings_environ``),
with the resolved broker and an absolute memory dir; no other ``SEPA_*`` variable or config file
reaches them.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from infra.embedded_broker import TansuBroker, stop_pid
from infra.exceptions import LockBusy, PipelineError
from infra.kafka_clients import ensure_topics, require_broker
from infra.policy_servers import local_policies, start_policy_servers, stop_policy_servers
from infra.processes import (
    CHILDREN,
    CRITICS,
    LIBERO_MARKER,
    PIPELINE,
    ROLLOUT,
    STREAMS,
    Child,
    RunState,
    broker_source,
    is_running,
    open_store,
    ready_path,
)
from infra.settings import Settings, child_settings, settings_environ
from producers.sim.models import load_models
from schemas.codec import Codec

ROOT = Path(__file__).resolve().parents[1]
# A second `up` waits this much longer than a first one may take, then gives up naming the holder.
LOCK_MARGIN_S = 30.0
STOP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 15


@contextmanager
def run_lock(settings: Settings, timeout: float) -> Iterator[None]:
    """The memory dir's lock: one `up` or `down` at a time. Waits up to ``timeout`` for a holder."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    path = settings.run_dir / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the children (O_CLOEXEC)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                    raise LockBusy(f"another `sepa-eval up` or `down` (pid {holder}) still holds {path} "
                                   f"after {timeout:g} s") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@dataclass
class UpResult:
    state: RunState
    started: list[str]  # what this call started; empty = everything was already running
    # Events re-published from the evidence log into a new embedded broker (its topics start empty),
    # per topic: what the loop still waited on (consumers/replay.py, republish_in_flight).
    republished: dict[str, int] = field(default_factory=dict)


def up(settings: Settings, codec: Codec | None = None) -> UpResult:
    """Start what is not running (embedded broker, pipeline, then streams worker, rollout worker and
    critics) and wait until every child is ready. A second `up` waits for the first and then starts nothing.
    A new embedded broker gets what the evidence log says is still in flight (``codec`` encodes it)."""
    _check_streams_settings(settings)
    with run_lock(settings, settings.ready_timeout_s + LOCK_MARGIN_S):
        state = RunState.read(settings)
        _drop_stale_ready_files(settings, state)
        started: list[tuple[str, int]] = []  # (label, pid), in start order
        republished: dict[str, int] = {}
        try:
            fresh_broker = False
            if settings.embedded_broker and not state.broker_alive:
                for child in CHILDREN:  # still talking to the broker that is gone: start them afresh
                    if state.alive(child):
                        stop_child(state.pid_of(child))
                    state.set_pid(child, None)
                fresh_broker = True
                broker = TansuBroker(settings.run_dir / "broker.log").start(detach=True)
                state.broker_pid, state.bootstrap = broker.process.pid, broker.bootstrap_servers
                started.append(("embedded broker", broker.process.pid))
                state.write(settings)
            bootstrap = settings.bootstrap_servers or state.bootstrap
            require_broker(bootstrap, settings.broker_timeout_s, broker_source(settings))
            ensure_topics(bootstrap, settings.topic_prefix, timeout=settings.broker_timeout_s)
            if settings.embedded_store and not state.pipeline_alive:
                # A new pipeline listens on a new port: whoever still asks the dead one's would
                # retry it forever, so they start afresh with the new one.
                for child in CHILDREN:
                    if child.reads_store and state.alive(child):
                        stop_child(state.pid_of(child))
                        state.set_pid(child, None)
            # the learned policies' servers before the workers that call them
            served = start_policy_servers(settings, local_policies(load_models(settings.models_file)),
                                          state.policy_pids)
            if served:
                state.policy_pids = {**state.policy_pids, **served}
                started += [(f"policy server of {m}", pid) for m, pid in served.items()]
                state.write(settings)
            # The pipeline first: the others reach the store through its endpoint (state.json names it).
            for phase in ((PIPELINE,), tuple(c for c in CHILDREN if c is not PIPELINE)):
                spawned: dict[str, tuple[subprocess.Popen, int]] = {}  # name -> (process, where its log began)
                for child in phase:
                    if not state.alive(child):
                        offset = _log_size(child.log(settings))
                        process = _spawn(settings, child, bootstrap)
                        spawned[child.name] = (process, offset)
                        state.set_pid(child, process.pid)
                        started.append((child.label, process.pid))
                state.write(settings)
                ready = _wait_ready(settings, state, spawned, phase)
                if PIPELINE in phase:
                    state.store_url = ready[PIPELINE.name].get("store_url")
                    state.write(settings)
                    if fresh_broker:  # before the streams worker starts: its clusterer restores from the topics
                        republished = _republish_in_flight(settings, bootstrap, codec or Codec())
                if STREAMS in phase:
                    state.streams_web = ready[STREAMS.name].get("web")
                state.write(settings)
            if settings.libero_worker and not is_running(state.libero_pid, LIBERO_MARKER):
                from infra.libero_worker import start_libero_worker

                state.libero_pid = start_libero_worker(settings, bootstrap, wait=False)
                if state.libero_pid is not None:
                    started.append(("LIBERO worker (starting)", state.libero_pid))
                state.write(settings)
        except BaseException:
            _stop_started(settings, state, started)
            raise
    return UpResult(state, [f"{label} (pid {pid})" for label, pid in started], republished)


def _republish_in_flight(settings: Settings, bootstrap: str, codec: Codec) -> dict[str, int]:
    """The embedded broker keeps its topics in memory: a new one has forgotten the requests,
    candidates and episodes the loop still waits on, and the evidence log has them."""
    from consumers.replay import republish_in_flight
    from infra.kafka_clients import make_producer
    from producers.publisher import Publisher

    return republish_in_flight(open_store(settings), Publisher(make_producer(bootstrap), settings.topic_prefix, codec))


def _check_streams_settings(settings: Settings) -> None:
    """What the streams worker would refuse at start, refused before anything starts (its own
    failure would only show in streams.log). Imports faust only for the settings that need it."""
    if settings.streams_processing_guarantee != "at_least_once" or settings.openai_base_url or settings.openai_model:
        from infra.streams_config import check_settings

        check_settings(settings)


def child_environ(settings: Settings, bootstrap: str) -> dict[str, str]:
    """The environment of a child: ours without any SEPA_* variable, plus the settings as SEPA_*
    (the broker resolved, the memory dir absolute) and this checkout first on the import path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPA_")}
    env.update(settings_environ(child_settings(settings, bootstrap)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return env


def command(settings: Settings, child: Child) -> list[str]:
    if child is PIPELINE:
        return [sys.executable, "-m", "infra.pipeline"]
    if child is STREAMS:
        # --without-web: faust's `worker` command defaults to --with-web (0.0.0.0:6066); the app
        # enforces the settings either way (infra/streams_worker.py).
        web = ["--with-web"] if settings.streams_web else ["--without-web"]
        return [sys.executable, "-m", "faust", "-A", "infra.streams_worker", "worker", *web, "-l", "info"]
    if child is ROLLOUT:
        return [sys.executable, "-m", "infra.cli", "rollout-worker"]
    if child is CRITICS:
        return [sys.executable, "-m", "infra.cli", "critics"]
    raise ValueError(f"no command for {child}")


def _spawn(settings: Settings, child: Child, bootstrap: str) -> subprocess.Popen:
    with open(child.log(settings), "ab") as log:
        return subprocess.Popen(command(settings, child), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=settings.run_dir.resolve(), env=child_environ(settings, bootstrap))


def _wait_ready(settings: Settings, state: RunState, spawned: dict[str, tuple[subprocess.Popen, int]],
                children: tuple[Child, ...] = CHILDREN) -> dict[str, dict]:
    """Every child's ready file, waiting up to ready_timeout_s; names the first that died or is late
    (children an earlier `up` started are only watched for their ready file and their pid)."""
    deadline = time.monotonic() + settings.ready_timeout_s
    ready: dict[str, dict] = {}
    while True:
        for child in children:
            if child.name in ready:
                continue
            pid = state.pid_of(child)
            path = ready_path(settings, child.name, pid)
            process, offset = spawned.get(child.name, (None, 0))
            if path.exists():
                ready[child.name] = json.loads(path.read_text())
            elif (process.poll() is not None) if process is not None else not state.alive(child):
                code = f" with code {process.returncode}" if process is not None else ""
                raise PipelineError(f"the {child.label} (pid {pid}) exited{code} before it was ready; "
                                    f"{_log_tail(child.log(settings), offset)}")
        if len(ready) == len(children):
            return ready
        if time.monotonic() > deadline:
            late = [c for c in children if c.name not in ready]
            raise PipelineError(f"the {', '.join(c.label for c in late)} did not say it was ready within "
                                f"{settings.ready_timeout_s:g} s (ready_timeout_s); "
                                f"{_log_tail(late[0].log(settings), spawned.get(late[0].name, (None, 0))[1])}")
        time.sleep(0.1)


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _log_tail(path: Path, offset: int) -> str:
    """The last lines this start wrote to a child's log (earlier starts append to the same file)."""
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            lines = log.read().decode(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    except OSError:
        return f"no log at {path}"
    if not lines:
        return f"{path} is empty"
    return f"last lines of {path}:\n" + "\n".join(lines)


def _drop_stale_ready_files(settings: Settings, state: RunState) -> None:
    """Ready files of processes that no longer run (a new child may get an old pid)."""
    live = {f"{c.name}-{state.pid_of(c)}.json" for c in CHILDREN if state.alive(c)}
    for path in (settings.run_dir / "ready").glob("*.json"):
        if path.name not in live:
            path.unlink(missing_ok=True)


def stop_child(pid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, wait, SIGKILL; then whatever is left of its process group (a child `up` started
    leads its own session: the rollout worker's simulator processes are in it)."""
    stop_pid(pid, timeout)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_started(settings: Settings, state: RunState, started: list[tuple[str, int]]) -> None:
    """A failed `up` leaves nothing of its own running: stop what it started, newest first."""
    for _, pid in reversed(started):
        stop_child(pid)
    pids = {pid for _, pid in started}
    for child in CHILDREN:
        if state.pid_of(child) in pids:
            state.set_pid(child, None)
    if state.broker_pid in pids:
        state.broker_pid, state.bootstrap = None, None
    state.policy_pids = {m: pid for m, pid in state.policy_pids.items() if pid not in pids}
    state.write(settings)


def down(settings: Settings) -> list[str]:
    with run_lock(settings, settings.ready_timeout_s + LOCK_MARGIN_S):
        state = RunState.read(settings)
        stopped = []
        # The consumers first: they commit their last batch while the broker is still there.
        if is_running(state.libero_pid, LIBERO_MARKER):
            from infra.libero_worker import stop_libero_worker

            stop_libero_worker(state.libero_pid)
            stopped.append(f"LIBERO worker (pid {state.libero_pid})")
        for child in (CRITICS, STREAMS, ROLLOUT, PIPELINE):
            if state.alive(child):
                stop_child(state.pid_of(child))
                stopped.append(f"{child.label} (pid {state.pid_of(child)})")
            if child is ROLLOUT:  # the servers once nothing calls them
                stopped += [f"policy server of {m} (pid {state.policy_pids[m]})"
                            for m in stop_policy_servers(state.policy_pids)]
        if state.broker_alive:
            stop_child(state.broker_pid, 15)
            stopped.append(f"embedded broker (pid {state.broker_pid})")
        RunState().write(settings)
        _drop_stale_ready_files(settings, RunState())
    return stopped
