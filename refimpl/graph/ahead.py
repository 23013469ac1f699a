"""The graph's ops in the order a second process compiles their kernels ahead of a first run
(``refimpl/cli/compile_ahead.py``). numba compiles each kernel on its first call, so a run on an empty cache
compiles ~20 kernels one after the other, in the order :func:`refimpl.graph.trunk.ubatch` meets them: the input
embedding, the norm, the projections (one Q8_0 kernel serves them all), the delta net's conv and fused op, the
FFN's router, softmax, top-k and experts, the shared expert's F32 gate, attention's RoPE, cache write and
``build_attn_mha``, the LM head. The other process takes them from the other end, each step's own op on stand-in
inputs (no projection before it, which the run compiles first): the fused delta net, the LM head (a Q4_K_M file's
Q6_K column kernel, ~13 s, is the run's last), ``build_attn_mha``'s core, then the FFN backwards — the shared
expert's gate, ``ggml_sum_rows``, the top-k, the softmax — each step skipped while the run is compiling a kernel it
calls (``kernels.base.cache.each_unless_busy``: builtin:kjv's head is the projections' Q8_0 kernel); and last the
whole blocks, one layer of each kind the weights make (a Q4_K_M file's ``ffn_down_exps`` is Q6_K in some layers),
for anything those skipped or missed. Where both need one kernel, one compiles it and the other waits and loads it
(kernels/base/cache.py ``_lock_compiles``). docs/performance.md, "First run".

Stand-ins have the run's shapes and types (what numba compiles for): small normal values, the state a fresh
sequence starts from, the run's ``Ctx``. Their numbers are thrown away; the run's own never depend on this walk
(the kernels are the same machine code whichever process compiles them). tests/test_compile_ahead.py checks that
the walk meets every kernel the run calls.
"""

from __future__ import annotations

import numpy as np

from kernels.base.cache import each_unless_busy
from kernels.ggml import mulmat_q8, rows, vecmath
from refimpl.graph.attention import build_attn, build_layer_attn, rope
from refimpl.graph.deltanet import build_layer_attn_linear, gated_delta_net, key_heads
from refimpl.graph.moe import build_layer_ffn, shared_gate_logits
from refimpl.graph.ops import F32, get_rows, mul_mat, output_rows, rms_norm_w, sigmoid, soft_max
from refimpl.io.stand_in import kinds


def walk(model, state, n_tokens: int, ctx, outputs: str) -> None:
    """One ubatch of ``n_tokens`` tokens at ``state`` (a fresh :class:`refimpl.model.state.SeqState`), the run's
    last-met kernels first (the module docstring); ``outputs`` as :func:`refimpl.graph.trunk.forward`'s."""
    c, w = model.config, model.weights
    T = n_tokens
    rng = np.random.default_rng(0)
    normal = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(F32)  # a stand-in activation
    x = normal(T, c.n_embd)  # [T, E]
    positions = state.n_past + np.arange(T, dtype=np.int32)  # [T]
    attn = [il for il in range(c.n_layer) if not c.is_recurrent[il]]
    linear = [il for il in range(c.n_layer) if c.is_recurrent[il]]
    ffn = w.layers[-1].ffn

    def fused_delta_net():  # build_layer_attn_linear's fused op (the conv window: the state's rows and T stand-in rows)
        il, Hk, Hv, S = linear[0], c.ssm_n_group, c.ssm_dt_rank, c.ssm_d_state
        st = state.layers[il]
        window = np.concatenate([st.conv, normal(T, st.conv.shape[1])])  # [Kc−1+T, C]
        beta = (0.5 + np.abs(normal(T, Hv))).astype(F32)  # [T, Hv]: a stand-in in (0, 1), not the sigmoid's kernel
        g = -np.abs(normal(T, Hv))  # [T, Hv]: a decay, ≤ 0
        gated_delta_net(normal(T, Hk, S), normal(T, Hk, S), normal(T, Hv, S), g, beta, key_heads(c), window, st, il,
                        ctx, state.n_rs_seq + 1, c.ssm_d_conv)  # [T, Hv, S]

    def attention_core():  # build_layer_attn's RoPE, cache write and build_attn_mha
        il, H, Hkv, D = attn[0], c.n_head, c.n_head_kv, c.head_dim
        q, k = rope(normal(T, H, D), normal(T, Hkv, D), positions, c.n_rot, c, ctx)  # [T, H, D], [T, Hkv, D]
        build_attn(q, k, normal(T, Hkv, D), positions, state.layers[il], c, ctx)  # [T, H, D]

    def router():  # build_moe_ffn backwards: the weights' sum, the top-k, the softmax, the router
        vecmath.sum_rows(np.abs(normal(T, c.n_expert_used)), ctx.ggml)  # [T, 1]
        rows.argsort_desc(normal(T, c.n_expert))  # [T, X]
        soft_max(normal(T, c.n_expert), ctx)  # [T, X]
        mul_mat(ffn.ffn_gate_inp, x, ctx)  # [T, X]

    steps = [fused_delta_net] if linear else []
    steps.append(lambda: output_rows(w.output, x, outputs, ctx))  # [T or 1, V]: the LM head (a Q4_K_M file's: Q6_K)
    if c.n_expert:  # mul_mat_id's grouping of the rows by expert (the run meets it after layer 0's mixer)
        steps.append(lambda: mulmat_q8.slot_groups(np.zeros((T, c.n_expert_used), np.int32), np.int64(1)))
    if attn:
        steps.append(attention_core)
    if getattr(ffn, "ffn_gate_inp_shexp", None) is not None:  # the shared expert's gate
        steps.append(lambda: sigmoid(shared_gate_logits(ffn, x, ctx), ctx))  # [T]
    if c.n_expert:
        steps.append(router)
    with model.stream_phase("prompt" if T > 1 else "decode", positions):
        each_unless_busy(steps)  # a step whose kernel the run is compiling now: the blocks below load it
        # the whole blocks, for anything skipped or missed: one layer of each kind of block its weights make
        for il in _distinct(w.layers, "ffn", range(c.n_layer - 1, -1, -1)):
            build_layer_ffn(w.layers[il].ffn, c, x, il, ctx)  # [T, E]
        for il in _distinct(w.layers, "mixer", attn):
            build_layer_attn(w.layers[il].mixer, c, x, positions, state.layers[il], il, ctx)  # [T, E]
        output_rows(w.output, rms_norm_w(x, w.output_norm, c.rms_eps, ctx), outputs, ctx)  # [T or 1, V]
        for il in _distinct(w.layers, "mixer", linear):
            build_layer_attn_linear(w.layers[il].mixer, c, x, state.layers[il], il, ctx,
                                    keep=state.n_rs_seq + 1)  # [T, E]
        get_rows(w.token_embd, np.zeros(T, np.int64), ctx)  # [T, E]


def _distinct(layers, part: str, order) -> list[int]:
    """The layers of ``order`` whose ``part`` ("ffn", "mixer") differs from every earlier one's in what its kernels are
    compiled for (:func:`refimpl.io.stand_in.kinds`): a Q4_K_M file's ``ffn_down_exps`` is Q6_K in some layers, Q4_K
    in the others."""
    seen, out = set(), []
    for il in order:
        key = kinds(getattr(layers[il], part))
        if key not in seen:
            seen.add(key)
            out.append(il)
    return out

