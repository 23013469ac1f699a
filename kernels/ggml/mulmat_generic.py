"""``ggml_mul_mat`` / ``ggml_mul_mat_id`` on ggml's generic x86 path (a libggml-cpu built without SIMD:
docs/ggml-generic-x86.md §2–3), bit for bit, for the weight types emulated there: F32, F16, BF16, Q8_0, MXFP4, the legacy
Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS.

On that path nothing but ``vec_dot`` runs: llamafile's sgemm declines every type without ``__AVX__``, the tiled
K-quant kernel is a stub, and the CPU_REPACK buffer takes nothing. So every element, whatever the row count, is one
``vec_dot`` of its weight row with the activation row converted to the type's ``vec_dot_type`` (``from_float``),
and no product is fused (the target has no FMA):

* F32 (``vec.cpp: ggml_vec_dot_f32``, the scalar branch): ``ggml_float sumf += (ggml_float)(x[i]*y[i])`` — each
  product rounded to float, summed in double in order, rounded once at the end.
* F16 / BF16 (``ggml_vec_dot_f16`` / ``_bf16``): the activations converted by ``ggml_cpu_fp32_to_fp16`` (ggml-impl.h's
  portable conversion: round to nearest even, a NaN -> sign | 0x7E00) / ``ggml_cpu_fp32_to_bf16``, then the same
  double sum of the (exact, barring over/underflow) float products.
* Q8_0 (``arch/x86/quants.c: ggml_vec_dot_q8_0_q8_0``'s scalar loop): ``sumf += (float)sumi*(d_w*d_x)`` per block in
  float32, ``sumi`` the exact integer dot; the activations by ``quantize_row_q8_0_ref`` (ggml-quants.c):
  ``amax = MAX(amax, fabsf(v))`` in order (a NaN is kept only if no later value replaces it: ``NaN > v`` is false),
  ``d = amax/127``, ``id = d ? 1.0f/d : 0``, ``qs = (int8_t)roundf(x*id)`` — half away from zero, the float
  truncated to int32 (NaN and out-of-range: INT_MIN) and then to its low byte —, ``y.d = fp16(d)`` (portable).
* MXFP4 (the scalar loop of ``ggml_vec_dot_mxfp4_q8_0``): ``d = fl(y.d · e8m0_half(e))``, ``sumf += d·(float)(sumi1 +
  sumi2)`` per block in float32; the activations as for Q8_0.
* Q4_K, Q5_K, Q6_K (``quants.c: ggml_vec_dot_q{4,5,6}_K_q8_K_generic``): per super-block 8 int32 lanes, lane ``l``
  summing ``scale · q8[k] · a[k]`` over the values ``k ≡ l (mod 8)`` (``a`` the code, Q6_K's less 32); then
  ``sums[l] += fl(fl(d_w · y.d) · (float)aux32[l])`` into 8 float sums kept across super-blocks, and (Q4_K, Q5_K)
  ``sumf -= fl(fl(dmin · y.d) · (float)Σ bsums·mins)`` per super-block; at the end ``sumf += sums[l]`` for ``l = 0…7``.
  The activations by ``quantize_row_q8_K_ref`` (the same in every build). Q3_K the same scheme with its signed
  values and scales (``scales[j] - 32``) and no mins; Q2_K per super-block ``sumf += fl(fl(dall·isum) - fl(dmin·summs))``;
  IQ4_XS per 32 values ``sumf += fl(fl(d4d8·(ls - 32)) · (float)sumi)``.
* Q4_0 (the scalar tail of x86's ``ggml_vec_dot_q4_0_q8_0``): ``sumf += fl(fl((float)sumi·d_w)·d_x)``; Q5_0
  ``sumf += fl(fl(d_w·d_x)·sumi)``; IQ4_NL ``sumf += fl(fl(d_x·d_w)·sumi)``; Q4_1 / Q5_1 ``sumf += fl(fl(fl(d_w·d_x)·sumi)
  + fl(m_w·s_x))`` with the activations by ``quantize_row_q8_1_ref`` (``s = fp16((float)Σqs · d)``).
"""

from __future__ import annotations

import numpy as np

from kernels.base.block import QT
from kernels.base.flags import jit
from kernels.ggml.mulmat_k import decode_row, q8_k_inputs
from kernels.ggml.mulmat_q import decode as decode_legacy
from kernels.ggml.mulmat_q8 import _mxfp4_weights
from kernels.ggml.simd import f32_bits
from kernels.ggml.vecmath import F16_TO_F32, _f32_to_f16_bits, cast_bf16, cast_f16

F32 = np.float32
KQ = {QT.Q4_K: 0, QT.Q5_K: 1, QT.Q6_K: 2, QT.IQ4_XS: 3, QT.Q2_K: 4, QT.Q3_K: 5}  # mulmat_k.KIND
LEGACY = {QT.Q4_0: 0, QT.Q5_0: 1, QT.IQ4_NL: 2, QT.Q4_1: 3, QT.Q5_1: 4}  # the formulas of the module docstring
TYPES = frozenset({QT.F32, QT.F16, QT.BF16, QT.Q8_0, QT.MXFP4} | set(KQ) | set(LEGACY))  # emulated on the generic path


@jit()
def _float_rows(w, x, out):
    """``out[t, n] = (float) Σ_k (double) fl(w[n, k] · x[t, k])`` (float32 values of the weights and activations)."""
    for t in range(x.shape[0]):
        for n in range(w.shape[0]):
            s = np.float64(0.0)
            for k in range(x.shape[1]):
                s += np.float64(np.float32(w[n, k] * x[t, k]))
            out[t, n] = np.float32(s)


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
            d[r, b] = F16_TO_F32[_f32_to_f16_bits(np.uint32(f32_bits(dd)))]  # GGML_FP32_TO_FP16(d), portable
            total = 0
            for j in range(32):
                qs[r, o + j] = _roundf_to_i8(F32(x[r, o + j] * inv))
                total += np.int64(qs[r, o + j])
            if s is not None:  # y[i].s = GGML_FP32_TO_FP16(sum*d)
                s[r, b] = F16_TO_F32[_f32_to_f16_bits(np.uint32(f32_bits(F32(F32(total) * dd))))]


@jit()
def _q8_0_dot(w, xq, xd, tab):
    """One element: ``sumf = fl(sumf + fl((float)sumi · fl(d_w · d_x)))`` over the blocks of one Q8_0 weight row
    (``w`` int8 bytes: per block the fp16 d, 32 quants) and one quantized activation row."""
    sumf = F32(0.0)
    for b in range(xd.shape[0]):
        o = 34 * b
        dw = tab[(np.int64(w[o]) & 255) | ((np.int64(w[o + 1]) & 255) << 8)]
        sumi = np.int64(0)
        for j in range(32):
            sumi += np.int64(w[o + 2 + j]) * np.int64(xq[32 * b + j])
        sumf = F32(sumf + F32(F32(sumi) * F32(dw * xd[b])))
    return sumf


@jit()
def _q8_0_rows(w, x, out, tab):
    xq = np.empty(x.shape, np.int8)
    xd = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    _quantize_rows_q8_0_ref(x, xq, xd)
    for t in range(x.shape[0]):
        for n in range(w.shape[0]):
            out[t, n] = _q8_0_dot(w[n], xq[t], xd[t], tab)


@jit()
def _mxfp4_rows(wv, we, x, out):
    """``wv`` (N, K) int8 the MXFP4 values, ``we`` (N, K/32) ``e8m0_half(e)``: the scalar loop per element."""
    xq = np.empty(x.shape, np.int8)
    xd = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    _quantize_rows_q8_0_ref(x, xq, xd)
    for t in range(x.shape[0]):
        for n in range(wv.shape[0]):
            sumf = F32(0.0)
            for b in range(xd.shape[1]):
                d = F32(xd[t, b] * we[n, b])  # GGML_CPU_FP16_TO_FP32(y.d) * GGML_CPU_E8M0_TO_FP32_HALF(x.e)
                sumi = np.int64(0)
                for j in range(32):
                    sumi += np.int64(xq[t, 32 * b + j]) * np.int64(wv[n, 32 * b + j])
                sumf = F32(sumf + F32(d * F32(sumi)))
            out[t, n] = sumf


@jit()
def _legacy_rows(kind, wv, wd, wm, x, out):
    """Q4_0 / Q5_0 / IQ4_NL (``kind`` 0-2, Q8_0 activations) and Q4_1 / Q5_1 (3-4, Q8_1) for every element: ``wv`` (N,
    K) the values (Q4_1 / Q5_1: the unsigned codes), ``wd`` / ``wm`` (N, K/32) ``d`` / ``m`` as float32."""
    xq = np.empty(x.shape, np.int8)
    xd = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    xs = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    if kind <= 2:
        _quantize_rows_q8_0_ref(x, xq, xd)
    else:
        _quantize_rows_q8_0_ref(x, xq, xd, xs)
    for t in range(x.shape[0]):
        for n in range(wv.shape[0]):
            sumf = F32(0.0)
            for b in range(xd.shape[1]):
                sumi = np.int64(0)
                for j in range(32):
                    sumi += np.int64(xq[t, 32 * b + j]) * np.int64(wv[n, 32 * b + j])
                if kind == 0:  # sumi*GGML_CPU_FP16_TO_FP32(x.d)*GGML_CPU_FP16_TO_FP32(y.d)
                    sumf = F32(sumf + F32(F32(F32(sumi) * wd[n, b]) * xd[t, b]))
                elif kind == 1:  # (d_x*d_y) * sumi
                    sumf = F32(sumf + F32(F32(wd[n, b] * xd[t, b]) * F32(sumi)))
                elif kind == 2:  # d = y.d*x.d; d * (sumi1 + sumi2)
                    sumf = F32(sumf + F32(F32(xd[t, b] * wd[n, b]) * F32(sumi)))
                else:  # (d_x*d_y)*sumi + m_x*s_y
                    sumf = F32(sumf + F32(F32(F32(wd[n, b] * xd[t, b]) * F32(sumi)) + F32(wm[n, b] * xs[t, b])))
            out[t, n] = sumf


@jit()
def _k_rows(kind, w, yq, yd, ybs, out, table):
    """``ggml_vec_dot_{q2_K,q3_K,q4_K,q5_K,q6_K,iq4_xs}_q8_K_generic`` for every element (module docstring);
    ``kind`` as mulmat_k.KIND (decode_row's values: Q3_K signed, IQ4_XS the table's)."""
    K = yq.shape[1]
    nb = K // 256
    sub = 32 if kind <= 1 or kind == 3 else 16
    q, sc, mn = np.empty(K, np.int32), np.empty(K // sub, np.int32), np.zeros(K // sub, np.int32)
    d, dmin = np.empty(nb, np.float32), np.zeros(nb, np.float32)
    aux32 = np.empty(8, np.int64)
    sums = np.empty(8, np.float32)
    for r in range(w.shape[0]):
        decode_row(kind, w[r], q, sc, mn, d, dmin, table)
        for t in range(yq.shape[0]):
            sums[:] = F32(0.0)
            sumf = F32(0.0)
            for b in range(nb):
                if kind == 4:  # Q2_K: sumf += dall*isum - dmin*summs
                    summs, isum = np.int64(0), np.int64(0)
                    for j in range(16):
                        summs += ybs[t, 16 * b + j] * np.int64(mn[16 * b + j])
                    for k in range(256 * b, 256 * b + 256):
                        isum += np.int64(sc[k // 16]) * (np.int64(yq[t, k]) * np.int64(q[k]))
                    dall, dm = F32(yd[t, b] * d[b]), F32(yd[t, b] * dmin[b])
                    sumf = F32(sumf + F32(F32(dall * F32(isum)) - F32(dm * F32(summs))))
                    continue
                if kind == 3:  # IQ4_XS: per 32 values sumf += (d4d8*(ls - 32)) * (sumi1 + sumi2)
                    d4d8 = F32(d[b] * yd[t, b])
                    for sb in range(8 * b, 8 * b + 8):
                        sumi = np.int64(0)
                        for k in range(32 * sb, 32 * sb + 32):
                            sumi += np.int64(yq[t, k]) * np.int64(q[k])
                        sumf = F32(sumf + F32(F32(d4d8 * F32(sc[sb])) * F32(sumi)))
                    continue
                aux32[:] = 0
                for k in range(256 * b, 256 * b + 256):
                    a = np.int64(q[k]) - (32 if kind == 2 else 0)
                    aux32[k % 8] += np.int64(sc[k // sub]) * (np.int64(yq[t, k]) * a)
                dd = F32(d[b] * yd[t, b])  # GGML_CPU_FP16_TO_FP32(x[i].d) * y[i].d
                for lane in range(8):
                    sums[lane] = F32(sums[lane] + F32(dd * F32(aux32[lane])))
                if kind <= 1:
                    sumi = np.int64(0)
                    for j in range(16):
                        sumi += ybs[t, 16 * b + j] * np.int64(mn[8 * b + j // 2])
                    sumf = F32(sumf - F32(F32(dmin[b] * yd[t, b]) * F32(sumi)))
            for lane in range(8):
                sumf = F32(sumf + sums[lane])
            out[t, r] = sumf


def _float_values(w_bytes: np.ndarray, qtype: QT, x: np.ndarray):
    """(weights, activations) as float32 values, the activations converted to ``vec_dot_type`` (``from_float``)."""
    if qtype == QT.F32:
        return w_bytes.view(np.float32), x
    if qtype == QT.F16:
        return F16_TO_F32[w_bytes.view(np.uint16)], F16_TO_F32[cast_f16(x).view(np.uint16)]
    w = (w_bytes.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return w, (cast_bf16(x).astype(np.uint32) << 16).view(np.float32)


def mul_mat(w_bytes: np.ndarray, qtype, x: np.ndarray) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` on the generic path: ``w_bytes`` (N, row bytes), ``x`` (T, K) float32 -> (T, N)."""
    qtype = QT(qtype)
    out = np.empty((x.shape[0], w_bytes.shape[0]), np.float32)
    if qtype == QT.Q8_0:
        _q8_0_rows(w_bytes.view(np.int8), x, out, F16_TO_F32)
    elif qtype == QT.MXFP4:
        _mxfp4_rows(*_mxfp4_weights(w_bytes), np.ascontiguousarray(x, np.float32), out)
    elif qtype in LEGACY:
        v, d, m = decode_legacy(w_bytes, qtype)
        wm = F16_TO_F32[m] if m is not None else np.zeros(d.shape, np.float32)
        _legacy_rows(LEGACY[qtype], np.ascontiguousarray(v), F16_TO_F32[d], wm, np.ascontiguousarray(x, np.float32), out)
    elif qtype in KQ:
        yq, yd, _, ybs = q8_k_inputs(np.ascontiguousarray(x, np.float32))
        _k_rows(KQ[qtype], np.ascontiguousarray(w_bytes, np.uint8), yq, yd, ybs, out, F16_TO_F32)
    elif qtype in TYPES:
        w, xv = _float_values(w_bytes, qtype, x)
        _float_rows(np.ascontiguousarray(w), np.ascontiguousarray(xv), out)
    else:
        raise ValueError(f"mul_mat emulation: {qtype.name} weights on ggml's generic x86 path are not emulated yet "
                         f"(emulated there: {', '.join(t.name for t in sorted(TYPES))})")
    return out


def mul_mat_id(w_bytes: np.ndarray, qtype, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``ggml_mul_mat_id`` on the generic path: ``w_bytes`` (E, N, row bytes), ``x`` (T, n_x, K), ``ids`` (T,
    n_used) -> (T, n_used, N); every slot one ``vec_dot`` per element (its activation row converted once)."""
    T, n_x, K = x.shape
    out = np.empty((T, ids.shape[1], w_bytes.shape[1]), np.float32)
    for t in range(T):
        for s in range(ids.shape[1]):
            out[t, s] = mul_mat(w_bytes[ids[t, s]], qtype, x[t, s % n_x][None])[0]
    return out


__all__ = ["TYPES", "mul_mat", "mul_mat_id"]
