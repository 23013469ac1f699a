"""Q4_K repacked (``gemv/gemm_q4_K_8x8_q8_K``, :mod:`kernels.ggml.repack_k`) in the column layout, a whole sub-tile
of 16 output columns against every activation row in one compiled step.

Per output element the numerics are :func:`kernels.ggml.columns_ir.q4k_fma_def`'s, super-block by super-block in K
order: the exact integers ``ΣI = Σ_s sc_s·Σ q·y`` and ``ΣM = Σ_s mn_s·Σ y`` over a super-block (the gemv's rows) or
over each 64 values (the gemm's rows, ``ggml_quantize_mat_q8_K_4x8``'s groups of 4), then ``acc = fma(float(ΣI),
d·y.d, acc)`` and ``accm = fma(float(ΣM), dmin·y.d, accm)``, and ``out = acc - accm``.

What this module changes is only where the work is shared. A gemm row's 64 values of a sub-tile are 16 code vectors
(8 loads of 64 bytes, each holding two quad rows as nibbles): they are loaded and unpacked once for all the gemm rows
(a verify batch's 4, a prompt's hundreds), then each row forms its dots from them (``vpdpbusd`` on AVX512-VNNI,
:func:`kernels.ggml.columns_ir._dpbusd`; on AVX2 a group's ``vpmaddubsw`` pair sums added as int16, then one
``vpmaddwd`` with its scale — ggml's own AVX2 steps, half the multiplies of a ``vpmaddwd`` with ones per lane).
The gemv's rows (a decode's one token, the tail of a batch, every routed row of ``mul_mat_id``) loop over their
super-blocks inside the same step. Either way one call per sub-tile, not one per super-block and row: at decode
widths the calls had cost more than the dots. The gemm prefetches its codes
:data:`AHEAD` bytes ahead (its rows take long enough per 64 values for the hardware prefetcher to fall behind).

Measured (real2's 8192 × 2048 ``attn_qkv``, 2 threads, EPYC, 2026-12-06, the weights out of the cache): one row
0.6 → 0.45 ms a product, four rows 1.7 → 0.65–0.9 ms. AVX2's int16 sums (Zen 3, 2026-12-06 21:15 UTC, 2 threads,
alternating with the code before, best of 200): four rows 0.92–1.13 → 0.69–0.89 ms (``attn_qkv``), 0.49–0.50 →
0.39–0.46 (the 2048 × 4096 ``ssm_out``); one row unchanged (0.23–0.25 ms, memory-bound).
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml.columns_ir import AHEAD_BLOCKS, AHEAD_LOCALITY, LEVEL, TILE, first_rows, q4k_fma_def, tile_span

F32 = np.float32
#: Software prefetch distance of the gemm's codes, a chunk's 512 bytes at a time (bytes: a sub-tile's super-block of
#: nibbles is 2048; :data:`kernels.ggml.columns_ir.AHEAD_BLOCKS`, into its ``AHEAD_LOCALITY``): real2's 8192 × 2048
#: Q4_K at 4 rows, 2 threads, EPYC, none 0.8 -> 2048 bytes into L1 0.65 ms a product. (The gemv's rows stream fast
#: enough without: prefetching them cost the experts ~10 %.)
AHEAD = 2048 * AHEAD_BLOCKS


@jit()
def q4k_sub_tile_def(acc, o, q, c, nc, y, rows, sel, sc, ys, d, yd, mn, dmin, step):
    """The definition: columns ``c … c + nc - 1`` of one sub-tile, every super-block, for the activation rows
    ``rows[sel[m]]`` (``y`` int8 (T, K), ``ys`` int64 (T, K/32) the Q8_K sums per 32 values, ``yd`` float32 (T,
    K/256)), each through ``step`` groups per FMA (2: the gemm, 8: the gemv) into ``acc[sel[m], 0 / 1, o:o + nc]``
    (:func:`kernels.ggml.columns_ir.q4k_fma_def` per super-block and row)."""
    v = np.empty((8, 16), np.int32)
    for b in range(d.shape[0]):
        for m in range(sel.shape[0]):
            i = sel[m]
            r = rows[i]
            q4k_fma_def(acc[i], o, v, q, b, step, c, nc, y[r], sc, ys[r], d, yd[r, b], mn, dmin)


if JIT_ENABLED:
    from llvmlite import ir
    from numba import literally, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from kernels.ggml.columns_ir import (_B32, _W16, _Args, _dpbusd, _halves, _join, _k, _lit, _madd, _splat,
                                         _sub_tile_row, _sub_tiles, _x86)
    from kernels.lanes.ir import _prefetch

    _i8, _i32, _i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    _V16, _B64, _F16 = ir.VectorType(_i32, 16), ir.VectorType(_i8, 64), ir.VectorType(ir.FloatType(), 16)

    @intrinsic
    def _q4k_sub_tile_ir(typingctx, acc, o, q, qr0, c, y, rows, sel, sc, ys, d, yd, mn, dmin, step, level, ns):
        """:func:`q4k_sub_tile_def` for the 16 columns of a sub-tile (``c`` a multiple of 16, its nibble quads from
        row ``qr0`` of ``q`` int8 (K/2, 16·4)), ``acc`` float32 (R, 2, ≥ o + 16), ``rows`` / ``sel`` int64, ``sc`` /
        ``mn`` uint8 (K/32, ≥ c + 16), ``d`` / ``dmin`` float32 (K/256, ≥ c + 16), all C-contiguous; ``step`` (2,
        8) and ``level`` literals; ``ns`` sub-tiles from ``c`` on, each the next 16 columns, the next ``K/8`` quad
        rows and the next 16 accumulators from ``o`` (one call for a tile's whole sub-tiles: a call's set-up, ~100 ns,
        was the half of a ``K = 512`` expert's gemv). Step 2 (the gemm): per super-block and 64 values, the 16 code
        vectors unpacked once, then every row's two FMAs from them. Step 8 (the gemv): row by row, super-block by
        super-block."""
        flags = [_lit(a) for a in (step, level)]
        arrays = (acc, q, y, rows, sel, sc, ys, d, yd, mn, dmin)
        if None in flags or flags[0] not in (2, 8) or not (
                all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)
                and q.dtype == y.dtype == types.int8 and acc.dtype == types.float32 and acc.ndim == 3):
            return None
        n_g, lv = flags
        i64 = types.int64
        sig = types.void(acc, i64, q, i64, i64, y, rows, sel, sc, ys, d, yd, mn, dmin, step, level, i64)

        def codegen(context, b, signature, args):
            a = _Args(context, b, signature, args, (0, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13))
            item, at, fma, k, arr = a.item, a.at, a.fma, _k, a.arr
            zero = ir.Constant(_V16, [0] * 16)

            def sub_tile(o, qr0, c):  # the 16 columns from c, their quads from row qr0, their accumulators from o
                def codes(blk, g, lane):  # quad row 8g + lane of the super-block: a nibble of row (8g + lane) // 2
                    r = 8 * g + lane
                    row = b.add(qr0, b.add(b.mul(blk, k(32)), k(r // 2)))
                    cb = b.load(at(2, [row, k(0)], _B64), align=1)
                    cb = b.lshr(cb, ir.Constant(_B64, [4] * 64)) if r % 2 else cb  # low nibbles even rows, high odd
                    return b.bitcast(b.and_(cb, ir.Constant(_B64, [15] * 64)), _V16)

                def sub_block(i, row):  # the 16 columns' scale / min bytes of sub-block row ``row``
                    return b.zext(b.load(at(i, [row, c], ir.VectorType(_i8, 16)), align=1), _V16)

                def groups(blk, r, g1, cv, scl, mnv):  # ΣI, ΣM of groups g1 … g1 + len(cv) - 1 for activation row r
                    y0 = at(5, [r, b.mul(blk, k(256))], _i8)
                    if lv == 1:
                        return groups_avx2(blk, r, g1, cv, scl, mnv, y0)
                    ii, mi = zero, zero
                    for gi, lanes in enumerate(cv):
                        dot = zero
                        for lane, codes_l in enumerate(lanes):  # scale · (the 4-value dots of the group's 8 lanes)
                            y4 = b.load(b.bitcast(b.gep(y0, [k(4 * (8 * (g1 + gi) + lane))]), _i32.as_pointer()), align=1)
                            dot = _dpbusd(b, lv, dot, codes_l, _splat(b, y4))
                        ii = b.add(ii, b.mul(dot, scl[gi]))
                        ysum = b.trunc(b.load(item(9, [r, b.add(b.mul(blk, k(8)), k(g1 + gi))])), _i32)
                        mi = b.add(mi, b.mul(mnv[gi], _splat(b, ysum)))  # mn·Σy
                    return ii, mi

                def groups_avx2(blk, r, g1, cv, scl, mnv, y0):  # groups() in AVX2's multiplies (ggml's own AVX2 order)
                    # A group's 8 lanes' ``vpmaddubsw`` pair sums added as int16 (each pair |q·y + q·y| <= 2·15·128, eight
                    # of them < 2^15), then one ``vpmaddwd`` with the (scale, scale) pairs: scale · the group's dots. The
                    # mins of both groups in one ``vpmaddwd`` of (mn_g1, mn_g2) and (Σy_g1, Σy_g2) (|Σy| <= 32·128 <
                    # 2^15). The same integers as the generic steps, in half the multiplies.
                    assert len(cv) == 2, "the mins' pairs take the two groups of a chunk"
                    ii = zero
                    for gi, lanes in enumerate(cv):
                        s16 = [None, None]
                        for lane, codes_l in enumerate(lanes):
                            y4 = b.load(b.bitcast(b.gep(y0, [k(4 * (8 * (g1 + gi) + lane))]), _i32.as_pointer()), align=1)
                            for h, (u, w) in enumerate(zip(_halves(b, codes_l, _B32), _halves(b, _splat(b, y4), _B32))):
                                p = _x86(b, "llvm.x86.avx2.pmadd.ub.sw", _W16, u, w)
                                s16[h] = p if s16[h] is None else b.add(s16[h], p)
                        pair = b.or_(scl[gi], b.shl(scl[gi], ir.Constant(_V16, [16] * 16)))  # (scale, scale) int16 pairs
                        ii = b.add(ii, _join(b, *(_madd(b, s, w) for s, w in zip(s16, _halves(b, pair, _W16)))))
                    ysum = [b.trunc(b.load(item(9, [r, b.add(b.mul(blk, k(8)), k(g1 + gi))])), _i32) for gi in range(2)]
                    ylo = b.and_(ysum[0], ir.Constant(_i32, 0xFFFF))  # Σy_g1's int16 (two's complement), Σy_g2 above it
                    ypair = _splat(b, b.or_(ylo, b.shl(ysum[1], ir.Constant(_i32, 16))))
                    mpair = b.or_(mnv[0], b.shl(mnv[1], ir.Constant(_V16, [16] * 16)))  # (mn_g1, mn_g2) int16 pairs
                    mi = _join(b, *(_madd(b, m, y) for m, y in zip(_halves(b, mpair, _W16), _halves(b, ypair, _W16))))
                    return ii, mi

                def fmas(blk, i, r, ii, mi):  # acc = fma(float(ΣI), d·y.d, acc); accm = fma(float(ΣM), dmin·y.d, accm)
                    ydv = _splat(b, b.load(item(11, [r, blk])), _F16)
                    dy = b.fmul(b.load(at(10, [blk, c], _F16), align=4), ydv)  # d · y.d
                    dmy = b.fmul(b.load(at(13, [blk, c], _F16), align=4), ydv)  # dmin · y.d
                    for h, (s, f) in enumerate(((ii, dy), (mi, dmy))):
                        p = at(0, [i, k(h), o], _F16)
                        b.store(b.call(fma, [b.sitofp(s, _F16), f, b.load(p, align=4)]), p, align=4)

                n_blk = cgutils.unpack_tuple(b, arr[10].shape, 2)[0]
                n_sel = cgutils.unpack_tuple(b, arr[7].shape, 1)[0]

                def chunk(blk, g1, ng, ahead=False):  # groups g1 … g1 + ng - 1: their code vectors, scales and mins
                    base = b.mul(blk, k(8))
                    if ahead:  # the gemm's rows take long enough per chunk for the hardware prefetcher to fall behind
                        _prefetch(b, item(2, [b.add(qr0, b.add(b.mul(blk, k(32)), k(4 * g1))), k(0)]), AHEAD, 64 * 4 * ng,
                                  AHEAD_LOCALITY)
                    cv = [[codes(blk, g, lane) for lane in range(8)] for g in range(g1, g1 + ng)]
                    rws = [b.add(base, k(g)) for g in range(g1, g1 + ng)]
                    return cv, [sub_block(8, rw) for rw in rws], [sub_block(12, rw) for rw in rws]

                if n_g == 2:  # the gemm: per 64 values, the codes once for every row
                    with cgutils.for_range(b, n_blk) as blk_loop:
                        blk = blk_loop.index
                        for g1 in range(0, 8, 2):
                            cv, scl, mnv = chunk(blk, g1, 2, True)
                            with cgutils.for_range(b, n_sel) as m_loop:
                                i = b.load(item(7, [m_loop.index]))
                                r = b.load(item(6, [i]))
                                fmas(blk, i, r, *groups(blk, r, g1, cv, scl, mnv))
                else:  # the gemv: row by row, an FMA per super-block
                    with cgutils.for_range(b, n_sel) as m_loop:
                        i = b.load(item(7, [m_loop.index]))
                        r = b.load(item(6, [i]))
                        with cgutils.for_range(b, n_blk) as blk_loop:
                            blk = blk_loop.index
                            ii, mi = zero, zero
                            for g1 in range(0, 8, 2):
                                s, t = groups(blk, r, g1, *chunk(blk, g1, 2))
                                ii, mi = b.add(ii, s), b.add(mi, t)
                            fmas(blk, i, r, ii, mi)

            sub_rows = b.udiv(cgutils.unpack_tuple(b, arr[2].shape, 2)[0], k(4))  # a sub-tile's K/8 quad rows
            _sub_tiles(b, args[16], sub_rows, args[1], args[3], args[4], sub_tile)  # ns sub-tiles from (o, qr0, c)
            return context.get_dummy_value()

        return sig, codegen

    @jit()
    def q4k_sub_tiles16(acc, o, q, c, ns, y, rows, sel, sc, ys, d, yd, mn, dmin, step, level):
        """:func:`q4k_sub_tile_def` for the ``ns`` whole sub-tiles of columns ``c … c + 16·ns - 1`` (``c`` a multiple
        of 16) into ``acc[:, :, o:o + 16·ns]``, in one call of the vector IR (``level``
        :data:`kernels.ggml.columns_ir.LEVEL`)."""
        literally(level)
        qr0 = _sub_tile_row(q, c)
        if step == 2:  # the literals the IR is built for, one branch each
            _q4k_sub_tile_ir(acc, o, q, qr0, c, y, rows, sel, sc, ys, d, yd, mn, dmin, 2, level, ns)
        else:
            _q4k_sub_tile_ir(acc, o, q, qr0, c, y, rows, sel, sc, ys, d, yd, mn, dmin, 8, level, ns)

else:

    def q4k_sub_tiles16(acc, o, q, c, ns, y, rows, sel, sc, ys, d, yd, mn, dmin, step, level):
        for s in range(ns):
            q4k_sub_tile_def(acc, o + 16 * s, q, c + 16 * s, 16, y, rows, sel, sc, ys, d, yd, mn, dmin, step)


@jit()
def tiles_q4k(q, d, dmin, sc, mn, c0, c1, ta, tb, y, yd, ys, gemm, rows, orow, out):
    """Tiles ``ta … tb - 1`` of Q4_K repacked (``q`` (nt, K/2, 64) each tile's sub-tiles of nibble quads, ``d`` /
    ``dmin`` (nt, K/256, TILE), ``sc`` / ``mn`` (nt, K/32, TILE)), their columns of ``[c0, c1)``, against the Q8_K
    activation rows ``rows`` (``y`` (T, K) int8, ``yd`` (T, K/256), ``ys`` (T, K/32) the sums per 32 values, ``gemm``
    (T,) the rows taking the gemm's FMA per 64 values) into ``out[orow[i], c - c0]``: per tile, the whole sub-tiles
    as vector IR in one call per kind of row (:func:`q4k_sub_tiles16`), a partial one by the definition
    (:func:`q4k_sub_tile_def`), then ``out = acc - accm``. The rows' order and the accumulators are made once for the
    run (per tile, with the calls that reached it, they had cost a K = 512 expert's tile more than its dots)."""
    order, n_gemm = first_rows(gemm[rows])  # the rows' indices: the gemm's (an FMA per 64 values) first, then the gemv's
    acc = np.empty((rows.shape[0], 2, TILE), F32)  # per row: acc, acc of the mins
    for t in range(ta, tb):
        c, nc = tile_span(c0, c1, t)
        ct = c - TILE * t  # the tile's columns from ct on
        acc[:] = 0
        for h in range(2):
            sel = order[:n_gemm] if h == 0 else order[n_gemm:]
            step = 2 if h == 0 else 8
            if sel.shape[0] == 0:
                continue
            w0 = ct - ct % 16
            while w0 < ct + nc:  # sub-tiles of 16 columns, each streamed once by each kind of row
                cs = max(ct, w0)
                w = min(ct + nc, w0 + 16) - cs
                if w == 16:  # the whole sub-tiles from here on, in one call
                    ns = (ct + nc - w0) // 16
                    q4k_sub_tiles16(acc, cs - ct, q[t], cs, ns, y, rows, sel, sc[t], ys, d[t], yd, mn[t], dmin[t], step,
                                    LEVEL)
                    w0 += 16 * ns
                else:  # a partial sub-tile (the matrix's last, when its rows are not a multiple of 16; or a split's)
                    q4k_sub_tile_def(acc, cs - ct, q[t], cs, w, y, rows, sel, sc[t], ys, d[t], yd, mn[t], dmin[t], step)
                    w0 += 16
        for i in range(rows.shape[0]):
            for j in range(nc):
                out[orow[i], c - c0 + j] = acc[i, 0, j] - acc[i, 1, j]  # _mm*_sub_ps(acc_rows, acc_min_rows)


__all__ = ["q4k_sub_tiles16", "q4k_sub_tile_def", "tiles_q4k"]
