"""The lean control step (envs._LeanControlStep) against robosuite's stock MujocoEnv.step: two envs
of one scenario, one seed, the same actions; the simulator state, the controller's goal and
torques, the observation clock, robosuite's observations, reward and our signals must be
bit-identical after every step. (robosuite's proprioceptive history buffers, which nothing here
reads, are the one thing the lean step does not keep.)

Both run the fixed-order arithmetic producers/robosuite_arithmetic.py installs into robosuite, so
the comparison holds bit for bit on every machine, whatever BLAS kernel numpy picked. Against
robosuite's own BLAS arithmetic (``original_arithmetic``) the lean step is compared with a stated
tolerance instead: there the last bits follow the machine's kernel."""

import numpy as np
import pytest
from robosuite.utils.control_utils import orientation_error

from producers.robosuite_arithmetic import nullspace_torques, opspace_matrices, original_arithmetic
from producers.sim import osc_substep
from producers.sim.envs import _LeanControlStep, make_env
from producers.sim.policies import make_policy
from schemas.scenario import Distractor, ScenarioSpec


def _state(env) -> dict[str, bytes]:
    """Everything that decides what comes next, as bytes (so -0.0 != 0.0 and NaN == NaN)."""
    rs, d = env.robosuite_env, env.data
    arm = rs.robots[0].composite_controller.part_controllers["right"]
    state = {name: np.asarray(getattr(d, name)).tobytes()
             for name in ("qpos", "qvel", "act", "ctrl", "qacc", "qacc_warmstart", "qfrc_actuator", "time")}
    state["goal"] = np.concatenate([arm.goal_pos, arm.goal_ori.ravel(), arm.torques]).tobytes()
    state["gripper"] = rs.robots[0].gripper["right"].current_action.tobytes()
    state["clock"] = repr([(o._time_since_last_sample, o._sampled) for o in rs._observables.values()]).encode()
    state["robosuite"] = repr((rs.timestep, rs.cur_time, rs.done)).encode()
    return state


def _obs_bytes(obs: dict) -> dict[str, bytes]:
    return {k: np.asarray(v, dtype=np.float64).tobytes() for k, v in obs.items()}


def _diff(lean, stock) -> list[str]:
    a, b = _state(lean), _state(stock)
    return [k for k in a if a[k] != b[k]]


def _run_both(spec: ScenarioSpec, seed: int, steps: int, policy: str = "scripted-novice", tweak=None):
    """Steps a lean and a stock env side by side, the policy reading the lean one; returns
    [(step, [what differs])], step -1 being the state after reset (empty list: identical)."""
    lean, stock = make_env(spec), make_env(spec)
    stock.robosuite_env.lean_step = False
    try:
        obs = lean.reset(seed)
        stock.reset(seed)
        if tweak is not None:
            tweak(lean, stock)
        signals = lean.signals()
        pol = make_policy(policy)
        pol.reset(seed, spec)
        diffs = [(-1, wrong)] if (wrong := _diff(lean, stock)) else []
        for t in range(steps):
            action = pol.act(obs, signals)
            obs, reward, _, info = lean.step(action)
            obs_s, reward_s, _, info_s = stock.step(action)
            signals = lean.signals()
            wrong = _diff(lean, stock)
            oa, ob = _obs_bytes(obs), _obs_bytes(obs_s)
            wrong += [f"obs.{k}" for k in sorted(set(oa) | set(ob)) if oa.get(k) != ob.get(k)]
            if reward != reward_s or info != info_s or signals != stock.signals():
                wrong.append("reward/info/signals")
            if wrong:
                diffs.append((t, wrong))
        assert lean.robosuite_env._lean is not None, "the lean step never ran"
        assert stock.robosuite_env._lean is None, "the stock env ran the lean step"
        return diffs
    finally:
        lean.close()
        stock.close()


def test_lift_lean_step_is_bit_identical_to_robosuite():
    spec = ScenarioSpec(env_name="Lift", horizon=70, instruction="lift")
    # the oracle approaches, closes on the cube at step ~29 and holds it 15 cm up from step ~55:
    # free motion, the gripper closing, contact and a lifted load all run through both steps
    assert _run_both(spec, seed=4, steps=70, policy="oracle") == []
    # numba compiles one specialization per array layout; a second one would mean the lean step
    # handed the jitted helpers differently laid out arrays than robosuite's step does
    for jitted in (opspace_matrices, orientation_error, nullspace_torques):
        assert len(getattr(jitted, "signatures", ())) <= 1, jitted.signatures


@pytest.mark.parametrize("env_name", ["Stack", "PickPlaceCan"])
def test_other_envs_lean_step_is_bit_identical(env_name):
    # scripted-novice closes the gripper on the object by step ~60 in both
    spec = ScenarioSpec(env_name=env_name, horizon=70, instruction="task", object_friction=0.5,
                        distractors=(Distractor(kind="box", size=0.02, x=0.12, y=0.12),))
    assert _run_both(spec, seed=2, steps=70) == []


def test_observables_off_the_shared_clock_fall_back_to_robosuites_update():
    def detune(*envs):  # one observable sampled at 10 Hz: the observables no longer share one clock
        for env in envs:
            env.robosuite_env._observables["robot0_eef_pos"].set_sampling_rate(10)

    spec = ScenarioSpec(env_name="Lift", horizon=20, instruction="lift")
    assert _run_both(spec, seed=1, steps=20, tweak=detune) == []


def test_the_comparison_can_fail():
    """A nudge of 1e-9 rad/s to one joint velocity of one env must show up, and stay."""

    def nudge(lean, stock):
        lean.data.qvel[0] += 1e-9

    spec = ScenarioSpec(env_name="Lift", horizon=10, instruction="lift")
    diffs = _run_both(spec, seed=0, steps=10, tweak=nudge)
    assert diffs[0] == (-1, ["qvel"])
    assert [t for t, _ in diffs] == list(range(-1, 10))  # it never goes away
    assert "qpos" in diffs[1][1] and "ctrl" in diffs[1][1]


def test_lean_step_only_for_the_configuration_it_reproduces(lift_env):
    rs = lift_env.robosuite_env
    lift_env.reset(0)
    assert _LeanControlStep.supports(rs)
    arm = rs.robots[0].composite_controller.part_controllers["right"]
    saved = arm.input_ref_frame
    arm.input_ref_frame = "world"
    try:
        assert not _LeanControlStep.supports(rs)
    finally:
        arm.input_ref_frame = saved


def test_without_robosuites_numba_the_stock_step_runs(lift_env, monkeypatch):
    # robosuite.macros.ENABLE_NUMBA = False leaves its helpers plain Python: nothing to compile against
    monkeypatch.setattr(osc_substep, "compiled", lambda: False)
    rs = lift_env.robosuite_env
    lift_env.reset(0)
    assert not _LeanControlStep.supports(rs)
    lift_env.step(np.zeros(7))
    assert rs._lean is None


def test_compiled_clip_matches_numpys_clip_bit_for_bit():
    values = [-0.0, 0.0, -80.0, 80.0, -80.5, 80.5, 1e-300, np.nan, np.inf, -np.inf, 3.25]
    for low, high in ((-80.0, 80.0), (0.0, 1.0), (-1.0, -0.0)):
        for x in values:
            expected = np.clip(np.array([x]), low, high)[0]
            got = osc_substep._clip(x, low, high)
            assert np.array([got]).tobytes() == np.array([expected]).tobytes(), (x, low, high)


def test_lean_step_tracks_robosuites_own_blas_arithmetic_within_tolerance():
    """The stock step with robosuite's original arithmetic (BLAS, whatever kernel this machine
    has) against the lean, fixed-order one: the last bits differ, the episode does not. Over the
    oracle's approach, grasp and lift the joint positions stay within 1e-9 rad, the object within
    1e-9 m, and both succeed at the same step. (Seen: ~4e-15 under this machine's kernel and under
    Prescott's; contact can amplify a last bit, so the bound leaves a wide margin.)"""
    spec = ScenarioSpec(env_name="Lift", horizon=70, instruction="lift")
    lean = make_env(spec)
    try:
        with original_arithmetic():
            stock = make_env(spec)
            stock.robosuite_env.lean_step = False
            try:
                obs = lean.reset(4)
                stock.reset(4)
                pol = make_policy("oracle")
                pol.reset(4, spec)
                worst_q, worst_obj = 0.0, 0.0
                for _ in range(70):
                    action = pol.act(obs, lean.signals())
                    obs, _, _, info = lean.step(action)
                    _, _, _, info_s = stock.step(action)
                    worst_q = max(worst_q, float(np.max(np.abs(lean.data.qpos - stock.data.qpos))))
                    assert info["success"] == info_s["success"]
                assert lean.success_relative() and stock.success_relative()
                obj, obj_s = (env.data.xpos[env._manip.body_id] for env in (lean, stock))
                worst_obj = float(np.max(np.abs(obj - obj_s)))
            finally:
                stock.close()
    finally:
        lean.close()
    assert worst_q <= 1e-9 and worst_obj <= 1e-9, (worst_q, worst_obj)
