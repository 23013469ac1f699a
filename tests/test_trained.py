"""The built-in trained model (refimpl/models/kjv-q8_0.gguf): the committed bytes, its tokenizer, greedy
decoding and MTP drafting against llama.cpp, and that it writes text (docs/trained-model.md)."""

import re
from functools import lru_cache

import numpy as np
import pytest

from conftest import require_llama_cpp
from refimpl.fixtures.builtin import TRAINED_PATH, TRAINED_SHA256, resolve_model, sha256_file
from refimpl.decode.greedy import greedy
from refimpl.model.trunk import load_model
from refimpl.model.ops import Ctx
from refimpl.decode.speculative import speculative_generate
from refimpl.tokenizer import Tokenizer

PROMPTS = ["In the beginning", "And the LORD said unto Moses,", "The quick brown fox"]
N_GENERATE = 24


@lru_cache(maxsize=None)
def model():
    return load_model(TRAINED_PATH, pack=False)


@lru_cache(maxsize=None)
def tok():
    return Tokenizer.from_gguf(TRAINED_PATH)


def test_committed_file_is_byte_identical_to_its_sha256():
    assert sha256_file(TRAINED_PATH) == TRAINED_SHA256
    recorded = (TRAINED_PATH.parent / (TRAINED_PATH.name + ".sha256")).read_text().split()
    assert recorded == [TRAINED_SHA256, TRAINED_PATH.name]


def test_builtin_spec_names_the_committed_file():
    assert resolve_model("builtin:kjv") == resolve_model("builtin:kjv/q8_0") == TRAINED_PATH


def test_dimensions_are_the_documented_ones():
    c = model().config
    assert (c.n_embd, c.n_vocab, c.n_layer, c.n_layer_nextn) == (256, 2048, 4, 1)
    assert [c.layer_kind(il) for il in range(c.n_layer_all)] == ["deltanet"] * 3 + ["attention", "mtp"]
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp) == (16, 2, 64, 128)
    assert tok().n_vocab == 2048 and tok().eos_id == tok().tokens.index("<|im_end|>")


@lru_cache(maxsize=None)
def plain(prompt: str) -> tuple[int, ...]:
    ids = tok().encode(prompt)
    return tuple(greedy(model(), ids, N_GENERATE, eog_ids=tok().eog_ids))


def test_continuations_are_english_words():
    """Greedy continuations are words and punctuation (a random model prints byte soup)."""
    for prompt in PROMPTS:
        text = tok().decode(list(plain(prompt)))
        words = re.findall(r"[A-Za-z]+", text)
        assert len(words) >= N_GENERATE // 3, text
        assert re.fullmatch(r"[A-Za-z ,.;:'?!\n-]*", text), text
        assert {"the", "and", "of", "unto", "he", "I"} & set(words), text


# ---- against llama.cpp ------------------------------------------------------------------------------

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "And it came to pass, when Jacob saw Rachel the daughter of Laban his mother's brother,",
    "Blessed are the poor in spirit: for theirs is the kingdom of heaven.\n\nMatthew\n\n",
    "The quick brown fox jumps over the lazy dog; it's 2024, isn't it?  Tabs\tand CRLF\r\n",
    "<|im_start|>user\nWho begat Enos?<|im_end|>\n<|im_start|>assistant\n<think>",
    "Café naïve — “quotes” 中文 🙂",
]


@pytest.mark.oracle
@pytest.mark.parametrize("parse_special", [False, True])
def test_tokenizer_equals_llama_cpp(parse_special):
    llama_cpp = require_llama_cpp()
    llm = llama_cpp.Llama(str(TRAINED_PATH), vocab_only=True, verbose=False)
    try:
        for text in TEXTS:
            assert llm.tokenize(text.encode(), add_bos=True, special=parse_special) == tok().encode(text, parse_special=parse_special), text
    finally:
        llm.close()


@pytest.mark.oracle
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_llama_cpp(prompt):
    """llama.cpp (F32 K/V, no flash attention: tests/llama_trace.py) fed refimpl's emulated greedy
    stream picks the same token at every step — a step may differ only after an activation-rounding
    crossing, which tests/conformance.py then finds — and without emulation refimpl's stream is the
    same or parts from it at a near-tie only: plain numerics omit llama.cpp's activation rounding, which
    flips two of these three prompts' streams at a step whose top-2 logits are within the audit's band."""
    require_llama_cpp()
    import conformance

    from refimpl.oracle.audit import Stream, audit

    ids = tok().encode(prompt)
    run = conformance.TrunkRun.make(model(), TRAINED_PATH, Ctx(act_quant=True), ids, N_GENERATE)
    run.assert_end_to_end(prompt)
    if run.gen != list(plain(prompt)):
        rep = audit(model(), ids, Stream("A", "refimpl --emulate", "json", run.gen))
        assert rep.exit_code == 0 and rep.verdict == "near-tie", (prompt, rep.verdict)


@pytest.fixture(scope="module")
def f32_copy(tmp_path_factory):
    """The committed weights dequantized into an F32 file (same metadata and vocabulary): refimpl's plain
    numbers on it equal those on the q8_0 file bit for bit. llama-cpp-python 0.3.36's draft-mtp loop
    (tests/llama_spec.py) dies with SIGILL on every Q8_0 file, the tiny fixture's included; on F32 it runs
    (train.export.dequantized_copy)."""
    from train.export import dequantized_copy

    path = dequantized_copy(TRAINED_PATH, tmp_path_factory.mktemp("kjv") / "kjv-f32.gguf")
    assert Tokenizer.from_gguf(path).encode(TEXTS[1]) == tok().encode(TEXTS[1])
    return path


@pytest.mark.oracle
@pytest.mark.parametrize("n_draft", [1, 3])
def test_mtp_drafting_equals_llama_cpp(f32_copy, n_draft):
    """llama.cpp's draft-mtp loop on the same weights drafts and accepts exactly what refimpl's does."""
    require_llama_cpp()
    from llama_spec import llama_speculative

    ids = tok().encode(PROMPTS[1])
    tokens, stats = speculative_generate(model(), ids, 32, source="mtp", n_draft=n_draft)
    assert speculative_generate(load_model(f32_copy, pack=False), ids, 32, source="mtp", n_draft=n_draft)[0] == tokens
    theirs = llama_speculative(f32_copy, ids, 32, n_draft=n_draft)
    assert theirs.tokens == tokens == list(greedy(model(), ids, 32))
    assert (stats.n_drafted, stats.n_accepted, stats.n_decodes) == (theirs.n_drafted, theirs.n_accepted, theirs.n_decodes)
    assert stats.n_accepted / stats.n_drafted > 0.3  # a trained head: a random one accepts ~0 %


@pytest.mark.oracle
def test_llama_cpp_draft_streams_with_its_defaults_audit_clean(f32_copy):
    """llama.cpp's own draft-1 and draft-3 streams, run with its defaults (F16 K/V cache, flash attention
    auto = on), are audited clean or near-tie only on the committed model — by `refimpl audit` as a user
    runs it (no emulation, the q8_0 file) and against the oracle emulating llama.cpp's configuration on
    the F32 file it ran. (The same tokens as refimpl's on this machine; a near-tie flip elsewhere is fine.)"""
    require_llama_cpp()
    from llama_spec import llama_speculative

    from refimpl.oracle.audit import Stream, audit
    from refimpl.model.ops import emulation_ctx

    f32_model = load_model(f32_copy, pack=False)
    for prompt in PROMPTS[1:]:  # one in the corpus's style, one not
        ids = tok().encode(prompt)
        d1, d3 = (llama_speculative(f32_copy, ids, 32, n_draft=n, defaults=True) for n in (1, 3))
        assert all(0 < d.n_accepted < d.n_drafted for d in (d1, d3)), prompt  # drafts accepted and rolled back
        a, b = Stream("A", "llama.cpp --draft 1", "json", d1.tokens), Stream("B", "llama.cpp --draft 3", "json", d3.tokens)
        for rep in (audit(model(), ids, a, b), audit(f32_model, ids, a, b, ctx=emulation_ctx("default"))):
            assert rep.exit_code == 0 and rep.verdict in ("identical", "near-tie"), (prompt, rep.verdict)
            assert all(f.benign for f in rep.findings), prompt


def test_greedy_steps_are_confident():
    """Few greedy steps sit inside the audit's 5 % near-tie band: 27 % of bench/trained.py's 288 steps,
    31 % of these 72, against about 40 % on the random tiny fixture."""
    from refimpl.model.trunk import forward
    from refimpl.model.state import SeqState

    gaps = []
    for prompt in PROMPTS:
        ids = tok().encode(prompt)
        logits, _, _ = forward(model(), SeqState.fresh(model().config), ids + list(plain(prompt))[:-1])
        rows = logits[len(ids) - 1:]  # the rows that chose each generated token
        top2 = np.sort(rows, axis=-1)[:, -2:]
        gaps.extend((top2[:, 1] - top2[:, 0]) / np.abs(rows).max(axis=-1))
    assert np.mean(np.asarray(gaps) <= 0.05) < 0.35
