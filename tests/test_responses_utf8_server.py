"""The real llama-server (conftest.require_llama_tool) on answers with tokens it holds back: a converted file of
``golden/converted/`` (a real Qwen-style byte-level vocabulary, random weights) whose greedy continuations of
PROMPTS hold tokens whose bytes end inside a UTF-8 character — in the middle and at the end. llama-server sends no
log-prob entry for them, and, streamed or through ``/v1/completions``, no id (refimpl.oracle.response_align). Each
form — ``/completion`` whole and streamed, ``/v1/completions`` whole and streamed — is read, every token judged
by its id (the ids the streamed and /v1 forms leave out recovered from the bytes), the present log-probs compared
within the bound, the steps without one listed as "partial UTF-8"; ``refimpl validate`` on the same prompts works.
One server for the module; 16 tokens per answer."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from conftest import require_llama_tool
from test_validate_server import llama_servers

from refimpl.cli import main
from refimpl.oracle.response_align import Pieces
from refimpl.oracle.responses import read_response
from refimpl.tokenizer import Tokenizer

MODEL = Path(__file__).resolve().parent.parent / "golden" / "converted" / "qwen35-narrow-q8_0.gguf"
# greedy continuations (16 tokens) with held-back tokens: "The cat" in the middle (steps 10, 11), "Hello" at the end
PROMPTS = {"middle": "The cat", "end": "Hello"}
N = 16


def _post(url: str, path: str, body: dict) -> str:
    req = urllib.request.Request(f"{url}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode("utf-8")


@pytest.fixture(scope="module")
def served():
    """The running server's URL and, per prompt, the four answers' texts."""
    server = require_llama_tool("llama-server")
    tok = Tokenizer.from_gguf(MODEL)
    with llama_servers(server, [["-m", str(MODEL)]]) as (url,):
        answers = {}
        for name, text in PROMPTS.items():
            ids = tok.encode(text)
            body = {"prompt": ids, "n_predict": N, "n_probs": 3, "temperature": 0, "return_tokens": True, "cache_prompt": False}
            v1 = {"prompt": ids, "max_tokens": N, "logprobs": 3, "temperature": 0, "cache_prompt": False}
            answers[name] = {"whole": _post(url, "/completion", body), "stream": _post(url, "/completion", {**body, "stream": True}),
                             "v1": _post(url, "/v1/completions", v1), "v1 stream": _post(url, "/v1/completions", {**v1, "stream": True})}
        yield url, tok, answers


def _audit(tmp_path, name: str, text: str, prompt: list[int], capsys) -> dict:
    path = tmp_path / name
    path.write_text(text)
    code = main(["audit", str(MODEL), str(path), "--prompt-tokens", ",".join(map(str, prompt)), "--emulate", "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == rep["exit_code"]
    return rep


@pytest.mark.parametrize("form", ["whole", "stream", "v1", "v1 stream"])
def test_held_back_tokens_in_the_middle(served, form, tmp_path, capsys):
    url, tok, answers = served
    pieces = Pieces(tok)
    whole = json.loads(answers["middle"]["whole"])
    ids = whole["tokens"]
    held = sorted(pieces.partial_steps(ids))
    assert len(ids) == N and held and max(held) < N - 1  # the prompt still gives a gap in the middle
    assert len(whole["completion_probabilities"]) == N - len(held)  # llama-server: no entry for them

    got, _, info = read_response(answers["middle"][form], form, tok)
    assert got == ids and info.unread == 0  # every id, the held-back ones recovered where the answer leaves them out
    assert info.recovered == (() if form == "whole" else tuple(held))
    assert [s for s, sp in enumerate(info.probs) if sp is None] == held
    rep = _audit(tmp_path, "r.sse" if "stream" in form else "r.json", answers["middle"][form], tok.encode(PROMPTS["middle"]), capsys)
    assert rep["streams"][0]["n_tokens"] == N and not any(f["kind"].endswith("wrong") for f in rep["findings"])
    p = rep["probs"]["A"]
    assert p["verdict"] == "within bound" and p["n_compared"] == N - len(held) and p["max_rel_dlogp"] <= p["bound"]
    assert p["without_logprob"] == [{"step": s, "reason": "partial UTF-8"} for s in held]
    assert p["missing_steps"] == held and p["recovered_steps"] == list(info.recovered) and p["unread_tokens"] == 0


@pytest.mark.parametrize("form", ["whole", "stream", "v1", "v1 stream"])
def test_held_back_tokens_at_the_end(served, form, tmp_path, capsys):
    url, tok, answers = served
    ids = json.loads(answers["end"]["whole"])["tokens"]
    held = sorted(Pieces(tok).partial_steps(ids))
    assert held and held[-1] == N - 1  # the last token is held back
    tail = N - next(k + 1 for k in reversed(range(N)) if k not in held)
    got, _, info = read_response(answers["end"][form], form, tok)
    n = N if form == "whole" else N - tail  # only the whole /completion names the ids held back at the end
    assert got == ids[:n] and info.unread == N - n
    rep = _audit(tmp_path, "r.sse" if "stream" in form else "r.json", answers["end"][form], tok.encode(PROMPTS["end"]), capsys)
    p = rep["probs"]["A"]
    assert p["verdict"] == "within bound" and p["unread_tokens"] == N - n
    assert p["without_logprob"] == [{"step": s, "reason": "partial UTF-8"} for s in held if s < n]
    capsys.readouterr()
    main(["audit", str(MODEL), str(tmp_path / ("r.sse" if "stream" in form else "r.json")),
          "--prompt-tokens", ",".join(map(str, tok.encode(PROMPTS["end"]))), "--emulate"])
    out = capsys.readouterr().out
    if form == "whole":
        assert f"log-prob missing at step {', '.join(map(str, held))} (partial UTF-8: " in out
    else:
        assert f"the server counts {N - n} more generated token(s) after the last one it sent" in out


def test_validate_on_held_back_tokens(served, tmp_path, capsys):
    url, tok, answers = served
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(t + "\n" for t in PROMPTS.values()))
    report = tmp_path / "report.json"
    for api in ("llama", "openai"):
        code = main(["validate", str(MODEL), "--server", url, "--api", api, "--prompts", str(prompts), "-n", str(N),
                     "--emulate", "--report", str(report)])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "identical, 2 without log-prob (partial UTF-8)" in out and ("1 unread" in out) == (api == "openai")
        doc = json.loads(report.read_text())
        for res, name in zip(doc["results"], PROMPTS):
            ids = json.loads(answers[name]["whole"])["tokens"]
            held = sorted(Pieces(tok).partial_steps(ids))
            n = N if api == "llama" else N - (N - next(k + 1 for k in reversed(range(N)) if k not in held))
            p = res["audit"]["probs"][res["column"]]  # the report: every step without a log-prob, with its reason
            assert res["tokens"] == ids[:n] and res["verdict"] in ("identical", "near-tie")
            assert p["without_logprob"] == [{"step": s, "reason": "partial UTF-8"} for s in held if s < n]
