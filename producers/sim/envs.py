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
each. ``step`` goes through _LeanControlStep (producers/sim/lean_step.py), which makes the same
MuJoCo calls and does the same arithmetic without robosuite's per-substep overhead, the arithmetic
compiled (producers/sim/osc_substep.py): about 3x the steps/s of robosuite's own step, with bit-identical
results (tests/unit/producers/sim/test_sim_lean_step.py compares the two). Both run the fixed-order
arithmetic producers/robosuite_arithmetic.py installs into robosuite on import, so an episode is
the same on every machine, whichever BLAS kernel numpy picked.
``robosuite_env.lean_step = False`` runs robosuite's stock step.

Tasks: the robosuite task classes and each task's goal and success are producers/sim/tasks.py's.
Tasks beyond robosuite's own: lift then place (``spec.place_target_xy``, Lift only): the goal is
the target on the table and success is the cube lifted first, then resting there, released (see
_Lift.success_relative there); lift and hold (``spec.success_hold_steps``) is the rollout's
business (producers/sim/rollout.py): the env reports success per step, the episode ends once it
held.

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

from producers import robosuite_arithmetic
from producers.fixed_order import norm
from producers.sim.exceptions import ActionError, EnvError, KeyframeError
from producers.sim.lean_step import _LeanControlStep as _LeanControlStep  # re-exported for test_sim_lean_step.py only
from producers.sim.tasks import (
    _ENV_CLASSES,
    LIFT_SUCCESS_HEIGHT_M,
    PLACE_REST_SPEED_M_S,
    PLACE_XY_TOL_M,
    PLACE_Z_TOL_M,
)
from producers.step_signals import OBJECT_GROUP, StepSignals
from producers.step_signals import SIGNAL_KEYS as SIGNAL_KEYS  # re-exported: the keys of SimEnv.signals()
from schemas.scenario import OBJECT_GEOM_PRIORITY, ScenarioSpec

# robosuite's BLAS arithmetic replaced by fixed-order arithmetic, so an episode is the same on every
# machine (producers/robosuite_arithmetic.py).
robosuite_arithmetic.install()

CONTROL_FREQ_HZ = 20
ACTION_DIM = 7
# Control steps run with a hold action after each reset, before the start pose is recorded.
SETTLE_STEPS = 5
# Keyframes: camera and render options (shadows, reflections, skybox off, collision geoms hidden).
KEYFRAME_CAMERA = "agentview"

# SIGNAL_KEYS and the contact groups are producers/step_signals.py's, shared with LIBERO ("table"
# here: the table, bins and floor, every static arena body).


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
        self._renderers: dict[int, mujoco.Renderer] = {}  # by frame size: keyframes and camera frames differ
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
        env.index_goal(self)  # what the task's goal needs (PickPlaceCan: its target bin)

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
        """Where the manipulated object's centre should end up (world, m): the task's goal_pos hook (tasks.py)."""
        return self._env.goal_pos(self)

    def goal_distance(self) -> float:
        """Distance to the goal, m, 0 when reached: the task's goal_distance hook (producers/sim/tasks.py)."""
        return self._env.goal_distance(self)

    def success_relative(self) -> bool:
        """Success measured from the episode's start (False before reset): the task's success_relative hook."""
        if not self._started:
            return False
        return self._env.success_relative(self)

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
        if camera not in self.camera_names:
            raise KeyframeError(f"scenario {self.spec.scenario_id} has no camera {camera!r}; its cameras: "
                                f"{', '.join(self.camera_names)}")
        renderer = self._renderers.get(size)
        if renderer is None:
            try:
                renderer = self._renderers[size] = mujoco.Renderer(self.model, size, size)
            except Exception as exc:
                raise KeyframeError(f"cannot create an offscreen renderer (MUJOCO_GL="
                                    f"{os.environ.get('MUJOCO_GL')!r}): {exc!r}") from exc
            _track_renderer(self)
            flags = renderer.scene.flags
            flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
            flags[mujoco.mjtRndFlag.mjRND_SKYBOX] = 0
        if self._scene_option is None:
            self._scene_option = mujoco.MjvOption()
            self._scene_option.geomgroup[0] = 0
        try:
            renderer.update_scene(self.data, camera=camera, scene_option=self._scene_option)
            return renderer.render().copy()
        except Exception as exc:
            raise KeyframeError(f"render failed on scenario {self.spec.scenario_id}: {exc!r}") from exc

    @property
    def camera_names(self) -> tuple[str, ...]:
        """The scene's cameras, by the names render_keyframe and RolloutRequested.cameras take."""
        return tuple(self.model.camera(i).name for i in range(self.model.ncam))

    def _close_renderer(self) -> None:
        for renderer in self._renderers.values():
            try:
                renderer.close()
            except Exception:  # EGL teardown errors at close carry no information for us
                pass
        self._renderers.clear()

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
