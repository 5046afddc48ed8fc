"""Reading the evidence log: report, diff, export-hard-cases, prune.

Usage:
    sepa-eval report --output eval_memory/report [--run RUN_ID] [--ranking a,b,c]
    sepa-eval diff MODEL_A MODEL_B [--version V] [--fail-on-regression] [--json]
    sepa-eval diff MODEL@1 MODEL@2          # two versions of one model

A model named alone is taken at its latest version; MODEL@VERSION names a version. `diff` exits 0
when B shows no significant regression against A, 1 when it does and --fail-on-regression is given,
2 on bad input (an unknown model, model version or benchmark version), with one line saying which.

Heavy modules (the report's jinja2 and matplotlib, the exports' pandas and pyarrow) are imported by
the command that needs them, so `diff` and `status` start without them.
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from consumers import state as bs
from consumers.diff import DiffInputError, ModelRef, as_dict, compare_models, rows
from consumers.evidence.exceptions import EvidenceError, StoreUnavailable
from consumers.evidence.store import EvidenceStore
from consumers.exports.exceptions import ExportError
from consumers.exports.jsonl import export_jsonl
from consumers.exports.output import ExportFilters
from consumers.prune import prune as prune_store
from infra import processes
from infra.cli.base import app, console, err, fail, settings_of
from infra.exceptions import InfraError
from infra.settings import Settings
from schemas import loader

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
    from consumers.report import write_report  # jinja2, and matplotlib to draw
    from consumers.report_data import NothingToReport

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
def diff(ctx: typer.Context, model_a: Annotated[str, typer.Argument(
             help="the baseline: MODEL (its latest version) or MODEL@VERSION")],
         model_b: Annotated[str, typer.Argument(help="the model compared against it: MODEL or MODEL@VERSION")],
         version: Annotated[int | None, typer.Option(help="benchmark version (default: the latest)")] = None,
         fail_on_regression: Annotated[bool, typer.Option(
             "--fail-on-regression", help="exit 1 when B regresses significantly on any scenario")] = False,
         run_id: Annotated[str | None, typer.Option("--run", help="only this run's episodes")] = None,
         seeds: Annotated[str, typer.Option(help="held-out (the seeds the loop measures on), selection (the "
                                                 "seeds that chose the scenarios: biased) or all")] = "held-out",
         as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False):
    """Per scenario: both success rates with 95% intervals, the paired difference on shared seeds
    (exact McNemar), and a verdict after Holm's correction over the scenarios. Two versions of one
    model: `diff MODEL@1 MODEL@2`."""
    settings = settings_of(ctx)
    try:
        a, b = ModelRef.parse(model_a), ModelRef.parse(model_b)
        if seeds not in (bs.HELD_OUT, bs.SELECTION, "all"):
            raise DiffInputError(f"--seeds must be {bs.HELD_OUT}, {bs.SELECTION} or all, got {seeds!r}")
        result = compare_models(open_existing_store(settings), a, b, version=version, run_id=run_id,
                                seeds=None if seeds == "all" else seeds)
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
        table = Table("scenario", f"A: {result.label_a}", f"B: {result.label_b}", "pairs (A only/B only)",
                      "B - A [95% CI]", "test p", "Holm p", "verdict",
                      title=f"{result.label_b} against {result.label_a}, {where}")
        for row in rows(result):
            table.add_row(*row)
        (console if console.is_terminal else Console(width=DIFF_TABLE_WIDTH)).print(table)
        regressions = ", ".join(result.regressions) or "none"
        console.print(f"significant regressions (Holm, family-wise alpha {result.alpha}): {regressions}; "
                      f"improvements: {', '.join(result.improvements) or 'none'}", soft_wrap=True)
    if result.regressions and fail_on_regression:
        raise typer.Exit(1)


# --- hard-case exports and housekeeping (export-hard-cases, prune) -------------------------------

class ExportFormat(StrEnum):
    jsonl = "jsonl"
    lerobot = "lerobot"


_AGE = re.compile(r"(\d+)\s*([smhdw])")
_AGE_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def _age(text: str) -> timedelta:
    """'30d', '12h', '2w', '90m', '1d12h' -> a timedelta; anything else is refused by name."""
    compact = text.replace(" ", "").lower()
    parts = _AGE.findall(compact)
    if not parts or "".join(f"{n}{u}" for n, u in parts) != compact:
        raise typer.BadParameter(f"{text!r} is not an age like 30d, 12h, 2w or 1d12h")
    return sum((timedelta(**{_AGE_UNITS[unit]: int(n)}) for n, unit in parts), timedelta())


def _since(text: str | None) -> datetime | None:
    """An ISO 8601 time (UTC when it names no zone) or an age back from now."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        try:
            return datetime.now(UTC) - _age(text)
        except typer.BadParameter:
            raise typer.BadParameter(f"{text!r} is neither an ISO time (2026-05-01T00:00Z) nor an age (7d)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _failure_types() -> list[str]:
    (field,) = [f for f in loader.expanded_schema("FailureMoment")["fields"] if f["name"] == "failure_type"]
    return list(field["type"]["symbols"])


EXPORT_HELP = (
    "Failed episodes (and, with --include-recovered, successes that recovered from a failure moment) out of "
    "the evidence log.\n\n"
    "jsonl writes OUTPUT/hard_cases.jsonl (scenario, model, moments, quality and every step, one episode per "
    "line) and the keyframes it refers to. lerobot writes a LeRobot v3.0 dataset (meta/info.json, stats.json, "
    "tasks.parquet, episodes and data parquet; keyframes as an image feature); episodes whose steps were "
    "pruned are left out of it and listed.")

PRUNE_HELP = (
    "Remove the step rows and keyframe files of episodes whose last step is older than --older-than.\n\n"
    "Never removes episodes, moments, analyses, clusters, candidates, verdicts or decisions, so scores, the "
    "benchmark, reports and diffs are unchanged. Each prune is recorded in the store (prune_log) and `replay` "
    "re-applies it to the rebuilt database, so `replay --verify` still compares every table, steps included.\n\n"
    "A replay cannot bring pruned steps or keyframes back: keyframes never travel through Kafka, `replay "
    "--republish` republishes only what the store kept, and a broker that still holds old steps has them "
    "removed again. The LeRobot export leaves pruned episodes out; the JSONL export marks them "
    "steps_complete=false.")


EPISODES_HELP = (
    "Chosen episodes out of the evidence log, e.g. the oracle's demonstrations: `export-episodes --model oracle "
    "--format lerobot --output demos`.\n\n"
    "Formats as export-hard-cases. Episodes recorded with camera frames (`rollout --cameras ...`) become "
    "LeRobot video features, one per camera. Episodes the harness broke (env_error, aborted) are never exported.")


@app.command("export-hard-cases", help=EXPORT_HELP)
def export_hard_cases(
        ctx: typer.Context,
        format_: ExportFormat = typer.Option(..., "--format", help="jsonl: one episode per line; lerobot: a "
                                             "LeRobot v3.0 dataset"),
        output: Path = typer.Option(..., help="directory to create (must not exist or be empty)"),
        since: str | None = typer.Option(None, help="episodes ended since: an ISO time or an age (7d)"),
        failure_type: str | None = typer.Option(None, help="only episodes with a moment of this type"),
        include_recovered: bool = typer.Option(False, "--include-recovered",
                                               help="also successes that recovered from a failure moment"),
        fps: int | None = typer.Option(None, min=1, help="frame rate of the steps (lerobot; default: the "
                                       "exporter's DEFAULT_FPS, 20)")):
    if failure_type is not None and failure_type not in _failure_types():
        fail(ValueError(f"unknown failure type {failure_type!r}; one of {', '.join(_failure_types())}"))
    _export(ctx, format_, output, ExportFilters(since=_since(since), failure_type=failure_type,
                                                include_recovered=include_recovered), fps)


class Outcome(StrEnum):
    success = "success"
    any = "any"


@app.command("export-episodes", help=EPISODES_HELP)
def export_episodes(
        ctx: typer.Context,
        format_: ExportFormat = typer.Option(..., "--format", help="jsonl: one episode per line; lerobot: a "
                                             "LeRobot v3.0 dataset"),
        output: Path = typer.Option(..., help="directory to create (must not exist or be empty)"),
        model: str | None = typer.Option(None, help="only this model's episodes"),
        scenario: str | None = typer.Option(None, help="only this scenario's episodes"),
        request: str | None = typer.Option(None, help="only this request's episodes"),
        outcome: Outcome = typer.Option(Outcome.success, help="success: successes only; any: failures too"),
        since: str | None = typer.Option(None, help="episodes ended since: an ISO time or an age (7d)"),
        fps: int | None = typer.Option(None, min=1, help="frame rate of the steps (lerobot; default: the "
                                       "exporter's DEFAULT_FPS, 20)")):
    _export(ctx, format_, output, ExportFilters(since=_since(since), outcome=outcome.value, model_id=model,
                                                scenario_id=scenario, request_id=request), fps)


def _export(ctx: typer.Context, format_: ExportFormat, output: Path, filters: ExportFilters, fps: int | None) -> None:
    from consumers.exports.lerobot import DEFAULT_FPS, export_lerobot  # pandas and pyarrow: only here

    # SVT-AV1 prints a dozen info lines per video it encodes unless told its log level; errors still show.
    os.environ.setdefault("SVT_LOG", "1")
    settings = settings_of(ctx)
    keyframes = settings.memory_dir / "keyframes"
    try:
        store = processes.open_store(settings)
        if format_ is ExportFormat.jsonl:
            summary = export_jsonl(store, output, keyframes, filters)
        else:
            summary = export_lerobot(store, output, keyframes, filters, fps=DEFAULT_FPS if fps is None else fps)
    except (InfraError, EvidenceError, ExportError, OSError) as exc:
        fail(exc)
    kinds = f"{summary.failed} failed, {summary.recovered} recovered" + (
        f", {summary.succeeded} successes" if summary.succeeded else "")
    media = (f"videos of {', '.join(summary.cameras)}" if summary.cameras else f"{summary.keyframes} keyframes")
    console.print(f"wrote {summary.format} export to {summary.output}: {summary.episodes} episodes "
                  f"({kinds}), {summary.frames} steps, {media}"
                  + (f", {summary.keyframes_missing} keyframe references without a file"
                     if summary.keyframes_missing else ""), soft_wrap=True)
    for episode_id, reason in summary.skipped.items():
        err.print(f"left out {episode_id}: {reason}")


@app.command(help=PRUNE_HELP)
def prune(ctx: typer.Context,
          older_than: str = typer.Option(..., "--older-than", help="age of the steps to remove: 30d, 12h, 2w"),
          dry_run: bool = typer.Option(False, "--dry-run", help="report what would be freed, remove nothing")):
    settings = settings_of(ctx)
    try:
        cutoff = datetime.now(UTC) - _age(older_than)
    except typer.BadParameter as exc:
        fail(exc)
    try:
        result = prune_store(processes.open_store(settings), cutoff, settings.memory_dir / "keyframes", dry_run)
    except (InfraError, EvidenceError, OSError) as exc:
        fail(exc)
    if not result.step_rows:
        console.print(f"nothing to prune: no episode's steps are older than {cutoff.isoformat(timespec='seconds')}")
        return
    verb, size = ("would free", "about ") if dry_run else ("freed", "")
    console.print(f"{verb}: {result.step_rows} step rows of {result.episodes} episodes ({size}{result.step_bytes} "
                  f"bytes), {result.keyframe_files} keyframe files ({result.keyframe_bytes} bytes); "
                  f"cutoff {cutoff.isoformat(timespec='seconds')}")
