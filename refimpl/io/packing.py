"""The weights' second copies in a kernel's layout — never a number changed, only how fast a product runs.

* :func:`pack_weights`: the lane kernels' packed rows (``kernels.pack``), for the reference's products;
* ``refimpl.graph.layout.ggml_layout``: ``--emulate=ggml``'s column layout (``kernels.ggml.columns``), built
  with :func:`map_matrices` over the same matrices.

Which matrices: every :class:`refimpl.io.weights.Matrix` of the :class:`refimpl.io.weights.Weights` except the
embedding table (its rows are looked up, never multiplied), routed experts only when pinned (streamed ones are
read per batch and stay as read) — :func:`pack_targets`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import kernels
from refimpl.io.weights import Matrix, PinnedExperts


def packed_fields(obj, experts: bool = True) -> list[str]:
    """The fields of a weights dataclass that packing descends into: not the embedding table (rows are
    looked up, never multiplied), not the streamer, not routed experts unless they are pinned (and ``experts``)."""
    pinned = experts and isinstance(getattr(obj, "experts", None), PinnedExperts)
    skip = ("token_embd", "streamer") + (() if pinned else ("experts",))
    return [f.name for f in dataclasses.fields(obj) if f.name not in skip]


def pack_targets(obj, experts: bool = True):
    """The matrices packing copies: every Matrix of ``obj`` in :func:`packed_fields` (``experts`` False: not the
    pinned routed experts)."""
    if isinstance(obj, Matrix):
        yield obj
    elif isinstance(obj, tuple):
        for o in obj:
            yield from pack_targets(o, experts)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for name in packed_fields(obj, experts):
            yield from pack_targets(getattr(obj, name), experts)


def map_matrices(obj, fn, experts: bool = True):
    """``obj`` (the :class:`refimpl.io.weights.Weights`, or any part of them) with every matrix of
    :func:`pack_targets` (``experts`` as there) replaced by ``fn(matrix)``."""
    if isinstance(obj, Matrix):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(map_matrices(o, fn, experts) for o in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{name: map_matrices(getattr(obj, name), fn, experts)
                                           for name in packed_fields(obj, experts)})
    return obj


def pack_weights(obj):
    """``obj`` (the :class:`Weights`, or any part of them) with every matrix also held in the lane
    kernels' packed layout (``kernels.pack``), routed experts included when they are pinned (streamed
    ones are read per batch and stay as read); the embedding table is left alone. Every product gives
    the same bits; a decoded token skips the lane kernels' gathers, at the cost of a second copy of
    those matrices' bytes in memory (docs/performance.md)."""
    return map_matrices(obj, lambda m: dataclasses.replace(m, raw=kernels.pack(m.raw, m.qtype)))


def packable_bytes(weights) -> int:
    """Bytes of the matrices :func:`pack_weights` would copy (types with a lane kernel)."""
    return sum(int(np.asarray(w.raw).nbytes) for w in pack_targets(weights) if kernels.lanes.pack.supported(w.qtype))


def packed_nbytes(weights) -> int:
    """Bytes of the packed copies held: the lane kernels' words, or ``--emulate=ggml``'s column layout."""
    return sum(int(w.raw.words.nbytes) if isinstance(w.raw, kernels.PackedRows) else w.cols.nbytes if w.cols is not None
               else 0 for w in pack_targets(weights))
