"""Step 5: the trunk — ``llama_model_qwen35moe::graph::graph`` (spec §3.2).

For each of the L trunk layers, with h⁰ = the token embedding rows::

    attn_norm     a = RMSNorm(h, attn_norm)
    mixer         m = GatedDeltaNet(a)  if the layer is recurrent  else  GatedAttention(a)
    attn_residual r = h + m
    attn_post_norm  x = RMSNorm(r, post_attention_norm)
    ffn_out       f = MoE(x) + sigmoid-gated shared expert
    l_out         h = r + f

then ``h_nextn = result_norm = RMSNorm(h, output_norm)`` and ``result_output = W_out · h_nextn``
(``output.weight``, or ``token_embd.weight`` when tied). ``h_nextn`` is what the MTP head is fed.

:func:`forward` processes T consecutive tokens of one sequence in one call (a prompt, a single
decode step, or a 1+N verify batch) and returns every position's logits. Every operation treats
rows independently and identically, so the logits of a batch are bit-identical to decoding the
same tokens one at a time (tested in tests/test_trunk.py) — unlike a batched C++ engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from refimpl.attention import gated_attention
from refimpl.config import Config
from refimpl.deltanet import gated_deltanet
from refimpl.load import ModelFile, open_model
from refimpl.moe import moe_ffn
from refimpl.ops import Ctx, mm, rms_norm_w
from refimpl.state import SeqState
from refimpl.weights import Weights, load_weights


@dataclass(frozen=True)
class Model:
    file: ModelFile
    weights: Weights

    @property
    def config(self) -> Config:
        return self.file.config


def load_model(path: str | os.PathLike) -> Model:
    m = open_model(path)
    return Model(file=m, weights=load_weights(m))


def forward(model: Model, state: SeqState, tokens, ctx: Ctx = Ctx()) -> tuple[np.ndarray, np.ndarray, SeqState]:
    """Run T tokens at positions n_past … n_past+T−1.

    Returns (result_output [T, V] float32, h_nextn [T, E] float32, new state).
    """
    c, w = model.config, model.weights
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [T]
    if tokens.size == 0:
        raise ValueError("forward() needs at least one token")
    if tokens.min() < 0 or tokens.max() >= c.n_vocab:
        raise ValueError(f"token id out of range [0, {c.n_vocab})")
    positions = state.n_past + np.arange(tokens.size, dtype=np.int32)  # [T]

    T = int(tokens.size)
    h = ctx.cb("model.input_embed", -1, w.token_embd.rows(tokens))  # [T, E]
    layers = list(state.layers)
    per_token = [[None] * c.n_layer for _ in range(T)]  # recurrent state after each token
    for il, lw in enumerate(w.layers):
        a = ctx.cb("attn_norm", il, rms_norm_w(h, lw.attn_norm, c.rms_eps))  # [T, E]
        if c.is_recurrent[il]:
            m, states = gated_deltanet(lw.mixer, c, a, layers[il], il, ctx)  # [T, E], T states
            layers[il] = states[-1]
            for t in range(T):
                per_token[t][il] = states[t]
        else:
            m, layers[il] = gated_attention(lw.mixer, c, a, positions, layers[il], il, ctx)  # [T, E]
        r = ctx.cb("attn_residual", il, m + h)  # [T, E]
        x = ctx.cb("attn_post_norm", il, rms_norm_w(r, lw.post_attention_norm, c.rms_eps))  # [T, E]
        f, _, _ = moe_ffn(lw.ffn, c, x, il, ctx)  # [T, E]
        h = ctx.cb("l_out", il, f + r)  # [T, E]

    h_nextn = ctx.cb("result_norm", -1, rms_norm_w(h, w.output_norm, c.rms_eps))  # [T, E]
    logits = ctx.cb("result_output", -1, mm(w.output, h_nextn, ctx))  # [T, V]
    return logits, h_nextn, state.advanced(T, tuple(layers), [tuple(p) for p in per_token])
