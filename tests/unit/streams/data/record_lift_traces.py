"""Records the real robosuite traces the detector tests replay (golden files beside this script).

A scripted Panda Lift policy (move above the cube, descend, close, lift) on one scenario with a
box distractor, run twice with the same seed: once aimed at the cube (a clean success) and once
aimed 6 cm beside it (the fingers close on nothing). Signals are rounded to 5 decimals.

Usage (needs the simulator, ~10 s):
    .venv/bin/python tests/unit/streams/data/record_lift_traces.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import producers.sim  # noqa: F401  (sets MUJOCO_GL before mujoco is imported)
from producers.sim.envs import make_env
from producers.sim.scenario import Distractor, ScenarioSpec

HERE = Path(__file__).parent
SEED = 7
HORIZON = 120
GAIN = 10.0  # action per metre of position error
CLOSE_STEPS = 10  # steps the gripper gets to close before lifting
LIFT_TO_Z = 1.05  # m, world height the hand lifts to
SIGNALS = ("t", "action", "eef_pos", "eef_quat", "gripper_opening", "gripper_force", "object_poses", "contacts",
           "joint_torques", "joint_pos", "reward", "goal_distance", "object_lift")


def _round(value):
    if isinstance(value, float):
        return round(value, 5)
    if isinstance(value, list):
        return [_round(v) for v in value]
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value


def record(aim_offset_x: float) -> dict:
    spec = ScenarioSpec(env_name="Lift", horizon=HORIZON, instruction="lift the cube",
                        distractors=(Distractor(kind="box", size=0.02, x=0.12, y=0.1),))
    env = make_env(spec)
    env.reset(SEED)
    rows, phase, close_t = [], "above", 0
    for _ in range(HORIZON):
        s = env.signals()
        eef = np.array(s["eef_pos"])
        cube = np.array(s["object_poses"][0]["pos"]) + [aim_offset_x, 0.0, 0.0]
        action = np.zeros(7)
        if phase == "above":
            target, action[6] = cube + [0.0, 0.0, 0.10], -1.0
            if np.linalg.norm(target - eef) < 0.01:
                phase = "down"
        if phase == "down":
            target, action[6] = cube, -1.0
            if np.linalg.norm(target - eef) < 0.008:
                phase, close_t = "close", env.steps
        if phase == "close":
            target, action[6] = eef, 1.0
            if env.steps - close_t > CLOSE_STEPS:
                phase = "lift"
        if phase == "lift":
            target, action[6] = np.array([eef[0], eef[1], LIFT_TO_Z]), 1.0
        action[:3] = np.clip((target - eef) * GAIN, -1.0, 1.0)
        _, reward, done, info = env.step(action)
        rows.append(_round({"t": info["t"], "action": action.tolist(), "reward": reward, **env.signals()}))
        if done:
            break
    success = env.success_relative()
    env.close()
    return {"scenario": spec.to_dict(), "seed": SEED, "aim_offset_x_m": aim_offset_x, "success": success,
            "steps": [{k: r[k] for k in SIGNALS} for r in rows]}


def main() -> None:
    for name, offset in (("lift_success", 0.0), ("lift_miss", 0.06)):
        trace = record(offset)
        (HERE / f"{name}.json").write_text(json.dumps(trace, separators=(",", ":")))
        print(name, "success", trace["success"], "steps", len(trace["steps"]))


if __name__ == "__main__":
    main()
