"""``ggml_mul_mat`` / ``ggml_mul_mat_id`` on ggml's generic x86 path (a libggml-cpu built without SIMD:
docs/ggml-generic-x86.md §2–3), bit for bit, for every weight type but TQ1_0 / TQ2_0.

On that path nothing but ``vec_dot`` runs: llamafile's sgemm declines every type without ``__AVX__``, the tiled
K-quant kernel is a stub, and the CPU_REPACK buffer takes nothing. So every element, whatever the row count, is one
``vec_dot`` of its weight row with the activation row converted to the type's ``vec_dot_type`` (``from_float``),
and no product is fused (the target has no FMA). The dots are ggml-cpu/quants.c's ``*_generic`` functions (x86's
own Q8_0, Q4_0, MXFP4 and IQ4_NL functions run their scalar loops, the same C), transcribed in
:mod:`kernels.ggml.actdots` / :mod:`kernels.ggml.actdots_iq` (the ``--emulate`` act-quant path's dots; F32 / F16 /
BF16 a double sum of float products). What is this path's own is the activations' conversion:

* Q8_0 / Q8_1 by ggml-quants.c's ``quantize_row_q8_0_ref`` / ``_q8_1_ref`` — not x86's AVX ``quantize_row_q8_0``:
  ``amax = MAX(amax, fabsf(v))`` in order (a NaN is kept only if no later value replaces it: ``NaN > v`` is false),
  ``d = amax/127``, ``id = d ? 1.0f/d : 0`` (AVX: ``127/amax``), ``qs = (int8_t)roundf(x*id)`` — half away from zero
  (AVX: to even), the float truncated to int32 (NaN and out-of-range: INT_MIN) and then to its low byte —,
  ``y.d = fp16(d)`` (portable), Q8_1's ``s = fp16((float)Σqs · d)``;
* Q8_K by ``quantize_row_q8_K_ref``, as in every build;
* F16 by ``ggml_cpu_fp32_to_fp16``'s scalar form, ggml-impl.h's portable conversion (a NaN -> sign | 0x7E00),
  BF16 by ``ggml_cpu_fp32_to_bf16``.
"""

from __future__ import annotations

import numpy as np

from kernels.base.block import QT
from kernels.base.flags import jit
from kernels.ggml.actdots import _matmul_float, _matmul_q8_0, _matmul_q8_1, _matmul_q8_k
from kernels.ggml.actquant import _q8_k_rows
from kernels.ggml.mulmat_q8 import slot_groups
from kernels.ggml.vecmath import F16_TO_F32, cast_bf16, cast_f16, f16_value

F32 = np.float32
Q8_0_ACT = frozenset({QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.MXFP4, QT.IQ4_NL})  # vec_dot_type Q8_0
Q8_1_ACT = frozenset({QT.Q4_1, QT.Q5_1})  # Q8_1
Q8_K_ACT = frozenset({QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS, QT.IQ1_S, QT.IQ1_M, QT.IQ2_XXS, QT.IQ2_XS,
                      QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S})  # Q8_K
TYPES = frozenset({QT.F32, QT.F16, QT.BF16}) | Q8_0_ACT | Q8_1_ACT | Q8_K_ACT  # emulated on the generic path


@jit()
def _roundf_to_i8(v):
    """``(int8_t)roundf(v)`` as GCC compiles it on x86: roundf (half away from zero), ``cvttss2si`` (NaN and values
    outside int32: INT_MIN), the low byte."""
    if v != v or not (np.float64(-2147483648.0) <= np.float64(v) < np.float64(2147483648.0)):
        return np.int8(0)  # INT_MIN's low byte
    a = np.floor(np.abs(np.float64(v)) + 0.5)  # exact in double for |v| < 2^31
    i = np.int64(a) if v >= 0 else -np.int64(a)
    return np.int8(((i + 128) & 255) - 128)


@jit()
def _quantize_rows_q8_0_ref(x, qs, d, s=None):
    """ggml-quants.c ``quantize_row_q8_0_ref`` of every row: qs (T, K) int8, d (T, K/32) the fp16 d as float32; with
    ``s`` (T, K/32), ``quantize_row_q8_1_ref`` (the same quants, and ``s = fp16((float)Σ qs · d)``)."""
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            o = 32 * b
            amax = F32(0.0)
            for j in range(32):
                a = np.abs(x[r, o + j])
                amax = amax if amax > a else a  # MAX(amax, fabsf(v))
            dd = F32(amax / F32(127.0))
            inv = F32(F32(1.0) / dd) if dd != 0 else F32(0.0)  # a NaN d is "true": 1/NaN
            d[r, b] = f16_value(dd)  # GGML_FP32_TO_FP16(d), portable
            total = 0
            for j in range(32):
                qs[r, o + j] = _roundf_to_i8(F32(x[r, o + j] * inv))
                total += np.int64(qs[r, o + j])
            if s is not None:  # y[i].s = GGML_FP32_TO_FP16(sum*d)
                s[r, b] = f16_value(F32(F32(total) * dd))


def mul_mat(w_bytes: np.ndarray, qtype, x: np.ndarray) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` on the generic path: ``w_bytes`` (N, row bytes), ``x`` (T, K) float32 -> (T, N). The
    activations converted by ``from_float`` (the ``_ref`` quantizers, the portable F16 conversion), then every element
    by the type's generic ``vec_dot`` (:mod:`kernels.ggml.actdots`, :mod:`kernels.ggml.actdots_iq`)."""
    qtype = QT(qtype)
    if qtype not in TYPES:
        raise ValueError(f"mul_mat emulation: {qtype.name} weights on ggml's generic x86 path are not emulated "
                         f"(emulated there: {', '.join(t.name for t in sorted(TYPES))})")
    x = np.ascontiguousarray(x, np.float32)
    w = np.ascontiguousarray(w_bytes, np.uint8)
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    kind = int(qtype)
    if qtype in Q8_0_ACT:
        qs, d = np.empty(x.shape, np.int8), np.empty((x.shape[0], x.shape[1] // 32), np.float32)
        _quantize_rows_q8_0_ref(x, qs, d)
        _matmul_q8_0(kind)(w, qs, d, out)
    elif qtype in Q8_1_ACT:
        qs, d = np.empty(x.shape, np.int8), np.empty((x.shape[0], x.shape[1] // 32), np.float32)
        s = np.empty_like(d)
        _quantize_rows_q8_0_ref(x, qs, d, s)
        _matmul_q8_1(kind)(w, qs, d, s, out)
    elif qtype in Q8_K_ACT:
        _matmul_q8_k(kind)(w, *_q8_k_rows(x), out)  # quantize_row_q8_K_ref, as in every build
    else:  # F32 as it is; F16 / BF16 by ggml_cpu_fp32_to_fp16 (portable) / _bf16
        xr = x if qtype == QT.F32 else F16_TO_F32[cast_f16(x).view(np.uint16)] if qtype == QT.F16 else \
            (cast_bf16(x).astype(np.uint32) << 16).view(np.float32)
        _matmul_float(kind)(w, np.ascontiguousarray(xr), out)
    return out


def mul_mat_id(w_bytes: np.ndarray, qtype, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``ggml_mul_mat_id`` on the generic path: ``w_bytes`` (E, N, row bytes), ``x`` (T, n_x, K), ``ids`` (T,
    n_used) int32 -> (T, n_used, N): the slots grouped by expert as ggml groups them (:func:`slot_groups`), each
    group's rows through :func:`mul_mat` in one call — ``vec_dot`` per element. ``from_float`` converts row by row,
    so a row routed to several experts gets the same bits in each group as ggml's single conversion."""
    T, n_x, K = x.shape
    out = np.empty((T * ids.shape[1], w_bytes.shape[1]), np.float32)  # (T·n_used, N)
    order, bounds, experts, arow = slot_groups(np.ascontiguousarray(ids, np.int32), n_x)
    x2 = np.ascontiguousarray(x, np.float32).reshape(T * n_x, K)  # (T·n_x, K)
    for g, e in enumerate(experts.tolist()):
        slots = order[bounds[g]:bounds[g + 1]]  # (cne1,): this expert's (token, slot)s
        out[slots] = mul_mat(w_bytes[e], qtype, x2[arow[slots]])  # (cne1, N)
    return out.reshape(T, ids.shape[1], -1)


__all__ = ["TYPES", "mul_mat", "mul_mat_id"]
