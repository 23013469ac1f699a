"""The FFN block as llama.cpp builds it — ``build_moe_ffn`` of ``src/llama-graph.cpp`` (SOFTMAX gating, weights
normalized) with qwen35moe's sigmoid-gated shared expert (``graph::build_layer_ffn`` of qwen35moe.cpp /
qwen3next.cpp), or qwen35's dense ``build_ffn`` — and as ggml-cpu computes it, op for op.

Routed experts are reached through ``w.experts.routed(sel, weights)`` (pinned: views of the memory map; streamed:
the batch's union read once, refimpl.io.streamer), as in the reference. The reference computes the same block in
:mod:`refimpl.model.moe`; the traced names and the tap points are the same, deliberately parallel.
"""

from __future__ import annotations

import numpy as np

from kernels.base.blocks import QT
from kernels.ggml import mulmat, rows, vecmath
from refimpl.graph.ops import F32, mul_mat, sigmoid, soft_max, swiglu
from refimpl.io.weights import DenseFFNWeights, PinnedExperts

W_SUM_MIN = 6.103515625e-5  # build_moe_ffn: ggml_clamp(weights_sum, 6.103515625e-5, INFINITY) (2^-14; the reference's too)


def build_layer_ffn(w, c, x: np.ndarray, il: int, ctx, prefix: str = "") -> np.ndarray:
    """The layer's FFN on x = attn_post_norm [T, E] -> ffn_out [T, E]: :func:`build_moe_ffn` for MoE weights,
    :func:`build_ffn` for qwen35's :class:`refimpl.io.weights.DenseFFNWeights`."""
    if isinstance(w, DenseFFNWeights):
        return ctx.cb(prefix + "ffn_out", il, build_ffn(w.ffn_gate, w.ffn_up, w.ffn_down, x, il, ctx, prefix))
    out, _, _ = build_moe_ffn(w, c, x, il, ctx, prefix)
    return out


def build_ffn(gate, up, down, x: np.ndarray, il: int, ctx, prefix: str = "") -> np.ndarray:
    """``build_ffn(x, up, gate, down, LLM_FFN_SILU, LLM_FFN_PAR)``: ``ggml_mul_mat`` gate and up,
    ``ggml_swiglu_split`` (traced ``ffn_swiglu``), ``ggml_mul_mat`` down. x [T, E] -> [T, E]."""
    act = ctx.cb(prefix + "ffn_swiglu", il, swiglu(mul_mat(gate, x, ctx), mul_mat(up, x, ctx), ctx))  # [T, F]
    return mul_mat(down, act, ctx)  # [T, F] -> [T, E]


def build_moe_ffn(w, c, x: np.ndarray, il: int, ctx, prefix: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``build_moe_ffn`` + qwen35moe's gated shared expert, op by op: ``ggml_mul_mat`` (router) → ``ggml_soft_max``
    → ``ggml_argsort_top_k`` → ``ggml_get_rows`` of the probs → ``ggml_sum_rows`` → ``ggml_clamp(6.103515625e-5,
    INF)`` → ``ggml_div``; ``ggml_mul_mat_id`` up and gate → ``ggml_swiglu_split`` → ``ggml_mul_mat_id`` down →
    ``ggml_mul`` by the weights → the experts' views added in slot order (``ggml_add``); shared expert
    ``build_ffn``, its gate ``ggml_mul_mat`` with the F32 [E] weight (one output row) → ``ggml_sigmoid`` →
    ``ggml_mul``; ``ggml_add``. x [T, E] -> (ffn_out [T, E], sel [T, K], weights [T, K])."""
    K = c.n_expert_used
    logits = ctx.cb(prefix + "ffn_moe_logits", il, mul_mat(w.ffn_gate_inp, x, ctx))  # [T, X]
    probs = soft_max(logits, ctx)  # [T, X]
    sel = rows.argsort_desc(probs)[:, :K].astype(np.int64)  # [T, K]: ggml_argsort_top_k, a view of the argsort
    weights = np.take_along_axis(probs, sel, axis=-1)  # [T, K]: ggml_get_rows (a copy)
    w_sum = vecmath.clamp(vecmath.sum_rows(weights, ctx.ggml), W_SUM_MIN, np.inf)  # [T, 1]
    weights = ctx.cb("moe.weights", il, vecmath.div(weights, w_sum, ctx.ggml), probs=probs, sel=sel)  # [T, K]
    ctx.cb(prefix + "ffn_moe_topk", il, sel)
    ctx.cb(prefix + "ffn_moe_weights_norm", il, weights)

    experts = w.experts.routed(sel, weights, stacked=True)  # the batch's experts (a streamer reads their union here,
    # once: at a budget of 0 straight into mul_mat_id's stacks)
    x3 = np.ascontiguousarray(x, dtype=F32)[:, None, :]  # [T, 1, E]: ggml_reshape_3d(cur, n_embd, 1, n_tokens)
    up = mul_mat_id(experts, "up", sel, x3, ctx)  # [T, K, F]
    gate = mul_mat_id(experts, "gate", sel, x3, ctx)  # [T, K, F]
    act = ctx.cb(prefix + "ffn_moe_swiglu", il, swiglu(gate, up, ctx))  # [T, K, F]
    down = mul_mat_id(experts, "down", sel, act, ctx)  # [T, K, E]
    weighted = down * weights[:, :, None]  # [T, K, E]: ggml_mul, weights [1, K, T] broadcast over E
    moe_out = weighted[:, 0]
    for i in range(1, K):  # ggml_add of the views, slot by slot
        moe_out = moe_out + weighted[:, i]  # [T, E]
    ctx.cb(prefix + "ffn_moe_out", il, moe_out)

    shexp = ctx.cb(prefix + "ffn_shexp", il, build_ffn(w.ffn_gate_shexp, w.ffn_up_shexp, w.ffn_down_shexp, x, il, ctx, prefix))
    shared_gate = ctx.cb("moe.shared_gate", il, sigmoid(shared_gate_logits(w, x, ctx), ctx))  # [T]
    ctx.cb(prefix + "shared_expert_gate_sigmoid", il, shared_gate)
    out = moe_out + shexp * shared_gate[:, None]  # [T, E]: ggml_mul (broadcast), ggml_add
    return ctx.cb(prefix + "ffn_out", il, out), sel, weights


def shared_gate_logits(w, x: np.ndarray, ctx) -> np.ndarray:
    """The shared expert's gate before its sigmoid: ``ggml_mul_mat`` of the F32 [E] weight ``ffn_gate_inp_shexp``
    (one output row) and x [T, E] -> [T]."""
    gate_row = np.ascontiguousarray(w.ffn_gate_inp_shexp, dtype=F32).reshape(1, -1).view(np.uint8)  # [1, 4E] bytes
    return mulmat.mul_mat(gate_row, QT.F32, x, ctx.ggml, ctx.n_threads)[:, 0]  # [T]


def expert_stack(experts, which: str, sel: np.ndarray) -> tuple[np.ndarray, object, np.ndarray, int, object]:
    """The rows of ``ffn_{which}_exps`` that ``ggml_mul_mat_id`` reads, as (bytes [X, out, row bytes], type,
    ids [T, K] into them, rows per expert of the stored tensor): pinned experts give the whole stack (a view of
    the map, the fused gate_up tensor's gate or up rows as a strided view) and ``sel`` itself; streamed ones the
    batch's experts ``union`` of ``sel`` stacked in first-use order, and ``sel`` renumbered into it (the grouping
    of rows by expert, which is all the op depends on, is kept). The stored rows (2F for a fused gate_up tensor)
    decide whether llama.cpp repacks the tensor (``kernels.ggml.mulmat.repacked``). Last, the stack's column layout
    (``kernels.ggml.columns``) for those rows when the model was loaded with one, else None."""
    if isinstance(experts, PinnedExperts):
        m, (start, stop) = experts.stacked(which)
        whole = (start, stop) == (0, m.shape[1])
        rows_ = m.row_bytes if whole else m.row_bytes[:, start:stop]
        cols = m.cols if m.cols is None or whole else m.cols.columns(start, stop)  # its column layout, if built
        return rows_, m.qtype, sel.astype(np.int32), m.shape[1], cols
    union = list(dict.fromkeys(sel.reshape(-1).tolist()))  # the batch's experts in first-use order
    renumber = {e: i for i, e in enumerate(union)}
    ids = np.array([[renumber[e] for e in row] for row in sel.tolist()], dtype=np.int32)  # [T, K]: in union order
    tensor = experts.layer.layout(which)[0]
    stored_rows = tensor.shape[1]  # ExpertTensor.shape = (X, rows, cols)
    stack = experts.read_stack(which, union)  # [n, rows, row_bytes]: read straight into it (a budget of 0)
    if stack is None:  # slices the cache holds: stacked here
        stack = np.stack([getattr(experts, which)(int(e)).row_bytes for e in union])  # [n, rows, row_bytes]
    return stack, tensor.qtype, ids, stored_rows, None


def mul_mat_id(experts, which: str, sel: np.ndarray, x: np.ndarray, ctx) -> np.ndarray:
    """``ggml_mul_mat_id`` of ``ffn_{which}_exps`` on ``x`` [T, 1 or K, in] -> [T, K, out], repacked when llama.cpp
    loads that tensor into its CPU_REPACK buffer (``ctx.repack``: its default)."""
    w, qt, ids, stored_rows, cols = expert_stack(experts, which, sel)
    return mulmat.mul_mat_id(w, qt, x, ids, ctx.ggml, ctx.n_threads, repack=ctx.repack, tensor_rows=stored_rows,
                             cols=cols)
