"""Draft sources: the n-gram rule (tie-breaks, clipping, overlap, gate), the MTP draft probability,
greedy acceptance, and the MTP head against llama.cpp's MTP context (and ``logits --mtp-out``)."""

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import conformance
from conftest import require_llama_cpp
from refimpl.cli import main
from refimpl.decode.drafts import mtp_catchup_logits, ngram_draft, top_k_p
from refimpl.model.trunk import forward, load_model
from refimpl.model.ops import Ctx
from refimpl.decode.speculative import accept_greedy
from refimpl.model.state import SeqState

# ---------------------------------------------------------------------------------------------
# n-gram


def test_ngram_docstring_example():
    h = [5, 1, 2, 3, 9, 1, 2, 3, 7, 2, 3]
    assert ngram_draft(h, 3, min_match=2) == [7, 2, 3]
    assert ngram_draft(h, 3, min_match=3) == []


def test_ngram_most_recent_occurrence_wins_a_tie():
    #    0  1  2  3  4  5  6  7  8  9
    h = [1, 2, 3, 10, 1, 2, 3, 20, 1, 2, 3]  # "1 2 3" at 0 and at 4 (both L = 3): 4 is more recent
    assert ngram_draft(h, 2, min_match=3) == [20, 1]


def test_ngram_longest_match_beats_a_more_recent_shorter_one():
    h = [0, 1, 2, 3, 10, 9, 2, 3, 20, 0, 1, 2, 3]  # L = 4 at e=3, L = 2 at e=7
    assert ngram_draft(h, 1, min_match=2) == [10]


def test_ngram_max_match_caps_length_so_recency_decides():
    h = [0, 1, 2, 3, 10, 9, 1, 2, 3, 20, 0, 1, 2, 3]  # L = 4 at e=3, L = 3 at e=8
    assert ngram_draft(h, 1, min_match=2) == [10]
    assert ngram_draft(h, 1, min_match=2, max_match=3) == [20]  # both capped at 3: the later wins


def test_ngram_clips_at_the_end_of_the_history():
    h = [4, 5, 6, 7, 4, 5, 6]  # match at e=2, only h[3:] = [7, 4, 5, 6] follow
    assert ngram_draft(h, 8, min_match=3) == [7, 4, 5, 6]
    assert ngram_draft(h, 2, min_match=3) == [7, 4]


def test_ngram_overlapping_match_runs_into_the_suffix():
    h = [9, 8, 8, 8, 8]  # suffix "8 8 8" also ends at e=3 (overlapping it), then only h[4] follows
    assert ngram_draft(h, 3, min_match=3) == [8]
    h = [1, 2, 1, 2, 1, 2]  # "1 2 1 2" ends at e=3 (overlap by two): h[4:] follows
    assert ngram_draft(h, 5, min_match=4) == [1, 2]


def test_ngram_never_matches_itself():
    assert ngram_draft([1, 2, 3, 4, 5], 3, min_match=1) == []
    assert ngram_draft([7], 3, min_match=1) == []
    assert ngram_draft([7, 7], 3, min_match=1) == [7]


@pytest.mark.parametrize("min_match, drafts", [(1, True), (2, True), (3, True), (4, False)])
def test_ngram_min_match_gate_boundary(min_match, drafts):
    h = [6, 7, 8, 1, 2, 3, 4, 6, 7, 8]  # longest match L = 3 exactly
    assert ngram_draft(h, 2, min_match=min_match) == ([1, 2] if drafts else [])


def test_ngram_no_budget_no_draft():
    assert ngram_draft([1, 2, 3, 1, 2, 3], 0, min_match=1) == []


def _naive_ngram(h, n_max, min_match, max_match):
    """The rule spelled out by enumeration: lengths from longest, occurrences from most recent."""
    n = len(h)
    for k in range(min(max_match, n - 1), min_match - 1, -1):
        suffix = h[n - k:]
        for i in range(n - 1 - k, -1, -1):  # start i, end i+k−1 ≤ n−2
            if h[i:i + k] == suffix:
                return h[i + k:i + k + n_max]
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=24), st.integers(1, 5), st.integers(1, 4), st.integers(0, 3))
def test_ngram_equals_the_enumerated_rule(h, n_max, min_match, extra):
    max_match = min_match + extra
    expected = _naive_ngram(h, n_max, min_match, max_match)
    assert ngram_draft(h, n_max, min_match=min_match, max_match=max_match) == expected


# ---------------------------------------------------------------------------------------------
# MTP draft probability and greedy acceptance


def test_top_k_p_is_softmax_over_the_top_10():
    logits = np.full(50, -100.0, dtype=np.float32)
    logits[:10] = 0.0
    assert top_k_p(logits) == pytest.approx(0.1)
    logits[3] = np.log(9.0)  # 9 / (9 + 9·1)
    assert top_k_p(logits) == pytest.approx(0.5, rel=1e-6)
    logits[20] = 50.0  # a far larger logit dominates
    assert top_k_p(logits) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "drafts, targets, eog, ids",
    [
        ([], [7], (), [7]),  # plain step
        ([1, 2, 3], [1, 2, 3, 4], (), [1, 2, 3, 4]),  # all accepted + bonus
        ([1, 2, 3], [5, 2, 3, 4], (), [5]),  # reject at 0: the correction only
        ([1, 2, 3], [1, 9, 3, 4], (), [1, 9]),  # reject at 1
        ([1, 2, 3], [1, 2, 3, 4], (2,), [1, 2]),  # accepted EOG before the last draft stops
        ([1, 2, 3], [1, 2, 3, 4], (3,), [1, 2, 3, 4]),  # EOG as the last draft: bonus still taken
    ],
    ids=["plain", "all", "reject-0", "reject-1", "eog-mid", "eog-last"],
)
def test_accept_greedy(drafts, targets, eog, ids):
    assert accept_greedy(drafts, targets, frozenset(eog)) == ids


# ---------------------------------------------------------------------------------------------
# The MTP head against llama.cpp's MTP context

PROMPT = conformance.MTP_PROMPT


MTP_CASES = [("f32", {}), ("q8_0", {}), ("f32", {"mtp": "extras"})]  # q8_0: with emulation
MTP_IDS = ["f32", "q8_0-emulated", "f32-extras"]


@pytest.fixture(scope="module")
def mtp_pair(make_fixture):
    """case -> conformance.MTPRun: llama.cpp's run with the trunk's and the MTP context's
    intermediates, one llama.cpp run per case for the tests below."""
    @functools.cache
    def get(quant, **options):
        require_llama_cpp()
        path = make_fixture("tiny", quant, **options)
        return conformance.MTPRun.make(load_model(path), path, Ctx(act_quant=quant != "f32"), PROMPT)

    return get


@pytest.mark.oracle
@pytest.mark.parametrize("quant, options", MTP_CASES, ids=MTP_IDS)
def test_mtp_block_from_llama_cpp_own_inputs_is_at_float_noise(mtp_pair, quant, options):
    """Layer-local: the MTP block fed llama.cpp's own hiddens, and every rounding site inside it
    llama.cpp's own float input (refimpl.oracle.trace.Patcher), reproduces every intermediate, h_nextn and
    the logits of llama.cpp's MTP context to float noise; fed only the hiddens, it does so at every
    position but at and after a crossing inside the block."""
    mtp_pair(quant, **options).assert_layer_local(f"{quant} MTP")


@pytest.mark.oracle
@pytest.mark.parametrize("quant, options", MTP_CASES, ids=MTP_IDS)
def test_mtp_head_matches_llama_cpp(mtp_pair, quant, options):
    """End to end, the trunk's hiddens and the head fed refimpl's own hiddens: f32 within 1e-4 of
    llama.cpp; emulated, at float noise at every row but at and after a crossing (trunk rows up to
    p−1, head rows up to p), and the same drafted token wherever no crossing came before."""
    run = mtp_pair(quant, **options)
    if quant == "f32":
        run.assert_f32_close(f"{quant} MTP")
    else:
        run.assert_end_to_end(f"{quant} MTP")


def test_logits_mtp_out(make_fixture, tmp_path, capsys):
    path = make_fixture("tiny", "f32")
    tokens = [5, 6, 7, 8]
    rc = main(["logits", str(path), "--tokens", "5,6,7,8", "--out", str(tmp_path / "l.npy"), "--mtp-out", str(tmp_path / "m.npy")])
    assert rc == 0
    model = load_model(path)
    _, h, _ = forward(model, SeqState.fresh(model.config), tokens)
    assert np.array_equal(np.load(tmp_path / "m.npy"), mtp_catchup_logits(model, tokens, h))
    assert "MTP logits 4 x 512" in capsys.readouterr().err


def test_logits_mtp_out_refuses_a_stripped_file(make_fixture, tmp_path, capsys):
    path = make_fixture("tiny", "f32", mtp="stripped")
    rc = main(["logits", str(path), "--tokens", "5,6", "--out", str(tmp_path / "l.npy"), "--mtp-out", str(tmp_path / "m.npy")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "nextn (MTP)" in err[0]
    assert not (tmp_path / "m.npy").exists()
