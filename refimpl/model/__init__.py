"""The model: the reference forward pass — the math that defines the oracle's numbers — readable top to
bottom in this order.

``ctx`` (:class:`Ctx`: which numerics, what to record; its ``cb`` is the one hook for every named point:
llama.cpp's traced intermediates and refimpl's tap points) → ``state`` (the explicit state record: KV caches,
conv windows, delta-net matrices, snapshots) → ``ops`` (the primitive ops) → ``attention`` (gated full
attention) → ``deltanet`` (Gated DeltaNet, with the delta-rule step's definition) → ``moe`` (the MoE FFN) →
``load`` (:func:`load_model`: the weights, pinned or streamed, and their packed copies) → ``trunk`` (the layer
stack and the LM head: :func:`forward`) → ``mtp`` (the nextn block that drafts). Beside them, ``ahead``: the order
in which a first run's second process compiles the kernels of :func:`forward` (refimpl/cli/compile_ahead.py).
Each function names the llama.cpp source it mirrors (``src/models/qwen35moe.cpp``, ``delta-net-base.cpp``,
``llama-graph.cpp``).

Two numerics are computed here: the exact definition (``Ctx()``) and ``--emulate``'s approximate rounding
points of llama.cpp (``Ctx.act_quant``, ``kv_f16``, ``flash_attn``: the activation quantization of
``kernels.matmul``, F16 K/V, flash attention's F16 accumulator). The third, ``--emulate=ggml`` (bit for bit),
is llama.cpp's own graph in :mod:`refimpl.graph`: ``trunk.forward`` and ``mtp.mtp_forward`` hand it a
``Ctx(ggml=PATH)`` at their entry — the one place the numerics is chosen — and nothing else here branches on it.

May import: ``refimpl.errors``, ``refimpl.io`` (weights and the config), ``refimpl.graph`` (at those two entries,
``load`` for the ggml column layout, and the KV view's size that ``--emulate``'s flash attention shares with
llama.cpp) and ``kernels``. No decoding loop, no oracle, no fault logic: faults reach the model only through
the tap points ``Ctx.cb`` hands to ``Ctx.faults``.
"""
