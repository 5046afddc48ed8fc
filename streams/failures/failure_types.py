"""One small state machine per failure type (definitions: the detector module docstring).

    grasp = Grasp(config)
    for summary in summaries:                # StepSummary per Step, in t order
        grasp.on_step(summary, episode)      # emits through the Episode, which tracks recoveries
    grasp.on_end(last_t, episode)

Each machine holds only its own state; what they share (the start poses, the moments and their
recoveries, the site of a moment) is the ``Episode``. ``Knocks`` reads the grasp and wrong_object
machines (a grasped target or a wrong-grasped object is not knocked).
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from streams.failures.episode import Episode, StepSummary, _clip01

if TYPE_CHECKING:
    from streams.failures.detector import DetectorConfig

# grasp_miss feature "variant"
MISS_CLOSED_EMPTY = 0.0
MISS_LOST_BEFORE_LIFT = 1.0
MISS_REOPENED_UNLIFTED = 2.0
MISS_ENDED_UNLIFTED = 3.0

# grasp phases
UNARMED = "unarmed"  # closing since the first step: not an attempt until the gripper opens
OPEN = "open"
CLOSING = "closing"  # attempt started, nothing touched yet
TOUCHING = "touching"  # attempt touched the target, not (yet) held
HELD = "held"
SPENT = "spent"  # attempt concluded (missed or slipped); waits for the gripper to open


class Recurring:
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


class Grasp:
    """grasp_miss, slip and drop: one grasp attempt at a time, through the phases above; entering
    "held" recovers the episode's waiting grasp_miss, slip, drop and wrong_object moments."""

    def __init__(self, config: DetectorConfig):
        self.cfg = config
        self.phase = OPEN
        self.close_t = 0
        self.held_streak = 0
        self.peak_force = 0.0  # of the current attempt, N
        self.max_lift = 0.0  # of the current attempt, m
        self.target_grasped = False  # touched while closing at least once: target knocks stop counting
        self.drop_watch: tuple[float, float, bool, int] | None = None  # (lift ref, goal ref, commanded, t)
        self.started = False
        self.last_opening: float | None = None
        self.last_lift = 0.0
        self.last_goal = 0.0

    def on_step(self, s: StepSummary, ep: Episode) -> None:
        cfg = self.cfg
        t, force, opening, lift = s.t, s.force, s.opening, s.lift
        if not self.started:
            self.started = True
            if s.closing:
                self.phase = UNARMED
        touching = force >= cfg.contact_force_n
        phase = self.phase
        if not s.closing:
            if phase == TOUCHING or (phase == HELD and self.max_lift < cfg.held_lift_m):
                self._miss(ep, t, MISS_REOPENED_UNLIFTED)
            elif phase == HELD:
                self.drop_watch = (self.last_lift, self.last_goal, True, t)
            self.phase = OPEN
        else:
            if phase == OPEN:
                phase = self.phase = CLOSING
                self.close_t = t
                self.peak_force = 0.0
                self.max_lift = lift
                self.held_streak = 0
            if phase in (CLOSING, TOUCHING, HELD):
                self.peak_force = max(self.peak_force, force)
                self.max_lift = max(self.max_lift, lift)
            if phase == CLOSING:
                if touching:
                    phase = self.phase = TOUCHING
                    self.target_grasped = True
                elif s.other_press >= cfg.wrong_grasp_force_n:
                    self.phase = SPENT  # closed on another object: wrong_object tells that story
                elif t - self.close_t >= cfg.grasp_settle_steps or (
                        t > self.close_t and opening <= cfg.closed_empty_opening_m):
                    ep.emit("grasp_miss", t, _clip01(s.hand_target_xy / cfg.miss_severity_distance_m),
                            {"variant": MISS_CLOSED_EMPTY, "close_step": float(self.close_t),
                             "opening_m": opening, "steps_since_close": float(t - self.close_t)})
                    self.phase = SPENT
            if phase == TOUCHING:
                if force >= cfg.held_force_n and (lift >= cfg.held_lift_m or self._pinched(s)):
                    self.held_streak += 1
                    if self.held_streak >= cfg.held_min_steps:
                        self.phase = HELD
                        self.drop_watch = None
                        ep.recover("regrasped", t)
                else:
                    self.held_streak = 0
                    if not touching and self.last_opening is not None \
                            and self.last_opening - opening > cfg.pinch_steady_m:
                        # Still closing: the finger that touched first nudged the object towards
                        # the other one. Not concluded yet; the closing rules decide.
                        self.phase = CLOSING
                    elif not touching:
                        self._miss(ep, t, MISS_LOST_BEFORE_LIFT)
                        self.phase = SPENT
            elif phase == HELD and not touching:
                held_lift = self.last_lift
                ep.emit("slip", t, _clip01(held_lift / cfg.slip_severity_lift_m),
                        {"lift_at_slip_m": held_lift, "grip_force_n": force,
                         "peak_grip_force_n": self.peak_force, "opening_m": opening,
                         "steps_held_from_close": float(t - self.close_t)})
                self.drop_watch = (held_lift, self.last_goal, False, t)
                self.phase = SPENT
        watch = self.drop_watch
        if watch is not None and self.phase != HELD:
            lift_ref, goal_ref, commanded, since = watch
            fall = lift_ref - lift
            regress = s.goal - goal_ref
            if fall >= cfg.drop_fall_m and (not commanded or regress >= cfg.drop_goal_regress_m):
                ep.emit("drop", t, _clip01(fall / cfg.drop_severity_fall_m),
                        {"fall_m": fall, "lift_at_release_m": lift_ref, "commanded_release": float(commanded),
                         "goal_regress_m": regress, "steps_since_release": float(t - since)})
                self.drop_watch = None
        self.last_opening, self.last_lift, self.last_goal = opening, lift, s.goal

    def on_end(self, last_t: int, ep: Episode) -> None:
        """A touched attempt still unlifted at the end (at least ``grasp_settle_steps`` old; a
        younger one was cut short by the end, not missed) is a miss at the last step."""
        cfg = self.cfg
        unlifted = self.phase == TOUCHING or (self.phase == HELD and self.max_lift < cfg.held_lift_m)
        if unlifted and last_t - self.close_t >= cfg.grasp_settle_steps:
            self._miss(ep, max(last_t, 0), MISS_ENDED_UNLIFTED)

    def _miss(self, ep: Episode, t: int, variant: float) -> None:
        """A touched attempt that never held: severity is how far it stayed from lifting (1 = not at all)."""
        cfg = self.cfg
        severity = _clip01(1.0 - self.max_lift / cfg.held_lift_m) if cfg.held_lift_m > 0 else 1.0
        ep.emit("grasp_miss", t, severity,
                {"variant": variant, "close_step": float(self.close_t),
                 "peak_grip_force_n": self.peak_force, "max_lift_m": self.max_lift})

    def _pinched(self, s: StepSummary) -> bool:
        """The fingers have stopped on the target with it between the pads: a grip that has not
        lifted yet (a heavy or slippery object may never lift, and then it slips)."""
        cfg = self.cfg
        last = self.last_opening
        return (last is not None and abs(s.opening - last) <= cfg.pinch_steady_m
                and s.opening > cfg.closed_empty_opening_m
                and s.hand_target_xy <= cfg.pinch_xy_m and s.hand_target_z <= cfg.pinch_z_m)


class WrongObject:
    """wrong_object: the closing gripper presses (or lifts) a non-target object. Once per object."""

    def __init__(self, config: DetectorConfig):
        self.cfg = config
        self.streak: dict[str, int] = {}
        self.fired: set[str] = set()

    def on_step(self, s: StepSummary, ep: Episode) -> None:
        cfg = self.cfg
        poses, other_grip = s.poses, s.other_grip
        for name, f in other_grip.items():
            if name in self.fired:
                continue
            streak = self.streak.get(name, 0) + 1 if s.closing and f >= cfg.wrong_grasp_force_n else 0
            self.streak[name] = streak
            lifted = 0.0
            start = ep.start_pose.get(name)
            if start is not None:
                for p in poses:
                    if p["name"] == name:
                        lifted = p["pos"][2] - start[0][2]
                        break
            if streak >= cfg.wrong_grasp_confirm_steps or (f > 0.0 and lifted >= cfg.wrong_object_lift_m):
                self.fired.add(name)
                index = next((i for i, p in enumerate(poses) if p["name"] == name), -1)
                ep.emit("wrong_object", s.t, _clip01(max(f / cfg.wrong_grasp_severity_force_n,
                                                         lifted / max(cfg.wrong_object_lift_m, 1e-9))),
                        {"contact_force_n": f, "object_lift_m_other": lifted, "object_index": float(index),
                         "closing": float(s.closing)})
        for name in list(self.streak):
            if name not in other_grip:
                self.streak[name] = 0


class Knocks:
    """knocked_object: an object moved or turned from its start pose without a grasp. Once per object."""

    def __init__(self, config: DetectorConfig, grasp: Grasp, wrong: WrongObject):
        self.cfg = config
        self.grasp = grasp
        self.wrong = wrong
        self.knocked: set[str] = set()

    def on_step(self, s: StepSummary, ep: Episode) -> None:
        cfg = self.cfg
        target = s.target
        for i, p in enumerate(s.poses):
            name = p["name"]
            if name in self.knocked or name in self.wrong.fired:
                continue
            if name == target and self.grasp.target_grasped:
                continue
            pos0, quat0 = ep.start_pose[name]
            disp = _dist(pos0, p["pos"])
            rot = _quat_angle(quat0, p["quat"])
            if disp >= cfg.knock_displacement_m or rot >= cfg.knock_rotation_rad:
                self.knocked.add(name)
                ep.emit("knocked_object", s.t, _clip01(max(disp / cfg.knock_severity_displacement_m,
                                                           rot / math.pi)),
                        {"displacement_m": disp, "rotation_rad": rot, "is_target": float(name == target),
                         "object_index": float(i)})


class Forces:
    """excessive_force: crushing grip, hard contact, or a joint torque saturated while touching."""

    def __init__(self, config: DetectorConfig):
        self.cfg = config
        self.recurring = Recurring(config.rearm_steps)
        self.torque_streak = 0
        self.thresholds = tuple(config.torque_saturation_fraction * v for v in config.joint_torque_limits_nm)

    def on_step(self, s: StepSummary, ep: Episode) -> None:
        cfg = self.cfg
        force, max_robot_contact = s.force, s.max_robot_contact
        torque_frac, torque_joint, torque_hit = 0.0, -1, False
        for i, (tau, thr) in enumerate(zip(s.joint_torques, self.thresholds, strict=False)):
            frac = abs(tau) / cfg.joint_torque_limits_nm[i]
            if frac > torque_frac:
                torque_frac, torque_joint = frac, i
            if abs(tau) >= thr:
                torque_hit = True
        # A saturated joint in free space is the controller hurrying (a fast wrist turn saturates
        # the 12 N m wrist), not a force on the world: it counts only while the robot touches something.
        torque_hit = torque_hit and s.world_contact >= cfg.contact_force_n
        self.torque_streak = self.torque_streak + 1 if torque_hit else 0
        torque_hit = self.torque_streak >= cfg.torque_min_steps
        grip_hit = force > cfg.max_grip_force_n
        contact_hit = max_robot_contact > cfg.max_contact_force_n
        if self.recurring.update(grip_hit or contact_hit or torque_hit):
            sat = cfg.torque_saturation_fraction
            severity = max(1.0 - cfg.max_grip_force_n / force if grip_hit else 0.0,
                           1.0 - cfg.max_contact_force_n / max_robot_contact if contact_hit else 0.0,
                           (torque_frac - sat) / (1.0 - sat) if torque_hit else 0.0)
            ep.emit("excessive_force", s.t, _clip01(severity),
                    {"grip_force_n": force, "max_contact_force_n": max_robot_contact,
                     "max_torque_fraction": torque_frac, "max_torque_joint": float(torque_joint),
                     "by_grip": float(grip_hit), "by_contact": float(contact_hit), "by_torque": float(torque_hit)})


class Collision:
    """collision: hand or arm against the table or a non-target object, or the arm against the target."""

    def __init__(self, config: DetectorConfig):
        self.cfg = config
        self.recurring = Recurring(config.rearm_steps)

    def on_step(self, s: StepSummary, ep: Episode) -> None:
        if self.recurring.update(s.collide_force > 0.0):
            ep.emit("collision", s.t, _clip01(1.0 - self.cfg.collision_force_n / s.collide_force),
                    {"force_n": s.collide_force, "with_table": float(s.collide_table),
                     "with_object": float(s.collide_object), "by_arm": float(s.collide_arm)})


class Stall:
    """stall: no goal progress over a window while the hand stays put; recovered ("progressed")
    once goal_distance improves on its value at the stall, or the goal is reached."""

    def __init__(self, config: DetectorConfig):
        self.cfg = config
        self.recurring = Recurring(config.rearm_steps)
        self.goals: deque[float] = deque(maxlen=config.stall_window_steps + 1)
        self.eefs: deque = deque(maxlen=config.stall_window_steps + 1)

    def on_step(self, s: StepSummary, ep: Episode) -> None:
        cfg = self.cfg
        goal = s.goal
        goals, eefs = self.goals, self.eefs
        goals.append(goal)
        eefs.append(s.eef)
        stalled = False
        progress = travel = 0.0
        if len(goals) == goals.maxlen and goal > cfg.goal_reached_m:
            progress = goals[0] - min(goals)
            if progress < cfg.stall_min_progress_m:
                p0, limit = eefs[0], cfg.stall_max_eef_travel_m
                stalled = all(_dist(p0, p) < limit for p in eefs)  # stops at the first sign of motion
        if self.recurring.update(stalled):
            travel = max(_dist(eefs[0], p) for p in eefs)
            start = ep.start_goal or 0.0
            ep.emit("stall", s.t, _clip01(goal / start) if start > 0 else 1.0,
                    {"window_steps": float(cfg.stall_window_steps), "progress_m": progress,
                     "eef_travel_m": travel, "start_goal_distance_m": start})
        ep.recover_progress(s.t, goal)


class Limits:
    """out_of_reach (a reach joint stretched, the hand short of the target) and joint_limit (any
    other limit); out_of_reach is recovered ("reached") once the hand is within reach_gap_m."""

    def __init__(self, config: DetectorConfig):
        self.cfg = config
        self.reach = Recurring(config.rearm_steps)
        self.limit = Recurring(config.rearm_steps)
        self.reach_streak = 0
        self.limit_streak = 0

    def on_step(self, s: StepSummary, ep: Episode) -> None:
        cfg = self.cfg
        joint_pos = s.joint_pos
        reach_i, reach_left = -1, math.inf
        limit_left, limit_joint = math.inf, -1
        for i, (q, (lo, hi)) in enumerate(zip(joint_pos, cfg.joint_limits_rad, strict=False)):
            to_hi, to_lo = hi - q, q - lo
            if i in cfg.reach_joint_indices:
                if to_hi < reach_left:
                    reach_i, reach_left = i, to_hi
                to_hi = math.inf  # a stretched arm is out_of_reach, or fine at the goal: not a joint limit
            near = min(to_hi, to_lo)
            if near < limit_left:
                limit_left, limit_joint = near, i
        at_reach = (reach_left <= cfg.reach_margin_rad and s.hand_target_xy >= cfg.reach_gap_m
                    and s.goal > cfg.goal_reached_m)
        self.reach_streak = self.reach_streak + 1 if at_reach else 0
        if self.reach.update(self.reach_streak >= cfg.limit_min_steps):
            ep.emit("out_of_reach", s.t, _clip01(1.0 - reach_left / cfg.reach_margin_rad),
                    {"joint": float(reach_i), "distance_to_limit_rad": reach_left,
                     "joint_pos_rad": joint_pos[reach_i], "hand_to_target_m": s.hand_target_xy})
        at_limit = limit_left <= cfg.joint_limit_margin_rad and not at_reach
        self.limit_streak = self.limit_streak + 1 if at_limit else 0
        if self.limit.update(self.limit_streak >= cfg.limit_min_steps):
            ep.emit("joint_limit", s.t, _clip01(1.0 - limit_left / cfg.joint_limit_margin_rad),
                    {"joint": float(limit_joint), "distance_to_limit_rad": limit_left,
                     "joint_pos_rad": joint_pos[limit_joint]})
        if s.poses and s.hand_target_xy < cfg.reach_gap_m:
            ep.recover("reached", s.t)


class Timeout:
    """timeout: the episode ended by timeout without success; the moment is at its last step."""

    def __init__(self, config: DetectorConfig):
        self.cfg = config
        self.min_goal = math.inf
        self.last_goal = 0.0

    def on_step(self, s: StepSummary, ep: Episode) -> None:
        self.min_goal = min(self.min_goal, s.goal)
        self.last_goal = s.goal

    def on_end(self, ended: dict, last: int, steps_seen: int, ep: Episode) -> None:
        if ended["termination"] == "timeout" and not ended["success"]:
            start = ep.start_goal if ep.start_goal is not None else 0.0
            final = self.last_goal
            severity = _clip01(final / start) if start > 0 else 1.0
            ep.emit("timeout", last, severity,
                    {"steps": float(ended["steps"]), "start_goal_distance_m": start,
                     "final_goal_distance_m": final,
                     "min_goal_distance_m": self.min_goal if steps_seen else final,
                     "steps_seen": float(steps_seen)})
