"""llama.cpp's graph as ggml-cpu computes it (``--emulate=ggml``): bit for bit, op for op, each step naming the C++
it mirrors — ``src/models/qwen35moe.cpp`` (and ``qwen35.cpp`` / ``qwen3next.cpp``), ``src/models/delta-net-base.cpp``,
``src/llama-graph.cpp`` — with every op computed by :mod:`kernels.ggml`. Readable on its own, next to the C++.

:mod:`refimpl.model` is the reference: the exact definition of the oracle's numbers (and ``--emulate``'s
approximate rounding points). This folder is llama.cpp: its ubatches, its padded KV view, its F16 casts and its
fused ops. The two are computed apart and tested against each other (tests/test_graph.py: this graph within the
documented float-noise bound of the reference; tests/test_ggml_e2e.py: bit-identical to llama.cpp). The one place
the numerics is chosen is the entry of the forward passes: ``refimpl.model.trunk.forward`` and
``refimpl.model.mtp.mtp_forward`` hand a ``Ctx(ggml=PATH)`` to :func:`refimpl.graph.trunk.forward` /
:func:`refimpl.graph.mtp.mtp_forward`.

Modules in reading order: ``ops`` (ggml ops on the model's tensors: ``ggml_mul_mat``, the fused RMS_NORM+MUL, the
unary ops, ``ggml_get_rows``; the ubatch loop; the LM head's rows) → ``attention`` (``build_layer_attn``: RoPE,
the F16 cache write, ``build_attn_mha`` over the padded KV view) → ``deltanet`` (``build_layer_attn_linear``:
``ggml_ssm_conv`` and the fused ``ggml_gated_delta_net``) → ``moe`` (``build_moe_ffn`` and the shared expert,
``build_ffn``) → ``trunk`` (``graph::graph``: the layer loop per ubatch) → ``mtp`` (``graph_mtp``) → ``layout``
(which weights ggml-cpu can run here, and the column layout ``--pack`` builds for its kernels) → ``ahead`` (the ops in
the order a second process compiles their kernels beside a first run).

Where a step is the same view or the same float32 operation as in the reference (a reshape, a residual add), the
code here says so as deliberately parallel: each side reads as one numerics, without the other.

May import: ``refimpl.errors``, ``refimpl.io`` and ``kernels``. Never ``refimpl.model`` (the reference is what
this graph is compared with, not what it is built from): the records it receives (``Ctx``, the state records, the
model) it reads by their fields and remakes with ``dataclasses.replace``.
"""
