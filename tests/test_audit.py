"""Stream audit: streams corrupted on purpose are blamed on the right side, a genuine near-tie of the
oracle is recognised as benign, and every stream format is read."""

import json

import numpy as np
import pytest

from conftest import require_llama_cpp
from refimpl import golden as G
from refimpl.audit import TIE_THRESHOLD, Stream, audit, read_stream, report_lines
from refimpl.cli import main
from refimpl.errors import RefimplError
from refimpl.generate import greedy
from refimpl.model import load_model
from refimpl.ops import Ctx
from refimpl.tokenizer import Tokenizer

N = 20


pytestmark = pytest.mark.usefixtures("fixture_cache")  # conftest: shared fixture cache, one numba thread


class Case:
    """The built-in tiny model, a prompt, the oracle's greedy stream and its logits at every step."""

    def __init__(self):
        self.model = load_model(G.resolve_model("builtin:tiny"))
        self.tok = Tokenizer.from_gguf(self.model.file.gguf.reader)
        self.prompt = self.tok.encode("The quick brown fox", parse_special=True)
        self.stream = greedy(self.model, self.prompt, N)
        rows = []
        G.walk(self.model, G.start(self.model, self.prompt, Ctx()), self.stream, Ctx(), lambda i, r: rows.append(r.copy()))
        self.rows = np.array(rows)  # [N, V]
        top2 = np.sort(self.rows, axis=1)[:, -2:]
        self.rel_margin = (top2[:, 1] - top2[:, 0]) / np.abs(self.rows).max(axis=1)
        self.tie = int(np.argmin(self.rel_margin[1:])) + 1  # the oracle's closest call (not step 0)
        self.clear = int(np.argmax(self.rel_margin))  # its clearest choice

    def runner_up(self, step):
        return int(np.argsort(-self.rows[step], kind="stable")[1])

    def worst(self, step, k=0):
        return int(np.argsort(self.rows[step], kind="stable")[k])

    def continue_from(self, head):
        """head + the oracle's greedy continuation after it, N tokens in all."""
        return head + greedy(self.model, self.prompt + head, N - len(head)) if len(head) < N else head

    def run(self, a, b=None, **kw):
        sa = Stream("A", "a", "json", a)
        sb = Stream("B", "b", "json", b) if b is not None else None
        return audit(self.model, self.prompt, sa, sb, **kw)


@pytest.fixture(scope="module")
def case():
    return Case()


def test_the_case_has_a_genuine_near_tie_and_a_clear_step(case):
    assert case.rel_margin[case.tie] < 0.01 < TIE_THRESHOLD  # a real near-tie of the oracle itself
    assert case.rel_margin[case.clear] > 2 * TIE_THRESHOLD


def test_identical_streams_are_clean(case):
    rep = case.run(case.stream, list(case.stream))
    assert (rep.verdict, rep.exit_code, rep.common, rep.findings) == ("identical", 0, N, [])
    rep = case.run(case.stream)
    assert (rep.verdict, rep.exit_code, rep.divergence) == ("clean", 0, None)


def test_a_flip_at_a_near_tie_is_benign(case):
    j = case.tie
    flipped = case.continue_from(case.stream[:j] + [case.runner_up(j)])
    rep = case.run(case.stream, flipped)
    d = rep.divergence
    assert (rep.common, d.step, d.kind, rep.exit_code) == (j, j, "near-tie", 0)
    assert d.oracle.margin == pytest.approx(float(np.sort(case.rows[j])[-1] - np.sort(case.rows[j])[-2]))
    assert d.oracle.margin <= d.oracle.threshold == pytest.approx(TIE_THRESHOLD * np.abs(case.rows[j]).max())
    assert rep.findings == []  # each tail follows the oracle given its own history
    assert rep.tails == {"A": N - j - 1, "B": N - j - 1}
    text = "\n".join(report_lines(rep, case.tok))
    assert f"first divergence at step {j}" in text and "verdict: near-tie" in text and "exit 0" in text
    # against the oracle alone, the flipped stream is a near-tie too
    rep = case.run(flipped)
    assert (rep.divergence.kind, rep.divergence.step, rep.exit_code) == ("near-tie", j, 0)


def test_a_corrupted_stream_is_blamed(case):
    j = case.clear
    bad = case.stream[:j] + [case.worst(j)] + case.stream[j + 1 :]
    rep = case.run(case.stream, bad)
    assert (rep.divergence.kind, rep.divergence.step, rep.exit_code) == ("B wrong", j, 1)
    assert rep.divergence.oracle.deficit(case.worst(j)) > rep.divergence.oracle.threshold
    rep = case.run(bad, case.stream)
    assert (rep.divergence.kind, rep.exit_code) == ("A wrong", 1)
    rep = case.run(bad)  # against the oracle's own greedy stream
    assert (rep.divergence.kind, rep.divergence.step, rep.exit_code) == ("A wrong", j, 1)
    assert rep.divergence.tokens == {"A": case.worst(j), "oracle": case.stream[j]}


def test_both_corrupted_differently_is_both_wrong(case):
    j = case.clear
    a = case.stream[:j] + [case.worst(j, 0)]
    b = case.stream[:j] + [case.worst(j, 1)]
    rep = case.run(a, b)
    assert (rep.divergence.kind, rep.exit_code) == ("both wrong", 1)


def test_the_runner_up_at_a_clear_step_is_not_a_near_tie(case):
    j = case.clear
    rep = case.run(case.stream, case.stream[:j] + [case.runner_up(j)])
    assert (rep.divergence.kind, rep.exit_code) == ("B wrong", 1)


def test_a_shared_mistake_in_the_common_prefix_is_found(case):
    j = case.clear
    shared = case.stream[:j] + [case.worst(j)]
    rep = case.run(shared + [1, 2], shared + [1, 3])
    assert rep.common == j + 2
    assert [(f.step, f.where, f.kind) for f in rep.findings][0] == (j, "A+B", "wrong")
    assert rep.exit_code == 1


def test_a_wrong_token_after_a_benign_flip_is_still_caught(case):
    """The rollback bug a first-divergence-only audit would miss: B flips at a near-tie, then errs."""
    j = case.tie
    flipped = case.continue_from(case.stream[:j] + [case.runner_up(j)])
    k = N - 2
    flipped[k] = (flipped[k] + 1) % 300
    rep = case.run(case.stream, flipped)
    assert rep.divergence.kind == "near-tie"
    wrong = [f for f in rep.findings if not f.benign]
    assert wrong and wrong[0].where == "B" and wrong[0].step == k
    assert rep.exit_code == 1


def test_streams_of_different_length(case):
    rep = case.run(case.stream, case.stream[:12])
    assert (rep.divergence, rep.common, rep.exit_code, rep.tails) == (None, 12, 0, {"A": N - 12, "B": 0})
    assert "A continues for 8 tokens" in "\n".join(report_lines(rep, case.tok))


def test_threshold_is_a_fraction_of_max_logit(case):
    j = case.tie
    flipped = case.stream[:j] + [case.runner_up(j)]
    tight = case.rel_margin[j] / 2
    assert case.run(case.stream, flipped, tau=tight).divergence.kind == "B wrong"
    with pytest.raises(RefimplError, match="threshold"):
        case.run(case.stream, flipped, tau=1.5)


# ---- stream files ---------------------------------------------------------------------------


def test_stream_formats(case, tmp_path):
    ids = case.stream
    p = tmp_path / "ids.json"
    p.write_text(json.dumps(ids))
    assert read_stream(p, "A", case.tok).tokens == ids
    p = tmp_path / "run.json"
    p.write_text(json.dumps({"prompt_tokens": case.prompt, "tokens": ids, "text": "…"}))
    s = read_stream(p, "A", case.tok)
    assert (s.tokens, s.prompt, s.kind) == (ids, case.prompt, "json")
    p = tmp_path / "engine.csv"
    p.write_text("# engine=foo\nstep,token_id,ms\n" + "".join(f"{i},{t},1.5\n" for i, t in enumerate(ids)) + "# total=3\n")
    assert read_stream(p, "B", case.tok).tokens == ids
    p = tmp_path / "out.txt"
    p.write_text("Hello world\n")
    s = read_stream(p, "A", case.tok)
    assert (s.tokens, s.kind) == (case.tok.encode("Hello world", parse_special=True), "text")


def test_refimpl_run_outputs_are_streams(case, tmp_path, capsys):
    """`refimpl run --json` output and `refimpl run --mtp --csv` telemetry read back as the stream."""
    path, prompt = str(G.resolve_model("builtin:tiny")), ",".join(map(str, case.prompt))
    assert main(["run", path, "--tokens", prompt, "-n", "8", "--json"]) == 0
    out = tmp_path / "run.json"
    out.write_text(capsys.readouterr().out)
    s = read_stream(out, "A", case.tok)
    assert (s.tokens, s.prompt) == (case.stream[:8], case.prompt)
    csv_path = tmp_path / "t.csv"
    assert main(["run", path, "--tokens", prompt, "-n", "8", "--mtp", "--draft", "3", "--csv", str(csv_path)]) == 0
    capsys.readouterr()
    assert read_stream(csv_path, "B", case.tok).tokens == case.stream[:8]


def test_bad_stream_files(case, tmp_path):
    for name, body, msg in [("x.json", "[1, 2,", "does not parse"), ("y.json", '{"ids": [1]}', "object with 'tokens'"),
                            ("z.json", '["a"]', "list of integer token ids"), ("w.csv", "a,b\n1,2\n", "no 'token' or 'token_id' column"),
                            ("v.csv", "token\n12\nx\n", "CSV row 2: 'token' is 'x'")]:
        p = tmp_path / name
        p.write_text(body)
        with pytest.raises(RefimplError, match=msg):
            read_stream(p, "A", case.tok)
    with pytest.raises(RefimplError, match="outside the vocabulary"):
        case.run([5, 999])
    with pytest.raises(RefimplError, match="holds no tokens"):
        case.run([])


# ---- the command ----------------------------------------------------------------------------


def test_cli(case, tmp_path, capsys):
    j = case.tie
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"prompt_tokens": case.prompt, "tokens": case.stream}))
    b.write_text(json.dumps(case.continue_from(case.stream[:j] + [case.runner_up(j)])))
    assert main(["audit", "builtin:tiny", str(a), str(b)]) == 0  # prompt taken from A's prompt_tokens
    out = capsys.readouterr().out
    assert "verdict: near-tie" in out and f"first divergence at step {j}" in out
    assert main(["audit", "builtin:tiny", str(b), "--prompt-tokens", ",".join(map(str, case.prompt)), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["verdict"], rep["divergence"]["step"], rep["exit_code"]) == ("near-tie", j, 0)
    assert rep["divergence"]["oracle"]["margin"] <= rep["divergence"]["oracle"]["threshold"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(case.stream[: case.clear] + [case.worst(case.clear)]))
    assert main(["audit", "builtin:tiny", str(bad), "--prompt", "The quick brown fox"]) == 1
    assert "verdict: A wrong" in capsys.readouterr().out


def test_cli_errors_are_one_line(case, tmp_path, capsys):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(case.stream))
    for argv, msg in [([str(a)], "audit needs the prompt"), ([str(a)] * 3 + ["--prompt", "x"], "one or two streams"),
                      ([str(tmp_path / "nope.json"), "--prompt", "x"], "cannot read stream A"),
                      ([str(a), "--prompt-tokens", "1,x"], "comma-separated integers")]:
        assert main(["audit", "builtin:tiny", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and msg in err, err


# ---- a real near-tie: llama.cpp against refimpl, without emulation ----------------------------


@pytest.mark.oracle
def test_llama_cpp_flip_without_emulation_is_a_near_tie(make_fixture):
    """docs/numerics.md: on the mxfp4 mix without emulation llama.cpp's greedy stream leaves
    refimpl's at a near-tie. The audit must call that benign, not blame llama.cpp."""
    require_llama_cpp()
    from llama_ref import llama_greedy

    path = make_fixture("tiny", "mxfp4")
    model = load_model(path)
    prompt = [int(t) for t in np.random.default_rng(1).integers(0, 390, size=24)]
    theirs = [int(t) for t in llama_greedy(path, prompt, 32)[len(prompt) :]]
    rep = audit(model, prompt, Stream("A", "llama.cpp", "json", theirs))
    assert rep.divergence is not None and rep.divergence.kind == "near-tie", report_lines(rep, Tokenizer.from_gguf(path))
    # with emulation the oracle is llama.cpp's twin: the same stream, no divergence at all
    assert audit(model, prompt, Stream("A", "llama.cpp", "json", theirs), ctx=Ctx(act_quant=True)).divergence is None
