"""kernels.ggml.mulmat on the AArch64 GCC paths (kernels/ggml/mulmat_arm.py), weights in a plain buffer, bit for bit
against ``arm64-dotprod-gcc`` and ``arm64-i8mm-gcc`` (tests/arm64.py: qemu-aarch64, a CPU model with exactly the
build's features).

A one-op graph's weight tensor sits in the context's plain memory (:class:`ggml_graph.Graph.tensor`): llama.cpp's
``--no-repack``, and what CPU_REPACK leaves alone (N % 4 / % 8 != 0, other types). On ``arm64-i8mm`` Q8_0's
``vec_dot`` runs 2 rows × 2 columns (``smmla``) in every chunk whose extents are even, 1 row elsewhere — so the
shapes cover T = 1, 2, 3, 4, 5, 8, 9 and odd N, and 1 and 2 threads (the thread count decides the chunks there:
``test_i8mm_thread_count_matters``). Hard inputs: .5 ties of the quantizer, zeros, subnormal and huge values,
NaN, ±inf, extreme fp16 scales.
"""

import numpy as np
import pytest
from ggml_graph import Graph, on_build, vp
from gguf import GGMLQuantizationType as QT
from test_ggml_ops_mulmat import acts, bits, float_weights, g_mul_mat_id, g_mul_mats, hard_floats, weight_bytes

from kernels.ggml import mulmat_arm
from kernels.ggml.mulmat import kernel_for, mul_mat, mul_mat_id

pytestmark = pytest.mark.oracle

ARM_BUILDS = ["arm64-dotprod-gcc", "arm64-i8mm-gcc", pytest.param("arm64-i8mm-clang", marks=pytest.mark.deep), pytest.param("arm64-dotprod-clang", marks=pytest.mark.deep)]  # arm64-base-gcc: test_base_bit_exact
PATH = {"arm64-dotprod-gcc": "arm64-dotprod", "arm64-i8mm-gcc": "arm64-i8mm", "arm64-i8mm-clang": "arm64-i8mm-clang", "arm64-base-gcc": "arm64-base",
        "arm64-base-clang": "arm64-base-clang", "arm64-dotprod-clang": "arm64-dotprod-clang",
        "arm64-sve128-gcc": "arm64-sve128", "arm64-sve128-clang": "arm64-sve128-clang14",
        "arm64-sve128-clang19": "arm64-sve128-clang", "arm64-sve256-gcc": "arm64-sve256"}
T_ARM = (1, 2, 3, 4, 5, 8, 9)


def g_mul_mat_heads(w, gtype, K, x, n_threads):
    """w (Hkv, N, row bytes), x (H, T, K) -> ggml_mul_mat of the 3-D tensors (T rows per head, heads broadcast over
    the weight's Hkv): (H, T, N) — one product over every head, as attention's K·Q."""
    (Hkv, N), (H, T, _) = w.shape[:2], x.shape
    with Graph(mem=w.nbytes + x.nbytes + 4 * N * T * H + (16 << 20)) as g:
        y = g.op("ggml_mul_mat", [vp, vp], g.tensor(w, gtype, (K, N, Hkv)), g.tensor(x))
        return g.compute(y, (H, T, N), n_threads=n_threads)


def check(build, cases):
    """Every case (w, gtype, K, x, n_threads) on ``build`` against the emulation of its path, bit for bit."""
    path = PATH[build]
    got = on_build(build, g_mul_mats, cases)
    for (w, gtype, K, x, nth), y in zip(cases, got):
        want = mul_mat(w, QT(gtype), x, path, n_threads=nth)
        bad = bits(y) != bits(want)
        assert not bad.any(), (QT(gtype).name, w.shape, x.shape, nth, np.argwhere(bad)[:4])
    return got


def hard_acts(rng, t, k, nonfinite=True):
    """Activations with a .5-tie block (amax 127: x·id lands on .5), zeros, subnormals, and (``nonfinite``) huge
    values, ±inf, NaN. Weights with NaN / inf scales take ``nonfinite=False``: a NaN of the weights meeting the
    default NaN of ``0·inf`` in one sum keeps one of the two by operand order, which is not modelled (as on x86)."""
    x = acts(rng, max(t, 9), k)
    x[3, :32] = np.arange(32, dtype=np.float32) - np.float32(15.5)
    x[3, 31] = 127.0
    x[5, 40:60] = np.float32(1e-42)  # a subnormal block: d = 0 or subnormal
    x[8, :] = np.float32(-1e-39)
    if nonfinite:
        x[4, 33] = np.inf
        x[6, 64 % k:64 % k + 8] = np.float32(3e38)
        x[7, 5] = np.nan
    return x[:t] if t < 9 else x


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_q8_0_bit_exact(build):
    rng = np.random.default_rng(3901)
    cases = []
    for n, k in ((16, 256), (13, 96), (6, 32)):  # even and odd N; odd nb (the fmadd tail), nb = 1
        w = weight_bytes(QT.Q8_0, n, k, rng)
        w.reshape(n, -1, 34)[0, :, 2:] = np.uint8(0x80)  # weight bytes of -128
        for t in T_ARM:
            for nth in (1, 2) if t in (2, 4, 8) else (1,):  # 2 threads re-chunk: odd extents, 1-row kernel
                cases.append((w, int(QT.Q8_0), k, acts(rng, t, k), nth))
    w = weight_bytes(QT.Q8_0, 20, 64, rng)  # 3 threads: chunks of 7, 7, 6 rows — 1-row and 2-row in one product
    cases += [(w, int(QT.Q8_0), 64, acts(rng, t, 64), 3) for t in (2, 4)]
    k = 128
    cases.append((weight_bytes(QT.Q8_0, 10, k, rng), int(QT.Q8_0), k, hard_acts(rng, 9, k), 1))
    for scales in ("extreme", "raw"):  # fp16 scales: subnormal, huge, ±inf, NaN (raw bytes)
        w = weight_bytes(QT.Q8_0, 10, k, rng, scales)
        for t in (2, 9):
            cases.append((w, int(QT.Q8_0), k, hard_acts(rng, t, k, nonfinite=False), 1))
    check(build, cases)


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_float_bit_exact(build):
    """F32 (4×4 lanes, NEON leftovers), F16 (half-precision accumulators: hard values overflow them), BF16
    (scalar, double sum)."""
    rng = np.random.default_rng(3902)
    cases = []
    for qtype in (QT.F32, QT.F16, QT.BF16):
        for n, k in ((5, 7), (6, 20), (3, 64), (4, 100), (7, 171)):  # < a step, a step, leftovers of every kind
            w = float_weights(qtype, hard_floats(rng, (n, k)) if qtype != QT.F16 else acts(rng, n, k))
            for t in (1, 2, 5):
                x = hard_floats(rng, (t, k)) if qtype != QT.F16 else acts(rng, t, k)
                cases.append((w, int(qtype), k, x, 1 if t != 2 else 2))
        # F16: near 65504 the half accumulators overflow to inf; sub-half-ulp addends (the single-rounding fma)
        k = 64
        w16 = np.full((2, k), 250.0, np.float32)
        w16[1, ::3] = np.float32(2.0**-14)
        x16 = np.full((2, k), 255.0, np.float32)
        x16[1, 1::2] = np.float32(1.0 + 2.0**-10)
        cases.append((float_weights(QT.F16, w16), int(QT.F16), k, x16, 1))
    check(build, cases)


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_mul_mat_id_bit_exact(build):
    """mul_mat_id: every routed row through the 1-row vec_dot (also on i8mm), experts in token order."""
    path = PATH[build]
    rng = np.random.default_rng(3903)
    E, N, K, T, n_used = 4, 6, 256, 5, 3
    ids = np.stack([rng.permutation(E)[:n_used] for _ in range(T)]).astype(np.int32)
    for qtype in (QT.Q8_0, QT.F32, QT.F16, QT.Q4_0, QT.MXFP4, QT.Q4_K, QT.Q6_K, QT.IQ4_XS):
        w = np.stack([weight_bytes(qtype, N, K, rng) for _ in range(E)])
        for n_x in (1, n_used) if qtype == QT.Q8_0 else (n_used,):
            x = acts(rng, T * n_x, K).reshape(T, n_x, K)
            got = on_build(build, g_mul_mat_id, w, int(qtype), K, x, ids, 2)
            want = mul_mat_id(w, qtype, x, ids, path)
            assert np.array_equal(bits(got), bits(want)), (qtype.name, n_x)


def test_i8mm_thread_count_matters():
    """On arm64-i8mm the chunks (so the thread count) decide which Q8_0 elements take the 2-row smmla kernel: the
    emulation differs between 1 and 3 threads where a chunk turns odd, and from the dotprod path; the library
    agrees with each."""
    rng = np.random.default_rng(3904)
    k, n = 160, 6  # one chunk (6 × 4) for 1 thread; chunked by thread (N > T) for 2: 3 rows each, 1-row kernel
    w = weight_bytes(QT.Q8_0, n, k, rng)
    x = acts(rng, 4, k)
    assert mulmat_arm.mmla_mask(4, 6, 1, QT.Q8_0, "arm64-i8mm").all()
    assert mulmat_arm.mmla_mask(4, 6, 2, QT.Q8_0, "arm64-i8mm") is None
    assert mulmat_arm.mmla_mask(4, 6, 3, QT.Q8_0, "arm64-i8mm").all()  # 2 rows each
    assert mulmat_arm.mmla_mask(4, 6, 1, QT.Q8_0, "arm64-dotprod") is None
    cases = [(w, int(QT.Q8_0), k, x, nth) for nth in (1, 2)]
    got = check("arm64-i8mm-gcc", cases)
    assert not np.array_equal(bits(got[0]), bits(got[1]))
    assert np.array_equal(bits(got[1]), bits(mul_mat(w, QT.Q8_0, x, "arm64-dotprod")))


def test_arm_dispatch_refuses_what_is_not_emulated():
    """A weight type without an ARM emulation is a one-line ValueError naming the type and the path (no x86 kernel
    stands in)."""
    rng = np.random.default_rng(3905)
    x = acts(rng, 2, 256)
    assert kernel_for(QT.Q4_K, "arm64-i8mm", 16, 16, 256) == "vec_dot"  # no tiled kernel, no llamafile on ARM
    for path in ("arm64-dotprod", "arm64-i8mm"):
        with pytest.raises(ValueError, match=rf"mul_mat of TQ2_0 weights .*\({path}\) is not emulated"):
            mul_mat(weight_bytes(QT.TQ2_0, 4, 256, rng), QT.TQ2_0, x, path)
        w = weight_bytes(QT.TQ1_0, 4, 256, rng)
        with pytest.raises(ValueError, match=rf"mul_mat_id of TQ1_0 weights .*\({path}\) is not emulated"):
            mul_mat_id(w[None], QT.TQ1_0, x[:, None], np.zeros((2, 1), np.int32), path)
    w = weight_bytes(QT.Q8_0, 6, 256, rng)  # 6 % 4: CPU_REPACK leaves it in a plain buffer
    assert np.array_equal(bits(mul_mat(w, QT.Q8_0, x, "arm64-i8mm", repack=True)), bits(mul_mat(w, QT.Q8_0, x, "arm64-i8mm")))


def q8_k_ties(rng, k):
    """A row whose Q8_K products iscale·x sit within an ulp of .5 (vmax = 100: iscale = -1.27 rounded): the
    AArch64 build's contracted ``nearest_int(iscale*x)`` rounds them by the exact product, x86's by the rounded one."""
    x = np.zeros(k, np.float32)
    isc = np.float32(-127.0) / np.float32(100.0)
    x[:] = ((rng.integers(-120, 120, k) + 0.5) / np.float64(isc)).astype(np.float32)
    x[::256] = 100.0
    return x


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_block32_types_bit_exact(build):
    """Q4_0 (2-row on i8mm), MXFP4 and IQ4_NL (pairs of blocks, one product fused), Q5_0 with AArch64 Q8_0
    activations; Q4_1 (2-row on i8mm) and Q5_1 with AArch64 Q8_1."""
    rng = np.random.default_rng(3906)
    cases = []
    for qtype in (QT.Q4_0, QT.MXFP4, QT.IQ4_NL, QT.Q5_0, QT.Q4_1, QT.Q5_1):
        for n, k in ((6, 96), (5, 64), (2, 32)):
            w = weight_bytes(qtype, n, k, rng)
            for t in T_ARM:
                cases.append((w, int(qtype), k, acts(rng, t, k), 1 if t % 2 else 2))
        cases.append((weight_bytes(qtype, 4, 128, rng), int(qtype), 128, hard_acts(rng, 9, 128), 1))
        w = weight_bytes(qtype, 4, 128, rng, "extreme")
        cases.append((w, int(qtype), 128, hard_acts(rng, 9, 128, nonfinite=False), 1))
    check(build, cases)


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_kquant_bit_exact(build):
    """Q4_K and Q6_K (2-row on i8mm), Q5_K, IQ4_XS, Q2_K, Q3_K with Q8_K activations (quantize_row_q8_K_ref, contracted)."""
    rng = np.random.default_rng(3907)
    cases = []
    for qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS, QT.Q2_K, QT.Q3_K):
        for n, k in ((6, 256), (3, 512)):
            w = weight_bytes(qtype, n, k, rng)
            for t in T_ARM:
                x = acts(rng, t, k)
                x[0] = q8_k_ties(rng, k)
                cases.append((w, int(qtype), k, x, 1 if t % 2 else 2))
        cases.append((weight_bytes(qtype, 4, 256, rng), int(qtype), 256, hard_acts(rng, 9, 256), 1))
        cases.append((weight_bytes(qtype, 4, 256, rng, "extreme"), int(qtype), 256,
                      hard_acts(rng, 9, 256, nonfinite=False), 1))
        cases.append((weight_bytes(qtype, 20, 256, rng), int(qtype), 256, acts(rng, 4, 256), 3))  # mixed chunks
    check(build, cases)


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_iq_bit_exact(build):
    """The IQ1/2/3 codebook types (NEON kernels: float group sums for IQ2_XXS / IQ3_XXS, the IQ1 deltas)."""
    rng = np.random.default_rng(3910)
    cases = []
    for qtype in (QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.IQ1_S, QT.IQ1_M):
        w = weight_bytes(qtype, 5, 512, rng)
        for t in (1, 2, 3):
            x = acts(rng, t, 512)
            x[0, :256] = q8_k_ties(rng, 256)
            cases.append((w, int(qtype), 512, x, 1))
        cases.append((weight_bytes(qtype, 2, 256, rng), int(qtype), 256, hard_acts(rng, 9, 256), 2))
        cases.append((weight_bytes(qtype, 2, 256, rng, "extreme"), int(qtype), 256,
                      hard_acts(rng, 9, 256, nonfinite=False), 1))
    check(build, cases)


def test_q8_k_contraction_matters():
    """The tie row above quantizes differently with and without the fused nearest_int (so the tests see it)."""
    from kernels.ggml.actquant import _q8_k_rows

    x = q8_k_ties(np.random.default_rng(3908), 256)[None]
    assert (_q8_k_rows(x, fused=True)[0] != _q8_k_rows(x)[0]).any()


def test_q5_0_i8mm_tail_reads_unsigned():
    """GCC 12's i8mm build computes a Q5_0 row's odd last block with USDOT (values v - 16 as unsigned bytes):
    the two ARM paths differ exactly there (test_block32_types_bit_exact matches each library)."""
    rng = np.random.default_rng(3909)
    x = acts(rng, 2, 96)
    for k, differ in ((96, True), (64, False)):
        w = weight_bytes(QT.Q5_0, 3, k, rng)
        a, b = mul_mat(w, QT.Q5_0, x[:, :k], "arm64-dotprod"), mul_mat(w, QT.Q5_0, x[:, :k], "arm64-i8mm")
        assert (not np.array_equal(bits(a), bits(b))) == differ


def test_fused_row_blocks_follow_the_whole_tensor():
    """A row block of a fused tensor (``attn_qkv``: ggml multiplies it whole, then views): on arm64-i8mm the chunks
    of the whole tensor pick the 2-row kernel. Each block against the library's product of the whole tensor; a
    shape whose whole-tensor chunks mix the kernels is refused (the block's offset is not known to mul_mat)."""
    rng = np.random.default_rng(3911)
    k, cases, blocks = 64, [], []
    for sizes, nth in (((8, 6, 4), 2), ((8, 4, 4), 3), ((6, 6, 4), 1)):
        w = weight_bytes(QT.Q8_0, sum(sizes), k, rng)
        cases.append((w, int(QT.Q8_0), k, acts(rng, 2, k), nth))
        blocks.append(sizes)
    got = on_build("arm64-i8mm-gcc", g_mul_mats, cases)
    for (w, _, _, x, nth), sizes, y in zip(cases, blocks, got):
        a = 0
        for n in sizes:
            part = mul_mat(w[a:a + n], QT.Q8_0, x, "arm64-i8mm", n_threads=nth, tensor_rows=w.shape[0])
            assert np.array_equal(bits(part), bits(y[:, a:a + n])), (sizes, nth, n)
            a += n
    w = weight_bytes(QT.Q8_0, 20, k, rng)  # 3 threads: chunks of 7, 7, 6 rows — mixed
    with pytest.raises(ValueError, match="i8mm chunks mix"):
        mul_mat(w[:8], QT.Q8_0, acts(rng, 2, k), "arm64-i8mm", n_threads=3, tensor_rows=20)


def test_batched_heads_chunk_together():
    """ggml's K·Q multiplies every head in one product (``ne12`` = H), chunked over T·H rows: on arm64-i8mm a Q8_0
    K cache's 2-row kernels follow those chunks (``head=(h, H)``), not a per-head product's."""
    rng = np.random.default_rng(3912)
    K, N, Hkv, H = 64, 6, 2, 4
    w = np.stack([weight_bytes(QT.Q8_0, N, K, rng) for _ in range(Hkv)])
    for T, nth in ((2, 1), (2, 3), (4, 2)):
        x = acts(rng, H * T, K).reshape(H, T, K)
        y = on_build("arm64-i8mm-gcc", g_mul_mat_heads, w, int(QT.Q8_0), K, x, nth)
        for h in range(H):
            want = mul_mat(w[h // (H // Hkv)], QT.Q8_0, x[h], "arm64-i8mm", n_threads=nth, head=(h, H))
            assert np.array_equal(bits(want), bits(y[h])), (T, nth, h)


def test_mixed_chunks():
    """N = 20 rows on 3 threads: chunks of 7, 7 and 6 rows — the last alone takes the 2-row kernel."""
    m = mulmat_arm.mmla_mask(4, 20, 3, QT.Q4_K, "arm64-i8mm")
    assert not m[:, :14].any() and m[:, 14:].all()


@pytest.mark.deep  # a third qemu worker (cortex-a53): pytest -m deep
@pytest.mark.parametrize("build", ["arm64-base-gcc", "arm64-base-clang"])
def test_base_bit_exact(build):
    """arm64-base-gcc (armv8-a: no dotprod, no FP16 arithmetic, nothing repacked): the same kernels, with
    ggml_vdotq_s32's vmull_s8 + vpaddlq_s16 lanes (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 keep float lanes) and F16's dot
    in float; one call to the library for every type. arm64-base-clang: the same with clang's choices (the lanes'
    vmlaq_n_f32 fused, Q8_K's nearest_int not, F32's leftovers in blocks of 8)."""
    rng = np.random.default_rng(3913)
    cases = []
    for qtype in (QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_1, QT.Q5_1, QT.MXFP4, QT.IQ4_NL):
        w = weight_bytes(qtype, 6, 96, rng)
        cases += [(w, int(qtype), 96, acts(rng, t, 96), 2) for t in (1, 4)]
    cases.append((weight_bytes(QT.Q8_0, 8, 128, rng), int(QT.Q8_0), 128, hard_acts(rng, 9, 128), 1))
    for qtype in (QT.Q4_K, QT.Q6_K, QT.IQ4_XS, QT.IQ2_XXS):
        cases.append((weight_bytes(qtype, 4, 256, rng), int(qtype), 256, hard_acts(rng, 3, 256), 1))
    for qtype in (QT.F32, QT.F16, QT.BF16):
        w = float_weights(qtype, acts(rng, 5, 100))
        cases += [(w, int(qtype), 100, acts(rng, t, 100), 1) for t in (1, 3)]
    check(build, cases)
    w = weight_bytes(QT.Q8_0, 8, 64, rng)  # CPU_REPACK takes nothing on armv8-a
    x = acts(rng, 2, 64)
    path = PATH[build]
    assert np.array_equal(bits(mul_mat(w, QT.Q8_0, x, path, repack=True)), bits(mul_mat(w, QT.Q8_0, x, path)))


@pytest.mark.deep  # a fourth qemu worker (SVE at 128 bits): pytest -m deep
@pytest.mark.parametrize("build", ["arm64-sve128-gcc", *(pytest.param(b, marks=pytest.mark.deep)
                                                         for b in ("arm64-sve128-clang", "arm64-sve128-clang19"))])
def test_sve128_bit_exact(build):
    """arm64-sve128-gcc (SVE2 at 128 bits, i8mm): the SVE F32 dot (8 accumulators, predicated tail), Q8_0 and
    Q4_0's SVE 1-row kernels (fused lanes, one FADDV), their NEON i8mm 2-row kernels, the SVE K-quant kernels (Q2_K's
    4 float lanes; Q4_K / Q6_K's fused SVE+MMLA 2-row kernels) and the NEON kernels of the types without SVE code;
    SVE2's widening F16 dot; one library call. clang's builds (14: arm64-sve128-clang14, 19: arm64-sve128-clang): the
    same with clang's choices."""
    rng = np.random.default_rng(3914)
    cases = []
    for qtype in (QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.MXFP4, QT.IQ4_NL):
        w = weight_bytes(qtype, 6, 96, rng)
        cases += [(w, int(qtype), 96, acts(rng, t, 96), 1) for t in (1, 2, 3)]
    cases.append((weight_bytes(QT.Q8_0, 20, 64, rng), int(QT.Q8_0), 64, acts(rng, 4, 64), 3))  # mixed chunks
    cases.append((weight_bytes(QT.Q8_0, 8, 128, rng), int(QT.Q8_0), 128, hard_acts(rng, 9, 128), 1))
    for qtype in (QT.Q5_K, QT.IQ4_XS, QT.IQ2_XXS, QT.IQ1_M, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q6_K):
        w = weight_bytes(qtype, 6, 512, rng)
        cases += [(w, int(qtype), 512, hard_acts(rng, t, 512), 1) for t in (1, 2, 3)]
    for qtype, n in ((QT.F32, 7), (QT.F32, 37), (QT.F32, 100), (QT.BF16, 100)):
        cases.append((float_weights(qtype, hard_floats(rng, (5, n))), int(qtype), n, hard_floats(rng, (2, n)), 1))
    for n in (5, 8, 13, 64, 77, 200):  # F16: < a vector, whole vectors, steps of 64, the predicated tail
        cases.append((float_weights(QT.F16, acts(rng, 5, n)), int(QT.F16), n, acts(rng, 2, n), 1))
    check(build, cases)
