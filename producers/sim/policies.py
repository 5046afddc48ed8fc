"""Policies: the Policy protocol, scripted state-machine policies with graded skill, and the
registry of policies by name.

    policy = make_policy("scripted-novice")
    policy.reset(seed, spec)
    action = policy.act(obs, signals)          # np.ndarray (7,) in [-1, 1]

A scripted policy reads the privileged object poses from ``signals["object_poses"]`` and the
task goal from ``obs["goal_pos"]`` (added by SimEnv), and runs a state machine per task:

    Lift:          approach above the cube, descend, close, lift (and hold it up)
    Lift + place:  (ScenarioSpec.place_target_xy) approach, descend, close, lift, carry the cube
                   above the place target, lower until it touches the table, open, retreat
    Stack:         approach cubeA, descend, close, lift, move above cubeB, lower until cubeA
                   touches cubeB, open, retreat
    PickPlaceCan:  approach the can, descend, close, lift over the bin walls, move above the
                   target bin, lower, open, retreat

Its ``Skill`` degrades it the way a real policy degrades: a per-episode error in where it
believes the object is (``target_noise_m``), noisy actions (``action_noise``), sloppy timing
(``timing_jitter``) and a weak, imprecise controller (``precision``). With ``retries`` it
notices a failed grasp (the hand rose GRASP_CHECK_RISE_M above where it closed and the object
did not come along) and tries again: it opens, takes a fresh look (a new perception error drawn
from the same distribution) and starts over from the approach, up to ``retries`` times per
episode. All randomness comes from one numpy Generator seeded in ``reset(seed, spec)``: the same
seed gives the same actions; with ``retries=0`` no retry ever draws from it.

Scripted policies ignore ``spec.instruction``: they know the task from ``env_name`` and the
goal from ``obs["goal_pos"]``, so an instruction paraphrase changes nothing for them (it is for
language-conditioned policies and the semantic critic).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from producers.fixed_order import norm
from producers.sim.exceptions import UnknownPolicy
from schemas.scenario import ScenarioSpec

ACTION_DIM = 7
# OSC_POSE delta scaling of robosuite's default Panda controller: action 1 = 0.05 m, 0.5 rad.
POS_PER_ACTION_M = 0.05
ROT_PER_ACTION_RAD = 0.5
# Proportional gains (action units per metre / per radian of error) at precision 1.
POS_GAIN = 16.0
ROT_GAIN = 2.0 / ROT_PER_ACTION_RAD
# Heights (m) relative to the object or goal.
HOVER_M = 0.08  # above the object before descending
GRASP_DZ_M = -0.002  # grip site relative to the object's centre when closing
LIFT_M = 0.15  # Lift: how high above its start to lift the object
CARRY_CLEARANCE_M = 0.12  # Stack/PickPlace: above the goal while carrying (bin walls: 0.1 m)
PLACE_DZ_M = 0.03  # PickPlace: above the resting goal height when opening
PLACE_LIFT_M = 0.08  # Lift then place: how high above its start to lift the cube before carrying
# Tolerances (m) at precision 1; divided by precision.
XY_TOL_M = 0.006
Z_TOL_M = 0.008
ALIGN_TOL_RAD = 0.08
# Steps spent closing / opening the gripper (robosuite's gripper moves 0.2 of its range per step).
CLOSE_STEPS = 12
OPEN_STEPS = 8
# A phase that has not reached its goal after this many steps moves on anyway.
PHASE_TIMEOUT_STEPS = 60
# Lowering onto cubeB (Stack) or the table (Lift then place): speed cap (action units) and the
# contact force that counts as touching.
LOWER_SPEED = 0.25
TOUCH_FORCE_N = 0.5
# A grasp has failed when the hand has risen this far above where it closed while the object
# rose less than GRASP_CHECK_LIFT_M (what a policy with retries checks).
GRASP_CHECK_RISE_M = 0.04
GRASP_CHECK_LIFT_M = 0.01
MAX_RETRIES = 5
# Distractors farther than this from the object do not pull the belief (Skill.distractor_pull).
DISTRACTOR_PULL_RADIUS_M = 0.15

GRIP_OPEN = -1.0
GRIP_CLOSE = 1.0


@runtime_checkable
class Policy(Protocol):
    """What the rollout loop drives. ``act`` returns a (7,) float array in [-1, 1]."""

    name: str

    def reset(self, seed: int, spec: ScenarioSpec) -> None: ...

    def act(self, obs: dict[str, Any], signals: dict[str, Any]) -> np.ndarray: ...


@dataclass(frozen=True, kw_only=True)
class Skill:
    """How well a scripted policy executes. All zero / 1.0 is perfect (the oracle).

    target_noise_m: std (m) of a per-episode x/y error in the believed object (and place
        target) position; drawn once per episode.
    action_noise: std of gaussian noise added to every action component (action units; the
        arm's full scale is 1).
    timing_jitter: 0..1. Each episode draws its gripper dwell times from U(1-j, 1+j) x nominal,
        and how early it may leave the descend phase (up to 1 + 3j times the tolerance).
    precision: (0, 1]. Scales the controller gains; tolerances are divided by it.
    retries: 0..MAX_RETRIES. Grasps it may re-try after noticing a failed one (0: it never
        checks, and behaves exactly as before the field existed).
    range_noise_per_m: std (m) of perception error added per metre of horizontal distance
        between the grip site and the object (or the place goal) at the episode's start (a
        camera sees far things worse): the error's std is target_noise_m + range_noise_per_m *
        distance.
    distractor_pull: 0..1. How much a nearby distractor drags the believed object position
        towards itself (attention to the wrong thing): the nearest distractor within
        DISTRACTOR_PULL_RADIUS_M shifts the belief by distractor_pull * (1 - d / radius) of the
        offset between them.
    The last three are 0 for models made before they existed, which then act exactly as before.
    """

    target_noise_m: float = 0.0
    action_noise: float = 0.0
    timing_jitter: float = 0.0
    precision: float = 1.0
    retries: int = 0
    range_noise_per_m: float = 0.0
    distractor_pull: float = 0.0

    def __post_init__(self) -> None:
        for name, lo, hi in (("target_noise_m", 0.0, 0.2), ("action_noise", 0.0, 2.0),
                             ("timing_jitter", 0.0, 1.0), ("range_noise_per_m", 0.0, 0.5),
                             ("distractor_pull", 0.0, 1.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(f"Skill.{name} must be a number in [{lo}, {hi}], got {v!r}")
            object.__setattr__(self, name, float(v))
        p = self.precision
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.05 <= p <= 1.0:
            raise ValueError(f"Skill.precision must be a number in [0.05, 1], got {p!r}")
        object.__setattr__(self, "precision", float(p))
        r = self.retries
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= MAX_RETRIES:
            raise ValueError(f"Skill.retries must be an integer in [0, {MAX_RETRIES}], got {r!r}")

    def to_params(self) -> dict[str, str]:
        """As the string map of ModelRegistered.params. ``retries``, ``range_noise_per_m`` and
        ``distractor_pull`` are listed only when set, so a model registered before they existed
        keeps the same params (and event content)."""
        params = {k: repr(getattr(self, k)) for k in ("target_noise_m", "action_noise", "timing_jitter", "precision")}
        for k in ("retries", "range_noise_per_m", "distractor_pull"):
            if getattr(self, k):
                params[k] = repr(getattr(self, k))
        return params

    def at_least_as_good_as(self, other: Skill) -> bool:
        """Every component is at least as good as ``other``'s (noise, jitter lower or equal;
        precision, retries higher or equal): the order the registered models are ranked by."""
        return (self.target_noise_m <= other.target_noise_m and self.action_noise <= other.action_noise
                and self.timing_jitter <= other.timing_jitter and self.precision >= other.precision
                and self.retries >= other.retries and self.range_noise_per_m <= other.range_noise_per_m
                and self.distractor_pull <= other.distractor_pull)


# As in configs/models.yaml (version 2 of expert, novice, clumsy), best first; the file is what the
# rollout worker registers, this is the same set by name for tests and the labelled failure set.
SKILLS: dict[str, Skill] = {
    "oracle": Skill(),
    "expert": Skill(target_noise_m=0.002, range_noise_per_m=0.04, action_noise=0.048, timing_jitter=0.08,
                    precision=0.92, distractor_pull=0.4, retries=1),
    "skilled": Skill(target_noise_m=0.003, range_noise_per_m=0.06, action_noise=0.072, timing_jitter=0.12,
                     precision=0.88, distractor_pull=0.6, retries=1),
    "novice": Skill(target_noise_m=0.004, range_noise_per_m=0.08, action_noise=0.096, timing_jitter=0.16,
                    precision=0.84, distractor_pull=0.8, retries=1),
    "clumsy": Skill(target_noise_m=0.005, range_noise_per_m=0.1, action_noise=0.12, timing_jitter=0.2,
                    precision=0.8, distractor_pull=1.0, retries=1),
}


# -- small quaternion helpers (xyzw, as in signals) ---------------------------------------

def _qmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return np.array([aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw,
                     aw * bw - ax * bx - ay * by - az * bz])


def _qconj(q: np.ndarray) -> np.ndarray:
    return np.array([-q[0], -q[1], -q[2], q[3]])


def _rotvec(q: np.ndarray) -> np.ndarray:
    """Axis-angle vector of a unit quaternion (xyzw), angle in [0, pi]."""
    if q[3] < 0:
        q = -q
    s = float(norm(q[:3]))
    if s < 1e-12:
        return np.zeros(3)
    return q[:3] / s * (2.0 * math.atan2(s, q[3]))


def _zrot(angle: float) -> np.ndarray:
    return np.array([0.0, 0.0, math.sin(angle / 2), math.cos(angle / 2)])


def _yaw(q: np.ndarray) -> float:
    x, y, z, w = q
    return math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def _wrap_quarter(angle: float) -> float:
    """The equivalent rotation in [-pi/4, pi/4) for a shape with 90-degree symmetry."""
    return (angle + math.pi / 4) % (math.pi / 2) - math.pi / 4


def _pose(signals: dict[str, Any], name: str) -> tuple[np.ndarray, np.ndarray]:
    for p in signals["object_poses"]:
        if p["name"] == name:
            return np.asarray(p["pos"], dtype=float), np.asarray(p["quat"], dtype=float)
    raise KeyError(f"object {name!r} not in signals['object_poses']")


def _contact_force(signals: dict[str, Any], a: str, b: str) -> float:
    lo, hi = sorted((a, b))
    return sum(c["normal_force"] for c in signals["contacts"] if c["a"] == lo and c["b"] == hi)


# -- the scripted policy ------------------------------------------------------------------

_TASK_OBJECT = {"Lift": "cube", "Stack": "cubeA", "PickPlaceCan": "Can"}
_BOX_TASKS = ("Lift", "Stack")  # objects with 90-degree yaw symmetry: align the gripper to them


class ScriptedPolicy:
    """State-machine policy for Lift, Stack and PickPlaceCan with a given Skill."""

    def __init__(self, skill: Skill, name: str = "scripted"):
        self.skill = skill
        self.name = name
        self._spec: ScenarioSpec | None = None

    # -- episode setup ----------------------------------------------------------------
    def reset(self, seed: int, spec: ScenarioSpec) -> None:
        if spec.env_name not in _TASK_OBJECT:
            raise UnknownPolicy(f"{self.name} has no script for env {spec.env_name!r}")
        sk = self.skill
        # Decorrelated from the env's own use of the same seed.
        self._rng = np.random.default_rng([int(seed), 0x5EA])
        self._spec = spec
        self._object = _TASK_OBJECT[spec.env_name]
        # rng.normal(0, s) is 0 + s * standard_normal: the same draws, the direction kept for the
        # range-dependent part, which needs the first observation
        self._pick_z = self._rng.standard_normal(2)
        self._pick_bias = np.append(sk.target_noise_m * self._pick_z, 0.0)
        self._place_z = self._rng.standard_normal(2)
        self._place_bias = np.append(sk.target_noise_m * self._place_z, 0.0)
        self._pick_std = sk.target_noise_m
        j = sk.timing_jitter
        self._close_steps = max(1, round(CLOSE_STEPS * self._rng.uniform(1 - j, 1 + j)))
        self._open_steps = max(1, round(OPEN_STEPS * self._rng.uniform(1 - j, 1 + j)))
        self._descend_tol = Z_TOL_M / sk.precision * self._rng.uniform(1.0, 1.0 + 3.0 * j)
        self._xy_tol = XY_TOL_M / sk.precision
        self._z_tol = Z_TOL_M / sk.precision
        self._phase = "approach"
        self._phase_steps = 0
        self._start_quat: np.ndarray | None = None
        self._yaw_offset = 0.0
        self._lift_z: float | None = None
        self._retreat_z: float | None = None
        self._close_z: float | None = None
        self._retries_left = sk.retries
        self.retries_used = 0
        # Lift then place carries the cube like Stack and PickPlaceCan do; plain Lift holds it up.
        self._places = spec.env_name == "Lift" and spec.place_target_xy is not None
        self._carries = spec.env_name != "Lift" or self._places

    def _goto(self, phase: str) -> None:
        self._phase = phase
        self._phase_steps = 0

    # -- control helpers --------------------------------------------------------------
    def _move(self, eef: np.ndarray, target: np.ndarray, cap: float = 1.0) -> np.ndarray:
        return np.clip(POS_GAIN * self.skill.precision * (target - eef), -cap, cap)

    def _rotate(self, quat: np.ndarray) -> np.ndarray:
        desired = _qmul(_zrot(self._yaw_offset), self._start_quat)
        err = _rotvec(_qmul(desired, _qconj(quat)))
        return np.clip(ROT_GAIN * self.skill.precision * err, -1.0, 1.0)

    def _aligned(self, quat: np.ndarray) -> bool:
        desired = _qmul(_zrot(self._yaw_offset), self._start_quat)
        return float(norm(_rotvec(_qmul(desired, _qconj(quat))))) < ALIGN_TOL_RAD / self.skill.precision

    # -- act --------------------------------------------------------------------------
    def act(self, obs: dict[str, Any], signals: dict[str, Any]) -> np.ndarray:
        if self._spec is None:
            raise RuntimeError(f"{self.name}.act() before reset()")
        eef = np.asarray(signals["eef_pos"], dtype=float)
        quat = np.asarray(signals["eef_quat"], dtype=float)
        obj_pos, obj_quat = _pose(signals, self._object)
        if self._start_quat is None:
            self._start_quat = quat.copy()
            k = self.skill.range_noise_per_m
            if k:
                self._pick_std += k * float(norm(obj_pos[:2] - eef[:2]))
                self._pick_bias = np.append(self._pick_std * self._pick_z, 0.0)
                if self._carries:  # where it puts the object down is seen from the start too
                    place_std = self.skill.target_noise_m + k * float(norm(self._goal(obs)[:2] - eef[:2]))
                    self._place_bias = np.append(place_std * self._place_z, 0.0)
        believed = obj_pos + self._pick_bias
        if self.skill.distractor_pull:
            believed = believed + self._pull(signals, obj_pos)
        if self._spec.env_name in _BOX_TASKS and self._phase == "approach":
            # Turn the fingers square to the box: the relative yaw, modulo the box's symmetry.
            self._yaw_offset = _wrap_quarter(_yaw(obj_quat) - _yaw(self._start_quat) - math.pi / 2)
        self._phase_steps += 1
        timeout = self._phase_steps > PHASE_TIMEOUT_STEPS
        pos_a = np.zeros(3)
        grip = GRIP_OPEN
        phase = self._phase

        if phase == "approach":
            target = believed + np.array([0.0, 0.0, HOVER_M])
            pos_a = self._move(eef, target)
            err = target - eef
            if (norm(err[:2]) < self._xy_tol and abs(err[2]) < 2 * self._z_tol
                    and self._aligned(quat)) or timeout:
                self._goto("descend")
        elif phase == "descend":
            target = believed + np.array([0.0, 0.0, GRASP_DZ_M])
            pos_a = self._move(eef, target)
            if abs(target[2] - eef[2]) < self._descend_tol or timeout:
                self._goto("close")
        elif phase == "close":
            target = believed + np.array([0.0, 0.0, GRASP_DZ_M])
            pos_a = self._move(eef, target)
            grip = GRIP_CLOSE
            if self._phase_steps >= self._close_steps:
                if self._places:
                    rise = PLACE_LIFT_M
                elif self._spec.env_name == "Lift":
                    rise = LIFT_M
                else:
                    rise = CARRY_CLEARANCE_M + max(0.0, self._goal(obs)[2] - eef[2])
                self._close_z = eef[2]
                self._lift_z = eef[2] + rise
                self._goto("lift")
        elif phase == "lift":
            grip = GRIP_CLOSE
            target = np.array([eef[0], eef[1], self._lift_z])
            pos_a = self._move(eef, target)
            if self._retries_left > 0 and self._grasp_failed(eef, signals):
                self._retries_left -= 1
                self.retries_used += 1
                # a fresh look at where the object is: the perception error is drawn again
                self._pick_bias = np.append(self._rng.normal(0.0, self._pick_std, 2), 0.0)
                self._goto("reopen")
            elif self._carries and (abs(self._lift_z - eef[2]) < 2 * self._z_tol or timeout):
                self._goto("carry")
        elif phase == "reopen":
            # let go of nothing and rise back to hover height before approaching again
            grip = GRIP_OPEN
            pos_a = self._move(eef, np.array([eef[0], eef[1], self._close_z + HOVER_M]))
            if self._phase_steps >= self._open_steps:
                self._goto("approach")
        elif phase == "carry":
            # From here on the object is steered, not the hand: it hangs at a fixed offset.
            grip = GRIP_CLOSE
            goal = self._goal(obs) + self._place_bias
            err = np.array([goal[0] - obj_pos[0], goal[1] - obj_pos[1], self._lift_z - eef[2]])
            pos_a = self._move(np.zeros(3), err)
            if norm(err[:2]) < 2 * self._xy_tol or timeout:
                self._goto("lower")
        elif phase == "lower":
            grip = GRIP_CLOSE
            goal = self._goal(obs) + self._place_bias
            if self._spec.env_name in _BOX_TASKS:
                # Lower until the cube touches what it is put on (cubeB, or the table), aiming a
                # little below where it would rest.
                support = "cubeB" if self._spec.env_name == "Stack" else "table"
                pos_a = self._move(obj_pos, goal - np.array([0.0, 0.0, 0.02]), cap=LOWER_SPEED)
                if _contact_force(signals, self._object, support) > TOUCH_FORCE_N or timeout:
                    self._goto("release")
            else:
                target = goal + np.array([0.0, 0.0, PLACE_DZ_M])
                pos_a = self._move(obj_pos, target)
                if abs(target[2] - obj_pos[2]) < 2 * self._z_tol or timeout:
                    self._goto("release")
        elif phase == "release":
            grip = GRIP_OPEN
            if self._phase_steps >= self._open_steps:
                self._retreat_z = eef[2] + CARRY_CLEARANCE_M
                self._goto("retreat")
        elif phase == "retreat":
            grip = GRIP_OPEN
            pos_a = self._move(eef, np.array([eef[0], eef[1], self._retreat_z]))

        action = np.concatenate([pos_a, self._rotate(quat), [grip]])
        if self.skill.action_noise > 0:
            action = action + self._rng.normal(0.0, self.skill.action_noise, ACTION_DIM)
        return np.clip(action, -1.0, 1.0)

    def _pull(self, signals: dict[str, Any], obj_pos: np.ndarray) -> np.ndarray:
        """Skill.distractor_pull: the belief's shift towards the nearest distractor in range."""
        best, offset = DISTRACTOR_PULL_RADIUS_M, np.zeros(3)
        for p in signals["object_poses"]:
            if not p["name"].startswith("distractor"):
                continue
            delta = np.asarray(p["pos"], dtype=float) - obj_pos
            d = float(norm(delta[:2]))
            if d < best:
                best = d
                offset = np.array([delta[0], delta[1], 0.0]) * self.skill.distractor_pull * (
                    1.0 - d / DISTRACTOR_PULL_RADIUS_M)
        return offset

    def _grasp_failed(self, eef: np.ndarray, signals: dict[str, Any]) -> bool:
        return (eef[2] - self._close_z >= GRASP_CHECK_RISE_M
                and float(signals["object_lift"]) < GRASP_CHECK_LIFT_M)

    def _goal(self, obs: dict[str, Any]) -> np.ndarray:
        return np.asarray(obs["goal_pos"], dtype=float)

    @property
    def phase(self) -> str:
        """The current state of the machine (for tests and debugging)."""
        return self._phase


class OracleScripted(ScriptedPolicy):
    """The scripted policy with perfect skill: exact privileged poses, no noise, full gain."""

    def __init__(self, name: str = "oracle"):
        super().__init__(SKILLS["oracle"], name=name)


POLICY_KINDS = ("oracle", "scripted")

# Registered policies by name: a factory each, so every caller gets a fresh instance.
POLICIES: dict[str, Callable[[], Policy]] = {
    "oracle": lambda: OracleScripted(),
    "scripted-expert": lambda: ScriptedPolicy(SKILLS["expert"], name="scripted-expert"),
    "scripted-skilled": lambda: ScriptedPolicy(SKILLS["skilled"], name="scripted-skilled"),
    "scripted-novice": lambda: ScriptedPolicy(SKILLS["novice"], name="scripted-novice"),
    "scripted-clumsy": lambda: ScriptedPolicy(SKILLS["clumsy"], name="scripted-clumsy"),
}


def make_policy(name: str) -> Policy:
    """A fresh instance of a registered policy."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise UnknownPolicy(f"no policy registered as {name!r}; known: {sorted(POLICIES)}") from None
    return factory()
