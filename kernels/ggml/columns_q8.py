"""Q8_0 in a plain buffer on x86 (``arch/x86/quants.c: ggml_vec_dot_q8_0_q8_0``, its AVX2 / AVX-512 branch; the
same formula as llamafile's ``tinyBLAS_Q0_AVX``) from the column layout's quads: 16 output columns per vector step.

Per output element the numerics are the stored rows' (:func:`kernels.ggml.mulmat_q8._q8_0_dot`): 8 float lanes,
block by block in K order ``acc_l = fma(float32(d_w · d_x), float(dot_l), acc_l)`` (``_mm256_fmadd_ps(d, q,
acc)``), ``dot_l`` the exact integer dot of the block's values ``4l … 4l + 3`` through the sign trick
(``mul_sum_i8_pairs_float``: ``|w|`` unsigned times ``x`` negated where ``w < 0``, in int8, so an activation byte
of -128 against a negative weight counts ``+128·w``: :func:`kernels.ggml.mulmat_q8._sign_dot`), then
``hsum_float_8``: ``((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))``.

The layout (:func:`lay_q8_0`) is the K-quants' byte quads (:mod:`kernels.ggml.columns_ir`): value ``k`` of column
``c`` of a tile at ``[(c // 16)·K/4 + k // 4, 4·(c % 16) + k % 4]``, so one 64-byte load holds lane ``l`` of a
block for 16 columns, and one ``vpdpbusd`` (AVX512-VNNI: ``|w|`` against the activation's 4 bytes, their signs
flipped per column by a byte mask) or ggml's own AVX2 pair (``vpsignb``, ``vpmaddubsw``, ``vpmaddwd`` with ones)
forms the 16 columns' lane dots. The 8 lane accumulators of a sub-tile stay in registers over all its blocks. On
the stored rows a block's 34 bytes took ~11 vector instructions for one output; here ~4 per output and block.
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml.columns_ir import LEVEL, TILE
from kernels.ggml.mulmat_q8 import _sign_dot
from kernels.ggml.simd import fma32, hsum_fold
from kernels.ggml.vecmath import F16_TO_F32

F32 = np.float32


def lay_q8_0(w: np.ndarray, nt: int) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 rows ``w`` (E, N, K/32·34) uint8 -> (q (E, nt, K, 64) int8, d (E, nt, K/32, TILE) float32): per tile of
    :data:`TILE` columns, its 4 sub-tiles of 16 columns one after the other, each K/4 quad rows of 64 bytes (value
    ``k`` of the sub-tile's column ``j`` at ``[k // 4, 4j + k % 4]``); ``d`` the blocks' fp16 scales as float32
    (``GGML_CPU_FP16_TO_FP32``), column ``c`` at ``[c // TILE, b, c % TILE]``. Columns past N are zero. In numpy,
    a quad an int32 (~1 GB/s; half that with the bytes moved one by one): nothing to compile on a first run."""
    E, N, rb = w.shape
    nb = rb // 34
    blocks = w.reshape(E, N, nb, 34)
    quads = np.zeros((E, nt * TILE, 8 * nb), np.int32)  # (E, N padded, K/4): 4 values of a column in one int32
    quads[:, :N] = np.ascontiguousarray(blocks[:, :, :, 2:]).view(np.int32).reshape(E, N, 8 * nb)
    q = quads.reshape(E, nt, 4, 16, 8 * nb).transpose(0, 1, 2, 4, 3)  # [expert, tile, sub-tile, quad row, column]
    d = np.zeros((E, nt * TILE, nb), F32)
    d[:, :N] = F16_TO_F32[np.ascontiguousarray(blocks[:, :, :, :2]).view(np.uint16).reshape(E, N, nb)]
    return (np.ascontiguousarray(q).view(np.int8).reshape(E, nt, 32 * nb, 64),
            np.ascontiguousarray(d.reshape(E, nt, TILE, nb).transpose(0, 1, 3, 2)))


@jit()
def q8_0_tile_def(q, d, c, nc, y, yd, rows, orow, out, oc):
    """The definition: columns ``c … c + nc - 1`` of one tile (``q`` (K, 64) quads, ``d`` (K/32, TILE)) against
    the Q8_0 activation rows ``rows`` (``y`` (T, K) int8, ``yd`` (T, K/32) float32) into ``out[orow[i], oc + j]``
    (module docstring), one element at a time."""
    K4 = q.shape[0] // 4  # a sub-tile's quad rows
    acc = np.empty(8, F32)
    for i in range(rows.shape[0]):
        r = rows[i]
        for j in range(nc):
            cj = c + j
            r0, col = K4 * (cj // 16), 4 * (cj % 16)
            acc[:] = 0
            for b in range(yd.shape[1]):
                dj = F32(d[b, cj] * yd[r, b])  # GGML_CPU_FP16_TO_FP32(x.d) * GGML_CPU_FP16_TO_FP32(y.d)
                for lane in range(8):
                    s = 0
                    for e in range(4):
                        k = 32 * b + 4 * lane + e
                        s += _sign_dot(q[r0 + k // 4, col + e], y[r, k])
                    acc[lane] = fma32(dj, F32(s), acc[lane])  # acc = _mm256_fmadd_ps(d, q, acc)
            out[orow[i], oc + j] = hsum_fold(acc, 0, 8)  # hsum_float_8(acc)


if JIT_ENABLED:
    from llvmlite import ir
    from numba import literally, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from kernels.ggml.columns_ir import _Args, _halves, _join, _k, _lit, _madd, _splat, _x86

    _i8, _i32 = ir.IntType(8), ir.IntType(32)
    _V16, _B64, _F16 = ir.VectorType(_i32, 16), ir.VectorType(_i8, 64), ir.VectorType(ir.FloatType(), 16)
    _B32, _W16 = ir.VectorType(_i8, 32), ir.VectorType(ir.IntType(16), 16)

    def _lane_dots(b, lv, w, x4):
        """<16 x i32>: the sign trick's dots (``mul_sum_i8_pairs_float``) of 16 columns' 4 weight bytes ``w`` (<64 x
        i8>) and the activation's 4 bytes ``x4`` (an i32): ``vpdpbusd`` of ``|w|`` and ``x`` negated in int8 where ``w
        < 0`` (``lv`` 2: ``_mm256_sign_epi8`` has no 512-bit form), or per 256-bit half ggml's ``vpsignb`` /
        ``vpmaddubsw`` / ``vpmaddwd`` with ones (1; a pair sums at most 2·128·128 in magnitude: no saturation). An
        activation byte of -128 against a negative weight wraps as in ggml."""
        xb, zero = b.bitcast(_splat(b, x4), _B64), ir.Constant(_B64, [0] * 64)
        absw = b.call(cgutils.get_or_insert_function(b.module, ir.FunctionType(_B64, [_B64, ir.IntType(1)]),
                                                     "llvm.abs.v64i8"), [w, ir.Constant(ir.IntType(1), 0)])
        if lv == 2:  # where w = 0, |w| is 0: x's sign does not matter
            sx = b.select(b.icmp_signed("<", w, zero), b.sub(zero, xb), xb)
            return _x86(b, "llvm.x86.avx512.vpdpbusd.512", _V16, ir.Constant(_V16, [0] * 16), b.bitcast(absw, _V16),
                        b.bitcast(sx, _V16))
        ones, halves = ir.Constant(_W16, [1] * 16), []
        for a, s, xh in zip(_halves(b, absw, _B32), _halves(b, w, _B32), _halves(b, xb, _B32)):
            sx = _x86(b, "llvm.x86.avx2.psign.b", _B32, xh, s)  # _mm256_sign_epi8(y, x)
            halves.append(_madd(b, _x86(b, "llvm.x86.avx2.pmadd.ub.sw", _W16, a, sx), ones))
        return _join(b, *halves)

    @intrinsic
    def _q8_0_sub_tiles_ir(typingctx, out, ro, o, q, qr0, c, y, r, yd, d, ns, level):
        """:func:`q8_0_tile_def` for activation row ``r`` and the ``ns`` whole sub-tiles from column ``c`` (a multiple
        of 16; its quads from row ``qr0`` of the tile ``q`` (K, 64) int8, ``d`` (K/32, TILE) float32) into ``out[ro,
        o …]`` (float32 (R, ≥ o + 16·ns)); ``y`` int8 (T, K), ``yd`` float32 (T, K/32); ``level`` a literal (1, 2).
        Per sub-tile: the 8 lane accumulators in registers over every block, then ``hsum_float_8`` of each column.
        (Two rows a call, sharing each weight load, measured no faster: a lane's float step, not the load, is the
        work.)"""
        lv = _lit(level)
        arrays = (out, q, y, yd, d)
        if lv not in (1, 2) or not (all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)
                                    and q.dtype == y.dtype == types.int8
                                    and out.dtype == yd.dtype == d.dtype == types.float32):
            return None
        i64 = types.int64
        sig = types.void(out, i64, i64, q, i64, i64, y, i64, yd, d, i64, level)

        def codegen(context, b, signature, args):
            a = _Args(context, b, signature, args, (0, 3, 6, 8, 9))
            item, at, fma, k = a.item, a.at, a.fma, _k
            ro, o, qr0, c, r, ns = args[1], args[2], args[4], args[5], args[7], args[10]
            nb = cgutils.unpack_tuple(b, a.arr[8].shape, 2)[1]  # K/32
            k4 = b.mul(nb, k(8))  # a sub-tile's quad rows: K/4
            accs = [cgutils.alloca_once(b, _F16) for _ in range(8)]  # promoted to registers by LLVM
            with cgutils.for_range(b, ns) as st:
                cs = b.add(c, b.mul(st.index, k(16)))
                q0 = b.add(qr0, b.mul(st.index, k4))
                for p in accs:
                    b.store(ir.Constant(_F16, [0.0] * 16), p)
                with cgutils.for_range(b, nb) as blk_loop:
                    blk = blk_loop.index
                    ydv = _splat(b, b.load(item(8, [r, blk])), _F16)
                    dj = b.fmul(b.load(at(9, [blk, cs], _F16), align=4), ydv)  # d_w · d_x, per column
                    y0 = at(6, [r, b.mul(blk, k(32))], _i8)
                    for lane in range(8):
                        w = b.load(at(3, [b.add(q0, b.add(b.mul(blk, k(8)), k(lane))), k(0)], _B64), align=1)
                        x4 = b.load(b.bitcast(b.gep(y0, [k(4 * lane)]), _i32.as_pointer()), align=1)
                        dot = _lane_dots(b, lv, w, x4)
                        p = accs[lane]
                        b.store(b.call(fma, [dj, b.sitofp(dot, _F16), b.load(p)]), p)  # _mm256_fmadd_ps(d, q, acc)
                acc = [b.load(p) for p in accs]
                s = [b.fadd(acc[j + 4], acc[j]) for j in range(4)]  # hsum_float_8: hi + lo, movehl, movehdup
                res = b.fadd(b.fadd(s[0], s[2]), b.fadd(s[1], s[3]))
                b.store(res, at(0, [ro, b.add(o, b.mul(st.index, k(16)))], _F16), align=4)
            return context.get_dummy_value()

        return sig, codegen

    @jit()
    def q8_0_sub_tiles16(out, ro, o, q, c, y, r, yd, d, ns, level):
        """:func:`_q8_0_sub_tiles_ir` for activation row ``r`` (into ``out[ro, o …]``) and the ``ns`` whole sub-tiles
        from column ``c`` (``level`` :data:`kernels.ggml.columns_ir.LEVEL`, 1 or 2)."""
        literally(level)
        _q8_0_sub_tiles_ir(out, ro, o, q, (c // 16) * (q.shape[0] // 4), c, y, r, yd, d, ns, level)

else:

    def q8_0_sub_tiles16(out, ro, o, q, c, y, r, yd, d, ns, level):
        q8_0_tile_def(q, d, c, 16 * ns, y, yd, np.array([r]), np.array([ro]), out, o)


@jit()
def tile_q8_0(q, d, c, nc, y, yd, rows, orow, out, oc):
    """Columns ``c … c + nc - 1`` of one tile (:func:`q8_0_tile_def`'s arguments): the whole sub-tiles of 16 columns
    in one vector call per activation row (:func:`q8_0_sub_tiles16`, where :data:`LEVEL` has the instructions), the
    rest by the definition."""
    w0 = c + (-c) % 16  # the first whole sub-tile's column
    ns = (c + nc - w0) // 16 if LEVEL >= 1 and c + nc >= w0 else 0
    if ns == 0:
        q8_0_tile_def(q, d, c, nc, y, yd, rows, orow, out, oc)
        return
    for i in range(rows.shape[0]):
        q8_0_sub_tiles16(out, orow[i], oc + w0 - c, q, w0, y, rows[i], yd, d, ns, LEVEL)
    if w0 > c:  # a partial sub-tile before them
        q8_0_tile_def(q, d, c, w0 - c, y, yd, rows, orow, out, oc)
    if w0 + 16 * ns < c + nc:  # and after
        q8_0_tile_def(q, d, w0 + 16 * ns, c + nc - w0 - 16 * ns, y, yd, rows, orow, out, oc + w0 + 16 * ns - c)


__all__ = ["lay_q8_0", "q8_0_sub_tiles16", "q8_0_tile_def", "tile_q8_0"]
