"""Benchmark state as typed queries over the evidence log: derived, never stored.

Every reader (report, diff, status, the critics and the gate, Grafana's SQL mirrors them) asks
these functions rather than writing SQL of its own. Each returns frozen dataclasses and takes, where
it makes sense:
- ``run_id``: only events whose ``envelope.run_id`` is that run (the run that produced them; a
  sweep episode reused by a later run keeps the run id of the run that made it);
- ``version``: the benchmark version (the scenarios active in it, from Promoted/Retired);
- ``as_of``: the log as it stood at that time (events with ``envelope.event_time <= as_of``).

Every read goes through ``FINAL``, so an event delivered twice counts once whatever merges did.

Success semantics: an episode's ``success`` is the environment's success measured relative to the
episode's own start and *held at the end of the episode* (not "succeeded at any step"). A trial is
one (model, model version, scenario, seed, variant), the version and variant from EpisodeStarted
(variant is empty for simulator workers; an eval farm sets it to tell policy variants or repeated
seeds apart): rollouts are deterministic per seed, so the same seed run twice (a sweep episode and
a validation control arm, a re-sweep) is one trial, counted once (its latest valid copy). Episodes
that ended ``env_error`` or ``aborted`` are not the policy's doing: they are counted as ``invalid``
and left out of success rates.

Model versions are never pooled. Scores, trials and execution quality take ``model_versions``:
``LATEST`` (the default) scores each model at its latest version (its latest ModelRegistered by
event time; a model never registered: the version of its latest started episode), ``ALL_VERSIONS``
keeps every version apart (one row per version), and a mapping ``{model_id: version}`` pins those
models to those versions (the others stay at their latest). An episode whose EpisodeStarted is
missing has no known version: it is a trial of its own under ``ALL_VERSIONS`` (version None) and
belongs to no version otherwise. Paired comparisons pair trials on (seed, variant).

Seeds are split (producers/seeds.py): scores and trials take ``seeds``: ``SELECTION`` (what chose
the benchmark: the gate and the critics read these only), ``HELD_OUT`` (what measures it: every
score a person reads), or None (every seed: the log as a whole).

``content_digest`` hashes what was decided and measured, not when (two runs are compared by it);
``derived_state`` / ``state_digest`` hash the whole derived state (tables, scores, benchmark
versions, promotions, candidate outcomes, clusters, reviews); replaying the topics into an empty
store must reproduce the digest exactly.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from consumers.evidence.columns import table_columns
from consumers.evidence.store import EvidenceStore
from consumers.statistics import (
    PairedDifference,
    holm_adjusted,
    paired,
    spearman,
    wilson_interval,
)
from producers.episode import HARNESS_TERMINATIONS
from producers.seeds import HELD_OUT_FROM
from schemas.catalog import TOPICS

# A scenario is saturated when every evaluated model passes it at least this often: what the report
# tells a reader. The gate retires at a lower bar (GateConfig.retire_min_success, 0.90, on fewer
# seeds) on purpose: it acts on selection sweeps of 10-20 seeds, where 0.95 is one failure away
# from 0.90, and a scenario that every model passes at 0.90 no longer separates them.
SATURATION_RATE = 0.95
# Terminations that say nothing about the policy: left out of success rates, counted as invalid.
INVALID_TERMINATIONS = HARNESS_TERMINATIONS
# ModelRegistered.kind of the reference policy: it validates scenarios, it is not ranked.
ORACLE_KIND = "oracle"
# Decision types and the candidate status each leaves behind when it is the latest.
DECISION_STATUS = {"Promoted": "promoted", "Rejected": "rejected", "Deferred": "deferred",
                   "ReviewRequested": "review", "Retired": "retired"}


ENDED = "envelope.event_type = 'EpisodeEnded'"
STARTED = "envelope.event_type = 'EpisodeStarted'"


# --- scope ------------------------------------------------------------------------------------

def _scope(run_id: str | None, as_of: datetime | None, params: dict, prefix: str = "") -> list[str]:
    """WHERE conditions for a run and an "as of" time, with their bound parameters added to params."""
    conditions = []
    if run_id is not None:
        params["run_id"] = run_id
        conditions.append(f"{prefix}envelope.run_id = {{run_id:String}}")
    if as_of is not None:
        if as_of.tzinfo is None:
            raise ValueError(f"as_of must be timezone-aware, got naive {as_of!r}")
        params["as_of"] = as_of.astimezone(UTC)
        conditions.append(f"{prefix}envelope.event_time <= {{as_of:DateTime64(6, 'UTC')}}")
    return conditions


def _where(conditions: Iterable[str]) -> str:
    conditions = [c for c in conditions if c]
    return (" WHERE " + " AND ".join(conditions)) if conditions else ""


def _utc(value: datetime) -> datetime:
    """ClickHouse hands DateTime64(6, 'UTC') back naive."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


# --- evidence tables --------------------------------------------------------------------------

def table_counts(store: EvidenceStore) -> dict[str, int]:
    """Events per evidence table (one table per topic), each counted once; in catalog order."""
    sql = " UNION ALL ".join(f"SELECT '{t.table}', count() FROM {{database}}.{t.table} FINAL" for t in TOPICS)
    counted = dict(store.query(sql))
    return {t.table: int(counted[t.table]) for t in TOPICS}


def table_fingerprints(store: EvidenceStore) -> dict[str, list]:
    """Count and an order-independent hash of every event's content, per table."""
    out = {}
    for topic in TOPICS:
        cols = ", ".join(f"`{c}`" for c in table_columns(topic))
        # toString(tuple(...)): sipHash64 of a NULL argument is NULL and would drop the row.
        count, xor = store.query(f"SELECT count(), groupBitXor(sipHash64(toString(tuple({cols})))) "
                                 f"FROM {{database}}.{topic.table} FINAL")[0]
        out[topic.table] = [int(count), str(xor)]
    return out


# --- models -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RegisteredModel:
    model_id: str
    version: str
    kind: str
    description: str


def models(store: EvidenceStore, *, as_of: datetime | None = None) -> list[RegisteredModel]:
    """Each registered model at its latest registration."""
    params: dict = {}
    rows = store.query(
        "SELECT model_id, argMax(version, k), argMax(kind, k), argMax(description, k) FROM "
        "(SELECT model_id, version, kind, description, (envelope.event_time, envelope.event_id) AS k "
        f"FROM {{database}}.models_registry FINAL{_where(_scope(None, as_of, params))}) "
        "GROUP BY model_id ORDER BY model_id", parameters=params)
    return [RegisteredModel(*row) for row in rows]


def ranked_model_ids(store: EvidenceStore, *, as_of: datetime | None = None) -> list[str] | None:
    """Registered models that are ranked (every kind but the oracle); None when none is registered."""
    return ranked_of(models(store, as_of=as_of))


def ranked_of(registered: Sequence[RegisteredModel]) -> list[str] | None:
    """The ranked ids among registered models (see ranked_model_ids)."""
    return [m.model_id for m in registered if m.kind != ORACLE_KIND] if registered else None


# Which version of each model a query reads (module docstring): LATEST, ALL_VERSIONS or a mapping
# {model_id: version} that pins those models (the others at their latest).
LATEST = "latest"
ALL_VERSIONS = "all"
ModelVersions = str | Mapping[str, str]
# Which trials a score reads (producers/seeds.py): the seeds that chose the benchmark, the seeds
# that measure it, or (None) every seed.
SELECTION = "selection"
HELD_OUT = "held-out"
Seeds = str | None


class UnknownModelVersion(ValueError):
    """A model version that neither a ModelRegistered nor an EpisodeStarted names."""


def _latest_versions_sql(params: dict, as_of: datetime | None) -> str:
    """model_id, version: each model's latest registration by (event time, event id), ranked above
    any episode; a model never registered: the version of its latest EpisodeStarted."""
    registered = _where(_scope(None, as_of, params))
    started = _where([STARTED, *_scope(None, as_of, params)])
    return ("SELECT model_id, argMax(version, k) AS version FROM ("
            " SELECT model_id, version, (1, envelope.event_time, envelope.event_id) AS k"
            f" FROM {{database}}.models_registry FINAL{registered}"
            " UNION ALL SELECT model_id, model_version, (0, envelope.event_time, envelope.event_id)"
            f" FROM {{database}}.rollout_episodes FINAL{started}) GROUP BY model_id")


def latest_model_versions(store: EvidenceStore, *, as_of: datetime | None = None) -> dict[str, str]:
    """model_id -> the version scores default to (LATEST)."""
    params: dict = {}
    return dict(store.query(_latest_versions_sql(params, as_of) + " ORDER BY model_id", parameters=params))


def _version_condition(params: dict, model_versions: ModelVersions, as_of: datetime | None) -> str:
    """The condition on (model_id, model_version) a selection makes ("" for ALL_VERSIONS)."""
    if isinstance(model_versions, str):
        if model_versions == ALL_VERSIONS:
            return ""
        if model_versions != LATEST:
            raise ValueError(f"model_versions must be {LATEST!r}, {ALL_VERSIONS!r} or a mapping "
                             f"{{model_id: version}}, got {model_versions!r}")
        return f"(model_id, model_version) IN ({_latest_versions_sql(params, as_of)})"
    pinned = dict(model_versions)
    params["pin_models"], params["pin_versions"] = list(pinned), [str(v) for v in pinned.values()]
    return ("if(has({pin_models:Array(String)}, model_id), model_version = "
            "arrayElement({pin_versions:Array(String)}, indexOf({pin_models:Array(String)}, model_id)), "
            f"(model_id, model_version) IN ({_latest_versions_sql(params, as_of)}))")


@dataclass(frozen=True)
class ModelVersion:
    """One version of a model: registered, or only seen in its episodes."""

    model_id: str
    version: str
    kind: str | None  # its registration's kind; None: never registered
    registered_at: datetime | None  # its latest ModelRegistered
    first_episode_at: datetime | None  # its first EpisodeStarted
    last_episode_at: datetime | None
    latest: bool  # the version scores default to

    @property
    def ref(self) -> str:
        return f"{self.model_id}@{self.version}"

    @property
    def _order(self) -> tuple:
        # Registered versions by registration time; a version only seen in episodes by its first one.
        return (self.registered_at or self.first_episode_at or datetime.min.replace(tzinfo=UTC), self.version)


def model_versions(store: EvidenceStore, *, model_id: str | None = None,
                   as_of: datetime | None = None) -> list[ModelVersion]:
    """Every version of every model (or of ``model_id``), by model, oldest first: registered
    versions by registration time, versions only seen in episodes by their first episode."""
    params: dict = {}
    conditions = _scope(None, as_of, params)
    if model_id is not None:
        params["model"] = model_id
        conditions.append("model_id = {model:String}")
    registered = store.query(
        "SELECT model_id, version, argMax(kind, k), max(envelope.event_time) FROM (SELECT *, "
        f"(envelope.event_time, envelope.event_id) AS k FROM {{database}}.models_registry FINAL{_where(conditions)}) "
        "GROUP BY model_id, version", parameters=params)
    seen = store.query(
        "SELECT model_id, model_version, min(envelope.event_time), max(envelope.event_time) FROM "
        f"{{database}}.rollout_episodes FINAL{_where([STARTED, *conditions])} "
        "GROUP BY model_id, model_version", parameters=params)
    latest = latest_model_versions(store, as_of=as_of)
    found: dict[tuple[str, str], list] = {}
    for m, v, kind, at in registered:
        found[(m, v)] = [kind, _utc(at), None, None]
    for m, v, first, last in seen:
        found.setdefault((m, v), [None, None, None, None])[2:] = [_utc(first), _utc(last)]
    out = [ModelVersion(m, v, kind, at, first, last, latest.get(m) == v)
           for (m, v), (kind, at, first, last) in found.items()]
    return sorted(out, key=lambda mv: (mv.model_id, mv._order))


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


# --- decisions and benchmark versions ----------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    event_id: str
    event_type: str  # Promoted | Rejected | Deferred | ReviewRequested | ReviewDecided | Retired
    event_time: datetime
    run_id: str
    scenario_id: str
    reason: str
    evidence_event_ids: tuple[str, ...]
    gate_version: str
    checks_json: str
    benchmark_version: int  # Promoted / Retired: the version the decision creates
    scenario: Mapping  # Promoted: the full ScenarioSpec
    parent_scenario_id: str
    source_cluster_id: str
    factor: str
    approved: bool  # ReviewDecided
    reviewer: str
    note: str

    @property
    def checks(self) -> dict:
        try:
            value = json.loads(self.checks_json) if self.checks_json else {}
        except json.JSONDecodeError:
            return {"unparsed": self.checks_json}
        return value if isinstance(value, dict) else {"checks": value}


_DECISION_COLUMNS = ("envelope.event_id, envelope.event_type, envelope.event_time, envelope.run_id, scenario_id, "
                     "reason, evidence_event_ids, gate_version, checks_json, benchmark_version, scenario, "
                     "parent_scenario_id, source_cluster_id, factor, approved, reviewer, note")


def decisions(store: EvidenceStore, *, scenario_ids: Sequence[str] | None = None,
              event_types: Sequence[str] | None = None, run_id: str | None = None,
              as_of: datetime | None = None) -> list[Decision]:
    """Gate and review decisions, oldest first (by event time, then event id)."""
    params: dict = {}
    conditions = _scope(run_id, as_of, params)
    if scenario_ids is not None:
        params["scenarios"] = list(scenario_ids)
        conditions.append("scenario_id IN {scenarios:Array(String)}")
    if event_types is not None:
        params["types"] = list(event_types)
        conditions.append("envelope.event_type IN {types:Array(String)}")
    rows = store.query(f"SELECT {_DECISION_COLUMNS} FROM {{database}}.benchmark_decisions FINAL{_where(conditions)} "
                       "ORDER BY envelope.event_time, envelope.event_id", parameters=params)
    return [Decision(r[0], r[1], _utc(r[2]), r[3], r[4], r[5], tuple(r[6]), r[7], r[8], int(r[9]), r[10], r[11],
                     r[12], r[13], bool(r[14]), r[15], r[16]) for r in rows]


@dataclass(frozen=True)
class ActiveScenario:
    scenario_id: str
    spec: Mapping  # the ScenarioSpec the Promoted carried
    promoted_in: int  # the version that admitted it
    parent_scenario_id: str
    factor: str
    source_cluster_id: str
    promotion_event_id: str


@dataclass(frozen=True)
class BenchmarkVersion:
    """The active benchmark as it stood once version ``version`` was created."""

    version: int
    created_at: datetime  # the first decision that made this version
    scenarios: tuple[ActiveScenario, ...]  # sorted by scenario id
    promoted: tuple[str, ...]  # scenarios this version admitted
    retired: tuple[str, ...]  # scenarios this version retired

    @property
    def scenario_ids(self) -> tuple[str, ...]:
        return tuple(s.scenario_id for s in self.scenarios)


def benchmark_versions(store: EvidenceStore, *, run_id: str | None = None,
                       as_of: datetime | None = None) -> list[BenchmarkVersion]:
    """Every benchmark version, oldest first. Active = scenarios whose latest of Promoted/Retired is
    Promoted, the decisions taken in (benchmark_version, event time, event id) order."""
    return versions_of(decisions(store, event_types=("Promoted", "Retired"), run_id=run_id, as_of=as_of))


def versions_of(made: Iterable[Decision]) -> list[BenchmarkVersion]:
    """Benchmark versions from Promoted/Retired decisions (any others are ignored)."""
    events = sorted((d for d in made if d.event_type in ("Promoted", "Retired")),
                    key=lambda d: (d.benchmark_version, d.event_time, d.event_id))
    active: dict[str, ActiveScenario] = {}
    versions: list[BenchmarkVersion] = []
    by_version: dict[int, list[Decision]] = defaultdict(list)
    for d in events:
        by_version[d.benchmark_version].append(d)
    for version in sorted(by_version):
        batch = by_version[version]
        for d in batch:
            if d.event_type == "Promoted":
                active[d.scenario_id] = ActiveScenario(d.scenario_id, d.scenario, version, d.parent_scenario_id,
                                                       d.factor, d.source_cluster_id, d.event_id)
            else:
                active.pop(d.scenario_id, None)
        versions.append(BenchmarkVersion(
            version, min(d.event_time for d in batch), tuple(active[s] for s in sorted(active)),
            tuple(sorted({d.scenario_id for d in batch if d.event_type == "Promoted"})),
            tuple(sorted({d.scenario_id for d in batch if d.event_type == "Retired"}))))
    return versions


def active_benchmark(store: EvidenceStore, *, version: int | None = None, run_id: str | None = None,
                     as_of: datetime | None = None) -> BenchmarkVersion | None:
    """The benchmark at ``version`` (None: the latest); None when no such version exists."""
    versions = benchmark_versions(store, run_id=run_id, as_of=as_of)
    if not versions:
        return None
    if version is None:
        return versions[-1]
    return next((v for v in versions if v.version == version), None)


def current_version(store: EvidenceStore, *, run_id: str | None = None, as_of: datetime | None = None) -> int | None:
    benchmark = active_benchmark(store, run_id=run_id, as_of=as_of)
    return benchmark.version if benchmark else None


def next_version(store: EvidenceStore, *, as_of: datetime | None = None) -> int:
    """The version the next Promoted/Retired creates: one past the latest (1 for the first)."""
    current = current_version(store, as_of=as_of)
    return 1 if current is None else current + 1


def active_scenarios(store: EvidenceStore, *, run_id: str | None = None, as_of: datetime | None = None) -> list[str]:
    """Scenario ids of the latest benchmark version (empty before the first promotion)."""
    benchmark = active_benchmark(store, run_id=run_id, as_of=as_of)
    return list(benchmark.scenario_ids) if benchmark else []


class UnknownVersion(ValueError):
    """A benchmark version that no Promoted/Retired decision created."""


def version_scenarios(store: EvidenceStore, version: int | None, *, run_id: str | None = None,
                      as_of: datetime | None = None) -> list[str] | None:
    """The scenarios of ``version``; None (meaning: no restriction) when version is None."""
    if version is None:
        return None
    benchmark = active_benchmark(store, version=version, run_id=run_id, as_of=as_of)
    if benchmark is None:
        known = [v.version for v in benchmark_versions(store, run_id=run_id, as_of=as_of)]
        raise UnknownVersion(f"benchmark version {version} does not exist in the evidence log "
                             f"(known versions: {known or 'none: nothing was promoted yet'})")
    return list(benchmark.scenario_ids)


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


@dataclass(frozen=True)
class ModelScenarioScore:
    """Success of one model (version) on one scenario: ``successes`` of ``episodes`` valid trials."""

    model_id: str
    scenario_id: str
    episodes: int  # valid trials (one per seed and variant), the rate's denominator
    successes: int
    invalid: int = 0  # trials whose every episode ended env_error / aborted
    model_version: str | None = None

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.episodes)


def scores(store: EvidenceStore, *, version: int | None = None, model_ids: Sequence[str] | None = None,
           scenario_ids: Sequence[str] | None = None, model_versions: ModelVersions = LATEST,
           run_id: str | None = None, as_of: datetime | None = None, seeds: Seeds = None) -> list[ModelScenarioScore]:
    """Per model x scenario success with 95% Wilson intervals (semantics in the module docstring).
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
class ModelScore:
    """A model's (version's) success pooled over a set of scenarios (each trial once), with its Wilson interval."""

    model_id: str
    scenarios: int  # scenarios of the set the model has valid trials on
    episodes: int
    successes: int
    model_version: str | None = None

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.episodes)


def pooled_scores(per_scenario: Iterable[ModelScenarioScore]) -> list[ModelScore]:
    """Per model and version, sorted by model then version; versions are never pooled together."""
    grouped: dict[tuple[str, str], list[ModelScenarioScore]] = defaultdict(list)
    for s in per_scenario:
        if s.episodes:
            grouped[(s.model_id, s.model_version)].append(s)
    return [ModelScore(m, len(g), sum(s.episodes for s in g), sum(s.successes for s in g), v)
            for (m, v), g in sorted(grouped.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]


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


# --- failures and clusters ----------------------------------------------------------------------

@dataclass(frozen=True)
class FailureTypeCount:
    failure_type: str
    moments: int  # FailureMoment events of this type
    episodes: int  # episodes with at least one
    recovered: int  # moments the episode later recovered from (EpisodeAnalysed)


def failure_types(store: EvidenceStore, *, model_ids: Sequence[str] | None = None,
                  scenario_ids: Sequence[str] | None = None, since: datetime | None = None,
                  run_id: str | None = None, as_of: datetime | None = None) -> list[FailureTypeCount]:
    """Detected failure moments by type, most frequent first."""
    params: dict = {}
    conditions = _scope(run_id, as_of, params)
    conditions += _filters(params, model_ids, scenario_ids, since)
    rows = store.query(
        "SELECT m.failure_type, count(), uniqExact(m.episode_id), countIf(r.recovered) FROM "
        "(SELECT envelope.event_id AS moment_id, toString(failure_type) AS failure_type, episode_id "
        f" FROM {{database}}.failure_moments FINAL{_where(conditions)}) AS m "
        "LEFT JOIN (SELECT mo.moment_id AS moment_id, max(mo.recovered_step >= 0) AS recovered "
        " FROM {database}.failure_episodes FINAL ARRAY JOIN moments AS mo GROUP BY moment_id) AS r "
        "ON m.moment_id = r.moment_id GROUP BY m.failure_type ORDER BY count() DESC, m.failure_type",
        parameters=params)
    return [FailureTypeCount(t, int(n), int(e), int(r)) for t, n, e, r in rows]


def _filters(params: dict, model_ids, scenario_ids, since: datetime | None) -> list[str]:
    conditions = []
    if model_ids is not None:
        params["models"] = list(model_ids)
        conditions.append("model_id IN {models:Array(String)}")
    if scenario_ids is not None:
        params["scenarios"] = list(scenario_ids)
        conditions.append("scenario_id IN {scenarios:Array(String)}")
    if since is not None:
        if since.tzinfo is None:
            raise ValueError(f"since must be timezone-aware, got naive {since!r}")
        params["since"] = since.astimezone(UTC)
        conditions.append("envelope.event_time >= {since:DateTime64(6, 'UTC')}")
    return conditions


@dataclass(frozen=True)
class FailureBucket:
    start: datetime
    failure_type: str
    moments: int


def failure_timeline(store: EvidenceStore, *, bucket_seconds: int | None = None, run_id: str | None = None,
                     as_of: datetime | None = None) -> list[FailureBucket]:
    """Failure moments per type per time bucket (by the moment's event time), oldest first.
    bucket_seconds None: the log's time span in about 24 buckets (at least one second each)."""
    params: dict = {}
    conditions = _scope(run_id, as_of, params)
    if bucket_seconds is None:
        lo, hi = store.query(f"SELECT min(envelope.event_time), max(envelope.event_time) "
                             f"FROM {{database}}.failure_moments FINAL{_where(conditions)}", parameters=params)[0]
        span = (_utc(hi) - _utc(lo)).total_seconds() if lo and hi else 0.0
        bucket_seconds = max(1, int(span / 24) + 1)
    if bucket_seconds < 1:
        raise ValueError(f"bucket_seconds must be >= 1, got {bucket_seconds}")
    params["bucket"] = int(bucket_seconds)
    rows = store.query(
        "SELECT toStartOfInterval(envelope.event_time, toIntervalSecond({bucket:UInt32})) AS b, "
        f"toString(failure_type), count() FROM {{database}}.failure_moments FINAL{_where(conditions)} "
        "GROUP BY b, failure_type ORDER BY b, failure_type", parameters=params)
    return [FailureBucket(_utc(b), t, int(n)) for b, t, n in rows]


@dataclass(frozen=True)
class ClusterSummary:
    """A failure cluster at its latest ClusterUpdated (by clusterer position)."""

    cluster_id: str
    size: int  # 0 = retired
    revision: int
    position: int
    dominant_failure_type: str
    failure_types: Mapping[str, float]  # share of the cluster's episodes with a moment of each type
    root_types: Mapping[str, float]
    model_counts: Mapping[str, int]
    scenario_counts: Mapping[str, int]
    site: Mapping[str, float]
    summary: str
    summary_source: str
    representative_episode_id: str
    representative_scenario_id: str
    representative_keyframe_sha256: str | None  # the representative episode's final keyframe
    updated_at: datetime


def clusters(store: EvidenceStore, *, as_of_position: int | None = None, include_retired: bool = False,
             run_id: str | None = None, as_of: datetime | None = None) -> list[ClusterSummary]:
    """Clusters at their latest ClusterUpdated, largest first. ``as_of_position``: the clusterer's
    output before that position (what a cycle opened at that position saw)."""
    params: dict = {}
    conditions = ["envelope.event_type = 'ClusterUpdated'", *_scope(run_id, as_of, params)]
    if as_of_position is not None:
        params["position"] = int(as_of_position)
        conditions.append("position < {position:Int64}")
    rows = store.query(
        "SELECT c.*, ifNull(k.keyframe, '') FROM ("
        " SELECT cluster_id, argMax(size, position), argMax(revision, position), max(position),"
        " argMax(dominant_failure_type, position), argMax(failure_types, position), argMax(root_types, position),"
        " argMax(model_counts, position), argMax(scenario_counts, position), argMax(site, position),"
        " argMax(summary, position), toString(argMax(summary_source, position)),"
        " argMax(representative_episode_id, position) AS representative,"
        " argMax(representative_scenario_id, position), argMax(envelope.event_time, position)"
        f" FROM {{database}}.failure_clusters FINAL{_where(conditions)} GROUP BY cluster_id) AS c "
        "LEFT JOIN (SELECT episode_id, any(final_keyframe_sha256) AS keyframe FROM {database}.rollout_episodes FINAL"
        " WHERE envelope.event_type = 'EpisodeEnded' AND final_keyframe_sha256 IS NOT NULL GROUP BY episode_id) AS k"
        " ON c.representative = k.episode_id", parameters=params)
    out = [ClusterSummary(r[0], int(r[1]), int(r[2]), int(r[3]), r[4], dict(r[5]), dict(r[6]),
                          {k: int(v) for k, v in r[7].items()}, {k: int(v) for k, v in r[8].items()}, dict(r[9]),
                          r[10], r[11], r[12], r[13], r[15] or None, _utc(r[14])) for r in rows]
    if not include_retired:
        out = [c for c in out if c.size > 0]
    return sorted(out, key=lambda c: (-c.size, c.cluster_id))


def cluster_events(store: EvidenceStore, *, before_position: int) -> list[dict]:
    """The latest ClusterUpdated of every cluster before ``before_position`` (size 0 included), as
    records with the fields a mutator seeds from: what a cycle opened at that position sees."""
    cols = ("cluster_id", "size", "revision", "position", "dominant_failure_type", "failure_types", "root_types",
            "model_counts", "scenario_counts", "site", "representative_episode_id", "representative_scenario_id",
            "representative_scenario")
    rows = store.query(
        f"SELECT {', '.join(f'argMax({c}, position)' if c != 'cluster_id' else c for c in cols)} "
        "FROM {database}.failure_clusters FINAL WHERE envelope.event_type = 'ClusterUpdated' "
        "AND position < {p:Int64} GROUP BY cluster_id ORDER BY cluster_id", parameters={"p": int(before_position)})
    out = []
    for r in rows:
        record = dict(zip(cols, r, strict=True))
        for name in ("failure_types", "root_types", "model_counts", "scenario_counts", "site",
                     "representative_scenario"):
            record[name] = dict(record[name])
        out.append(record)
    return out


def cluster_log_length(store: EvidenceStore) -> int:
    """How many of the clusterer's output positions the log holds from 0 without a gap (the next
    position to come, once the sink has caught up)."""
    n, top = store.query("SELECT uniqExact(position), max(position) FROM {database}.failure_clusters FINAL")[0]
    n = int(n)
    if n == 0:
        return 0
    return n if int(top) == n - 1 else min(n, int(top) + 1)


def noise_episodes(store: EvidenceStore, *, run_id: str | None = None, as_of: datetime | None = None) -> int:
    """Failed episodes whose latest assignment (by position) is "noise": clustered with nothing yet."""
    params: dict = {}
    conditions = ["envelope.event_type = 'ClusterAssigned'", *_scope(run_id, as_of, params)]
    return int(store.query(
        f"SELECT countIf(c = 'noise') FROM (SELECT episode_id, argMax(cluster_id, position) AS c "
        f"FROM {{database}}.failure_clusters FINAL{_where(conditions)} GROUP BY episode_id)", parameters=params)[0][0])


# --- what the critics and the gate read of single episodes and requests ------------------------

def requested(store: EvidenceStore, request_ids: Sequence[str]) -> set[str]:
    """Those of ``request_ids`` already in the log (a critic does not publish a request twice)."""
    if not request_ids:
        return set()
    rows = store.query("SELECT DISTINCT request_id FROM {database}.rollout_requests FINAL "
                       "WHERE request_id IN {ids:Array(String)}", parameters={"ids": list(request_ids)})
    return {r[0] for r in rows}


def in_flight_seeds(store: EvidenceStore, scenario_ids: Sequence[str],
                    model_ids: Sequence[str]) -> dict[tuple[str, str], set[int]]:
    """(scenario_id, model_id) -> the seeds some request in the log asked for whose episode of that
    request has not ended yet: what a critic must not ask for again while it is being run."""
    if not scenario_ids or not model_ids:
        return {}
    rows = store.query(
        "SELECT r.scenario_id, r.model_id, seed FROM (SELECT DISTINCT request_id, scenario_id, model_id, seeds "
        " FROM {database}.rollout_requests FINAL "
        " WHERE scenario_id IN {scenarios:Array(String)} AND model_id IN {models:Array(String)}) AS r "
        "ARRAY JOIN r.seeds AS seed "
        "WHERE (r.request_id, seed) NOT IN (SELECT ifNull(request_id, ''), seed FROM {database}.rollout_episodes FINAL "
        f" WHERE {STARTED} AND scenario_id IN {{scenarios:Array(String)}} AND episode_id IN "
        f" (SELECT episode_id FROM {{database}}.rollout_episodes FINAL WHERE {ENDED} "
        "  AND scenario_id IN {scenarios:Array(String)}))",
        parameters={"scenarios": list(scenario_ids), "models": list(model_ids)})
    out: dict[tuple[str, str], set[int]] = defaultdict(set)
    for scenario_id, model_id, seed in rows:
        out[(scenario_id, model_id)].add(int(seed))
    return dict(out)


def scenario_spec(store: EvidenceStore, scenario_id: str) -> dict | None:
    """The ScenarioSpec of a scenario, from wherever the log carries it (a promotion, a candidate,
    a rollout request), or None when the log has never seen it."""
    for sql in ("SELECT scenario FROM {database}.benchmark_decisions FINAL WHERE envelope.event_type = 'Promoted' "
                "AND scenario_id = {sid:String} LIMIT 1",
                "SELECT scenario FROM {database}.scenario_candidates FINAL WHERE scenario_id = {sid:String} LIMIT 1",
                "SELECT scenario FROM {database}.rollout_requests FINAL WHERE scenario_id = {sid:String} LIMIT 1"):
        rows = store.query(sql, parameters={"sid": scenario_id})
        if rows:
            return dict(rows[0][0])
    return None


def analysed_episodes(store: EvidenceStore, episode_ids: Sequence[str]) -> list[dict]:
    """The EpisodeAnalysed of each of ``episode_ids`` the detector has decided, as records
    (episode_id, model_id, scenario_id, success, termination, steps, quality, analysed, moments)."""
    if not episode_ids:
        return []
    cols = ("episode_id", "model_id", "scenario_id", "success", "termination", "steps", "quality", "analysed",
            "moments")
    rows = store.query(f"SELECT {', '.join(cols)} FROM {{database}}.failure_episodes FINAL "
                       "WHERE episode_id IN {ids:Array(String)} ORDER BY episode_id",
                       parameters={"ids": list(episode_ids)})
    return [dict(zip(cols, r, strict=True)) | {"moments": [dict(m) for m in r[-1]], "quality": dict(r[6])}
            for r in rows]


def episode_keyframes(store: EvidenceStore, episode_id: str) -> list[str]:
    """The sha256 of every keyframe of one episode, in step order, its final frame last."""
    rows = store.query("SELECT keyframe_sha256 FROM {database}.rollout_steps FINAL WHERE episode_id = {e:String} "
                       "AND keyframe_sha256 IS NOT NULL ORDER BY t", parameters={"e": episode_id})
    frames = [r[0] for r in rows]
    final = store.query("SELECT final_keyframe_sha256 FROM {database}.rollout_episodes FINAL WHERE episode_id = "
                        "{e:String} AND envelope.event_type = 'EpisodeEnded' AND final_keyframe_sha256 IS NOT NULL",
                        parameters={"e": episode_id})
    return frames + [r[0] for r in final if r[0] not in frames]


# --- candidates, verdicts, the funnel ------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    event_id: str
    event_time: datetime
    scenario_id: str
    critic: str  # semantic | safety | robustness
    critic_version: str
    ran: bool  # False: the critic did not really run (missing evidence, never a pass)
    score: float | None
    passed: bool | None
    backend: str
    reason: str
    rollouts: int  # rollouts this critic requested for the verdict
    evidence_json: str


def verdicts(store: EvidenceStore, *, scenario_ids: Sequence[str] | None = None, run_id: str | None = None,
             as_of: datetime | None = None) -> list[Verdict]:
    """Critic verdicts, oldest first."""
    params: dict = {}
    conditions = _scope(run_id, as_of, params)
    if scenario_ids is not None:
        params["scenarios"] = list(scenario_ids)
        conditions.append("scenario_id IN {scenarios:Array(String)}")
    rows = store.query(
        "SELECT envelope.event_id, envelope.event_time, scenario_id, critic, critic_version, ran, score, passed, "
        f"backend, reason, rollouts, evidence_json FROM {{database}}.critic_verdicts FINAL{_where(conditions)} "
        "ORDER BY envelope.event_time, envelope.event_id", parameters=params)
    return [Verdict(r[0], _utc(r[1]), r[2], r[3], r[4], bool(r[5]), r[6], None if r[7] is None else bool(r[7]),
                    r[8], r[9], int(r[10]), r[11]) for r in rows]


@dataclass(frozen=True)
class Candidate:
    scenario_id: str
    parent_scenario_id: str
    operator: str
    factor: str
    generator: str  # failure-guided | blind | composition | base
    cycle_id: str
    source_cluster_id: str | None
    params: Mapping[str, str]
    proposed_at: datetime
    scenario: Mapping  # the ScenarioSpec record
    event_id: str  # of its (first) CandidateProposed
    # promoted | rejected | deferred | review | approved (review approved, not yet promoted) |
    # retired | pending (no decision yet)
    status: str
    decided_at: datetime | None
    verdicts: tuple[Verdict, ...]

    @property
    def rollouts(self) -> int:
        return sum(v.rollouts for v in self.verdicts)


def _status(history: list[Decision]) -> tuple[str, datetime | None]:
    if not history:
        return "pending", None
    last = history[-1]
    if last.event_type == "ReviewDecided":
        return ("approved" if last.approved else "rejected"), last.event_time
    return DECISION_STATUS[last.event_type], last.event_time


def candidates(store: EvidenceStore, *, cycle_id: str | None = None, generator: str | None = None,
               run_id: str | None = None, as_of: datetime | None = None) -> list[Candidate]:
    """Proposed candidates with their verdicts and where the gate (or a reviewer) left them."""
    params: dict = {}
    conditions = _scope(run_id, as_of, params)
    if cycle_id is not None:
        params["cycle"] = cycle_id
        conditions.append("cycle_id = {cycle:String}")
    if generator is not None:
        params["generator"] = generator
        conditions.append("generator = {generator:String}")
    rows = store.query(
        "SELECT scenario_id, argMin(parent_scenario_id, k), argMin(operator, k), argMin(factor, k), "
        "argMin(generator, k), argMin(cycle_id, k), argMin(source_cluster_id, k), argMin(params, k), min(t), "
        "argMin(scenario, k), argMin(envelope.event_id, k) FROM "
        "(SELECT *, envelope.event_time AS t, (envelope.event_time, envelope.event_id) AS k "
        f" FROM {{database}}.scenario_candidates FINAL{_where(conditions)}) GROUP BY scenario_id ORDER BY min(t), "
        "scenario_id", parameters=params)
    if not rows:
        return []
    ids = [r[0] for r in rows]
    history: dict[str, list[Decision]] = defaultdict(list)
    for d in decisions(store, scenario_ids=ids, as_of=as_of):
        history[d.scenario_id].append(d)
    judged: dict[str, list[Verdict]] = defaultdict(list)
    for v in verdicts(store, scenario_ids=ids, as_of=as_of):
        judged[v.scenario_id].append(v)
    out = []
    for r in rows:
        status, decided_at = _status(history[r[0]])
        out.append(Candidate(r[0], r[1], r[2], r[3], r[4], r[5], r[6], dict(r[7]), _utc(r[8]), r[9], r[10], status,
                             decided_at, tuple(judged[r[0]])))
    return out


@dataclass(frozen=True)
class Funnel:
    """proposed -> verdicts -> decisions, for one generator (or every one: generator "all")."""

    generator: str
    infeasible: int  # generated but refused by the feasibility pre-check (never proposed)
    proposed: int
    with_verdicts: int
    promoted: int
    rejected: int
    deferred: int
    review: int
    approved: int
    retired: int
    pending: int
    rollouts: int  # rollouts the critics requested for these candidates


def funnel(store: EvidenceStore, *, cycle_id: str | None = None, run_id: str | None = None,
           as_of: datetime | None = None, proposed: Sequence[Candidate] | None = None) -> list[Funnel]:
    """One row per generator, then the total (generator "all"). ``proposed``: the candidates of
    the same scope when the caller has read them already."""
    if proposed is None:
        proposed = candidates(store, cycle_id=cycle_id, run_id=run_id, as_of=as_of)
    infeasible = _infeasible_counts(store, cycle_id=cycle_id, run_id=run_id, as_of=as_of)
    by_generator: dict[str, list[Candidate]] = defaultdict(list)
    for c in proposed:
        by_generator[c.generator].append(c)
    names = sorted(set(by_generator) | set(infeasible))
    rows = [_funnel_row(g, by_generator[g], infeasible.get(g, 0)) for g in names]
    rows.append(_funnel_row("all", proposed, sum(infeasible.values())))
    return rows


def _funnel_row(generator: str, group: Sequence[Candidate], infeasible: int) -> Funnel:
    count = defaultdict(int)
    for c in group:
        count[c.status] += 1
    return Funnel(generator, infeasible, len(group), sum(1 for c in group if c.verdicts), count["promoted"],
                  count["rejected"], count["deferred"], count["review"], count["approved"], count["retired"],
                  count["pending"], sum(c.rollouts for c in group))


def _infeasible_counts(store: EvidenceStore, *, cycle_id: str | None, run_id: str | None,
                       as_of: datetime | None) -> dict[str, int]:
    params: dict = {}
    conditions = ["envelope.event_type = 'CandidatesGenerated'", *_scope(run_id, as_of, params)]
    if cycle_id is not None:
        params["cycle"] = cycle_id
        conditions.append("cycle_id = {cycle:String}")
    rows = store.query(f"SELECT generator, sum(length(mapKeys(infeasible))) FROM {{database}}.benchmark_cycles FINAL"
                       f"{_where(conditions)} GROUP BY generator", parameters=params)
    return {g: int(n) for g, n in rows}


@dataclass(frozen=True)
class Cycle:
    cycle_id: str
    cycle: int
    benchmark_version: int
    generator: str
    started_at: datetime
    models: tuple[str, ...]
    proposed: tuple[str, ...]  # from CandidatesGenerated (empty until the mutator answered)
    infeasible: int
    answered: bool
    clusters_position: int = 0  # where in failures.clusters the mutator reads from
    focus_models: tuple[str, ...] = ()  # ranked models tied at the top: their clusters were seeded from first


def cycles(store: EvidenceStore, *, run_id: str | None = None, as_of: datetime | None = None) -> list[Cycle]:
    """Evolution cycles in the order they started."""
    params: dict = {}
    rows = store.query(
        "SELECT cycle_id, anyIf(cycle, t = 'CycleStarted'), anyIf(benchmark_version, t = 'CycleStarted'), "
        "anyIf(generator, t = 'CycleStarted'), minIf(at, t = 'CycleStarted'), anyIf(models, t = 'CycleStarted'), "
        "anyIf(proposed, t = 'CandidatesGenerated'), sumIf(length(mapKeys(infeasible)), t = 'CandidatesGenerated'), "
        "countIf(t = 'CandidatesGenerated') > 0, anyIf(clusters_position, t = 'CycleStarted'), "
        "anyIf(focus_models, t = 'CycleStarted') FROM (SELECT *, envelope.event_type AS t, envelope.event_time AS at "
        f"FROM {{database}}.benchmark_cycles FINAL{_where(_scope(run_id, as_of, params))}) GROUP BY cycle_id "
        "HAVING countIf(t = 'CycleStarted') > 0 ORDER BY minIf(at, t = 'CycleStarted'), cycle_id", parameters=params)
    return [Cycle(r[0], int(r[1]), int(r[2]), r[3], _utc(r[4]), tuple(r[5]), tuple(r[6]), int(r[7]), bool(r[8]),
                  int(r[9]), tuple(r[10])) for r in rows]


# --- reviews ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpenReview:
    scenario_id: str
    requested_at: datetime
    reason: str
    checks_json: str
    evidence_event_ids: tuple[str, ...]
    event_id: str


def open_reviews(store: EvidenceStore, *, run_id: str | None = None, as_of: datetime | None = None) -> list[OpenReview]:
    """ReviewRequested decisions no ReviewDecided (or later gate decision) has answered yet."""
    history: dict[str, list[Decision]] = defaultdict(list)
    for d in decisions(store, run_id=run_id, as_of=as_of):
        history[d.scenario_id].append(d)
    out = []
    for scenario_id in sorted(history):
        last = history[scenario_id][-1]
        if last.event_type == "ReviewRequested":
            out.append(OpenReview(scenario_id, last.event_time, last.reason, last.checks_json,
                                  last.evidence_event_ids, last.event_id))
    return out


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


# --- the digest replay verifies ------------------------------------------------------------------

def refused_requests(store: EvidenceStore, requests_topic: str, request_ids: list[str]) -> dict[str, str]:
    """request_id -> reason, for requests a rollout worker dead-lettered (their episodes never come)."""
    rows = store.query("SELECT original, reason FROM {database}.dead_letters FINAL WHERE source_topic = {topic:String}",
                       {"topic": requests_topic}, column_formats={"original": "bytes"})
    return {rid: reason for original, reason in rows for rid in request_ids if rid.encode() in original}


def derived_state(store: EvidenceStore) -> dict:
    """Everything derived from the log, as plain JSON-able values in a fixed order."""
    return {
        "tables": table_fingerprints(store),
        "scores": [[s.model_id, s.model_version, s.scenario_id, s.episodes, s.successes, s.invalid]
                   for s in scores(store, model_versions=ALL_VERSIONS)],
        "model_versions": latest_model_versions(store),
        "benchmark_versions": [[v.version, list(v.scenario_ids), list(v.promoted), list(v.retired)]
                               for v in benchmark_versions(store)],
        "promotions": [[d.scenario_id, d.benchmark_version, d.event_id]
                       for d in decisions(store, event_types=("Promoted", "Retired"))],
        "candidates": [[c.scenario_id, c.generator, c.status, len(c.verdicts)] for c in candidates(store)],
        "clusters": [[c.cluster_id, c.revision, c.size] for c in clusters(store, include_retired=True)],
        "active_scenarios": active_scenarios(store),
        "open_reviews": [r.scenario_id for r in open_reviews(store)],
    }


def state_digest(state: dict) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def content_state(store: EvidenceStore) -> dict:
    """What the benchmark decided and measured, not when: derived_state without the tables'
    fingerprints (they hash event times) and the clusters' revisions (how often the clusterer
    re-ran depends on timing), plus every trial's outcome, every list in a canonical order: what two
    runs of one seed are compared by (README, Reproducible, says when they share it)."""
    state = derived_state(store)
    del state["tables"], state["clusters"]
    # in a canonical order, not the log's: event times come from the episodes' wall clocks, so two
    # runs of one seed make the same decisions in an order that may differ
    for key in ("scores", "promotions", "candidates", "active_scenarios", "open_reviews"):
        state[key] = sorted(state[key], key=json.dumps)
    state["benchmark_versions"] = [[v, sorted(ids), sorted(promoted), sorted(retired)]
                                   for v, ids, promoted, retired in state["benchmark_versions"]]
    rows = store.query(
        "SELECT DISTINCT model_id, model_version, scenario_id, seed, success, termination, steps, total_reward "
        f"FROM {{database}}.rollout_episodes FINAL{_where([ENDED])} "
        "ORDER BY model_id, model_version, scenario_id, seed, termination, steps, total_reward")
    state["trials"] = [[m, v, s, int(seed), bool(ok), t, int(n), float(r)] for m, v, s, seed, ok, t, n, r in rows]
    return state


def content_digest(store: EvidenceStore) -> str:
    """sha256 of content_state: the digest `run` prints to compare two runs."""
    return state_digest(content_state(store))
