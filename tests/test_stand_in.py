"""A model's stand-in (refimpl/io/stand_in.py, ``load_model(stand_in=True)``): what a first run's second process walks
to compile the run's kernels (tests/test_compile_ahead.py checks that the walk of it meets every kernel the run calls).
It keeps one trunk layer of each kind, the file's own records, and every decision the run makes for the whole file."""

import dataclasses

import numpy as np

import refimpl.model.load as M
from refimpl.fixtures.builtin import fixture_path
from refimpl.graph.layout import layout_bytes
from refimpl.io.stand_in import kinds
from refimpl.model.ops import Ctx, emulation_ctx
from refimpl.model.state import SeqState
from refimpl.model.trunk import forward, load_model


def _same_record(a, b) -> bool:
    """The same weights: every matrix's bytes and every vector equal, field by field."""
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(_same_record(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def test_the_stand_in_keeps_the_first_layer_of_each_kind():
    """tiny Q4_K_M: layers 0 and 1 are delta-net layers with ``ffn_down_exps`` in Q4_K, layer 2 one with it in Q6_K
    (llama-quantize's use_more_bits), layer 3 attention: the stand-in is layers 0, 2, 3, the config saying so, the MTP
    block's entry kept, and a forward pass runs on it."""
    path = fixture_path("tiny", "q4_k_m")
    full, part = load_model(path, pack=False), load_model(path, pack=False, stand_in=True)
    c, s = full.config, part.config
    assert c.n_layer == 4 and s.n_layer == 3 and s.n_layer_nextn == c.n_layer_nextn == 1
    assert s.is_recurrent == (True, True, False, c.is_recurrent[4])
    for kept, il in zip(part.weights.layers, (0, 2, 3)):
        assert _same_record(kept, full.weights.layers[il])
    assert {kinds(lw) for lw in part.weights.layers} == {kinds(lw) for lw in full.weights.layers}
    assert kinds(full.weights.layers[1]) == kinds(full.weights.layers[0]) != kinds(full.weights.layers[2])
    assert part.weights.output is not None and _same_record(part.weights.output, full.weights.output)
    logits, _, state = forward(part, SeqState.fresh(s), [1, 2, 3], Ctx())
    assert logits.shape == (3, c.n_vocab) and len(state.layers) == len(SeqState.fresh(s).layers)


def test_the_stand_in_packs_as_the_whole_file_decides(monkeypatch):
    """The packing decision is the whole file's: with memory for the stand-in's copies but not for the file's, the
    stand-in is not packed (the run's kernels are the unpacked ones); with memory for the file's, it is packed, and
    its copies are fewer; with ``--emulate=ggml``, experts the file cannot lay out stay stored rows in the stand-in."""
    path = fixture_path("tiny", "q4_k_m")
    whole = load_model(path).packed_bytes
    part = load_model(path, stand_in=True).packed_bytes
    assert 0 < part < whole
    monkeypatch.setattr(M, "mem_available", lambda: int((part + whole) / 2 / M._PACK_GROWTH / M.PACK_AUTO_FRACTION))
    assert load_model(path).packed_bytes == 0 and load_model(path, stand_in=True).packed_bytes == 0
    monkeypatch.undo()

    ctx = emulation_ctx("ggml", ggml="avx2", n_threads=1)  # a named path: no library
    ggml = (ctx.ggml, ctx.repack)
    bare = load_model(path, pack=False, ggml=ggml)
    every, dense = layout_bytes(bare.weights, *ggml), layout_bytes(bare.weights, *ggml, experts=False)
    stand_in = load_model(path, pack=False, ggml=ggml, stand_in=True)
    assert layout_bytes(stand_in.weights, *ggml) < every  # the stand-in's experts would fit where the file's do not
    monkeypatch.setattr(M, "mem_available", lambda: int((dense + (every - dense) // 2) / M.PACK_AUTO_FRACTION))
    for model in (load_model(path, ggml=ggml), load_model(path, ggml=ggml, stand_in=True)):
        assert not model.pack_experts and model.weights.output.cols is not None
        assert all(lw.ffn.experts.down_exps.cols is None for lw in model.weights.layers)

