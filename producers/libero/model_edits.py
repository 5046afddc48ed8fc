"""LiberoEnv's edits of the compiled MuJoCo model from a scenario's perturbations: materials
(friction, mass, colour), cameras and lights, set from the model's saved defaults, and the layout
perturbations and distractor positions applied to the init state. Apart from
producers/libero/env.py to keep that module small; LiberoEnv takes them as the ModelEdits mixin.
Imported through env.py, which sets MUJOCO_GL before mujoco is first imported.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np

from producers.libero.bddl import distractor_name, park_xy
from producers.libero.exceptions import LiberoEnvError
from producers.libero.model_index import _Obj
from schemas.exceptions import LiberoScenarioError
from schemas.libero_scenario import TARGET

# Geom priority given to an object whose friction is set (MuJoCo takes the max of two geoms'
# frictions unless one has a higher priority; the finger pads have friction 1-2).
OBJECT_GEOM_PRIORITY = 2


def _qmul_wxyz(a, b) -> np.ndarray:
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return np.array([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw])


def _zrot_wxyz(angle: float) -> np.ndarray:
    return np.array([math.cos(angle / 2), 0.0, 0.0, math.sin(angle / 2)])


def _xrot_wxyz(angle: float) -> np.ndarray:
    return np.array([math.cos(angle / 2), math.sin(angle / 2), 0.0, 0.0])


class ModelEdits:
    """The perturbations applied to LiberoEnv's model and state. LiberoEnv provides ``model``,
    ``data``, ``spec``, ``target``, ``object_names``, ``_perturb``, ``_init_states`` and the
    index (ModelIndex)."""

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
