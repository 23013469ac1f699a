"""The trunk as llama.cpp decodes it (``--emulate=ggml``): ``llama_context::decode`` splits a batch into ubatches
of ``n_ubatch`` tokens, and each ubatch runs ``graph::graph`` of ``src/models/qwen35moe.cpp`` (``qwen35.cpp`` /
``qwen3next.cpp``: the same layer loop, other blocks inside) with every op ggml-cpu's::

    inpL = ggml_get_rows(tok_embd, inp_tokens)                         model.input_embed
    per layer: cur = build_norm(inpL, attn_norm)                       attn_norm
               cur = build_layer_attn_linear(cur) or build_layer_attn(cur)
               cur = ggml_add(cur, inpSA)                              attn_residual
               cur = build_norm(cur, attn_post_norm)                   attn_post_norm
               cur = build_layer_ffn(cur); cur = ggml_add(cur, ffn_residual)   l_out
    cur = build_norm(cur, output_norm)                                 result_norm
    cur = ggml_mul_mat(output, cur) on the ubatch's output rows        result_output

The reference walks the same loop in :mod:`refimpl.model.trunk` (deliberately parallel: the residual adds are the
same float32 sums, the traced names the same); :func:`refimpl.model.trunk.forward` hands a ``Ctx(ggml=…)`` here,
after checking the tokens and ``outputs``.
"""

from __future__ import annotations

import numpy as np

from refimpl.errors import RefimplError
from refimpl.graph.attention import build_layer_attn, kv_cache_cells
from refimpl.graph.deltanet import build_layer_attn_linear
from refimpl.graph.layout import check_ggml_weights
from refimpl.graph.moe import build_layer_ffn
from refimpl.graph.ops import by_ubatch, get_rows, output_rows, rms_norm_w

def forward(model, state, tokens: np.ndarray, ctx, phase: str, outputs: str):
    """T checked tokens [T] at positions n_past … n_past+T−1, ubatch by ubatch (``ops.by_ubatch``). ``model``:
    :class:`refimpl.model.load.Model`; ``state``: :class:`refimpl.model.state.SeqState`; ``phase``: the streamer's
    name of the whole batch. Returns (result_output or None, h_nextn [T, E], new state), as
    :func:`refimpl.model.trunk.forward`."""
    T = int(tokens.size)
    if T > ctx.n_ubatch:  # llama_decode splits the batch into ubatches of n_ubatch tokens
        return by_ubatch(lambda st, u0, u1, out: ubatch(model, st, tokens[u0:u1], ctx, phase, out),
                         T, ctx.n_ubatch, outputs, state)
    return ubatch(model, state, tokens, ctx, phase, outputs)


def ubatch(model, state, tokens: np.ndarray, ctx, phase: str, outputs: str):
    """One ubatch's graph (``graph::graph``), after the checks llama.cpp makes before it: every weight's kernel
    emulated (:func:`refimpl.graph.layout.check_ggml_weights`), the context large enough."""
    c, w = model.config, model.weights
    T = int(tokens.size)
    check_ggml_weights(model.file.gguf, ctx.ggml, ctx.repack)
    n_cells = kv_cache_cells(c, ctx)
    if state.n_past + T > n_cells:
        raise RefimplError(f"--emulate=ggml: the emulated llama.cpp context holds {n_cells} cells (n_ctx "
                           f"{ctx.n_ctx or c.n_ctx_train}); {state.n_past + T} tokens do not fit, as in llama.cpp")
    positions = state.n_past + np.arange(T, dtype=np.int32)  # [T]

    h = ctx.cb("model.input_embed", -1, get_rows(w.token_embd, tokens, ctx))  # [T, E]
    layers = list(state.layers)
    per_token = [[None] * c.n_layer for _ in range(T)]  # the recurrent states the fused op keeps (snapshot slots)
    with model.stream_phase(phase, positions):
        for il, lw in enumerate(w.layers):
            a = ctx.cb("attn_norm", il, rms_norm_w(h, lw.attn_norm, c.rms_eps, ctx))  # [T, E]
            if c.is_recurrent[il]:
                m, states = build_layer_attn_linear(lw.mixer, c, a, layers[il], il, ctx, keep=state.n_rs_seq + 1)
                layers[il] = states[-1]
                for t in range(T):
                    per_token[t][il] = states[t]
            else:
                m, layers[il] = build_layer_attn(lw.mixer, c, a, positions, layers[il], il, ctx)  # [T, E]
            r = ctx.cb("attn_residual", il, m + h)  # [T, E]: ggml_add
            x = ctx.cb("attn_post_norm", il, rms_norm_w(r, lw.post_attention_norm, c.rms_eps, ctx))  # [T, E]
            f = build_layer_ffn(lw.ffn, c, x, il, ctx)  # [T, E]
            h = ctx.cb("l_out", il, f + r)  # [T, E]: ggml_add

    h_nextn = ctx.cb("result_norm", -1, rms_norm_w(h, w.output_norm, c.rms_eps, ctx))  # [T, E]
    logits = output_rows(w.output, h_nextn, outputs, ctx)  # [T, V], [1, V] or None
    h_mtp = ctx.cb("trunk.h_nextn", -1, h_nextn, pre_norm=h)  # what the MTP head is handed
    if ctx.announce is not None:  # the CLI's "emulating ggml-cpu …" line, once a ubatch computed: an op refused
        ctx.announce()  # inside it (kernels.ggml.build.NotEmulated, an ARM kernel not emulated yet) stays one line
    return logits, h_mtp, state.advanced(T, tuple(layers), [tuple(p) for p in per_token])
