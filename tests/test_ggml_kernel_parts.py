"""The compiled building blocks of the ``--emulate=ggml`` matmuls equal their definitions.

The op tests (test_ggml_ops_*.py) hold every kernel to libggml's bits; these pin the pieces that exist only
for speed to the plain code they replace, on inputs the op tests reach rarely (extreme integers, every
nibble, empty and one-expert routings):

* ``simd.dot32_lanes`` (vector IR) equals ``simd._dot32_lanes_def`` (the definition, also the interpreted path);
* ``mulmat_q8.slot_groups`` (a counting sort) equals numpy's stable argsort / unique grouping;
* ``repack._nibble`` reads each type's LUT words as the LUT itself;
* ``vec.vec_dot_f32_cols`` (many ``ggml_vec_dot_f32`` at once, lane-wise across outputs: the attention heads and the
  delta net) equals ``vec.vec_dot_f32`` per output on every path's lane count (NEON's 4 included);
* ``half.fma16`` (AArch64's ``vfmaq_f16``) is one rounding to binary16, against exact rational arithmetic;
* ``simd.vfma_rows4`` (tinyBLAS's four FMA chains with the accumulators in registers) equals its definition,
  ``simd.vfma`` step by step, at AVX-512's and AVX2's lane counts;
* ``ssm._transpose_into`` (the delta net's state copied in and out, tile by tile) is numpy's transpose, bit for bit,
  at sizes with and without edges.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from kernels.ggml import half, repack, simd, ssm, vec
from kernels.ggml.isa import SVE128, SVE256
from kernels.ggml.mulmat_q8 import slot_groups


def test_dot32_lanes_equals_its_definition():
    rng = np.random.default_rng(0)
    for trial in range(200):
        a = rng.integers(-63 * 127, 63 * 127 + 1, 64, dtype=np.int32)  # q·scale range of Q6_K
        b = rng.integers(-127, 128, 64, dtype=np.int32)
        if trial % 3 == 0:
            a[:32] = rng.integers(0, 64, 32)  # unsigned codes, as Q4_K / Q5_K / Q6_K decode them
        s0, s1 = (int(v) for v in rng.integers(-128, 128, 2))
        ao, bo = (int(v) for v in rng.integers(0, 33, 2))
        start = rng.integers(-1000, 1000, 8, dtype=np.int32)
        got, want = start.copy(), start.copy()
        simd.dot32_lanes(got, a, ao, b, bo, s0, s1)
        simd._dot32_lanes_def(want, a, ao, b, bo, s0, s1)
        assert np.array_equal(got, want), (trial, got, want)


def _grouping_reference(ids, n_x):
    T, n_used = ids.shape
    slots = ids.reshape(-1).astype(np.int64)
    order = np.argsort(slots, kind="stable")
    experts, starts = np.unique(slots[order], return_index=True)
    j = np.arange(T * n_used)
    return order, np.append(starts, len(order)), experts, (j // n_used) * n_x + (j % n_used) % n_x


@pytest.mark.parametrize("shape", [(1, 1), (1, 4), (7, 2), (33, 8), (5, 3)])
@pytest.mark.parametrize("n_x_is_one", [True, False])
def test_slot_groups_is_ggmls_grouping(shape, n_x_is_one):
    """Slots sorted by expert, token order within one (ggml's ``matrix_rows``), for routings with repeated,
    missing and single experts."""
    rng = np.random.default_rng(list(shape))
    ids = rng.integers(0, 6, shape).astype(np.int32)
    ids[0, 0] = 5
    n_x = 1 if n_x_is_one else shape[1]
    got = slot_groups(ids, n_x)
    for g, w in zip(got, _grouping_reference(ids, n_x)):
        assert g.dtype == np.int64 and np.array_equal(g, w)


@pytest.mark.parametrize("qtype", sorted(repack.REPACK_Q4_B32), ids=lambda q: QT(q).name)
def test_lut_words_read_every_nibble(qtype):
    lut = repack._TYPES[qtype][0]
    lo, hi = repack._lut_words(lut)
    assert [repack._nibble(n, lo, hi) for n in range(16)] == lut.tolist()


@pytest.mark.parametrize("lanes", [16, 8, 4], ids=["avx512", "avx2", "neon"])
def test_vec_dot_f32_cols_equals_vec_dot_f32(lanes):
    rng = np.random.default_rng(lanes)
    for n, m in ((64, 37), (256, 64), (128, 5), (4 * lanes, 1)):
        xt = (rng.standard_normal((n, m)) * 2.0 ** rng.integers(-30, 30, (n, m))).astype(np.float32)
        y = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(np.float32)
        xt[:, 0] = -0.0  # a zero column (the KV view's empty cells), signed zeros
        if m > 2:
            xt[3, 1], xt[5, 2] = np.inf, np.nan
        if m > 4:
            xt[:, 3] = np.float32(3.4e38)  # overflow to inf inside the lanes
            xt[:, 4] = np.float32(1e-45)  # subnormal products
        acc, out = np.empty((4, 16, m), np.float32), np.empty(m, np.float32)
        assert vec.cols_fit(n, lanes)
        vec.vec_dot_f32_cols(n, xt, y, lanes, acc, out)
        scratch = vec.dot_scratch()
        want = np.array([vec.vec_dot_f32(n, np.ascontiguousarray(xt[:, c]), y, lanes, scratch) for c in range(m)],
                        np.float32)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), (n, m)
    assert not vec.cols_fit(80 if lanes > 4 else 40, lanes)


@pytest.mark.parametrize("lanes", [16, 8], ids=["avx512", "avx2"])
def test_vfma_rows4_equals_vfma_per_step(lanes):
    rng = np.random.default_rng(lanes)
    K = 64 * lanes
    w = (rng.standard_normal(K) * 2.0 ** rng.integers(-60, 60, K)).astype(np.float32)
    xs = [(rng.standard_normal(K) * 2.0 ** rng.integers(-60, 60, K)).astype(np.float32) for _ in range(4)]
    w[5], xs[1][9], xs[2][3 * lanes] = np.inf, np.nan, np.float32(3.4e38)  # inf, NaN, overflow inside a chain
    start = rng.standard_normal((4, 16)).astype(np.float32)  # the chains continue from acc's values
    got, want = start.copy(), start.copy()
    simd.vfma_rows4(got, w, *xs, K, lanes)
    for l0 in range(0, K, lanes):
        for j in range(4):
            simd.vfma(want, j, w, xs[j], l0, lanes)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("n", [1, 7, ssm.TILE, 2 * ssm.TILE + 5, 64, 128])  # edges only, tiles only, both
def test_transpose_into_is_the_transpose(n):
    rng = np.random.default_rng(n)
    src = rng.integers(0, 2**32, (n, n), dtype=np.uint64).astype(np.uint32).view(np.float32)  # NaN payloads too
    dst = np.full((n, n), np.float32(7.0))
    ssm._transpose_into(dst, src)
    assert np.array_equal(dst.view(np.uint32), src.T.view(np.uint32))


@pytest.mark.parametrize("w", [4, 8])
def test_sve_vec_dot_f32_cols_equals_its_vec_dot_f32(w):
    """SVE's twin at any length (the leftover vectors and the predicated tail into sum1), the same hard values, at
    svcntw() = 4 and 8 (128 and 256 bits: every tail of 8 and 64 too)."""
    from kernels.ggml import sve

    rng = np.random.default_rng(128)
    for n, m in ((64, 37), (256, 64), (19, 5), (80, 3), (3, 2), (33, 9), (71, 6), (129, 4)):
        xt = (rng.standard_normal((n, m)) * 2.0 ** rng.integers(-30, 30, (n, m))).astype(np.float32)
        y = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(np.float32)
        xt[:, 0] = -0.0
        if m > 2:
            xt[n // 2, 1], xt[n - 1, 2] = np.inf, np.nan
        if m > 4:
            xt[:, 3], xt[:, 4] = np.float32(3.4e38), np.float32(1e-45)
        acc, out = np.empty((4, 16, m), np.float32), np.empty(m, np.float32)
        sve.vec_dot_f32_cols(n, xt, y, acc, out, w)
        want = np.array([sve.vec_dot_f32(n, np.ascontiguousarray(xt[:, c]), y, w) for c in range(m)], np.float32)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), (n, m)
    code = SVE128 if w == 4 else SVE256
    assert not vec.cols_fit(4 * code, code)  # vec's twin never takes SVE's code (4 × its code was a "fit" before)


def _f16_round_exact(v):
    """A Fraction rounded to the nearest binary16 (ties to even), as float; ±inf from 65520."""
    from fractions import Fraction

    if abs(v) >= 65520:
        return float("inf") if v > 0 else float("-inf")
    if v == 0:
        return 0.0
    e = max(abs(v).numerator.bit_length() - abs(v).denominator.bit_length(), -14)
    while Fraction(2) ** e > abs(v):
        e -= 1
    while Fraction(2) ** (e + 1) <= abs(v):
        e += 1
    q = Fraction(2) ** (max(e, -14) - 10)
    k = v / q
    f = k.numerator // k.denominator
    rem = k - f
    k = f + (1 if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and f % 2) else 0)
    return float(k * q)


def test_fma16_rounds_once_to_half():
    """``half.fma16`` (NEON ``vfmaq_f16``, the F16 dot's accumulators) is ``a·b + c`` rounded once to binary16:
    against exact rational arithmetic, on random halves across binades, subnormals, and sums built to land on a
    half's midpoint in float64 (where a double rounding would err)."""
    from fractions import Fraction

    rng = np.random.default_rng(16)
    h = rng.integers(0, 0x7C00, (3000, 3)).astype(np.uint16) | (rng.integers(0, 2, (3000, 3)) << 15).astype(np.uint16)
    vals = h.view(np.float16).astype(np.float32)
    mid = [(np.float32(1.0), np.float32(1.0009765625), np.float32(2.0 ** -11)),  # 1 + 2^-10 + 2^-11: a tie
           (np.float32(1.5), np.float32(2.0 ** -12), np.float32(1.0)), (np.float32(3.0), np.float32(-2.0 ** -25), np.float32(2.0 ** -24))]
    for a, b, c in list(map(tuple, vals)) + mid:
        want = _f16_round_exact(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))
        got = float(half.fma16(a, b, c))
        assert got == want or (got != got and want != want), (a, b, c, got, want)
