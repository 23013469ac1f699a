"""The Q4_K / Q6_K super-block dots read straight from the stored rows (kernels/ggml/rows_k_ir.py): every
instruction level the host runs equals the definitions, lane for lane, on any bytes — codes at their extremes,
activation bytes of -128 (never produced by Q8_K's quantizer, exact all the same), negative and positive scales,
every chunk count the kernels use. The kernels built on them (vec_dot of Q4_K / Q6_K, Q4_K's repacked gemv and
gemm) are held to libggml in tests/test_ggml_ops_mulmat.py and tests/test_ggml_ops_repack_k.py."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from kernels.base.flags import JIT_ENABLED
from kernels.ggml import rows_k_ir


def _cases(rng):
    """(w uint8, y int8, sc int32) triples: random, then every extreme."""
    for trial in range(60):
        w = rng.integers(0, 256, 600, dtype=np.uint8)
        y = rng.integers(-128, 128, 600, dtype=np.int8)
        sc = rng.integers(-128, 128, 40).astype(np.int32) if trial % 2 else rng.integers(0, 64, 40).astype(np.int32)
        yield w, y, sc
    for wv, yv, sv in ((255, -128, 127), (255, -128, -128), (255, 127, 63), (0, -128, 127)):
        yield np.full(600, wv, np.uint8), np.full(600, yv, np.int8), np.full(40, sv, np.int32)


@pytest.mark.skipif(not JIT_ENABLED, reason="the IR kernels need numba")
@pytest.mark.parametrize("level", (0, 1, 2))
def test_levels_equal_the_definitions(level):
    if level > rows_k_ir.LEVEL:
        pytest.skip(f"the host runs levels up to {rows_k_ir.LEVEL}")
    q4, q4_total, q6 = rows_k_ir.make("q4_k", level), rows_k_ir.make("q4_k", level, True), rows_k_ir.make("q6_k", level)
    q4_block, q6_fma = rows_k_ir.make("q4_k_block", level), rows_k_ir.make("q6_k_fma", level)

    @numba.njit
    def run(w, wo, y, yo, sc, so, n):
        return q4(w, wo, y, yo, sc, so, n), q4_total(w, wo, y, yo, sc, so, n), q6(w, wo, y, yo, sc, so)

    @numba.njit
    def block(w, wo, y, yo, ys, so):
        return q4_block(w, wo, y, yo, ys, so)

    @numba.njit
    def fma6(w, wo, y, yo, bs, bo, db, acc):
        q6_fma(w, wo, y, yo, bs, bo, db, acc)

    rng = np.random.default_rng(5)
    for i, (w, y, sc) in enumerate(_cases(rng)):
        wo, yo, so = (int(v) for v in rng.integers(0, 100, 3))
        so %= 8
        n = (1, 4, 2, 3, 0)[i % 5]
        lanes4, total4, lanes6 = run(w, wo, y, yo, sc, so, n)
        want4 = rows_k_ir.q4_k_lanes_def(w, wo, y, yo, sc, so, n)
        assert lanes4 == want4, (i, n)
        assert total4 == sum(want4)
        assert lanes6 == rows_k_ir.q6_k_lanes_def(w, wo, y, yo, sc, so), i
        ys = rng.integers(-4096, 4097, 40).astype(np.int64)  # sums of 32 Q8 bytes
        assert block(w, wo, y, yo, ys, so) == rows_k_ir.q4_k_block_def(w, wo, y, yo, ys, so), i
        bs = rng.integers(-2032, 2033, 40).astype(np.int64)  # bsums of 16 Q8 bytes
        db = np.float32(rng.standard_normal() * 1e-3)
        acc = rng.standard_normal(8).astype(np.float32)
        want = acc.copy()
        rows_k_ir.q6_k_fma_def(w, wo, y, yo, bs, so, db, want)
        fma6(w, wo, y, yo, bs, so, db, acc)
        assert np.array_equal(acc.view(np.uint32), want.view(np.uint32)), i


def test_definitions_are_the_decoded_rows():
    """The definitions' codes are the stored rows' (kernels.ggml.mulmat_k.decode_row: Q4_K's nibbles, Q6_K's 6-bit
    codes), their lanes ggml's (kernels.ggml.simd.dot32_lanes over bytes 4l … 4l+3 of each 32-value load)."""
    from kernels.ggml.mulmat_k import decode_row
    from kernels.ggml.simd import _dot32_lanes_def
    from kernels.ggml.vecmath import F16_TO_F32

    rng = np.random.default_rng(6)
    for kind, block, sub in ((0, 144, 32), (2, 210, 16)):
        w = rng.integers(0, 256, block, dtype=np.uint8)
        w[:4] = (60, 0, 60, 0) if kind == 0 else w[:4]  # finite fp16 scales (unused here)
        q, sc, mn = np.empty(256, np.int32), np.empty(256 // sub, np.int32), np.zeros(256 // sub, np.int32)
        decode_row(kind, w, q, sc, mn, np.empty(1, np.float32), np.zeros(1, np.float32), F16_TO_F32)
        y = rng.integers(-127, 128, 256, dtype=np.int8)
        v = np.zeros(8, np.int32)
        for g in range(8):
            s0, s1 = (sc[g], sc[g]) if sub == 32 else (sc[2 * g], sc[2 * g + 1])
            _dot32_lanes_def(v, q, 32 * g, y.astype(np.int32), 32 * g, s0, s1)
        got = (rows_k_ir.q4_k_lanes_def(w, 16, y, 0, sc, 0, 4) if kind == 0 else
               rows_k_ir.q6_k_lanes_def(w, 0, y, 0, sc, 0))
        assert got == tuple(int(x) for x in v), kind


def test_block_definition_decodes_get_scale_min_k4():
    """q4_k_block_def's scales and mins are get_scale_min_k4's (kernels.plain.dequant.k_scale_min), its ΣI the
    lanes' sums with them, its ΣM the mins times the sums."""
    from kernels.plain.dequant import k_scale_min

    rng = np.random.default_rng(7)
    for _ in range(20):
        w = rng.integers(0, 256, 144, dtype=np.uint8)
        y = rng.integers(-127, 128, 256, dtype=np.int8)
        ys = rng.integers(-4096, 4097, 8).astype(np.int64)
        sc, mn = (np.array(v, np.int32) for v in zip(*(k_scale_min(w, 4, j) for j in range(8))))
        want = [sum(rows_k_ir.q4_k_lanes_def(w, 16 + 32 * c, y, 64 * c, sc, 2 * c, 1)) for c in range(4)]
        want += [int(mn[2 * c]) * int(ys[2 * c]) + int(mn[2 * c + 1]) * int(ys[2 * c + 1]) for c in range(4)]
        assert rows_k_ir.q4_k_block_def(w, 0, y, 0, ys, 0) == tuple(want)
