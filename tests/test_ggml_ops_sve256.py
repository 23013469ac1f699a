"""``arm64-sve256``: the GCC 12 SVE library (``-march=armv9-a+sve2+i8mm+dotprod+fp16``) on a CPU with 256-bit vectors
(Neoverse V1, Graviton3) — ``arm64-sve256-gcc``, ``arm64-sve128-gcc``'s files run by qemu at a 256-bit vector length
(tests/arm64.py) — bit for bit: the ops whose vec.h / vec.cpp code reads the length (kernels.ggml.sve at ``svcntw()`` = 8).

What the length changes (each test also checks that the 128-bit emulation would miss it): ``ggml_vec_dot_f32`` has 8
accumulators of 8 lanes over steps of 64 and a FADDV of 8 lanes, ``ggml_vec_dot_f16`` vectors of 16 halves over steps
of 128, ``ggml_vec_soft_max_f32`` blocks of 8 (FADDV of 8); so mul_mat of F32 / F16 weights, soft_max, flash
attention (one-row, split-KV, tiled: its soft_max, and the tiled path's condition ``DV % svcntw() == 0``), the
F32-cache attention without flash attention and the gated delta net's dots. What it does not change, tested too:
silu / swiglu (lane by lane, the last block predicated at any length), ssm_conv (FADDA is in order),
``ggml_vec_mad_f16`` / ``ggml_vec_scale_f16`` (every element one half operation). Also run on this build elsewhere:
rms_norm and the F16 K·Q that NEON's half lanes overflow (tests/test_ggml_ops_sve128.py), the F32-cache attention without flash attention
(tests/test_ggml_ops_attn_arm64.py), SVE's dots across columns at 8 lanes (tests/test_ggml_kernel_parts.py). Cost: one
qemu worker (~7 s) and ~20 s of tests.
"""

import numpy as np
import pytest
from ggml_graph import on_build
from test_ggml_ops_arm64 import assert_bits, emulated_mul_mat, g_mul_mat, g_unary, spread
from test_ggml_ops_attn import make
from test_ggml_ops_attn_arm64 import check
from test_ggml_ops_ssm import gdn_graph, gdn_inputs, hard_floats, split_gdn, ssm_conv_graph
from test_ggml_ops_unary import g_soft_max, g_swiglu, hard_values, rows_of, soft_max_cases

from kernels.ggml import vec
from kernels.ggml import vecmath as vm
from kernels.ggml.flashattn_exact import fa_kernel, flash_attn_ext
from kernels.ggml.isa import SVE128, SVE256
from kernels.ggml.ssm import gated_delta_net, ssm_conv

pytestmark = pytest.mark.oracle
BUILD, PATH = "arm64-sve256-gcc", "arm64-sve256"


def differs(a, b):
    return bool((np.asarray(a, np.float32).view(np.uint32) != np.asarray(b, np.float32).view(np.uint32)).any())


def test_vec_dot_f32_and_f16():
    """mul_mat of F32 / F16 weights: each output one SVE ggml_vec_dot_f32 / _f16 at 8 lanes — every tail of 8 (the
    predicated svmla), 64 (the leftover vectors into sum1), 16 and 128 halves; hard values (ties of the sums, ±0,
    subnormal products, an inf). 128 bits' dots differ."""
    rng = np.random.default_rng(256)
    old = []
    for k in (1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 100, 127, 128, 129, 200, 300):
        a, b = spread(rng, (3, k), -30, 30), spread(rng, (2, k), -30, 30)
        a[0, :] = -0.0
        a[1, k // 2] = np.float32(1e-45)
        if k > 4:
            a[2, 3], b[1, 4] = np.inf, np.float32(2.0 ** -100)
        want = on_build(BUILD, g_mul_mat, a, b)
        assert_bits(emulated_mul_mat(a, b, vec.vec_dot_f32, SVE256), want, f"f32 K={k}")
        old.append(differs(emulated_mul_mat(a, b, vec.vec_dot_f32, SVE128), want))
        a16 = spread(rng, (3, k), -3, 3).astype(np.float16)
        a16[1, : k // 2] = np.float16(6e-8)  # subnormal halves: exact products, sums of ties
        b = spread(rng, (2, k), -3, 3)
        got = on_build(BUILD, g_mul_mat, a16, b)
        b16 = b.astype(np.float16).astype(np.float32)  # src1 converted to F16 (round to nearest even)
        assert_bits(emulated_mul_mat(a16.astype(np.float32), b16, vec.vec_dot_f16, SVE256), got, f"f16 K={k}")
        old.append(differs(emulated_mul_mat(a16.astype(np.float32), b16, vec.vec_dot_f16, SVE128), got))
    assert any(old)


def test_silu_swiglu_soft_max():
    """silu / swiglu: the vector expf on every element, rows of every length mod 8 (the same bits as 128 bits');
    soft_max: blocks of 8 lanes, FADDV of 8 (not 128 bits')."""
    rng = np.random.default_rng(1)
    for width in (1, 3, 5, 8, 9, 15, 23, 37):
        x = rows_of(hard_values(rng, 200), width)
        assert_bits(vm.silu(x, PATH), on_build(BUILD, g_unary, "ggml_silu", x), f"silu width {width}")
        g = np.where(np.isnan(x), np.float32(1.5), rows_of(hard_values(rng, 200, scale=2.0, nan=False), width))
        assert_bits(vm.swiglu(x, g, PATH), on_build(BUILD, g_swiglu, x, g), f"swiglu width {width}")
    old = []
    for k, (x, mask, scale) in enumerate(soft_max_cases(np.random.default_rng(3))):
        want = on_build(BUILD, g_soft_max, x, mask, scale)
        assert_bits(vm.soft_max(x, mask, scale, PATH), want, f"soft_max {k}")
        old.append(differs(vm.soft_max(x, mask, scale, "arm64-sve128"), want))
    for n in (1, 59, 62, 63):  # the tails of 8 the cases above leave out (3, 6, 7)
        x = rng.standard_normal((4, n)).astype(np.float32) * 4
        want = on_build(BUILD, g_soft_max, x, None, 1.0)
        assert_bits(vm.soft_max(x, None, 1.0, PATH), want, f"soft_max width {n}")
        old.append(differs(vm.soft_max(x, None, 1.0, "arm64-sve128"), want))
    assert any(old)


@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
def test_flash_attn_one_row_and_split(kv_dtype):
    """The one-row loop (K·Q: the 256-bit dots; VKQ16: half FMAs on every element, half products but for
    ``ggml_vec_scale_f16``'s unscaled values past its one leftover vector: DV % 32 > 16, as 56 and 20) and split-KV;
    head sizes through every tail of 8 lanes, 16 halves, steps of 64 and 128."""
    rng = np.random.default_rng(1)
    for i, shape in enumerate([(4, 2, 1, 37, 128), (4, 2, 4, 40, 80), (2, 1, 3, 257, 100), (1, 1, 2, 9, 17),
                               (2, 1, 2, 30, 136), (2, 1, 3, 40, 56), (2, 1, 1, 600, 64)]):  # the last: split-KV
        check(BUILD, *make(rng, *shape, kv_dtype, amp=4.0 if i % 2 else 1.0), n_threads=1 + i % 2)


@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
def test_flash_attn_tiled(kv_dtype):
    """64+ rows: simd-gemm.h's scalar FMA chains, soft_max over 64-cell tiles in 8 blocks of 8 lanes (FADDV of 8);
    tiled only where ``DV % svcntw() == 0``: DV = 20 is tiled at 128 bits, one-row at 256."""
    rng = np.random.default_rng(5)
    args = make(rng, 1, 1, 64, 70, 32, kv_dtype, amp=3.0)
    want = check(BUILD, *args, n_threads=2)
    assert differs(flash_attn_ext(*args, "arm64-sve128", n_threads=2), want)
    assert fa_kernel(65, 70, kv_dtype, kv_dtype, 20, PATH) == "one_row"
    assert fa_kernel(65, 70, kv_dtype, kv_dtype, 20, "arm64-sve128") == "tiled"
    check(BUILD, *make(rng, 2, 2, 65, 70, 40, kv_dtype, DV=20))
    check(BUILD, *make(rng, 2, 1, 64, 130, 24, kv_dtype, DV=16))


def test_ssm_conv_and_gated_delta_net():
    """ssm_conv: FADDA over all taps (128 bits' bits); the delta net: the 256-bit dots (state sizes through the
    tails of 8 and 64)."""
    rng = np.random.default_rng(27)
    for nc in (3, 4, 5, 13):
        sx, c = hard_floats(rng, (2, 37, nc + 4)), hard_floats(rng, (37, nc), 0.5)
        assert_bits(ssm_conv(sx, c, PATH), on_build(BUILD, ssm_conv_graph, sx, c, 2), f"ssm_conv nc={nc}")
    old = []
    for n_seqs, T, H, H_k, S, K in [(1, 3, 2, 2, 24, 1), (2, 2, 2, 2, 33, 2), (1, 2, 1, 1, 64, 1), (1, 2, 2, 1, 72, 1)]:
        args = list(gdn_inputs(rng, n_seqs, T, H, H_k, S, S == 33))
        out_ref, states_ref = split_gdn(on_build(BUILD, gdn_graph, *args, K, 1), args[2].shape, K)
        out, states = gated_delta_net(*args, PATH, K=K)
        assert_bits(out, out_ref, f"gdn output S={S}")
        written = min(T, K)
        assert_bits((states[None] if K == 1 else states)[:written], states_ref[:written], f"gdn state S={S}")
        old.append(differs(gated_delta_net(*args, "arm64-sve128", K=K)[0], out_ref))
    assert any(old)
