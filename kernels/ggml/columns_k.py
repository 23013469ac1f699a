"""The column layout's K-quant kernels: Q4_K, Q5_K and Q6_K weights in a plain CPU buffer (not repacked — Q5_K and
Q6_K never are; Q4_K with llama.cpp's ``-nr``, or rows not a multiple of 8), through the formulas of
:mod:`kernels.ggml.mulmat_k`, output element by output element, with the weights laid out by
:func:`kernels.ggml.columns.layout`:

* ``T < 8`` rows (``vec_dot``, ``arch/x86/quants.c``'s ``__AVX2__`` branch in both builds): per super-block the
  integer dot in ggml's 8 int32 lanes — lane ``l`` sums values ``32g + 4l … 32g + 4l + 3`` of the 8 32-value
  groups ``g``, each 4 times its sub-block scale (:func:`klanes`) —; Q6_K's lane ``l`` less ``32·(bsums[2l]·sc[2l] +
  bsums[2l+1]·sc[2l+1])``; ``acc[l] = fma(y.d·d, float(sumi[l]), acc[l])``; the mins (Q4_K: 4 float lanes, Q5_K one
  scalar), ``hsum_float_8(acc)`` and the mins added last.
* ``T >= 8`` rows (the tiled kernel): per super-block ``s1`` (the lanes' total: the same integer as ``Σ sc·(q - 32)·y``
  for Q6_K) and ``s2 = Σ mn·Σy``, ``res = fma(-dmin, float(s2), d·float(s1))``, ``acc = fma(res, y.d, acc)``.

The layout holds the codes as ggml's integer dot takes them (Q4_K 0…15, Q5_K 0…31, Q6_K 0…63, value pairs side by
side: :func:`kernels.ggml.simd.cols_dot16`), the 6-bit scales and mins (Q6_K: its int8 scale bytes, one per 16
values), ``d`` and ``dmin`` as float32. Integers are exact, so only which integers meet which float operation
matters; that is kept element by element.
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml.mulmat_k import decode_row
from kernels.ggml.simd import fma32

F32 = np.float32
#: :mod:`kernels.ggml.columns` kind of the K-quant formulas here (``kind - 3`` is ``mulmat_k.KIND``'s type code)
KQ_KIND = {"Q4_K": 3, "Q5_K": 4, "Q6_K": 5}


@jit()
def lay_k(kind, w, q, d, dmin, sc, mn, tab):
    """Q4_K / Q5_K / Q6_K rows (``kind`` as ``mulmat_k.KIND``) -> ``q`` (K/2, 2N) the codes, ``d`` / ``dmin``
    (K/256, N), ``sc`` / ``mn`` (K/32 or K/16, N), through :func:`kernels.ggml.mulmat_k.decode_row`."""
    K = 2 * q.shape[0]
    qr, scr, mnr = np.empty(K, np.int32), np.empty(sc.shape[0], np.int32), np.zeros(sc.shape[0], np.int32)
    dr, dminr = np.empty(d.shape[0], F32), np.zeros(d.shape[0], F32)
    for c in range(w.shape[0]):
        decode_row(kind, w[c], qr, scr, mnr, dr, dminr, tab)
        for k in range(K):
            q[k // 2, 2 * c + k % 2] = qr[k]
        for s in range(sc.shape[0]):
            sc[s, c] = np.uint8(scr[s] & 255)  # Q6_K: the int8 scale's byte
        for s in range(mn.shape[0]):
            mn[s, c] = mnr[s]
        for b in range(d.shape[0]):
            d[b, c] = dr[b]
        for b in range(dmin.shape[0]):
            dmin[b, c] = dminr[b]


@jit()
def _s8(u):
    """A stored uint8 scale byte as the int8 it holds (Q6_K)."""
    v = np.int32(u)
    return v - 256 * (v >> 7)


@jit()
def _klanes_def(v, oj, nj, q, blk, c, y, sc, kind):
    """``v[l, oj + j]`` = lane ``l`` of super-block ``blk``'s integer dot for column ``c + j`` (``j < nj``): the sum over
    the 8 groups ``g`` of ``scale · Σ_{i<4} w(256·blk + 32g + 4l + i) · y[…]``; the scale is the sub-block's (a scale
    per 32 values, per 16 for Q6_K, ``kind`` 5), its byte read as an int8 (Q6_K's scales are; the 6-bit scales of
    Q4_K and Q5_K are below 64, the same either way). The definition; the vector path's tail."""
    for j in range(nj):
        cj = c + j
        for lane in range(8):
            s = np.int64(0)
            for g in range(8):
                k0 = 256 * blk + 32 * g + 4 * lane
                dot = np.int64(0)
                for i in range(4):
                    k = k0 + i
                    dot += np.int64(q[k // 2, 2 * cj + k % 2]) * np.int64(y[k])
                srow = 16 * blk + 2 * g + lane // 4 if kind == 5 else 8 * blk + g
                s += np.int64(_s8(sc[srow, cj])) * dot
            v[lane, oj + j] = s


if JIT_ENABLED:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from kernels.ggml.simd import _is, _pair_dot16

    @intrinsic
    def _klanes_group16(typingctx, v, oj, q, k0, c, y, sc, s_lo, s_hi):
        """One 32-value group (values ``k0 … k0 + 31``) of :func:`_klanes_def` for 16 columns as vector IR:
        ``v[l, oj + j] += scale · Σ_{i<4} w(k0 + 4l + i, c + j)·y[k0 + 4l + i]``, the 8 lanes' 4-value dots
        (:func:`kernels.ggml.simd._pair_dot16` of two pairs) times the 16 columns' scale bytes of row ``s_lo`` (lanes
        0–3) or ``s_hi`` (lanes 4–7), sign-extended (Q6_K's are int8; the 6-bit scales are below 128, the same
        either way)."""
        if not (_is(v, types.int32, 2) and _is(q, types.int8, 2) and _is(y, types.int16, 1) and _is(sc, types.uint8, 2)):
            return None
        sig = types.void(v, types.int64, q, types.int64, types.int64, y, sc, types.int64, types.int64)

        def codegen(context, bld, signature, args):
            i64, v16 = ir.IntType(64), ir.VectorType(ir.IntType(32), 16)
            ts = signature.args
            v_a, q_a, y_a, sc_a = (context.make_array(ts[i])(context, bld, args[i]) for i in (0, 2, 5, 6))
            oj, k0, c = args[1], args[3], args[4]
            scales = []
            for s in (args[7], args[8]):
                ps = cgutils.get_item_pointer(context, bld, ts[6], sc_a, [s, c])
                scales.append(bld.sext(bld.load(bld.bitcast(ps, ir.VectorType(ir.IntType(8), 16).as_pointer()), align=1), v16))
            for lane in range(8):
                kl = bld.add(k0, ir.Constant(i64, 4 * lane))
                dot = _pair_dot16(context, bld, ts[2], q_a, kl, c, ts[5], y_a, kl, npairs=2)
                pv = bld.bitcast(cgutils.get_item_pointer(context, bld, ts[0], v_a, [ir.Constant(i64, lane), oj]),
                                 v16.as_pointer())
                bld.store(bld.add(bld.load(pv, align=4), bld.mul(scales[lane // 4], dot)), pv, align=4)
            return context.get_dummy_value()

        return sig, codegen

    @jit()
    def klanes(v, q, blk, c, nc, y, sc, kind):
        """:func:`_klanes_def` for columns ``c … c + nc - 1`` into ``v[:, :nc]``: 16 columns at a time as vector IR,
        a group at a time (:func:`_klanes_group16`), the rest by the definition (``v`` int32 (8, ≥ nc), ``q`` int8
        (K/2, 2·TILE), ``y`` int16 (K,), ``sc`` uint8)."""
        j = 0
        while j + 16 <= nc:
            v[:, j:j + 16] = 0
            for g in range(8):
                if kind == 5:  # Q6_K: a scale per 16 values
                    s_lo, s_hi = 16 * blk + 2 * g, 16 * blk + 2 * g + 1
                else:
                    s_lo = s_hi = 8 * blk + g
                _klanes_group16(v, np.int64(j), q, np.int64(256 * blk + 32 * g), np.int64(c + j), y, sc,
                                np.int64(s_lo), np.int64(s_hi))
            j += 16
        if j < nc:
            _klanes_def(v, j, nc - j, q, blk, c + j, y, sc, kind)

else:

    def klanes(v, q, blk, c, nc, y, sc, kind):
        _klanes_def(v, 0, nc, q, blk, c, y, sc, kind)


@jit()
def tile_k(kind, q, d, dmin, sc, mn, c, nc, y, yd, ys, tiled, rows, orow, out, oc):
    """Columns ``c … c + nc - 1`` of one tile (``q`` (K/2, 2·TILE), ``d`` / ``dmin`` (K/256, TILE), ``sc`` / ``mn``
    (K/32 or K/16, TILE)) against the Q8_K activation rows ``rows`` (``y`` (R, K) int16, ``yd`` (R, K/256), ``ys`` the
    sums per 32 values (Q4_K, Q5_K) or per 16, the bsums (Q6_K)) into ``out[orow[i], oc + j]``; ``tiled[r]``: row
    ``r`` takes the tiled kernel's formula, else vec_dot's (module docstring). ``kind`` 3/4/5: Q4_K/Q5_K/Q6_K."""
    kk = kind - 3  # mulmat_k.KIND: 0 Q4_K, 1 Q5_K, 2 Q6_K
    v = np.empty((8, 64), np.int32)  # a super-block's 8 integer lanes per column (TILE = 64 columns at most)
    acc = np.empty((8, 64), F32)
    accm = np.empty((4, 64), F32)
    db = np.empty(64, F32)
    for i in range(rows.shape[0]):
        r = rows[i]
        yr = y[r]
        if tiled[r]:
            acc[0, :nc] = 0
            for b in range(yd.shape[1]):
                klanes(v, q, b, c, nc, yr, sc, kind)
                for j in range(nc):
                    s1 = np.int64(0)  # Σ_s scale_s·(Σ w·q8), w the signed value: exact, in any order
                    for lane in range(8):
                        s1 += np.int64(v[lane, j])
                    if kk == 2:
                        for s in range(16 * b, 16 * b + 16):
                            s1 -= 32 * np.int64(_s8(sc[s, c + j])) * ys[r, s]
                    res = d[b, c + j] * F32(s1)  # _mm*_mul_ps(cvtepi32_ps(s1), d0)
                    if kk <= 1:
                        s2 = np.int64(0)
                        for s in range(8 * b, 8 * b + 8):
                            s2 += np.int64(mn[s, c + j]) * ys[r, s]
                        res = fma32(-dmin[b, c + j], F32(s2), res)  # _mm*_fnmadd_ps(dmin, s2, res)
                    acc[0, j] = fma32(res, yd[r, b], acc[0, j])  # buf += res * d1 (FMA)
            for j in range(nc):
                out[orow[i], oc + j] = acc[0, j]
            continue
        acc[:, :nc] = 0
        accm[:, :nc] = 0
        for b in range(yd.shape[1]):
            klanes(v, q, b, c, nc, yr, sc, kind)
            for j in range(nc):
                db[j] = yd[r, b] * d[b, c + j]  # y.d * GGML_CPU_FP16_TO_FP32(x.d)
            for lane in range(8):
                if kk == 2:  # q8sclsub = (bsums · scales pairwise) << 5
                    g = 16 * b + 2 * lane
                    for j in range(nc):
                        v[lane, j] -= 32 * (np.int32(ys[r, g]) * _s8(sc[g, c + j]) + np.int32(ys[r, g + 1]) * _s8(sc[g + 1, c + j]))
                for j in range(nc):
                    acc[lane, j] = fma32(db[j], F32(v[lane, j]), acc[lane, j])  # _mm256_fmadd_ps
            if kk == 0:  # acc_m = _mm_fmadd_ps(-y.d·dmin, cvtepi32_ps(prod), acc_m), prod[i] = sub-blocks 2i, 2i+1
                for m in range(4):
                    s = 8 * b + 2 * m
                    for j in range(nc):
                        p = np.int64(mn[s, c + j]) * ys[r, s] + np.int64(mn[s + 1, c + j]) * ys[r, s + 1]
                        accm[m, j] = fma32(-yd[r, b] * dmin[b, c + j], F32(p), accm[m, j])
            elif kk == 1:  # summs += -y.d·dmin · hsum(prod), contracted to vfmadd231ss
                for j in range(nc):
                    p = np.int64(0)
                    for s in range(8 * b, 8 * b + 8):
                        p += np.int64(mn[s, c + j]) * ys[r, s]
                    accm[0, j] = fma32(-yd[r, b] * dmin[b, c + j], F32(p), accm[0, j])
        for j in range(nc):  # hsum_float_8(acc): ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))
            res = F32(F32(F32(acc[0, j] + acc[4, j]) + F32(acc[2, j] + acc[6, j]))
                      + F32(F32(acc[1, j] + acc[5, j]) + F32(acc[3, j] + acc[7, j])))
            if kk == 0:
                res = res + F32(F32(accm[0, j] + accm[2, j]) + F32(accm[1, j] + accm[3, j]))
            elif kk == 1:
                res = res + accm[0, j]
            out[orow[i], oc + j] = res


__all__ = ["KQ_KIND", "klanes", "lay_k", "tile_k"]
