"""Decisions and the benchmark versions they make: what the gate and the reviewers decided, oldest
first, and which scenarios each version holds (per scenario, the latest of Promoted/Retired).
Every read scoped to a benchmark version asks ``version_scenarios`` here."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from consumers.evidence.store import EvidenceStore
from consumers.state.scope import _scope, _utc, _where

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
