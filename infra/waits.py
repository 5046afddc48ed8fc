"""The waits on the evidence log for the episodes a run requested, and the checks that the
processes those waits rely on still run: a run publishes its RolloutRequested events (infra/
orchestrator.py) and then waits on the evidence log, never on the processes. Kept apart from the
evolving loop so the CLI's `run` and `rollout`, the benches and the loop share one set of waits:

1. ``wait_for_episodes``: every requested episode has its EpisodeEnded in rollout_episodes;
2. ``wait_until_settled``: every ended episode has its EpisodeAnalysed (failure_episodes), and
   every failed analysed episode (success=false, analysed=true, termination not env_error or
   aborted) has its intake ClusterAssigned (failure_clusters, intake=true): the failure moments
   of every episode are stored and the clusterer has taken in every failure, in a cluster or as
   noise. Only then is the derived state a finished one that a report may print.

A timeout names what is missing (which requests, which episodes, which table). What the waits read
of the store they ask through consumers/state/online.py.

    requests = request_rollouts(publisher, store, scenario, ["oracle"], seeds=[0, 1], run_id="run")
    deadline, check = deadline_in(600), still_coming(settings, store, requests)
    wait_for_episodes(store, requests, deadline, check=check)
    settled = wait_until_settled(store, requests, deadline, check=check)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from consumers.evidence.store import EvidenceStore
from consumers.state import online as q
from infra import processes
from infra.exceptions import NotRunning, OutOfSpace, RequestRefused, WaitTimeout
from infra.settings import Settings
from producers.episode import HARNESS_TERMINATIONS
from schemas.catalog import BY_NAME

POLL_S = 0.5
# How many missing ids a timeout error quotes.
QUOTED_IDS = 5

Progress = Callable[[int, int], None]  # (done, total)
Check = Callable[[], None]  # raises when a process the wait relies on has died


def deadline_in(seconds: float) -> float:
    return time.monotonic() + seconds


def still_coming(settings: Settings, libero: bool = False) -> Check:
    """A check for the waits: the rollout worker and the pipeline still run (and the LIBERO
    worker `up` started, for ``libero`` requests)."""
    state = processes.RunState.read(settings)
    children = (processes.ROLLOUT, processes.PIPELINE) + ((processes.LIBERO,) if libero else ())

    def check() -> None:
        _require_alive(settings, state, children)
    return check


def requests_topic(topic_prefix: str) -> str:
    """The rollout requests' topic, where a worker's refusals are dead-lettered from."""
    return BY_NAME["rollout.requests"].full_name(topic_prefix)


def still_running(settings: Settings, libero: bool = False) -> Check:
    """A check for the evolving loop's waits: every process `up` started still runs, the LIBERO
    worker too for a run on ``libero`` (a robosuite run does not need it, whatever became of it)."""
    state = processes.RunState.read(settings)
    children = processes.CHILDREN + ((processes.LIBERO,) if libero else ())

    def check() -> None:
        _require_alive(settings, state, children)
    return check


def _require_alive(settings: Settings, state: processes.RunState, children) -> None:
    """Raises NotRunning naming the first of ``children`` that `up` started and that has stopped,
    and why when its log says (a full disk); OutOfSpace when the disk under the memory dir is full
    while they all run (the sink retries a store that cannot write, and the waits would sit)."""
    full = processes.out_of_space(settings)
    if full:
        raise OutOfSpace(f"{full}: the evidence store cannot take more events; free some space, then "
                         "`sepa-eval up` and run again")
    for child in children:
        if state.pid_of(child) is not None and not state.alive(child):
            why = processes.why_stopped(child, settings)
            raise NotRunning(f"the {child.label} (pid {state.pid_of(child)}) has stopped"
                             f"{': ' + why if why else ''}; see {child.log(settings)}")


@dataclass(frozen=True)
class Settled:
    """The run's episodes once the failure analysis has caught up with them."""

    episodes: int  # ended
    failed: int  # failed, analysed, of a termination the clusterer takes in
    fragile: int  # successes with failure moments (the clusterer takes them in too)
    analysed: int
    moments: int  # failure moments of the run's episodes (from their EpisodeAnalysed)
    clustered: int  # failed and fragile episodes with their intake ClusterAssigned


def wait_for_episodes(store: EvidenceStore, requests: list[dict], deadline: float,
                      progress: Progress | None = None, check: Check | None = None,
                      requests_topic: str | None = None) -> int:
    """Until every requested episode's EpisodeEnded is in the evidence log; returns their number.
    ``requests_topic`` (the requests' full topic name): a request a rollout worker dead-lettered
    from it raises RequestRefused with the reason at once, since its episodes will never come."""
    expected = {r["request_id"]: len(r["seeds"]) for r in requests}
    total = sum(expected.values())
    while True:
        ended = q.ended_per_request(store, list(expected))
        done = sum(min(ended.get(rid, 0), n) for rid, n in expected.items())
        if progress is not None:
            progress(done, total)
        if done >= total:
            return total
        if check is not None:
            check()
        if requests_topic is not None:
            # refusals of these publications only: a dead letter's time is its message's, and each
            # request was made just before it was published
            pending = [r for r in requests if ended.get(r["request_id"], 0) < len(r["seeds"])]
            refused = q.refused_requests(store, requests_topic, [r["request_id"] for r in pending],
                                         since=min(r["envelope"]["event_time"] for r in pending))
            if refused:
                raise RequestRefused("; ".join(f"a rollout worker refused {rid}: {reason}"
                                               for rid, reason in refused.items()))
        if time.monotonic() > deadline:
            short = [f"{rid}: {ended.get(rid, 0)} of {n}" for rid, n in expected.items() if ended.get(rid, 0) < n]
            raise WaitTimeout(f"{total - done} of {total} requested episodes have not ended in the evidence log "
                              f"(rollout_episodes) in time; requests short of episodes: {quote_ids(short)}")
        time.sleep(POLL_S)


def wait_until_settled(store: EvidenceStore, requests: list[dict], deadline: float,
                       progress: Progress | None = None, check: Check | None = None,
                       fragile: bool = False) -> Settled:
    """Until every ended episode of the requests is analysed and every failed one clustered
    (``fragile``: the clusterer takes in successes with failure moments too, and is waited for)."""
    request_ids = [r["request_id"] for r in requests]
    while True:
        state = settle_state(store, request_ids, fragile)
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
                               f"in failure_episodes (the failure detector's): {quote_ids(state.unanalysed)}")
            if state.unclustered:
                missing.append(f"{len(state.unclustered)} of {len(state.to_cluster)} failed (or fragile) episodes have "
                               f"no intake ClusterAssigned in failure_clusters (the clusterer's): "
                               f"{quote_ids(state.unclustered)}")
            raise WaitTimeout("the failure analysis did not catch up in time: " + "; ".join(missing))
        time.sleep(POLL_S)


@dataclass(frozen=True)
class SettleState:
    ended: list[str]
    analysed: dict[str, tuple[bool, bool, str, int]]  # episode -> (success, analysed, termination, moments)
    clustered: set[str]
    fragile: bool = False  # the clusterer takes in successes with failure moments too

    @property
    def to_cluster(self) -> list[str]:
        """The episodes the clusterer takes in: failures, and successes with failure moments (fragile wins)."""
        return sorted(e for e, a in self.analysed.items() if taken_in(*a, fragile=self.fragile))

    @property
    def unanalysed(self) -> list[str]:
        return [e for e in self.ended if e not in self.analysed]

    @property
    def unclustered(self) -> list[str]:
        return [e for e in self.to_cluster if e not in self.clustered]

    @property
    def analysed_count(self) -> int:
        return len(self.ended) - len(self.unanalysed)

    @property
    def clustered_count(self) -> int:
        return len(self.to_cluster) - len(self.unclustered)

    @property
    def total(self) -> int:
        return len(self.ended) + len(self.to_cluster)

    @property
    def settled(self) -> Settled:
        return Settled(episodes=len(self.ended), failed=sum(not self.analysed[e][0] for e in self.to_cluster),
                       fragile=sum(bool(self.analysed[e][0]) for e in self.to_cluster), analysed=len(self.analysed),
                       moments=sum(m for *_, m in self.analysed.values()), clustered=self.clustered_count)


def taken_in(success: bool, analysed: bool, termination: str, moments: int, fragile: bool) -> bool:
    """Whether the clusterer takes an analysed episode in (streams/failures/collector.py's rule)."""
    return (not success or (fragile and moments > 0)) and analysed and termination not in HARNESS_TERMINATIONS


def settle_state(store: EvidenceStore, request_ids: list[str], fragile: bool = False) -> SettleState:
    """Where the failure analysis of the requests' ended episodes stands, read from the evidence log."""
    ended = sorted({e for _, e in q.ended_episodes(store, request_ids)})
    if not ended:
        return SettleState([], {}, set(), fragile)
    analysed = q.analysed_state(store, ended)
    failed = [e for e, a in analysed.items() if taken_in(*a, fragile=fragile)]
    clustered = q.intake_clustered(store, failed) if failed else set()
    return SettleState(ended, analysed, clustered, fragile)


def quote_ids(ids: list[str]) -> str:
    shown = ", ".join(ids[:QUOTED_IDS])
    return shown + (f" and {len(ids) - QUOTED_IDS} more" if len(ids) > QUOTED_IDS else "")


def poll_until(done: Callable[[], bool], timeout_s: float, check: Check | None, missing: Callable[[], str]) -> None:
    """Until ``done()``; a timeout raises WaitTimeout naming ``missing()``."""
    deadline = deadline_in(timeout_s)
    while not done():
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise WaitTimeout(f"{missing()} after {timeout_s:.0f} s")
        time.sleep(POLL_S)
