"""Putting events on the topics and taking them off: synth, sink, replay, sync-models, rollout,
rollout-worker."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import typer
from confluent_kafka import Consumer
from rich.progress import Progress
from rich.table import Table

from consumers import replay as replay_mod
from consumers.evidence.exceptions import EvidenceError
from consumers.evidence.sink import GROUP_ID, EvidenceSink
from infra import processes
from infra.cli import app, console, err, fail, make_publisher, settings_of
from infra.exceptions import InfraError
from infra.kafka_clients import consumer_config, ensure_topics, make_producer
from producers.exceptions import ProducerError
from producers.synthetic import episodes as synthetic_episodes
from schemas.codec import Codec
from schemas.registry import schema_ids_for


@app.command()
def synth(ctx: typer.Context, episodes: int = typer.Option(20, min=1), steps: int = typer.Option(100, min=1),
          seed: int = typer.Option(0), run_id: str | None = typer.Option(None)):
    """Publish schema-valid synthetic episodes and steps (deterministic by --seed)."""
    settings = settings_of(ctx)
    try:
        publisher = make_publisher(settings, processes.resolve_bootstrap(settings))
        total = episodes * (steps + 2)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("publishing", total=total)
            for i, event in enumerate(synthetic_episodes(episodes, steps, seed, run_id or f"synth-{seed}")):
                publisher.publish(event)
                if i % 1000 == 0:
                    progress.update(task, completed=i)
        publisher.flush()
    except (InfraError, ProducerError) as exc:
        fail(exc)
    console.print(f"published {publisher.published} events ({episodes} episodes x {steps} steps)")


@app.command()
def sink(ctx: typer.Context, until_idle: float | None = typer.Option(
        None, help="exit after this many seconds without messages")):
    """Run the evidence sink in the foreground (`up` runs it in the background)."""
    settings = settings_of(ctx)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        store = processes.open_store(settings)
        bootstrap = processes.resolve_bootstrap(settings)
        worker = EvidenceSink(store, Consumer(consumer_config(bootstrap, GROUP_ID, settings.session_timeout_ms)),
                              make_producer(bootstrap), Codec(schema_ids_for(settings.schema_registry_url)),
                              settings.topic_prefix, settings.sink_batch_max, settings.sink_linger_ms)
        totals = worker.run(threading.Event(), idle_exit_s=until_idle)
    except (InfraError, EvidenceError) as exc:
        fail(exc)
    console.print(f"stored {totals.stored}, dead-lettered {totals.dead_lettered}, consumed {totals.consumed}")


@app.command()
def replay(ctx: typer.Context,
           verify: bool = typer.Option(False, "--verify", help="exit 1 when the rebuilt state differs"),
           republish: bool = typer.Option(False, "--republish", help="first publish the store's log into the topics"),
           into: str | None = typer.Option(None, help="database to rebuild into (default <db>_rebuild)")):
    """Rebuild the evidence store from the topics into an empty database and compare digests."""
    settings = settings_of(ctx)
    try:
        store = processes.open_store(settings)
        bootstrap = processes.resolve_bootstrap(settings)
        if republish:
            ensure_topics(bootstrap, settings.topic_prefix)
            counts = replay_mod.republish(store, make_publisher(settings, bootstrap))
            console.print(f"republished {sum(counts.values())} events: {counts}")
        target = into or f"{settings.clickhouse_database}_rebuild"
        with console.status(f"rebuilding {target} from the topics"):
            rebuilt = replay_mod.rebuild(
                store, lambda group: Consumer(consumer_config(bootstrap, group, settings.session_timeout_ms)),
                Codec(schema_ids_for(settings.schema_registry_url)), settings.topic_prefix, target, broker=bootstrap)
        before, after, differences = replay_mod.compare(store, rebuilt)
    except (InfraError, EvidenceError, ProducerError, ValueError) as exc:
        fail(exc)
    console.print(f"digest before (live {settings.clickhouse_database}): {before}")
    console.print(f"digest after  (rebuilt {target}):  {after}")
    if differences:
        err.print(f"[red]derived state differs:[/red] {json.dumps(differences, default=str)[:2000]}")
        if verify:
            raise typer.Exit(1)
    else:
        console.print("[green]identical[/green]")


def _scenario(env: str, scenario_file: Path | None, horizon: int) -> dict:
    from producers.adapters import RobosuiteAdapter
    from producers.sim.scenario import ScenarioSpec

    if scenario_file is not None:
        return ScenarioSpec.from_dict(json.loads(scenario_file.read_text())).to_dict()
    return RobosuiteAdapter().base_scenario(env, horizon)


@app.command("sync-models")
def sync_models(ctx: typer.Context,
                models_file: Path | None = typer.Option(None, help="default: the built-in models.yaml")):
    """Publish a ModelRegistered event for every model in the registry file."""
    from producers.sim.models import load_models
    from schemas.events import make_event

    settings = settings_of(ctx)
    try:
        models = load_models(models_file) if models_file else load_models()
        publisher = make_publisher(settings, processes.resolve_bootstrap(settings))
        for m in models:
            publisher.publish(make_event("ModelRegistered", (m.model_id, m.version), "sync-models", "sync-models",
                                         model_id=m.model_id, version=m.version, kind=m.kind,
                                         description=m.description, params=m.params()))
        publisher.flush()
    except (InfraError, ProducerError, ValueError, OSError) as exc:
        fail(exc)
    console.print(f"registered {len(models)} models: {', '.join(m.model_id for m in models)}")


@app.command()
def rollout(ctx: typer.Context, model: str = typer.Option(..., help="a model_id from models.yaml"),
            env: str = typer.Option("Lift"), scenario_file: Path | None = typer.Option(None, "--scenario"),
            episodes: int = typer.Option(5, min=1), seed: int = typer.Option(0), horizon: int = typer.Option(200),
            keyframe_every: int = typer.Option(0, min=0), processes_: int = typer.Option(2, "--processes", min=1)):
    """Run simulated episodes directly (no request topic) and publish their events."""
    from producers.rollout_worker import RolloutPool, rollout_request

    settings = settings_of(ctx)
    try:
        bootstrap = processes.resolve_bootstrap(settings)
        request = rollout_request(_scenario(env, scenario_file, horizon), model, list(range(seed, seed + episodes)),
                                  keyframe_every=keyframe_every)
        make_publisher(settings, bootstrap).publish(request)
        pool = RolloutPool(bootstrap, settings.topic_prefix, settings.memory_dir / "keyframes", processes_)
        try:
            with console.status(f"{episodes} episodes of {model} on {request['scenario_id']}"):
                summaries = pool.run(request)
        finally:
            pool.close()
    except (InfraError, ProducerError, ValueError, KeyError, OSError) as exc:
        fail(exc)
    table = Table("seed", "episode", "termination", "steps")
    for s in summaries:
        table.add_row(str(s.seed), s.episode_id, s.termination, str(s.steps))
    console.print(table)
    successes = sum(s.success for s in summaries)
    console.print(f"{model} on {request['scenario_id']}: {successes}/{len(summaries)} successes")


@app.command("rollout-worker")
def rollout_worker(ctx: typer.Context, processes_: int = typer.Option(2, "--processes", min=1)):
    """Serve rollout.requests until interrupted."""
    import signal

    from producers.rollout_worker import RolloutPool, RolloutWorker

    settings = settings_of(ctx)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    bootstrap = processes.resolve_bootstrap(settings)
    pool = RolloutPool(bootstrap, settings.topic_prefix, settings.memory_dir / "keyframes", processes_)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        RolloutWorker(pool, bootstrap, settings.topic_prefix, settings.session_timeout_ms).run(stop)
    except KeyboardInterrupt:
        pass
    finally:
        pool.close()
