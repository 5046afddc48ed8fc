"""The `sepa-eval` command line.

Usage:
    sepa-eval up                 # embedded broker + pipeline (evidence sink) in the background
    sepa-eval run                # the whole loop once, on the embedded default
    sepa-eval status [--json]    # processes, topics and evidence counts
    sepa-eval synth --episodes 100 --steps 200 --seed 7
    sepa-eval replay --verify    # rebuild the store from the topics; exit 1 if the state differs
    sepa-eval replay --republish # store -> topics (the embedded broker forgets on restart)
    sepa-eval report --output eval_memory/report.md
    sepa-eval down

Global options come before the command: `sepa-eval --memory-dir /tmp/m status`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from consumers import replay as replay_mod
from consumers.benchmark_state import derived_state, scores, state_digest, table_counts
from consumers.evidence.exceptions import EvidenceError
from consumers.evidence.sink import EvidenceSink
from consumers.report import render_markdown
from infra import processes
from infra.exceptions import InfraError
from infra.kafka_clients import ensure_topics, make_producer, topic_message_counts
from infra.settings import Settings, load_settings
from producers.exceptions import ProducerError
from producers.publisher import Publisher
from producers.synthetic import episodes as synthetic_episodes
from schemas.catalog import TOPICS
from schemas.codec import Codec
from schemas.registry import schema_ids_for

app = typer.Typer(help="SEPA-Eval: a robot-policy benchmark that gets harder by itself.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
console = Console()
err = Console(stderr=True)


def _settings(ctx: typer.Context) -> Settings:
    return ctx.obj


@app.callback()
def main(ctx: typer.Context,
         memory_dir: Path | None = typer.Option(None, "--memory-dir", help="default ./eval_memory or SEPA_MEMORY_DIR"),
         config: Path | None = typer.Option(None, "--config", help="TOML settings file (or SEPA_CONFIG)")):
    try:
        ctx.obj = load_settings(config_file=config, memory_dir=memory_dir)
    except (ValueError, FileNotFoundError) as exc:
        err.print(f"[red]bad configuration:[/red] {exc}")
        raise typer.Exit(2) from exc


def _publisher(settings: Settings, bootstrap: str) -> Publisher:
    codec = Codec(schema_ids_for(settings.schema_registry_url))
    return Publisher(make_producer(bootstrap), settings.topic_prefix, codec)


def _fail(exc: Exception) -> None:
    err.print(f"[red]error:[/red] {exc}")
    raise typer.Exit(1)


@app.command()
def up(ctx: typer.Context):
    """Start the embedded broker (unless SEPA_BOOTSTRAP_SERVERS is set) and the pipeline."""
    settings = _settings(ctx)
    try:
        state = processes.up(settings)
    except (InfraError, EvidenceError) as exc:
        _fail(exc)
    console.print(f"broker [bold]{settings.bootstrap_servers or state.bootstrap}[/bold]; pipeline pid "
                  f"{state.pipeline_pid}; store {state.store_url or settings.clickhouse_url}")


@app.command()
def down(ctx: typer.Context):
    """Stop the pipeline, then the embedded broker."""
    stopped = processes.down(_settings(ctx))
    console.print("stopped " + ", ".join(stopped) if stopped else "nothing was running")


@app.command()
def status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="machine-readable")):
    """Processes, topics and evidence counts per table."""
    settings = _settings(ctx)
    state = processes.RunState.read(settings)
    report: dict = {"memory_dir": str(settings.memory_dir), "broker": processes.broker_status(settings, state),
                    "streams": {"pid": state.streams_pid if state.streams_alive else None},
                    "pipeline": {"pid": state.pipeline_pid if state.pipeline_alive else None,
                                 "store": state.store_url or settings.clickhouse_url or f"chdb://{settings.chdb_path}"}}
    try:
        report["evidence"] = table_counts(processes.open_store(settings))
    except EvidenceError as exc:
        report["evidence"] = {"error": str(exc)}
    if as_json:
        print(json.dumps(report, indent=1))
        return
    console.print(f"memory dir {report['memory_dir']}")
    broker = report["broker"]
    console.print(f"broker   {broker['mode']} {broker['bootstrap'] or '-'} "
                  f"{'[green]up[/green]' if broker['answering'] else '[red]down[/red]'}")
    pid = report["pipeline"]["pid"]
    console.print(f"pipeline {f'[green]pid {pid}[/green]' if pid else '[red]not running[/red]'}"
                  f"  store {report['pipeline']['store']}")
    streams_pid = report["streams"]["pid"]
    console.print(f"streams  {f'[green]pid {streams_pid}[/green]' if streams_pid else '[red]not running[/red]'}"
                  " (failure detector + clusterer)")
    table = Table("evidence table", "events")
    for name, count in (report["evidence"].items() if "error" not in report["evidence"] else []):
        table.add_row(name, str(count))
    if "error" in report["evidence"]:
        err.print(f"[red]{report['evidence']['error']}[/red]")
    console.print(table)


@app.command()
def topics(ctx: typer.Context):
    """Create the catalog's topics (idempotent) and list them with message counts."""
    settings = _settings(ctx)
    try:
        bootstrap = processes.resolve_bootstrap(settings)
        created = ensure_topics(bootstrap, settings.topic_prefix)
        counts = topic_message_counts(bootstrap, [t.full_name(settings.topic_prefix) for t in TOPICS])
    except InfraError as exc:
        _fail(exc)
    table = Table("topic", "partitions", "retention", "messages", "created now")
    for t in TOPICS:
        name = t.full_name(settings.topic_prefix)
        retention = "forever" if t.retention_ms < 0 else f"{t.retention_ms // 86_400_000} d"
        table.add_row(name, str(t.partitions), retention, str(counts.get(name, 0)), "yes" if name in created else "")
    console.print(table)


@app.command()
def synth(ctx: typer.Context, episodes: int = typer.Option(20, min=1), steps: int = typer.Option(100, min=1),
          seed: int = typer.Option(0), run_id: str | None = typer.Option(None)):
    """Publish schema-valid synthetic episodes and steps (deterministic by --seed)."""
    settings = _settings(ctx)
    try:
        publisher = _publisher(settings, processes.resolve_bootstrap(settings))
        total = episodes * (steps + 2)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("publishing", total=total)
            for i, event in enumerate(synthetic_episodes(episodes, steps, seed, run_id or f"synth-{seed}")):
                publisher.publish(event)
                if i % 1000 == 0:
                    progress.update(task, completed=i)
        publisher.flush()
    except (InfraError, ProducerError) as exc:
        _fail(exc)
    console.print(f"published {publisher.published} events ({episodes} episodes x {steps} steps)")


@app.command()
def sink(ctx: typer.Context, until_idle: float | None = typer.Option(
        None, help="exit after this many seconds without messages")):
    """Run the evidence sink in the foreground (`up` runs it in the background)."""
    settings = _settings(ctx)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        store = processes.open_store(settings)
        worker = EvidenceSink(store, processes.resolve_bootstrap(settings), settings.topic_prefix,
                              settings.session_timeout_ms, settings.sink_batch_max, settings.sink_linger_ms,
                              schema_ids=schema_ids_for(settings.schema_registry_url))
        totals = worker.run(threading.Event(), idle_exit_s=until_idle)
    except (InfraError, EvidenceError) as exc:
        _fail(exc)
    console.print(f"stored {totals.stored}, dead-lettered {totals.dead_lettered}, consumed {totals.consumed}")


@app.command()
def replay(ctx: typer.Context,
           verify: bool = typer.Option(False, "--verify", help="exit 1 when the rebuilt state differs"),
           republish: bool = typer.Option(False, "--republish", help="first publish the store's log into the topics"),
           into: str | None = typer.Option(None, help="database to rebuild into (default <db>_rebuild)")):
    """Rebuild the evidence store from the topics into an empty database and compare digests."""
    settings = _settings(ctx)
    try:
        store = processes.open_store(settings)
        bootstrap = processes.resolve_bootstrap(settings)
        if republish:
            ensure_topics(bootstrap, settings.topic_prefix)
            counts = replay_mod.republish(store, _publisher(settings, bootstrap))
            console.print(f"republished {sum(counts.values())} events: {counts}")
        target = into or f"{settings.clickhouse_database}_rebuild"
        with console.status(f"rebuilding {target} from the topics"):
            rebuilt = replay_mod.rebuild(store, bootstrap, settings.topic_prefix, settings.session_timeout_ms, target)
        before, after, differences = replay_mod.compare(store, rebuilt)
    except (InfraError, EvidenceError, ProducerError, ValueError) as exc:
        _fail(exc)
    console.print(f"digest before (live {settings.clickhouse_database}): {before}")
    console.print(f"digest after  (rebuilt {target}):  {after}")
    if differences:
        err.print(f"[red]derived state differs:[/red] {json.dumps(differences, default=str)[:2000]}")
        if verify:
            raise typer.Exit(1)
    else:
        console.print("[green]identical[/green]")


@app.command()
def report(ctx: typer.Context, output: Path | None = typer.Option(None, help="write markdown here")):
    """Benchmark state from the evidence log: scores with 95% intervals, counts, the state digest."""
    settings = _settings(ctx)
    try:
        store = processes.open_store(settings)
        text = render_markdown(derived_state(store), scores(store))
    except (InfraError, EvidenceError) as exc:
        _fail(exc)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        console.print(f"wrote {output}")
    else:
        print(text)


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

    settings = _settings(ctx)
    try:
        models = load_models(models_file) if models_file else load_models()
        publisher = _publisher(settings, processes.resolve_bootstrap(settings))
        for m in models:
            publisher.publish(make_event("ModelRegistered", (m.model_id, m.version), "sync-models", "sync-models",
                                         model_id=m.model_id, version=m.version, kind=m.kind,
                                         description=m.description, params=m.params()))
        publisher.flush()
    except (InfraError, ProducerError, ValueError, OSError) as exc:
        _fail(exc)
    console.print(f"registered {len(models)} models: {', '.join(m.model_id for m in models)}")


@app.command()
def rollout(ctx: typer.Context, model: str = typer.Option(..., help="a model_id from models.yaml"),
            env: str = typer.Option("Lift"), scenario_file: Path | None = typer.Option(None, "--scenario"),
            episodes: int = typer.Option(5, min=1), seed: int = typer.Option(0), horizon: int = typer.Option(200),
            keyframe_every: int = typer.Option(0, min=0), processes_: int = typer.Option(2, "--processes", min=1)):
    """Run simulated episodes directly (no request topic) and publish their events."""
    from producers.rollout_worker import RolloutPool, rollout_request

    settings = _settings(ctx)
    try:
        bootstrap = processes.resolve_bootstrap(settings)
        request = rollout_request(_scenario(env, scenario_file, horizon), model, list(range(seed, seed + episodes)),
                                  keyframe_every=keyframe_every)
        _publisher(settings, bootstrap).publish(request)
        pool = RolloutPool(bootstrap, settings.topic_prefix, settings.memory_dir / "keyframes", processes_)
        try:
            with console.status(f"{episodes} episodes of {model} on {request['scenario_id']}"):
                summaries = pool.run(request)
        finally:
            pool.close()
    except (InfraError, ProducerError, ValueError, KeyError, OSError) as exc:
        _fail(exc)
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

    settings = _settings(ctx)
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


RUN_MODELS = ("oracle", "scripted-novice", "scripted-clumsy")


@app.command()
def run(ctx: typer.Context, episodes: int = typer.Option(4, min=1, help="episodes per model"),
        env: str = typer.Option("Lift"), seed: int = typer.Option(0),
        timeout: float = typer.Option(300.0, help="seconds to wait for the evidence to land")):
    """The loop once on the embedded default: start it, register the models, evaluate each on a
    simulated scenario, wait until every event landed in the evidence log, report."""
    settings = _settings(ctx)
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
            landed = sum(s.episodes for s in scores(store) if s.model_id in RUN_MODELS)
            if landed >= expected:
                break
            time.sleep(0.5)
    if landed < expected:
        _fail(InfraError(f"only {landed} of {expected} episodes landed within {timeout}s; "
                         f"see {settings.run_dir / 'pipeline.log'}"))
    report(ctx, output=settings.memory_dir / "report.md")
    console.print(f"state digest {state_digest(derived_state(store))}")


if __name__ == "__main__":
    app()
