"""``build_attn_mha`` with flash attention off and an F32 K/V cache, every head in one compiled call, bit for bit.

Per head ``h`` (KV head ``j = h // (H / Hkv)``, ``ggml_mul_mat``'s broadcast) the graph runs three ops, each
computed here by the same kernels the one-op emulations use:

* ``kq = ggml_mul_mat(k, q)``: the permuted Q view is not contiguous, so ``ggml_compute_forward_mul_mat``
  skips llamafile_sgemm and takes ``ggml_vec_dot_f32`` per element (:func:`kernels.ggml.vec.vec_dot_f32`);
* ``ggml_soft_max_ext(kq, mask, scale)`` (:func:`kernels.ggml.vecmath._soft_max_rows`);
* ``kqv = ggml_mul_mat(v_trans, kq)``: ``vec_dot`` per element, or llamafile's ``tinyBLAS`` when
  :func:`kernels.ggml.mulmat.kernel_for` says so (``sgemm``: T ≥ 2 rows, K and N aligned)
  (:func:`kernels.ggml.mulmat_vec.tinyblas_rows`).

``refimpl.graph.attention.attend`` calls op by op for the other configurations (F16 K/V, flash attention).

``lanes`` is the path's vec code (:attr:`kernels.ggml.isa.Simd.code`): 16, 8, or 4 for the AArch64 NEON builds
(``arm64-dotprod`` / ``arm64-i8mm`` / ``arm64-base``: ``ggml_vec_dot_f32``'s 4 × 4 lanes and ``vaddvq_f32``, soft_max's
NEON blocks; no llamafile there, so ``sgemm`` is False; the clang builds: :data:`kernels.ggml.isa.NEON_CLANG`, the
dots' leftovers in clang's blocks of 8, soft_max NEON's; the SVE builds: :data:`kernels.ggml.isa.SVE128` and
:data:`kernels.ggml.isa.SVE256`, SVE's dot at ``svcntw()`` lanes side by side, :func:`kernels.ggml.sve.vec_dot_f32_cols`,
soft_max SVE's blocks) — bit for bit against the ARM builds
(tests/test_ggml_ops_attn_arm64.py: test_attention_without_flash). :func:`attend_f32` lays out the cache for it and
swaps an AArch64 path's default NaN around it (:func:`kernels.ggml.isa.nan_swap`: every op here adds, multiplies,
compares, exponentiates and propagates NaNs); :data:`PATHS`: the paths whose graph takes it
(``refimpl.graph.attention.attend``).
"""

from __future__ import annotations

import numpy as np

from numba import prange

from kernels.base.flags import SERIAL_BELOW, jit
from kernels.base.blocks import QT
from kernels.ggml import mulmat, sve
from kernels.ggml.isa import SIMD, SVE128, SVE256, nan_swap, simd
from kernels.ggml.mulmat_vec import F32_ROWS, tinyblas_rows
from kernels.ggml.vec import cols_fit, vec_dot_f32, vec_dot_f32_cols
from kernels.ggml.vecmath import _soft_max_rows, cast_f16_to_f32


#: the paths whose F32-cache heads run here: every path with ggml's vector code (not x86's generic build), each
#: tested against its library (tests/test_ggml_ops_attn_arm64.py)
PATHS = tuple(key for key, s in SIMD.items() if s.code is not None)


def attend_f32(q, k, v, n_used, mask, scale, path, n_threads: int = 1):
    """``build_attn_mha`` of ``q`` [T, H, D] over the KV view ``k``, ``v`` [Hkv, n_kv, D] float32 (the cells from
    ``n_used`` on +0), ``mask`` [T, n_kv] float16, ``scale`` float32 on ``path`` (one of :data:`PATHS`) -> [T, H, D];
    K·Q: src1 = the permuted Q view is not contiguous and needs no conversion to F32, so
    ``ggml_compute_forward_mul_mat`` skips llamafile_sgemm (it needs src1_cont) and takes vec_dot per element.
    The heads are split between ``n_threads`` threads from ``flags.SERIAL_BELOW`` multiply-adds (no bit depends on it)."""
    T, H, D = q.shape
    Hkv, n_kv = k.shape[0], k.shape[1]
    q, k, v = (nan_swap(path, x) for x in (np.ascontiguousarray(q), k, v))  # AArch64's default NaN as x86's
    L = simd(path, "build_attn_mha").code  # the vec code (NEON_CLANG: clang's blocks of 8 in the dots' leftovers)
    sgemm = mulmat.kernel_for(QT.F32, path, T, D, n_kv) == "sgemm"  # kqv's kernel: [D, n_kv] times p [T, n_kv]
    kq_cols, pv_cols = layouts(D, n_kv, L, sgemm)  # the layouts its products read (the rest: empty)
    none = np.zeros((Hkv, 0, 0), dtype=np.float32)
    kt = np.zeros((Hkv, D, n_kv), dtype=np.float32) if kq_cols else none  # [Hkv, D, n_kv]: K transposed
    if kq_cols:
        kt[:, :, :n_used] = k[:, :n_used].transpose(0, 2, 1)
    vt = none if pv_cols else np.ascontiguousarray(v.transpose(0, 2, 1))  # [Hkv, D, n_kv]: the transposed V cache
    o = np.empty((T, H, D), dtype=np.float32)
    args = (q, none if kq_cols else k, kt, v, vt, cast_f16_to_f32(mask), scale, L, simd(path).expf, sgemm)
    if n_threads > 1 and H > 1 and H * T * n_kv * 2 * D >= SERIAL_BELOW:  # K·Q and P·V of every cell
        attn_heads_f32_parallel(*args, min(int(n_threads), H), o)
    else:
        attn_heads_f32(*args, 0, H, o)
    return nan_swap(path, o)


@jit()
def attn_heads_f32(q, k, kt, v, vt, mask, scale, lanes, expf, sgemm, h0, h1, out):
    """Heads ``h0 … h1 - 1`` of ``q`` [T, H, D], the KV view as ``k`` [Hkv, n_kv, D] or ``kt`` [Hkv, D, n_kv] (K
    transposed: the cells side by side) and ``v`` [Hkv, n_kv, D] or ``vt`` [Hkv, D, n_kv] (the transposed V cache),
    ``mask`` [T, n_kv] float32, ``scale`` float32, ``lanes`` the path's vec code, ``expf`` its soft_max code
    (:attr:`kernels.ggml.isa.Simd.expf`), ``sgemm`` whether kqv takes tinyBLAS -> ``out[:, h0:h1]`` of [T, H, D].
    Where a dot's length is a whole number of ``GGML_F32_STEP``s (:func:`kernels.ggml.vec.cols_fit`) the
    ``vec_dot_f32``s of a row of scores, or of a head's outputs, run together across the cells or the outputs
    (:func:`kernels.ggml.vec.vec_dot_f32_cols`, the same bits), from ``kt`` / ``v``; otherwise one by one from
    ``k`` / ``vt``. ``v`` is always given; of ``k``, ``kt``, ``vt`` the caller passes the ones :func:`layouts` says
    are read (the others may be empty). Its own scratch: the heads of one call are one thread's."""
    T, H, D = q.shape
    Hkv, n_kv = v.shape[0], v.shape[1]
    group = H // Hkv
    acc = np.empty((4, 16), np.float32)  # vec.dot_scratch: the accumulators of vec_dot_f32
    acc_cols = np.empty((4, 16, max(n_kv, D)), np.float32)  # SVE at 256 bits: 8 accumulators × 8 lanes
    kq = np.empty((1, T, n_kv), np.float32)  # [1, T, n_kv]: one head's scores
    p = np.empty((1, T, n_kv), np.float32)  # [1, T, n_kv]: its probabilities
    m = mask.reshape(1, T, n_kv)
    mask_of = np.zeros(1, np.int64)
    o = np.empty((T, D), np.float32)  # [T, D]: one head's output
    kq_cols, pv_cols = layouts(D, n_kv, lanes, sgemm)
    for h in range(h0, h1):
        j = h // group
        for t in range(T):
            if kq_cols and (lanes == SVE128 or lanes == SVE256):  # ggml_vec_dot_f32 per cell, SVE's
                sve.vec_dot_f32_cols(D, kt[j], q[t, h], acc_cols, kq[0, t], sve.svcntw(lanes))
            elif kq_cols:
                vec_dot_f32_cols(D, kt[j], q[t, h], lanes, acc_cols, kq[0, t])  # ggml_vec_dot_f32 per cell
            else:
                for c in range(n_kv):
                    kq[0, t, c] = vec_dot_f32(D, k[j, c], q[t, h], lanes, acc)  # ggml_vec_dot_f32, one element
        _soft_max_rows(kq, m, mask_of, True, scale, expf, p)  # ggml_soft_max_ext(kq, mask, scale)
        if sgemm:
            tinyblas_rows(vt[j], p[0], o, lanes, lanes, False)
        elif pv_cols and (lanes == SVE128 or lanes == SVE256):
            for t in range(T):  # ggml_vec_dot_f32 per output, SVE's
                sve.vec_dot_f32_cols(n_kv, v[j], p[0, t], acc_cols, o[t], sve.svcntw(lanes))
        elif pv_cols:
            for t in range(T):
                vec_dot_f32_cols(n_kv, v[j], p[0, t], lanes, acc_cols, o[t])  # ggml_vec_dot_f32 per output
        else:
            F32_ROWS(vt[j], p[0], o, lanes)  # mulmat_vec.vec_dot_float_rows, F32
        out[:, h, :] = o


@jit(parallel=True)
def attn_heads_f32_parallel(q, k, kt, v, vt, mask, scale, lanes, expf, sgemm, n_chunks, out):
    """:func:`attn_heads_f32` with the heads in ``n_chunks`` runs, one per thread (as ggml's threads split each op's
    rows; every head computed by one thread in the same order, so the split never changes a bit)."""
    H = q.shape[1]
    per = (H + n_chunks - 1) // n_chunks
    for c in prange(n_chunks):
        attn_heads_f32(q, k, kt, v, vt, mask, scale, lanes, expf, sgemm, c * per, min(H, (c + 1) * per), out)


@jit()
def layouts(D, n_kv, lanes, sgemm):
    """(K·Q from ``kt``, P·V from ``v``): which of :func:`attn_heads_f32`'s products run across cells / outputs (SVE's
    at any length: :func:`kernels.ggml.sve.vec_dot_f32_cols`)."""
    sve_ = lanes == SVE128 or lanes == SVE256
    return sve_ or cols_fit(D, lanes), (sve_ or cols_fit(n_kv, lanes)) and not sgemm


__all__ = ["PATHS", "attend_f32", "attn_heads_f32", "attn_heads_f32_parallel", "layouts"]
