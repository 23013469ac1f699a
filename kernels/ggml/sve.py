"""The ``__ARM_FEATURE_SVE`` branches of ggml-cpu's shared vector code at a 128-bit vector length (``arm64-sve128``,
code :data:`kernels.ggml.isa.SVE128`), where they differ from NEON's.

GCC 12 (``-march=armv9-a+sve2+i8mm+dotprod+fp16``) compiles vec.h / vec.cpp's SVE loops: ``svcntw()`` = 4 float
lanes, ``svcnth()`` = 8 half lanes, and a *predicated* last block (``svwhilelt``) where NEON has a scalar tail:

* ``ggml_vec_soft_max_f32`` (:func:`vec_soft_max_f32`): ``ggml_v_expf(pg, x - max)`` — NEON's formula, FMA for
  FMA — on every element, the last block too; each block's ``svaddv_f32(pg, val)`` (FADDV: the recursive pairwise
  sum ``(v0 + v1) + (v2 + v3)``, inactive lanes +0.0) added to the double sum. (silu / swiglu:
  :mod:`kernels.ggml.vecmath` with the same predicated last block.)
* ``ggml_vec_dot_f16`` (:func:`vec_dot_f16`): *float* accumulators, unlike NEON's half ones —
  ``ggml_sve_f16_fma_widened``: SVE2's ``svmlalb_f32`` / ``svmlalt_f32`` (FMLALB/FMLALT) add the exact products of
  the even / odd halves of each 8-half vector to ``acc_lo`` / ``acc_hi`` (4 lanes each), one rounding; 4 such
  pairs over steps of 64 (vector j of a step into pair j % 4), the leftover vectors into pair 1, the predicated
  last one (zeros beyond n: products +0.0) too; then ``sum1 + sum2``, ``sum3 + sum4``, their sum (lo and hi
  apart), ``svaddv(lo) + svaddv(hi)`` in float. No scalar tail.
* ``ggml_vec_mad_f16`` / ``ggml_vec_scale_f16`` (:func:`vec_mad_f16`, :func:`vec_scale_f16`): ``svdup_n_f16(v)``
  rounds ``v`` to half once, then *every* element (the predicated tail too) is one half FMA ``fma16(x, vh, y)`` /
  one half product ``y·vh`` — NEON computes its tail in float.

* ``ggml_vec_dot_f32`` (:func:`vec_dot_f32`): 8 fused accumulators of 4 lanes, predicated tail, FADDV; many of them
  side by side (:func:`vec_dot_f32_cols`: the F32-cache attention's K·Q and P·V, :mod:`kernels.ggml.attn_heads`).

:mod:`kernels.ggml.vec`'s functions take these for the code ``SVE128``.
Other vector lengths are refused (kernels.ggml.build: ``SVE_BITS``).
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import jit
from kernels.ggml.half import f16_round64, fma16
from kernels.ggml.simd import f16_round, fma32, v_expf_avx2

F32 = np.float32


@jit()
def _faddv4(a, b, c, d):
    """FADDV of 4 float lanes (svaddv_f32 at 128 bits): ``(a + b) + (c + d)``."""
    return F32(F32(a + b) + F32(c + d))


@jit()
def vec_soft_max_f32(n, y, x, mx):
    """vec.cpp ggml_vec_soft_max_f32, the SVE branch at 128 bits: ``y[i] = ggml_v_expf(x[i] - max)`` for all i,
    the double sum of each 4-lane block's FADDV (the last block predicated: absent lanes +0.0)."""
    total = np.float64(0.0)
    v = np.zeros(4, np.float32)
    for i in range(0, n, 4):
        for lane in range(4):
            if i + lane < n:
                v[lane] = v_expf_avx2(F32(x[i + lane] - mx))  # svsub_f32_x, ggml_v_expf(pg, …): NEON's FMAs
                y[i + lane] = v[lane]
            else:
                v[lane] = F32(0.0)
        total += np.float64(_faddv4(v[0], v[1], v[2], v[3]))
    return total


@jit()
def vec_dot_f32(n, x, y):
    """vec.cpp ggml_vec_dot_f32, the SVE branch at 128 bits: 8 accumulators of 4 lanes over steps of 32 (``svmad``:
    fused), the leftover whole vectors into ``sum1``, the last ``n % 4`` values by a predicated ``svmla_f32_m``
    into ``sum1``'s first lanes (the others keep theirs); ``GGML_F32xt_REDUCE``: ``(1+2) + (3+4)``,
    ``(5+6) + (7+8)``, their sum, lane-wise, then FADDV; a float."""
    np1 = n & ~31
    acc = np.zeros((8, 4), np.float32)
    for i in range(n):
        j = ((i % 32) // 4) if i < np1 else 0
        acc[j, i % 4] = fma32(x[i], y[i], acc[j, i % 4])
    r = np.empty(4, np.float32)
    for lane in range(4):
        a12, a34 = F32(acc[0, lane] + acc[1, lane]), F32(acc[2, lane] + acc[3, lane])
        a56, a78 = F32(acc[4, lane] + acc[5, lane]), F32(acc[6, lane] + acc[7, lane])
        r[lane] = F32(F32(a12 + a34) + F32(a56 + a78))
    return _faddv4(r[0], r[1], r[2], r[3])


@jit()
def vec_dot_f32_cols(n, xt, y, acc, out):
    """``out[c] = vec_dot_f32(n, xt[:, c], y)`` for every column ``c`` of ``xt`` (n, m) at once, any ``n``: each
    column's 8 × 4 accumulators fed the same fused products in the same order (the leftovers into ``sum1``), then the
    same tree and FADDV — every operation lane-wise across the columns. ``acc`` (4, ≥ 8, ≥ m) float32 scratch
    (accumulator ``j``, lane ``l`` in ``acc[j // 2, 4 * (j % 2) + l]``). Same bits as :func:`vec_dot_f32` per column
    (tests/test_ggml_kernel_parts.py)."""
    m = xt.shape[1]
    np1 = n & ~31
    for j in range(4):
        for lane in range(8):
            acc[j, lane, :m] = F32(0.0)
    for i in range(n):
        j = ((i % 32) // 4) if i < np1 else 0
        a, yi, row = acc[j // 2, 4 * (j % 2) + i % 4], y[i], xt[i]
        for c in range(m):
            a[c] = fma32(row[c], yi, a[c])
    for c in range(m):
        for lane in range(4):  # GGML_F32xt_REDUCE, lane-wise: (1+2) + (3+4), (5+6) + (7+8), their sum
            a12 = F32(acc[0, lane, c] + acc[0, 4 + lane, c])
            a34 = F32(acc[1, lane, c] + acc[1, 4 + lane, c])
            a56 = F32(acc[2, lane, c] + acc[2, 4 + lane, c])
            a78 = F32(acc[3, lane, c] + acc[3, 4 + lane, c])
            acc[0, lane, c] = F32(F32(a12 + a34) + F32(a56 + a78))
        out[c] = _faddv4(acc[0, 0, c], acc[0, 1, c], acc[0, 2, c], acc[0, 3, c])


@jit()
def vec_dot_f16(n, x, y):
    """vec.cpp ggml_vec_dot_f16, the SVE branch at 128 bits (``x``, ``y``: F16 values as float32): float
    accumulators by FMLALB / FMLALT (module docstring); returns the float32 result."""
    lo = np.zeros((4, 4), np.float32)  # sum1_lo … sum4_lo: the even halves of each vector
    hi = np.zeros((4, 4), np.float32)  # sum1_hi … sum4_hi: the odd halves
    np1 = n - n % 64  # ggml_f16_step = 8 * svcnth()
    for i in range(0, n, 8):
        j = (i // 8) % 4 if i < np1 else 0  # the leftover vectors (and the predicated last one) into sum1
        for lane in range(4):
            e, o = i + 2 * lane, i + 2 * lane + 1
            pe = F32(x[e] * y[e]) if e < n else F32(0.0)  # exact: halves' products fit float32
            po = F32(x[o] * y[o]) if o < n else F32(0.0)
            lo[j, lane] = F32(lo[j, lane] + pe)
            hi[j, lane] = F32(hi[j, lane] + po)
    for lane in range(4):
        lo[0, lane] = F32(F32(lo[0, lane] + lo[1, lane]) + F32(lo[2, lane] + lo[3, lane]))
        hi[0, lane] = F32(F32(hi[0, lane] + hi[1, lane]) + F32(hi[2, lane] + hi[3, lane]))
    s = F32(_faddv4(lo[0, 0], lo[0, 1], lo[0, 2], lo[0, 3]) + _faddv4(hi[0, 0], hi[0, 1], hi[0, 2], hi[0, 3]))
    return s  # ggml_sve_sum_f32x2: float, then (ggml_float), then *s = (float)


@jit()
def vec_mad_f16(n, y, x, v):
    """vec.h ggml_vec_mad_f16, SVE: ``y[i] = fma16(x[i], half(v), y[i])`` on every element (``y``, ``x``: F16
    values as float32)."""
    vh = f16_round(v)
    for i in range(n):
        y[i] = fma16(x[i], vh, y[i])


@jit()
def vec_scale_f16(n, y, v):
    """vec.h ggml_vec_scale_f16, SVE: ``y[i] = half(y[i] · half(v))`` on every element (one rounding: the product
    of two halves is exact in double)."""
    vh = f16_round(v)
    for i in range(n):
        y[i] = f16_round64(np.float64(y[i]) * np.float64(vh))
