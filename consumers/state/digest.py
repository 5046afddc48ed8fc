"""What replay and reproducibility are checked by: events and content fingerprints per table, the
whole derived state and its digest (replaying the topics into an empty store must reproduce it),
and the content digest two runs of one seed are compared by; and which requests a rollout worker
refused (their episodes never come)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

from consumers.evidence.columns import table_columns
from consumers.evidence.store import EvidenceStore
from consumers.state.failure_clusters import clusters
from consumers.state.loop import candidates, open_reviews
from consumers.state.registry import ALL_VERSIONS, latest_model_versions
from consumers.state.scope import ENDED, _where
from consumers.state.trial_scores import scores
from consumers.state.versions import active_scenarios, benchmark_versions, decisions
from schemas.catalog import TOPICS

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


# --- the digest replay verifies ------------------------------------------------------------------

def refused_requests(store: EvidenceStore, requests_topic: str, request_ids: list[str],
                     since: datetime | None = None) -> dict[str, str]:
    """request_id -> reason, for requests a rollout worker dead-lettered (their episodes never come).
    ``since``: refusals at or after it only (a request published again after an earlier refusal,
    say once its model was registered, is not refused by that one)."""
    rows = store.query("SELECT original, reason FROM {database}.dead_letters FINAL WHERE source_topic = {topic:String} "
                       "AND envelope.event_time >= {since:DateTime64(6, 'UTC')}",
                       {"topic": requests_topic, "since": since or datetime(1970, 1, 1, tzinfo=UTC)},
                       column_formats={"original": "bytes"})
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
