"""The column layout's K-quant kernels: Q4_K, Q5_K and Q6_K weights in a plain CPU buffer (not repacked — Q5_K and
Q6_K never are; Q4_K with llama.cpp's ``-nr``, or rows not a multiple of 8), through the formulas of
:mod:`kernels.ggml.mulmat_k`, output element by output element, with the weights laid out by
:func:`kernels.ggml.columns.layout`:

* ``T < 8`` rows (``vec_dot``, ``arch/x86/quants.c``'s ``__AVX2__`` branch in both builds): per super-block the
  integer dot in ggml's 8 int32 lanes — lane ``l`` sums values ``32g + 4l … 32g + 4l + 3`` of the 8 32-value
  groups ``g``, each 4 times its sub-block scale (:func:`kernels.ggml.columns_ir.kq_def`) —; Q6_K's lane ``l``
  less ``32·(bsums[2l]·sc[2l] + bsums[2l+1]·sc[2l+1])``; ``acc[l] = fma(y.d·d, float(sumi[l]), acc[l])``; the
  mins (Q4_K: 4 float lanes, Q5_K one scalar), ``hsum_float_8(acc)`` and the mins added last. Q5_K's and Q6_K's
  byte codes lie lane by lane (:func:`kernels.ggml.columns_ir.quad_row`): per super-block and lane, its scales are
  loaded once for every activation row, its 8 code vectors (512 bytes in a row) by each row from the L1 cache
  (:func:`lanes_rows`). Q6_K's codes in 6 bits (:func:`pack6`: 384 bytes a lane) are decoded once a lane, in
  registers, for every row (:func:`sixbit_into`); the tiled kernel's rows and a part of a sub-tile take the
  tile's bytes (:func:`unpack6`).
* ``T >= 8`` rows (the tiled kernel): per super-block ``s1`` (the lanes' total: the same integer as
  ``Σ sc·(q - 32)·y`` for Q6_K) and ``s2 = Σ mn·Σy``, ``res = fma(-dmin, float(s2), d·float(s1))``,
  ``acc = fma(res, y.d, acc)``.

The layout holds the codes as ggml's integer dot takes them (Q4_K 0…15, Q5_K 0…31, Q6_K 0…63), 4 consecutive
values of a column side by side, each sub-tile of 16 columns in one piece (:mod:`kernels.ggml.columns_ir`, whose
vector IR forms the lanes, their float step or their total), the 6-bit scales and mins (Q6_K: its int8 scale
bytes, one per 16 values), ``d`` and ``dmin`` as float32. Integers are exact, so only which integers meet which
float operation matters; that is kept element by element.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml.columns_ir import AHEAD_BLOCKS, AHEAD_LOCALITY, LEVEL, kq, kq_def, kq_fma, lanes_fma_def
from kernels.ggml.mulmat_k import decode_row
from kernels.ggml.simd import fma32

F32 = np.float32
#: :mod:`kernels.ggml.columns` kind of the K-quant formulas here (``kind - 3`` is ``mulmat_k.KIND``'s type code)
KQ_KIND = {"Q4_K": 3, "Q5_K": 4, "Q6_K": 5}


@jit(parallel=True)
def lay_k(kind, w, q, d, dmin, sc, mn, tab, six):
    """Q4_K / Q5_K / Q6_K rows ``w`` (E, N, row bytes) of E matrices (``kind`` as ``mulmat_k.KIND``) -> their tiles of
    :data:`kernels.ggml.columns.TILE` outputs, through :func:`kernels.ggml.mulmat_k.decode_row`: ``q`` (E, nt, R, 64)
    uint8, each tile's 4 sub-tiles of 16 columns one after another, 4 consecutive codes of a column side by side
    (``[r, 4j + m]``) — Q4_K two quad rows to a row of bytes (quad row ``2r`` in the low nibbles: R = K/2), Q5_K and
    Q6_K a super-block's 64 quad rows lane by lane (row ``8l + g`` the quad row ``8g + l``: R = K,
    :func:`kernels.ggml.columns_ir.quad_row`) —; ``d`` / ``dmin`` (E, nt, K/256, 64) float32, ``sc`` / ``mn`` (E,
    nt, K/32 or K/16, 64) uint8 (Q6_K: its int8 scale's byte), column ``c`` at ``[…, c // 64, …, c % 64]``; the
    last tile's columns past N zero. ``six`` (Q6_K): ``q`` (E, nt, 3K/4, 64) holds the codes in 6 bits, the bytes
    :func:`pack6` makes of the tile's R = K rows, written as they are laid out (no tile of bytes first). The (matrix,
    tile) items split between threads (each byte is one item's copy)."""
    nt = q.shape[1]
    for i in prange(w.shape[0] * nt):
        e, t = i // nt, i % nt
        _lay_k_tile(kind, w[e], t, q[e, t], d[e, t], dmin[e, t], sc[e, t], mn[e, t], tab, six)


@jit()
def _quad_at(r):
    """The first code of the quad row that row ``r`` = 64·sb + 8l + g of a Q5_K / Q6_K sub-tile holds: quad row
    64·sb + 8g + l (:func:`kernels.ggml.columns_ir.quad_row`)."""
    sb, l, g = r // 64, (r // 8) % 8, r % 8
    return 4 * (64 * sb + 8 * g + l)


@jit()
def _lay_k_tile(kind, w, t, q, d, dmin, sc, mn, tab, six):
    """Tile ``t`` of :func:`lay_k` for one matrix ``w`` (N, row bytes): ``q`` (R, 64) (``six``: 3K/4), ``d`` …
    (…, 64). A sub-tile's 16 rows are decoded into a scratch, then written out in order."""
    N = w.shape[0]
    nb = d.shape[0]
    K = 256 * nb
    R4 = (K // 2 if kind == 0 else K) // 4  # quad rows of one sub-tile, in rows of bytes (Q4_K: two to a row)
    qr, scr, mnr = np.empty(K, np.int32), np.empty(sc.shape[0], np.int32), np.zeros(sc.shape[0], np.int32)
    dr, dminr = np.empty(nb, F32), np.zeros(nb, F32)
    codes = np.empty((16, K), np.uint8)  # one sub-tile's columns, each its K codes
    for s in range(4):
        for j in range(16):
            c, o = 64 * t + 16 * s + j, 16 * s + j
            if c >= N:  # the last tile's padding
                codes[j] = 0
                dr[:] = 0
                dminr[:] = 0
                scr[:] = 0
                mnr[:] = 0
            else:
                decode_row(kind, w[c], qr, scr, mnr, dr, dminr, tab)
                for k in range(K):
                    codes[j, k] = qr[k]
            for x in range(sc.shape[0]):
                sc[x, o] = np.uint8(scr[x] & 255)
            for x in range(mn.shape[0]):
                mn[x, o] = mnr[x]
            for b in range(nb):
                d[b, o] = dr[b]
            for b in range(dmin.shape[0]):
                dmin[b, o] = dminr[b]
        if kind == 0:  # Q4_K: quad rows 2r, 2r + 1 in one row of nibbles
            qs = q[R4 * s:R4 * (s + 1)]  # (R4, 64): the sub-tile's rows
            for r in range(R4):
                for j in range(16):
                    for m in range(4):
                        qs[r, 4 * j + m] = codes[j, 8 * r + m] | (codes[j, 8 * r + 4 + m] << np.uint8(4))
        elif six:  # rows 4g … 4g + 3 of the tile (quad rows as below) -> pack6's nibble rows 2g, 2g + 1, high row K/2 + g
            lo4, two, four, sixb = np.uint8(15), np.uint8(2), np.uint8(4), np.uint8(6)
            for r4 in range(R4 // 4):
                g4 = R4 // 4 * s + r4  # the tile's group of 4 quad rows
                k0, k1, k2, k3 = _quad_at(4 * r4), _quad_at(4 * r4 + 1), _quad_at(4 * r4 + 2), _quad_at(4 * r4 + 3)
                for j in range(16):
                    for m in range(4):
                        v0, v1, v2, v3 = codes[j, k0 + m], codes[j, k1 + m], codes[j, k2 + m], codes[j, k3 + m]
                        q[2 * g4, 4 * j + m] = (v0 & lo4) | ((v1 & lo4) << four)
                        q[2 * g4 + 1, 4 * j + m] = (v2 & lo4) | ((v3 & lo4) << four)
                        q[K // 2 + g4, 4 * j + m] = ((v0 >> four) | ((v1 >> four) << two) | ((v2 >> four) << four)
                                                     | ((v3 >> four) << sixb))
        else:  # row 64·sb + 8l + g: quad row 64·sb + 8g + l
            qs = q[R4 * s:R4 * (s + 1)]  # (R4, 64): the sub-tile's rows
            for r in range(R4):
                k0 = _quad_at(r)
                for j in range(16):
                    for m in range(4):
                        qs[r, 4 * j + m] = codes[j, k0 + m]


def pack6(q: np.ndarray) -> np.ndarray:
    """Q6_K's byte codes (…, K, 64) in quad rows (0 … 63 each) -> (…, 3K/4, 64) uint8: rows ``[0, K/2)`` the low 4
    bits of quad rows ``2r`` (low nibble) and ``2r + 1`` (high nibble), rows ``[K/2, 3K/4)`` the high 2 bits of quad
    rows ``4r … 4r + 3`` (bits ``2i, 2i + 1`` for row ``4r + i``). :func:`unpack6` is its inverse."""
    b = q.view(np.uint8)
    b = b.reshape(*b.shape[:-2], b.shape[-2] // 4, 4, 64)  # (…, K/4, 4, 64)
    lo = (b[..., 0::2, :] & 15) | ((b[..., 1::2, :] & 15) << 4)  # (…, K/4, 2, 64): rows 4r, 4r+1 | 4r+2, 4r+3
    hi = (b[..., 0, :] >> 4) | ((b[..., 1, :] >> 4) << 2) | ((b[..., 2, :] >> 4) << 4) | ((b[..., 3, :] >> 4) << 6)
    return np.ascontiguousarray(np.concatenate([lo.reshape(*b.shape[:-3], -1, 64), hi], axis=-2), np.uint8)


@jit()
def unpack6(p, q):
    """A tile of six-bit codes ``p`` (3K/4, 64) uint8 (:func:`pack6`) -> its byte codes into ``q`` (K, 64) int8: 4
    rows of 64 from 2 rows of low nibbles and 1 of high bits, byte by byte in flat arrays (LLVM vectorizes it: ~2.4 µs
    a 2048-value tile, *EPYC*)."""
    K = q.shape[0]
    pf, qf = p.reshape(-1), q.reshape(-1).view(np.uint8)  # (3K/4·64,), (K·64,)
    lo4, two = np.uint8(15), np.uint8(3)
    for r in range(K // 4):
        a0, b0, h0, o = 128 * r, 128 * r + 64, (K // 2 + r) * 64, 256 * r
        for j in range(64):
            a, b, h = pf[a0 + j], pf[b0 + j], pf[h0 + j]
            qf[o + j] = (a & lo4) | ((h & two) << np.uint8(4))
            qf[o + 64 + j] = (a >> np.uint8(4)) | (((h >> np.uint8(2)) & two) << np.uint8(4))
            qf[o + 128 + j] = (b & lo4) | (((h >> np.uint8(4)) & two) << np.uint8(4))
            qf[o + 192 + j] = (b >> np.uint8(4)) | ((h >> np.uint8(6)) << np.uint8(4))


@jit()
def _mins_sb(kk, b, c, nc, dmin, mn, yd, ys, accm, o):
    """vec_dot's mins of super-block ``b`` for columns ``c … c + nc - 1`` of one activation row (``yd`` its y.d of
    ``b``, ``ys`` its sums per 32 values) into ``accm[:, o:o + nc]``: Q4_K's 4 float lanes, Q5_K's one."""
    if kk == 0:  # acc_m = _mm_fmadd_ps(-y.d·dmin, cvtepi32_ps(prod), acc_m), prod[i] = sub-blocks 2i, 2i+1
        for m in range(4):
            s = 8 * b + 2 * m
            for j in range(nc):
                p = np.int32(mn[s, c + j]) * np.int32(ys[s]) + np.int32(mn[s + 1, c + j]) * np.int32(ys[s + 1])
                accm[m, o + j] = fma32(-yd * dmin[b, c + j], F32(p), accm[m, o + j])
    elif kk == 1:  # summs += -y.d·dmin · hsum(prod), contracted to vfmadd231ss
        for j in range(nc):
            p = np.int32(0)
            for s in range(8 * b, 8 * b + 8):
                p += np.int32(mn[s, c + j]) * np.int32(ys[s])
            accm[0, o + j] = fma32(-yd * dmin[b, c + j], F32(p), accm[0, o + j])


@jit()
def _tiled_sb(kk, v, b, c, nc, d, dmin, mn, yd, ys, acc, o):
    """One super-block ``b`` of the tiled kernel for one activation row (``v[0]`` the integer ``s1``; ``acc[o:o +
    nc]`` that row's accumulators)."""
    for j in range(nc):
        res = d[b, c + j] * F32(v[0, j])  # _mm*_mul_ps(cvtepi32_ps(s1), d0)
        if kk <= 1:
            s2 = np.int32(0)
            for s in range(8 * b, 8 * b + 8):
                s2 += np.int32(mn[s, c + j]) * np.int32(ys[s])
            res = fma32(-dmin[b, c + j], F32(s2), res)  # _mm*_fnmadd_ps(dmin, s2, res)
        acc[o + j] = fma32(res, yd[b], acc[o + j])  # buf += res * d1 (FMA)


@jit()
def lanes_rows_def(acc, o, q, c, nc, y, rows, sc, bs, d, yd, form):
    """vec_dot's lanes and float step (:func:`kernels.ggml.columns_ir.kq_def`, :func:`~kernels.ggml.columns_ir.
    lanes_fma_def`) of every super-block, columns ``c … c + nc - 1`` of one sub-tile, for each activation row
    ``rows[i]`` into ``acc[i, :, o:o + nc]`` — by the definitions."""
    v = np.empty((8, 16), np.int32)
    for b in range(d.shape[0]):
        for i in range(rows.shape[0]):
            r = rows[i]
            kq_def(v, 0, nc, q, b, 0, 8, c, y[r], sc, bs[r], form, 0)
            lanes_fma_def(acc[i], o, v, nc, d, b, c, yd[r, b])


if JIT_ENABLED:
    from llvmlite import ir
    from numba import literally, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from kernels.ggml.columns_ir import _Args, _dot_scaled, _k, _lit, _scaled, _splat, _sub_tile_row, _sub_tiles
    from kernels.lanes.ir import _prefetch

    _i8, _i32, _i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    _V16, _F16 = ir.VectorType(_i32, 16), ir.VectorType(ir.FloatType(), 16)

    @intrinsic
    def _lanes_rows_ir(typingctx, acc, o, q, qr0, c, y, rows, sc, bs, d, yd, form, level, ns):
        """:func:`lanes_rows_def` for the 16 columns of a sub-tile of byte codes (``form`` 0 Q5_K, 1 Q6_K; ``c`` a
        multiple of 16, its quads from row ``qr0`` of ``q`` int8 (K, 16·4)) or of Q6_K's six-bit codes (``form`` 3:
        ``q`` uint8 (3K/4, 64), :func:`pack6`; ``qr0`` as for the bytes), ``acc`` float32 (R, 8, ≥ o + 16),
        ``y`` int8 (T, K), ``rows`` int64 (R,), ``sc`` uint8, ``bs`` int64 (T, K/16 or K/32), ``d`` float32
        (K/256, ≥ c + 16), ``yd`` float32 (T, K/256), all C-contiguous; ``form``, ``level`` literals
        (:mod:`kernels.ggml.columns_ir`). Super-block by super-block, lane by lane: the lane's scales loaded once,
        then each row's lane formed from them and the lane's 8 code vectors (512 bytes in a row:
        :func:`kernels.ggml.columns_ir.quad_row`) and through its float step — the integers and float operations of
        :func:`kernels.ggml.columns_ir.kq16_fma`, row by row. The code vectors are loaded by each row, from the L1
        cache after the first: held for all rows (16 ymm on AVX2, beside the scales' 16) they were spilled to the
        stack and reloaded — real2's Q6_K head (32768 × 2048), numba's 2-thread pool, 1 / 4 rows ~4.2 / ~6.0 ->
        ~3.0 / ~4.7 ms (*Zen 3*, alternating). The six-bit codes are decoded once a lane (8 zmm on AVX-512, where
        :func:`kernels.ggml.columns.sixbit_fast` lays them out) and held for all rows. ``ns`` sub-tiles from ``c`` on,
        each the next 16 columns, quads and accumulators (as :func:`kernels.ggml.columns_q4k.q4k_sub_tiles16`)."""
        flags = [_lit(a) for a in (form, level)]
        arrays = (acc, q, y, rows, sc, bs, d, yd)
        if None in flags or flags[0] not in (0, 1, 3) or not (
                all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)
                and q.dtype == (types.uint8 if flags[0] == 3 else types.int8) and y.dtype == types.int8
                and acc.dtype == types.float32):
            return None
        p16, lv, six = flags[0] in (1, 3), flags[1], flags[0] == 3
        i64 = types.int64
        sig = types.void(acc, i64, q, i64, i64, y, rows, sc, bs, d, yd, form, level, i64)

        def codegen(context, b, signature, args):
            a = _Args(context, b, signature, args, (0, 2, 5, 6, 7, 8, 9, 10))
            item, at, fma, k, arr = a.item, a.at, a.fma, _k, a.arr
            zero = ir.Constant(_V16, [0] * 16)

            def sub_tile(o, qr0, c):  # the 16 columns from c, their quads from row qr0, their accumulators from o
                const = lambda n: ir.Constant(_V16, [n] * 16)  # noqa: E731

                def six_codes(lo0, hi0, lane):  # form 3: the lane's 8 code vectors, low nibbles | high 2 bits << 4
                    codes = []
                    for g in range(8):  # quad row 8·lane + g: its nibbles in row 4·lane + g // 2, its high bits 2·lane + g // 4
                        lo = b.load(b.gep(lo0, [k(4 * lane + g // 2)]), align=1)
                        hi = b.load(b.gep(hi0, [k(2 * lane + g // 4)]), align=1)
                        top = b.shl(b.and_(b.lshr(hi, const(2 * (g % 4))), const(0x03030303)), const(4))
                        codes.append(b.or_(b.and_(b.lshr(lo, const(4 * (g % 2))), const(0x0F0F0F0F)), top))
                    return codes

                def scale(row):  # the 16 columns' scale bytes of sub-block row ``row``, sign-extended
                    return b.sext(b.load(at(7, [row, c], ir.VectorType(_i8, 16)), align=1), _V16)

                def lane_of_row(blk, base, lane, codes, scales, subs, i):  # row ``rows[i]``'s lane through its float step
                    r = b.load(item(6, [i]))
                    y0 = at(5, [r, b.mul(blk, k(256))], _i8)
                    s = zero
                    for g in range(8):  # scale · the 4-value dots of the lane's group g
                        y4 = b.load(b.bitcast(b.gep(y0, [k(4 * (8 * g + lane))]), _i32.as_pointer()), align=1)
                        cv = codes[g] if six else b.load(codes[g], align=1)
                        s = _dot_scaled(b, lv, s, cv, _splat(b, y4), scales[g])
                    if p16:  # less q8sclsub: 32·(bs[2l]·sc[2l] + bs[2l+1]·sc[2l+1]), |bs| <= 16·128 < 2^15
                        t = zero
                        for h in (0, 1):
                            bsv = b.trunc(b.load(item(8, [r, b.add(base, k(2 * lane + h))])), _i32)
                            t = _scaled(b, lv, t, _splat(b, bsv), subs[h])
                        s = b.sub(s, b.shl(t, ir.Constant(_V16, [5] * 16)))
                    db = b.fmul(_splat(b, b.load(item(10, [r, blk])), _F16), b.load(at(9, [blk, c], _F16), align=4))
                    pf = at(0, [i, k(lane), o], _F16)  # acc_l = fma(y.d·d, float(sumi_l), acc_l)
                    b.store(b.call(fma, [db, b.sitofp(s, _F16), b.load(pf, align=4)]), pf, align=4)

                n_rows = cgutils.unpack_tuple(b, arr[6].shape, 1)[0]
                with cgutils.for_range(b, cgutils.unpack_tuple(b, arr[9].shape, 2)[0]) as blk_loop:
                    blk = blk_loop.index
                    base = b.mul(blk, k(16 if p16 else 8))  # the super-block's first scale row
                    r0 = b.add(qr0, b.mul(blk, k(64)))  # the super-block's first quad row
                    if six:  # quad rows 2r, 2r + 1 in nibble row r; 4r … 4r + 3 in high-bit row K/2 + r (columns.pack6)
                        half = b.udiv(b.mul(cgutils.unpack_tuple(b, arr[2].shape, 2)[0], k(2)), k(3))  # K/2
                        lo0 = at(2, [b.udiv(r0, k(2)), k(0)], _V16)
                        hi0 = at(2, [b.add(half, b.udiv(r0, k(4))), k(0)], _V16)
                    else:
                        q0 = at(2, [r0, k(0)], _V16)  # lane l, group g at q0 + 8l + g
                    for lanes in ((0, 1, 2, 3), (4, 5, 6, 7)) if p16 else (tuple(range(8)),):
                        # Q6_K: scale 2g + l // 4 per 16 values; else scale g per 32
                        scales = [scale(b.add(base, k(2 * g + lanes[0] // 4 if p16 else g))) for g in range(8)]
                        for lane in lanes:
                            if six:  # decoded once for all rows
                                # the lane's codes (a sub-tile's super-block: 2048 bytes of nibbles, 1024 of high bits)
                                _prefetch(b, b.gep(lo0, [k(4 * lane)]), 2048 * AHEAD_BLOCKS, 256, AHEAD_LOCALITY)
                                _prefetch(b, b.gep(hi0, [k(2 * lane)]), 1024 * AHEAD_BLOCKS, 128, AHEAD_LOCALITY)
                                codes = six_codes(lo0, hi0, lane)
                            else:
                                _prefetch(b, b.gep(q0, [k(8 * lane)]), 4096 * AHEAD_BLOCKS, 512, AHEAD_LOCALITY)  # 4096 a super-block
                                codes = [b.gep(q0, [k(8 * lane + g)]) for g in range(8)]  # loaded per row (register pressure)
                            subs = [scale(b.add(base, k(2 * lane + h))) for h in (0, 1)] if p16 else []
                            with cgutils.for_range(b, n_rows) as row_loop:
                                lane_of_row(blk, base, lane, codes, scales, subs, row_loop.index)

            # a sub-tile's K/4 quad rows: a quarter of the tile's byte rows (K), a third of its six-bit rows (3K/4)
            sub_rows = b.udiv(cgutils.unpack_tuple(b, arr[2].shape, 2)[0], k(3 if six else 4))
            _sub_tiles(b, args[13], sub_rows, args[1], args[3], args[4], sub_tile)  # ns sub-tiles from (o, qr0, c)
            return context.get_dummy_value()

        return sig, codegen

    @jit()
    def lanes_rows16(acc, o, q, c, y, rows, sc, bs, d, yd, form, level):
        """:func:`lanes_rows_def` for the 16 columns ``c … c + 15`` of a sub-tile of byte codes (``form`` 0, 1) as
        vector IR (``level`` :data:`kernels.ggml.columns_ir.LEVEL`)."""
        literally(level)
        qr0 = _sub_tile_row(q, c)
        if form == 1:  # the literals the IR is built for, one branch each
            _lanes_rows_ir(acc, o, q, qr0, c, y, rows, sc, bs, d, yd, 1, level, 1)
        else:
            _lanes_rows_ir(acc, o, q, qr0, c, y, rows, sc, bs, d, yd, 0, level, 1)

    @jit()
    def lanes_rows16_six(acc, o, q, c, ns, y, rows, sc, bs, d, yd, level):
        """:func:`lanes_rows16` of Q6_K for ``ns`` sub-tiles of its six-bit codes from column ``c`` on (``q`` (3K/4,
        64) uint8, :func:`pack6`), in one call: each lane's 8 code vectors decoded once, in the vector step, for all
        rows."""
        literally(level)
        if q.shape[1] != 64 or q.shape[0] % 3:
            raise ValueError("column layout: a tile of six-bit codes has 3K/4 rows of 64 bytes")
        _lanes_rows_ir(acc, o, q, (c // 16) * (q.shape[0] // 3), c, y, rows, sc, bs, d, yd, 3, level, ns)

else:

    def lanes_rows16(acc, o, q, c, y, rows, sc, bs, d, yd, form, level):
        lanes_rows_def(acc, o, q, c, 16, y, rows, sc, bs, d, yd, form)

    def lanes_rows16_six(acc, o, q, c, ns, y, rows, sc, bs, d, yd, level):
        codes = np.empty((q.shape[0] * 4 // 3, 64), np.int8)
        unpack6(q, codes)
        for s in range(ns):
            lanes_rows_def(acc, o + 16 * s, codes, c + 16 * s, 16, y, rows, sc, bs, d, yd, 1)


@jit()
def lanes_rows(acc, o, q, c, nc, y, rows, sc, bs, d, yd, form):
    """:func:`lanes_rows_def` — a whole sub-tile of byte codes (Q5_K, Q6_K) as vector IR (:func:`lanes_rows16`), else
    by the definitions."""
    if nc == 16 and form != 2:
        lanes_rows16(acc, o, q, c, y, rows, sc, bs, d, yd, form, LEVEL)
    else:
        lanes_rows_def(acc, o, q, c, nc, y, rows, sc, bs, d, yd, form)


@jit()
def _by_block(kk, form, q, d, dmin, sc, mn, c, nc, y, yd, ys, tiled, rows, acc, accm, o):
    """Columns ``c … c + nc - 1`` of one sub-tile, super-block by super-block, each row ``rows[i]`` by its formula
    into ``acc[i]`` / ``accm[i]`` at ``o``: the tiled kernel's (:func:`kernels.ggml.columns_ir.kq`'s total), or
    vec_dot's (Q4_K's nibbles, a sub-tile's tail: :func:`kernels.ggml.columns_ir.kq_fma`, the mins)."""
    v = np.empty((8, 16), np.int32)  # a super-block's 8 integer lanes (or their total) per column of a sub-tile
    for b in range(yd.shape[1]):
        for i in range(rows.shape[0]):
            r = rows[i]
            if tiled[r]:
                kq(v, q, b, 0, 8, c, nc, y[r], sc, ys[r], form, 1)
                _tiled_sb(kk, v, b, c, nc, d, dmin, mn, yd[r], ys[r], acc[i, 0], o)
            else:
                kq_fma(acc[i], o, v, q, b, c, nc, y[r], sc, ys[r], d, yd[r, b], form)
                _mins_sb(kk, b, c, nc, dmin, mn, yd[r, b], ys[r], accm[i], o)


@jit()
def tile_k(kind, q, d, dmin, sc, mn, c, nc, y, yd, ys, tiled, rows, orow, out, oc):
    """Columns ``c … c + nc - 1`` of one tile (``q`` (K, 16·4) the quads of its sub-tiles, ``d`` / ``dmin`` (K/256,
    TILE), ``sc`` / ``mn`` (K/32 or K/16, TILE)) against the Q8_K activation rows ``rows`` (``y`` (R, K) int8,
    ``yd`` (R, K/256), ``ys`` the sums per 32 values (Q4_K, Q5_K) or per 16, the bsums (Q6_K)) into ``out[orow[i],
    oc + j]``; ``tiled[r]``: row ``r`` takes the tiled kernel's formula, else vec_dot's (module docstring). ``kind``
    3/4/5: Q4_K/Q5_K/Q6_K. Sub-tile by sub-tile (its codes one stream), super-block by super-block, every row
    against it while its codes are in the cache."""
    kk = kind - 3  # mulmat_k.KIND: 0 Q4_K, 1 Q5_K, 2 Q6_K
    form = 1 if kk == 2 else 2 if kk == 0 else 0  # columns_ir: Q6_K, Q4_K's nibbles, Q5_K's bytes
    R = rows.shape[0]
    acc = np.zeros((R, 8, 64), F32)  # TILE = 64 columns at most
    accm = np.zeros((R, 4, 64), F32)
    vec = form != 2  # the byte codes, every row vec_dot's: each lane's scales loaded once for all rows (lanes_rows)
    for i in range(R):
        vec = vec and not tiled[rows[i]]
    for w0 in range(c - c % 16, c + nc, 16):
        cs = max(c, w0)
        n = min(c + nc, w0 + 16) - cs
        if vec:
            lanes_rows(acc, cs - c, q, cs, n, y, rows, sc, ys, d, yd, form)
            if kk <= 1:
                for b in range(yd.shape[1]):
                    for i in range(R):
                        _mins_sb(kk, b, cs, n, dmin, mn, yd[rows[i], b], ys[rows[i]], accm[i], cs - c)
        else:
            _by_block(kk, form, q, d, dmin, sc, mn, cs, n, y, yd, ys, tiled, rows, acc, accm, cs - c)
    for i in range(R):
        a, am = acc[i], accm[i]
        for j in range(nc):
            if tiled[rows[i]]:
                out[orow[i], oc + j] = a[0, j]
                continue
            res = hsum8(a, j)
            if kk == 0:
                res = res + F32(F32(am[0, j] + am[2, j]) + F32(am[1, j] + am[3, j]))
            elif kk == 1:
                res = res + am[0, j]
            out[orow[i], oc + j] = res


@jit()
def hsum8(a, j):
    """``hsum_float_8`` of column ``j``'s 8 lanes ``a[:, j]``: ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))."""
    return F32(F32(F32(a[0, j] + a[4, j]) + F32(a[2, j] + a[6, j])) + F32(F32(a[1, j] + a[5, j]) + F32(a[3, j] + a[7, j])))


@jit(inline=True)
def sixbit_into(acc, q, d, sc, c, nc, y, yd, ys, rows, orow, out, oc):
    """:func:`tile_k` of Q6_K on a tile of its six-bit codes (``q`` (3K/4, 64) uint8, :func:`pack6`), every row by
    vec_dot's formula, whole sub-tiles (``c``, ``nc`` multiples of 16), on zeroed accumulators ``acc`` (R, 8, ≥ nc):
    each lane's codes decoded once for all the rows (:func:`lanes_rows16_six`, every sub-tile in one call), then
    ``hsum_float_8``."""
    lanes_rows16_six(acc, 0, q, c, nc // 16, y, rows, sc, ys, d, yd, LEVEL)  # the sub-tiles in one call
    for i in range(rows.shape[0]):
        for j in range(nc):
            out[orow[i], oc + j] = hsum8(acc[i], j)


__all__ = ["KQ_KIND", "lanes_rows", "lanes_rows16", "lanes_rows_def", "lay_k", "pack6", "sixbit_into", "tile_k", "unpack6"]
