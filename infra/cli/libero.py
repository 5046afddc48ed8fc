"""`sepa-eval libero ...`: set up LIBERO, list its tasks, build its scenarios, run its worker.

    sepa-eval libero setup [--force]                  # build the LIBERO venv (idempotent; ~5 min the first time)
    sepa-eval libero status                           # is it set up, and with which versions
    sepa-eval libero tasks [--suite libero_object]    # suites and tasks, with their instructions
    sepa-eval libero scenario --suite libero_object --task 0 [--perturb layout.target.dx_m=0.04]
                                                      # a ScenarioSpec as JSON (a base scenario without --perturb)
    sepa-eval libero request --suite libero_object --task 0 --model oracle --episodes 5
                                                      # publish a RolloutRequested for the LIBERO worker
    sepa-eval libero worker [--processes 2]           # the LIBERO worker in the foreground

The tasks and scenarios are read from the files of the LIBERO venv (producers/libero/tasks.py);
LIBERO itself is never imported in this venv. `sepa-eval up` starts the LIBERO worker when LIBERO
is set up.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import typer
from rich.table import Table

from infra import processes
from infra.cli.base import app, codec_of, console, fail, make_publisher, settings_of
from infra.exceptions import InfraError, LiberoSetupError
from infra.libero_venv import LiberoVenv, build, check

libero_app = typer.Typer(help="LIBERO: its own venv, tasks, scenarios and rollout worker.", no_args_is_help=True)
app.add_typer(libero_app, name="libero")


def _catalog(cache_root: Path | None):
    from producers.libero.tasks import TaskCatalog

    venv = LiberoVenv.at(cache_root)
    if not venv.ready():
        raise LiberoSetupError(f"LIBERO is not set up at {venv.root}: run `sepa-eval libero setup`")
    return TaskCatalog(venv.package_dir)


def _task_name(catalog, suite: str, task: str) -> str:
    names = catalog.tasks(suite)
    if task.isdigit():
        index = int(task)
        if not 0 <= index < len(names):
            raise ValueError(f"task index {index} is out of range: {suite} has {len(names)} tasks")
        return names[index]
    return task


def _perturbations(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise ValueError(f"--perturb takes NAME=NUMBER, got {item!r}")
    return out


@libero_app.command()
def setup(force: bool = typer.Option(False, "--force", help="rebuild the venv from scratch"),
          cache_root: Path | None = typer.Option(None, help="default ~/.cache/sepa-eval")):
    """Build the LIBERO venv from the package registries (idempotent)."""
    try:
        venv = build(cache_root, force=force, log=lambda line: console.print(line, soft_wrap=True))
        report = check(venv)
    except LiberoSetupError as exc:
        fail(exc)
    console.print(f"LIBERO ready: robosuite {report['robosuite']}, mujoco {report['mujoco']} at {venv.root}")


@libero_app.command()
def status(cache_root: Path | None = typer.Option(None)):
    """Whether LIBERO is set up, and the versions its venv runs."""
    venv = LiberoVenv.at(cache_root)
    if not venv.ready():
        console.print(f"LIBERO is not set up at {venv.root} (sepa-eval libero setup)")
        raise typer.Exit(1)
    try:
        report = check(venv)
    except LiberoSetupError as exc:
        fail(exc)
    console.print(json.dumps({"venv": str(venv.root), **report}))


@libero_app.command()
def tasks(suite: str | None = typer.Option(None, help="one suite (default: all)"),
          cache_root: Path | None = typer.Option(None), as_json: bool = typer.Option(False, "--json")):
    """List the suites' tasks with their instructions and targets."""
    try:
        catalog = _catalog(cache_root)
        suites = [suite] if suite else list(catalog.suites())
        rows = [(s, i, catalog.info(s, name)) for s in suites for i, name in enumerate(catalog.tasks(s))]
    except (InfraError, KeyError, ValueError) as exc:
        fail(exc)
    if as_json:
        console.print(json.dumps([{"suite": s, "index": i, "task": info.name, "instruction": info.instruction,
                                   "target": info.target, "pick_and_place": info.pick_and_place}
                                  for s, i, info in rows]), soft_wrap=True)
        return
    table = Table("suite", "#", "task", "target", "scripted")
    for s, i, info in rows:
        table.add_row(s, str(i), info.instruction, info.target, "yes" if info.pick_and_place else "")
    console.print(table)


@libero_app.command()
def scenario(suite: str = typer.Option(...), task: str = typer.Option(..., help="task name or index in the suite"),
             init_state: int = typer.Option(0, help="init state of seed 0"),
             horizon: int | None = typer.Option(None, help="default: the suite's (openpi's max_steps)"),
             perturb: list[str] = typer.Option([], help="NAME=NUMBER, repeatable"),
             cache_root: Path | None = typer.Option(None)):
    """Print a LIBERO ScenarioSpec as JSON: the base scenario, or a child of it with --perturb."""
    try:
        catalog = _catalog(cache_root)
        base = catalog.base_scenario(suite, _task_name(catalog, suite, task), horizon, init_state)
        spec = base.perturb(**_perturbations(perturb)) if perturb else base
    except (InfraError, KeyError, ValueError) as exc:
        fail(exc)
    console.print(json.dumps(spec.to_dict(), indent=1), soft_wrap=True)


@libero_app.command()
def request(ctx: typer.Context, model: str = typer.Option(...), suite: str | None = typer.Option(None),
            task: str | None = typer.Option(None), scenario_file: Path | None = typer.Option(None, "--scenario"),
            episodes: int = typer.Option(5, min=1), seed: int = typer.Option(0),
            keyframe_every: int = typer.Option(0, min=0), cache_root: Path | None = typer.Option(None)):
    """Publish a RolloutRequested for a LIBERO scenario (the LIBERO worker serves it)."""
    from producers.rollout_worker import rollout_request
    from schemas.libero_scenario import LiberoScenario

    settings = settings_of(ctx)
    try:
        if scenario_file is not None:
            spec = LiberoScenario.from_dict(json.loads(scenario_file.read_text()))
        elif suite and task:
            catalog = _catalog(cache_root)
            spec = catalog.base_scenario(suite, _task_name(catalog, suite, task))
        else:
            raise ValueError("give --scenario FILE, or --suite and --task")
        event = rollout_request(spec.to_dict(), model, list(range(seed, seed + episodes)),
                                keyframe_every=keyframe_every)
        publisher = make_publisher(settings, processes.require_bootstrap(settings), codec_of(ctx))
        publisher.publish(event)
        publisher.flush()
    except (InfraError, KeyError, ValueError, OSError) as exc:
        fail(exc)
    console.print(f"requested {episodes} episodes of {model} on {spec.scenario_id} ({spec.task}): "
                  f"{event['request_id']}")


@libero_app.command()
def worker(ctx: typer.Context, processes_: int = typer.Option(2, "--processes", min=1),
           policy_server: list[str] = typer.Option([], help="MODEL=ws://HOST:PORT, repeatable"),
           cache_root: Path | None = typer.Option(None)):
    """Serve LIBERO rollout requests in the foreground (in the LIBERO venv)."""
    from infra.libero_worker import ready_file_of, worker_command, worker_environ

    settings = settings_of(ctx)
    try:
        venv = LiberoVenv.at(cache_root)
        if not venv.ready():
            raise LiberoSetupError(f"LIBERO is not set up at {venv.root}: run `sepa-eval libero setup`")
        bootstrap = processes.resolve_bootstrap(settings)
        servers = dict(item.split("=", 1) for item in policy_server)
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        cmd = worker_command(venv, ready_file_of(settings), processes_, servers)
        code = subprocess.call(cmd, env=worker_environ(settings, bootstrap, venv), cwd=os.getcwd())
    except (InfraError, ValueError) as exc:
        fail(exc)
    raise typer.Exit(code)
