"""Files made the way real downloads are made: tiny Hugging Face checkpoints in the real layout,
converted by llama.cpp's own ``convert_hf_to_gguf.py`` and quantized by its own quantizer
(golden/converted/, made by ``python hf/build.py``; MANIFEST.json holds the commands and sha256s).

Two oracles: transformers (the reference logits, greedy stream and MTP-module logits in
``<model>.ref.npz``, computed when the files were made) and llama.cpp (run here). A file written by
refimpl's own fixture writer can only prove that writer and loader agree; these cannot.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import conformance
from conftest import require_llama_cpp
from refimpl.cli import main as cli_main
from refimpl.decode.drafts import mtp_catchup_logits
from refimpl.decode.greedy import greedy
from refimpl.io.load import open_model
from refimpl.model.trunk import forward, load_model
from refimpl.model.ops import Ctx
from refimpl.decode.speculative import speculative_generate
from refimpl.model.state import SeqState

CONVERTED = Path(__file__).resolve().parent.parent / "golden" / "converted"
MANIFEST = json.loads((CONVERTED / "MANIFEST.json").read_text())
FILES = sorted(f for m in MANIFEST["models"].values() for f in m["files"] if f.endswith(".gguf"))
NARROW = ["qwen35moe-narrow", "qwen35-narrow", "qwen3next-narrow"]  # f32 conversions + transformers references
# where llama.cpp rounds activations (BF16 and the block types): llama-quantize's files, --outtype q8_0 / bf16
QUANTIZED = sorted(f for f in FILES if "-f32" not in f)
TRANSFORMERS_BOUND = 1e-5  # per position: max |Δ logit| / max |logit| of the row


def model_of(name: str) -> str:
    """The checkpoint a file was made from (MANIFEST.json's key)."""
    return next(m for m, entry in MANIFEST["models"].items() if name in entry["files"])


def prompt_of(name: str) -> list[int]:
    return reference(model_of(name))["prompt_tokens"].tolist()


def rel(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return conformance.rel_rows(ours.astype(np.float64), ref.astype(np.float64))


@functools.cache
def reference(model: str) -> dict:
    with np.load(CONVERTED / f"{model}.ref.npz") as z:
        return {k: z[k] for k in z.files}


@functools.cache
def loaded(name: str):
    return load_model(CONVERTED / name)


@functools.cache
def own_run(name: str):
    """refimpl on the prompt: (logits [T, V], h_nextn [T, E], MTP catch-up logits [T, V])."""
    model = loaded(name)
    tokens = prompt_of(name)
    logits, h, _ = forward(model, SeqState.fresh(model.config), tokens)
    return logits, h, mtp_catchup_logits(model, tokens, h)


def test_the_manifest_lists_every_committed_file_with_its_sha256():
    listed = {f: h for m in MANIFEST["models"].values() for f, h in m["files"].items()}
    present = {p.name for p in CONVERTED.iterdir() if p.name != "MANIFEST.json"}
    assert present == set(listed)
    for name, digest in listed.items():
        assert hashlib.sha256((CONVERTED / name).read_bytes()).hexdigest() == digest, name
    for m in MANIFEST["models"].values():
        assert m["commands"] and all(c.startswith(("python convert_hf_to_gguf.py", "llama-quantize")) for c in m["commands"])


@pytest.mark.parametrize("name", FILES)
def test_every_converted_file_loads_with_its_mtp_block(name, capsys):
    assert cli_main(["inspect", str(CONVERTED / name)]) == 0
    assert "error" not in capsys.readouterr().err
    m = open_model(CONVERTED / name)
    assert m.plan.mtp == "present"
    # what the converter writes that refimpl's fixtures long did not: HF's (1, E) shared_expert_gate
    # as ne [E, 1] (llama-quantize drops the trailing 1), a padded vocabulary, a chat template
    shexp = m.gguf.tensors.get("blk.0.ffn_gate_inp_shexp.weight")
    assert shexp is None or shexp.shape == (m.config.n_embd,)
    assert m.gguf.key("tokenizer.chat_template")
    assert any(t.startswith("[PAD") for t in m.gguf.key("tokenizer.ggml.tokens"))


def test_the_converter_writes_the_shared_expert_gate_as_a_row_matrix():
    """The real cause of refusals before: the raw table of an unquantized conversion says ne [E, 1]."""
    from gguf import GGUFReader

    t = next(t for t in GGUFReader(CONVERTED / "qwen35moe-narrow-f32.gguf").tensors if t.name == "blk.0.ffn_gate_inp_shexp.weight")
    assert t.shape.tolist() == [64, 1]


@pytest.mark.parametrize("model", NARROW)
def test_f32_logits_and_greedy_match_transformers(model):
    ref = reference(model)
    logits, _, _ = own_run(f"{model}-f32.gguf")
    for key in ("logits_f32", "logits_f64"):
        err = rel(logits, ref[key])
        assert err.max() <= TRANSFORMERS_BOUND, f"{model} vs transformers {key}: {err.max():.3g} at {int(err.argmax())}"
    prompt = ref["prompt_tokens"].tolist()
    assert greedy(loaded(f"{model}-f32.gguf"), prompt, len(ref["greedy"])) == ref["greedy"].tolist()


@pytest.mark.parametrize("model", NARROW)
def test_the_mtp_head_matches_transformers_own_layers_wired_as_llama_cpp(model):
    ref = reference(model)
    _, _, mtp = own_run(f"{model}-f32.gguf")
    for key in ("mtp_logits_f32", "mtp_logits_f64"):
        err = rel(mtp, ref[key])
        assert err.max() <= TRANSFORMERS_BOUND, f"{model} MTP vs transformers {key}: {err.max():.3g}"
    assert np.array_equal(mtp.argmax(1), ref["mtp_logits_f64"].argmax(1))


@pytest.mark.parametrize("other", ["qwen35moe-narrow-bf16.gguf", "qwen35moe-narrow-bf16-fused.gguf"])
def test_bf16_and_fused_conversions_compute_the_f32_logits_bit_for_bit(other):
    """The checkpoint is bf16, as published: --outtype f32 and bf16 hold the same values, and refimpl's
    sums are exact, so the logits are the same bits — fused gate_up experts included."""
    a, ha, ma = own_run("qwen35moe-narrow-f32.gguf")
    b, hb, mb = own_run(other)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert np.array_equal(ma.view(np.uint32), mb.view(np.uint32))
    if "fused" in other:  # --fuse-gate-up-exps --fuse-qkv: every MoE's experts, both attention blocks
        plan = open_model(CONVERTED / other).plan
        assert plan.fused_gate_up == (True,) * 5 and plan.fused_qkv == (False, False, False, True, True)


@pytest.mark.parametrize("name", ["qwen35moe-narrow-f32.gguf", "qwen3next-narrow-f32.gguf", "qwen35moe-k-q4_k_m.gguf"])
def test_speculative_decoding_on_a_converted_file_equals_plain_greedy(name):
    model = loaded(name)
    prompt = prompt_of(name)
    plain = greedy(model, prompt, 12)
    for n_draft in (1, 3):
        tokens, _ = speculative_generate(model, prompt, 12, source="mtp", n_draft=n_draft)
        assert tokens == plain, f"{name} --draft {n_draft}"


# ---- against llama.cpp ------------------------------------------------------------------------


@functools.cache
def llama(name: str):
    from llama_ref import llama_run

    require_llama_cpp()
    return llama_run(CONVERTED / name, prompt_of(name), n_generate=16, mtp=True, load_mtp=True)


@pytest.mark.oracle
@pytest.mark.parametrize("name", [f"{m}-f32.gguf" for m in NARROW])
def test_f32_logits_greedy_and_mtp_head_match_llama_cpp(name):
    model = model_of(name)
    run = llama(name)
    ref = reference(model)
    T = len(ref["prompt_tokens"])
    logits, h, mtp = own_run(name)
    assert rel(logits, run.logits[:T]).max() <= conformance.NOISE
    assert rel(h, run.hidden[:T]).max() <= conformance.NOISE
    assert rel(mtp, run.mtp_logits[:T]).max() <= conformance.NOISE
    assert run.tokens[T:].tolist() == ref["greedy"].tolist()  # llama.cpp's greedy = transformers' = refimpl's
    # and llama.cpp itself is as close to transformers as refimpl is
    assert rel(run.logits[:T], ref["logits_f64"]).max() <= TRANSFORMERS_BOUND


@pytest.mark.oracle
@pytest.mark.parametrize("name", QUANTIZED)
def test_quantized_conversions_with_emulation_at_float_noise_until_a_crossing(name):
    """The conformance criteria of the synthetic mixes (tests/test_trunk.py), on the converter's and
    llama-quantize's own output (bf16 included: llama.cpp's BF16 dot product rounds the activations to
    bf16, ~1 % off f32, which the emulation reproduces; fused projections included): every position at float noise unless an activation-quantization crossing came at or
    before it, greedy identical but after one; the MTP head likewise."""
    require_llama_cpp()
    path = CONVERTED / name
    model = load_model(path)
    prompt = prompt_of(name)
    ctx = Ctx(act_quant=True)
    conformance.TrunkRun.make(model, path, ctx, prompt[:24], 16).assert_end_to_end(name)
    conformance.MTPRun.make(model, path, ctx, prompt[:24]).assert_end_to_end(name)


@pytest.mark.parametrize("model", sorted(MANIFEST["models"]))
def test_refimpl_tokenizes_the_prompt_as_transformers_did(model):
    """The converted vocabulary (byte-level BPE, Qwen's pre-tokenizer regex, added special tokens,
    [PAD…] padding) encodes the prompt to the ids transformers' tokenizer gave, and decodes them back."""
    from refimpl.tokenizer.vocab import Tokenizer

    name = next(f for f in MANIFEST["models"][model]["files"] if f.endswith(".gguf"))
    tok = Tokenizer.from_gguf(open_model(CONVERTED / name).gguf)
    prompt = MANIFEST["models"][model]["prompt"]
    assert tok.encode(prompt) == reference(model)["prompt_tokens"].tolist()
    assert tok.decode(tok.encode(prompt)) == prompt
