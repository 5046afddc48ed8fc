"""What running the benchmark took and how the policies executed: rollouts asked for and run by
purpose, seconds spent inside episodes, execution quality beside success (smoothness, force,
recoveries), and the figures status shows of the whole log."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from consumers.evidence.store import EvidenceStore
from consumers.state.digest import table_counts
from consumers.state.failure_clusters import FailureTypeCount, clusters, failure_types, noise_episodes
from consumers.state.loop import Funnel, cycles, funnel, open_reviews
from consumers.state.registry import ALL_VERSIONS, LATEST, ModelVersions, latest_model_versions, models
from consumers.state.scope import ENDED, STARTED, _scope, _where
from consumers.state.trial_scores import _trials_sql
from consumers.state.versions import decisions, version_scenarios, versions_of

# --- rollouts spent, execution quality ------------------------------------------------------------

@dataclass(frozen=True)
class RolloutSpend:
    purpose: str  # sweep | validation | adhoc | unrequested (episodes without a request)
    requests: int
    requested_episodes: int  # seeds asked for
    ended_episodes: int  # episodes that ended (every copy, not trials: what was really spent)
    env_steps: int


def rollouts_spent(store: EvidenceStore, *, run_id: str | None = None,
                   as_of: datetime | None = None) -> list[RolloutSpend]:
    """Rollouts asked for and run, by purpose (the requests' ``purpose``)."""
    params: dict = {}
    scope = _scope(run_id, as_of, params)
    requested = store.query(
        "SELECT toString(purpose), count(), sum(length(seeds)) FROM {database}.rollout_requests FINAL"
        f"{_where(scope)} GROUP BY purpose", parameters=params)
    ended = store.query(
        "SELECT ifNull(toString(r.purpose), 'unrequested') AS p, count(), sum(e.steps) FROM "
        "(SELECT episode_id, steps FROM {database}.rollout_episodes FINAL"
        f"{_where([ENDED, *scope])}) AS e "
        "LEFT JOIN (SELECT episode_id, request_id FROM {database}.rollout_episodes FINAL "
        " WHERE envelope.event_type = 'EpisodeStarted') AS s ON e.episode_id = s.episode_id "
        "LEFT JOIN (SELECT request_id, any(purpose) AS purpose FROM {database}.rollout_requests FINAL "
        " GROUP BY request_id) AS r ON s.request_id = r.request_id "
        "GROUP BY p SETTINGS join_use_nulls = 1", parameters=params)
    table: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for purpose, n, seeds in requested:
        table[purpose][0:2] = [int(n), int(seeds)]
    for purpose, n, steps in ended:
        table[purpose][2:4] = [int(n), int(steps or 0)]
    return [RolloutSpend(p, *v) for p, v in sorted(table.items())]


def episode_seconds(store: EvidenceStore, *, since: datetime | None = None) -> float:
    """Seconds the rollout processes spent inside episodes, summed over the episodes started at or
    after ``since``: from each EpisodeStarted to its EpisodeEnded (both stamped by the process that
    ran it, so the sink's lag is not in it). Divided by the pool's processes, it is the wall time
    the rollouts took; what a loop took beyond that is its own (waits, critics, gate, sink). By time,
    not run: an episode carries the run id of whoever asked for it (the sweeper, the critics)."""
    params: dict = {}
    started = [STARTED]
    if since is not None:
        if since.tzinfo is None:
            raise ValueError(f"since must be timezone-aware, got naive {since!r}")
        params["since"] = since
        started.append("envelope.event_time >= {since:DateTime64(6, 'UTC')}")
    [(seconds,)] = store.query(
        "SELECT sum(dateDiff('microsecond', s.t, e.t)) / 1e6 FROM "
        "(SELECT episode_id, min(envelope.event_time) AS t FROM {database}.rollout_episodes FINAL"
        f"{_where(started)} GROUP BY episode_id) AS s "
        "INNER JOIN (SELECT episode_id, min(envelope.event_time) AS t FROM {database}.rollout_episodes FINAL"
        f"{_where([ENDED])} GROUP BY episode_id) AS e ON s.episode_id = e.episode_id", parameters=params)
    return float(seconds or 0.0)


@dataclass(frozen=True)
class ExecutionQuality:
    """How a model (version) executed, beside whether it succeeded (over its valid trials).

    Recoveries come from EpisodeAnalysed: each failure moment carries ``recovered_step`` (>= 0 when
    the episode later recovered: re-grasped the target, resumed progress, reached it). A success is
    *flagged* only by a moment it never recovered from; a success that recovered from every moment
    it had counts in ``successes_recovered`` and is not flagged.
    """

    model_id: str
    scenario_id: str | None  # None: over every scenario of the scope
    episodes: int  # valid trials
    success_rate: float
    smoothness_jerk: float  # mean squared end-effector jerk, m^2/s^6 (lower is smoother)
    path_efficiency: float  # straight-line / travelled distance, 0..1
    peak_contact_force: float  # N
    mean_contact_force: float  # N
    regrasps: float  # per episode
    idle_steps: float  # per episode
    time_to_success: float | None  # steps, over successful episodes
    moments: int  # failure moments in these episodes (EpisodeAnalysed)
    recovered: int  # of which the episode later recovered
    flagged_successes: int  # successes with at least one unrecovered moment
    model_version: str | None = None
    successes: int = 0
    analysed: int = 0  # trials the detector analysed (the rest say nothing about moments)
    episodes_recovered: int = 0  # trials with at least one recovered moment
    successes_recovered: int = 0  # successes with at least one recovered moment
    clean_successes: int = 0  # successes without any failure moment

    @property
    def recovery_rate(self) -> float | None:
        return self.recovered / self.moments if self.moments else None

    @property
    def recovered_share(self) -> float:
        """Share of the trials with at least one recovered moment."""
        return self.episodes_recovered / self.episodes if self.episodes else 0.0

    @property
    def recovered_only_successes(self) -> int:
        """Successes that had moments and recovered from every one (successes = clean + these + flagged)."""
        return self.successes - self.clean_successes - self.flagged_successes


def execution_quality(store: EvidenceStore, *, version: int | None = None, by_scenario: bool = False,
                      model_ids: Sequence[str] | None = None, model_versions: ModelVersions = LATEST,
                      run_id: str | None = None, as_of: datetime | None = None) -> list[ExecutionQuality]:
    """Smoothness, force, re-grasps (EpisodeEnded.quality) and recoveries (EpisodeAnalysed moments)
    per model version (and scenario), over valid trials; ``version`` restricts to its scenarios."""
    scenario_ids = version_scenarios(store, version, run_id=run_id, as_of=as_of)
    params: dict = {}
    sql = _trials_sql(params, run_id=run_id, as_of=as_of, model_ids=model_ids, scenario_ids=scenario_ids,
                      model_versions=model_versions)
    group = "t.model_id, t.model_version" + (", t.scenario_id" if by_scenario else "")
    analyses = _where(_scope(None, as_of, params))
    rows = store.query(
        f"SELECT t.model_id, {'t.scenario_id' if by_scenario else 'NULL'}, count(), avg(t.success), "
        "avg(t.quality.smoothness_jerk), avg(t.quality.path_efficiency), avg(t.quality.peak_contact_force), "
        "avg(t.quality.mean_contact_force), avg(t.quality.regrasp_count), avg(t.quality.idle_steps), "
        "avgIf(t.quality.time_to_success, t.success AND t.quality.time_to_success IS NOT NULL), "
        "sum(a.n_moments), sum(a.n_recovered), countIf(t.success AND a.n_unrecovered > 0), t.model_version, "
        "countIf(t.success), countIf(a.analysed), countIf(a.n_recovered > 0), "
        "countIf(t.success AND a.n_recovered > 0), countIf(t.success AND a.n_moments = 0) "
        f"FROM ({sql}) AS t LEFT JOIN (SELECT episode_id, true AS analysed, length(moments) AS n_moments, "
        " arrayCount(m -> m.recovered_step >= 0, moments) AS n_recovered, "
        " arrayCount(m -> m.recovered_step < 0, moments) AS n_unrecovered "
        f" FROM {{database}}.failure_episodes FINAL{analyses}) AS a ON t.episode_id = a.episode_id "
        f"WHERE t.valid GROUP BY {group} ORDER BY {group}", parameters=params)
    return [ExecutionQuality(r[0], r[1], int(r[2]), float(r[3]), float(r[4]), float(r[5]), float(r[6]), float(r[7]),
                             float(r[8]), float(r[9]), None if r[10] is None or r[10] != r[10] else float(r[10]),
                             int(r[11]), int(r[12]), int(r[13]), r[14], int(r[15]), int(r[16]), int(r[17]),
                             int(r[18]), int(r[19])) for r in rows]


# --- memory figures, for status -------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryFigures:
    """What the evidence log holds, in the terms people ask about."""

    events: Mapping[str, int]  # per evidence table (one per topic)
    episodes: int  # ended episodes (every copy)
    trials: int  # distinct (model, model version, scenario, seed, variant)
    models: int
    failures: tuple[FailureTypeCount, ...]
    clusters: int  # live clusters
    noise_episodes: int
    candidates: int
    promotions: int
    retirements: int
    benchmark_version: int | None
    active_scenarios: int
    open_reviews: int
    cycles: int
    dead_letters: int
    funnel: tuple[Funnel, ...] = field(default=())
    model_versions: Mapping[str, str] = field(default_factory=dict)  # model -> the version scores default to


def memory_figures(store: EvidenceStore, *, run_id: str | None = None, as_of: datetime | None = None) -> MemoryFigures:
    counts = table_counts(store)
    params: dict = {}
    ended = store.query("SELECT count() FROM {database}.rollout_episodes FINAL"
                        f"{_where([ENDED, *_scope(run_id, as_of, params)])}",
                        parameters=params)[0][0]
    params = {}
    trials_sql = _trials_sql(params, run_id=run_id, as_of=as_of, model_ids=None, scenario_ids=None,
                             model_versions=ALL_VERSIONS)
    trial_count = store.query(f"SELECT count() FROM ({trials_sql})", parameters=params)[0][0]
    made = decisions(store, event_types=("Promoted", "Retired"), run_id=run_id, as_of=as_of)
    versions = versions_of(made)
    benchmark = versions[-1] if versions else None
    flow = funnel(store, run_id=run_id, as_of=as_of)
    return MemoryFigures(
        counts, int(ended), int(trial_count), len(models(store, as_of=as_of)),
        tuple(failure_types(store, run_id=run_id, as_of=as_of)), len(clusters(store, run_id=run_id, as_of=as_of)),
        noise_episodes(store, run_id=run_id, as_of=as_of), flow[-1].proposed,
        sum(1 for d in made if d.event_type == "Promoted"), sum(1 for d in made if d.event_type == "Retired"),
        benchmark.version if benchmark else None, len(benchmark.scenarios) if benchmark else 0,
        len(open_reviews(store, run_id=run_id, as_of=as_of)), len(cycles(store, run_id=run_id, as_of=as_of)),
        counts.get("dead_letters", 0), tuple(flow), latest_model_versions(store, as_of=as_of))
