"""Reading the evidence log: report, diff.

Usage:
    sepa-eval report --output eval_memory/report [--run RUN_ID] [--ranking a,b,c]
    sepa-eval diff MODEL_A MODEL_B [--version V] [--fail-on-regression] [--json]

`diff` exits 0 when B shows no significant regression against A, 1 when it does and
--fail-on-regression is given, 2 on bad input (an unknown model or version), with one line saying
which.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from consumers.diff import DiffInputError, as_dict, compare_models, rows
from consumers.evidence.exceptions import EvidenceError, StoreUnavailable
from consumers.evidence.store import EvidenceStore
from consumers.report import NothingToReport, write_report
from infra import processes
from infra.cli import app, console, err, fail, settings_of
from infra.exceptions import InfraError
from infra.settings import Settings

# The report's HTML must open in a mail or a chat: it is refused past this size.
REPORT_HTML_MAX_BYTES = 5 * 1024 * 1024
# rich narrows tables to 80 columns off a terminal; the diff's table needs this many to stay legible.
DIFF_TABLE_WIDTH = 160


def open_existing_store(settings: Settings) -> EvidenceStore:
    """The evidence store, without creating one: an empty memory dir is a clear error, not a new store."""
    if settings.embedded_store:
        state = processes.RunState.read(settings)
        url = settings.clickhouse_url
        path = Path(url[len("chdb://"):]) if url else settings.chdb_path
        if not (state.pipeline_alive and state.store_url) and not path.exists():
            raise StoreUnavailable(f"no evidence under {settings.memory_dir}: {path} does not exist "
                                   "(run `sepa-eval run` to fill it, or point --memory-dir at one that has evidence)")
    return processes.open_store(settings)


@app.command()
def report(ctx: typer.Context,
           output: Annotated[Path | None, typer.Option(
               help="directory for report.md, report.html and figures/ (default: the memory dir)")] = None,
           run_id: Annotated[str | None, typer.Option("--run", help="only this run's events")] = None,
           ranking: Annotated[str | None, typer.Option(
               help="model ids, most capable first, comma-separated: the reference Spearman is taken against")] = None):
    """Write report.md and a self-contained report.html: success heatmap with intervals, frontier and
    discrimination per benchmark version, saturation, clusters with keyframes, promotions with
    their evidence, execution quality."""
    settings = settings_of(ctx)
    output = output or settings.memory_dir
    order = [m.strip() for m in ranking.split(",") if m.strip()] if ranking else None
    try:
        files = write_report(open_existing_store(settings), output, settings.memory_dir / "keyframes",
                             run_id=run_id, ranking=order)
    except (InfraError, EvidenceError, NothingToReport) as exc:
        fail(exc)
    if files.html_bytes > REPORT_HTML_MAX_BYTES:
        fail(ValueError(f"{files.html} is {files.html_bytes / 1e6:.1f} MB, over the "
                        f"{REPORT_HTML_MAX_BYTES / 1e6:.0f} MB a self-contained report may take"))
    console.print(f"wrote {files.markdown} and {files.html} ({files.html_bytes / 1e3:.0f} kB, "
                  f"{len(files.figures)} figures)", soft_wrap=True, highlight=False)


@app.command()
def diff(ctx: typer.Context, model_a: Annotated[str, typer.Argument(help="the baseline")],
         model_b: Annotated[str, typer.Argument(help="the model compared against it")],
         version: Annotated[int | None, typer.Option(help="benchmark version (default: the latest)")] = None,
         fail_on_regression: Annotated[bool, typer.Option(
             "--fail-on-regression", help="exit 1 when B regresses significantly on any scenario")] = False,
         run_id: Annotated[str | None, typer.Option("--run", help="only this run's episodes")] = None,
         as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False):
    """Per scenario: both success rates with 95% intervals, the paired difference on shared seeds
    (exact McNemar), and a verdict after Holm's correction over the scenarios."""
    settings = settings_of(ctx)
    try:
        result = compare_models(open_existing_store(settings), model_a, model_b, version=version, run_id=run_id)
    except DiffInputError as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(2) from exc
    except StoreUnavailable as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(2) from exc
    except (InfraError, EvidenceError) as exc:
        fail(exc)
    if as_json:
        print(json.dumps(as_dict(result), indent=1))
    else:
        where = f"benchmark v{result.version}" if result.version is not None else "every scenario (nothing promoted)"
        table = Table("scenario", f"A: {model_a}", f"B: {model_b}", "pairs (A only/B only)", "B - A [95% CI]",
                      "test p", "Holm p", "verdict", title=f"{model_b} against {model_a}, {where}")
        for row in rows(result):
            table.add_row(*row)
        (console if console.is_terminal else Console(width=DIFF_TABLE_WIDTH)).print(table)
        regressions = ", ".join(result.regressions) or "none"
        console.print(f"significant regressions (Holm, family-wise alpha {result.alpha}): {regressions}; "
                      f"improvements: {', '.join(result.improvements) or 'none'}", soft_wrap=True)
    if result.regressions and fail_on_regression:
        raise typer.Exit(1)
