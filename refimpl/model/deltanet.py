"""Gated DeltaNet layer (``graph::build_layer_attn_linear`` of ``src/models/qwen35moe.cpp`` /
``qwen35.cpp`` / ``qwen3next.cpp``, ``delta-net-base.cpp``).

Gated DeltaNet (Yang, Kautz, Hatamizadeh, arXiv 2412.06464) keeps, per value head j, a matrix
state M_j [S_v, S_k] updated by the gated delta rule. Letters (the legend of docs/architecture.md): Hk key
heads (GGUF ``ssm.group_count``, ``Config.ssm_n_group``), Hv value heads (``ssm.time_step_rank``,
``Config.ssm_dt_rank``), S the head dimension of q, k and v (``ssm.state_size``, ``Config.ssm_d_state``;
S_k = S_v = S, the two subscripts say which axis of M), Kc the conv width; the state is always M (the paper
writes it S). Per token, with the symbols of the paper:

* α_j = exp(g_j) is the decay, g_j = softplus(alpha_j + dt_bias_j) · ssm_a_j ≤ 0 (log-space;
  ssm_a = −exp(A_log) is stored by the converter);
* β_j = sigmoid(beta_j) ∈ (0, 1) is the write strength (the "learning rate" of the delta rule);
* :func:`delta_rule_step` decays M_j by α_j, writes β_j (v_j − M_j k) kᵀ into it and reads o_j = (M_j q)
  / sqrt(S) out of the *updated* state — i.e. M ← α M (I − β k kᵀ) + β v kᵀ (ops.cpp
  ``ggml_compute_forward_gated_delta_net_one_chunk``; fla's ``naive_recurrent_gated_delta_rule`` is the
  same recurrence; docs/architecture.md, "The delta rule").

Value head j uses query/key head ``j mod Hk`` in qwen35moe / qwen35 (the converter's tiled V-head
order, docs/gguf.md §4) and ``j // (Hv/Hk)`` in qwen3next (grouped: the checkpoint's own order).
qwen3next also fuses its input projections differently (:func:`input_projections`). Before the
recurrence, q/k/v pass a depthwise causal conv over the last Kc inputs (window state
carried between calls), SiLU, and L2 norm of q and k. After it, a gated RMSNorm with SiLU(z) and
``ssm_out``.

Functions are pure: state in, (output, new state) out. ``--emulate=ggml`` computes this layer as
llama.cpp's graph does (``ggml_ssm_conv``, the fused ``ggml_gated_delta_net``): :mod:`refimpl.graph.deltanet`.
"""

from __future__ import annotations

import numpy as np

import kernels
from refimpl.model.ops import F32, Ctx, dot64, l2_norm, mm, rms_norm_w, sigmoid, silu, softplus
from refimpl.model.state import DeltaNetState


def causal_conv(window: np.ndarray, w_conv: np.ndarray) -> np.ndarray:
    """Depthwise causal conv (``ggml_compute_forward_ssm_conv_f32``) over the T new inputs of ``window``.

    window [Kc−1+T, C] = ``[conv_state ‖ x]`` (the Kc−1 inputs kept from before, oldest first, then
    the T new ones), w_conv [C, Kc] (column Kc−1 multiplies the current token). For token t the
    window is rows t … t+Kc−1; ``y[c] = Σ_i window[t+i, c] · w_conv[c, i]``, summed in float32 in
    order i = 0 … Kc−1. Returns y [T, C]. (The conv state after token t is rows t+1 … t+Kc−1 of the
    same window: :func:`gated_deltanet` keeps those.)
    """
    Kc = w_conv.shape[1]
    T = window.shape[0] - (Kc - 1)
    y = np.zeros((T, window.shape[1]), dtype=F32)
    for t in range(T):
        acc = np.zeros(window.shape[1], dtype=F32)  # float sumf = 0.0f
        for i in range(Kc):
            acc = acc + window[t + i] * w_conv[:, i]
        y[t] = acc
    return y


def delta_rule_step(M: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, decay: np.ndarray, beta: np.ndarray, scale) -> tuple[np.ndarray, np.ndarray]:
    """One token of the gated delta rule for all value heads (ops.cpp
    ``ggml_compute_forward_gated_delta_net_one_chunk``, one token); pure (M is not modified).

    **The definition** of the oracle's numbers: each line is one float32 operation, or one ``dot64``
    (exact float64 products summed from +0.0 in increasing index order, rounded once to float32), in
    this order, without fused multiply-adds. ``kernels.delta_rule_step`` is its compiled twin — the
    same operations, same bits (tests/test_kernels_recurrent.py) — and runs unless
    ``Ctx(kernel="numpy")``.

    M [Hv, S_v, S_k]; q, k [Hv, S_k] (already mapped to value heads); v [Hv, S_v]; decay = exp(g),
    beta [Hv]; scale = 1/sqrt(S_k), a float32 scalar. All float32. Returns (o [Hv, S_v], M' [Hv, S_v, S_k]).
    """
    M = M * decay[:, None, None]  # [Hv, S_v, S_k]: M_j ← α_j M_j
    u = dot64(M, k[:, None, :], "numpy")  # [Hv, S_v]: u[vi] = Σ_ki M[vi, ki] k[ki]
    delta = (v - u) * beta[:, None]  # [Hv, S_v]: δ = β_j (v_j − M_j k)
    M = M + delta[:, :, None] * k[:, None, :]  # [Hv, S_v, S_k]: M[vi, ki] += δ[vi] k[ki]
    o = dot64(M, q[:, None, :], "numpy") * scale  # [Hv, S_v]: o_j = (M_j q) / sqrt(S_k), from the updated state
    return o, M


def input_projections(w, c, a: np.ndarray, il: int, ctx: Ctx) -> tuple[np.ndarray, ...]:
    """The four input projections of a[T, E]: (qkv_mixed [T, C], z [T, Din], b [T, Hv], alpha [T, Hv]),
    value heads in the order the arch's recurrence reads them.

    * ``attn_qkv`` / ``attn_gate`` (``build_qkvz``; qwen3next's "optimized path" too);
    * qwen3next's legacy ``ssm_in`` (``qwen3next.cpp::build_qkvz``): rows viewed [Hk, 2S + 2·(Hv/Hk)·S],
      per key head g ``[q_g ‖ k_g ‖ v_g ‖ z_g]``; qkv_mixed = [all q ‖ all k ‖ all v] (``ggml_concat``),
      z = all z — the value heads of key head g are g·Hv/Hk … (g+1)·Hv/Hk − 1;
    * ``ssm_beta`` / ``ssm_alpha``, or qwen3next's ``ssm_ba`` (``build_layer_attn_linear``): rows viewed
      [Hk, 2·Hv/Hk], per key head ``[b_g ‖ a_g]``.
    """
    T = a.shape[0]
    Hk, Hv, S = c.ssm_n_group, c.ssm_dt_rank, c.ssm_d_state
    r = Hv // Hk  # value heads per key head
    if w.ssm_in is not None:
        mixed = ctx.cb("linear_attn_mixed_qkvz", il, mm(w.ssm_in, a, ctx)).reshape(T, Hk, 2 * S + 2 * r * S)  # [T, C+Din] -> [T, Hk, ·]
        q, k = mixed[:, :, :S], mixed[:, :, S : 2 * S]  # [T, Hk, S] each
        v, z = mixed[:, :, 2 * S : 2 * S + r * S], mixed[:, :, 2 * S + r * S :]  # [T, Hk, r·S] each
        qkv_mixed = ctx.cb("qkv_mixed", il, np.concatenate([x.reshape(T, -1) for x in (q, k, v)], axis=1))  # [T, C]
        z = ctx.cb("z", il, np.ascontiguousarray(z).reshape(T, Hv * S))  # [T, Din]
    else:
        qkv_mixed = ctx.cb("linear_attn_qkv_mixed", il, mm(w.attn_qkv, a, ctx))  # [T, C]
        z = ctx.cb("z", il, mm(w.attn_gate, a, ctx))  # [T, Din]
    if w.ssm_ba is not None:
        ba = ctx.cb("linear_attn_mixed_ba", il, mm(w.ssm_ba, a, ctx)).reshape(T, Hk, 2 * r)  # [T, 2Hv] -> [T, Hk, 2r]
        b, alpha = ba[:, :, :r].reshape(T, Hv), ba[:, :, r:].reshape(T, Hv)  # [T, Hv] each
    else:
        b, alpha = mm(w.ssm_beta, a, ctx), mm(w.ssm_alpha, a, ctx)  # [T, Hv] each
    return qkv_mixed, z, b, alpha


def kv_heads(c) -> np.ndarray:
    """[Hv]: the key head each value head reads — ``j mod Hk`` (tiled: ``ggml_repeat_4d`` in
    ``qwen35.cpp``, or the fused GDN op's broadcast) or ``j // (Hv/Hk)`` (grouped: qwen3next.cpp's
    reshape–repeat–reshape "repeat interleave")."""
    j = np.arange(c.ssm_dt_rank)
    return j % c.ssm_n_group if c.arch.gdn_heads == "tiled" else j // (c.ssm_dt_rank // c.ssm_n_group)


def gated_deltanet(w, c, a: np.ndarray, st: DeltaNetState, il: int, ctx: Ctx,
                   keep: int | None = None) -> tuple[np.ndarray, list[DeltaNetState | None]]:
    """One Gated DeltaNet layer over T consecutive tokens of one sequence.

    ``w``: :class:`refimpl.io.weights.DeltaNetWeights`; ``a``: attn_norm output [T, E].
    Returns (linear_attn_out [T, E], the state after each of the T tokens — the last one is the
    new state; the others are the per-position snapshots a rollback restores). ``keep``: only the
    last ``keep`` states are kept, the earlier entries are None (a prompt longer than the snapshot
    ring need not hold a state per token: 2 MiB each at real widths).
    """
    T = a.shape[0]
    Hk, Hv, S, Kc = c.ssm_n_group, c.ssm_dt_rank, c.ssm_d_state, c.ssm_d_conv
    qkv_mixed, z, b, alpha = input_projections(w, c, a, il, ctx)  # [T, C], [T, Din], [T, Hv], [T, Hv]
    beta = ctx.cb("beta_sigmoid", il, sigmoid(b))  # [T, Hv]
    g = ctx.cb("gate", il, softplus(alpha + w.ssm_dt) * w.ssm_a)  # [T, Hv], ≤ 0: ggml_add, ggml_softplus, ggml_mul

    window = np.concatenate([st.conv, qkv_mixed.astype(F32)])  # [Kc−1+T, C]: the conv state, then the new inputs
    conv_out = causal_conv(window, w.ssm_conv1d)  # [T, C]
    ctx.cb("conv_output_raw", il, conv_out)
    y = ctx.cb("conv_output_silu", il, silu(conv_out))  # [T, C]: over rows of C

    q = l2_norm(y[:, : Hk * S].reshape(T, Hk, S), c.rms_eps)  # [T, Hk, S]
    k = l2_norm(y[:, Hk * S : 2 * Hk * S].reshape(T, Hk, S), c.rms_eps)  # [T, Hk, S]
    v = np.ascontiguousarray(y[:, 2 * Hk * S :]).reshape(T, Hv, S)  # [T, Hv, S]
    head = ctx.cb("deltanet.kv_head", il, kv_heads(c), Hk=Hk)  # [Hv]: value head j reads q/k head head[j]
    o, states = recurrence(q, k, v, g, beta, head, window, y, st, il, ctx, keep, Kc)  # [T, Hv, S], T states
    ctx.cb("attn_output_delta", il, o)

    # gated norm (build_norm_gated): RMSNorm over S per head × ssm_norm (plain w) × silu(z)
    out = rms_norm_w(o, ctx.cb("deltanet.ssm_norm", il, w.ssm_norm), c.rms_eps) * silu(z.reshape(T, Hv, S))  # [T, Hv, S]
    final = ctx.cb("final_output", il, out.reshape(T, Hv * S))  # [T, Din]
    return ctx.cb("linear_attn_out", il, mm(w.ssm_out, final, ctx)), states


def recurrence(q, k, v, g, beta, head, window, y, st, il, ctx, keep, Kc):
    """The delta rule token by token (:func:`delta_rule_step` or its compiled twin), a state after each token
    (only the last ``keep`` kept). Returns (o [T, Hv, S], states)."""
    T, Hv, S = v.shape
    decay = np.exp(g)  # [T, Hv]: α = exp(g), numpy's expf (the compiled step calls no exp)
    scale = F32(1.0) / np.sqrt(F32(S))  # 1/sqrt(S_k)
    step = delta_rule_step if ctx.kernel == "numpy" else kernels.delta_rule_step  # the definition or its compiled twin: same bits
    window = ctx.cb("deltanet.conv_rows", il, window, conv_silu=y)  # [Kc−1+T, C]: the rows the conv states keep
    M = st.ssm
    o = np.empty((T, Hv, S), dtype=F32)
    states = []
    for t in range(T):
        o[t], M = step(M, q[t, head], k[t, head], v[t], decay[t], beta[t], scale)  # [Hv, S], [Hv, S, S]
        M = ctx.cb("deltanet.state", il, M, n_tokens=T)
        states.append(DeltaNetState(conv=window[t + 1 : t + Kc], ssm=M))  # after token t: the window's last Kc−1 rows
        if keep is not None and t >= keep:
            states[t - keep] = None  # outside the ring: freed now, its memory reused by the next steps
    return o, states
