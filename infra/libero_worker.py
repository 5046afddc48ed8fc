"""The LIBERO rollout worker's process: its entry point (run in the LIBERO venv) and its launcher
(run from the project's venv, by `sepa-eval up` or `sepa-eval libero worker`).

    <libero venv>/bin/python -m infra.libero_worker [--processes 2] [--ready-file F]
                                                    [--policy-server MODEL=ws://HOST:PORT ...]

The entry point is the edge of that process: it reads the settings from the SEPA_* environment
(infra.settings.load_settings), builds the consumer (its own group, producers.libero.worker.
GROUP_ID), the publisher, the codec and the pool's producer factory, and passes them down. It
writes ``--ready-file`` (JSON: pid, processes) once its pool processes have imported LIBERO and
its consumer has its partitions; SIGTERM stops it after the request in hand.

``start_libero_worker(settings, bootstrap)`` starts it in the background when the LIBERO venv is
set up (returns None otherwise), with its log in ``<run_dir>/libero-worker.log``, and waits for the
ready file; ``stop_libero_worker(pid)`` stops it and its pool processes (SIGTERM to the worker,
which finishes the request in hand, then SIGKILL to its whole process group after the timeout: an
unfinished request is not committed, so it is served again).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from infra.exceptions import PipelineError
from infra.kafka_clients import make_consumer, make_producer
from infra.libero_venv import ROOT, LiberoVenv
from infra.settings import Settings, child_settings, load_settings, settings_environ

READY_TIMEOUT_S = 180.0
READY_FILE = "libero-worker-ready.json"
LOG_FILE = "libero-worker.log"


def _policy_servers(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        model, sep, uri = item.partition("=")
        if not sep or not model or not uri:
            raise SystemExit(f"--policy-server takes MODEL=URI, got {item!r}")
        out[model] = uri
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.libero_worker")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--ready-file", type=Path, default=None)
    parser.add_argument("--policy-server", action="append", default=[], metavar="MODEL=URI")
    parser.add_argument("--models-file", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


    from producers.libero.worker import GROUP_ID, LiberoPool, LiberoWorker, load_libero_models
    from producers.publisher import Publisher
    from schemas.codec import Codec
    from schemas.registry import schema_ids_for

    settings = load_settings()
    if not settings.bootstrap_servers:
        print("error: SEPA_BOOTSTRAP_SERVERS must name the broker (the launcher passes the resolved one)",
              file=sys.stderr)
        return 2
    bootstrap = settings.bootstrap_servers
    codec = Codec(schema_ids_for(settings.schema_registry_url))
    # the registry `up` serves (SEPA_MODELS_FILE) unless told: a model the robosuite workers know
    # and this one does not would have its LIBERO requests dead-lettered
    models = load_libero_models(args.models_file or settings.models_file, _policy_servers(args.policy_server))
    pool = LiberoPool(functools.partial(make_producer, bootstrap), settings.topic_prefix,
                      settings.memory_dir / "keyframes", models, args.processes)
    pool.ready()  # every pool process has imported LIBERO before the worker says it is ready
    consumer = make_consumer(bootstrap, GROUP_ID, settings.session_timeout_ms, **{"max.poll.interval.ms": 3_600_000})
    publisher = Publisher(make_producer(bootstrap), settings.topic_prefix, codec)

    def ready() -> None:
        if args.ready_file is not None:
            tmp = args.ready_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"pid": os.getpid(), "processes": args.processes}))
            tmp.replace(args.ready_file)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        LiberoWorker(consumer, publisher, codec, pool, settings.topic_prefix, on_ready=ready).run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        pool.close()
    return 0


def worker_command(venv: LiberoVenv, ready_file: Path, processes: int = 2,
                   policy_servers: dict[str, str] | None = None) -> list[str]:
    cmd = [str(venv.python), "-m", "infra.libero_worker", "--processes", str(processes),
           "--ready-file", str(ready_file)]
    for model, uri in (policy_servers or {}).items():
        cmd += ["--policy-server", f"{model}={uri}"]
    return cmd


def worker_environ(settings: Settings, bootstrap: str, venv: LiberoVenv) -> dict[str, str]:
    """The child's environment: ours, the settings as SEPA_* (with the resolved broker), the LIBERO
    venv's variables (its config, EGL, this project's code first on the path)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SEPA_", "VIRTUAL_ENV", "PYTHON"))}
    return {**base, **settings_environ(child_settings(settings, bootstrap)), **venv.environ(ROOT)}


def ready_file_of(settings: Settings) -> Path:
    """Where the worker says it is ready: absolute, since the worker runs in the run dir and a
    relative memory dir (the default, eval_memory) would name a file under itself."""
    return (settings.run_dir / READY_FILE).resolve()


def start_libero_worker(settings: Settings, bootstrap: str, processes: int = 2,
                        policy_servers: dict[str, str] | None = None, cache_root: Path | None = None,
                        timeout_s: float = READY_TIMEOUT_S, wait: bool = True) -> int | None:
    """Starts the LIBERO worker in the background when the LIBERO venv is set up; its pid, or
    None when LIBERO is not set up (`sepa-eval libero setup`). ``wait``: until its ready file
    exists (`sepa-eval up` does not wait: its pool takes ~20 s to import LIBERO, and requests
    published meanwhile wait in the topic)."""
    venv = LiberoVenv.at(cache_root)
    if not venv.ready():
        return None
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    ready_file = ready_file_of(settings)
    ready_file.unlink(missing_ok=True)
    log_path = settings.run_dir / LOG_FILE
    with open(log_path, "ab") as log:
        process = subprocess.Popen(worker_command(venv, ready_file, processes, policy_servers), stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                   cwd=settings.run_dir, env=worker_environ(settings, bootstrap, venv))
    if not wait:
        return process.pid
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise PipelineError(f"the LIBERO worker exited with code {process.returncode} at start; see {log_path}")
        if ready_file.exists():
            return process.pid
        time.sleep(0.2)
    process.terminate()
    raise PipelineError(f"the LIBERO worker was not ready within {timeout_s}s; see {log_path}")


def stop_libero_worker(pid: int, timeout_s: float = 30.0) -> bool:
    """Stops the worker started by start_libero_worker (its own session: pgid == pid). True when
    it had to be killed."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                break
        except ChildProcessError:  # not our child
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
        time.sleep(0.1)
    else:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True
    try:  # pool processes left behind by a worker that died
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return False


if __name__ == "__main__":
    sys.exit(main())
