"""Acting on the benchmark by hand: review, promote, eval.

Usage:
    sepa-eval review list [--json]               # candidates awaiting review, with their evidence
    sepa-eval review approve SCENARIO_ID [--note TEXT] [--reviewer NAME]
    sepa-eval review reject SCENARIO_ID [--note TEXT] [--reviewer NAME]
    sepa-eval promote [--dry-run] [--force]      # the promotion gate, once, over pending candidates
    sepa-eval eval --model M [--seeds N] [--ci]  # one model over the active benchmark

`review approve|reject` publishes ReviewDecided once the evidence log shows the scenario awaiting
review (a scenario gets one review decision); the streams worker's gate turns it into Promoted or
Rejected. `promote` decides with the gate of the streams worker (the same PromotionGate, the same
config), so it is refused while a streams worker runs that gate for this memory dir, unless
--force. `eval --ci` exits 1 on a significant regression (Holm-corrected, paired on seeds) against
the model's previous version on the same benchmark version, naming the scenarios. Bad input (an
unknown model or scenario, a scenario not awaiting review, no active benchmark) is one line and
exit 2.
"""

from __future__ import annotations

import getpass
import json
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from consumers import state as q
from consumers.diff import DiffInputError, compare_with_previous, rows
from consumers.evidence.exceptions import EvidenceError, StoreUnavailable
from infra import orchestrator, processes, reviews, waits
from infra.cli.base import app, codec_of, console, err, fail, make_publisher, settings_of
from infra.cli.events import require_pipeline, require_rollout_worker
from infra.cli.read import DIFF_TABLE_WIDTH, open_existing_store
from infra.exceptions import GateBusy, InfraError, ReviewRefused, WaitTimeout
from producers.exceptions import ProducerError
from producers.seeds import held_out_seeds
from schemas.events import utc_now
from streams.exceptions import ConfigError

review_app = typer.Typer(help="Candidates the gate asked a person about: list, approve, reject.",
                         no_args_is_help=True)
app.add_typer(review_app, name="review")


def bad_input(exc: Exception) -> None:
    """One line, exit 2: the input named something the log or the registry does not allow."""
    err.print(f"error: {exc}", markup=False)
    raise typer.Exit(2)


def _checks_line(checks: dict) -> str:
    parts = []
    for name in sorted(checks):
        check = checks[name]
        if isinstance(check, dict):
            status = check.get("status", {True: "passed", False: "failed"}.get(check.get("passed"), "?"))
            p = check.get("p_value")
            reason = check.get("reason")
            parts.append(f"{name} {status}" + (f" (p={p:.3g})" if isinstance(p, (int, float)) else "")
                         + (f": {reason}" if reason else ""))
        else:
            parts.append(f"{name}: {json.dumps(check, default=str)}")
    return "; ".join(parts) or "no checks recorded"


@review_app.command("list")
def review_list(ctx: typer.Context,
                as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False):
    """Candidates awaiting review (a ReviewRequested no decision has answered), with the gate's
    reason and the robustness verdict's checks."""
    settings = settings_of(ctx)
    try:
        waiting = reviews.awaiting_review(open_existing_store(settings))
    except StoreUnavailable as exc:
        bad_input(exc)
    except (InfraError, EvidenceError) as exc:
        fail(exc)
    if as_json:
        print(json.dumps([{"scenario_id": w.review.scenario_id, "requested_at": w.review.requested_at.isoformat(),
                           "reason": w.review.reason, "request_event_id": w.review.event_id,
                           "parent_scenario_id": w.candidate.parent_scenario_id if w.candidate else None,
                           "factor": w.candidate.factor if w.candidate else None,
                           "cycle_id": w.candidate.cycle_id if w.candidate else None,
                           "robustness": None if w.robustness is None else {
                               "passed": w.robustness.passed, "score": w.robustness.score,
                               "reason": w.robustness.reason, "rollouts": w.robustness.rollouts},
                           "checks": w.checks} for w in waiting], indent=1, default=str))
        return
    if not waiting:
        console.print("no candidate awaits review")
        return
    for w in waiting:
        c = w.candidate
        what = f"{c.factor} on {c.parent_scenario_id} (cycle {c.cycle_id or '-'})" if c else "candidate not in the log"
        console.print(f"[bold]{w.review.scenario_id}[/bold]: {what}; asked {w.review.requested_at:%Y-%m-%d %H:%M} UTC",
                      soft_wrap=True, highlight=False)
        console.print(f"  gate: {w.review.reason}", soft_wrap=True, highlight=False, markup=False)
        if w.robustness is not None:
            console.print(f"  robustness ({w.robustness.rollouts} rollouts, score {w.robustness.score}): "
                          f"{w.robustness.reason}", soft_wrap=True, highlight=False, markup=False)
        console.print(f"  checks: {_checks_line(w.checks)}", soft_wrap=True, highlight=False, markup=False)
    console.print(f"{len(waiting)} awaiting review: `sepa-eval review approve|reject SCENARIO_ID`")


def _decide_review(ctx: typer.Context, scenario_id: str, approved: bool, note: str, reviewer: str | None) -> None:
    settings = settings_of(ctx)
    try:
        bootstrap = processes.require_bootstrap(settings)
        require_pipeline(settings)
        store = processes.open_store(settings)
        event = reviews.review_decision(store, scenario_id, approved, reviewer or getpass.getuser(), note)
        publisher = make_publisher(settings, bootstrap, codec_of(ctx))
        publisher.publish(event)
        publisher.flush()
        reviews.wait_for_decisions(store, [event["envelope"]["event_id"]])
    except ReviewRefused as exc:
        bad_input(exc)
    except (InfraError, EvidenceError, ProducerError) as exc:
        fail(exc)
    verb = "approved" if approved else "rejected"
    console.print(f"{scenario_id} {verb} by {event['reviewer']}: ReviewDecided is in the evidence log; the gate "
                  f"{'promotes' if approved else 'rejects'} it at its next tick (or `sepa-eval promote`)",
                  soft_wrap=True, highlight=False)


@review_app.command("approve")
def review_approve(ctx: typer.Context, scenario_id: Annotated[str, typer.Argument(help="a scenario awaiting review")],
                   note: Annotated[str, typer.Option(help="why")] = "",
                   reviewer: Annotated[str | None, typer.Option(help="default: your user name")] = None):
    """Approve a candidate awaiting review: the gate promotes it into the next benchmark version."""
    _decide_review(ctx, scenario_id, True, note, reviewer)


@review_app.command("reject")
def review_reject(ctx: typer.Context, scenario_id: Annotated[str, typer.Argument(help="a scenario awaiting review")],
                  note: Annotated[str, typer.Option(help="why")] = "",
                  reviewer: Annotated[str | None, typer.Option(help="default: your user name")] = None):
    """Reject a candidate awaiting review: the gate rejects it."""
    _decide_review(ctx, scenario_id, False, note, reviewer)


@app.command()
def promote(ctx: typer.Context,
            dry_run: Annotated[bool, typer.Option("--dry-run", help="print the decisions, publish nothing")] = False,
            force: Annotated[bool, typer.Option(
                "--force", help="decide even though a streams worker runs the gate for this memory dir")] = False):
    """Run the promotion gate once over the pending candidates (the streams worker's gate, with the
    same config) and publish its decisions: promotions with their benchmark versions, rejections,
    deferrals, review requests, retirements."""
    from infra.streams_config import gate_config  # faust, through the gate's agent module
    from streams.gate.agent import gate_state
    from streams.gate.gate import PromotionGate

    settings = settings_of(ctx)
    try:
        bootstrap = None
        if not dry_run:
            bootstrap = processes.require_bootstrap(settings)
            gates = processes.streams_workers(settings, bootstrap)
            if gates and not force:
                raise GateBusy(f"a streams worker runs the promotion gate for {settings.memory_dir} "
                               f"({', '.join(gates)}): two gates must not decide at once (it decides every "
                               "tick; --dry-run shows what it would decide, --force decides anyway)")
            require_pipeline(settings)
        store = open_existing_store(settings) if dry_run else processes.open_store(settings)
        state = gate_state(store)
        decisions = PromotionGate(gate_config(settings)).decide(state, utc_now())
        if decisions and not dry_run:
            publisher = make_publisher(settings, bootstrap, codec_of(ctx))
            for event in decisions:
                publisher.publish(event)
            publisher.flush()
            reviews.wait_for_decisions(store, [e["envelope"]["event_id"] for e in decisions])
    except (InfraError, EvidenceError, ProducerError, ConfigError) as exc:  # GateBusy is an InfraError
        fail(exc)
    pending = len(state.pending())
    if not decisions:
        why = (f"{pending} pending candidate(s), none ready (verdicts still coming, within their timeout)" if pending
               else "no pending candidate")
        console.print(f"nothing to decide: {why}; benchmark v{state.version}", soft_wrap=True, highlight=False)
        return
    table = Table("decision", "scenario", "version", "reason", title="would decide" if dry_run else "decided")
    for e in decisions:
        version = e.get("benchmark_version")
        table.add_row(e["envelope"]["event_type"], e["scenario_id"], f"v{version}" if version else "-", e["reason"])
    (console if console.is_terminal else Console(width=DIFF_TABLE_WIDTH)).print(table)
    versions = [e["benchmark_version"] for e in decisions if e.get("benchmark_version")]
    after = max(versions, default=state.version)
    console.print(f"{len(decisions)} decision(s) {'not published (dry run)' if dry_run else 'published and stored'}; "
                  f"benchmark v{state.version} -> v{after}", soft_wrap=True, highlight=False)


@app.command("eval")
def eval_(ctx: typer.Context,
          model: Annotated[str, typer.Option(help="a model_id from the registry file, at its version there")],
          seeds: Annotated[int | None, typer.Option(min=1, help="N held-out seeds per scenario, the ones the "
                                                                "loop measures on (default: the sweep_seeds "
                                                                "setting, 20)")] = None,
          ci: Annotated[bool, typer.Option("--ci", help="exit 1 on a significant regression against the "
                                                        "model's previous version")] = False,
          timeout: Annotated[float, typer.Option(help="seconds to wait for the episodes")] =
          orchestrator.STAGE_TIMEOUT_S):
    """One model over the active benchmark on held-out seeds (the loop's measurement sweeps: what ran
    already is not run again; no seed of them chose a scenario), print success per scenario with 95%
    Wilson intervals; with --ci, compare with its previous version on the same benchmark version,
    paired on those seeds."""
    from producers.sim.models import load_models

    settings = settings_of(ctx)
    try:
        models = load_models(settings.models_file)
        orchestrator.check_models([model], models)
    except (ValueError, OSError) as exc:
        bad_input(exc)
    config = next(m for m in models if m.model_id == model)
    try:
        bootstrap = processes.require_bootstrap(settings)
        require_rollout_worker(settings, bootstrap)
        require_pipeline(settings)
        store = processes.open_store(settings)
        benchmark = q.active_benchmark(store)
        if benchmark is None:
            bad_input(ValueError(f"nothing is promoted in the evidence log of {settings.memory_dir}: there is no "
                                 "active benchmark to evaluate on (run `sepa-eval run` first)"))
        publisher = make_publisher(settings, bootstrap, codec_of(ctx))
        orchestrator.register_models(publisher, [config])  # the log knows the version evaluated
        requests = orchestrator.request_sweeps(publisher, store, [dict(a.spec) for a in benchmark.scenarios],
                                               [config], held_out_seeds(seeds or settings.sweep_seeds))
        on_libero = any(a.spec["benchmark"] == "libero" for a in benchmark.scenarios)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True, disable=not console.is_terminal) as bar:
            task = bar.add_task(f"{config.model_id}@{config.version} on benchmark v{benchmark.version}",
                                total=sum(len(r["seeds"]) for r in requests))
            waits.wait_for_episodes(store, requests, waits.deadline_in(timeout),
                                    progress=lambda done, total: bar.update(task, completed=done),
                                    check=waits.still_coming(settings, libero=on_libero),
                                    requests_topic=waits.requests_topic(settings.topic_prefix))
        pinned = {config.model_id: config.version}
        table = q.scores(store, version=benchmark.version, model_ids=[config.model_id], model_versions=pinned,
                         seeds=q.HELD_OUT)
        comparison = None
        if ci:
            comparison = compare_with_previous(store, config.model_id, model_version=config.version,
                                               version=benchmark.version, seeds=q.HELD_OUT)
    except DiffInputError as exc:
        bad_input(exc)
    except WaitTimeout as exc:
        fail(WaitTimeout(f"{exc}; see the logs in {settings.run_dir}"))
    except (InfraError, EvidenceError, ProducerError, ValueError) as exc:
        fail(exc)
    out = console if console.is_terminal else Console(width=DIFF_TABLE_WIDTH)
    scores = Table("scenario", "success", "95% CI", "episodes", "invalid",
                   title=f"{config.model_id}@{config.version} on benchmark v{benchmark.version}")
    for s in table:
        lo, hi = s.interval
        scores.add_row(s.scenario_id, f"{s.success_rate:.2f}", f"[{lo:.2f}, {hi:.2f}]", str(s.episodes), str(s.invalid))
    out.print(scores)
    for pooled in q.pooled_scores(table):
        lo, hi = pooled.interval
        console.print(f"{config.model_id}@{config.version}: {pooled.successes}/{pooled.episodes} = "
                      f"{pooled.success_rate:.2f} [{lo:.2f}, {hi:.2f}] over {pooled.scenarios} scenario(s)",
                      soft_wrap=True, highlight=False)
    if not ci:
        return
    if comparison is None:
        console.print(f"no previous version of {config.model_id} has episodes on benchmark v{benchmark.version}: "
                      "nothing to compare with", soft_wrap=True, highlight=False)
        return
    versus = Table("scenario", f"A: {comparison.label_a}", f"B: {comparison.label_b}", "pairs (A only/B only)",
                   "B - A [95% CI]", "test p", "Holm p", "verdict",
                   title=f"{comparison.label_b} against {comparison.label_a}, benchmark v{benchmark.version}")
    for row in rows(comparison):
        versus.add_row(*row)
    out.print(versus)
    if comparison.regressions:
        console.print(f"regression against {comparison.label_a} (Holm, family-wise alpha {comparison.alpha}) on: "
                      f"{', '.join(comparison.regressions)}", soft_wrap=True, highlight=False)
        raise typer.Exit(1)
    console.print(f"no significant regression against {comparison.label_a} (Holm, family-wise alpha "
                  f"{comparison.alpha}); improvements: {', '.join(comparison.improvements) or 'none'}",
                  soft_wrap=True, highlight=False)
