import numpy as np
import pytest

from producers.quality import (
    QualityConfig,
    execution_quality,
    idle_steps,
    path_efficiency,
    regrasp_count,
    smoothness_jerk,
    time_to_success,
)

AVRO_KEYS = {"smoothness_jerk", "path_efficiency", "peak_contact_force", "mean_contact_force",
             "time_to_success", "regrasp_count", "idle_steps"}


def sig(pos, force=0.0, contacts=()):
    return {"eef_pos": list(pos), "gripper_force": force, "contacts": list(contacts)}


def test_constant_velocity_has_zero_jerk_and_full_efficiency():
    p = np.array([[0.01 * t, 0.0, 0.0] for t in range(20)])
    assert smoothness_jerk(p) == pytest.approx(0.0, abs=1e-9)
    assert path_efficiency(p) == pytest.approx(1.0)


def test_jerk_scales_with_control_rate():
    p = np.zeros((6, 3))
    p[3, 0] = 0.001  # one 1 mm blip
    j20 = smoothness_jerk(p, 20.0)
    assert j20 > 0 and smoothness_jerk(p, 40.0) == pytest.approx(j20 * 2**6)


def test_path_efficiency_of_a_detour():
    p = np.array([[0, 0, 0], [1, 1, 0], [2, 0, 0]], dtype=float)
    assert path_efficiency(p) == pytest.approx(2 / (2 * np.sqrt(2)))
    assert path_efficiency(np.zeros((5, 3))) == 1.0


def test_idle_steps_counts_slow_steps():
    p = np.array([[0, 0, 0], [0, 0, 0], [0.01, 0, 0], [0.0101, 0, 0]], dtype=float)
    # speeds: 0, 0.2, 0.002 m/s at 20 Hz
    assert idle_steps(p) == 2
    assert idle_steps(p, QualityConfig(idle_speed_mps=0.001)) == 1


def test_regrasp_count_with_hysteresis():
    g = [-1, 1, 1, -1, -1, 1, 0.3, 1, -1, 1]
    # close (grasp), open, close on nothing (regrasp), noise 0.3 (no change), open, close while holding
    forces = [0, 20, 20, 0, 0, 0, 0, 0, 0, 15]
    actions = [[0] * 6 + [x] for x in g]
    signals = [sig((0, 0, 0), f) for f in forces]
    assert regrasp_count(actions, signals) == 1
    noisy = [[0] * 6 + [x] for x in (1, 0.2, 0.9, 0.1, 1)]
    assert regrasp_count(noisy, [sig((0, 0, 0))] * 5) == 0


def test_time_to_success():
    assert time_to_success([False, False, True, True]) == 2
    assert time_to_success([False] * 3) is None


def test_execution_quality_keys_and_contact_forces():
    contacts = [[{"a": "cube", "b": "table", "normal_force": 0.7}],
                [{"a": "cube", "b": "gripper", "normal_force": 30.0},
                 {"a": "cube", "b": "table", "normal_force": 0.2}],
                [{"a": "gripper", "b": "table", "normal_force": 10.0},
                 {"a": "robot", "b": "table", "normal_force": 2.0}]]
    signals = [sig((0.01 * t, 0, 0), contacts=c) for t, c in enumerate(contacts)]
    q = execution_quality(signals, [[0] * 7] * 3, [False, False, True])
    assert set(q) == AVRO_KEYS
    assert q["peak_contact_force"] == 30.0
    assert q["mean_contact_force"] == pytest.approx((30.0 + 12.0) / 2)  # steps with robot contact only
    assert q["time_to_success"] == 2 and q["regrasp_count"] == 0
    assert execution_quality(signals, [[0] * 7] * 3)["time_to_success"] is None
    with pytest.raises(ValueError, match="3 signal dicts but 2 actions"):
        execution_quality(signals, [[0] * 7] * 2)
