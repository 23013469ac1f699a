"""``ggml_mul_mat`` / ``ggml_mul_mat_id`` of a Q4_0, IQ4_NL or MXFP4 weight in llama.cpp's ``CPU_REPACK`` buffer
(its default on x86 for a matrix of N % 8 == 0 rows, ``kernels.ggml.mulmat.repacked``), bit for bit, on the
``avx512`` and ``avx2`` paths. The weights are taken in the plain GGUF layout: the interleaving changes no
value, only where the bytes sit.

Source (vendored llama.cpp, ``ggml/src/ggml-cpu``):

* ``repack.cpp: make_block_{q4_0,iq4_nl,mxfp4}x8`` interleave 8 rows' blocks in chunks of 8 bytes; Q4_0's
  bytes are xored with 0x88, so a nibble ``n`` becomes ``n ^ 8``, read as a signed nibble: ``n - 8``.
* ``arch/x86/repack.cpp: gemv_q4_b32_8x8_q8_0_lut_avx`` / ``gemm_q4_b32_8x8_q8_0_lut_avx`` (one template for
  the three types; entry points ``ggml_gemv/gemm_{q4_0,iq4_nl,mxfp4}_8x8_q8_0``) turn a nibble into an int8
  with a ``_mm256_shuffle_epi8`` LUT: signed nibbles (Q4_0), ``kvalues_iq4nl`` (IQ4_NL), ``kvalues_mxfp4``
  (MXFP4: the E2M1 values doubled, so the scale is ``GGML_CPU_E8M0_TO_FP32_HALF(e)`` = 2^(e-128), half the
  block's 2^(e-127)). Value ``j`` of a block is the low nibble of byte ``j``, value ``j + 16`` its high nibble.
* ``repack.cpp: forward_mul_mat`` quantizes the activation rows in groups of four with
  ``ggml_quantize_mat_q8_0_4x8`` and the last ``T % 4`` rows with ``from_float`` = x86 ``quantize_row_q8_0``:
  the two are the same float operations (abs-max by ``_mm256_max_ps`` in the same order, ``d = amax/127``,
  ``id = 127/amax``, ``round(x·id)`` half-even, saturating packs) — identical bytes and fp16 ``d``
  (:func:`kernels.ggml.actquant._quantize_rows_q8_0`). ``forward_mul_mat_one_chunk`` then runs the gemm on
  the first ``T - T % 4`` rows when ``T > 3`` and one gemv per remaining row; columns are chunked in ranges
  aligned to 8, which only decides who computes what.
* ``forward_mul_mat_id`` converts every activation row with ``from_float`` and always runs the gemv.

Per output element ``(t, r)`` every variant is the same float formula over the 32-value blocks ``b`` in order::

    acc = +0;  acc = fma(float(dot_b), float32(d_w[r, b] · d_x[t, b]), acc)

``d_w`` the fp16 ``d`` (Q4_0, IQ4_NL) or ``E8M0_HALF[e]`` (MXFP4), ``d_x`` the Q8_0 fp16 ``d``, the product
rounded to float32 (``_mm256/512_mul_ps(col_scale, row_scale)``), then ``_mm256/512_fmadd_ps`` with
``cvtepi32_ps(dot_b)`` (``|dot_b| <= 32·128·127 < 2^24``: exact). There is one float accumulator per output
— no lanes, no horizontal sum — so the AVX-512 gemm (16 rows × 16 columns tiles, then 4-row tiles, then the
AVX2 code for ``N % 16`` columns), the AVX2 gemm and the gemv give the same bits: ``path`` changes nothing.

What differs is the integer ``dot_b``, through the int8 sign trick of ``mul_sum_i8_pairs_acc_int32x{8,16}``
(``|x| · (y·sign x)``; ``maddubs`` cannot saturate: |pair| <= 2·128·127, and VNNI ``dpbusd`` gives the same
integers):

* gemm (both paths): ``x`` is the activation, ``y`` the weight value. ``|-128|`` is 128 as an unsigned byte
  and a weight value never is -128, so ``dot_b`` is the exact integer dot.
* gemv: ``x`` is the weight value, ``y`` the activation, so an activation byte of -128 against a negative
  weight value wraps (``-(-128)`` = -128) and counts ``-128·|w|`` (:func:`kernels.ggml.mulmat._sign_dot`).
  x86 ``quantize_row_q8_0`` yields -128 only where ``x·id`` is NaN or infinite (``cvtps_epi32`` gives
  INT_MIN; a finite ``|x·id|`` is at most 127): an activation NaN that ``_mm256_max_ps`` skips (``d_x``
  finite: the gemv row and a gemm row of the same activations differ), an inf (``d_x`` = inf, ``id`` = 0:
  the sign of the resulting inf differs), or ``amax < 127/FLT_MAX`` (``id`` = inf, ``d_x`` = 0: no effect).

Not modelled (as in :mod:`kernels.ggml.mulmat`): which NaN payload survives when two NaNs meet.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.base.block import QT
from kernels.base.flags import SERIAL_BELOW, jit, per_type
from kernels.base.floats import E8M0_HALF
from kernels.ggml.actquant import _q8_0_rows, _quantize_rows_q8_0
from kernels.ggml.build import X86_SIMD_PATHS
from kernels.ggml.mulmat_q8 import _bytes, _check, _qt, slot_groups
from kernels.ggml.simd import fma32
from kernels.ggml.vecmath import F16_TO_F32
from kernels.plain.dequant import IQ4NL_VALUES, MXFP4_VALUES

#: The paths whose repacked kernels are these: every x86 SIMD path (AVX2 / AVX-512, either GCC tuning; AArch64:
#: :mod:`kernels.ggml.repack_arm`).
X86_PATHS = X86_SIMD_PATHS
#: The weight types whose repacked x86 kernels are ``gemv/gemm_q4_b32_8x8_q8_0_lut_avx`` (emulated here).
REPACK_Q4_B32 = frozenset({QT.Q4_0, QT.IQ4_NL, QT.MXFP4})


def _lut_words(values) -> tuple[int, int]:
    """The kernel's 16-entry int8 LUT as two little-endian 64-bit words (nibbles 0–7, 8–15): :func:`_nibble`
    reads an entry with a shift instead of a memory lookup, so the decode loop vectorizes."""
    lo, hi = np.ascontiguousarray(np.asarray(values, np.int8)).view(np.int64).tolist()
    return lo, hi


#: Per type: (the value of each plain nibble as the kernel's LUT reads it, bytes of the block's scale, scale table).
#: Q4_0: repack xors nibble n with 8 and the LUT {0..7, -8..-1} reads n ^ 8 as a signed nibble: n - 8.
_TYPES = {
    QT.Q4_0: (np.arange(16, dtype=np.int32) - 8, 2, F16_TO_F32),  # fp16 d
    QT.IQ4_NL: (IQ4NL_VALUES.astype(np.int32), 2, F16_TO_F32),  # kvalues_iq4nl, fp16 d
    QT.MXFP4: (MXFP4_VALUES.astype(np.int32), 1, E8M0_HALF),  # kvalues_mxfp4 (E2M1 doubled), E8M0 halved
}


@jit()
def _nibble(n, lo, hi):
    """LUT entry ``n`` (0–15) of the packed words ``lo``, ``hi`` (:func:`_lut_words`, as int64), sign-extended."""
    word = hi if n & 8 else lo
    byte = (word >> ((n & 7) << 3)) & 0xFF
    return (byte ^ 0x80) - 0x80


@jit()
def _row_dot(w, hdr, lo, hi, tab, y, xd, m128, t, gemm):
    """One output element: the repacked gemm (``gemm``) or gemv of plain weight row ``w`` (per 32-value block:
    ``hdr`` scale bytes, then 16 bytes of nibbles, valued by the LUT words ``lo``, ``hi``) with Q8_0 activation
    row ``t`` (``y`` (T, K) its quants as int32, ``xd`` (T, K/32) its fp16 d values): an exact integer dot per
    block, then one float accumulator."""
    acc = np.float32(0.0)  # one float accumulator per output element
    yt = y[t]
    bs = hdr + 16
    for b in range(xd.shape[1]):
        o, yo = bs * b + hdr, 32 * b
        s = np.int64(0)  # the exact integer dot (|s| <= 32·128·127 < 2^24)
        for j in range(16):  # value j: low nibble of byte j; value j + 16: its high nibble
            q = np.int64(w[o + j])
            s += _nibble(q & 15, lo, hi) * np.int64(yt[yo + j]) + _nibble(q >> 4, lo, hi) * np.int64(yt[yo + j + 16])
        if not gemm and m128[t, b]:  # gemv: |w| times sign(x_act, w) in int8 -> -128 against w < 0 counts w·128
            for j in range(32):
                v = _nibble((np.int64(w[o + j % 16]) >> (4 * (j // 16))) & 15, lo, hi)
                if yt[yo + j] == -128 and v < 0:
                    s += 256 * v
        if hdr == 2:
            dw = tab[int(w[o - 2]) | (int(w[o - 1]) << 8)]  # GGML_CPU_FP16_TO_FP32(d) (F32Cx8 loads)
        else:
            dw = tab[int(w[o - 1])]  # GGML_CPU_E8M0_TO_FP32_HALF(e)
        d = np.float32(np.float32(dw) * np.float32(xd[t, b]))  # _mm256_mul_ps(col_scale, row_scale)
        acc = fma32(np.float32(s), d, acc)  # _mm256_fmadd_ps(cvtepi32_ps(iacc), d, acc)
    return acc


def _constants(qt) -> tuple[int, int, int]:
    """What a type's kernels compile in as constants: its scale bytes and LUT words (:func:`_lut_words`)."""
    lut, hdr, _ = _TYPES[QT(qt)]
    return (hdr, *_lut_words(lut))


@per_type
def _rows_for(qt, parallel):
    """The repacked gemm/gemv for every element, compiled for one type (its scale bytes and LUT constants, so
    the decode loop vectorizes): ``w`` (N, K/32·(hdr+16)) uint8 plain weight rows, ``tab`` the scale table (fp16
    bits or E8M0 byte -> float32), ``xq`` (T, K) int8 / ``xd`` (T, K/32) float32 the Q8_0 activations; rows
    ``t < exact_rows`` take the gemm (exact integer dot), the others the gemv (sign trick, which differs from the
    exact dot only in a block with an activation byte of -128: ``m128`` (T, K/32) bool). out (T, N)."""
    hdr, lo, hi = _constants(qt)

    @jit(parallel=parallel, kind=qt, variant="" if parallel else "serial")
    def _rows(w, tab, xq, xd, m128, exact_rows, out):
        y = xq.astype(np.int32)  # (T, K): the quants widened once
        for r in prange(w.shape[0]):  # prange over weight rows: independent outputs (range when serial)
            for t in range(xq.shape[0]):
                out[t, r] = _row_dot(w[r], hdr, lo, hi, tab, y, xd, m128, t, t < exact_rows)

    return _rows


@jit()
def _blocks_m128(xq):
    """(R, K/32) bool: the Q8_0 blocks holding an activation byte of -128, where the gemv's sign trick can wrap."""
    R, K = xq.shape
    m128 = np.zeros((R, K // 32), np.bool_)
    for r in range(R):
        for k in range(K):
            if xq[r, k] == -128:
                m128[r, k // 32] = True
    return m128


@jit()
def _q8_0_gemv_inputs(x):
    """Every row of ``x`` (R, K) through ``from_float`` = x86 ``quantize_row_q8_0``: (xq (R, K) int8, xd (R, K/32)
    float32, m128 (R, K/32) bool: the blocks holding a -128, where the gemv's sign trick can wrap)."""
    R, K = x.shape
    xq, xd = np.empty((R, K), np.int8), np.empty((R, K // 32), np.float32)
    _quantize_rows_q8_0(x, xq, xd, np.empty((R, 0), np.float32))
    return xq, xd, _blocks_m128(xq)


@per_type
def _rows_id_for(qt):
    """``forward_mul_mat_id`` in one compiled call, for one type: ``w`` (E, N, row bytes), ``x`` (T·n_x, K)
    float32 every row quantized by ``from_float``, the slots of ``ids`` (T, n_used) grouped by expert
    (:func:`slot_groups`), one gemv per routed (t, s) with activation row ``t·n_x + s % n_x``; out (T·n_used, N)."""
    hdr, lo, hi = _constants(qt)

    @jit(kind=qt, variant="id")
    def _rows_id(w, tab, x, ids, n_x, out):
        xq, xd, m128 = _q8_0_gemv_inputs(x)
        order, bounds, experts, arow = slot_groups(ids, n_x)  # ggml groups the routed rows by expert
        y = xq.astype(np.int32)  # (R, K)
        for g in range(experts.shape[0]):
            we = w[experts[g]]
            for r in range(we.shape[0]):
                for i in range(bounds[g], bounds[g + 1]):
                    out[order[i], r] = _row_dot(we[r], hdr, lo, hi, tab, y, xd, m128, arow[order[i]], False)

    return _rows_id


def _run(w2d, qtype: QT, xq, xd, exact_rows: int) -> np.ndarray:
    """:func:`_rows_for` on one weight matrix (N, row bytes) and Q8_0 activations (T, K) -> (T, N) float32."""
    T, K = xq.shape
    out = np.empty((T, w2d.shape[0]), np.float32)
    if T and w2d.shape[0]:
        rows = _rows_for(qtype, T * w2d.shape[0] * K >= SERIAL_BELOW)  # small products on the calling thread
        rows(w2d, _TYPES[qtype][2], xq, xd, _blocks_m128(xq), exact_rows, out)
    return out


def _check_type(qtype, path: str) -> QT:
    qtype = _qt(qtype)
    if qtype not in REPACK_Q4_B32:
        raise ValueError(f"repacked q4_b32 kernels: {qtype.name} is not Q4_0, IQ4_NL or MXFP4")
    if path not in X86_PATHS:  # an ARM path has its own kernels (kernels.ggml.repack_arm): never these
        raise ValueError(f"repacked q4_b32 kernels (x86 gemv/gemm_q4_b32_8x8_q8_0_lut_avx): path must be one of "
                         f"{X86_PATHS}, got {path!r}")
    return qtype


def mul_mat_repacked(w_bytes: np.ndarray, qtype, x: np.ndarray, path: str) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` with ``W`` repacked (``forward_mul_mat``): ``w_bytes`` (N, row bytes) uint8 plain
    rows of Q4_0 / IQ4_NL / MXFP4 (N % 8 == 0 for ggml to repack), ``x`` (T, K) float32 -> (T, N) float32.
    ``path`` ("avx512" / "avx2") changes no bit (module docstring); the thread count neither."""
    qtype = _check_type(qtype, path)
    w_bytes, x = _check(w_bytes, qtype, x)
    T = x.shape[0]
    xq, xd, _ = _q8_0_rows(x, False)  # ggml_quantize_mat_q8_0_4x8 == quantize_row_q8_0, bit for bit
    return _run(w_bytes, qtype, xq, xd, T - T % 4)  # gemm on T - T % 4 rows (none when T <= 3), gemv on the rest


def mul_mat_id_repacked(w_bytes: np.ndarray, qtype, x: np.ndarray, ids: np.ndarray, path: str) -> np.ndarray:
    """``ggml_mul_mat_id(W, x, ids)`` with ``W`` repacked (``forward_mul_mat_id``: a gemv per routed row):
    ``w_bytes`` (E, N, row bytes), ``x`` (T, n_x, K) float32 (``n_x`` = 1 or ``n_used``), ``ids`` (T, n_used)
    int32 -> (T, n_used, N) float32; slot ``s`` of token ``t`` is ``W[ids[t, s]] @ x[t, s % n_x]``."""
    qtype = _check_type(qtype, path)
    x = np.ascontiguousarray(x, np.float32)
    w_bytes = _bytes(w_bytes)  # (E, N, row bytes)
    ids = np.asarray(ids, np.int32)
    T, n_x, K = x.shape
    n_used = ids.shape[1]
    if w_bytes.ndim != 3:
        raise ValueError(f"weights must be (E, N, row bytes), got {w_bytes.shape}")
    E, N = w_bytes.shape[:2]
    _check(w_bytes[0], qtype, x[:0, 0])  # the row length
    if ids.shape[0] != T or (ids < 0).any() or (ids >= E).any():
        raise ValueError(f"ids must be (T={T}, n_used) experts in [0, {E}), got shape {ids.shape}")
    out = np.empty((T, n_used, N), np.float32)
    _rows_id_for(qtype)(w_bytes, _TYPES[qtype][2], x.reshape(T * n_x, K), ids, n_x, out.reshape(T * n_used, N))
    return out


__all__ = ["mul_mat_repacked", "mul_mat_id_repacked", "REPACK_Q4_B32"]
