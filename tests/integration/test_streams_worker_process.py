"""The streams worker process as faust's command line starts it: `faust -A infra.streams_worker
worker` without `--without-web` (faust defaults to --with-web, which binds 0.0.0.0:6066) opens no
port unless the settings ask, and then only 127.0.0.1 on a free port; it says when it is ready."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from stack_helpers import ROOT, clean_env, listening

# faust's own default command line: no --without-web
FAUST_WORKER = [sys.executable, "-m", "faust", "-A", "infra.streams_worker", "worker", "-l", "info"]
READY_TIMEOUT_S = 90.0


def start(tansu: str, prefix: str, memory_dir, **settings: str) -> subprocess.Popen:
    env = clean_env(SEPA_BOOTSTRAP_SERVERS=tansu, SEPA_TOPIC_PREFIX=prefix, SEPA_MEMORY_DIR=str(memory_dir),
                    **settings)
    memory_dir.mkdir(parents=True, exist_ok=True)
    with open(memory_dir / "worker.log", "ab") as log:
        return subprocess.Popen(FAUST_WORKER, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def wait_ready(worker: subprocess.Popen, memory_dir) -> dict:
    path = memory_dir / "run" / "ready" / f"streams-{worker.pid}.json"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not path.exists():
        assert worker.poll() is None, (memory_dir / "worker.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no ready file; " + (memory_dir / "worker.log").read_text()[-3000:]
        time.sleep(0.2)
    return json.loads(path.read_text())


def stop(worker: subprocess.Popen) -> None:
    worker.terminate()
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


@pytest.fixture
def topics(tansu):
    import uuid

    from infra.kafka_clients import ensure_topics

    prefix = f"w{uuid.uuid4().hex[:10]}."
    ensure_topics(tansu, prefix)
    return prefix


def test_the_worker_opens_no_port_by_default_even_with_fausts_with_web(tansu, topics, tmp_path):
    worker = start(tansu, topics, tmp_path / "m")
    try:
        ready = wait_ready(worker, tmp_path / "m")
        assert ready == {"pid": worker.pid, "web": None}
        time.sleep(2)  # faust starts its web server after recovery, were it on
        assert worker.poll() is None and listening(worker.pid) == []
    finally:
        stop(worker)


def test_the_web_server_when_enabled_binds_localhost_on_a_free_port(tansu, topics, tmp_path):
    worker = start(tansu, topics, tmp_path / "m", SEPA_STREAMS_WEB="true")
    try:
        ready = wait_ready(worker, tmp_path / "m")
        deadline = time.monotonic() + 30
        while not listening(worker.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        [(address, port)] = listening(worker.pid)
        assert address == "127.0.0.1" and port != 6066
        assert ready["web"] == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(ready["web"] + "/", timeout=10) as reply:
            assert reply.status == 200
    finally:
        stop(worker)
