"""Trials and scores: one row per (model, model version, scenario, seed, variant), its latest valid
episode, and the success rates built from them. One SQL (``_trials_sql``) says what a trial is for
every reader (scores, paired comparisons, execution quality, status); the seed split (SELECTION,
HELD_OUT) and the model versions are conditions on it. Which versions have trials (the one a view
shows a model at, the one a new version is compared against) is read from it too."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from consumers.evidence.store import EvidenceStore
from consumers.state.registry import (
    ALL_VERSIONS,
    LATEST,
    ModelVersion,
    ModelVersions,
    UnknownModelVersion,
    _version_condition,
    model_versions,
)
from consumers.state.scope import ENDED, INVALID_TERMINATIONS, STARTED, _scope, _utc, _where
from consumers.state.versions import version_scenarios
from consumers.statistics import wilson_interval
from producers.seeds import HELD_OUT_FROM

# Which trials a score reads (producers/seeds.py): the seeds that chose the benchmark, the seeds
# that measure it, or (None) every seed.
SELECTION = "selection"
HELD_OUT = "held-out"
Seeds = str | None


# --- episodes and trials ----------------------------------------------------------------------

def _seeds_condition(params: dict, seeds: Seeds) -> str:
    """The condition on a trial's seed that ``seeds`` makes ("" for all seeds; producers/seeds.py)."""
    if seeds is None:
        return ""
    if seeds not in (SELECTION, HELD_OUT):
        raise ValueError(f"seeds must be {SELECTION!r}, {HELD_OUT!r} or None, got {seeds!r}")
    params["held_out_from"] = HELD_OUT_FROM
    # a trial whose start is missing has no known seed: it measures nothing, and it never chose
    return ("ifNull(seed, 0) < {held_out_from:Int64}" if seeds == SELECTION
            else "seed IS NOT NULL AND seed >= {held_out_from:Int64}")


def _trials_sql(params: dict, *, run_id: str | None, as_of: datetime | None,
                model_ids: Sequence[str] | None, scenario_ids: Sequence[str] | None,
                model_versions: ModelVersions = LATEST, seeds: Seeds = None) -> str:
    """One row per trial (model, model version, scenario, seed, variant): its latest valid ended episode.

    Columns: model_id, model_version and seed (Nullable: an episode whose start is missing is a
    trial of its own, of no known version), variant, scenario_id, episode_id, success, valid,
    termination, steps, quality, keyframe, request_id, ended_at.
    """
    conditions = [ENDED, *_scope(run_id, as_of, params)]
    if model_ids is not None:
        params["models"] = list(model_ids)
        conditions.append("model_id IN {models:Array(String)}")
    if scenario_ids is not None:
        params["scenarios"] = list(scenario_ids)
        conditions.append("scenario_id IN {scenarios:Array(String)}")
    params["invalid"] = list(INVALID_TERMINATIONS)
    versions = _version_condition(params, model_versions, as_of)
    return (
        "SELECT model_id, model_version, scenario_id, argMax(seed, k) AS seed, argMax(variant, k) AS variant, "
        "argMax(episode_id, k) AS episode_id, argMax(success, k) AS success, argMax(valid, k) AS valid, "
        "argMax(termination, k) AS termination, argMax(steps, k) AS steps, argMax(quality, k) AS quality, "
        "argMax(keyframe, k) AS keyframe, argMax(request_id, k) AS request_id, argMax(ended_at, k) AS ended_at FROM ("
        " SELECT e.model_id AS model_id, e.scenario_id AS scenario_id, e.episode_id AS episode_id,"
        " e.success AS success, e.termination NOT IN {invalid:Array(String)} AS valid,"
        " toString(e.termination) AS termination, e.steps AS steps, e.quality AS quality,"
        " e.final_keyframe_sha256 AS keyframe, e.ended_at AS ended_at,"
        " if(s.episode_id = '', NULL, s.seed) AS seed, if(s.episode_id = '', NULL, s.model_version) AS model_version,"
        " s.variant AS variant, s.request_id AS request_id,"
        " if(s.episode_id = '', concat('episode ', e.episode_id), concat(toString(s.seed), '/', s.variant)) AS trial,"
        " (valid, e.ended_at, e.event_id) AS k"
        " FROM (SELECT episode_id, model_id, scenario_id, success, termination, steps, quality,"
        "  final_keyframe_sha256, envelope.event_time AS ended_at, envelope.event_id AS event_id"
        f"  FROM {{database}}.rollout_episodes FINAL{_where(conditions)}) AS e"
        " LEFT JOIN (SELECT episode_id, seed, model_version, variant, request_id FROM {database}.rollout_episodes FINAL"
        f"  WHERE {STARTED}) AS s ON e.episode_id = s.episode_id{_where([versions, _seeds_condition(params, seeds)])}"
        ") GROUP BY model_id, model_version, scenario_id, trial")


@dataclass(frozen=True)
class Trial:
    """One (model, model version, scenario, seed, variant) and the outcome of its latest valid episode."""

    model_id: str
    model_version: str | None  # None: the episode's start is missing
    scenario_id: str
    seed: int | None
    variant: str
    episode_id: str
    success: bool
    valid: bool
    termination: str
    steps: int
    request_id: str | None
    final_keyframe_sha256: str | None
    ended_at: datetime | None = None

    @property
    def pair_key(self) -> tuple[int, str] | None:
        """What paired comparisons match trials on: (seed, variant); None without a known seed."""
        return None if self.seed is None else (self.seed, self.variant)


def trials(store: EvidenceStore, *, model_ids: Sequence[str] | None = None, scenario_ids: Sequence[str] | None = None,
           model_versions: ModelVersions = LATEST, run_id: str | None = None,
           as_of: datetime | None = None, seeds: Seeds = None) -> list[Trial]:
    """Every trial, sorted by model, version, scenario, seed, variant: what paired comparisons are
    built from; ``seeds`` keeps SELECTION or HELD_OUT seeds only (None: all)."""
    params: dict = {}
    sql = _trials_sql(params, run_id=run_id, as_of=as_of, model_ids=model_ids, scenario_ids=scenario_ids,
                      model_versions=model_versions, seeds=seeds)
    rows = store.query("SELECT model_id, model_version, scenario_id, seed, variant, episode_id, success, valid, "
                       f"termination, steps, request_id, keyframe, ended_at FROM ({sql}) "
                       "ORDER BY model_id, model_version, scenario_id, seed, variant, episode_id", parameters=params)
    return [Trial(r[0], r[1], r[2], None if r[3] is None else int(r[3]), r[4] or "", r[5], bool(r[6]), bool(r[7]),
                  r[8], int(r[9]), r[10], r[11], _utc(r[12])) for r in rows]


class _Rate:
    """``successes`` of ``episodes``: the rate and its 95% Wilson interval (0 and (0, 1) when empty)."""

    successes: int
    episodes: int

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.episodes)


@dataclass(frozen=True)
class ModelScenarioScore(_Rate):
    """Success of one model (version) on one scenario: ``successes`` of ``episodes`` valid trials."""

    model_id: str
    scenario_id: str
    episodes: int  # valid trials (one per seed and variant), the rate's denominator
    successes: int
    invalid: int = 0  # trials whose every episode ended env_error / aborted
    model_version: str | None = None


def scores(store: EvidenceStore, *, version: int | None = None, model_ids: Sequence[str] | None = None,
           scenario_ids: Sequence[str] | None = None, model_versions: ModelVersions = LATEST,
           run_id: str | None = None, as_of: datetime | None = None, seeds: Seeds = None) -> list[ModelScenarioScore]:
    """Per model x scenario success with 95% Wilson intervals (semantics in the package docstring).
    ``version`` restricts to that benchmark version's scenarios (None = every scenario), and
    ``scenario_ids`` to those; ``model_versions`` picks the model versions (default: each model's
    latest); ``seeds`` the seeds (HELD_OUT: what the benchmark measures; SELECTION: what chose it)."""
    in_version = version_scenarios(store, version, run_id=run_id, as_of=as_of)
    if in_version is not None and scenario_ids is not None:
        scenario_ids = [s for s in scenario_ids if s in set(in_version)]
    elif in_version is not None:
        scenario_ids = in_version
    params: dict = {}
    sql = _trials_sql(params, run_id=run_id, as_of=as_of, model_ids=model_ids, scenario_ids=scenario_ids,
                      model_versions=model_versions, seeds=seeds)
    rows = store.query(f"SELECT model_id, scenario_id, countIf(valid), countIf(valid AND success), countIf(NOT valid), "
                       f"model_version FROM ({sql}) GROUP BY model_id, model_version, scenario_id "
                       "ORDER BY model_id, model_version, scenario_id", parameters=params)
    return [ModelScenarioScore(m, s, int(n), int(k), int(bad), v) for m, s, n, k, bad, v in rows]


@dataclass(frozen=True)
class ModelScore(_Rate):
    """A model's (version's) success pooled over a set of scenarios (each trial once), with its Wilson interval."""

    model_id: str
    scenarios: int  # scenarios of the set the model has valid trials on
    episodes: int
    successes: int
    model_version: str | None = None


def pooled_scores(per_scenario: Iterable[ModelScenarioScore]) -> list[ModelScore]:
    """Per model and version, sorted by model then version; versions are never pooled together."""
    grouped: dict[tuple[str, str], list[ModelScenarioScore]] = defaultdict(list)
    for s in per_scenario:
        if s.episodes:
            grouped[(s.model_id, s.model_version)].append(s)
    return [ModelScore(m, len(g), sum(s.episodes for s in g), sum(s.successes for s in g), v)
            for (m, v), g in sorted(grouped.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]


# --- which model versions have trials ---------------------------------------------------------

def evaluated_versions(store: EvidenceStore, *, run_id: str | None = None,
                       as_of: datetime | None = None) -> dict[str, str]:
    """model_id -> the newest version with trials in the scope: its latest version (LATEST) when
    that has trials, else its most recent one that has (in ``model_versions`` order). What a view
    of a run, or of a log where a new version is registered but not yet run, shows each model at."""
    with_trials: dict[str, set[str]] = defaultdict(set)
    for s in scores(store, model_versions=ALL_VERSIONS, run_id=run_id, as_of=as_of):
        if s.model_version is not None:
            with_trials[s.model_id].add(s.model_version)
    if not with_trials:
        return {}
    out = {}
    order = defaultdict(list)
    for v in model_versions(store, as_of=as_of):
        order[v.model_id].append(v)
    for model_id, versions in sorted(with_trials.items()):
        latest = next((v.version for v in order[model_id] if v.latest), None)
        out[model_id] = latest if latest in versions else next(
            v.version for v in reversed(order[model_id]) if v.version in versions)
    return out


def previous_model_version(store: EvidenceStore, model_id: str, *, version: str | None = None,
                           scenario_ids: Sequence[str] | None = None, run_id: str | None = None,
                           as_of: datetime | None = None, seeds: Seeds = None) -> ModelVersion | None:
    """The version of ``model_id`` before ``version`` (default: its latest) that has valid trials on
    any of ``scenario_ids`` (None: on any scenario), the nearest such one in ``model_versions``
    order: what a new version is compared against. None when no earlier version has trials there.
    Raises UnknownModelVersion for a model or a version the log does not name."""
    known = model_versions(store, model_id=model_id, as_of=as_of)
    if not known:
        raise UnknownModelVersion(f"model {model_id!r} is neither registered nor has episodes in the evidence log")
    target = version if version is not None else next((v.version for v in known if v.latest), known[-1].version)
    position = next((i for i, v in enumerate(known) if v.version == target), None)
    if position is None:
        raise UnknownModelVersion(f"model {model_id!r} has no version {target!r} in the evidence log "
                                  f"(its versions: {', '.join(v.version for v in known)})")
    with_trials = {s.model_version for s in scores(store, model_ids=[model_id], scenario_ids=scenario_ids,
                                                   model_versions=ALL_VERSIONS, run_id=run_id, as_of=as_of,
                                                   seeds=seeds)
                   if s.episodes}
    return next((v for v in reversed(known[:position]) if v.version in with_trials), None)
