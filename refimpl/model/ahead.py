"""The plain numerics' kernels in the order a second process compiles them ahead of a first run
(``refimpl/cli/compile_ahead.py``): the twin of :mod:`refimpl.graph.ahead` for :func:`refimpl.model.trunk.forward`.
numba compiles each kernel on its first call, so a plain run on an empty cache compiles its kernels one after the
other (builtin:kjv: 6, ~7 s; a Q4_K_M file: 12, ~50 s), in the order the trunk meets them: a recurrent layer's input
projections (the weight type's lane kernel, then the row kernel of the rows after the last whole group of 16), the
delta rule's compiled step, the FFN's router (F32), experts and shared expert, the shared expert's gate (``dot64``),
attention's ``dot64``, the LM head (a Q4_K_M file's Q6_K lane kernel: ~20 s alone). The other process takes them
from the other end: the LM head, the last layer's FFN, the delta rule's step on the state a fresh sequence starts
from — each step skipped while the run is compiling a kernel it calls (``kernels.base.cache.each_unless_busy``:
builtin:kjv's head is the projections' Q8_0 kernel, which the run compiles first) — and last the whole trunk on
stand-in tokens, for what those skipped or missed, waiting for the run's kernels and loading them.
docs/performance.md, "First run".

Stand-ins have the run's shapes and types (what numba compiles for): small normal values, the run's ``Ctx``. Their
numbers are thrown away; the run's own never depend on this walk (the kernels are the same machine code whichever
process compiles them). tests/test_compile_ahead.py checks that the walk meets every kernel the run calls.
"""

from __future__ import annotations

import numpy as np

from kernels.base.cache import each_unless_busy
from refimpl.model.deltanet import kv_heads, recurrence
from refimpl.model.moe import ffn
from refimpl.model.ops import F32, output_rows
from refimpl.model.trunk import forward


def walk(model, state, n_tokens: int, ctx, outputs: str) -> None:
    """One batch of ``n_tokens`` tokens at ``state`` (a fresh :class:`refimpl.model.state.SeqState`), the run's
    last-met kernels first (the module docstring); ``outputs`` as :func:`refimpl.model.trunk.forward`'s."""
    c, w = model.config, model.weights
    T = n_tokens
    rng = np.random.default_rng(0)
    normal = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(F32)  # a stand-in activation
    positions = state.n_past + np.arange(T, dtype=np.int32)  # [T]
    linear = [il for il in range(c.n_layer) if c.is_recurrent[il]]

    def recurrence_step():  # gated_deltanet's recurrence on a fresh state (q, k l2-normed in the run: any values here)
        il, Hk, Hv, S = linear[0], c.ssm_n_group, c.ssm_dt_rank, c.ssm_d_state
        st = state.layers[il]
        window = np.concatenate([st.conv, normal(T, st.conv.shape[1])])  # [Kc−1+T, C]
        g = -np.abs(normal(T, Hv))  # [T, Hv]: a decay, ≤ 0
        beta = (0.5 + np.abs(normal(T, Hv))).astype(F32)  # [T, Hv]: a stand-in in (0, 1)
        recurrence(normal(T, Hk, S), normal(T, Hk, S), normal(T, Hv, S), g, beta, kv_heads(c), window, window[-T:],
                   st, il, ctx, state.n_rs_seq + 1, c.ssm_d_conv)  # [T, Hv, S], T states

    steps = [lambda: output_rows(w.output, normal(T, c.n_embd), outputs, ctx),  # [T or 1, V]: the LM head
             lambda: ffn(w.layers[-1].ffn, c, normal(T, c.n_embd), c.n_layer - 1, ctx)]  # [T, E]: router, experts, …
    if linear:
        steps.append(recurrence_step)
    with model.stream_phase("prompt" if T > 1 else "decode", positions):
        each_unless_busy(steps)  # a step whose kernel the run is compiling now: the trunk's pass below loads it
    forward(model, state, np.zeros(T, np.int64), ctx, outputs=outputs)  # the whole trunk, for anything skipped or missed
