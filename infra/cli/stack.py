"""Starting, stopping and looking at the stack: up, down, status, topics."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from consumers.benchmark_state import table_counts
from consumers.evidence.exceptions import EvidenceError
from infra import processes
from infra.cli import app, console, err, fail, settings_of
from infra.exceptions import InfraError
from infra.kafka_clients import ensure_topics, topic_message_counts
from schemas.catalog import TOPICS


@app.command()
def up(ctx: typer.Context):
    """Start the embedded broker (unless SEPA_BOOTSTRAP_SERVERS is set) and the pipeline."""
    settings = settings_of(ctx)
    try:
        state = processes.up(settings)
    except (InfraError, EvidenceError) as exc:
        fail(exc)
    console.print(f"broker [bold]{settings.bootstrap_servers or state.bootstrap}[/bold]; pipeline pid "
                  f"{state.pipeline_pid}; store {state.store_url or settings.clickhouse_url}")


@app.command()
def down(ctx: typer.Context):
    """Stop the pipeline, then the embedded broker."""
    stopped = processes.down(settings_of(ctx))
    console.print("stopped " + ", ".join(stopped) if stopped else "nothing was running")


@app.command()
def status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="machine-readable")):
    """Processes, topics and evidence counts per table."""
    settings = settings_of(ctx)
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
    settings = settings_of(ctx)
    try:
        bootstrap = processes.resolve_bootstrap(settings)
        created = ensure_topics(bootstrap, settings.topic_prefix)
        counts = topic_message_counts(bootstrap, [t.full_name(settings.topic_prefix) for t in TOPICS])
    except InfraError as exc:
        fail(exc)
    table = Table("topic", "partitions", "retention", "messages", "created now")
    for t in TOPICS:
        name = t.full_name(settings.topic_prefix)
        retention = "forever" if t.retention_ms < 0 else f"{t.retention_ms // 86_400_000} d"
        table.add_row(name, str(t.partitions), retention, str(counts.get(name, 0)), "yes" if name in created else "")
    console.print(table)
