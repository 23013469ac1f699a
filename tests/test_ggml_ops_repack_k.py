"""kernels.ggml.repack_k (Q4_K / Q2_K in the CPU_REPACK buffer: gemm / gemv, quantize_mat_q8_K_4x8) bit for bit.

The weight goes into libggml's CPU_REPACK buffer (``Graph.repacked``, which raises if the build would not
repack it), so ggml_mul_mat / ggml_mul_mat_id run ``ggml_gemm_{q4,q2}_K_8x8_q8_K`` (the first ``T - T % 4``
rows) and ``ggml_gemv_{q4,q2}_K_8x8_q8_K`` (the rest; every routed row of mul_mat_id). Every test also checks
that plausible wrong models differ from libggml on its cases: ggml-cpu's non-repacked kernels
(:func:`kernels.ggml.mulmat.mul_mat` — so the repack path was taken), and the gemv formula on gemm rows.
Q2_K is repacked only by AVX-512 builds: on the AVX2 one the test checks that libggml declines it.
"""

import numpy as np
import pytest
from ggml_graph import BUILDS, Graph, build_info, on_build, vp
from gguf import GGMLQuantizationType as QT

from kernels.ggml import mulmat_k, repack_k
from kernels.ggml.actquant import _q8_k_rows
from kernels.ggml.mulmat import mul_mat, mul_mat_id, repacked
from kernels.ggml.repack_k import mul_mat_id_repacked_k, mul_mat_repacked_k, quantize_q8_k_4x8
from kernels.ggml.vecmath import F16_TO_F32
from kernels.testing import random_rows

pytestmark = pytest.mark.oracle

KQ = (QT.Q4_K, QT.Q2_K)


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# ---- graph functions (module level: they run in the other build's worker process too) -----------------


def g_repacked_mul_mats(cases):
    """[(w_bytes (N, row bytes), ggml type, K, x (T, K), n_threads)] -> [ggml_mul_mat(W repacked, x) (T, N)]."""
    out = []
    for w, gtype, K, x, n_threads in cases:
        with Graph(mem=x.nbytes * 2 + 4 * w.shape[0] * x.shape[0] + (8 << 20)) as g:
            y = g.op("ggml_mul_mat", [vp, vp], g.repacked(w, gtype, (K, w.shape[0])), g.tensor(x))
            out.append(g.compute(y, (x.shape[0], w.shape[0]), n_threads=n_threads))
    return out


def g_repacked_mul_mat_ids(cases):
    """[(w (E, N, row bytes), ggml type, K, x (T, n_x, K), ids (T, n_used), n_threads)] -> [(T, n_used, N)]."""
    out = []
    for w, gtype, K, x, ids, n_threads in cases:
        (E, N), (T, _, _), n_used = w.shape[:2], x.shape, ids.shape[1]
        with Graph(mem=x.nbytes * 2 + 4 * N * T * n_used + (8 << 20)) as g:
            wt = g.repacked(w, gtype, (K, N, E))
            y = g.op("ggml_mul_mat_id", [vp, vp, vp], wt, g.tensor(x), g.tensor(ids))
            out.append(g.compute(y, (T, n_used, N), n_threads=n_threads))
    return out


# ---- inputs ------------------------------------------------------------------------------------------


def weight_bytes(n, k, rng, scales="normal", qtype=QT.Q4_K):
    return np.ascontiguousarray(random_rows(qtype, n, k, rng, scales)).view(np.uint8).reshape(n, -1)


def g_repacks(gtype, ne):
    """Whether this build's CPU_REPACK buffer takes a weight of ``gtype`` and shape ``ne``."""
    with Graph(mem=1 << 20) as g:
        try:
            g.repacked(np.zeros(ne[0] // 256 * repack_k.BLOCK_BYTES[QT(gtype)] * ne[1], np.uint8), gtype, ne)
        except ValueError:
            return False
    return True


def acts(rng, t, k):
    """Activations over a few binades, plus (when there is room) the hard rows: zero, -0.0, round-half ties
    (amax = 127, so iscale = ∓1 and x·iscale lands on .5), a -amax before a +amax (ref's sign choice and
    quantize_mat_q8_K_4x8's differ: negated q, d, bsums), values just off the ties, huge and tiny scales
    (amax < 127/FLT_MAX: iscale overflows)."""
    x = (rng.standard_normal((t, k)) * np.float32(2.0) ** rng.integers(-6, 6, (t, k))).astype(np.float32)
    hard = []
    ties = (rng.integers(-127, 127, k) + np.float32(0.5)).astype(np.float32)
    ties[100::256] = 127.0  # amax = 127 in every block
    hard.append(ties)
    pm = x[0].copy()
    big = np.float32(2 * np.abs(pm).max() + 1)
    pm[3::256], pm[200::256] = -big, big  # -amax first, +amax later, in every block
    hard.append(pm)
    hard.append(np.zeros(k, np.float32))
    near = ties.copy()
    near[::3] = np.nextafter(near[::3], np.float32(np.inf))
    near[1::3] = np.nextafter(near[1::3], np.float32(-np.inf))
    hard.append(near)
    hard.append((x[-1] * np.float32(2.0**100)).astype(np.float32))
    hard.append((x[-1] * np.float32(2.0**-135)).astype(np.float32))  # subnormals: 127/amax = inf
    neg = ties.copy()
    neg[::256] = -127.0  # -amax first, +amax later
    hard.append(neg)
    mz = np.full(k, -0.0, np.float32)
    mz[::7] = 1e-3
    hard.append(mz)
    for i, h in enumerate(hard[: t - 1]):
        x[(2 * i + 1) % t] = h
    return x


T_ALL = (1, 2, 3, 4, 5, 7, 8, 16, 17, 20, 33)


def check_mul_mat(build, cases):
    path = build_info(build).path
    got = on_build(build, g_repacked_mul_mats, cases)
    for (w, gtype, K, x, nth), y in zip(cases, got):
        want = mul_mat_repacked_k(w, QT(gtype), x, path)
        bad = bits(y) != bits(want)
        assert not bad.any(), (w.shape, x.shape, nth, np.argwhere(bad)[:4])
    return got


def ref_quant_model(w, qtype, x, gemm=False):
    """Wrong models: quantize_row_q8_K_ref on every row (not ggml_quantize_mat_q8_K_4x8 on the gemm rows), and
    the gemv formula (one FMA per super-block) everywhere unless ``gemm``."""
    yq, yd, bs = _q8_k_rows(np.ascontiguousarray(x))
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    rows = np.arange(len(x)) < (len(x) - len(x) % 4 if gemm else 0)
    repack_k.repacked_k_rows(repack_k.KIND[qtype], w, yq, yd, repack_k._sub_sums(bs, qtype), rows, out, F16_TO_F32)
    return out


def skip_unless_repacked(build, qtype):
    """Q2_K on a build without AVX-512: check that libggml declines to repack it (as emulated), then skip."""
    path = build_info(build).path
    assert on_build(build, g_repacks, int(qtype), (256, 8)) == repacked(qtype, 8, path)
    if path not in repack_k.REPACK_K_PATHS[qtype]:
        assert not repacked(qtype, 8, path)
        with pytest.raises(ValueError):
            mul_mat_repacked_k(weight_bytes(8, 256, np.random.default_rng(0), qtype=qtype), qtype,
                               np.ones((1, 256), np.float32), path)
        pytest.skip(f"llama.cpp repacks {qtype.name} only on AVX-512 builds (checked that this one declines)")
    return path


# ---- mul_mat ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", KQ, ids=[q.name for q in KQ])
@pytest.mark.parametrize("build", BUILDS)
def test_repacked_mul_mat_bit_exact(build, qtype):
    path = skip_unless_repacked(build, qtype)
    rng = np.random.default_rng([4100, int(qtype)])
    gt, bb = int(qtype), repack_k.BLOCK_BYTES[qtype]
    cases = []
    for n, k in ((8, 256), (24, 512), (32, 256), (48, 512)):
        w = weight_bytes(n, k, rng, qtype=qtype)
        for t in T_ALL:
            for nth in (1, 2):
                cases.append((w, gt, k, acts(rng, t, k), nth))
    for n, k in ((16, 256), (32, 512)):  # extreme fp16 d / dmin (0, ±subnormal, ±65504)
        w = weight_bytes(n, k, rng, "extreme", qtype)
        for t in (3, 8, 17):
            cases.append((w, gt, k, acts(rng, t, k), 2))
    w = weight_bytes(48, 256, rng, qtype=qtype)
    blocks = w.reshape(48, -1, bb)
    if qtype == QT.Q4_K:
        blocks[:, :, 4:] = 0xFF  # every scale and min 63, every quant 15: the largest int16 lane sums
    else:
        blocks[:, :, :80] = 0xFF  # scales and mins 15, quants 3
    x = np.full((9, 256), 127.0, np.float32)
    x[1::2] *= -1
    cases.append((w, gt, 256, x, 2))
    # non-finite activations: quantize_mat_q8_K_4x8 makes NaN / ±inf products -128 (ref: nearest_int's bits)
    x = acts(rng, 8, 256)
    x[0, 5], x[2, 9], x[5, 3] = np.inf, np.nan, -np.inf
    x[6] = 0.0
    x[6, 7], x[6, 100] = np.inf, 1.0
    cases += [(weight_bytes(16, 256, rng, s, qtype), gt, 256, x, 1) for s in ("normal", "raw")]
    got = check_mul_mat(build, cases)
    for c, y in zip(cases[-2:], got[-2:]):  # ... so quantize_row_q8_K_ref on the gemm rows differs
        assert (bits(ref_quant_model(c[0], qtype, c[3], gemm=True)) != bits(y)).any()
    # wrong models differ: ggml-cpu's non-repacked kernels (vec_dot / tiled); the gemv formula on gemm rows
    if qtype in mulmat_k.KQUANT_TYPES:
        assert all((bits(mul_mat(c[0], qtype, c[3], path)) != bits(y)).any()
                   for c, y in zip(cases, got) if c[3].shape[0] == 33)
    assert all((bits(ref_quant_model(c[0], qtype, c[3])) != bits(y)).any()
               for c, y in zip(cases[:-2], got[:-2]) if len(c[3]) >= 16)
    assert all((bits(ref_quant_model(c[0], qtype, c[3])) == bits(y)).all() for c, y in zip(cases, got) if len(c[3]) < 4)


def test_quantize_mat_q8_k_4x8_sign_choice():
    """quantize_mat_q8_K_4x8 picks iscale = -127/amax whenever +amax occurs; ref takes the first |x| = amax.
    With -amax first the quants, d and bsums are negated (and every output bit is the same: the rows of
    ``acts`` with this pattern are in the bit-exact test above)."""
    x = np.linspace(-3, 3, 512, dtype=np.float32).reshape(2, 256)
    x[0, 0], x[0, 200] = -4.0, 4.0
    (q, d, b), (qr, dr, br) = quantize_q8_k_4x8(x), _q8_k_rows(x)
    assert np.array_equal(q[0], -qr[0]) and d[0, 0] == -dr[0, 0] and np.array_equal(b[0], -br[0])
    assert np.array_equal(q[1], qr[1]) and d[1, 0] == dr[1, 0] and np.array_equal(b[1], br[1])
    assert (q[0] != qr[0]).any()


# ---- mul_mat_id -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", KQ, ids=[q.name for q in KQ])
@pytest.mark.parametrize("build", BUILDS)
def test_repacked_mul_mat_id_bit_exact(build, qtype):
    path = skip_unless_repacked(build, qtype)
    rng = np.random.default_rng([4101, int(qtype)])
    E, n_used = 4, 3
    cases = []
    for (N, K, T) in ((8, 256, 1), (24, 512, 5), (32, 256, 12), (48, 512, 20)):
        w = np.stack([weight_bytes(N, K, rng, "extreme" if T == 5 else "normal", qtype) for _ in range(E)])
        # distinct experts per token (as top-k routes; a repeated one overflows ggml's per-expert row lists),
        # expert 0 in every token (>= 8 rows: ggml's own mul_mat_id would tile them)
        ids = np.array([[0, *[e for e in rng.permutation(E) if e][: n_used - 1]] for _ in range(T)], np.int32)
        for n_x in (1, n_used):
            x = acts(rng, T * n_x, K).reshape(T, n_x, K)
            for nth in (1, 2):
                cases.append((w, int(qtype), K, x, ids, nth))
    got = on_build(build, g_repacked_mul_mat_ids, cases)
    for (w, _, K, x, ids, nth), y in zip(cases, got):
        want = mul_mat_id_repacked_k(w, qtype, x, ids, path)
        assert np.array_equal(bits(y), bits(want)), (w.shape, x.shape, nth, np.argwhere(bits(y) != bits(want))[:4])
    if qtype in mulmat_k.KQUANT_TYPES:  # ggml-cpu's own mul_mat_id (tiled for the 12- and 20-row expert 0) differs
        assert any((bits(mul_mat_id(c[0], qtype, c[3], c[4], path)) != bits(y)).any() for c, y in zip(cases, got))
    # mul_mat_id takes the gemv even for an expert with >= 4 rows: mul_mat's gemm on expert 0's rows differs
    assert any((bits(mul_mat_repacked_k(c[0][0], qtype, c[3][:, 0], path)) != bits(y[:, 0])).any()
               for c, y in zip(cases, got))


def test_repacked_threads():
    """The (expert group, 64 weight rows) items of the gemv / gemm split between 1, 2 or 3 threads (above
    SERIAL_BELOW; 136 rows: 3 items, the last partial): the same bits as the serial kernel (the one the cases
    above prove against libggml), for mul_mat_id and for mul_mat (gemm and gemv rows)."""
    import numba

    from kernels.ggml.mulmat_q8 import slot_groups

    rng = np.random.default_rng(4102)
    E, N, K, T = 3, 136, 1024, 3
    ids = np.array([[0, 1], [2, 1], [1, 0]], np.int32)
    before = numba.get_num_threads()
    try:
        for qtype in KQ:
            kind = repack_k.KIND[qtype]
            w = np.stack([weight_bytes(N, K, rng, "normal", qtype) for _ in range(E)])
            x = acts(rng, T, K)
            yq, yd, ys = repack_k._q8_k_gemv_inputs(kind, x)
            order, bounds, experts, arow = slot_groups(ids, 1)
            want = np.empty((T * 2, N), np.float32)
            repack_k.repacked_k_id_serial(kind, w, yq, yd, ys, np.zeros(T, np.bool_), arow, order, bounds, experts,
                                          want, F16_TO_F32)
            x5 = acts(rng, 5, K)  # mul_mat: 4 gemm rows, 1 gemv row
            yq, yd, bs = repack_k.q8_k_mat_inputs(x5, 4)
            rows = np.arange(5)
            dense = np.empty((5, N), np.float32)
            repack_k.repacked_k_id_serial(kind, w[:1], yq, yd, repack_k._sub_sums(bs, qtype), rows < 4, rows, rows,
                                          np.array([0, 5]), np.zeros(1, np.int64), dense, F16_TO_F32)
            for nth in (1, 2, 3):
                numba.set_num_threads(min(nth, numba.config.NUMBA_NUM_THREADS))
                got = mul_mat_id_repacked_k(w, qtype, x[:, None], ids, "avx512")
                assert np.array_equal(bits(got), bits(want.reshape(T, 2, N))), (qtype.name, nth)
                assert np.array_equal(bits(mul_mat_repacked_k(w[0], qtype, x5, "avx512")), bits(dense)), qtype.name
    finally:
        numba.set_num_threads(before)


def test_repack_k_rejects():
    rng = np.random.default_rng(1)
    x = np.ones((2, 256), np.float32)
    with pytest.raises(ValueError):
        mul_mat_repacked_k(weight_bytes(12, 256, rng), QT.Q4_K, x, "avx2")  # N % 8 != 0: not repacked
    with pytest.raises(ValueError):
        mul_mat_repacked_k(weight_bytes(8, 256, rng), QT.Q5_K, x, "avx2")
