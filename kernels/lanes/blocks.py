"""Per-type block emitters of the row-lane kernels: the plain floats, the 32-value blocks and the
K-quants (the codebook and ternary types: :mod:`kernels.lanes.blocks_iq`), and the intrinsics.

Each emitter yields, in increasing k, (k within the block, <lanes x float> weights) computed with
the float32 operations of the row decoder in :mod:`kernels.plain.dequant` (or float64 weights, where
those are provably the same numbers: :mod:`kernels.lanes.exact64`); :func:`kernels.lanes.ir._block_kernel`
turns it into intrinsics for raw rows (gathers) or packed words, accumulating or decoding.

Two identities the emitters use, each exact for the reason given where it is used:

* ``fma32(a, q, c)`` for the decoder's ``a·q + c`` / ``a·q − m`` when ``a·q`` is exact in float32
  (few significant bits): then rounding once equals rounding the product (exactly) and then the sum.
* ``float32(q − c)`` for the decoder's ``float32(q) − c`` with small integers q, c (both exact).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from kernels.plain.dequant import IQ4NL_VALUES, MXFP4_VALUES
from .blocks_iq import IQ_EMITTERS
from .exact64 import (_by_scaled_codes, _by_table64, _k_quant_chunk64, _k_quant_exact, _neg_scaled_magic, _offset_codes64,
                            _offset_factors, _scaled_codes, _table_nibbles64)
from .ir import (_BF16, _F16, _F32, _IQ4_NL, _IQ4_XS, _MXFP4, _Q2_K, _Q3_K, _Q4_0, _Q4_1, _Q4_K, _Q5_0, _Q5_1,
                       _Q5_K, _Q6_K, _Q8_0, ISA_AVX512, ISA_GENERIC, _block_kernel, _Emit, _f16, _f32, _f64, _i16, _i32,
                       _i64, _Choice, _Loop, _PackedEmit)

# --------------------------------------------------------------------------------------------
# Plain floats: a "block" of 16 values


def _emit_f32(e: _Emit):
    """F32 (the routers): the stored values themselves."""
    for j, dw in enumerate(e.dwords(0, 16)):
        yield j, e.b.bitcast(dw, e.vec(_f32))


def _emit_f16(e: _Emit):
    """``_deq_f16``: the binary16 values, converted exactly (``fpext``). A NaN keeps its payload here
    where the row decoder makes it the canonical NaN: the output is NaN either way."""
    b = e.b
    for i, dw in enumerate(e.dwords(0, 8)):
        for high in (False, True):
            half = b.trunc(b.lshr(dw, e.const(16)) if high else dw, e.vec(_i16))
            yield 2 * i + high, b.fpext(b.bitcast(half, e.vec(_f16)), e.vec(_f32))


def _emit_bf16(e: _Emit):
    """``_deq_bf16``: value = the float32 whose bits are ``u16 << 16``."""
    b = e.b
    for i, dw in enumerate(e.dwords(0, 8)):
        yield 2 * i, b.bitcast(b.shl(dw, e.const(16)), e.vec(_f32))
        yield 2 * i + 1, b.bitcast(b.and_(dw, e.const(0xFFFF0000 - (1 << 32))), e.vec(_f32))


# --------------------------------------------------------------------------------------------
# 32-value blocks


def _nibbles(e: _Emit, dws, value):
    """The 32 values of a block whose 16 bytes ``dws`` (4 dwords) hold value j in the low nibble of byte
    j and value j + 16 in the high nibble: yields (j, value(high, q, j)) in increasing j."""
    for high in (0, 1):
        for j4, dw in enumerate(dws):
            for k in range(4):
                j = 4 * j4 + k
                yield 16 * high + j, value(high, e.bits(dw, 8 * k + 4 * high, 4), j)


def _emit_q8_0(e: _Emit):
    """``_deq_q8_0``: w[j] = float32(qs[j]) * d, j = 0..31; d f16 at byte 0, qs at byte 2."""
    d = e.f16(e.dwords(0)[0], high=False)
    for j4, dw in enumerate(e.dwords(2, 8)):
        for k in range(4):
            yield 4 * j4 + k, e.b.fmul(e.s2f(e.sbyte(dw, k)), d)


def _emit_q8_0_codes(e: _PackedEmit):
    """Q8_0 from its packed codes (``_pack_q8_0``): the LANES rows' codes of column j are LANES bytes
    side by side; w[j] = qs[j] · d formed in float64 — the row decoder's float32 product is exact
    (|qs| ≤ 128: ≤ 7 significant bits; d an f16: ≤ 11), so this is the same number (as for Q6_K,
    ``_emit_q6_k_codes``). Below AVX-512, with every lane's d finite, by ``_scaled_codes``."""
    b = e.b
    d32 = b.bitcast(e.words(8)[0], e.vec(_f32))
    d = b.fpext(d32, e.vec(_f64))

    def fast():
        neg_dm = _neg_scaled_magic(e, d)
        for j in range(32):
            yield j, _scaled_codes(e, e.codes(e.const64(j)), d, neg_dm)

    def general():
        for j in range(32):
            yield j, b.fmul(_int8_to_f64(e, e.codes(e.const64(j))), d)

    yield from _by_scaled_codes(e, d32, fast(), general())


def _emit_q4_0(e: _Emit):
    """``_deq_q4_0``: w = d * (float32(q) − 8), q the nibbles of qs (byte 2); d f16 at byte 0."""
    d = e.f16(e.dwords(0)[0], high=False)
    yield from _nibbles(e, e.dwords(2, 4), lambda high, q, j: e.b.fmul(d, e.i2f(e.b.sub(q, e.const(8)))))


def _emit_q4_1(e: _Emit):
    """``_deq_q4_1``: w = d * float32(q) + m (d, m f16 at bytes 0, 2; qs at 4): ``fma32``, as d·q has
    ≤ 11 + 4 significant bits."""
    dm = e.dwords(0)[0]
    d, m = e.f16(dm, high=False), e.f16(dm, high=True)
    yield from _nibbles(e, e.dwords(4, 4), lambda high, q, j: e.fma32(d, e.i2f(q), m))


def _fifth_bit(e: _Emit, qh, bit: int):
    """``((qh >> bit) & 1) << 4`` per lane."""
    b = e.b
    shifted = b.lshr(qh, e.const(bit - 4)) if bit >= 4 else b.shl(qh, e.const(4 - bit))
    return b.and_(shifted, e.const(16))


def _emit_q5_0(e: _Emit):
    """``_deq_q5_0``: w = d * (float32(q) − 16), q = nibble | bit j (or j + 16) of qh << 4; d at 0,
    qh (uint32) at 2, qs at 6."""
    d = e.f16(e.dwords(0)[0], high=False)
    qh = e.dwords(2)[0]
    yield from _nibbles(e, e.dwords(6, 4), lambda high, q, j: e.b.fmul(
        d, e.i2f(e.b.sub(e.b.or_(q, _fifth_bit(e, qh, j + 16 * high)), e.const(16)))))


def _emit_q5_1(e: _Emit):
    """``_deq_q5_1``: w = d * float32(q) + m (``fma32``: d·q ≤ 11 + 5 bits); d, m at 0, 2, qh at 4, qs at 8."""
    dm = e.dwords(0)[0]
    d, m = e.f16(dm, high=False), e.f16(dm, high=True)
    qh = e.dwords(4)[0]
    yield from _nibbles(e, e.dwords(8, 4), lambda high, q, j: e.fma32(d, e.i2f(e.b.or_(q, _fifth_bit(e, qh, j + 16 * high))), m))


def _table_nibbles(e: _Emit, dws, name: str, values, scale):
    """``_nibbles`` for a 16-entry table of small integers: the values ``scale * float32(values[nibble])``.
    At AVX-512 each nibble is looked up with one ``vpermps`` (``lookup16``); at AVX2 every byte's two
    nibbles are looked up at once (``byte_table16``: one ``vpshufb`` per four values), then each value
    is the signed byte converted; the generic twin gathers each from a table (``lookup16``). The same
    float32 table values every way."""
    b = e.b
    if e.isa == ISA_GENERIC:
        yield from _nibbles(e, dws, lambda high, q, j: b.fmul(scale, e.lookup16(name, values, q)))
        return
    if e.isa == ISA_AVX512:  # vpermps reads the low 4 bits of each index: a shift, no mask
        for high in (0, 1):
            for j4, dw in enumerate(dws):
                for k in range(4):
                    shift = 8 * k + 4 * high
                    yield 16 * high + 4 * j4 + k, b.fmul(scale, e.lookup16(name, values, b.lshr(dw, e.const(shift)) if shift else dw))
        return
    nib = e.const(0x0F0F0F0F)
    for high in (0, 1):
        for j4, dw in enumerate(dws):
            looked_up = e.byte_table16(values, b.and_(b.lshr(dw, e.const(4)) if high else dw, nib))
            for k in range(4):
                yield 16 * high + 4 * j4 + k, b.fmul(scale, e.i2f(e.sbyte(looked_up, k)))


def _emit_iq4_nl(e: _Emit):
    """``_deq_iq4_nl``: w = d * KV[nibble] (the IQ4_NL table, ``_table_nibbles``); d at 0, qs at 2."""
    d = e.f16(e.dwords(0)[0], high=False)
    dws = e.dwords(2, 4)
    yield from _by_table64(e, e.all_finite(d), _table_nibbles64(e, dws, IQ4NL_VALUES, d),
                           _table_nibbles(e, dws, "iq4nl_values", IQ4NL_VALUES, d))


def _emit_mxfp4(e: _Emit):
    """``_deq_mxfp4``: w[j] = d * K[qs[j] & 15], w[j+16] = d * K[qs[j] >> 4], j = 0..15; qs at byte 1,
    d = E8M0_HALF[e] for the exponent byte e at 0: the float32 bits ``(e − 1) << 23``, or
    ``0x00200000 << e`` for e < 2 (a denormal), as ``floats.E8M0_HALF``.

    K = MXFP4_VALUES (0, 1, 2, 3, 4, 6, 8, 12, then the negatives): on x86 ``_table_nibbles``, in
    generic IR the arithmetic ``_mxfp4_value``."""
    b = e.b
    ex = e.byte(e.dwords(0)[0], 0)
    d_bits = b.select(b.icmp_unsigned("<", ex, e.const(2)), b.shl(e.const(0x00200000), ex),
                      b.shl(b.sub(ex, e.const(1)), e.const(23)))
    d = b.bitcast(d_bits, e.vec(_f32))
    dws = e.dwords(1, 4)
    if e.isa != ISA_GENERIC:  # e ≤ 248: d ≤ 2^120, no product overflows (real files: e ≈ 110–135)
        yield from _by_table64(e, e.all_lanes(b.icmp_unsigned("<=", ex, e.const(248))), _table_nibbles64(e, dws, MXFP4_VALUES, d),
                               _table_nibbles(e, dws, "mxfp4_values", MXFP4_VALUES, d))
        return
    for high in (0, 1):
        for j4 in range(4):
            for k in range(4):
                yield 16 * high + 4 * j4 + k, b.fmul(d, _mxfp4_value(e, e.bits(dws[j4], 8 * k + 4 * high, 4)))


def _mxfp4_int(e: _Emit, code):
    """<lanes x i32> MXFP4_VALUES[code] in target-independent arithmetic: magnitude
    ``((2 | (c & 1)) << (c >> 1)) >> 1``, c = code & 7, 0 for c = 0; negative when bit 3 is set."""
    b = e.b
    c = b.and_(code, e.const(7))
    mag = b.lshr(b.shl(b.or_(e.const(2), b.and_(c, e.const(1))), b.lshr(c, e.const(1))), e.const(1))
    mag = b.select(b.icmp_unsigned("==", c, e.const(0)), e.const(0), mag)
    return b.select(b.icmp_unsigned("!=", b.and_(code, e.const(8)), e.const(0)), b.neg(mag), mag)


def _mxfp4_value(e: _Emit, code):
    """<lanes x float> MXFP4_VALUES[code] (``_mxfp4_int``, converted exactly)."""
    return e.s2f(_mxfp4_int(e, code))


# --------------------------------------------------------------------------------------------
# 256-value super-blocks


def _emit_q2_k(e: _Emit):
    """``_deq_q2_k``: sixteen scale bytes at 0 (sc = low nibble, m = high), qs at 16, d, dmin f16 at 80;
    for n = 0..1, shift j = 0..3, h = 0..1, l = 0..15 with group g = 8n + 2j + h:
    w[128n + 32j + 16h + l] = (d·sc[g]) * float32((qs[32n + 16h + l] >> 2j) & 3) − dmin·m[g]
    (``fma32``: d·sc·q ≤ 11 + 4 + 2 significant bits)."""
    b = e.b
    dd = e.dwords(80)[0]
    d, dmin = e.f16(dd, high=False), e.f16(dd, high=True)
    sw = e.dwords(0, 4)
    factors = []  # d·sc[g], dmin·m[g]
    for g in range(16):
        sc = e.byte(sw[g // 4], g % 4)
        factors += [b.fmul(d, e.i2f(b.and_(sc, e.const(15)))), b.fmul(dmin, e.i2f(b.lshr(sc, e.const(4))))]
    table = e.table(factors)

    def half(e, n):  # values 128n … 128n + 127
        qs = e.dwords(16, 8, dyn=b.mul(n, e.const64(32)))
        for j in range(4):
            for h in range(2):
                g2 = b.add(b.mul(n, e.const64(16)), e.const64(2 * (2 * j + h)))  # 2·g, g = 8n + 2j + h
                dl, ml = e.pick(table, g2), e.pick(table, b.add(g2, e.const64(1)))
                neg_ml = b.fneg(ml)
                for l in range(16):
                    q = e.bits(qs[4 * h + l // 4], 8 * (l % 4) + 2 * j, 2)
                    yield 32 * j + 16 * h + l, e.fma32(dl, e.i2f(q), neg_ml)

    yield _Loop(2, 128, half)


def _emit_q3_k(e: _Emit):
    """``_deq_q3_k``: hmask at 0, qs at 32, twelve scale bytes at 96 (``_q3_k_scale``), d f16 at 108;
    for n = 0..1, j = 0..3, h = 0..1, l = 0..15 with group g = 8n + 2j + h and ll = 16h + l:
    w[128n + 32j + ll] = (d·(sc[g] − 32)) * q, q = ((qs[32n + ll] >> 2j) & 3) − (0 if bit 4n + j of
    hmask[ll] else 4). The codes of four consecutive ll are assembled at once, one per byte, as
    (q + 4) with bit 2 flipped: read as 3-bit two's complement that is q."""
    b = e.b
    d = e.f16(e.dwords(106)[0], high=True)
    sw = e.dwords(96, 3)
    sbyte = [e.byte(sw[i // 4], i % 4) for i in range(12)]
    dl = []
    for g in range(16):
        low = b.and_(b.lshr(sbyte[g & 7], e.const(4 * (g >> 3))), e.const(15))
        high = b.and_(b.lshr(sbyte[8 + (g & 3)], e.const(2 * (g >> 2))), e.const(3))
        dl.append(b.fmul(d, e.i2f(b.sub(b.or_(low, b.shl(high, e.const(4))), e.const(32)))))
    table = e.table(dl)
    two, one, four = e.const(0x03030303), e.const(0x01010101), e.const(0x04040404)

    def half(e, n):  # values 128n … 128n + 127
        qs = e.dwords(32, 8, dyn=b.mul(n, e.const64(32)))
        hm = e.dwords(0, 8)
        for j in range(4):
            hshift = b.trunc(b.add(b.mul(n, e.const64(4)), e.const64(j)), _i32)
            for h in range(2):
                scale = e.pick(table, b.add(b.mul(n, e.const64(8)), e.const64(2 * j + h)))
                for l4 in range(4):
                    lo = b.and_(b.lshr(qs[4 * h + l4], e.const(2 * j)) if j else qs[4 * h + l4], two)
                    hi = b.and_(b.lshr(hm[4 * h + l4], e.splat(hshift, _i32)), one)
                    codes = b.xor(b.or_(lo, b.shl(hi, e.const(2))), four)
                    for k in range(4):
                        q = b.ashr(b.shl(codes, e.const(29 - 8 * k)), e.const(29))
                        yield 32 * j + 16 * h + 4 * l4 + k, b.fmul(scale, e.i2f(q))

    yield _Loop(2, 128, half)


def _k_scale_min(e: _Emit, sw):
    """``k_scale_min`` for the 8 sub-blocks from the three dwords ``sw`` of the 12 scale bytes: [(sc, m)]."""
    b = e.b
    s = [e.byte(sw[j // 4], j % 4) for j in range(12)]
    out = []
    for j in range(8):
        if j < 4:
            out.append((b.and_(s[j], e.const(63)), b.and_(s[j + 4], e.const(63))))
        else:
            sc = b.or_(b.and_(s[j + 4], e.const(15)), b.shl(b.lshr(s[j - 4], e.const(6)), e.const(4)))
            m = b.or_(b.lshr(s[j + 4], e.const(4)), b.shl(b.lshr(s[j], e.const(6)), e.const(4)))
            out.append((sc, m))
    return out


def _k_factors(e: _Emit):
    """Q4_K / Q5_K: a table of d·sc[j], −dmin·m[j] for the 8 sub-blocks (d, dmin f16 at 0, 2; scales at 4),
    and d, dmin (float32 lanes)."""
    b = e.b
    dd = e.dwords(0)[0]
    d, dmin = e.f16(dd, high=False), e.f16(dd, high=True)
    factors = []
    for sc, m in _k_scale_min(e, e.dwords(4, 3)):
        factors += [b.fmul(d, e.u2f(sc)), b.fneg(b.fmul(dmin, e.u2f(m)))]
    return e.table(factors), d, dmin


def _in_place_nibble(e: _Emit, dw, shift: int):
    """The nibble at bit ``shift`` of each dword, left in place: ``q · 2^shift`` (one ``and``), or for the
    top nibble ``q`` itself (one shift: in place it would be the sign bit). With ``_in_place_scale``'s
    scale the product is the same exact ``scale · q``."""
    return e.b.lshr(dw, e.const(28)) if shift == 28 else e.b.and_(dw, e.const(15 << shift))


def _in_place_scale(e: _Emit, scale, shift: int):
    """``scale · 2^−shift`` for ``_in_place_nibble`` (exact: a power of two, and the K-quant scales
    d·sc ≥ 2^−24 or 0 stay far above float32's smallest normal, 2^−126, for shift ≤ 24)."""
    if shift in (0, 28):
        return scale
    return e.b.fmul(scale, e.const(2.0 ** -shift, _f32))


def _emit_q4_k(e: _Emit):
    """``_deq_q4_k``: d, dmin f16 at bytes 0, 2; twelve scale bytes at 4 packing 6-bit (sc, m) for
    the 8 sub-blocks (``k_scale_min``); for c = 0..3, l = 0..31 with byte = qs[32c + l] (qs at 16):
    w[64c + l] = (d·sc[2c]) * float32(byte & 15) − dmin·m[2c];
    w[64c + 32 + l] = (d·sc[2c+1]) * float32(byte >> 4) − dmin·m[2c+1]
    (``fma32``: d·sc·q has ≤ 11 + 6 + 4 significant bits). Where the float32 result is exact for every
    code — ``_k_quant_exact``, which llama-quantize's blocks meet — formed in float64 instead
    (``_k_quant_chunk64``)."""
    b = e.b
    table, d, dmin = _k_factors(e)

    def chunk(e, c):  # c = 0..3: values 64c … 64c+63
        for high in (0, 1):
            sub = b.add(b.mul(c, e.const64(4)), e.const64(2 * high))
            dsc, neg_dmm = e.pick(table, sub), e.pick(table, b.add(sub, e.const64(1)))
            scaled = [_in_place_scale(e, dsc, 8 * k + 4 * high) for k in range(4)]
            for j4 in range(8):
                dw = e.dwords(16 + 4 * j4, dyn=b.mul(c, e.const64(32)))[0]  # read where used (fewer live registers)
                for k in range(4):
                    q = _in_place_nibble(e, dw, 8 * k + 4 * high)
                    yield 32 * high + 4 * j4 + k, e.fma32(scaled[k], e.i2f(q), neg_dmm)

    def codes64(e, c):  # the nibbles of each byte, one per byte
        nib = e.const(0x0F0F0F0F)

        def codes(high, j4):
            dw = e.dwords(16 + 4 * j4, dyn=b.mul(c, e.const64(32)))[0]
            return b.and_(b.lshr(dw, e.const(4)) if high else dw, nib)
        return _k_quant_chunk64(e, table, c, codes)

    yield _Choice(_k_quant_exact(e, d, dmin, 4), iter([_Loop(4, 64, codes64)]), iter([_Loop(4, 64, chunk)]))


def _emit_q5_k(e: _Emit):
    """``_deq_q5_k``: as Q4_K (qs at 48) plus a fifth bit: bit 2c (low nibbles) or 2c + 1 (high) of
    qh[l] (qh at 16), times 16 (``fma32``: ≤ 11 + 6 + 5 significant bits); in float64 where
    ``_k_quant_exact`` holds, as Q4_K."""
    b = e.b
    table, d, dmin = _k_factors(e)

    def chunk(e, c):
        dws = e.dwords(48, 8, dyn=b.mul(c, e.const64(32)))
        qh = e.dwords(16, 8)
        for high in (0, 1):
            sub = b.add(b.mul(c, e.const64(4)), e.const64(2 * high))
            dsc, neg_dmm = e.pick(table, sub), e.pick(table, b.add(sub, e.const64(1)))
            # bit 2c + high of byte k, moved to bit 4 of the lane: (qh >> (8k + 2c + high − 4)) & 16
            shifts = [b.trunc(b.add(b.mul(c, e.const64(2)), e.const64(8 * k + high)), _i32) for k in range(4)]
            for j4 in range(8):
                for k in range(4):
                    q = e.bits(dws[j4], 8 * k + 4 * high, 4)
                    fifth = b.and_(b.shl(b.lshr(qh[j4], e.splat(shifts[k], _i32)), e.const(4)), e.const(16))
                    yield 32 * high + 4 * j4 + k, e.fma32(dsc, e.i2f(b.or_(q, fifth)), neg_dmm)

    def codes64(e, c):  # nibble | fifth bit << 4, one code per byte
        dws = e.dwords(48, 8, dyn=b.mul(c, e.const64(32)))
        qh = e.dwords(16, 8)

        def codes(high, j4):
            bit = e.splat(b.trunc(b.add(b.mul(c, e.const64(2)), e.const64(high)), _i32), _i32)  # bit 2c + high of each qh byte
            fifth = b.shl(b.and_(b.lshr(qh[j4], bit), e.const(0x01010101)), e.const(4))
            return b.or_(b.and_(b.lshr(dws[j4], e.const(4)) if high else dws[j4], e.const(0x0F0F0F0F)), fifth)
        return _k_quant_chunk64(e, table, c, codes)

    yield _Choice(_k_quant_exact(e, d, dmin, 5), iter([_Loop(4, 64, codes64)]), iter([_Loop(4, 64, chunk)]))


def _q6_k_words(e: _Emit, ql0, ql1, qh, flip: bool):
    """128 codes of a Q6_K block, four at a time in increasing k, from half n's 8 dwords ql0 (ql at byte
    64n), ql1 (64n + 32) and qh (128 + 32n): yields (k − 128n, group − 8n, an int32 word per lane
    whose byte i is code k + i), ``_deq_q6_k``'s assembly — for n = 0..1, l = 0..31 with
    ql0 = ql[64n + l], ql1 = ql[64n + 32 + l], qh = qh[32n + l]:
    q[128n + l] = (ql0 & 15) | ((qh & 3) << 4), q[128n + 32 + l] = (ql1 & 15) | (((qh >> 2) & 3) << 4),
    q[128n + 64 + l] = (ql0 >> 4) | (((qh >> 4) & 3) << 4), q[128n + 96 + l] = (ql1 >> 4) | (((qh >> 6) & 3) << 4);
    value k is in group k // 16. The codes of four consecutive l are assembled at once (byte i = l + i);
    with ``flip``, bit 5 of each is flipped: read as 6-bit two's complement numbers they are q − 32."""
    b = e.b
    nib, two, bit5 = e.const(0x0F0F0F0F), e.const(0x03030303), e.const(0x20202020)
    for quarter in range(4):
        for j4 in range(8):
            lo = (ql0 if quarter in (0, 2) else ql1)[j4]
            lo = b.and_(b.lshr(lo, e.const(4)) if quarter >= 2 else lo, nib)
            hi = b.and_(b.lshr(qh[j4], e.const(2 * quarter)) if quarter else qh[j4], two)
            codes = b.or_(lo, b.shl(hi, e.const(4)))
            p = 32 * quarter + 4 * j4
            yield p, p // 16, b.xor(codes, bit5) if flip else codes


def _q6_k_codes(e: _Emit):
    """The 256 codes of a Q6_K block one at a time, unrolled: yields (k, group, q − 32 as int32 lanes)."""
    b = e.b
    for n in range(2):
        for p, g, codes in _q6_k_words(e, e.dwords(64 * n, 8), e.dwords(64 * n + 32, 8), e.dwords(128 + 32 * n, 8), flip=True):
            for k in range(4):
                yield 128 * n + p + k, 8 * n + g, b.ashr(b.shl(codes, e.const(26 - 8 * k)), e.const(26))  # sign-extended


def _emit_q6_k(e: _Emit):
    """``_deq_q6_k``: sixteen int8 scales at byte 192, d f16 at 208; w[k] = (d·sc[k // 16]) * (float32(q) − 32)
    with the codes q − 32 of ``_q6_k_codes`` (float32(q − 32) is that same number). Unrolled: as a
    ``_Loop`` over the halves, re-gathering or spilling ql/qh, this ran ~25 % slower. Where every lane's
    d is finite (all real files), in float64 by ``_offset_codes64`` instead — the float32 value is exact
    (d·sc has ≤ 11 + 7 significant bits, times q − 32 ≤ 5 more) — as a ``_Loop`` over the halves
    (unrolled, this one measured ~20 % slower: AVX2 +8 %, AVX-512 +24 % per core over the float32 route)."""
    b = e.b
    sw = e.dwords(192, 4)
    d = e.f16(e.dwords(206)[0], high=True)  # bytes 206..209: scales 14, 15, then d
    ds = [b.fmul(d, e.s2f(e.sbyte(sw[g // 4], g % 4))) for g in range(16)]  # d·sc[g]

    def general():
        for p, g, q32 in _q6_k_codes(e):
            yield p, b.fmul(ds[g], e.s2f(q32))

    def exact64():
        k12, neg_c = _offset_factors(e, ds, 32)

        def half(e, n):  # n = 0..1: values 128n … 128n + 127
            ql = b.mul(n, e.const64(64))
            words = _q6_k_words(e, e.dwords(0, 8, dyn=ql), e.dwords(32, 8, dyn=ql), e.dwords(128, 8, dyn=b.mul(n, e.const64(32))), flip=False)
            for p, g, word in words:
                g = b.add(b.mul(n, e.const64(8)), e.const64(g))
                yield from _offset_codes64(e, e.pick(k12, g), e.pick(neg_c, g), p, word)
        yield _Loop(2, 128, half)

    yield _Choice(e.all_finite(d), exact64(), general())


def _emit_q6_k_codes(e: _PackedEmit):
    """Q6_K from its packed codes (``_pack_q6_k``): the LANES rows' codes q − 32 of column k are LANES
    bytes side by side, so one vector load fetches a column; w[k] = (d·sc[k // 16]) * (q[k] − 32).

    Computed in float64, and still bit for bit the row decoder's float32 value: d is an f16
    (≤ 11 significant bits), sc an int8 (|sc| ≤ 128: ≤ 7 bits), q − 32 ∈ [−32, 31] (≤ 5 bits), so
    d·sc and d·sc·(q − 32) have at most 23 significant bits and both float32 products are exact — the
    float64 product of the same factors is the same number (NaN/inf scales propagate alike). Going
    int8 → float64 directly skips the float32 product and the two float32 → float64 widenings, which
    shared port 0 with the shifts that extracted a code from a word: 4 instead of 5 cycles per column
    of 16 rows on AVX-512 (measured +~20 %). Below AVX-512, with every lane's d finite (all real files), by
    ``_scaled_codes`` (d·sc has ≤ 18 significant bits): +20 % per core on AVX2 (docs/performance.md)."""
    b = e.b
    d = b.bitcast(e.words(68)[0], e.vec(_f32))
    sw = e.words(64, 4)
    scales = [b.fpext(b.fmul(d, e.s2f(e.sbyte(sw[g // 4], g % 4))), e.vec(_f64)) for g in range(16)]  # d·sc[g]
    table = e.table(scales)

    def chunk(e, it, neg_magic=None):  # it = 0..7: values 32·it … 32·it+31 (groups 2·it, 2·it+1)
        for j in range(32):
            g = b.add(b.mul(it, e.const64(2)), e.const64(j // 16))
            q = e.codes(b.add(b.mul(it, e.const64(32)), e.const64(j)))
            if neg_magic is None:
                yield j, b.fmul(e.pick(table, g), _int8_to_f64(e, q))
            else:  # d·sc has ≤ 11 + 7 significant bits: ``_scaled_codes`` applies
                yield j, _scaled_codes(e, q, e.pick(table, g), e.pick(neg_magic, g))

    def fast():
        neg_magic = e.table([_neg_scaled_magic(e, s) for s in scales])
        yield _Loop(8, 32, lambda e, it: chunk(e, it, neg_magic))

    yield from _by_scaled_codes(e, d, fast(), iter([_Loop(8, 32, chunk)]))


def _int8_to_f64(e: _Emit, q):
    """<lanes x i8> -> <lanes x double>, exactly. At ``ISA_AVX512`` as ``vpmovsxbq`` + ``vcvtqq2pd`` per
    8 lanes (one port-5 and one port-0 uop each): LLVM's own choice for a plain ``sitofp`` (``vpmovsxbd``
    + ``vextracti64x4`` + 2 × ``vcvtdq2pd``, 6 uops) costs more; the rounding-mode form of the
    conversion (exact either way: every int8 is a double) keeps it. Otherwise int8 → int32 → double
    (``vcvtdq2pd`` on AVX2; an int64 source would have no vector conversion there)."""
    b = e.b
    if e.isa != ISA_AVX512 or e.n % 8:
        return b.sitofp(b.sext(q, e.vec(_i32)), e.vec(_f64))
    v8 = ir.VectorType(_i64, 8)
    fnty = ir.FunctionType(ir.VectorType(_f64, 8), [v8, _i32])
    cvt = cgutils.get_or_insert_function(b.module, fnty, "llvm.x86.avx512.sitofp.round.v8f64.v8i64")
    halves = []
    for h in range(e.n // 8):
        part = b.shuffle_vector(q, q, ir.Constant(ir.VectorType(_i32, 8), list(range(8 * h, 8 * h + 8))))
        halves.append(b.call(cvt, [b.sext(part, v8), ir.Constant(_i32, 8)]))  # 8 = round to nearest, no exceptions
    out = halves[0]
    for h in halves[1:]:
        n = out.type.count
        out = b.shuffle_vector(out, h, ir.Constant(ir.VectorType(_i32, n + 8), list(range(n + 8))))
    return out


def _emit_iq4_xs(e: _Emit):
    """``_deq_iq4_xs``: d f16 at 0, scales_h (uint16) at 2, scales_l at 4, qs at 8; sub-block s = 0..7:
    ls = ((scales_l[s // 2] >> 4(s & 1)) & 15) | ((scales_h >> 2s) & 3) << 4, dl = d * float32(ls − 32);
    w[32s + j] = dl * KV[qs[16s + j] & 15], w[32s + 16 + j] = dl * KV[qs[16s + j] >> 4] (``lookup16``)."""
    b = e.b
    dw0 = e.dwords(0)[0]
    d = e.f16(dw0, high=False)
    scales_h = b.lshr(dw0, e.const(16))
    scales_l = e.dwords(4)[0]
    dl = []
    for s in range(8):
        ls = b.or_(e.bits(scales_l, 4 * s, 4), b.shl(e.bits(scales_h, 2 * s, 2), e.const(4)))
        dl.append(b.fmul(d, e.i2f(b.sub(ls, e.const(32)))))
    table = e.table(dl)

    def sub_block(e, s, f64=False):
        dws = e.dwords(8, 4, dyn=b.mul(s, e.const64(16)))
        if f64:
            yield from _table_nibbles64(e, dws, IQ4NL_VALUES, e.pick(table, s))
        else:
            yield from _table_nibbles(e, dws, "iq4nl_values", IQ4NL_VALUES, e.pick(table, s))

    # d finite: every dl = d·(ls − 32) is finite and |dl·KV| < 2^16·32·128
    yield from _by_table64(e, e.all_finite(d), iter([_Loop(8, 32, lambda e, s: sub_block(e, s, True))]),
                           iter([_Loop(8, 32, sub_block)]))


#: The raw-row emitter of each lane type.
EMITTERS = {_F32: _emit_f32, _F16: _emit_f16, _BF16: _emit_bf16, _Q8_0: _emit_q8_0, _Q4_0: _emit_q4_0,
            _Q4_1: _emit_q4_1, _Q5_0: _emit_q5_0, _Q5_1: _emit_q5_1, _IQ4_NL: _emit_iq4_nl, _MXFP4: _emit_mxfp4,
            _Q2_K: _emit_q2_k, _Q3_K: _emit_q3_k, _Q4_K: _emit_q4_k, _Q5_K: _emit_q5_k, _Q6_K: _emit_q6_k,
            _IQ4_XS: _emit_iq4_xs, **IQ_EMITTERS}
#: The packed-layout emitters: the same, except the column-major code layouts (``CODE_SLOTS``).
PACKED_EMITTERS = {**EMITTERS, _Q8_0: _emit_q8_0_codes, _Q6_K: _emit_q6_k_codes}

#: ``_block(kind, isa, acc, w, row0, blk, x, nt)``: one block of LANES raw rows (gathers), accumulated.
_block = _block_kernel("_block", EMITTERS)
#: ``_packed(kind, isa, acc, p, grp, blk, x, nt)``: the same from :func:`kernels.lanes.pack.pack`'s words.
_packed = _block_kernel("_packed", PACKED_EMITTERS, packed=True)
#: ``_decode(kind, isa, buf, w, row0, blk, col)`` / ``_decode_packed``: a block's weights into ``buf`` (wide path).
_decode = _block_kernel("_decode", EMITTERS, decode=True)
_decode_packed = _block_kernel("_decode_packed", PACKED_EMITTERS, packed=True, decode=True)
