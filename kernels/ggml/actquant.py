"""Emulation of llama.cpp's CPU activation quantization and integer block dot products.

``ggml_compute_forward_mul_mat`` (``ggml-cpu.c``) converts every float32 activation row to the
weight type's ``vec_dot_type`` (see ``blocks.Block.vec_dot_type``) before the dot product:

=====================================  ===========  =========================================
weight type                            activation   quantizer emulated here
=====================================  ===========  =========================================
Q8_0, Q4_0, Q5_0, MXFP4, IQ4_NL        Q8_0         x86 ``arch/x86/quants.c::quantize_row_q8_0``
Q4_1, Q5_1                             Q8_1         x86 ``quantize_row_q8_1``
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS   Q8_K         ``ggml-quants.c::quantize_row_q8_K_ref``
F16 / BF16 / F32                       F16 / BF16   round to nearest even / unchanged
=====================================  ===========  =========================================

* **Q8_0 (x86)**, per 32 values: ``amax = max|x|`` (folded as ``_mm256_max_ps`` folds it:
  :func:`_amax_x86`); ``d = fp16(amax / 127)``; ``id = 127/amax`` (float32; 0 if amax = 0 —
  *not* ``1/d`` as in the portable ``quantize_row_q8_0_ref``); ``q = round_half_even(x * id)``
  (``_mm256_round_ps``), saturated to int8.
* **Q8_1 (x86)**: as Q8_0, plus ``s = fp16(d * sum(q))`` with the *unrounded* float32 ``d``.
* **Q8_K**, per 256 values: ``max`` = the signed value of largest ``|x|`` (the first on ties);
  if it is 0 the block is all zero; else ``iscale = -127/max``,
  ``q = min(127, nearest_int(iscale * x))`` (``nearest_int`` = the ``+ 1.5*2**23`` bit trick, i.e.
  round half to even), ``d = 1/iscale`` (float32, negative when max > 0), ``bsums`` = sums of ``q``
  per 16. (llama.cpp leaves ``bsums`` unset for an all-zero block; they only ever multiply a zero
  ``d`` there, and we store zeros.)

The dot products are transcriptions of the generic ``ggml_vec_dot_<w>_<a>_generic`` functions in
``ggml-cpu/quants.c``: an exact integer dot per block (int arithmetic, which no reordering can
change), combined with the block scales in float32 in the same formula and order as the C code,
including the K-quants' 8 float lanes (``sums[8]``, one per ``aux32`` lane, added up at the end)
and the ``dmin * Σ bsums*m`` correction. F16/BF16/F32 weights use the generic
``ggml_vec_dot_f16/bf16/f32``: float32 products summed in double. llama.cpp's SIMD kernels compute
the same integer dots and only reorder the float32 combination, so they differ from this by float32
accumulation noise, not by quantization error: against libggml's own ``ggml_mul_mat``
(``tests/test_kernels_ggml.py``) the difference is ≤ 1e-7 of Σ|w·x| for every type.

Files: this module holds the quantizers; :mod:`kernels.ggml.actdots` the integer dots and
``matmul_act_quant``.

Non-finite activations (from weights that are not finite, docs/numerics.md "Non-finite weights") are
quantized as llama.cpp quantizes them: Q8_0/Q8_1 with the x86 ``MAXPS`` semantics of the block
maximum (a NaN is kept or skipped by its position, :func:`_amax_x86`) and ``cvtps_epi32``'s INT_MIN
for NaN and out-of-range values (saturated to −128 by the packs; Q8_1's ``s`` sums the int32s before
the packs); Q8_K as ``quantize_row_q8_K_ref``'s C does — a NaN is never the maximum, and
``nearest_int`` of a NaN reads its bits (0 for the default NaN). Weights with inf/NaN scales
propagate them as IEEE arithmetic does.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kernels.base.blocks import QT, layout
from kernels.base.flags import jit
from kernels.base.floats import round_to_bf16, round_to_f16
from kernels.ggml.simd import fma32

# --------------------------------------------------------------------------------------------
# Activation quantizers: x (R, K) float32 -> block fields, one activation row at a time


@jit()
def _maxps(a, b):
    """x86 ``MAXPS`` / ``MAXSS`` on one lane: ``a > b ? a : b`` — the *second* operand when either is
    NaN (what ``_mm256_max_ps`` / ``_mm_max_ps`` / ``_mm_max_ss`` compute)."""
    return a if a > b else b


@jit(inline=True)
def _amax_x86(x, r, o):
    """``max(abs(e))`` of the 32 values ``x[r, o : o+32]`` as the x86 ``quantize_row_q8_0`` / ``_q8_1``
    reduce them: four 8-lane vectors folded with ``_mm256_max_ps`` (lane l sees values l, 8+l, 16+l,
    24+l in that order), then the upper 128 bits against the lower, then lanes 2-3 against 0-1, then
    lane 1 against lane 0 (``_mm_max_ss``). For finite values it is the plain maximum; a NaN wins
    only where it is the second operand, so the result is NaN, or a value that skips the NaN and
    whatever came before it in its lane."""
    m0 = abs(x[r, o + 0])
    m1 = abs(x[r, o + 1])
    m2 = abs(x[r, o + 2])
    m3 = abs(x[r, o + 3])
    m4 = abs(x[r, o + 4])
    m5 = abs(x[r, o + 5])
    m6 = abs(x[r, o + 6])
    m7 = abs(x[r, o + 7])
    for v in range(1, 4):
        b = o + 8 * v
        m0 = _maxps(m0, abs(x[r, b + 0]))
        m1 = _maxps(m1, abs(x[r, b + 1]))
        m2 = _maxps(m2, abs(x[r, b + 2]))
        m3 = _maxps(m3, abs(x[r, b + 3]))
        m4 = _maxps(m4, abs(x[r, b + 4]))
        m5 = _maxps(m5, abs(x[r, b + 5]))
        m6 = _maxps(m6, abs(x[r, b + 6]))
        m7 = _maxps(m7, abs(x[r, b + 7]))
    h0, h1, h2, h3 = _maxps(m4, m0), _maxps(m5, m1), _maxps(m6, m2), _maxps(m7, m3)  # extractf128(hi) vs lo
    h0, h1 = _maxps(h0, h2), _maxps(h1, h3)  # _mm_movehl_ps
    return _maxps(h0, h1)  # _mm_max_ss with _mm_movehdup_ps


@jit(inline=True)
def _cvtps_epi32(v):
    """``_mm256_cvtps_epi32`` of an already rounded value: the int32, or INT_MIN ("integer
    indefinite") for NaN and anything outside the int32 range."""
    if v != v or v < np.float32(-2147483648.0) or v >= np.float32(2147483648.0):
        return -2147483648
    return int(v)


@jit()
def _quantize_rows_q8_0(x, qs, d, s):
    """x86 ``quantize_row_q8_0`` (and ``_q8_1`` when ``s`` has columns): fill qs (R, K) int8, d (R, K/32).

    ``d`` and ``s`` hold the values of their f16 fields, as float32.
    """
    with_s = s.shape[1] > 0
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            amax = _amax_x86(x, r, 32 * b)
            d_unrounded = amax / np.float32(127.0)
            d[r, b] = round_to_f16(d_unrounded)
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)  # NaN != 0: inv is NaN
            total = 0  # _q8_1: hsum_i32_8 of the int32 values, before the saturating packs (wraps as int32)
            for j in range(32):
                i32 = _cvtps_epi32(np.rint(x[r, 32 * b + j] * inv))  # _MM_ROUND_NEAREST: half to even
                qs[r, 32 * b + j] = min(max(i32, -128), 127)  # packs_epi32 then packs_epi16: saturated
                total += i32
            if with_s:
                total = (total + 2**31) % 2**32 - 2**31
                s[r, b] = round_to_f16(d_unrounded * np.float32(total))


@jit()
def _fcvtns(v):
    """AArch64 ``FCVTNS`` (``vcvtnq_s32_f32``): round to nearest, ties to even, saturated to int32; NaN -> 0."""
    if v != v:
        return 0
    if v >= np.float32(2147483648.0):
        return 2147483647
    if v < np.float32(-2147483648.0):
        return -2147483648
    return int(np.rint(v))


@jit()
def _quantize_rows_q8_0_arm(x, qs, d, s):
    """AArch64 ``arch/arm/quants.c: quantize_row_q8_0`` (and ``_q8_1`` when ``s`` has columns): fill qs (R, K)
    int8, d (R, K/32) (and s) with the values of their f16 fields, as float32.

    Per 32 values: ``amax`` = ``vmaxvq_f32`` of the ``vmaxq_f32`` tree of ``|x|`` — ``FMAX`` propagates a NaN, so
    any NaN in the block makes ``amax`` (then ``d`` and ``id``) NaN, and every ``q`` 0; ``d = amax / 127``;
    ``id = d ? 1.0f/d : 0.0f`` (the reciprocal of the *rounded-to-float* d, not x86's ``127/amax``);
    ``q = vcvtnq_s32_f32(x * id)`` (:func:`_fcvtns`) stored into an int8 by C's conversion: the low byte (a
    subnormal ``d`` whose reciprocal is inf sends ``x·id`` to ±inf: INT32_MAX → -1, INT32_MIN → 0). Q8_1's ``s``
    is ``fp16(d * (float) vaddvq_s32(Σ int32 q))``, the int32 sums wrapping."""
    with_s = s.shape[1] > 0
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            o = 32 * b
            amax = np.float32(0.0)
            nan = False
            for j in range(32):
                v = abs(x[r, o + j])
                if v != v:
                    nan = True
                elif v > amax:
                    amax = v
            if nan:
                amax = np.float32(np.nan)
            dd = amax / np.float32(127.0)
            d[r, b] = round_to_f16(dd)
            inv = np.float32(1.0) / dd if dd != 0 else np.float32(0.0)  # NaN != 0: inv is NaN
            total = 0
            for j in range(32):
                i32 = _fcvtns(x[r, o + j] * inv)
                qs[r, o + j] = ((i32 + 128) & 0xFF) - 128  # int32 -> int8: the low byte
                total += i32
            if with_s:
                total = (total + 2**31) % 2**32 - 2**31
                s[r, b] = round_to_f16(dd * np.float32(total))


@jit()
def _quantize_rows_q8_k(x, qs, d, bsums, fused=False):
    """``quantize_row_q8_K_ref``: fill qs (R, K) int8, d (R, K/256) float32, bsums (R, K/16) int16. ``fused``: the
    AArch64 GCC build of ``ggml-quants.c`` contracts ``nearest_int(iscale*x[j])`` into one ``fmla`` (the x86
    builds round the product first)."""
    shifted = np.empty(256, dtype=np.float32)
    shifted_bits = shifted.view(np.int32)
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 256):
            o = 256 * b
            vmax = np.float32(0.0)
            amax = np.float32(0.0)
            for j in range(256):
                ax = abs(x[r, o + j])
                if ax > amax:
                    amax = ax
                    vmax = x[r, o + j]
            if amax == 0:
                d[r, b] = 0.0
                for j in range(256):
                    qs[r, o + j] = 0
                for g in range(16):
                    bsums[r, 16 * b + g] = 0
                continue
            iscale = np.float32(-127.0) / vmax
            for j in range(256):  # nearest_int(): add 1.5*2**23 in float32, read the low mantissa bits
                if fused:
                    shifted[j] = fma32(iscale, x[r, o + j], np.float32(12582912.0))
                else:
                    shifted[j] = iscale * x[r, o + j] + np.float32(12582912.0)
            for j in range(256):
                qs[r, o + j] = min(127, (int(shifted_bits[j]) & 0x007FFFFF) - 0x00400000)
            for g in range(16):
                total = 0
                for j in range(16):
                    total += int(qs[r, o + 16 * g + j])
                bsums[r, 16 * b + g] = total
            d[r, b] = np.float32(1.0) / iscale


@jit()
def _round_rows(x, out, to_bf16):
    """F16 / BF16 activation rounding (nearest even), kept as float32 values."""
    for r in range(x.shape[0]):
        for k in range(x.shape[1]):
            out[r, k] = round_to_bf16(x[r, k]) if to_bf16 else round_to_f16(x[r, k])


class Q8_0Blocks(NamedTuple):
    """Q8_0 activation blocks: value ``j`` of block ``b`` is ``qs[..., b, j] * d[..., b]``."""

    d: np.ndarray  # float16 (..., n_blocks)
    qs: np.ndarray  # int8 (..., n_blocks, 32)


class Q8_1Blocks(NamedTuple):
    """Q8_1 activation blocks: as Q8_0, plus ``s = fp16(d_unrounded * sum(qs))`` per block."""

    d: np.ndarray  # float16 (..., n_blocks)
    s: np.ndarray  # float16 (..., n_blocks)
    qs: np.ndarray  # int8 (..., n_blocks, 32)


class Q8_KBlocks(NamedTuple):
    """Q8_K activation blocks: value ``j`` of block ``b`` is ``qs[..., b, j] * d[..., b]`` (float32 d)."""

    d: np.ndarray  # float32 (..., n_blocks)
    qs: np.ndarray  # int8 (..., n_blocks, 256)
    bsums: np.ndarray  # int16 (..., n_blocks, 16): sums of qs per 16 values


def _as_activation_rows(x, block: int, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"{what}: activations must be float32, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] % block:
        raise ValueError(f"{what}: the last axis must be a multiple of {block} values, got shape {x.shape}")
    return np.ascontiguousarray(x.reshape(-1, x.shape[-1]))


def _q8_0_rows(x2d, with_s: bool, kernel=None):
    """(qs, d, s) of (R, K) float32 rows by ``kernel`` (default: x86's :func:`_quantize_rows_q8_0`)."""
    R, K = x2d.shape
    qs = np.empty((R, K), np.int8)
    d = np.empty((R, K // 32), np.float32)
    s = np.empty((R, K // 32 if with_s else 0), np.float32)
    (kernel or _quantize_rows_q8_0)(x2d, qs, d, s)
    return qs, d, s


def _q8_k_rows(x2d, fused: bool = False):
    R, K = x2d.shape
    qs = np.empty((R, K), np.int8)
    d = np.empty((R, K // 256), np.float32)
    bsums = np.empty((R, K // 16), np.int16)
    _quantize_rows_q8_k(x2d, qs, d, bsums, fused)
    return qs, d, bsums


def _q8_0_rows_arm(x2d, with_s: bool):
    """AArch64 ``quantize_row_q8_0`` / ``_q8_1`` of (R, K) float32 rows: (qs, d, s) as :func:`_q8_0_rows`."""
    return _q8_0_rows(x2d, with_s, _quantize_rows_q8_0_arm)


def quantize_q8_0(x: np.ndarray) -> Q8_0Blocks:
    """float32 (..., K) -> Q8_0 blocks exactly as llama.cpp's x86 ``quantize_row_q8_0``. K % 32 == 0."""
    x2d = _as_activation_rows(x, 32, "quantize_q8_0")
    qs, d, _ = _q8_0_rows(x2d, with_s=False)
    lead = np.shape(x)[:-1]
    nb = x2d.shape[1] // 32
    return Q8_0Blocks(d.astype(np.float16).reshape(lead + (nb,)), qs.reshape(lead + (nb, 32)))


def quantize_q8_1(x: np.ndarray) -> Q8_1Blocks:
    """float32 (..., K) -> Q8_1 blocks exactly as llama.cpp's x86 ``quantize_row_q8_1``. K % 32 == 0."""
    x2d = _as_activation_rows(x, 32, "quantize_q8_1")
    qs, d, s = _q8_0_rows(x2d, with_s=True)
    lead = np.shape(x)[:-1]
    nb = x2d.shape[1] // 32
    return Q8_1Blocks(
        d.astype(np.float16).reshape(lead + (nb,)), s.astype(np.float16).reshape(lead + (nb,)), qs.reshape(lead + (nb, 32))
    )


def quantize_q8_K(x: np.ndarray) -> Q8_KBlocks:
    """float32 (..., K) -> Q8_K blocks exactly as ``quantize_row_q8_K_ref`` (used on x86). K % 256 == 0."""
    x2d = _as_activation_rows(x, 256, "quantize_q8_K")
    qs, d, bsums = _q8_k_rows(x2d)
    lead = np.shape(x)[:-1]
    nb = x2d.shape[1] // 256
    return Q8_KBlocks(d.reshape(lead + (nb,)), qs.reshape(lead + (nb, 256)), bsums.reshape(lead + (nb, 16)))


def activation_values(x: np.ndarray, qtype) -> np.ndarray:
    """The activations as a ``qtype`` weight's dot product sees them, as exact float64 values.

    ``x`` float32 (..., K) is converted to ``qtype``'s ``vec_dot_type`` as above and expanded back
    (``qs * d``; F16/BF16 rounding; F32 unchanged). For tests and for a float64 model of llama.cpp.
    """
    vdt = layout(qtype).vec_dot_type
    block = {QT.Q8_0: 32, QT.Q8_1: 32, QT.Q8_K: 256}.get(vdt, 1)
    x2d = _as_activation_rows(x, block, "activation_values")
    if vdt in (QT.Q8_0, QT.Q8_1):
        qs, d, _ = _q8_0_rows(x2d, with_s=False)
        vals = qs.reshape(len(qs), -1, 32).astype(np.float64) * d[:, :, None].astype(np.float64)
    elif vdt == QT.Q8_K:
        qs, d, _ = _q8_k_rows(x2d)
        vals = qs.reshape(len(qs), -1, 256).astype(np.float64) * d[:, :, None].astype(np.float64)
    elif vdt in (QT.F16, QT.BF16):
        vals = np.empty_like(x2d)
        _round_rows(x2d, vals, vdt == QT.BF16)
    else:
        vals = x2d
    return vals.astype(np.float64).reshape(np.shape(x))


__all__ = [
    "Q8_0Blocks",
    "Q8_1Blocks",
    "Q8_KBlocks",
    "quantize_q8_0",
    "quantize_q8_1",
    "quantize_q8_K",
    "activation_values",
]
