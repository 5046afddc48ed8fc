"""Policies for LIBERO: a privileged scripted pick-and-place oracle, graded scripted variants of
it, and the openpi VLA client with LIBERO's observation layout.

    policy = ScriptedPickPlace(Skill())                # the oracle; Skill from producers.sim.policies
    policy.reset(seed, spec)
    action = policy.act(obs, signals)                  # (7,) in [-1, 1]

    vla = OpenpiLiberoPolicy("ws://127.0.0.1:8000")    # an openpi policy server (pi0, pi0-FAST, ...)

The scripted policy is privileged: it reads the objects' poses from ``signals["object_poses"]``
and the target's geometry, the fingers' closing axis and the goal region from the simulation
(``obs["privileged"]``, the LiberoEnv, which LiberoEnv puts in every observation it returns). It
serves every task whose goal is one ``In``/``On`` predicate on a movable object (all of
libero_object, most of libero_spatial): approach above the target with the fingers turned to close
across its narrowest side, descend, close, lift clear of the goal's rim, carry above the goal,
lower, open, retreat.

The graded variants degrade it with the same ``Skill`` as the robosuite scripted policies
(producers/sim/policies.py): a per-episode error in the believed target and goal positions
(``target_noise_m``), gaussian action noise (``action_noise``), sloppy gripper dwell times
(``timing_jitter``) and a weaker, less precise controller (``precision``). All randomness comes
from one numpy Generator seeded in ``reset(seed, spec)``.

OpenpiLiberoPolicy sends what openpi's LIBERO example (examples/libero/main.py) sends:
``observation/image`` and ``observation/wrist_image`` (uint8 224x224x3: the 256x256 render,
rotated 180 degrees as LIBERO's training images are, resized with padding), ``observation/state``
(eef position, eef orientation as axis-angle, the two gripper finger positions: 8 floats) and
``prompt`` (the scenario's instruction), and runs the first ``replan_steps`` actions of each chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from producers.fixed_order import dot, norm
from producers.sim.policies import Skill

ACTION_DIM = 7
# Proportional gains (action units per metre / per radian of error) at precision 1; OSC_POSE
# deltas are action x 0.05 m and x 0.5 rad per step.
POS_GAIN = 14.0
ROT_GAIN = 2.5
# Heights (m).
HOVER_M = 0.06  # above the target's top before descending
CLEARANCE_M = 0.04  # the carried object's bottom above the goal's rim
RELEASE_ABOVE_CENTRE_M = 0.03  # the carried object's centre above the goal region's centre at release
FLOOR_CLEARANCE_M = 0.012  # the grip site never goes lower than this above the target's bottom
GRASP_BELOW_TOP_M = 0.02  # grasp this far below the target's top: the palm stops the fingers ~3 cm down
# Tolerances (m, rad) at precision 1; divided by precision.
XY_TOL_M = 0.006
Z_TOL_M = 0.008
ALIGN_TOL_RAD = 0.06
# Gripper dwell (steps): robosuite's Panda gripper travels its range in ~10 steps.
CLOSE_STEPS = 12
OPEN_STEPS = 8
# A phase that has not reached its goal after this many steps moves on.
PHASE_TIMEOUT_STEPS = 80
# Candidate closing directions searched for the narrowest grasp (degrees apart).
GRASP_YAW_STEP_DEG = 5
GRIPPER_MAX_OPENING_M = 0.078
GRASP_WIDTH_MARGIN_M = 0.012  # a closing direction is graspable when the object is this much narrower
# Points along the closing direction (m from the target's centre, both sides) where the fingers
# and the hand come down: a direction is chosen to keep them clear of the other objects.
HAND_PROBE_M = (0.045, 0.07, 0.1)
CLEARANCE_ENOUGH_M = 0.04  # clearance beyond this does not make a direction better
# A descend or lower that moved the hand less than this over STALL_STEPS steps is blocked
# (the palm on the target's top, the object on the goal's floor): go on to the next phase.
STALL_M = 0.001
STALL_STEPS = 4
GRIP_OPEN, GRIP_CLOSE = -1.0, 1.0
PHASES = ("approach", "descend", "close", "lift", "carry", "lower", "open", "retreat")


def _wrap_half_turn(a: float) -> float:
    """An angle folded into [-pi/2, pi/2) (a closing axis has no direction)."""
    return (a + math.pi / 2) % math.pi - math.pi / 2


def _quat_mul(a, b):  # xyzw
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array([aw * bx + ax * bw + ay * bz - az * by, aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw, aw * bw - ax * bx - ay * by - az * bz])


def _rotvec(q) -> np.ndarray:
    q = np.asarray(q, dtype=float)
    if q[3] < 0:
        q = -q
    s = float(norm(q[:3]))
    if s < 1e-12:
        return np.zeros(3)
    return q[:3] / s * (2.0 * math.atan2(s, q[3]))


def _box_distance(point: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    return float(norm(np.maximum(0.0, np.maximum(lo - point, point - hi))))


def closing_angle(footprint: np.ndarray, centre_xy: np.ndarray,
                  neighbours: list[np.ndarray]) -> tuple[float, float, float]:
    """The closing direction for a top-down grasp: (angle in the x/y plane, rad; the target's
    width along it, m; the hand's clearance from the neighbours' footprints, m).

    Among the directions across which the target fits the open gripper, the one whose finger and
    hand points (HAND_PROBE_M along it) keep clearest of the other objects (up to
    CLEARANCE_ENOUGH_M), the narrowest among equally clear ones; the narrowest overall when none fits."""
    pts = np.asarray(footprint, dtype=float)
    boxes = [(n.min(0), n.max(0)) for n in neighbours if len(n)]
    best_key, best = None, (0.0, math.inf, 0.0)
    for deg in range(0, 180, GRASP_YAW_STEP_DEG):
        a = math.radians(deg)
        axis = np.array([math.cos(a), math.sin(a)])
        proj = dot(pts, axis)
        width = float(proj.max() - proj.min())
        clear = CLEARANCE_ENOUGH_M
        for r in HAND_PROBE_M:
            for side in (-1.0, 1.0):
                probe = centre_xy + side * r * axis
                for lo, hi in boxes:
                    clear = min(clear, _box_distance(probe, lo, hi))
        fits = width <= GRIPPER_MAX_OPENING_M - GRASP_WIDTH_MARGIN_M
        key = (fits, round(clear, 3) if fits else 0.0, -width)
        if best_key is None or key > best_key:
            best_key, best = key, (a, width, clear)
    return best


@dataclass
class _Plan:
    target_xy: np.ndarray  # believed target centre
    goal_xy: np.ndarray  # believed goal centre
    grasp_z: float
    hover_z: float
    carry_z: float
    release_z: float
    orientation: np.ndarray  # desired grip-site orientation, xyzw
    close_steps: int
    open_steps: int


class ScriptedPickPlace:
    """The privileged pick-and-place state machine, degraded by ``skill`` (Skill() = the oracle)."""

    def __init__(self, skill: Skill | None = None, name: str = "oracle"):
        self.skill = skill or Skill()
        self.name = name
        self._rng = np.random.default_rng(0)
        self._plan: _Plan | None = None
        self.phase = PHASES[0]
        self._phase_t = 0
        self._belief = np.zeros(2)
        self._goal_belief = np.zeros(2)
        self._leave_factor = 1.0

    def reset(self, seed: int, spec: Any) -> None:
        sk = self.skill
        self._rng = np.random.default_rng([int(seed), 0x5EBA11B0])
        self._belief = self._rng.normal(0.0, sk.target_noise_m, 2) if sk.target_noise_m else np.zeros(2)
        self._goal_belief = self._rng.normal(0.0, sk.target_noise_m, 2) if sk.target_noise_m else np.zeros(2)
        j = sk.timing_jitter
        self._close_scale = float(self._rng.uniform(1 - j, 1 + j)) if j else 1.0
        self._open_scale = float(self._rng.uniform(1 - j, 1 + j)) if j else 1.0
        self._leave_factor = float(self._rng.uniform(1.0, 1.0 + 3 * j)) if j else 1.0
        self._plan = None
        self.phase, self._phase_t = PHASES[0], 0
        self._z_history: list[float] = []

    # -- planning from the privileged state ---------------------------------------------------

    def _make_plan(self, env: Any, signals: dict[str, Any]) -> _Plan:
        target = env.target
        centre, half = env.object_extent(target)
        self._half_z = float(half[2])
        neighbours = [env.object_footprint(n) for n in env.object_names if n != target]
        angle, _width, _clear = closing_angle(env.object_footprint(target), centre[:2], neighbours)
        pad = env.pad_axis_world()
        turn = _wrap_half_turn(angle - math.atan2(pad[1], pad[0]))
        q0 = np.asarray(signals["eef_quat"], dtype=float)
        orientation = _quat_mul(np.array([0.0, 0.0, math.sin(turn / 2), math.cos(turn / 2)]), q0)
        bottom, top = centre[2] - half[2], centre[2] + half[2]
        grasp_z = max(bottom + FLOOR_CLEARANCE_M, top - GRASP_BELOW_TOP_M)
        region = env.goal_region()
        goal = env.goal_pos()
        container = env.goal_container()
        rim = max(region[0][2] + region[1][2] if region is not None else -math.inf,
                  container[0][2] + container[1][2] if container is not None else -math.inf)
        self._rim = rim if math.isfinite(rim) else float(goal[2])
        self._goal_centre_z = float(region[0][2]) if region is not None else self._rim + float(half[2])
        carry_z, release_z = self._heights(grasp_z, centre[2])
        return _Plan(target_xy=centre[:2] + self._belief, goal_xy=np.asarray(goal[:2]) + self._goal_belief,
                     grasp_z=grasp_z, hover_z=top + HOVER_M, carry_z=max(carry_z, top + HOVER_M),
                     release_z=release_z, orientation=orientation,
                     close_steps=max(1, round(CLOSE_STEPS * self._close_scale)),
                     open_steps=max(1, round(OPEN_STEPS * self._open_scale)))

    def _heights(self, grip_z: float, centre_z: float) -> tuple[float, float]:
        """(carry, release) heights of the grip site for an object held with its centre at
        ``centre_z`` while the grip site is at ``grip_z``."""
        bottom_below_grip = grip_z - (centre_z - self._half_z)
        carry = self._rim + CLEARANCE_M + bottom_below_grip
        release = self._goal_centre_z + RELEASE_ABOVE_CENTRE_M + (grip_z - centre_z)
        return carry, min(release, carry)

    def _stalled(self, z: float) -> bool:
        """The hand has not moved down by STALL_M over the last STALL_STEPS steps of this phase."""
        hist = self._z_history
        hist.append(z)
        return len(hist) > STALL_STEPS and hist[-1 - STALL_STEPS] - z < STALL_M

    # -- control ------------------------------------------------------------------------------

    def _move(self, eef: np.ndarray, quat: np.ndarray, goal: np.ndarray, grip: float) -> np.ndarray:
        p = self.skill.precision
        action = np.zeros(ACTION_DIM)
        action[:3] = np.clip(POS_GAIN * p * (goal - eef), -1.0, 1.0)
        err = _rotvec(_quat_mul(self._plan.orientation, quat * np.array([-1, -1, -1, 1])))
        action[3:6] = np.clip(ROT_GAIN * p * err, -1.0, 1.0)
        action[6] = grip
        return action

    def _next(self, phase: str) -> None:
        self.phase, self._phase_t = phase, 0
        self._z_history = []

    def act(self, obs: dict[str, Any], signals: dict[str, Any]) -> np.ndarray:
        env = obs["privileged"]
        if self._plan is None:
            self._plan = self._make_plan(env, signals)
        plan, sk = self._plan, self.skill
        eef = np.asarray(signals["eef_pos"], dtype=float)
        quat = np.asarray(signals["eef_quat"], dtype=float)
        xy_tol, z_tol = XY_TOL_M / sk.precision, Z_TOL_M / sk.precision
        timed_out = self._phase_t >= PHASE_TIMEOUT_STEPS
        self._phase_t += 1
        target_now = np.asarray(signals["object_poses"][0]["pos"], dtype=float)
        align = float(norm(_rotvec(_quat_mul(plan.orientation, quat * np.array([-1, -1, -1, 1])))))
        phase = self.phase
        if phase == "approach":
            goal = np.array([*plan.target_xy, max(plan.hover_z, eef[2] if self._phase_t < 3 else plan.hover_z)])
            goal[2] = plan.hover_z
            if (norm(eef[:2] - plan.target_xy) < xy_tol * self._leave_factor
                    and abs(eef[2] - plan.hover_z) < 3 * z_tol and align < ALIGN_TOL_RAD / sk.precision) or timed_out:
                self._next("descend")
            return self._noisy(self._move(eef, quat, goal, GRIP_OPEN))
        if phase == "descend":
            goal = np.array([*plan.target_xy, plan.grasp_z])
            if abs(eef[2] - plan.grasp_z) < z_tol * self._leave_factor or self._stalled(eef[2]) or timed_out:
                self._next("close")
            return self._noisy(self._move(eef, quat, goal, GRIP_OPEN))
        if phase == "close":
            goal = np.array([*plan.target_xy, plan.grasp_z])
            if self._phase_t >= plan.close_steps:
                # plan the carry from where the object really sits in the hand
                plan.carry_z, plan.release_z = self._heights(float(eef[2]), float(target_now[2]))
                self._next("lift")
            return self._noisy(self._move(eef, quat, goal, GRIP_CLOSE))
        if phase == "lift":
            goal = np.array([eef[0], eef[1], plan.carry_z])
            goal[:2] = plan.target_xy
            if eef[2] > plan.carry_z - 2 * z_tol or timed_out:
                self._next("carry")
            return self._noisy(self._move(eef, quat, goal, GRIP_CLOSE))
        held_offset = target_now[:2] - eef[:2]  # carry the object, not the hand, over the goal
        if phase == "carry":
            goal = np.array([*(plan.goal_xy - held_offset), plan.carry_z])
            if norm(target_now[:2] - plan.goal_xy) < 2 * xy_tol or timed_out:
                self._next("lower")
            return self._noisy(self._move(eef, quat, goal, GRIP_CLOSE))
        if phase == "lower":
            goal = np.array([*(plan.goal_xy - held_offset), plan.release_z])
            if eef[2] < plan.release_z + z_tol or self._stalled(eef[2]) or timed_out:
                self._next("open")
            return self._noisy(self._move(eef, quat, goal, GRIP_CLOSE))
        if phase == "open":
            goal = eef.copy()
            if self._phase_t >= plan.open_steps:
                self._next("retreat")
            return self._noisy(self._move(eef, quat, goal, GRIP_OPEN))
        goal = np.array([eef[0], eef[1], plan.carry_z + 0.05])
        return self._noisy(self._move(eef, quat, goal, GRIP_OPEN))

    def _noisy(self, action: np.ndarray) -> np.ndarray:
        noise = self.skill.action_noise
        if noise:
            action = action + self._rng.normal(0.0, noise, ACTION_DIM)
        return np.clip(action, -1.0, 1.0)


# -- openpi VLAs ----------------------------------------------------------------------------

OPENPI_RESOLUTION = 256  # openpi's LIBERO_ENV_RESOLUTION: the resolution LIBERO's training data was rendered at
OPENPI_RESIZE = 224
OPENPI_REPLAN_STEPS = 5


def quat2axisangle(quat) -> np.ndarray:
    """robosuite's quat2axisangle (xyzw), as openpi's LIBERO example copies it."""
    q = np.array(quat, dtype=float)
    q[3] = min(1.0, max(-1.0, q[3]))
    den = math.sqrt(1.0 - q[3] * q[3])
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return (q[:3] * 2.0 * math.acos(q[3])) / den


def openpi_observation(env: Any, obs: dict[str, Any], resize: int = OPENPI_RESIZE) -> dict[str, np.ndarray]:
    """openpi's LIBERO element (without the prompt, which WebSocketPolicy adds) from a LiberoEnv
    and its last observation."""
    from openpi_client import image_tools

    agent, wrist = env.camera_images(OPENPI_RESOLUTION)
    # robosuite's camera observations are bottom-up (OpenGL); openpi rotates them 180 degrees.
    # Our renderer's frames are upright, so the same image is the upright one mirrored left-right.
    agent, wrist = np.ascontiguousarray(agent[:, ::-1]), np.ascontiguousarray(wrist[:, ::-1])
    img = image_tools.convert_to_uint8(image_tools.resize_with_pad(agent, resize, resize))
    wrist_img = image_tools.convert_to_uint8(image_tools.resize_with_pad(wrist, resize, resize))
    state = np.concatenate((obs["robot0_eef_pos"], quat2axisangle(obs["robot0_eef_quat"]),
                            obs["robot0_gripper_qpos"]))
    return {"observation/image": img, "observation/wrist_image": wrist_img, "observation/state": state}


class OpenpiLiberoPolicy:
    """An openpi policy server driven with LIBERO's observation layout (see the module docstring).
    Server failures end the episode as producers/websocket_policy.py says: env_error when the server
    is unreachable, gone or silent, policy_error when it answers with an error or a bad chunk."""

    def __init__(self, uri: str, name: str = "openpi", replan_steps: int = OPENPI_REPLAN_STEPS,
                 connect_timeout_s: float = 10.0):
        from producers.websocket_policy import WebSocketPolicy

        if replan_steps < 1:
            raise ValueError(f"replan_steps must be >= 1, got {replan_steps!r}")
        self.name, self.replan_steps = name, replan_steps
        self.client = WebSocketPolicy(uri, ACTION_DIM, connect_timeout_s)

    def reset(self, seed: int, spec: Any) -> None:
        self.client.reset(seed, spec)

    def act(self, obs: dict[str, Any], signals: dict[str, Any]) -> np.ndarray:
        c = self.client
        if c._chunk is None or c._cursor >= len(c._chunk):
            chunk = c._request(openpi_observation(obs["privileged"], obs))
            c._chunk, c._cursor = chunk[:self.replan_steps], 0
        action = c._chunk[c._cursor]
        c._cursor += 1
        return action

    def close(self) -> None:
        self.client.close()
