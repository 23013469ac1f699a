"""The AArch64 1-row ``vec_dot`` of Q8_0 and Q4_0 in a plain buffer (``arch/arm/quants.c``:
:func:`kernels.ggml.mulmat_arm_q._lanes_1row`, which reads the stored rows) from the column layout's values in pairs
(:mod:`kernels.ggml.columns`) — for :mod:`kernels.ggml.columns_arm`, with the same bits.

The kernel keeps ``ggml_vdotq_s32``'s 4 int32 lanes per 32-value block — ``sdot``'s bytes ``4l … 4l+3`` of each
16-byte half, or on ``arm64-base`` (no dotprod: ``vmull_s8`` + ``vpaddlq_s16``) bytes ``2l, 2l+1, 2l+8, 2l+9`` —,
even blocks' lanes in ``sumv0``, odd blocks' in ``sumv1``, each lane ``sumv[l] + float(lane)·(dw·dx)`` rounded twice
(GCC's ``vmlaq_n_f32``) or one FMA (clang; SVE's ``svmla``), then ``(l0 + l1) + (l2 + l3)`` of each (SVE: of their
lane-wise sum), and an odd last block's whole dot by one FMA (Q4_0: ``fma(float(sumi)·dw, dx, sumf)``). At a 256-bit
SVE vector length (``arm64-sve256``: quants.c's ``case 256``) a block fills one vector: 8 lanes (``wide``), lane ``l``
the values ``4l … 4l+3``, one FMA each, then FADDV's tree over the 8 lane-wise sums
(:func:`kernels.ggml.sve.faddv`). The lanes of
16 outputs form in one vector step (pairs of values against the activations' pair: ``pmaddwd`` / ``vpdpwssd``), as
do their float steps; integers are exact, the float operations each output's, in order.
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml.columns import TILE
from kernels.ggml.simd import fma32
from kernels.ggml.sve import faddv

F32 = np.float32


@jit()
def lane_dots_def(lanes, q, k0, c, nc, y, yo, vmull, wide=False):
    """``ggml_vdotq_s32``'s 4 lanes of one 32-value block (values ``k0 … k0 + 31``) for columns ``c … c + nc - 1``
    of the pairs layout ``q`` (K/2, 2·TILE): ``lanes[l, j]`` sums the products of bytes ``4l … 4l+3`` of both 16-byte
    halves (``sdot``), or with ``vmull`` (``arm64-base``) bytes ``2l, 2l+1, 2l+8, 2l+9`` — in pairs of values: pairs
    ``2l, 2l+1, 2l+8, 2l+9`` of the block, or ``l, l+4, l+8, l+12``. Exact: |lane| <= 8·128·128. ``wide``: the
    8 lanes of a 256-bit ``svdot_s32`` (``lanes`` (8, …)), lane ``l`` the values ``4l … 4l+3`` (pairs ``2l,
    2l+1``)."""
    for j in range(nc):
        cj = c + j
        for lane in range(8 if wide else 4):
            s = np.int32(0)
            for m in range(2 if wide else 4):
                if wide:
                    pr = 2 * lane + m
                else:
                    pr = lane + 4 * m if vmull else 2 * lane + (m & 1) + 8 * (m >> 1)  # the pair of the block
                k = k0 + 2 * pr
                s += (np.int32(q[k // 2, 2 * cj]) * np.int32(y[yo + 2 * pr])
                      + np.int32(q[k // 2, 2 * cj + 1]) * np.int32(y[yo + 2 * pr + 1]))
            lanes[lane, j] = s


@jit()
def lanes_step_def(acc, h, q, k0, c, nc, y, yo, vmull, d, blk, yd, fused, lanes, dj, wide=False):
    """One block's float step of :func:`_tile_lanes` (its lanes :func:`lane_dots_def`; ``lanes`` (8, 16) int32 and
    ``dj`` (16,) float32 scratch): ``dj = d[blk, c + j]·yd``, then lane by lane (4, or 8: ``wide``) one FMA
    (``fused``) or a rounded product then a rounded sum, into ``acc[h]``."""
    lane_dots_def(lanes, q, k0, c, nc, y, yo, vmull, wide)
    for j in range(nc):
        dj[j] = F32(d[blk, c + j] * yd)  # vmulq_f32
    for lane in range(8 if wide else 4):
        for j in range(nc):
            if fused:
                acc[h, lane, j] = fma32(F32(lanes[lane, j]), dj[j], acc[h, lane, j])
            else:
                acc[h, lane, j] = acc[h, lane, j] + F32(F32(lanes[lane, j]) * dj[j])


if JIT_ENABLED:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def _lanes16(context, b, q_t, qa, k0, c, y_t, ya, yo, vmull, wide=False):
        """The 4 lanes (each a (16 x i32) value) of :func:`lane_dots_def` for 16 columns: per pair of the block, 32
        weights sign-extended times the activations' pair (``pmaddwd`` / ``vpdpwssd``), then each lane the sum of its
        4 pairs (``vmull`` a constant: its order; an i1: both orders, one selected); ``wide`` (a Python bool): the 8
        lanes of SVE at 256 bits, each the sum of 2 pairs."""
        l64, i32, i16 = ir.IntType(64), ir.IntType(32), ir.IntType(16)
        v16, v32 = ir.VectorType(i32, 16), ir.VectorType(i32, 32)
        even, odd = ir.Constant(v16, list(range(0, 32, 2))), ir.Constant(v16, list(range(1, 32, 2)))
        kp0, c2 = b.ashr(k0, ir.Constant(l64, 1)), b.mul(c, ir.Constant(l64, 2))
        pairs = []
        for lp in range(16):  # the pair dots of 16 columns
            pq = cgutils.get_item_pointer(context, b, q_t, qa, [b.add(kp0, ir.Constant(l64, lp)), c2])
            wv = b.sext(b.load(b.bitcast(pq, ir.VectorType(ir.IntType(8), 32).as_pointer()), align=1), v32)
            py = cgutils.get_item_pointer(context, b, y_t, ya, [b.add(yo, ir.Constant(l64, 2 * lp))])
            pair = b.load(b.bitcast(py, i16.as_pointer()), align=1)
            pair = b.bitcast(b.sext(b.bitcast(pair, ir.VectorType(ir.IntType(8), 2)), ir.VectorType(i16, 2)), i32)
            yb = b.shuffle_vector(b.insert_element(ir.Constant(v16, None), pair, ir.Constant(i32, 0)),
                                  ir.Constant(v16, None), ir.Constant(v16, [0] * 16))
            p = b.mul(wv, b.sext(b.bitcast(yb, ir.VectorType(i16, 32)), v32))
            pairs.append(b.add(b.shuffle_vector(p, p, even), b.shuffle_vector(p, p, odd)))
        if wide:
            return [b.add(pairs[2 * lane], pairs[2 * lane + 1]) for lane in range(8)]
        lanes = []
        for lane in range(4):
            sdot = [pairs[2 * lane + (m & 1) + 8 * (m >> 1)] for m in range(4)]
            vmul = [pairs[lane + 4 * m] for m in range(4)]
            vs = None if vmull is True else b.add(b.add(sdot[0], sdot[1]), b.add(sdot[2], sdot[3]))
            vv = None if vmull is False else b.add(b.add(vmul[0], vmul[1]), b.add(vmul[2], vmul[3]))
            lanes.append(vv if vs is None else vs if vv is None else b.select(vmull, vv, vs))
        return lanes

    def _flag(context, b, value, t):
        """A bool argument: the Python constant where numba typed it a literal (one code path), else an i1."""
        if isinstance(t, types.Literal):
            return bool(t.literal_value)
        return _i1(context, b, value, t)

    def _i1(context, b, value, t):
        v = context.cast(b, value, t, types.boolean)
        return b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))

    def _arrays_ok(*arrays):
        return all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)

    @intrinsic
    def _lane_dots16_ir(typingctx, lanes, q, k0, c, y, yo, vmull):
        """:func:`lane_dots_def` for the 16 columns ``c … c + 15`` as target-independent vector IR."""
        if not (_arrays_ok(lanes, q, y) and lanes.dtype == types.int32 and q.dtype == y.dtype == types.int8):
            return None
        i64 = types.int64
        sig = types.void(lanes, q, i64, i64, y, i64, vmull)

        def codegen(context, b, signature, args):
            ts = signature.args
            la, qa, ya = (context.make_array(ts[i])(context, b, args[i]) for i in (0, 1, 4))
            vecs = _lanes16(context, b, ts[1], qa, args[2], args[3], ts[4], ya, args[5], _flag(context, b, args[6], ts[6]))
            l64, v16 = ir.IntType(64), ir.VectorType(ir.IntType(32), 16)
            for lane, vec in enumerate(vecs):
                po = cgutils.get_item_pointer(context, b, ts[0], la, [ir.Constant(l64, lane), ir.Constant(l64, 0)])
                b.store(vec, b.bitcast(po, v16.as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    def _step16(wide):
        """:func:`_lanes_step16_ir` for 4 lanes, or (``wide``) the 8 of SVE at 256 bits."""

        @intrinsic
        def _lanes_step16_ir(typingctx, acc, h, q, k0, c, y, yo, vmull, d, blk, yd, fused):
            """One block's float step of :func:`_tile_lanes` for the 16 columns ``c … c + 15`` (of ``d`` (K/32, TILE)
            float32, row ``blk``) as vector IR: ``dj = d · yd`` (``vmulq_f32``), then per lane ``acc[h, l] =
            fma(float(lane), dj, acc[h, l])`` (``fused``) or ``acc[h, l] + float(lane)·dj`` (two roundings), ``acc``
            (2, ≥ 4 or 8, 16) float32 (``wide``: 8 lanes)."""
            if not (_arrays_ok(acc, q, y, d) and acc.dtype == d.dtype == types.float32
                    and q.dtype == y.dtype == types.int8):
                return None
            i64 = types.int64
            sig = types.void(acc, i64, q, i64, i64, y, i64, vmull, d, i64, types.float32, fused)

            def codegen(context, b, signature, args):
                ts = signature.args
                aa, qa, ya, da = (context.make_array(ts[i])(context, b, args[i]) for i in (0, 2, 5, 8))
                vm = _flag(context, b, args[7], ts[7])
                vecs = _lanes16(context, b, ts[2], qa, args[3], args[4], ts[5], ya, args[6], vm, wide)
                l64, f16 = ir.IntType(64), ir.VectorType(ir.FloatType(), 16)
                pd = cgutils.get_item_pointer(context, b, ts[8], da, [args[9], args[4]])
                i32 = ir.IntType(32)
                ydv = b.shuffle_vector(b.insert_element(ir.Constant(f16, None), args[10], ir.Constant(i32, 0)),
                                       ir.Constant(f16, None), ir.Constant(ir.VectorType(i32, 16), [0] * 16))
                dj = b.fmul(b.load(b.bitcast(pd, f16.as_pointer()), align=4), ydv)
                fma = cgutils.get_or_insert_function(b.module, ir.FunctionType(f16, [f16] * 3), "llvm.fma.v16f32")
                use_fma = _flag(context, b, args[11], ts[11])
                for lane, vec in enumerate(vecs):
                    at = [args[1], ir.Constant(l64, lane), ir.Constant(l64, 0)]
                    pa = b.bitcast(cgutils.get_item_pointer(context, b, ts[0], aa, at), f16.as_pointer())
                    a, fl = b.load(pa, align=4), b.sitofp(vec, f16)
                    if use_fma is True or use_fma is False:
                        new = b.call(fma, [fl, dj, a]) if use_fma else b.fadd(a, b.fmul(fl, dj))
                    else:
                        new = b.select(use_fma, b.call(fma, [fl, dj, a]), b.fadd(a, b.fmul(fl, dj)))
                    b.store(new, pa, align=4)
                return context.get_dummy_value()

            return sig, codegen

        return _lanes_step16_ir

    _lanes_step16_ir, _lanes_step16_8_ir = _step16(False), _step16(True)

    def _tile(wide):
        """:func:`_lanes_tile_ir` for 4 lanes, or (``wide``) the 8 of SVE at 256 bits."""

        @intrinsic
        def _lanes_tile_ir(typingctx, acc, q, y, yd, d, npairs, vmull, fused):
            """:func:`_lanes_step16_ir` for a whole tile (4 sub-tiles of 16 columns) and every pair of blocks ``0 …
            2·npairs - 1`` in one loop, the 4 × 2 × 4 (``wide``: 4 × 2 × 8) accumulators in registers (stored to
            ``acc`` (4, 2, ≥ 4 or 8, 16) float32 at the end, after they start from it): the same float operations per
            column, in the same order. ``yd`` (nb,) the activation row's scales."""
            if not (_arrays_ok(acc, q, y, yd, d) and acc.dtype == d.dtype == yd.dtype == types.float32
                    and q.dtype == y.dtype == types.int8):
                return None
            sig = types.void(acc, q, y, yd, d, types.int64, vmull, fused)

            def codegen(context, b, signature, args):
                ts = signature.args
                aa, qa, ya, yda, da = (context.make_array(ts[i])(context, b, args[i]) for i in range(5))
                l64, i32, f16 = ir.IntType(64), ir.IntType(32), ir.VectorType(ir.FloatType(), 16)
                fma = cgutils.get_or_insert_function(b.module, ir.FunctionType(f16, [f16] * 3), "llvm.fma.v16f32")
                vm, use_fma = _flag(context, b, args[6], ts[6]), _flag(context, b, args[7], ts[7])

                def k(n):
                    return ir.Constant(l64, n)

                def acc_ptr(st, h, lane):
                    return b.bitcast(cgutils.get_item_pointer(context, b, ts[0], aa, [k(st), k(h), k(lane), k(0)]),
                                     f16.as_pointer())

                slots = {}
                for key in ((st, h, lane) for st in range(4) for h in range(2) for lane in range(8 if wide else 4)):
                    slots[key] = cgutils.alloca_once(b, f16)  # promoted to registers by LLVM
                    b.store(b.load(acc_ptr(*key), align=4), slots[key])
                with cgutils.for_range(b, args[5]) as loop:
                    for h in range(2):
                        blk = b.add(b.mul(loop.index, k(2)), k(h))
                        k0 = b.mul(blk, k(32))
                        ydv = b.load(cgutils.get_item_pointer(context, b, ts[3], yda, [blk]))
                        ydv = b.shuffle_vector(b.insert_element(ir.Constant(f16, None), ydv, ir.Constant(i32, 0)),
                                               ir.Constant(f16, None), ir.Constant(ir.VectorType(i32, 16), [0] * 16))
                        for st in range(4):
                            vecs = _lanes16(context, b, ts[1], qa, k0, k(16 * st), ts[2], ya, k0, vm, wide)
                            pd = cgutils.get_item_pointer(context, b, ts[4], da, [blk, k(16 * st)])
                            dj = b.fmul(b.load(b.bitcast(pd, f16.as_pointer()), align=4), ydv)  # vmulq_f32
                            for lane, vec in enumerate(vecs):
                                a, fl = b.load(slots[st, h, lane]), b.sitofp(vec, f16)
                                if use_fma is True or use_fma is False:
                                    new = b.call(fma, [fl, dj, a]) if use_fma else b.fadd(a, b.fmul(fl, dj))
                                else:
                                    new = b.select(use_fma, b.call(fma, [fl, dj, a]), b.fadd(a, b.fmul(fl, dj)))
                                b.store(new, slots[st, h, lane])
                for key, slot in slots.items():
                    b.store(b.load(slot), acc_ptr(*key), align=4)
                return context.get_dummy_value()

            return sig, codegen

        return _lanes_tile_ir

    _lanes_tile_ir, _lanes_tile8_ir = _tile(False), _tile(True)

    @jit()
    def lanes_tile(acc, q, y, yd, d, npairs, vmull, fused, wide=False):
        """:func:`_lanes_tile_ir` (a whole tile, every pair of blocks; ``wide``: 8 lanes)."""
        if wide:
            _lanes_tile8_ir(acc, q, y, yd, d, np.int64(npairs), vmull, fused)
        else:
            _lanes_tile_ir(acc, q, y, yd, d, np.int64(npairs), vmull, fused)

    @jit()
    def lanes_step(acc, h, q, k0, c, nc, y, yo, vmull, d, blk, yd, fused, lanes, dj, wide=False):
        """:func:`_tile_lanes`'s float step of one block — 16 columns as vector IR, else by the definitions."""
        if nc == 16 and wide:
            _lanes_step16_8_ir(acc, np.int64(h), q, np.int64(k0), np.int64(c), y, np.int64(yo), vmull, d,
                               np.int64(blk), F32(yd), fused)
        elif nc == 16:
            _lanes_step16_ir(acc, np.int64(h), q, np.int64(k0), np.int64(c), y, np.int64(yo), vmull, d,
                             np.int64(blk), F32(yd), fused)
        else:
            lanes_step_def(acc, h, q, k0, c, nc, y, yo, vmull, d, blk, yd, fused, lanes, dj, wide)

    @jit()
    def lane_dots(lanes, q, k0, c, nc, y, yo, vmull):
        """:func:`lane_dots_def` — 16 columns as vector IR, else by the definition."""
        if nc == 16:
            _lane_dots16_ir(lanes, q, np.int64(k0), np.int64(c), y, np.int64(yo), vmull)
        else:
            lane_dots_def(lanes, q, k0, c, nc, y, yo, vmull)
else:
    lane_dots = lane_dots_def

    def lanes_tile(acc, q, y, yd, d, npairs, vmull, fused, wide=False):
        lanes = np.empty((8, 16), np.int32)
        dj = np.empty(16, F32)
        for ib in range(npairs):
            for h in range(2):
                for st in range(4):
                    lanes_step_def(acc[st], h, q, 64 * ib + 32 * h, 16 * st, 16, y, 64 * ib + 32 * h, vmull, d,
                                   2 * ib + h, yd[2 * ib + h], fused, lanes, dj, wide)

    def lanes_step(acc, h, q, k0, c, nc, y, yo, vmull, d, blk, yd, fused, lanes, dj, wide=False):
        lanes_step_def(acc, h, q, k0, c, nc, y, yo, vmull, d, blk, yd, fused, lanes, dj, wide)


@jit()
def tile_lanes(q, d, c, nc, y, yd, recipe, rows, orow, out, oc):
    """The 1-row ``vec_dot`` of Q8_0 / Q4_0 (``arch/arm/quants.c``, :func:`kernels.ggml.mulmat_arm_q._lanes_1row`)
    for columns ``c … c + nc - 1`` of one tile of the pairs layout: blocks in pairs, even blocks into ``sumv0``, odd
    into ``sumv1``, lane by lane ``sumv[l] + float(lane)·(dw·dx)`` (or one FMA), their sum, then an odd last block.
    ``recipe[r]``: that kernel's ``kind`` (0 Q8_0, 1 Q4_0, 7 / 8 their SVE code at 128 bits, 9 / 10 at 256: 8 lanes)
    + 16·vmull + 32·fused."""
    nb = yd.shape[1]
    lanes = np.empty((8, 16), np.int32)
    w0 = c - c % 16  # the sub-tiles of 16 columns the range meets, each block of all of them in turn (the tile's
    ns = (c + nc - w0 + 15) // 16  # values in address order)
    acc = np.empty((ns, 2, 8, 16), F32)  # lanes 0-3, or 0-7 at 256 bits
    dj = np.empty(16, F32)
    sv = np.empty(8, F32)  # an SVE output's lane-wise sumv0 + sumv1
    for i in range(rows.shape[0]):
        r = rows[i]
        yr = y[r]
        lk, vmull, fused = recipe[r] & 15, (recipe[r] >> 4) & 1 == 1, (recipe[r] >> 5) & 1 == 1
        wide = lk >= 9  # SVE at 256 bits: 8 lanes a block
        acc[:] = 0
        ib = 0
        if c == 0 and nc == TILE and ns == 4:  # a whole tile: every pair of blocks in one vector loop
            lanes_tile(acc, q, yr, yd[r], d, nb // 2, vmull, fused, wide)
            ib = nb - nb % 2
        while ib + 1 < nb:
            for h in range(2):
                b = ib + h
                for st in range(ns):
                    cs = max(c, w0 + 16 * st)
                    n = min(c + nc, w0 + 16 * st + 16) - cs
                    lanes_step(acc[st], h, q, 32 * b, cs, n, yr, 32 * b, vmull, d, b, yd[r, b], fused, lanes, dj,
                               wide)
            ib += 2
        for st in range(ns):
            cs = max(c, w0 + 16 * st)
            n = min(c + nc, w0 + 16 * st + 16) - cs
            if ib < nb:  # the odd last block: its whole dot
                lane_dots(lanes, q, 32 * ib, cs, n, yr, 32 * ib, vmull)
            a, s = acc[st, 0], acc[st, 1]
            for j in range(n):
                if lk >= 7:  # SVE: one FADDV of sumv0 + sumv1 (4 lanes, or 8 at 256 bits)
                    w = 8 if wide else 4
                    for lane in range(w):
                        sv[lane] = F32(a[lane, j] + s[lane, j])
                    sumf = faddv(sv, 0, w)
                else:
                    sumf = F32(F32(F32(a[0, j] + a[1, j]) + F32(a[2, j] + a[3, j]))
                               + F32(F32(s[0, j] + s[1, j]) + F32(s[2, j] + s[3, j])))
                if ib < nb:
                    dot = F32(lanes[0, j] + lanes[1, j] + lanes[2, j] + lanes[3, j])
                    if lk == 0 or lk == 7 or lk == 9:  # Q8_0
                        sumf = fma32(dot, F32(d[ib, cs + j] * yd[r, ib]), sumf)
                    else:
                        sumf = fma32(F32(dot * d[ib, cs + j]), yd[r, ib], sumf)
                out[orow[i], oc + cs - c + j] = sumf


__all__ = ["lane_dots", "lane_dots_def", "lanes_step", "lanes_step_def", "lanes_tile", "tile_lanes"]
