"""Bit-exact emulation of ``ggml_compute_forward_flash_attn_ext_tiled`` (ggml-cpu/ops.cpp), the flash-attention
path of ≥ 64 query rows (a prompt ubatch) with K and V both F16 or both F32.

Rows are processed in tiles of up to ``Q_TILE_SZ = GGML_FA_TILE_Q = 64`` consecutive query rows of one head
(a tile never crosses a head nor a thread chunk), cells in tiles of ``KV_TILE_SZ = GGML_FA_TILE_KV = 64``.
Per KV tile, for each query row of the Q tile (ops.cpp l. 9224-9330)::

    KQ  = simd_gemm(Q, K)        # Q in F32 (NOT rounded to F16 here), K converted to F32 (exact)
    KQ  = KQ*scale; KQ[cells past n_kv] = -inf; KQ += mask
    mx  = max(KQ row)            # ggml_vec_max_f32: scalar MAX (vmaxss), in order
    if mx == -inf: the row's probabilities are 0 for this tile (row skipped)
    M'  = fmaxf(M, mx); if M' > M: ms = expf(M - M'); VKQ *= ms; S *= ms
    S   = (float)((double)S + ggml_vec_soft_max_f32(64, KQ row, M'))   # P = exp(KQ - M') in place
    VKQ = simd_gemm(P, V) accumulated into VKQ (F32; V converted to F32)
  out = VKQ * (S == 0 ? 0 : 1/S)

``simd_gemm`` (ggml-cpu/simd-gemm.h) computes each output element as one chain of FMAs over the inner index
in order, starting from the existing C: ``C[i,j] = fma(A[i,kk], B[kk,j], C[i,j])`` for kk = 0, 1, … — the
register blocking (GEMM_RM × GEMM_RN, masked tail) changes only which elements are computed together, so
both GEMMs are ISA-independent. ISA-dependent is ``ggml_vec_soft_max_f32`` (vec.cpp, :mod:`kernels.ggml.vec` —
the same function soft_max calls): blocks of 16 (AVX-512) or 8 (AVX2) values through ``ggml_v_expf`` (vec.h,
a different polynomial evaluation and scaling on each ISA), each block summed across lanes in float and
added to a double sum; 64 is a multiple of both, so the libm-``expf`` tail is never used.

Masked cells are not skipped one by one as in the one-row path: their probability is ``v_expf(-inf) = 0``
and the V GEMM adds ``0·V``. A KV tile is skipped for the whole Q tile only when every mask entry of all its
rows is -inf (``can_skip``); otherwise a row with no visible cell in it also adds ``0·V`` (its KQ row is
zeroed). With finite V this changes no bit; an inf or NaN in V makes ``0·inf = NaN`` reach rows that cannot
see that cell — which rows depends on where Q tiles are cut, i.e. on ``n_threads``, which only decides the
row chunks ``[ir0, ir1)`` (tests/test_ggml_ops_attn.py: test_tiled_inf_v_depends_on_threads). Stale V rows
of an earlier KV tile (the last tile's padding) enter the same way. All of this is emulated as ggml does it;
with finite inputs the tiled result does not depend on n_threads.

AArch64 (``lanes`` = :data:`kernels.ggml.simd.NEON`): ``simd_gemm`` is the same FMA chains (``GEMM_RM = GEMM_RN = 2``:
GCC does not define ``__ARM_NEON__``; the scalar tail columns are ``fmadd`` chains and never run, DV being a multiple
of 4 here), soft_max NEON blocks of 4, ``fmaxf`` GCC's inlined ``fmaxnm`` (:func:`fmax_path`), ``expf`` AArch64 glibc's.
The SVE library at 256 bits (``lanes`` = :data:`kernels.ggml.isa.SVE256`): simd-gemm.h is off under SVE (its scalar
loops: the same FMA chains), soft_max SVE's blocks of 8 lanes with a FADDV of 8 (:mod:`kernels.ggml.sve`), the rest
as NEON's; at 128 bits its soft_max is NEON's bits (16 whole blocks, FADDV = ``vaddvq_f32``): ``lanes`` NEON.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.base.flags import jit
from kernels.ggml.libm import GLIBC_AARCH64, GLIBC_X86_64, expf_on, fmaxf
from kernels.ggml.simd import NEON, SVE256, f32_bits, fma32
from kernels.ggml.vec import vec_max_f32, vec_soft_max_f32

NINF = np.float32(-np.inf)
Q_TILE_SZ = 64  # ggml-cpu/common.h GGML_FA_TILE_Q
KV_TILE_SZ = 64  # GGML_FA_TILE_KV


@jit()
def fmax_path(a, b, neon):
    """``fmaxf(a, b)`` as the build computes it: glibc's on x86 (:func:`kernels.ggml.libm.fmaxf`); on AArch64 GCC
    inlines it as ``fmaxnm`` — the number when one operand is NaN, ``+0`` for ``(+0, -0)`` in either order."""
    if not neon:
        return fmaxf(a, b)
    if a != a:
        return b
    if b != b or a > b:
        return a
    if a == b and f32_bits(a) == 0:  # a == +0, b == ±0
        return a
    return b


@jit()
def _tile(q, k, v, mask, has_mask, scale, lanes, fused, h, kvh, iq1, rows, out, K_f32, V32, KQ, VKQ, S, M):
    """One Q tile: query rows iq1 … iq1+rows-1 of head h (KV head kvh). The buffers are ggml's per-thread
    scratch; K_f32 and V32 are zeroed once per Q tile, as in the C, so the last KV tile's padding reads the
    previous tile's rows (multiplied by probability 0). ``fused`` False: ggml's generic build, whose scalar
    ``simd_gemm`` rounds each product before adding it."""
    DK = q.shape[2]
    DV = v.shape[2]
    n_kv = k.shape[1]
    for tq in range(rows):
        S[tq] = np.float32(0.0)
        M[tq] = NINF
        for d in range(DV):
            VKQ[tq, d] = np.float32(0.0)
    K_f32[:, :] = np.float32(0.0)
    V32[:, :] = np.float32(0.0)
    for ic in range(0, n_kv, KV_TILE_SZ):
        kv_tile = min(KV_TILE_SZ, n_kv - ic)
        if has_mask:  # can_skip: every mask entry of the tile's rows is -inf
            can_skip = True
            for tq in range(rows):
                for tk in range(kv_tile):
                    if mask[iq1 + tq, ic + tk] != NINF:
                        can_skip = False
            if can_skip:
                continue
        for tk in range(kv_tile):
            for dk in range(DK):
                K_f32[dk, tk] = k[kvh, ic + tk, dk]
        for tq in range(rows):
            row = KQ[tq]
            for tk in range(KV_TILE_SZ):
                if tk >= kv_tile:
                    row[tk] = NINF  # padded KQ entries
                    continue
                acc = np.float32(0.0)  # simd_gemm(KQ, Q, K_f32, …): KQ was memset to 0
                for dk in range(DK):
                    if fused:
                        acc = fma32(q[h, iq1 + tq, dk], K_f32[dk, tk], acc)
                    else:
                        acc = np.float32(acc + np.float32(q[h, iq1 + tq, dk] * K_f32[dk, tk]))
                acc = np.float32(acc * scale)  # ggml_vec_scale_f32(Q_TILE_SZ*KV_TILE_SZ, KQ, scale)
                if has_mask:  # ggml_vec_add_f32(tile_rows*KV_TILE_SZ, KQ, KQ, mask32)
                    acc = np.float32(acc + mask[iq1 + tq, ic + tk])
                row[tk] = acc
            tile_max = vec_max_f32(KV_TILE_SZ, row)
            if tile_max == NINF:  # skip[tq]: the row's KQ is zeroed before the V GEMM
                for tk in range(KV_TILE_SZ):
                    row[tk] = np.float32(0.0)
                continue
            m_old = M[tq]
            m_new = fmax_path(m_old, tile_max, lanes == NEON or lanes == SVE256)  # ARM: fmaxnm
            if m_new > m_old:
                ms = expf_on(np.float32(m_old - m_new), GLIBC_AARCH64 if lanes == NEON or lanes == SVE256 else GLIBC_X86_64)
                for d in range(DV):
                    VKQ[tq, d] = np.float32(VKQ[tq, d] * ms)
                S[tq] = np.float32(S[tq] * ms)
            M[tq] = m_new
            S[tq] = np.float32(np.float64(S[tq]) + vec_soft_max_f32(KV_TILE_SZ, row, row, m_new, lanes))
        for tk in range(kv_tile):  # V tile to F32; rows >= kv_tile keep the previous tile's values
            for d in range(DV):
                V32[tk, d] = v[kvh, ic + tk, d]
        for tq in range(rows):  # simd_gemm(VKQ32, KQ, V32, Q_TILE_SZ, KV_TILE_SZ, DV)
            for d in range(DV):
                acc = VKQ[tq, d]
                for tk in range(KV_TILE_SZ):
                    if fused:
                        acc = fma32(KQ[tq, tk], V32[tk, d], acc)
                    else:
                        acc = np.float32(acc + np.float32(KQ[tq, tk] * V32[tk, d]))
                VKQ[tq, d] = acc
    for tq in range(rows):
        s_inv = np.float32(0.0) if S[tq] == 0 else np.float32(np.float32(1.0) / S[tq])
        for d in range(DV):
            out[iq1 + tq, h, d] = np.float32(VKQ[tq, d] * s_inv)


@jit()
def q_tiles(n_q, n_head, n_threads):
    """(first row, row count) of every Q tile, in ggml's order: the rows ir = iq1 + n_q·iq2 are cut into
    ``nchunk`` chunks of ``dr`` rows (ggml_compute_forward_flash_attn_ext_f16's non-split branch), each chunk
    into tiles of up to Q_TILE_SZ rows that stay within one head (ggml_compute_forward_flash_attn_ext_tiled)."""
    nr = n_q * n_head
    nth_scaled = n_threads * 4  # 4x chunks per thread
    chunk_size = (nr + nth_scaled - 1) // nth_scaled
    nchunk = (nr + chunk_size - 1) // chunk_size
    if n_threads == 1 or nchunk < n_threads:  # (or NUMA)
        nchunk = n_threads
    dr = (nr + nchunk - 1) // nchunk
    first = np.empty(nr, np.int64)
    count = np.empty(nr, np.int64)
    n = 0
    for c in range(nchunk):
        ir = dr * c
        ir1 = min(ir + dr, nr)
        while ir < ir1:
            rows = min(Q_TILE_SZ, ir1 - ir, n_q - ir % n_q)  # tile_rows
            first[n] = ir
            count[n] = rows
            n += 1
            ir += rows
    return first[:n], count[:n]


@jit(parallel=True)
def tiled_rows(q, k, v, mask, has_mask, scale, lanes, fused, n_threads, out):
    """All Q tiles (:func:`q_tiles`); each tile writes its own output rows with its own scratch (ggml's
    per-thread wdata), so the prange split never changes a result."""
    n_head, n_q, DK = q.shape
    group = n_head // k.shape[0]  # rk2 = rv2
    DV = v.shape[2]
    first, count = q_tiles(n_q, n_head, n_threads)
    for t in prange(first.size):
        h = first[t] // n_q
        iq1 = first[t] - h * n_q
        K_f32 = np.empty((DK, KV_TILE_SZ), np.float32)
        V32 = np.empty((KV_TILE_SZ, DV), np.float32)
        KQ = np.empty((Q_TILE_SZ, KV_TILE_SZ), np.float32)
        VKQ = np.empty((Q_TILE_SZ, DV), np.float32)
        S = np.empty(Q_TILE_SZ, np.float32)
        M = np.empty(Q_TILE_SZ, np.float32)
        _tile(q, k, v, mask, has_mask, scale, lanes, fused, h, h // group, iq1, count[t], out, K_f32, V32, KQ, VKQ, S, M)



__all__ = ["tiled_rows", "q_tiles", "fmax_path"]
