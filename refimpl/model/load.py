"""Loading a model: :func:`load_model` opens and checks a GGUF, lays its weights out as
:class:`refimpl.io.weights.Weights` (routed experts pinned as memory-map views, or streamed through
:mod:`refimpl.io.streamer`) and decides whether to keep a packed second copy of the matrices —
the lane kernels' (:func:`refimpl.io.packing.pack_weights`) or, for ``--emulate=ggml``, the column layout
of ggml-cpu's kernels (:func:`refimpl.graph.layout.ggml_layout`). Never a number changed: only speed.

:class:`Model` is what :func:`refimpl.model.trunk.forward` and the decoders take.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from refimpl.graph.layout import ggml_layout, layout_bytes
from refimpl.io.config import Config
from refimpl.io.load import ModelFile, open_model
from refimpl.io.packing import pack_weights, packable_bytes, packed_nbytes
from refimpl.io.stand_in import stand_in as stand_in_layers
from refimpl.io.streamer import (ExpertStreamer, cache_budget, dense_tensors, fits_in_memory, is_auto, mem_available,
                                 pin_dense)
from refimpl.io.weights import Weights, load_weights


@dataclass(frozen=True)
class Model:
    file: ModelFile
    weights: Weights
    packed_bytes: int = 0  # bytes of the packed copies: the lane kernels' or, with ``ggml``, the column layout's
    pack_experts: bool = True  # with ggml: the pinned routed experts laid out too (False: they did not fit, the rest did)

    @property
    def config(self) -> Config:
        return self.file.config

    @property
    def streamer(self) -> ExpertStreamer | None:
        """The expert streamer, or None when the routed experts are pinned (memory-map views)."""
        return self.weights.streamer

    def stream_phase(self, name: str, positions):
        """``streamer.phase(name, positions)`` (refimpl.io.streamer), or nothing when pinned."""
        return self.streamer.phase(name, positions) if self.streamer is not None else contextlib.nullcontext()


PACK_AUTO_FRACTION = 0.25  # pack="auto": pack when the packed copies fit in this fraction of MemAvailable
#: ``refimpl run``'s ``min_pack_bytes``: no lane copies of a model with fewer packable bytes than this. The mapped
#: kernels are as fast there (builtin:kjv, 7.5 MB: 200 tokens in 2.8 s mapped, 3.0 s packed; builtin:tiny, 42 MB: 2.0 s
#: both; EPYC Zen 4, 2026-12-05), and a first run then compiles no packing kernels (docs/performance.md, "First run").
PACK_MIN_BYTES = 64 << 20
PACK_FLAGS = {"auto": "auto", "on": True, "off": False}  # --pack auto|on|off (cli run, bench/full.py) -> load_model's pack
_PACK_GROWTH = 1.32  # packed bytes / raw bytes, at most (Q6_K's assembled codes: 276 / 210)


def load_model(path: str | os.PathLike, cache_mb: int | str | None = None, *, on_route=None, progress: bool = True,
               pack: bool | str = "auto", min_pack_bytes: int = 0, ggml: tuple[str, bool] | None = None,
               stand_in: bool = False) -> Model:
    """Open and check a GGUF. ``cache_mb`` None: routed experts pinned as memory-map views;
    a whole number of MiB or ``"auto"``: routed experts streamed through an LRU cache of that budget
    (``--cache-mb``; refimpl.io.streamer.cache_budget), dense weights pinned now (a progress bar on
    stderr for large models), ``on_route`` called with every MoE batch's routing (--route-trace).
    ``pack``: True / False / ``"auto"`` (default: True when the packed copies fit in
    ``PACK_AUTO_FRACTION`` of MemAvailable) — see :func:`refimpl.io.packing.pack_weights`; never changes a number.
    ``min_pack_bytes``: with ``pack="auto"``, no lane copies of a model with fewer packable bytes (``refimpl run``:
    ``PACK_MIN_BYTES``, where they never pay off). ``ggml``: (path, repack) of an
    ``--emulate=ggml`` run — packing then builds the column layout of :func:`refimpl.graph.layout.ggml_layout`
    instead of the lane copies; ``"auto"`` lays out everything when it fits, else all but the pinned routed experts
    when that fits (they are then multiplied from the memory map's stored rows). With ``ggml``, ``cache_mb="auto"``
    pins the routed experts where the file fits in memory (the page cache keeps it: a private cache would hold a
    second copy of its pages), unless ``on_route`` asks for the streamer's routing: ggml's kernels read the column
    layout or the stored rows where the map has them, where a stream copies every token's missing experts first
    (the 40-layer full fixture, *EPYC*, 2026-12-05, 2 threads, budget 0: 211 ms a token mapped, 623 ms streamed,
    314 ms of it waiting for the reads; real2 Q4_K_M, 2026-12-07, 1 thread, half of MemAvailable: 13.0 ms a token
    pinned in the column layout, 16.1 streamed). ``stand_in``: every decision above made for the whole file, then
    only one trunk layer of each kind kept (:func:`refimpl.io.stand_in.stand_in`), and only those packed — what a
    first run's second process walks to compile the run's kernels (refimpl/cli/compile_ahead.py)."""
    if pack not in (True, False, "auto"):
        raise ValueError(f"load_model: pack must be True, False or 'auto', got {pack!r}")
    m = open_model(path)
    budget = None
    if cache_mb is not None:
        dense = sum(dense_tensors(m.gguf).values())
        size, resident = os.path.getsize(m.gguf.path), 0 if pack is False else int(dense * _PACK_GROWTH)  # packed copies, at most
        budget = cache_budget(cache_mb, file_bytes=size, resident_bytes=resident)
        if (ggml is not None and on_route is None and is_auto(cache_mb)
                and (budget == 0 or fits_in_memory(size, resident))):
            budget = None  # the page cache holds the file: its map (or the column layout) serves ggml's kernels
    if budget is None:
        weights = load_weights(m)
        if m.config.is_moe and fits_in_memory(os.path.getsize(m.gguf.path)):
            m.gguf.will_need()  # the routed experts' pages read ahead, not faulted in one by one by the first tokens
    else:
        streamer = ExpertStreamer.open(m, budget, on_route=on_route)
        streamer.dense_bytes = pin_dense(m.gguf, progress=progress)
        weights = load_weights(m, streamer)
    if pack == "auto" and ggml is None and packable_bytes(weights) < min_pack_bytes:
        pack = False
    experts = True
    if pack == "auto":
        avail = mem_available()
        fits = lambda need: avail is not None and need <= PACK_AUTO_FRACTION * avail  # noqa: E731
        if ggml is None:
            pack = fits(packable_bytes(weights) * _PACK_GROWTH)
        else:  # pinned experts too large to lay out (full size: 2 × 20 GB): the rest still is (LM head, attention, …)
            experts = fits(layout_bytes(weights, *ggml))
            pack = experts or fits(layout_bytes(weights, *ggml, experts=False))
    if stand_in:
        m, weights = stand_in_layers(m, weights)
    if not pack:
        return Model(file=m, weights=weights, pack_experts=experts)
    packed = pack_weights(weights) if ggml is None else ggml_layout(weights, *ggml, experts)
    return Model(file=m, weights=packed, packed_bytes=packed_nbytes(packed), pack_experts=experts)
