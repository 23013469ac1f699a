"""Float dot products of ggml-cpu's ``mul_mat``, bit for bit: the F16/BF16 conversions, horizontal sums, the
F32/F16/BF16 ``vec_dot`` kernels and llamafile's float ``tinyBLAS`` (used by :mod:`kernels.ggml.mulmat`).

Lane counts and orders, per emulated path (``L`` = float32 lanes of one vector: 16 on ``avx512``, 8 on
``avx2``), read from the C and checked against the disassembly of both libggml-cpu builds:

* horizontal sums — :func:`hsum_float_8` (``arch/x86/quants.c: hsum_float_8``; llamafile ``hsum(__m256)``
  is the same tree), :func:`reduce_add_ps` (GCC's ``_mm512_reduce_add_ps``: 16 → 8 → 4 lanes by adding the
  upper half to the lower, then ``(s0 + s2) + (s1 + s3)``), :func:`reduce_hadd_8` (``simd-mappings.h:
  GGML_F32x8_REDUCE``'s tail, two ``_mm_hadd_ps``: ``(s0 + s1) + (s2 + s3)``).
* ``vec.cpp: ggml_vec_dot_f32`` — ``GGML_F32_ARR`` = 4 accumulators of ``L`` lanes over chunks of
  ``GGML_F32_STEP`` = 4·L values (``_mm*_fmadd_ps``), reduced ``(s0+s2) + (s1+s3)`` lane-wise
  (``GGML_F32_VEC_REDUCE``), then the lanes as above. The leftover loop ``sumf += x[i]*y[i]`` is
  auto-vectorized by GCC -O3 *in order*: products of ``L`` and then ``L/2`` values are rounded
  (``vmulps``) and added one by one (``vaddss``); the last < L/2 values are contracted to ``vfmadd231ss``.
* ``vec.cpp: ggml_vec_dot_f16`` — the same accumulators on F16 values widened by ``vcvtph2ps``; the
  result goes to a *double* (``ggml_float``) and the leftovers add float32 products in double.
* ``vec.cpp: ggml_vec_dot_bf16`` — avx512 (``__AVX512BF16__``): two 16-lane ``_mm512_dpbf16_ps``
  accumulators per 64 values; avx2: four 8-lane accumulators per 32 values (``_mm256_add_ps(_mm256_mul_ps)``
  contracted to ``vfmadd231ps`` by GCC), folded ``(c1 + c3) + (c2 + c4)``; each folded vector's sum is
  added to a double, leftovers in double.
* ``llamafile/sgemm.cpp: tinyBLAS::gemm_bloc`` — one ``KN``-wide accumulator per output element,
  ``Cv = madd(A[l:l+KN], B[l:l+KN], Cv)`` over ``l``, then ``hsum(Cv)``. The tile shape (RM×RN, and which
  thread runs it) only changes the order in which elements are computed, never an element's value.

``VDPBF16PS`` (what ``_mm512_dpbf16_ps`` compiles to) per float32 lane ``l``: ``c = fma(x[2l+1], y[2l+1], c)``
then ``c = fma(x[2l], y[2l], c)``, with bf16 subnormal inputs read as zero and subnormal results flushed to
zero (Intel SDM "DAZ in, FTZ out, RNE"; both measured on Zen 4 — :func:`dpbf16_lane`).
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import jit
from kernels.ggml.simd import fma32

F32_TINY = np.float32(1.1754944e-38)  # FLT_MIN: smallest normal float32


# --------------------------------------------------------------------------------------------
# Conversions (the activations' from_float, F16/BF16 weights, fp16 scales) — exact, numpy


def f16_bits_to_f32(h: np.ndarray) -> np.ndarray:
    """binary16 bits -> float32 as ``vcvtph2ps`` / ggml's table give them (a signalling NaN is quieted)."""
    f = np.asarray(h, np.uint16).view(np.float16).astype(np.float32)
    bits = f.view(np.uint32)
    return np.where(np.isnan(f), bits | np.uint32(0x00400000), bits).astype(np.uint32).view(np.float32)


def fp32_to_fp16_values(x: np.ndarray) -> np.ndarray:
    """``ggml_cpu_fp32_to_fp16`` (``_mm*_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)``), back as float32 values:
    nearest even, overflow to inf; a NaN keeps its sign and top 10 mantissa bits, the quiet bit set."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32)
    nan_h = ((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF)
    return f16_bits_to_f32(np.where(np.isnan(x), nan_h, h).astype(np.uint16))


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """``ggml-impl.h: ggml_compute_fp32_to_bf16`` (what ``ggml_cpu_fp32_to_bf16`` calls per value)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    h = np.where(nan, (u >> 16) | 64, (u + (0x7FFF + ((u >> 16) & 1))) >> 16)  # force quiet / round to nearest even
    return (h & 0xFFFF).astype(np.uint16)


def bf16_bits_to_f32(h: np.ndarray) -> np.ndarray:
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)


@jit()
def hsum_float_8(a, o):
    """``hsum_float_8`` of the 8 lanes ``a[o:o+8]``: ``(a4+a0 + a6+a2) + (a5+a1 + a7+a3)``, as the C pairs them."""
    s0 = a[o + 4] + a[o + 0]  # _mm256_extractf128_ps(x, 1) + _mm256_castps256_ps128(x)
    s1 = a[o + 5] + a[o + 1]
    s2 = a[o + 6] + a[o + 2]
    s3 = a[o + 7] + a[o + 3]
    return (s0 + s2) + (s1 + s3)  # + _mm_movehl_ps, then _mm_add_ss with _mm_movehdup_ps


@jit()
def reduce_add_ps(a, o):
    """GCC's ``_mm512_reduce_add_ps`` of the 16 lanes ``a[o:o+16]``: upper 8 + lower 8, then hsum_float_8."""
    h = np.empty(8, np.float32)
    for i in range(8):
        h[i] = a[o + 8 + i] + a[o + i]
    return hsum_float_8(h, 0)


@jit()
def reduce_hadd_8(a, o):
    """The tail of ``GGML_F32x8_REDUCE`` (AVX): lower + upper 128 bits, then two ``_mm_hadd_ps``."""
    t0 = a[o + 0] + a[o + 4]
    t1 = a[o + 1] + a[o + 5]
    t2 = a[o + 2] + a[o + 6]
    t3 = a[o + 3] + a[o + 7]
    return (t0 + t1) + (t2 + t3)


@jit()
def _vec_reduce(acc, L):
    """``GGML_F32_VEC_REDUCE`` of the 4 accumulators ``acc`` (4, L): s0+s2, s1+s3, then their sum, lane-wise;
    then ``_mm512_reduce_add_ps`` (avx512) or the two-hadd tail (avx2)."""
    v = np.empty(L, np.float32)
    for i in range(L):
        v[i] = (acc[0, i] + acc[2, i]) + (acc[1, i] + acc[3, i])
    return reduce_add_ps(v, 0) if L == 16 else reduce_hadd_8(v, 0)


@jit()
def _leftover_f32(x, y, i, n, sumf, L):
    """``for (; i < n; ++i) sumf += x[i]*y[i];`` as GCC -O3 vectorizes it in order: chunks of ``L`` rounded
    products, one chunk of ``L/2``, then scalar ``vfmadd231ss`` (from the disassembly of both builds)."""
    while n - i >= L:
        for j in range(L):
            sumf = sumf + x[i + j] * y[i + j]  # vmulps, then vaddss lane by lane
        i += L
    if n - i >= L // 2:
        for j in range(L // 2):
            sumf = sumf + x[i + j] * y[i + j]
        i += L // 2
    for j in range(i, n):
        sumf = fma32(x[j], y[j], sumf)
    return sumf


@jit()
def vec_dot_f32(n, x, y, L):
    """``vec.cpp: ggml_vec_dot_f32`` of float32 rows ``x``, ``y`` (x86, ``L`` lanes)."""
    step = 4 * L  # GGML_F32_STEP
    np_ = n & ~(step - 1)
    acc = np.zeros((4, L), np.float32)
    for i in range(0, np_, step):
        for j in range(4):
            for lane in range(L):
                k = i + j * L + lane
                acc[j, lane] = fma32(x[k], y[k], acc[j, lane])  # GGML_F32_VEC_FMA
    sumf = _vec_reduce(acc, L)
    return _leftover_f32(x, y, np_, n, sumf, L)


@jit()
def vec_dot_f16(n, x, y, L):
    """``vec.cpp: ggml_vec_dot_f16``; ``x``, ``y`` hold the F16 values as float32 (exact)."""
    step = 4 * L  # GGML_F16_DOT_STEP
    np_ = n & ~(step - 1)
    acc = np.zeros((4, L), np.float32)
    for i in range(0, np_, step):
        for j in range(4):
            for lane in range(L):
                k = i + j * L + lane
                acc[j, lane] = fma32(x[k], y[k], acc[j, lane])
    sumf = np.float64(_vec_reduce(acc, L))  # ggml_float
    for i in range(np_, n):
        sumf += np.float64(x[i] * y[i])  # a float32 product (exact for F16 values), added in double
    return np.float32(sumf)


@jit()
def _daz(v):
    return np.float32(0.0) * v if abs(v) < F32_TINY else v  # keeps the sign; NaN stays NaN


@jit()
def _ftz(v):
    return np.float32(0.0) * v if abs(v) < F32_TINY else v


@jit()
def dpbf16_lane(c, x0, y0, x1, y1):
    """One float32 lane of ``VDPBF16PS``: the odd pair first, each an FMA with DAZ inputs and an FTZ result."""
    c = _ftz(fma32(_daz(x1), _daz(y1), c))
    return _ftz(fma32(_daz(x0), _daz(y0), c))


@jit()
def vec_dot_bf16(n, x, y, L):
    """``vec.cpp: ggml_vec_dot_bf16``; ``x``, ``y`` hold the BF16 values as float32 (exact)."""
    i = 0
    sumf = np.float64(0.0)
    if L == 16:  # __AVX512BF16__: c1 over values [i, i+32), c2 over [i+32, i+64)
        c = np.zeros((2, 16), np.float32)
        while i + 64 <= n:
            for h in range(2):
                for lane in range(16):
                    k = i + 32 * h + 2 * lane
                    c[h, lane] = dpbf16_lane(c[h, lane], x[k], y[k], x[k + 1], y[k + 1])
            i += 64
        sumf += np.float64(reduce_add_ps(c[0], 0))
        sumf += np.float64(reduce_add_ps(c[1], 0))
    else:  # __AVX2__: c1..c4 over values [i+8j, i+8j+8)
        c = np.zeros((4, 8), np.float32)
        while i + 32 <= n:
            for j in range(4):
                for lane in range(8):
                    k = i + 8 * j + lane
                    c[j, lane] = fma32(x[k], y[k], c[j, lane])
            i += 32
        v = np.empty(8, np.float32)
        for lane in range(8):
            v[lane] = (c[0, lane] + c[2, lane]) + (c[1, lane] + c[3, lane])
        sumf += np.float64(hsum_float_8(v, 0))
    for k in range(i, n):
        sumf += np.float64(x[k] * y[k])
    return np.float32(sumf)


@jit()
def vec_dot_float_rows(w, x, out, kind, L):
    """``out[t, r] = vec_dot(w[r], x[t])`` for ``kind`` 0 = F32, 1 = F16, 2 = BF16 (values as float32)."""
    K = w.shape[1]
    for t in range(x.shape[0]):
        for r in range(w.shape[0]):
            if kind == 0:
                out[t, r] = vec_dot_f32(K, w[r], x[t], L)
            elif kind == 1:
                out[t, r] = vec_dot_f16(K, w[r], x[t], L)
            else:
                out[t, r] = vec_dot_bf16(K, w[r], x[t], L)


@jit()
def tinyblas_rows(w, x, out, KN, L, dpbf16):
    """``sgemm.cpp: tinyBLAS::gemm_bloc`` for every element: ``out[t, r] = hsum(Cv)`` with the ``L``-lane
    accumulator ``Cv`` fed ``KN`` values of row ``w[r]`` (A) and ``x[t]`` (B) per step: ``_mm*_fmadd_ps``
    (KN = L), or ``_mm512_dpbf16_ps`` (``dpbf16``: KN = 32 bf16 values, two per lane)."""
    K = w.shape[1]
    cv = np.empty(L, np.float32)
    for t in range(x.shape[0]):
        for r in range(w.shape[0]):
            cv[:] = np.float32(0.0)
            for l0 in range(0, K, KN):
                for lane in range(L):
                    if dpbf16:
                        k = l0 + 2 * lane
                        cv[lane] = dpbf16_lane(cv[lane], w[r, k], x[t, k], w[r, k + 1], x[t, k + 1])
                    else:
                        cv[lane] = fma32(w[r, l0 + lane], x[t, l0 + lane], cv[lane])
            out[t, r] = reduce_add_ps(cv, 0) if L == 16 else hsum_float_8(cv, 0)
