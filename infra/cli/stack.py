"""Starting, stopping and looking at the stack: up, down, status, topics."""

from __future__ import annotations

import json

import typer
from rich.markup import escape
from rich.table import Table

from consumers.benchmark_state import table_counts
from consumers.evidence.exceptions import EvidenceError
from infra import processes
from infra.cli import app, console, err, fail, settings_of
from infra.exceptions import InfraError
from infra.kafka_clients import ensure_topics, topic_message_counts
from schemas.catalog import TOPICS
from streams.exceptions import ConfigError


@app.command()
def up(ctx: typer.Context):
    """Start the embedded broker (unless SEPA_BOOTSTRAP_SERVERS is set), the pipeline, the streams
    worker and the rollout worker; return once every one of them is ready."""
    settings = settings_of(ctx)
    try:
        result = processes.up(settings)
    except (InfraError, EvidenceError, ConfigError, OSError) as exc:
        fail(exc)
    state = result.state
    what = (f"broker {settings.bootstrap_servers or state.bootstrap}; pipeline pid {state.pipeline_pid}; "
            f"streams worker pid {state.streams_pid}; rollout worker pid {state.rollout_pid}; "
            f"store {state.store_url or settings.clickhouse_url}")
    if result.started:
        console.print(f"started {', '.join(result.started)}. Ready: {escape(what)}")
    else:
        console.print(f"already running, nothing started: {escape(what)}")


@app.command()
def down(ctx: typer.Context):
    """Stop the streams and rollout workers, the pipeline, then the embedded broker."""
    try:
        stopped = processes.down(settings_of(ctx))
    except (InfraError, OSError) as exc:
        fail(exc)
    console.print("stopped " + ", ".join(stopped) if stopped else "nothing was running")


@app.command()
def status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="machine-readable")):
    """Processes, topics and evidence counts per table."""
    settings = settings_of(ctx)
    state = processes.RunState.read(settings)
    report: dict = {"memory_dir": str(settings.memory_dir), "broker": processes.broker_status(settings, state),
                    **processes.process_status(settings, state)}
    try:
        report["evidence"] = table_counts(processes.open_store(settings))
    except EvidenceError as exc:
        report["evidence"] = {"error": str(exc)}
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
                             ("rollout_worker", "rollout ", "serves rollout.requests")):
        pid = report[key]["pid"]
        console.print(f"{label} {f'[green]pid {pid}[/green]' if pid else '[red]not running[/red]'}  {escape(what)}")
    table = Table("evidence table", "events")
    for name, count in (report["evidence"].items() if "error" not in report["evidence"] else []):
        table.add_row(name, str(count))
    if "error" in report["evidence"]:
        err.print(f"[red]{escape(report['evidence']['error'])}[/red]")
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
