"""Block emitters of the row-lane kernels for the codebook types IQ1_S … IQ3_S and the ternary
TQ1_0 / TQ2_0 (the rest: :mod:`kernels.lanes.blocks`).

Each mirrors its row decoder in :mod:`kernels.plain.dequant_iq`, value by value in increasing k, with the
same float32 operations: the sub-block scale first (``d · (0.5 + ls) · factor``, ``d · (1 + 2·ls)``,
``d · (2·ls + 1)``), then ``scale · grid value``, then the sign — the decoder's ``· (−1.0)``, done
here as the sign flip it is (``_Emit.negate_if``). Grid entries are gathered from constant tables
(one 32-bit word per lane: 4 grid values); the eighth sign bit of a 7-bit sign index
(``ksigns_iq2xs``) is the parity of the seven, computed rather than looked up.
"""

from __future__ import annotations

import numpy as np

from kernels.base.blocks_iq import GRID_IQ1S, GRID_IQ2S, GRID_IQ2XS, GRID_IQ2XXS, GRID_IQ3S, GRID_IQ3XXS, KSIGNS
from .ir import (_IQ1_M, _IQ1_S, _IQ2_S, _IQ2_XS, _IQ2_XXS, _IQ3_S, _IQ3_XXS, _TQ1_0, _TQ2_0, _Emit, _f32,
                       _i32, _Loop)


def _words(grid: np.ndarray) -> np.ndarray:
    """A grid (entries, 8 or 4 values) as little-endian uint32 words: 2 or 1 per entry, byte j = value j."""
    return np.ascontiguousarray(grid.astype(np.int8).view(np.uint8)).view(np.uint32).reshape(-1)


WORDS = {"iq2xxs": _words(GRID_IQ2XXS), "iq2xs": _words(GRID_IQ2XS), "iq2s": _words(GRID_IQ2S),
         "iq3xxs": _words(GRID_IQ3XXS), "iq3s": _words(GRID_IQ3S), "iq1s": _words(GRID_IQ1S)}
assert all(int(k) == (i | (bin(i).count("1") & 1) << 7) for i, k in enumerate(KSIGNS))  # the parity rule


def _f32c(e: _Emit, v: float):
    return e.const(float(v), _f32)


def _half_step(e: _Emit, d, ls, factor: float):
    """``half_step_scale``: ``d · (0.5 + ls) · factor`` in float32, left to right."""
    b = e.b
    return b.fmul(b.fmul(d, b.fadd(_f32c(e, 0.5), e.i2f(ls))), _f32c(e, factor))


def _signs8(e: _Emit, s7):
    """The 8 sign bits of a 7-bit index (``KSIGNS``): the seven, and their parity as bit 7."""
    b = e.b
    p = b.xor(s7, b.lshr(s7, e.const(4)))
    p = b.xor(p, b.lshr(p, e.const(2)))
    p = b.xor(p, b.lshr(p, e.const(1)))
    return b.or_(s7, b.shl(b.and_(p, e.const(1)), e.const(7)))


def _grid8(e: _Emit, name: str, g, scale, signs):
    """The 8 values ``(scale · grid[g, j]) · ±1`` (bit j of ``signs``), j = 0..7, of an 8-value grid."""
    b = e.b
    words = [e.table_words(name, WORDS[name], b.add(b.shl(g, e.const(1)), e.const(h))) for h in (0, 1)]
    for j in range(8):
        w = b.fmul(scale, e.i2f(e.byte(words[j // 4], j % 4)))
        yield j, e.negate_if(w, e.bits(signs, j, 1))


def _grid4(e: _Emit, name: str, g, scale, signs, shift: int):
    """The 4 values ``(scale · grid[g, j]) · ±1`` (bit shift + j of ``signs``) of a 4-value grid."""
    b = e.b
    word = e.table_words(name, WORDS[name], g)
    for j in range(4):
        yield j, e.negate_if(b.fmul(scale, e.i2f(e.byte(word, j))), e.bits(signs, shift + j, 1))


def _emit_iq2_xxs(e: _Emit):
    """``_deq_iq2_xxs``: d f16 at 0; sub-block s: four grid indices at 2 + 8s, then the uint32 a at
    6 + 8s (4 × 7-bit sign indices, scale a >> 28); db = d·(0.5 + ls)·0.25;
    w[32s + 8l + j] = (db · iq2xxs_grid[g_l][j]) · ±1."""
    b = e.b
    d = e.f16(e.dwords(0)[0], high=False)

    def sub(e, s):
        gw = e.dwords(2, dyn=b.mul(s, e.const64(8)))[0]
        a = e.dwords(6, dyn=b.mul(s, e.const64(8)))[0]
        db = _half_step(e, d, b.lshr(a, e.const(28)), 0.25)
        for l in range(4):
            for j, w in _grid8(e, "iq2xxs", e.byte(gw, l), db, _signs8(e, e.bits(a, 7 * l, 7))):
                yield 8 * l + j, w

    yield _Loop(8, 32, sub)


def _db_table(e: _Emit, d, scale_words, half_step: bool):
    """IQ2_XS / IQ2_S: a table of db0, db1 (scale nibbles low, high) of the 8 sub-blocks, whose scale
    bytes are ``scale_words`` (two dwords)."""
    out = []
    for s in range(8):
        sc = e.byte(scale_words[s // 4], s % 4)
        out += [_half_step(e, d, e.b.and_(sc, e.const(15)), 0.25), _half_step(e, d, e.b.lshr(sc, e.const(4)), 0.25)]
    return e.table(out)


def _emit_iq2_xs(e: _Emit):
    """``_deq_iq2_xs``: d at 0; qs[4s + l] (uint16 at 2 + 8s + 2l) = 9-bit grid index | 7-bit sign index
    << 9; scales at 66 (low nibble for l = 0, 1, high for l = 2, 3): w = (db · iq2xs_grid[g][j]) · ±1."""
    b = e.b
    d = e.f16(e.dwords(0)[0], high=False)
    table = _db_table(e, d, e.dwords(66, 2), True)

    def sub(e, s):
        qs = e.dwords(2, 2, dyn=b.mul(s, e.const64(8)))
        for l in range(4):
            q = e.bits(qs[l // 2], 16 * (l % 2), 16)
            db = e.pick(table, b.add(b.mul(s, e.const64(2)), e.const64(l // 2)))
            for j, w in _grid8(e, "iq2xs", b.and_(q, e.const(511)), db, _signs8(e, b.lshr(q, e.const(9)))):
                yield 8 * l + j, w

    yield _Loop(8, 32, sub)


def _byte_table(e: _Emit, words):
    """A table of the 8 bytes held by two dwords (per-sub-block bytes read inside a ``_Loop``)."""
    return e.table([e.byte(words[s // 4], s % 4) for s in range(8)])


def _emit_iq2_s(e: _Emit):
    """``_deq_iq2_s``: d at 0, qs at 2, signs at 34, qh at 66, scales at 74; grid index =
    qs[4s + l] | ((qh[s] >> 2l) & 3) << 8 (iq2s_grid), sign bits signs[4s + l]:
    w = (db · grid[j]) · ±1, db as IQ2_XS."""
    b = e.b
    d = e.f16(e.dwords(0)[0], high=False)
    table = _db_table(e, d, e.dwords(74, 2), True)
    qh_table = _byte_table(e, e.dwords(66, 2))

    def sub(e, s):
        qs = e.dwords(2, dyn=b.mul(s, e.const64(4)))[0]
        signs = e.dwords(34, dyn=b.mul(s, e.const64(4)))[0]
        qh = e.pick(qh_table, s)
        for l in range(4):
            g = b.or_(e.byte(qs, l), b.shl(e.bits(qh, 2 * l, 2), e.const(8)))
            db = e.pick(table, b.add(b.mul(s, e.const64(2)), e.const64(l // 2)))
            for j, w in _grid8(e, "iq2s", g, db, e.byte(signs, l)):
                yield 8 * l + j, w

    yield _Loop(8, 32, sub)


def _emit_iq3_xxs(e: _Emit):
    """``_deq_iq3_xxs``: d at 0; grid indices qs[8s + 2l], qs[8s + 2l + 1] (at 2) for values
    32s + 8l + 0..3 and + 4..7; the uint32 a_s at 66 + 4s as in IQ2_XXS; db = d·(0.5 + ls)·0.5."""
    b = e.b
    d = e.f16(e.dwords(0)[0], high=False)

    def sub(e, s):
        qs = e.dwords(2, 2, dyn=b.mul(s, e.const64(8)))
        a = e.dwords(66, dyn=b.mul(s, e.const64(4)))[0]
        db = _half_step(e, d, b.lshr(a, e.const(28)), 0.5)
        for l in range(4):
            signs = _signs8(e, e.bits(a, 7 * l, 7))
            for half in (0, 1):
                i = 2 * l + half
                for j, w in _grid4(e, "iq3xxs", e.byte(qs[i // 4], i % 4), db, signs, 4 * half):
                    yield 8 * l + 4 * half + j, w

    yield _Loop(8, 32, sub)


def _emit_iq3_s(e: _Emit):
    """``_deq_iq3_s``: d at 0, qs at 2, qh at 66, signs at 74, scales at 106; db = d · float32(1 + 2·nibble);
    values 32s + 8l + 0..3 use grid index qs[8s + 2l] | ((qh[s] >> 2l) & 1) << 8, + 4..7 use
    qs[8s + 2l + 1] | ((qh[s] >> (2l + 1)) & 1) << 8 (iq3s_grid); sign bits signs[4s + l]."""
    b = e.b
    d = e.f16(e.dwords(0)[0], high=False)
    sc = e.dwords(106)[0]
    table = e.table([b.fmul(d, e.i2f(b.add(b.shl(e.bits(sc, 4 * s, 4), e.const(1)), e.const(1)))) for s in range(8)])
    qh_table = _byte_table(e, e.dwords(66, 2))

    def sub(e, s):
        qs = e.dwords(2, 2, dyn=b.mul(s, e.const64(8)))
        signs = e.dwords(74, dyn=b.mul(s, e.const64(4)))[0]
        qh, db = e.pick(qh_table, s), e.pick(table, s)
        for l in range(4):
            byte_signs = e.byte(signs, l)
            for half in (0, 1):
                i = 2 * l + half
                g = b.or_(e.byte(qs[i // 4], i % 4), b.shl(e.bits(qh, i, 1), e.const(8)))
                for j, w in _grid4(e, "iq3s", g, db, byte_signs, 4 * half):
                    yield 8 * l + 4 * half + j, w

    yield _Loop(8, 32, sub)


def _iq1_values(e: _Emit, g, dl, negative):
    """``_put_iq1``: the 8 values ``dl · (iq1s_grid[g, j] + δ)``, δ = −0.125 where ``negative`` (≠ 0), else 0.125."""
    b = e.b
    delta = b.select(b.icmp_unsigned("!=", negative, e.const(0)), _f32c(e, -0.125), _f32c(e, 0.125))
    words = [e.table_words("iq1s", WORDS["iq1s"], b.add(b.shl(g, e.const(1)), e.const(h))) for h in (0, 1)]
    for j in range(8):
        yield j, b.fmul(dl, b.fadd(e.i2f(e.sbyte(words[j // 4], j % 4)), delta))


def _emit_iq1_s(e: _Emit):
    """``_deq_iq1_s``: d at 0, qs at 2, qh[s] (uint16) at 34 + 2s = 3-bit index parts | scale << 12 |
    shift sign << 15; dl = d · float32(2·scale + 1); grid index qs[4s + l] | ((qh >> 3l) & 7) << 8."""
    b = e.b
    d = e.f16(e.dwords(0)[0], high=False)
    qw = e.dwords(34, 4)
    qh_table = e.table([e.bits(qw[s // 2], 16 * (s % 2), 16) for s in range(8)])

    def sub(e, s):
        qs = e.dwords(2, dyn=b.mul(s, e.const64(4)))[0]
        qh = e.pick(qh_table, s)
        dl = b.fmul(d, e.i2f(b.add(b.shl(e.bits(qh, 12, 3), e.const(1)), e.const(1))))
        negative = b.and_(qh, e.const(0x8000))
        for l in range(4):
            g = b.or_(e.byte(qs, l), b.shl(e.bits(qh, 3 * l, 3), e.const(8)))
            for j, w in _iq1_values(e, g, dl, negative):
                yield 8 * l + j, w

    yield _Loop(8, 32, sub)


def _emit_iq1_m(e: _Emit):
    """``_deq_iq1_m``: qs at 0, qh at 32, four uint16 sc at 48 (their top nibbles: the f16 d); sub-block s:
    scales ``sc[s // 2] >> 6(s & 1)``: dl0 = d · float32(2·(x & 7) + 1) for values 32s … + 15, dl1 with
    (x >> 3) & 7 for the next 16; group l: nibble (qh[2s + l // 2] >> 4(l & 1)) & 15 = 3 index bits | shift sign."""
    b = e.b
    scw = e.dwords(48, 2)
    sc = [e.bits(scw[i // 2], 16 * (i % 2), 16) for i in range(4)]
    bits = b.or_(b.or_(b.lshr(sc[0], e.const(12)), b.and_(b.lshr(sc[1], e.const(8)), e.const(0xF0))),
                 b.or_(b.and_(b.lshr(sc[2], e.const(4)), e.const(0xF00)), b.and_(sc[3], e.const(0xF000))))
    d = e.f16(bits, high=False)
    dls = []
    for s in range(8):
        x = b.lshr(sc[s // 2], e.const(6 * (s & 1)))
        for shift in (0, 3):
            dls.append(b.fmul(d, e.i2f(b.add(b.shl(e.bits(x, shift, 3), e.const(1)), e.const(1)))))
    table = e.table(dls)
    qhw = e.dwords(32, 4)
    qh_table = e.table([e.bits(qhw[s // 2], 16 * (s % 2), 16) for s in range(8)])  # qh[2s] | qh[2s + 1] << 8

    def sub(e, s):
        qs = e.dwords(0, dyn=b.mul(s, e.const64(4)))[0]
        qh = e.pick(qh_table, s)
        for l in range(4):
            nib = e.bits(qh, 4 * l, 4)
            g = b.or_(e.byte(qs, l), b.shl(b.and_(nib, e.const(7)), e.const(8)))
            dl = e.pick(table, b.add(b.mul(s, e.const64(2)), e.const64(l // 2)))
            for j, w in _iq1_values(e, g, dl, b.and_(nib, e.const(8))):
                yield 8 * l + j, w

    yield _Loop(8, 32, sub)


def _tq1_digit(e: _Emit, byte, mult):
    """``tq1_digit``: ``((byte · 3^n) & 255) · 3 >> 8`` (``mult`` = 3^n lanes), minus 1."""
    b = e.b
    m = b.and_(b.mul(byte, mult), e.const(255))
    return b.sub(b.lshr(b.add(b.shl(m, e.const(1)), m), e.const(8)), e.const(1))


def _emit_tq1_0(e: _Emit):
    """``_deq_tq1_0``: qs at 0, qh at 48, d f16 at 52; w = d · float32(digit − 1) with digit n of byte
    qs[m] → value 32n + m (m < 32), of qs[32 + m] → 160 + 16n + m (m < 16), of qh[m] → 240 + 4n + m."""
    b = e.b
    d = e.f16(e.dwords(50)[0], high=True)
    pow3 = e.table([e.const(3 ** n) for n in range(5)])

    def first(e, n):  # values 32n … 32n + 31
        mult = e.pick(pow3, n)
        for j4, dw in enumerate(e.dwords(0, 8)):
            for k in range(4):
                yield 4 * j4 + k, b.fmul(d, e.i2f(_tq1_digit(e, e.byte(dw, k), mult)))

    def second(e, n):  # values 160 + 16n … + 15
        mult = e.pick(pow3, n)
        for j4, dw in enumerate(e.dwords(32, 4)):
            for k in range(4):
                yield 160 + 4 * j4 + k, b.fmul(d, e.i2f(_tq1_digit(e, e.byte(dw, k), mult)))

    yield _Loop(5, 32, first)
    yield _Loop(5, 16, second)
    qh = e.dwords(48)[0]
    for n in range(4):
        for m in range(4):
            yield 240 + 4 * n + m, b.fmul(d, e.i2f(_tq1_digit(e, e.byte(qh, m), e.const(3 ** n))))


def _emit_tq2_0(e: _Emit):
    """``_deq_tq2_0``: qs at 0, d f16 at 64; w[128c + 32l + m] = d · float32(((qs[32c + m] >> 2l) & 3) − 1)."""
    b = e.b
    d = e.f16(e.dwords(62)[0], high=True)

    def half(e, c):
        qs = e.dwords(0, 8, dyn=b.mul(c, e.const64(32)))
        for l in range(4):
            for j4, dw in enumerate(qs):
                for k in range(4):
                    yield 32 * l + 4 * j4 + k, b.fmul(d, e.i2f(b.sub(e.bits(dw, 8 * k + 2 * l, 2), e.const(1))))

    yield _Loop(2, 128, half)


IQ_EMITTERS = {_IQ2_XXS: _emit_iq2_xxs, _IQ2_XS: _emit_iq2_xs, _IQ2_S: _emit_iq2_s, _IQ3_XXS: _emit_iq3_xxs,
               _IQ3_S: _emit_iq3_s, _IQ1_S: _emit_iq1_s, _IQ1_M: _emit_iq1_m, _TQ1_0: _emit_tq1_0, _TQ2_0: _emit_tq2_0}
