"""The run orchestrator: what a run publishes, and the waiting on the events of that run.

A run publishes RolloutRequested events (the rollout worker that `sepa-eval up` started serves
them) and then waits on the evidence log, never on the processes:

1. ``wait_for_episodes``: every requested episode has its EpisodeEnded in rollout_episodes;
2. ``wait_until_settled``: every ended episode has its EpisodeAnalysed (failure_episodes), and
   every failed analysed episode (success=false, analysed=true, termination not env_error or
   aborted) has its intake ClusterAssigned (failure_clusters, intake=true): the failure moments
   of every episode are stored and the clusterer has taken in every failure, in a cluster or as
   noise. Only then is the derived state a finished one that a report may print.

A timeout names what is missing (which requests, which episodes, which table). The CLI's `run` and
`rollout` are thin callers; the evolving loop (cycles, sweeps) builds on the same waits.

    requests = request_rollouts(publisher, store, scenario, ["oracle"], seeds=[0, 1], run_id="run")
    wait_for_episodes(store, requests, deadline)
    settled = wait_until_settled(store, requests, deadline)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from consumers.evidence.store import EvidenceStore
from infra import processes
from infra.exceptions import NotRunning, RequestRefused, WaitTimeout
from infra.settings import Settings
from producers.publisher import Publisher
from producers.rollout_worker import rollout_request
from producers.sim.models import ModelConfig
from schemas.catalog import BY_NAME
from schemas.events import make_event

POLL_S = 0.5
# Terminations that are not the policy's failure: the clusterer does not take them in.
NOT_CLUSTERED_TERMINATIONS = ("env_error", "aborted")
# How many missing ids a timeout error quotes.
QUOTED_IDS = 5

Progress = Callable[[int, int], None]  # (done, total)
Check = Callable[[], None]  # raises when a process the wait relies on has died


def deadline_in(seconds: float) -> float:
    return time.monotonic() + seconds


def still_coming(settings: Settings, store: EvidenceStore, requests: list[dict]) -> Check:
    """A check for the waits: the rollout worker and the pipeline still run, and no request was
    refused by the rollout worker (dead-lettered: its episodes will never come)."""
    state = processes.RunState.read(settings)
    topic = BY_NAME["rollout.requests"].full_name(settings.topic_prefix)

    def check() -> None:
        for child in (processes.ROLLOUT, processes.PIPELINE):
            if state.pid_of(child) is not None and not state.alive(child):
                raise NotRunning(f"the {child.label} (pid {state.pid_of(child)}) has stopped; "
                                 f"see {child.log(settings)}")
        refused = refused_requests(store, topic, [r["request_id"] for r in requests])
        if refused:
            raise RequestRefused("; ".join(f"the rollout worker refused {rid}: {reason}"
                                           for rid, reason in refused.items()))
    return check


def register_models(publisher: Publisher, models: list[ModelConfig], producer: str = "sync-models") -> None:
    """ModelRegistered for every model (ids from (model_id, version): re-registering dedups)."""
    for m in models:
        publisher.publish(make_event("ModelRegistered", (m.model_id, m.version), producer, producer,
                                     model_id=m.model_id, version=m.version, kind=m.kind,
                                     description=m.description, params=m.params()))
    publisher.flush()


def check_models(requested: list[str], models: list[ModelConfig]) -> None:
    """Refuses a model the registry does not know, before anything is published."""
    known = {m.model_id for m in models}
    unknown = [m for m in requested if m not in known]
    if unknown:
        raise ValueError(f"model {', '.join(map(repr, unknown))} is not in the model registry; known: {sorted(known)}")


def request_rollouts(publisher: Publisher, store: EvidenceStore, scenario: dict, model_ids: list[str],
                     seeds: list[int], run_id: str, purpose: str = "adhoc", keyframe_every: int = 0) -> list[dict]:
    """One RolloutRequested per model. Request ids come from (scenario, model, seeds, purpose, run),
    so asking again is the same request; one whose episodes have all ended already is not published
    again. Returns every request (published or not)."""
    requests = [rollout_request(scenario, model_id, seeds, purpose=purpose, keyframe_every=keyframe_every,
                                run_id=run_id) for model_id in model_ids]
    done = _ended_per_request(store, [r["request_id"] for r in requests])
    for request in requests:
        if done.get(request["request_id"], 0) < len(request["seeds"]):
            publisher.publish(request)
    publisher.flush()
    return requests


@dataclass(frozen=True)
class Settled:
    """The run's episodes once the failure analysis has caught up with them."""

    episodes: int  # ended
    failed: int  # failed, analysed, of a termination the clusterer takes in
    analysed: int
    moments: int  # failure moments of the run's episodes (from their EpisodeAnalysed)
    clustered: int  # failed episodes with their intake ClusterAssigned


def wait_for_episodes(store: EvidenceStore, requests: list[dict], deadline: float,
                      progress: Progress | None = None, check: Check | None = None) -> int:
    """Until every requested episode's EpisodeEnded is in the evidence log; returns their number."""
    expected = {r["request_id"]: len(r["seeds"]) for r in requests}
    total = sum(expected.values())
    while True:
        ended = _ended_per_request(store, list(expected))
        done = sum(min(ended.get(rid, 0), n) for rid, n in expected.items())
        if progress is not None:
            progress(done, total)
        if done >= total:
            return total
        if check is not None:
            check()
        if time.monotonic() > deadline:
            short = [f"{rid}: {ended.get(rid, 0)} of {n}" for rid, n in expected.items() if ended.get(rid, 0) < n]
            raise WaitTimeout(f"{total - done} of {total} requested episodes have not ended in the evidence log "
                              f"(rollout_episodes) in time; requests short of episodes: {_quote(short)}")
        time.sleep(POLL_S)


def wait_until_settled(store: EvidenceStore, requests: list[dict], deadline: float,
                       progress: Progress | None = None, check: Check | None = None) -> Settled:
    """Until every ended episode of the requests is analysed and every failed one clustered."""
    request_ids = [r["request_id"] for r in requests]
    while True:
        state = settle_state(store, request_ids)
        if progress is not None:
            progress(state.analysed_count + state.clustered_count, state.total)
        if not state.unanalysed and not state.unclustered:
            return state.settled
        if check is not None:
            check()
        if time.monotonic() > deadline:
            missing = []
            if state.unanalysed:
                missing.append(f"{len(state.unanalysed)} of {len(state.ended)} ended episodes have no EpisodeAnalysed "
                               f"in failure_episodes (the failure detector's): {_quote(state.unanalysed)}")
            if state.unclustered:
                missing.append(f"{len(state.unclustered)} of {len(state.failed)} failed episodes have no intake "
                               f"ClusterAssigned in failure_clusters (the clusterer's): {_quote(state.unclustered)}")
            raise WaitTimeout("the failure analysis did not catch up in time: " + "; ".join(missing))
        time.sleep(POLL_S)


@dataclass(frozen=True)
class SettleState:
    ended: list[str]
    analysed: dict[str, tuple[bool, bool, str, int]]  # episode -> (success, analysed, termination, moments)
    clustered: set[str]

    @property
    def failed(self) -> list[str]:
        return sorted(e for e, (success, analysed, termination, _) in self.analysed.items()
                      if not success and analysed and termination not in NOT_CLUSTERED_TERMINATIONS)

    @property
    def unanalysed(self) -> list[str]:
        return [e for e in self.ended if e not in self.analysed]

    @property
    def unclustered(self) -> list[str]:
        return [e for e in self.failed if e not in self.clustered]

    @property
    def analysed_count(self) -> int:
        return len(self.ended) - len(self.unanalysed)

    @property
    def clustered_count(self) -> int:
        return len(self.failed) - len(self.unclustered)

    @property
    def total(self) -> int:
        return len(self.ended) + len(self.failed)

    @property
    def settled(self) -> Settled:
        return Settled(episodes=len(self.ended), failed=len(self.failed), analysed=len(self.analysed),
                       moments=sum(m for *_, m in self.analysed.values()), clustered=self.clustered_count)


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


def settle_state(store: EvidenceStore, request_ids: list[str]) -> SettleState:
    """Where the failure analysis of the requests' ended episodes stands, read from the evidence log."""
    ended = sorted({e for _, e in ended_episodes(store, request_ids)})
    if not ended:
        return SettleState([], {}, set())
    analysed = {e: (bool(s), bool(a), t, int(m)) for e, s, a, t, m in store.query(
        "SELECT episode_id, any(success), any(analysed), any(termination), any(length(moments)) "
        "FROM {database}.failure_episodes FINAL WHERE has({episodes:Array(String)}, episode_id) "
        "GROUP BY episode_id", {"episodes": ended})}
    failed = [e for e, (success, ok, termination, _) in analysed.items()
              if not success and ok and termination not in NOT_CLUSTERED_TERMINATIONS]
    clustered = {row[0] for row in store.query(
        "SELECT DISTINCT episode_id FROM {database}.failure_clusters FINAL "
        "WHERE envelope.event_type = 'ClusterAssigned' AND intake AND has({episodes:Array(String)}, episode_id)",
        {"episodes": failed})} if failed else set()
    return SettleState(ended, analysed, clustered)


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


def refused_requests(store: EvidenceStore, requests_topic: str, request_ids: list[str]) -> dict[str, str]:
    """request_id -> reason, for requests a rollout worker dead-lettered (their episodes never come)."""
    rows = store.query("SELECT original, reason FROM {database}.dead_letters FINAL WHERE source_topic = {topic:String}",
                       {"topic": requests_topic}, column_formats={"original": "bytes"})
    return {rid: reason for original, reason in rows for rid in request_ids if rid.encode() in original}


def _ended_per_request(store: EvidenceStore, request_ids: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for request_id, _ in ended_episodes(store, request_ids):
        counts[request_id] = counts.get(request_id, 0) + 1
    return counts


def _quote(ids: list[str]) -> str:
    shown = ", ".join(ids[:QUOTED_IDS])
    return shown + (f" and {len(ids) - QUOTED_IDS} more" if len(ids) > QUOTED_IDS else "")
