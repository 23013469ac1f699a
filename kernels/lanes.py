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

1. **Scale table** (plain numba, per row and block): the float32 factors the row decoder forms
   first — Q8_0 ``d``; MXFP4 ``E8M0_HALF[e]``; Q4_K ``d·sc`` and ``dmin·m`` per 32-value
   sub-block; Q6_K ``d·sc`` per 16-value group — computed with the decoder's own operations.
2. **Block kernel** (one LLVM-IR intrinsic per type, below), per block of the row: the quant
   bytes of the 16 rows are fetched four at a time with a *gather* (one 32-bit load per lane, at the
   same byte offset in each row), unpacked with shifts and masks, converted and scaled in float32
   exactly as the decoder does (same operations, same order, no FMA contraction), widened to float64
   and accumulated with ``acc[t] = fma(w, x[t, k], acc[t])`` for up to four activation rows. The
   fused multiply-add rounds once, after adding the *exact* product (two float32 values multiply
   exactly in float64), so it equals the separate multiply and add of the plain path.
3. The ``T`` activation rows are taken four at a time (four accumulators of 16 float64 lanes, 8
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

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .blocks import QT
from .dequant import MXFP4_VALUES, k_scale_min
from .flags import jit
from .floats import E8M0_HALF, F16_TABLE

LANES = 16  # weight rows per group: one float64 accumulator each (2 zmm per activation row)
MAX_T = 4  # activation rows per pass (4 x 4 accumulator registers)

_Q8_0, _MXFP4, _Q4_K, _Q6_K = int(QT.Q8_0), int(QT.MXFP4), int(QT.Q4_K), int(QT.Q6_K)
LANE_TYPES = (QT.Q8_0, QT.MXFP4, QT.Q4_K, QT.Q6_K)
TYPE_SIZE = {_Q8_0: 34, _MXFP4: 17, _Q4_K: 144, _Q6_K: 210}
BLOCK = {_Q8_0: 32, _MXFP4: 32, _Q4_K: 256, _Q6_K: 256}
SCALES = {_Q8_0: 1, _MXFP4: 1, _Q4_K: 16, _Q6_K: 16}  # float32 table entries per block and row

# --------------------------------------------------------------------------------------------
# LLVM IR vocabulary: vectors of LANES values, one per weight row


_i1, _i32, _i64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
_f32, _f64 = ir.FloatType(), ir.DoubleType()


def _vec(t):
    return ir.VectorType(t, LANES)


class _Emit:
    """Helpers that emit IR for one block of ``LANES`` rows (``b``: the IR builder)."""

    def __init__(self, b, row_ptrs, scale_ptr):
        self.b = b
        self.row_ptrs = row_ptrs  # <LANES x i64>: address of this block's first byte in each row
        self.scale_ptr = scale_ptr  # float*: this block's scale table, [scales][LANES]

    def const(self, value, t=_i32):
        return ir.Constant(_vec(t), [value] * LANES)

    def splat(self, x, t):
        v = self.b.insert_element(ir.Constant(_vec(t), ir.Undefined), x, ir.Constant(_i32, 0))
        return self.b.shuffle_vector(v, ir.Constant(_vec(t), ir.Undefined), ir.Constant(_vec(_i32), [0] * LANES))

    def dwords(self, offset: int, n: int) -> list:
        """n × <LANES x i32>: the little-endian 4-byte words at ``offset``, ``offset + 4``, … in this
        block of every row (one gather each: one 32-bit load per lane)."""
        b = self.b
        ptr_t = ir.VectorType(_i32.as_pointer(), LANES)
        fnty = ir.FunctionType(_vec(_i32), [ptr_t, _i32, _vec(_i1), _vec(_i32)])
        gather = cgutils.get_or_insert_function(b.module, fnty, f"llvm.masked.gather.v{LANES}i32.v{LANES}p0")
        words = []
        for o in range(offset, offset + 4 * n, 4):
            ptrs = b.inttoptr(b.add(self.row_ptrs, ir.Constant(_vec(_i64), [o] * LANES)), ptr_t)
            words.append(b.call(gather, [ptrs, ir.Constant(_i32, 1), ir.Constant(_vec(_i1), [1] * LANES),
                                         ir.Constant(_vec(_i32), ir.Undefined)]))
        return words

    def byte(self, dw, k: int):
        """Unsigned byte k (0..3) of each lane's dword."""
        return self.b.and_(self.b.lshr(dw, self.const(8 * k)), self.const(0xFF))

    def sbyte(self, dw, k: int):
        """Signed byte k (0..3) of each lane's dword (int8 sign-extended)."""
        return self.b.ashr(self.b.shl(dw, self.const(24 - 8 * k)), self.const(24))

    def scale(self, s: int):
        """<LANES x float>: entry ``s`` of this block's scale table (one value per row)."""
        ptr = self.b.gep(self.scale_ptr, [ir.Constant(_i64, s * LANES)])
        return self.b.load(self.b.bitcast(ptr, _vec(_f32).as_pointer()), align=4)

    def u2f(self, q):
        return self.b.uitofp(q, _vec(_f32))

    def s2f(self, q):
        return self.b.sitofp(q, _vec(_f32))


# --------------------------------------------------------------------------------------------
# Per-type block emitters: yield (k within the block, <LANES x float> weights) in increasing k,
# computing each weight with the float32 operations of the row decoder in kernels/dequant.py.


def _emit_q8_0(e: _Emit):
    """``_deq_q8_0``: w[j] = float32(qs[j]) * d, j = 0..31; qs at byte 2."""
    d = e.scale(0)
    for j4, dw in enumerate(e.dwords(2, 8)):
        for k in range(4):
            yield 4 * j4 + k, e.b.fmul(e.s2f(e.sbyte(dw, k)), d)


def _emit_mxfp4(e: _Emit):
    """``_deq_mxfp4``: w[j] = d * K[qs[j] & 15], w[j+16] = d * K[qs[j] >> 4], j = 0..15; qs at byte 1.

    K = MXFP4_VALUES (0, 1, 2, 3, 4, 6, 8, 12, then the negatives) is computed from the code c:
    magnitude ``((2 | (c & 1)) << (c >> 1)) >> 1`` for c = 1..7 (0 for c = 0), sign from bit 3."""
    b, d = e.b, e.scale(0)
    dws = e.dwords(1, 4)
    for high in (False, True):
        for j4 in range(4):
            for k in range(4):
                byte = e.byte(dws[j4], k)
                code = b.lshr(byte, e.const(4)) if high else b.and_(byte, e.const(15))
                c = b.and_(code, e.const(7))
                mag = b.lshr(b.shl(b.or_(e.const(2), b.and_(c, e.const(1))), b.lshr(c, e.const(1))), e.const(1))
                mag = b.select(b.icmp_unsigned("==", c, e.const(0)), e.const(0), mag)
                val = b.select(b.icmp_unsigned("!=", b.and_(code, e.const(8)), e.const(0)), b.neg(mag), mag)
                yield 16 * high + 4 * j4 + k, b.fmul(d, e.s2f(val))


def _emit_q4_k(e: _Emit):
    """``_deq_q4_k``: for c = 0..3, l = 0..31 with byte = qs[32c + l] (qs at byte 16):
    w[64c + l] = (d·sc[2c]) * float32(byte & 15) − dmin·m[2c];
    w[64c + 32 + l] = (d·sc[2c+1]) * float32(byte >> 4) − dmin·m[2c+1]."""
    b = e.b
    for c in range(4):
        dws = e.dwords(16 + 32 * c, 8)
        for high in (0, 1):
            sub = 2 * c + high
            dsc, dmm = e.scale(2 * sub), e.scale(2 * sub + 1)
            for j4 in range(8):
                for k in range(4):
                    byte = e.byte(dws[j4], k)
                    q = b.lshr(byte, e.const(4)) if high else b.and_(byte, e.const(15))
                    yield 64 * c + 32 * high + 4 * j4 + k, b.fsub(b.fmul(dsc, e.u2f(q)), dmm)


def _emit_q6_k(e: _Emit):
    """``_deq_q6_k``: for n = 0..1, l = 0..31 with ql0 = ql[64n + l], ql1 = ql[64n + 32 + l],
    qh = qh[32n + l] (ql at byte 0, qh at 128) and group g = 8n + l // 16:
    w[128n + l]      = (d·sc[g])     * (float32((ql0 & 15) | ((qh & 3) << 4)) − 32)
    w[128n + 32 + l] = (d·sc[g + 2]) * (float32((ql1 & 15) | (((qh >> 2) & 3) << 4)) − 32)
    w[128n + 64 + l] = (d·sc[g + 4]) * (float32((ql0 >> 4) | (((qh >> 4) & 3) << 4)) − 32)
    w[128n + 96 + l] = (d·sc[g + 6]) * (float32((ql1 >> 4) | (((qh >> 6) & 3) << 4)) − 32)
    The 6-bit codes of four consecutive l are assembled at once in one 32-bit word (byte k = l + k)."""
    b = e.b
    thirty_two = ir.Constant(_vec(_f32), [32.0] * LANES)
    nib, two = e.const(0x0F0F0F0F), e.const(0x03030303)
    for n in range(2):
        ql0, ql1, qh = e.dwords(64 * n, 8), e.dwords(64 * n + 32, 8), e.dwords(128 + 32 * n, 8)
        for quarter in range(4):
            for j4 in range(8):
                lo = (ql0 if quarter in (0, 2) else ql1)[j4]
                lo = b.and_(b.lshr(lo, e.const(4)) if quarter >= 2 else lo, nib)
                hi = b.and_(b.lshr(qh[j4], e.const(2 * quarter)) if quarter else qh[j4], two)
                codes = b.or_(lo, b.shl(hi, e.const(4)))  # four 6-bit codes, one per byte
                ds = e.scale(8 * n + (4 * j4) // 16 + 2 * quarter)
                for k in range(4):
                    yield 128 * n + 32 * quarter + 4 * j4 + k, b.fmul(ds, b.fsub(e.u2f(e.byte(codes, k)), thirty_two))


def _block_kernel(name: str, type_size: int, block: int, n_scales: int, emit):
    """An intrinsic ``kernel(acc, w, row0, blk, tab, x, nt)`` for one block of LANES rows:

    for t < nt, i < LANES, j < block (in that order of j):
        acc[t, i] += float64(W[row0 + i, block·blk + j]) * x[t, block·blk + j]   (fma, exact product)

    acc float64 [MAX_T, LANES]; w uint8 [N, row bytes]; tab float32 [n_blocks, n_scales, LANES];
    x float64 [nt, K]; nt a compile-time literal 1..MAX_T.
    """

    def kernel(typingctx, acc, w, row0, blk, tab, x, nt):
        if not isinstance(nt, types.IntegerLiteral):
            return None  # numba retries with the literal value
        NT = nt.literal_value
        sig = types.void(acc, w, row0, blk, tab, x, nt)

        def codegen(context, builder, signature, args):
            def array(i):
                return context.make_array(signature.args[i])(context, builder, args[i])

            acc_a, w_a, tab_a, x_a = array(0), array(1), array(4), array(5)
            row0_v, blk_v = args[2], args[3]
            row_stride = builder.extract_value(w_a.strides, 0)
            K = builder.extract_value(x_a.shape, 1)
            # address of this block in each of the LANES rows
            first = builder.add(builder.ptrtoint(w_a.data, _i64),
                                builder.add(builder.mul(row0_v, row_stride), builder.mul(blk_v, ir.Constant(_i64, type_size))))
            lane = ir.Constant(_vec(_i64), list(range(LANES)))
            e = _Emit(builder, None, None)
            e.row_ptrs = builder.add(e.splat(first, _i64), builder.mul(lane, e.splat(row_stride, _i64)))
            e.scale_ptr = builder.gep(tab_a.data, [builder.mul(blk_v, ir.Constant(_i64, n_scales * LANES))])
            acc_ptr = builder.bitcast(acc_a.data, _vec(_f64).as_pointer())
            accs = [builder.load(builder.gep(acc_ptr, [ir.Constant(_i64, t)]), align=8) for t in range(NT)]
            fma_ty = ir.FunctionType(_vec(_f64), [_vec(_f64)] * 3)
            fma = cgutils.get_or_insert_function(builder.module, fma_ty, f"llvm.fma.v{LANES}f64")
            k0 = builder.mul(blk_v, ir.Constant(_i64, block))
            for j, w32 in emit(e):
                w64 = builder.fpext(w32, _vec(_f64))  # exact
                for t in range(NT):
                    xi = builder.add(builder.mul(ir.Constant(_i64, t), K), builder.add(k0, ir.Constant(_i64, j)))
                    xv = e.splat(builder.load(builder.gep(x_a.data, [xi])), _f64)
                    accs[t] = builder.call(fma, [w64, xv, accs[t]])
            for t in range(NT):
                builder.store(accs[t], builder.gep(acc_ptr, [ir.Constant(_i64, t)]), align=8)
            return context.get_dummy_value()

        return sig, codegen

    kernel.__name__ = kernel.__qualname__ = name
    return intrinsic(kernel)


_block_q8_0 = _block_kernel("_block_q8_0", 34, 32, 1, _emit_q8_0)
_block_mxfp4 = _block_kernel("_block_mxfp4", 17, 32, 1, _emit_mxfp4)
_block_q4_k = _block_kernel("_block_q4_k", 144, 256, 16, _emit_q4_k)
_block_q6_k = _block_kernel("_block_q6_k", 210, 256, 16, _emit_q6_k)


# --------------------------------------------------------------------------------------------
# Scale tables (the decoders' first float32 operations, per row and block) and the driver


@jit()
def _f16(src, o):
    """The little-endian binary16 at ``src[o:o+2]`` as float32 (== floats.f16_at, by table)."""
    return F16_TABLE[int(src[o]) | (int(src[o + 1]) << 8)]


@jit()
def _scale_table(kind, w, row0, tab):
    """tab[blk, s, i] for rows row0 … row0+LANES−1: the per-block float32 factors of ``kind``."""
    n_blocks = tab.shape[0]
    for i in range(LANES):
        src = w[row0 + i]
        for blk in range(n_blocks):
            if kind == _Q8_0:
                tab[blk, 0, i] = _f16(src, 34 * blk)
            elif kind == _MXFP4:
                tab[blk, 0, i] = E8M0_HALF[src[17 * blk]]
            elif kind == _Q4_K:
                o = 144 * blk
                d = _f16(src, o)
                dmin = _f16(src, o + 2)
                for sub in range(8):
                    sc, m = k_scale_min(src, o + 4, sub)
                    tab[blk, 2 * sub, i] = d * np.float32(sc)
                    tab[blk, 2 * sub + 1, i] = dmin * np.float32(m)
            else:  # _Q6_K
                o = 210 * blk
                d = _f16(src, o + 208)
                for g in range(16):
                    sc = np.int8(src[o + 192 + g])
                    tab[blk, g, i] = d * np.float32(sc)


@jit()
def _group(kind, w, row0, tab, acc, x, nt):
    """acc[:nt] = the sums of rows row0 … row0+LANES−1 for activation rows x[:nt] (nt ≤ MAX_T)."""
    acc[:] = 0.0
    for blk in range(tab.shape[0]):
        if kind == _Q8_0:
            if nt == 1:
                _block_q8_0(acc, w, row0, blk, tab, x, 1)
            elif nt == 2:
                _block_q8_0(acc, w, row0, blk, tab, x, 2)
            elif nt == 3:
                _block_q8_0(acc, w, row0, blk, tab, x, 3)
            else:
                _block_q8_0(acc, w, row0, blk, tab, x, 4)
        elif kind == _MXFP4:
            if nt == 1:
                _block_mxfp4(acc, w, row0, blk, tab, x, 1)
            elif nt == 2:
                _block_mxfp4(acc, w, row0, blk, tab, x, 2)
            elif nt == 3:
                _block_mxfp4(acc, w, row0, blk, tab, x, 3)
            else:
                _block_mxfp4(acc, w, row0, blk, tab, x, 4)
        elif kind == _Q4_K:
            if nt == 1:
                _block_q4_k(acc, w, row0, blk, tab, x, 1)
            elif nt == 2:
                _block_q4_k(acc, w, row0, blk, tab, x, 2)
            elif nt == 3:
                _block_q4_k(acc, w, row0, blk, tab, x, 3)
            else:
                _block_q4_k(acc, w, row0, blk, tab, x, 4)
        else:
            if nt == 1:
                _block_q6_k(acc, w, row0, blk, tab, x, 1)
            elif nt == 2:
                _block_q6_k(acc, w, row0, blk, tab, x, 2)
            elif nt == 3:
                _block_q6_k(acc, w, row0, blk, tab, x, 3)
            else:
                _block_q6_k(acc, w, row0, blk, tab, x, 4)


@jit(parallel=True)
def _matmul_lanes(kind, w, x64, out, n_scales):
    """out[t, n] for the first ``LANES·(N // LANES)`` rows of ``w`` (the plain path's numbers)."""
    T, K = x64.shape
    n_blocks = K // (256 if kind == _Q4_K or kind == _Q6_K else 32)
    for g in prange(w.shape[0] // LANES):
        row0 = g * LANES
        tab = np.empty((n_blocks, n_scales, LANES), dtype=np.float32)
        acc = np.empty((MAX_T, LANES), dtype=np.float64)
        _scale_table(kind, w, row0, tab)
        for t0 in range(0, T, MAX_T):
            nt = min(MAX_T, T - t0)
            _group(kind, w, row0, tab, acc, x64[t0 : t0 + nt], nt)
            for t in range(nt):
                for i in range(LANES):
                    out[t0 + t, row0 + i] = acc[t, i]


def supported(qtype) -> bool:
    """True when ``matmul`` runs this weight type through the lane kernels."""
    return int(qtype) in TYPE_SIZE


def matmul_lanes(w_bytes: np.ndarray, qtype, x64: np.ndarray, out: np.ndarray) -> int:
    """Fill ``out[:, :n]`` for the first n = LANES·(N // LANES) rows; return n (the caller does the rest)."""
    kind = int(qtype)
    n = w_bytes.shape[0] // LANES * LANES
    if n:
        _matmul_lanes(kind, w_bytes, x64, out, SCALES[kind])
    return n


__all__ = ["LANES", "MAX_T", "LANE_TYPES", "supported", "matmul_lanes", "MXFP4_VALUES"]
