"""Dequantization: raw GGUF rows -> float32, bit-identical to ``gguf.quants.dequantize`` (gguf 0.19.0).

``dequantize(raw, qtype)`` is the public entry point. Underneath, one numba row decoder per type,
``_deq_<type>(src, dst)``, turns the bytes of one row (``src``, uint8) into its values (``dst``,
float32). Each decoder performs the same float32 operations in the same order as gguf's numpy code
(which matches ggml's ``dequantize_row_*``):

* scales are converted from f16 exactly, then ``d * sc`` (and ``dmin * m``) is formed first,
* then multiplied by the integer quant, then the min is subtracted: ``(d*sc)*q - dmin*m``;
  Q4_1/Q5_1 add their min last: ``(d*q) + m``; Q6_K is ``(d*sc)*q``.

No fused multiply-add is formed (``flags.FASTMATH`` is off), so every intermediate is a rounded
float32, as in numpy. Layouts and field names are in :mod:`kernels.base.blocks`; the decoders of the
codebook types (IQ1_S … IQ3_S) and of TQ1_0 / TQ2_0 are in :mod:`kernels.plain.dequant_iq`.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.base.blocks import QT, WEIGHT_TYPES, weight_layout
from .dequant_iq import _deq_iq1_m, _deq_iq1_s, _deq_iq2_s, _deq_iq2_xs, _deq_iq2_xxs, _deq_iq3_s, _deq_iq3_xxs, _deq_tq1_0, _deq_tq2_0
from kernels.base.flags import SERIAL_BELOW, by_type, jit, per_type, read_only
from kernels.base.floats import E8M0_HALF, F16_TABLE, f16_at

#: The 16 values of a 4-bit MXFP4 code: twice the E2M1 values (``kvalues_mxfp4``).
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
#: The non-linear 16-entry table of IQ4_NL and IQ4_XS (``kvalues_iq4nl``).
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)
MXFP4_F32 = MXFP4_VALUES.astype(np.float32)  # the same tables as float32, for the decoders
IQ4NL_F32 = IQ4NL_VALUES.astype(np.float32)

# Type codes for the compiled dispatch below (numba cannot hold enum members; these are their values
# under their names, and nothing else in the package spells a type as a number).
_F32, _F16, _BF16 = int(QT.F32), int(QT.F16), int(QT.BF16)
_Q8_0, _Q4_0, _Q4_1, _Q5_0, _Q5_1 = int(QT.Q8_0), int(QT.Q4_0), int(QT.Q4_1), int(QT.Q5_0), int(QT.Q5_1)
_MXFP4, _IQ4_NL, _IQ4_XS = int(QT.MXFP4), int(QT.IQ4_NL), int(QT.IQ4_XS)
_Q2_K, _Q3_K, _Q4_K, _Q5_K, _Q6_K = int(QT.Q2_K), int(QT.Q3_K), int(QT.Q4_K), int(QT.Q5_K), int(QT.Q6_K)
_IQ1_S, _IQ1_M, _IQ2_XXS, _IQ2_XS, _IQ2_S = int(QT.IQ1_S), int(QT.IQ1_M), int(QT.IQ2_XXS), int(QT.IQ2_XS), int(QT.IQ2_S)
_IQ3_XXS, _IQ3_S, _TQ1_0, _TQ2_0 = int(QT.IQ3_XXS), int(QT.IQ3_S), int(QT.TQ1_0), int(QT.TQ2_0)


# --------------------------------------------------------------------------------------------
# The decoders. Loops run over the bytes of a block with constant shifts and write every value the
# byte holds (as ggml's C does); integers become float32 only at the end.
#
# Speed note (measured, about 2-4x): where an inner loop's length is written as a literal (16, 32),
# LLVM unrolls the short loop completely and then cannot vectorize it, because it cannot prove that
# ``src`` and ``dst`` do not overlap. Most decoders therefore take the block length ``qk`` from the
# array sizes (``_blocks``), which keeps a real loop that LLVM vectorizes with one overlap check.
# Q4_K, Q5_K and Q6_K vectorize as written (and get slower the other way).


@jit()
def _blocks(src, dst, type_size):
    """(number of blocks, values per block) of a row, from the array sizes (see the speed note)."""
    n_blocks = src.size // type_size
    return n_blocks, (dst.size // n_blocks if n_blocks else 0)


# Plain floats


@jit()
def _deq_f32(src, dst):
    x = src.view(np.float32)
    for i in range(dst.size):
        dst[i] = x[i]


@jit()
def _deq_f16(src, dst):
    for i in range(dst.size):
        dst[i] = f16_at(src, 2 * i)


@jit()
def _deq_bf16(src, dst):
    bits = np.empty(dst.size, dtype=np.uint32)  # the float32 bit patterns: u16 << 16
    u16 = src.view(np.uint16)
    for i in range(dst.size):
        bits[i] = np.uint32(u16[i]) << np.uint32(16)
    values = bits.view(np.float32)
    for i in range(dst.size):
        dst[i] = values[i]


# --------------------------------------------------------------------------------------------
# 32-value blocks


@jit()
def _deq_q8_0(src, dst):
    qs = src.view(np.int8)
    n_blocks, qk = _blocks(src, dst, 34)
    for b in range(n_blocks):
        o = 34 * b
        d = f16_at(src, o)
        for j in range(qk):
            dst[32 * b + j] = np.float32(qs[o + 2 + j]) * d


@jit()
def _deq_q4_0(src, dst):
    n_blocks, qk = _blocks(src, dst, 18)
    for b in range(n_blocks):
        o = 18 * b
        d = f16_at(src, o)
        for j in range(qk // 2):
            byte = src[o + 2 + j]
            dst[32 * b + j] = d * (np.float32(byte & 15) - np.float32(8))
            dst[32 * b + j + 16] = d * (np.float32(byte >> 4) - np.float32(8))


@jit()
def _deq_q4_1(src, dst):
    n_blocks, qk = _blocks(src, dst, 20)
    for b in range(n_blocks):
        o = 20 * b
        d = f16_at(src, o)
        m = f16_at(src, o + 2)
        for j in range(qk // 2):
            byte = src[o + 4 + j]
            dst[32 * b + j] = d * np.float32(byte & 15) + m
            dst[32 * b + j + 16] = d * np.float32(byte >> 4) + m


@jit()
def _qh_bit(src, o, j):
    """Bit ``j`` (0..31) of the little-endian uint32 at ``src[o:o+4]`` (Q5_0 / Q5_1 fifth bits)."""
    return (src[o + (j >> 3)] >> (j & 7)) & 1


@jit()
def _deq_q5_0(src, dst):
    n_blocks, qk = _blocks(src, dst, 22)
    for b in range(n_blocks):
        o = 22 * b
        d = f16_at(src, o)
        for j in range(qk // 2):
            byte = src[o + 6 + j]
            lo = (byte & 15) | (_qh_bit(src, o + 2, j) << 4)
            hi = (byte >> 4) | (_qh_bit(src, o + 2, j + 16) << 4)
            dst[32 * b + j] = d * (np.float32(lo) - np.float32(16))
            dst[32 * b + j + 16] = d * (np.float32(hi) - np.float32(16))


@jit()
def _deq_q5_1(src, dst):
    n_blocks, qk = _blocks(src, dst, 24)
    for b in range(n_blocks):
        o = 24 * b
        d = f16_at(src, o)
        m = f16_at(src, o + 2)
        for j in range(qk // 2):
            byte = src[o + 8 + j]
            lo = (byte & 15) | (_qh_bit(src, o + 4, j) << 4)
            hi = (byte >> 4) | (_qh_bit(src, o + 4, j + 16) << 4)
            dst[32 * b + j] = d * np.float32(lo) + m
            dst[32 * b + j + 16] = d * np.float32(hi) + m


@jit()
def _deq_mxfp4(src, dst):
    n_blocks, qk = _blocks(src, dst, 17)
    for b in range(n_blocks):
        o = 17 * b
        d = E8M0_HALF[src[o]]
        for j in range(qk // 2):
            byte = src[o + 1 + j]
            dst[32 * b + j] = d * MXFP4_F32[byte & 15]
            dst[32 * b + j + 16] = d * MXFP4_F32[byte >> 4]


@jit()
def _deq_iq4_nl(src, dst):
    n_blocks, qk = _blocks(src, dst, 18)
    for b in range(n_blocks):
        o = 18 * b
        d = f16_at(src, o)
        for j in range(qk // 2):
            byte = src[o + 2 + j]
            dst[32 * b + j] = d * IQ4NL_F32[byte & 15]
            dst[32 * b + j + 16] = d * IQ4NL_F32[byte >> 4]


# --------------------------------------------------------------------------------------------
# 256-value super-blocks


@jit()
def _deq_q2_k(src, dst):
    n_blocks, qk = _blocks(src, dst, 84)
    for b in range(n_blocks):
        o = 84 * b
        d = f16_at(src, o + 80)
        dmin = f16_at(src, o + 82)
        for n in range(2):  # half n: 32 bytes of qs, read four times with shift 2j
            for j in range(4):
                for h in range(2):  # two groups of 16 per shift, each with its own scale byte
                    g = 8 * n + 2 * j + h
                    sc = src[o + g]
                    dl = d * np.float32(sc & 15)
                    ml = dmin * np.float32(sc >> 4)
                    for l in range(qk // 16):
                        q = (src[o + 16 + 32 * n + 16 * h + l] >> (2 * j)) & 3
                        dst[256 * b + 16 * g + l] = dl * np.float32(q) - ml


@jit()
def _q3_k_scale(src, o, i):
    """Six-bit scale ``i`` (0..15) of the Q3_K block at ``src[o:]``, as stored (0..63, offset 32)."""
    low = (src[o + 96 + (i & 7)] >> (4 * (i >> 3))) & 15
    high = (src[o + 96 + 8 + (i & 3)] >> (2 * (i >> 2))) & 3
    return int(low | (high << 4))


@jit()
def _deq_q3_k(src, dst):
    n_blocks, qk = _blocks(src, dst, 110)
    for b in range(n_blocks):
        o = 110 * b
        d = f16_at(src, o + 108)
        for n in range(2):  # as Q2_K; the high bit of value 128n + 32j + l is bit 4n + j of hmask[l]
            for j in range(4):
                for h in range(2):
                    g = 8 * n + 2 * j + h
                    dl = d * np.float32(_q3_k_scale(src, o, g) - 32)
                    for l in range(qk // 16):
                        ll = 16 * h + l
                        q = np.float32((src[o + 32 + 32 * n + ll] >> (2 * j)) & 3)
                        if not (src[o + ll] >> (4 * n + j)) & 1:
                            q -= np.float32(4)
                        dst[256 * b + 16 * g + l] = dl * q


@jit()
def k_scale_min(src, o, j):
    """``get_scale_min_k4``: (sc, m) of sub-block ``j`` (0..7) from the 12 scale bytes at ``src[o:]``."""
    if j < 4:
        sc = src[o + j] & 63
        m = src[o + j + 4] & 63
    else:
        sc = (src[o + j + 4] & 15) | ((src[o + j - 4] >> 6) << 4)
        m = (src[o + j + 4] >> 4) | ((src[o + j] >> 6) << 4)
    return int(sc), int(m)


@jit()
def _deq_q4_k(src, dst):
    for b in range(dst.size // 256):
        o = 144 * b
        d = f16_at(src, o)
        dmin = f16_at(src, o + 2)
        for c in range(4):  # 32 bytes: low nibbles = sub-block 2c, high nibbles = sub-block 2c+1
            sc, m = k_scale_min(src, o + 4, 2 * c)
            d_lo, m_lo = d * np.float32(sc), dmin * np.float32(m)
            sc, m = k_scale_min(src, o + 4, 2 * c + 1)
            d_hi, m_hi = d * np.float32(sc), dmin * np.float32(m)
            for l in range(32):
                byte = src[o + 16 + 32 * c + l]
                dst[256 * b + 64 * c + l] = d_lo * np.float32(byte & 15) - m_lo
                dst[256 * b + 64 * c + 32 + l] = d_hi * np.float32(byte >> 4) - m_hi


@jit()
def _deq_q5_k(src, dst):
    for b in range(dst.size // 256):
        o = 176 * b
        d = f16_at(src, o)
        dmin = f16_at(src, o + 2)
        for c in range(4):  # as Q4_K; the fifth bits are bits 2c and 2c+1 of qh[l]
            sc, m = k_scale_min(src, o + 4, 2 * c)
            d_lo, m_lo = d * np.float32(sc), dmin * np.float32(m)
            sc, m = k_scale_min(src, o + 4, 2 * c + 1)
            d_hi, m_hi = d * np.float32(sc), dmin * np.float32(m)
            for l in range(32):
                byte = src[o + 48 + 32 * c + l]
                qh = src[o + 16 + l] >> (2 * c)
                dst[256 * b + 64 * c + l] = d_lo * np.float32((byte & 15) | ((qh & 1) << 4)) - m_lo
                dst[256 * b + 64 * c + 32 + l] = d_hi * np.float32((byte >> 4) | ((qh & 2) << 3)) - m_hi


@jit()
def _deq_q6_k(src, dst):
    scales = src.view(np.int8)
    for b in range(dst.size // 256):
        o = 210 * b
        d = f16_at(src, o + 208)
        for n in range(2):  # half n: ql[64n : 64n+64], qh[32n : 32n+32], groups 8n .. 8n+7
            for h in range(2):  # l in 16h .. 16h+15 shares one scale per quarter
                g = 8 * n + h
                ds0 = d * np.float32(scales[o + 192 + g])
                ds1 = d * np.float32(scales[o + 192 + g + 2])
                ds2 = d * np.float32(scales[o + 192 + g + 4])
                ds3 = d * np.float32(scales[o + 192 + g + 6])
                for l in range(16 * h, 16 * h + 16):
                    ql0 = src[o + 64 * n + l]
                    ql1 = src[o + 64 * n + l + 32]
                    qh = src[o + 128 + 32 * n + l]
                    y = 256 * b + 128 * n + l
                    dst[y] = ds0 * (np.float32((ql0 & 15) | ((qh & 3) << 4)) - np.float32(32))
                    dst[y + 32] = ds1 * (np.float32((ql1 & 15) | (((qh >> 2) & 3) << 4)) - np.float32(32))
                    dst[y + 64] = ds2 * (np.float32((ql0 >> 4) | (((qh >> 4) & 3) << 4)) - np.float32(32))
                    dst[y + 96] = ds3 * (np.float32((ql1 >> 4) | (((qh >> 6) & 3) << 4)) - np.float32(32))


@jit()
def _deq_iq4_xs(src, dst):
    n_blocks, qk = _blocks(src, dst, 136)
    for b in range(n_blocks):
        o = 136 * b
        d = f16_at(src, o)
        scales_h = int(src[o + 2]) | (int(src[o + 3]) << 8)
        for s in range(8):
            ls = ((int(src[o + 4 + s // 2]) >> (4 * (s & 1))) & 15) | (((scales_h >> (2 * s)) & 3) << 4)
            dl = d * np.float32(ls - 32)
            for j in range(qk // 16):
                byte = src[o + 8 + 16 * s + j]
                dst[256 * b + 32 * s + j] = dl * IQ4NL_F32[byte & 15]
                dst[256 * b + 32 * s + 16 + j] = dl * IQ4NL_F32[byte >> 4]


# --------------------------------------------------------------------------------------------
# Dispatch and the public entry point


#: The row decoder of each type code.
DECODERS = {_F32: _deq_f32, _F16: _deq_f16, _BF16: _deq_bf16, _Q8_0: _deq_q8_0, _Q4_0: _deq_q4_0, _Q4_1: _deq_q4_1,
            _Q5_0: _deq_q5_0, _Q5_1: _deq_q5_1, _MXFP4: _deq_mxfp4, _IQ4_NL: _deq_iq4_nl, _Q2_K: _deq_q2_k,
            _Q3_K: _deq_q3_k, _Q4_K: _deq_q4_k, _Q5_K: _deq_q5_k, _Q6_K: _deq_q6_k, _IQ4_XS: _deq_iq4_xs,
            # the codebook and ternary types: kernels/plain/dequant_iq.py
            _IQ2_XXS: _deq_iq2_xxs, _IQ2_XS: _deq_iq2_xs, _IQ2_S: _deq_iq2_s, _IQ3_XXS: _deq_iq3_xxs, _IQ3_S: _deq_iq3_s,
            _IQ1_S: _deq_iq1_s, _IQ1_M: _deq_iq1_m, _TQ1_0: _deq_tq1_0, _TQ2_0: _deq_tq2_0}


@by_type(DECODERS)
def dequantize_row(kind, src, dst):
    """Decode one row: ``src`` = its bytes (uint8), ``dst`` = its values (float32), ``kind`` = type code
    (a compile-time constant in compiled code: only that type's decoder is compiled, ``flags.by_type``)."""
    DECODERS[kind](src, dst)


@per_type
def _dequantize_rows(kind):
    @jit(parallel=True, kind=kind)
    def _dequantize_rows(raw, out):
        """``out[r] = decode(raw[r])`` for every row; rows are independent, so ``prange`` over them."""
        for r in prange(raw.shape[0]):
            dequantize_row(kind, raw[r], out[r])

    return _dequantize_rows


def q8_0_rows_numpy(rows, tab, out) -> None:
    """Q8_0 rows [N, n/32·34] uint8 decoded into ``out`` [N, n] float32 in numpy: ``x = float32(qs) * d``, one float32
    product a value as in C (and gguf), ``d`` the half's float by ``tab`` (:data:`kernels.base.floats.F16_TABLE` here,
    ggml's ``F16_TO_F32`` for :mod:`kernels.ggml.rows`: the two differ in NaN payloads only)."""
    blocks = rows.reshape(rows.shape[0], rows.shape[1] // 34, 34)  # [N, n/32, 34]: block_q8_0 = d (f16), qs[32]
    d = tab[blocks[:, :, 0].astype(np.int64) | (blocks[:, :, 1].astype(np.int64) << 8)]  # [N, n/32]
    qs = blocks[:, :, 2:].view(np.int8).astype(np.float32)  # [N, n/32, 32]: exact
    np.multiply(qs, d[:, :, None], out=out.reshape(qs.shape))  # x[i].qs[j]*d: one rounding


@per_type
def _dequantize_rows_serial(kind):
    @jit(kind=kind)
    def _dequantize_rows_serial(raw, out):
        """``_dequantize_rows`` on the calling thread (a few rows, e.g. a token's embedding: ``flags.SERIAL_BELOW``)."""
        for r in range(raw.shape[0]):
            dequantize_row(kind, raw[r], out[r])

    return _dequantize_rows_serial


_NATIVE = {QT.F32: np.float32, QT.F16: np.float16, QT.BF16: np.uint16}  # float types also taken as their values


def as_row_bytes(raw: np.ndarray, qtype, what: str = "raw") -> tuple[np.ndarray, int]:
    """Validate ``raw`` as GGUF data of ``qtype``; return (C-contiguous uint8 bytes view, n_cols).

    Accepted: uint8 rows for every type (last axis = bytes per row); also float32 for F32, float16
    for F16, and uint16 for BF16 (last axis = values). No copy is made when ``raw`` is already
    C-contiguous. The view returned is read-only.
    """
    cls = weight_layout(qtype)
    raw = np.asarray(raw)
    if raw.ndim == 0:
        raise ValueError(f"{what} for {cls.qtype.name} must have at least one axis")
    native = _NATIVE.get(cls.qtype)
    if raw.dtype == np.uint8:
        pass
    elif native is not None and raw.dtype == native:
        raw = np.ascontiguousarray(raw)
        raw = raw.view(np.uint8).reshape(raw.shape[:-1] + (raw.shape[-1] * raw.itemsize,))
    else:
        allowed = "uint8" + (f" or {np.dtype(native).name}" if native is not None else "")
        raise ValueError(f"{what} for {cls.qtype.name} must be {allowed}, got {raw.dtype}")
    raw = read_only(np.ascontiguousarray(raw))  # one compiled signature, whether or not the caller's array is a map
    n_bytes = raw.shape[-1]
    if n_bytes % cls.type_size:
        raise ValueError(
            f"{what} for {cls.qtype.name}: {n_bytes} bytes per row is not a multiple of the {cls.type_size}-byte block"
        )
    return raw, n_bytes // cls.type_size * cls.block_size


def dequantize(raw: np.ndarray, qtype, n_cols: int | None = None) -> np.ndarray:
    """GGUF tensor data -> float32 values, bit-identical to ``gguf.quants.dequantize``.

    ``raw`` is what ``gguf.GGUFReader`` hands out: for quantized types and BF16 a uint8 array whose
    last axis is the bytes of one row; for F32 / F16 a float32 / float16 array (its uint8 view is
    accepted too). ``n_cols``, if given, must equal the number of values per row.
    Returns a new float32 array of shape ``raw.shape[:-1] + (n_cols,)``.
    Raises ``ValueError`` (one line) for an unsupported type, a wrong dtype or a bad row length.
    """
    cls = weight_layout(qtype)
    rows, cols = as_row_bytes(raw, cls.qtype)
    if n_cols is not None and n_cols != cols:
        raise ValueError(f"{cls.qtype.name} data holds {cols} values per row, but n_cols={n_cols}")
    lead = rows.shape[:-1]
    rows2d = rows.reshape(-1, rows.shape[-1])
    out = np.empty((rows2d.shape[0], cols), dtype=np.float32)
    if cls.qtype == QT.Q8_0:  # numpy, nothing to compile (a token's embedding); f16_at's table: its canonical NaN
        q8_0_rows_numpy(rows2d, F16_TABLE, out)
    elif out.size:
        rows_kernel = _dequantize_rows_serial if out.size < SERIAL_BELOW else _dequantize_rows
        rows_kernel(cls.qtype)(rows2d, out)
    return out.reshape(lead + (cols,))


__all__ = ["dequantize", "dequantize_row", "as_row_bytes", "MXFP4_VALUES", "IQ4NL_VALUES", "WEIGHT_TYPES"]
