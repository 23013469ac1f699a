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

``lanes`` is the path's vec code (:func:`kernels.ggml.simd.lanes`): 16, 8, or 4 for the AArch64 NEON builds
(``arm64-dotprod`` / ``arm64-i8mm``: ``ggml_vec_dot_f32``'s 4 × 4 lanes and ``vaddvq_f32``, soft_max's NEON blocks;
no llamafile there, so ``sgemm`` is False) — bit for bit against both ARM builds
(tests/test_ggml_ops_attn_arm64.py: test_attention_without_flash).
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import jit
from kernels.ggml.mulmat_vec import F32_ROWS, tinyblas_rows
from kernels.ggml.vec import cols_fit, vec_dot_f32, vec_dot_f32_cols
from kernels.ggml.vecmath import _soft_max_rows


@jit()
def attn_heads_f32(q, k, kt, v, vt, mask, scale, lanes, sgemm, out):
    """``q`` [T, H, D], the KV view as ``k`` [Hkv, n_kv, D] or ``kt`` [Hkv, D, n_kv] (K transposed: the cells side
    by side) and ``v`` [Hkv, n_kv, D] or ``vt`` [Hkv, D, n_kv] (the transposed V cache), ``mask`` [T, n_kv] float32,
    ``scale`` float32, ``lanes`` the path's float32 lanes, ``sgemm`` whether kqv takes tinyBLAS -> ``out`` [T, H, D].
    Where a dot's length is a whole number of ``GGML_F32_STEP``s (:func:`kernels.ggml.vec.cols_fit`) the
    ``vec_dot_f32``s of a row of scores, or of a head's outputs, run together across the cells or the outputs
    (:func:`kernels.ggml.vec.vec_dot_f32_cols`, the same bits), from ``kt`` / ``v``; otherwise one by one from
    ``k`` / ``vt``. ``v`` is always given; of ``k``, ``kt``, ``vt`` the caller passes the ones :func:`layouts` says
    are read (the others may be empty)."""
    T, H, D = q.shape
    Hkv, n_kv = v.shape[0], v.shape[1]
    group = H // Hkv
    acc = np.empty((4, 16), np.float32)  # vec.dot_scratch: the accumulators of vec_dot_f32
    acc_cols = np.empty((4, 16, max(n_kv, D)), np.float32)
    kq = np.empty((1, T, n_kv), np.float32)  # [1, T, n_kv]: one head's scores
    p = np.empty((1, T, n_kv), np.float32)  # [1, T, n_kv]: its probabilities
    m = mask.reshape(1, T, n_kv)
    mask_of = np.zeros(1, np.int64)
    o = np.empty((T, D), np.float32)  # [T, D]: one head's output
    kq_cols, pv_cols = layouts(D, n_kv, lanes, sgemm)
    for h in range(H):
        j = h // group
        for t in range(T):
            if kq_cols:
                vec_dot_f32_cols(D, kt[j], q[t, h], lanes, acc_cols, kq[0, t])  # ggml_vec_dot_f32 per cell
            else:
                for c in range(n_kv):
                    kq[0, t, c] = vec_dot_f32(D, k[j, c], q[t, h], lanes, acc)  # ggml_vec_dot_f32, one element
        _soft_max_rows(kq, m, mask_of, True, scale, lanes, p)  # ggml_soft_max_ext(kq, mask, scale)
        if sgemm:
            tinyblas_rows(vt[j], p[0], o, lanes, lanes, False)
        elif pv_cols:
            for t in range(T):
                vec_dot_f32_cols(n_kv, v[j], p[0, t], lanes, acc_cols, o[t])  # ggml_vec_dot_f32 per output
        else:
            F32_ROWS(vt[j], p[0], o, lanes)  # mulmat_vec.vec_dot_float_rows, F32
        out[:, h, :] = o


@jit()
def layouts(D, n_kv, lanes, sgemm):
    """(K·Q from ``kt``, P·V from ``v``): which of :func:`attn_heads_f32`'s products run across cells / outputs."""
    return cols_fit(D, lanes), cols_fit(n_kv, lanes) and not sgemm


__all__ = ["attn_heads_f32", "layouts"]
