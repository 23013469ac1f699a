"""K-quant weights in llama.cpp's CPU_REPACK buffer (Q4_K ``block_q4_Kx8``, Q2_K ``block_q2_Kx8``), x86, bit for bit.

llama.cpp loads a matrix with ``ne[1] % 8 == 0`` (rows per expert) into the CPU_REPACK buffer
(``repack.cpp: ggml_repack_get_optimal_repack_type``): Q4_K on any AVX2 build (``q4_K_8x8_q8_K``), Q2_K only
when ``ggml_cpu_has_avx512()`` (``q2_K_8x8_q8_K``; :data:`REPACK_K_PATHS`). Its mul_mat / mul_mat_id then skip
ggml-cpu's own kernels (:mod:`kernels.ggml.mulmat_k`) for ``tensor_traits::forward_mul_mat{,_id}`` (``repack.cpp``
~4650-4900). The interleaved layout only decides which register lane holds what; per output element the kernels
compute exact integers and the float steps below, which is all that is emulated here.

Activations (``forward_mul_mat``): the first ``T - T % 4`` rows are quantized four at a time by
``arch/x86/repack.cpp: ggml_quantize_mat_q8_K_4x8`` and go to the gemm; the last ``T % 4`` rows by
``from_float`` = ``quantize_row_q8_K_ref`` (:mod:`kernels.ggml.actquant`) and go to the gemv one by one.
``forward_mul_mat_id`` runs ``from_float`` + gemv on every routed row (slot ``s`` reads ``x[t, s % n_x]``;
a token routed twice to one expert overflows ggml's per-expert row list of ``ne12`` entries — top-k never does
that, and it is not modelled).

``ggml_quantize_mat_q8_K_4x8`` (~290-515, per row; the 4 rows never mix): ``amax`` = the max of ``|x|`` folded
with ``_mm256_max_ps`` per lane over the 32 8-value groups, then across lanes; the sign is not "the first value
of largest |x|" (ref) but "does any value equal +amax" (a lane-wise ``_CMP_EQ_OQ`` mask): ``iscale =
-127/amax`` if so, else ``+127/amax`` (0 if amax = 0); ``d = 1/iscale``; ``q = cvtps_epi32(round_ps(x·iscale))``
saturated to int8 by the two ``packs`` (NaN, ±inf, |v| >= 2^31 -> INT_MIN -> -128); bsums per 16 values.
Against ``quantize_row_q8_K_ref`` it differs (a) when ``-amax`` comes first and ``+amax`` also occurs: q, d
and bsums are all negated — no output bit changes (each float product below has both factors negated, and the
accumulators start at +0, so a signed-zero product never shows); (b) when ``127/amax`` overflows (``amax`` <
~3.7e-37: ref's ``nearest_int(±inf)`` stores 0, here -128 — times ``d = ±0``, invisible); (c) on NaN/inf
activations: a NaN or inf quantizes to -128 (ref: 0), and a NaN that ``_mm256_max_ps`` keeps becomes the
block's amax (ref never picks a NaN) — visible in the outputs of NaN rows. :func:`quantize_rows_q8_k_4x8`
emulates all of it.

Integers, per weight row ``c`` and activation row ``r``, sub-blocks ``s`` of 32 (Q4_K) / 16 (Q2_K) values:
``I_s = sc_s · Σ q·y`` (``maddubs`` pairs summed in int16 — at most 16 products of 15·128 (Q4_K) or 8 of
3·128 (Q2_K) per lane: no wrap or saturation possible —, ``madd_epi16`` with the scale), ``M_s = mn_s · Σ y``
(the bsums, pairwise ``hadd_epi16`` for Q4_K, ``madd_epi16`` with the mins). ``sc``/``mn``: Q4_K's 6-bit
``get_scale_min_k4``, Q2_K's nibbles. Floats (``ds = fp16(d_c)·y.d``, ``dm = fp16(dmin_c)·y.d``, each rounded
to float32 by ``_mm*_mul_ps``; accumulators start at +0; super-blocks in K order; ``out = acc - accm``):

* gemv (``ggml_gemv_{q4,q2}_K_8x8_q8_K``, ``__AVX2__`` code in both builds): per super-block
  ``acc = fma(float(Σ_s I_s), ds, acc)``, ``accm = fma(float(Σ_s M_s), dm, accm)`` (int32 sums over the block).
* gemm (``ggml_gemm_{q4,q2}_K_8x8_q8_K``): the same, but one FMA per ``sb`` step of the super-block — 64 values
  (4 per block) for Q4_K, 128 (2 per block) for Q2_K. Its AVX-512 part (``__AVX512BW__ && __AVX512DQ__``:
  16 activation rows x 16 weight rows, then 4 x 16) and the AVX2 code for the rest (16 x 8, 4 x 8; all of the
  AVX2-only build) compute this same formula, so neither the path, the tile an element lands in, nor the thread
  chunking (whole groups of 8 weight rows) changes a bit.

Q4_K rows are read straight from their bytes (:func:`_q4_k_rows_into`). Not modelled: NaN payloads (which of two NaNs
survives a sum).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.base.block import QT
from kernels.base.flags import SERIAL_BELOW, jit
from kernels.ggml.actquant import _maxps, _quantize_rows_q8_k
from kernels.ggml.build import X86_SIMD_PATHS
from kernels.ggml.mulmat_k import pair_sums, q8_k_inputs
from kernels.ggml.mulmat_q8 import _bytes, _qt, slot_groups
from kernels.ggml.rows_k_ir import q4_k_block
from kernels.ggml.simd import fma32, lanes
from kernels.ggml.vecmath import F16_TO_F32, fp16_at

#: Weight types emulated here, and the paths on which llama.cpp repacks them (``ne[1] % 8 == 0`` per expert).
REPACK_K = frozenset({QT.Q4_K, QT.Q2_K})
REPACK_K_PATHS = {QT.Q4_K: X86_SIMD_PATHS,  # ggml_cpu_has_avx2(): every x86 SIMD path
                  QT.Q2_K: tuple(p for p in X86_SIMD_PATHS if lanes(p) == 16)}  # ggml_cpu_has_avx512(): the AVX2
# builds leave Q2_K in plain rows
KIND = {QT.Q4_K: 0, QT.Q2_K: 1}
BLOCK_BYTES = {QT.Q4_K: 144, QT.Q2_K: 84}
F32 = np.float32


# --------------------------------------------------------------------------------------------
# ggml_quantize_mat_q8_K_4x8 (x86 __AVX2__)


@jit()
def _cvt_i8(v):
    """``_mm256_cvtps_epi32`` of an already rounded float32, then ``packs_epi32`` + ``packs_epi16``."""
    if not (v > -2147483648.0 and v < 2147483648.0):  # NaN, ±inf, out of int32: the "integer indefinite"
        return -128
    i = np.int64(v)
    return max(-128, min(127, i))


@jit()
def quantize_rows_q8_k_4x8(x, qs, d, bsums):
    """``ggml_quantize_mat_q8_K_4x8`` row by row: x (R, K) float32 -> qs (R, K) int8, d (R, K/256) float32,
    bsums (R, K/16) int16 (the values the kernel stores, un-interleaved)."""
    m = np.empty(8, np.float32)  # maxAbs, one per lane
    mask = np.empty(8, np.bool_)  # maskAbs: a +maxAbs value was seen in the lane
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 256):
            o = 256 * b
            for lane in range(8):
                for g in range(32):  # g = 4·sb + j: the 8-value group of _mm256_loadu_ps j of iteration sb
                    v = x[r, o + 8 * g + lane]
                    if g == 0:
                        m[lane] = abs(v)
                        mask[lane] = False
                        prev = m[lane]
                    else:
                        if g % 4 == 0:
                            prev = m[lane]  # tempAbs
                        m[lane] = _maxps(m[lane], abs(v))  # _mm256_max_ps(maxAbs, absj)
                    if g % 4 == 3:  # after the 4 loads of one sb iteration
                        if not (prev == m[lane]):  # maskAbs &= (tempAbs == maxAbs), ordered compare
                            mask[lane] = False
                        for j in range(4):  # maskAbs |= mask_curr (maxAbs == vj)
                            if m[lane] == x[r, o + 8 * (g - 3 + j) + lane]:
                                mask[lane] = True
            h0 = _maxps(m[4], m[0])  # _mm_max_ps(extractf128(hi), lo)
            h1 = _maxps(m[5], m[1])
            h0 = _maxps(h0, _maxps(m[6], m[2]))  # movehl
            h1 = _maxps(h1, _maxps(m[7], m[3]))
            amax = _maxps(h0, h1)  # _mm_max_ss(max4, movehdup(max4))
            neg = False
            for lane in range(8):
                if mask[lane] and amax == m[lane]:
                    neg = True
            iscale = F32(0.0)
            if amax != 0:
                iscale = F32(-127.0) / amax if neg else F32(127.0) / amax
            d[r, b] = F32(1.0) / iscale if amax != 0 else F32(0.0)  # `maxScalar ? 1/iscale : 0` (NaN is true)
            for k in range(o, o + 256):
                qs[r, k] = _cvt_i8(np.rint(x[r, k] * iscale))  # _mm256_round_ps(_MM_ROUND_NEAREST): half even
            for g in range(16 * b, 16 * b + 16):
                s = 0
                for k in range(16 * g, 16 * g + 16):
                    s += np.int64(qs[r, k])
                bsums[r, g] = s


@jit()
def q8_k_mat_inputs(x, g):
    """The Q8_K activations of ``forward_mul_mat``: rows ``t < g`` of ``x`` (T, K) by ``ggml_quantize_mat_q8_K_4x8``
    (the gemm's), the rest by ``from_float`` = ``quantize_row_q8_K_ref``: (yq (T, K) int8, yd (T, K/256) float32,
    bsums (T, K/16) int16)."""
    T, K = x.shape
    yq, yd, bs = np.empty((T, K), np.int8), np.empty((T, K // 256), np.float32), np.empty((T, K // 16), np.int16)
    quantize_rows_q8_k_4x8(x[:g], yq[:g], yd[:g], bs[:g])
    _quantize_rows_q8_k(x[g:], yq[g:], yd[g:], bs[g:])
    return yq, yd, bs


def quantize_q8_k_4x8(x: np.ndarray):
    """(qs, d, bsums) of ``ggml_quantize_mat_q8_K_4x8`` for float32 rows x (R, K)."""
    x = np.ascontiguousarray(x, np.float32)
    R, K = x.shape
    qs = np.empty((R, K), np.int8)
    d = np.empty((R, K // 256), np.float32)
    bs = np.empty((R, K // 16), np.int16)
    quantize_rows_q8_k_4x8(x, qs, d, bs)
    return qs, d, bs


# --------------------------------------------------------------------------------------------
# ggml_gemv_{q4,q2}_K_8x8_q8_K / ggml_gemm_{q4,q2}_K_8x8_q8_K


@jit()
def _decode_q2_k_i32(w, q, sc, mn, d, dmin, table):
    """One Q2_K row (per block: scales[16], qs[64], d, dmin) -> 2-bit codes ``q`` (int32), 4-bit ``sc`` / ``mn`` per
    16 values, ``d`` / ``dmin``. Value ``128h + 32j + l`` is bits ``2j`` of ``qs[32h + l]`` (dequantize_row_q2_K)."""
    for b in range(d.shape[0]):
        o = 84 * b
        d[b] = table[np.int64(w[o + 80]) | (np.int64(w[o + 81]) << 8)]
        dmin[b] = table[np.int64(w[o + 82]) | (np.int64(w[o + 83]) << 8)]
        for s in range(16):
            sc[16 * b + s] = np.int32(w[o + s]) & 15
            mn[16 * b + s] = np.int32(w[o + s]) >> 4
        for n in range(2):  # value 128n + 32j + l: bits 2j of qs[32n + l]
            for j in range(4):
                base = 256 * b + 128 * n + 32 * j
                for l in range(32):
                    q[base + l] = (np.int32(w[o + 16 + 32 * n + l]) >> (2 * j)) & 3


@jit()
def _q4_k_rows_into(w, y, yd, ysub, gemm, rows, out, orow, d, dmin, table):
    """The core of :func:`_id_item` (so of :func:`repacked_k_rows`) for Q4_K: weight rows ``w`` (N, row bytes)
    against the activation rows ``rows`` of ``y`` (int8 (·, K), the Q8_K quants), ``yd``, ``ysub``, ``gemm``;
    results to ``out[orow[i], c]``. Each super-block's integers — ``ΣI`` and ``ΣM`` per 64 values, the scales and
    mins decoded from its bytes — come straight from the row (:func:`kernels.ggml.rows_k_ir.q4_k_block`; exact
    in int32: a super-block's sum < 2^25)."""
    K = y.shape[1]
    nb = K // 256
    for c in range(w.shape[0]):
        wc = w[c]
        for b in range(nb):  # fp16 d / dmin of the row
            d[b] = fp16_at(wc, 144 * b, table)
            dmin[b] = fp16_at(wc, 144 * b + 2, table)
        for i in range(rows.shape[0]):
            r = rows[i]
            yr, ys = y[r], ysub[r]
            acc = F32(0.0)
            accm = F32(0.0)
            for b in range(nb):
                ds = d[b] * yd[r, b]  # _mm*_mul_ps(col_scale_f32, row_scale_f32)
                dm = dmin[b] * yd[r, b]  # _mm*_mul_ps(col_dmin_f32, row_scale_f32)
                t = q4_k_block(wc, 144 * b, yr, 256 * b, ys, 8 * b)  # (ΣI, ΣM) of each 64 values
                if gemm[r]:  # an FMA per 64 values (two sub-blocks)
                    for cc in range(4):
                        acc = fma32(F32(t[cc]), ds, acc)  # _mm*_fmadd_ps(cvtepi32_ps(iacc), ds, acc)
                        accm = fma32(F32(t[4 + cc]), dm, accm)
                else:  # the gemv: one per super-block
                    acc = fma32(F32(t[0] + t[1] + t[2] + t[3]), ds, acc)
                    accm = fma32(F32(t[4] + t[5] + t[6] + t[7]), dm, accm)
            out[orow[i], c] = acc - accm  # _mm*_sub_ps(acc_rows, acc_min_rows)


@jit()
def _q2_k_rows_into(w, y, yd, ysub, gemm, rows, out, orow, q, sc, mn, d, dmin, isum, table):
    """:func:`_q4_k_rows_into` for Q2_K: the rows decoded first (:func:`_decode_q2_k_i32`), sub-blocks of 16
    values, the gemm's FMA per 128 values (8 sub-blocks), the gemv's per super-block."""
    K = y.shape[1]
    nb = K // 256
    for c in range(w.shape[0]):
        _decode_q2_k_i32(w[c], q, sc, mn, d, dmin, table)
        for i in range(rows.shape[0]):
            r = rows[i]
            for s in range(K // 16):
                p = np.int32(0)
                for k in range(16 * s, 16 * s + 16):
                    p = np.int32(p + np.int32(q[k] * y[r, k]))
                isum[s] = sc[s] * p
            acc = F32(0.0)
            accm = F32(0.0)
            step = 8 if gemm[r] else 16
            for b in range(nb):
                ds = d[b] * yd[r, b]  # _mm*_mul_ps(col_scale_f32, row_scale_f32)
                dm = dmin[b] * yd[r, b]  # _mm*_mul_ps(col_dmin_f32, row_scale_f32)
                for s0 in range(16 * b, 16 * b + 16, step):
                    ii = np.int64(0)
                    mi = np.int64(0)
                    for s in range(s0, s0 + step):
                        ii += isum[s]
                        mi += np.int64(mn[s]) * ysub[r, s]
                    acc = fma32(F32(ii), ds, acc)  # _mm*_fmadd_ps(cvtepi32_ps(iacc), ds, acc)
                    accm = fma32(F32(mi), dm, accm)
            out[orow[i], c] = acc - accm  # _mm*_sub_ps(acc_rows, acc_min_rows)


@jit()
def _work_buffers(K):
    """Q2_K's per-row scratch: codes, scales and mins per 16 values, d / dmin, the scaled sums per sub-block."""
    nb = K // 256
    return (np.empty(K, np.int32), np.empty(K // 16, np.int32), np.empty(K // 16, np.int32),
            np.empty(nb, np.float32), np.empty(nb, np.float32), np.empty(K // 16, np.int64))


ROWS = 64  # weight rows per work item of the parallel kernels (an expert's 512 gate rows: 8 items)


@jit()
def _id_item(kind, w, yq, y, yd, ysub, gemm, arow, order, bounds, experts, out, table, g, c0):
    """Weight rows ``[c0, c0 + ROWS)`` of expert group ``g`` (:func:`repacked_k_id`): every output element of the
    item computed here, whole, in ggml's order."""
    c1 = min(c0 + ROWS, w.shape[1])
    orow = order[bounds[g]:bounds[g + 1]]
    rows = np.empty(orow.shape[0], np.int64)
    for i in range(orow.shape[0]):
        rows[i] = arow[orow[i]]
    wg, og = w[experts[g], c0:c1], out[:, c0:c1]
    if kind == 0:  # the super-blocks' integers from the bytes: only d / dmin per row
        nb = yq.shape[1] // 256
        _q4_k_rows_into(wg, yq, yd, ysub, gemm, rows, og, orow, np.empty(nb, np.float32), np.empty(nb, np.float32), table)
    else:
        q, sc, mn, d, dmin, isum = _work_buffers(yq.shape[1])
        _q2_k_rows_into(wg, y, yd, ysub, gemm, rows, og, orow, q, sc, mn, d, dmin, isum, table)


def _id_for(parallel):
    """:func:`repacked_k_id` and its parallel twin (``prange`` over the (expert group, ``ROWS`` weight rows) items,
    one region per call; each output element one item's, so the thread count changes no bit)."""

    @jit(parallel=parallel, variant="parallel" if parallel else "serial")
    def repacked_k_id(kind, w, yq, yd, ysub, gemm, arow, order, bounds, experts, out, table):
        """``w`` (E, N, row bytes); the output slots ``order[bounds[g]:bounds[g+1]]`` (rows of ``out`` (slots,
        N)) go through expert ``experts[g]``, slot ``j`` with activation row ``arow[j]`` of ``yq`` / ``yd`` /
        ``ysub``, the gemm's FMAs where ``gemm[arow[j]]``, else the gemv's."""
        # Q2_K's int32 dots take the Q8_K quants widened once (R, K); Q4_K's vector IR the bytes
        y = yq.astype(np.int32) if kind == 1 else np.empty((yq.shape[0], 0), np.int32)
        if w.strides[2] != 1:  # kernels.ggml.rows_k_ir reads each weight row as contiguous bytes
            raise ValueError("the weight rows must be contiguous")
        nt = (w.shape[1] + ROWS - 1) // ROWS
        for i in prange(experts.shape[0] * nt):
            _id_item(kind, w, yq, y, yd, ysub, gemm, arow, order, bounds, experts, out, table, i // nt, ROWS * (i % nt))

    return repacked_k_id


repacked_k_id_serial, repacked_k_id_parallel = _id_for(False), _id_for(True)


@jit()
def repacked_k_id(kind, w, yq, yd, ysub, gemm, arow, order, bounds, experts, out, table):
    """mul_mat_id's (and mul_mat's: one group) rows, split between threads at ``SERIAL_BELOW`` multiply-adds."""
    if order.shape[0] * w.shape[1] * yq.shape[1] >= SERIAL_BELOW:
        repacked_k_id_parallel(kind, w, yq, yd, ysub, gemm, arow, order, bounds, experts, out, table)
    else:
        repacked_k_id_serial(kind, w, yq, yd, ysub, gemm, arow, order, bounds, experts, out, table)


@jit()
def repacked_k_rows(kind, w, yq, yd, ysub, gemm, out, table):
    """Every element of the repacked kernels (``kind`` 0: Q4_K, 1: Q2_K): ``w`` (N, row bytes) plain rows, ``yq``
    (R, K) / ``yd`` (R, K/256) the Q8_K rows, ``ysub`` (R, K/sub) their sums per weight sub-block (32 / 16
    values), ``gemm`` (R,) the rows that take the gemm (an FMA per ``sb`` step) rather than the gemv (per
    super-block); out (R, N). One expert group of :func:`repacked_k_id`."""
    R = yq.shape[0]
    rows = np.arange(R)
    repacked_k_id(kind, w.reshape((1,) + w.shape), yq, yd, ysub, gemm, rows, rows, np.array([0, R]),
                  np.zeros(1, np.int64), out, table)


@jit()
def _q8_k_gemv_inputs(kind, x):
    """Every row of ``x`` (R, K) through ``from_float`` = ``quantize_row_q8_K_ref``: (yq, yd, ys) for the gemv,
    ``ys`` the sums per weight sub-block (:func:`_sub_sums`)."""
    yq, yd, ysum32, ybs = q8_k_inputs(x)
    return yq, yd, (ysum32 if kind == 0 else ybs)


@jit()
def gemv_k(kind, w, x, out, table):
    """``forward_mul_mat`` for T < 4 (decode), in one compiled call: every row of ``x`` (T, K) quantized by
    ``from_float``, then the gemv of every element; out (T, N)."""
    yq, yd, ys = _q8_k_gemv_inputs(kind, x)
    repacked_k_rows(kind, w, yq, yd, ys, np.zeros(x.shape[0], np.bool_), out, table)


@jit()
def gemv_k_id(kind, w, x, ids, n_x, out, table):
    """``forward_mul_mat_id`` in one compiled call: ``x`` (T·n_x, K) every row through ``from_float``, the slots
    grouped by expert (:func:`slot_groups`), one gemv per routed (t, s); out (T·n_used, N)."""
    yq, yd, ys = _q8_k_gemv_inputs(kind, x)
    order, bounds, experts, arow = slot_groups(ids, n_x)  # ggml groups the routed rows by expert
    repacked_k_id(kind, w, yq, yd, ys, np.zeros(x.shape[0], np.bool_), arow, order, bounds, experts, out, table)


def _check_path(qtype, path):
    lanes(path)
    qtype = _qt(qtype)
    if qtype not in REPACK_K:
        raise ValueError(f"repacked K-quant emulation: {qtype.name} is not emulated")
    if path.startswith("arm64"):  # AArch64 has its own kernels (8x4 / 8x8): kernels.ggml.repack_arm_k
        raise ValueError(f"repacked K-quant emulation: the x86 kernels of {qtype.name} are not those of {path}")
    if path not in REPACK_K_PATHS[qtype]:
        raise ValueError(f"llama.cpp does not repack {qtype.name} on the {path} path")
    return qtype


def _sub_sums(bsums, qtype):
    """Q8_K bsums (R, K/16) -> sums per weight sub-block: (R, K/32) for Q4_K (``_mm_hadd_epi16``), as is for Q2_K."""
    return pair_sums(bsums) if qtype == QT.Q4_K else bsums.astype(np.int64)  # (R, K/32) or (R, K/16)


def mul_mat_repacked_k(w_bytes: np.ndarray, qtype, x: np.ndarray, path: str) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` with ``W`` in the CPU_REPACK buffer: ``w_bytes`` (N, row bytes) plain GGUF rows
    (N % 8 == 0), ``x`` (T, K) float32 -> (T, N) float32."""
    qtype = _check_path(qtype, path)
    x = np.ascontiguousarray(x, np.float32)
    w = np.ascontiguousarray(w_bytes, np.uint8)
    T, K = x.shape
    rb = K // 256 * BLOCK_BYTES[qtype]
    if w.ndim != 2 or w.shape[0] % 8 or K % 256 or w.shape[1] != rb:
        raise ValueError(f"weights must be (N % 8 == 0, {rb}) bytes, got {w.shape}")
    g = T - T % 4  # rows quantized by ggml_quantize_mat_q8_K_4x8 and run through the gemm
    out = np.empty((T, w.shape[0]), np.float32)
    if g == 0:  # T < 4 (decode): every row through from_float and the gemv
        gemv_k(KIND[qtype], w, x, out, F16_TO_F32)
    else:
        yq, yd, bs = q8_k_mat_inputs(x, g)
        repacked_k_rows(KIND[qtype], w, yq, yd, _sub_sums(bs, qtype), np.arange(T) < g, out, F16_TO_F32)
    return out


def mul_mat_id_repacked_k(w_bytes: np.ndarray, qtype, x: np.ndarray, ids: np.ndarray, path: str) -> np.ndarray:
    """``ggml_mul_mat_id(W, x, ids)`` with ``W`` (E, N, row bytes) repacked: ``x`` (T, n_x, K) float32 (``n_x``
    = 1 or n_used), ``ids`` (T, n_used) -> (T, n_used, N); slot ``s`` of token ``t`` is the gemv of
    ``W[ids[t, s]]`` with ``quantize_row_q8_K_ref(x[t, s % n_x])``."""
    qtype = _check_path(qtype, path)
    x = np.ascontiguousarray(x, np.float32)
    w = _bytes(w_bytes)  # read-only: a mapped stack and a streamed one share one compiled kernel
    ids = np.asarray(ids, np.int32)
    T, n_x, K = x.shape
    E, N = w.shape[:2]
    if ids.shape[0] != T or (ids < 0).any() or (ids >= E).any() or N % 8:
        raise ValueError(f"ids must be (T={T}, n_used) in [0, {E}) and N % 8 == 0, got {ids.shape}, N={N}")
    out = np.empty((T, ids.shape[1], N), np.float32)
    gemv_k_id(KIND[qtype], w, x.reshape(T * n_x, K), ids, n_x, out.reshape(-1, N), F16_TO_F32)
    return out


__all__ = ["REPACK_K", "REPACK_K_PATHS", "mul_mat_repacked_k", "mul_mat_id_repacked_k", "quantize_q8_k_4x8"]
