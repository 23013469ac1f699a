"""Gated full attention as llama.cpp builds it (``graph::build_layer_attn`` of ``src/models/qwen35moe.cpp``;
``qwen35.cpp``'s is the same, ``qwen3next.cpp``'s differs in the RoPE: ``ggml_rope_ext`` NEOX instead of
``ggml_rope_multi`` IMROPE) and as ggml-cpu computes it, op for op:

1. ``Qcur_full = ggml_mul_mat(wq, cur)`` viewed [D, 2, H, T] (query and gate interleaved per head);
   ``Qcur = ggml_view_3d`` of the queries, RMS-normed with ``attn_q_norm`` (the fused RMS_NORM+MUL);
   ``gate = ggml_cont_2d`` of the gate halves. ``Kcur``, ``Vcur``: ``ggml_mul_mat``; K normed like Q.
2. RoPE (:func:`rope`): ``ggml_rope_multi`` IMROPE with positions (p, p, p, 0) per text token, or NEOX.
3. ``build_attn`` (llama-graph.cpp, :func:`build_attn`): K and V stored into the cache with ``ggml_set_rows`` — an
   F16 cache rounds them — then ``build_attn_mha`` over the KV view of :func:`kv_view_cells` cells (:func:`attend`).
4. ``cur = ggml_mul(cur, ggml_sigmoid(gate))``, ``ggml_mul_mat(wo, cur)``.

The reference computes the same layer in :mod:`refimpl.model.attention`; the traced names are the same
(``cb(cur, name, il)``), deliberately parallel.
"""

from __future__ import annotations

import numpy as np

from kernels.base.blocks import QT
from kernels.ggml import attn_heads, flashattn_exact, mulmat, rope as ggml_rope, vecmath
from refimpl.graph.ops import F32, mul_mat, rms_norm_w, sigmoid

KV_PAD = 256  # llama_kv_cache::get_n_kv pads the KV view to a multiple of 256 cells
GGML_ROPE_TYPE_IMROPE = ggml_rope.ROPE_TYPE_IMROPE  # ggml.h: GGML_ROPE_TYPE_IMROPE (qwen35moe / qwen35's rope_type)


def build_layer_attn(w, c, a: np.ndarray, positions: np.ndarray, kv, il: int, ctx, prefix: str = ""):
    """One gated-attention layer over the T tokens of a ubatch. ``w``: :class:`refimpl.io.weights.AttentionWeights`;
    ``c``: :class:`refimpl.io.config.Config`; ``a``: attn_norm [T, E]; ``positions`` [T]; ``kv``: the layer's
    :class:`refimpl.model.state.KVCache`. Returns (attn_output [T, E], the cache with the T new cells).
    ``prefix`` is prepended to traced names (``"mtp_"`` in the MTP block, as in ``graph_mtp``)."""
    T = a.shape[0]
    H, Hkv, D = c.n_head, c.n_head_kv, c.head_dim
    qg = ctx.cb("attention.q_gate", il, mul_mat(w.attn_q, a, ctx).reshape(T, H, 2, D))  # [T, 2HD] -> [T, H, 2, D]
    ctx.cb(prefix + "Qcur_full", il, qg.reshape(T, 2 * H * D))
    q = rms_norm_w(qg[:, :, 0, :], w.attn_q_norm, c.rms_eps, ctx)  # [T, H, D]: the view, normed row by row
    ctx.cb(prefix + "Qcur_normed", il, q)
    gate = np.ascontiguousarray(qg[:, :, 1, :]).reshape(T, H * D)  # [T, HD]: ggml_cont_2d
    k = rms_norm_w(mul_mat(w.attn_k, a, ctx).reshape(T, Hkv, D), w.attn_k_norm, c.rms_eps, ctx)  # [T, Hkv, D]
    ctx.cb(prefix + "Kcur_normed", il, k)
    v = mul_mat(w.attn_v, a, ctx).reshape(T, Hkv, D)  # [T, Hkv, D]

    n_rot = ctx.cb("attention.rope_dims", il, c.n_rot, head_dim=D)
    q, k = rope(q, k, positions, n_rot, c, ctx)  # [T, H, D], [T, Hkv, D]
    ctx.cb(prefix + "Qcur", il, q)
    ctx.cb(prefix + "Kcur", il, k)
    ctx.cb(prefix + "Vcur", il, v)

    o, kv = build_attn(q, k, v, positions, kv, c, ctx)
    o = o.reshape(T, H * D)  # [T, H, D] -> [T, HD]
    ctx.cb(prefix + "attn_pregate", il, o)
    o = ctx.cb(prefix + "attn_gated", il, o * sigmoid(gate, ctx))  # [T, HD]: ggml_mul (one float32 product)
    return ctx.cb(prefix + "attn_output", il, mul_mat(w.attn_output, o, ctx)), kv


def rope(q: np.ndarray, k: np.ndarray, positions: np.ndarray, n_rot: int, c, ctx) -> tuple[np.ndarray, np.ndarray]:
    """RoPE of q [T, H, D] and k [T, Hkv, D]: ``ggml_rope_multi`` IMROPE (qwen35moe / qwen35) or ``ggml_rope_ext``
    NEOX (qwen3next), :mod:`kernels.ggml.rope` (glibc sin/cos, the fused rotation)."""
    pos = np.asarray(positions, dtype=np.int32)  # [T]
    if c.rope_sections:  # text tokens: the four position streams are (p, p, p, 0) (llm_graph_input_pos)
        pos4 = np.stack([pos, pos, pos, np.zeros_like(pos)])  # [4, T]
        return tuple(ggml_rope.rope_multi(x, pos4, n_rot, c.rope_sections, GGML_ROPE_TYPE_IMROPE, c.rope_freq_base,
                                          ctx.ggml, c.rope_freq_scale) for x in (q, k))
    return tuple(ggml_rope.rope_neox(x, pos, n_rot, c.rope_freq_base, ctx.ggml, c.rope_freq_scale) for x in (q, k))


def build_attn(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: np.ndarray, kv, c, ctx):
    """``build_attn``: K and V [T, Hkv, D] stored into the cache (``ggml_set_rows``; an F16 cache rounds them), then
    :func:`attend` of q [T, H, D]. Returns (o [T, H, D], the cache with the T new cells)."""
    if ctx.kv_f16:  # ggml_set_rows into an F16 cache: F32 -> F16 (flash attention casts an F32 cache itself)
        k, v = vecmath.cast_f16(k).astype(F32), vecmath.cast_f16(v).astype(F32)
    kv = kv.append(k, v, positions)
    return attend(q, kv, positions, c, ctx), kv


def kv_cache_cells(c, ctx) -> int:
    """The KV cache size of the emulated llama.cpp context: its n_ctx (``ctx.n_ctx``, or n_ctx_train as llama.cpp's
    n_ctx = 0) padded to a multiple of 256 cells."""
    return -(-(ctx.n_ctx or c.n_ctx_train) // KV_PAD) * KV_PAD


def kv_view_cells(n_used: int, c, ctx) -> int:
    """``llama_kv_cache::get_n_kv``: the cells of the KV view, the used ones padded to a multiple of 256
    (at least 256), at most the cache size (:func:`kv_cache_cells`)."""
    return min(kv_cache_cells(c, ctx), max(KV_PAD, -(-n_used // KV_PAD) * KV_PAD))


def attend(q: np.ndarray, kv, positions: np.ndarray, c, ctx) -> np.ndarray:
    """``build_attn_mha`` over the padded KV view of ``n_kv`` cells (cells past the used ones zero, as the
    cleared cache buffer holds; masked with -inf, ``set_input_kq_mask``). q [T, H, D] -> [T, H, D].

    * flash attention on: ``ggml_flash_attn_ext`` with F16 K/V (an F32 cache is cast, ``ggml_cast``)
      and the F16 mask (:func:`kernels.ggml.flashattn_exact.flash_attn_ext`: its one-row, tiled or
      split-KV path, which it picks from the shape and ``n_threads``).
    * off: ``kq = ggml_mul_mat(k, q)`` per head (K's type is the cache's), ``ggml_soft_max_ext(kq, mask,
      scale)``, ``kqv = ggml_mul_mat(v_trans, kq)`` (the V cache stored transposed)."""
    T, H, D = q.shape
    Hkv = kv.k.shape[1]
    n_used = len(kv.pos)
    n_kv = kv_view_cells(n_used, c, ctx)
    scale = F32(1.0) / np.sqrt(F32(D))  # kq_scale = 1.0f/sqrtf(float(n_embd_head))
    visible = np.zeros((T, n_kv), dtype=bool)
    visible[:, :n_used] = kv.pos[None, :] <= positions[:, None]  # causal: p_kv <= p_q
    mask = np.where(visible, np.float16(0), np.float16(-np.inf))  # [T, n_kv] F16 (the mask of an F16 cache or of flash attention)
    k = np.zeros((Hkv, n_kv, D), dtype=F32)
    v = np.zeros((Hkv, n_kv, D), dtype=F32)
    k[:, :n_used], v[:, :n_used] = kv.k.transpose(1, 0, 2), kv.v.transpose(1, 0, 2)  # [Hkv, n_kv, D]
    if ctx.flash_attn:  # K, V as F16 (exact for an F16 cache, ggml_cast for an F32 one; the empty cells +0 either way),
        # held as their float32 values, as the kernel reads them (flash_attn_values: flash_attn_ext without the casts)
        for x in (k, v):
            x[:, :n_used] = vecmath.cast_f16_to_f32(vecmath.cast_f16(x[:, :n_used]))
        return flashattn_exact.flash_attn_values(q.transpose(1, 0, 2), k, v, True, True, vecmath.cast_f16_to_f32(mask),
                                                 scale, ctx.ggml, ctx.n_threads)  # [T, H, D]
    if not ctx.kv_f16 and ctx.ggml in attn_heads.PATHS:  # F32 cache: every head's ops below in one compiled call
        return attn_heads.attend_f32(q, k, v, n_used, mask, scale, ctx.ggml, ctx.n_threads)
    group = H // Hkv  # head h reads KV head h // group (ggml_mul_mat's broadcast i02 = i12 / r2)
    o = np.empty((T, H, D), dtype=F32)
    kv_type = QT.F16 if ctx.kv_f16 else QT.F32  # F32: ggml's generic path (vec_dot whatever the shape)
    as_cache = (lambda x: vecmath.cast_f16(x).view(np.uint8)) if ctx.kv_f16 else (lambda x: x.view(np.uint8))
    for h in range(H):  # the cache's type
        j = h // group
        qh = np.ascontiguousarray(q[:, h])  # [T, D]
        # Q converted to F16 (contiguous wdata): the F16 kernel for T rows (llamafile_sgemm for T ≥ 2)
        kq = mulmat.mul_mat(as_cache(k[j]), kv_type, qh, ctx.ggml, ctx.n_threads)  # [T, n_kv]
        p = vecmath.soft_max(kq, mask, scale, ctx.ggml)  # [T, n_kv]
        vt = np.ascontiguousarray(v[j].T)  # [D, n_kv]: the transposed V cache
        o[:, h] = mulmat.mul_mat(as_cache(vt), kv_type, p, ctx.ggml, ctx.n_threads)  # [T, D]
    return o
