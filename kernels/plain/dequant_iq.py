"""Row decoders of the codebook types IQ1_S … IQ3_S and the ternary TQ1_0 / TQ2_0.

Same contract as :mod:`kernels.plain.dequant` (which dispatches to these): ``_deq_<type>(src, dst)`` turns
one row's bytes into float32 values bit-identical to ``gguf.quants.dequantize``, performing gguf's
float32 operations in gguf's order, which are ``ggml-quants.c::dequantize_row_<type>``'s:

* IQ2_XXS / IQ2_XS / IQ2_S: ``db = d · (0.5 + ls) · 0.25``, value ``(db · grid[j]) · ±1``;
* IQ3_XXS: ``db = d · (0.5 + ls) · 0.5``; IQ3_S: ``db = d · (1 + 2·ls)`` (the integer formed first);
* IQ1_S / IQ1_M: ``dl = d · (2·ls + 1)``, value ``dl · (grid[j] + δ)``, δ = ±0.125 (exact sums);
* TQ1_0 / TQ2_0: ``d · (q − 1)``.

Signs are applied as gguf and ggml do, by multiplying with ±1 (tables ``SIGN_F32`` / ``KSIGN_F32``,
branch-free). Layouts, grids and sign tables: :mod:`kernels.base.blocks_iq`.
"""

from __future__ import annotations

import numpy as np

from kernels.base.blocks_iq import GRID_IQ1S, GRID_IQ2S, GRID_IQ2XS, GRID_IQ2XXS, GRID_IQ3S, GRID_IQ3XXS, IQ1_DELTA, KSIGNS
from kernels.base.flags import jit
from kernels.base.floats import f16_at, f16_bits_to_f32

F32 = np.float32

#: ``SIGN_F32[b, j]`` = −1.0 if bit j of byte b is set, else +1.0: a sign byte as 8 factors, so a
#: value is ``(db · grid[j]) · SIGN_F32[b, j]`` — gguf's and ggml's operation, without a branch.
SIGN_F32 = np.where((np.arange(256)[:, None] >> np.arange(8)) & 1, F32(-1.0), F32(1.0)).astype(F32)
#: ``KSIGN_F32[i] = SIGN_F32[KSIGNS[i]]``: the 8 factors of a 7-bit sign index.
KSIGN_F32 = SIGN_F32[KSIGNS]
#: ``TQ1_F32[b, n]`` = base-3 digit n of the TQ1_0 byte b, minus 1 (``((uint8)(b·3^n)·3) >> 8`` − 1).
TQ1_F32 = np.array([[(((b * 3**n) & 255) * 3 >> 8) - 1 for n in range(5)] for b in range(256)], dtype=F32)


@jit()
def u16_at(src, o):
    """The little-endian uint16 at ``src[o:o+2]`` (a uint8 array), as int."""
    return int(src[o]) | (int(src[o + 1]) << 8)


@jit()
def u32_at(src, o):
    """The little-endian uint32 at ``src[o:o+4]``, as int."""
    return u16_at(src, o) | (u16_at(src, o + 2) << 16)


@jit()
def half_step_scale(d, ls, factor):
    """IQ2/IQ3_XXS sub-block scale ``d · (0.5 + ls) · factor`` (factor 0.25 for IQ2, 0.5 for IQ3_XXS)."""
    return d * (F32(0.5) + F32(ls)) * factor


@jit()
def _put8(dst, y, db, grid, g, sign):
    """``dst[y + j] = (db · grid[g, j]) · sign[j]`` for j = 0..7 (``sign``: 8 factors ±1)."""
    for j in range(8):
        dst[y + j] = (db * grid[g, j]) * sign[j]


@jit()
def _put4(dst, y, db, grid, g, sign, shift):
    """As :func:`_put8` for a 4-value grid entry, with the factors ``sign[shift .. shift+3]``."""
    for j in range(4):
        dst[y + j] = (db * grid[g, j]) * sign[shift + j]


@jit()
def _deq_iq2_xxs(src, dst):
    for b in range(dst.size // 256):
        o = 66 * b
        d = f16_at(src, o)
        for s in range(8):
            q = o + 2 + 8 * s  # four grid indices, then the uint32 of signs and scale
            a = u32_at(src, q + 4)
            db = half_step_scale(d, a >> 28, F32(0.25))
            for l in range(4):
                _put8(dst, 256 * b + 32 * s + 8 * l, db, GRID_IQ2XXS, src[q + l], KSIGN_F32[(a >> (7 * l)) & 127])


@jit()
def _deq_iq2_xs(src, dst):
    for b in range(dst.size // 256):
        o = 74 * b
        d = f16_at(src, o)
        for s in range(8):
            sc = src[o + 66 + s]
            db0 = half_step_scale(d, sc & 15, F32(0.25))  # groups l = 0, 1
            db1 = half_step_scale(d, sc >> 4, F32(0.25))  # groups l = 2, 3
            for l in range(4):
                w = u16_at(src, o + 2 + 8 * s + 2 * l)  # 9-bit grid index | 7-bit sign index << 9
                _put8(dst, 256 * b + 32 * s + 8 * l, db0 if l < 2 else db1, GRID_IQ2XS, w & 511, KSIGN_F32[w >> 9])


@jit()
def _deq_iq2_s(src, dst):
    for b in range(dst.size // 256):
        o = 82 * b
        d = f16_at(src, o)
        for s in range(8):
            sc = src[o + 74 + s]
            db0 = half_step_scale(d, sc & 15, F32(0.25))  # groups l = 0, 1
            db1 = half_step_scale(d, sc >> 4, F32(0.25))  # groups l = 2, 3
            qh = int(src[o + 66 + s])
            for l in range(4):
                g = int(src[o + 2 + 4 * s + l]) | (((qh >> (2 * l)) & 3) << 8)
                _put8(dst, 256 * b + 32 * s + 8 * l, db0 if l < 2 else db1, GRID_IQ2S, g, SIGN_F32[src[o + 34 + 4 * s + l]])


@jit()
def _deq_iq3_xxs(src, dst):
    for b in range(dst.size // 256):
        o = 98 * b
        d = f16_at(src, o)
        for s in range(8):
            a = u32_at(src, o + 66 + 4 * s)
            db = half_step_scale(d, a >> 28, F32(0.5))
            for l in range(4):
                signs = KSIGN_F32[(a >> (7 * l)) & 127]
                y = 256 * b + 32 * s + 8 * l
                _put4(dst, y, db, GRID_IQ3XXS, src[o + 2 + 8 * s + 2 * l], signs, 0)
                _put4(dst, y + 4, db, GRID_IQ3XXS, src[o + 2 + 8 * s + 2 * l + 1], signs, 4)


@jit()
def _deq_iq3_s(src, dst):
    for b in range(dst.size // 256):
        o = 110 * b
        d = f16_at(src, o)
        for s in range(8):
            db = d * F32(1 + 2 * ((int(src[o + 106 + s // 2]) >> (4 * (s & 1))) & 15))
            qh = int(src[o + 66 + s])
            for l in range(4):
                signs = SIGN_F32[src[o + 74 + 4 * s + l]]
                g1 = int(src[o + 2 + 8 * s + 2 * l]) | (((qh >> (2 * l)) & 1) << 8)
                g2 = int(src[o + 2 + 8 * s + 2 * l + 1]) | (((qh >> (2 * l + 1)) & 1) << 8)
                y = 256 * b + 32 * s + 8 * l
                _put4(dst, y, db, GRID_IQ3S, g1, signs, 0)
                _put4(dst, y + 4, db, GRID_IQ3S, g2, signs, 4)


@jit()
def _put_iq1(dst, y, dl, g, negative_shift):
    """``dst[y + j] = dl · (iq1s_grid[g, j] + δ)``, δ = −0.125 if ``negative_shift`` else +0.125."""
    delta = -IQ1_DELTA if negative_shift else IQ1_DELTA
    for j in range(8):
        dst[y + j] = dl * (GRID_IQ1S[g, j] + delta)


@jit()
def _deq_iq1_s(src, dst):
    for b in range(dst.size // 256):
        o = 50 * b
        d = f16_at(src, o)
        for s in range(8):
            qh = u16_at(src, o + 34 + 2 * s)
            dl = d * F32(2 * ((qh >> 12) & 7) + 1)
            for l in range(4):
                g = int(src[o + 2 + 4 * s + l]) | (((qh >> (3 * l)) & 7) << 8)
                _put_iq1(dst, 256 * b + 32 * s + 8 * l, dl, g, qh & 0x8000)


@jit()
def iq1_m_scale(src, o):
    """IQ1_M's f16 super-block scale, gathered from the top nibbles of the four uint16 at ``src[o+48:]``."""
    bits = (
        (u16_at(src, o + 48) >> 12)
        | ((u16_at(src, o + 50) >> 8) & 0x00F0)
        | ((u16_at(src, o + 52) >> 4) & 0x0F00)
        | (u16_at(src, o + 54) & 0xF000)
    )
    return f16_bits_to_f32(bits)


@jit()
def _deq_iq1_m(src, dst):
    for b in range(dst.size // 256):
        o = 56 * b
        d = iq1_m_scale(src, o)
        for s in range(8):
            sc = u16_at(src, o + 48 + 2 * (s // 2)) >> (6 * (s & 1))
            dl0 = d * F32(2 * (sc & 7) + 1)  # values 32s .. 32s+15
            dl1 = d * F32(2 * ((sc >> 3) & 7) + 1)  # values 32s+16 .. 32s+31
            for l in range(4):
                nib = (int(src[o + 32 + 2 * s + l // 2]) >> (4 * (l & 1))) & 15  # 3 index bits | shift sign
                g = int(src[o + 4 * s + l]) | ((nib & 7) << 8)
                _put_iq1(dst, 256 * b + 32 * s + 8 * l, dl0 if l < 2 else dl1, g, nib & 8)


@jit()
def tq1_digit(byte, n):
    """Base-3 digit ``n`` of a TQ1_0 byte: ``((uint8)(byte · 3^n) · 3) >> 8`` (0, 1 or 2)."""
    return (((int(byte) * 3**n) & 255) * 3) >> 8


@jit()
def _deq_tq1_0(src, dst):
    for b in range(dst.size // 256):
        o = 54 * b
        d = f16_at(src, o + 52)
        y = 256 * b
        for n in range(5):  # qs[0..31]: value 32n + m
            for m in range(32):
                dst[y + 32 * n + m] = d * TQ1_F32[src[o + m], n]
        for n in range(5):  # qs[32..47]: value 160 + 16n + m
            for m in range(16):
                dst[y + 160 + 16 * n + m] = d * TQ1_F32[src[o + 32 + m], n]
        for n in range(4):  # qh[0..3]: value 240 + 4n + m
            for m in range(4):
                dst[y + 240 + 4 * n + m] = d * TQ1_F32[src[o + 48 + m], n]


@jit()
def _deq_tq2_0(src, dst):
    for b in range(dst.size // 256):
        o = 66 * b
        d = f16_at(src, o + 64)
        for c in range(2):
            for l in range(4):
                for m in range(32):
                    q = (int(src[o + 32 * c + m]) >> (2 * l)) & 3
                    dst[256 * b + 128 * c + 32 * l + m] = d * F32(q - 1)
