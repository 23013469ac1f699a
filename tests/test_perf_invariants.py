"""Speed work never changes numbers: the fast paths equal the plain ones bit for bit.

* the packed Q8_0 / Q6_K kernels' float64 products at the limits of their factors (every type's lane
  kernels against ``matmul._matmul_rows``: tests/test_kernels_lanes.py);
* ``PackedRows`` indexes like the array it packs;
* ``forward`` gives the same bits with 1 and 2 numba threads, mapped or packed weights, for a
  prompt, a decode step and a 1+3 verify batch, in every quantized tiny mix;
* ``moe_ffn`` on a batch whose rows share experts equals the rows one at a time;
* the large-fixture writer makes valid, deterministic blocks of the intended scale; and (``oracle``,
  only with ``REFIMPL_SLOW=1``: builds ~3 GiB per mix) llama.cpp loads the ``medium`` preset.
"""

import os

import json

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import kernels
from kernels.matmul import _matmul_rows
from conftest import require_llama_cpp, stored
from kernels.testing import random_rows
from refimpl.fixtures.builtin import fixture_path
from refimpl.model.trunk import forward, load_model
from refimpl.model.moe import moe_ffn
from refimpl.model.ops import Ctx
from refimpl.model.state import SeqState

N, K = 37, 512  # two 16-row groups and a tail of 5 rows; two K-quant super-blocks


def rows_reference(w, qtype, x):
    """The plain numba path, row by row (``_matmul_rows``), as float32 (T, N), from the bytes as ``kernels.matmul``
    hands them (conftest's ``stored``)."""
    out = np.zeros((x.shape[0], w.shape[0]), dtype=np.float32)
    _matmul_rows(qtype)(stored(w), x.astype(np.float64), out)
    return out


def same_bits(a, b):
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_packed_q6_k_float64_products_at_the_limits():
    """The packed Q6_K kernel forms w = d·sc·(q − 32) in float64 (kernels/lanes/blocks.py _emit_q6_k_codes),
    relying on the float32 products being exact: check the extremes of every factor — d the largest
    and smallest (subnormal) f16, sc = −128 / 127 / ±1 / 0, every code — against the row decoder."""
    rng = np.random.default_rng(61)
    w = random_rows(QT.Q6_K, 32, 512, rng)  # 2 lane groups, 2 blocks per row
    blocks = w.reshape(32, 2, 210)
    d_choices = np.array([0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x03FF, 0x3C00, 0x3555], dtype=np.uint16)  # ±65504, ±2^-24, …
    sc_choices = np.array([-128, 127, 1, -1, 0, 64, -77], dtype=np.int8)
    blocks[:, :, 192:208] = sc_choices[rng.integers(0, sc_choices.size, (32, 2, 16))].view(np.uint8)
    blocks[:, :, 208:210] = d_choices[rng.integers(0, d_choices.size, (32, 2))].view(np.uint8).reshape(32, 2, 2)
    blocks[:4, :, :192] = 0xFF  # q = 63 → +31 everywhere in four rows
    blocks[4:8, :, :192] = 0x00  # q = 0 → −32
    x = rng.standard_normal((5, 512)).astype(np.float32)
    x[2] *= np.float32(1e30)
    ref = rows_reference(w, QT.Q6_K, x)
    for T in (1, 2, 5):
        assert same_bits(kernels.matmul(kernels.pack(w, QT.Q6_K), QT.Q6_K, x[:T]), ref[:T])


def test_packed_q8_0_float64_products_at_the_limits():
    """The packed Q8_0 kernel forms w = qs·d in float64 (lanes_blocks ``_emit_q8_0_codes``): every
    code −128 … 127 against the largest, smallest (subnormal) and ordinary f16 scales of both signs."""
    rng = np.random.default_rng(80)
    w = random_rows(QT.Q8_0, 32, 256, rng)  # 2 lane groups, 8 blocks per row
    blocks = w.reshape(32, 8, 34)
    d_choices = np.array([0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x03FF, 0x3C00, 0x3555, 0x0000], dtype=np.uint16)
    blocks[:, :, 0:2] = d_choices[rng.integers(0, d_choices.size, (32, 8))].view(np.uint8).reshape(32, 8, 2)
    blocks[:8, :, 2:34] = np.arange(-128, 128, dtype=np.int8).reshape(8, 32).view(np.uint8)[:, None, :]
    x = rng.standard_normal((5, 256)).astype(np.float32)
    x[2] *= np.float32(1e30)
    ref = rows_reference(w, QT.Q8_0, x)
    for T in (1, 2, 5):
        assert same_bits(kernels.matmul(kernels.pack(w, QT.Q8_0), QT.Q8_0, x[:T]), ref[:T])


def test_packed_rows_index_like_the_array():
    rng = np.random.default_rng(3)
    w = random_rows(QT.Q4_K, 48, K, rng)
    p = kernels.pack(w, QT.Q4_K)
    assert p.shape == w.shape and p.dtype == w.dtype and p.ndim == 2 and len(p) == 48
    assert np.array_equal(p[[1, 5, 40]], w[[1, 5, 40]])  # fancy index: the original bytes
    x = rng.standard_normal((2, K)).astype(np.float32)
    head = p[16:48]  # aligned slice: still packed
    assert isinstance(head, kernels.PackedRows)
    assert same_bits(kernels.matmul(head, QT.Q4_K, x), rows_reference(w[16:48], QT.Q4_K, x))
    assert isinstance(p[3:20], np.ndarray)  # unaligned: the original bytes
    stack = random_rows(QT.Q8_0, 3 * 32, K, rng).reshape(3, 32, -1)
    ps = kernels.pack(stack, QT.Q8_0)
    assert ps.shape == stack.shape
    for e in range(3):
        assert isinstance(ps[e], kernels.PackedRows)
        assert same_bits(kernels.matmul(ps[e], QT.Q8_0, x), rows_reference(stack[e], QT.Q8_0, x))
    small = w[:15]  # fewer rows than a lane group: unchanged
    assert kernels.pack(small, QT.Q4_K) is small
    with pytest.raises(ValueError, match="packed"):
        kernels.matmul(p, QT.Q8_0, x)


@pytest.fixture(scope="module")
def thread_count():
    before = numba.get_num_threads()
    yield lambda n: numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(before)


def _decode_path(model, ctx):
    """Logits and hiddens of a 5-token prompt, one decode step, and a 1+3 verify batch after it."""
    st0 = SeqState.fresh(model.config)
    lp, hp, st = forward(model, st0, [3, 141, 59, 26, 53], ctx)
    ld, hd, st1 = forward(model, st, [58], ctx)
    lv, hv, _ = forward(model, st1, [97, 93, 23, 84], ctx, phase="verify")
    return [lp, hp, ld, hd, lv, hv]


@pytest.mark.parametrize("quant", ["q4_k_m", "mxfp4", "q8_0", "f32"])
def test_forward_independent_of_threads_and_packing(quant, thread_count):
    path = fixture_path("tiny", quant)
    mapped, packed = load_model(path, pack=False), load_model(path, pack=True)
    results = []
    for threads in (1, 2):
        thread_count(threads)
        for model in (mapped, packed):
            results.append(_decode_path(model, Ctx()))
    for other in results[1:]:
        assert all(same_bits(a, b) for a, b in zip(results[0], other))


def test_forward_emulated_independent_of_threads_and_packing(thread_count):
    """--emulate numerics (act_quant): a packed model multiplies from its original bytes."""
    path = fixture_path("tiny", "q4_k_m")
    model, packed = load_model(path, pack=False), load_model(path, pack=True)
    thread_count(1)
    one = _decode_path(model, Ctx(act_quant=True))
    thread_count(2)
    two = _decode_path(model, Ctx(act_quant=True))
    three = _decode_path(packed, Ctx(act_quant=True))
    assert all(same_bits(a, b) and same_bits(a, c) for a, b, c in zip(one, two, three))


@pytest.mark.parametrize("quant", ["q4_k_m", "mxfp4", "bf16"])
def test_serial_and_parallel_kernels_agree(quant, monkeypatch):
    """flags.SERIAL_BELOW only decides which thread computes an output: forward with every kernel
    serial equals forward with every kernel parallel, bit for bit (mapped and packed)."""
    import importlib

    modules = [importlib.import_module(f"kernels.{name}") for name in ("lanes.pack", "matmul", "plain.recurrent", "plain.dequant")]
    path = fixture_path("tiny", quant)
    results = []
    for below in (0, 1 << 62):
        for mod in modules:
            monkeypatch.setattr(mod, "SERIAL_BELOW", below)
        for pack in (False, True):
            results.append(_decode_path(load_model(path, pack=pack), Ctx()))
    for other in results[1:]:
        assert all(same_bits(a, b) for a, b in zip(results[0], other))


def test_pack_auto_packs_what_fits_and_reports_it(monkeypatch):
    """load_model's default pack="auto": packed when the copies fit in PACK_AUTO_FRACTION of
    MemAvailable, not packed otherwise; same numbers either way (above)."""
    import refimpl.model.load as M
    from refimpl.io.packing import packable_bytes, packed_nbytes

    path = fixture_path("tiny", "q4_k_m")
    auto = load_model(path)
    assert isinstance(auto.weights.output.raw, kernels.PackedRows)
    assert auto.packed_bytes == packed_nbytes(auto.weights) > packable_bytes(load_model(path, pack=False).weights) > 0
    assert load_model(path, pack=False).packed_bytes == 0
    monkeypatch.setattr(M, "PACK_AUTO_FRACTION", 0.0)
    tight = load_model(path)
    assert tight.packed_bytes == 0 and not isinstance(tight.weights.output.raw, kernels.PackedRows)
    streamed = load_model(path, cache_mb=0, pack=True)  # streamed experts are never packed
    assert 0 < streamed.packed_bytes < auto.packed_bytes
    with pytest.raises(ValueError, match="pack must be"):
        load_model(path, pack="yes")


def test_ggml_pack_auto_lays_out_all_but_pinned_experts_too_large(monkeypatch):
    """--emulate=ggml's pack="auto": everything in the column layout when it fits; when the pinned routed experts do
    not (the full-size model: 2 × 20 GB) the rest still is — LM head, attention, shared experts —, the experts
    multiplied from the map's stored rows; the logits are the same bits."""
    import refimpl.model.load as M
    from refimpl.graph.layout import layout_bytes
    from refimpl.model.ops import emulation_ctx
    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward

    ctx = emulation_ctx("ggml", ggml="avx2", n_threads=1)  # a named path: no library
    path, ggml = fixture_path("tiny", "q4_k_m"), (ctx.ggml, ctx.repack)
    bare = load_model(path, pack=False, ggml=ggml)
    every, dense = layout_bytes(bare.weights, *ggml), layout_bytes(bare.weights, *ggml, experts=False)
    assert every > dense > 0
    monkeypatch.setattr(M, "mem_available", lambda: int((dense + (every - dense) // 2) / M.PACK_AUTO_FRACTION))
    part = load_model(path, ggml=ggml)
    experts = part.weights.layers[0].ffn.experts
    assert not part.pack_experts and part.weights.output.cols is not None and experts.down_exps.cols is None
    monkeypatch.setattr(M, "mem_available", lambda: int(every / M.PACK_AUTO_FRACTION))
    whole = load_model(path, ggml=ggml)
    assert whole.pack_experts and whole.weights.layers[0].ffn.experts.down_exps.cols is not None
    assert 0 < part.packed_bytes < whole.packed_bytes
    monkeypatch.setattr(M, "mem_available", lambda: int(dense / M.PACK_AUTO_FRACTION) - 1)
    assert load_model(path, ggml=ggml).packed_bytes == 0
    logits = [forward(m, SeqState.fresh(m.config), [1, 2, 3, 4], ctx)[0] for m in (bare, part)]  # (whole: test_ggml_columns)
    assert same_bits(*logits)


def test_cli_pack_flag(capsys, monkeypatch):
    import refimpl.model.load as M
    from refimpl.cli import main

    monkeypatch.setattr(M, "PACK_MIN_BYTES", 0)  # the tiny model packed as a large one is (below)
    sizes = {}
    for flag in ("off", "on", "auto"):
        assert main(["run", "builtin:tiny/q4_k_m", "--tokens", "1,2,3", "-n", "3", "--json", "--pack", flag]) == 0
        out = json.loads(capsys.readouterr().out)
        sizes[flag] = (out["tokens"], out["stats"]["packed_bytes"])
    assert sizes["off"][1] == 0 and sizes["on"][1] > 0 and sizes["auto"] == sizes["on"]
    assert sizes["off"][0] == sizes["on"][0]


def test_plain_run_packs_at_load(capsys, monkeypatch):
    """refimpl run (plain greedy) makes its packed copies at load: a one-token run (its only forward pass the
    prompt's) packs nothing, a longer one reports the packed bytes of load_model's pack, with the tokens of an
    unpacked run. A model under ``PACK_MIN_BYTES`` (the tiny one, unless the limit is lowered) is not packed at all
    (``min_pack_bytes``; --emulate=ggml's column layout has no such limit)."""
    import refimpl.model.load as M
    from refimpl.cli import main
    from refimpl.model.ops import emulation_ctx

    path = fixture_path("tiny", "q4_k_m")
    assert load_model(path, min_pack_bytes=M.PACK_MIN_BYTES).packed_bytes == 0 < load_model(path).packed_bytes
    ctx = emulation_ctx("ggml", ggml="avx2", n_threads=1)  # a named path: no library
    assert load_model(path, ggml=(ctx.ggml, ctx.repack), min_pack_bytes=M.PACK_MIN_BYTES).packed_bytes > 0
    tokens = {}
    for n in ("1", "3"):
        assert main(["run", "builtin:tiny/q4_k_m", "--tokens", "1,2,3", "-n", n, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["stats"]["packed_bytes"] == 0  # too small to pay off
        tokens[n] = out["tokens"]
    monkeypatch.setattr(M, "PACK_MIN_BYTES", 0)
    sizes = {}
    for n in ("1", "3"):
        assert main(["run", "builtin:tiny/q4_k_m", "--tokens", "1,2,3", "-n", n, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        sizes[n] = out["stats"]["packed_bytes"]
        assert out["tokens"] == tokens[n]
    assert sizes == {"1": 0, "3": load_model(path, cache_mb="auto").packed_bytes}  # run streams its experts


def test_moe_batch_with_shared_experts_equals_rows_alone():
    """Rows that choose the same experts are multiplied together (one mm per expert); each row's
    output must still be its output alone."""
    model = load_model(fixture_path("tiny", "q4_k_m"))
    c, lw = model.config, model.weights.layers[1]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, c.n_embd)).astype(np.float32)
    x = np.concatenate([x, x[:2], x[1:2]])  # [6, E]: rows 3, 4, 5 repeat rows 0, 1, 1
    out, sel, _ = moe_ffn(lw.ffn, c, x, 1, Ctx())
    assert (sel[3] == sel[0]).all() and (sel[5] == sel[1]).all()
    for t in range(x.shape[0]):
        alone, _, _ = moe_ffn(lw.ffn, c, x[t : t + 1], 1, Ctx())
        assert same_bits(out[t : t + 1], alone)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.MXFP4], ids=["Q4_K", "Q6_K", "Q8_0", "MXFP4"])
def test_large_fixture_pool_blocks(qtype):
    """Blocks of a large-preset tensor: deterministic, finite, and of the intended scale."""
    from refimpl.fixtures.large import _Spec, tensor_bytes

    spec = _Spec("blk.0.ffn_up_exps.weight", (64, 512), 0.05)
    raw = tensor_bytes(spec, qtype, seed=0)
    assert np.array_equal(raw, tensor_bytes(spec, qtype, seed=0))
    assert not np.array_equal(raw, tensor_bytes(spec, qtype, seed=1))
    w = kernels.dequantize(raw, qtype)
    assert w.shape == (64, 512) and np.isfinite(w).all()
    assert 0.03 < w.std() < 0.08


@pytest.mark.oracle
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("REFIMPL_SLOW") != "1", reason="builds the ~3 GiB medium fixtures: set REFIMPL_SLOW=1")
@pytest.mark.parametrize("quant", ["q4_k_m", "mxfp4"])
def test_medium_fixture_loads_in_llama_cpp(quant):
    """llama.cpp loads ``medium`` (real Qwen3.6-35B-A3B widths) with its MTP block, and its logits
    agree with refimpl's emulated ones. (Measured: q4_k_m to ~1e-7 except at activation-rounding
    flips; mxfp4 to ~0.9 %: llama.cpp's default repacked Q8_0/MXFP4 CPU kernels differ from its own
    unrepacked ones by that much here, and refimpl matches the unrepacked ones to 3e-7.)"""
    from llama_ref import llama_run
    from refimpl.fixtures.large import large_fixture

    require_llama_cpp()

    path = large_fixture("medium", quant)
    tokens = [11, 22, 33, 44]
    run = llama_run(path, tokens, n_generate=2, load_mtp=True)
    model = load_model(path)
    logits, _, _ = forward(model, SeqState.fresh(model.config), tokens, Ctx(act_quant=True))
    rel = np.abs(logits - run.logits[: len(tokens)]).max(axis=1) / np.abs(run.logits[: len(tokens)]).max(axis=1)
    assert (rel < 2e-2).all(), rel


def test_logits_of_the_last_row_or_none_change_nothing_else():
    """``forward(..., outputs="last" | "none")`` (a prompt needs its last row's logits, a catch-up none,
    as llama.cpp's inp_out_ids): the rows computed, the hiddens and the state are the bits of
    ``outputs="all"``; the MTP head's catch-up likewise; any other value is refused."""
    from refimpl.model.mtp import MTPState, load_mtp_weights, mtp_forward

    model = load_model(fixture_path("tiny", "q8_0"))
    prompt = [11, 42, 7, 300, 5, 9, 100]
    want, h, state = forward(model, SeqState.fresh(model.config), prompt)  # [T, V], [T, E]
    last, h_last, state_last = forward(model, SeqState.fresh(model.config), prompt, outputs="last")
    none, h_none, state_none = forward(model, SeqState.fresh(model.config), prompt, outputs="none")
    assert last.shape == (1, want.shape[1]) and same_bits(last[0], want[-1]) and none is None
    for hh, st in ((h_last, state_last), (h_none, state_none)):
        assert same_bits(hh, h)
        after = [forward(model, s, [17])[0] for s in (state, st)]  # the state carries on identically
        assert same_bits(after[0], after[1])
    w = load_mtp_weights(model.file, model.weights)
    mtp_all, mh, mstate = mtp_forward(model, w, MTPState.fresh(model.config), prompt, h)
    mtp_none, mh_none, mstate_none = mtp_forward(model, w, MTPState.fresh(model.config), prompt, h, outputs="none")
    assert mtp_none is None and same_bits(mh_none, mh)
    step = [mtp_forward(model, w, s, [17], mh[-1:])[0] for s in (mstate, mstate_none)]
    assert same_bits(step[0], step[1])
    seen = {}
    traced = Ctx(trace=lambda name, il, x: seen.setdefault(name, x.copy()) if name == "result_output" else None)
    last_traced = forward(model, SeqState.fresh(model.config), prompt, traced, outputs="last")[0]
    assert same_bits(seen["result_output"], want) and same_bits(last_traced, last)  # a trace records every row
    with pytest.raises(ValueError, match="outputs must be one of"):
        forward(model, SeqState.fresh(model.config), prompt, outputs="first")


def test_a_long_batch_keeps_only_the_states_the_ring_needs():
    """``gated_deltanet(…, keep=n)`` returns the same last n states (bit for bit) and None before them,
    and ``forward`` keeps n_rs_seq + 1: its snapshot ring equals the one made by decoding token by token."""
    from refimpl.model.deltanet import gated_deltanet
    from refimpl.model.state import rollback

    model = load_model(fixture_path("tiny", "q8_0"))
    c = model.config
    il = c.is_recurrent.index(True)
    a = np.random.default_rng(3).standard_normal((9, c.n_embd)).astype(np.float32)
    st = SeqState.fresh(c).layers[il]
    _, every = gated_deltanet(model.weights.layers[il].mixer, c, a, st, il, Ctx())
    _, kept = gated_deltanet(model.weights.layers[il].mixer, c, a, st, il, Ctx(), keep=3)
    assert kept[:6] == [None] * 6
    for x, y in zip(every[6:], kept[6:]):
        assert same_bits(x.ssm, y.ssm) and same_bits(x.conv, y.conv)
    prompt = [11, 42, 7, 300, 5, 9, 100, 3, 8]
    batch = forward(model, SeqState.fresh(c, n_rs_seq=3), prompt)[2]
    one = SeqState.fresh(c, n_rs_seq=3)
    for t in prompt:
        one = forward(model, one, [t])[2]
    for r in (1, 2, 3):  # every snapshot of the ring restores the same state
        x, y = rollback(batch, r), rollback(one, r)
        for il, recurrent in enumerate(c.is_recurrent):
            if recurrent:
                p, q = x.layers[il], y.layers[il]
                assert same_bits(p.ssm, q.ssm) and same_bits(p.conv, q.conv), (r, il)
