"""robosuite's OSC arm controller for one physics substep, compiled: what lean_step._LeanControlStep
runs on each of the 25 substeps of a control step.

robosuite computes the OSC torques in Python on every substep. The arithmetic is small (7x7
matrices), so the time goes to ~40 numpy calls of ~1-3 us of Python each. These functions do
the same operations in the same order in one numba call: elementwise arithmetic is IEEE-exact
either way, and every product, inverse and robosuite helper is the fixed-order one that
producers/robosuite_arithmetic.py installs into robosuite (BLAS's results depend on the
machine's kernel; these do not), so the compiled code computes what robosuite's stock step then
computes, bit for bit: tests/unit/producers/sim/test_sim_lean_step.py checks it.

    osc_update(...)    OperationalSpaceController.update(): the arm's state, from mjData
    osc_torques(...)   run_controller(): torques for the goal, written to mjData.ctrl
    osc_substep(...)   both, for a substep without a new action (set_goal runs between the two
                       on the substep that brings one)

The MuJoCo calls stay in Python (mujoco.mj_step1/mj_step2/mj_jacSite/mj_fullM), because the
bindings turn a MuJoCo error into an exception there; from compiled code it would end the
process.
"""

from __future__ import annotations

import numba
import numpy as np
from robosuite.utils.control_utils import orientation_error  # np.cross only: no BLAS, robosuite's own

from producers.fixed_order import matmat, matvec
from producers.robosuite_arithmetic import nullspace_torques, opspace_matrices

# ints[] layout: the sites and the index ranges the substep reads and writes
BASE_SITE, REF_SITE, QPOS0, QPOS1, QVEL0, QVEL1, ACT0, ACT1, GRIP0, GRIP1, UNCOUPLING = range(11)
N_INTS = 11


def compiled() -> bool:
    """False when robosuite's numba is switched off (robosuite.macros.ENABLE_NUMBA): then its
    helpers are plain Python, which compiled code cannot call, and a SimEnv runs robosuite's
    stock step."""
    return all(isinstance(f, numba.core.registry.CPUDispatcher)
               for f in (opspace_matrices, orientation_error, nullspace_torques))


@numba.njit(cache=True)
def _clip(x: float, low: float, high: float) -> float:
    """numpy's clip ufunc for one double: NaN passes through, ties keep the bound (so -0.0 at a
    0.0 bound becomes 0.0, as in numpy)."""
    if np.isnan(x):
        return x
    x = x if x > low else low
    return x if x < high else high


# cache=True: compiled once (~10 s) and kept next to this module. The cache does not notice a
# change in robosuite's helpers; robosuite is pinned in pyproject.toml.
@numba.njit(cache=True)
def osc_update(qpos, qvel, site_xpos, site_xmat, ints, jacp, jacr, mass_full,
               origin_pos, origin_ori, ref_pos, ref_ori_mat, ref_pos_vel, ref_ori_vel,
               J_pos, J_ori, J_full, joint_pos, joint_vel, mass_matrix):  # noqa: N803 (robosuite's names)
    """CompositeController.update_state() and OperationalSpaceController.update() under lite
    physics. Reads the mjData views and the Jacobian (jacp, jacr: mj_jacSite of the reference
    site) and full mass matrix (mj_fullM) the caller has just filled; writes the arm's state
    (origin_pos ... mass_matrix) in place. mass_matrix must be Fortran-ordered, as robosuite's is:
    the layout decides which code paths the products in osc_torques take."""
    base, ref = ints[BASE_SITE], ints[REF_SITE]
    qp0, qp1, qv0, qv1 = ints[QPOS0], ints[QPOS1], ints[QVEL0], ints[QVEL1]
    origin_pos[:] = site_xpos[base]
    origin_ori[:, :] = site_xmat[base].reshape((3, 3))
    ref_pos[:] = site_xpos[ref]
    ref_ori_mat[:, :] = site_xmat[ref].reshape((3, 3))
    ref_pos_vel[:] = matvec(jacp, qvel)
    ref_ori_vel[:] = matvec(jacr, qvel)
    J_pos[:, :] = jacp[:, qv0:qv1]
    J_ori[:, :] = jacr[:, qv0:qv1]
    J_full[:3] = J_pos
    J_full[3:] = J_ori
    joint_pos[:] = qpos[qp0:qp1]
    joint_vel[:] = qvel[qv0:qv1]
    mass_matrix[:, :] = mass_full[qv0:qv1, qv0:qv1]


@numba.njit(cache=True)
def osc_torques(qvel, qfrc_bias, ctrl, ints, goal_pos, goal_ori, kp, kd, initial_joint, arm_low, arm_high,
                grip_ctrl, base_jacp, base_jacr, origin_pos, origin_ori, ref_pos, ref_ori_mat, ref_pos_vel,
                ref_ori_vel, J_pos, J_ori, J_full, joint_pos, joint_vel, mass_matrix, torques):  # noqa: N803
    """OperationalSpaceController.run_controller() in the base frame without interpolators, then
    the actuator controls: the arm's torques clipped to their ranges, the gripper's command
    (fixed for the whole control step). base_jacp/base_jacr: mj_jacSite of the base site."""
    qv0, qv1 = ints[QVEL0], ints[QVEL1]
    desired_world_pos = origin_pos + matvec(origin_ori, goal_pos)
    desired_world_ori = matmat(origin_ori, goal_ori)
    ori_error = orientation_error(desired_world_ori, ref_ori_mat)
    position_error = desired_world_pos - ref_pos
    base_pos_vel = matvec(base_jacp, qvel)
    base_ori_vel = matvec(base_jacr, qvel)
    vel_pos_error = -(ref_pos_vel - base_pos_vel)
    desired_force = np.multiply(position_error, kp[0:3]) + np.multiply(vel_pos_error, kd[0:3])
    vel_ori_error = -(ref_ori_vel - base_ori_vel)
    desired_torque = np.multiply(ori_error, kp[3:6]) + np.multiply(vel_ori_error, kd[3:6])
    lambda_full, lambda_pos, lambda_ori, nullspace_matrix = opspace_matrices(mass_matrix, J_full, J_pos, J_ori)
    if ints[UNCOUPLING]:
        decoupled_wrench = np.concatenate((matvec(lambda_pos, desired_force), matvec(lambda_ori, desired_torque)))
    else:
        decoupled_wrench = matvec(lambda_full, np.concatenate((desired_force, desired_torque)))
    torques[:] = matvec(J_full.T, decoupled_wrench) + qfrc_bias[qv0:qv1]
    torques += nullspace_torques(mass_matrix, nullspace_matrix, initial_joint, joint_pos, joint_vel)
    a0, g0 = ints[ACT0], ints[GRIP0]
    for i in range(ints[ACT1] - a0):
        ctrl[a0 + i] = _clip(torques[i], arm_low[i], arm_high[i])
    for i in range(ints[GRIP1] - g0):
        ctrl[g0 + i] = grip_ctrl[i]


@numba.njit(cache=True)
def osc_substep(qpos, qvel, site_xpos, site_xmat, ints, jacp, jacr, mass_full,
                origin_pos, origin_ori, ref_pos, ref_ori_mat, ref_pos_vel, ref_ori_vel,
                J_pos, J_ori, J_full, joint_pos, joint_vel, mass_matrix,  # noqa: N803
                qfrc_bias, ctrl, goal_pos, goal_ori, kp, kd, initial_joint, arm_low, arm_high, grip_ctrl,
                base_jacp, base_jacr, torques):
    """osc_update then osc_torques: a substep that brings no new goal, in one call (one dispatch
    instead of two saves ~3 us a substep, ~2% of a control step)."""
    osc_update(qpos, qvel, site_xpos, site_xmat, ints, jacp, jacr, mass_full, origin_pos, origin_ori, ref_pos,
               ref_ori_mat, ref_pos_vel, ref_ori_vel, J_pos, J_ori, J_full, joint_pos, joint_vel, mass_matrix)
    osc_torques(qvel, qfrc_bias, ctrl, ints, goal_pos, goal_ori, kp, kd, initial_joint, arm_low, arm_high, grip_ctrl,
                base_jacp, base_jacr, origin_pos, origin_ori, ref_pos, ref_ori_mat, ref_pos_vel, ref_ori_vel,
                J_pos, J_ori, J_full, joint_pos, joint_vel, mass_matrix, torques)
