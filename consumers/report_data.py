"""What the report shows, gathered from the evidence log: ReportData and the heatmap's colours.

`gather` asks the typed queries (consumers.state) for everything the report shows, and nothing
else: the report keeps no state and writes no SQL. Apart from the rendering (consumers/report.py:
markdown and HTML; consumers/report_figures.py: the PNG figures), which both read this data and
nothing else, so neither imports the other.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from consumers import state as bs
from consumers.evidence.store import EvidenceStore

# The report shows the largest clusters with their keyframes; the rest are counted.
REPORT_MAX_CLUSTERS = 12
# Heatmap cell colours: success 0 -> 1 along these anchors (viridis, legible to colour-blind readers).
HEATMAP_ANCHORS = ((0.0, (68, 1, 84)), (0.25, (59, 82, 139)), (0.5, (33, 145, 140)), (0.75, (94, 201, 98)),
                   (1.0, (253, 231, 37)))


class NothingToReport(ValueError):
    """The evidence log holds no ended episode: there is nothing to score."""


@dataclass(frozen=True)
class HeatmapRow:
    scenario_id: str
    label: str  # what the scenario is: its factor against its parent, or "base"
    status: str  # active | retired | candidate status (rejected, deferred, ...) | evaluated
    cells: tuple[bs.ModelScenarioScore | None, ...]  # one per model of the heatmap, None: no trial


@dataclass(frozen=True)
class Promotion:
    """A promoted scenario with the evidence that admitted it."""

    decision: bs.Decision
    candidate: bs.Candidate | None
    verdicts: tuple[bs.Verdict, ...]
    cluster: bs.ClusterSummary | None  # the source cluster, as it stands now
    effects: tuple[bs.PairedEffect, ...]  # against the parent, per model


@dataclass(frozen=True)
class VersionReport:
    version: bs.BenchmarkVersion
    discrimination: bs.Discrimination
    saturation: tuple[bs.SaturationSignal, ...]
    promotions: tuple[Promotion, ...]
    retirements: tuple[bs.Decision, ...]

    @property
    def saturated(self) -> int:
        return sum(1 for s in self.saturation if s.saturated)


@dataclass(frozen=True)
class ReportData:
    generated_at: datetime
    run_id: str | None
    ranking: tuple[str, ...] | None
    counts: dict[str, int]
    models: tuple[bs.RegisteredModel, ...]
    heatmap_models: tuple[str, ...]
    heatmap: tuple[HeatmapRow, ...]
    versions: tuple[VersionReport, ...]
    frontier: tuple[bs.Discrimination, ...]  # one per version (or one, before any promotion), held-out seeds
    current_saturation: tuple[bs.SaturationSignal, ...]
    failures: tuple[bs.FailureTypeCount, ...]
    timeline: tuple[bs.FailureBucket, ...]
    clusters: tuple[bs.ClusterSummary, ...]
    clusters_total: int
    noise_episodes: int
    funnel: tuple[bs.Funnel, ...]
    cycles: tuple[bs.Cycle, ...]
    open_reviews: tuple[bs.OpenReview, ...]
    rollouts: tuple[bs.RolloutSpend, ...]
    quality: tuple[bs.ExecutionQuality, ...]
    scores: tuple[bs.ModelScenarioScore, ...] = field(default=())
    model_versions: dict[str, str] = field(default_factory=dict)  # the version each model is shown at
    not_yet_run: dict[str, str] = field(default_factory=dict)  # models whose latest version has no trials here
    frontier_in_sample: tuple[bs.Discrimination, ...] = field(default=())  # the same on the selection seeds
    pairs: tuple[bs.AdjacentPair, ...] = field(default=())  # the latest version's neighbours, held-out seeds

    @property
    def total_rollouts(self) -> int:
        return sum(r.ended_episodes for r in self.rollouts)


def gather(store: EvidenceStore, *, run_id: str | None = None, ranking: list[str] | None = None) -> ReportData:
    """Everything the report shows, from the typed queries. Raises NothingToReport on an empty log.

    Each model is shown at one version, never pooled: its latest when that has trials in the scope,
    else the newest one that has (state.evaluated_versions; the report says which). The
    scores, the benchmark versions and the candidates are read once; each version's saturation and
    discrimination come from them (consumers.state's ``*_of`` functions), not from a query per
    version."""
    shown = bs.evaluated_versions(store, run_id=run_id)
    if not shown:
        where = f" for run {run_id!r}" if run_id else ""
        raise NothingToReport(f"no ended episode in the evidence log{where}: nothing to report yet "
                              "(`sepa-eval run` evaluates the models and fills it)")
    # The heatmap shows every scenario with trials, candidates included: all seeds. Every figure
    # about a benchmark version (frontier, discrimination, saturation) is read on held-out seeds
    # (producers/seeds.py), with the frontier on the selection seeds beside it, labelled in-sample.
    table = bs.scores(store, model_versions=shown, run_id=run_id)
    measured = bs.scores(store, model_versions=shown, run_id=run_id, seeds=bs.HELD_OUT)
    in_sample = bs.scores(store, model_versions=shown, run_id=run_id, seeds=bs.SELECTION)
    latest = bs.latest_model_versions(store)
    registered = bs.models(store)
    judged = bs.ranked_of(registered)
    made = bs.decisions(store, event_types=("Promoted", "Retired"), run_id=run_id)
    versions = bs.versions_of(made)
    proposed = bs.candidates(store, run_id=run_id)
    candidates = {c.scenario_id: c for c in proposed}
    all_clusters = bs.clusters(store, run_id=run_id)
    cluster_by_id = {c.cluster_id: c for c in all_clusters}
    effects = bs.paired_effects(store, run_id=run_id)
    version_reports = tuple(_version_report(v, made, measured, judged, candidates, cluster_by_id, effects, ranking)
                            for v in versions)
    heatmap_models = _heatmap_models(registered, table)
    return ReportData(
        generated_at=datetime.now(UTC), run_id=run_id, ranking=tuple(ranking) if ranking else None,
        counts=bs.table_counts(store), models=tuple(registered), heatmap_models=heatmap_models,
        heatmap=_heatmap(table, heatmap_models, versions, candidates),
        versions=version_reports,
        frontier=tuple(bs.frontier_of(versions, measured, ranking, judged)),
        frontier_in_sample=tuple(bs.frontier_of(versions, in_sample, ranking, judged)),
        current_saturation=tuple(bs.saturation_of(measured, versions[-1].scenario_ids if versions else None,
                                                  judged)),
        failures=tuple(bs.failure_types(store, run_id=run_id)),
        timeline=tuple(bs.failure_timeline(store, run_id=run_id)),
        clusters=tuple(all_clusters[:REPORT_MAX_CLUSTERS]), clusters_total=len(all_clusters),
        noise_episodes=bs.noise_episodes(store, run_id=run_id),
        funnel=tuple(bs.funnel(store, run_id=run_id, proposed=proposed)), cycles=tuple(bs.cycles(store, run_id=run_id)),
        open_reviews=tuple(bs.open_reviews(store, run_id=run_id)),
        rollouts=tuple(bs.rollouts_spent(store, run_id=run_id)),
        quality=tuple(bs.execution_quality(store, model_versions=shown, run_id=run_id)), scores=tuple(table),
        model_versions=shown, not_yet_run={m: latest[m] for m, v in shown.items() if latest.get(m, v) != v},
        pairs=tuple(bs.adjacent_pairs(store, versions[-1].version, model_ids=judged)) if versions and judged else ())


def _version_report(version: bs.BenchmarkVersion, made: list[bs.Decision], table: list[bs.ModelScenarioScore],
                    judged: list[str] | None, candidates: dict[str, bs.Candidate],
                    clusters: dict[str, bs.ClusterSummary], effects: list[bs.PairedEffect],
                    ranking: list[str] | None) -> VersionReport:
    made = [d for d in made if d.benchmark_version == version.version]
    by_scenario = defaultdict(list)
    for e in effects:
        by_scenario[e.scenario_id].append(e)
    promotions = []
    for d in (d for d in made if d.event_type == "Promoted"):
        candidate = candidates.get(d.scenario_id)
        promotions.append(Promotion(d, candidate, candidate.verdicts if candidate else (),
                                    clusters.get(d.source_cluster_id), tuple(by_scenario.get(d.scenario_id, ()))))
    return VersionReport(version, bs.discrimination_of(version.version, table, ranking, version.scenario_ids, judged),
                         tuple(bs.saturation_of(table, version.scenario_ids, judged)), tuple(promotions),
                         tuple(d for d in made if d.event_type == "Retired"))


def _heatmap_models(registered: list[bs.RegisteredModel], table: list[bs.ModelScenarioScore]) -> tuple[str, ...]:
    """Models with episodes: the oracle first (the ceiling), then the others by overall success."""
    kinds = {m.model_id: m.kind for m in registered}
    pooled = {m.model_id: m.success_rate for m in bs.pooled_scores(table)}
    return tuple(sorted(pooled, key=lambda m: (kinds.get(m) != bs.ORACLE_KIND, -pooled[m], m)))


def _heatmap(table: list[bs.ModelScenarioScore], models: tuple[str, ...], versions: list[bs.BenchmarkVersion],
             candidates: dict[str, bs.Candidate]) -> tuple[HeatmapRow, ...]:
    cells = {(s.model_id, s.scenario_id): s for s in table}
    active = set(versions[-1].scenario_ids) if versions else set()
    ever = {s for v in versions for s in v.scenario_ids}
    order = {"active": 0, "retired": 1}
    rows = []
    for scenario_id in sorted({s.scenario_id for s in table}):
        candidate = candidates.get(scenario_id)
        status = ("active" if scenario_id in active else "retired" if scenario_id in ever
                  else candidate.status if candidate else "evaluated")
        label = "base" if not candidate or candidate.generator == "base" else candidate.factor
        rows.append(HeatmapRow(scenario_id, label, status, tuple(cells.get((m, scenario_id)) for m in models)))
    return tuple(sorted(rows, key=lambda r: (order.get(r.status, 2), r.status, r.scenario_id)))


def heatmap_colour(rate: float) -> tuple[int, int, int]:
    """The cell colour for a success rate in [0, 1] (linear between the anchors)."""
    rate = min(1.0, max(0.0, rate))
    for (x0, c0), (x1, c1) in zip(HEATMAP_ANCHORS, HEATMAP_ANCHORS[1:], strict=False):
        if rate <= x1:
            f = (rate - x0) / (x1 - x0)
            return tuple(round(a + (b - a) * f) for a, b in zip(c0, c1, strict=True))
    return HEATMAP_ANCHORS[-1][1]
