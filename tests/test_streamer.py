"""The expert streamer: same numbers for every budget, LRU order and budget, counters, route trace,
expert pages kept out of the process, and the run flags."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from refimpl.errors import RefimplError
from refimpl.model.trunk import forward, load_model
from refimpl.model.mtp import MTPState, load_mtp_weights, mtp_forward
from refimpl.model.ops import Ctx
from refimpl.io.route_trace import RouteTrace, read_route_trace
from refimpl.model.state import SeqState
from refimpl.io.streamer import (
    MIB,
    ExpertStreamer,
    ExpertTensor,
    SliceCache,
    SliceKey,
    StreamedExperts,
    cache_budget,
    mem_available,
)
from refimpl.io.weights import PinnedExperts

PROMPT = [17, 200, 33, 41, 5, 88]
# MiB: nothing, a few slices (evicts), everything, half of MemAvailable — all four on q4_k_m; the
# slow f32 kernel and mxfp4 run a subset that still covers a thrashing and a holding cache
BUDGETS = {"q4_k_m": [0, 1, 1024, "auto"], "f32": [0, 1, "auto"], "mxfp4": [0, 1024]}


def _scenario(model):
    """Every logits row of: a prompt, a decode, a 1+2 verify batch, the MTP head over the prompt
    (catch-up) and one draft step."""
    c = model.config
    out = []
    state = SeqState.fresh(c)
    logits, h, state = forward(model, state, PROMPT)
    out.append(logits)
    logits, _, state = forward(model, state, [5])
    out.append(logits)
    logits, _, state = forward(model, state, [11, 12, 13])
    out.append(logits)
    w = load_mtp_weights(model.file, model.weights)
    h_in = np.concatenate([np.zeros((1, c.n_embd), np.float32), h[:-1]])  # row p: trunk h of p-1
    logits, h_mtp, mtp = mtp_forward(model, w, MTPState.fresh(c), PROMPT, h_in)
    out.append(logits)
    logits, _, _ = mtp_forward(model, w, mtp, [int(np.argmax(logits[-1]))], h_mtp[-1:])
    out.append(logits)
    return out


def _ggml_scenario(model, ctx):
    """Every logits row of a prompt, a decode, a 1+2 verify batch and the MTP head over the prompt, under ``ctx``."""
    c, out, state = model.config, [], SeqState.fresh(model.config)
    for tokens in (PROMPT, [5], [11, 12, 13]):
        logits, h, state = forward(model, state, tokens, ctx)
        out.append(logits)
    w = load_mtp_weights(model.file, model.weights)
    h_in = np.concatenate([np.zeros((1, c.n_embd), np.float32), h[:-1]])  # row p: trunk h of p-1
    out.append(mtp_forward(model, w, MTPState.fresh(c), [11, 12, 13], h_in, ctx)[0])
    return out


def test_ggml_logits_are_bit_identical_streamed_and_a_budget_of_0_reads_into_the_stack(make_fixture, monkeypatch):
    """--emulate=ggml with streamed experts: ggml_mul_mat_id's stack of the batch's experts is the stack the slices
    were read into at a budget of 0 (no copy; here a fused gate_up tensor's gate and up rows, strided views of it),
    and made of the cached slices otherwise — the same logits as the pinned experts' either way."""
    import refimpl.io.streamer as S
    from refimpl.model.ops import emulation_ctx

    ctx = emulation_ctx("ggml", ggml="avx2", n_threads=1)  # a named path: no library, the same bits on any host
    path = make_fixture("tiny", "q4_k_m", fused_gate_up=True)
    expected = _ggml_scenario(load_model(path, pack=False, ggml=(ctx.ggml, ctx.repack)), ctx)
    stacks, read_stack = [], S.RoutedExperts.read_stack
    monkeypatch.setattr(S.RoutedExperts, "read_stack", lambda self, *a: stacks.append(read_stack(self, *a)) or stacks[-1])
    for mb in (0, 1024):
        stacks.clear()
        got = _ggml_scenario(load_model(path, cache_mb=mb, pack=False, ggml=(ctx.ggml, ctx.repack)), ctx)
        for a, b in zip(expected, got, strict=True):
            assert np.array_equal(a, b), f"cache_mb={mb}"
        assert stacks and all((s is None) == (mb > 0) for s in stacks), f"cache_mb={mb}"
    streamed = StreamedExperts(load_model(path, cache_mb=0, pack=False).streamer, 0)  # the plain path's batches: no stack
    sel = np.array([[0, 1], [1, 2]])
    assert streamed.routed(sel, np.ones_like(sel, dtype=np.float32)).stacks == {}
    assert set(streamed.routed(sel, np.ones_like(sel, dtype=np.float32), stacked=True).stacks) == {"ffn_gate_up_exps", "ffn_down_exps"}


# ---- the slices are the mapped bytes --------------------------------------------------------------


@pytest.mark.parametrize("quant,fused", [("f32", False), ("bf16", False), ("q4_k_m", False), ("mxfp4", False), ("q4_k_m", True)])
def test_every_streamed_slice_equals_the_pinned_view(make_fixture, quant, fused):
    path = make_fixture("tiny", quant, **({"fused_gate_up": True} if fused else {}))
    pinned, streamed = load_model(path, pack=False), load_model(path, cache_mb=0)  # the mapped bytes
    c = pinned.config
    pairs = [(p.ffn.experts, s.ffn.experts) for p, s in zip(pinned.weights.layers, streamed.weights.layers)]
    pairs.append((load_mtp_weights(pinned.file, pinned.weights).layer.ffn.experts,
                   load_mtp_weights(streamed.file, streamed.weights).layer.ffn.experts))
    for p, s in pairs:
        assert isinstance(p, PinnedExperts) and isinstance(s, StreamedExperts)
        for e in range(c.n_expert):
            for which in ("gate", "up", "down"):
                a, b = getattr(p, which)(e), getattr(s, which)(e)
                assert (a.name, a.qtype, a.shape, a.raw.dtype, a.raw.shape) == (b.name, b.qtype, b.shape, b.raw.dtype, b.raw.shape)
                assert np.array_equal(a.raw.view(np.uint8), b.raw.view(np.uint8))
    # one read per call at budget 0 (with fused gate_up, gate(e) and up(e) each read the one slice)
    assert streamed.streamer.counters.total.slices_read == len(pairs) * c.n_expert * 3


# ---- exactness: streaming changes cost, never numbers -----------------------------------------------


@pytest.mark.parametrize("quant", ["f32", "q4_k_m", "mxfp4"])
def test_logits_are_bit_identical_for_every_budget(make_fixture, quant):
    path = make_fixture("tiny", quant)
    expected = _scenario(load_model(path))
    for mb in BUDGETS[quant]:
        model = load_model(path, cache_mb=mb)
        got = _scenario(model)
        for a, b in zip(expected, got):
            assert np.array_equal(a, b), f"cache_mb={mb}"
        s = model.streamer
        assert s.cache.peak <= s.budget
        if mb == 0:
            assert s.counters.total.hits == 0 and len(s.cache) == 0
        if mb == 1:
            assert s.cache.evictions > 0  # (f32's 256 KiB slices thrash a 1 MiB LRU: no hits there)
        if mb in (1024, "auto"):
            assert s.cache.evictions == 0 and s.counters.total.hits > 0


def test_speculative_tokens_equal_across_budgets_and_counters_add_up(make_fixture):
    from refimpl.decode.greedy import greedy
    from refimpl.decode.speculative import speculative_generate

    path = make_fixture("predictable", "q4_k_m")
    prompt = [40, 41, 42]
    plain = greedy(load_model(path), prompt, 10)
    for mb in (0, 1024):
        model = load_model(path, cache_mb=mb)
        s = model.streamer
        out, stats = speculative_generate(model, prompt, 10, source="mtp", n_draft=3,
                                          bytes_read=s.bytes_read, counters=s.counters.columns)
        assert out == plain
        rows = stats.rows
        for key in ("stream_bytes", "stream_slices", "stream_bytes_mtp", "stream_bytes_verify"):
            assert sum(r.counters[key] for r in rows) == stats.stream[key]
        assert stats.stream["stream_bytes"] == stats.bytes_read == sum(r.bytes_read for r in rows)
        t = stats.stream
        assert t["stream_bytes"] == t["stream_bytes_decode"] + t["stream_bytes_verify"] + t["stream_bytes_mtp"]
        assert t["stream_slices"] == t["stream_misses"]
        assert s.counters["mtp"].passes > 0 and s.counters["verify"].passes == stats.n_drafted_steps
        if mb == 0:
            assert t["stream_bytes_mtp"] > 0 and t["stream_bytes_verify_widened"] > 0 and t["stream_hits"] == 0


@pytest.mark.parametrize("mb", [0, 1, 1024])
def test_concurrent_reads_change_nothing(make_fixture, monkeypatch, mb):
    """A batch's misses are read READ_THREADS at a time: logits, every counter and the cache's LRU
    order equal those of reading one slice after another."""
    import refimpl.io.streamer as S

    path = make_fixture("tiny", "q4_k_m")
    runs = []
    for threads in (1, 8):
        monkeypatch.setattr(S, "READ_THREADS", threads)
        model = load_model(path, cache_mb=mb)
        assert (model.streamer._pool is None) == (threads == 1)
        runs.append((_scenario(model), model.streamer.stats(), model.streamer.cache.keys()))
    (a, stats_a, keys_a), (b, stats_b, keys_b) = runs
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert stats_a == stats_b and keys_a == keys_b


def _truncated_streamer(make_fixture, tmp_path):
    """A streamer on tiny q4_k_m cut 10 bytes into its last expert slice: (streamer, block, sel [1, 2])
    whose second expert's slice of that tensor cannot be read whole."""
    src = make_fixture("tiny", "q4_k_m")
    model = load_model(src, cache_mb=1024)
    last = max((t for ts in model.streamer.tensors.values() for t in ts), key=lambda t: t.slice_offset(0))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(Path(src).read_bytes()[: last.slice_offset(last.shape[0] - 1) + 10])
    s = ExpertStreamer(cut, model.streamer.tensors, n_layer=model.config.n_layer, n_ff=model.config.n_ff_exp, budget=1 << 30)
    il = next(il for il, ts in s.tensors.items() if last in ts)
    return s, il, np.array([[0, last.shape[0] - 1]])


def test_a_failed_read_leaves_nothing_in_the_cache(make_fixture, tmp_path):
    """A truncated file: the batch's reads fail with one line, and no unread slice stays cached."""
    s, il, sel = _truncated_streamer(make_fixture, tmp_path)
    with pytest.raises(RefimplError, match="unexpected end of file"):
        s.read_union(il, sel, np.ones_like(sel, dtype=np.float32))
    assert len(s.cache) == 0 and s.cache.used == 0
    s.close()


def test_a_failed_background_read_drops_its_batch(make_fixture, tmp_path):
    """A batch's reads run in the background (``routed``): the error of a failed one comes, as one
    line, from using a slice of that batch, and then none of the batch's slices stays cached — nor
    can a later batch be handed a slice before (or without) its bytes."""
    s, il, sel = _truncated_streamer(make_fixture, tmp_path)
    routed = StreamedExperts(s, il).routed(sel, np.ones_like(sel, dtype=np.float32))  # returns: nothing waited for
    assert len(s.cache) > 0
    with pytest.raises(RefimplError, match="unexpected end of file"):
        for e in sel[0]:
            routed.gate(int(e)), routed.up(int(e)), routed.down(int(e))
    assert len(s.cache) == 0 and s.cache.used == 0
    with pytest.raises(RefimplError, match="unexpected end of file"):  # the failed slice is never handed out
        for kind in ("gate", "up", "down"):
            getattr(routed, kind)(int(sel[0, 1]))
    assert len(s._in_flight) == 1  # that slice alone
    s.close()


def test_slices_are_read_in_the_background_gate_and_up_first(make_fixture, monkeypatch):
    """``routed`` returns before its reads finish; the reads start with every expert's gate and up
    slices (walk order), then the downs; a slice is handed out only once read, read-only and equal
    to the mapped bytes — also to a later batch whose hit finds it still in flight."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    path = make_fixture("tiny", "q4_k_m")
    pinned, model = load_model(path, pack=False), load_model(path, cache_mb=1024)
    s, il = model.streamer, 0
    release, order, read_into = threading.Event(), [], ExpertStreamer._read_into

    def held(self, t, e, buf):
        order.append((t.kind, e))
        assert release.wait(timeout=60)
        read_into(self, t, e, buf)

    monkeypatch.setattr(ExpertStreamer, "_read_into", held)
    monkeypatch.setattr(s, "_pool", ThreadPoolExecutor(1))  # one reader: the reads run in submission order
    sel, ones = np.array([[3, 1, 2]]), np.ones((1, 3), np.float32)
    routed = s.experts(il).routed(sel, ones)  # returns with every read held
    assert len(s._in_flight) == 3 * len(s.tensors[il])
    later = s.experts(il).routed(sel[:, :1], ones[:, :1])  # all hits, still in flight
    release.set()
    for batch, experts in ((later, [3]), (routed, [3, 1, 2])):
        for e in experts:
            for which in ("gate", "up", "down"):
                got, want = getattr(batch, which)(e), getattr(pinned.weights.layers[il].ffn.experts, which)(e)
                assert not got.raw.flags.writeable and np.array_equal(got.raw.view(np.uint8), want.raw.view(np.uint8))
    assert not s._in_flight
    downs = [e for kind, e in order if kind == "ffn_down_exps"]
    assert order[-3:] == [("ffn_down_exps", e) for e in downs] and sorted(downs) == [1, 2, 3]
    assert [e for kind, e in order[:-3]] == sorted((e for kind, e in order[:-3]), key=[3, 1, 2].index)


def test_slice_buffers_are_recycled_only_when_nothing_refers_to_them():
    """A slice buffer's block returns to the free list when the last view of it dies — a reshaped or
    retyped view (what a Matrix holds) keeps it out — and the next read of that size reuses it."""
    from refimpl.io.streamer import SliceBuffers

    pool = SliceBuffers()
    a = pool.take(4096)
    a[:] = 7
    b = pool.take(4096)
    assert not np.shares_memory(a, b)  # a is alive: b is a new block
    assert type(a) is np.ndarray  # the rest of refimpl sees plain arrays
    views = [a.reshape(16, -1)[2:5].view(np.float32), np.asarray(a)[8:], a.view(np.int32).reshape(2, -1).T]
    del a
    for _ in range(len(views)):
        c = pool.take(4096)
        assert not any(np.shares_memory(c, v) for v in views)  # a view of a's block is still alive
        views.pop()
    d = pool.take(4096)
    assert d.base is not None and (d == 7).all()  # a's block, as it was left (every read fills it whole)
    assert not np.shares_memory(d, b)
    assert not np.shares_memory(pool.take(8192)[:4096], d)  # other sizes have their own lists


def test_free_slice_buffers_stay_under_their_limit():
    """Freed blocks beyond the free lists' limit go back to the allocator, whatever their sizes."""
    from refimpl.io.streamer import SliceBuffers

    pool = SliceBuffers(free_bytes=10_000)
    held = [pool.take(n) for n in (4096, 4096, 3000, 3000, 5000)]
    while held:
        held.pop(0)  # freed in that order
    assert pool.free_bytes == 4096 + 4096  # the first freed that fit; the rest went back to the allocator
    assert pool.free_bytes == sum(b.nbytes for bs in pool._free.values() for b in bs)
    kept = pool.take(4096)
    assert pool.free_bytes == 4096 and kept.nbytes == 4096


# ---- the cache ------------------------------------------------------------------------------------


def test_slice_cache_evicts_least_recently_used_and_never_exceeds_its_budget():
    cache = SliceCache(budget=100)
    buf = {k: np.zeros(n, np.uint8) for k, n in [("a", 40), ("b", 30), ("c", 30), ("d", 50), ("big", 101)]}
    assert cache.put("a", buf["a"]) == [] and cache.put("b", buf["b"]) == [] and cache.put("c", buf["c"]) == []
    assert cache.keys() == ["a", "b", "c"] and cache.used == 100
    assert cache.get("a") is buf["a"]  # a hit makes a the most recent
    assert cache.keys() == ["b", "c", "a"]
    assert cache.put("d", buf["d"]) == ["b", "c"]  # 100 + 50 > 100: evict oldest until 50 fits
    assert cache.keys() == ["a", "d"] and cache.used == 90
    assert cache.put("big", buf["big"]) == [] and "big" not in cache  # larger than the budget: not kept
    assert cache.get("b") is None
    assert cache.peak == 100 and cache.evictions == 2
    nothing = SliceCache(budget=0)
    assert nothing.put("a", buf["a"]) == [] and len(nothing) == 0 and nothing.used == 0


def _fake_streamer(tmp_path, budget, n_expert=6, rows=2, cols=4):
    """A streamer over a file of three F32 expert tensors (gate, up, down) of one block, each
    (n_expert, rows, cols), filled with their own element index (+ 1000·tensor)."""
    kinds = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
    data = [np.arange(n_expert * rows * cols, dtype=np.float32).reshape(n_expert, rows, cols) + 1000 * i for i in range(3)]
    path = tmp_path / "experts.bin"
    pad = 64  # the tensors do not start at offset 0
    path.write_bytes(b"\xff" * pad + b"".join(d.tobytes() for d in data))
    slice_bytes = rows * cols * 4
    tensors = tuple(ExpertTensor(f"blk.0.{k}.weight", k, GGMLQuantizationType.F32, (n_expert, rows, cols),
                                 pad + i * data[0].nbytes, slice_bytes) for i, k in enumerate(kinds))
    return ExpertStreamer(path, {0: tensors}, n_layer=1, n_ff=rows, budget=budget), data, slice_bytes


def test_streamer_reads_the_right_bytes_and_evicts_in_lru_order(tmp_path):
    s, data, sb = _fake_streamer(tmp_path, budget=3 * 32)  # room for three 32-byte slices
    ex = s.experts(0)
    assert np.array_equal(ex.down(4).raw, data[2][4]) and np.array_equal(ex.gate(0).raw, data[0][0])
    assert np.array_equal(ex.up(5).raw, data[1][5])
    assert s.cache.keys() == [SliceKey(0, "ffn_down_exps", 4), SliceKey(0, "ffn_gate_exps", 0), SliceKey(0, "ffn_up_exps", 5)]
    ex.down(4)  # hit: most recent now
    ex.gate(1)  # miss: evicts the least recently used, gate[0]
    assert s.cache.keys() == [SliceKey(0, "ffn_up_exps", 5), SliceKey(0, "ffn_down_exps", 4), SliceKey(0, "ffn_gate_exps", 1)]
    c = s.counters["other"]
    assert (c.slices_read, c.hits, c.bytes_read) == (4, 1, 4 * sb)
    assert s.cache.used <= s.budget and s.cache.peak == 3 * sb and s.cache.evictions == 1


def test_a_verify_batch_reads_the_union_of_its_rows_once(tmp_path):
    """Hand-checked: rows 0 and 1 route to experts (0, 1) and (1, 2). At budget 0 the batch reads
    experts 0, 1, 2 once each (three tensors each); expert 2 is routed only by the draft row, so its
    three slices are the widened bytes. Using the batch's matrices reads nothing more."""
    s, data, sb = _fake_streamer(tmp_path, budget=0)
    sel = np.array([[0, 1], [1, 2]])
    w = np.full((2, 2), 0.5, np.float32)
    with s.phase("verify", positions=[7, 8]):
        batch = s.experts(0).routed(sel, w)
        for e in (0, 1, 1, 2):
            for which in ("gate", "up", "down"):
                getattr(batch, which)(e)
    v = s.counters["verify"]
    assert (v.slices_read, v.hits, v.bytes_read, v.widened_bytes, v.passes) == (9, 0, 9 * sb, 3 * sb, 1)
    assert np.array_equal(batch.down(2).raw, data[2][2]) and np.array_equal(batch.gate(1).raw, data[0][1])
    assert s.counters.total.slices_read == 9  # nothing read outside the batch
    # the same batch again with room for everything: a second pass hits what the first cached
    s2, _, _ = _fake_streamer(tmp_path, budget=1 << 20)
    with s2.phase("decode", positions=[7]):
        s2.experts(0).routed(sel[:1], w[:1])  # experts 0, 1
    with s2.phase("verify", positions=[8, 9]):
        s2.experts(0).routed(sel, w)  # 0, 1 hit; 2 missed, widened
    d, v = s2.counters["decode"], s2.counters["verify"]
    assert (d.slices_read, d.hits) == (6, 0)
    assert (v.slices_read, v.hits, v.bytes_read, v.widened_bytes) == (3, 6, 3 * sb, 3 * sb)
    assert v.hit_rate == 6 / 9


def test_counters_of_a_real_verify_batch_match_its_routes(make_fixture):
    """On the tiny model: the routes of a 1+2 batch (from moe_ffn's own trace) give, per layer, the
    union read at budget 0, its bytes, and the widened share of experts only rows 1-2 route to."""
    path = make_fixture("tiny", "q4_k_m")
    model = load_model(path, cache_mb=0)
    c, s = model.config, model.streamer
    _, _, state = forward(model, SeqState.fresh(c), PROMPT)
    before = s.counters["verify"].bytes_read
    routes = {}
    ctx = Ctx(trace=lambda name, il, x: routes.__setitem__(il, np.array(x)) if name == "ffn_moe_topk" else None)
    forward(model, state, [11, 12, 13], ctx)
    v = s.counters["verify"]
    n_read = widened = n_slices = 0
    for il in range(c.n_layer):
        per_expert = sum(t.slice_bytes for t in s.tensors[il])  # gate + up + down of one expert
        union, row0 = set(routes[il].ravel().tolist()), set(routes[il][0].tolist())
        n_read += per_expert * len(union)
        widened += per_expert * len(union - row0)
        n_slices += len(s.tensors[il]) * len(union)
    assert v.bytes_read - before == n_read and v.widened_bytes == widened and v.slices_read == n_slices
    assert v.passes == 1 and s.counters["prompt"].passes == 1


def test_phases(make_fixture):
    model = load_model(make_fixture("tiny", "q4_k_m"), cache_mb=0)
    s, c = model.streamer, model.config
    _, _, st = forward(model, SeqState.fresh(c), [1, 2])  # prompt
    _, _, st = forward(model, st, [3])  # decode
    _, _, st = forward(model, st, [4, 5])  # verify
    _, _, st = forward(model, st, [6, 7], phase="prompt")  # a second prompt chunk, declared by the caller
    assert [s.counters[p].passes for p in ("prompt", "decode", "verify", "mtp", "other")] == [2, 1, 1, 0, 0]
    per_layer = [sum(t.slice_bytes for t in s.tensors[il]) for il in range(c.n_layer)]
    assert s.counters["decode"].bytes_read == c.n_expert_used * sum(per_layer)  # K distinct experts per layer
    with pytest.raises(ValueError, match="unknown streamer phase"):
        with s.phase("draft"):
            pass


# ---- route trace -----------------------------------------------------------------------------------


def test_route_trace_rows_are_moe_ffns_selections(make_fixture, tmp_path):
    model = load_model(make_fixture("tiny", "q4_k_m"), cache_mb=1)
    c = model.config
    trace = RouteTrace(tmp_path / "routes.csv", c.n_expert_used)
    model.streamer.on_route = trace
    seen = []  # (kind, layer, sel, weights) in call order, from moe_ffn's own trace names

    def record(name, il, x):
        if name.endswith("ffn_moe_topk"):
            seen.append(["head" if name.startswith("mtp_") else "trunk", il, np.array(x)])
        elif name.endswith("ffn_moe_weights_norm"):
            seen[-1].append(np.array(x))

    ctx = Ctx(trace=record)
    _, h, st = forward(model, SeqState.fresh(c), PROMPT, ctx)
    _, _, st = forward(model, st, [3], ctx)
    w = load_mtp_weights(model.file, model.weights)
    h_in = np.concatenate([np.zeros((1, c.n_embd), np.float32), h[:-1]])
    mtp_forward(model, w, MTPState.fresh(c), PROMPT, h_in, ctx)
    trace.close()
    rows = read_route_trace(tmp_path / "routes.csv")
    expected = []
    passes = {"prompt": 0, "decode": 1, "mtp": 2}
    for kind, il, sel, wts in seen:
        phase = "mtp" if kind == "head" else ("prompt" if sel.shape[0] > 1 else "decode")
        start = 0 if phase != "decode" else len(PROMPT)
        for t in range(sel.shape[0]):
            expected.append({"pass": passes[phase], "phase": phase, "kind": kind, "row": t, "position": start + t,
                             "layer": il, "experts": sel[t].tolist(), "weights": wts[t].tolist()})
    assert rows == expected
    assert len(rows) == len(PROMPT) * c.n_layer + c.n_layer + len(PROMPT)
    assert all(np.float32(x) == x for r in rows for x in r["weights"])  # 9 digits give float32 back exactly


# ---- memory ---------------------------------------------------------------------------------------


def _present_pages(arr: np.ndarray) -> int:
    """Pages of arr's address range mapped into this process (/proc/self/pagemap bit 63)."""
    page = os.sysconf("SC_PAGE_SIZE")
    addr = arr.ctypes.data
    first, last = addr // page, (addr + arr.nbytes - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first + 1) * 8), dtype=np.uint64)
    return int(np.count_nonzero(entries >> np.uint64(63)))


@pytest.mark.skipif(not os.access("/proc/self/pagemap", os.R_OK), reason="needs /proc/self/pagemap")
def test_expert_pages_never_enter_the_process(make_fixture):
    path = make_fixture("tiny", "f32", seed=3)  # its own file: no other test has mapped its pages
    streamed = load_model(path, cache_mb=0)
    _scenario(streamed)
    gguf = streamed.file.gguf
    names = [n for il in streamed.streamer.tensors for n in (t.name for t in streamed.streamer.tensors[il])]
    present = sum(_present_pages(gguf.raw(n)) for n in names)
    # only the kernel's fault-around (≤ 16 pages) next to a dense tensor's page can map expert pages
    assert present <= 2 * 16 * len(names), present
    pinned = load_model(path)
    _scenario(pinned)
    assert sum(_present_pages(pinned.file.gguf.raw(n)) for n in names) > 4 * present + 100


# ---- budget and flags ------------------------------------------------------------------------------


def test_cache_budget():
    assert cache_budget(0) == 0 and cache_budget("64") == 64 * MIB
    avail = mem_available()
    if avail is not None:
        assert abs(cache_budget("auto") - avail // 2) < 256 * MIB
    for bad, msg in (("-1", "must be ≥ 0"), ("lots", "whole number of MiB or 'auto'"), ("1.5", "whole number")):
        with pytest.raises(RefimplError, match=msg):
            cache_budget(bad)


def test_auto_budget_leaves_the_page_cache_room_for_a_file_that_fits(monkeypatch):
    """auto: half of MemAvailable, unless the whole file fits in MemAvailable beside the packed copies and
    AUTO_HEADROOM — then what is left over (the page cache keeps the file), down to 0."""
    import refimpl.io.streamer as S

    GIB = 1 << 30
    monkeypatch.setattr(S, "mem_available", lambda: 24 * GIB)
    assert S.AUTO_HEADROOM == GIB
    assert cache_budget("auto") == 12 * GIB  # nothing known about the file
    assert cache_budget("auto", file_bytes=100 * MIB) == 12 * GIB  # small: the half, as before
    assert cache_budget("auto", file_bytes=20 * GIB, resident_bytes=2 * GIB) == 1 * GIB  # 24 − 20 − 2 − 1
    assert cache_budget("auto", file_bytes=22 * GIB, resident_bytes=2 * GIB) == 0
    assert cache_budget("auto", file_bytes=25 * GIB) == 12 * GIB  # larger than memory: the page cache cannot keep it
    assert cache_budget(64, file_bytes=20 * GIB) == 64 * MIB  # a number is a number


def test_load_model_gives_auto_the_file_size(make_fixture, monkeypatch):
    """load_model passes the file's size and its packed copies' bound to the auto budget."""
    import refimpl.model.load as M

    seen = {}
    monkeypatch.setattr(M, "cache_budget", lambda mb, **kw: seen.update(kw, mb=mb) or 0)
    path = make_fixture("tiny", "q4_k_m")
    load_model(path, cache_mb="auto")
    assert seen["mb"] == "auto" and seen["file_bytes"] == os.path.getsize(path) and 0 < seen["resident_bytes"] < seen["file_bytes"]
    load_model(path, cache_mb="auto", pack=False)
    assert seen["resident_bytes"] == 0


def test_ggml_auto_maps_a_file_that_fits(make_fixture, monkeypatch):
    """--emulate=ggml with --cache-mb auto: where the file fits in memory (auto's budget 0, or room left beside it)
    the routed experts are pinned (memory-map views: ggml's kernels read the stored rows or the column layout),
    unless a routing hook asks for the streamer; a file that does not fit, a number, or the plain path keep the
    streamer. (Pinned experts' bits in the ggml path: tests/test_ggml_e2e.py.)"""
    import refimpl.model.load as M

    path = make_fixture("tiny", "q4_k_m")
    ggml = ("avx512", True)
    monkeypatch.setattr(M, "cache_budget", lambda mb, **kw: 0)
    mapped = load_model(path, cache_mb="auto", ggml=ggml, pack=False)
    assert mapped.streamer is None and isinstance(mapped.weights.layers[0].ffn.experts, PinnedExperts)
    assert load_model(path, cache_mb="auto", ggml=ggml, pack=False, on_route=lambda r: None).streamer is not None
    assert load_model(path, cache_mb="0", ggml=ggml, pack=False).streamer is not None
    assert load_model(path, cache_mb="auto", pack=False).streamer is not None
    monkeypatch.setattr(M, "cache_budget", lambda mb, **kw: 64 * MIB)  # room beside the file: still pinned
    assert load_model(path, cache_mb="auto", ggml=ggml, pack=False).streamer is None
    assert load_model(path, cache_mb="auto", pack=False).streamer is not None
    monkeypatch.setattr(M, "fits_in_memory", lambda *a: False)  # a file larger than the memory: streamed
    assert load_model(path, cache_mb="auto", ggml=ggml, pack=False).streamer is not None


def test_pinned_experts_read_ahead_when_the_file_fits(make_fixture, monkeypatch):
    """Pinned (memory-mapped) routed experts: load_model asks the kernel to read the file ahead (MADV_WILLNEED) when it
    fits in memory, and not when it does not (it would push its own pages out) nor for streamed experts."""
    import refimpl.io.gguf_file as G
    import refimpl.io.streamer as S
    import refimpl.model.load as M

    asked = []
    real = G.GGUFFile.will_need
    monkeypatch.setattr(G.GGUFFile, "will_need", lambda self: asked.append(self.path) or real(self))
    path = make_fixture("tiny", "q4_k_m")
    load_model(path, pack=False)
    assert asked == [path]
    load_model(path, cache_mb=0, pack=False)
    assert asked == [path]
    monkeypatch.setattr(M, "fits_in_memory", lambda *a: False)
    load_model(path, pack=False)
    assert asked == [path]
    assert S.fits_in_memory(1) and not S.fits_in_memory(1 << 60)


def _refimpl(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "refimpl", *map(str, args)], capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_run_flags(make_fixture, tmp_path):
    from refimpl.decode.greedy import greedy

    path = make_fixture("predictable", "q4_k_m")
    csv_path, routes = tmp_path / "t.csv", tmp_path / "routes.csv"
    proc = _refimpl("run", path, "--tokens", "40,41,42", "-n", "6", "--mtp", "--draft", "2", "--cache-mb", "0",
                    "--json", "--csv", csv_path, "--route-trace", routes)
    out = json.loads(proc.stdout)
    assert out["tokens"] == greedy(load_model(path), [40, 41, 42], 6)
    st = out["stats"]["streamer"]
    assert st["budget_bytes"] == 0 and st["hits"] == 0 and st["bytes_read"] > 0
    assert st["phases"]["mtp"]["bytes_read"] > 0 and st["phases"]["prompt"]["passes"] == 1
    assert "stream:" in proc.stderr and "was the head's own routing" in proc.stderr
    from refimpl.decode.telemetry import read_csv

    _, rows, trailer = read_csv(csv_path)
    assert sum(int(r["stream_bytes"]) for r in rows) == int(trailer["stream_bytes"]) > 0
    assert {r["kind"] for r in read_route_trace(routes)} == {"trunk", "head"}
    bad = _refimpl("run", path, "--tokens", "1", "-n", "1", "--cache-mb", "x", check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith("refimpl: error: --cache-mb")


# ---- the wide fixture writer (bench/streamer.py) ----------------------------------------------------


def _bench():
    spec = importlib.util.spec_from_file_location("bench_streamer", Path(__file__).resolve().parents[1] / "bench" / "streamer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("quant", ["f32", "q4_k_m"])
def test_per_tensor_writer_gives_write_fixtures_bytes(make_fixture, tmp_path, quant):
    out = _bench().write_fixture_per_tensor(tmp_path / "x.gguf", preset="tiny", quant=quant, seed=0)
    assert out.read_bytes() == make_fixture("tiny", quant).read_bytes()
