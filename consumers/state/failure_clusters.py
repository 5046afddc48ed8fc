"""Failures as the detector and the clusterer left them: failure moments by type and over time,
clusters at their latest ClusterUpdated, what a mutator cycle seeds from (the clusterer's output
before a position), and the failed episodes not clustered yet."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from consumers.evidence.store import EvidenceStore
from consumers.state.scope import _scope, _utc, _where

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


def cluster_assignments(store: EvidenceStore, *, before_position: int) -> dict[str, str]:
    """episode -> its cluster at its latest ClusterAssigned before ``before_position`` ("noise"
    included): every episode the clusterer took in before that position, and where it stood."""
    return {e: c for e, c in store.query(
        "SELECT episode_id, argMax(cluster_id, position) FROM {database}.failure_clusters FINAL "
        "WHERE envelope.event_type = 'ClusterAssigned' AND position < {p:Int64} GROUP BY episode_id "
        "ORDER BY episode_id", parameters={"p": int(before_position)})}


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
