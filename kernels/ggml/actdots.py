"""The integer-dot half of the llama.cpp emulation described in :mod:`kernels.ggml.actquant`.

Per weight type, the generic ``ggml_vec_dot_<w>_<a>_generic`` of ``ggml-cpu/quants.c`` transcribed:
an exact integer dot per block, combined with the block scales in float32 in the C code's formula
and order (the K-quants' eight float lanes included); then :func:`matmul_act_quant`, which
quantizes each activation row with :mod:`kernels.ggml.actquant` and dots it with every weight row.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .actdots_iq import (
    _dot_iq1_m_q8_k,
    _dot_iq1_s_q8_k,
    _dot_iq2_s_q8_k,
    _dot_iq2_xs_q8_k,
    _dot_iq2_xxs_q8_k,
    _dot_iq3_s_q8_k,
    _dot_iq3_xxs_q8_k,
    _dot_tq1_0_q8_k,
    _dot_tq2_0_q8_k,
)
from .actquant import _q8_0_rows, _q8_k_rows, _round_rows
from kernels.base.blocks import QT, layout
from kernels.plain.dequant import (
    IQ4NL_VALUES,
    MXFP4_VALUES,
    _BF16,
    _F16,
    _F32,
    _IQ1_M,
    _IQ1_S,
    _IQ2_S,
    _IQ2_XS,
    _IQ2_XXS,
    _IQ3_S,
    _IQ3_XXS,
    _IQ4_NL,
    _IQ4_XS,
    _MXFP4,
    _Q2_K,
    _Q3_K,
    _Q4_0,
    _Q4_1,
    _Q4_K,
    _Q5_0,
    _Q5_1,
    _Q5_K,
    _Q6_K,
    _Q8_0,
    _TQ1_0,
    _TQ2_0,
    _deq_bf16,
    _deq_f16,
    _deq_f32,
    _q3_k_scale,
    _qh_bit,
    k_scale_min,
)
from kernels.base.flags import JIT_ENABLED, by_type, jit, per_type
from kernels.base.floats import E8M0_HALF, f16_at

# --------------------------------------------------------------------------------------------
# Dot products with Q8_0 activations (ggml_vec_dot_{q8_0,q4_0,q5_0,mxfp4,iq4_nl}_q8_0_generic)
# Arguments: x = the weight row's bytes; yqs (K,) int8 and yd (K/32,) float32 = one activation row.


@jit()
def _dot_q8_0_q8_0(x, yqs, yd):
    xqs = x.view(np.int8)
    sumf = np.float32(0.0)
    for ib in range(yd.size):
        o = 34 * ib
        sumi = 0
        for j in range(32):
            sumi += int(xqs[o + 2 + j]) * int(yqs[32 * ib + j])
        sumf += np.float32(sumi) * (f16_at(x, o) * yd[ib])
    return sumf


@jit()
def _dot_q4_0_q8_0(x, yqs, yd):
    sumf = np.float32(0.0)
    for ib in range(yd.size):
        o = 18 * ib
        sumi = 0
        for j in range(16):
            byte = int(x[o + 2 + j])
            sumi += ((byte & 15) - 8) * int(yqs[32 * ib + j]) + ((byte >> 4) - 8) * int(yqs[32 * ib + j + 16])
        sumf += np.float32(sumi) * f16_at(x, o) * yd[ib]  # (sumi * dx) * dy, left to right as in C
    return sumf


@jit()
def _dot_q5_0_q8_0(x, yqs, yd):
    sumf = np.float32(0.0)
    for ib in range(yd.size):
        o = 22 * ib
        sumi = 0
        for j in range(16):
            byte = int(x[o + 6 + j])
            x0 = ((byte & 15) | (int(_qh_bit(x, o + 2, j)) << 4)) - 16
            x1 = ((byte >> 4) | (int(_qh_bit(x, o + 2, j + 16)) << 4)) - 16
            sumi += x0 * int(yqs[32 * ib + j]) + x1 * int(yqs[32 * ib + j + 16])
        sumf += (f16_at(x, o) * yd[ib]) * np.float32(sumi)
    return sumf


@jit()
def _dot_mxfp4_q8_0(x, yqs, yd):
    sumf = np.float32(0.0)
    for ib in range(yd.size):
        o = 17 * ib
        d = yd[ib] * E8M0_HALF[x[o]]
        sumi = 0
        for j in range(16):
            byte = int(x[o + 1 + j])
            sumi += int(yqs[32 * ib + j]) * int(MXFP4_VALUES[byte & 15])
            sumi += int(yqs[32 * ib + j + 16]) * int(MXFP4_VALUES[byte >> 4])
        sumf += d * np.float32(sumi)
    return sumf


@jit()
def _dot_iq4_nl_q8_0(x, yqs, yd):
    sumf = np.float32(0.0)
    for ib in range(yd.size):
        o = 18 * ib
        d = yd[ib] * f16_at(x, o)
        sumi = 0
        for j in range(16):
            byte = int(x[o + 2 + j])
            sumi += int(yqs[32 * ib + j]) * int(IQ4NL_VALUES[byte & 15])
            sumi += int(yqs[32 * ib + j + 16]) * int(IQ4NL_VALUES[byte >> 4])
        sumf += d * np.float32(sumi)
    return sumf


DOTS_Q8_0 = {_Q8_0: _dot_q8_0_q8_0, _Q4_0: _dot_q4_0_q8_0, _Q5_0: _dot_q5_0_q8_0, _MXFP4: _dot_mxfp4_q8_0,
             _IQ4_NL: _dot_iq4_nl_q8_0}


@by_type(DOTS_Q8_0)
def _dot_with_q8_0(kind, x, yqs, yd):
    return DOTS_Q8_0[kind](x, yqs, yd)


# --------------------------------------------------------------------------------------------
# Dot products with Q8_1 activations (ggml_vec_dot_{q4_1,q5_1}_q8_1_generic); ys = the s fields


@jit()
def _dot_q4_1_q8_1(x, yqs, yd, ys):
    sumf = np.float32(0.0)
    for ib in range(yd.size):
        o = 20 * ib
        sumi = 0
        for j in range(16):
            byte = int(x[o + 4 + j])
            sumi += (byte & 15) * int(yqs[32 * ib + j]) + (byte >> 4) * int(yqs[32 * ib + j + 16])
        sumf += (f16_at(x, o) * yd[ib]) * np.float32(sumi) + f16_at(x, o + 2) * ys[ib]
    return sumf


@jit()
def _dot_q5_1_q8_1(x, yqs, yd, ys):
    sumf = np.float32(0.0)
    for ib in range(yd.size):
        o = 24 * ib
        sumi = 0
        for j in range(16):
            byte = int(x[o + 8 + j])
            x0 = (byte & 15) | (int(_qh_bit(x, o + 4, j)) << 4)
            x1 = (byte >> 4) | (int(_qh_bit(x, o + 4, j + 16)) << 4)
            sumi += x0 * int(yqs[32 * ib + j]) + x1 * int(yqs[32 * ib + j + 16])
        sumf += (f16_at(x, o) * yd[ib]) * np.float32(sumi) + f16_at(x, o + 2) * ys[ib]
    return sumf


DOTS_Q8_1 = {_Q4_1: _dot_q4_1_q8_1, _Q5_1: _dot_q5_1_q8_1}


@by_type(DOTS_Q8_1)
def _dot_with_q8_1(kind, x, yqs, yd, ys):
    return DOTS_Q8_1[kind](x, yqs, yd, ys)


# --------------------------------------------------------------------------------------------
# Dot products with Q8_K activations (ggml_vec_dot_{q2_K..q6_K,iq4_xs}_q8_K_generic; the IQ1/IQ2/IQ3
# and TQ types are in kernels/ggml/actdots_iq.py)
# yd (K/256,) float32, ybsums (K/16,) int16.


@jit()
def _dot_q2_k_q8_k(x, yqs, yd, ybsums):
    sumf = np.float32(0.0)
    for i in range(yd.size):
        o = 84 * i
        summs = 0
        for g in range(16):
            summs += int(ybsums[16 * i + g]) * (int(x[o + g]) >> 4)
        dall = yd[i] * f16_at(x, o + 80)
        dmin = yd[i] * f16_at(x, o + 82)
        isum = 0
        for g in range(16):  # group g = 8n + 2j + h, as in dequant._deq_q2_k
            n, j, h = g >> 3, (g >> 1) & 3, g & 1
            isuml = 0
            for l in range(16):
                q2 = (int(x[o + 16 + 32 * n + 16 * h + l]) >> (2 * j)) & 3
                isuml += int(yqs[256 * i + 16 * g + l]) * q2
            isum += (int(x[o + g]) & 15) * isuml
        sumf += dall * np.float32(isum) - dmin * np.float32(summs)
    return sumf


@jit()
def _add_lanes(sums, d, prod):
    """The K-quants' float lanes: ``sums[l] += d * aux32[l]`` for l = 0..7, where the C code's
    ``aux32[l]`` is the exact integer Σ of ``prod[p]`` over the values p ≡ l (mod 8) of the
    super-block (``prod[p]`` = scale · weight quant · activation quant of value p)."""
    for l in range(8):
        lane = 0
        for k in range(32):
            lane += prod[8 * k + l]
        sums[l] += d * np.float32(lane)


@jit()
def _dot_q3_k_q8_k(x, yqs, yd, ybsums):
    sums = np.zeros(8, dtype=np.float32)
    prod = np.empty(256, dtype=np.int32)
    for i in range(yd.size):
        o = 110 * i
        for n in range(2):  # value 128n + 32j + 16h + l, as in dequant._deq_q3_k
            for j in range(4):
                for h in range(2):
                    g = 8 * n + 2 * j + h
                    scale = _q3_k_scale(x, o, g) - 32
                    for l in range(16):
                        ll = 16 * h + l
                        a = np.int32((x[o + 32 + 32 * n + ll] >> (2 * j)) & 3)
                        if not (x[o + ll] >> (4 * n + j)) & 1:
                            a -= 4
                        prod[16 * g + l] = np.int32(scale) * a * np.int32(yqs[256 * i + 16 * g + l])
        _add_lanes(sums, f16_at(x, o + 108) * yd[i], prod)
    sumf = np.float32(0.0)
    for l in range(8):
        sumf += sums[l]
    return sumf


@jit()
def _dot_q45_k_q8_k(x, yqs, yd, ybsums, five_bits):
    """Q4_K (``five_bits=False``, 144-byte blocks) and Q5_K (176-byte blocks, qh at 16, qs at 48)."""
    block, qs_at = (176, 48) if five_bits else (144, 16)
    sums = np.zeros(8, dtype=np.float32)
    prod = np.empty(256, dtype=np.int32)
    sumf = np.float32(0.0)
    for i in range(yd.size):
        o = block * i
        sumi = 0  # Σ_g bsums[g] * m[g // 2]
        for c in range(4):  # 32 bytes: sub-block 2c in the low nibbles, 2c+1 in the high nibbles
            sc_lo, m_lo = k_scale_min(x, o + 4, 2 * c)
            sc_hi, m_hi = k_scale_min(x, o + 4, 2 * c + 1)
            sumi += (int(ybsums[16 * i + 4 * c]) + int(ybsums[16 * i + 4 * c + 1])) * m_lo
            sumi += (int(ybsums[16 * i + 4 * c + 2]) + int(ybsums[16 * i + 4 * c + 3])) * m_hi
            for l in range(32):
                byte = x[o + qs_at + 32 * c + l]
                a_lo = np.int32(byte & 15)
                a_hi = np.int32(byte >> 4)
                if five_bits:
                    qh = x[o + 16 + l] >> (2 * c)
                    a_lo |= np.int32((qh & 1) << 4)
                    a_hi |= np.int32((qh & 2) << 3)
                p = 64 * c + l
                prod[p] = np.int32(sc_lo) * a_lo * np.int32(yqs[256 * i + p])
                prod[p + 32] = np.int32(sc_hi) * a_hi * np.int32(yqs[256 * i + p + 32])
        _add_lanes(sums, f16_at(x, o) * yd[i], prod)
        dmin = f16_at(x, o + 2) * yd[i]
        sumf -= dmin * np.float32(sumi)
    for l in range(8):
        sumf += sums[l]
    return sumf


@jit()
def _dot_q6_k_q8_k(x, yqs, yd, ybsums):
    scales = x.view(np.int8)
    sums = np.zeros(8, dtype=np.float32)
    prod = np.empty(256, dtype=np.int32)
    sc = np.empty(16, dtype=np.int32)
    for i in range(yd.size):
        o = 210 * i
        for g in range(16):
            sc[g] = scales[o + 192 + g]
        for n in range(2):  # as dequant._deq_q6_k; value 128n + 32k + l is in group 8n + 2k + l // 16
            for l in range(32):
                ql0 = x[o + 64 * n + l]
                ql1 = x[o + 64 * n + l + 32]
                qh = x[o + 128 + 32 * n + l]
                g = 8 * n + (l >> 4)
                p = 128 * n + l
                y = 256 * i + p
                prod[p] = sc[g] * (np.int32((ql0 & 15) | ((qh & 3) << 4)) - 32) * np.int32(yqs[y])
                prod[p + 32] = sc[g + 2] * (np.int32((ql1 & 15) | (((qh >> 2) & 3) << 4)) - 32) * np.int32(yqs[y + 32])
                prod[p + 64] = sc[g + 4] * (np.int32((ql0 >> 4) | (((qh >> 4) & 3) << 4)) - 32) * np.int32(yqs[y + 64])
                prod[p + 96] = sc[g + 6] * (np.int32((ql1 >> 4) | (((qh >> 6) & 3) << 4)) - 32) * np.int32(yqs[y + 96])
        _add_lanes(sums, f16_at(x, o + 208) * yd[i], prod)
    sumf = np.float32(0.0)
    for l in range(8):
        sumf += sums[l]
    return sumf


@jit()
def _dot_iq4_xs_q8_k(x, yqs, yd, ybsums):
    sumf = np.float32(0.0)
    for i in range(yd.size):
        o = 136 * i
        d4d8 = f16_at(x, o) * yd[i]
        scales_h = int(x[o + 2]) | (int(x[o + 3]) << 8)
        for s in range(8):
            ls = ((int(x[o + 4 + s // 2]) >> (4 * (s & 1))) & 15) | (((scales_h >> (2 * s)) & 3) << 4)
            dl = d4d8 * np.float32(ls - 32)
            sumi = 0
            for j in range(16):
                byte = int(x[o + 8 + 16 * s + j])
                sumi += int(yqs[256 * i + 32 * s + j]) * int(IQ4NL_VALUES[byte & 15])
                sumi += int(yqs[256 * i + 32 * s + 16 + j]) * int(IQ4NL_VALUES[byte >> 4])
            sumf += dl * np.float32(sumi)
    return sumf


@jit()
def _dot_q4_k_q8_k(x, yqs, yd, ybsums):
    return _dot_q45_k_q8_k(x, yqs, yd, ybsums, False)


@jit()
def _dot_q5_k_q8_k(x, yqs, yd, ybsums):
    return _dot_q45_k_q8_k(x, yqs, yd, ybsums, True)


#: The Q8_K dot of each weight type, all ``(x, yqs, yd, ybsums)``; the codebook and ternary types
#: (kernels/ggml/actdots_iq.py) other than IQ1_S take the block sums only to share the signature.
DOTS_Q8_K = {_Q4_K: _dot_q4_k_q8_k, _Q5_K: _dot_q5_k_q8_k, _Q6_K: _dot_q6_k_q8_k, _Q2_K: _dot_q2_k_q8_k,
             _Q3_K: _dot_q3_k_q8_k, _IQ4_XS: _dot_iq4_xs_q8_k, _IQ2_XXS: _dot_iq2_xxs_q8_k, _IQ2_XS: _dot_iq2_xs_q8_k,
             _IQ2_S: _dot_iq2_s_q8_k, _IQ3_XXS: _dot_iq3_xxs_q8_k, _IQ3_S: _dot_iq3_s_q8_k, _IQ1_S: _dot_iq1_s_q8_k,
             _IQ1_M: _dot_iq1_m_q8_k, _TQ1_0: _dot_tq1_0_q8_k, _TQ2_0: _dot_tq2_0_q8_k}


@by_type(DOTS_Q8_K)
def _dot_with_q8_k(kind, x, yqs, yd, ybsums):
    return DOTS_Q8_K[kind](x, yqs, yd, ybsums)


# --------------------------------------------------------------------------------------------
# The act-quant matmul kernels: prange over weight rows, each dotted with every activation row


@per_type
def _matmul_q8_0(kind):
    @jit(parallel=True, kind=kind)
    def _matmul_act_q8_0(w, yqs, yd, out):
        for n in prange(w.shape[0]):
            for t in range(yqs.shape[0]):
                out[t, n] = _dot_with_q8_0(kind, w[n], yqs[t], yd[t])

    return _matmul_act_q8_0


@per_type
def _matmul_q8_1(kind):
    @jit(parallel=True, kind=kind)
    def _matmul_act_q8_1(w, yqs, yd, ys, out):
        for n in prange(w.shape[0]):
            for t in range(yqs.shape[0]):
                out[t, n] = _dot_with_q8_1(kind, w[n], yqs[t], yd[t], ys[t])

    return _matmul_act_q8_1


@per_type
def _matmul_q8_k(kind):
    @jit(parallel=True, kind=kind)
    def _matmul_act_q8_k(w, yqs, yd, ybsums, out):
        for n in prange(w.shape[0]):
            for t in range(yqs.shape[0]):
                out[t, n] = _dot_with_q8_k(kind, w[n], yqs[t], yd[t], ybsums[t])

    return _matmul_act_q8_k


FLOAT_DECODERS = {_F32: _deq_f32, _F16: _deq_f16, _BF16: _deq_bf16}


@by_type(FLOAT_DECODERS)
def _decode_float_row(kind, src, dst):
    FLOAT_DECODERS[kind](src, dst)


@per_type
def _matmul_float(kind):
    @jit(parallel=True, kind=kind)
    def _matmul_act_float(w, xr, out):
        """F32/F16/BF16 weights: ``ggml_vec_dot_f32/f16/bf16`` scalar form, float32 products summed in double."""
        for n in prange(w.shape[0]):
            row = np.empty(xr.shape[1], dtype=np.float32)
            _decode_float_row(kind, w[n], row)
            for t in range(xr.shape[0]):
                acc = 0.0
                for k in range(row.size):
                    acc += np.float64(row[k] * xr[t, k])
                out[t, n] = np.float32(acc)

    return _matmul_act_float


def _lanes(w_bytes, qtype, qs, d, yx, out, packed) -> int:
    """The row-lane kernels (kernels/lanes/act.py) for the first rows of ``out``, where the type has one
    (from ``packed``, the matrix's PackedRows, when given): the number of rows done (the same bits as
    the kernels below, which do the rest)."""
    from kernels.lanes.act import ACT_LANE_TYPES, matmul_act_lanes

    if not JIT_ENABLED or int(qtype) not in ACT_LANE_TYPES:
        return 0
    return matmul_act_lanes(w_bytes, qtype, qs, d, yx, out, packed=packed)


def matmul_act_quant(w_bytes: np.ndarray, qtype, x: np.ndarray, packed=None) -> np.ndarray:
    """``y[t, n]`` = llama.cpp's generic CPU dot of weight row n with activation row t quantized to
    the weight's ``vec_dot_type``. ``w_bytes`` (N, row bytes) uint8 C-contiguous, ``x`` (T, K)
    float32 C-contiguous, both validated by :func:`kernels.matmul.matmul`; ``packed``: the matrix's
    ``PackedRows`` if it has one (the lane kernels read it instead). Returns float32 (T, N).
    """
    cls = layout(qtype)
    kind = int(cls.qtype)
    vdt = cls.vec_dot_type
    out = np.empty((x.shape[0], w_bytes.shape[0]), dtype=np.float32)
    if out.size == 0:
        return out
    if x.shape[1] == 0:
        out[:] = 0.0
        return out
    if vdt == QT.Q8_0:
        qs, d, _ = _q8_0_rows(x, with_s=False)
        n = _lanes(w_bytes, qtype, qs, d, np.zeros((qs.shape[0], 1), np.int16), out, packed)
        if n < w_bytes.shape[0]:
            tail = np.empty((out.shape[0], w_bytes.shape[0] - n), dtype=np.float32)
            _matmul_q8_0(kind)(w_bytes[n:], qs, d, tail)
            out[:, n:] = tail
    elif vdt == QT.Q8_1:
        qs, d, s = _q8_0_rows(x, with_s=True)
        _matmul_q8_1(kind)(w_bytes, qs, d, s, out)
    elif vdt == QT.Q8_K:
        qs, d, bsums = _q8_k_rows(x)
        n = _lanes(w_bytes, qtype, qs, d, bsums, out, packed)
        if n < w_bytes.shape[0]:
            tail = np.empty((out.shape[0], w_bytes.shape[0] - n), dtype=np.float32)
            _matmul_q8_k(kind)(w_bytes[n:], qs, d, bsums, tail)
            out[:, n:] = tail
    else:
        xr = x
        if vdt in (QT.F16, QT.BF16):
            xr = np.empty_like(x)
            _round_rows(x, xr, vdt == QT.BF16)
        _matmul_float(kind)(w_bytes, xr, out)
    return out


__all__ = ["matmul_act_quant"]
