"""The recorder as an eval farm uses it: a producer that is not SimEnv (a point-mass "arm" with a
two-finger hand, hand-made signals following the conventions in producers/recorder.py) publishes
through a real broker, and the failure detector's stage finds exactly the moments those
conventions imply."""

from __future__ import annotations

import math
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from infra.kafka_clients import make_producer
from producers.publisher import Publisher
from producers.recorder import EpisodeIdentity, EpisodeRecorder, task_scenario
from schemas.catalog import BY_NAME
from streams.deadletter import RawMessage
from streams.failures.detector import DetectorConfig
from streams.failures.router import DetectorStage, RouterConfig

CFG = DetectorConfig()
TABLE_Z = 0.0
BLOCK = "block"
BLOCK_HALF_M = 0.02  # a 4 cm block
OPEN_M = 0.08
CLOSE_PER_STEP_M = 0.01
SPEED_M = 0.02  # hand travel per step
GOAL_LIFT_M = 0.04  # the task: lift the block 4 cm


class PointMassArm:
    """A hand that flies straight to where it is sent; fingers that close on what is between them.
    Three "joints": the hand's x, y, z. No robot links, so no "robot" contacts."""

    def __init__(self, block_xy=(0.5, 0.0)):
        self.hand = [0.3, 0.0, 0.3]
        self.block = [block_xy[0], block_xy[1], TABLE_Z + BLOCK_HALF_M]
        self.start_z = self.block[2]
        self.opening = OPEN_M
        self.grip = False

    def step(self, action: list[float]) -> None:
        target = action[:3]
        d = [t - h for t, h in zip(target, self.hand, strict=True)]
        n = math.sqrt(sum(v * v for v in d))
        scale = min(1.0, SPEED_M / n) if n > 0 else 0.0
        self.hand = [h + v * scale for h, v in zip(self.hand, d, strict=True)]
        between = self.grip or (math.hypot(self.hand[0] - self.block[0], self.hand[1] - self.block[1])
                                < BLOCK_HALF_M and abs(self.hand[2] - self.block[2]) < BLOCK_HALF_M)
        if action[-1] > 0:  # +1 closes
            stop = 2 * BLOCK_HALF_M if between else 0.0
            self.opening = max(stop, self.opening - CLOSE_PER_STEP_M)
            self.grip = between and self.opening <= 2 * BLOCK_HALF_M
        else:
            self.opening, self.grip = min(OPEN_M, self.opening + CLOSE_PER_STEP_M), False
        if self.grip:
            self.block = [self.hand[0], self.hand[1], max(self.start_z, self.hand[2])]

    def signals(self) -> dict:
        lift = self.block[2] - self.start_z
        contacts = [] if lift > 0.001 else [{"a": BLOCK, "b": "table", "normal_force": 0.4}]
        if self.grip:
            contacts.append({"a": BLOCK, "b": "gripper", "normal_force": 40.0})
        return {"eef_pos": list(self.hand), "eef_quat": [1.0, 0.0, 0.0, 0.0], "gripper_opening": self.opening,
                "gripper_force": 40.0 if self.grip else 0.0,
                "object_poses": [{"name": BLOCK, "pos": list(self.block), "quat": [0.0, 0.0, 0.0, 1.0]}],
                "contacts": contacts, "joint_torques": [0.0, 0.0, 9.8], "joint_pos": list(self.hand),
                "goal_distance": max(0.0, GOAL_LIFT_M - lift), "object_lift": lift}


def run_farm_episode(publisher: Publisher, run_id: str, seed: int, aim_dx: float, horizon: int = 90) -> list[dict]:
    """Approach above the block (believed ``aim_dx`` off), descend, close, lift; returns the signals."""
    arm = PointMassArm()
    identity = EpisodeIdentity(run_id, "pointmass-farm", "lift-block", task_scenario(
        "pointmass-farm", "lift-block", "lift the block", horizon), "farm-policy", "0.1", seed,
        simulator="pointmass 0.1")
    seen, closing_since = [], None
    with EpisodeRecorder(publisher, identity) as recorder:
        for t in range(horizon):
            aim = [arm.block[0] + aim_dx, arm.block[1]]
            if closing_since is None:
                above = abs(arm.hand[0] - aim[0]) + abs(arm.hand[1] - aim[1]) < 1e-6
                target = [*aim, arm.block[2]] if above else [*aim, arm.block[2] + 0.1]
                grip = -1.0
                if above and abs(arm.hand[2] - arm.block[2]) < 1e-6:
                    closing_since, grip = t, 1.0
            else:
                grip = 1.0
                target = list(arm.hand) if t - closing_since < 6 else [arm.hand[0], arm.hand[1], 0.21]
            arm.step([*target, grip])
            signals = arm.signals()
            seen.append(signals)
            success = signals["object_lift"] >= GOAL_LIFT_M
            recorder.step([*target, grip], signals, float(success), success)
            if success:
                recorder.end(True, "success")
                break
        else:
            recorder.end(False, "timeout")
    return seen


def read_back(bootstrap: str, prefix: str, idle_s: float = 2.0, timeout_s: float = 30.0) -> list[RawMessage]:
    """The rollout topics' messages, per partition in offset order, the two topics interleaved."""
    names = [BY_NAME[n].full_name(prefix) for n in ("rollout.episodes", "rollout.steps")]
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"farm-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    out: list[RawMessage] = []
    try:
        metadata = consumer.list_topics(timeout=10).topics
        consumer.assign([TopicPartition(n, p, OFFSET_BEGINNING) for n in names for p in metadata[n].partitions])
        start = last = time.monotonic()
        while time.monotonic() - start < timeout_s and time.monotonic() - last < idle_s:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                out.append(RawMessage(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value()))
                last = time.monotonic()
    finally:
        consumer.close()
    return out


def first_stall(signals: list[dict]) -> int:
    """The first step ending a window of stall_window_steps in which goal_distance improved less
    than stall_min_progress_m and the hand stayed within stall_max_eef_travel_m of where it began."""
    w = CFG.stall_window_steps
    for t in range(w, len(signals)):
        window = signals[t - w:t + 1]
        goals = [s["goal_distance"] for s in window]
        if goals[0] - min(goals) < CFG.stall_min_progress_m and goals[-1] > CFG.goal_reached_m and all(
                math.dist(window[0]["eef_pos"], s["eef_pos"]) < CFG.stall_max_eef_travel_m for s in window):
            return t
    raise AssertionError("no stall in the signals")


def test_a_farm_that_is_not_simenv_gets_the_moments_its_signals_imply(broker, prefix):
    publisher = Publisher(make_producer(broker), prefix)
    run_id = f"farm-{uuid.uuid4().hex[:8]}"
    missed = run_farm_episode(publisher, run_id, seed=0, aim_dx=0.06)  # closes 6 cm beside the block
    lifted = run_farm_episode(publisher, run_id, seed=1, aim_dx=0.0)
    publisher.flush()

    stage = DetectorStage(CFG, RouterConfig(), prefix, "farm-test")
    out = stage.process(read_back(broker, prefix))
    assert [o.topic for o in out if o.topic == "deadletter"] == []
    analysed = [stage.codec.decode(o.value) for o in out if o.topic == "failures.episodes"]
    assert sorted(e["success"] for e in analysed) == [False, True]
    miss, success = sorted(analysed, key=lambda e: e["success"])

    # The conventions say: the fingers shut (gripper_opening, m) with no force on the target
    # (gripper_force) within grasp_settle_steps of the close command (action[-1] > 0): a grasp_miss
    # at the step the opening falls to closed_empty_opening_m; the hand then stays still with no
    # progress (goal_distance) for stall_window_steps: a stall; the horizon ends it: a timeout.
    shut = next(t for t, s in enumerate(missed) if s["gripper_opening"] <= CFG.closed_empty_opening_m)
    assert [(m["failure_type"], m["step"]) for m in miss["moments"]] == [
        ("grasp_miss", shut), ("stall", first_stall(missed)), ("timeout", len(missed) - 1)]
    assert all(m["recovered_step"] == -1 for m in miss["moments"])
    grasp = miss["moments"][0]["features"]
    assert grasp["object_dx"] == 0.0 and abs(grasp["eef_x"] - (grasp["object_x"] + 0.06)) < 1e-6
    assert (miss["termination"], miss["steps"], miss["analysed"]) == ("timeout", len(missed), True)
    assert miss["scenario"]["env_name"] == "lift-block"

    # pads on the target (gripper_force) and the target rising (object_lift): held, no failure
    assert success["moments"] == [] and success["termination"] == "success" and success["steps"] == len(lifted)
