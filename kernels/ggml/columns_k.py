"""The column layout's K-quant kernels: Q4_K, Q5_K and Q6_K weights in a plain CPU buffer (not repacked — Q5_K and
Q6_K never are; Q4_K with llama.cpp's ``-nr``, or rows not a multiple of 8), through the formulas of
:mod:`kernels.ggml.mulmat_k`, output element by output element, with the weights laid out by
:func:`kernels.ggml.columns.layout`:

* ``T < 8`` rows (``vec_dot``, ``arch/x86/quants.c``'s ``__AVX2__`` branch in both builds): per super-block the
  integer dot in ggml's 8 int32 lanes — lane ``l`` sums values ``32g + 4l … 32g + 4l + 3`` of the 8 32-value
  groups ``g``, each 4 times its sub-block scale (:func:`kernels.ggml.columns_ir.kq_def`) —; Q6_K's lane ``l``
  less ``32·(bsums[2l]·sc[2l] + bsums[2l+1]·sc[2l+1])``; ``acc[l] = fma(y.d·d, float(sumi[l]), acc[l])``; the
  mins (Q4_K: 4 float lanes, Q5_K one scalar), ``hsum_float_8(acc)`` and the mins added last.
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

from kernels.base.flags import jit
from kernels.ggml.columns_ir import kq, kq_fma
from kernels.ggml.mulmat_k import decode_row
from kernels.ggml.simd import fma32

F32 = np.float32
#: :mod:`kernels.ggml.columns` kind of the K-quant formulas here (``kind - 3`` is ``mulmat_k.KIND``'s type code)
KQ_KIND = {"Q4_K": 3, "Q5_K": 4, "Q6_K": 5}


@jit()
def lay_k(kind, w, q, d, dmin, sc, mn, tab):
    """Q4_K / Q5_K / Q6_K rows (``kind`` as ``mulmat_k.KIND``) -> ``q`` (K/4, 4N) the codes in quads, ``d`` / ``dmin``
    (K/256, N), ``sc`` / ``mn`` (K/32 or K/16, N), through :func:`kernels.ggml.mulmat_k.decode_row`."""
    K = 4 * q.shape[0]
    qr, scr, mnr = np.empty(K, np.int32), np.empty(sc.shape[0], np.int32), np.zeros(sc.shape[0], np.int32)
    dr, dminr = np.empty(d.shape[0], F32), np.zeros(d.shape[0], F32)
    for c in range(w.shape[0]):
        decode_row(kind, w[c], qr, scr, mnr, dr, dminr, tab)
        for k in range(K):
            q[k // 4, 4 * c + k % 4] = qr[k]
        for s in range(sc.shape[0]):
            sc[s, c] = np.uint8(scr[s] & 255)  # Q6_K: the int8 scale's byte
        for s in range(mn.shape[0]):
            mn[s, c] = mnr[s]
        for b in range(d.shape[0]):
            d[b, c] = dr[b]
        for b in range(dmin.shape[0]):
            dmin[b, c] = dminr[b]


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
    v = np.empty((8, 16), np.int32)  # a super-block's 8 integer lanes (or their total) per column of a sub-tile
    acc = np.zeros((R, 8, 64), F32)  # TILE = 64 columns at most
    accm = np.zeros((R, 4, 64), F32)
    for w0 in range(c - c % 16, c + nc, 16):
        cs = max(c, w0)
        n = min(c + nc, w0 + 16) - cs
        for b in range(yd.shape[1]):
            for i in range(R):
                r = rows[i]
                if tiled[r]:
                    kq(v, q, b, 0, 8, cs, n, y[r], sc, ys[r], form, 1)
                    _tiled_sb(kk, v, b, cs, n, d, dmin, mn, yd[r], ys[r], acc[i, 0], cs - c)
                else:
                    kq_fma(acc[i], cs - c, v, q, b, cs, n, y[r], sc, ys[r], d, yd[r, b], form)
                    _mins_sb(kk, b, cs, n, dmin, mn, yd[r, b], ys[r], accm[i], cs - c)
    for i in range(R):
        a, am = acc[i], accm[i]
        for j in range(nc):
            if tiled[rows[i]]:
                out[orow[i], oc + j] = a[0, j]
                continue
            # hsum_float_8(acc): ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))
            res = F32(F32(F32(a[0, j] + a[4, j]) + F32(a[2, j] + a[6, j]))
                      + F32(F32(a[1, j] + a[5, j]) + F32(a[3, j] + a[7, j])))
            if kk == 0:
                res = res + F32(F32(am[0, j] + am[2, j]) + F32(am[1, j] + am[3, j]))
            elif kk == 1:
                res = res + am[0, j]
            out[orow[i], oc + j] = res


__all__ = ["KQ_KIND", "lay_k", "tile_k"]
