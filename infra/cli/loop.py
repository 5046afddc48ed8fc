"""The loop: run (the evolving benchmark), critics (the critics process)."""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from datetime import UTC, datetime

import typer
from rich.table import Table

from consumers.evidence.exceptions import EvidenceError
from consumers.report import write_report
from consumers.state import content_digest, derived_state, open_reviews, state_digest
from infra import orchestrator, processes, supervisor, waits
from infra.cli.base import app, codec_of, console, fail, make_publisher, republished_line, settings_of
from infra.cli.events import require_libero_worker
from infra.exceptions import InfraError, WaitTimeout
from producers.exceptions import ProducerError
from streams.exceptions import ConfigError

RUN_HORIZON = 200


@app.command()
def run(ctx: typer.Context,
        cycles: int = typer.Option(2, min=1, help="evolution cycles"),
        sweep_seeds: int | None = typer.Option(
            None, min=1, help="seeds per model x active scenario in each sweep (default: the sweep_seeds setting)"),
        measure_seeds: int | None = typer.Option(
            None, min=1, help="held-out seeds per model x active scenario that the scores are read on (default: "
                              "as many as --sweep-seeds)"),
        max_candidates: int = typer.Option(4, min=1, help="candidates the mutator may propose per cycle"),
        budget: int | None = typer.Option(None, min=1, help="rollouts the evidence log may hold in all: after the "
                                                            "first cycle (which runs whole: nothing to estimate by), "
                                                            "a cycle proposes only the candidates that fit, and none "
                                                            "starts when not one does (default: no cap)"),
        generator: str = typer.Option("failure-guided", help="failure-guided, or a baseline arm: blind (random "
                                                             "draws) or coverage (a fixed grid of factors)"),
        env: str = typer.Option("Lift", help="the base benchmark's task(s), comma-separated"),
        benchmark: str = typer.Option("robosuite", help="robosuite, or libero (its own venv and worker: "
                                                        "`sepa-eval libero setup` first)"),
        suite: str = typer.Option("libero_object", help="--benchmark libero: the LIBERO suite of the base tasks"),
        tasks: str | None = typer.Option(None, help="--benchmark libero: the base tasks, indices or names, "
                                                    "comma-separated (default: every task of the suite)"),
        seed: int = typer.Option(0, help="seeds every cycle's mutations"),
        run_id: str | None = typer.Option(None, help="default: run-<seed>"),
        timeout: float = typer.Option(orchestrator.STAGE_TIMEOUT_S, help="seconds each stage of a cycle may take")):
    """The living benchmark on the embedded default: start everything, register the models, then per
    cycle sweep them over the active benchmark, mine the failures, generate candidates, validate them
    and promote the good ones; print each cycle and write the report of the finished state."""
    from producers.adapters import RobosuiteAdapter
    from producers.sim.models import load_models

    settings = settings_of(ctx)
    try:
        models = load_models(settings.models_file)
        if benchmark == "libero":
            base = libero_base(suite, tasks)
        elif benchmark == "robosuite":
            adapter = RobosuiteAdapter()
            base = tuple(adapter.base_scenario(task.strip(), RUN_HORIZON) for task in env.split(",") if task.strip())
        else:
            raise ValueError(f"--benchmark must be robosuite or libero, got {benchmark!r}")
        if generator not in orchestrator.GENERATOR_ARMS:
            raise ValueError(f"--generator must be one of {', '.join(orchestrator.GENERATOR_ARMS)}, "
                             f"got {generator!r}")
        config = orchestrator.EvolveConfig(run_id=run_id or f"run-{seed}", cycles=cycles,
                                           sweep_seeds=sweep_seeds or settings.sweep_seeds,
                                           measure_seeds=measure_seeds or sweep_seeds or settings.sweep_seeds,
                                           max_candidates=max_candidates, generator=generator, seed=seed, base=base,
                                           stage_timeout_s=timeout, fragile=settings.cluster_fragile_successes,
                                           rollout_budget=budget)
        result = supervisor.up(settings, codec_of(ctx))
        if result.started:
            console.print(f"started {', '.join(result.started)}")
        if result.republished:
            console.print(republished_line(result.republished))
        bootstrap = processes.require_bootstrap(settings)
        if benchmark == "libero":
            require_libero_worker(settings, bootstrap)
        store = processes.open_store(settings)
        publisher = make_publisher(settings, bootstrap, codec_of(ctx))
        orchestrator.register_models(publisher, models)
        started, since = time.monotonic(), datetime.now(UTC)
        with console.status("starting", spinner="dots") if console.is_terminal else nullcontext() as status:
            reports = orchestrator.evolve(store, publisher, models, config,
                                          on_event=lambda kind, value: _show(kind, value, status),
                                          check=waits.still_running(settings, libero=benchmark == "libero"))
        timing = orchestrator.loop_time(store, since, time.monotonic() - started, settings.rollout_processes)
        state, content = derived_state(store), content_digest(store)
        files = write_report(store, settings.memory_dir, settings.memory_dir / "keyframes")
        reviews = open_reviews(store)
    except (InfraError, EvidenceError, ProducerError, ConfigError, ValueError, OSError) as exc:
        if isinstance(exc, WaitTimeout):
            exc = WaitTimeout(f"{exc}; see the logs in {settings.run_dir}")
        fail(exc)
    total = sum(r.rollouts for r in reports)
    seconds = sum(r.seconds for r in reports)
    console.print(f"{len(reports)} cycles, {total} rollouts, {seconds:.0f} s; benchmark v{reports[-1].version_after}; "
                  f"wrote {files.markdown} and {files.html}")
    console.print(timing, soft_wrap=True, highlight=False)
    # content: what was decided and measured, no times (to compare two runs of one seed by);
    # state: the whole log's (event times included), what `replay --verify` rebuilds
    console.print(f"content digest {content}")
    console.print(f"state digest {state_digest(state)}")
    if reviews:  # the gate asked a person: say how to answer
        console.print(f"{len(reviews)} candidate(s) awaiting review: `sepa-eval review list`, then "
                      "`sepa-eval review approve|reject ID`")
    console.print("the stack is still up for `status`, `report`, `eval`, `review`; `sepa-eval down` stops it")


def libero_base(suite: str, tasks: str | None) -> tuple[dict, ...]:
    """LIBERO base scenarios: the suite's tasks (all, or the given indices/names) from their init
    state 0, with the suite's default horizon. Refuses when LIBERO is not set up."""
    from infra.cli.libero import _catalog, _task_name

    catalog = _catalog(None)
    names = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else catalog.tasks(suite)
    return tuple(catalog.base_scenario(suite, _task_name(catalog, suite, t)).to_dict() for t in names)


def _show(kind: str, value, status) -> None:
    """Progress on a terminal (a spinner line), the cycle reports everywhere."""
    lines = {
        "base": lambda v: f"promoting the base benchmark: {', '.join(v)}",
        "sweep": lambda v: f"sweeping {v['requests']} model x scenario pairs of benchmark v{v['version']}",
        "settled": lambda v: f"sweep done: {v.episodes} episodes, {v.failed} failed, {v.fragile} fragile successes, "
                             f"{v.clustered} of them clustered",
        "cycle": lambda v: f"cycle {v['cycle_id']} opened at clusterer position {v['clusters_position']}"
                           + (f"; seeding from the failures of {', '.join(v['focus'])} first (each >= 95% on the "
                              "sweep: the benchmark cannot order them)" if v.get("focus") else ""),
        "generated": lambda v: f"{len(v.proposed)} candidates proposed ({v.infeasible} infeasible); validating",
        "measure": lambda v: f"measuring benchmark v{v['version']} on held-out seeds ({v['requests']} requests)",
    }
    if kind in lines:
        if status is not None:
            status.update(lines[kind](value))
        else:
            console.print(lines[kind](value), soft_wrap=True, highlight=False)
    elif kind == "report":
        _print_cycle(value)
    elif kind == "budget":
        console.print(f"the budget of {value} rollouts has no room for another candidate: no further cycle",
                      soft_wrap=True, highlight=False)
    elif kind == "separated":
        console.print("every adjacent pair of ranked models is separated on held-out seeds: no further cycle",
                      soft_wrap=True, highlight=False)


def _print_cycle(r) -> None:
    decided = ", ".join(f"{n} {status}" for status, n in sorted(r.decided.items())) or "no candidate"
    console.print(f"[bold]cycle {r.cycle}[/bold]: {len(r.proposed)} proposed ({r.infeasible} infeasible), {decided}; "
                  f"promoted {', '.join(r.promoted) or 'none'}; retired {', '.join(r.retired) or 'none'}; "
                  f"benchmark v{r.version_before} -> v{r.version_after}; {r.rollouts} rollouts, {r.seconds:.0f} s"
                  + (f"; seeded from the failures of {', '.join(r.focus)} first" if r.focus else ""),
                  soft_wrap=True, highlight=False)
    # held-out seeds chose nothing; the selection seeds' rate is shown beside it because the gap is
    # the selection bias (a scenario was promoted because a model failed on those very seeds)
    in_sample = {s.model_id: s for s in r.in_sample}
    table = Table("model", "held-out success", "95% CI", "episodes", "in-sample",
                  title=f"benchmark v{r.version_after}, held-out seeds")
    for s in sorted(r.scores, key=lambda s: (-s.success_rate, s.model_id)):
        lo, hi = s.interval
        biased = in_sample.get(s.model_id)
        table.add_row(s.model_id, f"{s.success_rate:.2f}", f"[{lo:.2f}, {hi:.2f}]", str(s.episodes),
                      f"{biased.success_rate:.2f}" if biased else "-")
    console.print(table)
    if r.pairs:
        told = "; ".join(f"{p.better} {'>' if p.separated else '~'} {p.worse} (Holm p={p.holm_p:.2g})" for p in r.pairs)
        console.print(f"adjacent models in held-out order, ties by name (paired exact McNemar, Holm): {told}; "
                      f"{sum(p.separated for p in r.pairs)} of {len(r.pairs)} separated", soft_wrap=True,
                      highlight=False)


@app.command()
def critics(ctx: typer.Context):
    """Validate proposed candidates until interrupted (`up` runs one in the background): robustness
    (validation rollouts on paired seeds, decided sequentially), safety, semantic (the VLM judge
    when SEPA_JUDGE_BASE_URL and SEPA_JUDGE_MODEL are set, else a verdict that says it did not run)."""
    import signal
    import threading

    from consumers.critics.worker import GROUP_ID, CriticsConfig, CriticsWorker
    from infra.kafka_clients import make_consumer, make_producer
    from producers.publisher import Publisher
    from producers.sim.models import load_models

    settings = settings_of(ctx)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        bootstrap = processes.require_bootstrap(settings)
        store = processes.open_store(settings)
        judge, semantic = critics_judge(settings)
        # the models the rollout workers serve: their registry file's (a stray registration is left out)
        served = frozenset(m.model_id for m in load_models(settings.models_file))
    except (InfraError, EvidenceError, ConfigError, ValueError) as exc:
        fail(exc)
    codec = codec_of(ctx)
    worker = CriticsWorker(make_consumer(bootstrap, GROUP_ID, settings.session_timeout_ms),
                           Publisher(make_producer(bootstrap), settings.topic_prefix, codec), store, codec,
                           CriticsConfig(semantic=semantic, served_models=served), settings.topic_prefix,
                           judge=judge)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        worker.run(stop, on_assigned=lambda: processes.write_ready(settings, processes.CRITICS.name))
    except KeyboardInterrupt:
        pass


def critics_judge(settings):
    """The semantic critic's judge from the settings: (SemanticJudge, its config), or (None, an
    unconfigured config) when no judge endpoint is set. Builds the OpenAI client: the edge only."""
    from consumers.critics.semantic import SemanticConfig, SemanticJudge
    from producers.keyframes import KeyframeStore

    if not settings.judge_configured:
        return None, SemanticConfig()
    if settings.judge_api_key is None:
        raise ConfigError(f"the VLM judge at {settings.judge_base_url} needs an API key: set SEPA_JUDGE_API_KEY or "
                          "OPENAI_API_KEY (any value for a server that checks none)")
    import openai

    config = SemanticConfig(endpoint=settings.judge_base_url, model=settings.judge_model,
                            timeout_s=settings.judge_timeout_s, threshold=settings.judge_threshold)
    client = openai.OpenAI(base_url=settings.judge_base_url, api_key=settings.judge_api_key.get_secret_value(),
                           timeout=settings.judge_timeout_s, max_retries=0)
    return SemanticJudge(client, config, KeyframeStore(settings.memory_dir / "keyframes")), config
