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
camera observations (cameras cost 10x a step); keyframes and VLA images come from our own GL
context (frames.py: one per env, for every size), only when asked for, and only the env being
rolled out keeps one (``_hold_gl``). Resets are soft (hard_reset=False: the compiled model stays,
so the scenario's model edits and the GL context stay valid).

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

import ctypes
import os
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")  # before mujoco is first imported: headless frames

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from producers import robosuite_arithmetic  # noqa: E402
from producers.fixed_order import dot, norm  # noqa: E402
from producers.libero.bddl import distractor_bddl  # noqa: E402
from producers.libero.exceptions import LiberoEnvError, LiberoSetupMissing  # noqa: E402
from producers.libero.frames import Frames  # noqa: E402
from producers.libero.model_edits import ModelEdits  # noqa: E402
from producers.libero.model_index import ModelIndex  # noqa: E402
from producers.libero.tasks import TaskCatalog, TaskInfo  # noqa: E402
from producers.step_signals import SIGNAL_KEYS as SIGNAL_KEYS  # noqa: E402 (re-exported: the keys of signals())
from schemas.exceptions import LiberoScenarioError  # noqa: E402
from schemas.libero_scenario import LiberoScenario, parse_perturbation  # noqa: E402

CONTROL_FREQ_HZ = 20
ACTION_DIM = 7
# openpi's LIBERO example: wait this many steps with the gripper open after setting the init state.
SETTLE_STEPS = 10
LIBERO_DUMMY_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
# Where `sepa-eval libero setup` writes LIBERO's config.yaml inside the venv (LiberoVenv.config_dir).
VENV_CONFIG_DIR = "libero-config"
# LIBERO's On(obj, other) holds when obj's centre is within this of other's, horizontally.
ON_XY_TOLERANCE_M = 0.03
# LIBERO's in_box lowers a region's floor by this much.
IN_BOX_FLOOR_SLACK_M = 0.01
KEYFRAME_CAMERA = "agentview"
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


class LiberoEnv(ModelIndex, ModelEdits):
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
        self._frames: Frames | None = None
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
        if camera not in self.camera_names:
            raise LiberoEnvError(f"scenario {self.spec.scenario_id} has no camera {camera!r}; its cameras: "
                                 f"{', '.join(self.camera_names)}")
        if self._frames is None:
            _hold_gl(self)
            try:
                self._frames = Frames(self.model)
                _register_cleanup()
            except Exception as exc:
                raise LiberoEnvError(f"cannot create an offscreen renderer (MUJOCO_GL="
                                     f"{os.environ.get('MUJOCO_GL')!r}): {exc!r}") from exc
        if self._scene_option is None:
            self._scene_option = mujoco.MjvOption()
            self._scene_option.geomgroup[0] = 0  # collision geoms hidden, as robosuite renders them
        if size > self._frames.max_size:
            raise LiberoEnvError(f"scenario {self.spec.scenario_id}: frame size {size} exceeds its offscreen "
                                 f"buffer ({self._frames.max_size} px)")
        camera_id = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        return self._frames.render(self.data, camera_id, size, self._scene_option)

    @property
    def camera_names(self) -> tuple[str, ...]:
        """The scene's cameras, by the names render_keyframe and RolloutRequested.cameras take."""
        return tuple(self.model.camera(i).name for i in range(self.model.ncam))

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

    def close_frames(self) -> None:
        if self._frames is not None:
            try:
                self._frames.close()
            except Exception:  # EGL teardown errors at close carry no information for us
                pass
            self._frames = None

    def close(self) -> None:
        self.close_frames()
        try:
            self._wrapper.env.close()
        except Exception:
            pass
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        _return_freed_memory()


def _return_freed_memory() -> None:
    """Hands the heap a closed env freed back to the OS. glibc keeps it mapped otherwise, and a pool
    process that builds env after env (a sweep of many scenarios) grew to 5.6 GB resident with three
    envs live and was killed for memory; with the trim it holds what its live envs need (measured:
    back to 1.1 GB once every env is closed). A no-op off glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


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
        env.close_frames()


def _hold_gl(env: LiberoEnv) -> None:
    """Frees the GL context of every other env of this process before ``env`` makes one.

    A GL context holds the scene's textures in host memory (headless EGL renders on the CPU):
    about 500 MB for a LIBERO scene, measured. With three cached envs, each with a context per
    frame size (keyframes, a pixel policy's images), a pool process reached 4.8 GB, and one at
    5.4 GB was killed for memory. Only the env being rolled out renders, so one context is enough;
    making it again takes about a second, against tens of seconds per pixel-policy episode.
    """
    freed = False
    for other in list(_LIVE):
        if other is not env and other._frames is not None:
            other.close_frames()
            freed = True
    if freed:
        _return_freed_memory()
