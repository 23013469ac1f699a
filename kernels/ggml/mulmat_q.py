"""The legacy 32-value block weights (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) in a plain CPU buffer, in ggml-cpu's
``mul_mat`` / ``mul_mat_id``, bit for bit on the ``avx512`` and ``avx2`` paths.

(A Q4_0 / IQ4_NL matrix of N % 8 == 0 rows in llama.cpp's CPU_REPACK buffer runs :mod:`kernels.ggml.repack`
instead; the legacy types are never tiled.) The activations are quantized by the x86 ``quantize_row_q8_0``
(Q4_0, Q5_0, IQ4_NL) or ``quantize_row_q8_1`` (Q4_1, Q5_1) of :mod:`kernels.ggml.actquant`; ``x.d``, ``x.m``,
``y.d`` and ``y.s`` below are fp16 fields read as float32. ``w`` is the weight's integer value: Q4_0 ``q - 8``,
Q5_0 ``(q | qh_bit << 4) - 16``, IQ4_NL ``kvalues_iq4nl[q]``; Q4_1 ``q`` and Q5_1 ``q | qh_bit << 4`` (unsigned).
``dot_l`` is the exact integer dot of values ``4l … 4l+3`` of a block (``dpbusd`` on avx512, ``maddubs`` +
``madd`` on avx2: no int16 saturation is reachable, ``|w| <= 127``).

* Q4_0, Q5_0 (``arch/x86/quants.c: ggml_vec_dot_q4_0_q8_0``, ``_q5_0_q8_0``, ``__AVX2__`` branch, both builds)
  and ``llamafile/sgemm.cpp: tinyBLAS_Q0_AVX`` (``T >= 2``; Q4_0, Q5_0, IQ4_NL, any shape: ``gemm``,
  ``gemm4xN``, ``gemmMx4`` alike) are Q8_0's formula: ``acc[l] = fma(x.d·y.d, float(dot_l), acc[l])`` in
  block order, ``hsum_float_8(acc)``, with ``_mm256_sign_epi8`` (an activation byte -128 against a negative
  ``w`` counts ``-128·|w|``). The weights are re-expressed as Q8_0 blocks (the fp16 ``d`` bits, the 32 values)
  and run through :func:`kernels.ggml.mulmat.q8_0_mul_mat` — the same operations.
* IQ4_NL ``vec_dot`` (``T = 1`` and ``mul_mat_id``): ``ggml_vec_dot_iq4_nl_q8_0`` is MXFP4's structure — block
  pairs into two 8-lane accumulators, ``d = y.d·x.d``, ``hsum_float_8(accum1 + accum2)``, an odd last block
  by the scalar tail ``sumf += d·float(Σ w·q8)``, compiled ``vmulss`` + ``vaddss`` by GCC tuned for AMD Zen
  (avx512, avx2-zen) and ``vfmadd231ss`` otherwise (avx2; :mod:`kernels.ggml.tuning`): :func:`kernels.ggml.mulmat.mxfp4_rows`.
* Q4_1, Q5_1 (``ggml_vec_dot_q4_1_q8_1``, ``_q5_1_q8_1``; llamafile has no case for them: always ``vec_dot``):
  ``acc[l] = fma(x.d·y.d, float(dot_l), acc[l])``, ``summs = fma(x.m, y.s, summs)`` (GCC contracts
  ``summs += m·s`` to ``vfmadd231ss`` in both builds), result ``hsum_float_8(acc) + summs`` (``vaddss`` with the
  hsum as first source: when both are NaN, the hsum's NaN is kept — modelled, as x86 does it).

``mul_mat_id`` runs ``vec_dot`` for every element (no llamafile): for Q4_0 / Q5_0 that is the same formula.
"""

from __future__ import annotations

import numpy as np

from kernels.base.block import QT
from kernels.base.flags import jit
from kernels.ggml import mulmat_q8 as _mm
from kernels.ggml.actquant import _q8_0_rows
from kernels.ggml.simd import fma32, hsum_fold, simd
from kernels.ggml.vecmath import F16_TO_F32
from kernels.plain.dequant import IQ4NL_VALUES

Q8_0_ACT = frozenset({QT.Q4_0, QT.Q5_0, QT.IQ4_NL})  # vec_dot_type Q8_0
Q8_1_ACT = frozenset({QT.Q4_1, QT.Q5_1})  # vec_dot_type Q8_1
LEGACY_TYPES = Q8_0_ACT | Q8_1_ACT
SGEMM_TYPES = Q8_0_ACT  # llamafile_sgemm: tinyBLAS_Q0_AVX<block_q4_0 / block_q5_0 / block_iq4_nl, block_q8_0>
BLOCK_BYTES = {QT.Q4_0: 18, QT.Q4_1: 20, QT.Q5_0: 22, QT.Q5_1: 24, QT.IQ4_NL: 18}


def decode(w_bytes: np.ndarray, qtype):
    """Weight rows (N, nb·block bytes) -> (values (N, K) int16, ``d`` bits (N, nb) uint16, ``m`` bits or None).
    Value ``j < 16`` of a block comes from the low nibble of ``qs[j]``, ``j >= 16`` from the high nibble of
    ``qs[j - 16]``; the fifth bit (Q5_0, Q5_1) is bit ``j`` of the little-endian ``qh``."""
    qtype = _mm._qt(qtype)
    N = w_bytes.shape[0]
    blk = np.ascontiguousarray(w_bytes, np.uint8).reshape(N, -1, BLOCK_BYTES[qtype])  # (N, nb, block bytes)
    d = blk[:, :, 0:2].copy().view(np.uint16)[:, :, 0]
    m = blk[:, :, 2:4].copy().view(np.uint16)[:, :, 0] if qtype in Q8_1_ACT else None
    qs_at = {QT.Q4_0: 2, QT.IQ4_NL: 2, QT.Q4_1: 4, QT.Q5_0: 6, QT.Q5_1: 8}[qtype]
    qs = blk[:, :, qs_at:qs_at + 16].astype(np.int16)
    v = np.concatenate([qs & 15, qs >> 4], axis=2)  # (N, nb, 32) codes
    if qtype in (QT.Q5_0, QT.Q5_1):
        qh = blk[:, :, qs_at - 4:qs_at].copy().view(np.uint32)  # (N, nb, 1)
        v |= (((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int16)
    if qtype == QT.Q4_0:
        v -= 8
    elif qtype == QT.Q5_0:
        v -= 16
    elif qtype == QT.IQ4_NL:
        v = IQ4NL_VALUES.astype(np.int16)[v]
    return v.reshape(N, -1), d, m


def as_q8_0(w_bytes: np.ndarray, qtype) -> np.ndarray:
    """Q4_0 / Q5_0 / IQ4_NL rows re-expressed as Q8_0 rows (N, nb·34) viewed as int8: per block the same fp16
    ``d`` bits, then the 32 signed values (all within int8)."""
    v, d, _ = decode(w_bytes, qtype)
    N, K = v.shape
    out = np.empty((N, K // 32, 34), np.uint8)
    out[:, :, 0:2] = d[:, :, None].view(np.uint8)
    out[:, :, 2:] = v.reshape(N, -1, 32).astype(np.int8).view(np.uint8)
    return out.reshape(N, -1).view(np.int8)


@jit()
def q1_rows(wv, wd, wm, xq, xd, xs, out):
    """``ggml_vec_dot_q4_1_q8_1`` / ``_q5_1_q8_1`` (x86 __AVX2__) for every element: ``wv`` (N, K) unsigned
    values, ``wd`` / ``wm`` (N, K/32) float32 ``d`` / ``m``; ``xq`` (T, K) int8, ``xd`` / ``xs`` (T, K/32) the Q8_1
    activations' ``d`` / ``s``; out (T, N)."""
    nb = wd.shape[1]
    acc = np.empty(8, np.float32)
    for t in range(xq.shape[0]):
        for r in range(wv.shape[0]):
            acc[:] = np.float32(0.0)
            summs = np.float32(0.0)
            for b in range(nb):
                summs = fma32(wm[r, b], xs[t, b], summs)  # summs += FP16_TO_FP32(x.m) * FP16_TO_FP32(y.s)
                d = wd[r, b] * xd[t, b]  # _mm256_mul_ps(d0v, d1v) (Q5_1: dx * dy)
                for lane in range(8):
                    s = np.int64(0)
                    for k in range(32 * b + 4 * lane, 32 * b + 4 * lane + 4):
                        s += np.int64(wv[r, k]) * np.int64(xq[t, k])  # mul_sum_us8_pairs_float: unsigned w
                    acc[lane] = fma32(d, np.float32(s), acc[lane])  # _mm256_fmadd_ps
            h = hsum_fold(acc, 0, 8)  # hsum_float_8(acc)
            out[t, r] = h if h != h else h + summs  # vaddss: a NaN sum keeps hsum's NaN (the first source)


def mul_mat_q(w_bytes: np.ndarray, qtype, x: np.ndarray, path: str, sgemm: bool) -> np.ndarray:
    """``mul_mat`` of legacy-type rows ``w_bytes`` (N, row bytes) with float32 ``x`` (T, K) -> (T, N): llamafile's
    ``tinyBLAS_Q0_AVX`` (``sgemm``: T >= 2, Q4_0 / Q5_0 / IQ4_NL) or ``vec_dot``."""
    qtype = _mm._qt(qtype)
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty((x.shape[0], w_bytes.shape[0]), np.float32)
    if qtype in Q8_1_ACT:
        xq, xd, xs = _q8_0_rows(x, True)  # x86 quantize_row_q8_1
        v, d, m = decode(w_bytes, qtype)
        q1_rows(v.astype(np.uint8), F16_TO_F32[d], F16_TO_F32[m], xq, xd, xs, out)
    elif qtype == QT.IQ4_NL and not sgemm:
        xq, xd, _ = _q8_0_rows(x, False)  # x86 quantize_row_q8_0
        v, d, _ = decode(w_bytes, qtype)
        _mm.mxfp4_rows(v.astype(np.int8), F16_TO_F32[d], xq, xd, out, not simd(path).split_chains)
    else:  # Q4_0, Q5_0 (vec_dot or tinyBLAS), IQ4_NL (tinyBLAS): Q8_0's formula
        _mm.q8_0_mul_mat(as_q8_0(w_bytes, qtype), x, out, F16_TO_F32)
    return out


__all__ = ["LEGACY_TYPES", "SGEMM_TYPES", "decode", "mul_mat_q"]
