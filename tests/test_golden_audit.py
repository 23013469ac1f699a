"""`refimpl audit GOLDEN STREAM`: a stream judged by a committed golden file's top-5 and margins, no
model loaded; the verdicts agree with the model audit's, and coverage ends at the divergence."""

import json
from pathlib import Path

import pytest

from refimpl.cli import main

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "tiny-f32.jsonl"

pytestmark = pytest.mark.usefixtures("fixture_cache")


@pytest.fixture(scope="module")
def rec():
    records = [json.loads(line) for line in GOLDEN.read_text().splitlines()]
    return records[1]  # prompt 0


def _stream(tmp_path, rec, tokens, prompt=True, name="s.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"prompt_tokens": rec["prompt_ids"], "tokens": tokens} if prompt else tokens))
    return str(p)


def _rel(step):
    return step["margin"] / max(abs(x) for x in step["top_logits"])


def _audit(argv, capsys):
    rc = main(["audit", *argv])
    return rc, capsys.readouterr()


def test_the_golden_stream_is_identical(rec, tmp_path, capsys):
    rc, out = _audit([str(GOLDEN), _stream(tmp_path, rec, rec["ids"])], capsys)
    assert rc == 0 and "A follows the golden for all 24 steps" in out.out and "identical → exit 0" in out.out


@pytest.mark.parametrize("which", ["near-tie", "wide"])
def test_a_runner_up_is_judged_like_the_model_audit(rec, tmp_path, capsys, which):
    rels = [_rel(s) for s in rec["steps"]]
    j = min(range(1, len(rels)), key=rels.__getitem__) if which == "near-tie" else max(range(len(rels)), key=rels.__getitem__)
    tokens = rec["ids"][:j] + [rec["steps"][j]["top_ids"][1]] + rec["ids"][j + 1:]
    path = _stream(tmp_path, rec, tokens)
    rc, out = _audit([str(GOLDEN), path, "--json"], capsys)
    v = json.loads(out.out)
    expected = "near-tie" if which == "near-tie" else "A wrong"
    assert (v["step"], v["kind"], v["exact"], rc) == (j, expected, True, int(expected == "A wrong"))
    assert v["deficit"] == pytest.approx(rec["steps"][j]["margin"]) and v["covered"] == j + 1
    rc, out = _audit([str(GOLDEN), path], capsys)
    assert f"coverage: the golden judges steps 0–{j}; steps {j + 1}–23 follow a history it never saw" in out.out
    # the model audit says the same about the divergence
    main(["audit", "builtin:tiny/f32", path, "--json"])  # its exit status also judges the tail, which the golden cannot
    d = json.loads(capsys.readouterr().out)["divergence"]
    assert (d["step"], d["kind"]) == (j, expected)


def test_a_token_outside_the_top5_is_wrong(rec, tmp_path, capsys):
    bad = next(t for t in range(500) if t not in rec["steps"][0]["top_ids"])
    rc, out = _audit([str(GOLDEN), _stream(tmp_path, rec, [bad] + rec["ids"][1:])], capsys)
    assert rc == 1 and "not in the recorded top-5: at least" in out.out and "verdict: A wrong" in out.out


def test_a_stream_longer_than_the_golden(rec, tmp_path, capsys):
    rc, out = _audit([str(GOLDEN), _stream(tmp_path, rec, rec["ids"] + [5, 6, 7])], capsys)
    assert rc == 0 and "steps 24–26 follow a history it never saw" in out.out


def test_prompt_by_ids_and_errors(rec, tmp_path, capsys):
    ids = _stream(tmp_path, rec, rec["ids"], prompt=False)
    rc, out = _audit([str(GOLDEN), ids, "--prompt-tokens", ",".join(map(str, rec["prompt_ids"]))], capsys)
    assert rc == 0
    text = tmp_path / "t.txt"
    text.write_text("hello\n")
    for argv, msg in [([ids], "holds 4 prompts: give the stream's prompt"),
                      ([ids, "--prompt-tokens", "1,2,3"], "no prompt with ids [1, 2, 3]"),
                      ([str(text), "--prompt-tokens", "1"], "is text; without a model"),
                      ([ids, "--prompt", "x"], "needs the prompt as ids")]:
        rc, out = _audit([str(GOLDEN), *argv], capsys)
        err = out.err.strip()
        assert rc == 2 and "\n" not in err and msg in err, err
