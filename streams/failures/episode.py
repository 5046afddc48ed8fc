"""What the failure machines share: one step summarised once, and the episode's moment ledger.

    summary = summarize(step, config, previous_summary)   # pure: contacts, grip, poses, distances
    episode.emit("slip", t, severity, features)           # a FailureMoment, with its site and recovery slot

``StepSummary`` is everything the detector derives from a Step (detector module docstring for
what "closing", "touching" and the contact classes mean). ``Episode`` holds the episode's ids, its
start (object poses, goal distance), the current step's summary (every moment's site), the moments
emitted so far with their recoveries, and the per-type cap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple

from schemas.events import make_event
from streams.exceptions import DetectorError

if TYPE_CHECKING:
    from streams.failures.detector import DetectorConfig

# 1.2: moments carry their site (eef_x/y/z, object_x/y/z, object_dx/dy); recovery is tracked.
DETECTOR_VERSION = "failure-detector/1.2"
PRODUCER = "failure-detector"

# Mirrors the FailureType enum in schemas/avro/FailureMoment.avsc (a unit test checks it).
FAILURE_TYPES = ("grasp_miss", "slip", "drop", "knocked_object", "excessive_force", "collision", "stall",
                 "out_of_reach", "joint_limit", "wrong_object", "timeout")

GROUP_GRIPPER = "gripper"
GROUP_ROBOT = "robot"
GROUP_TABLE = "table"
_ROBOT_GROUPS = (GROUP_GRIPPER, GROUP_ROBOT)

# How a moment is recovered from (MomentOutcome.recovery); failure types absent here never are.
RECOVERED_BY = {"grasp_miss": "regrasped", "slip": "regrasped", "drop": "regrasped", "wrong_object": "regrasped",
                "stall": "progressed", "out_of_reach": "reached"}
NOT_RECOVERED = -1  # MomentOutcome.recovered_step of a moment the episode never recovered from


class StepSummary(NamedTuple):
    """One Step as the failure machines see it (immutable; a NamedTuple, as it is made once per
    step on the hot path). Lists are the step's own (not copied)."""

    t: int
    goal: float = 0.0  # goal_distance, m
    lift: float = 0.0  # object_lift, m
    force: float = 0.0  # gripper_force: finger pads on the target, N
    opening: float = 0.0  # gripper_opening, m
    closing: bool = False  # the gripper command is above gripper_close_command
    eef: list[float] | tuple[float, ...] = (0.0, 0.0, 0.0)
    joint_pos: list[float] | tuple[float, ...] = ()
    joint_torques: list[float] | tuple[float, ...] = ()
    poses: list[dict] | tuple[dict, ...] = ()  # object_poses; the first is the target
    target: str | None = None
    target_pos: list[float] | None = None
    # hand to target: horizontal and vertical distance; carried over from the last step with a pose
    hand_target_xy: float = 0.0
    hand_target_z: float = math.inf
    # contacts
    other_grip: Mapping[str, float] = MappingProxyType({})  # gripper force per non-target object
    max_robot_contact: float = 0.0  # strongest hand/arm contact with anything
    world_contact: float = 0.0  # strongest hand/arm contact with anything but the robot itself
    collide_force: float = 0.0  # strongest colliding contact (0: none)
    collide_table: bool = False
    collide_object: bool = False
    collide_arm: bool = False

    @property
    def other_press(self) -> float:
        return max(self.other_grip.values(), default=0.0)


def summarize(step: dict, config: DetectorConfig, previous: StepSummary | None = None) -> StepSummary:
    """The summary of one Step; ``previous`` (the episode's last summary) only supplies the
    hand-to-target distances of a step without object poses."""
    cfg = config
    action = step["action"]
    cmd_index = cfg.gripper_command_index
    closing = bool(action) and -len(action) <= cmd_index < len(action) \
        and action[cmd_index] > cfg.gripper_close_command
    poses = step["object_poses"]
    target = poses[0]["name"] if poses else None
    eef = step["eef_pos"]
    target_pos = None
    if poses:
        target_pos = poses[0]["pos"]
        xy = math.hypot(eef[0] - target_pos[0], eef[1] - target_pos[1])
        z = abs(eef[2] - target_pos[2])
    elif previous is not None:
        xy, z = previous.hand_target_xy, previous.hand_target_z
    else:
        xy, z = 0.0, math.inf

    other_grip: dict[str, float] = {}
    max_robot_contact = 0.0
    world_contact = 0.0
    collide_force, collide_table, collide_object, collide_arm = 0.0, False, False, False
    for c in step["contacts"]:
        a, b, f = c["a"], c["b"], float(c["normal_force"])
        if a in _ROBOT_GROUPS:
            mine, other = a, b
        elif b in _ROBOT_GROUPS:
            mine, other = b, a
        else:
            continue
        if f > max_robot_contact:
            max_robot_contact = f
        if other in _ROBOT_GROUPS:
            continue
        if f > world_contact:
            world_contact = f
        if other == target:
            if mine == GROUP_ROBOT and f >= cfg.collision_force_n:  # the arm, not the hand, hits it
                collide_force, collide_arm = max(collide_force, f), True
            continue
        if mine == GROUP_GRIPPER and other != GROUP_TABLE:
            other_grip[other] = other_grip.get(other, 0.0) + f
            if closing:
                continue  # closing fingers on an object grasp it: wrong_object, not collision
        if f >= cfg.collision_force_n:
            collide_force = max(collide_force, f)
            collide_table = collide_table or other == GROUP_TABLE
            collide_object = collide_object or other != GROUP_TABLE
            collide_arm = collide_arm or mine == GROUP_ROBOT

    return StepSummary(
        t=step["t"], goal=float(step["goal_distance"]), lift=float(step["object_lift"]),
        force=float(step["gripper_force"]), opening=float(step["gripper_opening"]), closing=closing,
        eef=eef, joint_pos=step["joint_pos"], joint_torques=step["joint_torques"], poses=poses, target=target,
        target_pos=target_pos, hand_target_xy=xy, hand_target_z=z, other_grip=other_grip,
        max_robot_contact=max_robot_contact, world_contact=world_contact, collide_force=collide_force,
        collide_table=collide_table, collide_object=collide_object, collide_arm=collide_arm)


class Episode:
    """The episode's facts every machine may use, and its moments: ``emit`` makes a FailureMoment
    (at most one per type and step, ``max_moments_per_type`` per type, the rest counted in
    ``suppressed``) with the current step's site, and opens its recovery (``recover``)."""

    def __init__(self, config: DetectorConfig, episode_id: str, scenario_id: str, model_id: str):
        self.config = config
        self.episode_id = episode_id
        self.scenario_id = scenario_id
        self.model_id = model_id
        self.run_id = ""
        self.event_time: datetime | None = None
        self.start_pose: dict[str, tuple[list[float], list[float]]] = {}  # per object: first (pos, quat)
        self.start_goal: float | None = None
        self.site: StepSummary | None = None  # the current (last) step
        self.moments: list[dict] = []
        self.suppressed: dict[str, int] = {}
        # per moment (parallel to moments) [recovered_step, recovery]; moments still waiting, per
        # way of recovering, as (index, reference goal_distance)
        self.recovery: list[list] = []
        self._waiting: dict[str, list[tuple[int, float]]] = {"regrasped": [], "reached": [], "progressed": []}
        self._emitted: set[tuple[str, int]] = set()
        self._per_type: dict[str, int] = dict.fromkeys(FAILURE_TYPES, 0)

    def envelope(self, event: dict) -> None:
        """Takes the run id and event time of the event being processed, for the moments it gives."""
        env = event.get("envelope") or {}
        self.run_id = env.get("run_id", self.run_id)
        et = env.get("event_time")
        self.event_time = et if isinstance(et, datetime) and et.tzinfo is not None else None

    def begin(self, s: StepSummary) -> None:
        """Makes ``s`` the current step: the episode's start at its first, each object's start pose
        when first seen, and the site of its moments."""
        if self.start_goal is None:
            self.start_goal = s.goal
        for p in s.poses:
            if p["name"] not in self.start_pose:
                self.start_pose[p["name"]] = (p["pos"], p["quat"])
        self.site = s

    def emit(self, failure_type: str, t: int, severity: float, features: dict) -> None:
        key = (failure_type, t)
        if key in self._emitted:
            return
        if self._per_type[failure_type] >= self.config.max_moments_per_type:
            self.suppressed[failure_type] = self.suppressed.get(failure_type, 0) + 1
            return
        self._emitted.add(key)
        self._per_type[failure_type] += 1
        feats = {k: float(v) for k, v in features.items()}
        feats.update(self._site_features())
        for name, value in feats.items():
            if not math.isfinite(value):
                raise DetectorError(f"episode {self.episode_id} {failure_type} at step {t}: feature {name} "
                                    f"is {value}")
        moment = make_event("FailureMoment", (self.episode_id, failure_type, t), PRODUCER, self.run_id,
                            event_time=self.event_time,
                            episode_id=self.episode_id, scenario_id=self.scenario_id, model_id=self.model_id,
                            failure_type=failure_type, step=t, severity=_clip01(severity), features=feats,
                            detector_version=DETECTOR_VERSION)
        how = RECOVERED_BY.get(failure_type)
        if how is not None:
            self._waiting[how].append((len(self.moments), float(self.site.goal) if self.site else 0.0))
        self.moments.append(moment)
        self.recovery.append([NOT_RECOVERED, ""])

    def recover(self, how: str, t: int) -> None:
        """Marks the moments waiting to be recovered ``how`` ("regrasped", "reached") from before
        step ``t`` recovered at ``t``."""
        waiting = self._waiting[how]
        if not waiting:
            return
        left = []
        for i, ref in waiting:
            if self.moments[i]["step"] < t:
                self.recovery[i] = [t, how]
            else:
                left.append((i, ref))
        self._waiting[how] = left

    def recover_progress(self, t: int, goal: float) -> None:
        """Marks the stalls from before ``t`` whose goal_distance has since improved by
        ``stall_min_progress_m`` (or reached the goal) recovered at ``t``."""
        waiting = self._waiting["progressed"]
        if not waiting:
            return
        cfg = self.config
        left = []
        for i, ref in waiting:
            if self.moments[i]["step"] < t and (goal <= ref - cfg.stall_min_progress_m or goal <= cfg.goal_reached_m):
                self.recovery[i] = [t, "progressed"]
            else:
                left.append((i, ref))
        self._waiting["progressed"] = left

    def outcomes(self) -> list[dict]:
        """Every moment emitted so far as a MomentOutcome record (schemas/avro/MomentOutcome.avsc)."""
        return [{"moment_id": m["envelope"]["event_id"], "failure_type": m["failure_type"], "step": m["step"],
                 "severity": m["severity"], "features": m["features"], "recovered_step": r[0], "recovery": r[1]}
                for m, r in zip(self.moments, self.recovery, strict=True)]

    def _site_features(self) -> dict[str, float]:
        """Goal, lift and where the hand and the target are, at the current step."""
        s = self.site
        if s is None:
            return {"goal_distance_m": 0.0, "object_lift_m": 0.0}
        feats = {"goal_distance_m": float(s.goal), "object_lift_m": float(s.lift)}
        eef = s.eef
        if eef is not None:
            feats["eef_x"], feats["eef_y"], feats["eef_z"] = float(eef[0]), float(eef[1]), float(eef[2])
        obj = s.target_pos
        if obj is not None:
            start = self.start_pose[s.target][0]
            feats["object_x"], feats["object_y"], feats["object_z"] = float(obj[0]), float(obj[1]), float(obj[2])
            feats["object_dx"], feats["object_dy"] = float(obj[0] - start[0]), float(obj[1] - start[1])
        return feats


def _clip01(x: float) -> float:
    return 0.0 if x <= 0.0 else 1.0 if x >= 1.0 else float(x)
