"""The loop: run."""

from __future__ import annotations

import time

import typer

from consumers.benchmark_state import derived_state, scores, state_digest
from infra import processes
from infra.cli import app, console, fail, settings_of
from infra.cli.events import rollout, sync_models
from infra.cli.read import report
from infra.cli.stack import up
from infra.exceptions import InfraError

RUN_MODELS = ("oracle", "scripted-novice", "scripted-clumsy")


@app.command()
def run(ctx: typer.Context, episodes: int = typer.Option(4, min=1, help="episodes per model"),
        env: str = typer.Option("Lift"), seed: int = typer.Option(0),
        timeout: float = typer.Option(300.0, help="seconds to wait for the evidence to land")):
    """The loop once on the embedded default: start it, register the models, evaluate each on a
    simulated scenario, wait until every event landed in the evidence log, report."""
    settings = settings_of(ctx)
    up(ctx)
    sync_models(ctx, models_file=None)
    for model in RUN_MODELS:
        rollout(ctx, model=model, env=env, scenario_file=None, episodes=episodes, seed=seed, horizon=200,
                keyframe_every=0, processes_=2)
    store = processes.open_store(settings)
    expected = len(RUN_MODELS) * episodes
    deadline = time.monotonic() + timeout
    landed = 0
    with console.status("waiting for the evidence sink"):
        while time.monotonic() < deadline:
            landed = sum(s.episodes + s.invalid for s in scores(store) if s.model_id in RUN_MODELS)
            if landed >= expected:
                break
            time.sleep(0.5)
    if landed < expected:
        fail(InfraError(f"only {landed} of {expected} episodes landed within {timeout}s; "
                         f"see {settings.run_dir / 'pipeline.log'}"))
    report(ctx, output=settings.memory_dir)  # report.md and report.html in the memory dir
    console.print(f"state digest {state_digest(derived_state(store))}")
