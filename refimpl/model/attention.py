"""Gated full attention (``graph::build_layer_attn`` of ``src/models/qwen35moe.cpp``; ``qwen35.cpp``'s is
the same, ``qwen3next.cpp``'s differs only in the RoPE: ``ggml_rope_ext`` NEOX instead of IMRoPE).

Per token at position p, input a [E]:

1. ``Qcur_full = W_q a`` [2·H·D], viewed [H, 2, D]: head h's query is ``[h, 0]``, its output gate
   ``[h, 1]`` (memory ``[q_0 | g_0 | q_1 | g_1 | …]``). ``Kcur = W_k a``, ``Vcur = W_v a`` [Hkv, D].
2. q and k RMSNorm over D with ``attn_q_norm`` / ``attn_k_norm`` (weights stored as 1+w).
3. RoPE on q and k (:func:`rope_imrope`): IMRoPE for qwen35moe / qwen35, plain NEOX for qwen3next —
   for text tokens the two differ only in the pairs IMRoPE leaves unrotated (:func:`rope_cache`).
4. K, V appended to this layer's cache; GQA: query head h reads KV head ``h // (H/Hkv)``.
5. ``softmax(q·k / sqrt(D))`` over cached positions ≤ p (causal), ``o_h = Σ p·v``.
6. ``o ⊙ sigmoid(gate)``, then ``W_o`` → ``attn_output`` [E].

The KV cache lives in :class:`refimpl.model.state.KVCache`; this function returns a new one.
"""

from __future__ import annotations

import numpy as np

import kernels
from refimpl.model.ops import F32, Ctx, dot64, mm, rms_norm_w, sigmoid, softmax, to_f16
from refimpl.model.state import KVCache

FA_TILE_Q = 64  # GGML_FA_TILE_Q: a ubatch of at least this many query rows takes the tiled flash-attention path
FA_SPLIT_KV = 512  # use_split_kv_path: one query row and at least this many KV cells (n_kv)
KV_PAD = 256  # llama_kv_cache::get_n_kv pads the KV view to a multiple of 256 cells


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


def rope_imrope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NEOX pairing over the first R dims (``rotate_pairs`` with offset R/2); dims ≥ R unchanged.

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
    With ``ctx.ggml`` every op is ggml-cpu's (``build_layer_attn`` of qwen35moe.cpp): the norms, sigmoid and
    matmuls through ``ctx``, :func:`_rope_ggml`, the F16 cache write, :func:`_attend_ggml`.
    """
    T = a.shape[0]
    H, Hkv, D = c.n_head, c.n_head_kv, c.head_dim
    qg = ctx.cb("attention.q_gate", il, mm(w.attn_q, a, ctx).reshape(T, H, 2, D))  # [T, 2HD] -> [T, H, 2, D]
    ctx.cb(prefix + "Qcur_full", il, qg.reshape(T, 2 * H * D))
    q = rms_norm_w(qg[:, :, 0, :], w.attn_q_norm, c.rms_eps, ctx)  # [T, H, D]: the view, normed row by row
    ctx.cb(prefix + "Qcur_normed", il, q)
    gate = np.ascontiguousarray(qg[:, :, 1, :]).reshape(T, H * D)  # [T, HD]: ggml_cont_2d
    k = rms_norm_w(mm(w.attn_k, a, ctx).reshape(T, Hkv, D), w.attn_k_norm, c.rms_eps, ctx)  # [T, Hkv, D]
    ctx.cb(prefix + "Kcur_normed", il, k)
    v = mm(w.attn_v, a, ctx).reshape(T, Hkv, D)  # [T, Hkv, D]

    n_rot = ctx.cb("attention.rope_dims", il, c.n_rot, head_dim=D)
    if ctx.ggml:
        q, k = _rope_ggml(q, k, positions, n_rot, c, ctx)  # [T, H, D], [T, Hkv, D]
    else:
        for t in range(T):
            cos, sin = rope_cache(int(positions[t]), n_rot, c.rope_sections, c.rope_freq_base, c.rope_freq_scale)
            q[t] = rope_imrope(q[t], cos, sin)
            k[t] = rope_imrope(k[t], cos, sin)
    ctx.cb(prefix + "Qcur", il, q)
    ctx.cb(prefix + "Kcur", il, k)
    ctx.cb(prefix + "Vcur", il, v)

    if ctx.ggml:  # ggml_set_rows into an F16 cache: F32 -> F16 (flash attention casts an F32 cache itself)
        if ctx.kv_f16:
            from kernels.ggml import vecmath

            k, v = vecmath.cast_f16(k).astype(F32), vecmath.cast_f16(v).astype(F32)
    elif ctx.kv_f16 or ctx.flash_attn:  # an F16 cache (llama_context default), or flash attention's F16 cast
        k, v = to_f16(k), to_f16(v)
    kv = kv.append(k, v, positions)

    o = (_attend_ggml if ctx.ggml else attend)(q, kv, positions, c, ctx)  # [T, H, D]
    o = o.reshape(T, H * D)
    ctx.cb(prefix + "attn_pregate", il, o)
    o = ctx.cb(prefix + "attn_gated", il, o * sigmoid(gate, ctx))  # [T, HD]: ggml_mul (one float32 product)
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
    padded to 256 (``ctx.n_ctx`` or the model's training context, as llama.cpp's n_ctx = 0)."""
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


# --- --emulate=ggml: RoPE and attention as ggml-cpu computes them (Ctx.ggml) ------------------------------------

GGML_ROPE_TYPE_IMROPE = 40  # ggml.h: GGML_ROPE_TYPE_IMROPE (qwen35moe / qwen35's rope_type)


def _rope_ggml(q: np.ndarray, k: np.ndarray, positions: np.ndarray, n_rot: int, c, ctx: Ctx) -> tuple[np.ndarray, np.ndarray]:
    """``--emulate=ggml``'s RoPE of q [T, H, D] and k [T, Hkv, D]: ``ggml_rope_multi`` IMROPE (qwen35moe /
    qwen35) or ``ggml_rope_ext`` NEOX (qwen3next), :mod:`kernels.ggml.rope` (glibc sin/cos, the fused rotation)."""
    from kernels.ggml import rope

    pos = np.asarray(positions, dtype=np.int32)  # [T]
    if c.rope_sections:  # text tokens: the four position streams are (p, p, p, 0) (llm_graph_input_pos)
        pos4 = np.stack([pos, pos, pos, np.zeros_like(pos)])  # [4, T]
        return tuple(rope.rope_multi(x, pos4, n_rot, c.rope_sections, GGML_ROPE_TYPE_IMROPE, c.rope_freq_base, ctx.ggml,
                                     c.rope_freq_scale) for x in (q, k))
    return tuple(rope.rope_neox(x, pos, n_rot, c.rope_freq_base, ctx.ggml, c.rope_freq_scale) for x in (q, k))


def kv_cache_cells(c, ctx: Ctx) -> int:
    """The KV cache size of the emulated llama.cpp context: its n_ctx (``ctx.n_ctx``, or n_ctx_train as llama.cpp's
    n_ctx = 0) padded to a multiple of 256 cells."""
    return -(-(ctx.n_ctx or c.n_ctx_train) // KV_PAD) * KV_PAD


def kv_view_cells(n_used: int, c, ctx: Ctx) -> int:
    """``llama_kv_cache::get_n_kv``: the cells of the KV view, the used ones padded to a multiple of 256
    (at least 256), at most the cache size (:func:`kv_cache_cells`)."""
    return min(kv_cache_cells(c, ctx), max(KV_PAD, -(-n_used // KV_PAD) * KV_PAD))


def _attend_ggml(q: np.ndarray, kv: KVCache, positions: np.ndarray, c, ctx: Ctx) -> np.ndarray:
    """``build_attn_mha`` over the padded KV view of ``n_kv`` cells (cells past the used ones zero, as the
    cleared cache buffer holds; masked with -inf, ``set_input_kq_mask``). q [T, H, D] -> [T, H, D].

    * flash attention on: ``ggml_flash_attn_ext`` with F16 K/V (an F32 cache is cast, ``ggml_cast``)
      and the F16 mask (:func:`kernels.ggml.flashattn_exact.flash_attn_ext`: its one-row, tiled or
      split-KV path, which it picks from the shape and ``n_threads``).
    * off: ``kq = ggml_mul_mat(k, q)`` per head (K's type is the cache's), ``ggml_soft_max_ext(kq, mask,
      scale)``, ``kqv = ggml_mul_mat(v_trans, kq)`` (the V cache stored transposed)."""
    from kernels.base.blocks import QT
    from kernels.ggml import flashattn_exact, mulmat, vecmath

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
    if not ctx.kv_f16 and ctx.ggml != "generic":  # F32 cache: every head's ops below in one compiled call (kernels.ggml.attn_heads). K·Q: src1 =
        # the permuted Q view is not contiguous and needs no conversion to F32, so ggml_compute_forward_mul_mat skips
        # llamafile_sgemm (it needs src1_cont) and takes vec_dot per element
        from kernels.ggml import attn_heads

        o = np.empty((T, H, D), dtype=F32)
        L = mulmat.lanes(ctx.ggml)
        sgemm = mulmat.kernel_for(QT.F32, ctx.ggml, T, D, n_kv) == "sgemm"  # kqv's kernel: [D, n_kv] times p [T, n_kv]
        kq_cols, pv_cols = attn_heads.layouts(D, n_kv, L, sgemm)  # the layouts its products read (the rest: empty)
        none = np.zeros((Hkv, 0, 0), dtype=F32)
        kt = np.zeros((Hkv, D, n_kv), dtype=F32) if kq_cols else none  # [Hkv, D, n_kv]: K transposed
        if kq_cols:
            kt[:, :, :n_used] = kv.k.transpose(1, 2, 0)
        vt = none if pv_cols else np.ascontiguousarray(v.transpose(0, 2, 1))  # [Hkv, D, n_kv]: the transposed V cache
        attn_heads.attn_heads_f32(np.ascontiguousarray(q), none if kq_cols else k, kt, v, vt,
                                  vecmath.cast_f16_to_f32(mask), scale, L, sgemm, o)
        return o
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
