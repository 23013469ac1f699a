"""The speculative loop: output equals plain greedy for every source and width, rollback leaves no
trace, counters match hand-computed values, telemetry, CLI flags, and the counts of the same loop
driven through llama.cpp."""

import json
from functools import lru_cache

import numpy as np
import pytest

from conftest import require_llama_cpp
from refimpl.cli import main
from refimpl.decode.drafts import DraftSource, MTPSource
from refimpl.errors import RefimplError
from refimpl.decode.greedy import greedy
from refimpl.model.trunk import forward, load_model
from refimpl.decode.speculative import SpecState, prefill, speculative_generate, step
from refimpl.model.state import DeltaNetState, KVCache, SeqState
from refimpl.decode.telemetry import read_csv

FIXTURES = {  # name -> (preset, quant, prompt, n_predict)
    "tiny-f32": ("tiny", "f32", [11, 42, 7, 300, 5, 11, 42, 7], 6),
    "tiny-q8_0": ("tiny", "q8_0", [11, 42, 7, 300, 5, 11, 42, 7], 6),
    # a stretch of the trunk's successor cycle, then its first three tokens again: n-grams hit
    "predictable": ("predictable", "f32", [41, 212, 197, 248, 60, 285, 2, 10, 41, 212, 197], 10),
}


@pytest.fixture(scope="module")
def runs(make_fixture):
    """Cached runs: runs(name) -> (model, prompt, greedy tokens); runs(name, **kw) -> (tokens, stats)."""

    @lru_cache(maxsize=None)
    def model_of(name):
        preset, quant, prompt, n = FIXTURES[name]
        model = load_model(make_fixture(preset, quant))
        return model, prompt, tuple(greedy(model, prompt, n))

    @lru_cache(maxsize=None)
    def spec(name, source, n_draft=3, p_min=0.0):
        model, prompt, ref = model_of(name)
        return speculative_generate(model, prompt, len(ref), source=source, n_draft=n_draft, p_min=p_min)

    def get(name, **kw):
        return spec(name, **kw) if kw else model_of(name)

    return get


# ---------------------------------------------------------------------------------------------
# 1. The output never depends on speculation.

CASES = [dict(source=None)] + [dict(source="mtp", n_draft=n) for n in range(1, 9)] + [
    dict(source="ngram", n_draft=3), dict(source="ngram", n_draft=8),
    dict(source="mtp", n_draft=3, p_min=0.3), dict(source="mtp", n_draft=3, p_min=0.9), dict(source="mtp", n_draft=3, p_min=1.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("name", list(FIXTURES))
def test_tokens_equal_plain_greedy(runs, name, case):
    _, _, ref = runs(name)
    tokens, stats = runs(name, **case)
    assert tuple(tokens) == ref
    assert stats.n_generated == len(ref) and stats.n_accepted <= stats.n_drafted
    assert stats.n_generated == stats.n_decodes + stats.n_accepted  # every decode confirms n_acc + 1
    assert len(stats.rows) == len(ref) and [r.token for r in stats.rows] == list(ref)


def test_p_min_one_never_drafts(runs):
    _, stats = runs("predictable", source="mtp", n_draft=3, p_min=1.0)
    assert stats.n_drafted == 0 and stats.n_drafted_steps == 0 and stats.n_decodes == stats.n_generated


def test_ngram_drafts_the_repeated_cycle(runs):
    _, stats = runs("predictable", source="ngram", n_draft=3)
    assert stats.n_drafted_steps >= 1 and stats.n_accepted >= 3


@pytest.mark.parametrize("n_draft", [1, 3])
def test_acceptance_on_the_predictable_fixture(runs, n_draft):
    _, stats = runs("predictable", source="mtp", n_draft=n_draft)
    assert 0.4 <= stats.acceptance <= 0.9, stats.counters()


# ---------------------------------------------------------------------------------------------
# 2. Rollback: after rounds that drafted and were (partly) rejected, the state is exactly the state
#    of never having drafted — trunk, snapshots aside, and the MTP head's KV and pending hidden.


def _assert_same_layers(a, b):
    assert a.n_past == b.n_past
    for x, y in zip(a.layers, b.layers):
        if isinstance(x, KVCache):
            assert np.array_equal(x.k, y.k) and np.array_equal(x.v, y.v) and np.array_equal(x.pos, y.pos)
        else:
            assert isinstance(y, DeltaNetState) and np.array_equal(x.conv, y.conv) and np.array_equal(x.ssm, y.ssm)


@pytest.mark.parametrize("name", ["tiny-f32", "predictable"])
def test_rollback_leaves_no_trace(runs, name):
    model, prompt, _ = runs(name)
    src = MTPSource(model)
    s, rounds = prefill(model, src, prompt, n_rs_seq=3), []
    for _ in range(3):
        r, s = step(model, src, s, 3)
        rounds.append(r)
    assert any(r.rollback > 0 for r in rounds) and all(r.drafts for r in rounds)
    # never drafted: the confirmed tokens decoded one at a time, the head caught up one at a time
    ref = prefill(model, src, list(s.history[:2]), n_rs_seq=0)
    for tok in s.history[1:-1]:
        _, h, target = forward(model, ref.target, [tok])
        ref = SpecState(target=target, source=src.process(ref.source, [tok], h), history=ref.history + (tok,))
    _assert_same_layers(s.target, ref.target)
    a, b = s.source, ref.source
    assert a.mtp.n_past == b.mtp.n_past == s.target.n_past
    assert np.array_equal(a.mtp.kv.k, b.mtp.kv.k) and np.array_equal(a.mtp.kv.v, b.mtp.kv.v)
    assert np.array_equal(a.mtp.kv.pos, b.mtp.kv.pos) and np.array_equal(a.pending_h, b.pending_h)


# ---------------------------------------------------------------------------------------------
# 3. A scripted source forces accept/reject patterns; the counters are computed by hand.


class Scripted(DraftSource):
    """Drafts ``n_right`` correct tokens (from the known greedy stream), then wrong ones."""

    name = "scripted"

    def __init__(self, truth, n_right, vocab):
        self.truth, self.n_right, self.vocab = list(truth), n_right, vocab

    def draft(self, state, req):
        nxt = self.truth[req.pos0 + 1: req.pos0 + 1 + req.n_max]
        return [t if i < self.n_right else (t + 1) % self.vocab for i, t in enumerate(nxt)], state


@pytest.mark.parametrize(
    "n_right, n_predict, drafted, accepted, decodes, steps, per_pos, kinds",
    [
        # accept-all: budgets 3, 3, 3 → 4 tokens per decode
        (99, 12, 9, 9, 3, 3, [3, 3, 3], "dddb" * 3),
        # reject-all: budgets 3, 3, 3, 2, 1, 0 → one correction per decode, the last one plain
        (0, 6, 12, 0, 6, 5, [0, 0, 0], "ccccc" + "p"),
        # reject at k = 1: budgets 3, 3, 3, then 1 (all right: bonus)
        (1, 8, 10, 4, 4, 4, [4, 0, 0], "dc" * 3 + "db"),
    ],
    ids=["accept-all", "reject-all", "reject-at-1"],
)
def test_scripted_counters(runs, n_right, n_predict, drafted, accepted, decodes, steps, per_pos, kinds):
    model, prompt, _ = runs("tiny-f32")
    truth = list(prompt) + greedy(model, prompt, n_predict)
    calls = iter(range(0, 10**6, 100))
    tokens, st = speculative_generate(model, prompt, n_predict, source=Scripted(truth, n_right, model.config.n_vocab),
                                      n_draft=3, bytes_read=lambda: next(calls))
    assert tokens == truth[len(prompt):]
    assert (st.n_drafted, st.n_accepted, st.n_decodes, st.accepted_per_pos) == (drafted, accepted, decodes, per_pos)
    assert st.n_drafted_steps == steps
    assert "".join(r.kind[0] for r in st.rows) == kinds
    firsts = [i for i, r in enumerate(st.rows) if i == 0 or r.step != st.rows[i - 1].step]
    assert [r.bytes_read for r in st.rows] == [100 if i in firsts else 0 for i in range(len(st.rows))]
    assert st.bytes_read == 100 * decodes and all(st.rows[i].mtp_batch > 0 for i in firsts)
    assert all(r.mtp_batch == 0 and r.mtp_draft_ms == 0 for i, r in enumerate(st.rows) if i not in firsts)
    assert st.snapshot_bytes == SeqState.fresh(model.config).recurrent_nbytes() > 0
    assert st.snapshot_ring_bytes == 3 * st.snapshot_bytes  # n_rs_seq = n_draft = 3 snapshots


# ---------------------------------------------------------------------------------------------
# 4. The command line and the telemetry files.


def test_run_mtp_json_csv_and_summary(make_fixture, runs, tmp_path, capsys):
    model, prompt, ref = runs("predictable")
    path, csv = make_fixture("predictable", "f32"), tmp_path / "t.csv"
    rc = main(["run", str(path), "--tokens", ",".join(map(str, prompt)), "-n", str(len(ref)), "--mtp", "--draft", "3",
               "--json", "--csv", str(csv)])
    out, err = capsys.readouterr()
    assert rc == 0
    result = json.loads(out)
    _, stats = runs("predictable", source="mtp", n_draft=3)
    assert result["tokens"] == list(ref)
    for k in ("mtp_drafted", "mtp_accepted", "mtp_decodes", "drafted_steps", "accepted_per_pos", "snapshot_bytes"):
        assert result["stats"][k] == stats.counters()[k]
    a, d = stats.n_accepted, stats.n_drafted
    assert f"mtp: {a}/{d} drafts accepted ({100 * a / d:.1f}%)" in err
    assert f"({stats.n_decodes} decodes for {len(ref)} tokens)" in err and "tok/s effective (vs " in err
    head, rows, tail = read_csv(csv)
    assert (head["spec"], head["spec_draft_max"], head["mtp"], head["mtp_draft_max"]) == ("mtp", "3", "1", "3")
    assert head["ngram_min_match"] == "3" and head["prompt_tokens"] == str(len(prompt)) and head["model"] == str(path)
    assert [int(r["token"]) for r in rows] == list(ref)
    assert sum(int(r["bytes_read"] or 0) for r in rows) == int(tail["bytes_read"] or 0)  # the streamer's, if any
    assert (tail["mtp_drafted"], tail["mtp_accepted"], tail["drafted_steps"]) == (str(d), str(a), str(stats.n_drafted_steps))
    assert int(tail["snapshot_bytes"]) == stats.snapshot_bytes and "mtp_draft_s/tok" in tail


def test_run_ngram_summary(make_fixture, capsys):
    # "41 212" recurs: drafts 197 248 7, the trunk confirms 197 248 then corrects 7 → 60 (its π);
    # the second round has no budget left (n_predict − 3 − 1 = 0) and decodes plainly
    rc = main(["run", str(make_fixture("predictable", "f32")), "--tokens", "41,212,197,248,7,41,212", "-n", "4",
               "--ngram", "--ngram-min-match", "2", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0 and json.loads(out)["tokens"] == [197, 248, 60, 285]
    assert "ngram: 2/3 drafts accepted (66.7%), 2.00 tokens per verify decode (2 decodes for 4 tokens)" in err
    assert "ngram: drafted on 1 of 2 steps (50.0%); the rest decoded plainly" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mtp", "--ngram"], "not allowed with argument --mtp"),
        (["--mtp", "--draft", "9"], "--draft must be between 1 and 8, got 9"),
        (["--ngram", "--draft", "0"], "--draft must be between 1 and 8, got 0"),
        (["--temp", "0.8"], "only greedy decoding is supported"),
        (["--mtp-p-min", "0.5"], "--mtp-p-min needs --mtp"),
        (["--draft", "2"], "--draft needs --mtp or --ngram"),
        (["--mtp", "--mtp-p-min", "1.5"], "--mtp-p-min must be between 0 and 1"),
    ],
    ids=["both-sources", "draft-9", "draft-0", "temp", "p-min-alone", "draft-alone", "p-min-range"],
)
def test_bad_speculative_flags(make_fixture, capsys, args, message):
    rc = main(["run", str(make_fixture("tiny", "f32")), "--tokens", "1,2", "-n", "2", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("refimpl: error:") and message in err[0], err


def test_mtp_on_a_stripped_file_is_refused_at_load(make_fixture, capsys):
    path = make_fixture("tiny", "f32", mtp="stripped")
    rc = main(["run", str(path), "--tokens", "1,2", "-n", "2", "--mtp"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--mtp needs the nextn (MTP) block" in err[0]
    with pytest.raises(RefimplError, match="nextn"):
        speculative_generate(load_model(path), [1, 2], 2, source="mtp")


# ---------------------------------------------------------------------------------------------
# 5. The same loop driven through llama.cpp drafts and accepts the same tokens.


@pytest.mark.oracle
@pytest.mark.parametrize("n_draft", [1, 3])
def test_counts_equal_llama_cpp(make_fixture, runs, n_draft):
    require_llama_cpp()
    from llama_spec import llama_speculative

    model, prompt, ref = runs("predictable")
    tokens, stats = runs("predictable", source="mtp", n_draft=n_draft)
    theirs = llama_speculative(make_fixture("predictable", "f32"), prompt, len(ref), n_draft=n_draft)
    assert theirs.tokens == tokens
    ours = (stats.n_drafted, stats.n_accepted, stats.n_decodes, stats.n_drafted_steps)
    assert ours == (theirs.n_drafted, theirs.n_accepted, theirs.n_decodes, theirs.n_drafted_steps)
    kinds = "".join("d" * (len(r["ids"]) - 1) + ("b" if len(r["ids"]) > len(r["drafts"]) else "c") if r["drafts"] else "p"
                    for r in theirs.rounds)
    assert "".join(r.kind[0] for r in stats.rows) == kinds[: len(tokens)]


@pytest.mark.parametrize("n_right", [99, 0], ids=["accept-all", "reject-all"])
def test_end_of_generation_stops_the_loop(runs, n_right):
    """An EOG token ends generation (included), even inside an accepted run of drafts."""
    model, prompt, _ = runs("tiny-f32")
    truth = list(prompt) + greedy(model, prompt, 6)
    eog = frozenset({truth[len(prompt) + 2]})  # pretend the third generated token is EOG
    expected = greedy(model, prompt, 6, eog_ids=eog)
    tokens, st = speculative_generate(model, prompt, 6, source=Scripted(truth, n_right, model.config.n_vocab),
                                      n_draft=3, eog_ids=eog)
    assert tokens == expected == truth[len(prompt): len(prompt) + 3]
    assert st.n_generated == len(st.rows) == 3
