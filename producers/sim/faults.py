"""Policy faults for failure injection: wrappers that make any Policy fail in one known way.

    policy = PerceptionOffset(make_policy("oracle"), (0.08, 0.0, 0.0))   # grasps beside the cube
    policy = ReleaseWhenLifted(make_policy("oracle"), lift_m=0.06)             # lets go mid-air
    policy = FreezeAt(make_policy("oracle"), step=30)                          # stops moving at step 30

Each wrapper records in ``injected_at`` the control step at which it changed the behaviour
(None while it has not), so a labelled episode knows when its cause happened. Physical causes
(friction, mass, pushes, distractors, horizon) live in the ScenarioSpec and ``perturb.Push``; these
are the causes that live in the policy: what it believes and what it commands.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from producers.sim.policies import Policy
from schemas.scenario import ScenarioSpec

GRIPPER_INDEX = -1  # robosuite: the last action element commands the gripper
GRIP_OPEN = -1.0


class _Wrapper:
    def __init__(self, inner: Policy):
        self.inner = inner
        self.name = f"{type(self).__name__}({inner.name})"
        self.t = 0
        self.injected_at: int | None = None

    def reset(self, seed: int, spec: ScenarioSpec) -> None:
        self.t = 0
        self.injected_at = None
        self.inner.reset(seed, spec)

    def act(self, obs: dict[str, Any], signals: dict[str, Any]) -> np.ndarray:
        action = self._act(obs, signals)
        self.t += 1
        return action

    def _act(self, obs: dict[str, Any], signals: dict[str, Any]) -> np.ndarray:
        raise NotImplementedError


class PerceptionOffset(_Wrapper):
    """The policy sees the manipulated object (the first object pose) ``offset_xyz`` metres from
    where it is: a wrong belief held the whole episode. ``injected_at`` is 0."""

    def __init__(self, inner: Policy, offset_xyz: tuple[float, float, float]):
        super().__init__(inner)
        self.offset = tuple(float(v) for v in offset_xyz)

    def _act(self, obs, signals):
        if self.injected_at is None:
            self.injected_at = self.t
        seen = copy.copy(signals)
        poses = [dict(p) for p in signals["object_poses"]]
        if poses:
            pos = list(poses[0]["pos"])
            pos = [p + o for p, o in zip(pos, self.offset, strict=True)]
            poses[0]["pos"] = pos
        seen["object_poses"] = poses
        return self.inner.act(obs, seen)


class ReleaseWhenLifted(_Wrapper):
    """Opens the gripper for good once the object is ``lift_m`` above its start: a commanded
    release in mid-air. ``injected_at`` is the first step commanded open."""

    def __init__(self, inner: Policy, lift_m: float):
        super().__init__(inner)
        self.lift_m = float(lift_m)

    def _act(self, obs, signals):
        action = np.array(self.inner.act(obs, signals), dtype=float)
        if self.injected_at is None and float(signals["object_lift"]) >= self.lift_m:
            self.injected_at = self.t
        if self.injected_at is not None:
            action[:GRIPPER_INDEX] = 0.0
            action[GRIPPER_INDEX] = GRIP_OPEN
        return action


class FreezeAt(_Wrapper):
    """From control step ``step`` on, commands no motion and keeps the gripper as it was: a
    policy that hangs. ``injected_at`` is ``step``."""

    def __init__(self, inner: Policy, step: int):
        super().__init__(inner)
        self.step = int(step)
        self._grip = GRIP_OPEN

    def _act(self, obs, signals):
        if self.t < self.step:
            action = np.array(self.inner.act(obs, signals), dtype=float)
            self._grip = float(action[GRIPPER_INDEX])
            return action
        if self.injected_at is None:
            self.injected_at = self.t
        action = np.zeros(len(signals["eef_pos"]) + 4)  # 3 position + 3 rotation + 1 gripper
        action[GRIPPER_INDEX] = self._grip
        return action
