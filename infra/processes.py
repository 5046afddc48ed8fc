"""What `up` starts and finding what runs: the pipeline, the streams worker, the rollout worker and
the critics (Child), their and the embedded broker's pids in ``state.json`` (RunState), ready
files, how a command reaches the broker and the evidence store, and status reports. Starting and
stopping them (`up`, `down`) is infra/supervisor.py.

Everything lives under ``<memory_dir>/run``: ``state.json`` (pids, bootstrap, store endpoint),
``ready/`` (each child writes ``<name>-<pid>.json`` once it serves) and one log per process.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from consumers.evidence.endpoint import RemoteStore
from consumers.evidence.store import ClickHouseStore, EvidenceStore, migrate
from infra.embedded_broker import pid_alive
from infra.exceptions import BrokerError, BrokerUnreachable
from infra.kafka_clients import group_members, require_broker
from infra.settings import Settings


@dataclass(frozen=True)
class Child:
    """A background process `up` starts: its state field, log, ready-file name and a word of its
    command line (so a recycled pid is not mistaken for it)."""

    name: str  # ready/<name>-<pid>.json, <name>.log
    label: str
    marker: str
    # Reaches the embedded store through the pipeline's endpoint, whose port it read once at start.
    reads_store: bool = False
    log_name: str = ""  # <name>.log unless given

    def log(self, settings: Settings) -> Path:
        return settings.run_dir / (self.log_name or f"{self.name}.log")


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
# Started by `up` when LIBERO is set up, in the LIBERO venv (infra/libero_worker.py), and not one
# of CHILDREN: only a LIBERO run's waits rely on it.
LIBERO = Child("libero", "LIBERO worker", LIBERO_MARKER, log_name="libero-worker.log")
POLICY_SERVER_MARKER = "producers.learned.server"


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
    # model_id -> pid: the servers of registered learned policies `up` started (infra/policy_servers.py)
    policy_pids: dict[str, int] = field(default_factory=dict)

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


def libero_workers(settings: Settings, bootstrap: str) -> list[str]:
    """LIBERO workers serving this memory dir's topics: the one `up` started, else the members of
    their consumer group on brokers that report members."""
    from producers.libero.worker import GROUP_ID

    state = RunState.read(settings)
    if is_running(state.libero_pid, LIBERO_MARKER):
        return [f"pid {state.libero_pid}"]
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
            "libero_worker": {"pid": state.libero_pid if is_running(state.libero_pid, LIBERO_MARKER) else None},
            "policy_servers": {m: pid for m, pid in sorted(state.policy_pids.items())
                               if is_running(pid, POLICY_SERVER_MARKER)}}
