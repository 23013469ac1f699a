"""Float64 routes of the row-lane kernels: a block's weights formed directly in float64 where the row
decoder's float32 value is provably the same number, skipping the float32 arithmetic and the widening
(the float32 → float64 conversion is two uops per four values on AVX2). Each route is taken only where
its condition holds for every lane of the block, as a run-time branch (``lanes_ir._Choice``) whose
other side is the emitter's float32 route — the same bits either way (tests/test_kernels_lanes.py).

* ``_scaled_codes``: ``scale · q`` for int8 codes (packed Q8_0 and Q6_K below AVX-512) as one integer add
  and one fma (the bits of 1.5·2^52 plus q are the double 1.5·2^52 + q).
* ``_byte_at_40``: a code byte placed at bits 40–47 of a lane holding 1.0's exponent is the double
  1 + c·2^−12 (one constant byte shuffle), and ``fma(K, X, −(K + offset))`` with K = scale·2^12 is
  scale·c − offset rounded once: ``_table_nibbles64`` (MXFP4, IQ4_NL, IQ4_XS where no product can
  overflow) and ``_k_quant_chunk64`` (Q4_K and Q5_K where ``_k_quant_exact`` shows the float32 value exact).
"""

from __future__ import annotations

from llvmlite import ir

from .ir import ISA_AVX512, ISA_GENERIC, _Choice, _Emit, _f64, _fma, _i8, _i32, _i64


#: The bits of 1.0: the exponent ``_k_quant_chunk64`` and ``_table_nibbles64`` give their codes.
_ONE_BITS = 0x3FF0000000000000
#: 1.5 · 2^52 and its bits: ``_scaled_codes``' bias.
_MAGIC, _MAGIC_BITS = 1.5 * 2.0**52, 0x4338000000000000


def _scaled_codes(e: _Emit, q, scale, neg_scale_magic):
    """``scale · q`` (float64 lanes) for int8 lanes ``q`` and a finite float64 ``scale`` with at most 20
    significant bits, in two vector operations besides the sign extension: the bits of _MAGIC plus q, as
    a signed 64-bit integer, are the double _MAGIC + q exactly (its last significand bit is worth 1 and
    |q| ≤ 128 keeps it in [2^52, 2^53)); then ``fma(scale, _MAGIC + q, −scale·_MAGIC)`` (the third argument
    from ``_neg_scaled_magic``, exact: ≤ 22 bits) is the exact ``scale·q`` rounded once — and scale·q has
    at most 20 + 7 ≤ 53 bits, so it *is* scale·q. The same number as ``scale · float64(q)``; a zero comes
    out +0.0 where that may give −0.0, which no sum can tell apart (a lane's sum starts at +0.0 and a
    sum of opposite-signed zeros is +0.0). On AVX2 this replaces the int32 → float64 conversion (two
    uops, one on port 5 with the sign extension) and the product by one integer add and one fma
    (+20–30 % per core); at ``ISA_AVX512`` ``vcvtqq2pd`` and the product stay (measured faster). An
    infinite or NaN scale would give NaN where the product gives ±inf or another NaN: callers take
    this path only where ``e.all_finite`` holds (a ``_Choice``)."""
    b = e.b
    biased = b.add(b.sext(q, e.vec(_i64)), ir.Constant(e.vec(_i64), [_MAGIC_BITS] * e.n))
    return b.call(_fma(b, e.n), [scale, b.bitcast(biased, e.vec(_f64)), neg_scale_magic])


def _neg_scaled_magic(e: _Emit, scale):
    """``−scale · _MAGIC`` for ``_scaled_codes`` (exact: _MAGIC is 3 · 2^51)."""
    return e.b.fmul(scale, ir.Constant(e.vec(_f64), [-_MAGIC] * e.n))


def _by_scaled_codes(e: _Emit, d32, fast, general):
    """The emitter items of a packed-codes type: ``fast`` (weights by ``_scaled_codes``) where every lane's
    float32 d is finite, else ``general`` (the product) — a ``_Choice`` below AVX-512; at ``ISA_AVX512``
    ``general`` alone (``vcvtqq2pd`` and the product measured faster there: 7.6 against 5.8 G weights/s
    per core for Q6_K). Generators, so the branch not taken emits nothing."""
    if e.isa == ISA_AVX512:
        return general
    return [_Choice(e.all_finite(d32), fast, general)]


def _byte_at_40(e: _Emit, moved, k: int):
    """<lanes x double>: byte k (0..3) of each 64-bit lane of ``moved`` placed at bits 40–47 under the
    exponent bits 52–63 of the same lane, every other bit zero — one constant byte shuffle (x86:
    ``vpshufb``; ARM64: ``tbl``). With ``moved``'s bytes 6–7 those of 1.0, it is 1 + byte·2^−12."""
    b, n = e.b, e.n
    vb = ir.VectorType(_i8, 8 * n)
    mask = []
    for lane in range(n):
        mask += [8 * n] * 5 + [8 * lane + k, 8 * lane + 6, 8 * lane + 7]  # 8n…: a byte of the zero vector
    picked = b.shuffle_vector(b.bitcast(moved, vb), ir.Constant(vb, None), ir.Constant(ir.VectorType(_i32, 8 * n), mask))
    return b.bitcast(picked, e.vec(_f64))


def _table_nibbles64(e: _Emit, dws, values, scale):
    """``_table_nibbles``' weights ``scale · values[nibble]`` formed in float64, the same numbers where
    the float32 product is exact and finite (``_by_table64`` checks the scale). The table's bytes are
    biased by 128 (u = v + 128, 0..255; ``byte_table16`` looks four up per lane); each lane's four
    looked-up bytes, zero-extended to 64 bits with the exponent bits of 1.0 added, give value k as the
    double X = 1 + u·2^−12 by one byte shuffle (``_byte_at_40``); with K = scale·2^12,
    ``fma(K, X, −(K + 128·scale))`` is scale·(u − 128) = scale·v rounded once: exact (≤ 24 + 8 bits).
    Both constants are exact (K + 128·scale = scale·(2^12 + 2^7)). Three vector operations per weight
    (shuffle, two fma) and two constants per block, instead of the float32 route's five or six (convert,
    product, two 2-uop widenings on AVX2)."""
    b = e.b
    f64, i64 = e.vec(_f64), e.vec(_i64)
    biased = [(int(v) + 128) - 256 * (int(v) >= 0) for v in values]  # v + 128 as a signed byte
    s64 = b.fpext(scale, f64)
    k12 = b.fmul(s64, ir.Constant(f64, [2.0 ** 12] * e.n))
    neg_c = b.fsub(b.fmul(s64, ir.Constant(f64, [-128.0] * e.n)), k12)  # −(K + 128·scale)
    fma, nib = _fma(b, e.n), e.const(0x0F0F0F0F)
    for high in (0, 1):
        for j4, dw in enumerate(dws):
            looked_up = e.byte_table16(biased, b.and_(b.lshr(dw, e.const(4)) if high else dw, nib))
            moved = b.or_(b.zext(looked_up, i64), ir.Constant(i64, [_ONE_BITS] * e.n))
            for k in range(4):
                yield 16 * high + 4 * j4 + k, b.call(fma, [k12, _byte_at_40(e, moved, k), neg_c])


def _by_table64(e: _Emit, scale_ok, fast, general):
    """The items of a 16-entry-table type: ``fast`` (``_table_nibbles64``) where ``scale_ok`` (IR i1: every
    lane's scale finite and small enough that no product overflows float32) holds, else ``general`` —
    at AVX2 and AVX-512, where ``byte_table16`` exists; the generic level keeps ``general``."""
    if e.isa == ISA_GENERIC:
        return general
    return [_Choice(scale_ok, fast, general)]


def _k_quant_exact(e: _Emit, d, dmin, code_bits: int):
    """IR i1 for Q4_K (``code_bits`` 4) and Q5_K (5), from the block's d and dmin (float32 lanes, as
    ``lanes_blocks._k_factors`` converts them): in every lane, d and dmin are finite and
    ``(d·sc)·q − dmin·m`` is exact in float32 for every 6-bit sc, m and code q — so the row decoder's
    rounded float32 value is the exact one, which ``_k_quant_chunk64`` computes in float64. With E(x)
    the float32 exponent of x (|x| < 2^(E+1), and x — an f16 — a multiple of 2^(E − 10)):
    |d·sc·q| < 2^(E_d + 7 + code_bits), |dmin·m| < 2^(E_m + 7), their difference a multiple of
    2^(min(E_d, E_m) − 10) below twice the larger bound, so ``max(E_d + 7 + code_bits, E_m + 7) −
    min(E_d, E_m) ≤ 13`` fits 24 bits (Q4_K: E_m − E_d ∈ [−2, 6], Q5_K: [−1, 6]; llama-quantize's Q4_K
    blocks have 2–4, dmin ≈ 7.5·d). A zero d or dmin makes one term vanish: exact whatever the other's
    exponent."""
    b = e.b
    exps, zeros = [], []
    for value in (d, dmin):
        bits = b.bitcast(value, e.vec(_i32))
        exps.append(b.and_(b.lshr(bits, e.const(23)), e.const(0xFF)))
        zeros.append(b.icmp_unsigned("==", b.and_(bits, e.const(0x7FFFFFFF)), e.const(0)))
    ed, em = exps
    top_d = b.add(ed, e.const(7 + code_bits))
    top = b.select(b.icmp_signed(">", top_d, b.add(em, e.const(7))), top_d, b.add(em, e.const(7)))
    low = b.select(b.icmp_signed("<", ed, em), ed, em)
    fits = b.icmp_signed("<=", b.sub(top, low), e.const(13))
    finite = b.and_(b.icmp_unsigned("!=", ed, e.const(0xFF)), b.icmp_unsigned("!=", em, e.const(0xFF)))
    return e.all_lanes(b.and_(finite, b.or_(fits, b.or_(zeros[0], zeros[1]))))


def _k_quant_chunk64(e: _Emit, table, c, codes):
    """Q4_K / Q5_K values 64c … 64c + 63 formed in float64 (under ``_k_quant_exact``): the same numbers as
    the row decoder's, in three vector operations per weight instead of the float32 route's ~five (a
    float32 fma, two 2-uop widenings on AVX2). ``codes(high, j4)``: the dword of four codes (one per
    byte) of values 64c + 32·high + 4·j4 …; zero-extended to 64 bits with the exponent bits of 1.0 added,
    code k is the double X = 1 + q·2^−12 by one byte shuffle (``_byte_at_40``). With K = d·sc·2^12
    (exact), K·X = K + d·sc·q, and ``fma(K, X, −(K + dmin·m))`` is d·sc·q − dmin·m rounded once — exact,
    since it fits 24 bits. ``−(K + dmin·m)`` is exact too: K is a multiple of 2^(E_d + 2) below
    2^(E_d + 19), dmin·m one of 2^(E_m − 10) below 2^(E_m + 7), so under ``_k_quant_exact`` their sum
    spans at most 30 − (E_m − E_d) ≤ 32 bits."""
    b = e.b
    fma, f64, i64 = _fma(b, e.n), e.vec(_f64), e.vec(_i64)
    one = ir.Constant(i64, [_ONE_BITS] * e.n)
    for high in (0, 1):
        sub = b.add(b.mul(c, e.const64(4)), e.const64(2 * high))
        k12 = b.fmul(b.fpext(e.pick(table, sub), f64), ir.Constant(f64, [2.0 ** 12] * e.n))  # d·sc·2^12
        neg_c = b.fsub(b.fpext(e.pick(table, b.add(sub, e.const64(1))), f64), k12)  # −(K + dmin·m)
        for j4 in range(8):
            moved = b.or_(b.zext(codes(high, j4), i64), one)
            for k in range(4):
                yield 32 * high + 4 * j4 + k, b.call(fma, [k12, _byte_at_40(e, moved, k), neg_c])


def _offset_factors(e: _Emit, scales, offset: int):
    """Tables (``e.table``) of K = scale·2^12 and −(K + offset·scale) in float64, one entry per group, for
    ``_offset_codes64`` — where ``scales`` (float32 lanes, one per group) are finite with at most 18
    significant bits and the codes less than 64 (Q6_K: d·sc and q − 32). Both are exact
    (scale·(2^12 + offset) has ≤ 18 + 13 bits)."""
    b, f64 = e.b, e.vec(_f64)
    wide = [b.fpext(s, f64) for s in scales]
    k12 = [b.fmul(s, ir.Constant(f64, [2.0 ** 12] * e.n)) for s in wide]
    neg_c = [b.fmul(s, ir.Constant(f64, [-(2.0 ** 12 + offset)] * e.n)) for s in wide]
    return e.table(k12), e.table(neg_c)


def _offset_codes64(e: _Emit, k12, neg_c, k: int, word):
    """Yields (k + i, scale · (q_i − offset)) in float64 for i = 0..3, the codes q_i (< 64) the bytes of
    ``word`` (int32 lanes) and ``k12``, ``neg_c`` a group's ``_offset_factors``: the row decoder's float32
    product is exact (≤ 18 + 6 bits), and this is the same number. The word zero-extended to 64 bits
    with the exponent bits of 1.0 added gives code i as the double X = 1 + q·2^−12 by one byte shuffle
    (``_byte_at_40``), and ``fma(K, X, −(K + offset·scale))`` is scale·(q − offset) rounded once — exact,
    as it fits 24 bits. Three vector operations per weight (shuffle, two fma) against the float32
    route's sign extension, conversion, product and 2-uop widening on AVX2."""
    b = e.b
    moved = b.or_(b.zext(word, e.vec(_i64)), ir.Constant(e.vec(_i64), [_ONE_BITS] * e.n))
    fma = _fma(b, e.n)
    for i in range(4):
        yield k + i, b.call(fma, [k12, _byte_at_40(e, moved, i), neg_c])
