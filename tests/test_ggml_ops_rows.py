"""kernels.ggml.norm and kernels.ggml.rows bit for bit against both libggml builds (tests/ggml_graph.py).

Every op here is ISA-independent, so no test asserts that the two builds differ; the reasons, checked in
the disassembly of both ``libggml-cpu.so`` and ``libggml-base.so``:

* rms_norm / l2_norm: a sequential double sum of float32 squares (scalar ``vaddsd`` in both builds), then
  an element-wise ``ggml_vec_scale_f32`` — lanes never meet;
* get_rows: the dequantizers live in libggml-base, built without ISA flags (no FMA, same C rounding);
  F16 via F16C or the table and BF16 via shifts are exact conversions;
* argsort / top_k: libstdc++'s std::sort / std::partial_sort (integer moves, ordered ``>`` compares);
* concat: a float copy.

Each test still can fail: alongside the bit comparison it asserts that a plausible wrong model (float64
math, numpy's stable argsort, kernels.plain.dequant's NaN-canonicalising f16) differs on the same data.
"""

import ctypes

import numpy as np
import pytest
from ggml_graph import WITH_GENERIC, Graph, build_info, on_build, vp
from gguf import GGMLQuantizationType as QT

from kernels.ggml.norm import gdn_l2_norm, l2_norm, rms_norm
from kernels.ggml.rows import GET_ROWS_TYPES, argsort_desc, concat, get_rows, top_k
from kernels.plain.dequant import dequantize
from kernels.testing import random_rows

cf, ci = ctypes.c_float, ctypes.c_int
pytestmark = pytest.mark.oracle

#: and the AArch64 dotprod GCC build (tests/arm64.py, under qemu). arm64-i8mm-gcc runs the same machine code for
#: these ops (their disassembly, addresses aside) and passed every test here too; tests/test_ggml_ops_arm64.py keeps
#: it in the default suite (one qemu worker less here)
WITH_ARM = WITH_GENERIC + ["arm64-dotprod-gcc"]
#: the norms on arm64-base-gcc (armv8-a) too: its F32 NEON code is the dotprod build's (get_rows, argsort, concat
#: passed there as well, left out to keep the suite short); pytest -m deep: a third qemu worker
WITH_BASE = WITH_ARM + [pytest.param("arm64-base-gcc", marks=pytest.mark.deep)]


def path_of(build: str) -> str:
    """The emulated path ``build``'s library takes (an ARM build's from tests/arm64.py: it cannot be loaded here)."""
    if build.startswith("arm64-"):
        import arm64

        return arm64.BUILDS[build][0]
    return build_info(build).path


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def nan_bits(*patterns):
    return np.array(patterns, np.uint32).view(np.float32)


# ---- graph functions (module level: they run in the other build's worker process too) -----------------


def g_rms_norm(x, eps, w=None, n_threads=1):
    with Graph() as g:
        t = g.op("ggml_rms_norm", [vp, cf], g.tensor(x), eps)
        if w is not None:  # ggml_cpu_try_fuse_ops fuses RMS_NORM + MUL
            t = g.op("ggml_mul", [vp, vp], t, g.tensor(w))
        return g.compute(t, x.shape, n_threads=n_threads)


def g_l2_norm(x, eps):
    with Graph() as g:
        return g.compute(g.op("ggml_l2_norm", [vp, cf], g.tensor(x), eps), x.shape)


def g_gdn_l2_norm(x, eps):
    """models.h: build_gdn_l2_norm = ggml_scale(ggml_rms_norm(x, eps/n), 1.0f/sqrtf(n))."""
    n = np.float32(x.shape[-1])
    with Graph() as g:
        t = g.op("ggml_rms_norm", [vp, cf], g.tensor(x), np.float32(np.float32(eps) / n))
        t = g.op("ggml_scale", [vp, cf], t, np.float32(1) / np.sqrt(n))
        return g.compute(t, x.shape)


def g_get_rows(table, gtype, n_cols, ids, n_threads=1):
    with Graph() as g:
        t = g.tensor(table, gtype=gtype, ne=(n_cols, table.shape[0]))
        out = g.op("ggml_get_rows", [vp, vp], t, g.tensor(np.ascontiguousarray(ids, np.int32)))
        return g.compute(out, (ids.size, n_cols), n_threads=n_threads)


def g_argsort_desc(x):
    with Graph() as g:
        return g.compute(g.op("ggml_argsort", [vp, ci], g.tensor(x), 1), x.shape, np.int32)  # GGML_SORT_ORDER_DESC


def g_top_k(x, k):
    with Graph() as g:
        return g.compute(g.op("ggml_top_k", [vp, ci], g.tensor(x), k), x.shape[:-1] + (k,), np.int32)


def g_concat(a, b, dim):
    shape = np.concatenate([a, b], axis=a.ndim - 1 - dim).shape
    with Graph() as g:
        return g.compute(g.op("ggml_concat", [vp, vp, ci], g.tensor(a), g.tensor(b), dim), shape)


# ---- inputs ------------------------------------------------------------------------------------------


def hard_rows(rng, n_rows, n):
    """Rows at many magnitudes (subnormal … squares overflowing float32), zeros and signed zeros, ties,
    and rows holding ±inf and NaNs with payloads (quiet, signalling, negative)."""
    mags = np.float32([1e-42, 1e-30, 1e-20, 1e-3, 1.0, 3.0, 1e10, 1e18, 2e19, 1e30])
    x = (rng.standard_normal((n_rows, n)) * rng.choice(mags, (n_rows, 1))).astype(np.float32)
    x[0] = 0.0
    x[1] = -0.0
    x[1, ::3] = 0.0
    x[2] = np.float32(1.5)  # all equal: mean = x²
    x[3, rng.integers(0, n)] = np.inf
    x[4, rng.integers(0, n, 2)] = nan_bits(0x7F812345, 0xFFC0BEEF)  # sNaN, then a negative qNaN
    x[5, -1] = nan_bits(0xFF800001)[0]
    x[6, 0] = -np.inf
    x[6, -1] = np.inf
    return x


@pytest.mark.parametrize("build", WITH_BASE)
def test_rms_norm_bit_exact(build):
    path = path_of(build)
    rng = np.random.default_rng(2701)
    for n in (1, 4, 5, 7, 37, 64, 261):  # tails of every length beyond 4/8/16 lanes; AArch64 fused: n <= 4 scalar
        x = hard_rows(rng, 18, n)  # rows summed four at a time, and two left over
        w = rng.standard_normal(n).astype(np.float32)
        w[rng.integers(0, n)] = nan_bits(0x7FC00ABC)[0]
        for eps in (1e-6, 0.0):
            assert np.array_equal(bits(on_build(build, g_rms_norm, x, eps)), bits(rms_norm(x, eps, path))), (n, eps)
            fused = on_build(build, g_rms_norm, x, eps, w, 2)
            assert np.array_equal(bits(fused), bits(rms_norm(x, eps, path, w))), (n, eps)
    # the float32 square overflows before the double sum: a row of 2e19s is all zeros, not ±1
    big = np.full((1, 8), 2e19, np.float32)
    assert np.array_equal(on_build(build, g_rms_norm, big, 1e-6), np.zeros((1, 8), np.float32))
    assert not np.array_equal(rms_norm(big, 1e-6, path), big / np.sqrt((big.astype(np.float64) ** 2).mean()))


@pytest.mark.parametrize("build", WITH_BASE)
def test_l2_norm_and_gdn_l2_norm_bit_exact(build):
    path = path_of(build)
    rng = np.random.default_rng(2702)
    for n in (1, 9, 128, 133):
        x = hard_rows(rng, 13, n)  # rows summed four at a time, and one left over
        for eps in (1e-6, 0.0):
            assert np.array_equal(bits(on_build(build, g_l2_norm, x, eps)), bits(l2_norm(x, eps, path))), (n, eps)
            assert np.array_equal(bits(on_build(build, g_gdn_l2_norm, x, eps)), bits(gdn_l2_norm(x, eps, path))), (n, eps)
    # the test can fail: float64 math rounded once differs from ggml's float-square / double-sum / float-scale
    x = rng.standard_normal((64, 128)).astype(np.float32)
    exact = (x / np.sqrt((x.astype(np.float64) ** 2).sum(-1, keepdims=True))).astype(np.float32)
    assert (bits(l2_norm(x, 1e-6, path)) != bits(exact)).any()


#: the types the AArch64 build runs here (every type passed there once, NaN scales included; these keep the default
#: suite short): the model's tables (F32, F16, Q8_0, Q6_K) and the decoders GCC contracts into fmadd / fmla there
ARM_GET_ROWS = (QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.Q4_1, QT.Q4_K, QT.Q5_K, QT.Q6_K)
GET_ROWS_CASES = [(b, t) for b in WITH_ARM for t in GET_ROWS_TYPES if not b.startswith("arm64-") or t in ARM_GET_ROWS]


@pytest.mark.parametrize("build, qtype", GET_ROWS_CASES, ids=[f"{b}-{t.name}" for b, t in GET_ROWS_CASES])
def test_get_rows_bit_exact(build, qtype):
    rng = np.random.default_rng([2703, int(qtype)])
    n_cols = 512
    if qtype in (QT.F32, QT.BF16, QT.F16):  # every bit pattern of the 16-bit types; F32: random bits
        n = 1 << 16
        if qtype == QT.F32:
            table = rng.integers(0, 1 << 32, (64, n_cols), dtype=np.uint32).view(np.float32)
        else:
            table = np.arange(n, dtype=np.uint32).astype(np.uint16).reshape(n // n_cols, n_cols)
            table = table.view(np.float16) if qtype == QT.F16 else table
    else:  # random bytes: random f16 scales, NaN / inf / subnormal ones among them; and realistic rows
        table = np.concatenate([random_rows(qtype, 48, n_cols, rng, "raw"), random_rows(qtype, 16, n_cols, rng)])
    ids = rng.integers(0, table.shape[0], 200).astype(np.int32)
    raw = np.ascontiguousarray(table).view(np.uint8).reshape(table.shape[0], -1)
    got = on_build(build, g_get_rows, raw, int(qtype), n_cols, ids, 2)
    assert np.array_equal(bits(got), bits(get_rows(table, qtype, ids, path_of(build))))
    if qtype == QT.F16:  # the 4-value and scalar tails: ggml_table_f32_f16 instead of F16C
        tail = np.ascontiguousarray(table.reshape(-1)[: 3 * 21845].reshape(-1, 3))
        ids3 = np.arange(tail.shape[0], dtype=np.int32)
        got3 = on_build(build, g_get_rows, tail.view(np.uint8), 1, 3, ids3)
        assert np.array_equal(bits(got3), bits(get_rows(tail, qtype, ids3)))
    if qtype in (QT.F16, QT.Q8_0, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS, QT.Q4_0, QT.Q4_1, QT.Q5_0,
                 QT.Q5_1, QT.IQ4_NL):
        # kernels.plain.dequant agrees except for NaN payloads (its f16 conversion canonicalises NaNs)
        plain = dequantize(table[ids], qtype)
        differ = bits(plain) != bits(got)
        assert differ.any() and np.isnan(got[differ]).all()


@pytest.mark.parametrize("build", WITH_ARM)
def test_get_rows_q4_1_q5_1_mul_then_add(build):
    """Q4_1 / Q5_1 ``x0*d + m`` with ``d`` and ``m`` both NaN: the add keeps the product's NaN (its first source),
    not ``m``'s (what a commuted ``fadd`` gives). (The product itself is exact: 5 bits times an fp16.) On AArch64
    GCC contracts it into ``fmadd`` / ``fmla``, whose addend ``m`` wins."""
    rng = np.random.default_rng(2707)
    for qtype, size in ((QT.Q4_1, 20), (QT.Q5_1, 24)):
        table = random_rows(qtype, 32, 256, rng)
        blk = table.reshape(32, 8, size)
        blk[0, 0, :4] = np.array([0x7F99, 0x7DCE], np.uint16).view(np.uint8)  # d: NaN 0x7F99, m: NaN 0x7DCE
        blk[1, 1, :4] = np.array([0xFC01, 0xFE00], np.uint16).view(np.uint8)
        ids = np.arange(32, dtype=np.int32)
        got = on_build(build, g_get_rows, table, int(qtype), 256, ids)
        assert np.array_equal(bits(got), bits(get_rows(table, qtype, ids, path_of(build))))
        if build.startswith("arm64-"):  # m's NaN: 0x7DCE, 0xFE00 widened
            assert (bits(got[0, :32]) == 0x7FF9C000).all() and (bits(got[1, 32:64]) == 0xFFC00000).all()
        else:
            assert (bits(got[0, :32]) == 0x7FF32000).all() and (bits(got[1, 32:64]) == 0xFFC02000).all()  # d's NaN


def tie_rows(rng, n):
    """Rows of few distinct values (ties, 0.0 / -0.0, NaN), a random row, and the MoE-like softmax row."""
    pool = np.array([0.0, -0.0, 1.0, 2.0, -1.0, 0.5, np.nan, -np.inf, np.inf], np.float32)
    rows = [rng.choice(pool[:6], n), rng.choice(pool, n), np.round(rng.standard_normal(n) * 2),
            rng.standard_normal(n), np.exp(rng.standard_normal(n)) / n]
    return np.array(rows, np.float32)


@pytest.mark.parametrize("build", WITH_ARM)
def test_argsort_and_top_k_bit_exact(build):
    rng = np.random.default_rng(2704)
    any_stable_differs = False
    for n in (1, 2, 5, 16, 17, 33, 128, 256, 512, 1000):  # 16: insertion sort only; > 16: introsort
        x = tie_rows(rng, n)
        order = argsort_desc(x)
        assert np.array_equal(on_build(build, g_argsort_desc, x), order), n
        for k in sorted({1, min(2, n), min(8, n), n}):
            assert np.array_equal(on_build(build, g_top_k, x, k), top_k(x, k)), (n, k)
        stable = np.argsort(-x[0], kind="stable")  # ties in index order: not what std::sort does
        any_stable_differs |= not np.array_equal(order[0], stable)
    assert any_stable_differs


@pytest.mark.parametrize("build", WITH_ARM)
def test_concat_bit_exact(build):
    rng = np.random.default_rng(2705)
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    a.reshape(-1)[:3] = nan_bits(0x7F800001, 0xFF812345, 0x80000000)  # signalling NaNs stay signalling
    for dim, b_shape in ((0, (3, 4, 2)), (1, (3, 6, 5)), (2, (1, 4, 5))):
        b = rng.standard_normal(b_shape).astype(np.float32)
        assert np.array_equal(bits(on_build(build, g_concat, a, b, dim)), bits(concat(a, b, dim))), dim


def g_get_rows_batched(probs, ids):
    """build_moe_ffn: ``ggml_get_rows(ggml_reshape_3d(probs, 1, n_expert, T), selected_experts)``."""
    T, n_expert = probs.shape
    with Graph() as g:
        t = g.tensor(probs, ne=(1, n_expert, T))
        out = g.op("ggml_get_rows", [vp, vp], t, g.tensor(np.ascontiguousarray(ids, np.int32)))
        return g.compute(out, ids.shape + (1,))


@pytest.mark.parametrize("build", WITH_ARM)
def test_get_rows_batched_expert_weights(build):
    rng = np.random.default_rng(2706)
    probs = rng.random((5, 64)).astype(np.float32)
    selected = argsort_desc(probs)[:, :8]  # ggml_argsort_top_k: the first k of the full argsort
    want = get_rows(probs[:, :, None], QT.F32, selected)  # [T, n_expert, 1] planes, ids [T, k]
    assert np.array_equal(bits(on_build(build, g_get_rows_batched, probs, selected)), bits(want))
    assert np.array_equal(want[..., 0], np.take_along_axis(probs, selected, 1))
