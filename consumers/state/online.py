"""The seam: what the online processors (streams/: the gate, the sweeper, the mutator;
consumers/critics) and the orchestrator (infra/orchestrator.py, its waits infra/waits.py and
reviews infra/reviews.py) ask the store.

They import this module only (``from consumers.state import online as q``), never the other read
models, so what the running loop depends on is the list below: the single-episode and request
lookups defined here (a critic does not ask twice, nor for seeds still being run) and the read
models it re-exports from where they are defined. A read model the loop starts to need is added
here, where a reviewer sees it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from consumers.evidence.store import EvidenceStore
from consumers.state.comparisons import adjacent_pairs
from consumers.state.digest import refused_requests
from consumers.state.failure_clusters import cluster_assignments, cluster_events, cluster_log_length
from consumers.state.loop import Candidate, OpenReview, Verdict, candidates, cycles, open_reviews, verdicts
from consumers.state.registry import model_versions, models
from consumers.state.scope import ENDED, ORACLE_KIND, SATURATION_RATE, STARTED
from consumers.state.spend import episode_seconds, rollouts_spent
from consumers.state.trial_scores import HELD_OUT, SELECTION, pooled_scores, scores, trials
from consumers.state.versions import active_benchmark, active_scenarios, benchmark_versions, decisions

__all__ = [
    # defined here: single episodes and requests
    "requested",
    "in_flight_seeds",
    "scenario_spec",
    "analysed_episodes",
    "episode_keyframes",
    # defined here: what the orchestrator's waits and loop read of requests and episodes
    "ENDED_OF_REQUESTS",
    "ended_episodes",
    "ended_per_request",
    "analysed_state",
    "intake_clustered",
    "episode_outcomes",
    "episodes_spent",
    "verdicts_of",
    # re-exported from the read models that define them
    "Candidate",
    "HELD_OUT",
    "ORACLE_KIND",
    "OpenReview",
    "SATURATION_RATE",
    "SELECTION",
    "Verdict",
    "active_benchmark",
    "active_scenarios",
    "adjacent_pairs",
    "benchmark_versions",
    "candidates",
    "cluster_assignments",
    "cluster_events",
    "cluster_log_length",
    "cycles",
    "decisions",
    "episode_seconds",
    "model_versions",
    "models",
    "open_reviews",
    "pooled_scores",
    "refused_requests",
    "rollouts_spent",
    "scores",
    "trials",
    "verdicts",
]


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
    (episode_id, model_id, scenario_id, scenario, success, termination, steps, quality, analysed, moments)."""
    if not episode_ids:
        return []
    cols = ("episode_id", "model_id", "scenario_id", "scenario", "success", "termination", "steps", "quality",
            "analysed", "moments")
    rows = store.query(f"SELECT {', '.join(cols)} FROM {{database}}.failure_episodes FINAL "
                       "WHERE episode_id IN {ids:Array(String)} ORDER BY episode_id",
                       parameters={"ids": list(episode_ids)})
    return [dict(zip(cols, r, strict=True)) | {"moments": [dict(m) for m in r[-1]], "quality": dict(r[7]),
                                               "scenario": dict(r[3])} for r in rows]


def episode_keyframes(store: EvidenceStore, episode_id: str) -> list[str]:
    """The sha256 of every keyframe of one episode, in step order, its final frame last."""
    rows = store.query("SELECT keyframe_sha256 FROM {database}.rollout_steps FINAL WHERE episode_id = {e:String} "
                       "AND keyframe_sha256 IS NOT NULL ORDER BY t", parameters={"e": episode_id})
    frames = [r[0] for r in rows]
    final = store.query("SELECT final_keyframe_sha256 FROM {database}.rollout_episodes FINAL WHERE episode_id = "
                        "{e:String} AND envelope.event_type = 'EpisodeEnded' AND final_keyframe_sha256 IS NOT NULL",
                        parameters={"e": episode_id})
    return frames + [r[0] for r in final if r[0] not in frames]


# --- what the orchestrator's waits and loop read of requests and episodes ----------------------

# Episodes of the requests whose EpisodeEnded is stored (EpisodeEnded carries no request_id:
# EpisodeStarted names the request).
ENDED_OF_REQUESTS = (
    "SELECT request_id, episode_id FROM (SELECT DISTINCT request_id, episode_id FROM {database}.rollout_episodes FINAL "
    "WHERE envelope.event_type = 'EpisodeStarted' AND has({requests:Array(String)}, request_id)) "
    "WHERE episode_id IN (SELECT episode_id FROM {database}.rollout_episodes FINAL "
    "WHERE envelope.event_type = 'EpisodeEnded') ORDER BY request_id, episode_id")


def ended_episodes(store: EvidenceStore, request_ids: list[str]) -> list[tuple[str, str]]:
    """(request_id, episode_id) of every ended episode of the requests."""
    return [(r, e) for r, e in store.query(ENDED_OF_REQUESTS, {"requests": request_ids})]


def ended_per_request(store: EvidenceStore, request_ids: list[str]) -> dict[str, int]:
    """request_id -> how many of its episodes have ended."""
    counts: dict[str, int] = {}
    for request_id, _ in ended_episodes(store, request_ids):
        counts[request_id] = counts.get(request_id, 0) + 1
    return counts


def analysed_state(store: EvidenceStore, episode_ids: list[str]) -> dict[str, tuple[bool, bool, str, int]]:
    """episode -> (success, analysed, termination, moments) of each of ``episode_ids`` with its
    EpisodeAnalysed (failure_episodes)."""
    return {e: (bool(s), bool(a), t, int(m)) for e, s, a, t, m in store.query(
        "SELECT episode_id, any(success), any(analysed), any(termination), any(length(moments)) "
        "FROM {database}.failure_episodes FINAL WHERE has({episodes:Array(String)}, episode_id) "
        "GROUP BY episode_id", {"episodes": episode_ids})}


def intake_clustered(store: EvidenceStore, episode_ids: list[str]) -> set[str]:
    """Those of ``episode_ids`` with their intake ClusterAssigned (failure_clusters)."""
    return {row[0] for row in store.query(
        "SELECT DISTINCT episode_id FROM {database}.failure_clusters FINAL "
        "WHERE envelope.event_type = 'ClusterAssigned' AND intake AND has({episodes:Array(String)}, episode_id)",
        {"episodes": episode_ids})}


def episode_outcomes(store: EvidenceStore, request_ids: list[str]) -> list[tuple[int, str, str, int, bool]]:
    """(seed, episode_id, termination, steps, success) of the requests' ended episodes, by seed."""
    episode_ids = [e for _, e in ended_episodes(store, request_ids)]
    rows = store.query(
        "SELECT s.seed, episode_id, e.termination, e.steps, e.success FROM "
        "(SELECT episode_id, any(seed) AS seed FROM {database}.rollout_episodes FINAL "
        " WHERE envelope.event_type = 'EpisodeStarted' AND has({episodes:Array(String)}, episode_id) "
        " GROUP BY episode_id) AS s JOIN "
        "(SELECT episode_id, any(termination) AS termination, any(steps) AS steps, any(success) AS success "
        " FROM {database}.rollout_episodes FINAL WHERE envelope.event_type = 'EpisodeEnded' "
        " AND has({episodes:Array(String)}, episode_id) GROUP BY episode_id) AS e USING (episode_id) "
        "ORDER BY s.seed, episode_id", {"episodes": episode_ids})
    return [(int(seed), e, t, int(n), bool(ok)) for seed, e, t, n, ok in rows]


def episodes_spent(store: EvidenceStore) -> int:
    """Episodes ended in the whole log (every copy: what was really spent)."""
    return sum(r.ended_episodes for r in rollouts_spent(store))


def verdicts_of(store: EvidenceStore, scenario_ids: list[str]) -> str:
    """The critics' verdicts so far of each scenario, as a timeout quotes them."""
    if not scenario_ids:
        return "none"
    by = defaultdict(list)
    for v in verdicts(store, scenario_ids=scenario_ids):
        by[v.scenario_id].append(f"{v.critic} {'ran' if v.ran else 'not run'}/{v.passed}")
    return "; ".join(f"{sid}: {', '.join(by[sid]) or 'none yet'}" for sid in scenario_ids)
