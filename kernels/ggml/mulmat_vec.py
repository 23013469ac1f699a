"""Float dot products of ggml-cpu's ``mul_mat``, bit for bit: the F16/BF16 conversions, horizontal sums, the
F32/F16/BF16 ``vec_dot`` kernels and llamafile's float ``tinyBLAS`` (used by :mod:`kernels.ggml.mulmat`).

Lane counts and orders, per emulated path (``L`` = float32 lanes of one vector: 16 on ``avx512``, 8 on
``avx2``), read from the C and checked against the disassembly of both libggml-cpu builds:

* horizontal sums — :mod:`kernels.ggml.simd`: :func:`~kernels.ggml.simd.hsum_fold` (``arch/x86/quants.c:
  hsum_float_8``, llamafile's ``hsum(__m256)``, GCC's ``_mm512_reduce_add_ps``).
* ``vec.cpp: ggml_vec_dot_f32`` / ``ggml_vec_dot_f16`` — :mod:`kernels.ggml.vec` (shared with flash
  attention and the delta net): ``GGML_F32_ARR`` = 4 accumulators of ``L`` lanes, the F32 dot's leftovers
  as GCC vectorized them in order, the F16 dot's in double.
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

import functools

import numpy as np

from numba import prange
from numba.extending import overload

from kernels.base.flags import ERROR_MODEL, FASTMATH, JIT_ENABLED, jit
from kernels.ggml.simd import fma32, hsum_fold, vfma, vfma_rows4, vfma_rows4x2
from kernels.ggml.vec import vec_dot_f16, vec_dot_f32
from kernels.ggml.vecmath import F16_TO_F32

F32_TINY = np.float32(1.1754944e-38)  # FLT_MIN: smallest normal float32


# --------------------------------------------------------------------------------------------
# Conversions (the activations' from_float, F16/BF16 weights, fp16 scales) — exact, numpy


def f16_bits_to_f32(h: np.ndarray) -> np.ndarray:
    """binary16 bits -> float32 as ``vcvtph2ps`` / ggml's table give them (a signalling NaN is quieted)."""
    return F16_TO_F32[np.asarray(h, np.uint16)]


def fp32_to_fp16_values(x: np.ndarray) -> np.ndarray:
    """``ggml_cpu_fp32_to_fp16`` (``_mm*_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)``), back as float32 values:
    nearest even, overflow to inf; a NaN keeps its sign and top 10 mantissa bits, the quiet bit set."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32)
    nan_h = ((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF)
    return f16_bits_to_f32(np.where(np.isnan(x), nan_h, h).astype(np.uint16))


def bf16_bits_to_f32(h: np.ndarray) -> np.ndarray:
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)


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
    """``vec.cpp: ggml_vec_dot_bf16``; ``x``, ``y`` hold the BF16 values as float32 (exact). ``L``: the path's SIMD
    code; the AArch64 builds (NEON, SVE codes) have no BF16 branch there: the scalar loop alone."""
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
        sumf += np.float64(hsum_fold(c[0], 0, 16))  # _mm512_reduce_add_ps(c1)
        sumf += np.float64(hsum_fold(c[1], 0, 16))
    elif L == 8:  # __AVX2__: c1..c4 over values [i+8j, i+8j+8)
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
        sumf += np.float64(hsum_fold(v, 0, 8))  # hsum_float_8
    for k in range(i, n):
        sumf += np.float64(x[k] * y[k])
    return np.float32(sumf)


@functools.cache
def float_rows(kind: int, lanes: int = -1):
    """:func:`vec_dot_float_rows` for one ``kind`` and, given, one path's SIMD code ``lanes``, each a compile-time
    constant: only that kind's dot and that path's branches compile (F32: 2.9 -> 1.3 s of a first run, the same
    speed: 256 x 2048 and 512 x 256, T = 1 and 4, *EPYC* 2026-12-05). With ``lanes`` -1 the kernel reads the code from
    its argument ``L`` (:data:`F32_ROWS`, for compiled callers that pass the code on)."""

    @jit(variant="" if lanes < 0 else f"l{lanes}")
    def vec_dot_float_rows(w, x, out, L):
        code = L if lanes < 0 else lanes
        K = w.shape[1]
        acc = np.empty((4, 16), np.float32)  # vec.dot_scratch
        for t in range(x.shape[0]):
            for r in range(w.shape[0]):
                if kind == 0:
                    out[t, r] = vec_dot_f32(K, w[r], x[t], code, acc)
                elif kind == 1:
                    out[t, r] = vec_dot_f16(K, w[r], x[t], code, acc)
                else:
                    out[t, r] = vec_dot_bf16(K, w[r], x[t], code)

    return vec_dot_float_rows


def vec_dot_float_rows(w, x, out, kind: int, L: int) -> None:
    """``out[t, r] = vec_dot(w[r], x[t])`` for ``kind`` 0 = F32, 1 = F16, 2 = BF16 (values as float32); ``L``: the
    path's SIMD code (AArch64: :func:`kernels.ggml.isa.f16_code`, which the F32 dot reads as NEON on arm64-base)."""
    float_rows(int(kind), int(L))(w, x, out, L)


F32_ROWS = float_rows(0)  # vec_dot_float_rows(…, 0, L) for compiled callers: F32_ROWS(w, x, out, L)


@jit()
def _tinyblas_block(w, x, out, r0, r1, KN, L, dpbf16, acc):
    """Rows ``r0 … r1-1`` of ``w`` against every row of ``x`` (:func:`tinyblas_rows`), four activation rows at a time
    (four independent accumulators: what changes is only when an element is computed), two weight rows at a time
    where ``x`` has a multiple of four rows (eight accumulators). ``acc`` (8, ≥ L) scratch."""
    K, T = w.shape[1], x.shape[0]
    vec = not dpbf16 and (L == 16 or L == 8)  # one _mm*_fmadd_ps per step: vfma (rows contiguous)
    r = r0
    if vec and T % 4 == 0:  # pairs of weight rows, eight chains in registers (four alone wait on the FMA's latency)
        while r + 1 < r1:
            for t0 in range(0, T, 4):
                acc[:, :L] = np.float32(0.0)
                vfma_rows4x2(acc, w[r], w[r + 1], x[t0], x[t0 + 1], x[t0 + 2], x[t0 + 3], K, L)
                for h in range(2):
                    for j in range(4):
                        out[t0 + j, r + h] = hsum_fold(acc[4 * h + j], np.int64(0), L)
            r += 2
    for r in range(r, r1):
        wr = w[r]
        for t0 in range(0, T, 4):
            nb = min(4, T - t0)
            acc[:nb, :L] = np.float32(0.0)
            if vec and nb == 4:  # the four chains interleaved, in registers
                vfma_rows4(acc, wr, x[t0], x[t0 + 1], x[t0 + 2], x[t0 + 3], K, L)
            elif vec:
                for j in range(nb):
                    xj = x[t0 + j]
                    for l0 in range(0, K, KN):
                        vfma(acc, j, wr, xj, l0, L)
            else:
                for j in range(nb):
                    for l0 in range(0, K, KN):
                        for lane in range(L):
                            if dpbf16:
                                k = l0 + 2 * lane
                                acc[j, lane] = dpbf16_lane(acc[j, lane], wr[k], x[t0 + j, k], wr[k + 1], x[t0 + j, k + 1])
                            else:
                                acc[j, lane] = fma32(wr[l0 + lane], x[t0 + j, l0 + lane], acc[j, lane])
            for j in range(nb):
                out[t0 + j, r] = hsum_fold(acc[j], np.int64(0), L)  # hsum(Cv): _mm512_reduce_add_ps / hsum_float_8


@jit()
def _tinyblas_rows(w, x, out, KN, L, dpbf16):
    """:func:`tinyblas_rows` in compiled code (one block of every row, on the calling thread)."""
    _tinyblas_block(w, x, out, 0, w.shape[0], KN, L, dpbf16, np.empty((8, 16), np.float32))


TINYBLAS_ROWS = 16  # weight rows per work item of tinyblas_rows_parallel


@functools.cache
def _tinyblas_for(KN: int, L: int, dpbf16: bool, parallel: bool):
    """The tinyBLAS kernel for these constants (only their branches compile; ``parallel``: blocks of
    :data:`TINYBLAS_ROWS` weight rows split between threads, each element still one thread's, in one order)."""

    def tinyblas_rows(w, x, out):
        if not parallel:  # _tinyblas_rows' one block, called here directly: one level of compiled calls less
            _tinyblas_block(w, x, out, 0, w.shape[0], KN, L, dpbf16, np.empty((8, 16), np.float32))
            return
        N = w.shape[0]
        for b in prange((N + TINYBLAS_ROWS - 1) // TINYBLAS_ROWS):
            r0 = b * TINYBLAS_ROWS
            _tinyblas_block(w, x, out, r0, min(N, r0 + TINYBLAS_ROWS), KN, L, dpbf16, np.empty((8, 16), np.float32))

    return jit(parallel=parallel, variant="parallel" if parallel else "")(tinyblas_rows)  # twins named apart


def tinyblas_rows(w, x, out, KN, L, dpbf16) -> None:
    """``sgemm.cpp: tinyBLAS::gemm_bloc`` for every element: ``out[t, r] = hsum(Cv)`` with the ``L``-lane
    accumulator ``Cv`` fed ``KN`` values of row ``w[r]`` (A) and ``x[t]`` (B) per step: ``_mm*_fmadd_ps``
    (KN = L), or ``_mm512_dpbf16_ps`` (``dpbf16``: KN = 32 bf16 values, two per lane). Rows contiguous. Serial
    (attention's P·V calls it per head, compiled: :func:`_tinyblas_rows`); :func:`tinyblas_rows_parallel` splits
    the weight rows between threads."""
    _tinyblas_for(int(KN), int(L), bool(dpbf16), False)(w, x, out)


def tinyblas_rows_parallel(w, x, out, KN, L, dpbf16) -> None:
    """:func:`tinyblas_rows` with blocks of :data:`TINYBLAS_ROWS` weight rows split between threads: each element
    still computed by one thread in the same order, the same bits at any thread count."""
    _tinyblas_for(int(KN), int(L), bool(dpbf16), True)(w, x, out)


if JIT_ENABLED:
    @overload(tinyblas_rows, jit_options=dict(fastmath=FASTMATH, error_model=ERROR_MODEL), prefer_literal=True)
    def _tinyblas_rows_typed(w, x, out, KN, L, dpbf16):
        """:func:`tinyblas_rows` called from compiled code (attention's P·V): :func:`_tinyblas_rows`."""
        return lambda w, x, out, KN, L, dpbf16: _tinyblas_rows(w, x, out, KN, L, dpbf16)
