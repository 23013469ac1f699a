"""``--emulate=ggml`` end to end: the built-in trained model's logits, bit for bit, against llama.cpp itself.

llama.cpp (llama-cpp-python 0.3.36) runs in a subprocess on each of the two builds of tests/ggml_graph.py —
``native`` (AVX-512 here) and ``avx2`` (``LLAMA_CPP_LIB_PATH`` = the GGML_NATIVE=OFF build) — and refimpl runs
with ``Ctx.ggml`` set to that build's path (``kernels.ggml.build.detect``). Compared as ``uint32`` views at
every position (no tolerance), for the batch shapes llama.cpp computes differently:

* decode: one token per ``llama_decode`` (llama.cpp's defaults: F16 K/V, flash attention on; and F32 K/V
  with flash attention off, also in 4-token batches);
* a prompt in one ubatch (n_batch = n_ubatch = 512; ≥ 64 rows: flash attention's tiled path), and the same
  prompt in ubatches of 32 (refimpl.model.trunk splits the batch as llama.cpp does);
* 4-token batches after a 4-token prompt: the shape of a 1+3 speculative verify;
* the greedy stream and the MTP head (llama_ref's draft-mtp catch-up: the head's logits and hiddens).

The emulation follows the build, not the host: refimpl's two paths compute different bits for the same
tokens (``conv_output_raw`` of layer 0: ``ggml_ssm_conv``'s vectorized tap sum, AVX-512 FMA chain vs AVX2
rounded products), each equal to its own build.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ggml_graph import BUILDS, WITH_GENERIC, build_info
from llama_ref import llama_run
from llama_trace import llama_trace
from refimpl.fixtures.builtin import TRAINED_PATH
from refimpl.model.ops import emulation_ctx
from refimpl.model.state import SeqState

pytestmark = pytest.mark.oracle

TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
        "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. And God "
        "said, Let there be light: and there was light.")
N_THREADS = 1  # llama.cpp's n_threads (and Ctx.n_threads): 1, as 2 spinning threads crawl on a loaded 2-core host;
# the prompt-ubatch shape runs with 2 (flash attention's tiled path takes n_threads; split-KV needs ≥ 512 cells,
# more than kjv's 256-token context holds)
TRACED = ("conv_output_raw-0", "final_output-0", "attn_pregate-3")  # intermediates compared besides the logits


@functools.cache
def model():
    from refimpl.model.trunk import load_model

    return load_model(TRAINED_PATH, pack=False)


@functools.cache
def prompt() -> tuple[int, ...]:
    from refimpl.tokenizer.vocab import Tokenizer

    tokens = tuple(Tokenizer.from_gguf(TRAINED_PATH).encode(TEXT))
    assert len(tokens) >= 64  # one ubatch of them takes flash attention's tiled path (GGML_FA_TILE_Q)
    return tokens


@pytest.fixture
def on_build(monkeypatch):
    """``on_build(build)`` → refimpl's path for ``build``; llama.cpp's subprocesses then load that build."""

    def select(build: str) -> str:
        info = build_info(build)
        monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(info.lib_dir))
        return info.path

    return select


def refimpl_logits(path: str, tokens, n_batch: int, n_threads: int = N_THREADS, **fields) -> tuple[np.ndarray, dict]:
    """refimpl --emulate=ggml on ``path``, ``tokens`` in batches of ``n_batch`` (as llama_trace feeds llama.cpp):
    (logits [T, V], {name: [T, n]} of :data:`TRACED`)."""
    from refimpl.model.trunk import forward

    traced: dict[str, list] = {}

    def hook(name, il, x):
        key = name if il < 0 else f"{name}-{il}"
        if key in TRACED:
            traced.setdefault(key, []).append(np.asarray(x, dtype=np.float32).reshape(len(x), -1))

    ctx = emulation_ctx("ggml", ggml=path, n_threads=n_threads, trace=hook, **fields)
    state, logits = SeqState.fresh(model().config), []
    for s in range(0, len(tokens), n_batch):
        lg, _, state = forward(model(), state, list(tokens[s : s + n_batch]), ctx)
        logits.append(lg)
    return np.concatenate(logits), {k: np.concatenate(v) for k, v in traced.items()}


def assert_bits(name: str, got: np.ndarray, want: np.ndarray) -> None:
    got, want = np.ascontiguousarray(got, np.float32), np.ascontiguousarray(want, np.float32).reshape(got.shape)
    diff = got.view(np.uint32) != want.view(np.uint32)
    rows = np.nonzero(diff.reshape(len(diff), -1).any(axis=1))[0]
    assert not diff.any(), f"{name}: {diff.sum()} elements differ, at positions {rows[:10].tolist()}, max |Δ| {np.max(np.abs(got - want)):.3g}"


def batch_bounds(n_tokens: int, n_batch: int, prompt_batch: int = 0) -> list[tuple[int, int]]:
    """The token ranges of llama_trace's ``llama_decode`` calls: ``prompt_batch`` tokens first (when > 0), then
    ``n_batch`` at a time."""
    starts = ([0] if prompt_batch else []) + list(range(prompt_batch, n_tokens, n_batch))
    return [(s, prompt_batch if s == 0 and prompt_batch else min(s + n_batch, n_tokens)) for s in starts]


def refimpl_batches(m, tokens, ctx, n_batch: int, prompt_batch: int = 0) -> np.ndarray:
    """refimpl's logits [T, V] for ``tokens`` forwarded in llama_trace's batches (:func:`batch_bounds`)."""
    from refimpl.model.trunk import forward

    state, logits = SeqState.fresh(m.config), []
    for s, e in batch_bounds(len(tokens), n_batch, prompt_batch):
        lg, _, state = forward(m, state, list(tokens[s:e]), ctx)
        logits.append(lg)
    return np.concatenate(logits)


def assert_llama_defaults(model_path, path: str, batches, label: str, tokens=None, seed: int = 0) -> None:
    """For each n_batch of ``batches``: refimpl ``--emulate=ggml`` (``path``) and llama.cpp with its defaults (F16 K/V,
    flash attention on, repacking) on ``tokens`` (default: 18 ids drawn with ``seed``) in batches of n_batch —
    logits equal as bits."""
    from refimpl.model.trunk import load_model

    m, ctx = load_model(model_path, pack=False), emulation_ctx("ggml", ggml=path, n_threads=N_THREADS)
    if tokens is None:
        tokens = [int(t) for t in np.random.default_rng(seed).integers(1, m.config.n_vocab, 18)]
    for n_batch in batches:
        ref = llama_trace(model_path, tokens, (), n_threads=N_THREADS, n_batch=n_batch, n_ubatch=512, type_k="f16",
                          type_v="f16", flash_attn="on")
        assert_bits(f"{label} n_batch {n_batch}", refimpl_batches(m, tokens, ctx, n_batch), ref["logits"])


#: shape -> (tokens used, n_batch of both sides, llama.cpp's n_ubatch, llama_trace options, refimpl Ctx fields)
SHAPES = {
    "decode": (24, 1, 512, {"type_k": "f16", "type_v": "f16", "flash_attn": "on"}, {}),
    "decode-f32-noflash": (24, 1, 512, {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}, {"kv_f16": False, "flash_attn": False}),
    "prompt-ubatch": (None, 512, 512, {"type_k": "f16", "type_v": "f16", "flash_attn": "on"}, {"n_threads": 2}),
    "prompt-ubatches-of-32": (None, 512, 32, {"type_k": "f16", "type_v": "f16", "flash_attn": "on"}, {"n_ubatch": 32}),
    "verify-1+3": (24, 4, 512, {"type_k": "f16", "type_v": "f16", "flash_attn": "on"}, {}),
    # F32 K/V without flash attention, batched: K·Q takes vec_dot (the permuted Q view is not contiguous), P·V sgemm
    "verify-f32-noflash": (24, 4, 512, {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}, {"kv_f16": False, "flash_attn": False}),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("build", WITH_GENERIC)
def test_logits_bit_identical(build, shape, on_build):
    assert_shape_bit_identical(build, on_build(build), shape, SHAPES[shape])


def assert_shape_bit_identical(build: str, path: str, shape: str, spec) -> None:
    """llama_trace on the loaded build against refimpl's ``path`` for one :data:`SHAPES`-style ``spec`` (tokens used,
    n_batch, n_ubatch, llama_trace options, Ctx fields): the logits and :data:`TRACED` bit for bit."""
    n_tok, n_batch, n_ubatch, options, fields = spec
    tokens = prompt()[:n_tok]
    ref = llama_trace(TRAINED_PATH, tokens, TRACED, n_threads=fields.get("n_threads", N_THREADS), n_batch=n_batch,
                      n_ubatch=n_ubatch, **options)
    logits, traced = refimpl_logits(path, tokens, n_batch, **fields)
    assert_bits(f"{build} {shape} logits", logits, ref["logits"])
    for name in TRACED:
        assert_bits(f"{build} {shape} {name}", traced[name], ref[name])


@pytest.mark.parametrize("build", WITH_GENERIC)
def test_greedy_stream_and_mtp_head(build, on_build):
    """llama_ref's greedy loop with the draft-mtp catch-up (llama.cpp's defaults): the same stream, and the
    trunk's logits and h_nextn and the MTP head's logits and hiddens bit for bit at every position."""
    assert_greedy_and_mtp_head(build, on_build(build), prompt()[:12], 12)


def assert_greedy_and_mtp_head(build: str, path: str, start, n_generate: int) -> None:
    """llama_ref's greedy loop with the MTP catch-up on the loaded build (``LLAMA_CPP_LIB_PATH``) against refimpl's
    ``path``: the same tokens; logits, hidden, mtp_logits and mtp_hidden bit for bit at every position."""
    from refimpl.model.mtp import MTPState, load_mtp_weights, mtp_forward
    from refimpl.model.ops import argmax
    from refimpl.model.trunk import forward

    ref = llama_run(TRAINED_PATH, start, n_generate=n_generate, mtp=True, defaults=True, n_threads=N_THREADS)
    m = model()
    mw = load_mtp_weights(m.file, m.weights)
    ctx = emulation_ctx("ggml", ggml=path, n_threads=N_THREADS, n_ubatch=8)  # llama_ref's context: n_ubatch 8
    state, mstate = SeqState.fresh(m.config), MTPState.fresh(m.config)
    tokens, h_prev, rows = list(start), np.zeros((1, m.config.n_embd), np.float32), []
    for pos in range(len(ref.tokens)):
        if pos >= len(tokens):
            tokens.append(argmax(rows[-1][0][0]))
        lg, h, state = forward(m, state, [tokens[pos]], ctx)
        mlg, mh, mstate = mtp_forward(m, mw, mstate, [tokens[pos]], h_prev, ctx)
        rows.append((lg, h, mlg, mh))
        h_prev = h
    assert tokens == ref.tokens.tolist()
    for i, name in enumerate(("logits", "hidden", "mtp_logits", "mtp_hidden")):
        assert_bits(f"{build} {name}", np.concatenate([r[i] for r in rows]), getattr(ref, name))


def test_emulation_follows_the_build(on_build):
    """The paths compute different bits on the same tokens (so each test above could fail on another build):
    layer 0's ``ggml_ssm_conv`` sums its 4 taps as an FMA chain on AVX-512, as rounded products on AVX2; the generic
    build's logits differ from both (double-sum dots, no FMA, its own quantizer), and llama.cpp's generic library is
    the one its tests load (its logits are not the native build's)."""
    tokens = prompt()[:8]
    la, a = refimpl_logits("avx512", tokens, 1)
    lb, b = refimpl_logits("avx2", tokens, 1)
    lg, _ = refimpl_logits("generic", tokens, 1)
    assert (a["conv_output_raw-0"].view(np.uint32) != b["conv_output_raw-0"].view(np.uint32)).any()
    assert (lg.view(np.uint32) != la.view(np.uint32)).any() and (lg.view(np.uint32) != lb.view(np.uint32)).any()
    on_build("generic")
    generic = llama_trace(TRAINED_PATH, tokens, (), n_threads=N_THREADS, n_batch=1, n_ubatch=512)["logits"]
    on_build("native")
    native = llama_trace(TRAINED_PATH, tokens, (), n_threads=N_THREADS, n_batch=1, n_ubatch=512)["logits"]
    assert (generic.view(np.uint32) != native.view(np.uint32)).any()


@pytest.mark.parametrize("build", WITH_GENERIC)
def test_draft_mtp_loop_equals_llama_cpp(build, on_build):
    """``refimpl run --mtp --draft 3 --emulate=ggml``'s loop (refimpl.decode.speculative) against llama.cpp's own
    draft-mtp rounds (tests/llama_spec.py, llama.cpp's defaults): the same stream, drafts, accepts and decodes —
    the 1+3 verify batches, the MTP catch-up batches and the recurrent-state rollbacks computed as llama.cpp does."""
    from llama_spec import llama_speculative
    from refimpl.decode.speculative import speculative_generate

    path = on_build(build)
    start = prompt()[:10]
    theirs = llama_speculative(TRAINED_PATH, start, 24, n_draft=3, defaults=True, n_threads=N_THREADS)
    tokens, stats = speculative_generate(model(), start, 24, emulation_ctx("ggml", ggml=path, n_threads=N_THREADS),
                                         source="mtp", n_draft=3)
    assert tokens == theirs.tokens
    ours = (stats.n_drafted, stats.n_accepted, stats.n_decodes, stats.n_drafted_steps)
    assert ours == (theirs.n_drafted, theirs.n_accepted, theirs.n_decodes, theirs.n_drafted_steps)


@pytest.mark.parametrize("build", WITH_GENERIC)
def test_cli_names_the_build_and_matches_llama_cpp(build, on_build, tmp_path, capsys):
    """``refimpl logits --emulate=ggml``: one stderr line naming the build it follows, and llama.cpp's logits
    of that build for the prompt as one batch (llama.cpp's defaults: n_batch 2048 ≥ T, one ubatch)."""
    from refimpl.cli import main

    path = on_build(build)
    tokens = prompt()[:16]
    out = tmp_path / "logits.npy"
    assert main(["logits", "--emulate=ggml", "--tokens", ",".join(map(str, tokens)), "--out", str(out), str(TRAINED_PATH)]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("emulating ")]
    assert said == [f"emulating {build_info(build).describe()}"]
    assert said[0].startswith({"avx512": "emulating ggml-cpu AVX-512 (", "avx2": "emulating ggml-cpu AVX2 (",
                               "avx2-zen": "emulating ggml-cpu AVX2 (tuned for AMD Zen) (",
                               "generic": "emulating ggml-cpu generic x86 (no SIMD) from"}[path])
    ref = llama_trace(TRAINED_PATH, tokens, (), n_threads=N_THREADS, n_batch=512, n_ubatch=512, type_k="f16",
                      type_v="f16", flash_attn="on")
    assert_bits(f"{build} refimpl logits --emulate=ggml", np.load(out), ref["logits"])


def test_cli_refuses_a_build_it_does_not_emulate(tmp_path, monkeypatch, capsys):
    """A folder without libggml-cpu (e.g. a build that loads its backends at run time): refused in one line, exit 2."""
    from refimpl.cli import main

    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(tmp_path))
    assert main(["logits", "--emulate=ggml", "--tokens", "1,2", "--out", str(tmp_path / "x.npy"), str(TRAINED_PATH)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("refimpl: error: --emulate=ggml: no libggml-cpu.so in"), err


@pytest.mark.parametrize("build", BUILDS)
def test_weights_llama_cpp_repacks(build, make_fixture, tmp_path, on_build, capsys):
    """A Q4_K_M file holds Q4_K matrices that llama.cpp's default CPU_REPACK buffer re-lays out (``q4_K_8x8_q8_K``):
    ``--emulate=ggml`` runs their repacked gemm/gemv and equals llama.cpp's default run bit for bit — a 9-token
    prompt (two 4-row gemm groups and a gemv row), batches of 5 and one token at a time; with ``--no-repack``
    it equals llama.cpp's run with ``use_extra_bufts = false``, whose logits differ (so the two are told apart)."""
    from refimpl.cli import main

    on_build(build)
    path = make_fixture("tiny", "q4_k_m")
    tokens = list(range(1, 15))
    runs = {}
    for repack in (True, False):
        out = tmp_path / f"logits-{repack}.npy"
        argv = ["logits", "--emulate=ggml", "--tokens", ",".join(map(str, tokens[:9])), "--out", str(out), str(path)]
        assert main(argv + ([] if repack else ["--no-repack"])) == 0
        ref = llama_trace(path, tokens[:9], (), n_threads=N_THREADS, n_batch=512, n_ubatch=512, type_k="f16",
                          type_v="f16", flash_attn="on", repack=repack)
        assert_bits(f"{build} q4_k_m repack={repack} prompt logits", np.load(out), ref["logits"])
        runs[repack] = ref["logits"]
    assert not np.array_equal(runs[True].view(np.uint32), runs[False].view(np.uint32))  # the repacked kernels ran
    # batches of 5, 5, 4 (gemm rows and a gemv row; a gemm-only batch), then decode (gemv)
    assert_llama_defaults(path, build_info(build).path, (5, 1), f"{build} q4_k_m repacked", tokens)
    assert main(["logits", "--no-repack", "--tokens", "1,2", "--out", str(tmp_path / "x.npy"), str(path)]) == 2
    assert "--no-repack describes the llama.cpp that --emulate=ggml emulates" in capsys.readouterr().err


CONVERTED_FILES = ["qwen35moe-narrow-q8_0.gguf", "qwen35moe-narrow-bf16.gguf", "qwen35moe-narrow-bf16-fused.gguf",
                   "qwen3next-narrow-q8_0.gguf", "qwen35-narrow-f32.gguf", "qwen35moe-k-iq4_xs.gguf",
                   "qwen35moe-k-mxfp4_moe.gguf", "qwen35moe-k-q4_k_m.gguf", "qwen35-k-q4_k_m.gguf",
                   "qwen3next-k-q4_k_m.gguf"]


@pytest.mark.parametrize("name,build", [(n, "native") for n in CONVERTED_FILES]
                         + [(n, "avx2") for n in CONVERTED_FILES if "mxfp4" in n or "q4_k" in n or "iq4" in n]
                         + [(n, "generic") for n in CONVERTED_FILES if "iq4" not in n])
def test_files_made_by_llama_cpps_own_tools(name, build, on_build):
    """Files this project did not write — golden/converted: tiny Hugging Face checkpoints converted by the vendored
    convert_hf_to_gguf.py and quantized by llama-quantize (tests/test_converted.py), all three archs — bit for bit
    with llama.cpp and its defaults (the Q4_K and MXFP4 weights in its CPU_REPACK buffer), one token per call and in
    5-token batches (the repacked gemm's 4-row group and a gemv row). The mixes with repacked weights run on both
    builds."""
    from test_converted import CONVERTED

    tokens = [1, 5, 9, 17, 33, 65, 129, 200, 7, 3, 11, 42]
    assert_llama_defaults(CONVERTED / name, on_build(build), (1, 5), f"{name} {build}", tokens)


MATRIX_FILES = ["qwen35moe-k-q4_k_m.gguf", "qwen3next-k-q4_k_m.gguf", "qwen35moe-k-mxfp4_moe.gguf", "qwen35-k-q4_k_m.gguf"]
#: llama.cpp configuration -> (llama_trace options, refimpl Ctx fields)
CONFIGS = {"f16-flash": ({"type_k": "f16", "type_v": "f16", "flash_attn": "on"}, {}),
           "f32-noflash": ({"type_k": "f32", "type_v": "f32", "flash_attn": "off"}, {"kv_f16": False, "flash_attn": False})}


@pytest.mark.parametrize("n_ubatch", [1, 512])
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("name,build", [(n, "native") for n in MATRIX_FILES]
                         + [(n, "generic") for n in ("qwen35moe-k-q4_k_m.gguf", "qwen35moe-k-mxfp4_moe.gguf")])
def test_converted_files_in_every_configuration(name, build, config, n_ubatch, on_build):
    """The converted files with repacked weights (and qwen35's dense FFN), in K/V F16/F32 × flash attention on/off ×
    n_ubatch 1 and 512: a 56-token prompt in one batch, then 12 tokens in 1+3-shaped batches, logits bit for bit —
    loaded with the column layout (kernels.ggml.columns; the stored rows' kernels: assert_llama_defaults). On ggml's
    generic build (no repack, no layout: every product its generic vec_dot) too."""
    from test_converted import CONVERTED
    from refimpl.model.trunk import load_model

    options, fields = CONFIGS[config]
    path, model_path = on_build(build), CONVERTED / name
    m = load_model(model_path, pack=True, ggml=(path, True))  # the column layout of the repacked weights (--pack)
    assert (m.packed_bytes > 0) == (build != "generic")
    tokens = [int(t) for t in np.random.default_rng(7).integers(1, m.config.n_vocab, 68)]
    ctx = emulation_ctx("ggml", ggml=path, n_threads=N_THREADS, n_ubatch=n_ubatch, **fields)
    logits = refimpl_batches(m, tokens, ctx, 4, prompt_batch=56)
    ref = llama_trace(model_path, tokens, (), n_threads=N_THREADS, prompt_batch=56, n_batch=4, n_ubatch=n_ubatch,
                      **options)
    assert_bits(f"{name} {config} n_ubatch {n_ubatch}", logits, ref["logits"])


@pytest.mark.parametrize("name,build", [(n, "native") for n in MATRIX_FILES] + [("qwen35moe-k-q4_k_m.gguf", "generic")])
def test_converted_files_draft_mtp_loop(name, build, on_build):
    """llama.cpp's draft-mtp loop (n_max 3, its defaults, repacked weights) on the converted files: the same
    stream, drafts, accepts and decodes as refimpl's loop under --emulate=ggml."""
    from llama_spec import llama_speculative
    from test_converted import CONVERTED
    from refimpl.decode.speculative import speculative_generate
    from refimpl.model.trunk import load_model

    path, model_path = on_build(build), CONVERTED / name
    m = load_model(model_path, pack=True, ggml=(path, True))  # the column layout of the repacked weights (--pack)
    start = [int(t) for t in np.random.default_rng(11).integers(1, m.config.n_vocab, 10)]
    theirs = llama_speculative(model_path, start, 16, n_draft=3, defaults=True, n_threads=N_THREADS)
    tokens, stats = speculative_generate(m, start, 16, emulation_ctx("ggml", ggml=path, n_threads=N_THREADS),
                                         source="mtp", n_draft=3)
    assert tokens == theirs.tokens
    assert (stats.n_drafted, stats.n_accepted, stats.n_decodes) == (theirs.n_drafted, theirs.n_accepted, theirs.n_decodes)
    assert theirs.n_drafted > 0


@pytest.mark.parametrize("n_threads,build", [(1, "native"), (2, "native"), (2, "generic")])
def test_split_kv_decode(n_threads, build, on_build):
    """Decode past 256 cells of a 512-cell cache: flash attention's split-KV path (one query row, n_kv ≥ 512), whose
    chunks follow the thread count — after a 300-token prompt (one ubatch: the tiled path), 4 decoded tokens equal
    llama.cpp's bit for bit with 1 and 2 threads (a converted Q4_K_M file: its context is long enough)."""
    from test_converted import CONVERTED
    from refimpl.model.trunk import load_model

    path, model_path = on_build(build), CONVERTED / "qwen35moe-k-q4_k_m.gguf"
    m = load_model(model_path, pack=False)
    tokens = [int(t) for t in np.random.default_rng(5).integers(1, m.config.n_vocab, 304)]
    n_ctx = len(tokens) + 8  # llama_trace's context: padded to 512 cells
    logits = refimpl_batches(m, tokens, emulation_ctx("ggml", ggml=path, n_threads=n_threads, n_ctx=n_ctx), 1,
                             prompt_batch=300)
    ref = llama_trace(model_path, tokens, (), n_threads=n_threads, prompt_batch=300, n_batch=1, n_ubatch=512,
                      type_k="f16", type_v="f16", flash_attn="on")
    assert_bits(f"split-KV decode, {n_threads} threads", logits, ref["logits"])


#: LLAMA_FTYPE_MOSTLY_* of the mixes requantized by llama.cpp's own quantizer from the converted Q4_K_M file (their
#: matrices: Q2_K + Q3_K, Q3_K + Q4_K + Q5_K, the legacy types, IQ4_NL, IQ3_S (+ Q4_K for IQ3_M); Q6_K LM head)
REQUANTIZED = {"q2_k": 10, "q3_k_m": 12, "q4_0": 2, "q4_1": 3, "q5_0": 8, "q5_1": 9, "iq4_nl": 25, "iq3_s": 26,
               "iq3_m": 27}


@pytest.fixture(scope="session")
def requantized(tmp_path_factory):
    """``requantized(mix)`` -> the converted qwen35moe Q4_K_M file requantized to ``mix`` by llama_model_quantize."""
    from llama_ref import quantize_with_llama
    from test_converted import CONVERTED

    root, made = tmp_path_factory.mktemp("requantized"), {}

    def make(mix: str):
        if mix not in made:
            made[mix] = quantize_with_llama(CONVERTED / "qwen35moe-k-q4_k_m.gguf", root / f"qwen35moe-k-{mix}.gguf",
                                            REQUANTIZED[mix], allow_requantize=True)
        return made[mix]

    return make


@pytest.mark.parametrize("mix,build", [(m, "native") for m in REQUANTIZED] + [("q2_k", "avx2"), ("q4_0", "avx2"),
                                                                           ("iq3_s", "avx2")]
                         + [(m, "generic") for m in ("q2_k", "q3_k_m", "q4_1", "q5_0", "iq3_s")])  # a mix per dot family
def test_every_quant_mix(mix, build, requantized, on_build):
    """Every mix real Qwen3.5 files come in, made by llama.cpp's own quantizer: logits bit for bit with llama.cpp's
    defaults (CPU_REPACK for Q4_0 / IQ4_NL, and Q2_K on AVX-512), one token per call and in 9-token batches (the
    K-quant and IQ weights' tiled kernel, llamafile's sgemm for the legacy types, the repacked gemm)."""
    assert_llama_defaults(requantized(mix), on_build(build), (1, 9), f"{mix} {build}", seed=3)


@pytest.mark.parametrize("mix,build", [(m, "native") for m in ("iq1_m", "iq2_xxs", "iq3_xxs")]
                         + [("iq1_m", "generic")])  # IQ1_M's shift term; every IQ dot: test_ggml_ops_mulmat
def test_iq_fixture_mixes(mix, build, make_fixture, on_build):
    """The IQ1_M / IQ2_XXS / IQ3_XXS fixture mixes (quantized by libggml; llama_model_quantize wants an importance
    matrix for them): logits bit for bit, one token per call and in 9-token batches."""
    assert_llama_defaults(make_fixture("tiny", mix), on_build(build), (1, 9), f"{mix} {build}", seed=4)


def test_generic_build_refuses_types_it_does_not_emulate(make_fixture, on_build, tmp_path, capsys):
    """On ggml's generic build, as on the others, the ternary types (TQ1_0, TQ2_0) are refused in one line naming
    the type and the path, exit 2 — not computed with another kernel."""
    from refimpl.cli import main

    on_build("generic")
    path = make_fixture("tiny", "tq1_0")
    assert main(["logits", "--emulate=ggml", "--tokens", "1,2", "--out", str(tmp_path / "x.npy"), str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("emulating")]
    assert len(err) == 1 and "TQ1_0" in err[0] and "generic path is not emulated" in err[0], err
