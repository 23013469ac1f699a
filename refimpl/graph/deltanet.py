"""The Gated DeltaNet layer as llama.cpp builds it (``graph::build_layer_attn_linear`` of
``src/models/qwen35moe.cpp`` / ``qwen35.cpp`` / ``qwen3next.cpp``; ``build_delta_net_fused`` of
``src/models/delta-net-base.cpp``) and as ggml-cpu computes it, op for op:

1. the input projections (``ggml_mul_mat``; qwen3next's fused ``ssm_in`` / ``ssm_ba`` viewed per key head and
   reassembled with ``ggml_concat``): qkv_mixed [T, C], z [T, Din], b and alpha [T, Hv];
2. ``beta = ggml_sigmoid(b)``; ``gate = ggml_mul(ggml_softplus(ggml_add(alpha, ssm_dt)), ssm_a)``;
3. ``ggml_concat(conv_states, qkv_mixedᵀ)`` then ``ggml_ssm_conv`` and ``ggml_silu``;
4. q and k views through ``build_gdn_l2_norm`` (``ggml_rms_norm`` + ``ggml_scale``);
5. the fused ``ggml_gated_delta_net`` over the whole ubatch, with the snapshot slots ``build_recurrent_attn``
   asks for when ``n_rs_seq > 0``;
6. ``build_norm_gated``: ``ggml_rms_norm``·``ssm_norm`` (fused) times ``ggml_silu(z)``; ``ggml_mul_mat(ssm_out)``.

Letters as in the legend of docs/architecture.md: Hk key heads (GGUF ``ssm.group_count``), Hv value heads
(``ssm.time_step_rank``), S the head dimension (``ssm.state_size``); the state is M [Hv, S, S].
The reference computes the same layer in :mod:`refimpl.model.deltanet`; the views of step 1 and the traced
names are the same there, deliberately parallel.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kernels.ggml import ssm
from refimpl.graph.ops import F32, l2_norm, mul_mat, rms_norm_w, sigmoid, silu, softplus


def build_layer_attn_linear(w, c, a: np.ndarray, st, il: int, ctx, keep: int | None = None):
    """One Gated DeltaNet layer over the T tokens of a ubatch. ``w``: :class:`refimpl.io.weights.DeltaNetWeights`;
    ``a``: attn_norm [T, E]; ``st``: the layer's :class:`refimpl.model.state.DeltaNetState`.
    Returns (linear_attn_out [T, E], T entries: the state after token t where the fused op keeps one — the last
    ``keep`` tokens, or only the last when ``keep`` is None — else None)."""
    T = a.shape[0]
    Hk, Hv, S = c.ssm_n_group, c.ssm_dt_rank, c.ssm_d_state
    qkv_mixed, z, b, alpha = build_qkvz(w, c, a, il, ctx)  # [T, C], [T, Din], [T, Hv], [T, Hv]
    beta = ctx.cb("beta_sigmoid", il, sigmoid(b, ctx))  # [T, Hv]
    g = ctx.cb("gate", il, softplus(alpha + w.ssm_dt, ctx) * w.ssm_a)  # [T, Hv], ≤ 0: ggml_add, ggml_softplus, ggml_mul

    window = np.concatenate([st.conv, qkv_mixed.astype(F32)])  # [Kc−1+T, C]: ggml_concat(conv_states, qkv_mixedᵀ, 0)
    conv_out = ssm.ssm_conv(np.ascontiguousarray(window.T), w.ssm_conv1d, ctx.ggml)  # ggml_ssm_conv: [C, Kc−1+T] -> [T, C]
    ctx.cb("conv_output_raw", il, conv_out)
    y = ctx.cb("conv_output_silu", il, silu(conv_out, ctx))  # [T, C]: over rows of C

    q = l2_norm(y[:, : Hk * S].reshape(T, Hk, S), c.rms_eps, ctx)  # [T, Hk, S]
    k = l2_norm(y[:, Hk * S : 2 * Hk * S].reshape(T, Hk, S), c.rms_eps, ctx)  # [T, Hk, S]
    v = np.ascontiguousarray(y[:, 2 * Hk * S :]).reshape(T, Hv, S)  # [T, Hv, S]
    head = ctx.cb("deltanet.kv_head", il, key_heads(c), Hk=Hk)  # [Hv]: value head j reads q/k head head[j]
    window = ctx.cb("deltanet.conv_rows", il, window, conv_silu=y)  # [Kc−1+T, C]: the rows the conv states keep
    o, states = gated_delta_net(q, k, v, g, beta, head, window, st, il, ctx, keep, c.ssm_d_conv)  # [T, Hv, S]
    ctx.cb("attn_output_delta", il, o)

    # build_norm_gated: ggml_rms_norm over S per head, ggml_mul by ssm_norm (plain w), ggml_mul by ggml_silu(z)
    out = rms_norm_w(o, ctx.cb("deltanet.ssm_norm", il, w.ssm_norm), c.rms_eps, ctx) * silu(z.reshape(T, Hv, S), ctx)
    final = ctx.cb("final_output", il, out.reshape(T, Hv * S))  # [T, Din]
    return ctx.cb("linear_attn_out", il, mul_mat(w.ssm_out, final, ctx)), states


def build_qkvz(w, c, a: np.ndarray, il: int, ctx) -> tuple[np.ndarray, ...]:
    """The input projections of a [T, E] (``build_qkvz``; ``build_layer_attn_linear``'s beta/alpha):
    (qkv_mixed [T, C], z [T, Din], b [T, Hv], alpha [T, Hv]). Each projection is one ``ggml_mul_mat``; qwen3next's
    legacy ``ssm_in`` is viewed [Hk, 2S + 2·(Hv/Hk)·S] and reassembled, ``ssm_ba`` viewed [Hk, 2·Hv/Hk] — the same
    views as :func:`refimpl.model.deltanet.input_projections`, deliberately parallel (only the matmul differs)."""
    T = a.shape[0]
    Hk, Hv, S = c.ssm_n_group, c.ssm_dt_rank, c.ssm_d_state
    r = Hv // Hk  # value heads per key head
    if w.ssm_in is not None:
        mixed = ctx.cb("linear_attn_mixed_qkvz", il, mul_mat(w.ssm_in, a, ctx)).reshape(T, Hk, 2 * S + 2 * r * S)
        q, k = mixed[:, :, :S], mixed[:, :, S : 2 * S]  # [T, Hk, S] each: ggml_view_4d
        v, z = mixed[:, :, 2 * S : 2 * S + r * S], mixed[:, :, 2 * S + r * S :]  # [T, Hk, r·S] each
        qkv_mixed = ctx.cb("qkv_mixed", il, np.concatenate([x.reshape(T, -1) for x in (q, k, v)], axis=1))  # ggml_concat
        z = ctx.cb("z", il, np.ascontiguousarray(z).reshape(T, Hv * S))  # [T, Din]: ggml_cont
    else:
        qkv_mixed = ctx.cb("linear_attn_qkv_mixed", il, mul_mat(w.attn_qkv, a, ctx))  # [T, C]
        z = ctx.cb("z", il, mul_mat(w.attn_gate, a, ctx))  # [T, Din]
    if w.ssm_ba is not None:
        ba = ctx.cb("linear_attn_mixed_ba", il, mul_mat(w.ssm_ba, a, ctx)).reshape(T, Hk, 2 * r)  # [T, Hk, 2r]
        b, alpha = ba[:, :, :r].reshape(T, Hv), ba[:, :, r:].reshape(T, Hv)  # [T, Hv] each
    else:
        b, alpha = mul_mat(w.ssm_beta, a, ctx), mul_mat(w.ssm_alpha, a, ctx)  # [T, Hv] each
    return qkv_mixed, z, b, alpha


def key_heads(c) -> np.ndarray:
    """[Hv]: the key head value head j reads. qwen35moe / qwen35 (tiled): ``j % Hk``, the fused op's own broadcast
    (``ggml_gated_delta_net`` reads q/k head ``j % Hk``); qwen3next (grouped): ``j // (Hv/Hk)``, its
    reshape–``ggml_repeat_4d``–reshape "repeat interleave" (qwen3next.cpp). The same map as
    :func:`refimpl.model.deltanet.kv_heads`, deliberately parallel: here it is what the graph's ops broadcast."""
    j = np.arange(c.ssm_dt_rank)
    return j % c.ssm_n_group if c.arch.gdn_heads == "tiled" else j // (c.ssm_dt_rank // c.ssm_n_group)


def gated_delta_net(q, k, v, g, beta, head, window, st, il: int, ctx, keep: int | None, Kc: int):
    """The fused ``ggml_gated_delta_net`` over the whole ubatch (``build_delta_net_fused``; with ``keep`` the last
    ``keep`` states are its snapshot slots, as ``build_recurrent_attn`` with n_rs_seq > 0 asks for),
    :func:`kernels.ggml.ssm.gated_delta_net`. q, k [T, Hk, S]; v [T, Hv, S]; g, beta [T, Hv]; ``window``: the conv
    input rows [Kc−1+T, C]. Returns (o [T, Hv, S], T entries: a state where a slot keeps one, else None)."""
    T, Hv, S = v.shape
    Hk = q.shape[1]
    if not np.array_equal(head, np.arange(Hv) % Hk):  # the fused op reads head j % Hk: other orders are expanded
        q, k = q[:, head], k[:, head]  # [T, Hv, S] each (a copy: ggml_repeat / get_rows move bits only)
    n_snap = 1 if keep is None else max(1, min(T, keep))
    o, snaps = ssm.gated_delta_net(q, k, v, g, beta, st.ssm, ctx.ggml, K=n_snap)  # [T, Hv, S], state(s)
    snaps = snaps[None] if n_snap == 1 else snaps  # [n_snap, Hv, S, S]: slot s = the state after token T−1−s
    states = [None] * T
    for slot in range(n_snap):
        t = T - 1 - slot
        M = ctx.cb("deltanet.state", il, snaps[slot], n_tokens=T)  # [Hv, S, S]
        states[t] = dataclasses.replace(st, conv=window[t + 1 : t + Kc], ssm=M)  # after token t: the window's last Kc−1 rows
    return o, states
