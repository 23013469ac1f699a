"""Step 8: the trunk — ``graph::graph`` of ``src/models/qwen35moe.cpp`` (and of ``qwen35.cpp`` /
``qwen3next.cpp``, the same layer loop: only the blocks inside differ, see refimpl.io.config.Arch).

The layer skeleton is walked through in docs/architecture.md, "One token, step by step".

For each of the L trunk layers, with h⁰ = the token embedding rows::

    attn_norm     a = RMSNorm(h, attn_norm)
    mixer         m = GatedDeltaNet(a)  if the layer is recurrent  else  GatedAttention(a)
    attn_residual r = h + m
    attn_post_norm  x = RMSNorm(r, post_attention_norm)
    ffn_out       f = MoE(x) + sigmoid-gated shared expert   (qwen35: dense SwiGLU(x))
    l_out         h = r + f

then ``h_nextn = result_norm = RMSNorm(h, output_norm)`` and ``result_output = W_out · h_nextn``
(``output.weight``, or ``token_embd.weight`` when tied). ``h_nextn`` is what the MTP head is fed.

:func:`forward` processes T consecutive tokens of one sequence in one call (a prompt, a single
decode step, or a 1+N verify batch) and returns every position's logits. Every operation treats
rows independently and identically, so the logits of a batch are bit-identical to decoding the
same tokens one at a time (tested in tests/test_trunk.py) — unlike a batched C++ engine.

With ``load_model(path, cache_mb=…)`` the routed experts are streamed from the file
(:mod:`refimpl.io.streamer`); ``forward`` then declares which trunk pass it is — ``prompt``, ``decode``
or ``verify`` — so the streamer can say whose routing caused each read (docs/streamer.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import weakref
from dataclasses import dataclass

import numpy as np

import kernels
from refimpl.errors import RefimplError
from refimpl.model.attention import gated_attention, kv_cache_cells
from refimpl.io.config import Config
from refimpl.model.deltanet import gated_deltanet
from refimpl.io.load import ModelFile, open_model
from refimpl.model.moe import ffn
from refimpl.model.ops import Ctx, by_ubatch, ieee, output_rows, rms_norm_w
from refimpl.model.state import SeqState
from refimpl.io.streamer import ExpertStreamer, cache_budget, dense_tensors, mem_available, pin_dense
from refimpl.io.weights import Matrix, PinnedExperts, Weights, load_weights


@dataclass(frozen=True)
class Model:
    file: ModelFile
    weights: Weights
    packed_bytes: int = 0  # bytes of the packed copies: the lane kernels' or, with ``ggml``, the column layout's
    pack_pending: bool = False  # load_model(defer_pack=True) decided to pack: :meth:`packed` does it
    ggml: tuple[str, bool] | None = None  # load_model's ggml: (path, repack) that packing lays the weights out for

    def packed(self) -> "Model":
        """This model with its matrices also in the lane kernels' layout (:func:`pack_weights`), when
        :func:`load_model` deferred the packing; else the model itself. Never changes a number."""
        if not self.pack_pending:
            return self
        weights = _pack(self.weights, self.ggml)
        return dataclasses.replace(self, weights=weights, packed_bytes=_packed_nbytes(weights), pack_pending=False)

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
PACK_FLAGS = {"auto": "auto", "on": True, "off": False}  # --pack auto|on|off (cli run, bench/full.py) -> load_model's pack
_PACK_GROWTH = 1.32  # packed bytes / raw bytes, at most (Q6_K's assembled codes: 276 / 210)


def load_model(path: str | os.PathLike, cache_mb: int | str | None = None, *, on_route=None, progress: bool = True,
               pack: bool | str = "auto", defer_pack: bool = False, ggml: tuple[str, bool] | None = None) -> Model:
    """Open and check a GGUF. ``cache_mb`` None: routed experts pinned as memory-map views;
    a whole number of MiB or ``"auto"``: routed experts streamed through an LRU cache of that budget
    (``--cache-mb``; refimpl.io.streamer.cache_budget), dense weights pinned now (a progress bar on
    stderr for large models), ``on_route`` called with every MoE batch's routing (--route-trace).
    ``pack``: True / False / ``"auto"`` (default: True when the packed copies fit in
    ``PACK_AUTO_FRACTION`` of MemAvailable) — see :func:`pack_weights`; never changes a number.
    ``defer_pack``: decide now, pack later — the model comes back unpacked with ``pack_pending`` set,
    and :meth:`Model.packed` makes the copies (``refimpl run`` does it after the first token: the copy
    pays off only over many tokens, and the first token need not wait for it). ``ggml``: (path, repack) of an
    ``--emulate=ggml`` run — packing then builds the column layout of :func:`ggml_layout` instead of the lane copies."""
    if pack not in (True, False, "auto"):
        raise ValueError(f"load_model: pack must be True, False or 'auto', got {pack!r}")
    m = open_model(path)
    if cache_mb is None:
        weights = load_weights(m)
    else:
        dense = sum(dense_tensors(m.gguf).values())
        budget = cache_budget(cache_mb, file_bytes=os.path.getsize(m.gguf.path),
                              resident_bytes=0 if pack is False else int(dense * _PACK_GROWTH))  # packed copies, at most
        streamer = ExpertStreamer.open(m, budget, on_route=on_route)
        streamer.dense_bytes = pin_dense(m.gguf, progress=progress)
        weights = load_weights(m, streamer)
    if pack == "auto":
        avail = mem_available()
        need = packable_bytes(weights) * _PACK_GROWTH if ggml is None else layout_bytes(weights, *ggml)
        pack = avail is not None and need <= PACK_AUTO_FRACTION * avail
    if not pack or defer_pack:
        return Model(file=m, weights=weights, pack_pending=bool(pack), ggml=ggml)
    packed = _pack(weights, ggml)
    return Model(file=m, weights=packed, packed_bytes=_packed_nbytes(packed), ggml=ggml)


def _pack(weights, ggml):
    return pack_weights(weights) if ggml is None else ggml_layout(weights, *ggml)


def _pack_targets(obj):
    """The matrices :func:`pack_weights` packs: every Matrix except the embedding table, routed experts
    only when pinned."""
    if isinstance(obj, Matrix):
        yield obj
    elif isinstance(obj, tuple):
        for o in obj:
            yield from _pack_targets(o)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for name in _packed_fields(obj):
            yield from _pack_targets(getattr(obj, name))


def _packed_fields(obj) -> list[str]:
    """The fields of a weights dataclass that packing descends into: not the embedding table (rows are
    looked up, never multiplied), not the streamer, not routed experts unless they are pinned."""
    skip = ("token_embd", "streamer") + (() if isinstance(getattr(obj, "experts", None), PinnedExperts) else ("experts",))
    return [f.name for f in dataclasses.fields(obj) if f.name not in skip]


def packable_bytes(weights) -> int:
    """Bytes of the matrices :func:`pack_weights` would copy (types with a lane kernel)."""
    return sum(int(np.asarray(w.raw).nbytes) for w in _pack_targets(weights) if kernels.lanes.pack.supported(w.qtype))


def _packed_nbytes(weights) -> int:
    return sum(int(w.raw.words.nbytes) if isinstance(w.raw, kernels.PackedRows) else w.cols.nbytes if w.cols is not None
               else 0 for w in _pack_targets(weights))


def pack_weights(obj):
    """``obj`` (the :class:`Weights`, or any part of them) with every matrix also held in the lane
    kernels' packed layout (``kernels.pack``), routed experts included when they are pinned (streamed
    ones are read per batch and stay as read); the embedding table is left alone. Every product gives
    the same bits; a decoded token skips the lane kernels' gathers, at the cost of a second copy of
    those matrices' bytes in memory (docs/performance.md)."""
    if isinstance(obj, Matrix):
        return dataclasses.replace(obj, raw=kernels.pack(obj.raw, obj.qtype))
    if isinstance(obj, tuple):
        return tuple(pack_weights(o) for o in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{name: pack_weights(getattr(obj, name)) for name in _packed_fields(obj)})
    return obj


def _layout_target(w: Matrix, path: str, repack: bool) -> bool:
    """Whether ``--emulate=ggml`` multiplies ``w`` by a kernel that has a column layout (kernels.ggml.columns):
    Q4_0 / IQ4_NL / MXFP4 / Q4_K when llama.cpp repacks the tensor, Q4_K / Q5_K / Q6_K when it does not."""
    from kernels.ggml.columns import kind_for
    from kernels.ggml.mulmat import repacked

    if path == "generic":  # its vec_dot is the generic C's, which the layout's kernels are not
        return False
    return kind_for(w.qtype, repack and repacked(w.qtype, w.stored_rows or w.shape[-2], path)) is not None


def layout_bytes(weights, path: str, repack: bool) -> int:
    """Bytes :func:`ggml_layout` would add (~1.8 × a 4-bit matrix, 1.3–1.6 × a Q6_K or Q5_K one, rounded up to 2 ×)."""
    return sum(2 * int(np.asarray(w.raw).nbytes) for w in _pack_targets(weights) if _layout_target(w, path, repack))


def ggml_layout(obj, path: str, repack: bool):
    """``--emulate=ggml``'s packing: ``obj`` (the :class:`Weights`, or any part of them) with every matrix that
    ggml-cpu's ``path`` multiplies by a kernel of :mod:`kernels.ggml.columns` also held in that column layout
    (``Matrix.cols``: routed experts included when pinned, as a stack; the embedding table left alone). Every product
    gives the same bits; a decoded token runs the exact integer dots of many outputs at once."""
    from kernels.ggml.columns import layout

    if isinstance(obj, Matrix):
        return dataclasses.replace(obj, cols=layout(obj.row_bytes, obj.qtype)) if _layout_target(obj, path, repack) else obj
    if isinstance(obj, tuple):
        return tuple(ggml_layout(o, path, repack) for o in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{name: ggml_layout(getattr(obj, name), path, repack) for name in _packed_fields(obj)})
    return obj


def check_ggml_weights(gguf, path: str, repack: bool) -> None:
    """``--emulate=ggml``: refuse, in one line, a file holding a weight whose ggml-cpu kernel on ``path`` is not
    emulated — a table read by ``get_rows`` (``token_embd``, ``nextn.embed_tokens``: ``kernels.ggml.rows``), a matrix
    multiplied by ``mul_mat`` / ``mul_mat_id`` (``kernels.ggml.mulmat.mul_mat_emulated``), or, with llama.cpp's
    default CPU_REPACK buffer (``repack``), a matrix that buffer takes (``kernels.ggml.mulmat.repacked``) with
    repacked kernels not emulated. A ``token_embd`` that is also the LM head (no ``output.weight``) is both: llama.cpp
    loads a duplicate for the mul_mat. The conv kernels and norms are F32 (checked by the loader)."""
    from kernels.ggml.mulmat import mul_mat_emulated, repack_emulated, repacked
    from kernels.ggml.rows import GET_ROWS_TYPES

    key = (path, repack)
    if key in _GGML_CHECKED.get(gguf, ()):  # a file passes once per configuration: not on every decode step
        return
    tied = "output.weight" not in gguf.tensors

    def refuse(t, what: str):
        raise RefimplError(f"--emulate=ggml: {t.name} is {t.qtype.name}, whose {what} on ggml-cpu's {path} path is not "
                           "emulated (docs/numerics.md lists what is)")

    for t in gguf.tensors.values():
        if len(t.shape) < 2 or t.name.endswith("ssm_conv1d.weight"):
            continue
        table = t.name == "token_embd.weight" or t.name.endswith("embed_tokens.weight")
        if table and t.qtype not in GET_ROWS_TYPES:
            refuse(t, "get_rows")
        if table and not (t.name == "token_embd.weight" and tied):
            continue
        if repack and repacked(t.qtype, t.shape[-2], path):
            if not repack_emulated(t.qtype, path):
                raise RefimplError(f"--emulate=ggml: llama.cpp repacks {t.name} ({t.qtype.name}) into CPU_REPACK's "
                                   f"interleaved layout by default, whose {path} kernels are not emulated; run llama.cpp "
                                   "with --no-repack and give --no-repack here")
        elif not mul_mat_emulated(t.qtype, path):
            refuse(t, "mul_mat")
    _GGML_CHECKED.setdefault(gguf, set()).add(key)


_GGML_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # gguf file -> the paths it passed


def trunk_phase(n_tokens: int, n_past: int) -> str:
    """Which trunk pass a forward call is, for the streamer: one token → ``decode``; several at
    position 0 → ``prompt``; several after that → ``verify`` (a speculative 1+N batch)."""
    return "decode" if n_tokens == 1 else "prompt" if n_past == 0 else "verify"


@ieee  # inf/NaN weights: the IEEE values, silently, as in C
def forward(model: Model, state: SeqState, tokens, ctx: Ctx = Ctx(), *, phase: str | None = None,
            outputs: str = "all") -> tuple[np.ndarray | None, np.ndarray, SeqState]:
    """Run T tokens at positions n_past … n_past+T−1.

    Returns (result_output [T, V] float32, h_nextn [T, E] float32, new state). ``outputs``: the rows
    whose logits are computed — ``"all"``; ``"last"`` (result_output [1, V], the last position's: a
    prompt); ``"none"`` (None: only the hiddens and the state are needed) — :func:`refimpl.model.ops.output_rows`.
    ``phase`` names the pass for the expert streamer's counters (default :func:`trunk_phase`);
    numbers never depend on it nor on ``outputs``.
    """
    c, w = model.config, model.weights
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [T]
    if tokens.size == 0:
        raise ValueError("forward() needs at least one token")
    if tokens.min() < 0 or tokens.max() >= c.n_vocab:
        raise ValueError(f"token id out of range [0, {c.n_vocab})")
    positions = state.n_past + np.arange(tokens.size, dtype=np.int32)  # [T]

    T = int(tokens.size)
    if ctx.ggml and T > ctx.n_ubatch:  # llama_decode splits the batch into ubatches of n_ubatch tokens
        phase = phase or trunk_phase(T, state.n_past)  # llama_context::decode's ubatch loop (ops.by_ubatch)
        return by_ubatch(lambda st, u0, u1, out: forward(model, st, tokens[u0:u1], ctx, phase=phase, outputs=out),
                         T, ctx.n_ubatch, outputs, state)
    if ctx.ggml:  # ggml_get_rows: dequantize_row_* of the stored rows (kernels.ggml.rows)
        from kernels.ggml import rows as ggml_rows
        from refimpl.model.ops import said_ggml

        check_ggml_weights(model.file.gguf, ctx.ggml, ctx.repack)
        n_cells = kv_cache_cells(c, ctx)
        if state.n_past + T > n_cells:
            raise RefimplError(f"--emulate=ggml: the emulated llama.cpp context holds {n_cells} cells (n_ctx "
                               f"{ctx.n_ctx or c.n_ctx_train}); {state.n_past + T} tokens do not fit, as in llama.cpp")

        said_ggml()  # the CLI's "emulating ggml-cpu …" line, now that the emulation starts

        h = ctx.cb("model.input_embed", -1, ggml_rows.get_rows(w.token_embd.row_bytes, w.token_embd.qtype, tokens))
    else:
        h = ctx.cb("model.input_embed", -1, w.token_embd.rows(tokens))  # [T, E]
    layers = list(state.layers)
    per_token = [[None] * c.n_layer for _ in range(T)]  # recurrent state after each token
    with model.stream_phase(phase or trunk_phase(T, state.n_past), positions):
        for il, lw in enumerate(w.layers):
            a = ctx.cb("attn_norm", il, rms_norm_w(h, lw.attn_norm, c.rms_eps, ctx))  # [T, E]
            if c.is_recurrent[il]:
                m, states = gated_deltanet(lw.mixer, c, a, layers[il], il, ctx, keep=state.n_rs_seq + 1)  # [T, E], T states
                # (the last n_rs_seq + 1: the snapshot ring's new entries and the new state; the rest None)
                layers[il] = states[-1]
                for t in range(T):
                    per_token[t][il] = states[t]
            else:
                m, layers[il] = gated_attention(lw.mixer, c, a, positions, layers[il], il, ctx)  # [T, E]
            r = ctx.cb("attn_residual", il, m + h)  # [T, E]
            x = ctx.cb("attn_post_norm", il, rms_norm_w(r, lw.post_attention_norm, c.rms_eps, ctx))  # [T, E]
            f = ffn(lw.ffn, c, x, il, ctx)  # [T, E]
            h = ctx.cb("l_out", il, f + r)  # [T, E]

    h_nextn = ctx.cb("result_norm", -1, rms_norm_w(h, w.output_norm, c.rms_eps, ctx))  # [T, E]
    logits = output_rows(w.output, h_nextn, outputs, ctx)  # [T, V], [1, V] or None
    h_mtp = ctx.cb("trunk.h_nextn", -1, h_nextn, pre_norm=h)  # what the MTP head is handed
    return logits, h_mtp, state.advanced(T, tuple(layers), [tuple(p) for p in per_token])

