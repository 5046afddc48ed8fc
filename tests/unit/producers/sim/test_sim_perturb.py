import numpy as np
import pytest

from producers.sim.perturb import Push, apply_perturbations
from producers.sim.policies import OracleScripted
from producers.sim.rollout import run_episode


def test_push_validation_quotes_value():
    with pytest.raises(ValueError, match="'elbow'"):
        Push(target="elbow", force_xyz=(1, 0, 0), start_step=0, duration_steps=1)
    with pytest.raises(ValueError, match="500"):
        Push(target="object", force_xyz=(500, 0, 0), start_step=0, duration_steps=1)
    with pytest.raises(ValueError, match="0"):
        Push(target="hand", force_xyz=(1, 0, 0), start_step=0, duration_steps=0)
    p = Push(target="object", force_xyz=(1, 0, 0), start_step=3, duration_steps=2)
    assert [p.active(t) for t in range(6)] == [False, False, False, True, True, False]


def test_push_sets_and_clears_xfrc(lift_env):
    lift_env.reset(0)
    push = Push(target="object", force_xyz=(0.5, -0.5, 0.0), start_step=2, duration_steps=2)
    body = lift_env.body_for("object")
    seen = []
    for t in range(5):
        active = apply_perturbations(lift_env, [push], t)
        seen.append((len(active), lift_env.data.xfrc_applied[body, :3].tolist()))
        lift_env.step(np.zeros(7))
    assert seen[1] == (0, [0.0, 0.0, 0.0])
    assert seen[2] == (1, [0.5, -0.5, 0.0]) and seen[3] == (1, [0.5, -0.5, 0.0])
    assert seen[4] == (0, [0.0, 0.0, 0.0])
    apply_perturbations(lift_env, [push], 2)
    lift_env.reset(0)
    assert not lift_env.data.xfrc_applied.any()  # a reset clears every force


def test_one_newton_push_during_descent_makes_the_oracle_miss(lift_env):
    # The oracle descends from about step 12; the 0.07 kg cube slides under a 1 N push.
    push = Push(target="object", force_xyz=(1.0, 0.0, 0.0), start_step=15, duration_steps=20)
    for seed in (0, 1, 2):
        clean, _ = run_episode(lift_env, OracleScripted(), seed)
        pushed, steps = run_episode(lift_env, OracleScripted(), seed, perturbations=[push])
        assert clean.success and not pushed.success
        assert max(s.signals["object_lift"] for s in steps) < 0.03


def test_push_on_the_hand_deflects_it(lift_env):
    def final_y(force):
        lift_env.reset(0)
        push = Push(target="hand", force_xyz=(0.0, force, 0.0), start_step=0, duration_steps=10)
        for t in range(10):
            apply_perturbations(lift_env, [push], t)
            lift_env.step(np.zeros(7))
        return lift_env.signals()["eef_pos"][1]
    assert final_y(20.0) - final_y(0.0) > 0.02
