"""Hand-built, physically plausible Panda Lift step sequences for the detector tests.

Magnitudes follow the recorded robosuite traces in data/ (20 Hz; a 4 cm cube resting at
z=0.83 m; fingers open to 0.078 m, hold the cube at 0.040 m with ~40 N, shut on nothing within ~8
steps; arm torques within +-50 N m while moving; elbow near -2.0 rad). A ``Scene`` holds the
evolving state; each phase method changes it step by step and records one Step event per step.
Lift's goal_distance is max(0, 0.04 - object_lift).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

from schemas.events import make_event

DATA = Path(__file__).parent / "data"
CUBE = "cube"
DISTRACTOR = "distractor0"
CUBE_START = (0.0, 0.0, 0.83)
DISTRACTOR_START = (0.12, 0.10, 0.83)
QUAT_IDENTITY = [0.0, 0.0, 0.0, 1.0]
OPEN_M = 0.078
HOLD_OPENING_M = 0.040
HOLD_FORCE_N = 40.0
LIFT_GOAL_M = 0.04
REST_TORQUES = [0.1, -40.0, 0.0, 11.0, 0.1, 2.3, 0.0]
REST_JOINTS = [0.03, 0.9, 0.0, -2.0, -0.03, 2.98, 0.84]


def _lerp(a, b, f):
    return [x + (y - x) * f for x, y in zip(a, b, strict=True)]


@dataclass
class Scene:
    episode_id: str = "ep-1"
    run_id: str = "run-1"
    eef: list = field(default_factory=lambda: [-0.10, 0.0, 1.00])
    cube: list = field(default_factory=lambda: list(CUBE_START))
    cube_quat: list = field(default_factory=lambda: list(QUAT_IDENTITY))
    distractor: list | None = field(default_factory=lambda: list(DISTRACTOR_START))
    distractor_quat: list = field(default_factory=lambda: list(QUAT_IDENTITY))
    opening: float = 0.042
    force: float = 0.0
    command: float = -1.0
    torques: list = field(default_factory=lambda: list(REST_TORQUES))
    joints: list = field(default_factory=lambda: list(REST_JOINTS))
    extra_contacts: list = field(default_factory=list)
    gripper_distractor_force: float = 0.0
    goal: float | None = None  # overrides Lift's goal_distance when set
    steps: list = field(default_factory=list)

    # -- recording ----------------------------------------------------------------------

    @property
    def t(self) -> int:
        return len(self.steps)

    @property
    def lift(self) -> float:
        return self.cube[2] - CUBE_START[2]

    def record(self, action_xyz=(0.0, 0.0, 0.0)) -> dict:
        contacts = []
        if self.lift <= 0.001:
            contacts.append({"a": CUBE, "b": "table", "normal_force": 0.7})
        if self.force > 0.0:
            contacts.append({"a": CUBE, "b": "gripper", "normal_force": self.force})
        poses = [{"name": CUBE, "pos": list(self.cube), "quat": list(self.cube_quat)}]
        if self.distractor is not None:
            poses.append({"name": DISTRACTOR, "pos": list(self.distractor), "quat": list(self.distractor_quat)})
            if self.distractor[2] - DISTRACTOR_START[2] <= 0.001:
                contacts.append({"a": DISTRACTOR, "b": "table", "normal_force": 0.3})
            if self.gripper_distractor_force > 0.0:
                contacts.append({"a": DISTRACTOR, "b": "gripper", "normal_force": self.gripper_distractor_force})
        contacts.extend(copy.deepcopy(self.extra_contacts))
        contacts.sort(key=lambda c: (c["a"], c["b"]))
        goal = self.goal if self.goal is not None else max(0.0, LIFT_GOAL_M - self.lift)
        t = self.t
        step = make_event("Step", (self.episode_id, t), "test", self.run_id,
                          episode_id=self.episode_id, t=t, action=[*action_xyz, 0.0, 0.0, 0.0, self.command],
                          eef_pos=list(self.eef), eef_quat=[1.0, 0.0, 0.0, 0.0], gripper_opening=self.opening,
                          gripper_force=self.force, object_poses=poses, contacts=contacts,
                          joint_torques=list(self.torques), joint_pos=list(self.joints), reward=0.0,
                          goal_distance=goal, object_lift=self.lift, keyframe_sha256=None)
        self.steps.append(step)
        return step

    # -- phases -------------------------------------------------------------------------

    def move_to(self, target, n: int, carry: bool = False, **hold) -> Scene:
        """Moves the hand in a straight line over n steps (the held cube follows if carry)."""
        start = list(self.eef)
        cube_start = list(self.cube)
        for i in range(1, n + 1):
            self.eef = _lerp(start, target, i / n)
            if carry:
                self.cube = [c + (e - s) for c, e, s in zip(cube_start, self.eef, start, strict=True)]
            for k, v in hold.items():
                setattr(self, k, v)
            self.opening = min(OPEN_M, self.opening + 0.01) if self.command < 0 and not carry else self.opening
            self.record(action_xyz=[max(-1.0, min(1.0, (b - a) * 10)) for a, b in zip(start, target, strict=True)])
        return self

    def approach(self, n: int = 30) -> Scene:
        """Open hand to 10 cm above the cube, then down to grasp height."""
        self.command = -1.0
        above = [self.cube[0], self.cube[1], self.cube[2] + 0.10]
        self.move_to(above, n - n // 3)
        return self.move_to(list(self.cube), n // 3)

    def close_on_cube(self, n: int = 11) -> Scene:
        """Fingers close from open, touch the cube on the 4th step and squeeze to ~40 N."""
        self.command = 1.0
        for i in range(n):
            if i < 3:
                self.opening = OPEN_M - (OPEN_M - HOLD_OPENING_M) * (i + 1) / 4
                self.force = 0.0
            else:
                self.opening = HOLD_OPENING_M + 0.0005
                self.force = min(HOLD_FORCE_N, 20.0 + 6.0 * (i - 3))
            self.record()
        return self

    def close_empty(self, n: int = 12) -> Scene:
        """Fingers close on nothing: the opening shrinks to 0 in ~8 steps, no force."""
        self.command = 1.0
        for _ in range(n):
            self.opening = max(0.0, self.opening - 0.011)
            self.force = 0.0
            self.record()
        return self

    def lift_by(self, dz: float, n: int = 15) -> Scene:
        """Raises the hand (and the held cube) by dz."""
        target = [self.eef[0], self.eef[1], self.eef[2] + dz]
        return self.move_to(target, n, carry=True, force=HOLD_FORCE_N)

    def hold(self, n: int, **state) -> Scene:
        for k, v in state.items():
            setattr(self, k, v)
        for _ in range(n):
            self.record()
        return self

    def slip(self, fall_steps: int = 4) -> Scene:
        """Touch lost while the gripper stays closed: force drops to 0, fingers shut, cube falls."""
        start_lift = self.lift
        for i in range(1, fall_steps + 1):
            self.force = 0.0
            self.opening = max(0.0, self.opening - 0.012)
            self.cube = [self.cube[0], self.cube[1], CUBE_START[2] + start_lift * (1 - i / fall_steps)]
            self.record()
        return self

    def release(self, fall_steps: int = 4) -> Scene:
        """Commanded open: force to 0, fingers open, a lifted cube falls back to the table."""
        self.command = -1.0
        start_lift = self.lift
        for i in range(1, fall_steps + 1):
            self.force = 0.0
            self.opening = min(OPEN_M, self.opening + 0.01)
            self.cube = [self.cube[0], self.cube[1], CUBE_START[2] + start_lift * (1 - i / fall_steps)]
            self.record()
        return self


def clean_lift(scene: Scene | None = None) -> Scene:
    """Approach, grasp, lift 15 cm, hold: a successful Lift episode (~76 steps)."""
    scene = scene or Scene()
    return scene.approach(30).close_on_cube(11).lift_by(0.15, 15).hold(20)


def ended(scene: Scene, success: bool, termination: str | None = None, steps: int | None = None) -> dict:
    termination = termination or ("success" if success else "timeout")
    n = scene.t if steps is None else steps
    return make_event("EpisodeEnded", (scene.episode_id,), "test", scene.run_id,
                      episode_id=scene.episode_id, scenario_id="scn-1", model_id="model-1", success=success,
                      termination=termination, steps=n, total_reward=float(success),
                      quality={"smoothness_jerk": 0.1, "path_efficiency": 0.8, "peak_contact_force": 40.0,
                               "mean_contact_force": 10.0, "time_to_success": n if success else None,
                               "regrasp_count": 0, "idle_steps": 0},
                      error=None, final_keyframe_sha256=None)


def recorded(name: str, episode_id: str = "rec-1") -> tuple[dict, list[dict]]:
    """A trace recorded from robosuite by data/record_lift_traces.py, as Step events."""
    trace = json.loads((DATA / f"{name}.json").read_text())
    steps = [make_event("Step", (episode_id, row["t"]), "recorded", "run-rec", episode_id=episode_id,
                        keyframe_sha256=None, **row) for row in trace["steps"]]
    return trace, steps
