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


# --- hard-case exports and housekeeping (export-hard-cases, prune) -------------------------------
# (their imports here, so this section stays an append to the file)

import re  # noqa: E402
from datetime import UTC, datetime, timedelta  # noqa: E402
from enum import StrEnum  # noqa: E402

from consumers.exports.exceptions import ExportError  # noqa: E402
from consumers.exports.jsonl import export_jsonl  # noqa: E402
from consumers.exports.lerobot import DEFAULT_FPS, export_lerobot  # noqa: E402
from consumers.exports.output import ExportFilters  # noqa: E402
from consumers.prune import prune as prune_store  # noqa: E402
from infra.cli import err as export_err  # noqa: E402  (aliased: the report side imports err too)
from schemas import loader  # noqa: E402


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
        fps: int = typer.Option(DEFAULT_FPS, min=1, help="frame rate of the steps (lerobot)")):
    settings = settings_of(ctx)
    if failure_type is not None and failure_type not in _failure_types():
        fail(ValueError(f"unknown failure type {failure_type!r}; one of {', '.join(_failure_types())}"))
    filters = ExportFilters(since=_since(since), failure_type=failure_type, include_recovered=include_recovered)
    keyframes = settings.memory_dir / "keyframes"
    try:
        store = processes.open_store(settings)
        if format_ is ExportFormat.jsonl:
            summary = export_jsonl(store, output, keyframes, filters)
        else:
            summary = export_lerobot(store, output, keyframes, filters, fps=fps)
    except (InfraError, EvidenceError, ExportError, OSError) as exc:
        fail(exc)
    console.print(f"wrote {summary.format} export to {summary.output}: {summary.episodes} episodes "
                  f"({summary.failed} failed, {summary.recovered} recovered), {summary.frames} steps, "
                  f"{summary.keyframes} keyframes" + (f", {summary.keyframes_missing} keyframe references without "
                                                      "a file" if summary.keyframes_missing else ""))
    for episode_id, reason in summary.skipped.items():
        export_err.print(f"left out {episode_id}: {reason}")


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
