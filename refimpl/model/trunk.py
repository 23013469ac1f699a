"""Step 8: the trunk — ``graph::graph`` of ``src/models/qwen35moe.cpp`` (and of ``qwen35.cpp`` /
``qwen3next.cpp``, the same layer loop: only the blocks inside differ, see refimpl.io.config.Arch).

The layer skeleton is walked through in docs/architecture.md, "One token, step by step".

For each of the L trunk layers, with h⁰ = the token embedding rows::

    attn_norm     a = RMSNorm(h, attn_norm)
    mixer         m = GatedDeltaNet(a)  if the layer is recurrent  else  GatedAttention(a)
    attn_residual r = h + m
    attn_post_norm  x = RMSNorm(r, post_attention_norm)
    ffn_out       f = MoE(x) + sigmoid-gated shared expert   (qwen35: dense SwiGLU(x))
    l_out         h = r + f

then ``h_nextn = result_norm = RMSNorm(h, output_norm)`` and ``result_output = W_out · h_nextn``
(``output.weight``, or ``token_embd.weight`` when tied). ``h_nextn`` is what the MTP head is fed.

:func:`forward` processes T consecutive tokens of one sequence in one call (a prompt, a single
decode step, or a 1+N verify batch) and returns every position's logits. With the reference numerics
(``Ctx()``, the default) every operation treats rows independently and identically, so the logits of a
batch are bit-identical to decoding the same tokens one at a time (tested in tests/test_trunk.py) — unlike a
batched C++ engine. ``--emulate`` breaks that where llama.cpp does (flash attention's tiled and split-KV
paths depend on the batch), and so does ``--emulate=ggml`` (a kernel depends on the row count).

The one place the numerics is chosen: :func:`forward` hands a ``Ctx(ggml=PATH)`` (``--emulate=ggml``) to
llama.cpp's graph, :func:`refimpl.graph.trunk.forward`; everything below that line in this folder is the
reference. (:func:`refimpl.model.mtp.mtp_forward` does the same for the MTP head.)

With ``load_model(path, cache_mb=…)`` (:mod:`refimpl.model.load`) the routed experts are streamed from the file
(:mod:`refimpl.io.streamer`); ``forward`` then declares which trunk pass it is — ``prompt``, ``decode``
or ``verify`` — so the streamer can say whose routing caused each read (docs/streamer.md).
"""

from __future__ import annotations

import numpy as np

from refimpl.graph import trunk as ggml_graph
from refimpl.model.attention import gated_attention
from refimpl.model.deltanet import gated_deltanet
from refimpl.model.load import Model, load_model  # noqa: F401  (imported from here by the decoders, tests and docs)
from refimpl.model.moe import ffn
from refimpl.model.ops import OUTPUTS, Ctx, ieee, output_rows, rms_norm_w
from refimpl.model.state import SeqState


def trunk_phase(n_tokens: int, n_past: int) -> str:
    """Which trunk pass a forward call is, for the streamer: one token → ``decode``; several at
    position 0 → ``prompt``; several after that → ``verify`` (a speculative 1+N batch)."""
    return "decode" if n_tokens == 1 else "prompt" if n_past == 0 else "verify"


@ieee  # inf/NaN weights: the IEEE values, silently, as in C
def forward(model: Model, state: SeqState, tokens, ctx: Ctx = Ctx(), *, phase: str | None = None,
            outputs: str = "all") -> tuple[np.ndarray | None, np.ndarray, SeqState]:
    """Run T tokens at positions n_past … n_past+T−1.

    Returns (result_output [T, V] float32, h_nextn [T, E] float32, new state). ``outputs``: the rows
    whose logits are computed — ``"all"``; ``"last"`` (result_output [1, V], the last position's: a
    prompt); ``"none"`` (None: only the hiddens and the state are needed) — :func:`refimpl.model.ops.output_rows`.
    ``phase`` names the pass for the expert streamer's counters (default :func:`trunk_phase`);
    numbers never depend on it nor on ``outputs``.
    """
    c, w = model.config, model.weights
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [T]
    if tokens.size == 0:
        raise ValueError("forward() needs at least one token")
    if tokens.min() < 0 or tokens.max() >= c.n_vocab:
        raise ValueError(f"token id out of range [0, {c.n_vocab})")
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs must be one of {OUTPUTS}, not {outputs!r}")
    T = int(tokens.size)
    phase = phase or trunk_phase(T, state.n_past)
    if ctx.ggml:  # --emulate=ggml: llama.cpp's graph as ggml-cpu computes it, ubatch by ubatch (refimpl/graph/)
        return ggml_graph.forward(model, state, tokens, ctx, phase, outputs)

    positions = state.n_past + np.arange(T, dtype=np.int32)  # [T]
    h = ctx.cb("model.input_embed", -1, w.token_embd.rows(tokens))  # [T, E]: ggml_get_rows
    layers = list(state.layers)
    per_token = [[None] * c.n_layer for _ in range(T)]  # recurrent state after each token
    with model.stream_phase(phase, positions):
        for il, lw in enumerate(w.layers):
            a = ctx.cb("attn_norm", il, rms_norm_w(h, lw.attn_norm, c.rms_eps))  # [T, E]
            if c.is_recurrent[il]:
                m, states = gated_deltanet(lw.mixer, c, a, layers[il], il, ctx, keep=state.n_rs_seq + 1)  # [T, E], T states
                # (the last n_rs_seq + 1: the snapshot ring's new entries and the new state; the rest None)
                layers[il] = states[-1]
                for t in range(T):
                    per_token[t][il] = states[t]
            else:
                m, layers[il] = gated_attention(lw.mixer, c, a, positions, layers[il], il, ctx)  # [T, E]
            r = ctx.cb("attn_residual", il, m + h)  # [T, E]
            x = ctx.cb("attn_post_norm", il, rms_norm_w(r, lw.post_attention_norm, c.rms_eps))  # [T, E]
            f = ffn(lw.ffn, c, x, il, ctx)  # [T, E]
            h = ctx.cb("l_out", il, f + r)  # [T, E]

    h_nextn = ctx.cb("result_norm", -1, rms_norm_w(h, w.output_norm, c.rms_eps))  # [T, E]
    logits = output_rows(w.output, h_nextn, outputs, ctx)  # [T, V], [1, V] or None
    h_mtp = ctx.cb("trunk.h_nextn", -1, h_nextn, pre_norm=h)  # what the MTP head is handed
    return logits, h_mtp, state.advanced(T, tuple(layers), [tuple(p) for p in per_token])
