"""The quantized ``vec_dot`` kernels of ``arch/arm/quants.c`` (NEON + dotprod, and the i8mm 2-row ones), as GCC 12
compiled them for the ``arm64-dotprod`` / ``arm64-i8mm`` builds, bit for bit — called by :mod:`kernels.ggml.mulmat_arm`.

Every integer below is exact (``sdot`` / ``smmla`` / ``vaddvq_s32`` sums of int8 products: no order changes them);
the float steps are read from the disassembly of both builds (the 1-row kernels compile alike in the two):

* 32-value blocks, Q8_0 activations (:func:`block32_rows`): weight values ``v`` (int8), scales ``dw`` (float32).

  - ``Q8_0``, ``Q4_0`` 1 row: blocks in pairs, even blocks into ``sumv0``, odd into ``sumv1``; lane ``l`` of a
    block is the dot of values ``4l…4l+3`` and ``16+4l…``; ``vmlaq_n_f32`` compiled *unfused*:
    ``sumv[l] = sumv[l] + float(lane)·(dw·dx)``; ``sumf = vaddvq(sumv0) + vaddvq(sumv1)`` (``faddp`` twice:
    ``(l0+l1)+(l2+l3)``); an odd last block ``sumf = fma(float(sumi), dw·dx, sumf)`` (Q8_0) or
    ``fma(float(sumi)·dw, dx, sumf)`` (Q4_0: ``sumi*d_x*d_y``, left to right).
  - ``Q8_0``, ``Q4_0`` 2 rows (i8mm ``vmmlaq_s32``): per element, per block in order,
    ``acc = acc + float(dot32)·(dw·dx)``, each step rounded (``fmul``, ``fadd``).
  - ``MXFP4``, ``IQ4_NL`` (1 row only): blocks in pairs, ``sumf += dA·sA + dB·sB`` (``d = dx·dw``) compiled as
    ``sumf + fma(float(sB), dB, float(sA)·dA)`` for MXFP4 and ``sumf + fma(float(sA), dA, float(sB)·dB)`` for
    IQ4_NL (GCC fused the other product: the same C, read in the disassembly); an odd last block
    ``fma(float(sumi), d, sumf)``.
  - ``Q5_0``: as Q8_0 — except on ``arm64-i8mm``, where GCC's ``usdot`` tail reads the odd last block's values
    ``v - 16`` as unsigned bytes (:data:`I8MM_KIND`). ``Q4_1``, ``Q5_1`` (Q8_1 activations, unsigned values, a min ``m`` per block): the lanes
    as Q8_0, the mins per pair ``summs += fma(m0, s0, m1·s1)`` (Q4_1) or in two sums ``summsN = fma(mN, sN, summsN)``
    (Q5_1), ``sumf = vaddvq(sumv0) + vaddvq(sumv1) + summs (+ summs1)``; an odd last block
    ``sumf + fma(dw·dx, float(sumi), m·s)``. Q4_1's i8mm 2-row kernel: Q8_0's lane plus its own
    ``summs = fma(m, s, summs)`` lane, added at the end.
* K-quants, Q8_K activations (:func:`k_rows`), per 256-value super-block ``b`` with ``d = y.d·fp16(x.d)``,
  ``dmin = y.d·fp16(x.dmin)``, ``sumi`` = Σ sub-block scale × sub-block dot, ``bias`` = Σ min × Q8_K pair sum
  (Q6_K: ``sumi`` with the values ``q - 32``):

  - ``Q4_K`` 1 row: ``sumf = fma(-float(bias), dmin, sumf)`` (``fmsub``), ``sumf = fma(float(sumi), d, sumf)``;
    2 rows: ``acc = (acc - float(bias)·dmin) + float(sumi)·d``, every step rounded.
  - ``Q5_K``: ``sumf = sumf + fma(float(sumi), d, -(float(bias)·dmin))`` (``fnmsub`` then ``fadd``).
  - ``Q6_K`` 1 row: ``sumf = fma(fp16(x.d)·y.d, float(sumi), sumf)``; 2 rows: ``acc = acc + float(sumi)·(fp16(x.d)·y.d)``
    rounded twice.
  - ``IQ4_XS``: ``sumf = fma(fp16(x.d)·y.d, float(sumi), sumf)``.
  - ``Q2_K`` (scale and min per 16): ``sumf = fma(float(bias), -(y.d·fp16(x.dmin)), sumf)``, then
    ``fma(float(sumi), d, sumf)``; ``Q3_K`` (values ``(low2 | hbit << 2) - 4``, scales - 32):
    ``sumf = fma(float(sumi), d, sumf)``.

The SVE build (``arm64-sve128``, ``arm64-sve256``: ``switch (svcntb()*8)`` in each kernel) keeps these integers
and float steps but for Q8_0 / Q4_0's 1-row kernels — at 128 bits 4 lanes fused (``svmla``), one FADDV of ``sumv0 +
sumv1`` (kinds 7, 8); at 256 bits a block fills a vector: 8 lanes of 4 values, fused, one FADDV of 8 (kinds 9, 10:
:func:`_sve256_1row`) — and Q2_K, which keeps 4 or 8 float lanes across the super-blocks (:func:`_q2_k_sve`); its
SVE+MMLA Q4_K / Q6_K 2-row kernels fuse every step (:func:`k_rows`).

The clang build (``clang``: ``arm64-i8mm-clang``) contracts the ``vmlaq_f32`` family: the 1-row lanes
``sumv[l] = fma(float(lane), dw·dx, sumv[l])``, the 2-row ``acc = fma(float(dot32), dw·dx, acc)`` (Q4_1's mins
``summs + m·s`` rounded twice there: its products are stored to ``summs_t[]`` first), Q4_K's 2-row kernel the 1-row
formula and Q6_K's ``acc = fma(float(sumi), d, acc)``; the scalar tails and the other types compile alike.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.base.block import QT
from kernels.base.floats import E8M0_HALF
from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml.mulmat_iq import KIND as IQ_KIND
from kernels.ggml.mulmat_iq import decode_row as iq_decode_row
from kernels.ggml.mulmat_k import decode_row
from kernels.ggml.simd import fma32
from kernels.ggml.sve import faddv
from kernels.ggml.vecmath import F16_TO_F32
from kernels.plain.dequant import IQ4NL_VALUES, MXFP4_VALUES

F32 = np.float32
#: 32-value block types: (block bytes, kernel kind) — kind 0: Q8_0 and Q5_0, 1: Q4_0, 2: MXFP4, 3: IQ4_NL, 4: Q4_1,
#: 5: Q5_1 (4 and 5 take Q8_1 activations); 6: Q5_0 on arm64-i8mm (:data:`I8MM_KIND`); 7, 8: :data:`SVE128_KIND`;
#: 9, 10: :data:`SVE256_KIND`
BLOCK32 = {QT.Q8_0: (34, 0), QT.Q4_0: (18, 1), QT.MXFP4: (17, 2), QT.IQ4_NL: (18, 3), QT.Q5_0: (22, 0),
           QT.Q4_1: (20, 4), QT.Q5_1: (24, 5)}
Q8_1_TYPES = frozenset({QT.Q4_1, QT.Q5_1})
#: the kernel kinds that differ on arm64-i8mm: GCC 12 (-march=armv8.6-a+…+i8mm) vectorizes the scalar tail (odd last
#: block) of ggml_vec_dot_q5_0_q8_0 with USDOT, whose first operand is *unsigned*: the int8 values v - 16 of that
#: block count as (v - 16) mod 256 (a miscompile; qemu's USDOT follows the Arm ARM, checked with inline asm)
I8MM_KIND = {QT.Q5_0: 6}
#: the kinds of ``arm64-sve128`` (SVE at 128 bits, i8mm): Q8_0 and Q4_0's 1-row kernels are SVE code (7, 8: fused
#: lanes, one FADDV of sumv0 + sumv1); Q5_0 has the i8mm build's USDOT tail; the other 32-value types the NEON code
SVE128_KIND = {QT.Q5_0: 6, QT.Q8_0: 7, QT.Q4_0: 8}
#: ``arm64-sve128-clang`` / ``-clang14``: the same SVE kernels; clang vectorizes no USDOT into Q5_0's tail
SVE128_CLANG_KIND = {QT.Q8_0: 7, QT.Q4_0: 8}
#: the kinds of ``arm64-sve256`` (the same GCC build on a 256-bit CPU): Q8_0 and Q4_0's 1-row kernels take their
#: ``case 256`` code (9, 10: 8 fused lanes of 4 values, one FADDV of 8: :func:`_sve256_1row`); Q5_0 the USDOT tail
SVE256_KIND = {QT.Q5_0: 6, QT.Q8_0: 9, QT.Q4_0: 10}
#: K-quant types: kernels.ggml.mulmat_k.decode_row's kind
IQ = IQ_KIND  # IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M: :func:`iq_rows`
#: weight rows a parallel task takes (:func:`block32_rows`)
ROW_TILE = 16
KQUANTS = {QT.Q4_K: 0, QT.Q5_K: 1, QT.Q6_K: 2, QT.IQ4_XS: 3, QT.Q2_K: 4, QT.Q3_K: 5}


def _f16(blk, o):
    return F16_TO_F32[blk[:, :, o] | (blk[:, :, o + 1].astype(np.int64) << 8)]


def decode_block32(w_bytes: np.ndarray, qtype: QT):
    """(N, nb·bytes) uint8 rows of a 32-value type -> (v (N, K) int8 values, dw (N, nb) float32 block scales, mw
    (N, nb) float32 block mins: Q4_1 / Q5_1, else zeros). Value ``j < 16`` is the low nibble of byte ``j``,
    ``16 + j`` its high nibble (with Q5's fifth bit ``j`` / ``16 + j`` of ``qh``)."""
    size = BLOCK32[qtype][0]
    N = w_bytes.shape[0]
    blk = np.ascontiguousarray(w_bytes).reshape(N, -1, size)
    mw = np.zeros(blk.shape[:2], np.float32)
    if qtype == QT.Q8_0:
        return blk[:, :, 2:].view(np.int8).reshape(N, -1), _f16(blk, 0), mw
    if qtype == QT.MXFP4:
        dw, qs, table = E8M0_HALF[blk[:, :, 0]], blk[:, :, 1:], MXFP4_VALUES  # GGML_E8M0_TO_FP32_HALF
    elif qtype == QT.IQ4_NL:
        dw, qs, table = _f16(blk, 0), blk[:, :, 2:], IQ4NL_VALUES.astype(np.int8)
    else:
        dw, qs, table = _f16(blk, 0), blk[:, :, size - 16:], np.arange(16, dtype=np.int8)
    v = np.concatenate([table[qs & 15], table[qs >> 4]], axis=2)  # (N, nb, 32)
    if qtype in (QT.Q5_0, QT.Q5_1):
        o = 2 if qtype == QT.Q5_0 else 4
        qh = blk[:, :, o:o + 4].copy().view("<u4")  # (N, nb, 1)
        v = v | (((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int8) << 4)
    if qtype in (QT.Q4_0, QT.Q5_0):
        v = v - np.int8(8 if qtype == QT.Q4_0 else 16)
    if qtype in Q8_1_TYPES:
        mw = _f16(blk, 2)
    return v.reshape(N, -1), dw.astype(np.float32), mw


@jit()
def _dot32(v, r, xq, t, o, vo=-1):
    """The exact dot of weight values ``v[r, vo:vo + 32]`` (``vo`` -1: ``o``) and activations ``xq[t, o:o + 32]``."""
    vo = o if vo < 0 else vo
    s = 0
    for j in range(32):
        s += np.int64(v[r, vo + j]) * xq[t, o + j]
    return s


@jit()
def _wblock(v, dw, r, b, raw, tab):
    """Block ``b`` of weight row ``r``: (the offset of its 32 values in ``v[r]``, its scale) — decoded rows (``v`` the
    values, ``dw`` the scales), or with ``raw`` Q8_0's stored bytes as int8 (34 a block: the fp16 ``d`` through
    ``tab``, then the values), read in place."""
    if raw:
        o = 34 * b
        return o + 2, tab[(np.int64(v[r, o]) & 255) | ((np.int64(v[r, o + 1]) & 255) << 8)]
    return 32 * b, dw[r, b]


@jit()
def _lanes32_def(w, wo, y, yo, vmull):
    """The 4 int32 lanes of ``ggml_vdotq_s32`` over one 32-value block (``w[wo:wo + 32]``, ``y[yo:yo + 32]``, 1-D
    int8), both 16-byte halves summed: lane ``l`` takes bytes ``4l … 4l+3`` (``sdot``) or, with ``vmull``
    (``arm64-base``: ``vmull_s8`` + ``vpaddlq_s16``), bytes ``2l, 2l+1, 2l+8, 2l+9`` of each half. Exact: |lane| <=
    8·128·128."""
    a0 = np.int32(0)
    a1 = np.int32(0)
    a2 = np.int32(0)
    a3 = np.int32(0)
    for lane in range(4):
        dot = np.int32(0)
        for e in range(4):
            k = 2 * lane + (e & 1) + 8 * (e >> 1) if vmull else 4 * lane + e
            dot += (np.int32(w[wo + k]) * np.int32(y[yo + k])
                    + np.int32(w[wo + k + 16]) * np.int32(y[yo + k + 16]))
        if lane == 0:
            a0 = dot
        elif lane == 1:
            a1 = dot
        elif lane == 2:
            a2 = dot
        else:
            a3 = dot
    return a0, a1, a2, a3


if JIT_ENABLED:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def _lanes32(typingctx, w, wo, y, yo, vmull):
        """:func:`_lanes32_def` as target-independent IR: the 32 products sign-extended to i32, the halves added,
        then each lane's 4 bytes gathered by shuffles (both lane orders, one selected by ``vmull``)."""
        if not (isinstance(w, types.Array) and isinstance(y, types.Array) and w.ndim == y.ndim == 1):
            return None
        sig = types.UniTuple(types.int32, 4)(w, wo, y, yo, vmull)

        def codegen(context, b, signature, args):
            i32 = ir.IntType(32)
            v8, v32 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(i32, 32)

            def load(i):  # 32 bytes from element args[i + 1] of array args[i]
                data = context.make_array(signature.args[i])(context, b, args[i]).data
                return b.sext(b.load(b.bitcast(b.gep(data, [args[i + 1]]), v8.as_pointer()), align=1), v32)

            def pick(vec, idx):
                return b.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(i32, len(idx)), idx))

            p = b.mul(load(0), load(2))
            h = b.add(pick(p, list(range(16))), pick(p, list(range(16, 32))))  # (16,): the two halves summed
            sdot = [pick(h, [4 * l + e for l in range(4)]) for e in range(4)]
            vmul = [pick(h, [2 * l + (e & 1) + 8 * (e >> 1) for l in range(4)]) for e in range(4)]
            lanes_s = b.add(b.add(sdot[0], sdot[1]), b.add(sdot[2], sdot[3]))
            lanes_v = b.add(b.add(vmul[0], vmul[1]), b.add(vmul[2], vmul[3]))
            flag = context.cast(b, args[4], signature.args[4], types.boolean)
            lanes = b.select(b.trunc(flag, ir.IntType(1)) if flag.type != ir.IntType(1) else flag, lanes_v, lanes_s)
            vals = [b.extract_element(lanes, ir.Constant(i32, l)) for l in range(4)]
            return context.make_tuple(b, signature.return_type, vals)

        return sig, codegen
else:
    _lanes32 = _lanes32_def


@jit()
def _lanes_1row(kind, v, dw, mw, r, xq, xd, xs, t, vmull, fused, raw, tab):
    """One element of the 1-row ``vec_dot`` of the lane kernels (module docstring: Q8_0, Q4_0, Q5_0, Q4_1, Q5_1 —
    kinds 0, 1, 4–8): blocks in pairs, each block's 4 ``ggml_vdotq_s32`` lanes (:func:`_lanes32`; ``vmull``: the
    ``arm64-base`` order) into ``sumv0`` (even blocks) or ``sumv1`` (odd), lane by lane ``sumv + float(lane)·d``
    rounded twice or (``fused``: clang's ``vmlaq_n_f32``, SVE's ``svmla``) once, Q4_1's / Q5_1's mins beside; the
    lanes' sums, then an odd last block. ``raw``, ``tab``: :func:`_wblock`."""
    nb = xd.shape[1]
    vr, xr = v[r], xq[t]
    a0, a1, a2, a3 = F32(0.0), F32(0.0), F32(0.0), F32(0.0)  # sumv0
    b0, b1, b2, b3 = F32(0.0), F32(0.0), F32(0.0), F32(0.0)  # sumv1
    summs, summs1 = F32(0.0), F32(0.0)
    ib = 0
    while ib + 1 < nb:
        if kind == 4:  # Q4_1: summs += m0·s0 + m1·s1, the first product fused
            summs = F32(summs + fma32(mw[r, ib], xs[t, ib], F32(mw[r, ib + 1] * xs[t, ib + 1])))
        elif kind == 5:  # Q5_1: summs0 += m0·s0, summs1 += m1·s1 (fused)
            summs = fma32(mw[r, ib], xs[t, ib], summs)
            summs1 = fma32(mw[r, ib + 1], xs[t, ib + 1], summs1)
        vo, dwb = _wblock(v, dw, r, ib, raw, tab)
        d = F32(dwb * xd[t, ib])
        l0, l1, l2, l3 = _lanes32(vr, np.int64(vo), xr, np.int64(32 * ib), vmull)
        if fused:
            a0, a1, a2, a3 = fma32(F32(l0), d, a0), fma32(F32(l1), d, a1), fma32(F32(l2), d, a2), fma32(F32(l3), d, a3)
        else:
            a0, a1 = F32(a0 + F32(F32(l0) * d)), F32(a1 + F32(F32(l1) * d))
            a2, a3 = F32(a2 + F32(F32(l2) * d)), F32(a3 + F32(F32(l3) * d))
        vo, dwb = _wblock(v, dw, r, ib + 1, raw, tab)
        d = F32(dwb * xd[t, ib + 1])
        l0, l1, l2, l3 = _lanes32(vr, np.int64(vo), xr, np.int64(32 * ib + 32), vmull)
        if fused:
            b0, b1, b2, b3 = fma32(F32(l0), d, b0), fma32(F32(l1), d, b1), fma32(F32(l2), d, b2), fma32(F32(l3), d, b3)
        else:
            b0, b1 = F32(b0 + F32(F32(l0) * d)), F32(b1 + F32(F32(l1) * d))
            b2, b3 = F32(b2 + F32(F32(l2) * d)), F32(b3 + F32(F32(l3) * d))
        ib += 2
    if kind == 7 or kind == 8:  # SVE: one FADDV of sumv0 + sumv1
        sumf = F32(F32(F32(a0 + b0) + F32(a1 + b1)) + F32(F32(a2 + b2) + F32(a3 + b3)))
    else:
        sumf = F32(F32(F32(a0 + a1) + F32(a2 + a3)) + F32(F32(b0 + b1) + F32(b2 + b3)))
    if kind == 4 or kind == 5:
        sumf = F32(sumf + summs)
        if kind == 5:
            sumf = F32(sumf + summs1)
    return _last_block(kind, v, dw, mw, r, xq, xd, xs, t, raw, tab, ib, sumf)


@jit()
def _last_block(kind, v, dw, mw, r, xq, xd, xs, t, raw, tab, ib, sumf):
    """The scalar loop after the pairs (``ib``: the first block it takes, the odd last one or none), added to
    ``sumf``: each block's exact dot, then the C's ``sumf += …`` as GCC compiled it (module docstring)."""
    for b in range(ib, xd.shape[1]):
        vo, dwb = _wblock(v, dw, r, b, raw, tab)
        if kind == 6:  # Q5_0 on arm64-i8mm: GCC's USDOT reads the values v - 16 as unsigned bytes
            dot = 0
            for j in range(32):
                dot += (np.int64(v[r, vo + j]) & 255) * xq[t, 32 * b + j]
            sumf = fma32(F32(dot), F32(dwb * xd[t, b]), sumf)
        elif kind == 0 or kind == 7 or kind == 9:  # Q8_0: sumi*(d_x*d_y)
            sumf = fma32(F32(_dot32(v, r, xq, t, 32 * b, vo)), F32(dwb * xd[t, b]), sumf)
        elif kind == 1 or kind == 8 or kind == 10:  # Q4_0: sumi*d_x*d_y, left to right
            sumf = fma32(F32(F32(_dot32(v, r, xq, t, 32 * b, vo)) * dwb), xd[t, b], sumf)
        else:  # Q4_1, Q5_1: sumf += (d_w·d_x)·sumi + m·s, the first product fused
            sumi = F32(_dot32(v, r, xq, t, 32 * b, vo))
            sumf = F32(sumf + fma32(F32(dwb * xd[t, b]), sumi, F32(mw[r, b] * xs[t, b])))
    return sumf


@jit()
def _sve256_1row(kind, v, dw, r, xq, xd, t, raw, tab, acc):
    """One element of Q8_0's (``kind`` 9) or Q4_0's (10) SVE 1-row ``vec_dot`` at a 256-bit vector length
    (``quants.c``'s ``case 256``): a block's 32 values fill one vector — Q8_0's bytes as stored, Q4_0's
    ``svld1rq_u8`` copy of its 16 bytes, low nibbles in the first 16 lanes and high nibbles in the last (the
    decoded order) — and ``svdot_s32`` makes 8 int32 lanes, lane ``l`` the dot of values ``4l … 4l+3``. Blocks in
    pairs, even blocks into ``sumv0``, odd into ``sumv1``, each lane ``svmla_n_f32_x``: ``fma(float(lane),
    dw·dx, sumv[l])``; then ``svaddv_f32(svadd(sumv0, sumv1))`` — FADDV's pairwise tree over 8 lanes,
    ``((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7))`` — and the odd last block as at 128 bits (:func:`_last_block`: the
    scalar loop is outside the ``switch``). ``acc`` (2, 8) float32 scratch; ``raw``, ``tab``: :func:`_wblock`."""
    nb = xd.shape[1]
    acc[:] = F32(0.0)
    ib = 0
    while ib + 1 < nb:
        for h in range(2):
            vo, dwb = _wblock(v, dw, r, ib + h, raw, tab)
            d = F32(dwb * xd[t, ib + h])
            xo = 32 * (ib + h)
            for lane in range(8):
                dot = np.int32(0)
                for e in range(4 * lane, 4 * lane + 4):
                    dot += np.int32(v[r, vo + e]) * np.int32(xq[t, xo + e])
                acc[h, lane] = fma32(F32(dot), d, acc[h, lane])
        ib += 2
    for lane in range(8):  # svadd(sumv0, sumv1)
        acc[0, lane] = F32(acc[0, lane] + acc[1, lane])
    sumf = faddv(acc[0], 0, 8)
    return _last_block(kind, v, dw, dw, r, xq, xd, xd, t, raw, tab, ib, sumf)  # (mw, xs: unused by Q8_0 / Q4_0)


@jit()
def _pairs_1row(kind, v, dw, r, xq, xd, t):
    """One element of the 1-row ``vec_dot`` of MXFP4 (``kind`` 2) or IQ4_NL (3), blocks in pairs: ``sumf += dA·sA +
    dB·sB`` (``d = dx·dw``), one product rounded and the other fused (module docstring); an odd last block
    ``fma(float(sumi), d, sumf)``."""
    nb = dw.shape[1]
    sumf = F32(0.0)
    ib = 0
    while ib + 1 < nb:
        da, db = F32(xd[t, ib] * dw[r, ib]), F32(xd[t, ib + 1] * dw[r, ib + 1])
        sa, sb = F32(_dot32(v, r, xq, t, 32 * ib)), F32(_dot32(v, r, xq, t, 32 * ib + 32))
        if kind == 2:
            sumf = F32(sumf + fma32(sb, db, F32(sa * da)))
        else:
            sumf = F32(sumf + fma32(sa, da, F32(sb * db)))
        ib += 2
    for b in range(ib, nb):
        sumf = fma32(F32(_dot32(v, r, xq, t, 32 * b)), F32(xd[t, b] * dw[r, b]), sumf)
    return sumf


@jit()
def _block32_2row(kind, v, dw, mw, r, xq, xd, xs, t, clang, raw, tab):
    """One of the four elements of the i8mm 2-row Q8_0 / Q4_0 / Q4_1 ``vec_dot`` (Q4_1: the mins in their own lane,
    ``summs = fma(m, s, summs)`` (``fmla``), added at the end). ``clang``: ``vmlaq_f32`` one ``fmla``; Q4_1's
    ``summs_t[]`` products rounded before their ``vaddq_f32`` (``=on`` does not contract across statements)."""
    acc = F32(0.0)
    summs = F32(0.0)
    for b in range(xd.shape[1]):
        vo, dwb = _wblock(v, dw, r, b, raw, tab)
        dot, d = F32(_dot32(v, r, xq, t, 32 * b, vo)), F32(dwb * xd[t, b])
        acc = fma32(dot, d, acc) if clang else F32(acc + F32(dot * d))
        if kind == 4:
            summs = F32(summs + F32(mw[r, b] * xs[t, b])) if clang else fma32(mw[r, b], xs[t, b], summs)
    return F32(acc + summs) if kind == 4 else acc


@jit(parallel=True)
def block32_rows(kind, v, dw, mw, xq, xd, xs, out, two, vmull=False, clang=False, raw=False, tab=F16_TO_F32):
    """``out[t, r]`` for decoded 32-value weight rows (:func:`decode_block32`) and Q8_0 / Q8_1 activations ``xq``
    (T, K) int8, ``xd`` (T, nb), ``xs`` (T, nb) Q8_1's s (or anything: unused); ``two`` (T, N) bool: the elements of
    2-row kernels (or (0, 0): none); ``vmull``: the lanes of ``arm64-base`` (:func:`_lanes_1row`); ``clang``: the
    ``arm64-i8mm-clang`` build's contractions; ``raw``: ``v`` Q8_0's stored rows as int8, read in place (``dw``
    unused; :func:`_wblock`). Every element is computed alone: the weight rows split between threads change no bit."""
    has_two = two.shape[0] > 0
    fused = clang or kind == 7 or kind == 8  # the lanes' multiply-accumulate: clang's fmla, SVE's svmla
    for tile in prange((v.shape[0] + ROW_TILE - 1) // ROW_TILE):  # independent elements: ROW_TILE weight rows a task
        acc = np.empty((2, 8), F32)  # _sve256_1row's sumv0, sumv1
        for r in range(tile * ROW_TILE, min(tile * ROW_TILE + ROW_TILE, v.shape[0])):
            for t in range(xq.shape[0]):
                if has_two and two[t, r]:
                    out[t, r] = _block32_2row(kind, v, dw, mw, r, xq, xd, xs, t, clang, raw, tab)
                elif kind == 2 or kind == 3:  # MXFP4, IQ4_NL
                    out[t, r] = _pairs_1row(kind, v, dw, r, xq, xd, t)
                elif kind == 9 or kind == 10:  # Q8_0, Q4_0 at 256 bits: 8 SVE lanes
                    out[t, r] = _sve256_1row(kind, v, dw, r, xq, xd, t, raw, tab, acc)
                else:
                    out[t, r] = _lanes_1row(kind, v, dw, mw, r, xq, xd, xs, t, vmull, fused, raw, tab)


@jit()
def _k_ints(kind, q, sc, mn, yq, ybs, t, b):
    """(sumi, bias) of super-block ``b`` for decoded weights (``mulmat_k.decode_row``) and Q8_K row ``t``."""
    sumi = 0
    bias = 0
    o = 256 * b
    if kind == 2 or kind >= 4:  # Q6_K (values q - 32), Q2_K, Q3_K: 16 sub-blocks of 16
        off = 32 if kind == 2 else 0
        for j in range(16):
            dot = 0
            for l in range(16):
                dot += (np.int64(q[o + 16 * j + l]) - off) * yq[t, o + 16 * j + l]
            sumi += np.int64(sc[16 * b + j]) * dot
            if kind == 4:
                bias += np.int64(mn[16 * b + j]) * ybs[t, 16 * b + j]
        return sumi, bias
    for j in range(8):
        dot = 0
        for l in range(32):
            dot += np.int64(q[o + 32 * j + l]) * yq[t, o + 32 * j + l]
        sumi += np.int64(sc[8 * b + j]) * dot
        if kind <= 1:
            bias += np.int64(mn[8 * b + j]) * (ybs[t, 16 * b + 2 * j] + ybs[t, 16 * b + 2 * j + 1])
    return sumi, bias


@jit()
def _q2_k_sve(q, sc, mn, d, dmin, yq, yd, ybs, t, L):
    """``ggml_vec_dot_q2_K_q8_K``'s SVE code in ``L`` float lanes: 4 (``case 128``) or 8 (``case 256``), lanes
    across the super-blocks, then FADDV (pairwise: ``(l0+l1)+(l2+l3)``, of 8 ``((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))``).
    Per super-block, lane ``l`` first takes the mins of sub-blocks ``s ≡ l (mod L)`` (``acc = fma(float(Σ m·bsum),
    -(y.d·dmin), acc)``), then ``svdot_s32``'s bytes ``4(l % 4) … 4(l % 4)+3`` of every 16-value sub-block ``s`` with
    ``s ≡ l // 4 (mod L/4)`` times its scale (at 128 bits a vector is one sub-block; at 256, two: the first 4 lanes
    the even one, the last 4 the odd, ``svsel`` of their scales): ``acc = fma(float(sumi), y.d·d, acc)``."""
    acc = np.zeros(L, np.float32)
    per = L // 4  # sub-blocks a vector holds
    for b in range(d.shape[0]):
        dm = -F32(yd[t, b] * dmin[b])
        db = F32(yd[t, b] * d[b])
        for lane in range(L):
            bias = 0
            for s in range(16 * b + lane, 16 * b + 16, L):
                bias += np.int64(mn[s]) * ybs[t, s]
            acc[lane] = fma32(F32(bias), dm, acc[lane])
        for lane in range(L):
            sumi = 0
            for s in range(16 * b + lane // 4, 16 * b + 16, per):
                dot = 0
                for e in range(4):
                    k = 16 * s + 4 * (lane % 4) + e
                    dot += np.int64(q[k]) * yq[t, k]
                sumi += np.int64(sc[s]) * dot
            acc[lane] = fma32(F32(sumi), db, acc[lane])
    return faddv(acc, 0, L)


@jit()
def k_rows(kind, w, yq, yd, ybs, out, two, tab, sve=0, clang=False, odd_hi3=False):
    """``out[t, r]`` for K-quant rows ``w`` (N, row bytes) and Q8_K activations (``yq`` (T, K) int8, ``yd``
    (T, K/256), ``ybs`` (T, K/16) int64 bsums); ``two`` as in :func:`block32_rows` (Q4_K, Q6_K); ``sve``: the SVE
    build's vector length in bits (0: not SVE), whose SVE 1-row kernels round as the NEON ones (their integers are
    the same) and whose SVE+MMLA 2-row kernels fuse every step — at 128 and 256 bits alike (``case 256`` of Q3_K,
    Q4_K and Q6_K, 1-row and 2-row, forms the same exact integers in wider vectors and meets the floats with the same
    operations) — but Q2_K keeps float lanes, 4 or 8 (:func:`_q2_k_sve`); ``clang``: the ``arm64-i8mm-clang``
    build, whose NEON 2-row kernels' ``vmlsq_f32`` / ``vmlaq_f32`` are one ``fmls`` / ``fmla`` each (the 1-row
    formulas); ``odd_hi3``: the SVE build
    compiled by clang 14 to 16 (``arm64-sve128-clang14``), whose Q6_K 1-row kernel (case 128) forms the high bits with
    ``svand_u8_x(pg16_8, mone, …)`` — a 16-bit predicate on bytes, the odd bytes inactive — as a merging ``and z,
    p/m`` on a copy of ``mone``: every odd code's high bits read 0x30 (``(q & 15) | 48``; its ``isum_mins`` is the
    true one)."""
    K = yq.shape[1]
    nsb = K // 256
    q = np.empty(K, np.int32)
    sc = np.empty(K // 16, np.int32)
    mn = np.zeros(K // 16, np.int32)
    d = np.empty(nsb, np.float32)
    dmin = np.zeros(nsb, np.float32)
    has_two = two.shape[0] > 0
    odd_hi3 = odd_hi3 and kind == 2  # arm64-sve128-clang14's Q6_K 1-row kernel
    q1 = np.empty(K if odd_hi3 else 0, np.int32)  # its codes
    for r in range(w.shape[0]):
        decode_row(kind, w[r], q, sc, mn, d, dmin, tab)
        if odd_hi3:
            for k in range(K):
                q1[k] = (q[k] & 15) | 48 if k & 1 else q[k]  # lane k % 16 of a 16-byte vector: odd bytes inactive
        for t in range(yq.shape[0]):
            if sve and kind == 4:
                out[t, r] = _q2_k_sve(q, sc, mn, d, dmin, yq, yd, ybs, t, sve // 32)
                continue
            pair = has_two and two[t, r]
            acc = F32(0.0)
            for b in range(nsb):
                sumi, bias = _k_ints(kind, q1 if odd_hi3 and not pair else q, sc, mn, yq, ybs, t, b)
                if kind == 0:  # Q4_K
                    db, dm = F32(yd[t, b] * d[b]), F32(yd[t, b] * dmin[b])
                    if pair and sve:  # SVE+MMLA: svmla(svmla(acc, sumi, d), -dmin, bias), both fused
                        acc = fma32(F32(bias), -dm, fma32(F32(sumi), db, acc))
                    elif pair and not clang:
                        acc = F32(F32(acc - F32(F32(bias) * dm)) + F32(F32(sumi) * db))
                    else:
                        acc = fma32(-F32(bias), dm, acc)
                        acc = fma32(F32(sumi), db, acc)
                elif kind == 1:  # Q5_K
                    db, dm = F32(yd[t, b] * d[b]), F32(yd[t, b] * dmin[b])
                    acc = F32(acc + fma32(F32(sumi), db, -F32(F32(bias) * dm)))
                elif kind == 4:  # Q2_K: dmin = -(y.d·fp16(x.dmin)) (fnmul)
                    acc = fma32(F32(bias), -F32(yd[t, b] * dmin[b]), acc)
                    acc = fma32(F32(sumi), F32(yd[t, b] * d[b]), acc)
                elif kind == 5:  # Q3_K
                    acc = fma32(F32(sumi), F32(yd[t, b] * d[b]), acc)
                else:  # Q6_K, IQ4_XS
                    db = F32(d[b] * yd[t, b])
                    if pair and (sve or clang):  # SVE+MMLA Q6_K: one svmla; clang's vmlaq_f32: one fmla
                        acc = fma32(F32(sumi), db, acc)
                    elif pair:
                        acc = F32(acc + F32(F32(sumi) * db))
                    else:
                        acc = fma32(db, F32(sumi), acc)
            out[t, r] = acc


@jit()
def iq_rows(kind, w, yq, yd, ybs, out, tab):
    """``ggml_vec_dot_iq*_q8_K`` (NEON) for every element: ``w`` (N, row bytes) of an IQ1/2/3 type
    (:data:`kernels.ggml.mulmat_iq.KIND`), Q8_K activations ``yq`` (T, K), ``yd`` (T, K/256), ``ybs`` bsums ->
    ``out`` (T, N). Per super-block, ``d = fp16(x.d)·y.d``:

    * IQ2_XXS, IQ3_XXS: two float sums over the 32-value groups (even / odd), ``sumfN = fma(float(dot32),
      ls + 0.5, sumfN)``, then ``sumf = fma(sumf1 + sumf2, d, sumf)``; ``*s = 0.25·sumf`` / ``0.5·sumf``.
    * IQ2_XS, IQ2_S (×0.125 at the end), IQ3_S: ``sumf = fma(float(Σ sc·dot16), d, sumf)``.
    * IQ1_S, IQ1_M: ``sumf = fma(y.d·fp16(x.d), fma(float(sumi_delta), 0.125, float(sumi)), sumf)``."""
    K = yq.shape[1]
    nb = K // 256
    v, e = np.empty(K, np.int64), np.zeros(K, np.int64)
    sc, d = np.empty(K // 16, np.int64), np.empty(nb, np.float32)
    for r in range(w.shape[0]):
        iq_decode_row(kind, w[r], v, e, sc, d, tab)
        for t in range(yq.shape[0]):
            sumf = F32(0.0)
            for b in range(nb):
                db = F32(d[b] * yd[t, b])
                if kind == 0 or kind == 3:
                    f1, f2 = F32(0.0), F32(0.0)
                    for g in range(8 * b, 8 * b + 8):
                        p = 0
                        for k in range(32 * g, 32 * g + 32):
                            p += v[k] * np.int64(yq[t, k])
                        half = F32(F32(sc[2 * g]) * F32(0.5))  # 0.5f + ls, exact
                        if g % 2 == 0:
                            f1 = fma32(F32(p), half, f1)
                        else:
                            f2 = fma32(F32(p), half, f2)
                    sumf = fma32(F32(f1 + f2), db, sumf)
                    continue
                sumi, sumi2 = 0, 0
                for s in range(16 * b, 16 * b + 16):
                    p, p2 = 0, 0
                    for k in range(16 * s, 16 * s + 16):
                        p += v[k] * np.int64(yq[t, k])
                        p2 += e[k] * np.int64(yq[t, k])
                    sumi += sc[s] * p
                    sumi2 += sc[s] * p2
                if kind >= 5:  # IQ1_S (sumi3 from the bsums: the same integer), IQ1_M
                    sumf = fma32(F32(yd[t, b] * d[b]), fma32(F32(sumi2), F32(0.125), F32(sumi)), sumf)
                else:
                    sumf = fma32(F32(sumi), db, sumf)
            if kind == 0:
                sumf = F32(sumf * F32(0.25))
            elif kind == 3:
                sumf = F32(sumf * F32(0.5))
            elif kind <= 2:
                sumf = F32(sumf * F32(0.125))
            out[t, r] = sumf
