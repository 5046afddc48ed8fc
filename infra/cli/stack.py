"""Starting, stopping and looking at the stack: up, down, status, topics."""

from __future__ import annotations

import json

import typer
from rich.markup import escape
from rich.table import Table

from consumers.evidence.exceptions import EvidenceError
from consumers.state import MemoryFigures, memory_figures
from infra import processes, supervisor
from infra.cli.base import app, codec_of, console, err, fail, republished_line, settings_of
from infra.cli.read import open_existing_store
from infra.exceptions import InfraError
from infra.kafka_clients import ensure_topics, topic_message_counts
from infra.lag import consumer_lag
from producers.sim.exceptions import ModelConfigError
from schemas.catalog import TOPICS
from streams.exceptions import ConfigError


@app.command()
def up(ctx: typer.Context):
    """Start the embedded broker (unless SEPA_BOOTSTRAP_SERVERS is set), the pipeline, the streams
    worker and the rollout worker; return once every one of them is ready."""
    settings = settings_of(ctx)
    try:
        result = supervisor.up(settings, codec_of(ctx))
    except (InfraError, EvidenceError, ConfigError, ModelConfigError, OSError) as exc:
        fail(exc)
    state = result.state
    what = (f"broker {settings.bootstrap_servers or state.bootstrap}; pipeline pid {state.pipeline_pid}; "
            f"streams worker pid {state.streams_pid}; rollout worker pid {state.rollout_pid}; "
            f"store {state.store_url or settings.clickhouse_url}")
    if result.started:
        console.print(f"started {', '.join(result.started)}. Ready: {escape(what)}")
    else:
        console.print(f"already running, nothing started: {escape(what)}")
    if result.republished:
        console.print(republished_line(result.republished))


@app.command()
def down(ctx: typer.Context):
    """Stop the streams and rollout workers, the pipeline, then the embedded broker."""
    try:
        stopped = supervisor.down(settings_of(ctx))
    except (InfraError, OSError) as exc:
        fail(exc)
    console.print("stopped " + ", ".join(stopped) if stopped else "nothing was running")


@app.command()
def status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="machine-readable")):
    """Processes, evidence per table, memory and evolution figures (episodes, failures by type,
    clusters, candidates, promotions, benchmark version) and consumer lag per group."""
    settings = settings_of(ctx)
    state = processes.RunState.read(settings)
    report: dict = {"memory_dir": str(settings.memory_dir), "broker": processes.broker_status(settings, state),
                    **processes.process_status(settings, state), "memory": None}
    try:
        figures = memory_figures(open_existing_store(settings))
        report["evidence"] = dict(figures.events)
        report["memory"] = _memory(figures)
        report["memory"]["unserved_models"] = _unserved(settings, figures.model_versions)
    except EvidenceError as exc:
        report["evidence"] = {"error": str(exc)}
    report["lag"] = _lag(settings, state, report["broker"])
    if as_json:
        print(json.dumps(report, indent=1))
        return
    console.print(f"memory dir {escape(report['memory_dir'])}")
    broker = report["broker"]
    console.print(f"broker   {broker['mode']} {broker['bootstrap'] or '-'} "
                  f"{'[green]up[/green]' if broker['answering'] else '[red]down[/red]'}")
    if broker["error"]:
        err.print(f"broker: {escape(broker['error'])}")
    for key, label, what in (("pipeline", "pipeline", f"store {report['pipeline']['store']}"),
                             ("streams", "streams ", "failure detector + clusterer"),
                             ("rollout_worker", "rollout ", "serves rollout.requests"),
                             ("critics", "critics ", "validates candidates"),
                             ("libero_worker", "libero  ", "serves LIBERO's rollout requests (when set up)")):
        pid = report[key]["pid"]
        console.print(f"{label} {f'[green]pid {pid}[/green]' if pid else '[red]not running[/red]'}  {escape(what)}")
    for model_id, pid in report["policy_servers"].items():
        console.print(f"policy   [green]pid {pid}[/green]  serves {escape(model_id)}")
    if "error" in report["evidence"]:
        err.print(escape(report["evidence"]["error"]))
    else:
        _print_memory(report["evidence"], report["memory"])
    lag = report["lag"]
    if "error" in lag:
        console.print(f"consumer lag: {lag['error']}", soft_wrap=True, highlight=False)
    elif lag["groups"]:
        table = Table("consumer group", "lag (messages)", "per topic")
        for group, entry in lag["groups"].items():
            table.add_row(group, str(entry["lag"]), ", ".join(f"{t} {n}" for t, n in entry["topics"].items() if n)
                          or "-")
        console.print(table)
    else:
        console.print("consumer lag: no consumer group has committed offsets yet")


def _unserved(settings, model_versions) -> list[str] | str:
    """Registered models that the registry file the rollout workers serve does not hold (a stray
    registration: nothing sweeps or validates them)."""
    from producers.sim.exceptions import ModelConfigError
    from producers.sim.models import load_models

    try:
        served = {m.model_id for m in load_models(settings.models_file)}
    except ModelConfigError as exc:
        return f"unknown: {exc}"
    return sorted(set(model_versions) - served)


def _memory(f: MemoryFigures) -> dict:
    return {"episodes": f.episodes, "trials": f.trials, "models": f.models,
            "model_versions": dict(f.model_versions),
            "failures_by_type": {t.failure_type: t.moments for t in f.failures},
            "failures_recovered": {t.failure_type: t.recovered for t in f.failures},
            "clusters": f.clusters, "noise_episodes": f.noise_episodes, "candidates": f.candidates,
            "promotions": f.promotions, "retirements": f.retirements, "benchmark_version": f.benchmark_version,
            "active_scenarios": f.active_scenarios, "open_reviews": f.open_reviews, "cycles": f.cycles,
            "dead_letters": f.dead_letters,
            "funnel": {r.generator: {"infeasible": r.infeasible, "proposed": r.proposed,
                                     "with_verdicts": r.with_verdicts, "promoted": r.promoted,
                                     "rejected": r.rejected, "deferred": r.deferred, "review": r.review,
                                     "approved": r.approved, "retired": r.retired, "pending": r.pending}
                       for r in f.funnel}}


def _lag(settings, state: processes.RunState, broker: dict) -> dict:
    if not broker["answering"]:
        return {"error": f"no broker answering at {broker['bootstrap'] or '-'} (lag comes from the broker)"}
    try:
        groups = consumer_lag(broker["bootstrap"], topic_prefix=settings.topic_prefix)
    except InfraError as exc:
        return {"error": str(exc)}
    return {"groups": {g.group: {"lag": g.lag, "topics": g.by_topic()} for g in groups if g.partitions}}


def _print_memory(events: dict, memory: dict) -> None:
    if not memory["episodes"] and not any(events.values()):
        console.print("evidence log: empty (no event has landed yet)")
        return
    version = memory["benchmark_version"]
    versions = ", ".join(f"{m}@{v}" for m, v in memory["model_versions"].items())
    console.print(f"episodes {memory['episodes']} ({memory['trials']} trials) of {memory['models']} registered models; "
                  f"benchmark {f'v{version}' if version is not None else 'not promoted yet'} "
                  f"({memory['active_scenarios']} active scenarios)", soft_wrap=True, highlight=False)
    if versions:
        console.print(f"models at their latest version: {versions}", soft_wrap=True, highlight=False)
    if memory["unserved_models"]:
        console.print(f"registered but not in the model registry file (not swept, not validated): "
                      f"{escape(str(memory['unserved_models']))}", soft_wrap=True, highlight=False)
    funnel = memory["funnel"].get("all", {})
    console.print(f"candidates {memory['candidates']}: {funnel.get('promoted', 0)} promoted, "
                  f"{funnel.get('rejected', 0)} rejected, {funnel.get('deferred', 0)} deferred, "
                  f"{memory['open_reviews']} awaiting review, {funnel.get('pending', 0)} pending; "
                  f"{memory['promotions']} promotions, {memory['retirements']} retirements, {memory['cycles']} cycles",
                  soft_wrap=True, highlight=False)
    failures = ", ".join(f"{t} {n}" for t, n in memory["failures_by_type"].items()) or "none"
    console.print(f"failures {failures}; clusters {memory['clusters']} ({memory['noise_episodes']} episodes "
                  f"unclustered); dead letters {memory['dead_letters']}", soft_wrap=True, highlight=False)
    table = Table("evidence table", "events")
    for name, count in events.items():
        table.add_row(name, str(count))
    console.print(table)


@app.command()
def topics(ctx: typer.Context):
    """Create the catalog's topics (idempotent) and list them with message counts."""
    settings = settings_of(ctx)
    try:
        bootstrap = processes.require_bootstrap(settings)
        created = ensure_topics(bootstrap, settings.topic_prefix, timeout=settings.broker_timeout_s)
        counts = topic_message_counts(bootstrap, [t.full_name(settings.topic_prefix) for t in TOPICS])
    except InfraError as exc:
        fail(exc)
    table = Table("topic", "partitions", "retention", "messages", "created now")
    for t in TOPICS:
        name = t.full_name(settings.topic_prefix)
        retention = "forever" if t.retention_ms < 0 else f"{t.retention_ms // 86_400_000} d"
        table.add_row(name, str(t.partitions), retention, str(counts.get(name, 0)), "yes" if name in created else "")
    console.print(table)
