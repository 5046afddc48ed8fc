"""Records the real robosuite traces the detector tests replay (golden files beside this script).

A scripted Panda Lift policy (move above the cube, descend, close, lift) on one scenario with a
box distractor, all with the same seed. It aims at where it believes the cube is: the cube's
true position plus the attempt's aim offset (a perception error). After a close it lifts; if the
cube has not come up after ``MISS_CHECK_STEPS`` it reopens and, while attempts remain, tries again
with the next attempt's offset (a test-only retry, independent of producers/sim/policies.py).

    lift_success         aimed at the cube: a clean success (runs to the horizon)
    lift_miss            aimed 6 cm beside it, no retry: the fingers close on nothing, it hovers
    lift_regrasp         aimed 6 cm beside it, then corrected after reopening: a success after
                         a recovered miss (stops once the success has held 5 steps)
    lift_miss_twice      aimed 6 cm beside it twice: it reopens and misses again, never recovers
    lift_stall_resume    freezes in mid-approach for 55 steps, then goes on and succeeds

Signals are rounded to 5 decimals.

Usage (needs the simulator, ~20 s):
    .venv/bin/python tests/unit/streams/failures/data/record_lift_traces.py
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import producers.sim  # noqa: F401  (sets MUJOCO_GL before mujoco is imported)
from producers.sim.envs import make_env
from schemas.scenario import Distractor, ScenarioSpec

HERE = Path(__file__).parent
SEED = 7
HORIZON = 120
RETRY_HORIZON = 200  # the traces that retry or pause need longer
GAIN = 10.0  # action per metre of position error
CLOSE_STEPS = 10  # steps the gripper gets to close before lifting
LIFT_TO_Z = 1.05  # m, world height the hand lifts to
MISS_CHECK_STEPS = 8  # lifting steps after which a cube still below MISSED_LIFT_M was missed
MISSED_LIFT_M = 0.01
REOPEN_STEPS = 8  # steps the gripper gets to open before the next attempt
SUCCESS_HOLD_STEPS = 5  # as producers/sim/rollout.py: a success that held this long ends the episode
SIGNALS = ("t", "action", "eef_pos", "eef_quat", "gripper_opening", "gripper_force", "object_poses", "contacts",
           "joint_torques", "joint_pos", "reward", "goal_distance", "object_lift")


@dataclass(frozen=True)
class Plan:
    aims_x: tuple[float, ...]  # aim offset (m, along x) of each attempt; one attempt = no retry
    horizon: int = HORIZON
    freeze_at: int | None = None  # control step at which the policy stops commanding motion
    freeze_steps: int = 0
    stop_on_success: bool = False


PLANS = {
    "lift_success": Plan(aims_x=(0.0,)),
    "lift_miss": Plan(aims_x=(0.06,)),
    "lift_regrasp": Plan(aims_x=(0.06, 0.0), horizon=RETRY_HORIZON, stop_on_success=True),
    "lift_miss_twice": Plan(aims_x=(0.06, 0.06), horizon=RETRY_HORIZON),
    "lift_stall_resume": Plan(aims_x=(0.0,), horizon=RETRY_HORIZON, freeze_at=12, freeze_steps=55,
                              stop_on_success=True),
}


def _round(value):
    if isinstance(value, float):
        return round(value, 5)
    if isinstance(value, list):
        return [_round(v) for v in value]
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value


def record(plan: Plan) -> dict:
    spec = ScenarioSpec(env_name="Lift", horizon=plan.horizon, instruction="lift the cube",
                        distractors=(Distractor(kind="box", size=0.02, x=0.12, y=0.1),))
    env = make_env(spec)
    env.reset(SEED)
    rows, phase, since, attempt, held = [], "above", 0, 0, 0
    for step in range(plan.horizon):
        s = env.signals()
        eef = np.array(s["eef_pos"])
        cube = np.array(s["object_poses"][0]["pos"]) + [plan.aims_x[attempt], 0.0, 0.0]
        action = np.zeros(7)
        frozen = plan.freeze_at is not None and plan.freeze_at <= step < plan.freeze_at + plan.freeze_steps
        if phase == "above":
            target, action[6] = cube + [0.0, 0.0, 0.10], -1.0
            if np.linalg.norm(target - eef) < 0.01:
                phase = "down"
        if phase == "down":
            target, action[6] = cube, -1.0
            if np.linalg.norm(target - eef) < 0.008:
                phase, since = "close", env.steps
        if phase == "close":
            target, action[6] = eef, 1.0
            if env.steps - since > CLOSE_STEPS:
                phase, since = "lift", env.steps
        if phase == "lift":
            target, action[6] = np.array([eef[0], eef[1], LIFT_TO_Z]), 1.0
            missed = env.steps - since >= MISS_CHECK_STEPS and s["object_lift"] < MISSED_LIFT_M
            if missed and attempt + 1 < len(plan.aims_x):
                phase, since, attempt = "reopen", env.steps, attempt + 1
        if phase == "reopen":
            target, action[6] = eef, -1.0
            if env.steps - since >= REOPEN_STEPS:
                phase = "above"
                target = np.array(s["object_poses"][0]["pos"]) + [plan.aims_x[attempt], 0.0, 0.10]
        action[:3] = np.clip((target - eef) * GAIN, -1.0, 1.0)
        if frozen:
            action[:6] = 0.0
        _, reward, done, info = env.step(action)
        rows.append(_round({"t": info["t"], "action": action.tolist(), "reward": reward, **env.signals()}))
        held = held + 1 if env.success_relative() else 0
        if done or (plan.stop_on_success and held >= SUCCESS_HOLD_STEPS):
            break
    success = env.success_relative()
    env.close()
    return {"scenario": spec.to_dict(), "seed": SEED, "aims_x_m": list(plan.aims_x), "freeze_at": plan.freeze_at,
            "freeze_steps": plan.freeze_steps, "success": success,
            "steps": [{k: r[k] for k in SIGNALS} for r in rows]}


def main() -> None:
    for name, plan in PLANS.items():
        trace = record(plan)
        (HERE / f"{name}.json").write_text(json.dumps(trace, separators=(",", ":")))
        print(name, "success", trace["success"], "steps", len(trace["steps"]))


if __name__ == "__main__":
    main()
