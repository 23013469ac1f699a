"""The vec.h / vec.cpp functions of ggml-cpu that several ops share, bit for bit on the x86 and AArch64 paths.

Each is one C function, called (through ``type_traits_cpu[type].vec_dot`` or directly) from every op that
uses it — mul_mat, flash attention, the gated delta net, soft_max — so one emulation serves them all
(``L`` = float32 lanes of the path, :func:`kernels.ggml.simd.lanes`: 16 on ``avx512``, 8 on ``avx2``, 4 on the
AArch64 NEON paths ``arm64-dotprod`` / ``arm64-i8mm``; that int, the ``lanes`` argument, is the path's SIMD code —
:data:`kernels.ggml.simd.NEON` selects the NEON code below, an unknown value raises):

* ``ggml_vec_dot_f32`` (:func:`vec_dot_f32`): ``GGML_F32_ARR`` = 4 accumulators of ``L`` lanes over steps of
  ``GGML_F32_STEP`` = 4·L values (``GGML_F32_VEC_FMA``: one rounding per lane), ``GGML_F32_VEC_REDUCE``
  (:func:`kernels.ggml.simd.vec_reduce`) into a *float* ``sumf``; the leftover loop
  ``sumf += x[i]*y[i]`` as GCC -O3 vectorized it in order (:func:`kernels.ggml.simd.fold_left_unfused`:
  rounded products in blocks of L and L/2, then scalar FMAs).
* ``ggml_vec_dot_f16`` (:func:`vec_dot_f16`): the same SIMD loop on F16 values widened by ``vcvtph2ps``
  (``GGML_F16_STEP``/``GGML_F16_EPR`` equal the F32 ones on x86), the reduced sum widened to a *double*,
  the leftovers added as ``(ggml_float)(x[i]*y[i])`` — a different tail from the F32 dot, so two functions.
* AArch64 NEON (GCC 12; the same code in both builds): ``ggml_vec_dot_f32`` as above with L = 4, reduced by
  ``vaddvq_f32`` = ``(a0 + a1) + (a2 + a3)``, the leftovers (< 16) as blocks of 4 rounded products (``fmul v.4s``)
  added lane by lane, then scalar ``fmadd``. ``ggml_vec_dot_f16``: ``GGML_F16_VEC`` is ``float16x8_t``
  (``__ARM_FEATURE_FP16_VECTOR_ARITHMETIC``): 4 accumulators of 8 *half* lanes over steps of 32, each
  ``vfmaq_f16`` rounded once to binary16 (:func:`kernels.ggml.half.fma16`), ``GGML_F16x8_REDUCE`` adding the
  accumulators in half (``x0 + x2``, ``x1 + x3``, their sum), then the low and high 4 lanes widened to float
  and added, ``vaddvq_f32``; the tail in double as on x86. Without FP16 vector arithmetic (``arm64-base``, code
  :data:`kernels.ggml.isa.NEON_F32C`) ``GGML_F16_VEC`` is ``GGML_F32Cx4``: x86's float loop with L = 4 (steps
  of 16, ``vfmaq_f32``, ``vaddvq_f32``), the same double tail. The clang builds (``arm64-*-clang``, code
  :data:`kernels.ggml.isa.NEON_CLANG`): the same intrinsics, but clang's vectorizer takes ``ggml_vec_dot_f32``'s
  leftovers in blocks of 8 rounded products (GCC's: of 4), the rest by ``fmadd``.
* ``ggml_vec_mad_f32`` / ``ggml_vec_mad_f16`` / ``ggml_vec_scale_f32`` / ``ggml_vec_scale_f16``
  (:func:`vec_mad_f32`, :func:`vec_mad_f16`, :func:`vec_scale_f16`): element-wise, ``fma(x, v, y)`` in every lane
  and (contracted) in the tail; on NEON the F16 ones compute in *half* on the SIMD part (``v`` rounded to half,
  ``vfmaq_f16`` / ``vmulq_f16``) and in float (rounded to half once) in the tail; on ``arm64-base``
  (``NEON_F32C``: float32x4_t, ``v`` kept in float) all of it as x86.
* ``ggml_vec_max_f32`` (:func:`vec_max_f32`): ``max = MAX(max, x[i])`` in order, from -inf (scalar).
* ``ggml_vec_soft_max_f32`` (:func:`vec_soft_max_f32`): ``y = ggml_v_expf(x - max)`` in blocks of L lanes
  (:func:`kernels.ggml.simd.v_expf`, a different polynomial per path), each block's lane sum in float
  (:func:`kernels.ggml.simd.hsum_fold` on both paths) added to a double; the tail with libm ``expf``,
  each value added to the double.

The SVE builds (codes :data:`kernels.ggml.isa.SVE128`, :data:`kernels.ggml.isa.SVE256`: one GCC library whose loops
read the vector length at run time) take vec.h / vec.cpp's SVE branches at ``svcntw()`` = 4 or 8 float lanes
(:mod:`kernels.ggml.sve`, :func:`kernels.ggml.sve.svcntw`): ``vec_dot_f32``, ``vec_dot_f16``, ``vec_soft_max_f32``,
``vec_mad_f16``, ``vec_scale_f16`` pass them on; :func:`vec_dot_f32_cols` / :func:`cols_fit` never take them (SVE's
twin: :func:`kernels.ggml.sve.vec_dot_f32_cols`).

Inputs are float32 arrays (F16 values held as float32: exact).
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import jit
from kernels.ggml.libm import expf, expf_arm64
from kernels.ggml.half import f16_round64, fma16
from kernels.ggml import sve
from kernels.ggml.isa import NEON_CLANG, NEON_F32C, SVE128, SVE256
from kernels.ggml.simd import (AVX2, AVX512, NEON, SSE2, f16_round, fma32, fold_left_unfused, hsum_fold, hsum_pairwise4,
                               v_expf, vec_reduce, vfma)

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
    if lanes == SVE128 or lanes == SVE256:  # vec.cpp's SVE branch at svcntw() lanes (kernels.ggml.sve)
        return sve.vec_dot_f32(n, x, y, sve.svcntw(lanes))
    # GGML_F32_VEC is float32x4_t on every NEON code (NEON_F32C: arm64-base's F16 code; NEON_CLANG: clang's builds)
    L = NEON if lanes == NEON_F32C or lanes == NEON_CLANG else lanes
    np_ = n & ~(4 * L - 1)  # GGML_F32_STEP
    sumf = _simd_dot(np_, x, y, L, acc)
    unfused = np_ + fold_left_unfused(n - np_, lanes)  # the compiler's blocks (NEON_CLANG: clang's)
    for i in range(np_, unfused):  # leftovers, the compiler's vector blocks: vmulps / fmul, then vaddss / fadd lane by lane
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
    if lanes == NEON_CLANG:  # no leftovers here: clang's NEON code is GCC's
        lanes = NEON
    if lanes != AVX512 and lanes != AVX2 and lanes != NEON:
        raise ValueError("vec_dot_f32_cols: unknown SIMD code")
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
        elif lanes == 8:  # hsum_hadd8: (t0 + t1) + (t2 + t3), t_i = lane i + lane i + 4
            t0, t1 = F32(r[0, c] + r[4, c]), F32(r[1, c] + r[5, c])
            t2, t3 = F32(r[2, c] + r[6, c]), F32(r[3, c] + r[7, c])
            out[c] = F32(F32(t0 + t1) + F32(t2 + t3))
        else:  # NEON vaddvq_f32: (r0 + r1) + (r2 + r3)
            out[c] = F32(F32(r[0, c] + r[1, c]) + F32(r[2, c] + r[3, c]))


@jit()
def cols_fit(n, lanes):
    """Whether :func:`vec_dot_f32_cols` computes dots of length ``n`` (a whole number of ``GGML_F32_STEP``s; never
    SVE's, whose twin is :func:`kernels.ggml.sve.vec_dot_f32_cols`)."""
    return lanes != SVE128 and lanes != SVE256 and n % (4 * (NEON if lanes == NEON_CLANG else lanes)) == 0


@jit()
def _simd_dot_f16_half(np_, x, y, acc):
    """NEON ``GGML_F16_VEC`` = float16x8_t: the SIMD loop of ggml_vec_dot_f16 over ``x[:np_]``, ``y[:np_]``
    (``np_`` a multiple of GGML_F16_STEP = 32) with 4 accumulators of 8 half lanes (``acc`` (4, ≥ 8) scratch),
    each ``vfmaq_f16`` rounded once to half; ``GGML_F16x8_REDUCE``: ``x0 += x2; x1 += x3; x0 += x1`` in half
    (``vaddq_f16``), ``vcvt_f32_f16`` of the low and high halves, their float sum, ``vaddvq_f32``."""
    for j in range(4):
        for lane in range(8):
            acc[j, lane] = F32(0.0)
    for i in range(0, np_, 32):
        for j in range(4):
            for lane in range(8):
                k = i + 8 * j + lane
                acc[j, lane] = fma16(x[k], y[k], acc[j, lane])
    t = np.empty(4, np.float32)
    for lane in range(8):  # the half additions: exact in float64, rounded once to half
        acc[0, lane] = f16_round64(np.float64(acc[0, lane]) + np.float64(acc[2, lane]))
        acc[1, lane] = f16_round64(np.float64(acc[1, lane]) + np.float64(acc[3, lane]))
        acc[0, lane] = f16_round64(np.float64(acc[0, lane]) + np.float64(acc[1, lane]))
    for lane in range(4):  # vaddq_f32(t0, t1): low 4 + high 4 (halves widen exactly)
        t[lane] = F32(acc[0, lane] + acc[0, lane + 4])
    return hsum_pairwise4(t, 0)


@jit()
def vec_dot_f16(n, x, y, lanes, acc):
    """vec.cpp: ggml_vec_dot_f16 of ``x[:n]``, ``y[:n]`` (F16 values as float32): SIMD part (float on x86, half
    accumulators on NEON: :func:`_simd_dot_f16_half`), double tail; ``acc``: :func:`dot_scratch`."""
    if lanes == SVE128 or lanes == SVE256:  # vec.cpp's SVE branch: float accumulators (kernels.ggml.sve)
        return sve.vec_dot_f16(n, x, y, sve.svcntw(lanes))
    if lanes == NEON:
        np_ = n & ~31  # GGML_F16_STEP = 32 (GGML_F16_EPR 8)
        sumf = np.float64(_simd_dot_f16_half(np_, x, y, acc))
        for i in range(np_, n):  # fcvt s, h; fmul s; fcvt d; fadd d
            sumf += np.float64(F32(x[i] * y[i]))
        return F32(sumf)
    if lanes == NEON_F32C:  # GGML_F32Cx4 (arm64-base): float32x4_t accumulators, vaddvq_f32, as the x86 loop
        lanes = NEON
    elif lanes != AVX512 and lanes != AVX2:
        raise ValueError("vec_dot_f16: unknown SIMD code")
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
    ``lanes``: the expf code of the path (:func:`kernels.ggml.simd.expf_lanes`): AVX512, AVX2, NEON, or SSE2 for
    ggml's generic x86 build (its ``__SSE2__`` branch)."""
    if lanes == SVE128 or lanes == SVE256:  # the SVE branch: predicated last block, FADDV per block (kernels.ggml.sve)
        return sve.vec_soft_max_f32(n, y, x, mx, sve.svcntw(lanes))
    total = np.float64(0.0)  # ggml_float sum
    width = 4 if lanes == SSE2 or lanes == NEON else lanes
    if lanes != AVX512 and lanes != AVX2 and lanes != NEON and lanes != SSE2:
        raise ValueError("vec_soft_max_f32: unknown SIMD code")
    i = 0
    while i + width - 1 < n:  # for (; i + 15 < n; i += 16) — AVX2: i + 7 < n, i += 8; SSE2, NEON: 4
        for lane in range(width):  # ggml_v_expf(_mm*_sub_ps(x, max)) / vsubq_f32, stored
            y[i + lane] = v_expf(F32(x[i + lane] - mx), lanes)
        if width == 4:  # SSE2: shuffle(2,3,0,1) + add, movehl + add_ss; NEON vaddvq_f32: (v0 + v1) + (v2 + v3)
            total += np.float64(hsum_pairwise4(y, i))
        else:
            total += np.float64(hsum_fold(y, i, lanes))  # sum += (ggml_float)<the block's lane sum>
        i += width
    while i < n:  # tail: float val = expf(x[i] - max); sum += (ggml_float)val — AArch64's glibc on NEON
        v = expf_arm64(F32(x[i] - mx)) if lanes == NEON else expf(F32(x[i] - mx))
        total += np.float64(v)
        y[i] = v
        i += 1
    return total


@jit()
def vec_mad_f32(n, y, x, v):
    """vec.h: ggml_vec_mad_f32: ``y[i] += x[i]*v`` — ``GGML_F32_VEC_FMA(ay, ax, vx)`` on the SIMD part and GCC's
    contraction in the tail: ``fma(x[i], v, y[i])`` everywhere, on every SIMD path (x86 and NEON)."""
    for i in range(n):
        y[i] = fma32(x[i], v, y[i])


@jit()
def vec_mad_f16(n, y, x, v, lanes):
    """vec.h: ggml_vec_mad_f16 on F16 values held as float32 (``y`` updated to F16 values). x86 (F32Cx8/16: the
    halves widened, float FMA, stored with ``vcvtps2ph``) and the tail: ``fp16(fma(x, v, y))``. NEON
    (float16x8_t): the ``n & ~31`` SIMD part computes in half — ``vdupq_n_f16(v)`` rounds ``v`` to half, one
    ``fmla v.8h`` rounding — the tail as x86. (The conversions round to nearest even; the tail's
    ``GGML_CPU_FP32_TO_FP16`` is the portable one on NEON, which differs from the hardware's only on NaN.)"""
    if lanes == SVE128 or lanes == SVE256:  # vec.h's SVE branch: half FMAs on every element (kernels.ggml.sve)
        sve.vec_mad_f16(n, y, x, v)
        return
    np_ = 0
    if lanes == NEON:
        np_ = n & ~31
        vh = f16_round(v)
        for i in range(np_):
            y[i] = fma16(x[i], vh, y[i])  # vfmaq_f16(ay, ax, vx)
    elif lanes != AVX512 and lanes != AVX2 and lanes != NEON_F32C:
        raise ValueError("vec_mad_f16: unknown SIMD code")
    for i in range(np_, n):
        y[i] = f16_round(fma32(x[i], v, y[i]))


@jit()
def vec_scale_f16(n, y, v, lanes):
    """vec.h: ggml_vec_scale_f16 on F16 values held as float32: x86 and the tail ``fp16(y[i]*v)`` in float; NEON's
    ``n & ~31`` SIMD part ``vmulq_f16`` in half with ``v`` rounded to half."""
    if lanes == SVE128 or lanes == SVE256:  # vec.h's SVE branch: half products, one predicated leftover vector (kernels.ggml.sve)
        sve.vec_scale_f16(n, y, v, sve.svcntw(lanes))
        return
    np_ = 0
    if lanes == NEON:
        np_ = n & ~31
        vh = f16_round(v)
        for i in range(np_):
            y[i] = f16_round64(np.float64(y[i]) * np.float64(vh))  # exact product, one rounding
    elif lanes != AVX512 and lanes != AVX2 and lanes != NEON_F32C:
        raise ValueError("vec_scale_f16: unknown SIMD code")
    for i in range(np_, n):
        y[i] = f16_round(F32(y[i] * v))


__all__ = ["vec_mad_f32", "vec_mad_f16", "vec_scale_f16", "dot_scratch", "vec_dot_f32", "vec_dot_generic", "vec_dot_f32_cols", "cols_fit", "vec_dot_f16", "vec_max_f32", "vec_soft_max_f32"]
