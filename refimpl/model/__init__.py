"""The model: the reference forward pass, readable top to bottom in this order.

``state`` (the explicit state record: KV caches, conv windows, delta-net matrices, snapshots) → ``ops``
(the primitive ops and :class:`Ctx`, whose ``cb`` is the one hook for every named point: llama.cpp's
traced intermediates and refimpl's tap points) → ``attention`` (gated full attention) → ``deltanet``
(Gated DeltaNet, with the delta-rule step's definition) → ``moe`` (the MoE FFN) → ``trunk`` (the layer
stack and the LM head: :func:`forward`, :func:`load_model`) → ``mtp`` (the nextn block that drafts).
Each function names the llama.cpp source it mirrors (``src/models/qwen35moe.cpp``, ``delta-net-base.cpp``,
``llama-graph.cpp``).

May import: ``refimpl.errors``, ``refimpl.io`` (weights and the config) and ``kernels``. No decoding loop,
no oracle, no fault logic: faults reach the model only through the tap points ``Ctx.cb`` hands to
``Ctx.faults``.
"""
