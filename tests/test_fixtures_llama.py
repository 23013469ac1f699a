"""llama.cpp (the ground truth) loads and runs every fixture, and the predictable preset behaves.

Each run is a subprocess (tests/llama_ref.py): a bad file can abort llama.cpp outright.
"""

import re

import numpy as np
import pytest

from conftest import require_llama_cpp
from llama_ref import llama_run
from refimpl.fixtures import QUANT_MIXES, predictable_successors
from refimpl.fixtures.mixes_iq import LIBGGML_MIXES

pytestmark = pytest.mark.oracle

PROMPT = [72, 101, 108, 108, 111, 44, 391, 300]  # "Hello," then <|endoftext|> and a merge token
VARIANTS = [
    {"mtp": "stripped"},
    {"mtp": "extras"},
    {"tied": True},
    {"fused_gate_up": True},
    {"recurrent_layers_key": False},
]
SAME_MODEL_AS_BASE = ("mtp", "fused_gate_up", "recurrent_layers_key")  # options that keep the trunk's weights


@pytest.fixture(scope="module", autouse=True)
def _oracle():
    require_llama_cpp()


def _ids(options):
    return "-".join(f"{k}={v}" for k, v in options.items())


def _check_run(run, n_rows, n_vocab=512, arch="qwen35moe"):
    assert run.logits.shape == (n_rows, n_vocab)
    assert np.isfinite(run.logits).all()
    assert run.logits.std(axis=1).min() > 0.1  # not a constant row
    assert re.search(rf"print_info: arch\s+= {arch}\n", run.log)


@pytest.mark.parametrize(  # the libggml-written mixes on tiny only: the presets differ in weights, not types
    "preset, quant", [(p, q) for q in QUANT_MIXES for p in ("tiny", "predictable") if p == "tiny" or q not in LIBGGML_MIXES]
)
def test_llama_cpp_runs_every_preset_and_mix(make_fixture, preset, quant):
    run = llama_run(make_fixture(preset, quant), PROMPT, load_mtp=True, mtp=True)
    _check_run(run, len(PROMPT))
    assert np.isfinite(run.mtp_logits).all() and np.isfinite(run.hidden).all()
    assert "n_layer_all           = 5" in run.log


@pytest.fixture(scope="module")
def base_logits(make_fixture):
    return llama_run(make_fixture("tiny", "f32"), PROMPT).logits


@pytest.mark.parametrize("options", VARIANTS, ids=_ids)
def test_llama_cpp_runs_option_variants(make_fixture, base_logits, options):
    path = make_fixture("tiny", "f32", **options)
    plain = llama_run(path, PROMPT)
    _check_run(plain, len(PROMPT))
    if options.get("mtp") == "stripped":
        mtp = llama_run(path, PROMPT, load_mtp=True)  # nothing to load, but loading must still work
        assert "n_layer_all           = 4" in mtp.log
    else:
        mtp = llama_run(path, PROMPT, mtp=True)  # nextn tensors loaded and the MTP head run
        assert np.isfinite(mtp.mtp_logits).all() and mtp.mtp_logits.std() > 0.1
    assert np.array_equal(mtp.logits, plain.logits)  # loading the MTP block leaves the trunk alone
    if set(options) <= set(SAME_MODEL_AS_BASE):
        assert np.array_equal(plain.logits, base_logits)  # same weights, other layout → same numbers


@pytest.mark.parametrize("options", [{"tied": True}, {"fused_gate_up": True}, {"mtp": "extras"}], ids=_ids)
def test_llama_cpp_runs_quantized_variants(make_fixture, options):
    run = llama_run(make_fixture("tiny", "q4_k_m", **options), PROMPT, load_mtp=True)
    _check_run(run, len(PROMPT))


def test_quantized_logits_stay_close_to_f32(make_fixture, base_logits):
    """Relative RMS distance to the f32 logits (seed 0: bf16 0.005, q8_0 0.04, mxfp4 0.13, q4_k_m
    0.17, iq3_xxs 0.31, iq2_xxs 0.33, iq1_m 0.53; a random MoE amplifies weight error where a token's
    top-2 experts nearly tie). Unrelated logits would be at ~1.4."""
    for quant, tol in (("bf16", 0.02), ("q8_0", 0.08), ("mxfp4", 0.35), ("q4_k_m", 0.35), ("iq3_xxs", 0.5),
                       ("iq2_xxs", 0.5), ("iq1_m", 0.8)):
        logits = llama_run(make_fixture("tiny", quant), PROMPT).logits
        assert np.sqrt(np.mean((logits - base_logits) ** 2) / np.mean(base_logits**2)) < tol, quant


@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_predictable_trunk_follows_pi_and_mtp_follows_pi_prime(make_fixture, quant):
    pi, pi_mtp = predictable_successors(0)
    run = llama_run(make_fixture("predictable", quant), [72, 101], n_generate=32, mtp=True)
    t = run.tokens
    follows = np.mean([pi[t[i]] == t[i + 1] for i in range(1, len(t) - 1)])
    assert follows >= 0.9
    assert all(pi[x] >= 0 for x in t[2:])  # never a special token, so generation never stops
    draft = run.mtp_logits.argmax(axis=1)  # MTP row p drafts token p+1 from (x_p, h_{p-1})
    assert np.mean(draft == pi_mtp[t]) >= 0.9
    agree = np.mean(draft[1:-1] == t[2:])  # the draft equals what the trunk then produced
    assert 0.4 <= agree <= 0.9


OTHER_ARCHS = [  # (arch, quant, options): variants of the siblings of qwen35moe (refimpl.io.config.ARCHS) that
    # tests/test_arch.py does not run already (it runs f32, q4_k_m / q8_0 and qwen3next's ssm_in=false through llama.cpp)
    ("qwen35", "f32", {"mtp": "stripped"}), ("qwen35", "f32", {"tied": True}), ("qwen35", "iq2_xxs", {}),
    ("qwen3next", "f32", {"mtp": "stripped"}), ("qwen3next", "f32", {"tied": True}),
]


@pytest.mark.parametrize("arch, quant, options", OTHER_ARCHS, ids=lambda x: _ids(x) if isinstance(x, dict) else str(x))
def test_llama_cpp_runs_the_other_archs(make_fixture, arch, quant, options):
    mtp = options.get("mtp") != "stripped"
    run = llama_run(make_fixture("tiny", quant, arch=arch, **options), PROMPT, load_mtp=True, mtp=mtp)
    _check_run(run, len(PROMPT), arch=arch)
    if mtp:
        assert np.isfinite(run.mtp_logits).all() and run.mtp_logits.std() > 0.1


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_q4_k_m_types_are_llama_quantizes(make_fixture, tmp_path, arch):
    """The fixture's q4_k_m mix gives every tensor the type llama.cpp's own quantizer (ftype Q4_K_M)
    gives it from the f32 file — dense FFN (no 8-expert rules), ssm_in, ssm_ba included."""
    from gguf import LlamaFileType

    from llama_ref import quantize_with_llama
    from refimpl.io.gguf_file import GGUFFile

    theirs = GGUFFile(quantize_with_llama(make_fixture("tiny", "f32", arch=arch), tmp_path / "q.gguf",
                                          LlamaFileType.MOSTLY_Q4_K_M)).tensors
    ours = GGUFFile(make_fixture("tiny", "q4_k_m", arch=arch)).tensors
    assert {n: t.qtype.name for n, t in ours.items()} == {n: t.qtype.name for n, t in theirs.items()}
