"""kernels.ggml.mulmat_q8's stored-rows kernels split between threads: the same bits at 1, 2 and 3 threads
as on the calling thread (each work item a product small enough to run there), and the Q8_0 block dot at
each instruction level the host runs (vpdpbusd, maddubs+madd, generic IR) equal to its definition. Bits
against libggml: tests/test_ggml_ops_mulmat.py."""

import numba
import numpy as np
import pytest

from kernels.base.block import QT
from kernels.base.flags import JIT_ENABLED
from kernels.ggml import mulmat_q8, mulmat_q8_ir
from kernels.ggml.mulmat_q8 import SERIAL_BELOW, _mxfp4_weights, _q8_0_quantize, mxfp4_rows, q8_0_mul_mat, q8_0_mul_mat_id
from kernels.ggml.vecmath import F16_TO_F32
from kernels.testing import random_rows

N, K = 133, 8192  # rows not a multiple of the work item's (32) nor of a tile's (4); T·N·K >= SERIAL_BELOW at T = 1


def rows(qtype, n, k, rng):
    return np.ascontiguousarray(random_rows(qtype, n, k, rng, "normal")).view(np.uint8).reshape(n, -1)


def acts(rng, t, k):
    x = rng.standard_normal((t, k)).astype(np.float32)
    x[0, :32] = -x[0, :32].max()  # q = -127 … and a block whose amax quantizes to ±127
    return x


@pytest.fixture
def threads():
    saved = numba.get_num_threads()
    yield lambda n: numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(saved)


def by_pieces(f, n, step=5):
    """f(r0, r1) (T, r1 - r0) for pieces of ``step`` rows, side by side: each piece below SERIAL_BELOW."""
    return np.concatenate([f(r, min(r + step, n)) for r in range(0, n, step)], axis=1)


@pytest.mark.parametrize("T", (1, 4, 9))
def test_q8_0_threads(threads, T):
    rng = np.random.default_rng([40, T])
    w, x = rows(QT.Q8_0, N, K, rng).view(np.int8), acts(rng, T, K)
    assert T * N * K >= SERIAL_BELOW > T * 5 * K
    ref = by_pieces(lambda a, b: _q8_0_mm(w[a:b], x), N)
    for n in (1, 2, 3):
        threads(n)
        assert np.array_equal(_q8_0_mm(w, x).view(np.uint32), ref.view(np.uint32)), f"{n} threads, T={T}"


def _q8_0_mm(w, x):
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    q8_0_mul_mat(w, x, out, F16_TO_F32)
    return out


def test_q8_0_id_threads(threads):
    """Groups of 1 to 8 slots per expert (a tile of 4 weight rows per slot, or of 4 slots per row)."""
    rng = np.random.default_rng(41)
    E, T, n_used = 5, 9, 3
    w = rows(QT.Q8_0, E * N, K // 2, rng).view(np.int8).reshape(E, N, -1)
    x, ids = acts(rng, T, K // 2).reshape(T, 1, -1), rng.integers(0, E, (T, n_used)).astype(np.int32)
    ids[:8, 0] = 1  # expert 1: >= 8 slots
    assert T * n_used * N * (K // 2) >= SERIAL_BELOW
    out = np.empty((T, n_used, N), np.float32)
    ref = np.stack([[_q8_0_mm(w[ids[t, s]], x[t])[0] for s in range(n_used)] for t in range(T)])
    for n in (1, 2, 3):
        threads(n)
        q8_0_mul_mat_id(w, ids, x, out, F16_TO_F32)
        assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), f"{n} threads"


@pytest.mark.parametrize("fused_tail", (False, True))
def test_mxfp4_threads(threads, fused_tail):
    rng = np.random.default_rng(42)
    k = 33 * 32  # an odd block count: the scalar tail
    assert 9 * N * k >= SERIAL_BELOW > 9 * 5 * k
    wv, we = _mxfp4_weights(rows(QT.MXFP4, N, k, rng))
    xq, xd = _q8_0_quantize(acts(rng, 9, k))

    def mm(a, b):
        out = np.empty((9, b - a), np.float32)
        mxfp4_rows(wv[a:b], we[a:b], xq, xd, out, fused_tail)
        return out

    ref = by_pieces(mm, N)
    for n in (1, 2, 3):
        threads(n)
        assert np.array_equal(mm(0, N).view(np.uint32), ref.view(np.uint32)), f"{n} threads"


@pytest.mark.skipif(not JIT_ENABLED, reason="the IR kernels need numba")
@pytest.mark.parametrize("level", (0, 1, 2))
def test_q8_0_tile_levels(level):
    """Each instruction level's block dot, in 1x1, 4x1 and 1x4 tiles, against the compiled definition —
    with activation bytes -128 against negative weight bytes (the sign trick's wrap)."""
    if level > mulmat_q8_ir.LEVEL:
        pytest.skip(f"the host runs levels up to {mulmat_q8_ir.LEVEL}")
    rng = np.random.default_rng(43)
    k = 256
    w = rows(QT.Q8_0, 8, k, rng).view(np.int8)
    w.reshape(8, -1, 34)[0, :, 2:6] = -128
    x = acts(rng, 4, k)
    x[1, :] = -np.abs(x[1, :]).max()  # every activation byte of row 1 is -127 …
    xq, xd = _q8_0_quantize(x)
    xq[2, ::3] = -128  # … and row 2 has -128s (a NaN's quantization)
    f = mulmat_q8_ir.make_q8_0_tile(level)
    tile = numba.njit(lambda w, rows, xq, xd, trows, tab: f(w, rows, xq, xd, trows, tab))
    want = np.array([[mulmat_q8._q8_0_dot(w[r], xq[t], xd[t], F16_TO_F32) for t in range(4)] for r in range(8)])
    got = np.array([tile(w, (r,), xq, xd, (t,), F16_TO_F32)[0] for r in range(8) for t in range(4)]).reshape(8, 4)
    got4 = np.array([tile(w, (r,), xq, xd, (0, 1, 2, 3), F16_TO_F32) for r in range(8)])
    got41 = np.array([tile(w, (r, r + 1, r + 2, r + 3), xq, xd, (t,), F16_TO_F32) for r in (0, 4) for t in range(4)])
    got41 = got41.reshape(2, 4, 4).transpose(0, 2, 1).reshape(8, 4)
    for g in (got, got4, got41):
        assert np.array_equal(g.astype(np.float32).view(np.uint32), want.astype(np.float32).view(np.uint32))
