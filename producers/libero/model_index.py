"""LiberoEnv's index of the compiled MuJoCo model: which bodies are the target, the other objects
and the fixtures, the contact groups (producers/step_signals.py) and the goal's region or object.
Apart from producers/libero/env.py to keep that module small; LiberoEnv takes it as the ModelIndex
mixin. Imported through env.py, which sets MUJOCO_GL before mujoco is first imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from producers.libero.bddl import distractor_name
from producers.libero.exceptions import LiberoEnvError
from producers.step_signals import OBJECT_GROUP, StepSignals


@dataclass(frozen=True)
class _Obj:
    name: str
    body: int
    qpos: int  # free joint: qpos[adr:adr+3] position, [adr+3:adr+7] wxyz; -1: a fixture (no free joint)
    qvel: int


class ModelIndex:
    """Builds LiberoEnv's index at construction (``_index_model``). LiberoEnv provides ``raw``,
    ``model``, ``info``, ``spec`` and ``_distractors``."""

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
