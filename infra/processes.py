"""`up`, `down`, and finding what runs: the embedded broker and the pipeline process.

Everything lives under ``<memory_dir>/run``: state.json (pids, bootstrap, store endpoint), the
settings the pipeline was started with, and one log per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from consumers.evidence.endpoint import RemoteStore
from consumers.evidence.store import ClickHouseStore, EvidenceStore, migrate
from infra.embedded_broker import TansuBroker, broker_answers, pid_alive, stop_pid
from infra.exceptions import BrokerError, PipelineError
from infra.kafka_clients import ensure_topics
from infra.settings import Settings, settings_environ

PIPELINE_READY_TIMEOUT_S = 60.0


@dataclass
class RunState:
    broker_pid: int | None = None
    bootstrap: str | None = None
    pipeline_pid: int | None = None
    store_url: str | None = None  # the pipeline's store endpoint (embedded store only)
    streams_pid: int | None = None  # the faust worker: failure detection and clustering

    @classmethod
    def read(cls, settings: Settings) -> RunState:
        path = settings.run_dir / "state.json"
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def write(self, settings: Settings) -> None:
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = settings.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(settings.run_dir / "state.json")

    @property
    def broker_alive(self) -> bool:
        return self.broker_pid is not None and pid_alive(self.broker_pid)

    @property
    def streams_alive(self) -> bool:
        return self.streams_pid is not None and pid_alive(self.streams_pid)

    @property
    def pipeline_alive(self) -> bool:
        return self.pipeline_pid is not None and pid_alive(self.pipeline_pid)


def resolve_bootstrap(settings: Settings) -> str:
    """The configured Kafka cluster, or the embedded broker that `up` started."""
    if settings.bootstrap_servers:
        return settings.bootstrap_servers
    state = RunState.read(settings)
    if state.broker_alive and state.bootstrap:
        return state.bootstrap
    raise BrokerError(f"no broker: the embedded broker is not running under {settings.run_dir} "
                      "(run `sepa-eval up`) and SEPA_BOOTSTRAP_SERVERS is not set")


def open_store(settings: Settings) -> EvidenceStore:
    """Through the pipeline when it owns the embedded store, else directly (migrated)."""
    if settings.embedded_store:
        state = RunState.read(settings)
        if state.pipeline_alive and state.store_url and state.pipeline_pid != os.getpid():
            return RemoteStore(state.store_url, settings.clickhouse_database)
    store = ClickHouseStore.connect(settings.clickhouse_url, settings.chdb_path, settings.clickhouse_database)
    migrate(store)
    return store


def up(settings: Settings) -> RunState:
    _check_streams_settings(settings)
    state = RunState.read(settings)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    if settings.embedded_broker and not state.broker_alive:
        broker = TansuBroker(settings.run_dir / "broker.log").start(detach=True)
        state.broker_pid, state.bootstrap = broker.process.pid, broker.bootstrap_servers
        state.write(settings)
    bootstrap = settings.bootstrap_servers or state.bootstrap
    ensure_topics(bootstrap, settings.topic_prefix)
    if not state.pipeline_alive:
        state.pipeline_pid, state.store_url = _start_pipeline(settings, bootstrap)
        state.write(settings)
    if not state.streams_alive:
        state.streams_pid = _start_streams_worker(settings, bootstrap)
        state.write(settings)
    return state


def _check_streams_settings(settings: Settings) -> None:
    """What the streams worker would refuse at start, refused before anything starts (its own
    failure would only show in streams.log). Imports faust only for the settings that need it."""
    if settings.streams_processing_guarantee != "at_least_once" or settings.openai_base_url or settings.openai_model:
        from streams.app import llm_summarizer, processing_guarantee

        processing_guarantee(settings)
        llm_summarizer(settings)


def _start_streams_worker(settings: Settings, bootstrap: str) -> int:
    """`faust -A streams.app worker`, configured through SEPA_* like any other command."""
    resolved = settings.model_copy(update={"bootstrap_servers": bootstrap,
                                           "memory_dir": settings.memory_dir.resolve()})
    with open(settings.run_dir / "streams.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "faust", "-A", "streams.app", "worker", "-l", "info"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            cwd=settings.run_dir, env={**os.environ, **settings_environ(resolved)})
    time.sleep(0.5)
    if process.poll() is not None:
        raise PipelineError(f"the streams worker exited with code {process.returncode} at start; "
                            f"see {settings.run_dir / 'streams.log'}")
    return process.pid


def _start_pipeline(settings: Settings, bootstrap: str) -> tuple[int, str | None]:
    settings_path = settings.run_dir / "pipeline-settings.json"
    resolved = settings.model_copy(update={"bootstrap_servers": bootstrap,
                                           "memory_dir": settings.memory_dir.resolve()})
    # No secrets on disk: the pipeline does not call the language model.
    settings_path.write_text(resolved.model_dump_json(indent=1, exclude={"openai_api_key"}))
    ready_path = settings.run_dir / "pipeline-ready.json"
    ready_path.unlink(missing_ok=True)
    with open(settings.run_dir / "pipeline.log", "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "infra.pipeline", str(settings_path)],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, cwd=Path(__file__).resolve().parents[1])
    deadline = time.monotonic() + PIPELINE_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise PipelineError(f"the pipeline exited with code {process.returncode} at start; "
                                f"see {settings.run_dir / 'pipeline.log'}")
        if ready_path.exists():
            return process.pid, json.loads(ready_path.read_text()).get("store_url")
        time.sleep(0.1)
    stop_pid(process.pid, 10)
    raise PipelineError(f"the pipeline was not ready within {PIPELINE_READY_TIMEOUT_S}s; "
                        f"see {settings.run_dir / 'pipeline.log'}")


def down(settings: Settings) -> list[str]:
    state = RunState.read(settings)
    stopped = []
    # The consumers first: they commit their last batch while the broker is still there.
    if state.streams_alive:
        stop_pid(state.streams_pid, 30)
        stopped.append(f"streams worker (pid {state.streams_pid})")
    if state.pipeline_alive:
        stop_pid(state.pipeline_pid, 30)
        stopped.append(f"pipeline (pid {state.pipeline_pid})")
    if state.broker_alive:
        stop_pid(state.broker_pid, 15)
        stopped.append(f"embedded broker (pid {state.broker_pid})")
    RunState().write(settings)
    return stopped


def broker_status(settings: Settings, state: RunState) -> dict:
    bootstrap = settings.bootstrap_servers or state.bootstrap
    return {"mode": "embedded" if settings.embedded_broker else "external", "bootstrap": bootstrap,
            "pid": state.broker_pid if state.broker_alive else None,
            "answering": bool(bootstrap) and broker_answers(bootstrap, timeout=2.0)}
