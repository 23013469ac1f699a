"""kernels.ggml.columns (``--emulate=ggml``'s column layout) gives the bits of the stored-row kernels it stands in for.

The stored-row kernels (kernels.ggml.repack, kernels.ggml.repack_k, and for the K-quants in a plain buffer
kernels.ggml.mulmat_k) are proven against libggml on both builds by test_ggml_ops_repack / test_ggml_ops_repack_k /
test_ggml_ops_mulmat; here the column layout must equal them bit for bit on the same kinds of inputs (rounding ties,
zeros, a NaN that quantizes to -128 — the gemv's sign trick —, inf), for decode (gemv, vec_dot) and batch (gemm,
tiled) row counts, column ranges that start and end inside a tile, and mul_mat_id's grouping. A model loaded
with the layout is compared with llama.cpp itself in tests/test_ggml_e2e.py.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from test_ggml_ops_repack import acts

from kernels.ggml import columns, columns_b32, columns_ir, columns_k, columns_q4k, mulmat
from kernels.ggml.simd import _cols_dot16_def, cols_dot16
from kernels.testing import random_rows

TYPES = (QT.Q4_0, QT.IQ4_NL, QT.MXFP4, QT.Q4_K)  # repacked by llama.cpp (its default CPU_REPACK buffer)
#: (type, nibbles): the 32-value block types in both layouts (values in pairs; 4-bit codes, kernels.ggml.columns_b32)
LAYOUTS = [(t, False) for t in TYPES] + [(t, True) for t in columns_b32.TYPES]
LAYOUT_IDS = [t.name + ("-nibbles" if nib else "") for t, nib in LAYOUTS]
PLAIN = (QT.Q4_K, QT.Q5_K, QT.Q6_K)  # in a plain buffer: vec_dot below 8 rows, the tiled kernel from 8


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def weight_bytes(qtype, n, k, rng):
    return np.ascontiguousarray(random_rows(qtype, n, k, rng, "normal")).view(np.uint8).reshape(n, -1)


def test_cols_dot16_is_its_definition():
    """The vector IR (pmaddwd / vpdpwssd pairs, two chains) against the definition, extremes included."""
    rng = np.random.default_rng(0)
    q = rng.integers(-128, 128, (48, 80), dtype=np.int8)  # K = 96 values, 40 columns
    q[0, :8] = -128
    y = rng.integers(-128, 128, 96).astype(np.int8)
    y[:4] = -128
    for k0, c, yo in ((0, 0, 0), (32, 24, 64), (64, 8, 32)):
        got, want = np.zeros(20, np.int32), np.zeros(20, np.int32)
        cols_dot16(got, 3, q, k0, c, y, yo)
        _cols_dot16_def(want, 3, q, k0, c, y, yo)
        assert np.array_equal(got, want)
        assert got[3] == sum(int(q[(k0 + l) // 2, 2 * c + (k0 + l) % 2]) * int(y[yo + l]) for l in range(32))


@pytest.mark.parametrize("qtype,nibbles", LAYOUTS, ids=LAYOUT_IDS)
def test_mul_mat_equals_stored_rows(qtype, nibbles):
    rng = np.random.default_rng(int(qtype))
    for N, K in ((64, 256), (136, 512)):  # 136: a tile of 8, and 16-column steps with a scalar tail
        w = weight_bytes(qtype, N, K, rng)
        cols = columns.layout(w, qtype, nibbles)
        assert cols.n_cols == N and cols.K == K and cols.nibbles == nibbles
        for T in (1, 2, 3, 4, 5, 9):  # gemv only; gemm rows + gemv rows; the special activation rows at 9
            x = acts(rng, T, K)
            want = mulmat.mul_mat(w, qtype, x, "avx512", repack=True)  # the repacked kernels on the stored rows
            assert np.array_equal(bits(columns.mul_mat_cols(cols, x)), bits(want)), (N, K, T)
            assert np.array_equal(bits(mulmat.mul_mat(w, qtype, x, "avx512", repack=True, cols=cols)), bits(want))
            for start, stop in ((8, 24), (60, 136 if N == 136 else 64)):  # inside a tile; across a tile's end
                got = columns.mul_mat_cols(cols.columns(start, stop), x)
                assert np.array_equal(bits(got), bits(want[:, start:stop])), (start, stop, T)


@pytest.mark.parametrize("qtype", PLAIN, ids=[t.name for t in PLAIN])
def test_quad_dots_are_their_definitions(qtype):
    """The K-quants' vector IR (kernels.ggml.columns_ir, every level the host runs: VNNI's vpdpbusd + vpdpwssd,
    AVX2's vpmaddubsw + vpmaddwd, the target-independent twin) against the definitions, for a sub-tile of 16
    columns: vec_dot's 8 lanes (Q6_K with q8sclsub) and their float step (Q5_K, Q6_K: also kernels.ggml.columns_k's
    step for several activation rows), the tiled kernel's totals, Q4_K repacked's gemv and gemm steps (a whole sub-tile
    for several rows: kernels.ggml.columns_q4k); extreme
    codes, scales and activations (Q6_K's scale bytes -128 and 127, the 6-bit scales' 63, a -128 activation)."""
    rng = np.random.default_rng(int(qtype))
    w = weight_bytes(qtype, 64, 512, rng)
    cols = columns.layout(w, qtype)
    q, sc, mn, d, dmin = cols.q[0, 0], cols.sc[0, 0].copy(), cols.mn[0, 0], cols.d[0, 0], cols.dmin[0, 0]
    per16 = qtype == QT.Q6_K
    form = {QT.Q5_K: 0, QT.Q6_K: 1, QT.Q4_K: 2}[qtype]  # columns_ir: bytes, Q6_K, Q4_K's nibbles
    sc[16 if per16 else 8, 16:20] = (128, 127, 0, 255) if per16 else (63, 0, 63, 1)  # block 1, group 0, sub-tile 1
    q[q.shape[0] // 4 + (32 if form == 2 else 64), :4] = -1 if form == 2 else q.max()  # block 1, sub-tile 1: largest codes
    y = rng.integers(-127, 128, 512).astype(np.int8)
    y[256:259] = (-128, 127, -127)
    bs = rng.integers(-2032, 2033, 32).astype(np.int64)  # Q6_K's bsums (per 16) / the sums per 32 (the mins)
    for level in range(columns_ir.LEVEL + 1):
        for blk, c in ((0, 0), (1, 16), (1, 48)):
            for total in (0, 1):
                got, want = np.zeros((8, 16), np.int32), np.zeros((8, 16), np.int32)
                columns_ir.kq16(got, 0, q, blk, 0, 8, c, y, sc, bs, form, total, level)
                columns_ir.kq_def(want, 0, 16, q, blk, 0, 8, c, y, sc, bs, form, total)
                assert np.array_equal(got[:8 - 7 * total], want[:8 - 7 * total]), (level, blk, c, total)
            acc = rng.standard_normal((8, 24)).astype(np.float32)
            got, want = acc.copy(), acc.copy()
            columns_ir.kq16_fma(got, 5, q, blk, c, y, sc, bs, d, np.float32(0.37), form, level)
            v = np.zeros((8, 16), np.int32)
            columns_ir.kq_fma(want, 5, v, q, blk, c, 15, y, sc, bs, d, np.float32(0.37), form)  # by the definitions
            columns_ir.kq_fma(want, 20, v, q, blk, c + 15, 1, y, sc, bs, d, np.float32(0.37), form)
            assert np.array_equal(bits(got), bits(want)), (level, blk, c)
        if form == 2:  # columns_q4k: a whole sub-tile, every super-block, several activation rows in one step
            ys2 = np.stack([y, np.roll(y, 7), -np.roll(y, 3)])
            ys2[1, 5] = -128
            sums = np.ascontiguousarray(np.stack([bs, bs[::-1], -bs])[:, :16])  # the sums per 32 values
            yd = rng.standard_normal((3, 2)).astype(np.float32)
            rows = np.array([2, 0, 1, 2, 1])
            for sel in (np.array([0, 1, 2, 3]), np.array([4]), np.array([3, 1])):
                for step in (2, 8):
                    for c, ns in ((16, 1), (48, 1), (16, 3), (0, 4)):  # ns sub-tiles from c in one call
                        acc = rng.standard_normal((5, 2, 8 + 16 * ns)).astype(np.float32)
                        got, want = acc.copy(), acc.copy()
                        columns_q4k.q4k_sub_tiles16(got, 5, q, c, ns, ys2, rows, sel, sc, sums, d, yd, mn, dmin, step,
                                                    level)
                        for s in range(ns):
                            columns_q4k.q4k_sub_tile_def(want, 5 + 16 * s, q, c + 16 * s, 16, ys2, rows, sel, sc, sums,
                                                         d, yd, mn, dmin, step)
                        assert np.array_equal(bits(got), bits(want)), (level, sel, step, c, ns)
        if form != 2:  # columns_k.lanes_rows: every super-block, each lane's codes for several activation rows
            ys = np.stack([y, np.roll(y, 7), np.roll(y, -3)])
            bss = np.stack([bs, bs[::-1], -bs])
            yd = rng.standard_normal((3, 2)).astype(np.float32)
            rows = np.array([2, 0, 1, 2])
            for c in (16, 48):
                acc = rng.standard_normal((4, 8, 24)).astype(np.float32)
                got, want = acc.copy(), acc.copy()
                columns_k.lanes_rows16(got, 5, q, c, ys, rows, sc, bss, d, yd, form, level)
                columns_k.lanes_rows_def(want, 5, q, c, 16, ys, rows, sc, bss, d, yd, form)
                assert np.array_equal(bits(got), bits(want)), (level, c)
                if form == 1:  # Q6_K's codes in 6 bits (columns_k.pack6), decoded in the vector step
                    six = columns_k.pack6(q)
                    back = np.empty_like(q)
                    columns_k.unpack6(six, back)
                    assert six.shape == (q.shape[0] * 3 // 4, 64) and np.array_equal(back, q)
                    got = acc.copy()
                    columns_k.lanes_rows16_six(got, 5, six, c, 1, ys, rows, sc, bss, d, yd, level)
                    assert np.array_equal(bits(got), bits(want)), (level, c, "six-bit")
                    if c == 16:  # sub-tiles 1-3 in one call
                        wide = rng.standard_normal((4, 8, 56)).astype(np.float32)
                        got, want3 = wide.copy(), wide.copy()
                        columns_k.lanes_rows16_six(got, 5, six, 16, 3, ys, rows, sc, bss, d, yd, level)
                        for s in range(3):
                            columns_k.lanes_rows_def(want3, 5 + 16 * s, q, 16 + 16 * s, 16, ys, rows, sc, bss, d, yd,
                                                     form)
                        assert np.array_equal(bits(got), bits(want3)), (level, "six-bit, 3 sub-tiles")

    def code(qr, i):  # value 4·qr + i of the sub-tile's first column: Q4_K's nibbles by group, the bytes by lane
        if form == 2:
            return (int(q[q.shape[0] // 4 + qr // 2, i]) & 255) >> (4 * (qr % 2)) & 15
        return int(q[q.shape[0] // 4 + qr - qr % 64 + 8 * (qr % 8) + qr % 64 // 8, i])

    lane0 = []  # block 1, sub-tile 1's first column, lane 0
    for g in range(8):
        s_g = int(sc[16 + 2 * g, 16].view(np.int8)) if per16 else int(sc[8 + g, 16])
        lane0.append(s_g * sum(code(64 + 8 * g, i) * int(y[256 + 32 * g + i]) for i in range(4)))
    if per16:
        lane0.append(-32 * sum(int(bs[16 + h]) * int(sc[16 + h, 16].view(np.int8)) for h in range(2)))
    want = np.zeros((8, 16), np.int32)
    columns_ir.kq_def(want, 0, 1, q, 1, 0, 8, 16, y, sc, bs, form, 0)
    assert want[0, 0] == sum(lane0)


def test_q4k_sub_tile_at_its_integer_bounds():
    """Q4_K repacked's sub-tile step where its AVX2 integers are largest: every code 15, every scale and min 63,
    activation rows all -128, all 127 and alternating, with their true sums per 32 values (±4096, the most a
    Q8_K group holds). AVX2 adds a group's eight ``vpmaddubsw`` pair sums as int16 (8 · 2 · 15 · 128 = 30720 <
    2^15) and both groups' mins in one ``vpmaddwd``: a wider bound or a sign slip in the packing shows here as
    a different accumulator than the definition's, at every level the host runs."""
    rng = np.random.default_rng(40)
    cols = columns.layout(weight_bytes(QT.Q4_K, 64, 512, rng), QT.Q4_K)
    q, d, dmin = cols.q[0, 0].copy(), cols.d[0, 0], cols.dmin[0, 0]
    q[:] = -1  # both nibbles 15: every code 15
    sc, mn = np.full_like(cols.sc[0, 0], 63), np.full_like(cols.mn[0, 0], 63)
    y = np.stack([np.full(512, -128), np.full(512, 127), np.tile([127, -128], 256)]).astype(np.int8)
    sums = np.ascontiguousarray(y.reshape(3, 16, 32).sum(axis=2, dtype=np.int64))  # [3, K/32]
    assert sums.min() == -4096 and sums.max() == 4064
    yd = rng.standard_normal((3, 2)).astype(np.float32)
    rows = np.array([0, 1, 2, 0])
    for level in range(columns_ir.LEVEL + 1):
        for step in (2, 8):
            for c in (0, 48):
                acc = rng.standard_normal((4, 2, 24)).astype(np.float32)
                got, want = acc.copy(), acc.copy()
                sel = np.arange(4)
                columns_q4k.q4k_sub_tiles16(got, 5, q, c, 1, y, rows, sel, sc, sums, d, yd, mn, dmin, step, level)
                columns_q4k.q4k_sub_tile_def(want, 5, q, c, 16, y, rows, sel, sc, sums, d, yd, mn, dmin, step)
                assert np.array_equal(bits(got), bits(want)), (level, step, c)


def test_six_bit_layout_is_pack6_of_the_byte_layout():
    """Q6_K laid out in 6 bits (``layout(…, sixbit=True)``: ``columns_k.lay_k`` writes them as it lays out) is
    ``columns_k.pack6`` of its byte layout — one matrix of two tiles, the last padded, and a stack of experts — the
    other arrays the same; ``unpack6`` gives the bytes back."""
    rng = np.random.default_rng(41)
    for w in (weight_bytes(QT.Q6_K, 96, 512, rng), np.stack([weight_bytes(QT.Q6_K, 64, 256, rng) for _ in range(3)])):
        laid, six = columns.layout(w, QT.Q6_K), columns.layout(w, QT.Q6_K, sixbit=True)
        assert six.sixbit and six.q.dtype == np.uint8 and six.q.shape[-2] == laid.q.shape[-2] * 3 // 4
        assert np.array_equal(six.q, columns_k.pack6(laid.q))
        for name in ("d", "dmin", "sc", "mn"):
            assert np.array_equal(getattr(six, name), getattr(laid, name)), name
        back = np.empty_like(laid.q[0, -1])
        columns_k.unpack6(six.q[-1, -1], back)
        assert np.array_equal(back, laid.q[-1, -1])


@pytest.mark.parametrize("qtype", PLAIN, ids=[t.name for t in PLAIN])
def test_plain_buffer_mul_mat_equals_stored_rows(qtype):
    """Not repacked (Q5_K and Q6_K never are; Q4_K with --no-repack): vec_dot's 8 lanes for T < 8, the tiled
    kernel's slabs from 8 rows, as kernels.ggml.mulmat_k computes them on the stored rows (a row with an inf and
    one with a NaN scale among them)."""
    rng = np.random.default_rng(200 + int(qtype))
    d_at = 208 if qtype == QT.Q6_K else 0  # the fp16 super-block scale's offset in a block
    for N, K in ((64, 256), (136, 512)):
        w = weight_bytes(qtype, N, K, rng)
        w[3, d_at:d_at + 2] = np.array([0x7C00], np.uint16).view(np.uint8)  # d = +inf: inf·0 lanes, ±inf
        w[5, d_at:d_at + 2] = np.array([0x7E00], np.uint16).view(np.uint8)  # d = NaN
        layouts = [columns.layout(w, qtype)] + ([columns.layout(w, qtype, sixbit=True)] if qtype == QT.Q6_K else [])
        for cols in layouts:  # Q6_K: its codes a byte each, and in 6 bits (whole sub-tiles decoded in the vector step)
            assert cols.n_cols == N and cols.K == K
            for T in (1, 2, 7, 8, 9):  # vec_dot; the tiled kernel (the special activation rows at 9)
                x = acts(rng, T, K)
                want = mulmat.mul_mat(w, qtype, x, "avx512", repack=False)
                assert mulmat.kernel_for(qtype, "avx512", T, N, K) == ("tiled" if T >= 8 else "vec_dot")
                assert np.array_equal(bits(columns.mul_mat_cols(cols, x, repacked=False)), bits(want)), (N, K, T)
                assert np.array_equal(bits(mulmat.mul_mat(w, qtype, x, "avx512", repack=False, cols=cols)), bits(want))
                for start, stop in ((8, 24), (16, 48), (60, 136 if N == 136 else 64)):  # part of a sub-tile, whole ones
                    got = columns.mul_mat_cols(cols.columns(start, stop), x, repacked=False)
                    assert np.array_equal(bits(got), bits(want[:, start:stop])), (start, stop, T, cols.sixbit)


@pytest.mark.parametrize("qtype", PLAIN, ids=[t.name for t in PLAIN])
def test_plain_buffer_mul_mat_id_equals_stored_rows(qtype):
    """mul_mat_id groups the rows by expert: a group of 8 or more rows takes the tiled kernel, a smaller one vec_dot,
    in the same call."""
    rng = np.random.default_rng(300 + int(qtype))
    E, N, K = 4, 80, 256
    w = np.stack([weight_bytes(qtype, N, K, rng) for _ in range(E)])
    for cols in [columns.layout(w, qtype)] + ([columns.layout(w, qtype, sixbit=True)] if qtype == QT.Q6_K else []):
        for T, n_x, n_used in ((1, 1, 2), (3, 2, 2), (12, 1, 2)):
            x = acts(rng, T * n_x, K).reshape(T, n_x, K)
            ids = np.stack([rng.permutation(E)[:n_used] for _ in range(T)]).astype(np.int32)
            if T == 12:
                ids[:, 0] = 0  # expert 0: 12 rows (tiled); the others fewer than 8 (vec_dot)
                ids[:, 1] = 1 + np.arange(T) % 3
            want = mulmat.mul_mat_id(w, qtype, x, ids, "avx512", repack=False)
            got = mulmat.mul_mat_id(w, qtype, x, ids, "avx512", repack=False, cols=cols)
            assert np.array_equal(bits(got), bits(want)), (T, cols.sixbit)
            half = columns.mul_mat_id_cols(cols.columns(40, 80), x, ids, repacked=False)  # a fused gate_up's up rows
            assert np.array_equal(bits(half), bits(want[..., 40:80])), (T, cols.sixbit)


def q8_0_weights(rng, n, k):
    """Q8_0 rows with the edge cases of the sign trick: -128 and ±127 weights, a zero block, d = +inf and NaN."""
    w = weight_bytes(QT.Q8_0, n, k, rng)
    blocks = w.reshape(n, k // 32, 34)
    blocks[1, :, 2:] = np.array(-128, np.int8).view(np.uint8)  # |w| = 128 against every activation
    blocks[2, :, 2::2] = np.array(-127, np.int8).view(np.uint8)
    blocks[2, :, 3::2] = 127
    blocks[4, 0, 2:] = 0
    blocks[6, 0, :2] = np.array([0x7C00], np.uint16).view(np.uint8)  # d = +inf
    blocks[7, 1, :2] = np.array([0x7E00], np.uint16).view(np.uint8)  # d = NaN
    return w


def test_layout_nbytes_are_the_layouts():
    """columns.layout_nbytes (what a load's memory budget weighs) is the bytes columns.layout makes, in every form,
    for a matrix and a stack, a partial last tile included."""
    rng = np.random.default_rng(803)
    forms = [(QT.Q8_0, {}), (QT.Q8_0, {"quads": True}), (QT.Q4_0, {}), (QT.IQ4_NL, {"nibbles": True}),
             (QT.MXFP4, {"nibbles": True}), (QT.Q4_K, {}), (QT.Q5_K, {}), (QT.Q6_K, {}), (QT.Q6_K, {"sixbit": True})]
    for qtype, flags in forms:
        for E, N, K in ((0, 100, 512), (3, 70, 256)):
            w = np.stack([weight_bytes(qtype, N, K, rng) for _ in range(max(E, 1))])
            w = w if E else w[0]
            want = columns.layout(w, qtype, **flags).nbytes
            assert columns.layout_nbytes(qtype, w.shape, **flags) == want, (qtype, flags, E)


def test_q8_0_mul_mat_equals_stored_rows():
    """Q8_0 in a plain buffer on x86 (vec_dot's 8 float lanes and hsum_float_8, kernels.ggml.columns_q8) from its
    values in quads: the stored rows' bits (kernels.ggml.mulmat_q8, proven against libggml) for 1-3 rows (the column
    kernel) and 4 or more (the stored rows' kernel takes them: columns.takes), whole tiles, a partial last one, column
    ranges inside sub-tiles, the activations' special rows (a NaN quantizes to -128: the sign trick wraps)."""
    rng = np.random.default_rng(800)
    for N, K in ((64, 256), (136, 512)):
        w = q8_0_weights(rng, N, K)
        cols = columns.layout(w, QT.Q8_0, quads=True)
        assert cols.quads and cols.n_cols == N and cols.K == K and cols.q.shape == (1, -(-N // 64), K, 64)
        for T in (1, 2, 3, 4, 9):
            x = acts(rng, T, K)
            want = mulmat.mul_mat(w, QT.Q8_0, x, "avx512")
            assert np.array_equal(bits(columns.mul_mat_cols(cols, x, repacked=False)), bits(want)), (N, K, T)
            assert np.array_equal(bits(mulmat.mul_mat(w, QT.Q8_0, x, "avx512", cols=cols)), bits(want))
            assert columns.takes(QT.Q8_0, T) == (T < columns.Q8_0_COLS_BELOW)
            for start, stop in ((8, 24), (5, 60), (16, 48), (60, N)):  # inside sub-tiles, whole ones, across tiles
                got = columns.mul_mat_cols(cols.columns(start, stop), x, repacked=False)
                assert np.array_equal(bits(got), bits(want[:, start:stop])), (start, stop, T)


def test_q8_0_mul_mat_id_equals_stored_rows():
    """mul_mat_id of Q8_0 experts from the quads: each slot's row against its expert's columns, the fused gate_up's
    halves, whatever the grouping; through mulmat.mul_mat_id while the experts meet fewer than 4 rows each."""
    rng = np.random.default_rng(801)
    E, N, K = 4, 80, 256
    w = np.stack([q8_0_weights(rng, N, K) for _ in range(E)])
    cols = columns.layout(w, QT.Q8_0, quads=True)
    for T, n_x, n_used in ((1, 1, 2), (3, 2, 2), (9, 1, 2)):
        x = acts(rng, T * n_x, K).reshape(T, n_x, K)
        ids = np.stack([rng.permutation(E)[:n_used] for _ in range(T)]).astype(np.int32)
        want = mulmat.mul_mat_id(w, QT.Q8_0, x, ids, "avx512")
        assert np.array_equal(bits(columns.mul_mat_id_cols(cols, x, ids, repacked=False)), bits(want)), T
        assert np.array_equal(bits(mulmat.mul_mat_id(w, QT.Q8_0, x, ids, "avx512", cols=cols)), bits(want)), T
        half = columns.mul_mat_id_cols(cols.columns(40, 80), x, ids, repacked=False)  # a fused gate_up's up rows
        assert np.array_equal(bits(half), bits(want[..., 40:80])), T


def test_q8_0_sub_tiles_are_their_definition():
    """The vector step of Q8_0's quads (kernels.ggml.columns_q8: ``vpdpbusd`` of ``|w|`` and the activation with its
    signs flipped per column, or AVX2's ``vpsignb`` / ``vpmaddubsw`` / ``vpmaddwd``) gives the definition's outputs at
    every instruction level this host runs — extreme weights and activations, the -128 whose product the sign trick
    wraps — for one sub-tile and a tile's whole."""
    from kernels.ggml import columns_q8

    rng = np.random.default_rng(802)
    N, K = 64, 256
    cols = columns.layout(q8_0_weights(rng, N, K), QT.Q8_0, quads=True)
    q, d = cols.q[0, 0], cols.d[0, 0]
    y = rng.integers(-128, 128, (4, K)).astype(np.int8)
    y[1, :] = 127
    y[2, :] = -128
    y[3, :] = -127
    yd = rng.uniform(0.01, 2.0, (4, K // 32)).astype(np.float32)
    rows, orow = np.array([3, 0, 1, 2]), np.array([2, 3, 0, 1])  # rows in any order, into any output rows
    want = np.zeros((4, 64), np.float32)
    columns_q8.q8_0_tile_def(q, d, 0, 64, y, yd, rows, orow, want, 0)
    for level in [lv for lv in (2, 1) if lv <= columns_ir.LEVEL]:
        for c, ns in ((0, 4), (16, 1), (48, 1)):
            got = np.full((4, 64), np.nan, np.float32)
            for i in range(4):
                columns_q8.q8_0_sub_tiles16(got, orow[i], c, q, c, y, rows[i], yd, d, ns, level)
            assert np.array_equal(bits(got[:, c:c + 16 * ns]), bits(want[:, c:c + 16 * ns])), (level, c)
    got = np.full((4, 64), np.nan, np.float32)  # the tile's driver: a partial sub-tile, whole ones, a partial one
    columns_q8.tile_q8_0(q, d, 5, 52, y, yd, rows, orow, got, 5)
    assert np.array_equal(bits(got[:, 5:57]), bits(want[:, 5:57]))


@pytest.mark.parametrize("qtype,nibbles", LAYOUTS, ids=LAYOUT_IDS)
def test_mul_mat_id_equals_stored_rows(qtype, nibbles):
    rng = np.random.default_rng(100 + int(qtype))
    E, N, K = 6, 80, 256
    w = np.stack([weight_bytes(qtype, N, K, rng) for _ in range(E)])
    cols = columns.layout(w, qtype, nibbles)
    for T, n_x, n_used in ((1, 1, 2), (3, 2, 2), (9, 1, 3)):
        x = acts(rng, T * n_x, K).reshape(T, n_x, K)
        ids = np.stack([rng.permutation(E)[:n_used] for _ in range(T)]).astype(np.int32)
        want = mulmat.mul_mat_id(w, qtype, x, ids, "avx512", repack=True)
        assert np.array_equal(bits(columns.mul_mat_id_cols(cols, x, ids)), bits(want)), (T, n_x)
        assert np.array_equal(bits(mulmat.mul_mat_id(w, qtype, x, ids, "avx512", repack=True, cols=cols)), bits(want))
        half = columns.mul_mat_id_cols(cols.columns(40, 80), x, ids)  # the up half of a fused gate_up stack
        assert np.array_equal(bits(half), bits(want[..., 40:80]))


@pytest.mark.parametrize("qtype", columns_b32.TYPES, ids=[t.name for t in columns_b32.TYPES])
def test_nibble_sub_tile_is_its_definition(qtype):
    """The codes' layout holds each value's code where columns_b32's docstring says, and its vector step
    (``vpshufb``, ``vpdpbusd`` or AVX2's pairs, ``− off·Σy``) gives the definition's accumulators — extreme codes and
    activations (±127, the -128 of a gemm row, whose dot is exact), one row or several, in any order — at every
    instruction level this host runs and the type allows (columns_b32.VECTOR)."""
    rng = np.random.default_rng(int(qtype))
    t = columns_b32.TYPES.index(qtype)
    N, K = 64, 256
    w = weight_bytes(qtype, N, K, rng)
    w[:3, :] = w[5, :]  # equal rows, and rows of extreme codes below
    cols = columns.layout(w, qtype, nibbles=True)
    hdr = 1 if qtype == QT.MXFP4 else 2
    blocks = w.reshape(N, K // 32, hdr + 16)
    codes = np.concatenate([blocks[:, :, hdr:] & 15, blocks[:, :, hdr:] >> 4], axis=2).reshape(N, K)  # (N, K)
    q, d = cols.q[0, 0], cols.d[0, 0]
    for c in range(N):
        for k in range(0, K, 7):
            assert columns_b32._code(q, (c // 16) * (K // 8), k // 32, c % 16, k % 32) == codes[c, k]
    y = rng.integers(-127, 128, (5, K)).astype(np.int8)
    y[1, :] = 127
    y[2, :] = -127
    y[3, :32] = -128  # a gemm row's -128: the exact dot (gemv rows with one take the definition, not the IR)
    yd = rng.uniform(0.01, 2.0, (5, K // 32)).astype(np.float32)
    ys = y.reshape(5, K // 32, 32).astype(np.int64).sum(axis=2)
    rows = np.array([4, 0, 1, 2, 3], np.int64)
    gemm = np.ones(5, np.bool_)
    m128 = np.zeros((5, K // 32), np.bool_)
    levels = [lv for lv in (2, 1) if lv <= columns_ir.LEVEL and (lv == 2 or qtype != QT.IQ4_NL)]
    assert (max(levels) if levels else 0) == columns_b32.VECTOR[t]
    for level in levels:
        for sel in (np.arange(5), np.array([3]), np.array([4, 2, 0])):
            for c in (0, 16, 48):
                got, want = np.zeros((5, 64), np.float32), np.zeros((5, 64), np.float32)
                got[:, :] = want[:, :] = rng.standard_normal((5, 64)).astype(np.float32)  # accumulated onto
                columns_b32.b32_sub_tile16(got, 8, q, c, y, yd, ys, rows, sel, d, t, level)
                columns_b32.b32_sub_tile_def(want, 8, q, c, 16, y, yd, rows, sel, d, m128, gemm, t)
                assert np.array_equal(bits(got), bits(want)), (level, sel, c)


def test_thread_count_changes_no_bit():
    """Tiles split between 1, 2 or 3 threads (each output one thread's, in one order): the same bits, for the
    K-quants' quad kernels (vec_dot lanes, tiled totals, Q4_K repacked's gemv and gemm rows) and Q8_0's, a partial
    tile too;
    mul_mat_id's (expert group, tile) items likewise, groups of vec_dot and tiled rows in one call."""
    import numba

    rng = np.random.default_rng(11)
    before = numba.get_num_threads()
    try:
        for qtype, repacked, six in ((QT.Q6_K, False, False), (QT.Q6_K, False, True), (QT.Q5_K, False, False),
                                     (QT.Q4_K, True, False), (QT.Q8_0, False, False)):
            w = weight_bytes(qtype, 200, 1536, rng)  # 4 tiles, the last partial; parallel from one row
            cols = columns.layout(w, qtype, sixbit=six, quads=True)
            for T in (1, 4, 8):
                x = acts(rng, T, 1536)
                outs = []
                for nth in (1, 2, 3):
                    numba.set_num_threads(min(nth, numba.config.NUMBA_NUM_THREADS))
                    outs.append(bits(columns.mul_mat_cols(cols, x, repacked)))
                assert all(np.array_equal(o, outs[0]) for o in outs[1:]), (qtype.name, T)
            stack = np.stack([w, weight_bytes(qtype, 200, 1536, rng), w])  # mul_mat_id: (group, tile) items
            cols = columns.layout(stack, qtype, sixbit=six, quads=True)
            ids = np.array([[0, 1], [1, 2], [1, 0]] * 4, np.int32)  # 12 tokens: expert 1 in 12 rows (tiled), 0 and 2 not
            x = acts(rng, 12, 1536).reshape(12, 1, 1536)
            outs = []
            for nth in (1, 2, 3):
                numba.set_num_threads(min(nth, numba.config.NUMBA_NUM_THREADS))
                outs.append(bits(columns.mul_mat_id_cols(cols, x, ids, repacked)))
            assert all(np.array_equal(o, outs[0]) for o in outs[1:]), (qtype.name, "mul_mat_id")
    finally:
        numba.set_num_threads(before)


def test_layout_is_refused_where_it_does_not_apply():
    rng = np.random.default_rng(5)
    w = weight_bytes(QT.Q4_K, 32, 256, rng)
    cols = columns.layout(w, QT.Q4_K)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    with pytest.raises(ValueError, match="column layout of Q4_K × 32 rows given for Q4_K × 16 rows"):
        mulmat.mul_mat(w[:16], QT.Q4_K, x, "avx512", repack=True, cols=cols)
    with pytest.raises(ValueError, match="Q4_1 has none"):
        columns.layout(weight_bytes(QT.Q4_1, 8, 64, rng), QT.Q4_1)
    assert columns.kind_for(QT.Q8_0, True) is None and columns.kind_for(QT.Q8_0, False) == columns.Q8_0_KIND
    q8 = weight_bytes(QT.Q8_0, 32, 256, rng)  # x86's Q8_0 kernel takes its values in quads, not in pairs (AArch64's)
    with pytest.raises(ValueError, match="Q8_0 in a plain buffer in pairs has no kernel here"):
        columns.mul_mat_cols(columns.layout(q8, QT.Q8_0), x, repacked=False)
    q4 = weight_bytes(QT.Q4_0, 32, 256, rng)
    with pytest.raises(ValueError, match="Q4_0 in a plain buffer has no kernel here"):
        columns.mul_mat_cols(columns.layout(q4, QT.Q4_0), x, repacked=False)
    # not repacked (--no-repack): Q4_0's plain-buffer kernel reads the stored rows, whatever layout is given
    want = mulmat.mul_mat(q4, QT.Q4_0, x, "avx512", repack=False)
    got = mulmat.mul_mat(q4, QT.Q4_0, x, "avx512", repack=False, cols=columns.layout(q4, QT.Q4_0))
    assert np.array_equal(bits(got), bits(want))


def test_the_model_is_laid_out_where_the_kernels_are():
    """``load_model(ggml=…)`` lays out the matrices llama.cpp repacks, experts included, and the K-quants of a plain
    buffer (with ``--no-repack``: all of them). (The logits with the layout equal llama.cpp's: tests/test_ggml_e2e.py,
    the converted files.)"""
    from refimpl.fixtures.builtin import fixture_path
    from refimpl.model.trunk import load_model

    path = fixture_path("tiny", "q4_k_m")
    laid = load_model(path, pack=True, ggml=("avx512", True))
    ffn = laid.weights.layers[0].ffn
    assert laid.packed_bytes > 0 and ffn.experts.down_exps.cols is not None and ffn.ffn_up_shexp.cols is not None
    qkv = laid.weights.layers[0].mixer.attn_qkv
    assert qkv.qtype == QT.Q8_0 and qkv.cols.quads  # Q8_0's vec_dot: its values in quads (kernels.ggml.columns_q8)
    assert laid.weights.output.qtype == QT.Q6_K and laid.weights.output.cols is not None  # vec_dot, laid out
    assert laid.weights.output.cols.sixbit == columns.sixbit_fast()  # in 6 bits where that is the faster
    from refimpl.graph.layout import layout_bytes

    assert layout_bytes(load_model(path, pack=False).weights, "avx512", True) == laid.packed_bytes  # what it weighs
    plain = load_model(path, pack=True, ggml=("avx512", False))
    assert 0 < plain.packed_bytes and plain.weights.layers[0].ffn.experts.down_exps.cols.qtype == QT.Q4_K


def test_interpreted_kernels_give_the_same_bits(tmp_path):
    """NUMBA_DISABLE_JIT=1 (every kernel as Python: coverage, pdb, the compiler ruled out): the layout and its
    products — the dots by their definitions, tiles split between threads by ``range`` — give the compiled bits."""
    rng = np.random.default_rng(9)
    cases = {}
    for qtype, repacked, T in ((QT.Q4_K, True, 5), (QT.MXFP4, True, 5), (QT.Q6_K, False, 3), (QT.Q5_K, False, 8)):
        w = weight_bytes(qtype, 40, 256, rng)
        x = acts(rng, T, 256)
        cases[qtype.name] = (w, x, columns.mul_mat_cols(columns.layout(w, qtype), x, repacked))
    w, x = weight_bytes(QT.Q6_K, 40, 256, rng), acts(rng, 2, 256)  # Q6_K's six-bit codes: whole sub-tiles and a tail
    cases["six"] = (w, x, columns.mul_mat_cols(columns.layout(w, QT.Q6_K, sixbit=True), x, False))
    w, x = weight_bytes(QT.Q8_0, 40, 256, rng), acts(rng, 2, 256)  # Q8_0's quads: x86's vec_dot
    cases["q8"] = (w, x, columns.mul_mat_cols(columns.layout(w, QT.Q8_0, quads=True), x, False))
    assert_interpreted(tmp_path, cases, "from kernels.ggml import columns; "
                       "np.savez('out.npz', six=columns.mul_mat_cols(columns.layout(z['six_0'], QT.Q6_K, sixbit=True), "
                       "z['six_1'], False), q8=columns.mul_mat_cols(columns.layout(z['q8_0'], QT.Q8_0, quads=True), "
                       "z['q8_1'], False), **{n: columns.mul_mat_cols(columns.layout(z[n + '_0'], QT[n]), "
                       "z[n + '_1'], n in ('Q4_K', 'MXFP4')) for n in ('Q4_K', 'MXFP4', 'Q6_K', 'Q5_K')})", 600)


def assert_interpreted(tmp_path, cases: dict, code: str, timeout: int) -> None:
    """``cases`` {name: (weights, activations, the compiled product)} saved as ``in.npz`` (``z[name + '_0']`` …);
    ``code`` run by a new Python under NUMBA_DISABLE_JIT=1 in ``tmp_path`` (numpy as ``np``, ``QT``, ``z`` given)
    writes ``out.npz``, whose ``name`` must equal the compiled product bit for bit."""
    import os
    import subprocess
    import sys

    np.savez(tmp_path / "in.npz", **{f"{n}_{i}": a for n, c in cases.items() for i, a in enumerate(c)})
    code = "import numpy as np; from gguf import GGMLQuantizationType as QT; z = np.load('in.npz'); " + code
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    out = np.load(tmp_path / "out.npz")
    for name, (_, _, compiled) in cases.items():
        assert np.array_equal(bits(out[name]), bits(compiled)), name
