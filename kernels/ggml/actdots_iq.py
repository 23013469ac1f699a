"""Q8_K dot products of the codebook types IQ1_S … IQ3_S and the ternary TQ1_0 / TQ2_0.

Transcriptions of ``ggml-cpu/quants.c::ggml_vec_dot_<type>_q8_K_generic``, dispatched from
:func:`kernels.ggml.actdots._dot_with_q8_k`. As there, every block's integer sum is exact and the floats
combine in the C formula and order. Per type (``dx`` = the f16 scale, ``dy`` = Q8_K's float32 ``d``,
``ls`` the 4- or 3-bit sub-block scale, Σ exact int32 sums of grid·sign·q8):

============  ==================================================================================
IQ2_XXS/XS/S  ``bsum = Σ_sub (2·ls + 1)·Σ``; ``sumf += (dx·dy)·bsum``; result ``0.125·sumf``
IQ3_XXS       the same, result ``0.25·sumf``
IQ3_S         ``bsum = Σ_sub (2·ls + 1)·Σ``; ``sumf += (dx·dy)·bsum``; result ``sumf``
IQ1_S         ``sumi = Σ ls'·Σ grid·q8``, ``sumi1 = Σ ls'·(±1)·(bsums pair)`` with ls' = 2·ls + 1;
              ``sumf += (dx·dy)·(sumi + 0.125·sumi1)``
IQ1_M         as IQ1_S per 16-value half with its own ls', the ±1 shift per group of 8 applied to
              ``Σ q8``; ``sumf += (dx·dy)·(sumi1 + 0.125·sumi2)``
TQ1_0         ``sumf += sum·(dx·dy)``;  TQ2_0: ``sumf += sumi·(dy·dx)``
============  ==================================================================================

What the x86 build (``ggml-cpu/arch/x86/quants.c``, AVX2 branch, also taken on AVX-512 hosts)
does differently is only *where the float sums round*, never the integers or the factors: the same
exact products and ``2·ls + 1`` scales (``_mm256_maddubs_epi16`` / ``_mm256_madd_epi16``, no
saturation at these magnitudes), then ``fma(dx·dy, float(lane), acc)`` into eight float lanes per
super-block, ``hsum_float_8`` at the end, and the constant factor (0.125, 0.25) applied to that
sum; IQ1_S/IQ1_M keep the shift term in a separate accumulator added last. With ≥ 8 activation
rows llama.cpp takes ``ggml-cpu/tiled/tiled.cpp`` instead, with its own float order. The tests
bound the difference (``tests/test_kernels_ggml.py``).
"""

from __future__ import annotations

import numpy as np

from kernels.base.blocks_iq import GRID_IQ1S, GRID_IQ2S, GRID_IQ2XS, GRID_IQ2XXS, GRID_IQ3S, GRID_IQ3XXS, KSIGNS
from kernels.plain.dequant_iq import iq1_m_scale, tq1_digit, u16_at, u32_at
from kernels.base.flags import jit
from kernels.base.floats import f16_at

F32 = np.float32
# The grids as integers (the C tables are uint8 / int8; every value here is exact).
GRID_IQ2XXS_I = GRID_IQ2XXS.astype(np.int32)
GRID_IQ2XS_I = GRID_IQ2XS.astype(np.int32)
GRID_IQ2S_I = GRID_IQ2S.astype(np.int32)
GRID_IQ3XXS_I = GRID_IQ3XXS.astype(np.int32)
GRID_IQ3S_I = GRID_IQ3S.astype(np.int32)
GRID_IQ1S_I = GRID_IQ1S.astype(np.int32)


@jit()
def _signed8(grid, g, signs, yqs, y):
    """Σ_j grid[g, j]·yqs[y + j]·(−1 if bit j of ``signs``) for j = 0..7 (exact int)."""
    s = 0
    for j in range(8):
        p = grid[g, j] * int(yqs[y + j])
        s += -p if (signs >> j) & 1 else p
    return s


@jit()
def _signed4(grid, g, signs, shift, yqs, y):
    """As :func:`_signed8` for a 4-value grid entry, sign bits ``shift .. shift+3``."""
    s = 0
    for j in range(4):
        p = grid[g, j] * int(yqs[y + j])
        s += -p if (signs >> (shift + j)) & 1 else p
    return s


@jit()
def _dot_iq2_xxs_q8_k(x, yqs, yd, ybsums):
    sumf = F32(0.0)
    for i in range(yd.size):
        o = 66 * i
        bsum = 0
        for s in range(8):
            q = o + 2 + 8 * s
            a = u32_at(x, q + 4)
            sumi = 0
            for l in range(4):
                sumi += _signed8(GRID_IQ2XXS_I, x[q + l], KSIGNS[(a >> (7 * l)) & 127], yqs, 256 * i + 32 * s + 8 * l)
            bsum += sumi * (2 * (a >> 28) + 1)
        sumf += (f16_at(x, o) * yd[i]) * F32(bsum)
    return F32(0.125) * sumf


@jit()
def _dot_iq2_xs_q8_k(x, yqs, yd, ybsums):
    sumf = F32(0.0)
    for i in range(yd.size):
        o = 74 * i
        bsum = 0
        for s in range(8):
            sc = int(x[o + 66 + s])
            for h in range(2):  # l = 0, 1 use the low nibble, l = 2, 3 the high one
                sumi = 0
                for l in range(2 * h, 2 * h + 2):
                    w = u16_at(x, o + 2 + 8 * s + 2 * l)
                    sumi += _signed8(GRID_IQ2XS_I, w & 511, KSIGNS[w >> 9], yqs, 256 * i + 32 * s + 8 * l)
                bsum += sumi * (2 * ((sc >> (4 * h)) & 15) + 1)
        sumf += (f16_at(x, o) * yd[i]) * F32(bsum)
    return F32(0.125) * sumf


@jit()
def _dot_iq2_s_q8_k(x, yqs, yd, ybsums):
    sumf = F32(0.0)
    for i in range(yd.size):
        o = 82 * i
        bsum = 0
        for s in range(8):
            sc = int(x[o + 74 + s])
            qh = int(x[o + 66 + s])
            sumi1 = 0  # groups l = 0, 1 (low scale nibble)
            sumi2 = 0  # groups l = 2, 3 (high nibble)
            for l in range(4):
                g = int(x[o + 2 + 4 * s + l]) | (((qh >> (2 * l)) & 3) << 8)
                t = _signed8(GRID_IQ2S_I, g, x[o + 34 + 4 * s + l], yqs, 256 * i + 32 * s + 8 * l)
                if l < 2:
                    sumi1 += t
                else:
                    sumi2 += t
            bsum += (1 + 2 * (sc & 15)) * sumi1 + (1 + 2 * (sc >> 4)) * sumi2
        sumf += (f16_at(x, o) * yd[i]) * F32(bsum)
    return F32(0.125) * sumf


@jit()
def _dot_iq3_xxs_q8_k(x, yqs, yd, ybsums):
    sumf = F32(0.0)
    for i in range(yd.size):
        o = 98 * i
        bsum = 0
        for s in range(8):
            a = u32_at(x, o + 66 + 4 * s)
            sumi = 0
            for l in range(4):
                signs = KSIGNS[(a >> (7 * l)) & 127]
                y = 256 * i + 32 * s + 8 * l
                sumi += _signed4(GRID_IQ3XXS_I, x[o + 2 + 8 * s + 2 * l], signs, 0, yqs, y)
                sumi += _signed4(GRID_IQ3XXS_I, x[o + 2 + 8 * s + 2 * l + 1], signs, 4, yqs, y + 4)
            bsum += sumi * (2 * (a >> 28) + 1)
        sumf += (f16_at(x, o) * yd[i]) * F32(bsum)
    return F32(0.25) * sumf


@jit()
def _dot_iq3_s_q8_k(x, yqs, yd, ybsums):
    sumf = F32(0.0)
    for i in range(yd.size):
        o = 110 * i
        bsum = 0
        for s in range(8):
            qh = int(x[o + 66 + s])
            sumi = 0
            for l in range(4):
                signs = x[o + 74 + 4 * s + l]
                g1 = int(x[o + 2 + 8 * s + 2 * l]) | (((qh >> (2 * l)) & 1) << 8)
                g2 = int(x[o + 2 + 8 * s + 2 * l + 1]) | (((qh >> (2 * l + 1)) & 1) << 8)
                y = 256 * i + 32 * s + 8 * l
                sumi += _signed4(GRID_IQ3S_I, g1, signs, 0, yqs, y) + _signed4(GRID_IQ3S_I, g2, signs, 4, yqs, y + 4)
            bsum += sumi * (2 * ((int(x[o + 106 + s // 2]) >> (4 * (s & 1))) & 15) + 1)
        sumf += (f16_at(x, o) * yd[i]) * F32(bsum)
    return sumf


@jit()
def _grid8(g, yqs, y):
    """Σ_j iq1s_grid[g, j]·yqs[y + j] for j = 0..7 (exact int)."""
    s = 0
    for j in range(8):
        s += GRID_IQ1S_I[g, j] * int(yqs[y + j])
    return s


@jit()
def _dot_iq1_s_q8_k(x, yqs, yd, ybsums):
    sumf = F32(0.0)
    for i in range(yd.size):
        o = 50 * i
        sumi = 0
        sumi1 = 0
        for s in range(8):
            qh = u16_at(x, o + 34 + 2 * s)
            ls = 2 * ((qh >> 12) & 7) + 1
            lsum = 0
            for l in range(4):
                g = int(x[o + 2 + 4 * s + l]) | (((qh >> (3 * l)) & 7) << 8)
                lsum += _grid8(g, yqs, 256 * i + 32 * s + 8 * l)
            sumi += ls * lsum
            delta = -1 if qh & 0x8000 else 1
            sumi1 += ls * delta * (int(ybsums[16 * i + 2 * s]) + int(ybsums[16 * i + 2 * s + 1]))
        sumf += f16_at(x, o) * yd[i] * (F32(sumi) + F32(0.125) * F32(sumi1))
    return sumf


@jit()
def _dot_iq1_m_q8_k(x, yqs, yd, ybsums):
    sumf = F32(0.0)
    for i in range(yd.size):
        o = 56 * i
        sumi1 = 0
        sumi2 = 0
        for s in range(8):
            sc = u16_at(x, o + 48 + 2 * (s // 2)) >> (6 * (s & 1))
            ls1 = 2 * (sc & 7) + 1  # groups l = 0, 1
            ls2 = 2 * ((sc >> 3) & 7) + 1  # groups l = 2, 3
            for l in range(4):
                nib = (int(x[o + 32 + 2 * s + l // 2]) >> (4 * (l & 1))) & 15  # 3 index bits | shift sign
                g = int(x[o + 4 * s + l]) | ((nib & 7) << 8)
                y = 256 * i + 32 * s + 8 * l
                lsum2 = 0
                for j in range(8):
                    lsum2 += int(yqs[y + j])
                ls = ls1 if l < 2 else ls2
                sumi1 += ls * _grid8(g, yqs, y)
                sumi2 += ls * (-lsum2 if nib & 8 else lsum2)
        sumf += iq1_m_scale(x, o) * yd[i] * (F32(sumi1) + F32(0.125) * F32(sumi2))
    return sumf


@jit()
def _dot_tq1_0_q8_k(x, yqs, yd, ybsums):
    sumf = F32(0.0)
    for i in range(yd.size):
        o = 54 * i
        y = 256 * i
        total = 0
        for n in range(5):  # value order as in dequant_iq._deq_tq1_0
            for m in range(32):
                total += (tq1_digit(x[o + m], n) - 1) * int(yqs[y + 32 * n + m])
        for n in range(5):
            for m in range(16):
                total += (tq1_digit(x[o + 32 + m], n) - 1) * int(yqs[y + 160 + 16 * n + m])
        for n in range(4):
            for m in range(4):
                total += (tq1_digit(x[o + 48 + m], n) - 1) * int(yqs[y + 240 + 4 * n + m])
        sumf += F32(total) * (f16_at(x, o + 52) * yd[i])
    return sumf


@jit()
def _dot_tq2_0_q8_k(x, yqs, yd, ybsums):
    sumf = F32(0.0)
    for i in range(yd.size):
        o = 66 * i
        sumi = 0
        for c in range(2):
            for l in range(4):
                for m in range(32):
                    sumi += int(yqs[256 * i + 128 * c + 32 * l + m]) * (((int(x[o + 32 * c + m]) >> (2 * l)) & 3) - 1)
        sumf += F32(sumi) * (yd[i] * f16_at(x, o + 64))
    return sumf
