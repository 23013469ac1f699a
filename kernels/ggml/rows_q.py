"""``dequantize_row_*`` (``ggml-quants.c``, libggml-base: no FMA, every operation rounded as written in C) of
Q2_K, Q3_K and the legacy Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, for :func:`kernels.ggml.rows.get_rows` (its
docstring says why these decoders are transcribed instead of reusing ``kernels.plain.dequant``'s).

* Q2_K: ``y = (d·(sc & 15))·q - dmin·(sc >> 4)`` (each product rounded, then the subtraction), ``q`` the
  2-bit code, one scale byte per 16 values;
* Q3_K: ``y = (d·(sc - 32))·(low2 - (hbit ? 0 : 4))``, the 6-bit scales of the kmask shuffle;
* Q4_0 / Q5_0: ``y = float(q - 8 | q - 16)·d``; IQ4_NL: ``y = d·kvalues_iq4nl[q]``;
* Q4_1 / Q5_1: ``y = float(q)·d + m`` — a multiply, then an add; when both are NaN the add keeps the
  product's (its first source's, as GCC's ``addss`` has it): said explicitly, since LLVM may swap the operands
  of a commutative ``fadd``.

``src``: [N, row bytes] uint8, ``y``: [N, n] float32, ``tab``: ``F16_TO_F32`` (ggml's half -> float, NaN payloads
kept).

AArch64 (:func:`arm64_nans`): libggml-base is built with the build's ``-march`` there, and GCC contracts Q4_1 / Q5_1's
``x*d + m`` into ``fmadd`` / ``fmla`` (addend ``m``) and Q4_K / Q5_K's ``d1*q - m1`` into ``fmla`` on ``-m1``
(``fneg`` of the broadcast ``m1``); the products are exact, so only NaNs differ: Arm's FPMulAdd returns the addend's
NaN first (``-m1``'s with its sign flipped), and every NaN an operation makes is 0x7FC00000.
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import jit
from kernels.ggml.isa import ARM_NAN, X86_NAN
from kernels.ggml.simd import bits_f32, f32_bits
from kernels.ggml.vecmath import F16_TO_F32, fp16_at
from kernels.plain.dequant import IQ4NL_F32, k_scale_min


@jit()
def _deq_q2_k(src, y, tab):
    for r in range(src.shape[0]):
        for i in range(y.shape[1] // 256):  # block_q2_K: scales[16], qs[64], d, dmin
            o = 84 * i
            d = fp16_at(src[r], o + 80, tab)
            mn = fp16_at(src[r], o + 82, tab)
            for e in range(256):  # n = e / 128 (q += 32), j = e % 128 / 32 (shift 2j), is = e / 16
                sc = int(src[r, o + e // 16])
                dl, ml = np.float32(d * np.float32(sc & 15)), np.float32(mn * np.float32(sc >> 4))
                q = (int(src[r, o + 16 + 32 * (e // 128) + e % 32]) >> (2 * (e % 128 // 32))) & 3
                y[r, 256 * i + e] = np.float32(dl * np.float32(q)) - ml  # dl * ((int8_t)(…)) - ml


@jit()
def _deq_q3_k(src, y, tab):
    for r in range(src.shape[0]):
        for i in range(y.shape[1] // 256):  # block_q3_K: hmask[32], qs[64], scales[12], d
            o = 110 * i
            d_all = fp16_at(src[r], o + 108, tab)
            for e in range(256):
                s, b = e // 16, o + 96 + e // 16 % 4  # scales[s] after the kmask shuffle of aux[0..3]
                lo = (int(src[r, b + 4 * (s // 4 % 2)]) >> (4 * (s // 8))) & 15
                sc = lo | (((int(src[r, b + 8]) >> (2 * (s // 4))) & 3) << 4)
                dl = np.float32(d_all * np.float32(sc - 32))  # d_all * (scales[is++] - 32)
                low = (int(src[r, o + 32 + 32 * (e // 128) + e % 32]) >> (2 * (e % 128 // 32))) & 3
                hm = (int(src[r, o + e % 32]) >> (e // 32)) & 1  # m = 1 << (4n + j)
                y[r, 256 * i + e] = dl * np.float32(low - (0 if hm else 4))


@jit()
def _deq_legacy(src, y, tab, kind):
    """dequantize_row_{q4_0, q4_1, q5_0, q5_1, iq4_nl} (kind 0…4): ``x*d`` or ``x*d + m`` (mul, then add)."""
    size = (18, 20, 22, 24, 18)[kind]
    qs_at = (2, 4, 6, 8, 2)[kind]
    for r in range(src.shape[0]):
        for i in range(y.shape[1] // 32):
            o = size * i
            d = fp16_at(src[r], o, tab)
            m = fp16_at(src[r], o + 2, tab) if kind == 1 or kind == 3 else np.float32(0.0)
            qh = np.int64(0)
            if kind == 2 or kind == 3:
                for k in range(4):
                    qh |= np.int64(src[r, o + qs_at - 4 + k]) << (8 * k)
            for j in range(32):
                v = (np.int64(src[r, o + qs_at + j % 16]) >> (4 * (j // 16))) & 15
                if kind == 2 or kind == 3:
                    v |= ((qh >> j) & 1) << 4  # xh_0 = ((qh >> j) << 4) & 0x10, xh_1 = (qh >> (j + 12)) & 0x10
                if kind == 4:
                    y[r, 32 * i + j] = d * IQ4NL_F32[v]  # d * kvalues_iq4nl[…]
                elif kind == 1 or kind == 3:  # x0*d + m: addss keeps its first source's NaN (x0*d) when both are
                    p = np.float32(np.float32(v) * d)  # NaN; LLVM may swap a commutative fadd, so say it
                    y[r, 32 * i + j] = p if p != p else p + m
                else:
                    y[r, 32 * i + j] = np.float32(v - (8 if kind == 0 else 16)) * d  # x0*d


def _legacy(kind):
    return lambda src, y, tab: _deq_legacy(src, y, tab, kind)


#: ``F16_TO_F32`` with every NaN's sign flipped: decoding with it tells a NaN that came from an f16 scale (it
#: changes) from one an operation made (inf·0, inf - inf: it does not)
F16_TO_F32_FLIPPED = F16_TO_F32.copy()
F16_TO_F32_FLIPPED.view(np.uint32)[np.isnan(F16_TO_F32)] ^= np.uint32(0x80000000)


@jit()
def _is_nan(u):
    return (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)


@jit()
def _arm_fma_bits(a, p, x):
    """Bits of Arm's ``FPMulAdd(addend a, p, x)`` for ``a``, ``p`` quiet NaNs or numbers and ``x`` a small integer
    (never NaN): the addend's NaN — the default one if ``p·x`` is inf·0 —, else ``p``'s, else the number (the
    product is exact: fused or not, the same), a NaN made there being the default one."""
    ab, pb = np.uint32(f32_bits(a)), np.uint32(f32_bits(p))
    if _is_nan(ab):
        return np.uint32(ARM_NAN) if np.isinf(p) and x == 0 else ab
    if _is_nan(pb):
        return pb
    v = np.float32(np.float32(p * np.float32(x)) + a)
    return np.uint32(ARM_NAN) if v != v else np.uint32(f32_bits(v))


@jit()
def _arm_mul(a, b):
    """``fmul`` of a number or quiet NaN ``a`` by a small integer ``b``: ``a``'s NaN, or the default one for inf·0."""
    v = np.float32(a * np.float32(b))
    return bits_f32(ARM_NAN) if v != v and a == a else v


@jit()
def _legacy_1_arm64(src, yb, tab, kind):
    """Q4_1 (kind 1) / Q5_1 (3) on AArch64: ``fmadd`` / ``fmla`` with the addend ``m``."""
    size, qs_at = (20 if kind == 1 else 24), (4 if kind == 1 else 8)
    for r in range(src.shape[0]):
        for i in range(yb.shape[1] // 32):
            o = size * i
            d, m = fp16_at(src[r], o, tab), fp16_at(src[r], o + 2, tab)
            qh = np.int64(0)
            if kind == 3:
                for k in range(4):
                    qh |= np.int64(src[r, o + 4 + k]) << (8 * k)
            for j in range(32):
                v = (np.int64(src[r, o + qs_at + j % 16]) >> (4 * (j // 16))) & 15
                if kind == 3:
                    v |= ((qh >> j) & 1) << 4
                yb[r, 32 * i + j] = _arm_fma_bits(m, d, v)


@jit()
def _k_arm64(src, yb, tab, five):
    """Q4_K / Q5_K (``five``) on AArch64: ``d1 = sc·d``, ``m1 = m·dmin`` (``fmul``), ``fmla`` on the addend ``-m1``
    (``fneg``: a NaN's sign flipped)."""
    size = 176 if five else 144
    for r in range(src.shape[0]):
        for i in range(yb.shape[1] // 256):
            o = size * i
            d, dmin = fp16_at(src[r], o, tab), fp16_at(src[r], o + 2, tab)
            ql = o + (48 if five else 16)
            for e in range(256):
                j, half, l = e // 64, (e // 32) % 2, e % 32
                sc, m = k_scale_min(src[r], o + 4, 2 * j + half)
                d1, m1 = _arm_mul(d, sc), _arm_mul(dmin, m)
                q = (int(src[r, ql + 32 * j + l]) >> (4 * half)) & 15
                if five and (int(src[r, o + 16 + l]) >> (2 * j + half)) & 1:
                    q += 16
                yb[r, 256 * i + e] = _arm_fma_bits(bits_f32(np.uint32(f32_bits(m1)) ^ np.uint32(0x80000000)), d1, q)


def arm64_nans(qtype, decode, sel, y):
    """The AArch64 NaNs of ``y`` = ``decode(sel)`` (x86's bits, :mod:`kernels.ggml.rows`): Q4_1, Q5_1, Q4_K, Q5_K
    decoded again with Arm's FMA rules; every other type's NaNs made by an operation (an inf scale times 0) become
    the default 0x7FC00000 — found as the NaNs that do not change when the f16 scales' NaNs are flipped."""
    from kernels.base.blocks import QT

    yb = y.view(np.uint32)
    if qtype in (QT.Q4_1, QT.Q5_1):
        _legacy_1_arm64(sel, yb, F16_TO_F32, 1 if qtype == QT.Q4_1 else 3)
    elif qtype in (QT.Q4_K, QT.Q5_K):
        _k_arm64(sel, yb, F16_TO_F32, qtype == QT.Q5_K)
    elif np.isnan(y).any():
        y2 = np.empty_like(y)
        decode(sel, y2, F16_TO_F32_FLIPPED)
        made = np.isnan(y) & (yb == y2.view(np.uint32)) & (yb == X86_NAN)
        yb[made] = ARM_NAN
