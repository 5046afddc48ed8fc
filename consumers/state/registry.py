"""Models and model versions: who is registered (and ranked: every kind but the oracle), every
version of every model, and which version a query reads (LATEST, ALL_VERSIONS or a pin, as the
package docstring says), as the SQL condition the trial query (trial_scores.py) applies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from consumers.evidence.store import EvidenceStore
from consumers.state.scope import ORACLE_KIND, STARTED, _scope, _utc, _where

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


# Which version of each model a query reads (package docstring): LATEST, ALL_VERSIONS or a mapping
# {model_id: version} that pins those models (the others at their latest).
LATEST = "latest"
ALL_VERSIONS = "all"
ModelVersions = str | Mapping[str, str]


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
