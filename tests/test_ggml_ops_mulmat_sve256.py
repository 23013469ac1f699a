"""kernels.ggml.mulmat on ``arm64-sve256`` (the GCC 12 SVE build, ``-march=armv9-a+sve2+i8mm+dotprod+fp16``, on a
CPU whose SVE vector length is 256 bits: Neoverse V1, Graviton3), weights in a plain buffer, bit for bit against
``arm64-sve256-gcc`` (tests/arm64.py: ``arm64-sve128-gcc``'s library run by qemu at 256 bits).

The library reads ``svcntb()`` at run time, so ``arch/arm/quants.c``'s SVE kernels take their ``case 256``
branches. What differs from 128 bits, and is tested here: Q8_0 and Q4_0's 1-row kernels (8 fused float lanes of 4
values a block, one FADDV of 8 — at odd T, the i8mm 2-row NEON kernels take the rest) and Q2_K's (8 float lanes);
F32 and F16's SVE dots at 8 float lanes (vec.cpp).
What ``case 256`` computes as ``case 128`` does (the same exact integers, the same float steps): Q3_K and Q4_K /
Q6_K's 1-row and fused SVE+MMLA 2-row kernels; and the NEON kernels of the types without SVE code. Hard inputs:
the quantizer's .5 ties, zeros, subnormal and huge values, NaN, ±inf, extreme fp16 scales; every tail (an odd
block count: the scalar last block; one block alone). Cost: one qemu worker (~7 s) and a few seconds.
"""

import numpy as np
import pytest
from ggml_graph import on_build
from gguf import GGMLQuantizationType as QT
from test_ggml_ops_mulmat import acts, bits, float_weights, g_mul_mat_id, hard_floats, weight_bytes
from test_ggml_ops_mulmat_arm64 import check as check_build
from test_ggml_ops_mulmat_arm64 import hard_acts, q8_k_ties

from kernels.ggml import columns, columns_arm
from kernels.ggml.mulmat import mul_mat, mul_mat_id

pytestmark = pytest.mark.oracle

BUILD, PATH = "arm64-sve256-gcc", "arm64-sve256"


def check(cases):
    """Every case (w, gtype, K, x, n_threads) on the 256-bit library against the emulation, bit for bit."""
    return check_build(BUILD, cases)


def test_sve256_bit_exact():
    """One library call: Q8_0 / Q4_0 (their 256-bit 1-row kernels at odd T and where 3 threads leave a chunk odd,
    the NEON i8mm 2-row kernels at even T; 1, 2, 3 and 5 blocks), Q2_K (8 float lanes; 1 to 3 super-blocks), the
    K-quants whose ``case 256`` equals ``case 128`` (Q3_K; Q4_K / Q6_K 1-row and 2-row), the NEON kernels of the
    types without SVE code (Q4_1, Q5_0 with its USDOT tail, Q5_1, MXFP4, IQ4_NL, Q5_K, IQ4_XS, IQ2_XXS, IQ1_M) and
    BF16's scalar loop."""
    rng = np.random.default_rng(5601)
    cases = []
    for qtype in (QT.Q8_0, QT.Q4_0):
        for n, k in ((6, 96), (5, 64), (3, 32), (4, 160)):  # 3, 2, 1, 5 blocks
            w = weight_bytes(qtype, n, k, rng)
            cases += [(w, int(qtype), k, acts(rng, t, k), 1) for t in (1, 2, 3)]
        cases.append((weight_bytes(qtype, 20, 64, rng), int(qtype), 64, acts(rng, 4, 64), 3))  # mixed chunks
        cases.append((weight_bytes(qtype, 8, 128, rng), int(qtype), 128, hard_acts(rng, 9, 128), 1))
        cases.append((weight_bytes(qtype, 7, 96, rng), int(qtype), 96, hard_acts(rng, 9, 96), 1))
        # fp16 scales: subnormal, huge, ±inf (not "raw" bytes: NaN scales of other payloads in one row meet in one
        # sum, and which NaN survives is not modelled)
        w = weight_bytes(qtype, 5, 96, rng, "extreme")
        cases.append((w, int(qtype), 96, hard_acts(rng, 9, 96, nonfinite=False), 1))
        w = weight_bytes(qtype, 3, 64, rng)  # a row of the extreme values: -128 (Q8_0), -8 (Q4_0)
        w.reshape(3, -1, 34 if qtype == QT.Q8_0 else 18)[0, :, 2:] = np.uint8(0x80 if qtype == QT.Q8_0 else 0)
        cases.append((w, int(qtype), 64, acts(rng, 3, 64), 1))
    for qtype in (QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.MXFP4, QT.IQ4_NL):
        w = weight_bytes(qtype, 6, 96, rng)
        cases += [(w, int(qtype), 96, acts(rng, t, 96), 1) for t in (1, 2, 3)]
    for qtype in (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q6_K, QT.Q5_K, QT.IQ4_XS, QT.IQ2_XXS, QT.IQ1_M):
        for n, k in ((6, 512), (3, 256), (2, 768)):
            if k != 512 and qtype not in (QT.Q2_K, QT.Q4_K, QT.Q6_K):
                continue
            w = weight_bytes(qtype, n, k, rng)
            for t in (1, 2, 3):
                x = hard_acts(rng, t, k)
                x[0] = q8_k_ties(rng, k)
                cases.append((w, int(qtype), k, x, 1))
        if qtype in (QT.Q2_K, QT.Q4_K, QT.Q6_K):
            cases.append((weight_bytes(qtype, 4, 256, rng, "extreme"), int(qtype), 256,
                          hard_acts(rng, 9, 256, nonfinite=False), 1))
            cases.append((weight_bytes(qtype, 20, 256, rng), int(qtype), 256, acts(rng, 4, 256), 3))  # mixed chunks
    cases.append((float_weights(QT.BF16, hard_floats(rng, (5, 100))), int(QT.BF16), 100, hard_floats(rng, (2, 100)), 1))
    check(cases)


def test_sve256_mul_mat_id():
    """mul_mat_id: every routed row through the 1-row ``vec_dot`` — Q8_0, Q4_0 and Q2_K's 256-bit kernels, Q4_K /
    Q6_K's SVE ones — experts in token order."""
    rng = np.random.default_rng(5602)
    E, N, T, n_used = 4, 6, 5, 3
    ids = np.stack([rng.permutation(E)[:n_used] for _ in range(T)]).astype(np.int32)
    for qtype, K in ((QT.Q8_0, 96), (QT.Q4_0, 160), (QT.Q2_K, 512), (QT.Q4_K, 256), (QT.Q6_K, 256)):
        w = np.stack([weight_bytes(qtype, N, K, rng) for _ in range(E)])
        x = acts(rng, T * n_used, K).reshape(T, n_used, K)
        got = on_build(BUILD, g_mul_mat_id, w, int(qtype), K, x, ids, 2)
        want = mul_mat_id(w, qtype, x, ids, PATH)
        assert np.array_equal(bits(got), bits(want)), qtype.name


def test_sve256_differs_from_sve128_where_the_c_does():
    """The emulation of the two vector lengths differs exactly where quants.c's branches do (so the library test
    above sees the 256-bit code): Q8_0 / Q4_0 at odd T (1-row) but not at even T (the i8mm 2-row NEON kernel), Q2_K
    at every T; Q4_K and Q6_K alike at both."""
    rng = np.random.default_rng(5603)
    for qtype, k, differ in ((QT.Q8_0, 128, True), (QT.Q4_0, 128, True), (QT.Q2_K, 512, True),
                             (QT.Q4_K, 512, False), (QT.Q6_K, 512, False), (QT.Q3_K, 512, False)):
        w = weight_bytes(qtype, 8, k, rng)
        for t in (2, 3):
            x = acts(rng, t, k)
            a, b = mul_mat(w, qtype, x, "arm64-sve128"), mul_mat(w, qtype, x, PATH)
            changed = not np.array_equal(bits(a), bits(b))
            assert changed == (differ and (t % 2 == 1 or qtype == QT.Q2_K)), (qtype.name, t)


def test_sve256_float_bit_exact():
    """F32 and F16 weights: vec.cpp's SVE dots at 8 float lanes (F32: 8 accumulators, a predicated last block; F16:
    SVE2's widening FMLALB/FMLALT into float) — lengths below a vector, whole vectors, steps, every predicated
    tail; F32 on hard values (subnormals, ±0, products that overflow: inf - inf's default NaN); F16 near the half
    range; BF16's scalar loop."""
    rng = np.random.default_rng(5604)
    cases = []
    for n in (3, 8, 13, 31, 32, 37, 64, 100, 131):
        cases.append((float_weights(QT.F32, hard_floats(rng, (5, n))), int(QT.F32), n, hard_floats(rng, (2, n)), 1))
    for n in (5, 16, 29, 64, 77, 128, 200):
        cases.append((float_weights(QT.F16, acts(rng, 5, n)), int(QT.F16), n, acts(rng, 3, n), 1))
    k = 64  # F16: products and sums near 65504
    w16 = np.full((2, k), 250.0, np.float32)
    w16[1, ::3] = np.float32(2.0**-14)
    x16 = np.full((2, k), 255.0, np.float32)
    x16[1, 1::2] = np.float32(1.0 + 2.0**-10)
    cases.append((float_weights(QT.F16, w16), int(QT.F16), k, x16, 1))
    check(cases)
    E, N, K, T = 3, 4, 77, 3  # mul_mat_id: the same dots per routed row
    ids = np.stack([rng.permutation(E)[:2] for _ in range(T)]).astype(np.int32)
    for qtype in (QT.F32, QT.F16):
        w = np.stack([float_weights(qtype, acts(rng, N, K)) for _ in range(E)])
        x = acts(rng, 2 * T, K).reshape(T, 2, K)
        got = on_build(BUILD, g_mul_mat_id, w, int(qtype), K, x, ids, 1)
        assert np.array_equal(bits(got), bits(mul_mat_id(w, qtype, x, ids, PATH))), qtype.name


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q4_K, QT.Q6_K, QT.MXFP4], ids=lambda q: q.name)
def test_sve256_plain_columns(qtype):
    """The column layout's plain-buffer kernels on arm64-sve256, against the stored rows' bits: Q8_0 / Q4_0's 8
    lanes a block (columns_arm_lanes' ``wide``: a whole tile's vector loop, partial sub-tiles, the odd last block),
    the K-quants and MXFP4 as at 128 bits; a decode, an odd batch (no 2-row kernel), part of the columns, and
    mul_mat_id."""
    rng = np.random.default_rng(int(qtype) + 5605)
    K = 512 if qtype in (QT.Q4_K, QT.Q6_K) else 480  # the 32-value blocks: an odd count (the last block's own step)
    w = weight_bytes(qtype, 80, K, rng)  # a whole tile of 64 columns and a part
    cols = columns.layout(w, qtype)
    assert columns_arm.covers(qtype, PATH, False)
    stack = np.stack([w, weight_bytes(qtype, 80, K, rng)])
    scols = columns.layout(stack, qtype)
    for T in (1, 3):
        x = hard_acts(rng, T, K) if T == 3 else acts(rng, T, K)
        want = mul_mat(w, qtype, x, PATH)
        assert np.array_equal(bits(mul_mat(w, qtype, x, PATH, cols=cols)), bits(want)), T
        part = columns_arm.mul_mat_cols_arm(cols.columns(8, 72), x, PATH, repacked=False)
        assert np.array_equal(bits(part), bits(want[:, 8:72])), T
        ids = rng.integers(0, 2, (T, 2)).astype(np.int32)
        xs = x.reshape(T, 1, K)
        got = mul_mat_id(stack, qtype, xs, ids, PATH, cols=scols)
        assert np.array_equal(bits(got), bits(mul_mat_id(stack, qtype, xs, ids, PATH))), T
