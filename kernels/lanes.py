"""Row-lane kernels: the plain matmul's exact sums, 16 weight rows at a time in SIMD lanes.

The plain mode of :func:`kernels.matmul` defines every output as ::

    y[t, n] = float32( (((0 + w[n,0]·x[t,0]) + w[n,1]·x[t,1]) + …) + w[n,K-1]·x[t,K-1] )

with float32 weights ``w`` decoded exactly as :mod:`kernels.dequant` does, products formed in
float64 (exact) and the sum taken strictly in increasing k. That chain cannot be vectorized along k
without changing its rounding. It *can* be vectorized across rows: here each SIMD lane holds one
weight row's running sum, so a vector instruction advances 16 independent chains by one k, each in
exactly the order above. The results are bit-identical to ``matmul._matmul_rows`` — tested for every
type, T = 1…9 and thread counts 1 and 2 (tests/test_kernels_matmul.py, tests/test_perf_invariants.py).

How one group of ``LANES`` = 16 consecutive rows is computed (``_matmul_lanes``):

1. **Block kernel** (one LLVM-IR intrinsic per type, below), per block of the rows: the block's
   bytes in the 16 rows are fetched four at a time with a *gather* (one 32-bit load per lane, at
   the same byte offset in each row); the scales are decoded first (f16 → float32 exactly, the
   K-quants' ``d·sc`` and ``dmin·m``), then each weight is unpacked with shifts and masks,
   converted and scaled in float32 exactly as the row decoder does (same operations, same order, no
   FMA contraction), widened to float64 and accumulated with ``acc[t] = fma(w, x[t, k], acc[t])``
   for up to four activation rows. The fused multiply-add rounds once, after adding the *exact*
   product (two float32 values multiply exactly in float64), so it equals the separate multiply
   and add of the plain path.
2. The ``T`` activation rows are taken four at a time (four accumulators of 16 float64 lanes, 8
   zmm registers), so a verify batch of 1+3 rows decodes each weight block once.

Why LLVM IR: numba's auto-vectorizer does not vectorize this shape (16 accumulators that live in
registers across a loop, gathered byte loads); written as numba loops it ran slower than the scalar
path. ``llvm.masked.gather`` and ``llvm.fma`` are target-independent (scalarized where the CPU has no
gather); on AVX-512 they become ``vpgather`` and ``vfmadd…pd zmm``.

Scope: Q8_0, MXFP4, Q4_K and Q6_K (the types of the q4_k_m and mxfp4 mixes' big matrices) with
K a multiple of the block; ``matmul`` sends every other type, the last ``N mod 16`` rows, and
everything when ``NUMBA_DISABLE_JIT=1`` (intrinsics cannot run as Python) to ``_matmul_rows``.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .blocks import QT
from .dequant import MXFP4_VALUES
from .flags import JIT_ENABLED, SERIAL_BELOW, jit
from .floats import F16_TABLE

LANES = 16  # weight rows per group: one float64 accumulator each (2 zmm per activation row)
MAX_T = 4  # activation rows per pass (4 x 4 accumulator registers)
#: MXFP4's 16-entry value table as one ``vpermps`` (an x86 AVX-512 intrinsic) when numba compiles
#: for this host and it has AVX-512F; numba's cache is keyed by the CPU, so the choice is per machine.
_PERMVAR = LANES == 16 and numba.config.CPU_NAME in (None, "host") and bool(llvm_binding.get_host_cpu_features().get("avx512f"))
#: int8 → float64 as ``vcvtqq2pd`` (AVX-512DQ) in the packed Q6_K kernel (``_int8_to_f64``); per machine, like ``_PERMVAR``.
_CVTQQ2PD = LANES % 8 == 0 and numba.config.CPU_NAME in (None, "host") and bool(llvm_binding.get_host_cpu_features().get("avx512dq"))
PREFETCH_BYTES = 2048  # packed kernels: prefetch the block(s) at least this far ahead of the current one

_F32, _Q8_0, _MXFP4, _Q4_K, _Q6_K = int(QT.F32), int(QT.Q8_0), int(QT.MXFP4), int(QT.Q4_K), int(QT.Q6_K)
LANE_TYPES = (QT.F32, QT.Q8_0, QT.MXFP4, QT.Q4_K, QT.Q6_K)
TYPE_SIZE = {_F32: 64, _Q8_0: 34, _MXFP4: 17, _Q4_K: 144, _Q6_K: 210}  # F32: a "block" of 16 values
BLOCK = {_F32: 16, _Q8_0: 32, _MXFP4: 32, _Q4_K: 256, _Q6_K: 256}
#: The byte offsets, within a block, of the 32-bit words each type's kernel reads (its emitter below
#: asks for exactly these). They are the *slots* of the packed layout (:func:`pack`).
SLOTS = {
    _F32: tuple(range(0, 64, 4)),
    _Q8_0: (0, *range(2, 34, 4)),  # d (+ qs[0:2]); qs
    _MXFP4: (0, *range(1, 17, 4)),  # e (+ qs[0:3]); qs
    _Q4_K: tuple(range(0, 144, 4)),  # d, dmin; scales; qs
}
#: Q6_K is packed differently (its 6-bit codes cost more to assemble than to store): 64 slots holding
#: the 256 codes q − 32 as int8, column by column (the LANES rows' codes of column k are bytes
#: k·LANES … k·LANES + LANES − 1 of the block); 4 slots of the 16 int8 scales; 1 slot of d as float32 bits.
Q6_K_CODE_SLOTS = 69

# --------------------------------------------------------------------------------------------
# LLVM IR vocabulary: vectors of LANES values, one per weight row


_i1, _i16, _i32, _i64 = ir.IntType(1), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_f16, _f32, _f64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()


def _vec(t):
    return ir.VectorType(t, LANES)


class _Emit:
    """Helpers that emit IR for one block of ``LANES`` rows (``b``: the IR builder;
    ``row_ptrs``: <LANES x i64>, the address of this block's first byte in each row)."""

    def __init__(self, b, row_ptrs):
        self.b = b
        self.row_ptrs = row_ptrs

    def const(self, value, t=_i32):
        return ir.Constant(_vec(t), [value] * LANES)

    def splat(self, x, t):
        v = self.b.insert_element(ir.Constant(_vec(t), ir.Undefined), x, ir.Constant(_i32, 0))
        return self.b.shuffle_vector(v, ir.Constant(_vec(t), ir.Undefined), ir.Constant(_vec(_i32), [0] * LANES))

    def dwords(self, offset: int, n: int = 1, dyn=None) -> list:
        """n × <LANES x i32>: the little-endian 4-byte words at ``offset``, ``offset + 4``, … in this
        block of every row (one gather each: one 32-bit load per lane); ``dyn`` (an IR i64, a
        multiple of 4) is added to the offset at run time (inside a ``_Loop``)."""
        b = self.b
        ptr_t = ir.VectorType(_i32.as_pointer(), LANES)
        fnty = ir.FunctionType(_vec(_i32), [ptr_t, _i32, _vec(_i1), _vec(_i32)])
        gather = cgutils.get_or_insert_function(b.module, fnty, f"llvm.masked.gather.v{LANES}i32.v{LANES}p0")
        rows = self.row_ptrs if dyn is None else b.add(self.row_ptrs, self.splat(dyn, _i64))
        words = []
        for o in range(offset, offset + 4 * n, 4):
            ptrs = b.inttoptr(b.add(rows, ir.Constant(_vec(_i64), [o] * LANES)), ptr_t)
            words.append(b.call(gather, [ptrs, ir.Constant(_i32, 1), ir.Constant(_vec(_i1), [1] * LANES),
                                         ir.Constant(_vec(_i32), ir.Undefined)]))
        return words

    def table(self, values: list):
        """Spill ``values`` (vectors of one type) to a stack table, for ``pick`` inside a ``_Loop``."""
        t = values[0].type
        ptr = cgutils.alloca_once(self.b, ir.ArrayType(t, len(values)))
        for i, v in enumerate(values):
            self.b.store(v, self.b.gep(ptr, [ir.Constant(_i32, 0), ir.Constant(_i32, i)]))
        return ptr

    def pick(self, table, index):
        """table[index] for an IR i64 index."""
        return self.b.load(self.b.gep(table, [ir.Constant(_i32, 0), index]))

    def const64(self, value: int):
        return ir.Constant(_i64, value)

    def byte(self, dw, k: int):
        """Unsigned byte k (0..3) of each lane's dword."""
        return self.b.and_(self.b.lshr(dw, self.const(8 * k)), self.const(0xFF))

    def sbyte(self, dw, k: int):
        """Signed byte k (0..3) of each lane's dword (int8 sign-extended)."""
        return self.b.ashr(self.b.shl(dw, self.const(24 - 8 * k)), self.const(24))

    def f16(self, dw, high: bool):
        """The binary16 in the low (or high) half of each dword, as float32: exact, and NaN becomes
        ±the canonical NaN, as ``floats.f16_bits_to_f32`` (and so ``dequant``) does."""
        b = self.b
        bits = b.lshr(dw, self.const(16)) if high else b.and_(dw, self.const(0xFFFF))
        v = b.fpext(b.bitcast(b.trunc(bits, _vec(_i16)), _vec(_f16)), _vec(_f32))
        nan = b.or_(self.const(0x7FC00000), b.shl(b.and_(bits, self.const(0x8000)), self.const(16)))
        return b.select(b.fcmp_unordered("uno", v, v), b.bitcast(nan, _vec(_f32)), v)

    def u2f(self, q):
        return self.b.uitofp(q, _vec(_f32))

    def s2f(self, q):
        return self.b.sitofp(q, _vec(_f32))


class _PackedEmit(_Emit):
    """The same helpers over a packed block (:func:`pack`): the words of all LANES rows at one byte
    offset are stored side by side, so ``dwords`` is a plain vector load instead of a gather."""

    def __init__(self, b, block_ptr, slots):
        super().__init__(b, None)
        self.block_ptr = block_ptr  # i32*: this group's packed block, [slot][LANES]
        self.slot = {o: i for i, o in enumerate(slots)}

    def prefetch(self, ahead: int, nbytes: int) -> None:
        """Software-prefetch the ``nbytes`` that lie ``ahead`` bytes past this block (a later block of
        the group, read a few blocks from now), one cache line at a time. The hardware prefetcher alone
        left the packed Q8_0 kernel at ~65 % of one core's read bandwidth; this made it ~37 % faster."""
        b = self.b
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), _i32, _i32, _i32])
        fn = cgutils.get_or_insert_function(b.module, fnty, "llvm.prefetch.p0")
        base = b.bitcast(self.block_ptr, ir.IntType(8).as_pointer())
        for line in range(0, nbytes, 64):
            ptr = b.gep(base, [ir.Constant(_i64, ahead + line)])
            b.call(fn, [ptr, ir.Constant(_i32, 0), ir.Constant(_i32, 3), ir.Constant(_i32, 1)])

    def words(self, slot: int, n: int = 1, dyn=None) -> list:
        """n × <LANES x i32>: packed slots ``slot`` … ``slot + n − 1`` (plus ``dyn``, an IR i64)."""
        b = self.b
        base = self.block_ptr if dyn is None else b.gep(self.block_ptr, [b.mul(dyn, ir.Constant(_i64, LANES))])
        return [b.load(b.bitcast(b.gep(base, [ir.Constant(_i64, s * LANES)]), _vec(_i32).as_pointer()), align=4)
                for s in range(slot, slot + n)]

    def dwords(self, offset: int, n: int = 1, dyn=None) -> list:
        """As ``_Emit.dwords``; a run-time ``dyn`` needs slots that are every 4 bytes (Q4_K, F32)."""
        if dyn is not None:
            assert all(self.slot.get(o) == o // 4 for o in range(offset, offset + 4 * n, 4)), "dyn needs linear slots"
            return self.words(offset // 4, n, dyn=self.b.udiv(dyn, ir.Constant(_i64, 4)))
        return [self.words(self.slot[o])[0] for o in range(offset, offset + 4 * n, 4)]


class _Loop:
    """An emitter item: ``n`` iterations of ``body(e, it)`` (``it`` an IR i64, 0 … n−1), each
    covering ``step`` consecutive k, yielding (k within the iteration, weights). Emitted as an IR
    loop, so a 256-value super-block compiles to a loop of 32 or 64 values instead of 256 unrolled
    ones: as fast (measured) and half the compile time."""

    def __init__(self, n: int, step: int, body):
        self.n, self.step, self.body = n, step, body


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


def _block_kernel(name: str, kind: int, emit, packed: bool = False):
    """An intrinsic ``kernel(acc, w, row0, blk, x, nt)`` for block ``blk`` of LANES rows:

    for t < nt, i < LANES, j < block (in that order of j):
        acc[t, i] += float64(W[row0 + i, block·blk + j]) * x[t, block·blk + j]   (fma, exact product)

    acc float64 [MAX_T, LANES]; w uint8 [N, row bytes] (C-contiguous); x float64 [nt, K];
    nt a compile-time literal 1..MAX_T. With ``packed``: ``w`` is :func:`pack`'s uint32
    [groups, blocks, slots, LANES] and ``row0`` the group index.
    """
    type_size, block = TYPE_SIZE[kind], BLOCK[kind]
    slots = SLOTS.get(kind, ())
    n_slots = Q6_K_CODE_SLOTS if kind == _Q6_K else len(slots)

    def kernel(typingctx, acc, w, row0, blk, x, nt):
        if not isinstance(nt, types.IntegerLiteral):
            return None  # numba retries with the literal value
        NT = nt.literal_value
        sig = types.void(acc, w, row0, blk, x, nt)

        def codegen(context, builder, signature, args):
            acc_a, w_a, x_a = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 1, 4))
            row0_v, blk_v = args[2], args[3]
            K = builder.extract_value(x_a.shape, 1)
            if packed:  # w[group, blk] holds the block's words: [slot][lane]
                n_blocks = builder.extract_value(w_a.shape, 1)
                first = builder.mul(builder.add(builder.mul(row0_v, n_blocks), blk_v), ir.Constant(_i64, n_slots * LANES))
                e = _PackedEmit(builder, builder.gep(builder.bitcast(w_a.data, _i32.as_pointer()), [first]), slots)
                block_bytes = 4 * n_slots * LANES
                e.prefetch(-(-PREFETCH_BYTES // block_bytes) * block_bytes, block_bytes)  # whole blocks ahead
            else:  # the address of this block in each of the LANES rows
                row_stride = builder.extract_value(w_a.strides, 0)
                first = builder.add(builder.ptrtoint(w_a.data, _i64),
                                    builder.add(builder.mul(row0_v, row_stride), builder.mul(blk_v, ir.Constant(_i64, type_size))))
                e = _Emit(builder, None)
                lane = ir.Constant(_vec(_i64), list(range(LANES)))
                e.row_ptrs = builder.add(e.splat(first, _i64), builder.mul(lane, e.splat(row_stride, _i64)))
            acc_ptr = builder.bitcast(acc_a.data, _vec(_f64).as_pointer())
            accs = [builder.load(builder.gep(acc_ptr, [ir.Constant(_i64, t)]), align=8) for t in range(NT)]
            fma_ty = ir.FunctionType(_vec(_f64), [_vec(_f64)] * 3)
            fma = cgutils.get_or_insert_function(builder.module, fma_ty, f"llvm.fma.v{LANES}f64")
            k0 = builder.mul(blk_v, ir.Constant(_i64, block))

            def accumulate(accs, kbase, items):
                """accs[t] += w·x[t, kbase + j] for each (j, w) of ``items``, in order."""
                for j, w in items:
                    w64 = w if w.type == _vec(_f64) else builder.fpext(w, _vec(_f64))  # exact
                    for t in range(NT):
                        xi = builder.add(builder.mul(ir.Constant(_i64, t), K), builder.add(kbase, ir.Constant(_i64, j)))
                        xv = e.splat(builder.load(builder.gep(x_a.data, [xi])), _f64)
                        accs[t] = builder.call(fma, [w64, xv, accs[t]])
                return accs

            for item in emit(e):
                if not isinstance(item, _Loop):
                    accs = accumulate(accs, k0, [item])
                    continue
                pre = builder.block
                head, body = builder.append_basic_block("lanes.loop"), builder.append_basic_block("lanes.body")
                done = builder.append_basic_block("lanes.done")
                builder.branch(head)
                builder.position_at_end(head)
                it = builder.phi(_i64)
                it.add_incoming(ir.Constant(_i64, 0), pre)
                phis = []
                for a in accs:
                    phis.append(builder.phi(a.type))
                    phis[-1].add_incoming(a, pre)
                builder.cbranch(builder.icmp_signed("<", it, ir.Constant(_i64, item.n)), body, done)
                builder.position_at_end(body)
                kbase = builder.add(k0, builder.mul(it, ir.Constant(_i64, item.step)))
                out = accumulate(list(phis), kbase, item.body(e, it))
                it_next = builder.add(it, ir.Constant(_i64, 1))
                latch = builder.block
                builder.branch(head)
                it.add_incoming(it_next, latch)
                for phi, a in zip(phis, out):
                    phi.add_incoming(a, latch)
                builder.position_at_end(done)
                accs = phis
            for t in range(NT):
                builder.store(accs[t], builder.gep(acc_ptr, [ir.Constant(_i64, t)]), align=8)
            return context.get_dummy_value()

        return sig, codegen

    kernel.__name__ = kernel.__qualname__ = name
    return intrinsic(kernel)


_block_f32 = _block_kernel("_block_f32", _F32, _emit_f32)
_packed_f32 = _block_kernel("_packed_f32", _F32, _emit_f32, packed=True)
_block_q8_0 = _block_kernel("_block_q8_0", _Q8_0, _emit_q8_0)
_block_mxfp4 = _block_kernel("_block_mxfp4", _MXFP4, _emit_mxfp4)
_block_q4_k = _block_kernel("_block_q4_k", _Q4_K, _emit_q4_k)
_block_q6_k = _block_kernel("_block_q6_k", _Q6_K, _emit_q6_k)
_packed_q8_0 = _block_kernel("_packed_q8_0", _Q8_0, _emit_q8_0, packed=True)
_packed_mxfp4 = _block_kernel("_packed_mxfp4", _MXFP4, _emit_mxfp4, packed=True)
_packed_q4_k = _block_kernel("_packed_q4_k", _Q4_K, _emit_q4_k, packed=True)
_packed_q6_k = _block_kernel("_packed_q6_k", _Q6_K, _emit_q6_k_codes, packed=True)


# --------------------------------------------------------------------------------------------
# The driver: prange over groups of LANES rows; activation rows MAX_T at a time


@jit()
def _group(kind, w, row0, n_blocks, acc, x, nt):
    """acc[:nt] = the sums of rows row0 … row0+LANES−1 for activation rows x[:nt] (nt ≤ MAX_T).
    (One call per literal nt: the intrinsics are specialized on it.)"""
    acc[:] = 0.0
    for blk in range(n_blocks):
        if kind == _Q8_0:
            if nt == 1:
                _block_q8_0(acc, w, row0, blk, x, 1)
            elif nt == 2:
                _block_q8_0(acc, w, row0, blk, x, 2)
            elif nt == 3:
                _block_q8_0(acc, w, row0, blk, x, 3)
            else:
                _block_q8_0(acc, w, row0, blk, x, 4)
        elif kind == _MXFP4:
            if nt == 1:
                _block_mxfp4(acc, w, row0, blk, x, 1)
            elif nt == 2:
                _block_mxfp4(acc, w, row0, blk, x, 2)
            elif nt == 3:
                _block_mxfp4(acc, w, row0, blk, x, 3)
            else:
                _block_mxfp4(acc, w, row0, blk, x, 4)
        elif kind == _Q4_K:
            if nt == 1:
                _block_q4_k(acc, w, row0, blk, x, 1)
            elif nt == 2:
                _block_q4_k(acc, w, row0, blk, x, 2)
            elif nt == 3:
                _block_q4_k(acc, w, row0, blk, x, 3)
            else:
                _block_q4_k(acc, w, row0, blk, x, 4)
        elif kind == _F32:
            if nt == 1:
                _block_f32(acc, w, row0, blk, x, 1)
            elif nt == 2:
                _block_f32(acc, w, row0, blk, x, 2)
            elif nt == 3:
                _block_f32(acc, w, row0, blk, x, 3)
            else:
                _block_f32(acc, w, row0, blk, x, 4)
        else:
            if nt == 1:
                _block_q6_k(acc, w, row0, blk, x, 1)
            elif nt == 2:
                _block_q6_k(acc, w, row0, blk, x, 2)
            elif nt == 3:
                _block_q6_k(acc, w, row0, blk, x, 3)
            else:
                _block_q6_k(acc, w, row0, blk, x, 4)


@jit()
def _lanes_group(kind, w, g, x64, out, block, acc):
    """out[t, n] for the LANES rows of group g and every activation row t (acc: scratch [MAX_T, LANES])."""
    T, K = x64.shape
    row0 = g * LANES
    for t0 in range(0, T, MAX_T):
        nt = min(MAX_T, T - t0)
        _group(kind, w, row0, K // block, acc, x64[t0 : t0 + nt], nt)
        for t in range(nt):
            for i in range(LANES):
                out[t0 + t, row0 + i] = acc[t, i]


@jit(parallel=True)
def _matmul_lanes(kind, w, x64, out, block):
    """out[t, n] for the first ``LANES·(N // LANES)`` rows of ``w`` (the plain path's numbers)."""
    for g in prange(w.shape[0] // LANES):
        _lanes_group(kind, w, g, x64, out, block, np.empty((MAX_T, LANES), dtype=np.float64))


@jit()
def _matmul_lanes_serial(kind, w, x64, out, block):
    """``_matmul_lanes`` on the calling thread (small products: see ``SERIAL_BELOW``)."""
    acc = np.empty((MAX_T, LANES), dtype=np.float64)
    for g in range(w.shape[0] // LANES):
        _lanes_group(kind, w, g, x64, out, block, acc)


@jit()
def _group_packed(kind, p, grp, acc, x, nt):
    """``_group`` over the packed words of group ``grp`` (p: uint32 [groups, blocks, slots, LANES])."""
    acc[:] = 0.0
    for blk in range(p.shape[1]):
        if kind == _Q8_0:
            if nt == 1:
                _packed_q8_0(acc, p, grp, blk, x, 1)
            elif nt == 2:
                _packed_q8_0(acc, p, grp, blk, x, 2)
            elif nt == 3:
                _packed_q8_0(acc, p, grp, blk, x, 3)
            else:
                _packed_q8_0(acc, p, grp, blk, x, 4)
        elif kind == _MXFP4:
            if nt == 1:
                _packed_mxfp4(acc, p, grp, blk, x, 1)
            elif nt == 2:
                _packed_mxfp4(acc, p, grp, blk, x, 2)
            elif nt == 3:
                _packed_mxfp4(acc, p, grp, blk, x, 3)
            else:
                _packed_mxfp4(acc, p, grp, blk, x, 4)
        elif kind == _Q4_K:
            if nt == 1:
                _packed_q4_k(acc, p, grp, blk, x, 1)
            elif nt == 2:
                _packed_q4_k(acc, p, grp, blk, x, 2)
            elif nt == 3:
                _packed_q4_k(acc, p, grp, blk, x, 3)
            else:
                _packed_q4_k(acc, p, grp, blk, x, 4)
        elif kind == _F32:
            if nt == 1:
                _packed_f32(acc, p, grp, blk, x, 1)
            elif nt == 2:
                _packed_f32(acc, p, grp, blk, x, 2)
            elif nt == 3:
                _packed_f32(acc, p, grp, blk, x, 3)
            else:
                _packed_f32(acc, p, grp, blk, x, 4)
        else:
            if nt == 1:
                _packed_q6_k(acc, p, grp, blk, x, 1)
            elif nt == 2:
                _packed_q6_k(acc, p, grp, blk, x, 2)
            elif nt == 3:
                _packed_q6_k(acc, p, grp, blk, x, 3)
            else:
                _packed_q6_k(acc, p, grp, blk, x, 4)


@jit()
def _packed_group(kind, p, g, x64, out, acc):
    """``_lanes_group`` over packed words."""
    T = x64.shape[0]
    for t0 in range(0, T, MAX_T):
        nt = min(MAX_T, T - t0)
        _group_packed(kind, p, g, acc, x64[t0 : t0 + nt], nt)
        for t in range(nt):
            for i in range(LANES):
                out[t0 + t, g * LANES + i] = acc[t, i]


@jit(parallel=True)
def _matmul_packed(kind, p, x64, out):
    """``_matmul_lanes`` over packed words: out[t, n] for the first ``LANES·groups`` rows."""
    for g in prange(p.shape[0]):
        _packed_group(kind, p, g, x64, out, np.empty((MAX_T, LANES), dtype=np.float64))


@jit()
def _matmul_packed_serial(kind, p, x64, out):
    """``_matmul_packed`` on the calling thread (small products: see ``SERIAL_BELOW``)."""
    acc = np.empty((MAX_T, LANES), dtype=np.float64)
    for g in range(p.shape[0]):
        _packed_group(kind, p, g, x64, out, acc)


@jit(parallel=True)
def _pack_words(w, type_size, slots, out):
    """out[g, blk, s, i] = the little-endian uint32 at byte blk·type_size + slots[s] of row g·LANES + i."""
    for g in prange(out.shape[0]):
        for i in range(LANES):  # each row read front to back; the group's words (≤ ~30 KB) stay in cache
            row = w[g * LANES + i]
            for blk in range(out.shape[1]):
                for s in range(slots.size):
                    o = blk * type_size + slots[s]
                    out[g, blk, s, i] = (np.uint32(row[o]) | (np.uint32(row[o + 1]) << np.uint32(8))
                                         | (np.uint32(row[o + 2]) << np.uint32(16)) | (np.uint32(row[o + 3]) << np.uint32(24)))


@jit(parallel=True)
def _pack_q6_k(w, out):
    """out[g, blk] for rows g·LANES … g·LANES + LANES − 1: their 256 codes q − 32 as int8 (q as
    ``_deq_q6_k`` assembles it), column-major — byte k·LANES + i of the block's first 64 slots is row i's
    code k —, then per row the 16 int8 scales (slots 64–67) and d (``F16_TABLE``) as float32 bits (68)."""
    for g in prange(out.shape[0]):
        codes = np.empty((256, LANES), dtype=np.int8)  # [k, row]
        d = np.empty(1, dtype=np.float32)
        for blk in range(out.shape[1]):
            o = 210 * blk
            for i in range(LANES):
                src = w[g * LANES + i]
                for n in range(2):
                    for l in range(32):
                        ql0 = int(src[o + 64 * n + l])
                        ql1 = int(src[o + 64 * n + l + 32])
                        qh = int(src[o + 128 + 32 * n + l])
                        codes[128 * n + l, i] = ((ql0 & 15) | ((qh & 3) << 4)) - 32
                        codes[128 * n + l + 32, i] = ((ql1 & 15) | (((qh >> 2) & 3) << 4)) - 32
                        codes[128 * n + l + 64, i] = ((ql0 >> 4) | (((qh >> 4) & 3) << 4)) - 32
                        codes[128 * n + l + 96, i] = ((ql1 >> 4) | (((qh >> 6) & 3) << 4)) - 32
                for j in range(4):
                    b0 = o + 192 + 4 * j
                    out[g, blk, 64 + j, i] = (np.uint32(src[b0]) | (np.uint32(src[b0 + 1]) << np.uint32(8))
                                              | (np.uint32(src[b0 + 2]) << np.uint32(16)) | (np.uint32(src[b0 + 3]) << np.uint32(24)))
                d[0] = F16_TABLE[int(src[o + 208]) | (int(src[o + 209]) << 8)]
                out[g, blk, 68, i] = d.view(np.uint32)[0]
            u = codes.reshape(-1).view(np.uint8)  # [256·LANES] in k-major order
            for wi in range(64 * LANES):  # word wi = bytes 4·wi … 4·wi + 3 of that order
                out[g, blk, wi // LANES, wi % LANES] = (np.uint32(u[4 * wi]) | (np.uint32(u[4 * wi + 1]) << np.uint32(8))
                                                        | (np.uint32(u[4 * wi + 2]) << np.uint32(16)) | (np.uint32(u[4 * wi + 3]) << np.uint32(24)))


class PackedRows:
    """A weight matrix laid out for the lane kernels, next to its original rows (see :func:`pack`).

    Behaves like the original array (N, row bytes) — or (X, N, row bytes) for a stack of experts —
    for ``shape``, ``ndim``, ``dtype``, ``nbytes`` and indexing, so code that looks rows up keeps
    working: ``packed[e]`` of a stack is expert e's PackedRows; ``packed[a:b]`` with ``a`` a multiple
    of LANES is the PackedRows of those rows; any other index gives the original bytes, as the raw
    array would. ``kernels.matmul`` recognises a 2-D PackedRows and multiplies with its words."""

    def __init__(self, raw: np.ndarray, qtype, words: np.ndarray):
        self.raw, self.qtype, self.words = raw, qtype, words  # words: uint32 [groups, blocks, slots, LANES]

    shape = property(lambda self: self.raw.shape)
    ndim = property(lambda self: self.raw.ndim)
    dtype = property(lambda self: self.raw.dtype)
    nbytes = property(lambda self: self.raw.nbytes)

    def __getitem__(self, idx):
        if self.raw.ndim == 3 and isinstance(idx, (int, np.integer)):
            per = self.raw.shape[1] // LANES  # groups per expert (a stack is packed only when whole)
            e = range(self.raw.shape[0])[idx]
            return PackedRows(self.raw[e], self.qtype, self.words[e * per : (e + 1) * per])
        if self.raw.ndim == 2 and isinstance(idx, slice) and idx.step in (None, 1):
            start, stop, _ = idx.indices(self.raw.shape[0])
            if start % LANES == 0 and stop >= start:
                return PackedRows(self.raw[start:stop], self.qtype, self.words[start // LANES : stop // LANES])
        return self.raw[idx]

    def __len__(self):
        return len(self.raw)

    def __repr__(self):
        return f"PackedRows({self.qtype.name}, {self.raw.shape[0]} rows, {self.words.nbytes >> 20} MiB packed)"


def pack(w_raw: np.ndarray, qtype):
    """``w_raw`` (N rows of ``qtype`` bytes, or a stack (X, N, row bytes) of expert matrices with N a
    multiple of LANES) as :class:`PackedRows` when the type has a lane kernel and N ≥ LANES;
    otherwise ``w_raw`` itself. Either result can be passed to ``kernels.matmul``
    in place of ``w_raw``, with identical results; the packed one skips the gathers (faster when a
    matrix is multiplied many times, e.g. every decoded token) at the cost of a copy of its bytes.

    Layout: for each group of LANES rows and each block, the 32-bit words the kernel reads
    (``SLOTS``: byte offsets within the block) of the LANES rows side by side —
    uint32 [N // LANES, blocks, slots, LANES]; for Q6_K the words of ``_pack_q6_k`` instead (its
    6-bit codes already assembled: 276 bytes per 256 values instead of 210). Rows after the last
    whole group stay in ``raw`` only.
    """
    if isinstance(w_raw, PackedRows):
        return w_raw
    from .dequant import as_row_bytes

    ndim = np.asarray(w_raw).ndim
    if not supported(qtype) or ndim not in (2, 3) or not JIT_ENABLED:
        return w_raw
    if ndim == 3 and w_raw.shape[1] % LANES:  # a stack of experts: only whole groups per expert
        return w_raw
    kind = int(qtype)
    w_bytes, K = as_row_bytes(np.asarray(w_raw).reshape(-1, w_raw.shape[-1]), qtype, what="pack: w_raw")
    groups = w_bytes.shape[0] // LANES
    if groups == 0 or K % BLOCK[kind]:
        return w_raw
    n_blocks = w_bytes.shape[1] // TYPE_SIZE[kind]
    if kind == _Q6_K:
        words = np.empty((groups, n_blocks, Q6_K_CODE_SLOTS, LANES), dtype=np.uint32)
        _pack_q6_k(w_bytes, words)
    else:
        slots = np.array(SLOTS[kind], dtype=np.int64)
        words = np.empty((groups, n_blocks, slots.size, LANES), dtype=np.uint32)
        _pack_words(w_bytes, TYPE_SIZE[kind], slots, words)
    return PackedRows(w_raw, qtype, words)


def matmul_packed(p: PackedRows, x64: np.ndarray, out: np.ndarray) -> int:
    """``matmul_lanes`` for a packed matrix: fill ``out[:, :n]``, n = LANES·groups; return n."""
    n = p.words.shape[0] * LANES
    kernel = _matmul_packed_serial if n * x64.shape[0] * x64.shape[1] < SERIAL_BELOW else _matmul_packed
    kernel(int(p.qtype), p.words, x64, out)
    return n


def supported(qtype) -> bool:
    """True when ``matmul`` runs this weight type through the lane kernels."""
    return int(qtype) in TYPE_SIZE


def matmul_lanes(w_bytes: np.ndarray, qtype, x64: np.ndarray, out: np.ndarray) -> int:
    """Fill ``out[:, :n]`` for the first n = LANES·(N // LANES) rows; return n (the caller does the rest)."""
    kind = int(qtype)
    n = w_bytes.shape[0] // LANES * LANES
    if x64.shape[1] % BLOCK[kind]:  # F32 rows whose length is not a multiple of 16
        return 0
    if n:
        kernel = _matmul_lanes_serial if n * x64.shape[0] * x64.shape[1] < SERIAL_BELOW else _matmul_lanes
        kernel(kind, w_bytes, x64, out, BLOCK[kind])
    return n


__all__ = ["LANES", "MAX_T", "LANE_TYPES", "PackedRows", "pack", "supported", "matmul_lanes", "matmul_packed", "MXFP4_VALUES"]
