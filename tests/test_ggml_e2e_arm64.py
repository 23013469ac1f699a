"""``--emulate=ggml`` on the phone's CPU, end to end: refimpl's AArch64 paths against llama.cpp's own AArch64 builds.

llama.cpp (the vendored tree of llama-cpp-python 0.3.36, cross-built by ``.ci/build-llama-arm64``) runs under
``qemu-aarch64`` on a CPU model with exactly the build's features (tests/arm64.py), driven by the same children as
the x86 tests (tests/llama_ref.py, llama_trace.py, llama_spec.py, in Debian's arm64 Python); refimpl runs here, on
x86, with ``Ctx.ggml`` the build's path (``kernels.ggml.build.detect`` reads it from the AArch64 library without
running it). Compared as ``uint32`` views, no tolerance, for the batch shapes that take different ARM kernels: with
CPU_REPACK (llama.cpp's default) a Q8_0 or Q4_K weight is multiplied by gemm on each block of 4 activation rows and by
gemv on the rest, so a decode (1 row), a 1+1 verify (2), a 1+3 verify (4) and a 1+8 verify (9 = 4 + 4 + 1) each
meet another mix; the i8mm build's plain-buffer row kernels take 2 rows at a time. Flash attention's one-row path
accumulates in half precision on both builds (FP16 vector arithmetic).

Builds: ``arm64-dotprod-gcc`` (``-march=armv8.2-a+dotprod+fp16``: most phones since 2019), ``arm64-i8mm-gcc``
(``armv8.6-a+dotprod+fp16+i8mm``: current phones) and ``arm64-base-gcc`` (``armv8-a``, the NDK's portable baseline: no
dotprod, no FP16 arithmetic, nothing repacked), ``arm64-sve128-gcc`` (``armv9-a+sve2+i8mm+dotprod+fp16``, run at a
128-bit vector length: flagship phones since 2022; its path is named, as an SVE library's vector length is the CPU's),
``arm64-sve256-gcc`` (the same library at 256 bits: Neoverse V1, Graviton3; path ``arm64-sve256``)
and the i8mm, dotprod, armv8-a and SVE builds compiled by clang 14, as the Android NDK compiles (``arm64-i8mm-clang``,
``arm64-dotprod-clang``, ``arm64-base-clang``: the Android guide's portable build; paths of the same names;
``arm64-sve128-clang``: the ``android_armv9.0_1`` variant, path ``arm64-sve128-clang14``), and the same four by
clang 19 (``arm64-*-clang19``: the NEON ones take the clang paths, the SVE one ``arm64-sve128-clang``), and by clang 17
and 18 (``arm64-*-clang17``, ``-clang18``: the Android NDK r26's and r27's LLVM majors, the paths of clang 19's). Each qemu run of the built-in model takes ~10-20 s here, so the
default suite runs one case of each kind (:data:`DEFAULT`) and ``pytest -m deep tests/test_ggml_e2e_arm64.py`` the whole
matrix (208 cases; clang 17's and 18's 84 of them, with the harness's 16, took 6 min 19 s on 2 workers; AMD EPYC Zen 4 host, qemu-aarch64 7.2,
2026-12-06).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ggml_graph import build_info
from llama_trace import llama_trace
from refimpl.fixtures.builtin import TRAINED_PATH
from refimpl.model.ops import emulation_ctx
from test_ggml_e2e import (N_THREADS, assert_bits, assert_greedy_and_mtp_head, assert_shape_bit_identical, model, prompt,
                            refimpl_batches, refimpl_logits)

pytestmark = pytest.mark.oracle

BUILDS = ["arm64-dotprod-gcc", "arm64-i8mm-gcc", "arm64-base-gcc", "arm64-sve128-gcc", "arm64-sve256-gcc", "arm64-i8mm-clang",
          "arm64-base-clang", "arm64-dotprod-clang", "arm64-sve128-clang", "arm64-i8mm-clang19", "arm64-dotprod-clang19",
          "arm64-base-clang19", "arm64-sve128-clang19",
          *(f"arm64-{kind}-clang{v}" for v in (17, 18) for kind in ("i8mm", "dotprod", "base", "sve128"))]
#: the cases of the default suite — repacked gemm and gemv rows, both K/V configurations, the draft-mtp loop, a
#: converted K-quant file on GCC's and on clang's i8mm build —; the others are marked ``deep`` (:func:`cases`). Every
#: ARM path also runs end to end against llama.cpp in the default suite through tests/test_ggml_paths_cli.py (its
#: logits one token per ubatch, run, audit, golden): the armv8-a builds (nothing repacked) need no verify case here.
DEFAULT = {("arm64-dotprod-gcc", "verify-1+3"), ("arm64-i8mm-gcc", "verify-1+8-f32-noflash"), ("arm64-i8mm-gcc", 3),
           ("arm64-sve128-gcc", "verify-1+3"), ("arm64-sve256-gcc", "verify-1+3"), ("arm64-sve256-gcc", "prompt-ubatch"),
           ("qwen3next-k-q4_k_m.gguf", "arm64-i8mm-gcc"), ("qwen35moe-k-q4_k_m.gguf", "arm64-i8mm-clang"),
           ("qwen35moe-k-q4_k_m.gguf", "arm64-i8mm-clang19"), ("qwen35moe-k-q4_k_m.gguf", "arm64-i8mm-clang18"),
           ("qwen35moe-k-q4_k_m.gguf", "arm64-sve256-gcc"), "arm64-sve128-clang17"}


def cases(*axes):
    """The product of ``axes`` as pytest params, those not in :data:`DEFAULT` marked ``deep``."""
    import itertools

    return [pytest.param(*c, marks=() if c in DEFAULT else pytest.mark.deep) for c in itertools.product(*axes)]
F16_FLASH = {"type_k": "f16", "type_v": "f16", "flash_attn": "on"}  # llama.cpp's defaults
F32 = ({"type_k": "f32", "type_v": "f32", "flash_attn": "off"}, {"kv_f16": False, "flash_attn": False})
#: shape -> (tokens used, n_batch of both sides, llama.cpp's n_ubatch, llama_trace options, refimpl Ctx fields)
SHAPES = {
    "decode": (12, 1, 512, F16_FLASH, {}),
    "verify-1+1": (12, 2, 512, F16_FLASH, {}),
    "verify-1+3": (12, 4, 512, F16_FLASH, {}),
    "verify-1+8-f32-noflash": (18, 9, 512, *F32),
    "prompt-ubatch": (None, 512, 512, F16_FLASH, {"n_threads": 2}),  # >= 64 rows: flash attention's tiled path
}


@pytest.fixture
def on_build(monkeypatch):
    """``on_build(build)`` → refimpl's path for ``build``; llama.cpp's children then load that build under qemu."""

    def select(build: str) -> str:
        import arm64

        arm64.require(build)
        monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(arm64.lib_dir(build)))
        if "sve" in build:  # detection refuses SVE on an x86 host (the vector length is the CPU's)
            return arm64.BUILDS[build][0]
        return build_info(build).path

    return select


@pytest.mark.parametrize("build,shape", cases(BUILDS, SHAPES))
def test_logits_bit_identical(build, shape, on_build):
    assert_shape_bit_identical(build, on_build(build), shape, SHAPES[shape])


@pytest.mark.deep
@pytest.mark.parametrize("build", BUILDS)
def test_plain_buffer_weights(build, on_build):
    """``--no-repack``: the same tokens with every weight in a plain buffer (its NEON ``vec_dot``s; on i8mm two rows
    at a time), in 1+3-shaped batches."""
    path = on_build(build)
    tokens = prompt()[:12]
    ref = llama_trace(TRAINED_PATH, tokens, (), n_threads=N_THREADS, n_batch=4, n_ubatch=512, repack=False, **F16_FLASH)
    logits, _ = refimpl_logits(path, tokens, 4, repack=False)
    assert_bits(f"{build} --no-repack logits", logits, ref["logits"])


def test_the_paths_compute_different_bits():
    """Each ARM path computes other bits than x86 and than every other ARM path — so each test above could fail on
    another path (dotprod and i8mm differ in their repacked gemm/gemv: 4x4 vs 4x8 blocks; base repacks nothing and
    sums F16 in float lanes; sve128 has its own F32/F16 dots and quant kernels; a clang build fuses other products
    and blocks other sums). On builtin:kjv, in the logits or the traced intermediates the e2e tests compare: its
    matmuls quantize their activations to Q8_0, which rounds some last-bit differences away (GCC's and clang's i8mm
    builds differ in the ssm_conv and delta-net outputs only; clang's dotprod and i8mm builds, whose Q8_0 4x4 and 4x8
    kernels are both fused, in nothing) — those pairs on the converted Q4_K_M file (K-quant 8x4 vs 8x8 kernels)."""
    import itertools

    from test_converted import CONVERTED
    from refimpl.model.trunk import load_model

    tokens = prompt()[:8]
    paths = ("arm64-dotprod", "arm64-i8mm", "arm64-base", "arm64-sve128", "arm64-sve256", "arm64-i8mm-clang", "arm64-base-clang",
             "arm64-dotprod-clang", "arm64-sve128-clang", "avx512")  # arm64-sve128-clang14: on plain Q6_K rows only
    #                                                                (test_clang_sve_builds_q6_k_rows_without_repack)
    runs = {p: refimpl_logits(p, tokens, 4) for p in paths}
    q4_k_m = load_model(CONVERTED / "qwen35moe-k-q4_k_m.gguf", pack=False)
    ids = [int(t) for t in np.random.default_rng(7).integers(1, q4_k_m.config.n_vocab, 8)]
    converted = functools.cache(lambda p: refimpl_batches(q4_k_m, ids, emulation_ctx("ggml", ggml=p, n_threads=N_THREADS), 4))
    same_on_kjv = set()
    for a, b in itertools.combinations(paths, 2):
        if not any((runs[a][i][k] != runs[b][i][k]).any() for i, k in ((0, ...), *((1, k) for k in runs[a][1]))):
            same_on_kjv.add((a, b))
            assert (np.asarray(converted(a)).view(np.uint32) != np.asarray(converted(b)).view(np.uint32)).any(), (a, b)
    assert same_on_kjv == {("arm64-i8mm-clang", "arm64-dotprod-clang")}, same_on_kjv


@pytest.mark.deep
@pytest.mark.parametrize("build", BUILDS)
def test_greedy_stream_and_mtp_head(build, on_build):
    """32 greedy steps with the draft-mtp catch-up (llama.cpp's defaults): the same stream, and the trunk's logits
    and h_nextn and the MTP head's logits and hiddens bit for bit at every position."""
    assert_greedy_and_mtp_head(build, on_build(build), prompt()[:8], 32)


@pytest.mark.parametrize("build,n_draft", cases(BUILDS, (1, 3)))
def test_draft_mtp_loop_equals_llama_cpp(build, n_draft, on_build):
    """``refimpl run --mtp --draft N --emulate=ggml:arm64-…``'s loop against llama.cpp's own draft-mtp rounds on the
    AArch64 build (tests/llama_spec.py, llama.cpp's defaults): the same stream, drafts, accepts and decodes."""
    from llama_spec import llama_speculative
    from refimpl.decode.speculative import speculative_generate

    path = on_build(build)
    start = prompt()[:10]
    theirs = llama_speculative(TRAINED_PATH, start, 24, n_draft=n_draft, defaults=True, n_threads=N_THREADS)
    tokens, stats = speculative_generate(model(), start, 24, emulation_ctx("ggml", ggml=path, n_threads=N_THREADS),
                                         source="mtp", n_draft=n_draft)
    assert tokens == theirs.tokens
    ours = (stats.n_drafted, stats.n_accepted, stats.n_decodes, stats.n_drafted_steps)
    assert ours == (theirs.n_drafted, theirs.n_accepted, theirs.n_decodes, theirs.n_drafted_steps)


@pytest.mark.parametrize("build", [pytest.param(b, marks=() if b in DEFAULT or b == "arm64-sve128-clang" else pytest.mark.deep)
                                   for b in ("arm64-sve128-clang", "arm64-sve128-clang17", "arm64-sve128-clang18",
                                             "arm64-sve128-clang19")])
def test_clang_sve_builds_q6_k_rows_without_repack(build, on_build):
    """``--no-repack`` on the SVE build compiled by clang: the converted Q4_K_M file's Q6_K matrices (attn_v, the
    shared and routed experts' ffn_down, the output) stay in a plain buffer and take its SVE 1-row kernel — every row
    of mul_mat_id, and a batch's last row when the batch is odd. clang 14's (``arm64-sve128-clang14``) reads each odd
    code's high bits as 3 (tests/test_ggml_ops_sve128.py says why): logits far from GCC's build, other argmaxes;
    clang 17's, 18's and 19's (``arm64-sve128-clang``) compute them right: within rounding of GCC's. refimpl's emulation gives
    llama.cpp's bits on each build, 12-token prompt then batches of 3."""
    import dataclasses

    from test_converted import CONVERTED
    from refimpl.model.trunk import load_model

    path, model_path = on_build(build), CONVERTED / "qwen35moe-k-q4_k_m.gguf"
    m = load_model(model_path, pack=False)
    tokens = [int(t) for t in np.random.default_rng(7).integers(1, m.config.n_vocab, 20)]
    ctx = dataclasses.replace(emulation_ctx("ggml", ggml=path, n_threads=N_THREADS), repack=False)
    logits = refimpl_batches(m, tokens, ctx, 3, prompt_batch=12)
    ref = llama_trace(model_path, tokens, (), n_threads=N_THREADS, prompt_batch=12, n_batch=3, n_ubatch=512,
                      repack=False, **F16_FLASH)
    assert_bits(f"qwen35moe-k-q4_k_m.gguf {build} --no-repack", logits, ref["logits"])
    gcc_ctx = dataclasses.replace(emulation_ctx("ggml", ggml="arm64-sve128", n_threads=N_THREADS), repack=False)
    gcc = refimpl_batches(m, tokens, gcc_ctx, 3, prompt_batch=12)
    if path == "arm64-sve128-clang14":
        assert np.abs(gcc - logits).max() > 1.0 and (gcc.argmax(1) != logits.argmax(1)).any()
    else:
        assert np.abs(gcc - logits).max() < 1e-4


#: converted files (made by llama.cpp's own convert_hf_to_gguf.py and llama-quantize) × the build they run on
CONVERTED_CASES = [("qwen35moe-k-q4_k_m.gguf", "arm64-dotprod-gcc"), ("qwen35moe-k-mxfp4_moe.gguf", "arm64-i8mm-gcc"),
                   ("qwen3next-k-q4_k_m.gguf", "arm64-i8mm-gcc"), ("qwen35-narrow-q8_0.gguf", "arm64-dotprod-gcc"),
                   ("qwen35moe-k-q4_k_m.gguf", "arm64-sve128-gcc"), ("qwen35moe-k-mxfp4_moe.gguf", "arm64-base-gcc"),
                   ("qwen35moe-k-q4_k_m.gguf", "arm64-sve256-gcc"),
                   ("qwen35moe-k-q4_k_m.gguf", "arm64-i8mm-clang"), ("qwen35moe-k-mxfp4_moe.gguf", "arm64-i8mm-clang"),
                   ("qwen35-narrow-q8_0.gguf", "arm64-i8mm-clang"), ("qwen35moe-k-mxfp4_moe.gguf", "arm64-base-clang"),
                   ("qwen35moe-k-q4_k_m.gguf", "arm64-sve128-clang"), ("qwen35moe-k-q4_k_m.gguf", "arm64-i8mm-clang19"),
                   ("qwen35moe-k-mxfp4_moe.gguf", "arm64-sve128-clang19"),
                   *((name, f"arm64-{kind}-clang{v}") for v in (17, 18)
                     for name, kind in (("qwen35moe-k-q4_k_m.gguf", "i8mm"), ("qwen35moe-k-mxfp4_moe.gguf", "sve128"),
                                        ("qwen35moe-k-q4_k_m.gguf", "sve128"), ("qwen35-narrow-q8_0.gguf", "dotprod"),
                                        ("qwen35moe-k-mxfp4_moe.gguf", "base")))]


@pytest.mark.parametrize("name,build", [pytest.param(*c, marks=() if c in DEFAULT else pytest.mark.deep)
                                        for c in CONVERTED_CASES])
def test_converted_files(name, build, on_build):
    """The converted files (Q4_K_M: Q4_K repacked 8x4 / 8x8 and plain Q6_K; MXFP4_MOE: MXFP4 4x4 and Q8_0; qwen35's
    dense FFN in Q8_0) with llama.cpp's defaults: a 12-token prompt in one batch, then 1+3-shaped batches."""
    from test_converted import CONVERTED
    from refimpl.model.trunk import load_model

    path, model_path = on_build(build), CONVERTED / name
    m = load_model(model_path, pack=False)
    tokens = [int(t) for t in np.random.default_rng(7).integers(1, m.config.n_vocab, 20)]
    ctx = emulation_ctx("ggml", ggml=path, n_threads=N_THREADS)
    logits = refimpl_batches(m, tokens, ctx, 4, prompt_batch=12)
    ref = llama_trace(model_path, tokens, (), n_threads=N_THREADS, prompt_batch=12, n_batch=4, n_ubatch=512, **F16_FLASH)
    assert_bits(f"{name} {build}", logits, ref["logits"])
