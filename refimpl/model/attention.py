"""Gated full attention (``graph::build_layer_attn`` of ``src/models/qwen35moe.cpp``; ``qwen35.cpp``'s is
the same, ``qwen3next.cpp``'s differs only in the RoPE: ``ggml_rope_ext`` NEOX instead of IMRoPE).

Per token at position p, input a [E]:

1. ``Qcur_full = W_q a`` [2·H·D], viewed [H, 2, D]: head h's query is ``[h, 0]``, its output gate
   ``[h, 1]`` (memory ``[q_0 | g_0 | q_1 | g_1 | …]``). ``Kcur = W_k a``, ``Vcur = W_v a`` [Hkv, D].
2. q and k RMSNorm over D with ``attn_q_norm`` / ``attn_k_norm`` (weights stored as 1+w).
3. RoPE on q and k: the angles of :func:`rope_cache` — IMRoPE for qwen35moe / qwen35, plain NEOX for
   qwen3next; for text tokens the two differ only in the pairs IMRoPE leaves unrotated — applied to the
   NEOX pairs (i, i + R/2) by :func:`rotate_pairs`, which both use.
4. K, V appended to this layer's cache; GQA: query head h reads KV head ``h // (H/Hkv)``.
5. ``softmax(q·k / sqrt(D))`` over cached positions ≤ p (causal), ``o_h = Σ p·v``.
6. ``o ⊙ sigmoid(gate)``, then ``W_o`` → ``attn_output`` [E].

The KV cache lives in :class:`refimpl.model.state.KVCache`; this function returns a new one.
With ``--emulate`` (``Ctx.kv_f16``, ``Ctx.flash_attn``) K, V and the attention itself are rounded where
llama.cpp's configuration rounds them (:func:`attend`); ``--emulate=ggml`` is llama.cpp's own graph,
:mod:`refimpl.graph.attention`.
"""

from __future__ import annotations

import numpy as np

import kernels
from refimpl.graph.attention import kv_view_cells
from refimpl.model.ops import F32, Ctx, dot64, mm, rms_norm_w, sigmoid, softmax, to_f16
from refimpl.model.state import KVCache

FA_TILE_Q = 64  # GGML_FA_TILE_Q: a ubatch of at least this many query rows takes the tiled flash-attention path
FA_SPLIT_KV = 512  # use_split_kv_path: one query row and at least this many KV cells (n_kv)


def rope_cache(pos: int, n_dims: int, sections: tuple[int, ...], freq_base: float, freq_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin for the R/2 rotated pairs at text position p.

    ``sections`` (4 ints): IMRoPE (``ggml_mrope_cache_init``). Positions are (p, p, p, 0) for text
    tokens (``llm_graph_input_pos::set_input``). Four float32 angles start at those components and
    are each multiplied by ``theta_scale = powf(base, -2/R)`` once per pair (a running product,
    rounded step by step). Pair k takes the t/h/w/e angle by the interleaved sector rule; the e angle
    is 0 for text, i.e. that pair is not rotated.
    ``sections`` empty: plain NEOX RoPE (``ggml_rope_cache_init``, qwen3next): one angle, starting at p,
    the same running product — every pair takes it.
    Returns (cos [R/2], sin [R/2]) in float32.
    """
    theta_scale = np.power(F32(freq_base), F32(-2.0) / F32(n_dims), dtype=F32)
    theta = {"t": F32(pos), "h": F32(pos), "w": F32(pos), "e": F32(0.0)}
    cos = np.empty(n_dims // 2, dtype=F32)
    sin = np.empty(n_dims // 2, dtype=F32)
    for k in range(n_dims // 2):
        which = _imrope_sector(k, sections) if sections else "t"
        angle = F32(freq_scale) * theta[which]  # rope_yarn with ext_factor = 0, mscale = 1
        cos[k] = np.cos(angle)
        sin[k] = np.sin(angle)
        for key in theta:
            theta[key] = F32(theta[key] * theta_scale)
    return cos, sin


def _imrope_sector(k: int, sections: tuple[int, ...]) -> str:
    """Which of IMRoPE's t/h/w/e angles pair k takes (``ggml_mrope_cache_init`` with is_imrope)."""
    s0, s1, s2, s3 = sections
    sector = k % (s0 + s1 + s2 + s3)
    if sector % 3 == 1 and sector < 3 * s1:
        return "h"
    if sector % 3 == 2 and sector < 3 * s2:
        return "w"
    if sector % 3 == 0 and sector < 3 * s0:
        return "t"
    return "e"


def rotate_pairs(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate the NEOX pairs (i, i + R/2) of the first R dims by the angles of :func:`rope_cache` (ops.cpp
    ``rotate_pairs`` with offset R/2, which IMRoPE and NEOX RoPE both use); dims ≥ R unchanged.

    [heads, D] -> [heads, D]
    """
    half = cos.shape[0]
    out = x.copy()
    x0, x1 = x[:, :half], x[:, half:2 * half]  # [heads, R/2] each
    out[:, :half] = x0 * cos - x1 * sin
    out[:, half:2 * half] = x0 * sin + x1 * cos
    return out


def gated_attention(w, c, a: np.ndarray, positions: np.ndarray, kv: KVCache, il: int, ctx: Ctx, prefix: str = "") -> tuple[np.ndarray, KVCache]:
    """One gated-attention layer over a batch of T consecutive tokens of one sequence.

    ``w``: :class:`refimpl.io.weights.AttentionWeights`; ``c``: :class:`refimpl.io.config.Config`;
    ``a``: attn_norm output [T, E]; ``positions`` [T]. Returns (attn_output [T, E], new cache).
    ``prefix`` is prepended to traced names (``"mtp_"`` in the MTP block, as in ``graph_mtp``).
    """
    T = a.shape[0]
    H, Hkv, D = c.n_head, c.n_head_kv, c.head_dim
    qg = ctx.cb("attention.q_gate", il, mm(w.attn_q, a, ctx).reshape(T, H, 2, D))  # [T, 2HD] -> [T, H, 2, D]
    ctx.cb(prefix + "Qcur_full", il, qg.reshape(T, 2 * H * D))
    q = rms_norm_w(qg[:, :, 0, :], w.attn_q_norm, c.rms_eps)  # [T, H, D]: the view, normed row by row
    ctx.cb(prefix + "Qcur_normed", il, q)
    gate = np.ascontiguousarray(qg[:, :, 1, :]).reshape(T, H * D)  # [T, HD]: ggml_cont_2d
    k = rms_norm_w(mm(w.attn_k, a, ctx).reshape(T, Hkv, D), w.attn_k_norm, c.rms_eps)  # [T, Hkv, D]
    ctx.cb(prefix + "Kcur_normed", il, k)
    v = mm(w.attn_v, a, ctx).reshape(T, Hkv, D)  # [T, Hkv, D]

    n_rot = ctx.cb("attention.rope_dims", il, c.n_rot, head_dim=D)
    for t in range(T):
        cos, sin = rope_cache(int(positions[t]), n_rot, c.rope_sections, c.rope_freq_base, c.rope_freq_scale)
        q[t] = rotate_pairs(q[t], cos, sin)
        k[t] = rotate_pairs(k[t], cos, sin)
    ctx.cb(prefix + "Qcur", il, q)
    ctx.cb(prefix + "Kcur", il, k)
    ctx.cb(prefix + "Vcur", il, v)

    if ctx.kv_f16 or ctx.flash_attn:  # an F16 cache (llama_context default), or flash attention's F16 cast
        k, v = to_f16(k), to_f16(v)
    kv = kv.append(k, v, positions)

    o = attend(q, kv, positions, c, ctx)  # [T, H, D]
    o = o.reshape(T, H * D)
    ctx.cb(prefix + "attn_pregate", il, o)
    o = ctx.cb(prefix + "attn_gated", il, o * sigmoid(gate))  # [T, HD]: ggml_mul (one float32 product)
    return ctx.cb(prefix + "attn_output", il, mm(w.attn_output, o, ctx)), kv


def attend(q: np.ndarray, kv: KVCache, positions: np.ndarray, c, ctx: Ctx) -> np.ndarray:
    """``softmax(q·k / sqrt(D)) · v`` over the visible cells, the way llama.cpp's configuration
    computes it (``build_attn_mha``). q [T, H, D] after RoPE; returns [T, H, D].

    * flash attention off (``ggml_mul_mat`` → ``ggml_soft_max_ext`` → ``ggml_mul_mat``): with an F16
      cache, Q is rounded to F16 for K·Q (K's ``vec_dot_type``) and the probabilities to F16 for P·V;
      with an F32 cache nothing is rounded.
    * flash attention on (``ggml_flash_attn_ext``, K and V always F16): per ubatch of ``ctx.n_ubatch``
      query rows, fewer than ``FA_TILE_Q`` rows take the vector path with an F16 accumulator
      (:func:`kernels.ggml.flashattn.flash_attn_f16`; one row with ``n_kv >= FA_SPLIT_KV`` cells splits
      the cells over ``ctx.n_threads`` chunks); a larger ubatch takes the tiled path
      (``ggml_compute_forward_flash_attn_ext_tiled``): Q, the scores, the probabilities and P·V all
      float32 — the plain computation below with nothing rounded.
    """
    T, H, D = q.shape
    scale = F32(1.0 / np.sqrt(np.float32(D)))  # kq_scale = 1/sqrtf(n_embd_head)
    if not ctx.flash_attn:
        return _attend_plain(q, kv, positions, scale, ctx, round_f16=ctx.kv_f16)
    o = np.empty((T, H, D), dtype=F32)
    for u0 in range(0, T, ctx.n_ubatch):  # llama.cpp decodes a batch as ubatches of n_ubatch tokens
        u1 = min(T, u0 + ctx.n_ubatch)
        if u1 - u0 >= FA_TILE_Q:
            o[u0:u1] = _attend_plain(q[u0:u1], kv, positions[u0:u1], scale, ctx, round_f16=False)
            continue
        visible = kv.pos[None, :] <= positions[u0:u1, None]  # [U, n_cells]: causal mask
        o[u0:u1] = kernels.flash_attn_f16(q[u0:u1], kv.k, kv.v, visible, scale, _split_chunk(u1 - u0, kv, c, ctx))
    return o


def _split_chunk(n_rows: int, kv: KVCache, c, ctx: Ctx) -> int:
    """Cells per chunk of flash attention's split-KV path, or 0 when it is not taken. The KV view has
    ``n_kv = min(kv_size, max(256, pad256(cells used)))`` cells (``get_n_kv``), kv_size = the context
    padded to 256 (``ctx.n_ctx`` or the model's training context, as llama.cpp's n_ctx = 0):
    :func:`refimpl.graph.attention.kv_view_cells`, llama.cpp's own rule."""
    n_kv = kv_view_cells(len(kv.pos), c, ctx)
    if n_rows != 1 or n_kv < FA_SPLIT_KV:
        return 0
    return -(-n_kv // ctx.n_threads)


def _attend_plain(q: np.ndarray, kv: KVCache, positions: np.ndarray, scale, ctx: Ctx, round_f16: bool) -> np.ndarray:
    """Scores, softmax and P·V one query row at a time, exact float64 dots (``dot64``); with
    ``round_f16`` Q and P are rounded to F16 as the non-flash path with an F16 cache does."""
    T, H, D = q.shape
    Hkv = kv.k.shape[1]
    group = H // Hkv  # GQA: query head h = j·group + g reads KV head j (ggml broadcast i02 = i12 / r2)
    o = np.empty((T, H, D), dtype=F32)
    for t in range(T):
        visible = kv.pos <= positions[t]  # causal mask: p_kv <= p_q (set_input_kq_mask_impl)
        keys, vals = kv.k[visible], kv.v[visible]  # [n_kv, Hkv, D]
        qt = (to_f16(q[t]) if round_f16 else q[t]).reshape(Hkv, group, 1, D)  # [Hkv, group, 1, D]
        kq = dot64(keys.transpose(1, 0, 2)[:, None], qt, ctx.kernel) * scale  # [Hkv, group, n_kv]
        p = softmax(kq)  # [Hkv, group, n_kv], each row alone
        if round_f16:
            p = to_f16(p)
        o[t] = dot64(vals.transpose(1, 2, 0)[:, None], p[:, :, None, :], ctx.kernel).reshape(H, D)  # [Hkv, group, D] -> [H, D]
    return o
