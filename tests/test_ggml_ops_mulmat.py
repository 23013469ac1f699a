"""kernels.ggml.mulmat (ggml_mul_mat / ggml_mul_mat_id) bit for bit against both libggml builds.

Which parts are ISA-dependent (checked in the disassembly of both ``libggml-cpu.so``):

* F32 / F16 / BF16: 16 lanes (avx512) against 8 (avx2) in ``vec_dot`` and ``tinyBLAS``; the avx512 build's
  BF16 goes through ``VDPBF16PS`` (odd pair first, DAZ/FTZ); the leftover loops are vectorized by GCC with
  different chunk sizes — ``test_float_builds_differ`` asserts the builds differ.
* MXFP4: the odd-last-block tail of ``ggml_vec_dot_mxfp4_q8_0`` is ``vmulss``+``vaddss`` on avx512 and
  ``vfmadd231ss`` on avx2 — ``test_mxfp4_bit_exact`` asserts the builds differ there.
* Q8_0 and the K-quants are ISA-independent: both builds run the same ``__AVX2__`` C code (the avx512 build
  swaps ``maddubs``+``madd`` for ``dpbusd``, the same integers) and the tiled kernel's VNNI and AVX2
  microtiles reduce to the same float formula (``fma(d0·s1 - dmin·s2, d1, acc)``). Their tests assert that
  the two builds agree, and that a plausible wrong model (vec_dot's formula on a tiled shape, 16 lanes)
  differs, so they can fail.

No case here changes a bit with the thread count (1 or 2 threads run on every shape).
"""

import numpy as np
import pytest
from ggml_graph import BUILDS, ZEN, Graph, build_info, on_build, vp
from gguf import GGMLQuantizationType as QT

from kernels.ggml import mulmat_k
from kernels.ggml.mulmat import fp32_to_bf16_bits, kernel_for, mul_mat, mul_mat_id
from kernels.ggml.simd import simd
from kernels.testing import random_rows

pytestmark = pytest.mark.oracle


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# ---- graph functions (module level: they run in the other build's worker process too) -----------------


def g_mul_mats(cases):
    """[(w_bytes (N, row bytes), ggml type, K, x (T, K), n_threads)] -> [ggml_mul_mat(W, x) (T, N)]."""
    out = []
    for w, gtype, K, x, n_threads in cases:
        with Graph(mem=w.nbytes + x.nbytes + 4 * w.shape[0] * x.shape[0] + (16 << 20)) as g:
            y = g.op("ggml_mul_mat", [vp, vp], g.tensor(w, gtype, (K, w.shape[0])), g.tensor(x))
            out.append(g.compute(y, (x.shape[0], w.shape[0]), n_threads=n_threads))
    return out


def g_mul_mat_id(w, gtype, K, x, ids, n_threads):
    """w (E, N, row bytes), x (T, n_x, K), ids (T, n_used) -> ggml_mul_mat_id (T, n_used, N)."""
    (E, N), (T, _, _), n_used = w.shape[:2], x.shape, ids.shape[1]
    with Graph(mem=w.nbytes + x.nbytes + 4 * N * T * n_used + (16 << 20)) as g:
        y = g.op("ggml_mul_mat_id", [vp, vp, vp], g.tensor(w, gtype, (K, N, E)), g.tensor(x), g.tensor(ids))
        return g.compute(y, (T, n_used, N), n_threads=n_threads)


# ---- inputs ------------------------------------------------------------------------------------------


def weight_bytes(qtype, n, k, rng, scales="normal"):
    return np.ascontiguousarray(random_rows(qtype, n, k, rng, scales)).view(np.uint8).reshape(n, -1)


def acts(rng, t, k):
    """Activations over a few binades, with a zero row and a -0.0 row when there is room."""
    x = (rng.standard_normal((t, k)) * np.float32(2.0) ** rng.integers(-6, 6, (t, k))).astype(np.float32)
    if t >= 3:
        x[1] = 0.0
        x[2, ::2] = -0.0
    return x


def hard_floats(rng, shape):
    """Subnormals, ±0, magnitudes whose products overflow to ±inf (so inf - inf makes the default NaN)."""
    v = (rng.standard_normal(shape) * np.float32(2.0) ** rng.integers(-8, 8, shape)).astype(np.float32)
    u = rng.random(shape)
    v[u < 0.05] = 0.0
    v[(u >= 0.05) & (u < 0.1)] = -0.0
    sub = (u >= 0.1) & (u < 0.16)
    v[sub] = (rng.standard_normal(sub.sum()) * 1e-40).astype(np.float32)
    big = (u >= 0.16) & (u < 0.19)
    v[big] = (rng.standard_normal(big.sum()) * 1e30).astype(np.float32)
    return v


def check(build, cases, emulate):
    """Run ``cases`` on ``build`` and compare every output bit with ``emulate(w, K, x)``."""
    got = on_build(build, g_mul_mats, cases)
    for (w, gtype, K, x, nth), y in zip(cases, got):
        want = emulate(w, QT(gtype), x)
        bad = bits(y) != bits(want)
        assert not bad.any(), (QT(gtype).name, w.shape, x.shape, nth, np.argwhere(bad)[:4])
    return got


T_ALL = (1, 2, 4, 8, 9, 32, 70)  # decode, 2, a 1+3 verify batch, the tiled threshold, 32, a prompt ubatch


# ---- Q8_0 ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", BUILDS)
def test_q8_0_bit_exact(build):
    path = build_info(build).path
    rng = np.random.default_rng(2710)
    cases = []
    for n, k in ((16, 256), (13, 96), (36, 64)):
        w = weight_bytes(QT.Q8_0, n, k, rng)
        w.reshape(n, -1, 34)[0, :, 2:] = np.uint8(0x80)  # weight bytes of -128 (|w| = 128 in maddubs)
        for t in T_ALL:
            for nth in (1, 2):
                cases.append((w, int(QT.Q8_0), k, acts(rng, t, k), nth))
    # hard activations: a NaN that _mm256_max_ps skips (first 8 of a block) becomes q = -128 against
    # negative weights (the sign trick gives -128·|w|); ties of x·127/amax; ±inf; subnormals; extreme scales
    k, n = 128, 16
    w = weight_bytes(QT.Q8_0, n, k, rng, "extreme")
    x = acts(rng, 9, k)
    x[0, 3] = np.nan
    x[3, :32] = np.arange(32, dtype=np.float32) - np.float32(15.5)  # amax = 127: x·127/amax = x, all .5 ties
    x[3, 31] = 127.0
    x[4, 40] = np.inf
    x[5, 70:90] = np.float32(1e-42)
    cases += [(w, int(QT.Q8_0), k, x, 1), (weight_bytes(QT.Q8_0, n, k, rng, "raw"), int(QT.Q8_0), k, x, 2)]
    got = check(build, cases, lambda w, q, x: mul_mat(w, q, x, path))
    assert kernel_for(QT.Q8_0, path, 1, 16, 256) == "vec_dot" and kernel_for(QT.Q8_0, path, 2, 16, 256) == "sgemm"
    # ISA-independent (see the module docstring): the other build gives the same bits
    other = on_build("avx2" if build == "native" else "native", g_mul_mats, cases[-2:])
    assert all(np.array_equal(bits(a), bits(b)) for a, b in zip(got[-2:], other))


@pytest.mark.parametrize("build", BUILDS)
def test_q8_0_sign_trick_matters(build):
    """A skipped NaN quantizes to -128; against a negative weight ggml's sign trick counts -128·|w|."""
    path = build_info(build).path
    k = 32
    w = np.zeros((1, 34), np.uint8)
    w[0, :2] = np.array([1.0], np.float16).view(np.uint8)
    w[0, 2:] = np.int8(-2).view(np.uint8)
    x = np.ones((1, k), np.float32)
    x[0, 0] = np.nan  # lane 0 of the first vector: _mm256_max_ps skips it, amax = 1
    (y,) = on_build(build, g_mul_mats, [(w, int(QT.Q8_0), k, x, 1)])
    assert np.array_equal(bits(mul_mat(w, QT.Q8_0, x, path)), bits(y))
    d = np.float32(np.float16(np.float32(1.0) / np.float32(127.0)))  # fp16(amax / 127)
    # Σ = 31·(-2·127) + 2·(-128) = -8130 (not -7618: -(-128) wraps to -128); lane sums are exact
    assert abs(y[0, 0] / d + 8130) < 1


# ---- F32 / F16 / BF16 ---------------------------------------------------------------------------------

FLOATS = (QT.F32, QT.F16, QT.BF16)


def float_weights(qtype, w32):
    if qtype == QT.F32:
        return w32.view(np.uint8)
    if qtype == QT.F16:
        with np.errstate(over="ignore"):
            return np.clip(w32, -65504, 65504).astype(np.float16).view(np.uint8)
    return fp32_to_bf16_bits(w32).view(np.uint8)


@pytest.mark.parametrize("qtype", FLOATS, ids=[q.name for q in FLOATS])
@pytest.mark.parametrize("build", BUILDS)
def test_float_bit_exact(build, qtype):
    path = build_info(build).path
    rng = np.random.default_rng([2711, int(qtype)])
    cases = []
    # K: tails of every kind (leftover chunks of 16/8, 8/4 and scalar FMAs; < one step); N % 4 != 0: vec_dot
    for n, k in ((12, 7), (16, 64), (13, 100), (12, 171), (8, 296)):
        w = float_weights(qtype, hard_floats(rng, (n, k)))
        for t in (1, 2, 4, 5, 8, 9):  # 4, 8: tinyBLAS's pairs of weight rows (mulmat_vec._tinyblas_block)
            x = hard_floats(rng, (t, k))
            if t >= 2:
                x[1, 3] = np.inf
            for nth in (1, 2) if t != 5 else (2,):
                cases.append((w, int(qtype), k, x, nth))
    # one NaN source per output: an activation NaN (its payload) in a row without overflowing values
    x = acts(rng, 3, 64)
    x[0, 5] = np.array([0x7FC0BEEF], np.uint32).view(np.float32)[0]
    cases.append((float_weights(qtype, acts(rng, 16, 64)), int(qtype), 64, x, 1))
    check(build, cases, lambda w, q, x: mul_mat(w, q, x, path))


@pytest.mark.parametrize("build", BUILDS)
def test_float_tinyblas_threads(build):
    """A float product above flags.SERIAL_BELOW takes tinyBLAS with blocks of weight rows split between threads
    (``mulmat_vec.tinyblas_rows_parallel``): libggml's bits at 1, 2 and 3 threads; 68 rows (a last block of 4),
    15 activation rows (a last group of 3 accumulators)."""
    import numba

    path = build_info(build).path
    rng = np.random.default_rng(2714)
    k, n, t = 288, 68, 15  # 68·288·15 = 293760 multiply-adds >= SERIAL_BELOW; K a multiple of 32 (BF16's KN)
    cases = [(float_weights(q, hard_floats(rng, (n, k))), int(q), k, hard_floats(rng, (t, k)), 2) for q in FLOATS]
    got = on_build(build, g_mul_mats, cases)
    before = numba.get_num_threads()
    try:
        for nth in (1, 2, 3):
            numba.set_num_threads(min(nth, numba.config.NUMBA_NUM_THREADS))
            for (w, q, _, x, _), y in zip(cases, got):
                assert np.array_equal(bits(mul_mat(w, QT(q), x, path)), bits(y)), (QT(q).name, nth)
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("lanes", (16, 8))
def test_tinyblas_pairs_of_rows_are_each_row_alone(lanes):
    """tinyBLAS's pairs of weight rows (eight chains in registers, where the activations come in fours) give each
    element the bits of its row computed alone — an odd row count too, whose last row takes the four chains."""
    from kernels.ggml.mulmat_vec import tinyblas_rows

    rng = np.random.default_rng(2715)
    k = 4 * lanes
    w, x = hard_floats(rng, (7, k)), hard_floats(rng, (8, k))
    out = np.empty((8, 7), np.float32)
    tinyblas_rows(w, x, out, lanes, lanes, False)
    for r in range(7):
        one = np.empty((8, 1), np.float32)
        tinyblas_rows(w[r : r + 1], x, one, lanes, lanes, False)
        assert np.array_equal(bits(out[:, r : r + 1]), bits(one)), r


@pytest.mark.parametrize("build", BUILDS)
def test_float_builds_differ(build):
    """The float kernels are ISA-dependent: each build matches its own path, and the two paths differ."""
    path = build_info(build).path
    other = "avx2" if path == "avx512" else "avx512"
    rng = np.random.default_rng(2712)
    x = acts(rng, 4, 160)
    w = acts(rng, 16, 160)
    cases = [(w.view(np.uint8), int(QT.F32), 160, x[:1], 1),  # vec_dot_f32: 4x16 lanes / 4x8 lanes, tails
             (w.view(np.uint8), int(QT.F32), 160, x, 1)]  # tinyBLAS: 16 / 8 lanes
    # BF16 subnormal products: VDPBF16PS (avx512) reads them as zero, the avx2 FMA does not
    wb = np.zeros((4, 64), np.float32)
    wb[:, 1] = 1e-39
    xb = np.zeros((2, 64), np.float32)
    xb[:, 1] = 2.0**100
    cases.append((fp32_to_bf16_bits(wb).view(np.uint8), int(QT.BF16), 64, xb, 1))
    got = check(build, cases, lambda w, q, x: mul_mat(w, q, x, path))
    for (w_, q, k, x_, _), y in zip(cases, got):
        assert (bits(mul_mat(w_, q, x_, other)) != bits(y)).any(), (QT(q).name, x_.shape)


@pytest.mark.parametrize("build", BUILDS)
def test_float_two_nans_meet(build):
    """NaN sign/payload when two different NaNs meet in one sum (an input NaN and the default NaN of inf-inf): x86
    keeps the first source operand's NaN, which depends on GCC's operand order per instruction. The AVX2 builds'
    order is the emulation's; the AVX-512 build's is not modelled (its bits differ here, asserted so)."""
    path = build_info(build).path
    rng = np.random.default_rng(2713)
    k = 96
    w = float_weights(QT.F16, hard_floats(rng, (16, k)))
    x = hard_floats(rng, (5, k))
    x[2, 5] = np.nan
    x[2, 6] = -np.inf
    case = [(w, int(QT.F16), k, x, 1)]
    if path == "avx512":
        with pytest.raises(AssertionError):
            check(build, case, lambda w, q, x: mul_mat(w, q, x, path))
    else:
        check(build, case, lambda w, q, x: mul_mat(w, q, x, path))


# ---- MXFP4 --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", BUILDS + [ZEN])
def test_mxfp4_bit_exact(build):
    path = build_info(build).path
    rng = np.random.default_rng(2714)
    cases = []
    for n, k in ((16, 64), (13, 96), (12, 288)):  # 2, 3 (odd: scalar tail), 9 blocks
        w = weight_bytes(QT.MXFP4, n, k, rng)
        for t in (1, 2, 9):
            cases.append((w, int(QT.MXFP4), k, acts(rng, t, k), 1 + t % 2))
    # large same-sign block sums (d·Σ has up to 27 bits) so that the odd tail's double rounding shows
    x = acts(rng, 3, 288)
    x[0, 5] = np.inf
    cases.append((weight_bytes(QT.MXFP4, 12, 288, rng, "raw"), int(QT.MXFP4), 288, x, 1))  # E8M0 up to 2**127
    w = weight_bytes(QT.MXFP4, 64, 96, rng)
    nib = rng.integers(1, 8, (64, 3, 16, 2))  # positive values 1 … 12 everywhere
    w.reshape(64, 3, 17)[:, :, 1:] = (nib[..., 0] | (nib[..., 1] << 4)).astype(np.uint8)
    cases.append((w, int(QT.MXFP4), 96, rng.uniform(0.5, 1.0, (4, 96)).astype(np.float32), 1))
    got = check(build, cases, lambda w, q, x: mul_mat(w, q, x, path))
    other = "avx2" if simd(path).split_chains else "avx2-zen"  # the other GCC tuning (kernels.ggml.tuning)
    odd = [bits(mul_mat(c[0], QT.MXFP4, c[3], other)) != bits(y) for c, y in zip(cases, got) if c[2] == 96]
    assert any(d.any() for d in odd)  # the tail's mul+add (tuned for AMD Zen) vs FMA (generic and Intel tunings)


# ---- K-quants -----------------------------------------------------------------------------------------

KQ = (QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS)


@pytest.mark.parametrize("qtype", KQ, ids=[q.name for q in KQ])
@pytest.mark.parametrize("build", BUILDS)
def test_kquant_bit_exact(build, qtype):
    path = build_info(build).path
    rng = np.random.default_rng([2715, int(qtype)])
    cases = []
    for n, k, ts in ((13, 256, T_ALL), (40, 2048, (1, 7, 8, 16, 70)), (300, 512, (9, 20))):
        w = weight_bytes(qtype, n, k, rng)
        for t in ts:
            for nth in (1, 2):
                cases.append((w, int(qtype), k, acts(rng, t, k), nth))
    x = acts(rng, 9, 256)
    x[0, 7] = np.inf
    x[4, 9] = np.nan
    for t in (3, 9):  # extreme fp16 scales (subnormal, ±65504, 0); Q6_K / IQ4_XS also random bits (NaN, inf)
        cases.append((weight_bytes(qtype, 16, 256, rng, "extreme"), int(qtype), 256, x[:t], 2))
        if qtype in (QT.Q6_K, QT.IQ4_XS):
            cases.append((weight_bytes(qtype, 16, 256, rng, "raw"), int(qtype), 256, x[:t], 1))
    got = check(build, cases, lambda w, q, x: mul_mat(w, q, x, path))
    assert kernel_for(qtype, path, 7, 40, 2048) == "vec_dot" and kernel_for(qtype, path, 8, 40, 2048) == "tiled"
    # the tiled kernel's float formula is not vec_dot's: the same rows give other bits at T >= 8
    i = next(i for i, c in enumerate(cases) if c[3].shape[0] == 70)
    vec = mulmat_k.mul_mat_k(cases[i][0], qtype, cases[i][3], path, tiled=False)
    assert (bits(vec) != bits(got[i])).any()


@pytest.mark.xfail(strict=True, reason="Q4_K/Q5_K vec_dot with a NaN fp16 d (its payload) and an inf activation "
                   "(y.d = -inf: the default NaN in the mins term): which NaN survives follows x86 operand order "
                   "(here acc_m is the first source of the final vaddss); the emulation does not model it")
@pytest.mark.parametrize("build", ["native"])
def test_kquant_two_nans_meet(build):
    path = build_info(build).path
    rng = np.random.default_rng(11)
    cases = []
    for qtype in (QT.Q4_K, QT.Q5_K):
        x = acts(rng, 1, 512)
        x[0, 7] = np.inf
        cases.append((weight_bytes(qtype, 16, 512, rng, "raw"), int(qtype), 512, x, 1))
    check(build, cases, lambda w, q, x: mul_mat(w, q, x, path))


# ---- mul_mat_id ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", (QT.Q8_0, QT.Q4_K, QT.F32), ids=["Q8_0", "Q4_K", "F32"])
@pytest.mark.parametrize("build", BUILDS)
def test_mul_mat_id_bit_exact(build, qtype):
    path = build_info(build).path
    rng = np.random.default_rng([2716, int(qtype)])
    E, N, K, T, n_used = 4, 16, 256, 12, 3
    w = np.stack([weight_bytes(qtype, N, K, rng) for _ in range(E)])
    ids = np.stack([rng.permutation(E)[:n_used] for _ in range(T)]).astype(np.int32)
    ids[:, 0] = 0  # expert 0 gets all 12 tokens: the tiled kernel for K-quants (>= 8 rows)
    ids[:3, 1] = 3
    for n_x in (1, n_used):  # one activation row shared by all slots (gate/up) or one per slot (down)
        x = acts(rng, T * n_x, K).reshape(T, n_x, K)
        for nth in (1, 2):
            got = on_build(build, g_mul_mat_id, w, int(qtype), K, x, ids, nth)
            want = mul_mat_id(w, qtype, x, ids, path)
            assert np.array_equal(bits(got), bits(want)), (n_x, nth)
    # mul_mat_id never takes llamafile's sgemm: for F32 the 16-row expert differs from ggml_mul_mat's tinyBLAS
    if qtype == QT.F32:
        rows = x[ids == 0]  # (12, K): n_x == n_used here
        assert (bits(mul_mat(w[0], qtype, rows, path)) != bits(got[ids == 0])).any()


def test_kquant_mul_mat_id_threads():
    """K-quant experts in a plain buffer: mul_mat_id's vec_dot groups in one call, its (expert group, 64 weight rows)
    items split between 1, 2 or 3 threads (above SERIAL_BELOW), a tiled group beside them — the same bits as each
    group's rows through mul_mat (the per-element kernels proven above), at every thread count; vec_dot's
    mul_mat too."""
    import numba

    rng = np.random.default_rng(2717)
    E, N, K, T, n_used = 3, 72, 1024, 8, 2  # 2 items per group, the last partial
    ids = np.array([[0, 1 + t % 2] for t in range(T)], np.int32)  # expert 0: 8 rows (tiled); 1 and 2: 4 (vec_dot)
    before = numba.get_num_threads()
    try:
        for qtype in (QT.Q6_K, QT.Q5_K):
            w = np.stack([weight_bytes(qtype, N, K, rng) for _ in range(E)])
            x = acts(rng, T * n_used, K).reshape(T, n_used, K)
            want = np.empty((T, n_used, N), np.float32)
            for e in range(E):
                want[ids == e] = mul_mat(w[e], qtype, x[ids == e], "avx512")
            dense = []  # vec_dot's mul_mat: 4 rows x 72 x 1024, parallel
            for nth in (1, 2, 3):
                numba.set_num_threads(min(nth, numba.config.NUMBA_NUM_THREADS))
                assert np.array_equal(bits(mul_mat_id(w, qtype, x, ids, "avx512")), bits(want)), (qtype.name, nth)
                dense.append(bits(mul_mat(w[1], qtype, x[:4, 0], "avx512")))
            assert all(np.array_equal(d, dense[0]) for d in dense[1:]), qtype.name
    finally:
        numba.set_num_threads(before)


# ---- ggml's generic x86 path (a build without SIMD: docs/ggml-generic-x86.md) -------------------------

GENERIC_TYPES = (QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.MXFP4, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.IQ4_NL, QT.Q2_K,
                 QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS, QT.IQ1_S, QT.IQ1_M, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S,
                 QT.IQ3_XXS, QT.IQ3_S)


@pytest.mark.parametrize("qtype", GENERIC_TYPES, ids=[q.name for q in GENERIC_TYPES])
def test_generic_build_bit_exact(qtype):
    """The generic build runs vec_dot for every shape (no sgemm, no repack): F32/F16/BF16 a double sum of rounded
    products, Q8_0 a float sum per block with the activations by quantize_row_q8_0_ref (roundf: ties away from
    zero) — against that library, and different from the AVX2 build's bits on the same inputs."""
    rng = np.random.default_rng([2720, int(qtype)])
    cases = []
    if qtype not in (QT.F32, QT.F16, QT.BF16, QT.Q8_0):
        for n, k in ((16, 256), (12, 512)):
            for scales in ("normal", "extreme"):
                w = weight_bytes(qtype, n, k, rng, scales)
                for t in (1, 4, 9):
                    cases.append((w, int(qtype), k, acts(rng, t, k), 1 + t % 2))
    elif qtype == QT.Q8_0:
        for n, k in ((16, 256), (13, 96)):
            w = weight_bytes(qtype, n, k, rng)
            w.reshape(n, -1, 34)[0, :, 2:] = np.uint8(0x80)  # weight bytes of -128
            for t in (1, 4, 9, 33):
                cases.append((w, int(qtype), k, acts(rng, t, k), 1 + t % 2))
        k, n = 128, 16
        x = acts(rng, 9, k)
        x[0, 3] = np.nan  # not the last of its block: MAX forgets it (NaN > v is false)
        x[0, 63] = np.nan  # the last of its block: amax, d, id are NaN; every quant of the block 0
        x[3, :32] = np.arange(32, dtype=np.float32) - np.float32(15.5)  # .5 ties: roundf goes away from zero
        x[3, 31] = 127.0
        x[4, 40] = np.inf
        x[5, 70:90] = np.float32(1e-42)
        cases += [(weight_bytes(qtype, n, k, rng, "extreme"), int(qtype), k, x, 1),
                  (weight_bytes(qtype, n, k, rng, "raw"), int(qtype), k, x, 2)]
    else:
        for n, k in ((12, 7), (16, 64), (13, 100), (8, 296)):
            w = float_weights(qtype, hard_floats(rng, (n, k)))
            for t in (1, 2, 5, 9):
                x = hard_floats(rng, (t, k))
                if t >= 2:
                    x[1, 3] = np.inf
                cases.append((w, int(qtype), k, x, 1 + t % 2))
        x = acts(rng, 3, 64)
        x[0, 5] = np.array([0x7FC0BEEF], np.uint32).view(np.float32)[0]  # one NaN source (F16: its payload dropped)
        cases.append((float_weights(qtype, acts(rng, 16, 64)), int(qtype), 64, x, 1))
    got = check("generic", cases, lambda w, q, x: mul_mat(w, q, x, "generic"))
    assert kernel_for(qtype, "generic", 9, 16, 256) == "vec_dot"
    avx2 = [mul_mat(w, q, x, "avx2") for w, q, _, x, _ in cases]
    assert any((bits(a) != bits(b)).any() for a, b in zip(got, avx2))


@pytest.mark.parametrize("qtype", (QT.Q8_0, QT.F32, QT.Q4_K), ids=["Q8_0", "F32", "Q4_K"])
def test_generic_build_mul_mat_id_bit_exact(qtype):
    rng = np.random.default_rng([2721, int(qtype)])
    E, N, K, T, n_used = 4, 16, 256, 12, 3
    w = np.stack([weight_bytes(qtype, N, K, rng) for _ in range(E)])
    ids = np.stack([rng.permutation(E)[:n_used] for _ in range(T)]).astype(np.int32)
    for n_x in (1, n_used):
        x = acts(rng, T * n_x, K).reshape(T, n_x, K)
        got = on_build("generic", g_mul_mat_id, w, int(qtype), K, x, ids, 2)
        assert np.array_equal(bits(got), bits(mul_mat_id(w, qtype, x, ids, "generic"))), n_x


def test_generic_build_refuses_types_not_emulated():
    rng = np.random.default_rng(2722)
    w = weight_bytes(QT.TQ1_0, 8, 256, rng)
    with pytest.raises(ValueError, match="TQ1_0 weights on ggml's generic x86 path are not emulated"):
        mul_mat(w, QT.TQ1_0, acts(rng, 1, 256), "generic")
