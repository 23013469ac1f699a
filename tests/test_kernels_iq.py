"""The codebook types (IQ1_S … IQ3_S) and TQ1_0 / TQ2_0: checks specific to their layouts.

The generic tests cover them too (they are parametrized over ``kernels.WEIGHT_TYPES``: bit-exact
dequantization vs gguf, both matmul paths, act_quant vs float64 and vs libggml). Here:

* grid entries and sign tables spot-checked against ggml's C tables (``ggml-common.h``, values
  written out below);
* hand-built blocks whose values are worked out in the comments;
* act_quant bit for bit against plain-Python transcriptions of the generic C dots
  (``ggml-cpu/quants.c::ggml_vec_dot_<type>_q8_K_generic``), written from the C source with gguf's
  grids as the only shared data.
"""

import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants
from test_kernels_actquant import assert_act_quant_equals_transcription, f16, py_quantize_q8_k

import kernels
from kernels.base.blocks_iq import GRID_IQ1S, GRID_IQ2S, GRID_IQ2XS, GRID_IQ2XXS, GRID_IQ3S, GRID_IQ3XXS, KSIGNS
from kernels.testing import random_rows

F32 = np.float32


def _u64_bytes(v):
    return list(struct.pack("<Q", v))


def test_grids_match_ggml_tables():
    # entries of ggml-common.h's tables (uint64 / uint32, little-endian: byte j = value j)
    assert list(GRID_IQ2XXS[1]) == _u64_bytes(0x080808080808082B)
    assert list(GRID_IQ2XXS[255]) == _u64_bytes(0x2B2B2B1908081908)
    assert list(GRID_IQ2XS[7]) == _u64_bytes(0x080808080819192B)
    assert list(GRID_IQ2S[1023]) == _u64_bytes(0x2B2B2B2B2B2B2B2B)
    assert list(GRID_IQ3XXS[0]) == list(struct.pack("<I", 0x04040404))
    assert list(GRID_IQ3XXS[1]) == list(struct.pack("<I", 0x04040414))
    assert list(GRID_IQ3S[0]) == list(struct.pack("<I", 0x01010101))
    assert list(GRID_IQ3S[1]) == list(struct.pack("<I", 0x01010103))
    # iq1s_grid holds int8 −1/0/+1: 0xffffffffffffffff is all −1, 0xffffffffffffff01 is [1, −1 × 7]
    assert list(GRID_IQ1S[0]) == [-1] * 8
    assert list(GRID_IQ1S[1]) == list(np.frombuffer(struct.pack("<Q", 0xFFFFFFFFFFFFFF01), np.int8))
    assert list(GRID_IQ1S[2]) == list(np.frombuffer(struct.pack("<Q", 0xFFFFFFFFFFFF0000), np.int8))
    assert [GRID_IQ2XXS.shape, GRID_IQ2XS.shape, GRID_IQ2S.shape] == [(256, 8), (512, 8), (1024, 8)]
    assert [GRID_IQ3XXS.shape, GRID_IQ3S.shape, GRID_IQ1S.shape] == [(256, 4), (512, 4), (2048, 8)]
    # ksigns_iq2xs: 7 bits plus an eighth that makes the number of set bits even
    assert list(KSIGNS[:8]) == [0, 129, 130, 3, 132, 5, 6, 135]
    assert all(bin(int(k)).count("1") % 2 == 0 and (int(k) & 127) == i for i, k in enumerate(KSIGNS))


def _block(size, **fields):
    b = np.zeros(size, np.uint8)
    for off, data in fields.values():
        b[off : off + len(data)] = data
    return b


def test_iq2_xxs_hand_block():
    # d = 1.0; sub-block 0: grid indices [1, 0, 0, 0], a = sign index 1 for group 0 | scale 3 << 28
    a = 1 | (3 << 28)
    blk = _block(66, d=(0, [0x00, 0x3C]), g=(2, [1, 0, 0, 0]), a=(6, list(struct.pack("<I", a))))
    y = kernels.dequantize(blk[None], QT.IQ2_XXS)[0]
    # db = 1 · (0.5 + 3) · 0.25 = 0.875; iq2xxs_grid[1] = [43, 8 × 7]; KSIGNS[1] = 0b10000001
    np.testing.assert_array_equal(y[:8], [-37.625, 7, 7, 7, 7, 7, 7, -7])
    np.testing.assert_array_equal(y[8:32], 7.0)  # grid[0] = 8 × 8, no signs
    np.testing.assert_array_equal(y[32:], 1.0)  # other sub-blocks: scale 0 → db = 0.125, value 8 · 0.125


def test_iq3_s_hand_block():
    # d = 0.5; scales[0] = 0x21: sub-block 0 nibble 1 → db = 0.5·3 = 1.5, sub-block 1 nibble 2 → 2.5
    # qs[0] = 1, qh[0] bit 1 set → second half of group 0 uses index 0 | 1 << 8 = 256; signs[0] = 0x01
    blk = _block(110, d=(0, [0x00, 0x38]), qs=(2, [1, 0]), qh=(66, [0b10]), signs=(74, [0x01]), sc=(106, [0x21]))
    y = kernels.dequantize(blk[None], QT.IQ3_S)[0]
    np.testing.assert_array_equal(y[:4], [-4.5, 1.5, 1.5, 1.5])  # grid[1] = [3, 1, 1, 1], value 0 negative
    np.testing.assert_array_equal(y[4:8], 1.5 * GRID_IQ3S[256])
    np.testing.assert_array_equal(y[8:32], 1.5)  # grid[0] = [1, 1, 1, 1]
    np.testing.assert_array_equal(y[32:64], 2.5)
    np.testing.assert_array_equal(y[64:], 0.5)  # scale nibble 0 → db = d


def test_iq1_m_hand_block():
    # d = 2.0 = f16 0x4000: its nibbles go to the tops of sc[0..3] → only sc[3] gets 0x4 << 12.
    # sc[0] low 12 bits: 3-bit scales 1 (values 0..15) and 2 (values 16..31) of sub-block 0.
    sc0 = 1 | (2 << 3)
    blk = _block(56, qh=(32, [0x08]), sc=(48, list(struct.pack("<4H", sc0, 0, 0, 0x4000))))
    y = kernels.dequantize(blk[None], QT.IQ1_M)[0]
    # grid[0] = all −1. Group 0: dl = 2·(2·1+1) = 6, shift −0.125 (qh bit 3) → 6·(−1.125) = −6.75
    np.testing.assert_array_equal(y[:8], -6.75)
    np.testing.assert_array_equal(y[8:16], 6 * (-1 + 0.125))
    np.testing.assert_array_equal(y[16:32], 10 * (-1 + 0.125))  # dl = 2·(2·2+1)
    np.testing.assert_array_equal(y[32:], 2 * (-1 + 0.125))


def test_tq1_0_hand_block():
    # digits of a byte: b = 0 → all digits 0 (value −d); b = 255 → digits ((255·3^n mod 256)·3) >> 8
    blk = _block(54, qs=(0, [255]), d=(52, [0x00, 0x3C]))
    y = kernels.dequantize(blk[None], QT.TQ1_0)[0]
    digits = [((255 * 3**n % 256) * 3) >> 8 for n in range(5)]  # [2, 2, 2, 2, 2]
    np.testing.assert_array_equal(y[[0, 32, 64, 96, 128]], np.array(digits, F32) - 1)
    np.testing.assert_array_equal(np.delete(y, [0, 32, 64, 96, 128]), -1.0)


# --------------------------------------------------------------------------------------------
# act_quant bit for bit against plain-Python transcriptions of the generic C


def _grid(cls):
    cls.init_grid()
    return cls.grid.reshape(cls.grid_shape).astype(int).tolist()


KS = list(np.frombuffer(gguf_quants.IQ2_XXS.ksigns, np.uint8))


def _signed(grid_row, signs, q8, shift=0):
    return sum(g * q * (-1 if signs & (1 << (shift + j)) else 1) for j, (g, q) in enumerate(zip(grid_row, q8)))


def py_dot_iq2_xxs(w, y):
    grid = _grid(gguf_quants.IQ2_XXS)
    sumf = F32(0)
    for i, (yd, q8, _) in enumerate(y):
        blk = w[66 * i : 66 * i + 66]
        d = F32(f16(blk, 0) * yd)
        bsum = 0
        for ib32 in range(8):
            aux8 = blk[2 + 8 * ib32 : 6 + 8 * ib32]
            aux32 = struct.unpack("<I", bytes(blk[6 + 8 * ib32 : 10 + 8 * ib32]))[0]
            ls = 2 * (aux32 >> 28) + 1
            sumi = sum(_signed(grid[aux8[l]], KS[(aux32 >> 7 * l) & 127], q8[32 * ib32 + 8 * l :][:8]) for l in range(4))
            bsum += sumi * ls
        sumf = F32(sumf + F32(d * F32(bsum)))
    return F32(F32(0.125) * sumf)


def py_dot_iq3_s(w, y):
    grid = _grid(gguf_quants.IQ3_S)
    sumf = F32(0)
    for i, (yd, q8, _) in enumerate(y):
        blk = w[110 * i : 110 * i + 110]
        d = F32(f16(blk, 0) * yd)
        qs, qh, signs, scales = blk[2:66], blk[66:74], blk[74:106], blk[106:110]
        bsum = 0
        for ib32 in range(0, 8, 2):
            for half, ls in ((0, 2 * (scales[ib32 // 2] & 0xF) + 1), (1, 2 * (scales[ib32 // 2] >> 4) + 1)):
                sumi = 0
                for l in range(4):
                    k = ib32 + half
                    g1 = grid[qs[8 * k + 2 * l] | ((qh[k] << (8 - 2 * l)) & 256)]
                    g2 = grid[qs[8 * k + 2 * l + 1] | ((qh[k] << (7 - 2 * l)) & 256)]
                    yy = q8[32 * k + 8 * l :]
                    sumi += _signed(g1, signs[4 * k + l], yy[:4]) + _signed(g2, signs[4 * k + l], yy[4:8], 4)
                bsum += sumi * ls
        sumf = F32(sumf + F32(d * F32(bsum)))
    return sumf


def py_dot_iq1_s(w, y):
    grid = _grid(gguf_quants.IQ1_S)
    sumf = F32(0)
    for i, (yd, q8, bsums) in enumerate(y):
        blk = w[50 * i : 50 * i + 50]
        qs, qh = blk[2:34], struct.unpack("<8H", bytes(blk[34:50]))
        sumi = sumi1 = 0
        for ib in range(8):
            ls = 2 * ((qh[ib] >> 12) & 7) + 1
            delta = -1 if qh[ib] & 0x8000 else 1
            lsum = 0
            for l in range(4):
                g = grid[qs[4 * ib + l] | (((qh[ib] >> 3 * l) & 7) << 8)]
                lsum += sum(a * b for a, b in zip(g, q8[32 * ib + 8 * l :][:8]))
            sumi += ls * lsum
            sumi1 += ls * delta * (bsums[2 * ib] + bsums[2 * ib + 1])
        sumf = F32(sumf + F32(F32(f16(blk, 0) * yd) * F32(F32(sumi) + F32(F32(0.125) * F32(sumi1)))))
    return sumf


def py_dot_iq1_m(w, y):
    grid = _grid(gguf_quants.IQ1_S)
    sumf = F32(0)
    for i, (yd, q8, _) in enumerate(y):
        blk = w[56 * i : 56 * i + 56]
        qs, qh, sc = blk[0:32], blk[32:48], struct.unpack("<4H", bytes(blk[48:56]))
        u16 = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000)
        scale = F32(np.frombuffer(struct.pack("<H", u16), np.float16)[0])
        sumi1 = sumi2 = 0
        for ib in range(8):
            h = qh[2 * ib : 2 * ib + 2]
            delta = [-1 if h[0] & 0x08 else 1, -1 if h[0] & 0x80 else 1, -1 if h[1] & 0x08 else 1, -1 if h[1] & 0x80 else 1]
            sum1, sum2 = [0, 0], [0, 0]
            for l in range(4):
                g = grid[qs[4 * ib + l] | ((h[l // 2] << (8 - 4 * (l % 2))) & 0x700)]
                yy = q8[32 * ib + 8 * l :][:8]
                sum1[l // 2] += sum(a * b for a, b in zip(g, yy))
                sum2[l // 2] += sum(yy) * delta[l]
            ls1 = 2 * ((sc[ib // 2] >> (6 * (ib % 2))) & 7) + 1
            ls2 = 2 * ((sc[ib // 2] >> (6 * (ib % 2) + 3)) & 7) + 1
            sumi1 += sum1[0] * ls1 + sum1[1] * ls2
            sumi2 += sum2[0] * ls1 + sum2[1] * ls2
        sumf = F32(sumf + F32(F32(scale * yd) * F32(F32(sumi1) + F32(F32(0.125) * F32(sumi2)))))
    return sumf


def py_dot_tq1_0(w, y):
    pow3 = [1, 3, 9, 27, 81, 243]
    sumf = F32(0)
    for i, (yd, q8, _) in enumerate(y):
        blk = w[54 * i : 54 * i + 54]
        qs, qh = blk[0:48], blk[48:52]
        digit = lambda b, n: (((b * pow3[n]) & 255) * 3) >> 8  # noqa: E731
        total = 0
        for l in range(5):
            total += sum((digit(qs[m], l) - 1) * q8[l * 32 + m] for m in range(32))
        for l in range(5):
            total += sum((digit(qs[32 + m], l) - 1) * q8[160 + l * 16 + m] for m in range(16))
        for l in range(4):
            total += sum((digit(qh[j], l) - 1) * q8[240 + l * 4 + j] for j in range(4))
        sumf = F32(sumf + F32(F32(total) * F32(f16(blk, 52) * yd)))
    return sumf


@pytest.mark.parametrize(
    "qtype, dot",
    [(QT.IQ2_XXS, py_dot_iq2_xxs), (QT.IQ3_S, py_dot_iq3_s), (QT.IQ1_S, py_dot_iq1_s), (QT.IQ1_M, py_dot_iq1_m),
     (QT.TQ1_0, py_dot_tq1_0)],
    ids=lambda v: v.name if isinstance(v, QT) else "",
)  # fmt: skip
def test_act_quant_bit_exact_vs_python_transcription(qtype, dot):
    rng = np.random.default_rng([int(qtype), 15])
    assert_act_quant_equals_transcription(random_rows(qtype, 3, 512, rng), qtype, rng, py_quantize_q8_k, dot)
