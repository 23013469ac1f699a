"""The AArch64 clang build against the GCC build, library against library: which ops give other bits (issue 39) —
and the ``arm64-i8mm-clang`` emulation against the clang build on every one of those cases.

``arm64-i8mm-clang`` (clang 14, Android NDK's compiler family) and ``arm64-i8mm-gcc`` (GCC 12, Linux distributions')
compile the same vendored llama.cpp with the same flags (``-O3 -march=armv8.6-a+dotprod+fp16+i8mm``); only the
compiler differs. refimpl's ``arm64-i8mm`` path follows the GCC build (tests/test_ggml_ops_*arm64*.py prove it op by
op), its ``arm64-i8mm-clang`` path the clang build (:func:`emulates_clang` on each case below; the op modules' clang
cases are ``deep``). Two compiler choices make most of the difference, both read in ``aarch64-linux-gnu-objdump -d``
of the two ``libggml-cpu.so``:

* **the ACLE multiply-accumulate intrinsics** ``vmlaq_f32`` / ``vmlaq_n_f32`` / ``vmlsq_f32`` (architecturally a
  multiply then an add, two roundings): GCC 12 emits ``fmul`` + ``fadd``/``fsub``, clang 14 (``-ffp-contract=on``:
  its ``arm_neon.h`` defines them as one C expression ``a + b * c``) *fuses* them into ``fmla``/``fmls``. Hit:
  arch/arm/quants.c ``ggml_vec_dot_q8_0_q8_0``, ``q4_0``, ``q4_1``, ``q5_0``, ``q5_1`` (NEON ``vmlaq_n_f32`` and the
  i8mm 2-row ``vmlaq_f32``), ``q4_K`` and ``q6_K`` (i8mm 2-row kernel, ``vmlsq_f32``/``vmlaq_f32`` per superblock:
  a single superblock starts from 0, fused = unfused there); arch/arm/repack.cpp ``ggml_gemv/gemm_iq4_nl_4x4_q8_0``,
  ``mxfp4_4x4`` (its products are exact unless ``|sumi|·d`` needs more than 24 bits), ``q4_K_8x8``, ``q5_K_8x8``,
  ``gemm_q6_K_8x8``. Not hit: the kernels written with ``vfmaq_f32`` (fused in both: repacked Q8_0 and Q4_0 on
  i8mm, 4x8), the scalar ``sumf += d * ...`` lines (one C expression: both compilers contract them into the same
  ``fmadd``), the IQ and other K-quant dots (but for their Q8_K activations, below).
* **the vectorizer's width for an in-order float reduction** of a scalar loop ``sum += a[i]*b[i]`` (strict FP: both
  vectorize it as ``fmul`` of 4 lanes then 4 in-order scalar ``fadd``, the scalar remainder as ``fmadd``): GCC
  takes blocks of 4 when 4 or more are left, clang blocks of 8 (interleave 2) when 8 or more are left. So a loop of
  r iterations rounds its products separately for the first 4·⌊r/4⌋ (GCC) or 8·⌊r/8⌋ (clang) terms and fuses the
  rest: the bits agree for r < 4 and 8 <= r < 12 only. Hit: vec.cpp ``ggml_vec_dot_f32``'s leftovers (n % 16:
  F32 mul_mat, attention without flash, flash attention's one-row path with F32 K, the gated delta net's dots when
  S_v % 16 >= 4) and ops.cpp ``ggml_compute_forward_ssm_conv_f32``'s tap loop (d_conv = 4: Qwen3.5's, differs).

Contraction proper (``-ffp-contract=fast`` across statements, ``=on`` within one expression) showed in one place:
ggml-quants.c ``quantize_row_q8_K_ref`` (GCC fuses ``nearest_int``'s ``+ 12582912.f`` into the product; clang rounds
the product first) — the Q8_K activations of every K-quant and IQ dot, on near-.5 products only.

The ops not listed agree bit for bit (soft_max, silu, swiglu, rms_norm, rope, get_rows, casts, the Q8_0 / Q8_1
activation quantizers (NEON: no contraction), Q8_K's on ordinary values, flash attention with F16 K/V on all three
paths, F32 K/V on the tiled and split paths); where NaNs are made or meet (rms_norm's scale, rope's ``inf·cos -
inf·sin``: GCC 0xffc00000, clang 0x7fc00000; get_rows' fused ``x*d - m`` of NaN scales) the compilers' operand
orders and negations differ, so only the NaN's sign or payload differs there (not tested here: the op tests model
GCC's).

Cost: two qemu workers (~7 s each to start, shared with the other ARM modules of the process) and ~10 s of graphs.
"""

import numpy as np
import pytest
from ggml_graph import Graph, on_build, vp
from gguf import GGMLQuantizationType as QT

from kernels.ggml.actquant import _q8_k_rows
from kernels.ggml.flashattn_exact import flash_attn_ext
from kernels.ggml.mulmat import mul_mat
from kernels.ggml.ssm import gated_delta_net, ssm_conv

pytestmark = pytest.mark.oracle

GCC, CLANG = "arm64-i8mm-gcc", "arm64-i8mm-clang"  # the builds (tests/arm64.py)
PATH = "arm64-i8mm-clang"  # the clang build's emulated path (kernels.ggml.build.EMULATED_PATHS)


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[a.dtype.itemsize])


def differs(a, b) -> bool:
    return bool((bits(a) != bits(b)).any())


def both(fn, *args):
    import arm64

    for build in (GCC, CLANG):
        arm64.require(build)
    return on_build(GCC, fn, *args), on_build(CLANG, fn, *args)


def emulates_clang(clang_outs, emulated_outs, labels):
    """Each output of the clang build equals the ``arm64-i8mm-clang`` emulation's, bit for bit."""
    bad = [label for label, a, b in zip(labels, clang_outs, emulated_outs, strict=True) if differs(a, b)]
    assert not bad, f"arm64-i8mm-clang differs from the clang build: {bad}"


def g_cpy(x, gtype, ne, nbytes):
    """ggml_cpy(F32 x → a ``gtype`` tensor): the CPU traits' ``from_float`` (the activation quantizers)."""
    with Graph() as g:
        out = g.op("ggml_cpy", [vp, vp], g.tensor(x), g.tensor(np.zeros(nbytes, np.uint8), gtype, ne))
        return g.compute(out, (nbytes,), np.uint8)


#: plain-buffer weights whose mul_mat differs (N = 8, T = 1, 2, 5: the i8mm 2-row kernels run where they exist)
PLAIN_DIFFER = {QT.F32, QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q4_K, QT.Q6_K}
PLAIN_SAME = {QT.F16, QT.BF16, QT.IQ4_NL, QT.MXFP4, QT.Q2_K, QT.Q3_K, QT.Q5_K, QT.IQ4_XS, QT.IQ2_XXS, QT.IQ2_XS,
              QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.IQ1_S, QT.IQ1_M}


def test_mul_mat_plain_buffer():
    """Per weight type: F32 by ``ggml_vec_dot_f32``'s leftovers (K = 100: 4 left), the 32-blocks by ``vmlaq_n_f32``
    / the i8mm ``vmlaq_f32``, Q4_K / Q6_K by the i8mm kernel's per-superblock ``vmlsq_f32``/``vmlaq_f32`` (K = 512:
    two superblocks). F16 (half FMA intrinsics), BF16 (scalar double sum) and the other types' scalar ``fmadd`` agree."""
    from test_ggml_ops_mulmat import acts, float_weights, g_mul_mats, weight_bytes

    rng = np.random.default_rng(3960)
    cases, kinds = [], []
    for qt in sorted(PLAIN_DIFFER | PLAIN_SAME):
        k = 100 if qt in (QT.F32, QT.F16, QT.BF16) else 512
        w = float_weights(qt, acts(rng, 8, k)) if k == 100 else weight_bytes(qt, 8, k, rng)
        for t in (1, 2, 5):
            cases.append((w, int(qt), k, acts(rng, t, k), 1))
            kinds.append(qt)
    gcc, clang = both(g_mul_mats, cases)
    found = {qt for qt, a, b in zip(kinds, gcc, clang) if differs(a, b)}
    assert found == PLAIN_DIFFER, (sorted(q.name for q in found - PLAIN_DIFFER), sorted(q.name for q in PLAIN_DIFFER - found))
    emulates_clang(clang, [mul_mat(w, QT(g), x, PATH, n_threads=nth) for w, g, _, x, nth in cases],
                   [(q.name, c[3].shape[0]) for q, c in zip(kinds, cases)])


def test_mul_mat_repacked():
    """CPU_REPACK on i8mm, T = 1 (gemv) and 5 (a 4-row gemm, a gemv): Q8_0 / Q4_0 (4x8, ``vfmaq_f32``) agree; IQ4_NL
    (4x4 ``vmlaq_f32``), Q4_K and Q5_K (8x8 gemv and gemm: ``vmlaq_f32``/``vmlsq_f32``) differ; Q6_K differs in its
    gemm only (``ggml_gemm_q6_K_8x8_q8_K``'s ``vmlaq_f32``; its gemv has none); MXFP4 (4x4 ``vmlaq_f32`` too) agrees
    on ordinary values — a power-of-two scale times a block's int sum stays exact in 24 bits — and differs once
    ``|sumi|·d`` needs more (every weight +6, activations of one sign)."""
    from test_ggml_ops_repack_arm64 import acts, g_mul_mats, weight_bytes

    rng = np.random.default_rng(3961)
    expect = {QT.IQ4_NL: (True, True), QT.Q4_K: (True, True), QT.Q5_K: (True, True), QT.Q6_K: (False, True),
              QT.Q8_0: (False, False), QT.Q4_0: (False, False), QT.MXFP4: (False, False)}
    cases = [(weight_bytes(qt, 16, 512, rng), int(qt), 512, acts(rng, t, 512), 1) for qt in expect for t in (1, 5)]
    w = np.zeros((16, 16, 17), np.uint8)  # block_mxfp4: e, qs[16]
    w[:, :, 0], w[:, :, 1:] = 127, 0x77
    x = (np.float32(1.0) + rng.integers(0, 128, (5, 512)).astype(np.float32) / 128).astype(np.float32)
    x *= np.float32(1.0) + rng.random((5, 512)).astype(np.float32) * np.float32(2.0**-8)
    cases += [(w.reshape(16, -1), int(QT.MXFP4), 512, x[:t], 1) for t in (1, 5)]
    gcc, clang = both(g_mul_mats, cases)
    got = [differs(a, b) for a, b in zip(gcc, clang)]
    want = [e for pair in expect.values() for e in pair] + [True, True]
    assert got == want, [(QT(c[1]).name, c[3].shape[0], g) for c, g, w_ in zip(cases, got, want) if g != w_]
    emulates_clang(clang, [mul_mat(w, QT(g), x, PATH, n_threads=nth, repack=True) for w, g, _, x, nth in cases],
                   [(QT(c[1]).name, c[3].shape[0]) for c in cases])


def test_vec_dot_f32_leftovers():
    """``ggml_vec_dot_f32``: 16 a step (4 ``vfmaq_f32`` accumulators, both compilers), then the scalar leftovers:
    r = K % 16 left, the first 4·⌊r/4⌋ (GCC) / 8·⌊r/8⌋ (clang) products rounded and added in order, the rest by
    ``fmadd``. Equal bits exactly where the two splits agree: r < 4 and 8 <= r < 12."""
    from test_ggml_ops_mulmat import acts, float_weights, g_mul_mats

    rng = np.random.default_rng(3962)
    ks = (16, 19, 20, 23, 24, 27, 28, 31, 32 + 13)
    cases = [(float_weights(QT.F32, acts(rng, 16, k)), int(QT.F32), k, acts(rng, 8, k) + 1, 1) for k in ks]
    gcc, clang = both(g_mul_mats, cases)
    for k, a, b in zip(ks, gcc, clang):
        split_gcc, split_clang = (k % 16) // 4 * 4, (k % 16) // 8 * 8
        assert differs(a, b) == (split_gcc != split_clang), (k, split_gcc, split_clang)
    emulates_clang(clang, [mul_mat(w, QT.F32, x, PATH) for w, _, _, x, _ in cases], ks)


def test_ssm_conv_and_gated_delta_net():
    """ssm_conv's tap loop (``sumf += s·c`` over d_conv taps) is the same in-order reduction: 3 taps (fmadd only)
    and 8 (blocks of 4 twice / of 8 once: the same rounded sums) agree, 4, 5, 13 differ — Qwen3.5's d_conv is 4.
    The gated delta net's dots are ``ggml_vec_dot_f32``: S_v = 128 agrees, S_v = 45 (13 left) differs."""
    from test_ggml_ops_ssm import gdn_graph, gdn_inputs, hard_floats, split_gdn, ssm_conv_graph

    rng = np.random.default_rng(3963)
    for nc, expect in ((3, False), (4, True), (5, True), (8, False), (13, True)):
        sx, c = hard_floats(rng, (2, 64, nc - 1 + 3)), hard_floats(rng, (64, nc), 0.5)
        gcc, clang = both(ssm_conv_graph, sx, c, 1)
        assert differs(gcc, clang) == expect, nc
        emulates_clang([clang], [ssm_conv(sx, c, PATH)], [f"ssm_conv nc={nc}"])
    for S, expect in ((128, False), (45, True)):
        args = gdn_inputs(rng, 1, 3, 2, 2, S)
        gcc, clang = both(gdn_graph, *args, 1, 1)
        assert differs(gcc, clang) == expect, S
        out, state = gated_delta_net(*args, PATH, K=1)
        out_ref, state_ref = split_gdn(clang, args[2].shape, 1)
        emulates_clang([out_ref, state_ref], [out, state[None]], [f"gdn S={S} out", f"gdn S={S} state"])


def test_flash_attention():
    """F16 K/V (llama.cpp's default) agree on the one-row, tiled and split-KV paths (half FMA intrinsics, explicit
    ``vfmaq``); F32 K on the one-row path takes ``ggml_vec_dot_f32``: D = 100 (4 left) differs, D = 64 agrees. The
    emulation gives the clang build's bits on each (its F32 dot: code ``NEON_CLANG``)."""
    from test_ggml_ops_attn import fa_graph, make

    rng = np.random.default_rng(3964)
    for shape, dtype, expect in [((4, 2, 3, 40, 100), np.float16, False), ((2, 1, 64, 96, 64), np.float16, False),
                                 ((2, 1, 1, 600, 64), np.float16, False), ((4, 2, 3, 40, 100), np.float32, True),
                                 ((4, 2, 3, 40, 64), np.float32, False), ((2, 1, 64, 96, 64), np.float32, False)]:
        q, k, v, m, scale = make(rng, *shape, dtype)
        gcc, clang = both(fa_graph, q, k, v, m, float(scale), 2)
        assert differs(gcc, clang) == expect, (shape, dtype)
        emulates_clang([clang], [flash_attn_ext(q, k, v, m, scale, PATH, n_threads=2)], [(shape, dtype)])


def test_elementwise_ops_and_quantizers_agree():
    """soft_max, silu, swiglu, rms_norm (+ fused MUL), rope NEOX, get_rows of quantized rows, the F16/BF16 casts and
    the activation quantizers (Q8_0, Q8_1, Q8_K through ``ggml_cpy``) give the same bits on finite inputs."""
    from test_ggml_ops_mulmat import acts, weight_bytes
    from test_ggml_ops_rope import g_rope_neox, q_like
    from test_ggml_ops_rows import g_get_rows, g_rms_norm
    from test_ggml_ops_unary import g_cast, g_soft_max, g_swiglu, g_unary

    rng = np.random.default_rng(3965)
    x = (rng.standard_normal((6, 203)) * 4).astype(np.float32)
    mask = np.where(rng.random((6, 203)) < 0.2, -np.inf, 0.0).astype(np.float16)
    checks = {
        "soft_max": (g_soft_max, x, mask, 0.125),
        "silu": (g_unary, "ggml_silu", x),
        "swiglu": (g_swiglu, x, x[:, ::-1].copy()),
        "rms_norm": (g_rms_norm, x, 1e-6),
        "rms_norm*w": (g_rms_norm, x, 1e-6, (rng.standard_normal(203)).astype(np.float32)),
        "rope_neox": (g_rope_neox, np.nan_to_num(q_like(rng, 9, 2, 128), posinf=3e38, neginf=-3e38), np.arange(9, dtype=np.int32) * 37, 64, 1e7),
        "cast_f16": (g_cast, x * 1e3, 1, np.float16),
        "cast_bf16": (g_cast, x, 30, np.uint16),
    }
    for qt in (QT.Q8_0, QT.Q4_1, QT.Q2_K, QT.Q4_K, QT.Q6_K, QT.IQ4_XS, QT.MXFP4):
        checks[f"get_rows {qt.name}"] = (g_get_rows, weight_bytes(qt, 6, 256, rng), int(qt), 256,
                                         np.array([5, 0, 3], np.int32))
    a = acts(rng, 3, 512)
    for qt, blk, size in ((QT.Q8_0, 32, 34), (QT.Q8_1, 32, 36), (QT.Q8_K, 256, 292)):
        checks[f"quantize {qt.name}"] = (g_cpy, a, int(qt), (512, 3), 3 * 512 // blk * size)
    bad = [name for name, (fn, *args) in checks.items() if differs(*both(fn, *args))]
    assert not bad, bad


def test_q8_k_quantizer_contracts_on_gcc_only():
    """ggml-quants.c ``quantize_row_q8_K_ref`` (the Q8_K activations of the K-quant and IQ dots): ``nearest_int(
    iscale*x[j])`` inlined is ``iscale*x + 12582912.f`` across two statements, which GCC's ``-ffp-contract=fast``
    fuses (``fmla``) and clang's ``=on`` does not (``fmul`` + ``fadd``): a product whose float rounding is a .5 tie but
    whose exact value is not rounds differently. Random activations almost never meet one (they agree above)."""
    iscale = np.float32(-127.0) / np.float32(3.0)  # amax 3.0 (positive): iscale = -127/3, inexact
    ties = []
    for k in range(-126, 127):
        c = np.float32((k + 0.5) / float(iscale))
        for v in (np.float32(c + d * np.spacing(c)) for d in (0, -1, 1, -2, 2)):
            exact = float(iscale) * float(v)  # exact in double (24 + 24 bits)
            rounded = float(np.float32(exact))
            if rounded % 1 == 0.5 and rounded != exact:
                ties.append(v)
                break
    x = np.zeros(256, np.float32)
    x[0], x[1:1 + len(ties[:255])] = 3.0, ties[:255]
    gcc, clang = both(g_cpy, x.reshape(1, 256), int(QT.Q8_K), (256, 1), 292)
    q_gcc, q_clang = gcc[4:260].view(np.int8), clang[4:260].view(np.int8)  # block_q8_K: d, qs[256], bsums[16]
    assert len(ties) > 100 and (q_gcc != q_clang).sum() > 50
    assert np.all(np.abs(q_gcc.astype(int) - q_clang) <= 1)
    for fused, q in ((True, q_gcc), (False, q_clang)):  # the emulation's quantizer, as each build's mul_mat takes it
        yq, yd, _ = _q8_k_rows(x.reshape(1, 256), fused=fused)
        assert np.array_equal(yq[0], q) and yd[0, 0] == gcc[:4].view(np.float32)[0], fused
