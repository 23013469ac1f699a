"""``arm64-sve256``'s CPU_REPACK buffer (kernels.ggml.repack_arm, kernels.ggml.repack_arm_k) against
``arm64-sve256-gcc`` (the SVE library of ``arm64-sve128-gcc`` run by qemu at a 256-bit vector length), bit for bit.

What 256 bits change (``ggml_repack_get_optimal_repack_type`` and ``arch/arm/repack.cpp`` where ``svcntb() == 32``):
Q4_0 with ``ne[1] % 8 == 0`` takes ``q4_0_8x8`` (its SVE gemv and gemm asm; ``ne[1] % 8 == 4``: ``4x8``, the i8mm
code), Q8_0's 4x8 gemm and Q4_K's 8x8 gemm run their SVE bodies; every other choice and kernel is i8mm's NEON code.
The Q4_0 and Q8_0 SVE bodies give the i8mm bits by construction (kernels.ggml.repack_arm's docstring); Q4_K's gemm
``svmls_f32`` / ``svmla_f32`` fuse its mins and its super-block step (``GEMM_GEMV``'s ``2 + FUSED_MINS``), so a Q4_K
product of 4 rows or more differs from the i8mm build's — shown here, as is each 32-value type's gemm against gemv
where they differ. Every tail of the gemm's 4-row groups (T % 4), the ARM quantizers' hard rows (ties, NaN, inf,
zeros, tiny), extreme and infinite weight scales, 1 and 2 threads, mul_mat_id (gemv only), the dispatch of
kernels.ggml.mulmat, and the column layout (kernels.ggml.columns_arm) on this path. Inputs and graph functions:
tests/test_ggml_ops_repack_arm64.py. Skipped without the ARM builds. Cost: one qemu worker (~7 s, shared with the
other sve256 modules in one process) and ~15 s.
"""

import numpy as np
import pytest
from ggml_graph import on_build
from gguf import GGMLQuantizationType as QT
from test_ggml_ops_repack_arm64 import (
    KQ,
    TYPES,
    _require,
    acts,
    acts_k,
    bits,
    g_mul_mat_ids,
    g_mul_mats,
    g_repacks,
    inf_scales,
    unfused_all,
    weight_bytes,
)
from test_ggml_ops_repack_arm64_k import wrong_recipe

from kernels.ggml import columns, columns_arm, mulmat
from kernels.ggml.repack_arm import (
    FUSED,
    REPACK_ARM,
    REPACK_ARM_B32,
    mul_mat_id_repacked_arm,
    mul_mat_repacked_arm,
    repacked_arm,
)
from kernels.ggml.repack_arm_k import FUSED_MINS, GEMM_GEMV, mul_mat_id_repacked_arm_k, mul_mat_repacked_arm_k

BUILD, PATH = "arm64-sve256-gcc", "arm64-sve256"
ROW_BYTES = {QT.Q8_0: 272, QT.Q4_0: 144, QT.IQ4_NL: 144, QT.MXFP4: 136, QT.Q4_K: 144, QT.Q5_K: 176, QT.Q6_K: 210}


def _acts(qt, rng, t, k):
    return (acts if qt in REPACK_ARM_B32 else acts_k)(rng, t, k)


def _direct(qt):
    """(mul_mat, mul_mat_id) of the stored-row kernels of ``qt``."""
    if qt in REPACK_ARM_B32:
        return mul_mat_repacked_arm, mul_mat_id_repacked_arm
    return mul_mat_repacked_arm_k, mul_mat_id_repacked_arm_k


@pytest.mark.oracle
def test_repack_choice():
    """Which weights CPU_REPACK takes at 256 bits: the 32-value types at ``ne[1] % 4 == 0`` (Q4_0: 8x8 at % 8, 4x8
    else — the same bits), the K-quants at ``% 8``, Q2_K never (AVX-512 only)."""
    _require(BUILD)
    shapes = [(256, 4), (256, 8), (256, 12), (256, 6)]
    for qt, (mult, kernel) in REPACK_ARM[PATH].items():
        got = on_build(BUILD, g_repacks, int(qt), shapes, ROW_BYTES[qt])
        assert got == [repacked_arm(qt, n, PATH) for _, n in shapes], qt.name
    assert REPACK_ARM[PATH][QT.Q4_0] == (4, "8x8") and REPACK_ARM["arm64-sve128"][QT.Q4_0] == (4, "4x8")
    assert on_build(BUILD, g_repacks, int(QT.Q2_K), [(256, 8)], 84) == [False]


@pytest.mark.oracle
def test_mul_mat_bit_exact():
    """Every repacked type, T = 1 … 9 and 22 (gemv rows, gemm groups and every tail), against the library; Q4_K's
    gemm rows differ from the i8mm build's (its SVE body), the other types' and the gemv rows do not."""
    _require(BUILD)
    rng = np.random.default_rng(25601)
    cases = []
    for qt in (*TYPES, *KQ):
        ns = (8, 12) if qt in REPACK_ARM_B32 else (8, 16)  # Q4_0: 8x8 (SVE asm) and 4x8 (NEON i8mm)
        for n, k, ts, scales in ((ns[0], 256, (1, 2, 3, 4, 5, 6, 7, 9), "normal"), (ns[1], 512, (4, 8), "extreme")):
            w = weight_bytes(qt, n, k, rng, scales)
            cases += [(w, int(qt), k, _acts(qt, rng, t, k), 1 + t % 2) for t in ts]
        if qt in (QT.Q8_0, QT.Q4_0, QT.Q4_K):  # the SVE gemms: Q4_0's asm's 16-row loop, then its 4-row tail
            cases.append((weight_bytes(qt, 8, 256, rng), int(qt), 256, _acts(qt, rng, 22, 256), 2))
    got = on_build(BUILD, g_mul_mats, cases)
    differs = set()
    for (w, gt, _, x, nth), y in zip(cases, got):
        qt = QT(gt)
        want = _direct(qt)[0](w, qt, x, PATH)
        bad = bits(y) != bits(want)
        assert not bad.any(), (qt.name, w.shape, x.shape, nth, np.argwhere(bad)[:4])
        assert np.array_equal(bits(mulmat.mul_mat(w, qt, x, PATH, n_threads=nth, repack=True)), bits(want))
        i8mm = _direct(qt)[0](w, qt, x, "arm64-i8mm")
        T = x.shape[0]
        if (bits(i8mm) != bits(y)).any():
            differs.add(qt)
            assert np.array_equal(bits(i8mm[T - T % 4:]), bits(y[T - T % 4:])), qt.name  # the gemv rows: i8mm's
    assert differs == {QT.Q4_K}
    assert GEMM_GEMV[(QT.Q4_K, PATH)] == (2 + FUSED_MINS, 1)
    # wrong models differ: Q8_0's and Q4_0's SVE gemm unfused, Q4_K's gemm rows through the gemv's recipe or through
    # the i8mm build's unfused gemm
    for qt in (QT.Q8_0, QT.Q4_0):
        assert FUSED[(qt, PATH)] == (True, True)
        mine = [(c, y) for c, y in zip(cases, got) if c[1] == int(qt) and len(c[3]) >= 4]
        assert any((bits(unfused_all(c[0], qt, c[3], PATH, False)[:4]) != bits(y[:4])).any() for c, y in mine), qt
    mine = [(c, y) for c, y in zip(cases, got) if c[1] == int(QT.Q4_K) and len(c[3]) >= 4]
    for rec in (1, 2):
        assert all((bits(wrong_recipe(c[0], QT.Q4_K, c[3], rec)[:4]) != bits(y[:4])).any() for c, y in mine), rec


@pytest.mark.oracle
def test_mul_mat_id_bit_exact():
    """``forward_mul_mat_id``: every routed row through the gemv (Q4_0 8x8's SVE gemv asm; the others i8mm's NEON
    code), one activation row or one per slot."""
    _require(BUILD)
    rng = np.random.default_rng(25602)
    E, n_used = 3, 2
    cases = []
    for qt in (*TYPES, *KQ):
        for N, K, T in ((8, 256, 1), (16, 256, 5)):
            w = np.stack([weight_bytes(qt, N, K, rng) for _ in range(E)])
            ids = np.stack([np.r_[0, 1 + rng.permutation(E - 1)[:n_used - 1]] for _ in range(T)]).astype(np.int32)
            n_x = 1 + T % 2
            cases.append((w, int(qt), K, _acts(qt, rng, T * n_x, K).reshape(T, n_x, K), ids, n_x))
    got = on_build(BUILD, g_mul_mat_ids, cases)
    for (w, gt, _, x, ids, _), y in zip(cases, got):
        qt = QT(gt)
        want = _direct(qt)[1](w, qt, x, ids, PATH)
        assert np.array_equal(bits(y), bits(want)), (qt.name, w.shape, x.shape, np.argwhere(bits(y) != bits(want))[:4])
        assert np.array_equal(bits(mulmat.mul_mat_id(w, qt, x, ids, PATH, repack=True)), bits(want))


@pytest.mark.oracle
def test_inf_weight_scales():
    """Infinite, zero and subnormal weight scales (and a Q4_K dmin) against zero activation blocks, gemm and gemv
    rows: the NaNs they make are ARM's default +NaN, as the model's."""
    _require(BUILD)
    rng = np.random.default_rng(25603)
    cases = []
    for qt in (QT.Q8_0, QT.MXFP4, QT.Q4_K, QT.Q6_K):
        w = inf_scales(weight_bytes(qt, 8, 512, rng), qt, rng)
        for t in (1, 5):
            x = _acts(qt, rng, t, 512)
            x[0, :40] = 0.0
            cases.append((w, int(qt), 512, x, 1))
    got = on_build(BUILD, g_mul_mats, cases)
    assert any(np.isnan(y).any() for y in got)
    for (w, gt, _, x, _), y in zip(cases, got):
        want = _direct(QT(gt))[0](w, QT(gt), x, PATH)
        assert np.array_equal(bits(y), bits(want)), (QT(gt).name, x.shape, np.argwhere(bits(y) != bits(want))[:4])


@pytest.mark.parametrize("qtype", [QT.Q4_K, *(pytest.param(t, marks=pytest.mark.deep)
                                             for t in (QT.Q5_K, QT.Q6_K, QT.Q4_0, QT.IQ4_NL, QT.MXFP4))])
def test_columns_equal_stored_rows(qtype):
    """The column layout (kernels.ggml.columns_arm) covers this path's repacked kernels with their bits: gemm rows
    (Q4_K: the fused SVE recipe) then gemv rows, column ranges, and mul_mat_id. No library call: the stored-row
    kernels are the ones checked above."""
    assert columns_arm.covers(qtype, PATH)
    rng = np.random.default_rng(int(qtype) + 25604)
    w = weight_bytes(qtype, 24, 512, rng)
    cols = columns.layout(w, qtype)
    for T in (1, 3, 4, 5, 8):
        x = _acts(qtype, rng, T, 512)
        want = mulmat.mul_mat(w, qtype, x, PATH, repack=True)
        assert np.array_equal(bits(mulmat.mul_mat(w, qtype, x, PATH, repack=True, cols=cols)), bits(want)), T
        assert np.array_equal(bits(columns_arm.mul_mat_cols_arm(cols.columns(8, 24), x, PATH)), bits(want[:, 8:])), T
    stack = np.stack([w, weight_bytes(qtype, 24, 512, rng)])
    ids = np.array([[0, 1], [1, 0], [1, 1]], np.int32)
    x = _acts(qtype, rng, 3, 512)[:, None]
    want = mulmat.mul_mat_id(stack, qtype, x, ids, PATH, repack=True)
    got = mulmat.mul_mat_id(stack, qtype, x, ids, PATH, repack=True, cols=columns.layout(stack, qtype))
    assert np.array_equal(bits(got), bits(want))
