"""``arm64-sve128`` (``-march=armv9-a+sve2+i8mm+dotprod+fp16``, GCC 12, run by qemu at a 128-bit vector length)
against ``arm64-sve128-gcc``, bit for bit: the ops whose vec.h / vec.cpp code has SVE branches (kernels.ggml.sve)
and the auto-vectorized loops GCC turned into SVE ones.

What is SVE's own (tested here, and that NEON's emulation would miss): silu / swiglu / soft_max take the vector
``ggml_v_expf`` on every element (a predicated last block, no libm tail); ``ggml_vec_dot_f32`` has 8 accumulators
and a predicated tail; ``ggml_vec_dot_f16`` accumulates in *float* (FMLALB/FMLALT) where NEON's is half, so the
flash attention K·Q that overflows NEON's half lanes stays finite; ``ggml_vec_mad_f16`` / ``ggml_vec_scale_f16``
compute every element in half; ssm_conv's taps are all rounded products added in order (FADDA); the fused
RMS_NORM+MUL multiplies ``scale·x`` then ``w·t`` (NaN operand order). The other element-wise ops, rope, get_rows,
the norms' sums are NEON's numbers. Flash attention's tiled path (64+ rows) takes simd-gemm.h's scalar loops
under SVE: fmadd chains, NEON's bits. Cost: one qemu worker (~7 s) and ~20 s of tests.

The same ``-march`` compiled by clang (GGML_CPU_ALL_VARIANTS' ``android_armv9.0_1``): ``arm64-sve128-clang``
(Debian's clang 14 → path ``arm64-sve128-clang14``) and ``arm64-sve128-clang19`` (clang 19 → ``arm64-sve128-clang``)
run every test here too (``-m deep``), and :func:`test_the_clang_builds_against_the_gcc_build` (clang 14's by default, clang 19's under ``-m deep``) finds,
library against library, what clang computes otherwise, and the emulation's bits for each: the NEON kernels the
SVE build keeps with clang's contractions (arm64-i8mm-clang's), ssm_conv's taps in unpredicated blocks of 8 then
``fmadd``, the fused RMS_NORM+MUL as ``t·w`` — and, clang 14 to 16 only, Q6_K's SVE 1-row kernel reading every odd
code's high bits as 3: ACLE's ``_x`` forms leave inactive lanes unspecified, llama.cpp predicates bytes with a 16-bit
predicate, and those clangs keep the inactive lanes as they were (a merging ``and``): a wrong dot, which the
emulation reproduces; GCC and clang 17+ compute every lane. Cost (default): one more qemu worker (~7 s) and ~8 s.
"""

import numpy as np
import pytest
from ggml_graph import on_build
from test_ggml_ops_arm64 import assert_bits, emulated_mul_mat, g_mul_mat, g_unary, spread
from test_ggml_ops_attn import make
from test_ggml_ops_attn_arm64 import check
from test_ggml_ops_rows import g_rms_norm, hard_rows, nan_bits
from test_ggml_ops_ssm import gdn_graph, gdn_inputs, hard_floats, split_gdn, ssm_conv_graph
from test_ggml_ops_unary import g_soft_max, g_swiglu, hard_values, rows_of, soft_max_cases

from kernels.ggml import vec
from kernels.ggml import vecmath as vm
from kernels.ggml.flashattn_exact import flash_attn_ext
from kernels.ggml.isa import NEON, SVE128
from kernels.ggml.norm import rms_norm
from kernels.ggml.ssm import gated_delta_net, ssm_conv

pytestmark = pytest.mark.oracle
#: the SVE builds (tests/arm64.py) and their paths; clang's run the op tests under ``-m deep``
BUILDS = ["arm64-sve128-gcc", *(pytest.param(b, marks=pytest.mark.deep) for b in ("arm64-sve128-clang", "arm64-sve128-clang19"))]
PATH = {"arm64-sve128-gcc": "arm64-sve128", "arm64-sve128-clang": "arm64-sve128-clang14",
        "arm64-sve128-clang19": "arm64-sve128-clang", "arm64-sve256-gcc": "arm64-sve256"}


@pytest.mark.parametrize("build", BUILDS)
def test_vec_dot_f32_and_f16(build):
    """mul_mat of F32 / F16 weights: each output one SVE ggml_vec_dot_f32 / _f16 (every tail of 4, 8, 32, 64)."""
    rng = np.random.default_rng(39)
    for k in (1, 3, 4, 7, 8, 9, 17, 31, 32, 33, 63, 64, 65, 100, 200):
        a, b = spread(rng, (3, k)), spread(rng, (2, k))
        assert_bits(emulated_mul_mat(a, b, vec.vec_dot_f32, SVE128), on_build(build, g_mul_mat, a, b), f"f32 K={k}")
        a16 = spread(rng, (3, k), -3, 3).astype(np.float16)
        got = on_build(build, g_mul_mat, a16, b)
        b16 = b.astype(np.float16).astype(np.float32)  # src1 converted to F16 (round to nearest even)
        assert_bits(emulated_mul_mat(a16.astype(np.float32), b16, vec.vec_dot_f16, SVE128), got, f"f16 K={k}")
    a16, b = spread(rng, (4, 256), -2, 2).astype(np.float16), spread(rng, (2, 256), -2, 2)
    got = on_build(build, g_mul_mat, a16, b)  # NEON's half accumulators would miss
    assert not np.array_equal(emulated_mul_mat(a16.astype(np.float32), b.astype(np.float16).astype(np.float32),
                                               vec.vec_dot_f16, NEON), got)


@pytest.mark.parametrize("build", BUILDS)
def test_silu_swiglu_soft_max(build):
    """The vector expf on every element: rows of every length mod 4 (NEON's scalar tail would be libm's)."""
    rng = np.random.default_rng(1)
    for width in (1, 3, 5, 8, 23, 37):
        x = rows_of(hard_values(rng, 200), width)
        assert_bits(vm.silu(x, PATH[build]), on_build(build, g_unary, "ggml_silu", x), f"silu width {width}")
        g = np.where(np.isnan(x), np.float32(1.5), rows_of(hard_values(rng, 200, scale=2.0, nan=False), width))
        assert_bits(vm.swiglu(x, g, PATH[build]), on_build(build, g_swiglu, x, g), f"swiglu width {width}")
    for k, (x, mask, scale) in enumerate(soft_max_cases(np.random.default_rng(3))):
        assert_bits(vm.soft_max(x, mask, scale, PATH[build]), on_build(build, g_soft_max, x, mask, scale), f"soft_max {k}")
    x = np.float32([[-0.5, 2.0, -3.25]])  # 3 < 4 lanes: vector expf here, AArch64 glibc's on NEON
    assert not np.array_equal(vm.silu(x, PATH[build]).view(np.uint32), vm.silu(x, "arm64-i8mm").view(np.uint32))


@pytest.mark.parametrize("build", BUILDS + ["arm64-sve256-gcc"])
def test_rms_norm_fused_nan_order(build):
    """RMS_NORM+MUL: GCC's SVE loop takes every element (``fmul scale, x`` then ``fmul w, t``), at any length."""
    rng = np.random.default_rng(2701)
    for n in (5, 37):
        x = hard_rows(rng, 16, n)
        w = rng.standard_normal(n).astype(np.float32)
        w[rng.integers(0, n)] = nan_bits(0x7FC00ABC)[0]
        for eps in (1e-6, 0.0):
            assert_bits(rms_norm(x, eps, PATH[build]), on_build(build, g_rms_norm, x, eps), f"rms_norm n={n}")
            assert_bits(rms_norm(x, eps, PATH[build], w), on_build(build, g_rms_norm, x, eps, w, 2), f"fused n={n}")


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
def test_flash_attn_one_row_and_split(build, kv_dtype):
    rng = np.random.default_rng(1)
    for i, shape in enumerate([(4, 2, 1, 37, 128), (4, 2, 4, 40, 80), (2, 1, 3, 257, 100), (1, 1, 2, 9, 17),
                               (2, 1, 1, 600, 64)]):  # the last: split-KV
        check(build, *make(rng, *shape, kv_dtype, amp=4.0 if i % 2 else 1.0), n_threads=1 + i % 2)
    # DV = 30: vec_scale_f16's SVE leftover is one predicated vector after steps of two, so with n % 16 > 8 its last
    # values are never scaled (a ggml bug, emulated: kernels.ggml.sve.vec_scale_f16) — F16 V only
    check(build, *make(rng, 2, 1, 3, 40, 32, kv_dtype, DV=30))


@pytest.mark.parametrize("build", BUILDS + ["arm64-sve256-gcc"])
def test_flash_attn_f16_dot_stays_finite(build):
    """K·Q of large halves: NEON's half lanes overflow to inf (NaN output), SVE's float ones hold 2.1e6 (at 256 bits
    too)."""
    rng = np.random.default_rng(9)
    q, k, v, m, scale = make(rng, 2, 1, 2, 20, 256, np.float16)
    q[:] = np.float32(90.0)
    k[:, [4, 9]] = np.float16(90.0)
    assert np.isfinite(check(build, q, k, v, m, scale)).all()
    assert np.isnan(flash_attn_ext(q, k, v, m, scale, "arm64-i8mm")).all()


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
def test_flash_attn_tiled(build, kv_dtype):
    """64+ rows: simd-gemm.h is off under SVE — its scalar simd_gemm, fmadd chains in order, the same bits as NEON's
    vector chains; soft_max over whole 64-cell tiles (FADDV = vaddvq_f32). DV % svcntw() != 0: one-row."""
    rng = np.random.default_rng(5)
    check(build, *make(rng, 1, 1, 64, 70, 32, kv_dtype), n_threads=2)
    check(build, *make(rng, 2, 2, 65, 70, 40, kv_dtype, DV=18))


@pytest.mark.parametrize("build", BUILDS)
def test_ssm_conv_and_gated_delta_net(build):
    rng = np.random.default_rng(27)
    for nc in (3, 4, 5, 13):
        sx, c = hard_floats(rng, (2, 37, nc + 4)), hard_floats(rng, (37, nc), 0.5)
        assert_bits(ssm_conv(sx, c, PATH[build]), on_build(build, ssm_conv_graph, sx, c, 2), f"ssm_conv nc={nc}")
    sx, c = rng.standard_normal((1, 256, 5 + 3)).astype(np.float32), rng.standard_normal((256, 5)).astype(np.float32)
    assert not np.array_equal(ssm_conv(sx, c, PATH[build]), ssm_conv(sx, c, "arm64-i8mm"))  # NEON fuses the 5th tap
    for n_seqs, T, H, H_k, S, K in [(1, 3, 2, 2, 24, 1), (2, 2, 2, 2, 33, 2), (1, 2, 1, 1, 64, 1)]:
        args = list(gdn_inputs(rng, n_seqs, T, H, H_k, S, S == 33))
        out_ref, states_ref = split_gdn(on_build(build, gdn_graph, *args, K, 1), args[2].shape, K)
        out, states = gated_delta_net(*args, PATH[build], K=K)
        assert_bits(out, out_ref, f"gdn output S={S}")
        written = min(T, K)
        assert_bits((states[None] if K == 1 else states)[:written], states_ref[:written], f"gdn state S={S}")


@pytest.mark.parametrize("clang", ["arm64-sve128-clang", pytest.param("arm64-sve128-clang19", marks=pytest.mark.deep)])
def test_the_clang_builds_against_the_gcc_build(clang):
    """clang's SVE builds (14 and 19) against ``arm64-sve128-gcc``, library against library (N = 8 rows, T = 1, 2, 5:
    the i8mm 2-row kernels and the 1-row ones), and the emulation against the clang library on each case:

    * mul_mat differs for the NEON kernels with ``vmlaq_n_f32`` / ``vmlaq_f32`` (Q8_0's and Q4_0's i8mm 2-row kernels
      — an odd T takes 1-row kernels only —, Q5_0, Q4_1, Q5_1: fused by clang); on clang 14 also for Q6_K's SVE 1-row
      kernel, whose odd codes are wrong: its dot is far from the exact one. The SVE kernels (Q8_0 and Q4_0's 1-row,
      Q2_K, Q3_K, Q4_K, Q6_K's SVE+MMLA 2-row, clang 19's Q6_K 1-row) and the other NEON ones agree;
    * ssm_conv differs where clang's blocks of 8 split the taps otherwise than GCC's FADDA over all of them;
    * the fused RMS_NORM+MUL keeps another NaN where x and w both hold one (``t·w``: GCC's ``w·t``)."""
    from gguf import GGMLQuantizationType as QT
    from gguf import quants
    from test_ggml_ops_mulmat import acts, g_mul_mats, weight_bytes

    from kernels.ggml.mulmat import mul_mat

    gcc, path = "arm64-sve128-gcc", PATH[clang]
    rng = np.random.default_rng(3970)
    differ = {QT.Q8_0: (False, True, False), QT.Q4_0: (False, True, False), QT.Q5_0: (True, True, True),
              QT.Q4_1: (True, True, True), QT.Q5_1: (True, True, True)}  # T = 1, 2, 5
    q6_k = (True, False, True) if path == "arm64-sve128-clang14" else (False, False, False)
    same = (QT.MXFP4, QT.IQ4_NL, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.IQ4_XS)
    types = (*differ, QT.Q6_K, *same)
    cases = [(weight_bytes(qt, 8, 512, rng), int(qt), 512) for qt in types]
    cases = [(w, gt, k, acts(rng, t, 512), 1) for w, gt, k in cases for t in (1, 2, 5)]
    ys_gcc, ys_clang = on_build(gcc, g_mul_mats, cases), on_build(clang, g_mul_mats, cases)
    got = {qt: tuple(bool((a.view(np.uint32) != b.view(np.uint32)).any())
                     for a, b in zip(ys_gcc[3 * i:3 * i + 3], ys_clang[3 * i:3 * i + 3])) for i, qt in enumerate(types)}
    assert got == {**differ, QT.Q6_K: q6_k, **{qt: (False,) * 3 for qt in same}}, got
    for (w, gt, _, x, nth), y in zip(cases, ys_clang):
        assert_bits(mul_mat(w, QT(gt), x, path, n_threads=nth), y, f"{QT(gt).name} T={x.shape[0]}")
    q6 = 3 * types.index(QT.Q6_K)  # T = 1: the 1-row kernel
    w, x = cases[q6][0], cases[q6][3]
    exact = quants.dequantize(w, QT.Q6_K).reshape(8, 512).astype(np.float64) @ x[0].astype(np.float64)
    err = {b: np.abs(ys[q6][0] - exact).max() / np.abs(exact).max() for b, ys in ((gcc, ys_gcc), (clang, ys_clang))}
    assert err[gcc] < 0.05 and (err[clang] > 0.5 if q6_k[0] else err[clang] == err[gcc]), err  # GCC: Q8_K's rounding

    for nc, expect in ((3, True), (4, True), (5, True), (8, False), (13, True)):
        sx, c = hard_floats(rng, (2, 64, nc - 1 + 3)), hard_floats(rng, (64, nc), 0.5)
        ys = on_build(gcc, ssm_conv_graph, sx, c, 1), on_build(clang, ssm_conv_graph, sx, c, 1)
        assert bool((ys[0].view(np.uint32) != ys[1].view(np.uint32)).any()) == expect, nc
        assert_bits(ssm_conv(sx, c, path), ys[1], f"ssm_conv nc={nc}")

    x = hard_rows(rng, 16, 37)
    w = rng.standard_normal(37).astype(np.float32)
    w[[3, 20]] = nan_bits(0x7FC00ABC)[0]
    ys = on_build(gcc, g_rms_norm, x, 1e-6, w, 2), on_build(clang, g_rms_norm, x, 1e-6, w, 2)
    assert (ys[0].view(np.uint32) != ys[1].view(np.uint32)).any()
    assert_bits(rms_norm(x, 1e-6, path, w), ys[1], "fused rms_norm")
