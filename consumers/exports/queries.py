"""Typed queries the hard-case exports need, over the evidence log.

Every read uses FINAL, so a re-delivered event counts once. A hard case is an ended episode
(EpisodeEnded) joined with its start (EpisodeStarted: scenario, instruction, model version, seed)
and with the detector's last word on it (EpisodeAnalysed: moments and whether each was recovered):

- failed: success = false, and terminated by the policy or the clock (env_error and aborted are
  the harness failing, not the policy; the clusterer leaves them out too);
- recovered (only when asked): success = true with at least one moment the episode recovered from
  (``recovered_step >= 0``).

``episodes`` selects more broadly for chosen exports (the oracle's demonstrations): successes, or
every episode the harness did not break, narrowed by model, scenario or request. A success with no
recovered moment is of kind "success" there.

With a failure type, an episode qualifies when one of its moments has that type, so an episode the
detector never analysed is left out of a filtered export.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from consumers.evidence.store import EvidenceStore
from producers.episode import HARNESS_TERMINATIONS

STEP_PAGE_EPISODES = 100  # episodes whose steps one query fetches


@dataclass(frozen=True)
class Moment:
    moment_id: str
    failure_type: str
    step: int
    severity: float
    features: dict[str, float]
    recovered_step: int  # -1 = never
    recovery: str

    @property
    def recovered(self) -> bool:
        return self.recovered_step >= 0


@dataclass(frozen=True)
class HardCase:
    episode_id: str
    kind: str  # "failed" | "recovered" | "success"
    scenario_id: str
    scenario: dict  # ScenarioSpec; env_name empty when EpisodeStarted was never stored
    model_id: str
    model_version: str
    seed: int
    benchmark: str
    instruction: str
    success: bool
    termination: str
    steps: int  # as EpisodeEnded counted them
    total_reward: float
    quality: dict
    ended_at: datetime
    final_keyframe_sha256: str | None
    analysed: bool | None  # None: no EpisodeAnalysed stored for this episode
    analysis_reason: str
    moments: tuple[Moment, ...] = field(default=())

    @property
    def failure_types(self) -> list[str]:
        return sorted({m.failure_type for m in self.moments})


@dataclass(frozen=True)
class StepRow:
    t: int
    action: list[float]
    eef_pos: list[float]
    eef_quat: list[float]
    gripper_opening: float
    gripper_force: float
    object_poses: list[dict]
    contacts: list[dict]
    joint_torques: list[float]
    joint_pos: list[float]
    reward: float
    goal_distance: float
    object_lift: float
    keyframe_sha256: str | None
    event_time: datetime
    frames: dict[str, str] = field(default_factory=dict)  # camera -> sha256: what it saw before this action


STEP_COLUMNS = ("t", "action", "eef_pos", "eef_quat", "gripper_opening", "gripper_force", "object_poses",
                "contacts", "joint_torques", "joint_pos", "reward", "goal_distance", "object_lift",
                "keyframe_sha256", "frames")

_HARD_CASES_SQL = """
SELECT e.episode_id, e.scenario_id, e.model_id, e.success, toString(e.termination), e.steps, e.total_reward,
       e.quality, e.ended_at, e.final_keyframe_sha256,
       s.seen, s.scenario, s.model_version, s.seed, s.benchmark, s.instruction,
       a.seen, a.analysed, a.reason, a.moments
FROM (
    SELECT episode_id, scenario_id, model_id, success, termination, steps, total_reward, quality,
           final_keyframe_sha256, envelope.event_time AS ended_at
    FROM {database}.rollout_episodes FINAL
    WHERE envelope.event_type = 'EpisodeEnded' AND envelope.event_time >= {since:DateTime64(6, 'UTC')}
) AS e
LEFT JOIN (
    SELECT episode_id, 1 AS seen, scenario, model_version, seed, benchmark, instruction, request_id
    FROM {database}.rollout_episodes FINAL
    WHERE envelope.event_type = 'EpisodeStarted'
) AS s ON s.episode_id = e.episode_id
LEFT JOIN (
    SELECT episode_id, 1 AS seen, analysed, reason, moments
    FROM {database}.failure_episodes FINAL
) AS a ON a.episode_id = e.episode_id
WHERE toString(e.termination) NOT IN {harness:Array(String)}
  AND (({outcome:String} = 'hard'
        AND (NOT e.success OR ({include_recovered:Bool}
                               AND arrayExists(m -> tupleElement(m, 'recovered_step') >= 0, a.moments))))
       OR ({outcome:String} = 'success' AND e.success)
       OR {outcome:String} = 'any')
  AND ({failure_type:String} = ''
       OR arrayExists(m -> tupleElement(m, 'failure_type') = {failure_type:String}, a.moments))
  AND ({model_id:String} = '' OR e.model_id = {model_id:String})
  AND ({scenario_id:String} = '' OR e.scenario_id = {scenario_id:String})
  AND ({request_id:String} = '' OR s.request_id = {request_id:String})
ORDER BY e.ended_at, e.episode_id
"""

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


OUTCOMES = ("hard", "success", "any")


def hard_cases(store: EvidenceStore, since: datetime | None = None, failure_type: str | None = None,
               include_recovered: bool = False) -> list[HardCase]:
    """Failed episodes (and, if asked, recovered successes) that ended at or after ``since``,
    oldest first."""
    return episodes(store, "hard", since=since, failure_type=failure_type, include_recovered=include_recovered)


def episodes(store: EvidenceStore, outcome: str, *, since: datetime | None = None, failure_type: str | None = None,
             include_recovered: bool = False, model_id: str | None = None, scenario_id: str | None = None,
             request_id: str | None = None) -> list[HardCase]:
    """Ended episodes the harness did not break, oldest first: ``outcome`` "hard" (as hard_cases),
    "success" or "any", narrowed by the other arguments (None: any)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
    if since is not None and since.tzinfo is None:
        raise ValueError(f"since must be timezone-aware, got naive {since!r}")
    rows = store.query(_HARD_CASES_SQL, parameters={
        "since": since or EPOCH, "harness": list(HARNESS_TERMINATIONS), "outcome": outcome,
        "include_recovered": include_recovered, "failure_type": failure_type or "", "model_id": model_id or "",
        "scenario_id": scenario_id or "", "request_id": request_id or ""})
    cases = []
    for (episode_id, scenario_id, model_id, success, termination, steps, total_reward, quality, ended_at,
         final_keyframe, started_seen, scenario, model_version, seed, benchmark, instruction,
         analysed_seen, analysed, reason, moments) in rows:
        outcomes = tuple(Moment(m["moment_id"], m["failure_type"], int(m["step"]), float(m["severity"]),
                                dict(m["features"]), int(m["recovered_step"]), m["recovery"]) for m in moments)
        kind = ("failed" if not success else "recovered" if any(m.recovered for m in outcomes) else "success")
        cases.append(HardCase(
            episode_id=episode_id, kind=kind, scenario_id=scenario_id,
            scenario=dict(scenario) if started_seen else {}, model_id=model_id,
            model_version=model_version if started_seen else "", seed=int(seed) if started_seen else -1,
            benchmark=benchmark if started_seen else "", instruction=instruction if started_seen else "",
            success=bool(success), termination=termination, steps=int(steps), total_reward=float(total_reward),
            quality=dict(quality), ended_at=_utc(ended_at), final_keyframe_sha256=final_keyframe,
            analysed=bool(analysed) if analysed_seen else None, analysis_reason=reason if analysed_seen else "",
            moments=outcomes))
    return cases


def episode_steps(store: EvidenceStore, episode_ids: Iterable[str]) -> dict[str, list[StepRow]]:
    """Every stored step of each episode, in step order (an episode with none maps to [])."""
    ids = list(dict.fromkeys(episode_ids))
    out: dict[str, list[StepRow]] = {episode_id: [] for episode_id in ids}
    columns = ", ".join(f"`{c}`" for c in STEP_COLUMNS)
    for start in range(0, len(ids), STEP_PAGE_EPISODES):
        page = ids[start:start + STEP_PAGE_EPISODES]
        rows = store.query(f"SELECT episode_id, {columns}, envelope.event_time FROM {{database}}.rollout_steps FINAL "
                           "WHERE episode_id IN {ids:Array(String)} ORDER BY episode_id, t",
                           parameters={"ids": page})
        for episode_id, *values, event_time in rows:
            record = dict(zip(STEP_COLUMNS, values, strict=True))
            out[episode_id].append(StepRow(
                t=int(record["t"]), action=list(record["action"]), eef_pos=list(record["eef_pos"]),
                eef_quat=list(record["eef_quat"]), gripper_opening=float(record["gripper_opening"]),
                gripper_force=float(record["gripper_force"]),
                object_poses=[dict(p) for p in record["object_poses"]],
                contacts=[dict(c) for c in record["contacts"]], joint_torques=list(record["joint_torques"]),
                joint_pos=list(record["joint_pos"]), reward=float(record["reward"]),
                goal_distance=float(record["goal_distance"]), object_lift=float(record["object_lift"]),
                keyframe_sha256=record["keyframe_sha256"], event_time=_utc(event_time),
                frames=dict(record["frames"])))
    return out


def _utc(moment: datetime) -> datetime:
    # ClickHouse hands DateTime64(6, 'UTC') back naive.
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
