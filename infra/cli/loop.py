"""The loop: run."""

from __future__ import annotations

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from consumers.benchmark_state import derived_state, state_digest
from consumers.evidence.exceptions import EvidenceError
from consumers.report import write_report
from infra import orchestrator, processes
from infra.cli import app, codec_of, console, fail, make_publisher, settings_of
from infra.exceptions import InfraError, WaitTimeout
from producers.exceptions import ProducerError
from streams.exceptions import ConfigError

RUN_MODELS = ("oracle", "scripted-novice", "scripted-clumsy")
RUN_ID = "run"
RUN_HORIZON = 200


@app.command()
def run(ctx: typer.Context, episodes: int = typer.Option(4, min=1, help="episodes per model"),
        env: str = typer.Option("Lift"), seed: int = typer.Option(0),
        timeout: float = typer.Option(600.0, help="seconds to wait for the evidence to land and be analysed")):
    """The loop once on the embedded default: start it, register the models, evaluate each on a
    simulated scenario, wait until every episode is in the evidence log, its failure moments stored
    and every failed episode clustered, then report that finished state."""
    from producers.adapters import RobosuiteAdapter
    from producers.sim.models import load_models

    settings = settings_of(ctx)
    try:
        models = load_models()
        orchestrator.check_models(list(RUN_MODELS), models)
        scenario = RobosuiteAdapter().base_scenario(env, RUN_HORIZON)
        result = processes.up(settings)
        if result.started:
            console.print(f"started {', '.join(result.started)}")
        bootstrap = processes.require_bootstrap(settings)
        store = processes.open_store(settings)
        publisher = make_publisher(settings, bootstrap, codec_of(ctx))
        orchestrator.register_models(publisher, models)
        requests = orchestrator.request_rollouts(publisher, store, scenario, list(RUN_MODELS),
                                                 list(range(seed, seed + episodes)), run_id=RUN_ID)
        deadline = orchestrator.deadline_in(timeout)
        check = orchestrator.still_coming(settings, store, requests)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True, disable=not console.is_terminal) as bar:
            task = bar.add_task("episodes", total=len(RUN_MODELS) * episodes)
            orchestrator.wait_for_episodes(store, requests, deadline, check=check,
                                           progress=lambda done, total: bar.update(task, completed=done))
            bar.update(task, description="analysed and clustered", completed=0)
            settled = orchestrator.wait_until_settled(
                store, requests, deadline, check=check,
                progress=lambda done, total: bar.update(task, completed=done, total=total))
        state = derived_state(store)
        files = write_report(store, settings.memory_dir, settings.memory_dir / "keyframes")
    except (InfraError, EvidenceError, ProducerError, ConfigError, ValueError, OSError) as exc:
        if isinstance(exc, WaitTimeout):
            exc = WaitTimeout(f"{exc}; see {settings.run_dir / 'streams.log'} and "
                                           f"{settings.run_dir / 'rollout.log'}")
        fail(exc)
    output = f"{files.markdown} and {files.html}"
    console.print(f"{settled.episodes} episodes, {settled.failed} failed, {settled.moments} failure moments, "
                  f"{settled.clustered} failed episodes clustered; wrote {output}")
    console.print(f"state digest {state_digest(state)}")
