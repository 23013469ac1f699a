"""The column layout's AArch64 kernels: a matrix that llama.cpp's CPU_REPACK buffer takes on an ARM path — Q4_K,
Q5_K, Q6_K (``q{4,5,6}_K_8x4`` / ``_8x8_q8_K``: :mod:`kernels.ggml.repack_arm_k`) and Q4_0, IQ4_NL, MXFP4 (the 32-value
block kernels: :mod:`kernels.ggml.repack_arm`) — multiplied from :mod:`kernels.ggml.columns`'s layout, 16 outputs'
exact integer dots at a time, with the same bits as those stored-row kernels (which the op tests hold to the
libraries under qemu).

Which register lane holds what is not part of the numerics; what is, per output element, are the integers that meet
a float operation and the float operations in ggml's order. The AArch64 kernels meet the floats with:

* **Q4_K, Q5_K**: each 32-value sub-block's ``I_s = sc_s · Σ q·y`` (the layout's codes, each group's scaled dot:
  :func:`kernels.ggml.columns_ir.kq_groups`) and the mins' ``m_2k + m_2k+1`` per 64 values; **Q6_K**: the
  super-block's ``I = Σ_g sc_g · Σ (q - 32)·y`` (:func:`kernels.ggml.columns_ir.kq`'s total, the -32 through the
  bsums). Their float steps, per super-block, by :func:`kernels.ggml.repack_arm_k.super_block` — the one function
  the stored-row kernel calls too, with the path's recipe of the gemm rows (the first ``T - T % 4``) and of the gemv
  rows (:data:`kernels.ggml.repack_arm_k.GEMM_GEMV`). Activations: the AArch64 Q8_K quantizer.
* **Q4_0, IQ4_NL, MXFP4**: per 32-value block the exact integer dot of the LUT values (no sign trick on ARM: ``sdot``
  / ``smmla``), ``d = float32(d_w · d_x)``, then ``acc = fma(float(dot), d, acc)`` or ``acc + float32(d ·
  float(dot))`` (:data:`kernels.ggml.repack_arm.FUSED`). Activations: the AArch64 Q8_0 quantizer.

And a weight in a **plain buffer** (``arm64-base`` repacks nothing; ``--no-repack``; rows not a multiple of 8), whose
1-row ``vec_dot`` (``arch/arm/quants.c``: :mod:`kernels.ggml.mulmat_arm_q`) meets the floats with:

* **Q4_K, Q5_K, Q6_K**: per super-block ``sumi = Σ sc·dot`` (Q6_K with the values ``q - 32``) and ``bias = Σ
  mn·(bsum pair)``: Q4_K ``sumf = fma(-float(bias), dmin, sumf)`` then ``fma(float(sumi), d, sumf)``; Q5_K ``sumf +
  fma(float(sumi), d, -(float(bias)·dmin))``; Q6_K ``fma(d, float(sumi), sumf)`` (``d = y.d·fp16(x.d)``, ``dmin =
  y.d·fp16(x.dmin)``).
* **MXFP4, IQ4_NL**: blocks in pairs, ``sumf + fma(float(sB), dB, float(sA)·dA)`` (MXFP4) or ``sumf + fma(float(sA),
  dA, float(sB)·dB)`` (IQ4_NL), an odd last block ``fma(float(sumi), d, sumf)``.
* **Q8_0, Q4_0**: ``ggml_vdotq_s32``'s 4 int32 lanes per block (``sdot``'s bytes ``4l … 4l+3`` of each half, or
  ``arm64-base``'s ``vmull`` order: :func:`lane_dots`, from the values in pairs), each lane's float chain (even
  blocks, odd blocks), their sum, an odd last block (:func:`_tile_lanes`).

An element that takes an i8mm 2-row kernel (a verify batch with ``--no-repack`` on an i8mm path), Q6_K on
``arm64-sve128-clang14`` (its wrong high bits) and the other types (Q5_0, Q4_1, Q5_1, the IQ and small K-quants)
read the stored rows.

Every NaN of an output is made AArch64's default NaN (:func:`kernels.ggml.repack_arm.arm_nans`), as the stored-row
kernels do. Q8_0 has no column layout here either (its stored-row kernel reads the rows in place).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.base.block import QT
from kernels.base.flags import JIT_ENABLED, SERIAL_BELOW, jit, per_type
from kernels.ggml import mulmat_arm, mulmat_arm_q
from kernels.ggml.actquant import _quantize_rows_q8_0_arm, _quantize_rows_q8_k
from kernels.ggml.build import by_clang
from kernels.ggml.columns import TILE, Columns, _dots
from kernels.ggml.columns_ir import kq, kq_groups
from kernels.ggml.mulmat_q8 import slot_groups
from kernels.ggml.repack_arm import FUSED, KERNELS_OF, REPACK_ARM, arm_nans
from kernels.ggml.repack_arm_k import GEMM_GEMV, Q8_K_FUSED, quantize_rows_q8_k_arm, super_block
from kernels.ggml.simd import fma32

F32 = np.float32
#: The types whose AArch64 repacked kernels run from the column layout -> kernel ``kind`` (0–2: the K-quants as
#: ``repack_arm_k.KIND``; 3: a 32-value block type).
KIND = {QT.Q4_K: 0, QT.Q5_K: 1, QT.Q6_K: 2, QT.Q4_0: 3, QT.IQ4_NL: 3, QT.MXFP4: 3}
#: The types whose plain-buffer 1-row ``vec_dot`` runs from the column layout -> kernel ``kind`` (4–6: Q4_K, Q5_K,
#: Q6_K; 7: MXFP4, 8: IQ4_NL; 9: the lanes of Q8_0 and Q4_0).
PLAIN_KIND = {QT.Q4_K: 4, QT.Q5_K: 5, QT.Q6_K: 6, QT.MXFP4: 7, QT.IQ4_NL: 8, QT.Q8_0: 9, QT.Q4_0: 9}


def covers(qtype, path: str, repacked: bool = True) -> bool:
    """Whether a ``qtype`` matrix runs from the column layout here on the AArch64 ``path``: ``repacked`` (the
    CPU_REPACK buffer takes it) on the paths whose repacked kernels are emulated
    (:data:`kernels.ggml.repack_arm.KERNELS_OF`), else in a plain buffer on every emulated AArch64 path."""
    qt = QT(qtype)
    if repacked:
        return path in KERNELS_OF and qt in KIND and qt in REPACK_ARM[path]
    return (qt in PLAIN_KIND and mulmat_arm.emulated(qt, path)
            and not (qt == QT.Q6_K and path == "arm64-sve128-clang14"))  # its 1-row Q6_K's wrong high bits


@jit()
def _tile_k(kk, q, d, dmin, sc, mn, c, nc, y, yd, ys, bs, recipe, rows, orow, out, oc):
    """Columns ``c … c + nc - 1`` of one tile of K-quant codes (``kk`` 0 Q4_K, 1 Q5_K, 2 Q6_K) against activation rows
    ``rows`` (``y`` (R, K) int8, ``yd`` (R, K/256), ``ys`` (R, K/32) the sums per 32 values, ``bs`` (R, K/16) the
    bsums, ``recipe`` (R,) each row's float recipe) into ``out[orow[i], oc + j]``: sub-tile by sub-tile, super-block
    by super-block, every row against the codes while they are in the cache; each element's float steps in order."""
    R = rows.shape[0]
    v = np.empty((8, 16), np.int32)  # a super-block's integers (per group, or the total) per column of a sub-tile
    isub = np.empty(8, np.int64)
    m4 = np.zeros(4, np.int64)
    acc = np.zeros((R, TILE), F32)
    for w0 in range(c - c % 16, c + nc, 16):
        cs = max(c, w0)
        n = min(c + nc, w0 + 16) - cs
        for b in range(yd.shape[1]):
            for i in range(R):
                r = rows[i]
                if kk == 2:  # columns_ir's forms (constants): 1 Q6_K's bytes, 2 Q4_K's nibbles, 0 Q5_K's bytes
                    kq(v, q, b, 0, 8, cs, n, y[r], sc, bs[r], 1, 1)  # v[0]: Σ_g sc_g · Σ (q - 32)·y
                elif kk == 0:
                    kq_groups(v, q, b, cs, n, y[r], sc, 2)  # v[s]: I_s
                else:
                    kq_groups(v, q, b, cs, n, y[r], sc, 0)
                for j in range(n):
                    cj = cs + j
                    isub[0] = v[0, j]
                    dm = F32(0.0)
                    if kk != 2:
                        for s in range(1, 8):
                            isub[s] = v[s, j]
                        for k in range(4):  # m_2k + m_2k+1
                            s0 = 8 * b + 2 * k
                            m4[k] = np.int64(mn[s0, cj]) * ys[r, s0] + np.int64(mn[s0 + 1, cj]) * ys[r, s0 + 1]
                        dm = dmin[b, cj]
                    o = cj - c
                    acc[i, o] = super_block(kk, recipe[r], isub, m4, d[b, cj], dm, yd[r, b], acc[i, o])
    for i in range(R):
        for j in range(nc):
            out[orow[i], oc + j] = acc[i, j]


@jit()
def _tile_b32(q, d, c, nc, y, yd, fused, rows, orow, out, oc):
    """Columns ``c … c + nc - 1`` of one tile of 32-value blocks (``q`` (K/2, 2·TILE) the LUT values, ``d`` (K/32,
    TILE) the weight scales) against activation rows ``rows`` (``y`` (R, K) int8, ``yd`` (R, K/32), ``fused`` (R,)
    1 where the row's float step is one FMA) into ``out[orow[i], oc + j]``."""
    dots = np.empty(TILE, np.int32)
    acc = np.empty(TILE, F32)
    for i in range(rows.shape[0]):
        r = rows[i]
        yr = y[r]
        acc[:nc] = 0
        for b in range(yd.shape[1]):
            _dots(q, 32 * b, c, nc, yr, 32 * b, dots)  # exact: no sign trick on ARM
            for j in range(nc):
                dd = F32(d[b, c + j] * yd[r, b])  # vmulq_f32
                if fused[r]:
                    acc[j] = fma32(F32(dots[j]), dd, acc[j])  # vfmaq_f32 / fmla
                else:
                    acc[j] = acc[j] + F32(dd * F32(dots[j]))  # vmlaq_f32: fmul, fadd
        for j in range(nc):
            out[orow[i], oc + j] = acc[j]


@jit()
def _tile_k1(kk, q, d, dmin, sc, mn, c, nc, y, yd, ys, bs, rows, orow, out, oc):
    """The plain buffer's 1-row ``vec_dot`` (module docstring) of K-quant codes (``kk`` 0 Q4_K, 1 Q5_K, 2 Q6_K) for
    columns ``c … c + nc - 1`` of one tile, as :func:`_tile_k`'s arguments."""
    R = rows.shape[0]
    v = np.empty((8, 16), np.int32)
    acc = np.zeros((R, TILE), F32)
    for w0 in range(c - c % 16, c + nc, 16):
        cs = max(c, w0)
        n = min(c + nc, w0 + 16) - cs
        for b in range(yd.shape[1]):
            for i in range(R):
                r = rows[i]
                if kk == 2:  # v[0]: sumi (Q6_K: of q - 32), columns_ir's form a constant
                    kq(v, q, b, 0, 8, cs, n, y[r], sc, bs[r], 1, 1)
                elif kk == 0:
                    kq(v, q, b, 0, 8, cs, n, y[r], sc, bs[r], 2, 1)
                else:
                    kq(v, q, b, 0, 8, cs, n, y[r], sc, bs[r], 0, 1)
                for j in range(n):
                    cj = cs + j
                    o = cj - c
                    db = F32(yd[r, b] * d[b, cj])
                    if kk == 2:
                        acc[i, o] = fma32(db, F32(v[0, j]), acc[i, o])
                        continue
                    bias = np.int64(0)
                    for s in range(8 * b, 8 * b + 8):
                        bias += np.int64(mn[s, cj]) * ys[r, s]
                    dm = F32(yd[r, b] * dmin[b, cj])
                    if kk == 0:  # Q4_K: fmsub, then fmadd
                        acc[i, o] = fma32(F32(v[0, j]), db, fma32(-F32(bias), dm, acc[i, o]))
                    else:  # Q5_K: fnmsub, then fadd
                        acc[i, o] = acc[i, o] + fma32(F32(v[0, j]), db, -F32(F32(bias) * dm))
    for i in range(R):
        for j in range(nc):
            out[orow[i], oc + j] = acc[i, j]


@jit()
def _tile_b32_1(mx, q, d, c, nc, y, yd, rows, orow, out, oc):
    """The plain buffer's 1-row ``vec_dot`` of MXFP4 (``mx``) or IQ4_NL: blocks in pairs, one product rounded and the
    other fused (module docstring); ``q``, ``d`` as :func:`_tile_b32`."""
    nb = yd.shape[1]
    da = np.empty(TILE, np.int32)
    db = np.empty(TILE, np.int32)
    acc = np.empty(TILE, F32)
    for i in range(rows.shape[0]):
        r = rows[i]
        yr = y[r]
        acc[:nc] = 0
        b = 0
        while b + 1 < nb:
            _dots(q, 32 * b, c, nc, yr, 32 * b, da)
            _dots(q, 32 * b + 32, c, nc, yr, 32 * b + 32, db)
            for j in range(nc):
                fa, fb = F32(yd[r, b] * d[b, c + j]), F32(yd[r, b + 1] * d[b + 1, c + j])
                if mx:
                    acc[j] = acc[j] + fma32(F32(db[j]), fb, F32(F32(da[j]) * fa))
                else:
                    acc[j] = acc[j] + fma32(F32(da[j]), fa, F32(F32(db[j]) * fb))
            b += 2
        if b < nb:
            _dots(q, 32 * b, c, nc, yr, 32 * b, da)
            for j in range(nc):
                acc[j] = fma32(F32(da[j]), F32(yd[r, b] * d[b, c + j]), acc[j])
        for j in range(nc):
            out[orow[i], oc + j] = acc[j]


@jit()
def lane_dots_def(lanes, q, k0, c, nc, y, yo, vmull):
    """``ggml_vdotq_s32``'s 4 lanes of one 32-value block (values ``k0 … k0 + 31``) for columns ``c … c + nc - 1``
    of the pairs layout ``q`` (K/2, 2·TILE): ``lanes[l, j]`` sums the products of bytes ``4l … 4l+3`` of both 16-byte
    halves (``sdot``), or with ``vmull`` (``arm64-base``) bytes ``2l, 2l+1, 2l+8, 2l+9`` — in pairs of values: pairs
    ``2l, 2l+1, 2l+8, 2l+9`` of the block, or ``l, l+4, l+8, l+12``. Exact: |lane| <= 8·128·128."""
    for j in range(nc):
        cj = c + j
        for lane in range(4):
            s = np.int32(0)
            for m in range(4):
                pr = lane + 4 * m if vmull else 2 * lane + (m & 1) + 8 * (m >> 1)  # the pair of the block
                k = k0 + 2 * pr
                s += (np.int32(q[k // 2, 2 * cj]) * np.int32(y[yo + 2 * pr])
                      + np.int32(q[k // 2, 2 * cj + 1]) * np.int32(y[yo + 2 * pr + 1]))
            lanes[lane, j] = s


@jit()
def lanes_step_def(acc, h, q, k0, c, nc, y, yo, vmull, d, blk, yd, fused, lanes, dj):
    """One block's float step of :func:`_tile_lanes` (its lanes :func:`lane_dots_def`; ``lanes`` (4, 16) int32 and
    ``dj`` (16,) float32 scratch): ``dj = d[blk, c + j]·yd``, then lane by lane one FMA (``fused``) or a rounded
    product then a rounded sum, into ``acc[h]``."""
    lane_dots_def(lanes, q, k0, c, nc, y, yo, vmull)
    for j in range(nc):
        dj[j] = F32(d[blk, c + j] * yd)  # vmulq_f32
    for lane in range(4):
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

    def _lanes16(context, b, q_t, qa, k0, c, y_t, ya, yo, vmull):
        """The 4 lanes (each a (16 x i32) value) of :func:`lane_dots_def` for 16 columns: per pair of the block, 32
        weights sign-extended times the activations' pair (``pmaddwd`` / ``vpdpwssd``), then each lane the sum of its
        4 pairs (``vmull`` a constant: its order; an i1: both orders, one selected)."""
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

    @intrinsic
    def _lanes_step16_ir(typingctx, acc, h, q, k0, c, y, yo, vmull, d, blk, yd, fused):
        """One block's float step of :func:`_tile_lanes` for the 16 columns ``c … c + 15`` (of ``d`` (K/32, TILE)
        float32, row ``blk``) as vector IR: ``dj = d · yd`` (``vmulq_f32``), then per lane ``acc[h, l] =
        fma(float(lane), dj, acc[h, l])`` (``fused``) or ``acc[h, l] + float(lane)·dj`` (two roundings), ``acc``
        (2, 4, 16) float32."""
        if not (_arrays_ok(acc, q, y, d) and acc.dtype == d.dtype == types.float32
                and q.dtype == y.dtype == types.int8):
            return None
        i64 = types.int64
        sig = types.void(acc, i64, q, i64, i64, y, i64, vmull, d, i64, types.float32, fused)

        def codegen(context, b, signature, args):
            ts = signature.args
            aa, qa, ya, da = (context.make_array(ts[i])(context, b, args[i]) for i in (0, 2, 5, 8))
            vecs = _lanes16(context, b, ts[2], qa, args[3], args[4], ts[5], ya, args[6], _flag(context, b, args[7], ts[7]))
            l64, f16 = ir.IntType(64), ir.VectorType(ir.FloatType(), 16)
            pd = cgutils.get_item_pointer(context, b, ts[8], da, [args[9], args[4]])
            ydv = b.shuffle_vector(b.insert_element(ir.Constant(f16, None), args[10], ir.Constant(ir.IntType(32), 0)),
                                   ir.Constant(f16, None), ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16))
            dj = b.fmul(b.load(b.bitcast(pd, f16.as_pointer()), align=4), ydv)
            fma = cgutils.get_or_insert_function(b.module, ir.FunctionType(f16, [f16] * 3), "llvm.fma.v16f32")
            use_fma = _flag(context, b, args[11], ts[11])
            for lane, vec in enumerate(vecs):
                pa = b.bitcast(cgutils.get_item_pointer(context, b, ts[0], aa, [args[1], ir.Constant(l64, lane),
                                                                                  ir.Constant(l64, 0)]), f16.as_pointer())
                a, fl = b.load(pa, align=4), b.sitofp(vec, f16)
                if use_fma is True or use_fma is False:
                    new = b.call(fma, [fl, dj, a]) if use_fma else b.fadd(a, b.fmul(fl, dj))
                else:
                    new = b.select(use_fma, b.call(fma, [fl, dj, a]), b.fadd(a, b.fmul(fl, dj)))
                b.store(new, pa, align=4)
            return context.get_dummy_value()

        return sig, codegen

    @jit()
    def lanes_step(acc, h, q, k0, c, nc, y, yo, vmull, d, blk, yd, fused, lanes, dj):
        """:func:`_tile_lanes`'s float step of one block — 16 columns as vector IR, else by the definitions."""
        if nc == 16:
            _lanes_step16_ir(acc, np.int64(h), q, np.int64(k0), np.int64(c), y, np.int64(yo), vmull, d,
                             np.int64(blk), F32(yd), fused)
        else:
            lanes_step_def(acc, h, q, k0, c, nc, y, yo, vmull, d, blk, yd, fused, lanes, dj)

    @jit()
    def lane_dots(lanes, q, k0, c, nc, y, yo, vmull):
        """:func:`lane_dots_def` — 16 columns as vector IR, else by the definition."""
        if nc == 16:
            _lane_dots16_ir(lanes, q, np.int64(k0), np.int64(c), y, np.int64(yo), vmull)
        else:
            lane_dots_def(lanes, q, k0, c, nc, y, yo, vmull)
else:
    lane_dots = lane_dots_def

    def lanes_step(acc, h, q, k0, c, nc, y, yo, vmull, d, blk, yd, fused, lanes, dj):
        lanes_step_def(acc, h, q, k0, c, nc, y, yo, vmull, d, blk, yd, fused, lanes, dj)


@jit()
def _tile_lanes(q, d, c, nc, y, yd, recipe, rows, orow, out, oc):
    """The 1-row ``vec_dot`` of Q8_0 / Q4_0 (``arch/arm/quants.c``, :func:`kernels.ggml.mulmat_arm_q._lanes_1row`)
    for columns ``c … c + nc - 1`` of one tile of the pairs layout: blocks in pairs, even blocks into ``sumv0``, odd
    into ``sumv1``, lane by lane ``sumv[l] + float(lane)·(dw·dx)`` (or one FMA), their sum, then an odd last block.
    ``recipe[r]``: that kernel's ``kind`` (0 Q8_0, 1 Q4_0, 7 / 8 their SVE code) + 16·vmull + 32·fused."""
    nb = yd.shape[1]
    lanes = np.empty((4, 16), np.int32)
    w0 = c - c % 16  # the sub-tiles of 16 columns the range meets, each block of all of them in turn (the tile's
    ns = (c + nc - w0 + 15) // 16  # values in address order)
    acc = np.empty((ns, 2, 4, 16), F32)
    dj = np.empty(16, F32)
    for i in range(rows.shape[0]):
        r = rows[i]
        yr = y[r]
        lk, vmull, fused = recipe[r] & 15, (recipe[r] >> 4) & 1 == 1, (recipe[r] >> 5) & 1 == 1
        acc[:] = 0
        ib = 0
        while ib + 1 < nb:
            for h in range(2):
                b = ib + h
                for st in range(ns):
                    cs = max(c, w0 + 16 * st)
                    n = min(c + nc, w0 + 16 * st + 16) - cs
                    lanes_step(acc[st], h, q, 32 * b, cs, n, yr, 32 * b, vmull, d, b, yd[r, b], fused, lanes, dj)
            ib += 2
        for st in range(ns):
            cs = max(c, w0 + 16 * st)
            n = min(c + nc, w0 + 16 * st + 16) - cs
            if ib < nb:  # the odd last block: its whole dot
                lane_dots(lanes, q, 32 * ib, cs, n, yr, 32 * ib, vmull)
            a, s = acc[st, 0], acc[st, 1]
            for j in range(n):
                if lk == 7 or lk == 8:  # SVE: one FADDV of sumv0 + sumv1
                    sumf = F32(F32(F32(a[0, j] + s[0, j]) + F32(a[1, j] + s[1, j]))
                               + F32(F32(a[2, j] + s[2, j]) + F32(a[3, j] + s[3, j])))
                else:
                    sumf = F32(F32(F32(a[0, j] + a[1, j]) + F32(a[2, j] + a[3, j]))
                               + F32(F32(s[0, j] + s[1, j]) + F32(s[2, j] + s[3, j])))
                if ib < nb:
                    dot = F32(lanes[0, j] + lanes[1, j] + lanes[2, j] + lanes[3, j])
                    if lk == 0 or lk == 7:
                        sumf = fma32(dot, F32(d[ib, cs + j] * yd[r, ib]), sumf)
                    else:
                        sumf = fma32(F32(dot * d[ib, cs + j]), yd[r, ib], sumf)
                out[orow[i], oc + cs - c + j] = sumf


@jit()
def _chunk(kind, q, d, dmin, sc, mn, c0, c1, t, y, yd, ys, bs, recipe, rows, orow, out):
    """The outputs of ``[c0, c1)`` in tile ``t`` (``q[t]`` …) into ``out[orow[i], c - c0]``."""
    c = max(c0, TILE * t)
    nc = min(c1, TILE * t + TILE) - c
    if kind == 3:
        _tile_b32(q[t], d[t], c - TILE * t, nc, y, yd, recipe, rows, orow, out, c - c0)
    elif kind == 9:
        _tile_lanes(q[t], d[t], c - TILE * t, nc, y, yd, recipe, rows, orow, out, c - c0)
    elif kind >= 7:
        _tile_b32_1(kind == 7, q[t], d[t], c - TILE * t, nc, y, yd, rows, orow, out, c - c0)
    elif kind >= 4:
        _tile_k1(kind - 4, q[t], d[t], dmin[t], sc[t], mn[t], c - TILE * t, nc, y, yd, ys, bs, rows, orow, out,
                 c - c0)
    else:
        _tile_k(kind, q[t], d[t], dmin[t], sc[t], mn[t], c - TILE * t, nc, y, yd, ys, bs, recipe, rows, orow, out,
                c - c0)


@jit(parallel=True)
def _tiles_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, rows, out):
    """Every tile of ``[c0, c1)``, split between threads (each output is one thread's, computed in one order)."""
    t0 = c0 // TILE
    for i in prange((c1 - 1) // TILE - t0 + 1):
        _chunk(kind, q, d, dmin, sc, mn, c0, c1, t0 + i, y, yd, ys, bs, recipe, rows, rows, out)


@jit()
def _tiles(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, rows, out):
    """:func:`_tiles_parallel` on the calling thread."""
    for t in range(c0 // TILE, (c1 - 1) // TILE + 1):
        _chunk(kind, q, d, dmin, sc, mn, c0, c1, t, y, yd, ys, bs, recipe, rows, rows, out)


@jit()
def _group(kind, q, d, dmin, sc, mn, c0, c1, t, y, yd, ys, bs, recipe, order, bounds, experts, arow, out, g):
    """Tile ``t`` of expert group ``g`` of a ``mul_mat_id``: the group's slots (their activation rows) against its
    expert's columns."""
    orow = order[bounds[g]:bounds[g + 1]]
    rows = np.empty(orow.shape[0], np.int64)
    for i in range(orow.shape[0]):
        rows[i] = arow[orow[i]]
    e = experts[g]
    _chunk(kind, q[e], d[e], dmin[e], sc[e], mn[e], c0, c1, t, y, yd, ys, bs, recipe, rows, orow, out)


@jit(parallel=True)
def _groups_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, order, bounds, experts, arow, out):
    """Every (expert group, tile) of a ``mul_mat_id`` in one parallel region."""
    t0 = c0 // TILE
    nt = (c1 - 1) // TILE - t0 + 1
    for w in prange(experts.shape[0] * nt):
        _group(kind, q, d, dmin, sc, mn, c0, c1, t0 + w % nt, y, yd, ys, bs, recipe, order, bounds, experts, arow,
               out, w // nt)


@jit()
def _groups(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, order, bounds, experts, arow, out):
    """:func:`_groups_parallel` on the calling thread."""
    for g in range(experts.shape[0]):
        for t in range(c0 // TILE, (c1 - 1) // TILE + 1):
            _group(kind, q, d, dmin, sc, mn, c0, c1, t, y, yd, ys, bs, recipe, order, bounds, experts, arow, out, g)


@jit()
def _inputs(kind, x, q8k_fused):
    """The activations ``x`` (R, K) float32 as the AArch64 kernels take them: (y (R, K) int8, yd, ys (R, K/32) int64
    the sums per 32 values, bs (R, K/16) int64 the bsums) — the Q8_K quantizer (``q8k_fused``: GCC's contracted
    ``nearest_int``) for the K-quants, the Q8_0 one (``yd`` (R, K/32); no sums) for the 32-value blocks (``kind`` as
    :data:`KIND`, :data:`PLAIN_KIND`)."""
    R, K = x.shape
    y = np.empty((R, K), np.int8)
    if kind == 3 or kind >= 7:
        yd = np.empty((R, K // 32), F32)
        _quantize_rows_q8_0_arm(x, y, yd, np.empty((R, 0), F32))
        return y, yd, np.empty((R, 0), np.int64), np.empty((R, 0), np.int64)
    yd = np.empty((R, K // 256), F32)
    b16 = np.empty((R, K // 16), np.int16)
    if kind >= 4:  # the plain buffer's from_float: quantize_row_q8_K_ref (the same recipe, libggml-base's code)
        _quantize_rows_q8_k(x, y, yd, b16, q8k_fused)
    else:
        quantize_rows_q8_k_arm(x, y, yd, b16, q8k_fused)
    bs = np.empty((R, K // 16), np.int64)
    ys = np.empty((R, K // 32), np.int64)
    for r in range(R):
        for s in range(K // 32):  # vpaddq_s16 (no int16 wrap: |sum| <= 32·128)
            bs[r, 2 * s], bs[r, 2 * s + 1] = b16[r, 2 * s], b16[r, 2 * s + 1]
            ys[r, s] = bs[r, 2 * s] + bs[r, 2 * s + 1]
    return y, yd, ys, bs


@jit()
def _mul_mat(kind, q, d, dmin, sc, mn, c0, c1, x, q8k_fused, recipe, out):
    y, yd, ys, bs = _inputs(kind, x, q8k_fused)
    rows = np.empty(x.shape[0], np.int64)
    for t in range(x.shape[0]):
        rows[t] = t
    if x.shape[0] * (c1 - c0) * x.shape[1] >= SERIAL_BELOW:
        _tiles_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, rows, out)
    else:
        _tiles(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, rows, out)


@jit()
def _mul_mat_id(kind, q, d, dmin, sc, mn, c0, c1, x, ids, n_x, q8k_fused, recipe, out):
    y, yd, ys, bs = _inputs(kind, x, q8k_fused)
    order, bounds, experts, arow = slot_groups(ids, n_x)
    if ids.size * (c1 - c0) * x.shape[1] >= SERIAL_BELOW:
        _groups_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, order, bounds, experts, arow, out)
    else:
        _groups(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, order, bounds, experts, arow, out)


@per_type
def _kernels(qt, repacked):
    """(mul_mat, mul_mat_id) compiled for one type's kernel (``repacked`` or a plain buffer's): its ``kind`` a
    constant, so each type compiles its own code alone (kernels/base/flags.py, "One compiled copy per weight type")."""
    kind = (KIND if repacked else PLAIN_KIND)[QT(qt)]
    name = "cols_arm" if repacked else "cols_arm_plain"

    @jit(kind=qt, variant=name)
    def mul_mat(q, d, dmin, sc, mn, c0, c1, x, q8k_fused, recipe, out):
        _mul_mat(kind, q, d, dmin, sc, mn, c0, c1, x, q8k_fused, recipe, out)

    @jit(kind=qt, variant=name + "_id")
    def mul_mat_id(q, d, dmin, sc, mn, c0, c1, x, ids, n_x, q8k_fused, recipe, out):
        _mul_mat_id(kind, q, d, dmin, sc, mn, c0, c1, x, ids, n_x, q8k_fused, recipe, out)

    return mul_mat, mul_mat_id


def _recipes(qt: QT, path: str, T: int, g: int, repacked: bool = True) -> np.ndarray:
    """(T,) int64: each activation row's float recipe on the kernels of ``path`` — rows ``t < g`` the gemm's, the rest
    the gemv's (K-quants: :data:`GEMM_GEMV`; 32-value blocks: 1 where :data:`FUSED` says one FMA); a plain buffer's
    1-row kernels: one recipe (none to pass)."""
    if not repacked:  # one recipe: the lanes' kernel (its kind, arm64-base's vmull, fused) or none to pass
        if PLAIN_KIND[qt] != 9:
            return np.zeros(T, np.int64)
        lk = mulmat_arm.BLOCK32_KINDS.get(path, {}).get(qt, 0) or mulmat_arm_q.BLOCK32[qt][1]
        fused = by_clang(path) or lk in (7, 8)
        return np.full(T, lk + 16 * (path in mulmat_arm.BASE_PATHS) + 32 * fused, np.int64)
    kp = KERNELS_OF[path]
    gemm, gemv = GEMM_GEMV[(qt, kp)] if KIND[qt] < 3 else (int(f) for f in FUSED[(qt, kp)])
    return np.where(np.arange(T) < g, gemm, gemv).astype(np.int64)


def _check(cols: Columns, path: str, K: int, repacked: bool) -> int:
    if not covers(cols.qtype, path, repacked):
        where = "repacked" if repacked else "in a plain buffer"
        raise ValueError(f"column layout: {cols.qtype.name} {where} on {path} has no AArch64 kernel here")
    if cols.K != K:
        raise ValueError(f"column layout of K={cols.K} given for activations of K={K}")
    return KIND[cols.qtype] if repacked else PLAIN_KIND[cols.qtype]


def _q8k_fused(path: str, repacked: bool) -> bool:
    """Whether ``path``'s Q8_K quantizer contracts ``nearest_int``'s product (GCC does, clang does not)."""
    return Q8_K_FUSED[KERNELS_OF[path]] if repacked else not by_clang(path)


def mul_mat_cols_arm(cols: Columns, x: np.ndarray, path: str, repacked: bool = True) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` for a dense weight repacked on the AArch64 ``path``, from its column layout (``cols.q``
    (1, …)): ``x`` (T, K) float32 -> (T, n_cols) float32, the gemm on the first ``T - T % 4`` rows and the gemv on the
    rest (``forward_mul_mat``); not ``repacked``: the plain buffer's 1-row ``vec_dot`` for every element (the caller
    knows that no element takes an i8mm 2-row kernel: :func:`kernels.ggml.mulmat_arm.block_mask`)."""
    x = np.ascontiguousarray(x, F32)
    T, K = x.shape
    _check(cols, path, K, repacked)
    if cols.q.shape[0] != 1:
        raise ValueError(f"column layout of E={cols.q.shape[0]} matrices given for one")
    out = np.empty((T, cols.n_cols), F32)
    _kernels(cols.qtype, repacked)[0](cols.q[0], cols.d[0], cols.dmin[0], cols.sc[0], cols.mn[0], cols.c0,
                                      cols.c0 + cols.n_cols, x, _q8k_fused(path, repacked),
                                      _recipes(cols.qtype, path, T, T - T % 4, repacked), out)
    return arm_nans(out)


def mul_mat_id_cols_arm(cols: Columns, x: np.ndarray, ids: np.ndarray, path: str, repacked: bool = True) -> np.ndarray:
    """``ggml_mul_mat_id(W, x, ids)`` for a stack of experts repacked on the AArch64 ``path``, from its column layout
    (``forward_mul_mat_id``: the gemv for every routed row; not ``repacked``: the 1-row ``vec_dot``): ``x`` (T, n_x,
    K) float32, ``ids`` (T, n_used) int32 experts in range (the caller's check) -> (T, n_used, n_cols)."""
    x = np.ascontiguousarray(x, F32)
    T, n_x, K = x.shape
    _check(cols, path, K, repacked)
    out = np.empty((T, ids.shape[1], cols.n_cols), F32)
    _kernels(cols.qtype, repacked)[1](cols.q, cols.d, cols.dmin, cols.sc, cols.mn, cols.c0, cols.c0 + cols.n_cols,
                                      x.reshape(T * n_x, K), np.asarray(ids, np.int32), n_x, _q8k_fused(path, repacked),
                                      _recipes(cols.qtype, path, T * n_x, 0, repacked), out.reshape(T * ids.shape[1], -1))
    return arm_nans(out)


__all__ = ["KIND", "PLAIN_KIND", "covers", "lane_dots", "lane_dots_def", "lanes_step", "lanes_step_def", "mul_mat_cols_arm", "mul_mat_id_cols_arm"]
