"""Headless robosuite environments built from a ScenarioSpec, and the per-step signals read
from raw MuJoCo.

    env = make_env(spec, keyframes=False)
    obs = env.reset(seed=7)
    obs, reward, done, info = env.step(action)     # action: 7 floats in [-1, 1]
    env.signals()                                  # dict with exactly SIGNAL_KEYS
    env.success_relative()                         # success measured from the episode's start
    env.render_keyframe(size=128)                  # uint8 HxWx3 (make_env(..., keyframes=True))

Control: the Panda's default robosuite 1.5 BASIC composite controller, an OSC_POSE arm with
delta inputs in the base frame (action[0:3] * 0.05 m, action[3:6] * 0.5 rad axis-angle per
step) and a binary-ish gripper (action[6]: -1 opens, +1 closes), at 20 Hz.

Determinism: ``make_env(spec)`` seeds robosuite with ``spec.seed`` (that fixes the world, e.g.
Lift's cube size); ``reset(seed)`` re-seeds the generator that robosuite's placement sampler and
joint-noise draw from, in place, so an episode is a function of (spec, seed) alone: the same pair
gives a bit-identical rollout in any process and after any earlier episodes. Resets are soft
(``hard_reset=False``: the compiled model is kept, 2 ms instead of ~0.15 s, and the keyframe
renderer stays valid); every scenario edit is re-applied after each reset anyway. With the
settle steps below a reset takes ~50 ms.

Speed: a control step runs 25 physics substeps, and robosuite runs its controller in Python on
each. ``step`` goes through _LeanControlStep, which makes the same MuJoCo calls and does the same
arithmetic without robosuite's per-substep overhead, the arithmetic compiled
(producers/sim/osc_substep.py): about 3x the steps/s of robosuite's own step, with bit-identical
results (tests/unit/sim/test_sim_lean_step.py compares the two). Both run the fixed-order
arithmetic producers/robosuite_arithmetic.py installs into robosuite on import, so an episode is
the same on every machine, whichever BLAS kernel numpy picked.
``robosuite_env.lean_step = False`` runs robosuite's stock step.

Tasks beyond robosuite's own: lift then place (``spec.place_target_xy``, Lift only): the goal is
the target on the table and success is the cube lifted first, then resting there, released (see
success_relative); lift and hold (``spec.success_hold_steps``) is the rollout's business
(producers/sim/rollout.py): the env reports success per step, the episode ends once it held.

The episode clock is ours: robosuite runs with ``ignore_done=True`` and ``done`` is
``steps >= spec.horizon``. Each reset lets objects settle for SETTLE_STEPS control steps (robosuite
drops them from 1 cm) before the start pose used by the "relative" measures is recorded.
"""

from __future__ import annotations

import atexit
import os
import weakref
from dataclasses import dataclass
from typing import Any

# producers/sim/__init__.py, which runs before this module, has set the MUJOCO_GL default.
import mujoco
import numpy as np
from robosuite.controllers import load_composite_controller_config
from robosuite.controllers.composite.composite_controller import CompositeController
from robosuite.controllers.parts.arm.osc import OperationalSpaceController
from robosuite.controllers.parts.gripper.simple_grip import SimpleGripController
from robosuite.environments.base import MujocoEnv
from robosuite.environments.manipulation.lift import Lift
from robosuite.environments.manipulation.pick_place import PickPlaceCan
from robosuite.environments.manipulation.stack import Stack
from robosuite.environments.robot_env import RobotEnv
from robosuite.models.objects import BallObject, BoxObject, CylinderObject
from robosuite.robots.fixed_base_robot import FixedBaseRobot
from robosuite.utils.observables import NO_DELAY
from robosuite.utils.placement_samplers import SequentialCompositeSampler

from producers import robosuite_arithmetic
from producers.fixed_order import norm
from producers.sim import osc_substep
from producers.sim.exceptions import ActionError, EnvError, KeyframeError
from producers.sim.scenario import OBJECT_GEOM_PRIORITY, Distractor, ScenarioSpec
from producers.step_signals import OBJECT_GROUP, StepSignals
from producers.step_signals import SIGNAL_KEYS as SIGNAL_KEYS  # re-exported: the keys of SimEnv.signals()

# robosuite's BLAS arithmetic replaced by fixed-order arithmetic, so an episode is the same on every
# machine (producers/robosuite_arithmetic.py).
robosuite_arithmetic.install()

CONTROL_FREQ_HZ = 20
ACTION_DIM = 7
# Control steps run with a hold action after each reset, before the start pose is recorded.
SETTLE_STEPS = 5
# Lift succeeds when the cube is this far above its own start height.
LIFT_SUCCESS_HEIGHT_M = 0.04
# Lift then place (ScenarioSpec.place_target_xy): after the cube has been lifted by
# LIFT_SUCCESS_HEIGHT_M, it must rest with its centre within PLACE_XY_TOL_M (horizontally) of
# the place target, within PLACE_Z_TOL_M of its start height (on the table, not hovering),
# slower than PLACE_REST_SPEED_M_S and untouched by the fingers (released).
PLACE_XY_TOL_M = 0.015
PLACE_Z_TOL_M = 0.01
PLACE_REST_SPEED_M_S = 0.05
# Stack: cubeA's bottom within this of cubeB's top, its centre within cubeB's half-size
# (times this factor) horizontally, touching cubeB and not touched by the fingers.
STACK_Z_TOL_M = 0.01
STACK_XY_FRACTION = 1.0
# PickPlaceCan: the can resting in its target bin quadrant, below this height above the bin
# base (robosuite's own bound) and not touched by the fingers.
BIN_MAX_HEIGHT_M = 0.1
BIN_FLOOR_HALF_THICKNESS_M = 0.02  # robosuite's bins_arena.xml floor box
# Distractors: density (kg/m^3, light wood) and colour, dropped from this height.
DISTRACTOR_DENSITY = 500.0
DISTRACTOR_RGBA = (0.35, 0.45, 0.9, 1.0)
DISTRACTOR_DROP_M = 0.002
# Keyframes: camera and render options (shadows, reflections, skybox off, collision geoms hidden).
KEYFRAME_CAMERA = "agentview"

# SIGNAL_KEYS and the contact groups are producers/step_signals.py's, shared with LIBERO ("table"
# here: the table, bins and floor, every static arena body).


# --------------------------------------------------------------------------------------
# robosuite subclasses: the scenario is applied in robosuite's own _load_model hook
# --------------------------------------------------------------------------------------

def _walk_samplers(sampler: Any):
    yield sampler
    if isinstance(sampler, SequentialCompositeSampler):
        for child in sampler.samplers.values():
            yield from _walk_samplers(child)


# --------------------------------------------------------------------------------------
# The lean control step: robosuite's MujocoEnv.step without its Python overhead
# --------------------------------------------------------------------------------------

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
    tests/unit/sim/test_sim_lean_step.py compares it with robosuite's own step bit for bit. Goals
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


class _ScenarioMixin:
    """Builds the scenario's geometry: object size, distractors, placement ranges.

    Subclasses name the manipulated object, the task objects reported in signals, the sampler
    that places the manipulated object and the placement reference point.
    """

    _scenario: ScenarioSpec

    # step() runs _LeanControlStep when the configuration allows it; False: robosuite's stock step.
    lean_step = True

    def __init__(self, *, scenario: ScenarioSpec, **kwargs: Any):
        self._scenario = scenario
        self.distractor_objects: list[Any] = []
        self._lean: _LeanControlStep | None = None
        super().__init__(**kwargs)

    def step(self, action):
        if not self.lean_step:
            return super().step(action)
        lean = self._lean
        if lean is None or lean.controller is not self.robots[0].composite_controller:
            # robosuite builds new controllers on every reset
            lean = self._lean = _LeanControlStep(self) if _LeanControlStep.supports(self) else None
        if lean is None:
            return super().step(action)
        return lean.step(action)

    # hooks ----------------------------------------------------------------------------
    def manipulated_object(self) -> Any:
        raise NotImplementedError

    def _set_manipulated_object(self, obj: Any) -> None:
        raise NotImplementedError

    def task_objects(self) -> list[Any]:
        raise NotImplementedError

    def _manipulated_sampler(self) -> Any:
        return self.placement_initializer

    def placement_reference(self) -> np.ndarray:
        return np.array(self.table_offset, dtype=float)

    def surface_z(self) -> float:
        return float(self.table_offset[2])

    # robosuite hook -------------------------------------------------------------------
    def _load_model(self) -> None:
        super()._load_model()
        spec = self._scenario
        if spec.object_size_scale != 1.0:
            self._rescale_manipulated(spec.object_size_scale)
        sampler = self._manipulated_sampler()
        if spec.placement_x_range is not None or spec.placement_y_range is not None:
            if spec.placement_x_range is not None:
                sampler.x_range = spec.placement_x_range
            if spec.placement_y_range is not None:
                sampler.y_range = spec.placement_y_range
            sampler.ensure_object_boundary_in_range = False  # ranges are for the object's centre
        self.distractor_objects = []
        if spec.distractors:
            self._add_distractors(spec.distractors)

    def _rescale_manipulated(self, scale: float) -> None:
        old = self.manipulated_object()
        new = BoxObject(name=old.name, size=np.array(old.size) * scale, rgba=old.rgba, material=old.material,
                        density=old.density, friction=old.friction, solref=old.solref, solimp=old.solimp)
        self.model.worldbody.remove(old.get_obj())
        self.model.merge_objects([new])
        objs = self.model.mujoco_objects
        objs[objs.index(old)] = new
        for s in _walk_samplers(self.placement_initializer):
            s.mujoco_objects = [new if o is old else o for o in s.mujoco_objects]
        self._set_manipulated_object(new)

    def _add_distractors(self, distractors: tuple[Distractor, ...]) -> None:
        ref = self.placement_reference()
        surface = self.surface_z()
        distractor_fixtures = {}
        for i, d in enumerate(distractors):
            name = f"distractor{i}"
            if d.kind == "box":
                obj = BoxObject(name=name, size=[d.size] * 3, rgba=DISTRACTOR_RGBA, density=DISTRACTOR_DENSITY)
            elif d.kind == "cylinder":
                obj = CylinderObject(name=name, size=[d.size, d.size], rgba=DISTRACTOR_RGBA,
                                     density=DISTRACTOR_DENSITY)
            else:
                obj = BallObject(name=name, size=[d.size], rgba=DISTRACTOR_RGBA, density=DISTRACTOR_DENSITY)
            self.distractor_objects.append(obj)
            pos = (ref[0] + d.x, ref[1] + d.y, surface - obj.bottom_offset[2] + DISTRACTOR_DROP_M)
            distractor_fixtures[obj.name] = (pos, np.array([1.0, 0.0, 0.0, 0.0]), obj)
        self.model.merge_objects(self.distractor_objects)
        self.model.mujoco_objects.extend(self.distractor_objects)
        # The samplers place task objects clear of the distractors and return the distractors'
        # fixed placements with theirs, so robosuite's own _reset_internal puts them down.
        original = self.placement_initializer.sample

        def sample(fixtures=None, reference=None, on_top=True):
            merged = dict(distractor_fixtures)
            merged.update(fixtures or {})
            return original(fixtures=merged, reference=reference, on_top=on_top)

        self.placement_initializer.sample = sample


class _Lift(_ScenarioMixin, Lift):
    def manipulated_object(self):
        return self.cube

    def _set_manipulated_object(self, obj):
        self.cube = obj

    def task_objects(self):
        return [self.cube]


class _Stack(_ScenarioMixin, Stack):
    def manipulated_object(self):
        return self.cubeA

    def _set_manipulated_object(self, obj):
        self.cubeA = obj

    def task_objects(self):
        return [self.cubeA, self.cubeB]


class _PickPlaceCan(_ScenarioMixin, PickPlaceCan):
    def manipulated_object(self):
        return self.objects[self.object_id]

    def _set_manipulated_object(self, obj):  # never called: scaling is refused for this env
        raise EnvError("PickPlaceCan's can cannot be rescaled")

    def task_objects(self):
        return [self.manipulated_object()]

    def _manipulated_sampler(self):
        sampler = self.placement_initializer.samplers["CollisionObjectSampler"]
        # Only the can is sampled: the other objects are moved out of the scene anyway, and a
        # narrow placement range could not fit all four.
        sampler.mujoco_objects = [self.manipulated_object()]
        return sampler

    def placement_reference(self):
        return np.array(self.bin1_pos, dtype=float)

    def surface_z(self):
        return float(self.bin1_pos[2]) + BIN_FLOOR_HALF_THICKNESS_M


_ENV_CLASSES = {"Lift": _Lift, "Stack": _Stack, "PickPlaceCan": _PickPlaceCan}


# --------------------------------------------------------------------------------------
# SimEnv
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _ObjectRef:
    name: str
    body_id: int
    qpos_adr: int  # free joint: qpos[adr:adr+3] position, [adr+3:adr+7] wxyz
    dof_adr: int  # free joint: qvel[adr:adr+3] linear velocity (world), [adr+3:adr+6] angular


class SimEnv:
    """One robosuite environment for one scenario; reset it for each episode.

    Attributes a policy or runner may read: ``spec``, ``steps`` (control steps taken this
    episode), ``manipulated_name``, ``object_names`` (task objects, then distractors),
    ``action_dim`` (7), ``robosuite_env`` (the underlying env, for inspection only).
    """

    def __init__(self, spec: ScenarioSpec, *, keyframes: bool = False):
        self.spec = spec
        self.keyframes = keyframes
        cls = _ENV_CLASSES[spec.env_name]
        try:
            self._env = cls(
                scenario=spec,
                robots=spec.robot,
                controller_configs=load_composite_controller_config(robot=spec.robot),
                has_renderer=False,
                has_offscreen_renderer=False,  # keyframes use our own mujoco.Renderer
                use_camera_obs=False,
                control_freq=CONTROL_FREQ_HZ,
                horizon=spec.horizon,
                ignore_done=True,  # the episode clock is ours
                hard_reset=False,
                renderer="mujoco",
                seed=spec.seed,
            )
        except Exception as exc:  # robosuite raises bare AssertionError/RandomizationError
            raise EnvError(f"cannot build {spec.env_name} for scenario {spec.scenario_id}: {exc!r}") from exc
        self._renderer: mujoco.Renderer | None = None
        self._scene_option: mujoco.MjvOption | None = None
        self._index_model()
        self.steps = 0
        self._started = False
        self._start_pos: dict[str, np.ndarray] = {}
        self._lifted = False  # lift then place: the object has been lifted this episode
        self._place_target: np.ndarray | None = None
        if spec.place_target_xy is not None:
            ref = self._env.placement_reference()
            self._place_target = ref[:2] + np.asarray(spec.place_target_xy, dtype=float)
        self.spawn_penetration_m = 0.0  # set by reset(): see _object_penetration()

    # -- model indexing (the compiled model never changes: resets are soft) --------------

    @property
    def robosuite_env(self) -> Any:
        return self._env

    @property
    def action_dim(self) -> int:
        return ACTION_DIM

    @property
    def model(self) -> mujoco.MjModel:
        return self._env.sim.model._model

    @property
    def data(self) -> mujoco.MjData:
        return self._env.sim.data._data

    def _body_id(self, name: str) -> int:
        return mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, name)

    def _geom_ids(self, names: list[str]) -> np.ndarray:
        return np.array([mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_GEOM, n) for n in names], dtype=int)

    def _object_ref(self, obj: Any) -> _ObjectRef:
        m = self.model
        jid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, obj.joints[0])
        return _ObjectRef(obj.name, self._body_id(obj.root_body), int(m.jnt_qposadr[jid]), int(m.jnt_dofadr[jid]))

    def _index_model(self) -> None:
        env, m = self._env, self.model
        robot = env.robots[0]
        gripper = robot.gripper["right"]
        manipulated = env.manipulated_object()
        self.manipulated_name: str = manipulated.name
        self._manip = self._object_ref(manipulated)
        self._task_refs = [self._object_ref(o) for o in env.task_objects()]
        self._distractor_refs = [self._object_ref(o) for o in env.distractor_objects]
        self.object_names: tuple[str, ...] = tuple(r.name for r in self._task_refs + self._distractor_refs)
        arm_joints = set(robot._ref_joint_indexes)
        arm_actuators = np.array([a for a in range(m.nu) if m.actuator_trntype[a] == mujoco.mjtTrn.mjTRN_JOINT
                                  and int(m.actuator_trnid[a, 0]) in arm_joints], dtype=int)
        # contact groups: the world (floor) and static arena bodies (table, bins) are the table;
        # bodies that are neither robot, table nor object are not reported
        root = m.body_rootid
        table = (np.arange(m.nbody) == 0) | ((root != 0) & (m.body_jntnum[root] == 0) & (m.body_mocapid[root] < 0))
        self._signals = StepSignals(m, gripper=gripper, robot_root_body=robot.robot_model.root_body,
                                    eef_site=int(robot.eef_site_id["right"]),
                                    arm_qpos=np.array(robot._ref_joint_pos_indexes, dtype=int),
                                    arm_actuators=arm_actuators,
                                    objects=[(r.name, r.body_id) for r in self._task_refs + self._distractor_refs],
                                    table=table, target=self.manipulated_name)
        self._pads = self._signals.pads
        self._finger_geoms = set(self._signals.finger_geoms.tolist())
        self._geom_group = self._signals.geom_group
        self._manip_contact_geoms = self._geom_ids(manipulated.contact_geoms)
        self._manip_visual_geoms = self._geom_ids(manipulated.visual_geoms)
        self._manip_bodies = np.flatnonzero(m.body_rootid == self._manip.body_id)
        self._orig_friction = m.geom_friction[self._manip_contact_geoms].copy()
        self._orig_priority = m.geom_priority[self._manip_contact_geoms].copy()
        self._orig_mass = m.body_mass[self._manip_bodies].copy()
        self._orig_inertia = m.body_inertia[self._manip_bodies].copy()
        self._orig_rgba = m.geom_rgba[self._manip_visual_geoms].copy()
        self._orig_matid = m.geom_matid[self._manip_visual_geoms].copy()
        self._hand_body = self._body_id(gripper.root_body)

        # target bin for PickPlaceCan
        if self.spec.env_name == "PickPlaceCan":
            env_obj_id = env.object_id
            self._bin_target = np.array(env.target_bin_placements[env_obj_id], dtype=float)
            bin_low = np.array(env.bin2_pos[:2], dtype=float)
            if env_obj_id in (0, 2):
                bin_low[0] -= env.bin_size[0] / 2
            if env_obj_id < 2:
                bin_low[1] -= env.bin_size[1] / 2
            self._bin_low = bin_low
            self._bin_high = bin_low + np.array(env.bin_size[:2], dtype=float) / 2
            self._bin_z = float(env.bin2_pos[2])

    # -- episode ------------------------------------------------------------------------

    def reset(self, seed: int) -> dict[str, np.ndarray]:
        """Starts an episode that is a function of (spec, seed) alone. Returns robosuite's
        observation dict plus "goal_pos" (see goal_pos())."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
        env = self._env
        env.rng.bit_generator.state = np.random.default_rng(int(seed)).bit_generator.state
        try:
            env.reset()
            self._apply_model_edits()
            if any(self.spec.pose_offset_xyz):
                adr = self._manip.qpos_adr
                self.data.qpos[adr:adr + 3] += np.asarray(self.spec.pose_offset_xyz)
            env.sim.forward()
            self.spawn_penetration_m = self._object_penetration()
            hold = np.zeros(ACTION_DIM)
            for _ in range(SETTLE_STEPS):
                env.step(hold)
        except Exception as exc:
            raise EnvError(f"reset failed for scenario {self.spec.scenario_id} seed {seed}: {exc!r}") from exc
        self.steps = 0
        self._started = True
        self._start_pos = {r.name: self.data.xpos[r.body_id].copy() for r in self._task_refs}
        self._lifted = False
        return self._observe(env._get_observations(force_update=True))

    def _object_penetration(self) -> float:
        """Deepest penetration (m, >= 0) of any contact that involves a task object or a
        distractor, in the current state."""
        d = self.data
        n = d.ncon
        if n == 0:
            return 0.0
        objects = self._geom_group >= OBJECT_GROUP  # groups 0-2: gripper, robot, table
        involved = objects[d.contact.geom1[:n]] | objects[d.contact.geom2[:n]]
        depth = -d.contact.dist[:n][involved]
        return float(max(0.0, depth.max())) if depth.size else 0.0

    def _observe(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        obs["goal_pos"] = self.goal_pos()
        return obs

    def _apply_model_edits(self) -> None:
        """Friction, mass and colour of the manipulated object, set on the compiled model."""
        m, spec = self.model, self.spec
        g = self._manip_contact_geoms
        if spec.object_friction is not None:
            m.geom_friction[g, 0] = spec.object_friction
            m.geom_priority[g] = OBJECT_GEOM_PRIORITY
        else:
            m.geom_friction[g] = self._orig_friction
            m.geom_priority[g] = self._orig_priority
        b = self._manip_bodies
        if spec.object_mass is not None:
            ratio = spec.object_mass / float(self._orig_mass.sum())
            m.body_mass[b] = self._orig_mass * ratio
            m.body_inertia[b] = self._orig_inertia * ratio
            mujoco.mj_setConst(m, mujoco.MjData(m))  # body_invweight0 etc. for the new mass
        v = self._manip_visual_geoms
        if spec.object_rgba is not None:
            m.geom_rgba[v] = spec.object_rgba
            m.geom_matid[v] = -1  # a material (texture) would override the rgba
        else:
            m.geom_rgba[v] = self._orig_rgba
            m.geom_matid[v] = self._orig_matid

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, dict[str, Any]]:
        """One 20 Hz control step. ``done`` is True once ``spec.horizon`` steps were taken;
        ``info`` holds ``t`` (this step's index, from 0) and ``success`` (success_relative())."""
        if not self._started:
            raise EnvError(f"step() before reset() on scenario {self.spec.scenario_id}")
        if self.steps >= self.spec.horizon:
            raise EnvError(f"step() after the horizon ({self.spec.horizon}) on scenario {self.spec.scenario_id}")
        a = np.asarray(action, dtype=float)
        if a.shape != (ACTION_DIM,) or not np.all(np.isfinite(a)):
            raise ActionError(f"action must be {ACTION_DIM} finite floats, got {action!r}")
        try:
            obs, reward, _, _ = self._env.step(np.clip(a, -1.0, 1.0))
        except Exception as exc:
            raise EnvError(f"step {self.steps} failed on scenario {self.spec.scenario_id}: {exc!r}") from exc
        t = self.steps
        self.steps += 1
        if self._place_target is not None and not self._lifted:
            self._lifted = self.object_lift() >= LIFT_SUCCESS_HEIGHT_M
        done = self.steps >= self.spec.horizon
        return self._observe(obs), float(reward), done, {"t": t, "success": self.success_relative()}

    # -- external forces (used by producers.sim.perturb) ----------------------------------

    def object_bodies(self) -> dict[str, int]:
        """MuJoCo root body id of every task object and distractor, by name (object_names order)."""
        return {r.name: r.body_id for r in self._task_refs + self._distractor_refs}

    def surface_z(self) -> float:
        """Height (world, m) of the surface objects are placed on (table top, start bin floor)."""
        return self._env.surface_z()

    def placement_reference(self) -> np.ndarray:
        """The point placement ranges, distractor and place-target x/y are relative to (world, m)."""
        return self._env.placement_reference()

    def body_for(self, target: str) -> int:
        """MuJoCo body id of "object" (the manipulated object), "hand" or a distractor name."""
        if target == "object":
            return self._manip.body_id
        if target == "hand":
            return self._hand_body
        for ref in self._distractor_refs:
            if ref.name == target:
                return ref.body_id
        raise ValueError(f"unknown push target {target!r}: use 'object', 'hand' or one of "
                         f"{[r.name for r in self._distractor_refs]}")

    def set_external_force(self, body_id: int, force_xyz: np.ndarray, torque_xyz: np.ndarray | None = None) -> None:
        """World-frame force (N) and torque (N m) at the body's centre of mass until changed;
        cleared by every reset."""
        self.data.xfrc_applied[body_id, :3] = force_xyz
        self.data.xfrc_applied[body_id, 3:] = 0.0 if torque_xyz is None else torque_xyz

    def clear_external_forces(self) -> None:
        self.data.xfrc_applied[:] = 0.0

    # -- signals ------------------------------------------------------------------------

    def signals(self) -> dict[str, Any]:
        """This step's signals, plain JSON types, keys exactly SIGNAL_KEYS:

        eef_pos [3] m, eef_quat [4] xyzw, gripper_opening m between the finger pads,
        gripper_force N (normal force, finger geoms on the manipulated object),
        object_poses [{name, pos [3], quat [4] xyzw}] task objects then distractors,
        contacts [{a, b, normal_force}] summed per pair of groups (gripper, robot, table, object
        and distractor names; a < b; only pairs in contact), joint_torques [7] N m (arm actuator
        forces), joint_pos [7] rad, goal_distance m (see goal_distance()), object_lift m.
        """
        if not self._started:
            raise EnvError(f"signals() before reset() on scenario {self.spec.scenario_id}")
        return self._signals.read(self.model, self.data, goal_distance=self.goal_distance(),
                                  object_lift=self.object_lift())

    # -- task measures relative to the episode's own start --------------------------------

    def object_lift(self) -> float:
        """Manipulated object's height above its own start height, m."""
        z = self.data.xpos[self._manip.body_id][2]
        return float(z - self._start_pos[self.manipulated_name][2])

    def object_speed(self) -> float:
        """Linear speed of the manipulated object, m/s."""
        adr = self._manip.dof_adr
        return float(norm(self.data.qvel[adr:adr + 3]))

    @property
    def lifted(self) -> bool:
        """Lift then place: whether the object has been LIFT_SUCCESS_HEIGHT_M above its start
        this episode (False in every other scenario)."""
        return self._lifted

    def _fingers_touch(self, body_root: int) -> bool:
        d = self.data
        n = d.ncon
        for i in range(n):
            a, b = int(d.contact.geom1[i]), int(d.contact.geom2[i])
            if a in self._finger_geoms and self.model.body_rootid[self.model.geom_bodyid[b]] == body_root:
                return True
            if b in self._finger_geoms and self.model.body_rootid[self.model.geom_bodyid[a]] == body_root:
                return True
        return False

    def _touching(self, root_a: int, root_b: int) -> bool:
        m, d = self.model, self.data
        for i in range(d.ncon):
            ra = m.body_rootid[m.geom_bodyid[d.contact.geom1[i]]]
            rb = m.body_rootid[m.geom_bodyid[d.contact.geom2[i]]]
            if (ra == root_a and rb == root_b) or (ra == root_b and rb == root_a):
                return True
        return False

    def _stack_target(self) -> np.ndarray:
        env = self._env
        a, b = self._task_refs
        top = self.data.xpos[b.body_id].copy()
        top[2] += float(env.cubeB.size[2]) + float(env.cubeA.size[2])
        return top

    def goal_pos(self) -> np.ndarray:
        """Where the manipulated object's centre should end up (world, m); also obs["goal_pos"].

        Lift: LIFT_SUCCESS_HEIGHT_M above its start position; lift then place: the place target
        (placement reference + place_target_xy) at the object's start height.
        Stack: resting centred on cubeB, cubeB as it is now.
        PickPlaceCan: the centre of the can's target bin quadrant, at the height the can rested
        at in the start bin (both bins' floors are at the same height).
        """
        name = self.spec.env_name
        start = self._start_pos[self.manipulated_name]
        if name == "Lift":
            if self._place_target is not None:
                return np.array([self._place_target[0], self._place_target[1], start[2]])
            return start + np.array([0.0, 0.0, LIFT_SUCCESS_HEIGHT_M])
        if name == "Stack":
            return self._stack_target()
        return np.array([self._bin_target[0], self._bin_target[1],
                         start[2] - float(self._env.bin1_pos[2]) + self._bin_z])

    def goal_distance(self) -> float:
        """Distance to the goal, m, 0 when reached.

        Lift: max(0, LIFT_SUCCESS_HEIGHT_M - object_lift) (height still to gain).
        Lift then place: the path still to go along lift, carry, put down: before the lift
        (LIFT_SUCCESS_HEIGHT_M - lift) + LIFT_SUCCESS_HEIGHT_M + horizontal distance to the target;
        after it |lift| + horizontal distance. Continuous where the lift completes, and shrinking
        along a lift, a carry and a descent.
        Stack, PickPlaceCan: from the manipulated object's centre to goal_pos().
        """
        if self.spec.env_name == "Lift":
            if self._place_target is not None:
                pos = self.data.xpos[self._manip.body_id]
                xy = float(norm(pos[:2] - self._place_target))
                lift = self.object_lift()
                if self._lifted:
                    return abs(lift) + xy
                return max(0.0, LIFT_SUCCESS_HEIGHT_M - lift) + LIFT_SUCCESS_HEIGHT_M + xy
            return max(0.0, LIFT_SUCCESS_HEIGHT_M - self.object_lift())
        return float(norm(self.data.xpos[self._manip.body_id] - self.goal_pos()))

    def success_relative(self) -> bool:
        """Task success measured against the episode's own start, not absolute heights.

        Lift: the cube is >= LIFT_SUCCESS_HEIGHT_M above its own start height (robosuite's check
        is "above table + 4 cm", which a cube scaled up 2x passes while lying on the table).
        Lift then place: the cube was lifted (see ``lifted``) and now rests at the place target:
        centre within PLACE_XY_TOL_M of it horizontally, within PLACE_Z_TOL_M of its start height,
        slower than PLACE_REST_SPEED_M_S, no finger touching it.
        Stack: cubeA rests on cubeB: touching it, its bottom within STACK_Z_TOL_M of cubeB's top,
        its centre within cubeB's half-size horizontally, and no finger touching cubeA (released).
        PickPlaceCan: the can is inside its target bin quadrant (x, y), below BIN_MAX_HEIGHT_M
        above the bin base (resting, not hovering), and no finger touches it (released).
        """
        if not self._started:
            return False
        name = self.spec.env_name
        d = self.data
        if name == "Lift":
            if self._place_target is not None:
                return self._placed()
            return self.object_lift() >= LIFT_SUCCESS_HEIGHT_M
        if name == "Stack":
            a, b = self._task_refs
            pa, pb = d.xpos[a.body_id], d.xpos[b.body_id]
            env = self._env
            half_a, half_b = float(env.cubeA.size[2]), float(env.cubeB.size[2])
            on_top = abs((pa[2] - half_a) - (pb[2] + half_b)) <= STACK_Z_TOL_M
            centred = bool(np.all(np.abs(pa[:2] - pb[:2]) <= STACK_XY_FRACTION * float(env.cubeB.size[0])))
            return bool(on_top and centred and self._touching(a.body_id, b.body_id)
                        and not self._fingers_touch(a.body_id))
        pos = d.xpos[self._manip.body_id]
        inside = bool(np.all(pos[:2] > self._bin_low) and np.all(pos[:2] < self._bin_high))
        low = self._bin_z < pos[2] < self._bin_z + BIN_MAX_HEIGHT_M
        return bool(inside and low and not self._fingers_touch(self._manip.body_id))

    def _placed(self) -> bool:
        if not self._lifted:
            return False
        pos = self.data.xpos[self._manip.body_id]
        return bool(float(norm(pos[:2] - self._place_target)) <= PLACE_XY_TOL_M
                    and abs(self.object_lift()) <= PLACE_Z_TOL_M
                    and self.object_speed() <= PLACE_REST_SPEED_M_S
                    and not self._fingers_touch(self._manip.body_id))

    def robosuite_success(self) -> bool:
        """robosuite's own _check_success(), for comparison (absolute heights)."""
        return bool(self._env._check_success())

    # -- keyframes ----------------------------------------------------------------------

    def render_keyframe(self, size: int = 128, camera: str = KEYFRAME_CAMERA) -> np.ndarray:
        """An offscreen RGB frame, uint8 (size, size, 3), via mujoco.Renderer (not robosuite's
        camera observations). Shadows, reflections and skybox off; collision geoms hidden."""
        if not self.keyframes:
            raise KeyframeError(f"scenario {self.spec.scenario_id}: env built without keyframes=True")
        if not self._started:
            raise KeyframeError(f"render_keyframe() before reset() on scenario {self.spec.scenario_id}")
        if isinstance(size, bool) or not isinstance(size, int) or not 16 <= size <= 1024:
            raise ValueError(f"keyframe size must be an int in [16, 1024], got {size!r}")
        if self._renderer is None or self._renderer.height != size:
            self._close_renderer()
            try:
                self._renderer = mujoco.Renderer(self.model, size, size)
            except Exception as exc:
                raise KeyframeError(f"cannot create an offscreen renderer (MUJOCO_GL="
                                    f"{os.environ.get('MUJOCO_GL')!r}): {exc!r}") from exc
            _track_renderer(self)
            flags = self._renderer.scene.flags
            flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
            flags[mujoco.mjtRndFlag.mjRND_SKYBOX] = 0
            self._scene_option = mujoco.MjvOption()
            self._scene_option.geomgroup[0] = 0
        try:
            self._renderer.update_scene(self.data, camera=camera, scene_option=self._scene_option)
            return self._renderer.render().copy()
        except Exception as exc:
            raise KeyframeError(f"render failed on scenario {self.spec.scenario_id}: {exc!r}") from exc

    def _close_renderer(self) -> None:
        if self._renderer is not None:
            try:
                self._renderer.close()
            except Exception:  # EGL teardown errors at close carry no information for us
                pass
            self._renderer = None

    def close(self) -> None:
        """Frees the renderer and the robosuite env."""
        self._close_renderer()
        self._env.close()


# Envs holding a renderer are closed at exit before EGL's own teardown, which mujoco registers
# with atexit when it creates the first context; atexit runs handlers last-in first-out, so ours
# is registered after that. Otherwise the renderers' __del__ prints an EGLError traceback.
_LIVE_RENDERERS: weakref.WeakSet[SimEnv] = weakref.WeakSet()
_cleanup_registered = False


def _close_renderers() -> None:
    for env in list(_LIVE_RENDERERS):
        env._close_renderer()


def _track_renderer(env: SimEnv) -> None:
    global _cleanup_registered
    _LIVE_RENDERERS.add(env)
    if not _cleanup_registered:
        atexit.register(_close_renderers)
        _cleanup_registered = True


def make_env(spec: ScenarioSpec, *, keyframes: bool = False) -> SimEnv:
    """Builds the headless env for ``spec`` (1-3 s). ``keyframes=True`` enables render_keyframe()."""
    robosuite_arithmetic.install()  # again: building an env may import robosuite modules first used now
    return SimEnv(spec, keyframes=keyframes)
