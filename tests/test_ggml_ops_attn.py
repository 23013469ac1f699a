"""ggml_flash_attn_ext, bit for bit: kernels.ggml.flashattn_exact against both libggml builds.

Each case runs the real op (ggml_graph: one-op graph, ``native`` = AVX-512 and ``avx2`` builds) and the
emulation with that build's path, and compares the output bytes. The three code paths of
ggml_compute_forward_flash_attn_ext_f16 are covered — one-row (decode, batches < 64), tiled (>= 64 rows),
split-KV (one row, n_kv >= 512, with several thread counts) — with F16 and F32 K/V, GQA, head dims that are
and are not multiples of the lane count, causal masks, and hard inputs (large scores that flush
probabilities to zero, ties of scores, zeros and signed zeros, subnormal F16 values, inf in V).
"""

import ctypes

import numpy as np
import pytest
from ggml_graph import BUILDS, WITH_GENERIC, Graph, build_info, on_build, require_both_paths, vp

from kernels.base.flags import SERIAL_BELOW
from kernels.ggml.attn_heads import attend_f32
from kernels.ggml.flashattn_exact import fa_kernel, flash_attn_ext

GGML_PREC_F32 = 10  # ggml.h enum ggml_prec


def fa_graph(q, k, v, mask, scale, n_threads):
    """ggml_flash_attn_ext(q, k, v, mask, scale, 0, 0) with GGML_PREC_F32 (as llama.cpp's build_attn_mha)."""
    with Graph() as g:
        m = g.tensor(mask) if mask is not None else None
        out = g.op("ggml_flash_attn_ext", [vp, vp, vp, vp, ctypes.c_float, ctypes.c_float, ctypes.c_float],
                   g.tensor(q), g.tensor(k), g.tensor(v), m, scale, 0.0, 0.0)
        set_prec = g.base.ggml_flash_attn_ext_set_prec
        set_prec.restype, set_prec.argtypes = None, [vp, ctypes.c_int]
        set_prec(out, GGML_PREC_F32)
        return g.compute(out, (q.shape[1], q.shape[0], v.shape[2]), n_threads=n_threads)


def causal_mask(n_q, n_kv, n_past):
    """llama.cpp's KQ mask: query t sees cells 0 … n_past + t; the rest -inf (F16)."""
    t = np.arange(n_q)[:, None]
    c = np.arange(n_kv)[None, :]
    return np.where(c <= n_past + t, 0.0, -np.inf).astype(np.float16)


def make(rng, n_head, n_head_kv, n_q, n_kv, D, kv_dtype, amp=1.0, mask="causal", DV=None):
    DV = DV or D
    q = (rng.standard_normal((n_head, n_q, D)) * amp).astype(np.float32)
    k = (rng.standard_normal((n_head_kv, n_kv, D)) * amp).astype(kv_dtype)
    v = rng.standard_normal((n_head_kv, n_kv, DV)).astype(kv_dtype)
    if isinstance(mask, str):
        m = causal_mask(n_q, n_kv, n_kv - n_q) if mask == "causal" else None
    else:
        m = mask
    return q, k, v, m, np.float32(1.0) / np.sqrt(np.float32(D))  # llama.cpp: 1.0f/sqrtf(float(n_embd_head))


def check(build, q, k, v, m, scale, n_threads=1, path=None):
    """Byte comparison of ggml and the emulation of ``path`` (default: the build's detected path); returns ggml's
    output."""
    want = on_build(build, fa_graph, q, k, v, m, float(scale), n_threads)
    got = flash_attn_ext(q, k, v, m, scale, path or build_info(build).path, n_threads=n_threads)
    bad = want.view(np.uint32) != got.view(np.uint32)
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        pytest.fail(f"{bad.sum()} of {bad.size} differ ({fa_kernel(q.shape[1], k.shape[1], k.dtype, v.dtype)} path, "
                    f"q {q.shape}, k {k.shape}, {n_threads} threads); first at {i}: ggml {want[i]!r} emulation {got[i]!r}")
    return want


# (n_head, n_head_kv, n_q, n_kv, D): decode and short batches take the one-row path. Head dims whose dot
# tails (D mod 64 / mod 32) go through every tail kind of ggml_vec_dot_f16/f32 on both ISAs.
ONE_ROW = [(4, 2, 1, 1, 64), (4, 1, 1, 37, 128), (8, 2, 1, 300, 256), (2, 1, 1, 511, 64), (4, 2, 4, 40, 128),
           (2, 2, 63, 100, 64), (2, 1, 3, 20, 80), (2, 1, 2, 19, 40), (2, 2, 5, 30, 100), (2, 1, 3, 25, 30),
           (2, 1, 2, 9, 17), (1, 1, 1, 5, 7)]


@pytest.mark.oracle
@pytest.mark.parametrize("build", WITH_GENERIC)
@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
def test_one_row_path(build, kv_dtype):
    rng = np.random.default_rng(1)
    for shape in ONE_ROW:
        assert fa_kernel(shape[2], shape[3], kv_dtype, kv_dtype) == "one_row"
        check(build, *make(rng, *shape, kv_dtype))
        # sharp softmax (many new maxima, flushes); ggml on 3 threads: rows are independent of the split
        check(build, *make(rng, *shape, kv_dtype, amp=4.0), n_threads=3)


@pytest.mark.oracle
@pytest.mark.parametrize("build", WITH_GENERIC)
def test_one_row_mixed_types_and_no_mask(build):
    rng = np.random.default_rng(2)
    q, k, v, m, scale = make(rng, 4, 2, 3, 50, 128, np.float16)
    check(build, q, k, v.astype(np.float32), m, scale)  # K F16, V F32: one-row path with a float accumulator
    check(build, q, k.astype(np.float32), v, m, scale)
    check(build, *make(rng, 4, 2, 2, 33, 64, np.float16, mask="none"))


@pytest.mark.oracle
@pytest.mark.parametrize("build", WITH_GENERIC)
@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
def test_tiled_path(build, kv_dtype):
    rng = np.random.default_rng(3)
    for shape, n_threads in [((2, 1, 64, 64, 64), 1), ((4, 2, 70, 130, 128), 2), ((2, 2, 100, 100, 80), 3),
                             ((2, 1, 65, 200, 256), 1)]:
        assert fa_kernel(shape[2], shape[3], kv_dtype, kv_dtype) == "tiled"
        check(build, *make(rng, *shape, kv_dtype), n_threads=n_threads)
    check(build, *make(rng, 2, 1, 64, 96, 64, kv_dtype, amp=5.0))


@pytest.mark.oracle
@pytest.mark.parametrize("build", WITH_GENERIC)
@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
def test_split_kv_path(build, kv_dtype):
    rng = np.random.default_rng(4)
    q, k, v, m, scale = make(rng, 4, 2, 1, 600, 128, kv_dtype)
    m[:, 520:] = -np.inf  # llama.cpp's padded cells: a whole chunk may be masked
    assert fa_kernel(1, 600, kv_dtype, kv_dtype) == "split"
    outs = [check(build, q, k, v, m, scale, n_threads=t) for t in (1, 2, 3, 4, 7)]
    # partial sums combined per chunk: the bits depend on the thread count
    assert any((o.view(np.uint32) != outs[0].view(np.uint32)).any() for o in outs[1:])


@pytest.mark.oracle
@pytest.mark.parametrize("build", WITH_GENERIC)
def test_hard_inputs(build):
    rng = np.random.default_rng(5)
    # identical keys: exact score ties (s > M false), every probability 1
    q, k, v, m, scale = make(rng, 2, 1, 4, 48, 64, np.float16)
    k[:] = k[:, :1]
    check(build, q, k, v, m, scale)
    # huge scores: probabilities flush to 0 (expf underflow, v_expf's |n| > 126 and > 192 branches)
    for n_q in (2, 64):
        q, k, v, m, scale = make(rng, 2, 1, n_q, 80, 64, np.float16, amp=20.0)
        check(build, q, k, v, m, scale)
    # zeros, signed zeros and subnormal F16 values in Q, K, V
    q, k, v, m, scale = make(rng, 2, 1, 3, 40, 64, np.float16)
    q[:, :, ::3] = -0.0
    k[:, ::2, ::5] = np.float16(2.0**-24) * rng.integers(-3, 4, k[:, ::2, ::5].shape)
    v[:, 1::3] = -0.0
    v[:, ::4, ::7] = np.float16(-2.0**-20)
    check(build, q, k, v, m, scale)
    check(build, q[:, :1], k, v, m[:1], scale)
    # Q values that round to F16 ties (q_to_vec_dot) and V values near the F16 rounding of the accumulator
    q = (np.float32(1.0) + np.float32(2.0**-11) * rng.integers(0, 4, (2, 1, 64))).astype(np.float32)
    check(build, q, k, v, m[-1:], scale)
    # inf in V: inf·p and 0·inf = NaN propagate through the accumulators (and the tiled padding)
    for n_q in (1, 64):
        q, k, v, m, scale = make(rng, 2, 1, n_q, 70, 64, np.float16)
        v[0, 3, 5] = np.inf
        want = check(build, q, k, v, m, scale)
        assert np.isnan(want).any() or np.isinf(want).any()


@pytest.mark.oracle
def test_builds_differ():
    """The emulation follows the build: the one-row dot (F32 K, lanes and tail order) and the tiled softmax
    (ggml_v_expf, block sums) give different bits on the AVX-512 and AVX2 builds."""
    require_both_paths()
    rng = np.random.default_rng(6)
    cases = [make(rng, 4, 2, 2, 60, 80, np.float32), make(rng, 2, 1, 64, 128, 64, np.float16)]
    for case in cases:
        a = on_build("native", fa_graph, *case[:4], float(case[4]), 1)
        b = on_build("avx2", fa_graph, *case[:4], float(case[4]), 1)
        assert build_info("native").path != build_info("avx2").path
        assert (a.view(np.uint32) != b.view(np.uint32)).any()


@pytest.mark.oracle
def test_generic_build_differs():
    """ggml's generic build (double-sum dots, no FMA, SSE2 exps) gives other bits than both SIMD builds on every
    path: the generic cases above compare with a computation the others would fail."""
    rng = np.random.default_rng(8)
    for case in (make(rng, 4, 2, 2, 60, 80, np.float32), make(rng, 2, 1, 64, 128, 64, np.float16),
                 make(rng, 2, 1, 1, 600, 64, np.float16)):
        g = on_build("generic", fa_graph, *case[:4], float(case[4]), 2)
        for path in ("avx2", "avx512"):
            assert (g.view(np.uint32) != flash_attn_ext(*case, path, n_threads=2).view(np.uint32)).any(), path


@pytest.mark.oracle
@pytest.mark.parametrize("build", WITH_GENERIC)
def test_tiled_inf_v_depends_on_threads(build):
    """An inf in a V cell that a row must not see: the tiled path multiplies it by probability 0 (NaN) when
    the cell's KV tile is not skipped for the row's Q tile, and where Q tiles are cut depends on n_threads."""
    rng = np.random.default_rng(7)
    q, k, v, m, scale = make(rng, 2, 1, 100, 100, 64, np.float16, mask=causal_mask(100, 100, 0))
    v[0, 70, :] = np.inf  # seen by rows >= 70 only
    one, three = (check(build, q, k, v, m, scale, n_threads=t) for t in (1, 3))
    nan_rows = [sorted(set(np.argwhere(np.isnan(o[:, 0]))[:, 0].tolist())) for o in (one, three)]
    assert nan_rows == [list(range(64, 70)), list(range(51, 70))]  # Q tiles [0, 64) vs [51, 68) …


def test_f16_round_on_the_bits_equals_numpy_float16():
    """kernels.ggml.simd.f16_round (flash attention's F16 accumulator: F16C's conversions where the target has them)
    and its integer twin f16_round_bits (rounded on the bits) are numpy's float32 → float16 → float32 (round to
    nearest even) on every kind of input: a stride through all 2^32 bit patterns, every half's midpoints and their
    float32 neighbours, the subnormal range and overflow; a NaN passes through both unchanged."""
    from kernels.base.flags import jit
    from kernels.ggml.simd import f16_round, f16_round_bits

    @jit()
    def rounded(x, y, z):
        for i in range(x.size):  # a loop of each, as the kernels vectorize it
            y[i] = f16_round(x[i])
        for i in range(x.size):
            z[i] = f16_round_bits(x[i])

    nans = np.uint32([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF, 0x7FC01234]).view(np.float32)
    y, z = np.empty_like(nans), np.empty_like(nans)
    rounded(nans, y, z)
    assert np.array_equal(y.view(np.uint32), nans.view(np.uint32)) and np.array_equal(z.view(np.uint32), nans.view(np.uint32))

    stride = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)  # ~1M patterns, all exponents
    halves = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)  # every finite half ≥ 0
    mids = ((halves[:-1].astype(np.float64) + halves[1:]) / 2).astype(np.float32)  # exact ties (representable)
    bits = mids.view(np.uint32).astype(np.int64)
    near = np.concatenate([bits - 1, bits, bits + 1]).astype(np.uint32).view(np.float32)
    x = np.concatenate([stride.view(np.float32), near, -near, np.float32([65519.0, 65520.0, -65520.0, 6e-8, 3e-8])])
    x = x[~np.isnan(x)]
    y, z = np.empty_like(x), np.empty_like(x)
    rounded(x, y, z)
    with np.errstate(over="ignore"):  # past the largest half: ±inf, as intended
        want = x.astype(np.float16).astype(np.float32)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(z.view(np.uint32), want.view(np.uint32))


# --- build_attn_mha without flash attention, F32 K/V (kernels.ggml.attn_heads) ------------------------------
def attn_graph(q, k, vt, mask, scale):
    """llama.cpp's build_attn_mha, flash attention off: q [T, H, D] permuted to [H, T, D] (not contiguous),
    kq = mul_mat(k [Hkv, n_kv, D], q), soft_max_ext(kq, mask [T, n_kv] F16, scale), kqv = mul_mat(vt [Hkv, D, n_kv],
    kq), permuted back and made contiguous -> [T, H, D]."""
    T, H, D = q.shape
    with Graph() as g:
        qp = g.op("ggml_permute", [vp] + [ctypes.c_int] * 4, g.tensor(q), 0, 2, 1, 3)
        kq = g.op("ggml_mul_mat", [vp, vp], g.tensor(k), qp)
        kq = g.op("ggml_soft_max_ext", [vp, vp, ctypes.c_float, ctypes.c_float], kq, g.tensor(mask), scale, 0.0)
        kqv = g.op("ggml_mul_mat", [vp, vp], g.tensor(vt), kq)
        out = g.op("ggml_cont", [vp], g.op("ggml_permute", [vp] + [ctypes.c_int] * 4, kqv, 0, 2, 1, 3))
        return g.compute(out, (T, H, D), n_threads=2)


@pytest.mark.oracle
@pytest.mark.parametrize("build", BUILDS)
def test_attention_without_flash(build):
    """:func:`kernels.ggml.attn_heads.attend_f32` (every head's K·Q, soft_max_ext and P·V in one compiled call) as the
    graph calls it, against the library's three ops, on 1 to 4 threads: the heads split between threads from
    SERIAL_BELOW multiply-adds (real2's 16 heads over 256 cells: a decode step is above it), no bit depends on it.
    D and n_kv multiples of 16 (the products across columns), and not (one by one); T ≥ 2 with n_kv a multiple of
    16: P·V by tinyBLAS."""
    rng = np.random.default_rng(11)
    for T, H, Hkv, n_kv, D in [(1, 16, 2, 256, 256), (4, 16, 2, 256, 256), (3, 6, 3, 90, 80), (1, 4, 2, 37, 19)]:
        q = (rng.standard_normal((T, H, D)) * 2).astype(np.float32)
        k = (rng.standard_normal((Hkv, n_kv, D)) * 2).astype(np.float32)
        v = rng.standard_normal((Hkv, n_kv, D)).astype(np.float32)
        mask = causal_mask(T, n_kv, n_kv - T - 7)
        scale = np.float32(1.0) / np.sqrt(np.float32(D))
        want = on_build(build, attn_graph, q, k, np.ascontiguousarray(v.transpose(0, 2, 1)), mask, float(scale))
        assert (H * T * n_kv * 2 * D >= SERIAL_BELOW) == (D == 256)  # the threaded kernel where it is meant to run
        for n_threads in (1, 2, 3, 4):
            got = attend_f32(q, k, v, n_kv - 7, mask, scale, build_info(build).path, n_threads)
            bad = want.view(np.uint32) != got.view(np.uint32)
            assert not bad.any(), f"{bad.sum()} of {bad.size} differ (T {T}, n_kv {n_kv}, D {D}, {n_threads} threads)"
