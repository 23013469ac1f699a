"""A model's stand-in: the same file, config and decisions, with one trunk layer of each kind its weights make —
what a first run's second process walks to compile the run's kernels (refimpl/cli/compile_ahead.py).

numba compiles a kernel once per signature: the types, dimensions and layouts of its arguments, never their sizes
nor how many layers call it. A 40-layer Qwen3.6-35B-A3B Q4_K_M file makes a handful of kinds of layer (a delta-net
or an attention mixer; ``ffn_down_exps`` in Q6_K in some layers, Q4_K in the others: llama-quantize's
``use_more_bits``), so its stand-in is a few layers, and the second process's copies (the packed or column layout) are
those layers' and the LM head's — not a second copy of the whole file beside the run's.
"""

from __future__ import annotations

import dataclasses

from refimpl.io.load import ModelFile
from refimpl.io.streamer import StreamedExperts
from refimpl.io.weights import Matrix, Weights


def kinds(obj):
    """What a block's weights make its kernels compiled for: each matrix's type, shape and layout (stored rows or
    ``kernels.ggml.columns``), through the block's records and its streamed experts' tensors."""
    if isinstance(obj, Matrix):
        return obj.qtype, obj.shape, obj.cols is None
    if isinstance(obj, StreamedExperts):
        return tuple((t.kind, t.qtype, t.shape) for t in obj.streamer.tensors[obj.il])
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return type(obj).__name__, tuple(kinds(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return None


def stand_in(m: ModelFile, weights: Weights) -> tuple[ModelFile, Weights]:
    """``m`` and ``weights`` with the first trunk layer of each kind (:func:`kinds`: its mixer and its FFN together)
    only, in the file's order; the config says so (``n_layer``, ``is_recurrent``), the MTP block's entries kept.
    Each kept layer is the file's own record: its streamed experts are still read by the file's layer index. The
    trunk only: the file's MTP block sits at the whole file's ``n_layer`` (refimpl.model.mtp), not the stand-in's."""
    c = m.config
    keep, seen = [], set()
    for il, lw in enumerate(weights.layers):
        key = kinds(lw)
        if key not in seen:
            seen.add(key)
            keep.append(il)
    config = dataclasses.replace(c, n_layer_all=len(keep) + c.n_layer_nextn,
                                 is_recurrent=tuple(c.is_recurrent[il] for il in keep) + c.is_recurrent[c.n_layer:])
    return (dataclasses.replace(m, config=config),
            dataclasses.replace(weights, layers=tuple(weights.layers[il] for il in keep)))  # [len(keep)] layers
