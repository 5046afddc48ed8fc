"""robosuite's MujocoEnv.step for the one configuration a SimEnv runs, without its per-substep
Python overhead (_LeanControlStep). A module of its own because it is robosuite's step
reproduced, not scenario or task code: it knows nothing of either, and
tests/unit/producers/sim/test_sim_lean_step.py holds it to robosuite's own step bit for bit.
"""

from __future__ import annotations

from typing import Any

# producers/sim/__init__.py, which runs before this module, has set the MUJOCO_GL default.
import mujoco
import numpy as np
from robosuite.controllers.composite.composite_controller import CompositeController
from robosuite.controllers.parts.arm.osc import OperationalSpaceController
from robosuite.controllers.parts.gripper.simple_grip import SimpleGripController
from robosuite.environments.base import MujocoEnv
from robosuite.environments.robot_env import RobotEnv
from robosuite.robots.fixed_base_robot import FixedBaseRobot
from robosuite.utils.observables import NO_DELAY

from producers import robosuite_arithmetic
from producers.sim import osc_substep

# robosuite's BLAS arithmetic replaced by fixed-order arithmetic, as producers/sim/envs.py does
# (idempotent): the step below is bit-identical to robosuite's only with it installed.
robosuite_arithmetic.install()


class _LeanControlStep:
    """MujocoEnv.step for one fixed-base arm under the BASIC composite controller (an OSC arm
    in the base frame without interpolators, plus a gripper), with the same results.

    robosuite runs its controller in Python on each of the 25 physics substeps of a 20 Hz control
    step, and most of that time is overhead around the arithmetic: the action limits rebuilt three
    times per substep to learn the action dimension, site names looked up and a fresh array
    allocated for each of six Jacobians, the controller frame read twice, every observable asked
    on every substep whether it is due, and ~40 small numpy calls. This class makes the same MuJoCo
    calls and does the same arithmetic in the same order, the arithmetic compiled
    (producers/sim/osc_substep.py), so the physics, the controller gains and every number stay
    exactly what robosuite computes (with its fixed-order arithmetic installed);
    tests/unit/producers/sim/test_sim_lean_step.py compares it with robosuite's own step bit for bit. Goals
    (the policy substep) are set by robosuite's own CompositeController.set_goal; reward and
    observations by robosuite's own _post_action and _get_observations.

    One thing is left out: robosuite's proprioceptive history buffers (robot.recent_qpos,
    recent_actions, recent_torques, recent_ee_*), ~0.3 ms of every control step. Nothing in a
    SimEnv reads them: only Wipe's reward and robot.js_energy / ee_ft_integral do.

    Built after each robosuite reset (robosuite builds new controllers on every reset).
    ``supports(env)`` is False for any other configuration, which then runs robosuite's step.
    """

    def __init__(self, env: Any):
        robot = env.robots[0]
        cc = robot.composite_controller
        self.env, self.controller = env, cc
        self.m, self.d = m, d = env.sim.model._model, env.sim.data._data
        self.n_substeps = int(env.control_timestep / env.model_timestep)  # as MujocoEnv.step
        self.action_dim = env.action_dim
        arm, grip = cc.part_controllers["right"], cc.part_controllers["right_gripper"]
        self.arm, self.grip = arm, grip
        self.base_site = env.sim.model.site_name2id(f"{arm.naming_prefix}{arm.part_name}_center")
        self.ref_site = env.sim.model.site_name2id(arm.ref_name)
        ranges = _index_ranges(robot)  # supports() has checked they are contiguous
        self.grip_qpos, self.grip_qvel = _index(grip.qpos_index), _index(grip.qvel_index)
        actuators = robot._ref_actuators_indexes_dict
        ctrlrange = env.sim.model.actuator_ctrlrange
        self.arm_low, self.arm_high = ctrlrange[actuators["right"], 0], ctrlrange[actuators["right"], 1]
        self.grip_low = ctrlrange[actuators["right_gripper"], 0]
        self.grip_high = ctrlrange[actuators["right_gripper"], 1]
        ctrl_range = np.stack([grip.actuator_min, grip.actuator_max], axis=-1)  # as SimpleGripController
        self.grip_bias = 0.5 * (ctrl_range[:, 1] + ctrl_range[:, 0])
        self.grip_weight = 0.5 * (ctrl_range[:, 1] - ctrl_range[:, 0])
        self.grip_command: tuple[np.ndarray, np.ndarray] | None = None  # (vels, clipped vels)
        self.observables: list[Any] = []  # the enabled ones, as of this step

        ints = np.zeros(osc_substep.N_INTS, dtype=np.int64)
        ints[osc_substep.BASE_SITE], ints[osc_substep.REF_SITE] = self.base_site, self.ref_site
        starts = (osc_substep.QPOS0, osc_substep.QVEL0, osc_substep.ACT0, osc_substep.GRIP0)
        for at, r in zip(starts, ranges, strict=True):
            ints[at], ints[at + 1] = r.start, r.stop
        ints[osc_substep.UNCOUPLING] = bool(arm.uncoupling)
        nv, n = m.nv, ranges[1].stop - ranges[1].start
        self.jacp, self.jacr = np.zeros((3, nv)), np.zeros((3, nv))  # mj_jacSite of the reference site
        self.base_jacp, self.base_jacr = np.zeros((3, nv)), np.zeros((3, nv))  # ... of the base site
        self.mass_full = np.zeros((nv, nv))
        # the state robosuite re-creates on every substep, kept here and handed to the controller
        # objects whenever robosuite's own code may look at them (_hand_over); the rest of the
        # arm's state robosuite updates in place, and so does osc_update
        self.origin_pos, self.origin_ori = np.zeros(3), np.zeros((3, 3))
        self.joint_pos, self.joint_vel = np.zeros(ranges[0].stop - ranges[0].start), np.zeros(n)
        self.mass_matrix, self.torques = np.zeros((n, n), order="F"), np.zeros(n)
        state = (self.origin_pos, self.origin_ori, arm.ref_pos, arm.ref_ori_mat, arm.ref_pos_vel, arm.ref_ori_vel,
                 arm.J_pos, arm.J_ori, arm.J_full, self.joint_pos, self.joint_vel, self.mass_matrix)
        # the compiled functions' arguments, around the goal tuple set_goal decides each step:
        #   osc_update(*update_args)
        #   osc_torques(*torque_head, *goal, *torque_tail)
        #   osc_substep(*update_args, *substep_mid, *goal, *substep_tail)
        self.update_args = (d.qpos, d.qvel, d.site_xpos, d.site_xmat, ints, self.jacp, self.jacr, self.mass_full,
                            *state)
        self.torque_head = (d.qvel, d.qfrc_bias, d.ctrl, ints)
        self.torque_tail = (self.base_jacp, self.base_jacr, *state, self.torques)
        self.substep_mid = (d.qfrc_bias, d.ctrl)
        self.substep_tail = (self.base_jacp, self.base_jacr, self.torques)
        self.goal: tuple = ()

    @staticmethod
    def supports(env: Any) -> bool:
        """True when env is in the one configuration this class reproduces."""
        cls = type(env)
        if not (cls._pre_action is RobotEnv._pre_action and cls._update_observables is MujocoEnv._update_observables
                and env.lite_physics and env.viewer is None and not env.has_renderer and not env.viewer_get_obs
                and len(env.robots) == 1 and osc_substep.compiled()):
            return False
        robot = env.robots[0]
        cc = robot.composite_controller
        if type(robot) is not FixedBaseRobot or type(cc) is not CompositeController or list(cc.arms) != ["right"]:
            return False
        parts = cc.part_controllers
        if list(parts) != ["right", "right_gripper"] or not all(robot._enabled_parts.get(p, False) for p in parts):
            return False
        arm, grip = parts["right"], parts["right_gripper"]
        return (type(arm) is OperationalSpaceController and arm.input_ref_frame == "base"
                and arm.interpolator_pos is None and arm.interpolator_ori is None and arm.lite_physics
                and arm.num_ref_sites == 1 and type(grip) is SimpleGripController and grip.interpolator is None
                and all(isinstance(r, slice) for r in _index_ranges(robot)))

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, dict]:
        """MujocoEnv.step(action)."""
        env = self.env
        if env.done:
            raise ValueError("executing action in terminated episode")
        if len(action) != self.action_dim:  # RobotEnv._pre_action's check
            raise ValueError(f"environment got invalid action dimension -- expected {self.action_dim}, "
                             f"got {len(action)}")
        env.timestep += 1
        m, d, last = self.m, self.d, self.n_substeps - 1
        clock = self._observable_clock()
        for i in range(self.n_substeps):
            mujoco.mj_step1(m, d)
            self._control(action if i == 0 else None)
            if clock is None or i == last or self._due(clock):
                self._hand_over()  # robosuite's own code is about to run
            mujoco.mj_step2(m, d)
            if clock is None:
                env._update_observables()
            else:
                clock = self._tick(clock)
        if clock is not None:
            for o in self.observables:
                o._time_since_last_sample = clock[0]
        env.cur_time += env.control_timestep
        reward, done, info = env._post_action(action)
        return env._get_observations(), reward, done, info

    # -- observables ----------------------------------------------------------------------

    def _observable_clock(self) -> tuple[float, bool, float] | None:
        """(time since last sample, sampled, sampling period) shared by every enabled observable,
        or None when they do not share one (then each substep runs robosuite's update)."""
        obs = self.observables = [o for o in self.env._observables.values() if o._enabled]
        if not obs:
            return None
        first = obs[0]
        t, sampled, period = first._time_since_last_sample, first._sampled, first._sampling_timestep
        for o in obs:
            if (o._time_since_last_sample != t or o._sampled != sampled or o._sampling_timestep != period
                    or o._delayer is not NO_DELAY or o._current_delay != 0.0):
                return None
        return t, sampled, period

    def _due(self, clock: tuple[float, bool, float]) -> bool:
        """Whether this substep's tick runs robosuite's observable update."""
        t, sampled, period = clock
        ticked = t + self.env.model_timestep
        return (not sampled and period >= ticked) or ticked >= period

    def _tick(self, clock: tuple[float, bool, float]) -> tuple[float, bool, float]:
        """Observable.update's clock for one substep: robosuite's own update runs only on the
        substeps where the observables sample or their period rolls over (2 of 25)."""
        t, sampled, period = clock
        ticked = t + self.env.model_timestep
        if self._due(clock):
            for o in self.observables:
                o._time_since_last_sample = t
            self.env._update_observables()
            first = self.observables[0]
            return first._time_since_last_sample, first._sampled, period
        return ticked, sampled, period

    # -- FixedBaseRobot.control ----------------------------------------------------------

    def _control(self, action: np.ndarray | None) -> None:
        """One substep of FixedBaseRobot.control; ``action`` on the policy substep, else None."""
        m, d = self.m, self.d
        # the MuJoCo calls robosuite's update() and run_controller() make
        mujoco.mj_jacSite(m, d, self.jacp, self.jacr, self.ref_site)
        mujoco.mj_fullM(m, self.mass_full, d.qM)
        mujoco.mj_jacSite(m, d, self.base_jacp, self.base_jacr, self.base_site)
        if action is None:
            osc_substep.osc_substep(*self.update_args, *self.substep_mid, *self.goal, *self.substep_tail)
            return
        osc_substep.osc_update(*self.update_args)
        arm, grip = self.arm, self.grip
        self._hand_over_arm()
        arm.new_update = False  # set_goal would otherwise redo what osc_update did
        self.controller.set_goal(action)  # robosuite's own: arm goal pose, gripper action
        vels = np.array(grip.goal_qvel)  # SimpleGripController.run_controller, once per step
        if grip.use_action_scaling:
            vels = self.grip_bias + self.grip_weight * vels
        self.grip_command = vels, _clip(vels, self.grip_low, self.grip_high)
        # the goal (and, with variable impedance, the gains) set_goal has just set
        self.goal = (arm.goal_pos, arm.goal_ori, arm.kp, arm.kd, arm.initial_joint, self.arm_low, self.arm_high,
                     self.grip_command[1])
        osc_substep.osc_torques(*self.torque_head, *self.goal, *self.torque_tail)

    def _hand_over_arm(self) -> None:
        """The arm's state as robosuite's update() leaves it: fresh arrays for what it re-creates."""
        arm = self.arm
        arm.origin_pos, arm.origin_ori = self.origin_pos.copy(), self.origin_ori.copy()
        arm.joint_pos, arm.joint_vel = self.joint_pos.copy(), self.joint_vel.copy()
        arm.mass_matrix = self.mass_matrix.copy(order="F")

    def _hand_over(self) -> None:
        """Leaves the controller objects as robosuite's own last substep would: the arm's state
        and torques, the gripper's joint state read at control time and its command."""
        arm, grip, d = self.arm, self.grip, self.d
        self._hand_over_arm()
        arm.torques, arm.new_update = self.torques.copy(), True
        grip.joint_pos, grip.joint_vel = np.array(d.qpos[self.grip_qpos]), np.array(d.qvel[self.grip_qvel])
        grip.vels, grip.new_update = self.grip_command[0], True
        applied = self.controller._applied_action_dict
        applied["right"], applied["right_gripper"] = arm.torques, grip.vels


try:  # the ufunc np.clip ends in (numpy 1.x), without its ~1.5 us of Python wrappers
    from numpy.core.umath import clip as _clip
except ImportError:  # pragma: no cover - numpy 2 moved it
    _clip = np.clip


def _index_ranges(robot: Any) -> tuple:
    """The arm's qpos and qvel indexes, the arm's and the gripper's actuators: what osc_substep
    reads and writes, each a slice when contiguous."""
    parts = robot.composite_controller.part_controllers
    actuators = robot._ref_actuators_indexes_dict
    return (_index(parts["right"].qpos_index), _index(parts["right"].qvel_index), _index(actuators["right"]),
            _index(actuators["right_gripper"]))


def _index(indexes: list[int]) -> slice | list[int]:
    """A contiguous index list as a slice (same elements, no fancy-indexing cost)."""
    idx = [int(i) for i in indexes]
    if idx and idx == list(range(idx[0], idx[0] + len(idx))):
        return slice(idx[0], idx[0] + len(idx))
    return idx
