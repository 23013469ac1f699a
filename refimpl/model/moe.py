"""The FFN block: MoE with a sigmoid-gated shared expert (qwen35moe, qwen3next), or a dense SwiGLU
(qwen35) — ``graph::build_layer_ffn`` of each arch, ``llama-graph.cpp::build_moe_ffn`` and ``build_ffn``.
:func:`ffn` picks by the weights it is given.

Dense (``qwen35.cpp::build_layer_ffn``): ``ffn_out = ffn_down(silu(ffn_gate x) ⊙ ffn_up x)``
(:func:`swiglu`, ``build_ffn`` with LLM_FFN_SILU / LLM_FFN_PAR: ``ggml_swiglu_split``).

Per token, input x = RMSNorm(r, post_attention_norm) [E]:

1. ``ffn_moe_logits = W_router x`` [X]; ``ffn_moe_probs = softmax`` over **all** X experts.
2. ``ffn_moe_topk``: the K experts with the largest probability, descending (ggml's argsort
   top-k; ties are unspecified there, lowest index first here).
3. ``ffn_moe_weights_norm``: w = p[sel] / max(Σ p[sel], 2^-14) (renormalisation is hard-coded on
   for this arch; no expert_weights_scale).
4. per selected expert e, in selection order: SwiGLU ``down_e(silu(gate_e x) ⊙ up_e x)``, times w_e
   (weights applied after the down projection), then summed left to right (a chain of ggml_add).
   Computed expert by expert for a batch: each expert of the batch's union multiplies all the rows
   that selected it at once (as ``ggml_mul_mat_id`` does), so a verify batch decodes each routed
   expert's weights once; every row's numbers are those of the row alone. A decoded token (T = 1)
   multiplies its K experts' gate, up and down matrices in one call each (:func:`mul_mat_id`).
5. shared expert ``down_s(silu(gate_s x) ⊙ up_s x)`` times the scalar gate
   ``sigmoid(ffn_gate_inp_shexp · x)``; ``ffn_out = ffn_moe_out + that``.

Routed experts are reached only through ``w.experts.routed(sel, weights)``, the batch's experts,
an object with ``gate(e)``, ``up(e)``, ``down(e)`` returning weight matrices: ``refimpl.io.weights``
pins them from the memory map (``routed`` returns itself), and ``refimpl.io.streamer`` reads the union
of the batch's selected experts from the file once, there (docs/streamer.md).

``--emulate=ggml`` computes this block as llama.cpp's graph does: :mod:`refimpl.graph.moe`.
"""

from __future__ import annotations

import numpy as np

import kernels
from refimpl.io.weights import DenseFFNWeights
from refimpl.model.ops import F32, Ctx, dot64, mm, sigmoid, silu, softmax, swiglu as swiglu_op

W_SUM_MIN = F32(6.103515625e-5)  # build_moe_ffn: the sum of the selected weights clamped at 2^-14


def swiglu(gate, up, down, x: np.ndarray, il: int, ctx: Ctx, prefix: str = "") -> np.ndarray:
    """``build_ffn(x, up, gate, down, LLM_FFN_SILU, LLM_FFN_PAR)``: down(silu(gate x) ⊙ up x).
    x [T, E] -> [T, E]; the product before ``down`` is traced as ``ffn_swiglu`` (as build_ffn names it)."""
    act = ctx.cb(prefix + "ffn_swiglu", il, swiglu_op(mm(gate, x, ctx), mm(up, x, ctx)))  # [T, F]
    return mm(down, act, ctx)  # [T, F] -> [T, E]


def ffn(w, c, x: np.ndarray, il: int, ctx: Ctx, prefix: str = "") -> np.ndarray:
    """The layer's FFN on x = attn_post_norm [T, E] -> ffn_out [T, E]: :func:`moe_ffn` for MoE
    weights, :func:`swiglu` for qwen35's :class:`refimpl.io.weights.DenseFFNWeights`."""
    if isinstance(w, DenseFFNWeights):
        return ctx.cb(prefix + "ffn_out", il, swiglu(w.ffn_gate, w.ffn_up, w.ffn_down, x, il, ctx, prefix))
    out, _, _ = moe_ffn(w, c, x, il, ctx, prefix)
    return out


def route(logits: np.ndarray, n_used: int, il: int = -1, ctx: Ctx = Ctx()) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over all experts, top-K, renormalise. logits [T, X] -> (sel [T, K] int, w [T, K])."""
    probs = softmax(logits)  # [T, X]
    sel = np.argsort(-probs, axis=-1, kind="stable")[:, :n_used]  # [T, K], descending probability
    w = np.take_along_axis(probs, sel, axis=-1)  # [T, K]
    w_sum = np.sum(w, axis=-1, keepdims=True, dtype=F32)  # ggml_sum_rows (float)
    w = w / np.maximum(w_sum, W_SUM_MIN)  # clamp at 2^-14, then divide
    return sel, ctx.cb("moe.weights", il, w.astype(F32), probs=probs, sel=sel)


def mul_mat_id(experts, which: tuple[str, ...], ids: np.ndarray, x: np.ndarray, ctx: Ctx) -> list[np.ndarray]:
    """``ggml_mul_mat_id`` with one row per expert, for each matrix named in ``which`` ("gate", "up",
    "down"): x[i] times expert ids[i]'s matrix, [K, in] -> [K, out] — the numbers of ``mm`` expert by
    expert. Pinned experts on the plain numba path go through one kernel call per matrix for all K
    (``kernels.matmul_experts``: a decoded token's experts in one parallel pass); streamed experts,
    ``--emulate`` and the numpy path expert by expert, all of ``which`` for one expert before the
    next (a streamed expert's slices are read in that order: its matrices are multiplied while the
    next experts' are still being read)."""
    stacked = getattr(experts, "stacked", None)
    if stacked is not None and ctx.kernel == "numba" and not ctx.act_quant:
        return [kernels.matmul_experts(m.raw, m.qtype, ids, x, rows) for m, rows in map(stacked, which)]
    per_expert = [[mm(getattr(experts, w)(int(e)), x[i : i + 1], ctx) for w in which] for i, e in enumerate(ids)]
    return [np.concatenate(products) for products in zip(*per_expert)]  # each [K, out]


def moe_ffn(w, c, x: np.ndarray, il: int, ctx: Ctx, prefix: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Routed experts + shared expert. x [T, E] -> (ffn_out [T, E], sel [T, K], weights [T, K]).

    ``prefix`` is prepended to traced names (``"mtp_"`` in the MTP block)."""
    T = x.shape[0]
    logits = ctx.cb(prefix + "ffn_moe_logits", il, mm(w.ffn_gate_inp, x, ctx))  # [T, X]
    sel, weights = route(logits, c.n_expert_used, il, ctx)  # [T, K], [T, K]
    ctx.cb(prefix + "ffn_moe_topk", il, sel)
    ctx.cb(prefix + "ffn_moe_weights_norm", il, weights)

    experts = w.experts.routed(sel, weights)  # the batch's experts (a streamer reads their union here, once)
    # Each expert once, for all the rows that chose it (mul_mat_id): rows are independent in every
    # op, so expert_out[t, i] is the same whether token t is alone or in a batch (weights read once).
    moe_swiglu = np.empty((T, c.n_expert_used, c.n_ff_exp), dtype=F32)  # [T, K, F]
    expert_out = np.empty((T, c.n_expert_used, c.n_embd), dtype=F32)  # [T, K, E], before weighting
    if T == 1:  # a decoded token: gate, up and down each for all its K experts at once (mul_mat_id)
        xk = np.repeat(x, c.n_expert_used, axis=0)  # [K, E]: the token's row once per expert
        gate, up = mul_mat_id(experts, ("gate", "up"), sel[0], xk, ctx)  # [K, F] each
        moe_swiglu[0] = silu(gate) * up  # [K, F]
        moe_swiglu = ctx.cb(prefix + "ffn_moe_swiglu", il, moe_swiglu)
        (expert_out[0],) = mul_mat_id(experts, ("down",), sel[0], moe_swiglu[0], ctx)  # [K, F] -> [K, E]
    else:
        union = list(dict.fromkeys(sel.reshape(-1).tolist()))  # the batch's experts in first-use order
        chosen = {e: np.nonzero(sel == e) for e in union}  # e -> (the tokens that chose e, where in their top-K)
        for e in union:
            xe = x[chosen[e][0]]  # [n, E]
            moe_swiglu[chosen[e]] = silu(mm(experts.gate(e), xe, ctx)) * mm(experts.up(e), xe, ctx)  # [n, F]
        moe_swiglu = ctx.cb(prefix + "ffn_moe_swiglu", il, moe_swiglu)
        for e in union:
            expert_out[chosen[e]] = mm(experts.down(e), moe_swiglu[chosen[e]], ctx)  # [n, F] -> [n, E]
    moe_out = np.zeros((T, c.n_embd), dtype=F32)
    for t in range(T):  # weighted after the down projection, summed in selection order
        acc = expert_out[t, 0] * weights[t, 0]  # [E]
        for i in range(1, c.n_expert_used):
            acc = acc + expert_out[t, i] * weights[t, i]
        moe_out[t] = acc
    ctx.cb(prefix + "ffn_moe_out", il, moe_out)

    shexp = ctx.cb(prefix + "ffn_shexp", il, swiglu(w.ffn_gate_shexp, w.ffn_up_shexp, w.ffn_down_shexp, x, il, ctx, prefix))  # [T, E]
    shared_gate = sigmoid(dot64(x, w.ffn_gate_inp_shexp[None, :], ctx.kernel))  # [T]: a [E]·[E, T] mat-vec
    shared_gate = ctx.cb("moe.shared_gate", il, shared_gate)
    ctx.cb(prefix + "shared_expert_gate_sigmoid", il, shared_gate)
    out = moe_out + shexp * shared_gate[:, None]  # [T, E]
    return ctx.cb(prefix + "ffn_out", il, out), sel, weights
