"""Headless LIBERO environments built from a LiberoScenario, with the per-step signals of the Step
schema read from raw MuJoCo. Runs in the LIBERO venv (robosuite 1.4); see infra/libero_venv.py.

    env = LiberoEnv(spec, catalog, keyframes=False)
    obs = env.reset(seed=3)                        # init state (init_state_index + 3) % 50, settled
    obs, reward, done, info = env.step(action)     # action: 7 floats in [-1, 1]; info["success"]
    env.signals()                                  # dict with exactly SIGNAL_KEYS, same units as robosuite's
    env.success_relative()                         # LIBERO's own goal check after the last step
    env.render_keyframe(128)                       # uint8 HxWx3 (keyframes=True)
    env.camera_images(256)                         # (agentview, wrist) upright uint8 frames

The same BenchmarkEnv surface as producers/sim/envs.py SimEnv (producers/adapters.py), so the
rollout loop (producers/episode.py, with LIBERO's success rule in rollout.py) and the recorder
treat both alike.

Control: LIBERO's own ControlEnv (robosuite 1.4 Panda, OSC_POSE deltas: action[0:3] x 0.05 m,
action[3:6] x 0.5 rad, action[6] gripper -1 open / +1 close, 20 Hz), built with no renderer and no
camera observations (cameras cost 10x a step); keyframes and VLA images come from our own
mujoco.Renderer, only when asked for. Resets are soft (hard_reset=False: the compiled model stays,
so the scenario's model edits and the renderer stay valid).

An episode: ``reset(seed)`` seeds numpy's global generator (LIBERO's samplers draw from it),
resets, sets the stored init state ``spec.init_state_for(seed)``, applies the layout
perturbations, and runs SETTLE_STEPS steps of LIBERO_DUMMY_ACTION (what openpi's LIBERO example
does: "the simulator drops objects and we need to wait for them to fall"); those steps are not
part of the episode. Then the start poses the relative measures use are recorded.

Signals (the contract of producers/sim/envs.py SimEnv.signals()): the target object is the first
object argument of the task's goal predicate and comes first in ``object_poses``, then the other
objects of interest, then every other movable object, then distractors. Contact groups:
"gripper" (the gripper's bodies), "robot" (the arm and its mount), "table" (the floor, the table,
every fixture and the world) and one group per movable object, by instance name.
``goal_distance`` for ``(In obj region)`` (and ``(On obj region)``): the distance (m) from the
target's centre to the region's box as LIBERO's ``in_box`` tests it (0 inside); for ``(On obj other)``: how far the
target still is from resting over the other's centre (horizontal excess over LIBERO's 3 cm,
plus height below it); other goals: 0 when LIBERO's check holds, else the hand's distance to the
target.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")  # before mujoco is first imported: headless frames

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from producers import robosuite_arithmetic  # noqa: E402
from producers.fixed_order import dot, norm  # noqa: E402
from producers.libero.exceptions import LiberoEnvError, LiberoSetupMissing  # noqa: E402
from producers.libero.tasks import TaskCatalog, TaskInfo  # noqa: E402
from producers.step_signals import OBJECT_GROUP, StepSignals  # noqa: E402
from producers.step_signals import SIGNAL_KEYS as SIGNAL_KEYS  # noqa: E402 (re-exported: the keys of signals())
from schemas.exceptions import LiberoScenarioError  # noqa: E402
from schemas.libero_scenario import TARGET, LiberoScenario, parse_perturbation  # noqa: E402

CONTROL_FREQ_HZ = 20
ACTION_DIM = 7
# openpi's LIBERO example: wait this many steps with the gripper open after setting the init state.
SETTLE_STEPS = 10
LIBERO_DUMMY_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
# Geom priority given to an object whose friction is set (MuJoCo takes the max of two geoms'
# frictions unless one has a higher priority; the finger pads have friction 1-2).
OBJECT_GEOM_PRIORITY = 2
# Where `sepa-eval libero setup` writes LIBERO's config.yaml inside the venv (LiberoVenv.config_dir).
VENV_CONFIG_DIR = "libero-config"
# LIBERO's On(obj, other) holds when obj's centre is within this of other's, horizontally.
ON_XY_TOLERANCE_M = 0.03
# LIBERO's in_box lowers a region's floor by this much.
IN_BOX_FLOOR_SLACK_M = 0.01
KEYFRAME_CAMERA = "agentview"
# Distractor instances are named <category>_<n> (LIBERO's naming; its parser needs the suffix),
# numbered from here so they never clash with a task's own instances.
DISTRACTOR_INDEX_BASE = 91
DISTRACTOR_PARK_XY = (0.42, -0.42)
DISTRACTOR_PARK_STEP_M = 0.14
WRIST_CAMERA = "robot0_eye_in_hand"

# SIGNAL_KEYS and the contact groups are producers/step_signals.py's, shared with robosuite ("table"
# here: the world, the floor, the tables and every fixture).


def _libero():
    """LIBERO's env wrapper module, or a clear error outside the LIBERO venv."""
    config = os.environ.get("LIBERO_CONFIG_PATH")
    if not config and (Path(sys.prefix) / VENV_CONFIG_DIR / "config.yaml").exists():
        # Run by hand with the LIBERO venv's python (`<venv>/bin/python -m producers.libero.bench`):
        # the venv's own config, as its workers get it from infra/libero_venv.py.
        config = os.environ["LIBERO_CONFIG_PATH"] = str(Path(sys.prefix) / VENV_CONFIG_DIR)
        os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    if not config or not (Path(config) / "config.yaml").exists():
        raise LiberoSetupMissing("LIBERO_CONFIG_PATH does not point at a directory with config.yaml: run in the "
                                 "LIBERO venv (sepa-eval libero setup), whose workers set it")
    try:
        from libero.libero.envs import env_wrapper
        from libero.libero.envs.objects import get_object_dict
    except ImportError as exc:
        raise LiberoSetupMissing(f"LIBERO is not importable here ({exc}); run in the LIBERO venv") from exc
    # robosuite 1.4's and LIBERO's BLAS arithmetic replaced by fixed-order arithmetic, so an episode
    # is the same on every machine (producers/robosuite_arithmetic.py)
    robosuite_arithmetic.install()
    return env_wrapper, get_object_dict


def libero_package_dir() -> Path:
    """<site-packages>/libero/libero of the running venv (without importing LIBERO)."""
    import importlib.util

    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        raise LiberoSetupMissing("the libero package is not installed here; run in the LIBERO venv")
    return Path(next(iter(spec.submodule_search_locations))) / "libero"


def simulator_versions() -> str:
    """What EpisodeStarted.simulator records, e.g. 'libero 0.1.1, robosuite 1.4.1, mujoco 3.3.2'."""
    from importlib.metadata import version

    return f"libero {version('libero')}, robosuite {version('robosuite')}, mujoco {mujoco.__version__}"


def _qmul_wxyz(a, b) -> np.ndarray:
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return np.array([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw])


def _zrot_wxyz(angle: float) -> np.ndarray:
    return np.array([math.cos(angle / 2), 0.0, 0.0, math.sin(angle / 2)])


def _xrot_wxyz(angle: float) -> np.ndarray:
    return np.array([math.cos(angle / 2), math.sin(angle / 2), 0.0, 0.0])


@dataclass(frozen=True)
class _Obj:
    name: str
    body: int
    qpos: int  # free joint: qpos[adr:adr+3] position, [adr+3:adr+7] wxyz; -1: a fixture (no free joint)
    qvel: int


def _section_span(text: str, head: str) -> tuple[int, int]:
    """[start, end) of the parenthesised BDDL section that opens with ``head`` (e.g. "(:objects")."""
    start = text.find(head)
    if start < 0:
        raise LiberoScenarioError(f"the task's BDDL has no {head} section")
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return start, i + 1
    raise LiberoScenarioError(f"the task's BDDL {head} section is not closed")


def park_xy(index: int) -> tuple[float, float]:
    """Where distractor ``index`` is placed when the scene is sampled (workspace frame, m): a corner
    no task region uses, so LIBERO's rejection sampler always finds room; reset() then moves it to
    its scenario position (the stored init states fix every other object anyway)."""
    return DISTRACTOR_PARK_XY[0], DISTRACTOR_PARK_XY[1] + DISTRACTOR_PARK_STEP_M * index


def distractor_bddl(text: str, objects: dict[str, str], categories: list[str]) -> str:
    """The task's BDDL with one movable object per category added, each resting in a 2 mm region
    at its park_xy() of the task's workspace (the target of its first region). ``objects`` is the
    task's instance -> category map; the objects section is rewritten one line per category
    (LIBERO's parser keeps only the last line of a category)."""
    import re

    target = re.search(r"\(:target\s+([A-Za-z0-9_]+)\)", text)
    if target is None:
        raise LiberoScenarioError("the task's BDDL has no region to place distractors relative to")
    workspace = target.group(1)
    regions, inits = [], []
    by_category: dict[str, list[str]] = {}
    for name, category in objects.items():
        by_category.setdefault(category, []).append(name)
    for i, category in enumerate(categories):
        x, y = park_xy(i)
        region = f"sepa_distractor_{i}_region"
        regions.append(f"      ({region}\n          (:target {workspace})\n          (:ranges (\n"
                       f"              ({x - 0.001!r} {y - 0.001!r} {x + 0.001!r} {y + 0.001!r})\n"
                       f"            )\n          )\n      )\n")
        by_category.setdefault(category, []).append(distractor_name(category, i))
        inits.append(f"    (On {distractor_name(category, i)} {workspace}_{region})\n")
    start, end = _section_span(text, "(:objects")
    lines = "".join(f"    {' '.join(names)} - {category}\n" for category, names in by_category.items())
    text = text[:start] + "(:objects\n" + lines + "  )" + text[end:]

    def insert_after(section: str, body: str, src: str) -> str:
        at = src.find(section)
        if at < 0:
            raise LiberoScenarioError(f"the task's BDDL has no {section} section")
        line_end = src.find("\n", at) + 1
        return src[:line_end] + body + src[line_end:]

    text = insert_after("(:regions", "".join(regions), text)
    return insert_after("(:init", "".join(inits), text)


def distractor_name(category: str, index: int) -> str:
    return f"{category}_{DISTRACTOR_INDEX_BASE + index}"


class LiberoEnv:
    """One LIBERO task environment for one scenario; reset it for each episode.

    Attributes: ``spec``, ``info`` (TaskInfo), ``steps``, ``target`` (target object name),
    ``object_names`` (signal order), ``action_dim`` (7), ``raw`` (LIBERO's problem env, for
    inspection)."""

    def __init__(self, spec: LiberoScenario, catalog: TaskCatalog | None = None, *, keyframes: bool = False):
        env_wrapper, get_object_dict = _libero()
        self.spec, self.keyframes = spec, keyframes
        self.catalog = catalog or TaskCatalog(libero_package_dir())
        self.info: TaskInfo = self.catalog.info(spec.suite, spec.env_name)
        self._init_states = self.catalog.init_states(spec.suite, spec.env_name)
        self._perturb = {parse_perturbation(k): v for k, v in spec.perturbations.items()}
        self._distractors = self._distractor_specs(get_object_dict())
        bddl = self.info.bddl_path
        self._tmp: tempfile.TemporaryDirectory | None = None
        if self._distractors:
            self._tmp = tempfile.TemporaryDirectory(prefix="sepa-libero-")
            bddl = Path(self._tmp.name) / self.info.bddl_path.name
            bddl.write_text(distractor_bddl(self.info.bddl_path.read_text(), self.info.objects,
                                            [c for c, *_ in self._distractors]))
        try:
            self._wrapper = env_wrapper.ControlEnv(
                bddl_file_name=str(bddl), robots=["Panda"], has_renderer=False, has_offscreen_renderer=False,
                use_camera_obs=False, ignore_done=True, hard_reset=False, control_freq=CONTROL_FREQ_HZ,
                horizon=spec.horizon + SETTLE_STEPS + 10)
        except Exception as exc:  # LIBERO / robosuite raise bare assertion and key errors
            raise LiberoEnvError(f"cannot build LIBERO task {spec.task} for scenario {spec.scenario_id}: "
                                 f"{exc!r}") from exc
        self.raw = self._wrapper.env
        self._renderers: dict[int, mujoco.Renderer] = {}
        self._scene_option: mujoco.MjvOption | None = None
        self._index_model()
        self._save_model_defaults()
        self.steps = 0
        self._started = False
        self._success = False
        self._start_pos: dict[str, np.ndarray] = {}
        self.placed_heights: dict[str, float] = {}  # objects' heights as placed, before settling
        _LIVE.add(self)

    # -- model indexing -------------------------------------------------------------------

    @property
    def model(self) -> mujoco.MjModel:
        return self.raw.sim.model._model

    @property
    def data(self) -> mujoco.MjData:
        return self.raw.sim.data._data

    @property
    def action_dim(self) -> int:
        return ACTION_DIM

    def _distractor_specs(self, object_dict: dict) -> list[tuple[str, float, float, float]]:
        cats: dict[str, dict[str, float]] = {}
        for p, v in self._perturb.items():
            if p.axis == "distractor":
                cats.setdefault(p.subject, {})[p.parameter] = v
        out = []
        for category in sorted(cats):
            if category not in object_dict:
                raise LiberoScenarioError(f"distractor {category!r} is not a LIBERO object category; known ones "
                                          f"include {sorted(object_dict)[:12]}...")
            c = cats[category]
            out.append((category, c["x_m"], c["y_m"], c.get("yaw_rad", 0.0)))
        return out

    def _free_object(self, name: str, root_body: str) -> _Obj:
        m = self.model
        body = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, root_body)
        jnt = int(m.body_jntadr[body])
        if body < 0 or jnt < 0 or m.jnt_type[jnt] != mujoco.mjtJoint.mjJNT_FREE:
            raise LiberoEnvError(f"object {name!r} of {self.spec.task} has no free joint")
        return _Obj(name, body, int(m.jnt_qposadr[jnt]), int(m.jnt_dofadr[jnt]))

    def _fixture(self, name: str) -> _Obj:
        """The fixture a goal names directly or through one of its regions (no free joint)."""
        raw = self.raw
        site = raw.object_sites_dict.get(name)
        owner = getattr(site, "parent_name", None) if site is not None else name
        if owner not in raw.obj_body_id:
            raise LiberoEnvError(f"the goal's target {name!r} of {self.spec.task} is neither an object nor a "
                                 f"fixture's region")
        return _Obj(owner, int(raw.obj_body_id[owner]), -1, -1)

    def _index_model(self) -> None:
        raw, m = self.raw, self.model
        info = self.info
        self.target = info.target
        movable = list(raw.objects_dict)
        distractor_names = [distractor_name(c, i) for i, (c, *_rest) in enumerate(self._distractors)]
        task_objects = [n for n in movable if n not in distractor_names]
        if self.target in movable:
            first = self._free_object(self.target, raw.objects_dict[self.target].root_body)
        else:  # an articulated goal (open a drawer, turn on a stove): the fixture that holds it
            first = self._fixture(self.target)
            self.target = first.name
        interest = [n for n in info.obj_of_interest if n in task_objects and n != self.target]
        order = [*interest, *[n for n in task_objects if n != self.target and n not in interest], *distractor_names]
        self._objs = [first, *[self._free_object(n, raw.objects_dict[n].root_body) for n in order]]
        order = [first.name, *order]
        self._by_name = {o.name: o for o in self._objs}
        self.object_names = tuple(order)
        robot = raw.robots[0]
        self._eef_site = int(robot.eef_site_id)
        # contact groups: every body that is neither robot nor object is the table (world, floor,
        # tables and fixtures)
        self._signals = StepSignals(m, gripper=robot.gripper, robot_root_body=robot.robot_model.root_body,
                                    eef_site=self._eef_site,
                                    arm_qpos=np.array(robot._ref_joint_pos_indexes, dtype=int),
                                    arm_actuators=np.array(robot._ref_joint_actuator_indexes, dtype=int),
                                    objects=[(o.name, o.body) for o in self._objs], table=np.ones(m.nbody, dtype=bool),
                                    target=first.name)
        self._group_names = self._signals.group_names
        self._geom_group = self._signals.geom_group
        self._obj_geoms = {o.name: np.flatnonzero(self._geom_group == OBJECT_GROUP + i)
                           for i, o in enumerate(self._objs)}
        self._obj_bodies = {o.name: np.flatnonzero(m.body_rootid == o.body) for o in self._objs}
        # the goal
        goal = info.goal[0] if info.goal else ()
        self._goal_kind, self._goal_site, self._goal_other = "other", None, None
        site_half = self._site_half(goal[2]) if len(goal) == 3 and goal[2] in raw.object_sites_dict else None
        if goal[:1] in (("in",), ("on",)) and site_half is not None:
            # In a region, or On a region (a stove's cook region): the region's box
            self._goal_kind, self._goal_site = "in", goal[2]
            self._goal_site_id = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_SITE, goal[2])
            self._goal_half = site_half
        elif len(goal) == 3 and goal[0] == "on" and goal[2] in raw.obj_body_id:
            self._goal_kind, self._goal_other = "on", int(raw.obj_body_id[goal[2]])

    def _site_half(self, name: str) -> np.ndarray | None:
        """Half extents (3) of a LIBERO region site, or None when it has no box size."""
        size = getattr(self.raw.object_sites_dict[name], "size", None)
        if isinstance(size, str):
            size = size.split()
        try:
            half = np.abs(np.asarray(size, dtype=float)).ravel()
        except (TypeError, ValueError):
            return None
        if mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, name) < 0:
            return None
        return half if half.shape == (3,) else None

    def _save_model_defaults(self) -> None:
        m = self.model
        self._orig = {"geom_friction": m.geom_friction.copy(), "geom_priority": m.geom_priority.copy(),
                      "body_mass": m.body_mass.copy(), "body_inertia": m.body_inertia.copy(),
                      "mat_rgba": m.mat_rgba.copy(), "geom_rgba": m.geom_rgba.copy(), "cam_pos": m.cam_pos.copy(),
                      "cam_quat": m.cam_quat.copy(), "light_pos": m.light_pos.copy(),
                      "light_diffuse": m.light_diffuse.copy(), "light_ambient": m.light_ambient.copy()}
        # full-state mapping: the stored init states do not know the distractors' joints
        self._state_map: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        if self._distractors:
            distractor_bodies = {self._by_name[distractor_name(c, i)].body for i, (c, *_r) in
                                 enumerate(self._distractors)}
            new_q, new_v = [], []
            for j in range(m.njnt):
                if int(m.body_rootid[m.jnt_bodyid[j]]) in distractor_bodies:
                    continue
                nq = 7 if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE else 4 if m.jnt_type[j] == 1 else 1
                nv = 6 if nq == 7 else 3 if nq == 4 else 1
                new_q.extend(range(int(m.jnt_qposadr[j]), int(m.jnt_qposadr[j]) + nq))
                new_v.extend(range(int(m.jnt_dofadr[j]), int(m.jnt_dofadr[j]) + nv))
            width = self._init_states.shape[1]
            if 1 + len(new_q) + len(new_v) != width:
                raise LiberoEnvError(f"{self.spec.task}: init states of width {width} do not map onto the model "
                                     f"with distractors ({len(new_q)} qpos, {len(new_v)} qvel)")
            self._state_map = (np.array(new_q), np.arange(len(new_q)), np.array(new_v),
                               np.arange(len(new_v)) + len(new_q))

    def _obj_for(self, subject: str) -> _Obj:
        name = self.target if subject == TARGET else subject
        if name not in self._by_name:
            raise LiberoScenarioError(f"scenario {self.spec.scenario_id}: {subject!r} is not an object of "
                                      f"{self.spec.task} (objects: {list(self.object_names)})")
        return self._by_name[name]

    def _restore_model(self) -> None:
        """The compiled model as built: every field a perturbation edits back at its default."""
        m, o = self.model, self._orig
        m.geom_friction[:] = o["geom_friction"]
        m.geom_priority[:] = o["geom_priority"]
        changed_mass = not np.array_equal(m.body_mass, o["body_mass"])
        m.body_mass[:] = o["body_mass"]
        m.body_inertia[:] = o["body_inertia"]
        if changed_mass:
            mujoco.mj_setConst(m, mujoco.MjData(m))
        m.mat_rgba[:] = o["mat_rgba"]
        m.geom_rgba[:] = o["geom_rgba"]
        m.cam_pos[:], m.cam_quat[:] = o["cam_pos"], o["cam_quat"]
        m.light_pos[:], m.light_diffuse[:], m.light_ambient[:] = o["light_pos"], o["light_diffuse"], o["light_ambient"]

    def _apply_model_edits(self, friction: bool = True) -> None:
        """Materials, mass, cameras and lights from the perturbations, set on the compiled model
        from its saved defaults (idempotent). ``friction=False`` leaves the frictions (and geom
        priorities) at their defaults: reset() sets them after the settle steps, because LIBERO's
        stored init states sink objects ~2 cm into the floor, and with the object's own contact
        parameters (what a higher geom priority selects) the solver throws them out violently."""
        m, o = self.model, self._orig
        self._restore_model()
        mass_changed = False
        for p, v in self._perturb.items():
            if p.axis == "material":
                obj = self._obj_for(p.subject)
                geoms = self._obj_geoms[obj.name]
                if p.parameter == "friction":
                    if not friction:
                        continue
                    collide = geoms[(m.geom_contype[geoms] != 0) | (m.geom_conaffinity[geoms] != 0)]
                    m.geom_friction[collide, 0] = v
                    m.geom_priority[collide] = OBJECT_GEOM_PRIORITY
                elif p.parameter == "mass_scale":
                    bodies = self._obj_bodies[obj.name]
                    m.body_mass[bodies] = o["body_mass"][bodies] * v
                    m.body_inertia[bodies] = o["body_inertia"][bodies] * v
                    mass_changed = True
                else:
                    channel = "rgb".index(p.parameter[-1])
                    mats = sorted({int(g) for g in m.geom_matid[geoms] if g >= 0})
                    if mats:
                        m.mat_rgba[mats, channel] = o["mat_rgba"][mats, channel] * v
                    m.geom_rgba[geoms, channel] = o["geom_rgba"][geoms, channel] * v
            elif p.axis == "camera":
                cam = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_CAMERA, p.subject)
                if cam < 0:
                    raise LiberoScenarioError(f"{self.spec.task} has no camera {p.subject!r}")
                if p.parameter.startswith("d"):
                    m.cam_pos[cam, "xyz".index(p.parameter[1])] += v
                elif p.parameter == "yaw_rad":
                    m.cam_quat[cam] = _qmul_wxyz(_zrot_wxyz(v), m.cam_quat[cam])
                else:
                    m.cam_quat[cam] = _qmul_wxyz(m.cam_quat[cam], _xrot_wxyz(v))
            elif p.axis == "light":
                if p.parameter == "diffuse_scale":
                    m.light_diffuse[:] = o["light_diffuse"] * v
                elif p.parameter == "ambient":
                    m.light_ambient[:] = np.clip(o["light_ambient"] + v, 0.0, 1.0)
                else:
                    m.light_pos[:, "xyz".index(p.parameter[1])] += v
        if mass_changed:
            mujoco.mj_setConst(m, mujoco.MjData(m))

    def _apply_layout(self) -> None:
        d = self.data
        for p, v in self._perturb.items():
            if p.axis != "layout":
                continue
            obj = self._obj_for(p.subject)
            if obj.qpos < 0:
                raise LiberoScenarioError(f"scenario {self.spec.scenario_id}: {obj.name} is a fixture; layout "
                                          f"perturbations move movable objects only")
            if p.parameter == "dx_m":
                d.qpos[obj.qpos] += v
            elif p.parameter == "dy_m":
                d.qpos[obj.qpos + 1] += v
            else:
                q = d.qpos[obj.qpos + 3:obj.qpos + 7]
                q[:] = _qmul_wxyz(_zrot_wxyz(v), q)
        for i, (category, x, y, yaw) in enumerate(self._distractors):
            obj = self._by_name[distractor_name(category, i)]
            px, py = park_xy(i)
            d.qpos[obj.qpos] += x - px
            d.qpos[obj.qpos + 1] += y - py
            q = d.qpos[obj.qpos + 3:obj.qpos + 7]
            q[:] = _qmul_wxyz(_zrot_wxyz(yaw), q)

    # -- episode ------------------------------------------------------------------------

    def reset(self, seed: int) -> dict[str, Any]:
        """Starts an episode that is a function of (spec, seed) alone (see the module docstring)."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**32:
            raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
        wrapper, raw = self._wrapper, self.raw
        state = self._init_states[self.spec.init_state_for(int(seed))]
        try:
            # LIBERO's reset computes with the model as it is: the last episode's edits must not be
            # part of it, or an episode would depend on the one before it (a floating-point trace
            # of it survives into the solver's state and grows over the episode)
            self._restore_model()
            np.random.seed(int(seed))  # LIBERO's placement samplers draw from numpy's global generator
            wrapper.reset()
            self._apply_model_edits(friction=False)
            if self._state_map is not None:
                full = raw.sim.get_state().flatten()
                new_q, old_q, new_v, old_v = self._state_map
                full[0] = state[0]
                full[1 + new_q] = state[1 + old_q]
                full[1 + self.model.nq + new_v] = state[1 + old_v]
                state = full
            wrapper.set_init_state(state)
            self._apply_layout()
            raw.sim.forward()
            self.placed_heights = {o.name: float(self.data.xpos[o.body][2]) for o in self._objs}
            for _ in range(SETTLE_STEPS):
                obs, _, _, _ = wrapper.step(np.asarray(LIBERO_DUMMY_ACTION))
            self._apply_model_edits(friction=True)
        except (LiberoScenarioError, ValueError):
            raise
        except Exception as exc:
            raise LiberoEnvError(f"reset failed for scenario {self.spec.scenario_id} seed {seed}: {exc!r}") from exc
        self.steps = 0
        self._started = True
        self._success = False
        self._start_pos = {o.name: self.data.xpos[o.body].copy() for o in self._objs}
        return self._observe(obs)

    def _observe(self, obs: dict[str, Any]) -> dict[str, Any]:
        """robosuite's observation dict, plus "goal_pos" (goal_pos()) and "privileged" (this env:
        what the privileged scripted policies and the openpi image layout read)."""
        obs["goal_pos"] = self.goal_pos()
        obs["privileged"] = self
        return obs

    def step(self, action) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """One 20 Hz control step. ``done`` once ``spec.horizon`` steps were taken; ``info`` holds
        ``t`` and ``success`` (LIBERO's own goal check, BDDLBaseDomain._check_success)."""
        if not self._started:
            raise LiberoEnvError(f"step() before reset() on scenario {self.spec.scenario_id}")
        if self.steps >= self.spec.horizon:
            raise LiberoEnvError(f"step() after the horizon ({self.spec.horizon}) on scenario {self.spec.scenario_id}")
        a = np.asarray(action, dtype=float)
        if a.shape != (ACTION_DIM,) or not np.all(np.isfinite(a)):
            raise ValueError(f"action must be {ACTION_DIM} finite floats, got {action!r}")
        try:
            obs, reward, done, _ = self._wrapper.step(np.clip(a, -1.0, 1.0))
        except Exception as exc:
            raise LiberoEnvError(f"step {self.steps} failed on scenario {self.spec.scenario_id}: {exc!r}") from exc
        t = self.steps
        self.steps += 1
        self._success = bool(done)  # LIBERO's step returns its goal check as done
        return self._observe(obs), float(reward), self.steps >= self.spec.horizon, {"t": t, "success": self._success}

    def success_relative(self) -> bool:
        """LIBERO's own goal check (its predicates are relative to the objects, not absolute heights)."""
        return self._started and self._success

    # -- signals ------------------------------------------------------------------------

    def signals(self) -> dict[str, Any]:
        """This step's signals, plain JSON types, keys exactly SIGNAL_KEYS (units as SimEnv's:
        m, N, N m, rad, quaternions xyzw)."""
        if not self._started:
            raise LiberoEnvError(f"signals() before reset() on scenario {self.spec.scenario_id}")
        return self._signals.read(self.model, self.data, goal_distance=self.goal_distance(),
                                  object_lift=self.object_lift())

    def object_lift(self) -> float:
        """The target's height above its own start height, m."""
        o = self._objs[0]
        return float(self.data.xpos[o.body][2] - self._start_pos[o.name][2])

    def goal_region(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(centre, half extents) in the world of the box LIBERO's in_box tests, for an In goal."""
        if self._goal_kind != "in":
            return None
        d = self.data
        centre = d.site_xpos[self._goal_site_id].copy()
        half = np.abs(dot(d.site_xmat[self._goal_site_id].reshape(3, 3), self._goal_half))
        return centre, half

    def goal_container(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(centre, half extents) now of the object holding the In region (the basket), or of the
        On goal's object; None for other goals."""
        if self._goal_kind == "in":
            parent = getattr(self.raw.object_sites_dict[self._goal_site], "parent_name", None)
            return self.object_extent(parent) if parent in self._by_name else None
        if self._goal_kind == "on":
            name = self.info.goal[0][2]
            return self.object_extent(name) if name in self._by_name else None
        return None

    def goal_pos(self) -> np.ndarray:
        """Where the target's centre should go (world, m): the In region's centre; the On
        object's centre; else the target's own position."""
        d = self.data
        if self._goal_kind == "in":
            return self.goal_region()[0]
        if self._goal_kind == "on":
            return d.xpos[self._goal_other].copy()
        return d.xpos[self._objs[0].body].copy()

    def goal_distance(self) -> float:
        """Distance to the goal, m, 0 when reached (see the module docstring)."""
        d = self.data
        pos = d.xpos[self._objs[0].body]
        if self._goal_kind == "in":
            centre, half = self.goal_region()
            lo, hi = centre - half, centre + half
            lo[2] -= IN_BOX_FLOOR_SLACK_M
            gap = np.maximum(0.0, np.maximum(lo - pos, pos - hi))
            return float(norm(gap))
        if self._goal_kind == "on":
            other = d.xpos[self._goal_other]
            xy = float(norm(pos[:2] - other[:2]))
            return max(0.0, xy - ON_XY_TOLERANCE_M) + max(0.0, float(other[2] - pos[2]))
        if self._success:
            return 0.0
        return float(norm(d.site_xpos[self._eef_site] - pos))

    # -- privileged geometry (scripted policies, feasibility) --------------------------------

    def object_extent(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(centre, half extents) in the world of an object's collision geoms' bounding box now."""
        m, d = self.model, self.data
        geoms = self._obj_geoms[name]
        geoms = geoms[(m.geom_contype[geoms] != 0) | (m.geom_conaffinity[geoms] != 0)]
        lo, hi = np.full(3, np.inf), np.full(3, -np.inf)
        signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=float)
        for g in geoms:
            centre, half = m.geom_aabb[g, :3], m.geom_aabb[g, 3:]
            corners = dot(centre + signs * half, d.geom_xmat[g].reshape(3, 3).T) + d.geom_xpos[g]
            lo, hi = np.minimum(lo, corners.min(0)), np.maximum(hi, corners.max(0))
        return (lo + hi) / 2, (hi - lo) / 2

    def object_footprint(self, name: str) -> np.ndarray:
        """The x/y corners (n, 2) of an object's collision geoms' boxes now, world, m."""
        m, d = self.model, self.data
        geoms = self._obj_geoms[name]
        geoms = geoms[(m.geom_contype[geoms] != 0) | (m.geom_conaffinity[geoms] != 0)]
        signs = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=float)
        pts = [dot(m.geom_aabb[g, :3] + signs * m.geom_aabb[g, 3:], d.geom_xmat[g].reshape(3, 3).T) + d.geom_xpos[g]
               for g in geoms]
        return np.concatenate(pts)[:, :2]

    def pad_axis_world(self) -> np.ndarray:
        """The fingers' closing direction in the world (unit vector)."""
        return self._signals.pad_axis_world(self.data)

    def object_speeds(self) -> dict[str, float]:
        """Linear speed (m/s) of every object's free joint."""
        d = self.data
        return {o.name: float(norm(d.qvel[o.qvel:o.qvel + 3])) for o in self._objs if o.qvel >= 0}

    def penetrations(self) -> list[tuple[str, str, float]]:
        """Contacts between objects (or an object and the table) deeper than 0: (a, b, depth m)."""
        d = self.data
        out = []
        for i in range(d.ncon):
            g1, g2 = int(self._geom_group[d.contact.geom1[i]]), int(self._geom_group[d.contact.geom2[i]])
            if g1 == g2 or min(g1, g2) < 2:
                continue
            dist = float(d.contact.dist[i])
            if dist < 0:
                out.append((self._group_names[g1], self._group_names[g2], -dist))
        return out

    # -- frames ---------------------------------------------------------------------------

    def _render(self, size: int, camera: str) -> np.ndarray:
        if isinstance(size, bool) or not isinstance(size, int) or not 16 <= size <= 1024:
            raise ValueError(f"frame size must be an int in [16, 1024], got {size!r}")
        renderer = self._renderers.get(size)
        if renderer is None:
            try:
                renderer = self._renderers[size] = mujoco.Renderer(self.model, size, size)
                _register_cleanup()
            except Exception as exc:
                raise LiberoEnvError(f"cannot create an offscreen renderer (MUJOCO_GL="
                                     f"{os.environ.get('MUJOCO_GL')!r}): {exc!r}") from exc
        if self._scene_option is None:
            self._scene_option = mujoco.MjvOption()
            self._scene_option.geomgroup[0] = 0  # collision geoms hidden, as robosuite renders them
        renderer.update_scene(self.data, camera=camera, scene_option=self._scene_option)
        return renderer.render().copy()

    def render_keyframe(self, size: int = 128, camera: str = KEYFRAME_CAMERA) -> np.ndarray:
        """An upright RGB frame, uint8 (size, size, 3)."""
        if not self.keyframes:
            raise LiberoEnvError(f"scenario {self.spec.scenario_id}: env built without keyframes=True")
        if not self._started:
            raise LiberoEnvError(f"render_keyframe() before reset() on scenario {self.spec.scenario_id}")
        return self._render(size, camera)

    def camera_images(self, size: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """(agent view, wrist view), upright uint8 frames: what a pixel policy sees."""
        return self._render(size, KEYFRAME_CAMERA), self._render(size, WRIST_CAMERA)

    def close(self) -> None:
        for r in self._renderers.values():
            try:
                r.close()
            except Exception:  # EGL teardown errors at close carry no information for us
                pass
        self._renderers.clear()
        try:
            self._wrapper.env.close()
        except Exception:
            pass
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


_LIVE: weakref.WeakSet[LiberoEnv] = weakref.WeakSet()
_cleanup_registered = False


def _register_cleanup() -> None:
    global _cleanup_registered
    if not _cleanup_registered:
        import atexit

        atexit.register(_close_all)
        _cleanup_registered = True


def _close_all() -> None:  # before EGL's own atexit teardown (registered when mujoco made a context)
    for env in list(_LIVE):
        for r in env._renderers.values():
            try:
                r.close()
            except Exception:
                pass
        env._renderers.clear()
