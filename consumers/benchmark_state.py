"""Benchmark state, derived from the evidence log and never stored: a function of the events.

Every query reads FINAL so a re-delivered event counts once. `state_digest` hashes the whole
derived state; replaying the topics into an empty store must reproduce it exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from consumers.evidence.columns import table_columns
from consumers.evidence.store import EvidenceStore
from schemas.catalog import TOPICS

Z_95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """95% Wilson score interval: honest at small n and at 0% / 100%, unlike the normal one."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class ModelScenarioScore:
    model_id: str
    scenario_id: str
    episodes: int
    successes: int

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.episodes)


def table_counts(store: EvidenceStore) -> dict[str, int]:
    return {t.table: int(store.query(f"SELECT count() FROM {{database}}.{t.table} FINAL")[0][0]) for t in TOPICS}


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


def scores(store: EvidenceStore) -> list[ModelScenarioScore]:
    rows = store.query("SELECT model_id, scenario_id, count(), countIf(success) FROM {database}.rollout_episodes "
                       "FINAL WHERE envelope.event_type = 'EpisodeEnded' GROUP BY model_id, scenario_id "
                       "ORDER BY model_id, scenario_id")
    return [ModelScenarioScore(m, s, int(n), int(k)) for m, s, n, k in rows]


def active_scenarios(store: EvidenceStore) -> list[str]:
    """Scenarios whose latest promotion-relevant decision is Promoted (or an approved review)."""
    rows = store.query(
        "SELECT scenario_id, argMax(envelope.event_type, (envelope.event_time, envelope.event_id)) AS last, "
        "argMax(approved, (envelope.event_time, envelope.event_id)) FROM {database}.benchmark_decisions FINAL "
        "WHERE envelope.event_type IN ('Promoted', 'Retired', 'ReviewDecided') GROUP BY scenario_id "
        "ORDER BY scenario_id")
    return [s for s, last, approved in rows if last == "Promoted" or (last == "ReviewDecided" and approved)]


def open_reviews(store: EvidenceStore) -> list[str]:
    rows = store.query(
        "SELECT scenario_id FROM {database}.benchmark_decisions FINAL GROUP BY scenario_id "
        "HAVING countIf(envelope.event_type = 'ReviewRequested') > countIf(envelope.event_type = 'ReviewDecided') "
        "ORDER BY scenario_id")
    return [r[0] for r in rows]


def derived_state(store: EvidenceStore) -> dict:
    return {
        "tables": table_fingerprints(store),
        "scores": [[s.model_id, s.scenario_id, s.episodes, s.successes] for s in scores(store)],
        "active_scenarios": active_scenarios(store),
        "open_reviews": open_reviews(store),
    }


def state_digest(state: dict) -> str:
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
