"""kernels.ggml.actquant / matmul(act_quant=True): llama.cpp's activation quantization and integer dots.

Three independent checks:

* the quantizers against blocks worked out by hand (round half to even, ties, all-zero blocks,
  Q8_K's signed max and negative d);
* every weight type against a float64 evaluation of "dequantized weights · dequantized quantized
  activations" (the integer dot is exact, so only float32 combination noise remains);
* Q8_0, Q4_K, Q6_K and MXFP4 bit for bit against a slow plain-Python transcription of the generic
  C code (``ggml-cpu/quants.c``), written from the C source independently of kernels/.
"""

import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

import kernels
from kernels import activation_values, quantize_q8_0, quantize_q8_1, quantize_q8_K
from kernels.testing import random_rows

TYPES = kernels.WEIGHT_TYPES
IDS = [t.name for t in TYPES]
F32 = np.float32


# --------------------------------------------------------------------------------------------
# Quantizers vs hand-computed blocks


def test_q8_0_hand_blocks():
    x = np.zeros(96, F32)
    # block 0: amax = 127 -> d = 1, id = 127/127 = 1, q = round_half_even(x)
    x[:12] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, 126.5, -127.0, 0.0, -0.0, 7.0]
    # block 1: amax = 1 -> d = fp16(1/127), id = 127: 0.5*127 = 63.5 -> 64 (even), 31.75 -> 32, 12.7 -> 13
    x[32:36] = [-1.0, 0.5, 0.25, 0.1]
    # block 2: all zero -> d = 0, q = 0
    blocks = quantize_q8_0(x)
    assert blocks.d.dtype == np.float16 and blocks.qs.dtype == np.int8 and blocks.qs.shape == (3, 32)
    np.testing.assert_array_equal(blocks.d, np.array([1.0, 1 / 127, 0.0], np.float16))
    np.testing.assert_array_equal(blocks.qs[0, :12], [0, 2, 2, 0, -2, -2, 3, 126, -127, 0, 0, 7])
    np.testing.assert_array_equal(blocks.qs[1, :4], [-127, 64, 32, 13])
    assert not blocks.qs[0, 12:].any() and not blocks.qs[1, 4:].any() and not blocks.qs[2].any()


def test_q8_0_random_vs_python():
    """x86 multiplies by id = 127/amax (not 1/d) and rounds half to even: compare with a transcription."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(4096) * np.exp(rng.uniform(-8, 8, 4096))).astype(F32)
    blocks = quantize_q8_0(x)
    for i, (d, qs) in enumerate(py_quantize_q8_0_x86(x)):
        assert blocks.d[i] == d
        np.testing.assert_array_equal(blocks.qs[i], qs)


def test_q8_1_sum_field():
    x = np.zeros(64, F32)
    x[:12] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, 126.5, -127.0, 0.0, -0.0, 7.0]  # sum(q) = 9, d = 1
    x[32:36] = [-1.0, 0.5, 0.25, 0.1]  # sum(q) = -127 + 64 + 32 + 13 = -18, d = 1/127 unrounded
    blocks = quantize_q8_1(x)
    np.testing.assert_array_equal(blocks.qs, quantize_q8_0(x).qs)
    np.testing.assert_array_equal(blocks.s, np.array([9.0, (F32(1.0) / F32(127.0)) * F32(-18.0)], np.float16))


def test_q8_k_hand_blocks():
    x = np.zeros(4 * 256, F32)
    a = x[:256]  # block 0: the first largest |x| is -127 -> iscale = -127/-127 = 1, d = 1
    a[[0, 1, 2, 3, 4, 5, 9, 20]] = [0.5, 1.5, 2.5, -3.5, 126.5, -127.0, 127.0, 4.25]
    b = x[256:512]  # block 1: the first largest |x| is +127 -> iscale = -1, d = -1
    b[:5] = [127.0, -127.0, 0.5, 2.5, -1.5]
    c = x[512:768]  # block 2: max = +2 -> iscale = -63.5: 1.0 -> -63.5 -> -64 (even), -0.25 -> 15.875 -> 16
    c[:3] = [2.0, 1.0, -0.25]
    blocks = quantize_q8_K(x)  # block 3 is all zero
    assert blocks.d.dtype == np.float32 and blocks.qs.dtype == np.int8 and blocks.bsums.dtype == np.int16
    np.testing.assert_array_equal(blocks.d, [1.0, -1.0, F32(1.0) / F32(-63.5), 0.0])
    np.testing.assert_array_equal(blocks.qs[0, [0, 1, 2, 3, 4, 5, 9, 20]], [0, 2, 2, -4, 126, -127, 127, 4])
    np.testing.assert_array_equal(blocks.qs[1, :5], [-127, 127, 0, -2, 2])
    np.testing.assert_array_equal(blocks.qs[2, :3], [-127, -64, 16])
    np.testing.assert_array_equal(blocks.bsums[0, :3], [0 + 2 + 2 - 4 + 126 - 127 + 127, 4, 0])
    np.testing.assert_array_equal(blocks.bsums[1:3, 0], [-127 + 127 + 0 - 2 + 2, -127 - 64 + 16])
    assert not blocks.qs[3].any() and not blocks.bsums[3].any()
    assert blocks.qs[:3].sum() == blocks.bsums[:3].sum()


def py_quantize_q8_k(x):
    """``quantize_row_q8_K_ref`` in plain Python (nearest_int via the float32 bit trick)."""
    out = []
    for i in range(len(x) // 256):
        v = [F32(t) for t in x[256 * i : 256 * i + 256]]
        amax, vmax = F32(0), F32(0)
        for t in v:
            if abs(t) > amax:
                amax, vmax = abs(t), t
        if amax == 0:
            out.append((F32(0), [0] * 256, [0] * 16))
            continue
        iscale = F32(F32(-127.0) / vmax)
        qs = []
        for t in v:
            bits = struct.unpack("<i", struct.pack("<f", F32(F32(iscale * t) + F32(12582912.0))))[0]
            qs.append(min(127, (bits & 0x007FFFFF) - 0x00400000))
        out.append((F32(F32(1.0) / iscale), qs, [sum(qs[16 * g : 16 * g + 16]) for g in range(16)]))
    return out


def test_q8_k_random_vs_python():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(1024) * np.exp(rng.uniform(-5, 5, 1024))).astype(F32)
    blocks = quantize_q8_K(x)
    for i, (d, qs, bsums) in enumerate(py_quantize_q8_k(x)):
        assert blocks.d[i].view(np.uint32) == F32(d).view(np.uint32)
        np.testing.assert_array_equal(blocks.qs[i], qs)
        np.testing.assert_array_equal(blocks.bsums[i], bsums)


def test_f16_and_bf16_activation_rounding():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 512)) * np.exp(rng.uniform(-12, 12, (2, 512)))).astype(F32)
    with np.errstate(over="ignore"):  # |x| >= 65520 rounds to inf, in numpy as in ggml
        f16 = x.astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(activation_values(x, QT.F16), f16)
    bf16 = (gguf_quants.BF16.quantize_blocks(x.reshape(-1, 1)).view(np.uint16).astype(np.uint32) << 16).view(F32)
    np.testing.assert_array_equal(activation_values(x, QT.BF16), bf16.reshape(x.shape).astype(np.float64))
    np.testing.assert_array_equal(activation_values(x, QT.F32), x.astype(np.float64))


def test_quantizer_input_errors():
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize_q8_K(np.zeros(128, F32))
    with pytest.raises(ValueError, match="must be float32"):
        quantize_q8_0(np.zeros(32))


# --------------------------------------------------------------------------------------------
# act_quant matmul vs a float64 evaluation of the same quantized operands


def act_quant_reference(w, qtype, x):
    """Σ_k W[n,k]·x̂[t,k] in float64 with x̂ the quantized activations, and Σ|W·x̂|.

    For Q4_1/Q5_1, llama.cpp adds the weight min as ``m * s`` with the f16-rounded ``s`` of the Q8_1
    block (not ``m * d * Σq``); the reference does the same.
    """
    W = kernels.dequantize(w, qtype).astype(np.float64)
    xa = activation_values(x, qtype)
    ref, mag = xa @ W.T, np.abs(xa) @ np.abs(W).T
    if qtype in (QT.Q4_1, QT.Q5_1):
        bs = 20 if qtype == QT.Q4_1 else 24
        blocks = w.reshape(w.shape[0], -1, bs)
        m = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)  # (N, nb)
        q8 = quantize_q8_1(x)
        exact_min_term = q8.d.astype(np.float64) * q8.qs.sum(axis=-1)  # (T, nb)
        ref += (q8.s.astype(np.float64) - exact_min_term) @ m.T
    return ref, mag


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_act_quant_matches_float64_of_quantized_operands(qtype):
    rng = np.random.default_rng([int(qtype), 11])
    w = random_rows(qtype, 29, 1024, rng)
    x = rng.standard_normal((9, 1024)).astype(F32)
    x[2] *= F32(1e-3)
    x[3, :256] = 0.0  # an all-zero activation block
    y = kernels.matmul(w, qtype, x, act_quant=True)
    assert y.shape == (9, 29) and y.dtype == np.float32
    ref, mag = act_quant_reference(w, qtype, x)
    err = np.abs(y - ref) / mag
    assert err.max() <= 1e-6, f"worst relative error {err.max():.3g}"


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_act_quant_batch_rows_equal_single_rows(qtype):
    rng = np.random.default_rng([int(qtype), 12])
    w = random_rows(qtype, 13, 512, rng)
    x = rng.standard_normal((7, 512)).astype(F32)
    batch = kernels.matmul(w, qtype, x, act_quant=True)
    singles = np.stack([kernels.matmul(w, qtype, x[t], act_quant=True) for t in range(7)])
    np.testing.assert_array_equal(batch.view(np.uint32), singles.view(np.uint32))


@pytest.mark.parametrize("qtype", [QT.F16, QT.BF16], ids=lambda q: q.name)
def test_f16_bf16_act_quant_is_plain_matmul_of_rounded_activations(qtype):
    """F16×F16 and BF16×BF16 products are exact in float32, and ggml_vec_dot_f16/bf16 sum them in
    double in order — which is exactly the plain mode applied to the rounded activations."""
    rng = np.random.default_rng(13)
    w = random_rows(qtype, 11, 256, rng)
    x = rng.standard_normal((3, 256)).astype(F32)
    rounded = activation_values(x, qtype).astype(F32)
    np.testing.assert_array_equal(kernels.matmul(w, qtype, x, act_quant=True), kernels.matmul(w, qtype, rounded))


# --------------------------------------------------------------------------------------------
# Bit-exact against a plain-Python transcription of the generic C dot products


def f16(b, o):
    return F32(np.frombuffer(bytes(b[o : o + 2]), np.float16)[0])


def py_quantize_q8_0_x86(x):
    """arch/x86/quants.c::quantize_row_q8_0: d = fp16(amax/127), q = rint(x * (127/amax))."""
    out = []
    for i in range(len(x) // 32):
        v = [F32(t) for t in x[32 * i : 32 * i + 32]]
        amax = F32(0)
        for t in v:
            amax = max(amax, abs(t))
        inv = F32(F32(127.0) / amax) if amax != 0 else F32(0)
        out.append((F32(np.float16(F32(amax / F32(127.0)))), [int(np.rint(F32(t * inv))) for t in v]))
    return out


def py_dot_q8_0_q8_0(w, y):
    sumf = F32(0)
    for ib, (dy, qy) in enumerate(y):
        qx = np.frombuffer(bytes(w[34 * ib + 2 : 34 * ib + 34]), np.int8)
        sumi = sum(int(a) * b for a, b in zip(qx, qy))
        sumf = F32(sumf + F32(F32(sumi) * F32(f16(w, 34 * ib) * dy)))  # sumi*(dx*dy)
    return sumf


def py_dot_mxfp4_q8_0(w, y):
    kvalues = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    sumf = F32(0)
    for ib, (dy, qy) in enumerate(y):
        e = int(w[17 * ib])
        bits = (0x00200000 << e) if e < 2 else ((e - 1) << 23)  # ggml_e8m0_to_fp32_half
        d = F32(dy * struct.unpack("<f", struct.pack("<I", bits))[0])
        qs = w[17 * ib + 1 : 17 * ib + 17]
        sumi1 = sum(qy[j] * kvalues[qs[j] & 0xF] for j in range(16))
        sumi2 = sum(qy[j + 16] * kvalues[qs[j] >> 4] for j in range(16))
        sumf = F32(sumf + F32(d * F32(sumi1 + sumi2)))
    return sumf


def py_dot_q4_k_q8_k(w, y):
    """ggml_vec_dot_q4_K_q8_K_generic, line by line (utmp/kmask scale unpacking, aux8/aux16/aux32)."""
    kmask1, kmask2, kmask3 = 0x3F3F3F3F, 0x0F0F0F0F, 0x03030303
    sums = [F32(0)] * 8
    sumf = F32(0)
    for i, (yd, q8, bsums) in enumerate(y):
        blk = w[144 * i : 144 * i + 144]
        q4 = blk[16:]
        aux8 = []
        for j in range(4):
            aux8 += [q4[32 * j + l] & 0xF for l in range(32)]
            aux8 += [q4[32 * j + l] >> 4 for l in range(32)]
        utmp = list(struct.unpack("<3I", bytes(blk[4:16]))) + [0]
        utmp[3] = ((utmp[2] >> 4) & kmask2) | (((utmp[1] >> 6) & kmask3) << 4)
        uaux = utmp[1] & kmask1
        utmp[1] = (utmp[2] & kmask2) | (((utmp[0] >> 6) & kmask3) << 4)
        utmp[2] = uaux
        utmp[0] &= kmask1
        packed = struct.pack("<4I", *utmp)
        scales, mins = packed[0:8], packed[8:16]
        sumi = sum(bsums[j] * mins[j // 2] for j in range(16))
        aux32 = [0] * 8
        a = 0
        for j in range(8):
            for _ in range(4):
                for l in range(8):
                    aux32[l] += scales[j] * (q8[a + l] * aux8[a + l])
                a += 8
        d = F32(f16(blk, 0) * yd)
        for l in range(8):
            sums[l] = F32(sums[l] + F32(d * F32(aux32[l])))
        dmin = F32(f16(blk, 2) * yd)
        sumf = F32(sumf - F32(dmin * F32(sumi)))
    for l in range(8):
        sumf = F32(sumf + sums[l])
    return sumf


def py_dot_q6_k_q8_k(w, y):
    """ggml_vec_dot_q6_K_q8_K_generic, line by line."""
    sums = [F32(0)] * 8
    for i, (yd, q8, _) in enumerate(y):
        blk = w[210 * i : 210 * i + 210]
        ql, qh, sc = blk[0:128], blk[128:192], np.frombuffer(bytes(blk[192:208]), np.int8)
        aux8 = [0] * 256
        for n in range(2):
            for l in range(32):
                q, h = ql[64 * n :], qh[32 * n :]
                aux8[128 * n + l + 0] = ((q[l] & 0xF) | (((h[l] >> 0) & 3) << 4)) - 32
                aux8[128 * n + l + 32] = ((q[l + 32] & 0xF) | (((h[l] >> 2) & 3) << 4)) - 32
                aux8[128 * n + l + 64] = ((q[l] >> 4) | (((h[l] >> 4) & 3) << 4)) - 32
                aux8[128 * n + l + 96] = ((q[l + 32] >> 4) | (((h[l] >> 6) & 3) << 4)) - 32
        aux32 = [0] * 8
        a = 0
        for j in range(16):
            for _ in range(2):
                for l in range(8):
                    aux32[l] += int(sc[j]) * (q8[a + l] * aux8[a + l])
                a += 8
        d = F32(f16(blk, 208) * yd)
        for l in range(8):
            sums[l] = F32(sums[l] + F32(d * F32(aux32[l])))
    sumf = F32(0)
    for l in range(8):
        sumf = F32(sumf + sums[l])
    return sumf


@pytest.mark.parametrize(
    "qtype, quantize, dot",
    [
        (QT.Q8_0, py_quantize_q8_0_x86, py_dot_q8_0_q8_0),
        (QT.MXFP4, py_quantize_q8_0_x86, py_dot_mxfp4_q8_0),
        (QT.Q4_K, py_quantize_q8_k, py_dot_q4_k_q8_k),
        (QT.Q6_K, py_quantize_q8_k, py_dot_q6_k_q8_k),
    ],
    ids=["Q8_0", "MXFP4", "Q4_K", "Q6_K"],
)
def test_act_quant_bit_exact_vs_python_transcription(qtype, quantize, dot):
    rng = np.random.default_rng([int(qtype), 14])
    w = random_rows(qtype, 3, 512, rng, scales="extreme" if qtype == QT.MXFP4 else "normal")
    if qtype == QT.MXFP4:
        w = w.reshape(3, -1, 17)
        w[:, :, 0] = rng.integers(110, 135, w.shape[:2])  # keep d * 12 * 127 * 32 finite
        w = w.reshape(3, -1)
    assert_act_quant_equals_transcription(w, qtype, rng, quantize, dot)


def assert_act_quant_equals_transcription(w, qtype, rng, quantize, dot):
    """matmul(act_quant=True) of rows ``w`` with two wide-range activation rows equals, bit for bit,
    ``dot(row bytes, quantize(activation row))`` — a Python transcription of the C code."""
    x = (rng.standard_normal((2, 512)) * np.exp(rng.uniform(-3, 3, (2, 512)))).astype(F32)
    y = kernels.matmul(w, qtype, x, act_quant=True)
    for t in range(2):
        blocks = quantize(x[t])
        for n in range(len(w)):
            want = dot([int(b) for b in w[n]], blocks)
            assert y[t, n].view(np.uint32) == F32(want).view(np.uint32), (t, n, y[t, n], want)
