"""`up`, `down`, and finding what runs: the embedded broker, the pipeline, the streams worker and
the rollout worker.

Everything lives under ``<memory_dir>/run``: ``state.json`` (pids, bootstrap, store endpoint),
``lock`` (held by `up` and `down`, so two of them never start or stop things at once), ``ready/``
(each child writes ``<name>-<pid>.json`` once it serves) and one log per process. `up` reports
success only when every child has said it is ready; a child that dies first is named with the tail
of its log, and what this `up` started is stopped again.

Children get their settings one way: ``SEPA_*`` environment variables (``settings_environ``),
with the resolved broker and an absolute memory dir; no other ``SEPA_*`` variable or config file
reaches them.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from consumers.evidence.endpoint import RemoteStore
from consumers.evidence.store import ClickHouseStore, EvidenceStore, migrate
from infra.embedded_broker import TansuBroker, pid_alive, stop_pid
from infra.exceptions import BrokerError, BrokerUnreachable, LockBusy, PipelineError
from infra.kafka_clients import ensure_topics, group_members, require_broker
from infra.settings import Settings, settings_environ
from schemas.codec import Codec

ROOT = Path(__file__).resolve().parents[1]
# A second `up` waits this much longer than a first one may take, then gives up naming the holder.
LOCK_MARGIN_S = 30.0
STOP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class Child:
    """A background process `up` starts: its state field, log, ready-file name and a word of its
    command line (so a recycled pid is not mistaken for it)."""

    name: str  # ready/<name>-<pid>.json, <name>.log
    label: str
    marker: str
    # Reaches the embedded store through the pipeline's endpoint, whose port it read once at start.
    reads_store: bool = False

    def log(self, settings: Settings) -> Path:
        return settings.run_dir / f"{self.name}.log"


# What a process's log says when it stopped because the disk filled (OSError ENOSPC in Python,
# ClickHouse's NOT_ENOUGH_SPACE).
OUT_OF_SPACE_MARKS = ("No space left on device", "NOT_ENOUGH_SPACE", "Errno 28")
LOG_TAIL_BYTES = 64 * 1024
LOW_SPACE_BYTES = 16 * 1024 * 1024  # less free under the memory dir than this: out of space


def why_stopped(child: Child, settings: Settings) -> str:
    """A stopped process's cause when one a person can act on shows: out of disk space (its log's
    tail says so, or the disk under the memory dir has under 16 MiB free: a full disk may keep the
    process from writing its last words to the log). "" otherwise."""
    try:
        with open(child.log(settings), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except OSError:
        tail = ""
    return out_of_space(settings, said_so=any(mark in tail for mark in OUT_OF_SPACE_MARKS))


def out_of_space(settings: Settings, said_so: bool = False) -> str:
    """"out of disk space (...)" when the disk under the memory dir is all but full (or a log
    ``said_so``), else ""."""
    try:
        free = shutil.disk_usage(settings.memory_dir).free
    except OSError:
        free = 0
    if said_so or (settings.memory_dir.exists() and free < LOW_SPACE_BYTES):
        return f"out of disk space ({free} bytes free under {settings.memory_dir})"
    return ""


PIPELINE = Child("pipeline", "pipeline", "infra.pipeline")
STREAMS = Child("streams", "streams worker", "infra.streams_worker", reads_store=True)
ROLLOUT = Child("rollout", "rollout worker", "rollout-worker")
CRITICS = Child("critics", "critics", "critics", reads_store=True)
CHILDREN = (PIPELINE, STREAMS, ROLLOUT, CRITICS)
BROKER_MARKER = "tansu"
LIBERO_MARKER = "infra.libero_worker"


def ready_path(settings: Settings, name: str, pid: int) -> Path:
    """Where a child started by `up` says it is ready (it computes the same path from its own pid)."""
    return settings.run_dir / "ready" / f"{name}-{pid}.json"


def write_ready(settings: Settings, name: str, info: dict | None = None) -> Path:
    """Called by a child once it serves."""
    path = ready_path(settings, name, os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **(info or {})}))
    tmp.replace(path)
    return path


def is_running(pid: int | None, marker: str) -> bool:
    """The pid is alive and its command line carries the marker (where /proc tells)."""
    if pid is None or not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pid
    # Empty while the process is still inside exec (just spawned): it is the one we started.
    return not cmdline or marker.encode() in cmdline.replace(b"\0", b" ")


@dataclass
class RunState:
    broker_pid: int | None = None
    bootstrap: str | None = None
    pipeline_pid: int | None = None
    store_url: str | None = None  # the pipeline's store endpoint (embedded store only)
    streams_pid: int | None = None  # the faust worker: failure detection and clustering
    streams_web: str | None = None  # its faust web server, when the settings turn it on
    rollout_pid: int | None = None  # serves rollout.requests
    critics_pid: int | None = None  # validates candidates (robustness, safety, semantic)
    libero_pid: int | None = None  # serves LIBERO's rollout requests, in the LIBERO venv (when set up)

    @classmethod
    def read(cls, settings: Settings) -> RunState:
        path = settings.run_dir / "state.json"
        if not path.exists():
            return cls()
        values = json.loads(path.read_text())
        known = {k: v for k, v in values.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def write(self, settings: Settings) -> None:
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = settings.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(settings.run_dir / "state.json")

    def pid_of(self, child: Child) -> int | None:
        return getattr(self, f"{child.name}_pid")

    def set_pid(self, child: Child, pid: int | None) -> None:
        setattr(self, f"{child.name}_pid", pid)

    def alive(self, child: Child) -> bool:
        return is_running(self.pid_of(child), child.marker)

    @property
    def broker_alive(self) -> bool:
        return is_running(self.broker_pid, BROKER_MARKER)

    @property
    def pipeline_alive(self) -> bool:
        return self.alive(PIPELINE)

    @property
    def streams_alive(self) -> bool:
        return self.alive(STREAMS)

    @property
    def rollout_alive(self) -> bool:
        return self.alive(ROLLOUT)


def resolve_bootstrap(settings: Settings) -> str:
    """The configured Kafka cluster, or the embedded broker that `up` started."""
    if settings.bootstrap_servers:
        return settings.bootstrap_servers
    state = RunState.read(settings)
    if state.broker_alive and state.bootstrap:
        return state.bootstrap
    raise BrokerError(f"no broker: the embedded broker is not running under {settings.run_dir} "
                      "(run `sepa-eval up`) and SEPA_BOOTSTRAP_SERVERS is not set")


def broker_source(settings: Settings) -> str:
    return "SEPA_BOOTSTRAP_SERVERS" if settings.bootstrap_servers else f"the embedded broker of {settings.run_dir}"


def require_bootstrap(settings: Settings) -> str:
    """resolve_bootstrap, and the broker answered within ``broker_timeout_s`` (else one line naming it)."""
    bootstrap = resolve_bootstrap(settings)
    require_broker(bootstrap, settings.broker_timeout_s, broker_source(settings))
    return bootstrap


def open_store(settings: Settings) -> EvidenceStore:
    """Through the pipeline when it owns the embedded store, else directly (migrated)."""
    if settings.embedded_store:
        state = RunState.read(settings)
        if state.pipeline_alive and state.store_url and state.pipeline_pid != os.getpid():
            return RemoteStore(state.store_url, settings.clickhouse_database)
    store = ClickHouseStore.connect(settings.clickhouse_url, settings.chdb_path, settings.clickhouse_database)
    migrate(store)
    return store


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
    resolved = settings.model_copy(update={"bootstrap_servers": bootstrap,
                                           "memory_dir": settings.memory_dir.resolve(),
                                           # children run in the run dir: a relative path would move
                                           "models_file": settings.models_file and settings.models_file.resolve()})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPA_")}
    env.update(settings_environ(resolved))
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
        if state.broker_alive:
            stop_child(state.broker_pid, 15)
            stopped.append(f"embedded broker (pid {state.broker_pid})")
        RunState().write(settings)
        _drop_stale_ready_files(settings, RunState())
    return stopped


def broker_status(settings: Settings, state: RunState) -> dict:
    """The broker and whether it answers; a broker that does not is reported, not raised."""
    bootstrap = settings.bootstrap_servers or (state.bootstrap if state.broker_alive else None)
    report = {"mode": "embedded" if settings.embedded_broker else "external", "bootstrap": bootstrap,
              "pid": state.broker_pid if state.broker_alive else None, "answering": False, "error": None}
    if not bootstrap:
        report["error"] = f"the embedded broker is not running under {settings.run_dir} (run `sepa-eval up`)"
        return report
    try:
        require_broker(bootstrap, settings.broker_timeout_s, broker_source(settings))
        report["answering"] = True
    except BrokerUnreachable as exc:
        report["error"] = str(exc)
    return report


def rollout_workers(settings: Settings, bootstrap: str) -> list[str]:
    """Rollout workers serving this memory dir's topics: those that said they are ready here (the one
    `up` started, or one run by hand), else the members of their consumer group on brokers that
    report members (Apache Kafka does, Tansu does not)."""
    from producers.rollout_worker import GROUP_ID

    found = []
    for path in sorted((settings.run_dir / "ready").glob(f"{ROLLOUT.name}-*.json")):
        pid = int(path.stem.rsplit("-", 1)[1])
        if is_running(pid, ROLLOUT.marker):
            found.append(f"pid {pid}")
    if found:
        return found
    return [f"group member {m}" for m in group_members(bootstrap, GROUP_ID, settings.broker_timeout_s)]


# The faust app id of the streams worker (streams.app.StreamsConfig.app_id): its consumer group.
STREAMS_GROUP = "sepa-streams"


def streams_workers(settings: Settings, bootstrap: str | None = None) -> list[str]:
    """Streams workers (each runs the promotion gate) serving this memory dir: the one `up` started
    and any started by hand with this memory dir (their ready files), else, given the broker, the
    members of the streams group on brokers that report members (Apache Kafka does, Tansu does not)."""
    found = set()
    state = RunState.read(settings)
    if state.streams_alive:
        found.add(state.streams_pid)
    for path in (settings.run_dir / "ready").glob(f"{STREAMS.name}-*.json"):
        pid = int(path.stem.rsplit("-", 1)[1])
        if is_running(pid, STREAMS.marker):
            found.add(pid)
    if found:
        return [f"pid {pid}" for pid in sorted(found)]
    if bootstrap is None:
        return []
    return [f"group member {m}" for m in group_members(bootstrap, STREAMS_GROUP, settings.broker_timeout_s)]


def process_status(settings: Settings, state: RunState) -> dict:
    """pid (None when not running) of each child `up` starts."""
    return {"pipeline": {"pid": state.pipeline_pid if state.pipeline_alive else None,
                         "store": state.store_url or settings.clickhouse_url or f"chdb://{settings.chdb_path}"},
            "streams": {"pid": state.streams_pid if state.streams_alive else None,
                        "web": state.streams_web if state.streams_alive else None},
            "rollout_worker": {"pid": state.rollout_pid if state.rollout_alive else None},
            "critics": {"pid": state.critics_pid if state.alive(CRITICS) else None},
            "libero_worker": {"pid": state.libero_pid if is_running(state.libero_pid, LIBERO_MARKER) else None}}
