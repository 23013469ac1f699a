"""kernels.ggml.repack (Q4_0 / IQ4_NL / MXFP4 weights in the CPU_REPACK buffer) bit for bit against both
libggml builds.

The weight goes into the ``CPU_REPACK`` buffer (``Graph.repacked``: it raises unless the build repacks it),
so ``ggml_mul_mat`` runs ``repack.cpp: forward_mul_mat`` — gemm (16×16 AVX-512 tiles, 4-row tiles, AVX2
code) on ``T - T % 4`` rows, gemv on the rest — and ``ggml_mul_mat_id`` runs ``forward_mul_mat_id`` (gemv).
Every test can fail in a known way:

* the same weights in a plain buffer give other bits (the repack path really ran — one accumulator per
  output, not vec_dot's lanes), and for MXFP4 ``kernels.ggml.mulmat.mul_mat`` matches that plain run;
* fma → mul + add, and the gemv sign trick → the exact dot, give other bits;
* a NaN that ``_mm256_max_ps`` skips quantizes to -128: the gemm rows count it exactly, the gemv rows wrap.

The two builds agree (the float formula has no lanes: module docstring of :mod:`kernels.ggml.repack`).
"""

import numpy as np
import pytest
from ggml_graph import BUILDS, Graph, both_paths, build_info, on_build, vp
from gguf import GGMLQuantizationType as QT

from kernels.ggml.actquant import _q8_0_rows
from kernels.ggml.mulmat import mul_mat, mul_mat_id
from kernels.ggml.repack import _TYPES, REPACK_Q4_B32, mul_mat_id_repacked, mul_mat_repacked
from kernels.testing import random_rows

pytestmark = pytest.mark.oracle

TYPES = (QT.Q4_0, QT.IQ4_NL, QT.MXFP4)
T_ALL = (1, 2, 3, 4, 5, 7, 8, 16, 17, 20, 33)  # gemv only, gemm + 1..3 gemv rows, 16-row tiles and their tails


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# ---- graph functions (module level: they run in the other build's worker process too) -----------------


def g_mul_mats(cases, repack=True):
    """[(w (N, row bytes), ggml type, K, x (T, K), n_threads)] -> [ggml_mul_mat(W, x) (T, N)], ``W`` in the
    CPU_REPACK buffer (``repack``) or a plain tensor."""
    out = []
    for w, gtype, K, x, n_threads in cases:
        with Graph(mem=w.nbytes + x.nbytes + 4 * w.shape[0] * x.shape[0] + (4 << 20)) as g:
            wt = g.repacked(w, gtype, (K, w.shape[0])) if repack else g.tensor(w, gtype, (K, w.shape[0]))
            y = g.op("ggml_mul_mat", [vp, vp], wt, g.tensor(x))
            out.append(g.compute(y, (x.shape[0], w.shape[0]), n_threads=n_threads))
    return out


def g_mul_mat_ids(cases, repack=True):
    """[(w (E, N, row bytes), ggml type, K, x (T, n_x, K), ids (T, n_used), n_threads)] -> [(T, n_used, N)]."""
    out = []
    for w, gtype, K, x, ids, n_threads in cases:
        (E, N), (T, _, _), n_used = w.shape[:2], x.shape, ids.shape[1]
        with Graph(mem=w.nbytes + x.nbytes + 4 * N * T * n_used + (4 << 20)) as g:
            wt = g.repacked(w, gtype, (K, N, E)) if repack else g.tensor(w, gtype, (K, N, E))
            y = g.op("ggml_mul_mat_id", [vp, vp, vp], wt, g.tensor(x), g.tensor(ids))
            out.append(g.compute(y, (T, n_used, N), n_threads=n_threads))
    return out


# ---- inputs ------------------------------------------------------------------------------------------


def weight_bytes(qtype, n, k, rng, scales="normal"):
    return np.ascontiguousarray(random_rows(qtype, n, k, rng, scales)).view(np.uint8).reshape(n, -1)


def acts(rng, t, k):
    """Activations over a few binades; special rows when there is room: zeros, -0.0, exact .5 ties of
    x·127/amax, values one ulp either side of a rounding boundary, a block skipping a NaN (-> -128), huge
    (fp16 d = inf) and tiny (127/amax = inf) blocks, an inf."""
    x = (rng.standard_normal((t, k)) * np.float32(2.0) ** rng.integers(-6, 6, (t, k))).astype(np.float32)
    special = [None] * 9
    special[1] = lambda r: r.fill(0.0)
    special[2] = lambda r: r.__setitem__(slice(0, None, 2), -0.0)

    def ties(r):  # amax = 127: id = 1, every value a .5 tie (half to even)
        r[:32] = np.arange(32, dtype=np.float32) - np.float32(15.5)
        r[31] = 127.0

    def near(r):  # amax = 1, id = 127: x·id lands on or one ulp beside j + 0.5 (x = (j + 0.5)/127 ± 1 ulp)
        v = ((np.arange(32) % 31 + 0.5) / 127).astype(np.float32)
        step = np.arange(32) % 3 - 1  # -1, 0, +1 ulp
        r[:32] = np.where(step < 0, np.nextafter(v, np.float32(0)),
                          np.where(step > 0, np.nextafter(v, np.float32(1)), v))
        r[:32:4] *= -1
        r[31] = -1.0

    def nan_skipped(r):  # lane 0 of a block's first vector: _mm256_max_ps skips it, d finite, q = -128
        r[0] = np.nan
        r[32 % len(r)] = np.nan

    def big_small(r):
        r[:32] *= np.float32(2.0**100)  # amax/127 > 65504: fp16 d = inf
        if len(r) > 32:
            r[32:64] *= np.float32(2.0**-130)  # amax < 127/FLT_MAX: id = inf, all -128 with d = 0

    special[3], special[4], special[5], special[6] = ties, near, nan_skipped, big_small
    special[8] = lambda r: r.__setitem__(len(r) - 3, np.inf)  # d = inf, id = 0: inf·0 -> -128
    for i in range(1, min(t, 9)):
        if special[i] is not None:
            special[i](x[i])
    return x


def positive(w, qtype, rng):
    """Rows ``w`` with every weight value positive (nibbles 9…15; MXFP4: 1…7)."""
    hdr = _TYPES[qtype][1]
    lo = 1 if qtype == QT.MXFP4 else 9
    qs = w.reshape(w.shape[0], -1, hdr + 16)[:, :, hdr:]
    nib = rng.integers(lo, lo + 7, qs.shape + (2,))
    qs[...] = (nib[..., 0] | (nib[..., 1] << 4)).astype(np.uint8)
    return w


def unfused(w, qtype, x):
    """A wrong model: the repacked formula with ``acc + float(dot)·d`` rounded twice (no fma)."""
    lut, hdr, tab = _TYPES[qtype]
    N, T, nb = w.shape[0], x.shape[0], x.shape[1] // 32
    blocks = w.reshape(N, nb, hdr + 16).astype(np.int64)
    dw = tab[blocks[:, :, 0] | (blocks[:, :, 1] << 8)] if hdr == 2 else tab[blocks[:, :, 0]]  # (N, nb)
    qs = blocks[:, :, hdr:]
    wv = np.concatenate([lut[qs & 15], lut[qs >> 4]], axis=2)  # (N, nb, 32)
    xq, xd, _ = _q8_0_rows(x, False)
    dots = np.einsum("tbj,nbj->tnb", xq.reshape(T, nb, 32).astype(np.int64), wv)  # (T, N, nb) exact
    acc = np.zeros((T, N), np.float32)
    with np.errstate(all="ignore"):
        for b in range(nb):
            acc = acc + dots[:, :, b].astype(np.float32) * (dw[None, :, b] * xd[:, None, b])
    return acc


# ---- ggml_mul_mat ------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", TYPES, ids=[q.name for q in TYPES])
@pytest.mark.parametrize("build", BUILDS)
def test_mul_mat_bit_exact(build, qtype):
    """Every shape class (gemv only, gemm + gemv tail, 16×16 tiles + 4-row tiles + AVX2 columns), threads 1/2."""
    path = build_info(build).path
    rng = np.random.default_rng([2720, int(qtype)])
    cases = []
    for i, (n, k) in enumerate(((8, 32), (24, 256), (32, 64), (48, 256))):  # N % 16 != 0: the AVX2 column tail
        w = weight_bytes(qtype, n, k, rng, "extreme" if i == 3 else "normal")
        for t in T_ALL:
            for nth in (1, 2):
                cases.append((w, int(qtype), k, acts(rng, t, k), nth))
    x = acts(rng, 9, 32)
    cases.append((weight_bytes(qtype, 16, 32, rng, "raw"), int(qtype), 32, x, 2))  # one block: raw scales (NaN, inf)
    cases.append((weight_bytes(qtype, 64, 64, rng), int(qtype), 64, acts(rng, 20, 64), 2))  # 4 column tiles of 16
    # for the wrong models: positive values (large same-sign block dots: float(dot)·d is inexact even for MXFP4's
    # power-of-two scales), 16 gemm rows / 1 gemv row
    w_chk = positive(weight_bytes(qtype, 32, 256, rng), qtype, rng)
    x_chk = rng.uniform(0.5, 1.0, (16, 256)).astype(np.float32)
    chk = [(w_chk, int(qtype), 256, x_chk, 1), (w_chk, int(qtype), 256, x_chk[:1].copy(), 2)]
    got = on_build(build, g_mul_mats, cases + chk)
    for (w, _, k, x, nth), y in zip(cases + chk, got):
        want = mul_mat_repacked(w, qtype, x, path)
        bad = bits(y) != bits(want)
        assert not bad.any(), (w.shape, x.shape, nth, np.argwhere(bad)[:4])
    y16, y1 = got[-2:]
    # the repack path ran: the same weights in a plain buffer (vec_dot: 8 lanes, hsum) give other bits
    plain = on_build(build, g_mul_mats, chk, False)
    assert (bits(plain[0]) != bits(y16)).any() and (bits(plain[1]) != bits(y1)).any()
    if qtype == QT.MXFP4:  # ... and those are kernels.ggml.mulmat's
        assert all(np.array_equal(bits(p), bits(mul_mat(w, qtype, x, path))) for p, (w, _, _, x, _) in zip(plain, chk))
    # the fma matters: acc + float(dot)·d rounded twice gives other bits
    assert (bits(unfused(w_chk, qtype, x_chk)) != bits(y16)).any()


NEG_NIBBLE = {QT.Q4_0: 0, QT.IQ4_NL: 0, QT.MXFP4: 15}  # a negative weight value: -8, -127, -12


def negative_first(w, qtype):
    """Value 0 of every row's first block made negative (the low nibble of its first quant byte)."""
    hdr = _TYPES[qtype][1]
    w[..., hdr] = (w[..., hdr] & 0xF0) | NEG_NIBBLE[qtype]
    return w


@pytest.mark.parametrize("build", BUILDS)
def test_nan_skipped_gemm_vs_gemv(build):
    """A NaN that ``_mm256_max_ps`` skips quantizes to -128 with a finite d: against a negative weight value the
    gemm rows count +128·|w| and the gemv row (sign trick) -128·|w|; an inf (d = inf, inf·0 -> -128) then gives
    infinities of opposite signs."""
    path = build_info(build).path
    rng = np.random.default_rng(2721)
    cases = []
    for qtype in TYPES:
        w = negative_first(weight_bytes(qtype, 8, 64, rng), qtype)
        for special in (0, 1):
            row = rng.standard_normal(64).astype(np.float32)
            row[0] = np.nan
            if special:
                row[0] = np.inf  # block 0: d = inf, id = 0
            cases.append((w, int(qtype), 64, np.repeat(row[None], 5, axis=0), 1))  # rows 0-3 gemm, row 4 gemv
    got = on_build(build, g_mul_mats, cases)
    for (w, gtype, _, x, _), y in zip(cases, got):
        qtype = QT(gtype)
        assert np.array_equal(bits(y), bits(mul_mat_repacked(w, qtype, x, path)))
        assert np.array_equal(bits(y[:4]), bits(np.repeat(y[:1], 4, axis=0)))  # the four gemm rows agree
        assert (bits(y[0]) != bits(y[4])).all()  # every column: w[r, 0] < 0
        # the wrong models: all gemv (T = 1 per row) or all gemm give the other row's bits
        assert np.array_equal(bits(mul_mat_repacked(w, qtype, x[:1], path)), bits(y[4:]))
        assert np.array_equal(bits(mul_mat_repacked(w, qtype, x[:4], path)[:1]), bits(y[:1]))


@pytest.mark.parametrize("qtype", TYPES, ids=[q.name for q in TYPES])
@pytest.mark.parametrize("build", BUILDS)
def test_mul_mat_id_bit_exact(build, qtype):
    path = build_info(build).path
    rng = np.random.default_rng([2722, int(qtype)])
    E, n_used = 4, 2
    cases = []
    for N, K, T in ((8, 32, 1), (24, 64, 5), (16, 256, 9)):
        w = negative_first(np.stack([weight_bytes(qtype, N, K, rng) for _ in range(E)]), qtype)
        # distinct experts per token (as top-k routes; ggml's per-expert row lists hold at most T rows):
        # expert 0 gets every token's slot 0
        ids = np.stack([np.r_[0, 1 + rng.permutation(E - 1)[:n_used - 1]] for _ in range(T)]).astype(np.int32)
        for n_x in (1, n_used):  # one activation row shared by all slots (gate/up) or one per slot (down)
            x = acts(rng, T * n_x, K).reshape(T, n_x, K)
            for nth in (1, 2):
                cases.append((w, int(qtype), K, x, ids, nth))
    got = on_build(build, g_mul_mat_ids, cases)
    for (w, _, K, x, ids, nth), y in zip(cases, got):
        want = mul_mat_id_repacked(w, qtype, x, ids, path)
        assert np.array_equal(bits(y), bits(want)), (w.shape, x.shape, nth, np.argwhere(bits(y) != bits(want))[:4])
    # always the gemv: the gemm on expert 0's 9 rows counts the skipped NaN of row 5 (-> -128) exactly
    w, _, K, x, ids, _ = cases[-4]  # n_x = 1: x[:, 0] are acts()'s rows
    assert (bits(mul_mat_repacked(w[0], qtype, x[:, 0], path)[5]) != bits(got[-4][5, 0])).any()
    # the repack path ran: a plain buffer (vec_dot) gives other bits; for MXFP4 those of kernels.ggml.mulmat
    plain = on_build(build, g_mul_mat_ids, cases[-2:], False)
    assert any((bits(p) != bits(y)).any() for p, y in zip(plain, got[-2:]))
    if qtype == QT.MXFP4:
        for p, (w, _, _, x, ids, _) in zip(plain, cases[-2:]):
            assert np.array_equal(bits(p), bits(mul_mat_id(w, qtype, x, ids, path)))


def test_builds_agree():
    """The float formula has no lanes: the AVX-512 and AVX2 libraries give the same bits (and the emulation
    ignores ``path``)."""
    rng = np.random.default_rng(2723)
    cases = []
    for qtype in TYPES:
        w = weight_bytes(qtype, 48, 256, rng, "extreme")
        for t in (3, 17, 33):
            cases.append((w, int(qtype), 256, acts(rng, t, 256), 2))
    a, b = (on_build(build, g_mul_mats, cases) for build in BUILDS)
    assert all(np.array_equal(bits(p), bits(q)) for p, q in zip(a, b))
    for w, gtype, _, x, _ in cases:
        y512, y2 = (mul_mat_repacked(w, gtype, x, path) for path in ("avx512", "avx2"))
        assert np.array_equal(bits(y512), bits(y2))
    assert REPACK_Q4_B32 == frozenset(TYPES)
    if not both_paths():  # pragma: no cover - depends on the machine
        pytest.skip("one ggml-cpu path on this host: the two libraries are both AVX2")
