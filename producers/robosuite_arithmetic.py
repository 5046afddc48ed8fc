"""robosuite's (and LIBERO's) arithmetic made machine-independent: what decides an episode goes
through producers/fixed_order.py instead of BLAS and LAPACK.

robosuite computes controller goals and torques, observations (quaternions from rotation
matrices), rewards and object placements with ``np.dot``, ``ndarray.dot``, ``np.linalg.norm``,
``inv``, ``pinv`` and ``eigh``, several of them inside numba functions that call SciPy's
OpenBLAS. Their last bits follow the BLAS kernel the machine picks, and a rollout amplifies a
last bit into a different episode. ``install()`` rebinds, in every loaded robosuite and LIBERO
module:

- the module's ``np`` to FIXED_NUMPY, numpy with ``dot``, ``matmul``, ``inner``, ``vdot`` and
  ``linalg.norm / inv / pinv / eigh`` replaced by their fixed-order equivalents, and ``sin``, ``cos``,
  ``tanh``, ``exp``, ``arccos``, ... by the C library's (numpy's SIMD loops for those differ between
  AVX2 and AVX512 machines); everything else is numpy's own object, so nothing else changes;
- the functions that use ``ndarray.dot`` or numba's BLAS to copies that do the same arithmetic in
  a fixed order: transform_utils' mat2quat, quat2mat, pose_inv, pose_in_A_to_pose_in_B,
  vel_in_A_to_vel_in_B, force_in_A_to_force_in_B, matrix_inverse; control_utils' opspace_matrices
  and nullspace_torques (orientation_error only uses np.cross, no BLAS: robosuite's own stays).

The replacements agree with robosuite's originals to a few ulps (mat2quat: to float32 precision,
as robosuite computes it in float32; tests/unit/producers/test_fixed_order.py), and they are the same on
every machine. It works for robosuite 1.5 (this venv) and 1.4 (the LIBERO venv): the names are the
same. Call ``install()`` after importing the robosuite modules in use and before building an env
(producers/sim/envs.py and producers/libero/env.py do, on import and in make_env); it is
idempotent and patches modules imported since the last call. ``original_arithmetic()`` puts
robosuite's own back for a ``with`` block (the fidelity test compares the two).

Left alone, as outside the episode path of the supported configuration (one Panda, OSC_POSE, no
camera observations): robosuite's IK controller and camera utilities (``@`` with linalg.solve),
mobile bases, ``get_orientation_error``; and numpy's other linalg routines (svd, solve, ...),
which FIXED_NUMPY passes through.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

import numba
import numpy as np

from producers import fixed_order as fo

EPS = np.finfo(float).eps * 4.0  # robosuite's transform_utils.EPS


# -- numpy with fixed-order linear algebra ---------------------------------------------------------

def _module(name: str, base: types.ModuleType, overrides: dict) -> types.ModuleType:
    module = types.ModuleType(name, base.__doc__)
    module.__dict__.update({k: v for k, v in vars(base).items() if not k.startswith("__")})
    module.__dict__.update(overrides)
    return module


FIXED_LINALG = _module("numpy.linalg (fixed order)", np.linalg,
                       {"norm": fo.norm, "inv": fo.inv, "pinv": fo.pinv, "eigh": fo.eigh})
FIXED_NUMPY = _module("numpy (fixed order)", np, {"dot": fo.dot, "matmul": fo.matmul, "vdot": fo.vdot_flat,
                                                  "inner": fo.inner, "linalg": FIXED_LINALG, **fo.TRANSCENDENTAL})


# -- robosuite's functions, in a fixed order ----------------------------------------------------------

@numba.njit(cache=True)
def mat2quat(rmat):
    """transform_utils.mat2quat: the unit eigenvector of the largest eigenvalue of robosuite's
    float32 K matrix (Jacobi instead of LAPACK's eigh), sign fixed as robosuite fixes it; (x, y, z, w)
    float32."""
    m = np.asarray(rmat).astype(np.float32)[:3, :3]
    m00, m01, m02 = m[0, 0], m[0, 1], m[0, 2]
    m10, m11, m12 = m[1, 0], m[1, 1], m[1, 2]
    m20, m21, m22 = m[2, 0], m[2, 1], m[2, 2]
    k = np.array([
        [m00 - m11 - m22, np.float32(0.0), np.float32(0.0), np.float32(0.0)],
        [m01 + m10, m11 - m00 - m22, np.float32(0.0), np.float32(0.0)],
        [m02 + m20, m12 + m21, m22 - m00 - m11, np.float32(0.0)],
        [m21 - m12, m02 - m20, m10 - m01, m00 + m11 + m22],
    ])
    k /= 3.0
    w, v = fo.jacobi_eigh(k.astype(np.float64))  # the lower triangle, as eigh reads it
    q1 = v[np.array([3, 0, 1, 2]), np.argmax(w)].astype(np.float32)
    if q1[0] < 0.0:
        np.negative(q1, q1)
    return q1[np.array([1, 2, 3, 0])]


@numba.njit(cache=True)
def quat2mat(quaternion):
    """transform_utils.quat2mat, its one dot product summed in order (the rest is robosuite's
    code as it is)."""
    q = np.asarray(quaternion).copy().astype(np.float32)[np.array([3, 0, 1, 2])]
    n = fo.vdot(q, q)
    if n < EPS:
        return np.identity(3)
    q *= np.sqrt(2.0 / n)
    q2 = np.outer(q, q)
    return np.array([
        [1.0 - q2[2, 2] - q2[3, 3], q2[1, 2] - q2[3, 0], q2[1, 3] + q2[2, 0]],
        [q2[1, 2] + q2[3, 0], 1.0 - q2[1, 1] - q2[3, 3], q2[2, 3] - q2[1, 0]],
        [q2[1, 3] - q2[2, 0], q2[2, 3] + q2[1, 0], 1.0 - q2[1, 1] - q2[2, 2]],
    ])


@numba.njit(cache=True)
def matrix_inverse(matrix):
    """transform_utils.matrix_inverse."""
    return fo.gauss_jordan_inverse(matrix)


def pose_in_A_to_pose_in_B(pose_A, pose_A_in_B):  # noqa: N802, N803 (robosuite's names)
    """transform_utils.pose_in_A_to_pose_in_B: pose_A_in_B . pose_A."""
    return fo.dot(pose_A_in_B, pose_A)


def pose_inv(pose):
    """transform_utils.pose_inv: [R t; 0 1]^-1 = [R^T -R^T t; 0 1]."""
    inverse = np.zeros((4, 4))
    inverse[:3, :3] = pose[:3, :3].T
    inverse[:3, 3] = -fo.dot(inverse[:3, :3], pose[:3, 3])
    inverse[3, 3] = 1.0
    return inverse


def _skew(pos):
    return np.array([0.0, -pos[2], pos[1], pos[2], 0.0, -pos[0], -pos[1], pos[0], 0.0]).reshape((3, 3))


def vel_in_A_to_vel_in_B(vel_A, ang_vel_A, pose_A_in_B):  # noqa: N802, N803
    """transform_utils.vel_in_A_to_vel_in_B."""
    pos_A_in_B, rot_A_in_B = pose_A_in_B[:3, 3], pose_A_in_B[:3, :3]  # noqa: N806
    skew = _skew(pos_A_in_B)
    vel_B = fo.dot(rot_A_in_B, vel_A) + fo.dot(skew, fo.dot(rot_A_in_B, ang_vel_A))  # noqa: N806
    return vel_B, fo.dot(rot_A_in_B, ang_vel_A)


def force_in_A_to_force_in_B(force_A, torque_A, pose_A_in_B):  # noqa: N802, N803
    """transform_utils.force_in_A_to_force_in_B."""
    pos_A_in_B, rot_A_in_B = pose_A_in_B[:3, 3], pose_A_in_B[:3, :3]  # noqa: N806
    skew = _skew(pos_A_in_B)
    rot_t = np.ascontiguousarray(rot_A_in_B.T)
    force_B = fo.dot(rot_t, force_A)  # noqa: N806
    torque_B = -fo.dot(rot_t, fo.dot(skew, force_A)) + fo.dot(rot_t, torque_A)  # noqa: N806
    return force_B, torque_B


@numba.njit(cache=True)
def nullspace_torques(mass_matrix, nullspace_matrix, initial_joint, joint_pos, joint_vel, joint_kp=10):
    """control_utils.nullspace_torques: N^T (M (kp (q0 - q) - kv qdot)), kv = 2 sqrt(kp)."""
    joint_kv = np.sqrt(joint_kp) * 2
    pose_torques = fo.matvec(mass_matrix, joint_kp * (initial_joint - joint_pos) - joint_kv * joint_vel)
    return fo.vecmat(pose_torques, nullspace_matrix)


@numba.njit(cache=True)
def opspace_matrices(mass_matrix, J_full, J_pos, J_ori):  # noqa: N803
    """control_utils.opspace_matrices: (lambda_full, lambda_pos, lambda_ori, nullspace_matrix).
    The mass matrix and the J M^-1 J^T are symmetric positive definite away from a singular arm:
    inverted through Cholesky, and where one is not clearly positive definite, pseudo-inverted from
    its eigenvalues as robosuite's pinv (fixed_order.spd_inverse)."""
    mass_matrix_inv = fo.spd_inverse(mass_matrix)
    lambda_full = fo.spd_inverse(fo.matmat(fo.matmat(J_full, mass_matrix_inv), J_full.T))
    lambda_pos = fo.spd_inverse(fo.matmat(fo.matmat(J_pos, mass_matrix_inv), J_pos.T))
    lambda_ori = fo.spd_inverse(fo.matmat(fo.matmat(J_ori, mass_matrix_inv), J_ori.T))
    jbar = fo.matmat(fo.matmat(mass_matrix_inv, J_full.T), lambda_full)
    nullspace_matrix = np.eye(J_full.shape[-1], J_full.shape[-1]) - fo.matmat(jbar, J_full)
    return lambda_full, lambda_pos, lambda_ori, nullspace_matrix


# The packages whose modules are rebound: robosuite, and LIBERO, which builds its tasks' success
# predicates on it (np.linalg.norm of object distances).
PACKAGES = ("robosuite", "libero")
REPLACEMENTS = {
    "robosuite.utils.transform_utils": ("mat2quat", "quat2mat", "matrix_inverse", "pose_in_A_to_pose_in_B",
                                        "pose_inv", "vel_in_A_to_vel_in_B", "force_in_A_to_force_in_B"),
    "robosuite.utils.control_utils": ("opspace_matrices", "nullspace_torques"),
}
_mine = {name: globals()[name] for names in REPLACEMENTS.values() for name in names}
_originals: dict[int, object] = {}  # id(original) -> original, for original_arithmetic()
_swaps: dict[int, object] = {}  # id(original) -> replacement; also id(numpy) -> FIXED_NUMPY
_patched: list[tuple[types.ModuleType, str, object]] = []  # (module, attribute, original)
_suspended = False  # inside original_arithmetic(): install() leaves robosuite's own in place


def _plan() -> None:
    """Which objects get which replacement, read off the defining robosuite modules once."""
    if _swaps:
        return
    for module_name, names in REPLACEMENTS.items():
        module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
        for name in names:
            original = getattr(module, name, None)
            if original is not None:
                _swaps[id(original)] = _mine[name]
                _originals[id(original)] = original
    _swaps[id(np)] = FIXED_NUMPY
    _originals[id(np)] = np


def install() -> None:
    """Rebinds, in every robosuite module loaded now, numpy and the functions in REPLACEMENTS
    (wherever a module holds them: ``from control_utils import *`` copies them)."""
    if _suspended:
        return
    _plan()
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.partition(".")[0] not in PACKAGES:
            continue
        for attr, value in list(vars(module).items()):
            swap = _swaps.get(id(value))
            if swap is not None and _originals[id(value)] is value:
                setattr(module, attr, swap)
                _patched.append((module, attr, value))


@contextmanager
def original_arithmetic() -> Iterator[None]:
    """robosuite's own arithmetic (BLAS) inside the block, envs built there included; the
    fixed-order one again after it."""
    global _suspended
    for module, attr, original in reversed(_patched):
        setattr(module, attr, original)
    _patched.clear()
    _suspended = True
    try:
        yield
    finally:
        _suspended = False
        install()
