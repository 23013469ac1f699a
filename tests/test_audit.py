"""Stream audit: streams corrupted on purpose are blamed on the right side, a genuine near-tie of the
oracle is recognised as benign, and every stream format is read."""

import json

import numpy as np
import pytest

from conftest import require_llama_cpp
from refimpl.oracle import golden as G
from refimpl.oracle.audit import TIE_THRESHOLD, Stream, audit, read_stream
from refimpl.oracle.audit_report import report_lines
from refimpl.cli import main
from refimpl.errors import RefimplError
from refimpl.decode.greedy import greedy
from refimpl.model.trunk import load_model
from refimpl.model.ops import Ctx
from refimpl.tokenizer import Tokenizer

N = 20


pytestmark = pytest.mark.usefixtures("fixture_cache")  # conftest: shared fixture cache, one numba thread


class Case:
    """The built-in tiny model, a prompt, the oracle's greedy stream and its logits at every step."""

    def __init__(self):
        self.model = load_model(G.resolve_model("builtin:tiny"))
        self.tok = Tokenizer.from_gguf(self.model.file.gguf)
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


def test_model_is_optional_and_told_by_file_type(case, tmp_path, capsys):
    """MODEL defaults to builtin:kjv (as for run); each positional is a MODEL (.gguf, builtin:, GGUF bytes
    under any name), a GOLDEN (.jsonl) or a STREAM (anything else), and a misplaced one is one line."""
    from refimpl.fixtures.builtin import TRAINED_PATH

    kjv = load_model(TRAINED_PATH, pack=False)
    tok = Tokenizer.from_gguf(kjv.file.gguf)
    prompt = tok.encode("And it came to pass")
    stream = greedy(kjv, prompt, 8)
    a, t = tmp_path / "a.json", tmp_path / "a.txt"
    a.write_text(json.dumps({"prompt_tokens": prompt, "tokens": stream}))
    t.write_text(tok.decode(stream) + "\n")
    assert main(["audit", str(a), str(t)]) == 0  # two streams, no MODEL: the trained model judges them
    captured = capsys.readouterr()
    assert "using the built-in trained model builtin:kjv" in captured.err
    assert captured.out.startswith("audit: builtin:kjv, prompt") and "result: identical" in captured.out
    bad = tmp_path / "bad.json"
    rows = []
    G.walk(kjv, G.start(kjv, prompt, Ctx()), stream[:4], Ctx(), lambda i, r: rows.append(r.copy()))
    bad.write_text(json.dumps(stream[:3] + [int(np.argmin(rows[3]))] + stream[4:]))  # the oracle's worst token at step 3
    assert main(["audit", str(bad), "--prompt", "And it came to pass"]) == 1  # one stream vs the kjv oracle
    assert "verdict: A wrong" in capsys.readouterr().out
    renamed = tmp_path / "tiny.model"  # a GGUF is a MODEL by its bytes whatever its name
    renamed.write_bytes(G.resolve_model("builtin:tiny").read_bytes())
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps(case.stream))
    assert main(["audit", str(renamed), str(tiny), "--prompt-tokens", ",".join(map(str, case.prompt))]) == 0
    assert "result: clean" in capsys.readouterr().out
    for argv, msg in [([str(a), "builtin:tiny"], "builtin:tiny is a MODEL: it goes first"),
                      ([str(a), str(renamed)], "tiny.model is a MODEL: it goes first"),
                      ([str(a), "x.jsonl"], "x.jsonl is a GOLDEN: it goes first"),
                      ([str(tmp_path / "nope")], "nope: no such file, and its name does not say what it is"),
                      ([str(a)] * 3, "one or two streams, got 3"), ([], "needs one or two STREAM files"),
                      ([str(tmp_path / "g.jsonl"), "--streams", str(tmp_path)], "--streams DIR needs a MODEL")]:
        assert main(["audit", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("refimpl: error:") and msg in err, err


# ---- many stream pairs: audit --streams DIR --------------------------------------------------


def write_stream_dir(case, d):
    """A --streams directory with one pair of each kind, every prompt source and stream format used;
    returns {NAME: (verdict, exit code)}."""
    j, c = case.tie, case.clear
    flipped = case.continue_from(case.stream[:j] + [case.runner_up(j)])
    bad = case.stream[:c] + [case.worst(c)] + case.stream[c + 1 :]
    d.mkdir(exist_ok=True)
    (d / "p0-same.A.json").write_text(json.dumps({"prompt_tokens": case.prompt, "tokens": case.stream}))
    (d / "p0-same.B.json").write_text(json.dumps(case.stream))
    (d / "p1-tie.A.json").write_text(json.dumps(case.stream))
    (d / "p1-tie.B.csv").write_text("step,token_id\n" + "".join(f"{i},{t}\n" for i, t in enumerate(flipped)))
    (d / "p1-tie.prompt.json").write_text(json.dumps(case.prompt))
    (d / "p2-bad.A.json").write_text(json.dumps(case.stream))
    (d / "p2-bad.B.json").write_text(json.dumps(bad))
    (d / "p2-bad.prompt.txt").write_text("The quick brown fox\n")
    (d / "p3-alone.A.json").write_text(json.dumps({"prompt_tokens": case.prompt, "tokens": flipped}))
    (d / ".hidden").write_text("skipped")
    return {"p0-same": ("identical", 0), "p1-tie": ("near-tie", 0), "p2-bad": ("B wrong", 1), "p3-alone": ("near-tie", 0)}


def test_streams_dir(case, tmp_path, capsys):
    expected = write_stream_dir(case, tmp_path / "s")
    assert main(["audit", "builtin:tiny", "--streams", str(tmp_path / "s")]) == 1
    lines = capsys.readouterr().out.splitlines()
    for line, (name, (verdict, code)) in zip(lines, sorted(expected.items())):
        assert line.startswith(f"{name}: {verdict}") and line.split("→ ")[1].startswith("WRONG" if code else "ok"), line
    assert f"p1-tie: near-tie at step {case.tie};" in lines[1] and f"p2-bad: B wrong at step {case.clear};" in lines[2]
    assert "p3-alone.A.json vs the oracle" in lines[3]
    table = [ln.split() for ln in lines[4:-1]]
    assert table == [["verdict", "pairs", "with", "a", "wrong", "token"], ["identical", "1", "0"], ["near-tie", "2", "0"],
                     ["B", "wrong", "1", "1"], ["total", "4", "1"]]
    assert lines[-1] == "result: 1 of 4 stream pairs wrong → exit 1"
    assert main(["audit", "builtin:tiny", "--streams", str(tmp_path / "s"), "--json"]) == 1
    obj = json.loads(capsys.readouterr().out)
    assert [(p["name"], p["verdict"], p["exit_code"]) for p in obj["pairs"]] == [(n, v, c) for n, (v, c) in sorted(expected.items())]
    assert obj["exit_code"] == 1 and obj["summary"] == {"identical": 1, "near-tie": 2, "B wrong": 1}
    for f in (tmp_path / "s").glob("p2-bad.*"):
        f.unlink()
    assert main(["audit", "builtin:tiny", "--streams", str(tmp_path / "s")]) == 0  # nothing wrong left
    assert capsys.readouterr().out.splitlines()[-1] == "result: 0 of 3 stream pairs wrong → exit 0"


def test_streams_dir_prompt_flag_overrides(case, tmp_path, capsys):
    d = tmp_path / "s"
    d.mkdir()
    (d / "x.A.json").write_text(json.dumps(case.stream))
    (d / "x.prompt.txt").write_text("something else entirely")
    assert main(["audit", "builtin:tiny", "--streams", str(d), "--prompt-tokens", ",".join(map(str, case.prompt))]) == 0
    assert capsys.readouterr().out.startswith("x: clean, 20 tokens; common prefix 20, 0 near-ties, 0 wrong → ok")


def test_streams_dir_errors_are_one_line(case, tmp_path, capsys):
    def fails(d, msg, *extra):
        assert main(["audit", "builtin:tiny", "--streams", str(d), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and msg in err, err

    d = tmp_path / "s"
    d.mkdir()
    fails(d, "no stream files")
    (d / "x.B.json").write_text(json.dumps(case.stream))
    fails(d, "B file without x.A.EXT")
    (d / "x.A.json").write_text(json.dumps(case.stream))
    fails(d, "x: no prompt: add x.prompt.EXT")
    (d / "x.prompt.json").write_text(json.dumps(case.prompt))
    (d / "x.a.json").write_text("[1]")
    fails(d, "x.a.json: not NAME.A.EXT, NAME.B.EXT or NAME.prompt.EXT")
    (d / "x.a.json").unlink()
    (d / "x.A.csv").write_text("token\n1\n")
    fails(d, "a second x.A file")
    fails(tmp_path / "nope", "not a directory")
    assert main(["audit", "builtin:tiny", str(d / "x.B.json"), "--streams", str(d)]) == 2
    assert "give STREAM files or --streams DIR, not both" in capsys.readouterr().err
    fails(d, "--cache-mb expects a whole number", "--cache-mb", "lots")
    assert main(["audit", "builtin:tiny", str(d / "x.B.json"), "--jobs", "2"]) == 2
    assert "go with --streams DIR" in capsys.readouterr().err


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
