"""The graph's blocks in the order a second process compiles their kernels ahead of a first run
(``refimpl/cli/compile_ahead.py``): numba compiles each kernel on its first call, so a run on an empty cache
compiles ~20 kernels one after the other, in the order :func:`refimpl.graph.trunk.ubatch` meets them — the
input embedding, then per layer the norm, the mixer (the delta net first in qwen35moe), the FFN — and on a
machine with a second core the other process compiles from the other end: the attention core (RoPE, the cache
write, ``build_attn_mha``), the FFN, the attention layer, the LM head, the delta-net layer. Where both need one
kernel, one compiles and the other waits for it and loads it (kernels/base/flags.py ``_lock_compiles``).

The blocks run on stand-in activations of the run's shapes and types (what numba compiles for): a hidden state of
small normal values, the state a fresh sequence starts from, the run's ``Ctx``. Their numbers are thrown away;
the run's own numbers never depend on this walk (the kernels compiled are the same machine code either way).
"""

from __future__ import annotations

import numpy as np

from kernels.ggml import vecmath
from refimpl.graph.attention import attend, build_layer_attn, rope
from refimpl.graph.deltanet import build_layer_attn_linear
from refimpl.graph.moe import build_layer_ffn
from refimpl.graph.ops import F32, get_rows, output_rows, rms_norm_w, sigmoid


def walk(model, state, n_tokens: int, ctx, outputs: str) -> None:
    """One ubatch of ``n_tokens`` tokens at ``state`` (a fresh :class:`refimpl.model.state.SeqState`), block by
    block, last-met kernels first (the module docstring); ``outputs`` as :func:`refimpl.graph.trunk.forward`'s."""
    c, w = model.config, model.weights
    T = n_tokens
    rng = np.random.default_rng(0)
    x = (0.1 * rng.standard_normal((T, c.n_embd))).astype(F32)  # [T, E]: a stand-in hidden state
    positions = state.n_past + np.arange(T, dtype=np.int32)  # [T]
    attn = [il for il in range(c.n_layer) if not c.is_recurrent[il]]
    linear = [il for il in range(c.n_layer) if c.is_recurrent[il]]
    with model.stream_phase("prompt" if T > 1 else "decode", positions):
        if attn:  # build_layer_attn's steps 2-4 on stand-in q, k, v (no projection: the run compiles that first)
            il = attn[0]
            H, Hkv, D = c.n_head, c.n_head_kv, c.head_dim
            q = (0.1 * rng.standard_normal((T, H, D))).astype(F32)  # [T, H, D]
            k = (0.1 * rng.standard_normal((T, Hkv, D))).astype(F32)  # [T, Hkv, D]
            v = (0.1 * rng.standard_normal((T, Hkv, D))).astype(F32)  # [T, Hkv, D]
            q, k = rope(q, k, positions, c.n_rot, c, ctx)  # [T, H, D], [T, Hkv, D]
            if ctx.kv_f16:
                k, v = vecmath.cast_f16(k).astype(F32), vecmath.cast_f16(v).astype(F32)
            kv = state.layers[il].append(k, v, positions)
            o = attend(q, kv, positions, c, ctx).reshape(T, H * D)  # [T, H, D] -> [T, HD]
            o * sigmoid(o, ctx)  # [T, HD]: the gate
        build_layer_ffn(w.layers[-1].ffn, c, x, c.n_layer - 1, ctx)  # [T, E]
        if attn:
            build_layer_attn(w.layers[attn[0]].mixer, c, x, positions, state.layers[attn[0]], attn[0], ctx)  # [T, E]
        output_rows(w.output, rms_norm_w(x, w.output_norm, c.rms_eps, ctx), outputs, ctx)  # [T or 1, V]
        if linear:
            il = linear[0]
            build_layer_attn_linear(w.layers[il].mixer, c, x, state.layers[il], il, ctx, keep=state.n_rs_seq + 1)
        get_rows(w.token_embd, np.zeros(T, np.int64), ctx)  # [T, E]
