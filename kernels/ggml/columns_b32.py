"""Q4_0, IQ4_NL and MXFP4 repacked (``gemv/gemm_q4_b32_8x8_q8_0_lut_avx``, :mod:`kernels.ggml.repack`) in the column
layout from their 4-bit codes: a sub-tile of 16 output columns against one activation row, every block, in one
vector-IR step.

The numerics are :mod:`kernels.ggml.columns`' for these types, per output element and 32-value block: the exact
integer dot of the block's LUT values with the row's Q8_0 values — on the gemv's rows plus the sign trick's ``256·w``
for each activation byte -128 met by a weight ``w < 0`` (:func:`kernels.ggml.mulmat_q8._sign_dot`) —, then
``acc = fma(float(dot), float32(d · y.d), acc)``, the blocks in K order.

What this module changes is the bytes read: the layout keeps each value's 4-bit code, as the stored rows and
llama.cpp's repacked ones do, not its LUT value (a byte: the pairs layout, twice the bytes, which kept a decode step
of MXFP4 experts at ~20 GB/s of layout for half that of weights). Per block a sub-tile's codes are 4 rows of 64 bytes
(:func:`kernels.ggml.columns.layout`): byte ``4j + e`` of row ``v`` holds column ``j``'s code of value ``4v + e`` in
its low nibble and of value ``16 + 4v + e`` in its high one (the stored block's byte ``4v + e``). ``vpshufb`` turns codes into ``u = LUT value + OFF`` (0 … 255), ``vpdpbusd``
sums ``u·y`` over 4 values for 16 columns at once, and ``Σu·y − OFF·Σy`` is the exact dot (``Σy``: the row's sum of
the block's 32 activations). A gemv row whose block holds a -128 (the Q8_0 quantizer's extreme: rare) takes the
definition, :func:`b32_sub_tile_def`, which the tests hold the IR to.

Where: AVX-512 VNNI (``vpdpbusd``, ``vpshufb`` of 64 bytes) for the three types; AVX2 (``vpshufb`` per 32 bytes,
``vpmaddubsw`` + ``vpmaddwd``) for Q4_0 and MXFP4, whose ``u ≤ 24`` keeps ``vpmaddubsw``'s int16 pair sums exact —
not IQ4_NL's ``u ≤ 240`` (:func:`fast`). Elsewhere the layout keeps the pairs of values (``vpmaddwd``).
"""

from __future__ import annotations

import numpy as np

from kernels.base.block import QT
from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml.columns_ir import LEVEL, first_rows
from kernels.ggml.repack import _TYPES
from kernels.ggml.simd import fma32

F32 = np.float32
#: the types, in the order of their kernels' ``kind - 6`` (:data:`kernels.ggml.columns.NIBBLE_KIND`)
TYPES = (QT.Q4_0, QT.IQ4_NL, QT.MXFP4)
#: per type, the LUT: the value of each code (kernels.ggml.repack's, as the repacked kernels read them)
LUT = np.stack([_TYPES[t][0] for t in TYPES]).astype(np.int8)  # (3, 16)
OFF = -LUT.min(axis=1).astype(np.int64)  # (3,): u = value + OFF is 0 … 255 (IQ4_NL: 113 + 127 = 240)
U_TAB = np.tile((LUT.astype(np.int64) + OFF[:, None]).astype(np.uint8), (1, 4))  # (3, 64): vpshufb's 4 lanes
#: per type, the instruction level its vector step runs at here (columns_ir.LEVEL: 2 VNNI, 1 AVX2), or 0: none —
#: AVX2's vpmaddubsw sums two u·y in int16, exact while 2·max(u)·128 < 2^15 (Q4_0 15, MXFP4 24; not IQ4_NL's 240)
VECTOR = np.array([LEVEL if JIT_ENABLED and (LEVEL == 2 or LEVEL == 1 and 2 * int(u.max()) * 128 < 2**15) else 0
                   for u in U_TAB], np.int64)


def fast(qtype) -> bool:
    """Whether ``--emulate=ggml`` lays ``qtype`` out as codes here (its vector step runs on this host)."""
    return qtype in TYPES and bool(VECTOR[TYPES.index(qtype)])


@jit()
def _code(q, qr0, b, j, l):
    """The code of value ``l`` (0 … 31) of block ``b`` of column ``j`` (0 … 15) of the sub-tile at row ``qr0``."""
    byte = np.int64(q[qr0 + 4 * b + (l % 16) // 4, 4 * j + l % 4]) & 0xFF
    return (byte >> 4) if l >= 16 else (byte & 15)


@jit()
def b32_sub_tile_def(acc, o, q, c, nc, y, yd, rows, sel, d, m128, gemm, t):
    """The definition: columns ``c … c + nc - 1`` of one tile (one sub-tile: ``c % 16 + nc <= 16``; ``q`` (K/2,
    64) its nibble rows, ``d`` (K/32, TILE) the scales), every block, for the activation rows ``rows[sel[m]]`` (``y``
    int8 (T, K), ``yd`` float32 (T, K/32), ``m128`` / ``gemm`` the gemv's -128 blocks / the gemm's rows) into
    ``acc[sel[m], o:o + nc]``; ``t`` the type (:data:`TYPES`)."""
    qr0 = (c // 16) * (q.shape[0] // 4)
    j0 = c % 16
    for m in range(sel.shape[0]):
        i = sel[m]
        r = rows[i]
        for b in range(d.shape[0]):
            wrap = not gemm[r] and m128[r, b]
            for j in range(nc):
                s = np.int64(0)
                for l in range(32):
                    v = np.int64(LUT[t, _code(q, qr0, b, j0 + j, l)])
                    yv = np.int64(y[r, 32 * b + l])
                    s += v * yv
                    if wrap and yv == -128 and v < 0:  # the gemv's sign trick: |w| · sign(-128, w) wraps to -128
                        s += 256 * v
                acc[i, o + j] = fma32(F32(s), F32(d[b, c + j] * yd[r, b]), acc[i, o + j])


@jit()
def _sub_tile16_def(acc, o, q, c, y, yd, rows, sel, d, t):
    """:func:`b32_sub_tile_def` for 16 columns and rows free of the sign trick (:func:`b32_sub_tile16`'s contract),
    where no vector step runs."""
    n = y.shape[0]
    b32_sub_tile_def(acc, o, q, c, 16, y, yd, rows, sel, d, np.zeros((n, d.shape[0]), np.bool_), np.ones(n, np.bool_), t)


if JIT_ENABLED:
    from llvmlite import ir
    from numba import literally, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from kernels.ggml.columns_ir import _B32, _V8, _Args, _dpbusd, _halves, _join, _k, _lit, _splat, _x86

    _i8, _i32 = ir.IntType(8), ir.IntType(32)
    _V16, _B64, _F16 = ir.VectorType(_i32, 16), ir.VectorType(_i8, 64), ir.VectorType(ir.FloatType(), 16)

    def _pshufb(b, level, table, codes):
        """``table[lane16 + codes[i]]`` for the 64 bytes (codes 0 … 15): ``vpshufb`` of 64 bytes (``level`` 2), or of
        each 32-byte half (1)."""
        if level == 2:
            return _x86(b, "llvm.x86.avx512.pshuf.b.512", _B64, table, codes)
        halves = [b.bitcast(_x86(b, "llvm.x86.avx2.pshuf.b", _B32, t, c_), _V8)
                  for t, c_ in zip(_halves(b, table, _B32), _halves(b, codes, _B32))]
        return b.bitcast(_join(b, *halves), _B64)

    @intrinsic
    def _b32_sub_tile_ir(typingctx, acc, o, q, qr0, c, y, yd, ys, rows, sel, d, tab, off, level):
        """:func:`b32_sub_tile_def` for the 16 columns of a sub-tile (``c`` a multiple of 16, its nibble rows from row
        ``qr0`` of ``q`` int8 (K/2, 64)) and rows free of the sign trick (gemm rows, or gemv rows without a -128):
        ``acc`` float32 (R, ≥ o + 16), ``ys`` int64 (T, K/32) the blocks' activation sums, ``tab`` uint8 (64,)
        :data:`U_TAB`'s row of the type, ``off`` its :data:`OFF`; all C-contiguous. Per row, block by block: 8
        ``vpdpbusd`` of the ``vpshufb``-decoded codes with the activations' 4-byte groups, ``− off·Σy``, the FMA."""
        arrays = (acc, q, y, yd, ys, rows, sel, d, tab)
        lv = _lit(level)
        if lv not in (1, 2) or not (all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)
                                     and q.dtype == y.dtype == types.int8 and acc.dtype == types.float32
                                     and acc.ndim == 2 and tab.dtype == types.uint8):
            return None
        i64 = types.int64
        sig = types.void(acc, i64, q, i64, i64, y, yd, ys, rows, sel, d, tab, i64, level)

        def codegen(context, b, signature, args):
            a = _Args(context, b, signature, args, (0, 2, 5, 6, 7, 8, 9, 10, 11))
            item, at, fma, k, arr = a.item, a.at, a.fma, _k, a.arr
            o, qr0, c, off = args[1], args[3], args[4], b.trunc(args[12], _i32)
            zero, low = ir.Constant(_V16, [0] * 16), ir.Constant(_B64, [15] * 64)
            table = b.load(at(11, [k(0)], _B64), align=1)
            n_blk = cgutils.unpack_tuple(b, arr[10].shape, 2)[0]
            n_sel = cgutils.unpack_tuple(b, arr[9].shape, 1)[0]
            with cgutils.for_range(b, n_sel) as m_loop:
                i = b.load(item(9, [m_loop.index]))
                r = b.load(item(8, [i]))
                pacc = at(0, [i, o], _F16)
                with cgutils.for_range(b, n_blk) as blk_loop:
                    blk = blk_loop.index
                    y0 = at(5, [r, b.mul(blk, k(32))], _i8)
                    dot = zero
                    for v in range(4):  # values 4v … 4v + 3 (low nibbles) and 16 + 4v … (high) of 16 columns
                        cb = b.load(at(2, [b.add(qr0, b.add(b.mul(blk, k(4)), k(v))), k(0)], _B64), align=1)
                        for h, codes in enumerate((b.and_(cb, low), b.lshr(cb, ir.Constant(_B64, [4] * 64)))):
                            u = _pshufb(b, lv, table, codes)  # u = LUT value + off
                            y4 = b.load(b.bitcast(b.gep(y0, [k(16 * h + 4 * v)]), _i32.as_pointer()), align=1)
                            dot = _dpbusd(b, lv, dot, b.bitcast(u, _V16), _splat(b, y4))
                    ysum = b.trunc(b.load(item(7, [r, blk])), _i32)
                    dot = b.sub(dot, _splat(b, b.mul(off, ysum)))  # Σu·y − off·Σy: the exact dot
                    dy = b.fmul(b.load(at(10, [blk, c], _F16), align=4), _splat(b, b.load(item(6, [r, blk])), _F16))
                    b.store(b.call(fma, [b.sitofp(dot, _F16), dy, b.load(pacc, align=4)]), pacc, align=4)
            return context.get_dummy_value()

        return sig, codegen

    @jit()
    def b32_sub_tile16(acc, o, q, c, y, yd, ys, rows, sel, d, t, level):
        """:func:`_b32_sub_tile_ir` for columns ``c … c + 15`` of type ``t`` (rows free of the sign trick) at
        instruction level ``level``, a literal (2 or 1; 0, a host without either: the definition), so that only
        the host's instructions are compiled."""
        literally(level)
        if level == 0:
            _sub_tile16_def(acc, o, q, c, y, yd, rows, sel, d, t)
        else:
            _b32_sub_tile_ir(acc, o, q, (c // 16) * (q.shape[0] // 4), c, y, yd, ys, rows, sel, d, U_TAB[t], OFF[t],
                             level)

else:

    def b32_sub_tile16(acc, o, q, c, y, yd, ys, rows, sel, d, t, level):
        _sub_tile16_def(acc, o, q, c, y, yd, rows, sel, d, t)


@jit()
def _sign_trick(r, m128, gemm):
    """Whether activation row ``r`` meets the gemv's sign trick in some block (a gemv row holding a -128)."""
    if gemm[r]:
        return False
    for b in range(m128.shape[1]):
        if m128[r, b]:
            return True
    return False


@jit()
def tile_b32(t, q, d, c, nc, y, yd, ys, m128, gemm, rows, orow, out, oc):
    """Columns ``c … c + nc - 1`` of one tile of type ``t`` (:data:`TYPES`; ``q`` (K/2, 64) its nibble rows, ``d``
    (K/32, TILE)) against the Q8_0 activation rows ``rows`` (``y`` (T, K) int8, ``yd`` (T, K/32), ``ys`` (T, K/32)
    their block sums, ``m128`` (T, K/32) the blocks holding a -128, ``gemm`` (T,) the gemm's rows) into
    ``out[orow[i], oc + j]``: whole sub-tiles as vector IR (:func:`b32_sub_tile16`) for the rows free of the sign
    trick, the others and a partial sub-tile by the definition."""
    R = rows.shape[0]
    acc = np.zeros((R, 64), F32)  # TILE = 64 columns at most
    free = np.empty(R, np.bool_)
    for i in range(R):
        free[i] = not _sign_trick(rows[i], m128, gemm)
    order, n_ir = first_rows(free)  # the rows' indices: those the IR takes first, then the sign trick's
    n_trick = R - n_ir
    level = VECTOR[t]
    for w0 in range(c - c % 16, c + nc, 16):  # sub-tiles of 16 columns, each streamed once a row
        cs = max(c, w0)
        w = min(c + nc, w0 + 16) - cs
        if w == 16 and level and n_ir:  # level: VECTOR[t], which is LEVEL where not 0
            b32_sub_tile16(acc, cs - c, q, cs, y, yd, ys, rows, order[:n_ir], d, t, LEVEL)
            if n_trick:
                b32_sub_tile_def(acc, cs - c, q, cs, w, y, yd, rows, order[n_ir:], d, m128, gemm, t)
        else:  # the last sub-tile of a matrix whose rows are not a multiple of 16, or no vector step here
            b32_sub_tile_def(acc, cs - c, q, cs, w, y, yd, rows, order, d, m128, gemm, t)
    for i in range(R):
        for j in range(nc):
            out[orow[i], oc + j] = acc[i, j]


__all__ = ["LUT", "OFF", "TYPES", "U_TAB", "VECTOR", "b32_sub_tile16", "b32_sub_tile_def", "fast",
           "tile_b32"]
