"""``ggml_mul_mat`` and ``ggml_mul_mat_id`` as ggml-cpu computes them, bit for bit, on the ``avx512`` and
``avx2`` paths (weights ``W`` of a ggml type in a plain CPU buffer — not repacked —, F32 activations, F32 out).

Which kernel an element takes (``ggml-cpu.c: ggml_compute_forward_mul_mat``), with ``T`` = activation rows
(``ne11``), ``N`` = weight rows (``ne01``), ``K`` = row length (``ne00``), ``L`` = 16 (avx512) or 8 (avx2):

1. ``tiled/tiled.cpp: ggml_compute_forward_mul_mat_tiled`` first: K-quant and IQ weights (Q2_K…Q6_K, IQ4_XS,
   the IQ1/2/3 types) with ``T >= 8`` (:mod:`kernels.ggml.mulmat_k`).
2. ``llamafile_sgemm`` on the F32 activations (needs ``T >= 2``): only F32 weights pass (``tinyBLAS`` with
   ``KN = L``; it declines unless ``K % KN == 0`` and ``N % 4 == 0``).
3. The activations are converted to the weight's ``vec_dot_type`` (``from_float``: F16 ``vcvtps2ph``,
   BF16 ``ggml_compute_fp32_to_bf16``, Q8_0 x86 ``quantize_row_q8_0``, Q8_K ``quantize_row_q8_K_ref`` —
   :mod:`kernels.ggml.actquant`), split across threads by whole blocks, which changes nothing.
4. ``llamafile_sgemm`` again (``T >= 2``): F16 (``tinyBLAS``, KN = L), BF16 (avx512: ``_mm512_dpbf16_ps``,
   KN = 32; avx2: KN = 8), Q8_0 (``tinyBLAS_Q0_AVX``, any shape).
5. Else one ``vec_dot`` per element (``nrows`` = 1 on x86): :mod:`kernels.ggml.mulmat_vec` for floats, here
   for Q8_0 and MXFP4, :mod:`kernels.ggml.mulmat_k` for the K-quants.

Every element is computed by one thread in one fixed order, so the thread count changes no bit on these
paths (the chunking only decides who computes what). Q8_0 is the same formula on every path — ``vec_dot``
(``arch/x86/quants.c: ggml_vec_dot_q8_0_q8_0``) and ``tinyBLAS_Q0_AVX`` (``gemm``, ``gemm4xN``,
``gemmMx4``) both keep 8 float lanes, lane ``l`` fed the exact integer dot of bytes ``4l … 4l+3`` of each
32-value block (``_mm256_dpbusd_epi32`` on avx512, ``maddubs``+``madd`` on avx2: no int16 saturation is
reachable), ``acc[l] = fma(d_w·d_x, float(dot), acc[l])`` with ``d_w·d_x`` rounded to float32, then
``hsum_float_8``. The ``_mm256_sign_epi8`` trick computes ``|w| · (x·sign w)`` in int8, so an activation
byte of -128 against a negative weight byte counts as -128 (not +128): :func:`_sign_dot`.

``ggml_mul_mat_id`` (``ggml_compute_forward_mul_mat_id``) groups the (token, slot) pairs by expert in token
order and runs ``vec_dot`` per element (no llamafile sgemm); K-quant experts with 8 or more routed rows go
to the tiled kernel. Activation row of (token t, slot s) is ``x[t, s % n_x]``.

Emulated weight types: F32, F16, BF16, Q8_0, MXFP4, Q4_K, Q5_K, Q6_K, IQ4_XS (others raise). ``avx512`` means
the build of this host (AVX-512 F/BW/DQ/VL with VNNI and BF16): without ``__AVX512BF16__`` ggml would take
other BF16 kernels. Not modelled: which NaN survives when two NaNs of different bits meet in one sum (an
activation or fp16-scale NaN payload and the default NaN of ``inf - inf`` / ``0·inf``) — x86 keeps the first
source operand's, i.e. it follows GCC's operand order per instruction; NaN-ness and all other bits match.
"""

from __future__ import annotations

import numpy as np

from kernels.base.block import QT
from kernels.base.blocks import row_bytes
from kernels.base.floats import E8M0_HALF
from kernels.base.flags import jit
from kernels.ggml import mulmat_k
from kernels.ggml.actquant import _q8_0_rows
from kernels.ggml.mulmat_vec import (
    bf16_bits_to_f32,
    f16_bits_to_f32,
    fp32_to_fp16_values,
    tinyblas_rows,
    vec_dot_float_rows,
)
from kernels.ggml.simd import PATHS, fma32, hsum_fold, lanes
from kernels.ggml.vecmath import cast_bf16 as fp32_to_bf16_bits  # ggml-impl.h: ggml_compute_fp32_to_bf16
from kernels.plain.dequant import MXFP4_VALUES

FLOAT_KIND = {QT.F32: 0, QT.F16: 1, QT.BF16: 2}


# --------------------------------------------------------------------------------------------
# Q8_0-activation weights: Q8_0 (vec_dot and tinyBLAS_Q0_AVX), MXFP4 (vec_dot)


@jit()
def _sign_dot(w, x):
    """One byte product of ``maddubs(sign(w, w), sign(x, w))`` (or ``dpbusd``): ``|w|`` (unsigned) times
    ``x`` negated when ``w < 0`` — negated in int8, so ``-(-128)`` stays -128."""
    wi = np.int64(w)
    xi = np.int64(x)
    if wi >= 0:
        return wi * xi
    sx = xi if xi == -128 else -xi  # _mm256_sign_epi8(x, w): wraps at -128
    return -wi * sx


@jit()
def q8_0_rows(wq, wd, xq, xd, out):
    """``ggml_vec_dot_q8_0_q8_0`` (= ``tinyBLAS_Q0_AVX``) for every element: ``wq`` (N, K) int8 and ``wd``
    (N, K/32) float32 the weight blocks, ``xq`` (T, K) / ``xd`` (T, K/32) the Q8_0 activations; out (T, N)."""
    nb = wd.shape[1]
    acc = np.empty(8, np.float32)
    for t in range(xq.shape[0]):
        for r in range(wq.shape[0]):
            acc[:] = np.float32(0.0)
            for b in range(nb):
                d = wd[r, b] * xd[t, b]  # GGML_CPU_FP16_TO_FP32(x.d) * GGML_CPU_FP16_TO_FP32(y.d), float32
                for lane in range(8):
                    s = 0
                    for e in range(4):
                        j = 32 * b + 4 * lane + e
                        s += _sign_dot(wq[r, j], xq[t, j])
                    acc[lane] = fma32(d, np.float32(s), acc[lane])  # _mm256_fmadd_ps(d, cvtepi32_ps(dot), acc)
            out[t, r] = hsum_fold(acc, 0, 8)  # hsum_float_8(acc)


@jit()
def mxfp4_rows(wv, we, xq, xd, out, fused_tail):
    """``arch/x86/quants.c: ggml_vec_dot_mxfp4_q8_0`` (__AVX2__ branch, both builds) for every element.

    ``wv`` (N, K) int8 the ``kvalues_mxfp4`` values, ``we`` (N, K/32) float32 ``E8M0_TO_FP32_HALF`` scales.
    Blocks go in pairs to two 8-lane accumulators (even blocks ``accum1``, odd ``accum2``); their lane-wise
    sum is reduced by ``hsum_float_8``; an odd last block is added by the scalar tail, which GCC compiled
    as ``vmulss`` + ``vaddss`` on avx512 and contracted to ``vfmadd231ss`` on avx2 (``fused_tail``).
    """
    nb = we.shape[1]
    acc = np.empty((2, 8), np.float32)
    v = np.empty(8, np.float32)
    for t in range(xq.shape[0]):
        for r in range(wv.shape[0]):
            acc[:, :] = np.float32(0.0)
            ib = 0
            while ib + 1 < nb:
                for h in range(2):
                    b = ib + h
                    d = xd[t, b] * we[r, b]  # FP16_TO_FP32(y.d) * E8M0_TO_FP32_HALF(x.e)
                    for lane in range(8):
                        s = 0
                        for e in range(4):
                            j = 32 * b + 4 * lane + e
                            s += _sign_dot(wv[r, j], xq[t, j])  # mul_add_epi8 + madd_epi16(ones)
                        acc[h, lane] = fma32(d, np.float32(s), acc[h, lane])
                ib += 2
            for lane in range(8):
                v[lane] = acc[0, lane] + acc[1, lane]
            sumf = hsum_fold(v, 0, 8)  # hsum_float_8
            for b in range(ib, nb):
                d = xd[t, b] * we[r, b]
                si = 0
                for j in range(32 * b, 32 * b + 32):
                    si += np.int64(wv[r, j]) * np.int64(xq[t, j])
                if fused_tail:
                    sumf = fma32(d, np.float32(si), sumf)
                else:
                    sumf = sumf + d * np.float32(si)
            out[t, r] = sumf


def _q8_0_weights(w_bytes: np.ndarray):
    """Q8_0 rows (N, K/32·34) -> qs (N, K) int8, d (N, K/32) float32."""
    N = w_bytes.shape[0]
    blocks = w_bytes.reshape(N, -1, 34)
    d = f16_bits_to_f32(np.ascontiguousarray(blocks[:, :, :2]).view(np.uint16)[:, :, 0])  # (N, nb)
    return np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(N, -1), d


def _mxfp4_weights(w_bytes: np.ndarray):
    """MXFP4 rows (N, K/32·17) -> values (N, K) int8 (value j = low nibble of qs[j], j+16 = high), scales."""
    N = w_bytes.shape[0]
    blocks = w_bytes.reshape(N, -1, 17)
    qs = blocks[:, :, 1:]
    vals = np.concatenate([MXFP4_VALUES[qs & 0x0F], MXFP4_VALUES[qs >> 4]], axis=2)  # (N, nb, 32)
    return np.ascontiguousarray(vals.reshape(N, -1)), E8M0_HALF[blocks[:, :, 0]]


# --------------------------------------------------------------------------------------------
# Dispatch


#: ``repack.cpp: ggml_repack_get_optimal_repack_type`` on x86: the weight types llama.cpp's CPU_REPACK buffer (its
#: default, ``use_extra_bufts``) re-lays out into interleaved blocks, per path, for a matrix of N % 8 == 0 rows —
#: a gemm/gemv with one accumulator per output that :func:`mul_mat` does not emulate (docs/numerics.md).
REPACKED = {"avx2": frozenset({QT.Q4_0, QT.Q4_K, QT.IQ4_NL, QT.MXFP4}),
            "avx512": frozenset({QT.Q4_0, QT.Q4_K, QT.IQ4_NL, QT.MXFP4, QT.Q2_K})}


def repacked(qtype, n_rows: int, path: str) -> bool:
    """Whether llama.cpp with its default CPU_REPACK buffer repacks a weight of ``qtype`` with ``n_rows`` rows
    (ggml's ne[1], per expert for a 3-D tensor) on ``path``."""
    return QT(qtype) in REPACKED[path] and n_rows % 8 == 0


def kernel_for(qtype, path: str, T: int, N: int, K: int) -> str:
    """Which ggml-cpu kernel computes ``ggml_mul_mat`` of this shape: "tiled", "sgemm" or "vec_dot"."""
    qtype, L = QT(qtype), lanes(path)
    if qtype in mulmat_k.TILED_TYPES and T >= mulmat_k.TILED_MIN_ROWS:
        return "tiled"
    if T >= 2:
        if qtype == QT.Q8_0:
            return "sgemm"
        if qtype in FLOAT_KIND:
            kn = 32 if (qtype == QT.BF16 and path == "avx512") else L
            if K % kn == 0 and N % 4 == 0:
                return "sgemm"
    return "vec_dot"


def _check(w_bytes, qtype, x):
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2:
        raise ValueError(f"activations must be (T, K), got shape {x.shape}")
    T, K = x.shape
    w_bytes = np.ascontiguousarray(w_bytes).view(np.uint8)
    if w_bytes.ndim != 2 or w_bytes.shape[1] != row_bytes(qtype, K):
        raise ValueError(f"weights must be (N, {row_bytes(qtype, K)}) bytes of {QT(qtype).name} rows of {K}, "
                         f"got {w_bytes.shape}")
    return w_bytes, x


def mul_mat(w_bytes: np.ndarray, qtype, x: np.ndarray, path: str, n_threads: int = 1) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` as ggml-cpu's ``path`` computes it: ``w_bytes`` (N, row bytes) uint8 rows of
    ``qtype``, ``x`` (T, K) float32 -> (T, N) float32. ``n_threads`` is accepted for the record: no path
    emulated here changes a bit with it."""
    qtype = QT(qtype)
    w_bytes, x = _check(w_bytes, qtype, x)
    return _compute(w_bytes, qtype, x, path, kernel_for(qtype, path, x.shape[0], w_bytes.shape[0], x.shape[1]))


def _compute(w_bytes, qtype, x, path, how):
    """``mul_mat`` through kernel ``how`` ("tiled", "sgemm" or "vec_dot")."""
    L = lanes(path)
    out = np.empty((x.shape[0], w_bytes.shape[0]), np.float32)
    if qtype in FLOAT_KIND:
        kind = FLOAT_KIND[qtype]
        if kind == 0:
            w, xv = w_bytes.view(np.float32), x
        elif kind == 1:
            w, xv = f16_bits_to_f32(w_bytes.view(np.uint16)), fp32_to_fp16_values(x)
        else:
            w, xv = bf16_bits_to_f32(w_bytes.view(np.uint16)), bf16_bits_to_f32(fp32_to_bf16_bits(x))
        if how == "sgemm":
            dp = kind == 2 and path == "avx512"
            tinyblas_rows(w, xv, out, 32 if dp else L, L, dp)
        else:
            vec_dot_float_rows(w, xv, out, kind, L)
        return out
    if qtype in (QT.Q8_0, QT.MXFP4):
        xq, xd, _ = _q8_0_rows(x, False)  # x86 quantize_row_q8_0; xd holds the fp16 d values
        if qtype == QT.Q8_0:
            q8_0_rows(*_q8_0_weights(w_bytes), xq, xd, out)
        else:
            mxfp4_rows(*_mxfp4_weights(w_bytes), xq, xd, out, path == "avx2")
        return out
    if qtype in mulmat_k.KQUANT_TYPES:
        return mulmat_k.mul_mat_k(w_bytes, qtype, x, path, how == "tiled")
    raise ValueError(f"mul_mat emulation: weight type {qtype.name} is not emulated")


def mul_mat_id(w_bytes: np.ndarray, qtype, x: np.ndarray, ids: np.ndarray, path: str, n_threads: int = 1):
    """``ggml_mul_mat_id(W, x, ids)``: ``w_bytes`` (E, N, row bytes) expert weights, ``x`` (T, n_x, K) float32
    with ``n_x`` = 1 (shared by all slots) or ``n_used``, ``ids`` (T, n_used) int32 expert of each slot ->
    (T, n_used, N) float32; slot ``s`` of token ``t`` is ``W[ids[t, s]] @ x[t, s % n_x]``."""
    qtype = QT(qtype)
    x = np.ascontiguousarray(x, np.float32)
    w_bytes = np.ascontiguousarray(w_bytes).view(np.uint8)
    ids = np.asarray(ids, np.int32)
    E, N = w_bytes.shape[:2]
    T, n_x, K = x.shape
    n_used = ids.shape[1]
    if ids.shape[0] != T or (ids < 0).any() or (ids >= E).any():
        raise ValueError(f"ids must be (T={T}, n_used) experts in [0, {E}), got shape {ids.shape}")
    if w_bytes.ndim != 3 or w_bytes.shape[2] != row_bytes(qtype, K):
        raise ValueError(f"weights must be (E, N, {row_bytes(qtype, K)}) bytes, got {w_bytes.shape}")
    out = np.empty((T, n_used, N), np.float32)
    for e in range(E):  # ggml groups the rows by expert: matrix_rows[e] = (slot, token) in token order
        t_idx, s_idx = np.nonzero(ids == e)
        if len(t_idx) == 0:
            continue
        rows = np.ascontiguousarray(x[t_idx, s_idx % n_x])  # (cne1, K): this expert's rows, token order
        tiled = qtype in mulmat_k.TILED_TYPES and len(t_idx) >= mulmat_k.TILED_MIN_ROWS
        out[t_idx, s_idx] = _compute(w_bytes[e], qtype, rows, path, "tiled" if tiled else "vec_dot")
    return out


__all__ = ["mul_mat", "mul_mat_id", "kernel_for", "lanes", "PATHS", "fp32_to_bf16_bits", "fp32_to_fp16_values"]
