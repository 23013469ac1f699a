"""kernels.ggml.repack_arm (Q8_0 / Q4_0 / IQ4_NL / MXFP4; the K-quants of kernels.ggml.repack_arm_k in
tests/test_ggml_ops_repack_arm64_k.py, which shares this module's inputs) in the CPU_REPACK buffer on AArch64, bit
for bit against the GCC ARM builds under qemu (``arm64-dotprod-gcc``: 4x4 and 8x4
kernels, ``arm64-i8mm-gcc``: 4x8 for Q8_0 and Q4_0, 8x8 for the K-quants).

The weight goes into the ``CPU_REPACK`` buffer (``Graph.repacked`` raises unless the build repacks it), so
``ggml_mul_mat`` runs ``forward_mul_mat`` (gemm on ``T - T % 4`` rows, gemv on the rest) and ``ggml_mul_mat_id``
``forward_mul_mat_id`` (gemv). Every test can fail in a known way: fused <-> unfused float step (Q8_0's dotprod
gemm is unfused, its gemv fused: the rows of one call differ), the x86 activation quantizer in place of ARM's
(NaN and tie handling), and a plain buffer (the repack path really ran); ``arm64-base-gcc`` repacks nothing and
``arm64-sve128-gcc`` gives the i8mm bits. Skipped without the ARM builds. Cost: ~50 s on 2 shared vCPUs with warm
numba caches, most of it starting the four qemu workers (one per build, ~7-14 s each, shared with other modules in
one process).
"""

import numpy as np
import pytest
from ggml_graph import Graph, on_build, vp
from gguf import GGMLQuantizationType as QT

from kernels.ggml import repack_arm
from kernels.ggml.repack_arm import (
    FUSED,
    REPACK_ARM_B32,
    mul_mat_id_repacked_arm,
    mul_mat_repacked_arm,
    quantize_q8_0_arm,
    repacked_arm,
)
from kernels.testing import random_rows

pytestmark = pytest.mark.oracle

ARM = {"arm64-dotprod-gcc": "arm64-dotprod", "arm64-i8mm-gcc": "arm64-i8mm", "arm64-i8mm-clang": "arm64-i8mm-clang",
       "arm64-dotprod-clang": "arm64-dotprod-clang"}
#: the builds the tests run on (the clang build's cases: pytest -m deep)
ARM_BUILDS = [pytest.param(b, marks=pytest.mark.deep) if "clang" in b else b for b in ARM]
TYPES = (QT.Q8_0, QT.Q4_0, QT.IQ4_NL, QT.MXFP4)


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _require(build):
    import arm64

    arm64.require(build)  # skips (fails under CI=true) without the build


# ---- graph functions (module level: sent by value to the aarch64 worker) ------------------------------


def g_mul_mats(cases, repack=True):
    """[(w (N, row bytes), ggml type, K, x (T, K), n_threads)] -> [ggml_mul_mat(W, x) (T, N)]."""
    out = []
    for w, gtype, K, x, n_threads in cases:
        with Graph(mem=w.nbytes + x.nbytes + 4 * w.shape[0] * x.shape[0] + (4 << 20)) as g:
            wt = g.repacked(w, gtype, (K, w.shape[0])) if repack else g.tensor(w, gtype, (K, w.shape[0]))
            y = g.op("ggml_mul_mat", [vp, vp], wt, g.tensor(x))
            out.append(g.compute(y, (x.shape[0], w.shape[0]), n_threads=n_threads))
    return out


def g_mul_mat_ids(cases):
    """[(w (E, N, row bytes), ggml type, K, x (T, n_x, K), ids (T, n_used), n_threads)] -> [(T, n_used, N)]."""
    out = []
    for w, gtype, K, x, ids, n_threads in cases:
        (E, N), (T, _, _), n_used = w.shape[:2], x.shape, ids.shape[1]
        with Graph(mem=w.nbytes + x.nbytes + 4 * N * T * n_used + (4 << 20)) as g:
            y = g.op("ggml_mul_mat_id", [vp, vp, vp], g.repacked(w, gtype, (K, N, E)), g.tensor(x), g.tensor(ids))
            out.append(g.compute(y, (T, n_used, N), n_threads=n_threads))
    return out


def g_repacks(gtype, shapes, row_bytes):
    """[whether this build's CPU_REPACK buffer takes a (K, N) weight of ``gtype``] for each (K, N); ``row_bytes``
    of a row of K values."""
    out = []
    for K, N in shapes:
        with Graph(mem=1 << 22) as g:
            try:
                g.repacked(np.zeros((N, row_bytes), np.uint8), gtype, (K, N))
                out.append(True)
            except ValueError:
                out.append(False)
    return out


# ---- inputs ------------------------------------------------------------------------------------------


def weight_bytes(qtype, n, k, rng, scales="normal"):
    return np.ascontiguousarray(random_rows(qtype, n, k, rng, scales)).view(np.uint8).reshape(n, -1)


def acts(rng, t, k):
    """Activations over a few binades, and the ARM quantizer's hard rows where there is room: zeros and -0.0,
    .5 ties of x·id (amax = 127: id = 1; x86 rounds them the same, ``roundf`` would not), a NaN (the block's
    amax and d become NaN, every q 0; x86 skips it), fp16 d = inf, tiny blocks (1/d = inf: +x -> byte -1,
    -x -> 0, 0 -> 0), an inf (d = inf, id = 0, inf·0 -> 0)."""
    x = (rng.standard_normal((t, k)) * np.float32(2.0) ** rng.integers(-6, 6, (t, k))).astype(np.float32)

    def ties(r):
        r[:32] = np.arange(32, dtype=np.float32) - np.float32(15.5)
        r[31] = 127.0
        r[32:64] = -r[:32]

    def nan(r):
        r[5] = np.nan

    def big_small(r):
        r[:32] *= np.float32(2.0**100)
        r[32:64] *= np.float32(2.0**-130)
        r[40] = 0.0

    special = [None, lambda r: r.fill(0.0), lambda r: r.__setitem__(slice(0, None, 2), -0.0), ties, nan,
               big_small, None, lambda r: r.__setitem__(len(r) - 3, -np.inf), ties]
    for i in range(1, min(t, len(special))):
        if special[i] is not None:
            special[i](x[i])
    return x


def unfused_all(w, qtype, x, path, fused):
    """A wrong model: every row through the gemm's float step (``fused``) — or the gemv's."""
    return repack_arm._run(np.ascontiguousarray(w), qtype, x, np.full(x.shape[0], fused))


def x86_quant(w, qtype, x, path):
    """A wrong model: x86's quantize_row_q8_0 in front of the ARM kernels."""
    g, v = FUSED[(qtype, path)]
    T = x.shape[0]
    fused = np.where(np.arange(T) < T - T % 4, g, v)
    return repack_arm._run(np.ascontiguousarray(w), qtype, np.ascontiguousarray(x), fused, x86_quant=True)


# ---- tests -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_repack_choice(build):
    """``ggml_repack_get_optimal_repack_type``: the rows multiple of each type on this build (4 or 8)."""
    _require(build)
    path = ARM[build]
    for qt, (mult, _) in repack_arm.REPACK_ARM[path].items():
        rb = {QT.Q8_0: 272, QT.Q4_0: 144, QT.IQ4_NL: 144, QT.MXFP4: 136, QT.Q4_K: 144, QT.Q5_K: 176, QT.Q6_K: 210}[qt]
        shapes = [(256, 4), (256, 8), (256, 12), (256, 6)]
        got = on_build(build, g_repacks, int(qt), shapes, rb)
        assert got == [repacked_arm(qt, n, path) for _, n in shapes], qt.name
    assert on_build(build, g_repacks, int(QT.Q2_K), [(256, 8)], 84) == [False]  # AVX-512 only


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_mul_mat_bit_exact(build):
    _require(build)
    path = ARM[build]
    rng = np.random.default_rng(3901)
    cases = []
    for qt in TYPES:
        for n, k, ts, scales in ((4, 64, (1, 2, 3, 4, 5, 9), "normal"), (12, 96, (2, 4, 6, 8), "normal"),
                                 (20, 128, (3, 7, 8, 9), "extreme")):
            w = weight_bytes(qt, n, k, rng, scales)
            for t in ts:
                cases.append((w, int(qt), k, acts(rng, t, k), 1 + (t % 2)))
    got = on_build(build, g_mul_mats, cases)
    for (w, gt, K, x, nth), y in zip(cases, got):
        want = mul_mat_repacked_arm(w, QT(gt), x, path)
        bad = bits(y) != bits(want)
        assert not bad.any(), (QT(gt).name, w.shape, x.shape, nth, np.argwhere(bad)[:4])
    # wrong models differ: fused <-> unfused where the kernels differ, x86's quantizer (ties, NaN)
    for qt in TYPES:
        mine = [(c, y) for c, y in zip(cases, got) if c[1] == int(qt) and len(c[3]) >= 8]
        g, v = FUSED[(qt, path)]
        for fused in {g, v}:
            assert any((bits(unfused_all(c[0], qt, c[3], path, not fused)) != bits(y)).any() for c, y in mine)
        assert all((bits(x86_quant(c[0], qt, c[3], path)) != bits(y)).any() for c, y in mine)
    # the repack path ran: a plain buffer (vec_dot) gives other bits
    plain = on_build(build, g_mul_mats, cases[-3:], False)
    assert any((bits(p) != bits(y)).any() for p, y in zip(plain, got[-3:]))


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_mul_mat_id_bit_exact(build):
    _require(build)
    path = ARM[build]
    rng = np.random.default_rng(3902)
    E, n_used = 4, 2
    cases = []
    for qt in TYPES:
        for N, K, T in ((4, 32, 1), (12, 64, 5), (8, 96, 9)):
            w = np.stack([weight_bytes(qt, N, K, rng) for _ in range(E)])
            ids = np.stack([np.r_[0, 1 + rng.permutation(E - 1)[:n_used - 1]] for _ in range(T)]).astype(np.int32)
            for n_x in (1, n_used):
                x = acts(rng, T * n_x, K).reshape(T, n_x, K)
                cases.append((w, int(qt), K, x, ids, n_x))  # 1 or 2 threads
    got = on_build(build, g_mul_mat_ids, cases)
    for (w, gt, K, x, ids, nth), y in zip(cases, got):
        want = mul_mat_id_repacked_arm(w, QT(gt), x, ids, path)
        bad = bits(y) != bits(want)
        assert not bad.any(), (QT(gt).name, w.shape, x.shape, np.argwhere(bad)[:4])
    if path == "arm64-dotprod":  # Q8_0: mul_mat_id is the (fused) gemv even for 9 rows of expert 0
        c, y = next((c, y) for c, y in zip(cases, got) if c[1] == int(QT.Q8_0) and c[3].shape[0] == 9)
        assert (bits(mul_mat_repacked_arm(c[0][0], QT.Q8_0, c[3][:, 0], path)[:8]) != bits(y[:8, 0])).any()


def inf_scales(w, qt, rng):
    """``w`` with some fp16 scales set to ±inf, ±0 and the smallest subnormal (MXFP4: E8M0 bytes 0, 254, 255)."""
    w = w.copy()
    if qt == QT.MXFP4:
        blocks = w.reshape(w.shape[0], -1, 17)
        blocks[:, :, 0].flat[rng.integers(0, blocks[:, :, 0].size, 6)] = rng.choice([0, 254, 255], 6)
        return w
    bb, off = {QT.Q8_0: (34, 0), QT.Q4_K: (144, 0), QT.Q6_K: (210, 208)}[qt]
    blocks = w.reshape(w.shape[0], -1, bb)
    for v in (0x7C00, 0xFC00, 0x0000, 0x8000, 0x0001):
        i, j = rng.integers(0, blocks.shape[0]), rng.integers(0, blocks.shape[1])
        blocks[i, j, off], blocks[i, j, off + 1] = v & 0xFF, v >> 8
    if qt == QT.Q4_K:  # and a dmin
        blocks[0, 0, 2], blocks[0, 0, 3] = 0x00, 0x7C
    return w


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_inf_weight_scales(build):
    """Infinite and zero weight scales: the NaNs they make (inf·0, inf - inf) are ARM's default +NaN."""
    from kernels.ggml.repack_arm_k import mul_mat_repacked_arm_k

    _require(build)
    path = ARM[build]
    rng = np.random.default_rng(3907)
    cases = []
    for qt in (QT.Q8_0, QT.MXFP4, QT.Q4_K, QT.Q6_K):
        w = inf_scales(weight_bytes(qt, 8, 512, rng), qt, rng)
        for t in (1, 5):
            x = (acts if qt in REPACK_ARM_B32 else acts_k)(rng, t, 512)
            x[0, :40] = 0.0  # a zero Q8 block (d = 0) against an infinite scale
            cases.append((w, int(qt), 512, x, 1))
    got = on_build(build, g_mul_mats, cases)
    assert any(np.isnan(y).any() for y in got)
    for (w, gt, _, x, _), y in zip(cases, got):
        f = mul_mat_repacked_arm if gt in map(int, REPACK_ARM_B32) else mul_mat_repacked_arm_k
        want = f(w, QT(gt), x, path)
        if "clang" in build and gt in (QT.Q4_K, QT.Q5_K):  # clang's fmls negates its NaN operand (an inf·0 min
            same = np.isnan(y) & np.isnan(want)  # scale, FPNeg of element 1): that NaN's sign is not modelled
            y, want = np.where(same, np.float32(0), y), np.where(same, np.float32(0), want)
        assert np.array_equal(bits(y), bits(want)), (QT(gt).name, x.shape, np.argwhere(bits(y) != bits(want))[:4])


@pytest.mark.parametrize("sve_build", ["arm64-sve128-gcc", *(pytest.param(b, marks=pytest.mark.deep)
                                                             for b in ("arm64-sve128-clang", "arm64-sve128-clang19"))])
def test_sve128_and_base(sve_build):
    """``arm64-base`` (NEON only) repacks nothing; ``arm64-sve128`` repacks as i8mm does and gives its bits
    (clang's SVE builds: as ``arm64-i8mm-clang`` does)."""
    from kernels.ggml.repack_arm_k import mul_mat_repacked_arm_k

    import arm64

    sve_path = arm64.BUILDS[sve_build][0]
    for build, path in (("arm64-base-gcc", "arm64-base"), (sve_build, sve_path)):
        _require(build)
        for qt in (QT.Q8_0, QT.Q4_0, QT.MXFP4, QT.Q4_K, QT.Q6_K):
            rb = {QT.Q8_0: 272, QT.Q4_0: 144, QT.MXFP4: 136, QT.Q4_K: 144, QT.Q6_K: 210}[qt]
            assert on_build(build, g_repacks, int(qt), [(256, 4), (256, 8)], rb) == [repacked_arm(qt, 4, path),
                                                                                    repacked_arm(qt, 8, path)]
    rng = np.random.default_rng(3906)
    cases = []
    for qt in (QT.Q8_0, QT.Q4_K):
        w = weight_bytes(qt, 8, 256, rng)
        cases += [(w, int(qt), 256, (acts if qt == QT.Q8_0 else acts_k)(rng, t, 256), 2) for t in (2, 5)]
    for (w, gt, _, x, _), y in zip(cases, on_build(sve_build, g_mul_mats, cases)):
        f = mul_mat_repacked_arm if gt == int(QT.Q8_0) else mul_mat_repacked_arm_k
        assert np.array_equal(bits(y), bits(f(w, QT(gt), x, sve_path)))


def test_quantizer_hard_values():
    """The ARM Q8_0 quantizer on its corner cases (module docstring of kernels.ggml.repack_arm)."""
    x = np.zeros((4, 32), np.float32)
    x[0] = np.arange(32) - np.float32(15.5)
    x[0, 31] = 127.0  # id = 1: ties to even
    x[1, 3], x[1, 4] = np.nan, 1.0  # NaN: d NaN, q 0
    x[2, :3] = np.float32(2.0**-130), -np.float32(2.0**-130), 0.0  # 1/d = inf: +inf -> -1, -inf -> 0
    x[3, 0] = np.inf
    q, d = quantize_q8_0_arm(x)
    assert list(q[0, :4]) == [-16, -14, -14, -12] and q[0, 31] == 127 and d[0, 0] == 1.0
    assert np.isnan(d[1, 0]) and not q[1].any()
    assert list(q[2, :3]) == [-1, 0, 0] and d[2, 0] == 0
    assert d[3, 0] == np.inf and not q[3].any()


def test_threads_change_no_bit():
    """Above flags.SERIAL_BELOW the kernel splits tiles of weight rows between threads: at 1, 2 and 3 threads the
    bits of the row blocks computed serially (each element alone: a row block of W gives its rows' bits; 68 rows,
    a last tile of 4). No library call: the serial kernel is the one checked against the builds above."""
    import numba

    rng = np.random.default_rng(3907)
    k, n = 4096, 68  # 68·4096 = 278528 multiply-adds per activation row >= SERIAL_BELOW; 17 rows below
    before = numba.get_num_threads()
    try:
        for qt in (QT.Q8_0,):  # the kernel the e2e cases compile too (kjv's 2048-row products are above SERIAL_BELOW)
            w, x = weight_bytes(qt, n, k, rng), acts(rng, 5, k)
            w3, ids = np.stack([w, w[::-1]]), np.array([[1, 0]] * 5, np.int32)  # 2 experts, both routed
            blocks = range(0, n, 17)
            want = np.concatenate([mul_mat_repacked_arm(w[r:r + 17], qt, x, "arm64-dotprod") for r in blocks], 1)
            want_id = np.concatenate([mul_mat_id_repacked_arm(w3[:, r:r + 17], qt, x[:, None], ids, "arm64-dotprod")
                                      for r in blocks], 2)
            for nth in (1, 2, 3):
                numba.set_num_threads(min(nth, numba.config.NUMBA_NUM_THREADS))
                assert np.array_equal(bits(mul_mat_repacked_arm(w, qt, x, "arm64-dotprod")), bits(want)), (qt, nth)
                got_id = mul_mat_id_repacked_arm(w3, qt, x[:, None], ids, "arm64-dotprod")
                assert np.array_equal(bits(got_id), bits(want_id)), (qt, nth)
    finally:
        numba.set_num_threads(before)


def test_rejects():
    x = np.ones((2, 32), np.float32)
    w = weight_bytes(QT.Q8_0, 6, 32, np.random.default_rng(0))
    assert not repacked_arm(QT.Q8_0, 6, "arm64-dotprod") and repacked_arm(QT.Q8_0, 4, "arm64-dotprod")
    with pytest.raises(ValueError):
        mul_mat_repacked_arm(w[:, :-1], QT.Q8_0, x, "arm64-dotprod")  # not Q8_0 rows of 32
    with pytest.raises(ValueError):
        mul_mat_repacked_arm(w[:4], QT.Q8_0, x, "avx2")  # an x86 path
    with pytest.raises(ValueError):
        mul_mat_repacked_arm(w[:4], QT.Q4_K, x, "arm64-i8mm")  # not a 32-value type


# ---- K-quants (kernels.ggml.repack_arm_k) ---------------------------------------------------------------


def acts_k(rng, t, k):
    """acts() for 256-value blocks: the ARM Q8_K quantizer's hard rows (ties of the fused x·iscale, -amax
    first, NaN / inf, zeros, tiny) where there is room."""
    x = (rng.standard_normal((t, k)) * np.float32(2.0) ** rng.integers(-6, 6, (t, k))).astype(np.float32)
    hard = []
    ties = (rng.integers(-127, 127, k) + np.float32(0.5)).astype(np.float32)
    ties[100::256] = -127.0  # max = -127: iscale = 1, every x·iscale a .5 tie
    hard.append(ties)
    near = ties * np.float32(1.0 + 2.0**-22)  # products just off the ties: fused vs rounded first differ
    hard.append(near.astype(np.float32))
    hard.append(np.zeros(k, np.float32))
    nan = x[0].copy()
    nan[7], nan[300 % k] = np.nan, np.inf
    hard.append(nan)
    hard.append((x[-1] * np.float32(2.0**-135)).astype(np.float32))
    for i, h in enumerate(hard[: t - 1]):
        x[(2 * i + 1) % t] = h
    return x


KQ = (QT.Q4_K, QT.Q5_K, QT.Q6_K)


def test_mulmat_dispatch():
    """kernels.ggml.mulmat sends a repacked weight on an ARM path here, or with its column layout to
    kernels.ggml.columns_arm (never to the x86 repack or column kernels); an ARM path meeting an x86 repack kernel,
    raises; a plain buffer's Q4_0 from its layout gives the stored rows' bits."""
    from kernels.ggml import repack, repack_k
    from kernels.ggml.columns import layout
    from kernels.ggml.mulmat import mul_mat, mul_mat_id, repack_emulated
    from kernels.ggml.repack_arm_k import mul_mat_id_repacked_arm_k, mul_mat_repacked_arm_k

    rng = np.random.default_rng(3905)
    for path in ARM.values():
        for qt in (QT.Q8_0, QT.Q4_K):
            k = 256
            w = weight_bytes(qt, 8, k, rng)
            x = acts(rng, 5, k)
            direct = (mul_mat_repacked_arm if qt == QT.Q8_0 else mul_mat_repacked_arm_k)(w, qt, x, path)
            assert np.array_equal(bits(mul_mat(w, qt, x, path, repack=True)), bits(direct))
            ids = np.zeros((5, 1), np.int32)
            direct = (mul_mat_id_repacked_arm if qt == QT.Q8_0 else mul_mat_id_repacked_arm_k)(w[None], qt, x[:, None],
                                                                                                ids, path)
            assert np.array_equal(bits(mul_mat_id(w[None], qt, x[:, None], ids, path, repack=True)), bits(direct))
            assert repack_emulated(qt, path)
        with pytest.raises(ValueError, match=path):
            repack.mul_mat_repacked(weight_bytes(QT.Q4_0, 8, 32, rng), QT.Q4_0, np.ones((1, 32), np.float32), path)
        w = weight_bytes(QT.Q4_0, 8, 32, rng)
        cols, x1 = layout(w, QT.Q4_0), np.ones((1, 32), np.float32)  # repacked: kernels.ggml.columns_arm, same bits
        assert np.array_equal(bits(mul_mat(w, QT.Q4_0, x1, path, repack=True, cols=cols)),
                              bits(mul_mat(w, QT.Q4_0, x1, path, repack=True)))
        q4_1 = weight_bytes(QT.Q4_1, 8, 32, rng)  # Q4_1's mins: no layout kernel; Q4_0's lanes have one
        assert np.array_equal(bits(mul_mat(w, QT.Q4_0, x1, path, repack=False, cols=cols)),
                              bits(mul_mat(w, QT.Q4_0, x1, path, repack=False)))
        with pytest.raises(ValueError, match="column layout: Q4_1 has none"):
            layout(q4_1, QT.Q4_1)
        with pytest.raises(ValueError, match=path):
            repack_k.mul_mat_repacked_k(weight_bytes(QT.Q4_K, 8, 256, rng), QT.Q4_K, np.ones((1, 256), np.float32),
                                        path)
