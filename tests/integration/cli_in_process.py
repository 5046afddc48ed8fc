"""`sepa-eval` commands run in this process (typer's CliRunner) against the session's broker and
chDB store, for tests of commands that publish and then wait on the evidence log.

A command checks that the processes `up` starts are running (the pipeline storing what it publishes,
the rollout worker serving its requests, a streams worker deciding): ``StandIns`` registers, under
the memory dir, a sleeping process for each whose command line carries that process's marker, the
way `up` records the real ones, while the test runs the real work (the evidence sink, a rollout
worker) in threads of its own. chDB lets one process open one directory, so the command opens the
session's directory (``chdb://<path>``) in the test's database.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from infra import processes
from infra.cli import app

STAND_IN_S = 900  # a stand-in outlives any test; the fixture stops it first


def cli_env(broker: str, prefix: str, store, models_file: Path | None = None) -> dict[str, str | None]:
    env = {"SEPA_BOOTSTRAP_SERVERS": broker, "SEPA_TOPIC_PREFIX": prefix,
           "SEPA_CLICKHOUSE_URL": f"chdb://{store.client.path}", "SEPA_CLICKHOUSE_DATABASE": store.database,
           "SEPA_SESSION_TIMEOUT_MS": "6000", "SEPA_MODELS_FILE": str(models_file) if models_file else None}
    return env


def sepa(memory_dir: Path, env: dict, *args: str):
    """One command; returns click's Result (exit_code, stdout, stderr)."""
    return CliRunner().invoke(app, ["--memory-dir", str(memory_dir), *args], env=env, catch_exceptions=False)


class StandIns:
    """Sleeping processes recorded as the pipeline, the rollout worker or a streams worker of a memory dir."""

    def __init__(self, memory_dir: Path):
        self.memory_dir = memory_dir
        self.run_dir = memory_dir / "run"
        self.started: list[subprocess.Popen] = []

    def start(self, *children: processes.Child) -> None:
        state = json.loads((self.run_dir / "state.json").read_text()) if (self.run_dir / "state.json").exists() \
            else {}
        for child in children:
            p = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))",
                                  str(STAND_IN_S), child.marker], stdin=subprocess.DEVNULL)
            self.started.append(p)
            state[f"{child.name}_pid"] = p.pid
            ready = self.run_dir / "ready" / f"{child.name}-{p.pid}.json"
            ready.parent.mkdir(parents=True, exist_ok=True)
            ready.write_text(json.dumps({"pid": p.pid}))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "state.json").write_text(json.dumps(state))

    def stop(self) -> None:
        for p in self.started:
            p.kill()
            p.wait(10)
        self.started.clear()
