"""Codebook weights (IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M; activations as Q8_K) in ggml-cpu's
``mul_mat`` / ``mul_mat_id``, bit for bit on the ``avx512`` and ``avx2`` paths.

Every weight value is an exact small integer ``w`` times a per-16 (or per-32) odd sub-block scale ``sc`` times
the fp16 super-block scale ``d`` (:func:`decode_row`): IQ2_* / IQ3_* ``w = grid·sign`` (``sc = 2·ls + 1``; the
value is ``d·sc·w/8`` for IQ2, ``d·sc·w/4`` for IQ3_XXS, ``d·sc·w`` for IQ3_S); IQ1_S / IQ1_M ``w = g`` (grid
value in {-1, 0, 1}) with a per-8 ``e = ±1`` (the value is ``d·sc·(g + e/8)``). The activations are
``quantize_row_q8_K_ref`` (:mod:`kernels.ggml.actquant`): ``q`` int8 (never -128), ``y.d`` float32.

* ``T < 8``: ``ggml_vec_dot_iq*_q8_K`` (``arch/x86/quants.c``, the ``__AVX2__`` branch in both builds; the
  avx512 build has no other). 8 int32 lanes, lane ``l`` summing, over every 32-value group ``g``,
  ``sc(g, l) · Σ w·q`` of bytes ``4l … 4l+3`` of the group (``maddubs`` of the grid magnitudes with the signed
  activations — no int16 saturation: ``2·62·127 < 2^15`` — then ``madd_epi16`` with the scale: lanes 0-3 take
  the first 16-value sub-block's scale, lanes 4-7 the second's); per super-block
  ``acc[l] = fma(d_b, float(sumi[l]), acc[l])`` with ``d_b = fp16(x.d)·y.d`` rounded to float32;
  ``out = f · hsum_float_8(acc)`` with ``f`` = 0.125 (IQ2_*), 0.25 (IQ3_XXS), none (IQ3_S).
  IQ1_S: ``sumi[l]`` from the grid values, a scalar ``sumi1 = Σ_g sc_g·e_g·(bsums)`` folded as
  ``acc1 = fma(d_b, float(sumi1), acc1)`` (``vfmadd231ss``), ``out = hsum(acc) + acc1·0.125`` (``vmulss`` then
  ``vaddss``). IQ1_M: a second lane set ``sumi2[l] = Σ sc·Σ e·q`` (``maddubs(1, sign(q, delta))``) into
  ``acc2`` the same way, ``out = fma(hsum(acc2), 0.125, hsum(acc1))`` (GCC's ``vfmadd132ss``). Both builds'
  disassembly agrees on these contractions.
* ``T >= 8``: the tiled kernel (``tiled/tiled.cpp``: ``tiled_unpack_src0`` of each type stores the codes
  ``w + 128`` — IQ1: ``8g + e + 128`` — with ``BIAS = 128``, ``ACTBIAS``; the fp16 scale times 1/8 (IQ2_*,
  IQ1_*), 1/4 (IQ3_XXS) or 1 (IQ3_S), exact). Per 256-value slab both microtiles (VNNI ``dpbusd`` minus
  ``128·bsum``; avx2 ``maddubs`` of the +128-biased activation with ``w``, minus the precomputed
  ``128·Σ sc·Σ w``) form the same exact ``s1 = Σ_s sc_s·Σ w_t·q`` (``w_t = w``, IQ1: ``8g + e``), then
  ``acc = fma(d0·float(s1), y.d, acc)`` in slab order (as :mod:`kernels.ggml.mulmat_k`), so neither path, the
  window (narrow or standard) nor the thread count changes a bit.

``mul_mat_id``: the (token, slot) rows are grouped per expert in token order; an expert with 8 or more rows
runs the tiled kernel, others ``vec_dot`` (``kernels.ggml.mulmat.mul_mat_id`` groups them, as for the K-quants).
"""

from __future__ import annotations

import numpy as np

from kernels.base.block import QT
from kernels.base.blocks_iq import GRID_IQ1S, GRID_IQ2S, GRID_IQ2XS, GRID_IQ2XXS, GRID_IQ3S, GRID_IQ3XXS, KSIGNS
from kernels.base.flags import jit
from kernels.ggml.actquant import _q8_k_rows
from kernels.ggml.mulmat_q8 import _bytes, _qt
from kernels.ggml.simd import fma32, hsum_fold
from kernels.ggml.vecmath import F16_TO_F32

IQ_TYPES = frozenset({QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.IQ1_S, QT.IQ1_M})
KIND = {QT.IQ2_XXS: 0, QT.IQ2_XS: 1, QT.IQ2_S: 2, QT.IQ3_XXS: 3, QT.IQ3_S: 4, QT.IQ1_S: 5, QT.IQ1_M: 6}
BLOCK_BYTES = (66, 74, 82, 98, 110, 50, 56)
VEC_FACTOR = (0.125, 0.125, 0.125, 0.25, 1.0, 1.0, 1.0)  # *s = f * hsum_float_8(accumf)
TILE_FACTOR = (0.125, 0.125, 0.125, 0.25, 1.0, 0.125, 0.125)  # tile->d = fp16(d) * f
G2XXS, G2XS, G2S = (g.astype(np.int64) for g in (GRID_IQ2XXS, GRID_IQ2XS, GRID_IQ2S))
G3XXS, G3S, G1S = (g.astype(np.int64) for g in (GRID_IQ3XXS, GRID_IQ3S, GRID_IQ1S))
KSIGN = KSIGNS.astype(np.int64)


@jit()
def _u16(w, o):
    return np.int64(w[o]) | (np.int64(w[o + 1]) << 8)


@jit()
def _signed8(v, k, grid, g, signs):
    """``v[k + j] = grid[g, j]``, negated where bit j of ``signs`` is set (j = 0..7)."""
    for j in range(8):
        v[k + j] = -grid[g, j] if (signs >> j) & 1 else grid[g, j]


@jit()
def _signed4(v, k, grid, g, signs, shift):
    for j in range(4):
        v[k + j] = -grid[g, j] if (signs >> (shift + j)) & 1 else grid[g, j]


@jit()
def decode_row(kind, w, v, e, sc, d, tab):
    """One weight row's bytes ``w`` -> ``v`` (K,) signed integers (IQ1: grid values), ``e`` (K,) the IQ1 ±1 delta
    signs (else 0), ``sc`` (K/16,) odd sub-block scales, ``d`` (K/256,) the fp16 scales as float32 (the table:
    ``GGML_CPU_FP16_TO_FP32``). Layouts: ``ggml-common.h`` / ``dequantize_row_iq*``."""
    for b in range(d.shape[0]):
        o, k0, s0 = BLOCK_BYTES[kind] * b, 256 * b, 16 * b
        if kind == 6:  # IQ1_M: qs[32], qh[16], scales u16[4] (fp16 in the top nibbles)
            h = (_u16(w, o + 48) >> 12) | ((_u16(w, o + 50) >> 8) & 0xF0) | ((_u16(w, o + 52) >> 4) & 0xF00)
            d[b] = tab[h | (_u16(w, o + 54) & 0xF000)]  # iq1m_scale_t
        else:
            d[b] = tab[_u16(w, o)]
        for ib in range(8):
            k = k0 + 32 * ib
            if kind == 0:  # IQ2_XXS: per 32: 4 grid bytes, u32 = 4 x 7-bit sign indices | scale << 28
                a = _u16(w, o + 6 + 8 * ib) | (_u16(w, o + 8 + 8 * ib) << 16)
                sc[s0 + 2 * ib] = sc[s0 + 2 * ib + 1] = 2 * (a >> 28) + 1
                for l in range(4):
                    _signed8(v, k + 8 * l, G2XXS, w[o + 2 + 8 * ib + l], KSIGN[(a >> (7 * l)) & 127])
            elif kind == 1:  # IQ2_XS: qs u16[32] (9-bit grid index | 7-bit sign index << 9), scales[8] at 66
                sb = np.int64(w[o + 66 + ib])
                sc[s0 + 2 * ib], sc[s0 + 2 * ib + 1] = 2 * (sb & 15) + 1, 2 * (sb >> 4) + 1
                for l in range(4):
                    q = _u16(w, o + 2 + 8 * ib + 2 * l)
                    _signed8(v, k + 8 * l, G2XS, q & 511, KSIGN[q >> 9])
            elif kind == 2:  # IQ2_S: qs[32] at 2, signs[32] at 34, qh[8] at 66, scales[8] at 74
                sb = np.int64(w[o + 74 + ib])
                sc[s0 + 2 * ib], sc[s0 + 2 * ib + 1] = 2 * (sb & 15) + 1, 2 * (sb >> 4) + 1
                qh = np.int64(w[o + 66 + ib])
                for l in range(4):
                    g = np.int64(w[o + 2 + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300)
                    _signed8(v, k + 8 * l, G2S, g, np.int64(w[o + 34 + 4 * ib + l]))
            elif kind == 3:  # IQ3_XXS: qs[64] at 2 (two 4-value grid bytes per 8), u32 scales_signs[8] at 66
                a = _u16(w, o + 66 + 4 * ib) | (_u16(w, o + 68 + 4 * ib) << 16)
                sc[s0 + 2 * ib] = sc[s0 + 2 * ib + 1] = 2 * (a >> 28) + 1
                for l in range(4):
                    s = KSIGN[(a >> (7 * l)) & 127]
                    _signed4(v, k + 8 * l, G3XXS, w[o + 2 + 8 * ib + 2 * l], s, 0)
                    _signed4(v, k + 8 * l + 4, G3XXS, w[o + 3 + 8 * ib + 2 * l], s, 4)
            elif kind == 4:  # IQ3_S: qs[64] at 2, qh[8] at 66, signs[32] at 74, scales[4] at 106
                ls = (np.int64(w[o + 106 + ib // 2]) >> (4 * (ib % 2))) & 15
                sc[s0 + 2 * ib] = sc[s0 + 2 * ib + 1] = 1 + 2 * ls
                qh = np.int64(w[o + 66 + ib])
                for l in range(4):
                    s = np.int64(w[o + 74 + 4 * ib + l])
                    g1 = np.int64(w[o + 2 + 8 * ib + 2 * l]) | ((qh << (8 - 2 * l)) & 256)
                    g2 = np.int64(w[o + 3 + 8 * ib + 2 * l]) | ((qh << (7 - 2 * l)) & 256)
                    _signed4(v, k + 8 * l, G3S, g1, s, 0)
                    _signed4(v, k + 8 * l + 4, G3S, g2, s, 4)
            elif kind == 5:  # IQ1_S: qs[32] at 2, qh u16[8] at 34 (3 x 3 index bits, scale << 12, delta sign)
                hw = _u16(w, o + 34 + 2 * ib)
                sc[s0 + 2 * ib] = sc[s0 + 2 * ib + 1] = 2 * ((hw >> 12) & 7) + 1
                for l in range(4):
                    g = np.int64(w[o + 2 + 4 * ib + l]) | (((hw >> (3 * l)) & 7) << 8)
                    for j in range(8):
                        v[k + 8 * l + j] = G1S[g, j]
                        e[k + 8 * l + j] = -1 if hw & 0x8000 else 1
            else:  # IQ1_M: per 32: qs[4], qh[2] (3 index bits + a delta sign bit per nibble), 3-bit scales
                hw = _u16(w, o + 48 + 2 * (ib // 2))
                sh = 6 * (ib % 2)
                sc[s0 + 2 * ib], sc[s0 + 2 * ib + 1] = 2 * ((hw >> sh) & 7) + 1, 2 * ((hw >> (sh + 3)) & 7) + 1
                for l in range(4):
                    qh = np.int64(w[o + 32 + 2 * ib + l // 2]) >> (4 * (l % 2))
                    g = np.int64(w[o + 4 * ib + l]) | ((qh & 7) << 8)
                    for j in range(8):
                        v[k + 8 * l + j] = G1S[g, j]
                        e[k + 8 * l + j] = -1 if qh & 8 else 1


@jit()
def vec_dot_iq_rows(kind, w, yq, yd, out, tab):
    """``ggml_vec_dot_iq*_q8_K`` (x86 ``__AVX2__``) for every element: ``w`` (N, row bytes), ``yq`` (T, K) /
    ``yd`` (T, K/256) the Q8_K activations -> ``out`` (T, N)."""
    K = yq.shape[1]
    nb = K // 256
    v, e = np.empty(K, np.int64), np.zeros(K, np.int64)
    sc, d = np.empty(K // 16, np.int64), np.empty(nb, np.float32)
    acc, acc2 = np.empty(8, np.float32), np.empty(8, np.float32)
    sumi, sumi2 = np.empty(8, np.int64), np.empty(8, np.int64)
    f = np.float32(VEC_FACTOR[kind])
    for r in range(w.shape[0]):
        decode_row(kind, w[r], v, e, sc, d, tab)
        for t in range(yq.shape[0]):
            acc[:] = np.float32(0.0)
            acc2[:] = np.float32(0.0)
            acc1 = np.float32(0.0)
            for b in range(nb):
                db = d[b] * yd[t, b]  # FP16_TO_FP32(x.d) * y.d (IQ1: y.d * ..., the same product)
                sumi[:] = 0
                sumi2[:] = 0
                for g in range(8 * b, 8 * b + 8):
                    for lane in range(8):
                        s = sc[2 * g + lane // 4]
                        p, p2 = np.int64(0), np.int64(0)
                        for k in range(32 * g + 4 * lane, 32 * g + 4 * lane + 4):
                            p += v[k] * np.int64(yq[t, k])
                            if kind >= 5:  # IQ1: Σ delta·q (IQ1_S: bsums·delta; IQ1_M: maddubs(1, sign(q, delta)))
                                p2 += e[k] * np.int64(yq[t, k])
                        sumi[lane] += s * p
                        sumi2[lane] += s * p2
                for lane in range(8):
                    acc[lane] = fma32(db, np.float32(sumi[lane]), acc[lane])  # _mm256_fmadd_ps
                    acc2[lane] = fma32(db, np.float32(sumi2[lane]), acc2[lane])
                if kind == 5:  # accum1 += d * sumi1 (vfmadd231ss); sumi1 = Σ bsums·delta·ls
                    acc1 = fma32(db, np.float32(sumi2.sum()), acc1)
            res = hsum_fold(acc, 0, 8)  # hsum_float_8
            if kind == 5:
                res = res + acc1 * np.float32(0.125)  # hsum + IQ1S_DELTA * accum1: vmulss, vaddss
            elif kind == 6:
                res = fma32(hsum_fold(acc2, 0, 8), np.float32(0.125), res)  # vfmadd132ss
            elif kind <= 3:
                res = f * res
            out[t, r] = res


@jit()
def tiled_iq_rows(kind, w, yq, yd, out, tab):
    """``tiled_run_microtile`` per element: per slab the exact ``s1 = Σ sc·Σ w_t·q``, then
    ``acc = fma(d0·float(s1), y.d, acc)`` in slab order (``d0 = fp16(d)·f``)."""
    K = yq.shape[1]
    nb = K // 256
    v, e = np.empty(K, np.int64), np.zeros(K, np.int64)
    sc, d = np.empty(K // 16, np.int64), np.empty(nb, np.float32)
    f = np.float32(TILE_FACTOR[kind])
    mul = 8 if kind >= 5 else 1  # IQ1 codes: 8·grid + delta
    for r in range(w.shape[0]):
        decode_row(kind, w[r], v, e, sc, d, tab)
        for b in range(nb):
            d[b] = d[b] * f  # tile->d = fp16_to_fp32(x.d) * f
        for t in range(yq.shape[0]):
            acc = np.float32(0.0)
            for b in range(nb):
                s1 = np.int64(0)
                for s in range(16 * b, 16 * b + 16):
                    raw = np.int64(0)
                    for k in range(16 * s, 16 * s + 16):
                        raw += (mul * v[k] + e[k]) * np.int64(yq[t, k])
                    s1 += sc[s] * raw
                res = d[b] * np.float32(s1)  # _mm*_mul_ps(cvtepi32_ps(s1), d0)
                acc = fma32(res, yd[t, b], acc)  # buf += res * d1 (FMA)
            out[t, r] = acc


def mul_mat_iq(w_bytes: np.ndarray, qtype, x: np.ndarray, path: str, tiled: bool) -> np.ndarray:
    """``mul_mat`` of IQ rows ``w_bytes`` (N, row bytes) with ``x`` (T, K) float32 -> (T, N): the tiled kernel
    (``tiled``: ggml takes it, T >= 8) or vec_dot. ``path`` ("avx512" / "avx2") changes no bit (see above)."""
    qtype = _qt(qtype)
    if qtype not in IQ_TYPES:
        raise ValueError(f"mul_mat_iq: {qtype.name} is not an IQ1/2/3 type")
    x = np.ascontiguousarray(x, np.float32)
    w = _bytes(w_bytes)  # read-only, as a mapped file's rows: one compiled kernel whoever calls
    kind = KIND[qtype]
    if x.shape[1] % 256 or w.shape[1] != x.shape[1] // 256 * BLOCK_BYTES[kind]:
        raise ValueError(f"weights must be (N, {x.shape[1] // 256 * BLOCK_BYTES[kind]}) bytes, got {w.shape}")
    yq, yd, _ = _q8_k_rows(x)  # quantize_row_q8_K_ref
    out = np.empty((x.shape[0], w.shape[0]), np.float32)
    (tiled_iq_rows if tiled else vec_dot_iq_rows)(kind, w, yq, yd, out, F16_TO_F32)
    return out
