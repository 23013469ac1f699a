"""The nextn / MTP head as llama.cpp builds it (``graph_mtp`` of ``src/models/qwen35moe.cpp``; ``qwen35.cpp`` and
``qwen3next.cpp`` have the same head with their own FFN and RoPE), ubatch by ubatch, every op ggml-cpu's::

    mtp_tok_embd = ggml_get_rows(embed_tokens, tokens)
    mtp_enorm, mtp_hnorm = build_norm(…);  mtp_concat = ggml_concat(enorm, hnorm)
    mtp_eh_proj = ggml_mul_mat(eh_proj, concat)
    build_layer_attn (the head's own KV cache), ggml_add; build_norm; build_layer_ffn, ggml_add
    h_nextn = build_norm(shared_head_norm);  result_output = ggml_mul_mat(shared_head_head, …)

The reference computes the same head in :mod:`refimpl.model.mtp` (deliberately parallel: the same traced names,
the same residual adds); :func:`refimpl.model.mtp.mtp_forward` hands a ``Ctx(ggml=…)`` here.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from refimpl.graph.attention import build_layer_attn
from refimpl.graph.moe import build_layer_ffn
from refimpl.graph.ops import by_ubatch, get_rows, mul_mat, output_rows, rms_norm_w


def mtp_forward(model, w, state, tokens: np.ndarray, h: np.ndarray, ctx, outputs: str):
    """The head on T rows (tokens [T], h [T, E]) at positions n_past …, ubatch by ubatch (llama.cpp's MTP context
    decodes a long catch-up in ubatches). ``w``: :class:`refimpl.model.mtp.MTPWeights`; ``state``:
    :class:`refimpl.model.mtp.MTPState`. Returns (logits or None, h_nextn [T, E], new state)."""
    T = int(tokens.size)
    if T > ctx.n_ubatch:
        return by_ubatch(lambda st, u0, u1, out: ubatch(model, w, st, tokens[u0:u1], h[u0:u1], ctx, out),
                         T, ctx.n_ubatch, outputs, state)
    return ubatch(model, w, state, tokens, h, ctx, outputs)


def ubatch(model, w, state, tokens: np.ndarray, h: np.ndarray, ctx, outputs: str):
    """One ubatch's ``graph_mtp``."""
    c = model.config
    il = c.n_layer
    positions = state.n_past + np.arange(tokens.size, dtype=np.int32)  # [T]

    e = ctx.cb("mtp_tok_embd", il, get_rows(w.embed_tokens, tokens, ctx))  # [T, E]
    enorm, hnorm = ctx.cb("mtp.input_norms", il, (w.enorm, w.hnorm))
    hn = ctx.cb("mtp_hnorm", il, rms_norm_w(h, hnorm, c.rms_eps, ctx))  # [T, E]
    en = ctx.cb("mtp_enorm", il, rms_norm_w(e, enorm, c.rms_eps, ctx))  # [T, E]
    concat = ctx.cb("mtp_concat", il, np.concatenate([en, hn], axis=-1))  # [T, 2E]: ggml_concat, a bit copy
    z = ctx.cb("mtp_eh_proj", il, mul_mat(w.eh_proj, concat, ctx))  # [T, E]

    lw = w.layer
    a = ctx.cb("mtp_attn_norm", il, rms_norm_w(z, lw.attn_norm, c.rms_eps, ctx))  # [T, E]
    attn, kv = build_layer_attn(lw.mixer, c, a, positions, state.kv, il, ctx, prefix="mtp_")  # [T, E]
    ctx.cb("mtp_attn_out", il, attn)
    r = ctx.cb("mtp_attn_residual", il, attn + z)  # [T, E]: ggml_add
    x = ctx.cb("mtp_attn_post_norm", il, rms_norm_w(r, lw.post_attention_norm, c.rms_eps, ctx))  # [T, E]
    with model.stream_phase("mtp", positions):  # the expert streamer counts these reads as the head's
        f = build_layer_ffn(lw.ffn, c, x, il, ctx, prefix="mtp_")  # [T, E]
    out = ctx.cb("mtp_post_ffn", il, f + r)  # [T, E]: ggml_add

    h_nextn = ctx.cb("h_nextn", -1, rms_norm_w(out, w.shared_head_norm, c.rms_eps, ctx))  # [T, E]
    logits = output_rows(w.shared_head_head, h_nextn, outputs, ctx)  # [T, V], [1, V] or None
    if ctx.announce is not None:  # the CLI's "emulating ggml-cpu …" line, if the head computed first (as the trunk's)
        ctx.announce()
    return logits, h_nextn, dataclasses.replace(state, n_past=state.n_past + int(tokens.size), kv=kv)
