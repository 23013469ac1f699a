"""The vec.h / vec.cpp functions of ggml-cpu that several ops share, bit for bit on the x86 paths.

Each is one C function, called (through ``type_traits_cpu[type].vec_dot`` or directly) from every op that
uses it — mul_mat, flash attention, the gated delta net, soft_max — so one emulation serves them all
(``L`` = float32 lanes of the path, :func:`kernels.ggml.simd.lanes`: 16 on ``avx512``, 8 on ``avx2``):

* ``ggml_vec_dot_f32`` (:func:`vec_dot_f32`): ``GGML_F32_ARR`` = 4 accumulators of ``L`` lanes over steps of
  ``GGML_F32_STEP`` = 4·L values (``GGML_F32_VEC_FMA``: one rounding per lane), ``GGML_F32_VEC_REDUCE``
  (:func:`kernels.ggml.simd.vec_reduce`) into a *float* ``sumf``; the leftover loop
  ``sumf += x[i]*y[i]`` as GCC -O3 vectorized it in order (:func:`kernels.ggml.simd.fold_left_unfused`:
  rounded products in blocks of L and L/2, then scalar FMAs).
* ``ggml_vec_dot_f16`` (:func:`vec_dot_f16`): the same SIMD loop on F16 values widened by ``vcvtph2ps``
  (``GGML_F16_STEP``/``GGML_F16_EPR`` equal the F32 ones on x86), the reduced sum widened to a *double*,
  the leftovers added as ``(ggml_float)(x[i]*y[i])`` — a different tail from the F32 dot, so two functions.
* ``ggml_vec_max_f32`` (:func:`vec_max_f32`): ``max = MAX(max, x[i])`` in order, from -inf (scalar).
* ``ggml_vec_soft_max_f32`` (:func:`vec_soft_max_f32`): ``y = ggml_v_expf(x - max)`` in blocks of L lanes
  (:func:`kernels.ggml.simd.v_expf`, a different polynomial per path), each block's lane sum in float
  (:func:`kernels.ggml.simd.hsum_fold` on both paths) added to a double; the tail with libm ``expf``,
  each value added to the double.

Inputs are float32 arrays (F16 values held as float32: exact).
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import jit
from kernels.ggml.libm import expf
from kernels.ggml.simd import fma32, fold_left_unfused, hsum_fold, v_expf, vec_reduce, vfma

F32 = np.float32


def dot_scratch() -> np.ndarray:
    """The accumulators :func:`vec_dot_f32` / :func:`vec_dot_f16` work in (4 × 16 float32, any path), made once
    by a caller that dots many rows (a heap array per dot would cost more than a 64-value dot itself)."""
    return np.empty((4, 16), np.float32)


@jit()
def _simd_dot(np_, x, y, lanes, acc):
    """The SIMD loop shared by ggml_vec_dot_f32/_f16 over ``x[:np_]``, ``y[:np_]`` (``np_`` a multiple of
    4·lanes): ``sum[j] = GGML_F32_VEC_FMA(sum[j], ax[j], ay[j])``, then GGML_F32_VEC_REDUCE (float32).
    ``acc`` (4, ≥ lanes): scratch for GGML_F32_VEC sum[GGML_F32_ARR], overwritten."""
    for j in range(4):
        for lane in range(lanes):
            acc[j, lane] = np.float32(0.0)
    if x.strides[0] == 4 and y.strides[0] == 4:  # contiguous: each GGML_F32_VEC_FMA one vector FMA
        for i in range(0, np_, 4 * lanes):  # i += GGML_F32_STEP
            for j in range(4):
                vfma(acc, j, x, y, i + j * lanes, lanes)
    else:
        for i in range(0, np_, 4 * lanes):
            for j in range(4):
                for lane in range(lanes):
                    k = i + j * lanes + lane
                    acc[j, lane] = fma32(x[k], y[k], acc[j, lane])
    return vec_reduce(acc, lanes)


@jit()
def vec_dot_f32(n, x, y, lanes, acc):
    """vec.cpp: ggml_vec_dot_f32 (the ``GGML_SIMD`` x86 branch) of ``x[:n]``, ``y[:n]``; ``acc``: :func:`dot_scratch`."""
    np_ = n & ~(4 * lanes - 1)  # GGML_F32_STEP
    sumf = _simd_dot(np_, x, y, lanes, acc)
    unfused = np_ + fold_left_unfused(n - np_, lanes)
    for i in range(np_, unfused):  # leftovers, GCC's vector blocks: vmulps, then vaddss lane by lane
        sumf = F32(sumf + F32(x[i] * y[i]))
    for i in range(unfused, n):  # the last < L/2: vfmadd231ss
        sumf = fma32(x[i], y[i], sumf)
    return sumf


@jit()
def vec_dot_generic(n, x, y):
    """vec.cpp: ggml_vec_dot_f32 / ggml_vec_dot_f16 without ``GGML_SIMD`` (ggml's generic x86 build): ``ggml_float
    sumf += (ggml_float)(x[i]*y[i])`` in order — each float product rounded (exact for F16 values), summed in double
    — rounded to float at the end. ``x``, ``y`` float32 (F16 values for the F16 dot)."""
    s = np.float64(0.0)
    for i in range(n):
        s += np.float64(F32(x[i] * y[i]))
    return F32(s)


@jit()
def vec_dot_f32_cols(n, xt, y, lanes, acc, out):
    """``out[c] = vec_dot_f32(n, xt[:, c], y)`` for every column ``c`` of ``xt`` (n, m) at once, for ``n`` a multiple
    of ``GGML_F32_STEP`` = 4·lanes (no leftovers; :func:`cols_fit`): the same 4 × ``lanes`` accumulators per column,
    each fed the same products in the same order (``fma`` per value, steps in order), then
    ``GGML_F32_VEC_REDUCE``'s tree (:func:`kernels.ggml.simd.vec_reduce`: ``x0 + x2``, ``x1 + x3``, their sum;
    then the lanes as ``_mm512_reduce_add_ps`` or AVX2's two hadds) — every operation lane-wise across the columns,
    so it vectorizes over them. ``acc`` (4, ≥ lanes, ≥ m) float32 scratch. Same bits as :func:`vec_dot_f32` per
    column (tests/test_ggml_kernel_parts.py)."""
    m = xt.shape[1]
    for j in range(4):
        for lane in range(lanes):
            acc[j, lane, :m] = F32(0.0)
    for i in range(0, n, 4 * lanes):  # i += GGML_F32_STEP
        for j in range(4):
            for lane in range(lanes):  # sum[j] = GGML_F32_VEC_FMA(sum[j], ax[j], ay[j]), lane `lane`
                k = i + j * lanes + lane
                yk, row, a = y[k], xt[k], acc[j, lane]
                for c in range(m):
                    a[c] = fma32(row[c], yk, a[c])
    for lane in range(lanes):  # x[0] += x[2]; x[1] += x[3]; x[0] += x[1]
        a0, a1, a2, a3 = acc[0, lane], acc[1, lane], acc[2, lane], acc[3, lane]
        for c in range(m):
            a0[c] = F32(F32(a0[c] + a2[c]) + F32(a1[c] + a3[c]))
    r = acc[0]
    for c in range(m):
        if lanes == 16:  # hsum_fold: lane i + lane i + 8, then (s0 + s2) + (s1 + s3)
            s0 = F32(F32(r[0, c] + r[8, c]) + F32(r[4, c] + r[12, c]))
            s1 = F32(F32(r[1, c] + r[9, c]) + F32(r[5, c] + r[13, c]))
            s2 = F32(F32(r[2, c] + r[10, c]) + F32(r[6, c] + r[14, c]))
            s3 = F32(F32(r[3, c] + r[11, c]) + F32(r[7, c] + r[15, c]))
            out[c] = F32(F32(s0 + s2) + F32(s1 + s3))
        else:  # hsum_hadd8: (t0 + t1) + (t2 + t3), t_i = lane i + lane i + 4
            t0, t1 = F32(r[0, c] + r[4, c]), F32(r[1, c] + r[5, c])
            t2, t3 = F32(r[2, c] + r[6, c]), F32(r[3, c] + r[7, c])
            out[c] = F32(F32(t0 + t1) + F32(t2 + t3))


@jit()
def cols_fit(n, lanes):
    """Whether :func:`vec_dot_f32_cols` computes dots of length ``n`` (a whole number of ``GGML_F32_STEP``s)."""
    return n % (4 * lanes) == 0


@jit()
def vec_dot_f16(n, x, y, lanes, acc):
    """vec.cpp: ggml_vec_dot_f16 of ``x[:n]``, ``y[:n]`` (F16 values as float32): float SIMD part, double tail;
    ``acc``: :func:`dot_scratch`."""
    np_ = n & ~(4 * lanes - 1)  # GGML_F16_STEP
    sumf = np.float64(_simd_dot(np_, x, y, lanes, acc))  # ggml_float sumf
    for i in range(np_, n):
        sumf += np.float64(F32(x[i] * y[i]))  # (ggml_float)(GGML_CPU_FP16_TO_FP32(x[i])*…(y[i])): exact product
    return F32(sumf)


@jit()
def vec_max_f32(n, x):
    """vec.h: ggml_vec_max_f32: ``max = MAX(max, x[i])`` from -INFINITY, ``MAX(a, b) = a > b ? a : b``."""
    mx = F32(-np.inf)
    for i in range(n):
        mx = mx if mx > x[i] else F32(x[i])
    return mx


@jit()
def vec_soft_max_f32(n, y, x, mx, lanes):
    """vec.cpp: ggml_vec_soft_max_f32: ``y[i] = exp(x[i] - max)`` (``y`` may be ``x``); returns the double sum.
    ``lanes``: 16, 8, or 4 for ggml's generic x86 build (its ``__SSE2__`` branch)."""
    total = np.float64(0.0)  # ggml_float sum
    i = 0
    while i + lanes - 1 < n:  # for (; i + 15 < n; i += 16) — AVX2: i + 7 < n, i += 8; SSE2 (generic): 4
        for lane in range(lanes):  # ggml_v_expf(_mm*_sub_ps(x, max)), stored
            y[i + lane] = v_expf(F32(x[i + lane] - mx), lanes)
        if lanes == 4:  # SSE2: shuffle(2,3,0,1) + add, movehl + add_ss: (v0 + v1) + (v2 + v3)
            total += np.float64(F32(F32(y[i] + y[i + 1]) + F32(y[i + 2] + y[i + 3])))
        else:
            total += np.float64(hsum_fold(y, i, lanes))  # sum += (ggml_float)<the block's lane sum>
        i += lanes
    while i < n:  # tail: float val = expf(x[i] - max); sum += (ggml_float)val
        v = expf(F32(x[i] - mx))
        total += np.float64(v)
        y[i] = v
        i += 1
    return total


__all__ = ["dot_scratch", "vec_dot_f32", "vec_dot_generic", "vec_dot_f32_cols", "cols_fit", "vec_dot_f16", "vec_max_f32", "vec_soft_max_f32"]
