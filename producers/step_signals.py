"""The Step schema's per-step signals, read from raw MuJoCo: what producers/sim/envs.py (robosuite
1.5) and producers/libero/env.py (LIBERO, robosuite 1.4) share.

    signals = StepSignals(model, gripper=gripper, robot_root_body=..., eef_site=..., arm_qpos=...,
                          arm_actuators=..., objects=[(name, root_body), ...], table=mask, target=name)
    signals.read(model, data, goal_distance=..., object_lift=...)   # dict with exactly SIGNAL_KEYS

Imports mujoco and numpy only (mj_name2id, mju_mat2Quat and mj_contactForce are the same in both
venvs' mujoco). What differs between the benchmarks stays in their envs: which robosuite
attributes name the eef site and the arm's actuators, which bodies are the table, and the
task measures (goal_distance, object_lift).

Contact groups: GROUP_GRIPPER (the gripper's bodies), GROUP_ROBOT (the rest of the robot: arm and
mount), GROUP_TABLE (the bodies the env marks as static arena) and one group per object (every
body under its root body), by name; other bodies are not reported. ``contacts`` sums the normal
force of every contact per pair of groups; ``gripper_force`` the normal force of the finger geoms
on the target object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np

from producers.fixed_order import dot, norm

# The Avro Step record's per-step signal fields, in schema order.
SIGNAL_KEYS = ("eef_pos", "eef_quat", "gripper_opening", "gripper_force", "object_poses", "contacts",
               "joint_torques", "joint_pos", "goal_distance", "object_lift")

# Contact groups besides object names; their indices in ``group_names``, objects from OBJECT_GROUP.
GROUP_GRIPPER = "gripper"
GROUP_ROBOT = "robot"
GROUP_TABLE = "table"
OBJECT_GROUP = 3
NOT_REPORTED = -1


def quat_xyzw(wxyz) -> list[float]:
    return [float(wxyz[1]), float(wxyz[2]), float(wxyz[3]), float(wxyz[0])]


def geom_ids(m: mujoco.MjModel, names: Sequence[str]) -> np.ndarray:
    return np.array([mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_GEOM, n) for n in names], dtype=int)


class StepSignals:
    """The indices one env's signals are read at (the compiled model never changes: resets are
    soft), and the reading.

    ``gripper`` is robosuite's gripper model (``important_geoms``, ``root_body``); ``objects`` the
    (name, root body id) of every object, in signal order; ``table`` a bool per body: the static
    arena; ``target`` the object whose grip is ``gripper_force``. Attributes: ``geom_group`` (the
    group index of every geom), ``group_names``, ``target_group``, ``pads``, ``finger_geoms``."""

    def __init__(self, m: mujoco.MjModel, *, gripper: Any, robot_root_body: str, eef_site: int,
                 arm_qpos: np.ndarray, arm_actuators: np.ndarray, objects: Sequence[tuple[str, int]],
                 table: np.ndarray, target: str):
        self.eef_site, self.arm_qpos, self.arm_actuators = eef_site, arm_qpos, arm_actuators
        self.objects = list(objects)
        self.pads = geom_ids(m, gripper.important_geoms["left_fingerpad"] + gripper.important_geoms["right_fingerpad"])
        # The pads are boxes; the closing axis is the axis of their smallest half-size.
        self.pad_axis = int(np.argmin(m.geom_size[self.pads[0]]))
        self.pad_thickness = float(m.geom_size[self.pads[0]].min() + m.geom_size[self.pads[1]].min())
        fingers = gripper.important_geoms["left_finger"] + gripper.important_geoms["right_finger"]
        self.finger_geoms = geom_ids(m, fingers)
        self._is_finger = np.zeros(m.ngeom, dtype=bool)
        self._is_finger[self.finger_geoms] = True

        gripper_root = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, gripper.root_body)
        robot_root = int(m.body_rootid[mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, robot_root_body)])
        names = [GROUP_GRIPPER, GROUP_ROBOT, GROUP_TABLE]
        body_group = np.where(table, names.index(GROUP_TABLE), NOT_REPORTED)
        for b in range(m.nbody):
            if int(m.body_rootid[b]) == robot_root:
                a, in_gripper = b, False
                while a > 0:
                    if a == gripper_root:
                        in_gripper = True
                        break
                    a = int(m.body_parentid[a])
                body_group[b] = names.index(GROUP_GRIPPER) if in_gripper else names.index(GROUP_ROBOT)
        for name, body in self.objects:
            names.append(name)
            body_group[m.body_rootid == body] = len(names) - 1
        self.group_names = names
        self.target_group = OBJECT_GROUP + [name for name, _ in self.objects].index(target)
        self.geom_group = body_group[m.geom_bodyid]
        self._force_buf = np.zeros(6)

    def gripper_opening(self, d: mujoco.MjData) -> float:
        """Distance between the finger pads' inner faces, m."""
        p0, p1 = self.pads[0], self.pads[1]
        axis = d.geom_xmat[p0].reshape(3, 3)[:, self.pad_axis]
        pad_sep = abs(float(dot(d.geom_xpos[p0] - d.geom_xpos[p1], axis)))
        return max(0.0, pad_sep - self.pad_thickness)

    def pad_axis_world(self, d: mujoco.MjData) -> np.ndarray:
        """The fingers' closing direction in the world (unit vector)."""
        axis = d.geom_xmat[self.pads[0]].reshape(3, 3)[:, self.pad_axis]
        return axis / norm(axis)

    def contacts(self, m: mujoco.MjModel, d: mujoco.MjData) -> tuple[list[dict[str, Any]], float]:
        """(contacts [{a, b, normal_force}] summed per pair of groups, a < b, sorted; the fingers'
        normal force on the target, N)."""
        n = d.ncon
        if n == 0:
            return [], 0.0
        geom1, geom2 = d.contact.geom1[:n], d.contact.geom2[:n]
        g1, g2 = self.geom_group[geom1], self.geom_group[geom2]
        keep = np.flatnonzero((g1 >= 0) & (g2 >= 0) & (g1 != g2) & (d.contact.efc_address[:n] >= 0))
        agg: dict[tuple[int, int], float] = {}
        grip = 0.0
        tg, fingers, buf = self.target_group, self._is_finger, self._force_buf
        for i in keep.tolist():
            mujoco.mj_contactForce(m, d, i, buf)
            f = abs(float(buf[0]))
            a, b = int(g1[i]), int(g2[i])
            key = (a, b) if a < b else (b, a)
            agg[key] = agg.get(key, 0.0) + f
            if (a == tg and fingers[geom2[i]]) or (b == tg and fingers[geom1[i]]):
                grip += f
        names = self.group_names
        contacts = []
        for (a, b), f in agg.items():
            na, nb = sorted((names[a], names[b]))
            contacts.append({"a": na, "b": nb, "normal_force": f})
        contacts.sort(key=lambda c: (c["a"], c["b"]))
        return contacts, grip

    def read(self, m: mujoco.MjModel, d: mujoco.MjData, *, goal_distance: float,
             object_lift: float) -> dict[str, Any]:
        """This step's signals, plain JSON types, keys exactly SIGNAL_KEYS in that order: eef_pos
        [3] m, eef_quat [4] xyzw, gripper_opening m, gripper_force N, object_poses [{name, pos [3],
        quat [4] xyzw}] in ``objects`` order, contacts, joint_torques N m (the arm's actuator
        forces), joint_pos rad, and the env's goal_distance m and object_lift m."""
        quat = np.empty(4)
        mujoco.mju_mat2Quat(quat, d.site_xmat[self.eef_site])
        contacts, grip = self.contacts(m, d)
        poses = [{"name": name, "pos": d.xpos[body].tolist(), "quat": quat_xyzw(d.xquat[body])}
                 for name, body in self.objects]
        return {
            "eef_pos": d.site_xpos[self.eef_site].tolist(),
            "eef_quat": quat_xyzw(quat),
            "gripper_opening": self.gripper_opening(d),
            "gripper_force": grip,
            "object_poses": poses,
            "contacts": contacts,
            "joint_torques": d.actuator_force[self.arm_actuators].tolist(),
            "joint_pos": d.qpos[self.arm_qpos].tolist(),
            "goal_distance": goal_distance,
            "object_lift": object_lift,
        }
