"""Round audit (refimpl.oracle.rounds): refimpl's own rounds match the oracle's head replay, a changed draft
or accepted count is found at the right round, a flip at the head's own near-tie is benign, and the
`rounds:` section and exit status of `refimpl audit`."""

import json

import pytest

from refimpl.oracle.audit import read_stream
from refimpl.cli import main
from refimpl.errors import RefimplError
from refimpl.inject.faults import Faults
from refimpl.model.trunk import load_model
from refimpl.model.ops import Ctx
from refimpl.oracle.rounds import check_rounds, rounds_from_json
from refimpl.decode.speculative import speculative_generate
from refimpl.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("fixture_cache")

PRED = [41, 212, 197, 248, 60]
TINY = [11, 42, 7, 300, 5]
N = 24


@pytest.fixture(scope="module")
def pred(make_fixture):
    model = load_model(make_fixture("predictable", "f32"))
    tokens, stats = speculative_generate(model, PRED, N, source="mtp", n_draft=3)
    return model, tokens, stats.rounds()


def _check(model, prompt, tokens, rounds):
    return check_rounds(model, prompt, tokens, rounds_from_json({"rounds": rounds, "spec_draft_max": 3}, "test"))


def test_refimpl_rounds_match_with_and_without_ids(pred):
    model, tokens, rounds = pred
    assert sum(r["accepted"] for r in rounds) > 5  # predictable's head is right about half the time
    for rr in (_check(model, PRED, tokens, rounds), _check(model, PRED, tokens, [{"accepted": r["accepted"]} for r in rounds])):
        t = rr.totals()
        assert (rr.verdict, rr.exit_code, t["differ"]) == ("match", 0, 0)
        assert t["engine_accepted"] == t["oracle_accepted"] == sum(r["accepted"] for r in rounds)
        assert rr.n_tokens_checked == N


def test_a_wrong_draft_id_is_found(pred):
    model, tokens, rounds = pred
    j = next(i for i, r in enumerate(rounds) if r["accepted"] == 0 and r["drafts"])  # a rejected first draft
    bad = [dict(r) for r in rounds]
    bad[j]["drafts"] = [(bad[j]["drafts"][0] + 1) % 300] + bad[j]["drafts"][1:]
    rr = _check(model, PRED, tokens, bad)
    f = rr.first
    assert (f.index, f.at, f.kind, rr.exit_code) == (j, 0, "wrong", 1)
    assert f.deficit > f.threshold and f.oracle_drafts == rounds[j]["drafts"]


def test_counts_alone_find_a_missing_acceptance(pred):
    """An engine that accepted one draft fewer in a round (counts only, no ids): the oracle's head
    drafted the stream's token there with a wide margin, so the round is wrong."""
    model, tokens, rounds = pred
    j = next(i for i, r in enumerate(rounds) if r["accepted"] >= 1)
    k = rounds[j]["accepted"]
    counts = [{"accepted": r["accepted"]} for r in rounds]
    counts[j : j + 1] = [{"accepted": k - 1, "drafted": 3}, {"accepted": 0, "drafted": 0}]  # same tokens, split
    rr = _check(model, PRED, tokens, counts)
    f = rr.first
    assert (f.index, f.engine_accepted, f.oracle_accepted, f.kind, rr.exit_code) == (j, k - 1, k, "wrong", 1)


def test_a_flip_at_the_heads_near_tie_is_benign(make_fixture):
    """mtp-prenorm on tiny changes some drafts only at the head's near-ties: those rounds alone,
    grafted onto the clean rounds, are near-ties and exit 0."""
    model = load_model(make_fixture("tiny", "f32"))
    tokens, clean = speculative_generate(model, TINY, 48, source="mtp", n_draft=3)
    faulty_tokens, faulty = speculative_generate(model, TINY, 48, Ctx(faults=Faults.of("mtp-prenorm")), source="mtp", n_draft=3)
    assert faulty_tokens == tokens  # blind to the stream
    rr = _check(model, TINY, tokens, faulty.rounds())
    ties = [c.index for c in rr.checks if c.kind == "near-tie"]
    assert ties and rr.exit_code == 1  # the fault also leaves the band somewhere
    graft = [faulty.rounds()[i] if i in ties else r for i, r in enumerate(clean.rounds())]
    rr = _check(model, TINY, tokens, graft)
    assert (rr.verdict, rr.exit_code, rr.totals()["near_tie"], rr.totals()["wrong"]) == ("near-tie", 0, len(ties), 0)
    assert all(c.deficit <= c.threshold for c in rr.checks if c.kind == "near-tie")


def test_streams_carry_their_rounds(make_fixture, tmp_path, capsys):
    path = str(make_fixture("predictable", "f32"))
    csv, js = tmp_path / "run.csv", tmp_path / "run.json"
    argv = ["run", path, "--tokens", ",".join(map(str, PRED)), "-n", str(N), "--mtp", "--draft", "3", "--csv", str(csv), "--json"]
    assert main(argv) == 0
    js.write_text(capsys.readouterr().out)
    tok = Tokenizer.from_gguf(path)
    a, b = read_stream(csv, "A", tok), read_stream(js, "A", tok)
    assert [r.n_tokens for r in a.rounds.rounds] == [r.n_tokens for r in b.rounds.rounds]  # kinds give accepted + 1
    assert [(r.accepted, r.drafts) for r in a.rounds.rounds] == [(r.accepted, r.drafts) for r in b.rounds.rounds]
    assert (a.rounds.draft_max, b.rounds.draft_max, a.rounds.p_min) == (3, 3, 0.0)
    # refimpl audit: a `rounds:` section, exit 0; then one draft id changed in the CSV → exit 1
    assert main(["audit", path, str(csv), "--prompt-tokens", ",".join(map(str, PRED))]) == 0
    out = capsys.readouterr().out
    assert "rounds (A):" in out and "every round matches (accepted counts, draft ids)" in out and "rounds A: match → exit 0" in out
    lines = csv.read_text().splitlines()
    header = lines[next(i for i, line in enumerate(lines) if not line.startswith("#"))].split(",")
    col = header.index("drafts")
    i = next(i for i, line in enumerate(lines) if not line.startswith("#") and line.split(",")[col].strip() and "," in line
             and line.split(",")[header.index("kind")] == "correction")
    cells = lines[i].split(",")
    ids = cells[col].split()
    ids[0] = str((int(ids[0]) + 1) % 300)
    cells[col] = " ".join(ids)
    lines[i] = ",".join(cells)
    csv.write_text("\n".join(lines) + "\n")
    assert main(["audit", path, str(csv), "--prompt-tokens", ",".join(map(str, PRED)), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["verdict"] == "clean" and rep["rounds"]["A"]["verdict"] == "wrong" and rep["exit_code"] == 1


def test_bad_round_information(pred, tmp_path, capsys):
    model, tokens, rounds = pred
    with pytest.raises(RefimplError, match="the rounds confirm"):
        _check(model, PRED, tokens[:-3], rounds[:2])
    with pytest.raises(RefimplError, match="rounds\\[0\\] must be an object with an integer 'accepted'"):
        rounds_from_json({"rounds": [{"drafts": [1]}]}, "x.json")
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"prompt_tokens": PRED, "tokens": tokens, "rounds": "no"}))
    assert main(["audit", "builtin:predictable", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'rounds' must be a list" in err
