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
from dataclasses import dataclass, fields

from streams.exceptions import ConfigError, DetectorError
from streams.failures.episode import (
    DETECTOR_VERSION,
    FAILURE_TYPES,
    GROUP_GRIPPER,
    GROUP_ROBOT,
    GROUP_TABLE,
    NOT_RECOVERED,
    PRODUCER,
    RECOVERED_BY,
    Episode,
    StepSummary,
    summarize,
)
from streams.failures.failure_types import (
    MISS_CLOSED_EMPTY,
    MISS_ENDED_UNLIFTED,
    MISS_LOST_BEFORE_LIFT,
    MISS_REOPENED_UNLIFTED,
    Collision,
    Forces,
    Grasp,
    Knocks,
    Limits,
    Stall,
    Timeout,
    WrongObject,
)

__all__ = ["DETECTOR_VERSION", "FAILURE_TYPES", "GROUP_GRIPPER", "GROUP_ROBOT", "GROUP_TABLE", "MISS_CLOSED_EMPTY",
           "MISS_ENDED_UNLIFTED", "MISS_LOST_BEFORE_LIFT", "MISS_REOPENED_UNLIFTED", "NOT_RECOVERED",
           "PANDA_JOINT_LIMITS_RAD", "PANDA_TORQUE_LIMITS_NM", "PRODUCER", "RECOVERED_BY", "DetectorConfig",
           "EpisodeDetector"]

# Franka Panda as robosuite 1.5 models it (robots/panda/robot.xml): joint ranges and motor limits.
PANDA_JOINT_LIMITS_RAD = ((-2.8973, 2.8973), (-1.7628, 1.7628), (-2.8973, 2.8973), (-3.0718, -0.0698),
                          (-2.8973, 2.8973), (-0.0175, 3.7525), (-2.8973, 2.8973))
PANDA_TORQUE_LIMITS_NM = (80.0, 80.0, 80.0, 80.0, 12.0, 12.0, 12.0)


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


class EpisodeDetector:
    """Failure detector for one episode. Feed its Steps in order, then its EpisodeEnded.

    Each Step is summarised once (``StepSummary``) and fed to one state machine per failure type
    (streams/failures/failure_types.py), in a fixed order: grasp (grasp_miss, slip, drop),
    wrong_object, knocked_object, excessive_force, collision, stall, out_of_reach / joint_limit.
    They emit through the ``Episode`` they share, which also tracks the recoveries.

    ``moments`` holds every FailureMoment emitted so far; ``suppressed`` counts moments over the
    per-type cap; ``outcomes()`` gives each moment with its recovery so far (module docstring).
    Not thread-safe; one instance per episode.
    """

    def __init__(self, config: DetectorConfig, episode_id: str, scenario_id: str, model_id: str):
        self.config = config
        self.episode_id = episode_id
        self.scenario_id = scenario_id
        self.model_id = model_id
        self.episode = Episode(config, episode_id, scenario_id, model_id)
        self.moments: list[dict] = self.episode.moments
        self.suppressed: dict[str, int] = self.episode.suppressed
        self.steps_seen = 0
        self.last_t = -1
        self.start_t: int | None = None
        self.ended = False
        self._summary: StepSummary | None = None
        self._grasp = Grasp(config)
        wrong = WrongObject(config)
        self._timeout = Timeout(config)
        self._machines = (self._grasp, wrong, Knocks(config, self._grasp, wrong), Forces(config), Collision(config),
                          Stall(config), Limits(config), self._timeout)

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
        if self.start_t is None:
            self.start_t = t
        ep = self.episode
        ep.envelope(step)
        summary = self._summary = summarize(step, self.config, self._summary)
        ep.begin(summary)
        first = len(ep.moments)
        for machine in self._machines:
            machine.on_step(summary, ep)
        return ep.moments[first:]

    def on_end(self, ended: dict) -> list[dict]:
        """Moments only the end can tell: timeout, and a grasp that touched but never lifted."""
        if ended["episode_id"] != self.episode_id:
            raise DetectorError(f"detector for episode {self.episode_id} got the end of {ended['episode_id']}")
        if self.ended:
            return []
        self.ended = True
        ep = self.episode
        ep.envelope(ended)
        first = len(ep.moments)
        self._grasp.on_end(self.last_t, ep)
        self._timeout.on_end(ended, max(self.last_t, int(ended["steps"]) - 1, 0), self.steps_seen, ep)
        return ep.moments[first:]

    def outcomes(self) -> list[dict]:
        """Every moment emitted so far as a MomentOutcome record (schemas/avro/MomentOutcome.avsc):
        its id, type, step, severity, features, and the step and way the episode recovered from it
        (-1 and "" while it has not)."""
        return self.episode.outcomes()
