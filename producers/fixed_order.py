"""Linear algebra whose results do not depend on the machine: the same bits under every BLAS kernel.

numpy hands ``dot``, ``@``, ``linalg.norm`` (of a whole array) and every ``linalg`` routine to
OpenBLAS, and OpenBLAS picks its kernel per CPU at load time (or from OPENBLAS_CORETYPE): Haswell
kernels fuse multiply-adds, Prescott ones do not, SIMD widths split sums differently. One Lift
episode had four digests under four kernels. numba's ``np.dot`` and ``np.linalg`` call the same
kind of library (SciPy's OpenBLAS). Everything here is a plain loop in a fixed order, compiled by
numba without fast-math (LLVM then neither fuses nor reorders floating-point operations), so a
result is a function of its inputs alone, on any x86-64 machine.

    dot(a, b)            np.dot for 1-D and 2-D float arrays
    norm(x)              np.linalg.norm(x) with ord and axis None (else numpy's, which uses no BLAS)
    inv(m), pinv(m)      np.linalg.inv / pinv
    eigh(m)              np.linalg.eigh: ascending eigenvalues, eigenvectors as columns

and, for other numba code, the compiled kernels: ``vdot``, ``matvec``, ``matmat``, ``spd_inverse``,
``sym_pinv``, ``jacobi_eigh``. They agree with numpy's BLAS results to a few ulps
(tests/unit/producers/test_fixed_order.py states the tolerances); they are not bit-equal to any one kernel,
which is the point.

Runs in the project's venv and in the LIBERO venv (numpy and numba only).
"""

from __future__ import annotations

import math

import numba
import numpy as np

# pinv's cut-off, as numpy's default: singular values below RCOND * the largest are dropped.
RCOND = 1e-15
# Jacobi sweeps before giving up (a symmetric matrix converges in ~6-10 for n <= 8).
MAX_JACOBI_SWEEPS = 60


@numba.njit(cache=True)
def vdot(a, b):
    """sum(a[i] * b[i]) for 1-D arrays, left to right."""
    s = np.zeros(1, a.dtype)[0]
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


@numba.njit(cache=True)
def matvec(m, x):
    """m @ x for a 2-D m and a 1-D x."""
    out = np.empty(m.shape[0], dtype=m.dtype)
    for i in range(m.shape[0]):
        s = np.zeros(1, out.dtype)[0]
        for j in range(m.shape[1]):
            s += m[i, j] * x[j]
        out[i] = s
    return out


@numba.njit(cache=True)
def vecmat(x, m):
    """x @ m for a 1-D x and a 2-D m."""
    out = np.empty(m.shape[1], dtype=m.dtype)
    for j in range(m.shape[1]):
        s = np.zeros(1, out.dtype)[0]
        for i in range(m.shape[0]):
            s += x[i] * m[i, j]
        out[j] = s
    return out


@numba.njit(cache=True)
def matmat(a, b):
    """a @ b for 2-D arrays."""
    out = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    for i in range(a.shape[0]):
        for j in range(b.shape[1]):
            s = np.zeros(1, out.dtype)[0]
            for k in range(a.shape[1]):
                s += a[i, k] * b[k, j]
            out[i, j] = s
    return out


@numba.njit(cache=True)
def jacobi_eigh(m):
    """Eigen-decomposition of a symmetric matrix by cyclic Jacobi rotations (float64): (w, v)
    with w ascending and v[:, k] the unit eigenvector of w[k]. Only the lower triangle is read,
    as LAPACK's eigh does by default."""
    n = m.shape[0]
    a = np.empty((n, n))
    for i in range(n):
        for j in range(i + 1):
            a[i, j] = m[i, j]
            a[j, i] = m[i, j]
    v = np.eye(n)
    for _ in range(MAX_JACOBI_SWEEPS):
        off, diag = 0.0, 0.0
        for i in range(n):
            diag += a[i, i] * a[i, i]
            for j in range(i + 1, n):
                off += a[i, j] * a[i, j]
        if off <= 1e-36 * diag or off == 0.0:
            break
        for p in range(n - 1):
            for q in range(p + 1, n):
                apq = a[p, q]
                if apq == 0.0:
                    continue
                theta = (a[q, q] - a[p, p]) / (2.0 * apq)
                t = 1.0 / (abs(theta) + math.sqrt(theta * theta + 1.0))
                if theta < 0.0:
                    t = -t
                c = 1.0 / math.sqrt(t * t + 1.0)
                s = t * c
                for k in range(n):  # columns p, q of a
                    akp, akq = a[k, p], a[k, q]
                    a[k, p] = c * akp - s * akq
                    a[k, q] = s * akp + c * akq
                for k in range(n):  # rows p, q of a
                    apk, aqk = a[p, k], a[q, k]
                    a[p, k] = c * apk - s * aqk
                    a[q, k] = s * apk + c * aqk
                for k in range(n):
                    vkp, vkq = v[k, p], v[k, q]
                    v[k, p] = c * vkp - s * vkq
                    v[k, q] = s * vkp + c * vkq
    w = np.empty(n)
    for i in range(n):
        w[i] = a[i, i]
    order = np.argsort(w, kind="mergesort")  # stable: equal eigenvalues keep their index order
    return w[order], v[:, order].copy()


@numba.njit(cache=True)
def sym_pinv(m, rcond):
    """Pseudo-inverse of a symmetric matrix from its Jacobi eigen-decomposition: eigenvalues
    below rcond * the largest magnitude are dropped (numpy's pinv drops the same singular values)."""
    w, v = jacobi_eigh(m)
    n = m.shape[0]
    cutoff = 0.0
    for i in range(n):
        cutoff = max(cutoff, abs(w[i]))
    cutoff *= rcond
    out = np.zeros((n, n))
    for k in range(n):
        if abs(w[k]) <= cutoff:
            continue
        inv_w = 1.0 / w[k]
        for i in range(n):
            f = v[i, k] * inv_w
            for j in range(n):
                out[i, j] += f * v[j, k]
    return out


@numba.njit(cache=True)
def _cholesky(m):
    """Lower Cholesky factor of a symmetric positive definite matrix, or an empty array when a
    pivot is not clearly positive (not positive definite, or ill-conditioned beyond ~1/RCOND)."""
    n = m.shape[0]
    low = np.zeros((n, n))
    scale = 0.0
    for i in range(n):
        scale = max(scale, abs(m[i, i]))
    for j in range(n):
        s = m[j, j]
        for k in range(j):
            s -= low[j, k] * low[j, k]
        if not s > RCOND * scale:
            return np.empty((0, 0))
        d = math.sqrt(s)
        low[j, j] = d
        for i in range(j + 1, n):
            s = m[i, j]
            for k in range(j):
                s -= low[i, k] * low[j, k]
            low[i, j] = s / d
    return low


@numba.njit(cache=True)
def spd_inverse(m):
    """Inverse of a symmetric positive definite matrix (a mass matrix, J M^-1 J^T) through its
    Cholesky factor; a matrix that is not clearly positive definite gets sym_pinv instead (what
    robosuite's pinv gives such a matrix). The result is exactly symmetric."""
    low = _cholesky(m)
    n = m.shape[0]
    if low.shape[0] != n:
        return sym_pinv(m, RCOND)
    linv = np.zeros((n, n))  # L^-1, lower triangular, by forward substitution
    for j in range(n):
        linv[j, j] = 1.0 / low[j, j]
        for i in range(j + 1, n):
            s = 0.0
            for k in range(j, i):
                s -= low[i, k] * linv[k, j]
            linv[i, j] = s / low[i, i]
    out = np.empty((n, n))  # M^-1 = L^-T L^-1
    for i in range(n):
        for j in range(i + 1):
            s = 0.0
            for k in range(i, n):
                s += linv[k, i] * linv[k, j]
            out[i, j] = s
            out[j, i] = s
    return out


@numba.njit(cache=True)
def gauss_jordan_inverse(m):
    """Inverse of a square matrix by Gauss-Jordan elimination with partial pivoting; raises
    ValueError when it is singular."""
    n = m.shape[0]
    a = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            a[i, j] = m[i, j]
    out = np.eye(n)
    for col in range(n):
        pivot, best = col, abs(a[col, col])
        for r in range(col + 1, n):
            if abs(a[r, col]) > best:
                pivot, best = r, abs(a[r, col])
        if best == 0.0:
            raise ValueError("Singular matrix")
        if pivot != col:
            for k in range(n):
                a[col, k], a[pivot, k] = a[pivot, k], a[col, k]
                out[col, k], out[pivot, k] = out[pivot, k], out[col, k]
        d = a[col, col]
        for k in range(n):
            a[col, k] /= d
            out[col, k] /= d
        for r in range(n):
            if r == col:
                continue
            f = a[r, col]
            if f == 0.0:
                continue
            for k in range(n):
                a[r, k] -= f * a[col, k]
                out[r, k] -= f * out[col, k]
    return out


# -- numpy-shaped entry points -----------------------------------------------------------------


_KERNELS = {(1, 1): vdot, (2, 1): matvec, (1, 2): vecmat, (2, 2): matmat}


def dot(a, b, out=None):
    """np.dot(a, b) in a fixed order for float arrays of 1 or 2 dimensions (and scalars); integer
    arrays go to numpy (exact, and numpy uses no BLAS for them). Anything else a float result
    could come from BLAS for (``out=``, complex, more dimensions) is refused rather than computed
    kernel-dependently."""
    if out is None and type(a) is np.ndarray and type(b) is np.ndarray and a.dtype == b.dtype \
            and a.dtype.kind == "f":  # the common case first: a control step makes ~100 of these calls
        kernel = _KERNELS.get((a.ndim, b.ndim))
        if kernel is not None:
            if a.shape[-1] != b.shape[0]:
                raise ValueError(f"shapes {a.shape} and {b.shape} not aligned: {a.shape[-1]} (dim {a.ndim - 1}) "
                                 f"!= {b.shape[0]} (dim 0)")
            result = kernel(a, b)
            return a.dtype.type(result) if kernel is vdot else result
    a_arr, b_arr = np.asarray(a), np.asarray(b)
    kinds = {a_arr.dtype.kind, b_arr.dtype.kind}
    if a_arr.ndim == 0 or b_arr.ndim == 0:
        return a_arr * b_arr if out is None else np.multiply(a_arr, b_arr, out=out)  # np.dot with a scalar
    if kinds <= set("iub"):
        return np.dot(a_arr, b_arr) if out is None else np.dot(a_arr, b_arr, out=out)
    if out is not None or not kinds <= set("fiub") or a_arr.ndim > 2 or b_arr.ndim > 2:
        raise TypeError(f"fixed_order.dot has no kernel-independent path for {a_arr.dtype}{a_arr.shape} . "
                        f"{b_arr.dtype}{b_arr.shape}" + (" with out=" if out is not None else ""))
    common = np.result_type(a_arr, b_arr)
    if common.kind != "f":
        common = np.dtype(np.float64)
    return dot(np.asarray(a_arr, dtype=common), np.asarray(b_arr, dtype=common))


def matmul(a, b):
    """a @ b for 1-D and 2-D float arrays (dot and matmul agree there)."""
    if np.ndim(a) == 0 or np.ndim(b) == 0:
        raise ValueError("matmul: Input operand does not have enough dimensions")
    return dot(a, b)


def norm(x, ord=None, axis=None, keepdims=False):  # noqa: A002 (numpy's signature)
    """np.linalg.norm(x): the 2-norm of the flattened array, summed in order. With ``ord`` or
    ``axis`` numpy's own (those paths reduce with ufuncs, no BLAS; matrix 2-norms raise)."""
    if ord is None and axis is None:
        flat = np.asarray(x)
        if flat.dtype.kind != "f":
            flat = flat.astype(float)
        flat = np.ascontiguousarray(flat).ravel()
        value = math.sqrt(vdot(flat, flat))
        if keepdims:
            return np.full((1,) * np.ndim(x), value, dtype=flat.dtype)
        return flat.dtype.type(value)
    if np.ndim(x) == 2 and axis is None and ord in (2, -2, "nuc"):
        raise TypeError(f"fixed_order.norm: ord={ord!r} of a matrix needs an SVD (kernel-dependent)")
    return np.linalg.norm(x, ord=ord, axis=axis, keepdims=keepdims)


def _square(m, name: str) -> np.ndarray:
    m = np.asarray(m, dtype=float)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise np.linalg.LinAlgError(f"{name}: Last 2 dimensions of the array must be square, got {m.shape}")
    return m


def inv(m):
    """np.linalg.inv for one square float matrix (Gauss-Jordan, partial pivoting)."""
    m = _square(m, "inv")
    try:
        return gauss_jordan_inverse(m)
    except ValueError as exc:
        raise np.linalg.LinAlgError(str(exc)) from None


def pinv(m, rcond=RCOND, hermitian=False):
    """np.linalg.pinv for one float matrix: a symmetric one from its eigen-decomposition; any other
    as m^T pinv(m m^T) (or pinv(m^T m) m^T, whichever Gram matrix is smaller). The Gram matrix
    squares the condition number, so there singular values below sqrt(n * eps) of the largest are
    dropped, not rcond: nothing in the episode path asks for a non-symmetric pinv."""
    a = np.asarray(m, dtype=float)
    if a.ndim != 2:
        raise np.linalg.LinAlgError(f"pinv: expected a 2-D array, got {a.shape}")
    if a.shape[0] == a.shape[1] and (hermitian or np.array_equal(a, a.T)):
        return sym_pinv(np.ascontiguousarray(a), float(rcond))
    at = np.ascontiguousarray(a.T)
    gram_rcond = max(float(rcond) ** 2, max(a.shape) * np.finfo(float).eps)
    if a.shape[0] <= a.shape[1]:
        return matmat(at, sym_pinv(matmat(a, at), gram_rcond))
    return matmat(sym_pinv(matmat(at, a), gram_rcond), at)


def eigh(m, UPLO="L"):  # noqa: N803 (numpy's signature)
    """np.linalg.eigh for one real symmetric matrix: (ascending eigenvalues, eigenvectors)."""
    a = _square(m, "eigh")
    if UPLO == "U":
        a = np.ascontiguousarray(a.T)
    return jacobi_eigh(np.ascontiguousarray(a))


def vdot_flat(a, b):
    """np.vdot(a, b) of real arrays: the flattened arrays' dot product."""
    a_flat, b_flat = np.ravel(np.asarray(a)), np.ravel(np.asarray(b))
    if a_flat.dtype.kind == "c" or b_flat.dtype.kind == "c":
        raise TypeError("fixed_order.vdot_flat: complex arrays have no kernel-independent path here")
    return dot(np.ascontiguousarray(a_flat), np.ascontiguousarray(b_flat))


def inner(a, b):
    """np.inner for 1-D arrays (and scalars); 2-D: a @ b.T."""
    if np.ndim(a) == 2 and np.ndim(b) == 2:
        return dot(a, np.ascontiguousarray(np.asarray(b).T))
    if np.ndim(a) > 2 or np.ndim(b) > 2 or (np.ndim(b) == 2 and np.ndim(a) == 1):
        raise TypeError("fixed_order.inner: only 1-D and 2-D operands")
    return dot(a, b)


# -- transcendental functions ------------------------------------------------------------------
# numpy's float64 sin, cos, tan, tanh, exp, log, arc* run SIMD loops picked per CPU (AVX512 machines
# take SVML's, which round differently from the C library's); float32 ones have AVX2 and AVX512
# variants too. These evaluate the C library's double function element by element (the same on
# every x86-64 machine with FMA, as glibc picks one variant for all of them), rounding to float32
# for float32 input. For the small arrays of a control step; numpy's own for anything that is not
# a real float (or int) array or takes extra arguments.

def elementwise(fn, numpy_fn):
    def apply(x, *args, **kwargs):
        a = np.asarray(x)
        if args or kwargs or a.dtype.kind not in "fiub":
            return numpy_fn(x, *args, **kwargs)
        dtype = a.dtype if a.dtype.kind == "f" and a.dtype.itemsize <= 8 else np.dtype(np.float64)
        if a.ndim == 0:
            return dtype.type(fn(float(a)))
        out = np.fromiter((fn(v) for v in a.ravel().tolist()), dtype=np.float64, count=a.size)
        return out.astype(dtype, copy=False).reshape(a.shape)

    apply.__name__ = apply.__qualname__ = numpy_fn.__name__
    apply.__doc__ = f"np.{numpy_fn.__name__} through math.{fn.__name__}, element by element."
    return apply


def _arctan2(y, x):
    y_arr, x_arr = np.broadcast_arrays(np.asarray(y, dtype=float), np.asarray(x, dtype=float))
    out = np.fromiter((math.atan2(a, b) for a, b in zip(y_arr.ravel().tolist(), x_arr.ravel().tolist(),
                                                         strict=True)), dtype=np.float64, count=y_arr.size)
    return out.reshape(y_arr.shape) if y_arr.ndim else np.float64(out[0])


def _safe(fn):
    """math's functions raise on a domain error where numpy returns NaN."""
    def call(v):
        try:
            return fn(v)
        except (ValueError, OverflowError):
            if fn is math.exp and v > 0:
                return math.inf
            return -math.inf if fn is math.log and v == 0 else math.nan
    call.__name__ = fn.__name__
    return call


TRANSCENDENTAL = {name: elementwise(_safe(getattr(math, mname)), getattr(np, name)) for name, mname in (
    ("sin", "sin"), ("cos", "cos"), ("tan", "tan"), ("tanh", "tanh"), ("sinh", "sinh"), ("cosh", "cosh"),
    ("exp", "exp"), ("log", "log"), ("arccos", "acos"), ("arcsin", "asin"), ("arctan", "atan"))}
TRANSCENDENTAL["arctan2"] = _arctan2
