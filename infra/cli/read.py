"""Reading the evidence log: report."""

from __future__ import annotations

from pathlib import Path

import typer

from consumers.benchmark_state import derived_state, scores
from consumers.evidence.exceptions import EvidenceError
from consumers.report import render_markdown
from infra import processes
from infra.cli import app, console, fail, settings_of
from infra.exceptions import InfraError


@app.command()
def report(ctx: typer.Context, output: Path | None = typer.Option(None, help="write markdown here")):
    """Benchmark state from the evidence log: scores with 95% intervals, counts, the state digest."""
    settings = settings_of(ctx)
    try:
        store = processes.open_store(settings)
        text = render_markdown(derived_state(store), scores(store))
    except (InfraError, EvidenceError) as exc:
        fail(exc)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        console.print(f"wrote {output}")
    else:
        print(text)
