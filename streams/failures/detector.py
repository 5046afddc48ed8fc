"""Incremental, per-episode failure detection from Step signals: a pure function of the events.

    detector = EpisodeDetector(DetectorConfig(), episode_id, scenario_id, model_id)
    for step in steps:                      # Step event dicts, in t order
        moments += detector.on_step(step)   # FailureMoment dicts, as soon as the evidence is there
    moments += detector.on_end(ended)       # what only the end can tell (timeout, never lifted)

Every failure type has its own small state machine fed by every step, so several types may fire
in one episode (a slip is often followed by a drop). A moment is emitted at most once: its event
id is ``stable_id("FailureMoment", episode_id, failure_type, step)``, and a re-delivered step
(``t`` not above the last one seen) is ignored. Each type fires at most
``max_moments_per_type`` times per episode, and a recurring condition (force, collision, stall,
joint limit) must clear for ``rearm_steps`` before it can fire again.

Definitions, every one relative to the episode's own start (the first step seen):

- "closing": the gripper command (``action[gripper_command_index]``, robosuite: -1 opens,
  +1 closes) is above ``gripper_close_command``. A grasp *attempt* starts when the command goes
  from open to closing (a gripper commanded closed from the first step is not an attempt until
  it has opened once). "Touching": ``gripper_force`` (finger pads on the target) at least
  ``contact_force_n``. "Held": gripped (``gripper_force >= held_force_n``) and either lifted
  (``object_lift >= held_lift_m``) or pinched (fingers stopped, ``pinch_steady_m``, with the target
  between the pads, ``pinch_xy_m`` / ``pinch_z_m``) for ``held_min_steps`` consecutive steps. A
  pinched object that never lifts (too heavy or slippery for the grip) and slides out slips.
- grasp_miss: an attempt whose fingers close on nothing (no touch ``grasp_settle_steps`` after
  the close started, or the fingers shut below ``closed_empty_opening_m``), or that touched the
  target but never held it (touch lost while closing, gripper reopened, or episode ended).
  ``features.variant``: 0 closed empty, 1 touch lost before lift, 2 reopened unlifted,
  3 episode ended unlifted (an attempt at least ``grasp_settle_steps`` old). A touch lost while
  the fingers are still closing is not yet a miss (one finger often reaches the object first and
  nudges it): the attempt goes on closing.
- slip: the target was held, then touch was lost while the gripper was still closing.
- drop: after holding ended (slip, or a commanded release), the target fell ``drop_fall_m``
  below its last held lift. A commanded release counts only if it also moved the target away from
  the goal (``goal_distance`` grew by ``drop_goal_regress_m``): placing it is not dropping it.
- knocked_object: an object moved ``knock_displacement_m`` (or turned ``knock_rotation_rad``)
  from its start pose without a grasp: the target before any touch while closing, another object
  (distractor, second task object) unless it was grasped (that is wrong_object). Once per object.
- excessive_force: finger force above ``max_grip_force_n``, any hand/arm contact above
  ``max_contact_force_n``, or a joint torque at ``torque_saturation_fraction`` of its limit for
  ``torque_min_steps`` steps while the hand or arm touches something (in free space a saturated
  joint is the controller hurrying: a fast wrist turn saturates the 12 N m wrist for ~5 steps).
- collision: hand or arm contact with the table or a non-target object, or arm-link contact with
  the target, above ``collision_force_n``. A closing hand pressing an object is grasping it
  (wrong_object), not colliding.
- stall: over ``stall_window_steps``, ``goal_distance`` improved less than
  ``stall_min_progress_m`` while the end effector stayed within ``stall_max_eef_travel_m`` of
  where the window began (a robot moving towards the object is not stalled), goal not reached.
- out_of_reach: a joint that stretches the arm forward (``reach_joint_indices``: the Panda's
  shoulder pitch and elbow) within ``reach_margin_rad`` of its stretched limit for
  ``limit_min_steps``, while the hand is still ``reach_gap_m`` (horizontally) from the target and
  the goal is not reached. Reaching for a far object stops the shoulder first, not the elbow.
- joint_limit: any other joint limit (the reach joints' low limits included) within
  ``joint_limit_margin_rad`` for ``limit_min_steps``, unless the arm is out of reach at that step.
- wrong_object: the gripper, closing, presses a non-target object with ``wrong_grasp_force_n``
  for ``wrong_grasp_confirm_steps`` steps, or lifts it ``wrong_object_lift_m`` while touching it.
- timeout: EpisodeEnded with termination "timeout" and no success; step = the last step.

Severity is in [0, 1], a documented ratio per type (see ``_severity_*`` call sites and
DetectorConfig). Every moment's features also carry, at its step, ``goal_distance_m`` and
``object_lift_m`` and where it happened: ``eef_x/y/z`` (the hand), ``object_x/y/z`` (the target,
world frame, m) and ``object_dx/dy`` (the target's offset from its own start, m); the object
features are absent when a step has no object pose.

Recovery, tracked online as the episode goes on (``outcomes()``; a FailureMoment, once emitted, is
never edited: the recovery reaches consumers in the episode's EpisodeAnalysed):

- grasp_miss, slip, drop, wrong_object: recovered at the first later step at which the target is
  held again (the grasp state machine enters "held"): ``recovery="regrasped"``;
- stall: recovered once ``goal_distance`` has improved by ``stall_min_progress_m`` on its value
  at the stall, or the goal is reached: ``"progressed"``;
- out_of_reach: recovered once the hand is within ``reach_gap_m`` (horizontally) of the target:
  ``"reached"``;
- excessive_force, collision, knocked_object, joint_limit, timeout: never (the harm or the miss
  happened).

A recovery comes strictly after the moment's step. A successful episode whose moments are all
recovered is a success after a recovery, not a flagged success.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, fields
from datetime import datetime

from schemas.events import make_event
from streams.exceptions import ConfigError, DetectorError

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

# Franka Panda as robosuite 1.5 models it (robots/panda/robot.xml): joint ranges and motor limits.
PANDA_JOINT_LIMITS_RAD = ((-2.8973, 2.8973), (-1.7628, 1.7628), (-2.8973, 2.8973), (-3.0718, -0.0698),
                          (-2.8973, 2.8973), (-0.0175, 3.7525), (-2.8973, 2.8973))
PANDA_TORQUE_LIMITS_NM = (80.0, 80.0, 80.0, 80.0, 12.0, 12.0, 12.0)

# How a moment is recovered from (MomentOutcome.recovery); failure types absent here never are.
RECOVERED_BY = {"grasp_miss": "regrasped", "slip": "regrasped", "drop": "regrasped", "wrong_object": "regrasped",
                "stall": "progressed", "out_of_reach": "reached"}
NOT_RECOVERED = -1  # MomentOutcome.recovered_step of a moment the episode never recovered from

# grasp_miss feature "variant"
MISS_CLOSED_EMPTY = 0.0
MISS_LOST_BEFORE_LIFT = 1.0
MISS_REOPENED_UNLIFTED = 2.0
MISS_ENDED_UNLIFTED = 3.0


@dataclass(frozen=True, kw_only=True)
class DetectorConfig:
    """Every threshold the detector uses. Defaults are calibrated on robosuite 1.5 Panda Lift at
    20 Hz (a held cube: ~40 N finger force, 0.04 m opening; fingers shut on nothing in ~8 steps)."""

    # -- gripper and grasp state ------------------------------------------------------------
    gripper_command_index: int = -1  # action element commanding the gripper (robosuite: the last)
    gripper_close_command: float = 0.0  # command above this = closing / holding closed (-1 open, +1 close)
    contact_force_n: float = 5.0  # finger-pad force on the target at which the fingers touch it, N
    held_force_n: float = 15.0  # finger-pad force at which the target counts as gripped, N
    held_lift_m: float = 0.002  # target lift above its start at which a gripped target is lifted, m
    held_min_steps: int = 2  # consecutive gripped steps before the target counts as held
    pinch_steady_m: float = 0.0005  # finger opening change per step below which the fingers have stopped, m
    pinch_xy_m: float = 0.02  # target centre this close (horizontally) to the grip site = between the pads, m
    pinch_z_m: float = 0.03  # and this close vertically, m
    goal_reached_m: float = 0.005  # goal_distance at or below which the goal is reached, m
    # -- grasp_miss -------------------------------------------------------------------------
    grasp_settle_steps: int = 10  # steps after the close command starts by which the fingers must touch
    closed_empty_opening_m: float = 0.005  # finger opening below which closed fingers hold nothing, m
    miss_severity_distance_m: float = 0.05  # eef-to-target horizontal distance giving severity 1, m
    # -- slip / drop ------------------------------------------------------------------------
    slip_severity_lift_m: float = 0.10  # lift at the moment of slipping that gives severity 1, m
    drop_fall_m: float = 0.03  # fall below the last held lift that makes a drop, m
    drop_goal_regress_m: float = 0.01  # growth of goal_distance that makes a commanded release a drop, m
    drop_severity_fall_m: float = 0.20  # fall giving severity 1, m
    # -- knocked_object ---------------------------------------------------------------------
    knock_displacement_m: float = 0.03  # object moved this far from its start position, m
    knock_rotation_rad: float = 0.5  # or turned this far from its start orientation, rad
    knock_severity_displacement_m: float = 0.15  # displacement giving severity 1, m
    # -- excessive_force / collision --------------------------------------------------------
    max_grip_force_n: float = 70.0  # finger-pad force on the target above this is crushing, N
    max_contact_force_n: float = 150.0  # any hand/arm contact above this, N
    joint_torque_limits_nm: tuple[float, ...] = PANDA_TORQUE_LIMITS_NM  # per arm joint, N m
    torque_saturation_fraction: float = 0.95  # |torque| at this fraction of its limit is saturating
    torque_min_steps: int = 3  # consecutive saturated steps (a fast start saturates one step), steps
    collision_force_n: float = 10.0  # hand/arm contact with table or non-target object above this, N
    rearm_steps: int = 5  # steps a recurring condition must be clear before it may fire again
    # -- stall ------------------------------------------------------------------------------
    stall_window_steps: int = 40  # steps without progress (2 s at 20 Hz)
    stall_min_progress_m: float = 0.005  # goal_distance improvement within the window that is progress, m
    stall_max_eef_travel_m: float = 0.02  # end-effector excursion within the window that is motion, m
    # -- out_of_reach / joint_limit ---------------------------------------------------------
    joint_limits_rad: tuple[tuple[float, float], ...] = PANDA_JOINT_LIMITS_RAD  # (low, high) per joint
    joint_limit_margin_rad: float = 0.05  # a joint this close to a limit is at it, rad
    reach_joint_indices: tuple[int, ...] = (1, 3)  # shoulder pitch, elbow: their high limits stretch the arm
    reach_margin_rad: float = 0.1  # a reach joint this close to stretched = the arm is at full reach, rad
    reach_gap_m: float = 0.03  # and the hand still this far (horizontally) from the target, m
    limit_min_steps: int = 3  # consecutive steps at a limit before it counts
    # -- wrong_object -----------------------------------------------------------------------
    wrong_grasp_force_n: float = 10.0  # closing gripper pressing a non-target object this hard, N
    wrong_grasp_confirm_steps: int = 3  # for this many consecutive steps
    wrong_object_lift_m: float = 0.02  # or a non-target object lifted this far while touched, m
    wrong_grasp_severity_force_n: float = 40.0  # contact force giving severity 1 (a full Panda grip), N
    # -- output -----------------------------------------------------------------------------
    max_moments_per_type: int = 5  # per episode; later ones are counted, not emitted

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("gripper_command_index", "gripper_close_command"):
                continue
            if isinstance(value, tuple):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"DetectorConfig.{f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise ConfigError(f"DetectorConfig.{f.name} must be >= 0, got {value!r}")
        for name in ("held_min_steps", "grasp_settle_steps", "torque_min_steps", "stall_window_steps",
                     "limit_min_steps", "wrong_grasp_confirm_steps", "max_moments_per_type"):
            if getattr(self, name) < 1:
                raise ConfigError(f"DetectorConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0.0 < self.torque_saturation_fraction < 1.0:
            raise ConfigError(f"DetectorConfig.torque_saturation_fraction must be in (0, 1), "
                              f"got {self.torque_saturation_fraction!r}")
        if any(lo >= hi for lo, hi in self.joint_limits_rad):
            raise ConfigError(f"DetectorConfig.joint_limits_rad needs low < high, got {self.joint_limits_rad!r}")
        if not all(isinstance(i, int) and 0 <= i < len(self.joint_limits_rad) for i in self.reach_joint_indices):
            raise ConfigError(f"DetectorConfig.reach_joint_indices {self.reach_joint_indices!r} must be joints of "
                              f"joint_limits_rad ({len(self.joint_limits_rad)} joints)")
        if any(v <= 0 for v in self.joint_torque_limits_nm):
            raise ConfigError(f"DetectorConfig.joint_torque_limits_nm must be > 0, got {self.joint_torque_limits_nm!r}")
        if self.held_force_n < self.contact_force_n:
            raise ConfigError(f"DetectorConfig.held_force_n ({self.held_force_n}) must be >= contact_force_n "
                              f"({self.contact_force_n})")


class _Recurring:
    """A condition that fires on its rising edge and re-arms after ``rearm`` clear steps."""

    __slots__ = ("rearm", "active", "clear")

    def __init__(self, rearm: int):
        self.rearm = rearm
        self.active = False
        self.clear = 0

    def update(self, condition: bool) -> bool:
        if condition:
            self.clear = 0
            if not self.active:
                self.active = True
                return True
            return False
        if self.active:
            self.clear += 1
            if self.clear >= self.rearm:
                self.active = False
        return False


def _clip01(x: float) -> float:
    return 0.0 if x <= 0.0 else 1.0 if x >= 1.0 else float(x)


def _dist(a, b) -> float:
    return math.sqrt((a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2 + (a[2] - b[2]) ** 2)


def _quat_angle(q0, q1) -> float:
    a0, a1, a2, a3 = q0
    b0, b1, b2, b3 = q1
    dot = abs(a0 * b0 + a1 * b1 + a2 * b2 + a3 * b3)
    n = math.sqrt((a0 * a0 + a1 * a1 + a2 * a2 + a3 * a3) * (b0 * b0 + b1 * b1 + b2 * b2 + b3 * b3))
    if n == 0.0:
        return 0.0
    return 2.0 * math.acos(min(1.0, dot / n))


# grasp phases
_UNARMED = "unarmed"  # closing since the first step: not an attempt until the gripper opens
_OPEN = "open"
_CLOSING = "closing"  # attempt started, nothing touched yet
_TOUCHING = "touching"  # attempt touched the target, not (yet) held
_HELD = "held"
_SPENT = "spent"  # attempt concluded (missed or slipped); waits for the gripper to open


class EpisodeDetector:
    """Failure detector for one episode. Feed its Steps in order, then its EpisodeEnded.

    ``moments`` holds every FailureMoment emitted so far; ``suppressed`` counts moments over the
    per-type cap; ``outcomes()`` gives each moment with its recovery so far (module docstring).
    Not thread-safe; one instance per episode.
    """

    def __init__(self, config: DetectorConfig, episode_id: str, scenario_id: str, model_id: str):
        self.config = config
        self.episode_id = episode_id
        self.scenario_id = scenario_id
        self.model_id = model_id
        self.moments: list[dict] = []
        self.suppressed: dict[str, int] = {}
        self.steps_seen = 0
        self.last_t = -1
        self.start_t: int | None = None
        self.ended = False
        self._emitted: set[tuple[str, int]] = set()
        self._per_type: dict[str, int] = dict.fromkeys(FAILURE_TYPES, 0)
        self._run_id = ""
        self._event_time: datetime | None = None
        # start of episode
        self._start_pose: dict[str, tuple[list[float], list[float]]] = {}
        self._start_goal: float | None = None
        self._min_goal = math.inf
        self._last_goal = 0.0
        self._last_lift = 0.0
        self._eef_target_xy = 0.0
        self._eef_target_z = math.inf
        self._last_opening: float | None = None
        # this step's site, for every moment's features
        self._goal = 0.0
        self._lift = 0.0
        self._eef: list[float] | None = None
        self._obj: list[float] | None = None
        self._obj_start: list[float] | None = None
        # recovery: per moment (parallel to self.moments) [recovered_step, recovery]; indexes of
        # moments still waiting, per way of recovering; a stall waits with its goal_distance
        self._recovery: list[list] = []
        self._awaiting_grasp: list[int] = []
        self._awaiting_reach: list[int] = []
        self._awaiting_progress: list[tuple[int, float]] = []
        # grasp / slip / drop
        self._phase = _OPEN
        self._close_t = 0
        self._held_streak = 0
        self._attempt_peak_force = 0.0
        self._attempt_max_lift = 0.0
        self._held_lift = 0.0
        self._target_grasped = False  # touched while closing at least once: target knocks stop counting
        self._drop_watch: tuple[float, float, bool, int] | None = None  # (lift ref, goal ref, commanded, t)
        # knocked_object / wrong_object, per object name
        self._knocked: set[str] = set()
        self._wrong_streak: dict[str, int] = {}
        self._wrong_fired: set[str] = set()
        # recurring conditions
        r = config.rearm_steps
        self._force = _Recurring(r)
        self._collision = _Recurring(r)
        self._stall = _Recurring(r)
        self._reach = _Recurring(r)
        self._limit = _Recurring(r)
        self._reach_streak = 0
        self._limit_streak = 0
        self._torque_streak = 0
        self._stall_goal: deque[float] = deque(maxlen=config.stall_window_steps + 1)
        self._stall_eef: deque[list[float]] = deque(maxlen=config.stall_window_steps + 1)
        self._torque_thresholds = tuple(config.torque_saturation_fraction * v for v in config.joint_torque_limits_nm)

    # -- public -----------------------------------------------------------------------------

    def on_step(self, step: dict) -> list[dict]:
        """Moments this step gives evidence for. Steps at or before the last ``t`` are ignored
        (re-delivery); steps after ``on_end`` are ignored."""
        if step["episode_id"] != self.episode_id:
            raise DetectorError(f"detector for episode {self.episode_id} got a step of {step['episode_id']} "
                                f"(t={step.get('t')})")
        t = step["t"]
        if self.ended or t <= self.last_t:
            return []
        self.last_t = t
        self.steps_seen += 1
        env = step.get("envelope") or {}
        self._run_id = env.get("run_id", self._run_id)
        et = env.get("event_time")
        self._event_time = et if isinstance(et, datetime) and et.tzinfo is not None else None
        out: list[dict] = []
        cfg = self.config

        goal = float(step["goal_distance"])
        lift = float(step["object_lift"])
        force = float(step["gripper_force"])
        opening = float(step["gripper_opening"])
        action = step["action"]
        cmd_index = cfg.gripper_command_index
        closing = bool(action) and -len(action) <= cmd_index < len(action) \
            and action[cmd_index] > cfg.gripper_close_command
        poses = step["object_poses"]
        target = poses[0]["name"] if poses else None
        if self.start_t is None:
            self.start_t = t
            self._start_goal = goal
            if closing:
                self._phase = _UNARMED
        for p in poses:
            if p["name"] not in self._start_pose:
                self._start_pose[p["name"]] = (p["pos"], p["quat"])
        eef = step["eef_pos"]
        self._goal, self._lift, self._eef = goal, lift, eef
        if poses:
            pos = poses[0]["pos"]
            self._obj, self._obj_start = pos, self._start_pose[target][0]
            self._eef_target_xy = math.hypot(eef[0] - pos[0], eef[1] - pos[1])
            self._eef_target_z = abs(eef[2] - pos[2])
        else:
            self._obj = None

        # contacts, summarised once
        other_grip: dict[str, float] = {}  # gripper contact force per non-target object
        max_robot_contact = 0.0
        world_contact = 0.0  # hand/arm against anything but itself
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

        other_press = max(other_grip.values(), default=0.0)
        self._grasp(t, step, closing, force, opening, lift, goal, other_press, out)
        self._wrong_object(t, step, closing, poses, target, other_grip, out)
        self._knocks(t, step, poses, target, out)
        self._forces(t, step, force, max_robot_contact, world_contact, out)
        if self._collision.update(collide_force > 0.0):
            self._emit(out, "collision", t, _clip01(1.0 - cfg.collision_force_n / collide_force),
                       {"force_n": collide_force, "with_table": float(collide_table),
                        "with_object": float(collide_object), "by_arm": float(collide_arm)})
        self._stall_check(t, step, goal, out)
        self._limits(t, step, goal, out)
        if self._awaiting_progress:
            self._recover_progress(t, goal)
        if self._awaiting_reach and poses and self._eef_target_xy < cfg.reach_gap_m:
            self._awaiting_reach = self._recover(self._awaiting_reach, t, "reached")

        self._min_goal = min(self._min_goal, goal)
        self._last_goal = goal
        self._last_lift = lift
        self._last_opening = opening
        return out

    def on_end(self, ended: dict) -> list[dict]:
        """Moments only the end can tell: timeout, and a grasp that touched but never lifted."""
        if ended["episode_id"] != self.episode_id:
            raise DetectorError(f"detector for episode {self.episode_id} got the end of {ended['episode_id']}")
        if self.ended:
            return []
        self.ended = True
        env = ended.get("envelope") or {}
        self._run_id = env.get("run_id", self._run_id)
        et = env.get("event_time")
        self._event_time = et if isinstance(et, datetime) and et.tzinfo is not None else None
        out: list[dict] = []
        last = max(self.last_t, int(ended["steps"]) - 1, 0)
        cfg = self.config
        unlifted = self._phase == _TOUCHING or (self._phase == _HELD and self._attempt_max_lift < cfg.held_lift_m)
        # An attempt younger than grasp_settle_steps was cut short by the end, not missed.
        if unlifted and self.last_t - self._close_t >= cfg.grasp_settle_steps:
            self._emit(out, "grasp_miss", max(self.last_t, 0), self._miss_severity(touched=True),
                       {"variant": MISS_ENDED_UNLIFTED, "close_step": float(self._close_t),
                        "peak_grip_force_n": self._attempt_peak_force, "max_lift_m": self._attempt_max_lift})
        if ended["termination"] == "timeout" and not ended["success"]:
            start = self._start_goal if self._start_goal is not None else 0.0
            final = self._last_goal
            severity = _clip01(final / start) if start > 0 else 1.0
            self._emit(out, "timeout", last, severity,
                       {"steps": float(ended["steps"]), "start_goal_distance_m": start,
                        "final_goal_distance_m": final,
                        "min_goal_distance_m": self._min_goal if self.steps_seen else final,
                        "steps_seen": float(self.steps_seen)})
        return out

    # -- state machines ---------------------------------------------------------------------

    def _grasp(self, t, step, closing, force, opening, lift, goal, other_press, out) -> None:
        cfg = self.config
        touching = force >= cfg.contact_force_n
        phase = self._phase
        if not closing:
            if phase == _TOUCHING or (phase == _HELD and self._attempt_max_lift < cfg.held_lift_m):
                self._emit(out, "grasp_miss", t, self._miss_severity(touched=True),
                           {"variant": MISS_REOPENED_UNLIFTED, "close_step": float(self._close_t),
                            "peak_grip_force_n": self._attempt_peak_force, "max_lift_m": self._attempt_max_lift})
            elif phase == _HELD:
                self._drop_watch = (self._last_lift, self._last_goal, True, t)
            self._phase = _OPEN
        else:
            if phase == _OPEN:
                phase = self._phase = _CLOSING
                self._close_t = t
                self._attempt_peak_force = 0.0
                self._attempt_max_lift = lift
                self._held_streak = 0
            if phase in (_CLOSING, _TOUCHING, _HELD):
                self._attempt_peak_force = max(self._attempt_peak_force, force)
                self._attempt_max_lift = max(self._attempt_max_lift, lift)
            if phase == _CLOSING:
                if touching:
                    phase = self._phase = _TOUCHING
                    self._target_grasped = True
                elif other_press >= cfg.wrong_grasp_force_n:
                    self._phase = _SPENT  # closed on another object: wrong_object tells that story
                elif t - self._close_t >= cfg.grasp_settle_steps or (
                        t > self._close_t and opening <= cfg.closed_empty_opening_m):
                    self._emit(out, "grasp_miss", t, self._miss_severity(touched=False),
                               {"variant": MISS_CLOSED_EMPTY, "close_step": float(self._close_t),
                                "opening_m": opening, "steps_since_close": float(t - self._close_t)})
                    self._phase = _SPENT
            if phase == _TOUCHING:
                if force >= cfg.held_force_n and (lift >= cfg.held_lift_m or self._pinched(opening)):
                    self._held_streak += 1
                    if self._held_streak >= cfg.held_min_steps:
                        self._phase = _HELD
                        self._drop_watch = None
                        if self._awaiting_grasp:
                            self._awaiting_grasp = self._recover(self._awaiting_grasp, t, "regrasped")
                else:
                    self._held_streak = 0
                    if not touching and self._last_opening is not None \
                            and self._last_opening - opening > cfg.pinch_steady_m:
                        # Still closing: the finger that touched first nudged the object towards
                        # the other one. Not concluded yet; the closing rules decide.
                        self._phase = _CLOSING
                    elif not touching:
                        self._emit(out, "grasp_miss", t, self._miss_severity(touched=True),
                                   {"variant": MISS_LOST_BEFORE_LIFT, "close_step": float(self._close_t),
                                    "peak_grip_force_n": self._attempt_peak_force,
                                    "max_lift_m": self._attempt_max_lift})
                        self._phase = _SPENT
            elif phase == _HELD and not touching:
                held_lift = self._last_lift
                self._emit(out, "slip", t, _clip01(held_lift / cfg.slip_severity_lift_m),
                           {"lift_at_slip_m": held_lift, "grip_force_n": force,
                            "peak_grip_force_n": self._attempt_peak_force, "opening_m": opening,
                            "steps_held_from_close": float(t - self._close_t)})
                self._drop_watch = (held_lift, self._last_goal, False, t)
                self._phase = _SPENT
        watch = self._drop_watch
        if watch is not None and self._phase != _HELD:
            lift_ref, goal_ref, commanded, since = watch
            fall = lift_ref - lift
            regress = goal - goal_ref
            if fall >= cfg.drop_fall_m and (not commanded or regress >= cfg.drop_goal_regress_m):
                self._emit(out, "drop", t, _clip01(fall / cfg.drop_severity_fall_m),
                           {"fall_m": fall, "lift_at_release_m": lift_ref, "commanded_release": float(commanded),
                            "goal_regress_m": regress, "steps_since_release": float(t - since)})
                self._drop_watch = None

    def _pinched(self, opening: float) -> bool:
        """The fingers have stopped on the target with it between the pads: a grip that has not
        lifted yet (a heavy or slippery object may never lift, and then it slips)."""
        cfg = self.config
        last = self._last_opening
        return (last is not None and abs(opening - last) <= cfg.pinch_steady_m
                and opening > cfg.closed_empty_opening_m
                and self._eef_target_xy <= cfg.pinch_xy_m and self._eef_target_z <= cfg.pinch_z_m)

    def _miss_severity(self, touched: bool) -> float:
        """Closed empty: how far (horizontally) the hand was from the target. Touched but never
        held: how far the attempt stayed from lifting it (1 = not at all)."""
        cfg = self.config
        if touched:
            return _clip01(1.0 - self._attempt_max_lift / cfg.held_lift_m) if cfg.held_lift_m > 0 else 1.0
        return _clip01(self._eef_target_xy / cfg.miss_severity_distance_m)

    def _knocks(self, t, step, poses, target, out) -> None:
        cfg = self.config
        for i, p in enumerate(poses):
            name = p["name"]
            if name in self._knocked or name in self._wrong_fired:
                continue
            if name == target and self._target_grasped:
                continue
            pos0, quat0 = self._start_pose[name]
            disp = _dist(pos0, p["pos"])
            rot = _quat_angle(quat0, p["quat"])
            if disp >= cfg.knock_displacement_m or rot >= cfg.knock_rotation_rad:
                self._knocked.add(name)
                self._emit(out, "knocked_object", t, _clip01(max(disp / cfg.knock_severity_displacement_m,
                                                                 rot / math.pi)),
                           {"displacement_m": disp, "rotation_rad": rot, "is_target": float(name == target),
                            "object_index": float(i)})

    def _wrong_object(self, t, step, closing, poses, target, other_grip, out) -> None:
        cfg = self.config
        for name, f in other_grip.items():
            if name in self._wrong_fired:
                continue
            streak = self._wrong_streak.get(name, 0) + 1 if closing and f >= cfg.wrong_grasp_force_n else 0
            self._wrong_streak[name] = streak
            lifted = 0.0
            start = self._start_pose.get(name)
            if start is not None:
                for p in poses:
                    if p["name"] == name:
                        lifted = p["pos"][2] - start[0][2]
                        break
            if streak >= cfg.wrong_grasp_confirm_steps or (f > 0.0 and lifted >= cfg.wrong_object_lift_m):
                self._wrong_fired.add(name)
                index = next((i for i, p in enumerate(poses) if p["name"] == name), -1)
                self._emit(out, "wrong_object", t, _clip01(max(f / cfg.wrong_grasp_severity_force_n,
                                                               lifted / max(cfg.wrong_object_lift_m, 1e-9))),
                           {"contact_force_n": f, "object_lift_m_other": lifted, "object_index": float(index),
                            "closing": float(closing)})
        for name in list(self._wrong_streak):
            if name not in other_grip:
                self._wrong_streak[name] = 0

    def _forces(self, t, step, force, max_robot_contact, world_contact, out) -> None:
        cfg = self.config
        torque_frac, torque_joint, torque_hit = 0.0, -1, False
        for i, (tau, thr) in enumerate(zip(step["joint_torques"], self._torque_thresholds, strict=False)):
            frac = abs(tau) / cfg.joint_torque_limits_nm[i]
            if frac > torque_frac:
                torque_frac, torque_joint = frac, i
            if abs(tau) >= thr:
                torque_hit = True
        # A saturated joint in free space is the controller hurrying (a fast wrist turn saturates
        # the 12 N m wrist), not a force on the world: it counts only while the robot touches something.
        torque_hit = torque_hit and world_contact >= cfg.contact_force_n
        self._torque_streak = self._torque_streak + 1 if torque_hit else 0
        torque_hit = self._torque_streak >= cfg.torque_min_steps
        grip_hit = force > cfg.max_grip_force_n
        contact_hit = max_robot_contact > cfg.max_contact_force_n
        if self._force.update(grip_hit or contact_hit or torque_hit):
            sat = cfg.torque_saturation_fraction
            severity = max(1.0 - cfg.max_grip_force_n / force if grip_hit else 0.0,
                           1.0 - cfg.max_contact_force_n / max_robot_contact if contact_hit else 0.0,
                           (torque_frac - sat) / (1.0 - sat) if torque_hit else 0.0)
            self._emit(out, "excessive_force", t, _clip01(severity),
                       {"grip_force_n": force, "max_contact_force_n": max_robot_contact,
                        "max_torque_fraction": torque_frac, "max_torque_joint": float(torque_joint),
                        "by_grip": float(grip_hit), "by_contact": float(contact_hit), "by_torque": float(torque_hit)})

    def _stall_check(self, t, step, goal, out) -> None:
        cfg = self.config
        goals, eefs = self._stall_goal, self._stall_eef
        goals.append(goal)
        eefs.append(step["eef_pos"])
        stalled = False
        progress = travel = 0.0
        if len(goals) == goals.maxlen and goal > cfg.goal_reached_m:
            progress = goals[0] - min(goals)
            if progress < cfg.stall_min_progress_m:
                p0, limit = eefs[0], cfg.stall_max_eef_travel_m
                stalled = all(_dist(p0, p) < limit for p in eefs)  # stops at the first sign of motion
        if self._stall.update(stalled):
            travel = max(_dist(eefs[0], p) for p in eefs)
            start = self._start_goal or 0.0
            self._emit(out, "stall", t, _clip01(goal / start) if start > 0 else 1.0,
                       {"window_steps": float(cfg.stall_window_steps), "progress_m": progress,
                        "eef_travel_m": travel, "start_goal_distance_m": start})

    def _limits(self, t, step, goal, out) -> None:
        cfg = self.config
        reach_i, reach_left = -1, math.inf
        limit_left, limit_joint = math.inf, -1
        for i, (q, (lo, hi)) in enumerate(zip(step["joint_pos"], cfg.joint_limits_rad, strict=False)):
            to_hi, to_lo = hi - q, q - lo
            if i in cfg.reach_joint_indices:
                if to_hi < reach_left:
                    reach_i, reach_left = i, to_hi
                to_hi = math.inf  # a stretched arm is out_of_reach, or fine at the goal: not a joint limit
            near = min(to_hi, to_lo)
            if near < limit_left:
                limit_left, limit_joint = near, i
        at_reach = (reach_left <= cfg.reach_margin_rad and self._eef_target_xy >= cfg.reach_gap_m
                    and goal > cfg.goal_reached_m)
        self._reach_streak = self._reach_streak + 1 if at_reach else 0
        if self._reach.update(self._reach_streak >= cfg.limit_min_steps):
            self._emit(out, "out_of_reach", t, _clip01(1.0 - reach_left / cfg.reach_margin_rad),
                       {"joint": float(reach_i), "distance_to_limit_rad": reach_left,
                        "joint_pos_rad": step["joint_pos"][reach_i], "hand_to_target_m": self._eef_target_xy})
        at_limit = limit_left <= cfg.joint_limit_margin_rad and not at_reach
        self._limit_streak = self._limit_streak + 1 if at_limit else 0
        if self._limit.update(self._limit_streak >= cfg.limit_min_steps):
            self._emit(out, "joint_limit", t, _clip01(1.0 - limit_left / cfg.joint_limit_margin_rad),
                       {"joint": float(limit_joint), "distance_to_limit_rad": limit_left,
                        "joint_pos_rad": step["joint_pos"][limit_joint]})

    # -- recovery ---------------------------------------------------------------------------

    def _recover(self, waiting: list[int], t: int, how: str) -> list[int]:
        """Marks the waiting moments from before step ``t`` recovered at ``t``; returns the rest."""
        left = []
        for i in waiting:
            if self.moments[i]["step"] < t:
                self._recovery[i] = [t, how]
            else:
                left.append(i)
        return left

    def _recover_progress(self, t: int, goal: float) -> None:
        cfg = self.config
        left = []
        for i, ref in self._awaiting_progress:
            if self.moments[i]["step"] < t and (goal <= ref - cfg.stall_min_progress_m or goal <= cfg.goal_reached_m):
                self._recovery[i] = [t, "progressed"]
            else:
                left.append((i, ref))
        self._awaiting_progress = left

    def outcomes(self) -> list[dict]:
        """Every moment emitted so far as a MomentOutcome record (schemas/avro/MomentOutcome.avsc):
        its id, type, step, severity, features, and the step and way the episode recovered from it
        (-1 and "" while it has not)."""
        return [{"moment_id": m["envelope"]["event_id"], "failure_type": m["failure_type"], "step": m["step"],
                 "severity": m["severity"], "features": m["features"], "recovered_step": r[0], "recovery": r[1]}
                for m, r in zip(self.moments, self._recovery, strict=True)]

    def _site(self) -> dict[str, float]:
        """Goal, lift and where the hand and the target are, at the current step."""
        feats = {"goal_distance_m": float(self._goal), "object_lift_m": float(self._lift)}
        eef = self._eef
        if eef is not None:
            feats["eef_x"], feats["eef_y"], feats["eef_z"] = float(eef[0]), float(eef[1]), float(eef[2])
        obj, start = self._obj, self._obj_start
        if obj is not None:
            feats["object_x"], feats["object_y"], feats["object_z"] = float(obj[0]), float(obj[1]), float(obj[2])
            feats["object_dx"], feats["object_dy"] = float(obj[0] - start[0]), float(obj[1] - start[1])
        return feats

    # -- output -----------------------------------------------------------------------------

    def _emit(self, out: list[dict], failure_type: str, t: int, severity: float, features: dict) -> None:
        key = (failure_type, t)
        if key in self._emitted:
            return
        if self._per_type[failure_type] >= self.config.max_moments_per_type:
            self.suppressed[failure_type] = self.suppressed.get(failure_type, 0) + 1
            return
        self._emitted.add(key)
        self._per_type[failure_type] += 1
        feats = {k: float(v) for k, v in features.items()}
        feats.update(self._site())
        for name, value in feats.items():
            if not math.isfinite(value):
                raise DetectorError(f"episode {self.episode_id} {failure_type} at step {t}: feature {name} "
                                    f"is {value}")
        moment = make_event("FailureMoment", (self.episode_id, failure_type, t), PRODUCER, self._run_id,
                            event_time=self._event_time,
                            episode_id=self.episode_id, scenario_id=self.scenario_id, model_id=self.model_id,
                            failure_type=failure_type, step=t, severity=_clip01(severity), features=feats,
                            detector_version=DETECTOR_VERSION)
        index = len(self.moments)
        self.moments.append(moment)
        self._recovery.append([NOT_RECOVERED, ""])
        how = RECOVERED_BY.get(failure_type)
        if how == "regrasped":
            self._awaiting_grasp.append(index)
        elif how == "reached":
            self._awaiting_reach.append(index)
        elif how == "progressed":
            self._awaiting_progress.append((index, float(self._goal)))
        out.append(moment)
