"""What the scores say about the benchmark: each promoted scenario against its parent (paired
effects), whether every model passes a scenario (saturation), how well a version separates the
models (spread, separated pairs, Spearman; adjacent pairs told apart by McNemar), and that over
every version (the frontier). The ``*_of`` functions compute the same from a scores table the
caller has read already (the report reads it once)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from consumers.evidence.store import EvidenceStore
from consumers.state.registry import ALL_VERSIONS, models, ranked_model_ids, ranked_of
from consumers.state.scope import SATURATION_RATE
from consumers.state.trial_scores import (
    HELD_OUT,
    ModelScenarioScore,
    ModelScore,
    Seeds,
    Trial,
    pooled_scores,
    scores,
    trials,
)
from consumers.state.versions import (
    BenchmarkVersion,
    Decision,
    benchmark_versions,
    current_version,
    decisions,
    version_scenarios,
)
from consumers.statistics import PairedDifference, holm_adjusted, paired, spearman

# --- paired effects, saturation, discrimination -------------------------------------------------

@dataclass(frozen=True)
class PairedEffect:
    """A promoted scenario against its parent for one model version, on the (seed, variant) pairs
    both were run on. ``effect.difference`` = child rate - parent rate (negative: the child is harder)."""

    scenario_id: str
    parent_scenario_id: str
    factor: str
    model_id: str
    effect: PairedDifference  # arm 1 = parent, arm 2 = the promoted scenario
    model_version: str | None = None


def outcomes_by_pair(rows: Iterable[Trial]) -> dict[tuple[str, str | None, str], dict[tuple[int, str], bool]]:
    """(model, model version, scenario) -> {(seed, variant): success} over valid trials with a seed."""
    out: dict[tuple[str, str | None, str], dict[tuple[int, str], bool]] = defaultdict(dict)
    for t in rows:
        if t.valid and t.pair_key is not None:
            out[(t.model_id, t.model_version, t.scenario_id)][t.pair_key] = t.success
    return out


def paired_effects(store: EvidenceStore, *, version: int | None = None, model_ids: Sequence[str] | None = None,
                   run_id: str | None = None, as_of: datetime | None = None) -> list[PairedEffect]:
    """Each promoted scenario that has a parent (not a base scenario) against that parent, per model
    version (every version that ran both), on matching (seed, variant) pairs. ``version``: only the
    scenarios of that benchmark version (None: every promotion)."""
    promoted = [d for d in decisions(store, event_types=("Promoted",), run_id=run_id, as_of=as_of)
                if d.parent_scenario_id and d.parent_scenario_id != d.scenario_id]
    if version is not None:
        keep = set(version_scenarios(store, version, run_id=run_id, as_of=as_of) or ())
        promoted = [d for d in promoted if d.scenario_id in keep]
    firsts: dict[str, Decision] = {}
    for d in promoted:
        firsts.setdefault(d.scenario_id, d)
    if not firsts:
        return []
    wanted = sorted({s for d in firsts.values() for s in (d.scenario_id, d.parent_scenario_id)})
    # Trials are not scoped by run: the parent's control arm is usually an earlier run's sweep.
    by_pair = outcomes_by_pair(trials(store, model_ids=model_ids, scenario_ids=wanted, model_versions=ALL_VERSIONS,
                                      as_of=as_of))
    arms = sorted({(m, v) for m, v, _ in by_pair}, key=lambda mv: (mv[0], mv[1] or ""))
    out = []
    for scenario_id in sorted(firsts):
        d = firsts[scenario_id]
        for model_id, model_version in arms:
            child = by_pair.get((model_id, model_version, scenario_id))
            parent = by_pair.get((model_id, model_version, d.parent_scenario_id))
            if child and parent:
                effect = paired(parent, child)
                if effect.pairs:
                    out.append(PairedEffect(scenario_id, d.parent_scenario_id, d.factor, model_id, effect,
                                            model_version))
    return out


@dataclass(frozen=True)
class SaturationSignal:
    scenario_id: str
    models: int  # models judged
    missing: tuple[str, ...]  # models with no valid trial on the scenario
    weakest_model: str | None
    min_rate: float
    min_lower: float  # the lowest Wilson lower bound among the models
    saturated: bool  # every model judged passes at >= threshold (and none is missing)


def saturation(store: EvidenceStore, *, version: int | None = None, model_ids: Sequence[str] | None = None,
               threshold: float = SATURATION_RATE, run_id: str | None = None,
               as_of: datetime | None = None) -> list[SaturationSignal]:
    """Per scenario of ``version`` (None: the latest version, or every scenario with episodes before
    the first promotion): does every model pass it at >= threshold? Models: the given ones, else
    the ranked registered ones (the oracle is not judged), else every model with episodes; each
    at its latest version."""
    version = _default_version(store, version, run_id=run_id, as_of=as_of)
    judged = list(model_ids) if model_ids is not None else ranked_model_ids(store, as_of=as_of)
    table = scores(store, version=version, model_ids=judged, run_id=run_id, as_of=as_of)
    return saturation_of(table, version_scenarios(store, version, run_id=run_id, as_of=as_of), judged, threshold)


def saturation_of(table: Sequence[ModelScenarioScore], scenario_ids: Sequence[str] | None,
                  judged: Sequence[str] | None, threshold: float = SATURATION_RATE) -> list[SaturationSignal]:
    """Saturation from a scores table (one row per model and scenario): per scenario of
    ``scenario_ids`` (None: every scenario of the table), over the ``judged`` models (None: every
    model with valid trials on those scenarios)."""
    if scenario_ids is not None:
        keep = set(scenario_ids)
        table = [s for s in table if s.scenario_id in keep]
    else:
        scenario_ids = sorted({s.scenario_id for s in table})
    if judged is None:
        judged = sorted({s.model_id for s in table if s.episodes})
    by_key = {(s.model_id, s.scenario_id): s for s in table if s.episodes}
    out = []
    for scenario_id in scenario_ids:
        present = [by_key[(m, scenario_id)] for m in judged if (m, scenario_id) in by_key]
        missing = tuple(m for m in judged if (m, scenario_id) not in by_key)
        weakest = min(present, key=lambda s: (s.success_rate, s.model_id), default=None)
        out.append(SaturationSignal(
            scenario_id, len(present), missing, weakest.model_id if weakest else None,
            weakest.success_rate if weakest else 0.0, min((s.interval[0] for s in present), default=0.0),
            bool(present) and not missing and all(s.success_rate >= threshold for s in present)))
    return out


def _default_version(store: EvidenceStore, version: int | None, *, run_id: str | None,
                     as_of: datetime | None) -> int | None:
    return version if version is not None else current_version(store, run_id=run_id, as_of=as_of)


@dataclass(frozen=True)
class Discrimination:
    """How well one benchmark version separates the models.

    spread = best - worst pooled success rate; separated_pairs = model pairs whose 95% intervals do
    not overlap; spearman = rank correlation of the models' rates with the reference ranking (None
    without one, or with fewer than two models)."""

    version: int | None  # None: every scenario with episodes (nothing promoted yet)
    scenarios: int
    model_scores: tuple[ModelScore, ...]  # best first
    spread: float
    separated_pairs: int
    pairs: int
    spearman: float | None

    @property
    def best(self) -> str | None:
        return self.model_scores[0].model_id if self.model_scores else None

    @property
    def worst(self) -> str | None:
        return self.model_scores[-1].model_id if self.model_scores else None


def discrimination(store: EvidenceStore, *, version: int | None = None, ranking: Sequence[str] | None = None,
                   model_ids: Sequence[str] | None = None, run_id: str | None = None,
                   as_of: datetime | None = None) -> Discrimination:
    """``ranking``: model ids from the most to the least capable (the reference Spearman is taken
    against). Models: the given ones, else the ranked registered ones, else every model with
    episodes; each at its latest version."""
    version = _default_version(store, version, run_id=run_id, as_of=as_of)
    judged = list(model_ids) if model_ids is not None else ranked_model_ids(store, as_of=as_of)
    table = scores(store, version=version, model_ids=judged, run_id=run_id, as_of=as_of)
    return discrimination_of(version, table, ranking)


@dataclass(frozen=True)
class AdjacentPair:
    """Two models next to each other in the benchmark's order: ``better`` scored above ``worse``.
    ``test`` pairs their trials on (scenario, seed, variant) over the version's scenarios; they are
    separated when its Holm-adjusted p (over every adjacent pair) is below ``alpha``."""

    better: str
    worse: str
    test: PairedDifference
    holm_p: float
    alpha: float

    @property
    def separated(self) -> bool:
        return self.holm_p < self.alpha


def adjacent_pairs(store: EvidenceStore, version: int, *, seeds: Seeds = HELD_OUT, alpha: float = 0.05,
                   model_ids: Sequence[str] | None = None) -> list[AdjacentPair]:
    """The ranked models (``model_ids``, default: the registered non-oracle models) in the order
    their pooled success on the version puts them, and whether each adjacent pair is told apart:
    exact McNemar on paired trials, Holm's correction over the pairs. A tie at the top reads as a
    pair that is not separated."""
    judged = list(model_ids) if model_ids is not None else ranked_of(models(store)) or []
    scenario_ids = version_scenarios(store, version)
    if not judged or not scenario_ids:
        return []
    pooled = pooled_scores(scores(store, version=version, model_ids=judged, seeds=seeds))
    order = [m.model_id for m in sorted(pooled, key=lambda m: (-m.success_rate, m.model_id))]
    outcomes: dict[str, dict[tuple, bool]] = defaultdict(dict)
    for t in trials(store, model_ids=order, scenario_ids=scenario_ids, seeds=seeds):
        if t.valid and t.pair_key is not None:
            outcomes[t.model_id][(t.scenario_id, *t.pair_key)] = t.success
    tests = [paired(outcomes[b], outcomes[w]) for b, w in zip(order, order[1:], strict=False)]
    adjusted = holm_adjusted([t.p_value for t in tests]) if tests else []
    return [AdjacentPair(b, w, t, p, alpha)
            for (b, w), t, p in zip(zip(order, order[1:], strict=False), tests, adjusted, strict=True)]


def discrimination_of(version: int | None, table: Sequence[ModelScenarioScore], ranking: Sequence[str] | None,
                      scenario_ids: Sequence[str] | None = None,
                      judged: Sequence[str] | None = None) -> Discrimination:
    """Discrimination from a scores table (one row per model and scenario), restricted to
    ``scenario_ids`` and the ``judged`` models when given."""
    if scenario_ids is not None:
        keep = set(scenario_ids)
        table = [s for s in table if s.scenario_id in keep]
    if judged is not None:
        table = [s for s in table if s.model_id in set(judged)]
    pooled = sorted(pooled_scores(table), key=lambda m: (-m.success_rate, m.model_id))
    rates = [m.success_rate for m in pooled]
    pairs = [(a, b) for i, a in enumerate(pooled) for b in pooled[i + 1:]]
    separated = sum(1 for a, b in pairs if a.interval[0] > b.interval[1] or b.interval[0] > a.interval[1])
    rho = None
    if ranking is not None:
        ranked = [m for m in pooled if m.model_id in ranking]
        # reference: the first model of the ranking is the most capable, so it gets the highest score
        rho = spearman([m.success_rate for m in ranked], [-list(ranking).index(m.model_id) for m in ranked])
    return Discrimination(version, len({s.scenario_id for s in table if s.episodes}), tuple(pooled),
                          (max(rates) - min(rates)) if rates else 0.0, separated, len(pairs), rho)


def discrimination_by_version(store: EvidenceStore, *, ranking: Sequence[str] | None = None,
                              model_ids: Sequence[str] | None = None, run_id: str | None = None,
                              as_of: datetime | None = None) -> list[Discrimination]:
    """The capability frontier: every version's discrimination, oldest first (one entry with
    version None before the first promotion)."""
    judged = list(model_ids) if model_ids is not None else ranked_model_ids(store, as_of=as_of)
    table = scores(store, model_ids=judged, run_id=run_id, as_of=as_of)
    return frontier_of(benchmark_versions(store, run_id=run_id, as_of=as_of), table, ranking)


def frontier_of(versions: Sequence[BenchmarkVersion], table: Sequence[ModelScenarioScore],
                ranking: Sequence[str] | None, judged: Sequence[str] | None = None) -> list[Discrimination]:
    if not versions:
        return [discrimination_of(None, table, ranking, judged=judged)]
    return [discrimination_of(v.version, table, ranking, v.scenario_ids, judged) for v in versions]
