"""producers/fixed_order.py and producers/robosuite_arithmetic.py: the machine-independent
arithmetic agrees with numpy's BLAS and LAPACK (and with robosuite's originals) within stated
tolerances, and is what robosuite runs once installed.

Tolerances: products and norms within 8 ulps of the result's magnitude (numpy's BLAS sums in
another order, with or without fused multiply-adds); inverses and pseudo-inverses within 1e-12 of
the largest entry for matrices with condition numbers below 1e3 (the mass matrices and J M^-1 J^T
of a Panda away from singularities are); eigenvalues within 1e-12 of the largest; mat2quat within
float32 precision (robosuite computes it in float32)."""

import math

import numpy as np
import pytest

from producers import fixed_order as fo
from producers import robosuite_arithmetic as ra

ULP = np.finfo(float).eps


def _rng(seed=0):
    return np.random.default_rng(seed)


def _spd(n, rng, cond=50.0):
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (q * np.geomspace(1.0, cond, n)) @ q.T


@pytest.mark.parametrize("shapes", [((3,), (3,)), ((7,), (7,)), ((3, 7), (7,)), ((7,), (7, 6)), ((4, 4), (4, 4)),
                                    ((6, 7), (7, 6)), ((3, 3), (3, 3))])
def test_dot_agrees_with_numpy(shapes):
    rng = _rng(1)
    for _ in range(20):
        a, b = rng.standard_normal(shapes[0]), rng.standard_normal(shapes[1])
        got, want = fo.dot(a, b), np.dot(a, b)
        assert np.shape(got) == np.shape(want)
        scale = np.dot(np.abs(a), np.abs(b))
        assert np.all(np.abs(got - want) <= 8 * ULP * np.maximum(scale, 1e-300))


def test_dot_is_numpys_for_scalars_integers_and_dtypes():
    assert fo.dot(2.0, np.array([1.0, 2.0])).tolist() == [2.0, 4.0]
    assert fo.dot(np.array([1, 2]), np.array([3, 4])) == 11
    q = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    assert isinstance(fo.dot(q, q), np.float32)
    with pytest.raises(ValueError, match="not aligned"):
        fo.dot(np.ones((2, 3)), np.ones(2))


def test_norm_inv_pinv_eigh_agree_with_numpy():
    rng = _rng(2)
    for n in (3, 6, 7):
        m = _spd(n, rng)
        top = np.max(np.abs(np.linalg.inv(m)))
        assert np.max(np.abs(fo.inv(m) - np.linalg.inv(m))) <= 1e-12 * top
        assert np.max(np.abs(fo.spd_inverse(m) - np.linalg.inv(m))) <= 1e-12 * top
        assert np.max(np.abs(fo.pinv(m) - np.linalg.pinv(m))) <= 1e-12 * top
        w, v = fo.eigh(m)
        w_np, _ = np.linalg.eigh(m)
        assert np.max(np.abs(w - w_np)) <= 1e-12 * np.max(np.abs(w_np))
        assert np.max(np.abs(m @ v - v * w)) <= 1e-12 * np.max(np.abs(w_np))  # m v = v diag(w)
        x = rng.standard_normal(n)
        assert abs(fo.norm(x) - np.linalg.norm(x)) <= 8 * ULP * np.linalg.norm(x)
    rect = rng.standard_normal((3, 5))
    assert np.max(np.abs(fo.pinv(rect) - np.linalg.pinv(rect))) <= 1e-10
    singular = np.diag([2.0, 1.0, 0.0])  # a singular arm: pinv drops the zero direction, as numpy's does
    assert np.array_equal(fo.spd_inverse(singular), np.diag([0.5, 1.0, 0.0]))
    with pytest.raises(np.linalg.LinAlgError):
        fo.inv(np.zeros((3, 3)))
    assert fo.norm(np.ones((2, 2)), axis=1).tolist() == [math.sqrt(2)] * 2  # numpy's, no BLAS on that path


def test_transcendentals_are_the_c_librarys():
    x = np.linspace(-3, 3, 13)
    for name, fn in (("sin", math.sin), ("cos", math.cos), ("tanh", math.tanh), ("arctan", math.atan)):
        got = fo.TRANSCENDENTAL[name](x)
        assert got.tolist() == [fn(v) for v in x.tolist()]
        assert np.max(np.abs(got - getattr(np, name)(x))) <= 2 * ULP  # numpy's SIMD loop: within an ulp or two
    assert fo.TRANSCENDENTAL["cos"](np.float32(0.5)).dtype == np.float32
    assert math.isnan(fo.TRANSCENDENTAL["arccos"](2.0)) and fo.TRANSCENDENTAL["log"](0.0) == -math.inf


def test_robosuite_runs_the_fixed_order_arithmetic_once_installed():
    import robosuite.controllers.parts.arm.osc as osc
    import robosuite.utils.binding_utils as binding
    import robosuite.utils.control_utils as cu
    import robosuite.utils.transform_utils as tu

    import producers.sim.envs  # noqa: F401  (installs)

    assert tu.mat2quat is ra.mat2quat and tu.pose_inv is ra.pose_inv and cu.opspace_matrices is ra.opspace_matrices
    assert osc.opspace_matrices is ra.opspace_matrices  # osc.py copied it with "import *"
    assert binding.np is ra.FIXED_NUMPY and binding.np.dot is fo.dot and binding.np.zeros is np.zeros
    with ra.original_arithmetic():
        assert tu.mat2quat is not ra.mat2quat and binding.np is np
    assert tu.mat2quat is ra.mat2quat and binding.np is ra.FIXED_NUMPY


def test_robosuite_replacements_agree_with_robosuites_originals():
    import robosuite.utils.control_utils as cu
    import robosuite.utils.transform_utils as tu

    import producers.sim.envs  # noqa: F401

    # Everything inside the block: robosuite's originals are numba functions compiled at their first
    # call, against the module's `np` as it is then; outside the block that is FIXED_NUMPY, which
    # numba cannot type (only a warm numba cache hid that, so a fresh clone failed by test order).
    with ra.original_arithmetic():
        rng = _rng(3)
        original = {name: getattr(tu, name) for name in ("mat2quat", "quat2mat", "pose_inv", "pose_in_A_to_pose_in_B")}
        original_ops, original_null = cu.opspace_matrices, cu.nullspace_torques
        for _ in range(50):
            q = rng.standard_normal(4)
            q /= np.linalg.norm(q)
            rot = original["quat2mat"](q)
            assert np.max(np.abs(ra.quat2mat(q) - rot)) <= 1e-6  # float32 inside, both
            q_back, q_orig = ra.mat2quat(rot), original["mat2quat"](rot)
            assert q_back.dtype == q_orig.dtype == np.float32
            assert np.max(np.abs(q_back - q_orig)) <= 2e-6
            pose = np.eye(4)
            pose[:3, :3], pose[:3, 3] = rot, rng.standard_normal(3)
            assert np.max(np.abs(ra.pose_inv(pose) - original["pose_inv"](pose))) <= 1e-15 * 8
            other = ra.pose_inv(pose)
            assert np.max(np.abs(ra.pose_in_A_to_pose_in_B(pose, other)
                                 - original["pose_in_A_to_pose_in_B"](pose, other))) <= 1e-14
        mass = np.asfortranarray(_spd(7, rng, cond=200.0))
        jac = rng.standard_normal((6, 7))
        got = ra.opspace_matrices(mass, jac, np.ascontiguousarray(jac[:3]), np.ascontiguousarray(jac[3:]))
        want = original_ops(mass, jac, np.ascontiguousarray(jac[:3]), np.ascontiguousarray(jac[3:]))
        for g, w in zip(got, want, strict=True):
            assert np.max(np.abs(g - w)) <= 1e-9 * max(1.0, np.max(np.abs(w)))
        args = (mass, want[3], rng.standard_normal(7), rng.standard_normal(7), rng.standard_normal(7))
        assert np.max(np.abs(ra.nullspace_torques(*args) - original_null(*args))) <= 1e-9
