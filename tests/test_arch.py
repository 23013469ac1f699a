"""The two sibling architectures next to qwen35moe: ``qwen35`` (dense FFN) and ``qwen3next`` (NEOX RoPE,
fused ``ssm_in`` / ``ssm_ba``, value heads grouped by key head) — loading, the layer code they share,
and conformance with llama.cpp (logits, greedy, the MTP head, speculative counts), on tiny fixtures.
"""

import functools

import numpy as np
import pytest

import conformance
from conftest import require_llama_cpp
from refimpl.cli import main
from refimpl.decode.greedy import greedy
from refimpl.cli.inspect_model import describe
from refimpl.io.load import open_model
from refimpl.model.trunk import forward, load_model
from refimpl.model.ops import Ctx
from refimpl.decode.speculative import speculative_generate
from refimpl.model.state import SeqState
from refimpl.oracle.trace import Recorder

ARCHS = ["qwen35", "qwen3next"]
PROMPT_LEN, N_GEN = 24, 32
MTP_PROMPT = [11, 42, 7, 300, 5, 99, 64, 200, 13, 1, 77, 256]


@pytest.fixture(scope="module")
def make_fixture(make_fixture):
    """conftest's, with qwen3next's fused ``ssm_in`` (the older layout) unless a test asks for ``ssm_in=False``:
    this module checks that path; the converter's attn_qkv + attn_gate (the writer's default) is checked
    against llama.cpp in tests/test_fixture_layout.py and by the tests here that pass ``ssm_in=False``."""
    def make(preset="tiny", quant="f32", seed=0, **options):
        if options.get("arch") == "qwen3next":
            options.setdefault("ssm_in", True)
        return make_fixture(preset, quant, seed, **options)

    return make


def _prompt(n=PROMPT_LEN, seed=1):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 390, size=n)]  # normal tokens of the tiny vocab


@pytest.fixture(scope="module")
def models(make_fixture):
    @functools.cache
    def get(arch, quant="f32", **options):
        return load_model(make_fixture("tiny", quant, arch=arch, **options))

    return get


# ---- loading and the shared layer code --------------------------------------------------------


def test_inspect_names_the_arch_and_what_differs(make_fixture):
    dense = describe(open_model(make_fixture("tiny", "f32", arch="qwen35")))
    assert "(arch qwen35)" in dense and "dense SwiGLU, width 512 (no experts)" in dense and "moe " not in dense
    nxt = describe(open_model(make_fixture("tiny", "f32", arch="qwen3next")))
    assert "(arch qwen3next)" in nxt and "NEOX" in nxt and "ssm_in (fused" in nxt and "ssm_ba (fused" in nxt
    assert "key head j // (Hv/Hk)" in nxt and "X=8 experts" in nxt
    assert "(arch qwen35moe)" in describe(open_model(make_fixture("tiny", "f32")))


@pytest.mark.parametrize("arch", ARCHS)
def test_batch_equals_one_token_at_a_time_bit_for_bit(models, arch):
    model = models(arch)
    tokens = _prompt(7, seed=2)
    batch, h, _ = forward(model, SeqState.fresh(model.config), tokens)
    state, rows = SeqState.fresh(model.config), []
    for t in tokens:
        logits, _, state = forward(model, state, [t])
        rows.append(logits[0])
    assert np.array_equal(batch, np.stack(rows))


def test_qwen3next_ssm_in_and_attn_qkv_files_hold_the_same_model(models, make_fixture):
    """The legacy fused ssm_in (q, k, v, z per key head) and today's attn_qkv + attn_gate are the same
    weights regrouped (refimpl/fixtures/weights.py): refimpl gives the same bits for both."""
    tokens = _prompt(6, seed=3)
    fused, split = models("qwen3next"), models("qwen3next", ssm_in=False)
    assert fused.file.plan.ssm_in[0] and not split.file.plan.ssm_in[0]
    a, _, _ = forward(fused, SeqState.fresh(fused.config), tokens)
    b, _, _ = forward(split, SeqState.fresh(split.config), tokens)
    assert np.array_equal(a, b)


def test_dense_model_streams_nothing_and_says_so(make_fixture, tmp_path, capsys):
    path = make_fixture("tiny", "f32", arch="qwen35")
    model = load_model(path, cache_mb=0, progress=False)
    out = greedy(model, [1, 2, 3], 2)
    assert model.streamer.bytes_read() == 0 and model.streamer.expert_bytes == 0
    lines = model.streamer.summary_lines(len(out), mtp=True)
    assert len(lines) == 1 and "nothing to stream: qwen35 is a dense model" in lines[0]
    rc = main(["run", str(path), "--tokens", "1,2", "-n", "1", "--route-trace", str(tmp_path / "r.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1] == "refimpl: error: --route-trace: qwen35 is a dense model; there is no expert routing to trace"
    assert not (tmp_path / "r.csv").exists()


# ---- conformance against llama.cpp ------------------------------------------------------------

TRACE_NAMES = {  # intermediates where the archs differ, with llama.cpp's names
    "qwen35": ["linear_attn_qkv_mixed-0", "z-0", "linear_attn_out-0", "ffn_out-0", "l_out-0", "Qcur-3", "ffn_out-3",
               "l_out-3", "result_norm"],
    "qwen3next": ["linear_attn_mixed_qkvz-0", "linear_attn_mixed_ba-0", "z-0", "final_output-0", "linear_attn_out-0",
                  "ffn_moe_out-0", "ffn_out-0", "l_out-0", "Qcur-3", "Kcur-3", "l_out-3", "result_norm"],
}


def _run_both(model, path, quant, ctx, names=()):
    from llama_trace import llama_trace

    prompt = _prompt()
    gen = greedy(model, prompt, N_GEN, ctx)
    rec = Recorder(set(names))
    ours, _, _ = forward(model, SeqState.fresh(model.config), prompt + gen, Ctx(act_quant=ctx.act_quant, trace=rec))
    theirs = llama_trace(path, prompt + gen, list(names))
    their_next = np.argmax(theirs["logits"][len(prompt) - 1 : -1], axis=-1)
    assert list(their_next) == gen, f"greedy: first divergence at generated step {int(np.argmax(their_next != np.array(gen)))}"
    err = np.abs(ours - theirs["logits"]).max(axis=-1) / np.abs(theirs["logits"]).max(axis=-1)
    return err, rec.arrays(), theirs


@pytest.mark.oracle
@pytest.mark.parametrize("arch", ARCHS)
def test_f32_logits_greedy_and_intermediates_match_llama_cpp(models, make_fixture, arch):
    require_llama_cpp()
    err, ours, theirs = _run_both(models(arch), make_fixture("tiny", "f32", arch=arch), "f32", Ctx(), TRACE_NAMES[arch])
    assert err.max() <= 1e-4, f"max relative logit error {err.max():.3g} at position {int(err.argmax())}"
    for name in TRACE_NAMES[arch]:
        a, b = ours[name], theirs[name].reshape(ours[name].shape)
        assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max(), name


@pytest.fixture(scope="module")
def quantized_run(models, make_fixture):
    """(arch, quant) -> conformance.TrunkRun: refimpl's emulated greedy run and llama.cpp's trace of it."""
    @functools.cache
    def get(arch, quant):
        require_llama_cpp()
        path = make_fixture("tiny", quant, arch=arch)
        return conformance.TrunkRun.make(models(arch, quant), path, Ctx(act_quant=True), _prompt(), N_GEN)

    return get


QUANTIZED = [("qwen35", "q4_k_m"), ("qwen3next", "q8_0")]  # every mix loads: test_fixtures_llama


@pytest.mark.oracle
@pytest.mark.parametrize("arch, quant", QUANTIZED)
def test_quantized_logits_at_float_noise_until_a_crossing_and_greedy_identical(quantized_run, arch, quant):
    """The verdict of tests/conformance.py, as for qwen35moe in tests/test_trunk.py: every position at
    float noise unless an activation-quantization crossing (the dense FFN's and the fused ssm_in's
    sites included) came at or before it; greedy identical."""
    quantized_run(arch, quant).assert_end_to_end(f"{arch} {quant}")


@pytest.mark.oracle
@pytest.mark.parametrize("arch, quant", QUANTIZED)
def test_every_layer_from_llama_cpp_own_inputs_is_at_float_noise(quantized_run, arch, quant):
    run = quantized_run(arch, quant)
    conformance.assert_layer_local(run.forward, run.block(), run.theirs, f"{arch} {quant}")


@pytest.fixture(scope="module")
def mtp_run(models, make_fixture):
    @functools.cache
    def get(arch, quant):
        require_llama_cpp()
        path = make_fixture("tiny", quant, arch=arch)
        return conformance.MTPRun.make(models(arch, quant), path, Ctx(act_quant=quant != "f32"), MTP_PROMPT)

    return get


@pytest.mark.oracle
@pytest.mark.parametrize("arch, quant", [("qwen35", "f32"), ("qwen35", "q8_0"), ("qwen3next", "f32"), ("qwen3next", "q8_0")])
def test_mtp_head_matches_llama_cpp(mtp_run, arch, quant):
    """f32 within 1e-4 of llama.cpp; q8_0 emulated: layer-local at float noise, end to end at float
    noise but at and after a crossing, the same drafted tokens where none came before."""
    run = mtp_run(arch, quant)
    if quant == "f32":
        run.assert_f32_close(f"{arch} {quant} MTP")
    else:
        run.assert_layer_local(f"{arch} {quant} MTP")
        run.assert_end_to_end(f"{arch} {quant} MTP")


@pytest.mark.oracle
def test_qwen3next_ssm_in_and_attn_qkv_files_agree_in_llama_cpp(make_fixture):
    require_llama_cpp()
    from llama_ref import llama_logits

    tokens = _prompt(8, seed=4)
    a = llama_logits(make_fixture("tiny", "f32", arch="qwen3next"), tokens)
    b = llama_logits(make_fixture("tiny", "f32", arch="qwen3next", ssm_in=False), tokens)
    assert np.abs(a - b).max() <= 1e-6 * np.abs(b).max()


SPEC_PROMPT = [41, 212, 197, 248, 60, 285, 2, 10, 41, 212, 197]


@pytest.mark.oracle
@pytest.mark.parametrize("arch, n_draft", [("qwen35", 1), ("qwen35", 3), ("qwen3next", 3)])
def test_speculative_counts_equal_llama_cpp(make_fixture, arch, n_draft):
    """qwen3next cannot roll back its recurrent state partially in llama.cpp (n_rs_seq clamps to 0):
    tests/llama_spec.py then rolls back with llama.cpp's state save / restore and a re-decode."""
    require_llama_cpp()
    from llama_spec import llama_speculative

    path = make_fixture("predictable", "f32", arch=arch)
    model = load_model(path)
    ref = greedy(model, SPEC_PROMPT, 10)
    tokens, stats = speculative_generate(model, SPEC_PROMPT, len(ref), source="mtp", n_draft=n_draft)
    assert tokens == ref and stats.n_accepted > 0 and stats.n_accepted < stats.n_drafted
    theirs = llama_speculative(path, SPEC_PROMPT, len(ref), n_draft=n_draft)
    assert theirs.rollback == ("checkpoint" if arch == "qwen3next" else "rs") and (theirs.n_redecodes > 0) == (arch == "qwen3next")
    assert theirs.tokens == tokens
    ours = (stats.n_drafted, stats.n_accepted, stats.n_decodes, stats.n_drafted_steps)
    assert ours == (theirs.n_drafted, theirs.n_accepted, theirs.n_decodes, theirs.n_drafted_steps)
