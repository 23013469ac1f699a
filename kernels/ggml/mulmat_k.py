"""K-quant weights (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS; activations as Q8_K) in ggml-cpu's ``mul_mat``, bit
for bit.

Two kernels, chosen by the number of activation rows (``tiled/tiled.cpp: ggml_tiled_min_batch``):

* ``T < 8``: ``vec_dot`` per element (``arch/x86/quants.c``, the ``__AVX2__`` branch — the avx512 build has
  no other). Per 256-value super-block the integer dot is kept in 8 int32 lanes, lane ``l`` summing the
  values ``k`` with ``(k % 32) // 4 == l`` (bytes ``4l … 4l+3`` of each 32-byte load, ``maddubs`` +
  ``madd_epi16`` with the sub-block scale), then ``acc[l] = fma(d, float(sumi[l]), acc[l])`` with
  ``d = y.d · fp16(x.d)`` rounded to float32, and ``hsum_float_8(acc)`` at the end. The mins:
  Q4_K keeps 4 float lanes ``acc_m`` (``_mm_fmadd_ps(-y.d·dmin, prod)``, ``prod[i]`` = mins of sub-blocks
  2i, 2i+1 times their Q8 sums), reduced ``(m0+m2) + (m1+m3)`` and added last; Q5_K folds them into one
  scalar ``summs = fma(dmin, float(Σ mins·sums), summs)`` (``vfmadd231ss`` in both builds); Q6_K subtracts
  ``32·(bsums[2l]·sc[2l] + bsums[2l+1]·sc[2l+1])`` from lane ``l`` (``q8sclsub``); IQ4_XS multiplies
  through the ``_mm256_sign_epi8`` trick (:func:`kernels.ggml.mulmat._sign_dot`). Q2_K and Q3_K have a scale
  per 16 values (as Q6_K: lane ``l`` of 32-value group ``g`` takes scale ``2g + l // 4``); Q3_K's value is
  ``(low2 | hbit << 2) - 4`` (``maddubs(low) - maddubs(4·!hbit)``, exact), Q2_K's the 2-bit code, and Q2_K
  puts its mins into the same ``acc`` first: ``acc[l] = fma(-y.d·fp16(x.dmin), float(mn[2l]·bsum[2l] +
  mn[2l+1]·bsum[2l+1]), acc[l])`` (``madd_epi16(mins, bsums)``), then ``acc[l] = fma(d, float(sumi[l]), acc[l])``.
* ``T >= 8``: the tiled kernel (``tiled_run_microtile``: AVX512-VNNI ``tiled_run_micro_vnni_8x16`` on
  avx512, ``tiled_run_microtile_avx2`` on avx2). Per super-block (a 256-K "slab") it forms the exact
  integers ``s1 = Σ_s scale_s·(Σ w·q8)`` and (Q2_K, Q4_K, Q5_K) ``s2 = Σ_s min_s·Σ q8``, then
  ``res = fp16(x.d)·float(s1)``; ``res = fma(-fp16(x.dmin), float(s2), res)``; ``acc = fma(res, y.d, acc)``
  — the last an explicit ``_mm256_fmadd_ps`` on avx2 and GCC's contraction of
  ``_mm512_add_ps(acc, _mm512_mul_ps(res, d1))`` on avx512 (disassembly: ``vfmadd213ps``). The slabs go
  in K order into one accumulator per element whatever the window (narrow ``num_k > 1`` or standard),
  chunking or thread count, so neither changes a bit. ``w`` is the signed weight value (``q - 32`` for
  Q6_K, ``q - 4`` for Q3_K, the ``kvalues_iq4nl`` entry for IQ4_XS; tiled.cpp's instantiations
  ``<16, true, 0>`` for Q2_K and ``<16, false, 4, ACTBIAS>`` for Q3_K); VNNI's ``dpbusd`` on ``w + BIAS``
  minus ``BIAS·bsum`` is exact, while avx2's IQ4_XS path uses the sign trick — the same integers, since
  ``quantize_row_q8_K_ref`` never produces a -128 (``nearest_int`` of a NaN is >= 0, finite values stay
  within ±127).

Weights are decoded one row at a time inside the kernels (:func:`decode_row`: per-value integers ``q`` —
unsigned codes, IQ4_XS table values, Q3_K signed values —, per-sub-block ``sc`` and ``mn``, the fp16
super-block scales as float32, converted like ``vcvtph2ps``) — except Q4_K's and Q6_K's codes, whose integer dots
:mod:`kernels.ggml.rows_k_ir` forms from the row bytes as vector IR (the same integers).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.base.block import QT
from kernels.base.flags import SERIAL_BELOW, jit, per_type
from kernels.ggml.actquant import _quantize_rows_q8_k
from kernels.ggml.mulmat_q8 import _bytes, _qt, slot_groups
from kernels.ggml.rows_k_ir import q4_k_lanes, q4_k_total, q6_k_fma, q6_k_lanes
from kernels.ggml.simd import dot32_lanes, fma32, hsum_fold, lanes
from kernels.ggml.vecmath import F16_TO_F32, fp16_at
from kernels.plain.dequant import IQ4NL_VALUES, k_scale_min

TILED_TYPES = frozenset({QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS, QT.IQ2_XXS, QT.IQ2_XS,
                         QT.IQ2_S, QT.IQ3_XXS, QT.IQ3_S, QT.IQ1_S, QT.IQ1_M})  # tiled.cpp: ggml_tiled_supported
TILED_MIN_ROWS = 8  # ggml_tiled_min_batch
KQUANT_TYPES = frozenset({QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS})  # emulated here
KIND = {QT.Q4_K: 0, QT.Q5_K: 1, QT.Q6_K: 2, QT.IQ4_XS: 3, QT.Q2_K: 4, QT.Q3_K: 5}
IQ4NL = IQ4NL_VALUES.astype(np.int64)
ROWS = 64  # weight rows per work item of the parallel vec_dot (an expert's 2048 down rows: 32 items)


# --------------------------------------------------------------------------------------------
# Weight rows: bytes -> integers and scales


@jit()
def decode_row(kind, w, q, sc, mn, d, dmin, table, codes=True):
    """One weight row's bytes ``w`` -> ``q`` (K,) integer values (unsigned codes; IQ4_XS: table values; Q3_K:
    signed ``code - 4``), ``sc`` (K/32 or K/16) scales, ``mn`` (as many) mins, ``d`` / ``dmin`` (K/256) fp16 scales
    as float32. ``codes=False`` (Q4_K, Q6_K): the scales alone, ``q`` untouched."""
    for b in range(d.shape[0]):
        if kind == 0 or kind == 1:  # Q4_K / Q5_K: d, dmin, scales[12], (Q5_K: qh[32]), qs[128]
            o = (144 if kind == 0 else 176) * b
            d[b] = fp16_at(w, o, table)
            dmin[b] = fp16_at(w, o + 2, table)
            for j in range(8):
                sc[8 * b + j], mn[8 * b + j] = k_scale_min(w, o + 4, j)
            if not codes:
                continue
            qo = o + (16 if kind == 0 else 48)
            qh = w[o + 16:o + 48]  # Q5_K's fifth bits (views: the loops below vectorize)
            for c in range(4):  # 32 bytes: low nibbles = values 64c + l, high nibbles = 64c + 32 + l
                qs = w[qo + 32 * c:qo + 32 * c + 32]
                qd = q[256 * b + 64 * c:256 * b + 64 * c + 64]
                for l in range(32):
                    byte = np.int32(qs[l])
                    lo, hi = byte & 15, byte >> 4
                    if kind == 1:  # fifth bit: bit 2c (low) / 2c+1 (high) of qh[l]
                        lo |= ((np.int32(qh[l]) >> (2 * c)) & 1) << 4
                        hi |= ((np.int32(qh[l]) >> (2 * c + 1)) & 1) << 4
                    qd[l] = lo
                    qd[l + 32] = hi
        elif kind == 2:  # Q6_K: ql[128], qh[64], scales[16] int8, d; half h, value 128h + 32r + l
            o = 210 * b
            d[b] = fp16_at(w, o + 208, table)
            for j in range(16):
                v = np.int64(w[o + 192 + j])
                sc[16 * b + j] = v - 256 if v > 127 else v
            if not codes:
                continue
            for h in range(2):
                ql = w[o + 64 * h:o + 64 * h + 64]  # views: the loop below vectorizes
                qh = w[o + 128 + 32 * h:o + 160 + 32 * h]
                qd = q[256 * b + 128 * h:256 * b + 128 * h + 128]
                for l in range(32):
                    ql0, ql1, qhl = np.int32(ql[l]), np.int32(ql[l + 32]), np.int32(qh[l])
                    qd[l] = (ql0 & 15) | ((qhl & 3) << 4)
                    qd[l + 32] = (ql1 & 15) | (((qhl >> 2) & 3) << 4)
                    qd[l + 64] = (ql0 >> 4) | (((qhl >> 4) & 3) << 4)
                    qd[l + 96] = (ql1 >> 4) | (((qhl >> 6) & 3) << 4)
        elif kind == 4:  # Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
            o = 84 * b
            d[b] = fp16_at(w, o + 80, table)
            dmin[b] = fp16_at(w, o + 82, table)
            for s in range(16):
                sc[16 * b + s] = np.int64(w[o + s]) & 15
                mn[16 * b + s] = np.int64(w[o + s]) >> 4
            for n in range(2):  # value 128n + 32j + l: bits 2j of qs[32n + l]
                for j in range(4):
                    for l in range(32):
                        q[256 * b + 128 * n + 32 * j + l] = (np.int64(w[o + 16 + 32 * n + l]) >> (2 * j)) & 3
        elif kind == 5:  # Q3_K: hmask[32], qs[64], scales[12] (6-bit, kmask decode), d
            o = 110 * b
            d[b] = fp16_at(w, o + 108, table)
            for i in range(4):
                a0, a1, a2 = np.int64(w[o + 96 + i]), np.int64(w[o + 100 + i]), np.int64(w[o + 104 + i])
                sc[16 * b + i] = ((a0 & 15) | ((a2 & 3) << 4)) - 32
                sc[16 * b + 4 + i] = ((a1 & 15) | (((a2 >> 2) & 3) << 4)) - 32
                sc[16 * b + 8 + i] = ((a0 >> 4) | (((a2 >> 4) & 3) << 4)) - 32
                sc[16 * b + 12 + i] = ((a1 >> 4) | (((a2 >> 6) & 3) << 4)) - 32
            for n in range(2):  # value 128n + 32j + l: (bits 2j of qs[32n + l]) | (bit 4n + j of hmask[l]) << 2
                for j in range(4):
                    for l in range(32):
                        low = (np.int64(w[o + 32 + 32 * n + l]) >> (2 * j)) & 3
                        high = (np.int64(w[o + l]) >> (4 * n + j)) & 1
                        q[256 * b + 128 * n + 32 * j + l] = (low | (high << 2)) - 4
        else:  # IQ4_XS: d, scales_h u16, scales_l[4], qs[128]; block j: low nibbles 32j + l, high 32j + 16 + l
            o = 136 * b
            d[b] = fp16_at(w, o, table)
            sh = np.int64(w[o + 2]) | (np.int64(w[o + 3]) << 8)
            for j in range(8):
                sl = (np.int64(w[o + 4 + j // 2]) >> (4 * (j % 2))) & 15
                sc[8 * b + j] = (sl | (((sh >> (2 * j)) & 3) << 4)) - 32
                for l in range(16):
                    byte = np.int64(w[o + 8 + 16 * j + l])
                    q[256 * b + 32 * j + l] = IQ4NL[byte & 15]
                    q[256 * b + 32 * j + 16 + l] = IQ4NL[byte >> 4]


# --------------------------------------------------------------------------------------------
# vec_dot (T < 8)


@jit()
def _prod(w, y, sign_trick):
    """One value product of the integer dot: plain, or through ``_mm256_sign_epi8`` (IQ4_XS)."""
    if sign_trick:
        if w >= 0:
            return w * y
        return -w * (y if y == -128 else -y)
    return w * y


@jit()
def _superblock_lanes(v, q, y, sc, b, sub):
    """``v`` (8,) int32 := super-block ``b``'s integer dot in ggml's 8 lanes: lane ``l`` sums bytes 4l … 4l+3 of
    each of the 8 32-byte loads (value 32g + k of the super-block is byte k of load g) times the sub-block scale
    ``sc`` (a scale per ``sub`` = 32 or 16 values), one :func:`kernels.ggml.simd.dot32_lanes` per load; ``q``, ``y``
    int32 (K,). Integers, exact: any order."""
    v[:] = np.int32(0)
    for g in range(8):
        o = 256 * b + 32 * g
        if sub == 32:
            dot32_lanes(v, q, o, y, o, sc[8 * b + g], sc[8 * b + g])
        else:
            dot32_lanes(v, q, o, y, o, sc[16 * b + 2 * g], sc[16 * b + 2 * g + 1])


@per_type
def _vec_dot_for(qt, parallel):
    """:func:`vec_dot_k_id` compiled for one weight type (``kind`` a compile-time constant, so the per-type
    branches fold and the integer loops vectorize), serial or (``parallel``) with ``prange`` over its
    (expert group, ``ROWS`` weight rows) items — one region per call; each output element one item's, computed
    in one order, so the thread count changes no bit."""
    kind = KIND[QT(qt)]

    @jit(kind=qt, parallel=parallel, variant="parallel" if parallel else "")
    def _vec_dot_k_id(w, yq, yd, ysum32, ybs16, arow, order, bounds, experts, out, table):
        K = yq.shape[1]
        nb = K // 256
        sub = 32 if kind <= 1 or kind == 3 else 16
        from_bytes = kind == 0 or kind == 2  # Q4_K, Q6_K: the codes' dots read the row bytes (kernels.ggml.rows_k_ir)
        # (T, K): the Q8_K quants widened once for the int32 dots; (T, 0) where the row bytes are read
        y = np.empty((yq.shape[0], 0), np.int32) if from_bytes else yq.astype(np.int32)
        if w.strides[2] != 1:  # kernels.ggml.rows_k_ir reads each weight row as contiguous bytes
            raise ValueError("the weight rows must be contiguous")
        nt = (w.shape[1] + ROWS - 1) // ROWS
        for item in prange(experts.shape[0] * nt):
            # int32 buffers: every integer here is one of ggml's int32 lanes (exact, no wrap)
            q, sc, mn = np.empty(K, np.int32), np.empty(K // sub, np.int32), np.zeros(K // sub, np.int32)
            d, dmin = np.empty(nb, np.float32), np.zeros(nb, np.float32)
            v = np.empty(8, np.int32)  # the 8 int32 lanes of a super-block's integer dot
            acc = np.empty(8, np.float32)
            acc_m = np.empty(4, np.float32)
            sumi = np.empty(8, np.int64)
            grp, r0 = item // nt, ROWS * (item % nt)
            orow = order[bounds[grp]:bounds[grp + 1]]
            for r in range(r0, min(r0 + ROWS, w.shape[1])):
                wr = w[experts[grp], r]
                if kind == 2:  # Q6_K: its d alone (q6_k_fma reads the scales from the bytes)
                    for b in range(nb):
                        d[b] = fp16_at(wr, 210 * b + 208, table)
                else:
                    decode_row(kind, wr, q, sc, mn, d, dmin, table, not from_bytes)
                for j in range(orow.shape[0]):
                    t = arow[orow[j]]
                    yt = y[t]
                    acc[:] = np.float32(0.0)
                    acc_m[:] = np.float32(0.0)
                    summs = np.float32(0.0)
                    for b in range(nb):
                        if kind == 3:
                            db = d[b] * yd[t, b]  # GGML_CPU_FP16_TO_FP32(x.d) * y.d
                        else:
                            db = yd[t, b] * d[b]  # y.d * GGML_CPU_FP16_TO_FP32(x.d)
                        if kind == 4:  # Q2_K: acc = fmadd(dmin, cvtepi32_ps(madd_epi16(mins, bsums)), acc), first
                            dm = -yd[t, b] * dmin[b]
                            for lane in range(8):
                                g = 16 * b + 2 * lane
                                p = (np.int64(mn[g]) * np.int64(ybs16[t, g])
                                     + np.int64(mn[g + 1]) * np.int64(ybs16[t, g + 1]))
                                acc[lane] = fma32(dm, np.float32(p), acc[lane])
                        # the 8 int32 lanes (_superblock_lanes); IQ4_XS through the _mm256_sign_epi8 trick, lane by lane
                        if kind == 3:
                            v[:] = np.int32(0)
                            for g in range(8):
                                o = 256 * b + 32 * g
                                for lane in range(8):
                                    for i in range(4):
                                        k = o + 4 * lane + i
                                        v[lane] = np.int32(v[lane] + np.int32(_prod(q[k], yt[k], True) * sc[8 * b + g]))
                        elif kind == 0:  # the nibbles' lanes straight from the row bytes (vector IR)
                            lv = q4_k_lanes(wr, 144 * b + 16, yq[t], 256 * b, sc, 8 * b, 4)
                            for lane in range(8):
                                v[lane] = lv[lane]
                        elif kind == 2:  # the lanes, q8sclsub and the FMA straight from the row bytes
                            q6_k_fma(wr, 210 * b, yq[t], 256 * b, ybs16[t], 16 * b, db, acc)
                            continue
                        else:
                            _superblock_lanes(v, q, yt, sc, b, sub)
                        for lane in range(8):
                            sumi[lane] = np.int64(v[lane])
                        if kind == 2:  # q8sclsub = (bsums · scales pairwise) << 5
                            for lane in range(8):
                                g = 16 * b + 2 * lane
                                sumi[lane] -= 32 * (np.int64(ybs16[t, g]) * sc[g]
                                                    + np.int64(ybs16[t, g + 1]) * sc[g + 1])
                        for lane in range(8):
                            acc[lane] = fma32(db, np.float32(sumi[lane]), acc[lane])  # _mm256_fmadd_ps
                        if kind <= 1:
                            dm = -yd[t, b] * dmin[b]  # -y.d * GGML_CPU_FP16_TO_FP32(x.dmin)
                            if kind == 0:  # acc_m = _mm_fmadd_ps(dmin, cvtepi32_ps(prod), acc_m)
                                for i in range(4):
                                    s = 8 * b + 2 * i
                                    p = mn[s] * ysum32[t, s] + mn[s + 1] * ysum32[t, s + 1]
                                    acc_m[i] = fma32(dm, np.float32(p), acc_m[i])
                            else:  # summs += dmin * hsum(prod), contracted to vfmadd231ss
                                p = np.int64(0)
                                for s in range(8 * b, 8 * b + 8):
                                    p += mn[s] * ysum32[t, s]
                                summs = fma32(dm, np.float32(p), summs)
                    res = hsum_fold(acc, 0, 8)  # hsum_float_8(acc)
                    if kind == 0:
                        res = res + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
                    elif kind == 1:
                        res = res + summs
                    out[orow[j], r] = res

    return _vec_dot_k_id


_QT_OF_KIND = {k: int(q) for q, k in KIND.items()}


def vec_dot_k_id(kind, w, yq, yd, ysum32, ybs16, arow, order, bounds, experts, out, table):
    """``ggml_vec_dot_{q2_K,q3_K,q4_K,q5_K,q6_K,iq4_xs}_q8_K`` (x86 __AVX2__) for every element of ``mul_mat_id``'s
    expert groups: ``w`` (E, N, row bytes); ``yq`` (T, K) / ``yd`` (T, K/256) the Q8_K activations, ``ysum32``
    (T, K/32) / ``ybs16`` (T, K/16) their sums; the output slots ``order[bounds[g]:bounds[g+1]]`` (rows of ``out``
    (slots, N)) through expert ``experts[g]``, slot ``j`` with activation row ``arow[j]``. Split between threads
    at ``SERIAL_BELOW`` multiply-adds."""
    parallel = order.shape[0] * w.shape[1] * yq.shape[1] >= SERIAL_BELOW
    _vec_dot_for(_QT_OF_KIND[kind], parallel)(w, yq, yd, ysum32, ybs16, arow, order, bounds, experts, out, table)


def vec_dot_k_rows(kind, w, yq, yd, ysum32, ybs16, out, table):
    """:func:`vec_dot_k_id` of one group: ``w`` (N, row bytes) times every row of ``yq``; out (T, N)."""
    rows = np.arange(yq.shape[0])
    vec_dot_k_id(kind, w[None], yq, yd, ysum32, ybs16, rows, rows, np.array([0, yq.shape[0]]), np.zeros(1, np.int64),
                 out, table)


# --------------------------------------------------------------------------------------------
# tiled (T >= 8)


def _tiled_for(parallel):
    """:func:`tiled_k_rows` serial or (``parallel``) with ``prange`` over blocks of ``ROWS`` weight rows (each
    output element one block's, in one order: the thread count changes no bit)."""

    @jit(parallel=parallel, variant="parallel" if parallel else "serial")
    def tiled_k_rows(kind, w, yq, yd, ysum32, ybs16, sign_trick, out, table):
        """``tiled_run_microtile`` per element: per slab exact ``s1``, ``s2``, then
        ``acc = fma(fma(-dmin, s2, d·s1), y.d, acc)`` in slab order."""
        K = yq.shape[1]
        nb = K // 256
        sub = 32 if kind <= 1 or kind == 3 else 16
        bias = 32 if kind == 2 else 0  # Q6_K codes are w + 32; IQ4_XS and Q3_K q already hold the signed value
        has_min = kind <= 1 or kind == 4
        from_bytes = kind == 0 or kind == 2  # Q4_K, Q6_K: the codes' dots read the row bytes (kernels.ggml.rows_k_ir)
        # (T, K): the Q8_K quants widened once for the int32 dots; (T, 0) where the row bytes are read
        y = np.empty((yq.shape[0], 0), np.int32) if from_bytes else yq.astype(np.int32)
        if w.strides[1] != 1:  # kernels.ggml.rows_k_ir reads each weight row as contiguous bytes
            raise ValueError("the weight rows must be contiguous")
        for blk in prange((w.shape[0] + ROWS - 1) // ROWS):
            q, sc, mn = np.empty(K, np.int32), np.empty(K // sub, np.int32), np.zeros(K // sub, np.int32)
            d, dmin = np.empty(nb, np.float32), np.zeros(nb, np.float32)
            v = np.empty(8, np.int32)
            for r in range(ROWS * blk, min(ROWS * blk + ROWS, w.shape[0])):
                wr = w[r]
                decode_row(kind, wr, q, sc, mn, d, dmin, table, not from_bytes)
                if not from_bytes:
                    for k in range(K):
                        q[k] -= bias  # the signed weight value w
                for t in range(yq.shape[0]):
                    acc = np.float32(0.0)
                    yt = y[t]
                    for b in range(nb):
                        s1 = np.int64(0)  # Σ_s scale_s·(Σ w·q8): exact integers, so summed in any order
                        if sign_trick:
                            for s in range(256 * b // sub, 256 * (b + 1) // sub):
                                raw = np.int64(0)
                                for k in range(sub * s, sub * s + sub):
                                    raw += _prod(np.int64(q[k]), np.int64(yt[k]), True)
                                s1 += np.int64(sc[s]) * raw
                        elif kind == 0:  # the unsigned nibbles: w = code
                            s1 = np.int64(q4_k_total(wr, 144 * b + 16, yq[t], 256 * b, sc, 8 * b, 4))
                        elif kind == 2:  # w = code - 32: Σ_s sc_s·(Σ code·q8 − 32·bsum_s)
                            lv = q6_k_lanes(wr, 210 * b, yq[t], 256 * b, sc, 16 * b)
                            for lane in range(8):
                                s1 += np.int64(lv[lane])
                            for s in range(16 * b, 16 * b + 16):
                                s1 -= 32 * np.int64(sc[s]) * np.int64(ybs16[t, s])
                        else:
                            _superblock_lanes(v, q, yt, sc, b, sub)
                            for lane in range(8):
                                s1 += np.int64(v[lane])
                        res = d[b] * np.float32(s1)  # _mm*_mul_ps(cvtepi32_ps(s1), d0)
                        if has_min:
                            s2 = np.int64(0)
                            for s in range(256 * b // sub, 256 * (b + 1) // sub):
                                s2 += np.int64(mn[s]) * (ysum32[t, s] if sub == 32 else np.int64(ybs16[t, s]))
                            res = fma32(-dmin[b], np.float32(s2), res)  # _mm*_fnmadd_ps(dmin, s2, res)
                        acc = fma32(res, yd[t, b], acc)  # buf += res * d1 (FMA)
                    out[t, r] = acc

    return tiled_k_rows


_TILED = (_tiled_for(False), _tiled_for(True))


def tiled_k_rows(kind, w, yq, yd, ysum32, ybs16, sign_trick, out, table):
    """The tiled kernel of every element (:func:`_tiled_for`), split between threads at ``SERIAL_BELOW``
    multiply-adds."""
    _TILED[yq.shape[0] * w.shape[0] * yq.shape[1] >= SERIAL_BELOW](kind, w, yq, yd, ysum32, ybs16, sign_trick, out,
                                                                   table)


@jit()
def pair_sums(ybs):
    """Q8_K bsums (T, K/16) -> (T, K/32) int64: the sums per 32 values (``_mm_hadd_epi16`` of neighbours)."""
    out = np.empty((ybs.shape[0], ybs.shape[1] // 2), np.int64)
    for t in range(out.shape[0]):
        for s in range(out.shape[1]):
            out[t, s] = np.int64(ybs[t, 2 * s]) + np.int64(ybs[t, 2 * s + 1])
    return out


@jit()
def q8_k_inputs(x):
    """``quantize_row_q8_K_ref`` of every row of ``x`` (T, K), in one compiled call: (yq (T, K) int8, yd (T, K/256),
    ysum32 (T, K/32) int64 the sums per 32 values (:func:`pair_sums`), ybs (T, K/16) int64 the bsums)."""
    T, K = x.shape
    yq, yd = np.empty((T, K), np.int8), np.empty((T, K // 256), np.float32)
    bs = np.empty((T, K // 16), np.int16)
    _quantize_rows_q8_k(x, yq, yd, bs)
    return yq, yd, pair_sums(bs), bs.astype(np.int64)


def mul_mat_id_k(w_bytes: np.ndarray, qtype, x: np.ndarray, ids: np.ndarray, path: str) -> np.ndarray:
    """``mul_mat_id`` of K-quant experts ``w_bytes`` (E, N, row bytes) in a plain buffer: ``x`` (T, n_x, K),
    ``ids`` (T, n_used) -> (T, n_used, N). Every row of ``x`` quantized once (``from_float`` is per row), the
    groups of fewer than ``TILED_MIN_ROWS`` rows through vec_dot in one compiled call, each larger group through
    the tiled kernel."""
    qtype = _qt(qtype)
    w_bytes = _bytes(w_bytes)  # read-only, as a mapped file's rows: one compiled kernel whoever calls
    T, n_x, K = x.shape
    N = w_bytes.shape[1]
    yq, yd, ysum32, ybs = q8_k_inputs(np.ascontiguousarray(x.reshape(T * n_x, K), np.float32))
    out = np.empty((T * ids.shape[1], N), np.float32)
    order, bounds, experts, arow = slot_groups(ids, n_x)  # ggml groups the rows by expert, token order within one
    sizes = np.diff(bounds)
    small = sizes < TILED_MIN_ROWS
    if small.any():  # the vec_dot groups, kept in order: their slots and bounds
        keep = np.repeat(small, sizes)
        vec_dot_k_id(KIND[qtype], w_bytes, yq, yd, ysum32, ybs, arow, order[keep],
                     np.concatenate([[0], np.cumsum(sizes[small])]), experts[small], out, F16_TO_F32)
    for g in np.flatnonzero(~small).tolist():
        slots = order[bounds[g]:bounds[g + 1]]
        r = arow[slots]
        part = np.empty((len(slots), N), np.float32)
        tiled_k_rows(KIND[qtype], np.ascontiguousarray(w_bytes[experts[g]]), yq[r], yd[r], ysum32[r], ybs[r],
                     qtype == QT.IQ4_XS and lanes(path) == 8, part, F16_TO_F32)
        out[slots] = part
    return out.reshape(T, ids.shape[1], N)


def mul_mat_k(w_bytes: np.ndarray, qtype, x: np.ndarray, path: str, tiled: bool) -> np.ndarray:
    """``mul_mat`` of K-quant rows ``w_bytes`` (N, row bytes) with ``x`` (T, K): the tiled kernel or vec_dot."""
    qtype = _qt(qtype)
    yq, yd, ysum32, ybs = q8_k_inputs(np.ascontiguousarray(x, np.float32))
    out = np.empty((x.shape[0], w_bytes.shape[0]), np.float32)
    w = _bytes(w_bytes)  # read-only, as a mapped file's rows: one compiled kernel whoever calls
    if tiled:
        tiled_k_rows(KIND[qtype], w, yq, yd, ysum32, ybs, qtype == QT.IQ4_XS and lanes(path) == 8, out, F16_TO_F32)
    else:
        vec_dot_k_rows(KIND[qtype], w, yq, yd, ysum32, ybs, out, F16_TO_F32)
    return out
