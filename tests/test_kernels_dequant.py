"""kernels.base.blocks and kernels.plain.dequant: layouts, and dequantization bit-identical to gguf 0.19.0.

Oracles: ``gguf.quants.dequantize`` (numpy, itself tested bit-exact against libggml upstream) for
every type and scale regime, and hand-built blocks whose values are written out below.
"""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT
from gguf import quants as gguf_quants

import kernels
from kernels.base.blocks import layout, row_bytes, weight_layout
from kernels.base.floats import E8M0_HALF
from kernels.testing import random_rows

TYPES = kernels.WEIGHT_TYPES
IDS = [t.name for t in TYPES]


def gguf_dequantize(raw, qtype):
    with np.errstate(all="ignore"):  # "raw" scales overflow on purpose
        return gguf_quants.dequantize(raw, qtype)


def assert_same_bits(got, ref):
    """float32 arrays equal bit for bit, except that any NaN matches any NaN."""
    assert got.dtype == np.float32 and ref.dtype == np.float32
    assert got.shape == ref.shape
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    bad = (got.view(np.uint32) != ref.view(np.uint32)) & ~nan
    assert not bad.any(), f"{bad.sum()} values differ, first at {np.argwhere(bad)[0]}: {got[bad][:4]} vs {ref[bad][:4]}"


# --------------------------------------------------------------------------------------------
# Layouts


def test_layout_sizes_come_from_gguf():
    for qtype in TYPES + (QT.Q8_K,):
        cls = layout(qtype)
        assert (cls.block_size, cls.type_size) == GGML_QUANT_SIZES[qtype]
        assert sum(f.nbytes for f in cls.fields) == cls.type_size
    # ggml's block_q8_1 is 2 x f16 + 32 x int8; gguf 0.19.0's table still says 40 bytes.
    assert layout(QT.Q8_1).type_size == 36 and GGML_QUANT_SIZES[QT.Q8_1] == (32, 40)


def test_vec_dot_types_follow_ggml_cpu_type_traits():
    """ggml-cpu.c::type_traits_cpu (vec_dot_type per weight type; docs/kernels.md)."""
    expected = {
        QT.F32: QT.F32, QT.F16: QT.F16, QT.BF16: QT.BF16,
        QT.Q8_0: QT.Q8_0, QT.Q4_0: QT.Q8_0, QT.Q5_0: QT.Q8_0, QT.MXFP4: QT.Q8_0, QT.IQ4_NL: QT.Q8_0,
        QT.Q4_1: QT.Q8_1, QT.Q5_1: QT.Q8_1,
        QT.Q2_K: QT.Q8_K, QT.Q3_K: QT.Q8_K, QT.Q4_K: QT.Q8_K, QT.Q5_K: QT.Q8_K, QT.Q6_K: QT.Q8_K,
        QT.IQ4_XS: QT.Q8_K,
        QT.IQ1_S: QT.Q8_K, QT.IQ1_M: QT.Q8_K, QT.IQ2_XXS: QT.Q8_K, QT.IQ2_XS: QT.Q8_K, QT.IQ2_S: QT.Q8_K,
        QT.IQ3_XXS: QT.Q8_K, QT.IQ3_S: QT.Q8_K, QT.TQ1_0: QT.Q8_K, QT.TQ2_0: QT.Q8_K,
    }  # fmt: skip
    assert {q: layout(q).vec_dot_type for q in TYPES} == expected


def test_row_bytes():
    assert row_bytes(QT.Q4_K, 2048) == 8 * 144
    assert row_bytes(QT.MXFP4, 64) == 2 * 17
    assert row_bytes(QT.BF16, 3) == 6
    with pytest.raises(ValueError, match="Q4_K row must hold a multiple of 256"):
        row_bytes(QT.Q4_K, 100)


@pytest.mark.parametrize("qtype", [QT.NVFP4, QT.Q1_0, QT.I32, QT.F64], ids=lambda q: q.name)
def test_unsupported_types_are_named(qtype):
    with pytest.raises(ValueError, match=f"unsupported ggml type {qtype.name}"):
        layout(qtype)
    with pytest.raises(ValueError, match=qtype.name):
        kernels.dequantize(np.zeros((1, 64), np.uint8), qtype)


def test_activation_formats_are_not_weights():
    with pytest.raises(ValueError, match="Q8_K is an activation-only format"):
        weight_layout(QT.Q8_K)
    with pytest.raises(ValueError, match="Q8_1"):
        kernels.dequantize(np.zeros((1, 36), np.uint8), QT.Q8_1)


# --------------------------------------------------------------------------------------------
# Bit-exactness against gguf


@pytest.mark.parametrize("scales", ["normal", "extreme"])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_dequantize_matches_gguf_bit_for_bit(qtype, scales):
    rng = np.random.default_rng([int(qtype), len(scales)])
    raw = random_rows(qtype, 6, 512, rng, scales=scales)
    got = kernels.dequantize(raw, qtype)
    assert got.shape == (6, 512)
    assert np.isfinite(got).all()
    assert_same_bits(got, gguf_dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_dequantize_fully_random_bytes(qtype):
    """Random bytes include inf/NaN scales; wherever gguf is finite we must agree bit for bit."""
    rng = np.random.default_rng(int(qtype) + 100)
    raw = random_rows(qtype, 4, 1024, rng, scales="raw")
    if qtype == QT.F32:
        raw = rng.integers(0, 2**32, (4, 1024), dtype=np.uint64).astype(np.uint32).view(np.float32)
    elif qtype == QT.F16:
        raw = rng.integers(0, 2**16, (4, 1024)).astype(np.uint16).view(np.float16)
    ref = gguf_dequantize(raw, qtype)
    assert np.isfinite(ref).mean() > 0.3  # the comparison is not only about NaNs
    assert_same_bits(kernels.dequantize(raw, qtype), ref)


def test_f16_every_bit_pattern():
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    ref = bits.view(np.float16).astype(np.float32)
    assert_same_bits(kernels.dequantize(bits.view(np.uint8)[None], QT.F16)[0], ref)


def test_e8m0_half_table_matches_gguf():
    e = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(E8M0_HALF.view(np.uint32), gguf_quants.MXFP4.e8m0_to_fp32_half(e).view(np.uint32))
    assert E8M0_HALF[0] == np.float32(2.0**-128) and E8M0_HALF[1] == np.float32(2.0**-127)  # denormals
    assert E8M0_HALF[128] == 1.0 and E8M0_HALF[255] == np.float32(2.0**127)


# --------------------------------------------------------------------------------------------
# Input forms and errors


def test_shapes_and_input_forms():
    rng = np.random.default_rng(1)
    raw3 = random_rows(QT.Q6_K, 6, 512, rng).reshape(2, 3, -1)  # an expert tensor (X, rows, bytes)
    out = kernels.dequantize(raw3, QT.Q6_K, n_cols=512)
    assert out.shape == (2, 3, 512) and out.dtype == np.float32
    assert_same_bits(out[1], kernels.dequantize(raw3[1], QT.Q6_K))

    x32 = rng.standard_normal((3, 8)).astype(np.float32)
    assert_same_bits(kernels.dequantize(x32, QT.F32), x32)
    assert_same_bits(kernels.dequantize(x32.view(np.uint8), QT.F32), x32)
    x16 = x32.astype(np.float16)
    assert_same_bits(kernels.dequantize(x16, QT.F16), x16.astype(np.float32))
    assert_same_bits(kernels.dequantize(x16.view(np.uint8), QT.F16), x16.astype(np.float32))
    bf = (x32.view(np.uint32) >> 16).astype(np.uint16)
    want = (bf.astype(np.uint32) << 16).view(np.float32)
    assert_same_bits(kernels.dequantize(bf.view(np.uint8), QT.BF16), want)
    assert_same_bits(kernels.dequantize(bf, QT.BF16), want)

    strided = random_rows(QT.Q8_0, 4, 64, rng)[::2]  # not C-contiguous: copied, same values
    assert_same_bits(kernels.dequantize(strided, QT.Q8_0), gguf_dequantize(np.ascontiguousarray(strided), QT.Q8_0))


def test_input_errors():
    q8 = np.zeros((2, 34), np.uint8)
    with pytest.raises(ValueError, match="Q8_0 data holds 32 values per row, but n_cols=64"):
        kernels.dequantize(q8, QT.Q8_0, n_cols=64)
    with pytest.raises(ValueError, match="must be uint8, got float32"):
        kernels.dequantize(np.zeros((2, 34), np.float32), QT.Q8_0)
    with pytest.raises(ValueError, match="not a multiple of the 34-byte block"):
        kernels.dequantize(np.zeros((2, 35), np.uint8), QT.Q8_0)
    with pytest.raises(ValueError, match="must be uint8 or float32, got float64"):
        kernels.dequantize(np.zeros((2, 4)), QT.F32)


# --------------------------------------------------------------------------------------------
# Known-answer blocks (values worked out by hand from ggml-common.h)


def f16_bytes(v):
    return list(np.array([v], np.float16).view(np.uint8))


def test_known_q8_0():
    block1 = f16_bytes(0.5) + [(q + 256) % 256 for q in [-128, -127, -1, 0, 1, 2, 3, 127]] + [0] * 24
    block2 = f16_bytes(-(2.0**-24)) + [1, 256 - 3, 127] + [0] * 29  # d = the negative f16 subnormal
    raw = np.array([block1 + block2], np.uint8)
    want = [-64.0, -63.5, -0.5, 0.0, 0.5, 1.0, 1.5, 63.5] + [0.0] * 24 + [-(2.0**-24), 3 * 2.0**-24, -127 * 2.0**-24] + [-0.0] * 29
    assert_same_bits(kernels.dequantize(raw, QT.Q8_0)[0], np.array(want, np.float32))


def test_known_q4_k():
    # d = 0.5, dmin = 0.25; sub-block scales sc = [1, 2, 3, 4, 17, 33, 48, 63] and
    # mins m = [0, 1, 2, 3, 16, 5, 40, 63], packed by get_scale_min_k4's rules:
    #   bytes 0..3  = sc[j] | (sc[j+4] >> 4) << 6;  bytes 4..7 = m[j] | (m[j+4] >> 4) << 6
    #   bytes 8..11 = (sc[j+4] & 15) | (m[j+4] & 15) << 4
    scales = [65, 130, 195, 196, 64, 1, 130, 195, 1, 81, 128, 255]
    # qs: chunk c (32 bytes) holds sub-block 2c in its low nibbles and 2c+1 in its high nibbles
    qs = [0x21] * 32 + [0x43] * 32 + [0xF0] * 32 + [0x0F] * 32
    qs[0] = 0x2F  # value 0 -> q = 15
    qs[31] = 0x71  # value 31 -> q = 1 (unchanged), value 63 -> q = 7
    raw = np.array([f16_bytes(0.5) + f16_bytes(0.25) + scales + qs], np.uint8)
    # value = d*sc*q - dmin*m per sub-block:
    #   s0: .5*1*1 - 0 = .5     s1: .5*2*2 - .25 = 1.75   s2: .5*3*3 - .5 = 4    s3: .5*4*4 - .75 = 7.25
    #   s4: 0 - .25*16 = -4     s5: .5*33*15 - 1.25 = 246.25   s6: .5*48*15 - 10 = 350   s7: 0 - 15.75
    want = np.repeat(np.array([0.5, 1.75, 4.0, 7.25, -4.0, 246.25, 350.0, -15.75], np.float32), 32)
    want[0] = 7.5  # .5*1*15
    want[63] = 6.75  # .5*2*7 - .25
    assert_same_bits(kernels.dequantize(raw, QT.Q4_K)[0], want)


def test_known_q6_k():
    # d = 2 (stored last), int8 scales[g] = g - 8, every ql byte 0x21 (low nibble 1, high 2),
    # every qh byte 0b11_10_01_00 (2-bit fields 0, 1, 2, 3 from the bottom).
    # Quarter k of each half: k=0 low(ql[l]) | 0<<4 = 1; k=1 low(ql[l+32]) | 1<<4 = 17;
    # k=2 high(ql[l]) | 2<<4 = 34; k=3 high(ql[l+32]) | 3<<4 = 50; minus 32:
    q_by_quarter = [-31, -15, 2, 18]
    raw = np.array([[0x21] * 128 + [0xE4] * 64 + [(g - 8) % 256 for g in range(16)] + f16_bytes(2.0)], np.uint8)
    want = np.array([2.0 * (i // 16 - 8) * q_by_quarter[(i % 128) // 32] for i in range(256)], np.float32)
    assert_same_bits(kernels.dequantize(raw, QT.Q6_K)[0], want)


def test_known_mxfp4():
    K = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    block1 = [128] + [j | (15 - j) << 4 for j in range(16)]  # scale 2**0: values K[j], then K[15-j]
    block2 = [0] + [0x77] * 16  # scale 2**-128 (denormal): code 7 = 12
    block3 = [1] + [0x11] * 16  # scale 2**-127 (denormal): code 1 = 1
    block4 = [254] + [0x93] * 16  # scale 2**126: code 3 = 3 (low), code 9 = -1 (high)
    raw = np.array([block1 + block2 + block3 + block4], np.uint8)
    want = (
        K + K[::-1]
        + [12 * 2.0**-128] * 32
        + [2.0**-127] * 32
        + [3 * 2.0**126] * 16 + [-(2.0**126)] * 16
    )  # fmt: skip
    assert_same_bits(kernels.dequantize(raw, QT.MXFP4)[0], np.array(want, np.float32))


def test_q8_0_rows_in_numpy_are_the_compiled_decoder_bit_for_bit():
    """dequantize's Q8_0 rows (numpy: nothing to compile for a token's embedding) against the compiled decoder it
    stands in for, every bit — NaN payloads included (f16_at's canonical NaN, not numpy's float16 payloads) — on
    random bytes (NaN, inf and subnormal scales among them) and realistic rows."""
    from kernels.plain.dequant import _dequantize_rows_serial

    rng = np.random.default_rng(77)
    raw = np.concatenate([random_rows(QT.Q8_0, 300, 256, rng, "raw"), random_rows(QT.Q8_0, 20, 256, rng)])
    raw = raw.view(np.uint8).reshape(raw.shape[0], -1)
    raw[0, :2] = (0x01, 0x7E)  # a NaN scale with a payload numpy's float16 would keep
    compiled = np.empty((raw.shape[0], 256), np.float32)
    _dequantize_rows_serial(QT.Q8_0)(raw, compiled)
    got = kernels.dequantize(raw, QT.Q8_0)
    assert np.isnan(got).any() and np.array_equal(got.view(np.uint32), compiled.view(np.uint32))
    assert kernels.dequantize(raw[:0], QT.Q8_0).shape == (0, 256)  # no rows: no values, no error
