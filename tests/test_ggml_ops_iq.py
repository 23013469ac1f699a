"""kernels.ggml.mulmat_iq / rows_iq (mul_mat, mul_mat_id, get_rows of IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S,
IQ1_S, IQ1_M) bit for bit against both libggml builds (tests/ggml_graph.py).

Both builds run the same ``__AVX2__`` vec_dot C code (T < 8) and tiled microtiles whose integer sums are exact
(VNNI ``dpbusd`` on avx512, act-biased ``maddubs`` on avx2) with the same float epilogue, and the dequantizers of
get_rows live in libggml-base (no ISA flags): every case here is ISA- and thread-count-independent, so each test
also asserts that the two builds agree. Each test can fail: it asserts that a plausible wrong model differs on
the same data (vec_dot's formula on a tiled shape and the reverse; the IQ1 delta terms rounded another way;
kernels.plain.dequant's NaN-canonicalising fp16 scales).
"""

import numpy as np
import pytest
from ggml_graph import BUILDS, build_info, on_build
from gguf import GGMLQuantizationType as QT
from test_ggml_ops_mulmat import bits, g_mul_mat_id, g_mul_mats, weight_bytes
from test_ggml_ops_rows import g_get_rows

from kernels.ggml.actquant import _q8_k_rows
from kernels.ggml.mulmat import mul_mat_id
from kernels.ggml.mulmat_iq import IQ_TYPES, KIND, decode_row, mul_mat_iq
from kernels.ggml.rows import get_rows
from kernels.ggml.simd import fma32, hsum_fold
from kernels.ggml.vecmath import F16_TO_F32
from kernels.plain.dequant import dequantize

pytestmark = pytest.mark.oracle
IQ = (QT.IQ3_S, QT.IQ3_XXS, QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ1_S, QT.IQ1_M)
T_SET = (1, 2, 7, 8, 9, 16)


# ---- inputs ------------------------------------------------------------------------------------------


def acts(rng, t, k):
    """Activations over a few binades, with a zero row, a -0.0 row and a near-tie row when there is room."""
    x = (rng.standard_normal((t, k)) * np.float32(2.0) ** rng.integers(-6, 6, (t, k))).astype(np.float32)
    if t >= 3:
        x[1] = 0.0
        x[2, ::2] = -0.0
    if t >= 4:  # quantize_row_q8_K_ref: amax -127 gives iscale = 1, so k + 0.5 (and its neighbours) are ties
        r = (rng.integers(-126, 126, k) + np.float32(0.5)).astype(np.float32)
        r[::3] = np.nextafter(r[::3], np.float32(0.0))
        r[:: 256] = -127.0
        x[3] = r
    return x


def other_build(build):
    return "avx2" if build == "native" else "native"


# ---- mul_mat -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", IQ, ids=[q.name for q in IQ])
@pytest.mark.parametrize("build", BUILDS)
def test_iq_mul_mat_bit_exact(build, qtype):
    path = build_info(build).path
    rng = np.random.default_rng([2720, int(qtype)])
    cases = []
    # K = 1024 / 512 with T <= 16: the narrow window (2 slabs per unpack); T = 24: the standard window
    for n, k, ts in ((13, 256, T_SET), (20, 1024, (1, 8, 16)), (40, 512, (9, 24))):
        w = weight_bytes(qtype, n, k, rng)
        for t in ts:
            for nth in (1, 2):
                cases.append((w, int(qtype), k, acts(rng, t, k), nth))
    x = acts(rng, 9, 256)
    x[0, 7] = np.inf
    x[4, 9] = np.nan
    for t in (3, 9):  # extreme fp16 scales (subnormal, ±65504, 0), and random bits (NaN, inf scales)
        cases.append((weight_bytes(qtype, 16, 256, rng, "extreme"), int(qtype), 256, x[:t], 2))
        cases.append((weight_bytes(qtype, 16, 256, rng, "raw"), int(qtype), 256, acts(rng, t, 256), 1))
    got = on_build(build, g_mul_mats, cases)
    for (w, _, _, x_, nth), y in zip(cases, got):
        want = mul_mat_iq(w, qtype, x_, path, tiled=x_.shape[0] >= 8)
        bad = bits(y) != bits(want)
        assert not bad.any(), (qtype.name, w.shape, x_.shape, nth, np.argwhere(bad)[:4])
    # ISA-independent: the other build gives the same bits (a vec_dot and a tiled case)
    sel = [i for i, c in enumerate(cases) if c[2] == 1024 and c[4] == 1]
    other = on_build(other_build(build), g_mul_mats, [cases[i] for i in sel])
    assert all(np.array_equal(bits(got[i]), bits(o)) for i, o in zip(sel, other))
    # the two formulas differ: vec_dot's on a tiled shape, the tiled one on a vec_dot shape
    for i, c in enumerate(cases):
        if c[2] == 1024 and c[3].shape[0] in (1, 16):
            wrong = mul_mat_iq(c[0], qtype, c[3], path, tiled=c[3].shape[0] < 8)
            assert (bits(wrong) != bits(got[i])).any(), (qtype.name, c[3].shape)


@pytest.mark.parametrize("build", BUILDS)
def test_iq1_delta_rounding(build):
    """IQ1_S folds its delta term into one scalar (``fma(d, Σ, acc1)`` per block, then ``hsum + acc1·0.125``); IQ1_M
    keeps it in 8 lanes (``out = fma(hsum(acc2), 0.125, hsum(acc1))``). Recomputed here from the exact integer
    sums: IQ1_M's recipe gives ggml's bits, IQ1_S's recipe on the same sums does not."""
    path = build_info(build).path
    rng = np.random.default_rng(2721)
    k = 2048
    w, x = weight_bytes(QT.IQ1_M, 32, k, rng), acts(rng, 2, k)
    (got,) = on_build(build, g_mul_mats, [(w, int(QT.IQ1_M), k, x, 1)])
    assert np.array_equal(bits(mul_mat_iq(w, QT.IQ1_M, x, path, False)), bits(got))
    yq, yd, _ = _q8_k_rows(x)
    v, e = np.empty(k, np.int64), np.zeros(k, np.int64)
    sc, d = np.empty(k // 16, np.int64), np.empty(k // 256, np.float32)
    wrong = np.empty_like(got)
    for r in range(w.shape[0]):
        decode_row(KIND[QT.IQ1_M], w[r], v, e, sc, d, F16_TO_F32)
        for t in range(x.shape[0]):
            acc, acc2, acc1 = np.zeros(8, np.float32), np.zeros(8, np.float32), np.float32(0.0)
            for b in range(k // 256):
                db = np.float32(d[b] * yd[t, b])
                q = yq[t, 256 * b:256 * b + 256].astype(np.int64).reshape(8, 2, 4, 4)  # group, half, lane, byte
                scl = sc[16 * b:16 * b + 16].reshape(8, 2, 1, 1)
                lanes = (scl * v[256 * b:256 * b + 256].reshape(8, 2, 4, 4) * q).sum(axis=(0, 3)).reshape(8)
                lanes2 = (scl * e[256 * b:256 * b + 256].reshape(8, 2, 4, 4) * q).sum(axis=(0, 3)).reshape(8)
                acc = np.array([fma32(db, np.float32(i), a) for i, a in zip(lanes, acc)], np.float32)
                acc2 = np.array([fma32(db, np.float32(i), a) for i, a in zip(lanes2, acc2)], np.float32)
                acc1 = fma32(db, np.float32(lanes2.sum()), acc1)
            right = fma32(hsum_fold(acc2, 0, 8), np.float32(0.125), hsum_fold(acc, 0, 8))
            assert bits(right) == bits(got[t, r])
            wrong[t, r] = hsum_fold(acc, 0, 8) + np.float32(acc1 * np.float32(0.125))
    assert (bits(wrong) != bits(got)).any()


# ---- mul_mat_id --------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", IQ, ids=[q.name for q in IQ])
@pytest.mark.parametrize("build", BUILDS)
def test_iq_mul_mat_id_bit_exact(build, qtype):
    path = build_info(build).path
    rng = np.random.default_rng([2722, int(qtype)])
    E, N, K, T, n_used = 4, 16, 256, 12, 3
    w = np.stack([weight_bytes(qtype, N, K, rng) for _ in range(E)])
    ids = np.stack([rng.permutation(E)[:n_used] for _ in range(T)]).astype(np.int32)
    ids[:, 0] = 0  # expert 0 gets all 12 tokens: tiled (>= 8 rows); the others get fewer: vec_dot
    ids[:3, 1] = 3
    for n_x in (1, n_used):
        x = acts(rng, T * n_x, K).reshape(T, n_x, K)
        for nth in (1, 2):
            got = on_build(build, g_mul_mat_id, w, int(qtype), K, x, ids, nth)
            want = mul_mat_id(w, qtype, x, ids, path)
            assert np.array_equal(bits(got), bits(want)), (qtype.name, n_x, nth)
    # wrong model: expert 0's 12 rows through vec_dot (the grouping decides the kernel)
    rows = x[ids == 0]
    assert (bits(mul_mat_iq(w[0], qtype, rows, path, tiled=False)) != bits(got[ids == 0])).any()


# ---- get_rows ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", IQ, ids=[q.name for q in IQ])
@pytest.mark.parametrize("build", BUILDS)
def test_iq_get_rows_bit_exact(build, qtype):
    rng = np.random.default_rng([2723, int(qtype)])
    n_cols = 512
    table = np.concatenate([weight_bytes(qtype, 48, n_cols, rng, "raw"), weight_bytes(qtype, 16, n_cols, rng),
                            weight_bytes(qtype, 16, n_cols, rng, "extreme")])
    ids = rng.integers(0, table.shape[0], 200).astype(np.int32)
    got = on_build(build, g_get_rows, table, int(qtype), n_cols, ids, 2)
    assert np.array_equal(bits(got), bits(get_rows(table, qtype, ids)))
    assert np.array_equal(bits(got), bits(on_build(other_build(build), g_get_rows, table, int(qtype), n_cols, ids)))
    # kernels.plain.dequant agrees except for NaN payloads (its f16 conversion canonicalises NaNs)
    plain = dequantize(table[ids], qtype)
    differ = bits(plain) != bits(got)
    assert differ.any() and np.isnan(got[differ]).all()


def test_iq_types():
    assert IQ_TYPES == frozenset(IQ)
    with pytest.raises(ValueError):
        mul_mat_iq(np.zeros((1, 144), np.uint8), QT.Q4_K, np.zeros((1, 256), np.float32), "avx2", False)
