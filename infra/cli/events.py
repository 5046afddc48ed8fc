"""Putting events on the topics and taking them off: synth, sink, replay, sync-models, rollout,
rollout-worker."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from consumers import replay as replay_mod
from consumers.evidence.exceptions import EvidenceError
from consumers.evidence.sink import GROUP_ID, EvidenceSink
from consumers.state import online as q
from infra import orchestrator, processes, waits
from infra.cli.base import app, codec_of, console, err, fail, make_publisher, settings_of
from infra.embedded_broker import TansuBroker
from infra.exceptions import InfraError, NotRunning
from infra.kafka_clients import ensure_topics, make_consumer, make_producer, producer_config, topic_message_counts
from infra.settings import Settings
from producers.episode import CAMERA_SIZE
from producers.exceptions import ProducerError
from producers.synthetic import episodes as synthetic_episodes
from schemas.catalog import TOPICS


@app.command()
def synth(ctx: typer.Context, episodes: int = typer.Option(20, min=1), steps: int = typer.Option(100, min=1),
          seed: int = typer.Option(0), run_id: str | None = typer.Option(None)):
    """Publish schema-valid synthetic episodes and steps (deterministic by --seed)."""
    settings = settings_of(ctx)
    try:
        publisher = make_publisher(settings, processes.require_bootstrap(settings), codec_of(ctx))
        total = episodes * (steps + 2)
        with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
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
        bootstrap = processes.require_bootstrap(settings)
        store = processes.open_store(settings)
        worker = EvidenceSink(store, make_consumer(bootstrap, GROUP_ID, settings.session_timeout_ms),
                              make_producer(bootstrap), codec_of(ctx), settings.topic_prefix, settings.sink_batch_max,
                              settings.sink_linger_ms)
        totals = worker.run(threading.Event(), idle_exit_s=until_idle)
    except (InfraError, EvidenceError) as exc:
        fail(exc)
    console.print(f"stored {totals.stored}, dead-lettered {totals.dead_lettered}, consumed {totals.consumed}")


@app.command()
def replay(ctx: typer.Context,
           verify: bool = typer.Option(False, "--verify", help="exit 1 when the rebuilt state differs"),
           republish: bool = typer.Option(False, "--republish", help=(
               "first publish the store's log into topics: a private embedded broker's, which nothing else "
               "reads (with SEPA_BOOTSTRAP_SERVERS, that broker's, only when its topics are empty)")),
           into: str | None = typer.Option(None, help="database to rebuild into (default <db>_rebuild)")):
    """Rebuild the evidence store from the topics into an empty database and compare digests."""
    settings = settings_of(ctx)
    try:
        if republish and settings.embedded_broker:
            # Republished into the stack's own topics, every event would reach its consumers a second
            # time and they would act on it again (run requests, re-detect, re-decide).
            with TansuBroker(settings.run_dir / "replay-broker.log") as private:
                console.print(f"republishing into a private embedded broker at {private.bootstrap_servers}")
                before, after, differences, target = _replay(ctx, settings, private.bootstrap_servers, True, into)
        else:
            # The broker first: a rebuild drops its target database, which must not happen for nothing.
            bootstrap = processes.require_bootstrap(settings)
            before, after, differences, target = _replay(ctx, settings, bootstrap, republish, into)
    except (InfraError, EvidenceError, ProducerError, ValueError) as exc:
        fail(exc)
    console.print(f"digest before (live {settings.clickhouse_database}): {before}")
    console.print(f"digest after  (rebuilt {target}):  {after}")
    if differences:
        err.print(f"[red]derived state differs:[/red] {escape(json.dumps(differences, default=str)[:2000])}")
        if verify:
            raise typer.Exit(1)
    else:
        console.print("[green]identical[/green]")


def _replay(ctx: typer.Context, settings: Settings, bootstrap: str, republish: bool, into: str | None):
    store = processes.open_store(settings)
    if republish:
        ensure_topics(bootstrap, settings.topic_prefix, timeout=settings.broker_timeout_s)
        held = {t: n for t, n in topic_message_counts(bootstrap, [t.full_name(settings.topic_prefix) for t in TOPICS],
                                                      timeout=settings.broker_timeout_s).items() if n}
        if held:
            raise ValueError(f"--republish: the topics at {bootstrap} hold events already ({sum(held.values())}: "
                             f"{', '.join(f'{t} {n}' for t, n in held.items())}); republished, each would be there "
                             "twice and its consumers would act on it again. Replay without --republish")
        counts = replay_mod.republish(store, make_publisher(settings, bootstrap, codec_of(ctx)))
        console.print(f"republished {sum(counts.values())} events: {counts}")
    target = into or f"{settings.clickhouse_database}_rebuild"
    with console.status(f"rebuilding {target} from the topics"):
        rebuilt = replay_mod.rebuild(
            store, lambda group: make_consumer(bootstrap, group, settings.session_timeout_ms),
            codec_of(ctx), settings.topic_prefix, target, broker=bootstrap)
    before, after, differences = replay_mod.compare(store, rebuilt)
    return before, after, differences, target


def _scenario(env: str, scenario_file: Path | None, horizon: int) -> dict:
    """The request's scenario: the --scenario file's, or env's base one. Bad input (an unreadable
    file, not JSON, not a scenario) exits 2 with one line naming the file and what is wrong."""
    from producers.adapters import RobosuiteAdapter
    from schemas.scenario import ScenarioSpec

    if scenario_file is None:
        try:
            return RobosuiteAdapter().base_scenario(env, horizon)
        except ValueError as exc:
            fail(ValueError(f"--env: {exc}"), 2)
    try:
        raw = json.loads(scenario_file.read_text())
    except OSError as exc:
        fail(OSError(f"--scenario {scenario_file}: cannot read it ({exc.strerror or exc})"), 2)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        fail(ValueError(f"--scenario {scenario_file}: not a JSON document ({exc})"), 2)
    try:
        return ScenarioSpec.from_dict(raw).to_dict()
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        fail(ValueError(f"--scenario {scenario_file}: not a scenario: {exc}"), 2)


@app.command("sync-models")
def sync_models(ctx: typer.Context,
                models_file: Path | None = typer.Option(
                    None, help="default: the models_file setting, else the built-in models.yaml")):
    """Publish a ModelRegistered event for every model in the registry file."""
    from producers.sim.models import load_models

    settings = settings_of(ctx)
    try:
        models_file = models_file or settings.models_file
        models = load_models(models_file)
        publisher = make_publisher(settings, processes.require_bootstrap(settings), codec_of(ctx))
        orchestrator.register_models(publisher, models)
    except (InfraError, ProducerError, ValueError, OSError) as exc:
        fail(exc)
    console.print(f"registered {len(models)} models: {', '.join(m.model_id for m in models)}")


def require_rollout_worker(settings: Settings, bootstrap: str) -> None:
    """A rollout worker must serve the requests: `up`'s, one started by hand on this memory dir, or
    (on a broker that reports group members) one elsewhere."""
    if not processes.rollout_workers(settings, bootstrap):
        raise NotRunning(f"no rollout worker is running under {settings.run_dir} or in consumer group "
                         f"sepa-rollout-workers on {bootstrap}: nothing would serve rollout.requests "
                         "(run `sepa-eval up`, which starts one, or `sepa-eval rollout-worker`)")


def require_libero_worker(settings: Settings, bootstrap: str) -> None:
    """LIBERO's requests are served by the LIBERO worker alone (its own venv)."""
    if not processes.libero_workers(settings, bootstrap):
        raise NotRunning(f"no LIBERO worker is running under {settings.run_dir} or in its consumer group on "
                         f"{bootstrap}: nothing would serve LIBERO's requests (`sepa-eval libero setup`, then "
                         "`sepa-eval up` starts one)")


def require_pipeline(settings: Settings) -> None:
    """The episodes are awaited in the evidence log: something must be storing them."""
    if settings.embedded_store and not processes.RunState.read(settings).pipeline_alive:
        raise NotRunning(f"the pipeline is not running under {settings.run_dir}: nothing would store the "
                         "episodes (run `sepa-eval up`)")


@app.command()
def rollout(ctx: typer.Context, model: str = typer.Option(..., help="a model_id from models.yaml"),
            env: str = typer.Option("Lift", help="the robosuite task"),
            scenario_file: Path | None = typer.Option(None, "--scenario", help="a scenario JSON file (robosuite)"),
            benchmark: str = typer.Option("robosuite", help="robosuite, or libero (the LIBERO worker serves it: "
                                                            "`sepa-eval libero setup` first)"),
            suite: str = typer.Option("libero_object", help="--benchmark libero: the LIBERO suite"),
            tasks: str | None = typer.Option(None, help="--benchmark libero: its tasks, indices or names, "
                                                        "comma-separated (default: every task of the suite)"),
            episodes: int = typer.Option(5, min=1), seed: int = typer.Option(0),
            horizon: int = typer.Option(200, help="robosuite (LIBERO tasks keep their suite's horizon)"),
            keyframe_every: int = typer.Option(0, min=0),
            cameras: str = typer.Option("", help="record these cameras at every step, comma-separated "
                                                 "(e.g. agentview,robot0_eye_in_hand): demonstrations with pixels"),
            camera_size: int = typer.Option(CAMERA_SIZE, min=16, max=1024, help="side of the square camera frames, px"),
            timeout: float = typer.Option(600.0, help="seconds to wait for the episodes to land")):
    """Publish a RolloutRequested and wait until its episodes are in the evidence log (the rollout
    worker that `up` started runs them). With --cameras every step keeps what those cameras saw
    (frames in the memory dir's keyframe store, by hash): `export-episodes --format lerobot`
    writes them as LeRobot videos. With --benchmark libero, one request per task of the suite (the
    instruction names the object): multi-task demonstrations."""
    from infra.cli.loop import libero_base
    from producers.sim.models import load_models

    settings = settings_of(ctx)
    try:
        orchestrator.check_models([model], load_models(settings.models_file))
        if benchmark == "libero":
            scenarios = list(libero_base(suite, tasks))
        elif benchmark == "robosuite":
            scenarios = [_scenario(env, scenario_file, horizon)]
        else:
            raise ValueError(f"--benchmark must be robosuite or libero, got {benchmark!r}")
        bootstrap = processes.require_bootstrap(settings)
        require_rollout_worker(settings, bootstrap)
        if benchmark == "libero":
            require_libero_worker(settings, bootstrap)
        require_pipeline(settings)
        store = processes.open_store(settings)
        publisher = make_publisher(settings, bootstrap, codec_of(ctx))
        seeds = list(range(seed, seed + episodes))
        camera_names = tuple(c.strip() for c in cameras.split(",") if c.strip())
        requests = [request for scenario in scenarios
                    for request in orchestrator.request_rollouts(
                        publisher, store, scenario, [model], seeds, run_id="cli", keyframe_every=keyframe_every,
                        cameras=camera_names, camera_size=camera_size)]
        what = requests[0]["scenario_id"] if len(requests) == 1 else f"{len(requests)} {suite} tasks"
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True, disable=not console.is_terminal) as bar:
            task = bar.add_task(f"{model} on {what}", total=episodes * len(requests))
            waits.wait_for_episodes(store, requests, waits.deadline_in(timeout),
                                    progress=lambda done, total: bar.update(task, completed=done),
                                    check=waits.still_coming(settings, libero=benchmark == "libero"),
                                    requests_topic=waits.requests_topic(settings.topic_prefix))
        ended = {r["request_id"]: q.episode_outcomes(store, [r["request_id"]]) for r in requests}
    except (InfraError, EvidenceError, ProducerError, ValueError, KeyError, OSError) as exc:
        fail(exc)
    table = Table("scenario", "seed", "episode", "termination", "steps")
    for request in requests:
        for seed_, episode_id, termination, steps, _ in ended[request["request_id"]]:
            table.add_row(request["scenario_id"], str(seed_), episode_id, termination, str(steps))
    console.print(table)
    for request in requests:
        rows = ended[request["request_id"]]
        console.print(f"{model} on {request['scenario_id']}: {sum(bool(r[4]) for r in rows)}/{len(rows)} successes")


@app.command("rollout-worker")
def rollout_worker(ctx: typer.Context, processes_: int | None = typer.Option(
        None, "--processes", min=1, help="simulator processes (default: the rollout_processes setting)")):
    """Serve rollout.requests until interrupted (`up` runs one in the background)."""
    import signal

    from producers.publisher import Publisher
    from producers.rollout_worker import GROUP_ID, MAX_POLL_INTERVAL_MS, RolloutPool, RolloutWorker

    settings = settings_of(ctx)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        bootstrap = processes.require_bootstrap(settings)
    except InfraError as exc:
        fail(exc)
    codec = codec_of(ctx)
    pool = RolloutPool(producer_config(bootstrap), settings.topic_prefix, codec, settings.memory_dir / "keyframes",
                       processes_ or settings.rollout_processes, models_path=settings.models_file)
    consumer = make_consumer(bootstrap, GROUP_ID, settings.session_timeout_ms,
                             **{"max.poll.interval.ms": MAX_POLL_INTERVAL_MS})
    worker = RolloutWorker(pool, consumer,
                           Publisher(make_producer(bootstrap), settings.topic_prefix, codec), codec)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        worker.run(stop, on_assigned=lambda: processes.write_ready(settings, processes.ROLLOUT.name))
    except KeyboardInterrupt:
        pass
    finally:
        pool.close()
