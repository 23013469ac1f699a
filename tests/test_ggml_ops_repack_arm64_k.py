"""kernels.ggml.repack_arm_k (Q4_K / Q5_K / Q6_K in the CPU_REPACK buffer on AArch64: 8x4 with dotprod, 8x8 with
i8mm) bit for bit against the GCC ARM builds under qemu, and the clang build of the i8mm kernels (every repacked
type). Each test also shows the other float recipes of :data:`kernels.ggml.repack_arm_k.GEMM_GEMV` give other bits.
Inputs and graph functions: tests/test_ggml_ops_repack_arm64.py. Skipped without the ARM builds. Cost: ~40 s on 2
shared vCPUs with warm numba caches (its qemu workers shared with that module in one process).
"""

import numpy as np
import pytest
from ggml_graph import on_build
from gguf import GGMLQuantizationType as QT
from test_ggml_ops_repack_arm64 import (
    ARM,
    ARM_BUILDS,
    KQ,
    REPACK_ARM_B32,
    TYPES,
    _require,
    acts,
    acts_k,
    bits,
    g_mul_mat_ids,
    g_mul_mats,
    weight_bytes,
)

from kernels.ggml import repack_arm
from kernels.ggml.repack_arm import mul_mat_repacked_arm

pytestmark = pytest.mark.oracle

RECIPES = {QT.Q4_K: {0, 1, 2}, QT.Q5_K: {0, 2, 3}, QT.Q6_K: {4, 5}}


def wrong_recipe(w, qt, x, recipe):
    """A wrong model: every row through one float recipe of repack_arm_k.GEMM_GEMV."""
    from kernels.ggml import repack_arm_k as rk

    y, yd, ys = rk._q8_k(np.ascontiguousarray(x, np.float32))
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    rows = np.arange(x.shape[0])
    rk._run(w, qt, y, yd, ys, np.full(x.shape[0], recipe, np.int64), rows, out, rows)
    return repack_arm.arm_nans(out)


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_k_mul_mat_bit_exact(build):
    from kernels.ggml.repack_arm_k import GEMM_GEMV, mul_mat_repacked_arm_k

    _require(build)
    path = ARM[build]
    rng = np.random.default_rng(3903)
    cases = []
    for qt in KQ:
        for n, k, ts, scales in ((8, 256, (1, 2, 3, 4, 5, 9), "normal"), (24, 512, (2, 4, 7, 8), "normal"),
                                 (16, 256, (3, 6, 8), "extreme")):
            w = weight_bytes(qt, n, k, rng, scales)
            for t in ts:
                cases.append((w, int(qt), k, acts_k(rng, t, k), 1 + (t % 2)))
    got = on_build(build, g_mul_mats, cases)
    for (w, gt, K, x, nth), y in zip(cases, got):
        want = mul_mat_repacked_arm_k(w, QT(gt), x, path)
        bad = bits(y) != bits(want)
        assert not bad.any(), (QT(gt).name, w.shape, x.shape, nth, np.argwhere(bad)[:4], y[bad][:4], want[bad][:4])
    for qt in KQ:  # the other recipes give other bits; where gemm and gemv differ, so do their rows
        mine = [(c, y) for c, y in zip(cases, got) if c[1] == int(qt)]
        gemm, gemv = GEMM_GEMV[(qt, path)]
        for rec in RECIPES[qt] - {gemm, gemv}:
            assert any((bits(wrong_recipe(c[0], qt, c[3], rec)) != bits(y)).any() for c, y in mine), (qt, rec)
        if gemm != gemv:
            assert any((bits(wrong_recipe(c[0], qt, c[3], gemv)) != bits(y)).any() for c, y in mine if len(c[3]) >= 4)


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_k_mul_mat_id_bit_exact(build):
    from kernels.ggml.repack_arm_k import mul_mat_id_repacked_arm_k

    _require(build)
    path = ARM[build]
    rng = np.random.default_rng(3904)
    E, n_used = 4, 2
    cases = []
    for qt in KQ:
        for N, K, T in ((8, 256, 1), (16, 256, 6)):
            w = np.stack([weight_bytes(qt, N, K, rng) for _ in range(E)])
            ids = np.stack([np.r_[0, 1 + rng.permutation(E - 1)[:n_used - 1]] for _ in range(T)]).astype(np.int32)
            for n_x in (1, n_used):
                cases.append((w, int(qt), K, acts_k(rng, T * n_x, K).reshape(T, n_x, K), ids, n_x))
    got = on_build(build, g_mul_mat_ids, cases)
    for (w, gt, K, x, ids, nth), y in zip(cases, got):
        want = mul_mat_id_repacked_arm_k(w, QT(gt), x, ids, path)
        assert np.array_equal(bits(y), bits(want)), (QT(gt).name, w.shape, x.shape,
                                                      np.argwhere(bits(y) != bits(want))[:4])


def test_clang_i8mm():
    """The clang build of the i8mm kernels (``arm64-i8mm-clang``, no path key yet): every ``vmlaq_f32`` /
    ``vmlsq_f32`` contracted, the Q8_K quantizer not — bit for bit, and unlike the GCC recipes."""
    from kernels.ggml.repack_arm_k import mul_mat_id_repacked_arm_k, mul_mat_repacked_arm_k

    build = "arm64-i8mm-clang"
    _require(build)
    rng = np.random.default_rng(3908)
    cases = []
    for qt in (*TYPES, *KQ):
        w = weight_bytes(qt, 16, 512, rng)
        cases += [(w, int(qt), 512, (acts if qt in REPACK_ARM_B32 else acts_k)(rng, t, 512), 2) for t in (2, 5, 8)]
    got = on_build(build, g_mul_mats, cases)
    differs = set()
    for (w, gt, _, x, _), y in zip(cases, got):
        f = mul_mat_repacked_arm if gt in map(int, REPACK_ARM_B32) else mul_mat_repacked_arm_k
        assert np.array_equal(bits(y), bits(f(w, QT(gt), x, "arm64-i8mm-clang"))), (QT(gt).name, x.shape)
        if (bits(y) != bits(f(w, QT(gt), x, "arm64-i8mm"))).any():
            differs.add(QT(gt))
    assert {QT.IQ4_NL, QT.Q4_K, QT.Q5_K, QT.Q6_K} <= differs  # the GCC build's bits are not clang's
    w = np.stack([weight_bytes(QT.Q4_K, 8, 256, rng) for _ in range(3)])
    ids = np.array([[0, 2], [1, 0], [2, 1], [0, 1], [2, 0]], np.int32)
    x = acts_k(rng, 10, 256).reshape(5, 2, 256)
    y = on_build(build, g_mul_mat_ids, [(w, int(QT.Q4_K), 256, x, ids, 2)])[0]
    assert np.array_equal(bits(y), bits(mul_mat_id_repacked_arm_k(w, QT.Q4_K, x, ids, "arm64-i8mm-clang")))
