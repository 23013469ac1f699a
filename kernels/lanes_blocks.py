"""Per-type block emitters of the row-lane kernels, and their intrinsics (:mod:`kernels.lanes`).

Each emitter yields, in increasing k, (k within the block, <LANES x float> weights) computed with
the float32 operations of the row decoder in :mod:`kernels.dequant` (or float64 weights, where
those are provably the same numbers: packed Q6_K); :func:`kernels.lanes_ir._block_kernel` turns it
into an intrinsic ``kernel(kind, acc, w, row0, blk, x, nt)`` for raw rows (gathers) or packed words.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .dequant import MXFP4_VALUES
from .lanes_ir import (_CVTQQ2PD, _F32, _MXFP4, _PERMVAR, _Q4_K, _Q6_K, _Q8_0, LANES, _block_kernel, _Emit, _f32,
                       _f64, _i32, _i64, _Loop, _PackedEmit, _vec)

# --------------------------------------------------------------------------------------------
# Per-type block emitters: yield (k within the block, <LANES x float> weights) in increasing k,
# computing each weight with the float32 operations of the row decoder in kernels/dequant.py
# (scales first, in the decoder's order; then the per-value products).


def _emit_f32(e: _Emit):
    """F32 (the routers): the stored values themselves, 16 per "block"."""
    for j, dw in enumerate(e.dwords(0, 16)):
        yield j, e.b.bitcast(dw, _vec(_f32))


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
    ``_emit_q6_k_codes``)."""
    b = e.b
    d = b.fpext(b.bitcast(e.words(8)[0], _vec(_f32)), _vec(_f64))
    codes = b.bitcast(e.block_ptr, ir.IntType(8).as_pointer())
    for j in range(32):
        q = b.load(b.bitcast(b.gep(codes, [e.const64(j * LANES)]), ir.VectorType(ir.IntType(8), LANES).as_pointer()), align=1)
        yield j, b.fmul(_int8_to_f64(e, q), d)


def _emit_mxfp4(e: _Emit):
    """``_deq_mxfp4``: w[j] = d * K[qs[j] & 15], w[j+16] = d * K[qs[j] >> 4], j = 0..15; qs at byte 1,
    d = E8M0_HALF[e] for the exponent byte e at 0: the float32 bits ``(e − 1) << 23``, or
    ``0x00200000 << e`` for e < 2 (a denormal), as ``floats.E8M0_HALF``.

    K = MXFP4_VALUES (0, 1, 2, 3, 4, 6, 8, 12, then the negatives): see ``_mxfp4_value``."""
    b = e.b
    ex = e.byte(e.dwords(0)[0], 0)
    d_bits = b.select(b.icmp_unsigned("<", ex, e.const(2)), b.shl(e.const(0x00200000), ex),
                      b.shl(b.sub(ex, e.const(1)), e.const(23)))
    d = b.bitcast(d_bits, _vec(_f32))
    dws = e.dwords(1, 4)
    for high in (False, True):
        for j4 in range(4):
            for k in range(4):
                byte = e.byte(dws[j4], k)
                code = b.lshr(byte, e.const(4)) if high else b.and_(byte, e.const(15))
                yield 16 * high + 4 * j4 + k, b.fmul(d, _mxfp4_value(e, code))


def _mxfp4_value(e: _Emit, code):
    """<LANES x float> MXFP4_VALUES[code]: one ``vpermps`` table lookup on AVX-512 hosts (``_PERMVAR``),
    else the arithmetic form (magnitude ``((2 | (c & 1)) << (c >> 1)) >> 1``, c = code & 7, 0 for
    c = 0; negative when bit 3 is set)."""
    b = e.b
    if _PERMVAR:
        fnty = ir.FunctionType(_vec(_f32), [_vec(_f32), _vec(_i32)])
        permvar = cgutils.get_or_insert_function(b.module, fnty, "llvm.x86.avx512.permvar.sf.512")
        table = ir.Constant(_vec(_f32), [float(v) for v in MXFP4_VALUES])
        return b.call(permvar, [table, code])
    c = b.and_(code, e.const(7))
    mag = b.lshr(b.shl(b.or_(e.const(2), b.and_(c, e.const(1))), b.lshr(c, e.const(1))), e.const(1))
    mag = b.select(b.icmp_unsigned("==", c, e.const(0)), e.const(0), mag)
    val = b.select(b.icmp_unsigned("!=", b.and_(code, e.const(8)), e.const(0)), b.neg(mag), mag)
    return e.s2f(val)


def _emit_q4_k(e: _Emit):
    """``_deq_q4_k``: d, dmin f16 at bytes 0, 2; twelve scale bytes at 4 packing 6-bit (sc, m) for
    the 8 sub-blocks (``k_scale_min``); for c = 0..3, l = 0..31 with byte = qs[32c + l] (qs at 16):
    w[64c + l] = (d·sc[2c]) * float32(byte & 15) − dmin·m[2c];
    w[64c + 32 + l] = (d·sc[2c+1]) * float32(byte >> 4) − dmin·m[2c+1]."""
    b = e.b
    dd = e.dwords(0)[0]
    d, dmin = e.f16(dd, high=False), e.f16(dd, high=True)
    sw = e.dwords(4, 3)
    scales = [e.byte(sw[j // 4], j % 4) for j in range(12)]

    def scale_min(j):  # k_scale_min
        if j < 4:
            return b.and_(scales[j], e.const(63)), b.and_(scales[j + 4], e.const(63))
        sc = b.or_(b.and_(scales[j + 4], e.const(15)), b.shl(b.lshr(scales[j - 4], e.const(6)), e.const(4)))
        m = b.or_(b.lshr(scales[j + 4], e.const(4)), b.shl(b.lshr(scales[j], e.const(6)), e.const(4)))
        return sc, m

    factors = []  # d·sc[j], dmin·m[j] for the 8 sub-blocks
    for j in range(8):
        sc, m = scale_min(j)
        factors += [b.fmul(d, e.u2f(sc)), b.fmul(dmin, e.u2f(m))]
    table = e.table(factors)

    def chunk(e, c):  # c = 0..3: values 64c … 64c+63
        dws = e.dwords(16, 8, dyn=b.mul(c, e.const64(32)))
        for high in (0, 1):
            sub = b.add(b.mul(c, e.const64(2)), e.const64(high))
            dsc, dmm = e.pick(table, b.mul(sub, e.const64(2))), e.pick(table, b.add(b.mul(sub, e.const64(2)), e.const64(1)))
            for j4 in range(8):
                for k in range(4):
                    byte = e.byte(dws[j4], k)
                    q = b.lshr(byte, e.const(4)) if high else b.and_(byte, e.const(15))
                    yield 32 * high + 4 * j4 + k, b.fsub(b.fmul(dsc, e.u2f(q)), dmm)

    yield _Loop(4, 64, chunk)


def _emit_q6_k(e: _Emit):
    """``_deq_q6_k``: sixteen int8 scales at byte 192, d f16 at 208;
    for n = 0..1, l = 0..31 with ql0 = ql[64n + l], ql1 = ql[64n + 32 + l], qh = qh[32n + l]
    (ql at byte 0, qh at 128) and group g = 8n + l // 16:
    w[128n + l]      = (d·sc[g])     * (float32((ql0 & 15) | ((qh & 3) << 4)) − 32)
    w[128n + 32 + l] = (d·sc[g + 2]) * (float32((ql1 & 15) | (((qh >> 2) & 3) << 4)) − 32)
    w[128n + 64 + l] = (d·sc[g + 4]) * (float32((ql0 >> 4) | (((qh >> 4) & 3) << 4)) − 32)
    w[128n + 96 + l] = (d·sc[g + 6]) * (float32((ql1 >> 4) | (((qh >> 6) & 3) << 4)) − 32)
    The 6-bit codes of four consecutive l are assembled at once in one 32-bit word (byte k = l + k)."""
    b = e.b
    sw = e.dwords(192, 4)
    d = e.f16(e.dwords(206)[0], high=True)  # bytes 206..209: scales 14, 15, then d
    ds = [b.fmul(d, e.s2f(e.sbyte(sw[g // 4], g % 4))) for g in range(16)]  # d·sc[g]
    nib, two, bit5 = e.const(0x0F0F0F0F), e.const(0x03030303), e.const(0x20202020)
    for n in range(2):  # unrolled: as a _Loop over n (re-gathering or spilling ql/qh) it ran ~25 % slower
        ql0, ql1, qh = e.dwords(64 * n, 8), e.dwords(64 * n + 32, 8), e.dwords(128 + 32 * n, 8)
        for quarter in range(4):
            for j4 in range(8):
                lo = (ql0 if quarter in (0, 2) else ql1)[j4]
                lo = b.and_(b.lshr(lo, e.const(4)) if quarter >= 2 else lo, nib)
                hi = b.and_(b.lshr(qh[j4], e.const(2 * quarter)) if quarter else qh[j4], two)
                # four 6-bit codes q, one per byte, with bit 5 flipped: read as 6-bit two's complement
                # numbers they are exactly q − 32, so float32(that) == float32(q) − 32
                codes = b.xor(b.or_(lo, b.shl(hi, e.const(4))), bit5)
                scale = ds[8 * n + (4 * j4) // 16 + 2 * quarter]
                for k in range(4):
                    q32 = b.ashr(b.shl(codes, e.const(26 - 8 * k)), e.const(26))  # q − 32, sign-extended
                    yield 128 * n + 32 * quarter + 4 * j4 + k, b.fmul(scale, e.s2f(q32))


def _emit_q6_k_codes(e: _PackedEmit):
    """Q6_K from its packed codes (``_pack_q6_k``): the LANES rows' codes q − 32 of column k are LANES
    bytes side by side, so one vector load fetches a column; w[k] = (d·sc[k // 16]) * (q[k] − 32).

    Computed in float64, and still bit for bit the row decoder's float32 value: d is an f16
    (≤ 11 significant bits), sc an int8 (|sc| ≤ 128: ≤ 7 bits), q − 32 ∈ [−32, 31] (≤ 5 bits), so
    d·sc and d·sc·(q − 32) have at most 23 significant bits and both float32 products are exact — the
    float64 product of the same factors is the same number (NaN/inf scales propagate alike). Going
    int8 → int64 → float64 directly (``vpmovsxbq`` + ``vcvtqq2pd`` on AVX-512DQ) skips the float32
    product and the two float32 → float64 widenings, which shared port 0 with the shifts that
    extracted a code from a word: 4 instead of 5 cycles per column of 16 rows (measured +~20 %)."""
    b = e.b
    d = b.bitcast(e.words(68)[0], _vec(_f32))
    sw = e.words(64, 4)
    table = e.table([b.fpext(b.fmul(d, e.s2f(e.sbyte(sw[g // 4], g % 4))), _vec(_f64)) for g in range(16)])  # d·sc[g]
    codes = b.bitcast(e.block_ptr, ir.IntType(8).as_pointer())

    def chunk(e, it):  # it = 0..7: values 32·it … 32·it+31 (groups 2·it, 2·it+1)
        col0 = b.gep(codes, [b.mul(it, e.const64(32 * LANES))])
        for j in range(32):
            scale = e.pick(table, b.add(b.mul(it, e.const64(2)), e.const64(j // 16)))
            q = b.load(b.bitcast(b.gep(col0, [e.const64(j * LANES)]), ir.VectorType(ir.IntType(8), LANES).as_pointer()), align=1)
            yield j, b.fmul(scale, _int8_to_f64(e, q))

    yield _Loop(8, 32, chunk)


def _int8_to_f64(e: _Emit, q):
    """<LANES x i8> -> <LANES x double>, exactly. On AVX-512DQ hosts (``_CVTQQ2PD``) as ``vpmovsxbq`` +
    ``vcvtqq2pd`` per 8 lanes (one port-5 and one port-0 uop each): LLVM's own choice for a plain
    ``sitofp`` (``vpmovsxbd`` + ``vextracti64x4`` + 2 × ``vcvtdq2pd``, 6 uops) costs more; the
    rounding-mode form of the conversion (exact either way: every int8 is a double) keeps it."""
    b = e.b
    if not _CVTQQ2PD:
        return b.sitofp(b.sext(q, _vec(_i64)), _vec(_f64))
    v8 = ir.VectorType(_i64, 8)
    fnty = ir.FunctionType(ir.VectorType(_f64, 8), [v8, _i32])
    cvt = cgutils.get_or_insert_function(b.module, fnty, "llvm.x86.avx512.sitofp.round.v8f64.v8i64")
    halves = []
    for h in range(LANES // 8):
        part = b.shuffle_vector(q, q, ir.Constant(ir.VectorType(_i32, 8), list(range(8 * h, 8 * h + 8))))
        halves.append(b.call(cvt, [b.sext(part, v8), ir.Constant(_i32, 8)]))  # 8 = round to nearest, no exceptions
    out = halves[0]
    for h in halves[1:]:
        n = out.type.count
        out = b.shuffle_vector(out, h, ir.Constant(ir.VectorType(_i32, n + 8), list(range(n + 8))))
    return out


#: ``_block(kind, acc, w, row0, blk, x, nt)``: one block of LANES raw rows (gathers), for each lane type.
_block = _block_kernel("_block", {_F32: _emit_f32, _Q8_0: _emit_q8_0, _MXFP4: _emit_mxfp4, _Q4_K: _emit_q4_k,
                                  _Q6_K: _emit_q6_k})
#: ``_packed(kind, acc, p, grp, blk, x, nt)``: the same from :func:`kernels.lanes.pack`'s words.
_packed = _block_kernel("_packed", {_F32: _emit_f32, _Q8_0: _emit_q8_0_codes, _MXFP4: _emit_mxfp4,
                                    _Q4_K: _emit_q4_k, _Q6_K: _emit_q6_k_codes}, packed=True)
