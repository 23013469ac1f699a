"""``refimpl validate`` against small local HTTP servers (http.server on 127.0.0.1, this process): the one-line
errors — an unreachable port, a timeout, malformed JSON, an HTTP error, a bad URL, a report path that cannot
be written — and the verdicts on answers made up from the oracle's own greedy stream (identical) and from a
token the oracle never picks (wrong, exit 1), with the JSON report written; ``--api auto`` telling a
llama-server (its /props) from an OpenAI-compatible server, and vLLM's answer shapes (``"token_id:N"``
log-prob tokens, ``token_ids``, an answer without ids refused) made from llama-server's recorded /v1 answer
(tests/data/responses). The real llama-server: tests/test_validate_server.py."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import threading
import time

import pytest

from pathlib import Path

from refimpl.cli import main

MODEL = "builtin:kjv"
PROMPT = [1063, 356, 473, 289, 600]  # "And it came to pass"
#: llama-server's /v1/completions answer to PROMPT on builtin:kjv (8 greedy tokens, 3 top log-probs each)
V1C = json.loads((Path(__file__).parent / "data" / "responses" / "llama-server-v1c.json").read_text())
LLAMA_PROPS = (200, json.dumps({"default_generation_settings": {}, "total_slots": 1, "model_path": "kjv.gguf"}).encode())


@contextlib.contextmanager
def fake_server(routes: dict):
    """An HTTP server on a free 127.0.0.1 port: ``routes`` maps a path to ``(status, body bytes)`` or to a
    callable returning one (called with the request's JSON body or None); other paths answer 404. Stopped
    on exit."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, body):
            route = routes.get(self.path)
            if route is None:
                self.send_error(404)
                return
            status, payload = route(body) if callable(route) else route
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            with contextlib.suppress(OSError):  # the client may have given up (the timeout test)
                self.wfile.write(payload)

        def do_GET(self):  # noqa: N802 - http.server's name
            self._answer(None)

        def do_POST(self):  # noqa: N802
            n = int(self.headers.get("Content-Length") or 0)
            self._answer(json.loads(self.rfile.read(n) or b"null"))

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    p = tmp_path_factory.mktemp("validate") / "prompts.jsonl"
    p.write_text(json.dumps({"tokens": PROMPT}) + "\n")
    return p


@pytest.fixture(scope="module")
def greedy(prompts):
    """The oracle's own greedy continuation of PROMPT (refimpl run --json), 6 tokens."""
    out = contextlib.redirect_stdout(__import__("io").StringIO())
    with out as buf:
        assert main(["run", MODEL, "--tokens", ",".join(map(str, PROMPT)), "-n", "6", "--json", "--emulate"]) == 0
    return json.loads(buf.getvalue())["tokens"]


def _error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("refimpl: error:")]
    assert len(err) == 1, err
    return err[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_port_is_one_line_and_fast(prompts, capsys):
    t = time.monotonic()
    assert main(["validate", MODEL, "--server", f"http://127.0.0.1:{_free_port()}", "--prompts", str(prompts)]) == 2
    assert "cannot reach the server" in _error(capsys)
    assert time.monotonic() - t < 30


def test_timeout_is_one_line(prompts, capsys):
    def slow(_):
        time.sleep(20)
        return 200, b"{}"

    with fake_server({"/v1/models": slow}) as url:
        t = time.monotonic()
        assert main(["validate", MODEL, "--server", url, "--prompts", str(prompts), "--timeout", "0.3"]) == 2
        assert time.monotonic() - t < 15  # the answer would take 20 s
    assert "no answer within 0.3 s (--timeout)" in _error(capsys)


@pytest.mark.parametrize("routes, words", [
    ({"/v1/models": (200, b"this is not json{")}, "/v1/models: malformed response, not JSON"),
    ({"/v1/models": (200, b'{"data": 3}')}, "/v1/models: malformed response"),
    ({"/tokenize": (200, b'{"tokens": "abc"}')}, "/tokenize: malformed response"),
    ({"/completion": (200, b"<html>oops</html>")}, "/completion (prompt 1): malformed response, not a completion response"),
    ({"/completion": (200, b'{"tokens": [1, "x"], "stop": true}')}, "/completion (prompt 1): 'tokens': expected a list of integer token ids"),
    ({"/completion": (500, b'{"error": {"message": "boom"}}')}, "the server answered HTTP 500"),
    ({"/completion": (200, b'{"tokens": [99999], "stop": true}')}, "outside the vocabulary"),
])
def test_bad_answers_are_one_line(prompts, capsys, routes, words):
    with fake_server(routes) as url:
        assert main(["validate", MODEL, "--server", url, "--prompts", str(prompts), "--api", "llama"]) == 2
    assert words in _error(capsys)


@pytest.mark.parametrize("argv, words", [
    (["--server", "127.0.0.1:8080"], "expected a URL http://HOST:PORT"),
    (["--server", "http://127.0.0.1:99999"], "the port is not a number"),
    (["--server", "http://127.0.0.1:1", "--server", "http://127.0.0.1:1/"], "the same URL is given twice"),
    (["--server", "http://127.0.0.1:1", "-n", "0"], "-n must be ≥ 1"),
    (["--server", "http://127.0.0.1:1", "--timeout", "nan"], "--timeout must be a number of seconds > 0"),
    (["--server", "http://127.0.0.1:1", "--draft", "1,x"], "--draft 1,x: expected comma-separated"),
    (["--server", "http://127.0.0.1:1", "--draft", "3,3"], "3 is given twice"),
    (["--server", "http://127.0.0.1:1", "--draft", "1", "--api", "openai"], "--draft needs --api llama"),
    (["--server", "http://127.0.0.1:1", "--api", "vllm"], "argument --api: invalid choice"),
    (["--server", "http://127.0.0.1:1", "--served-model", " "], "--served-model: expected a model name"),
    (["--server", "http://127.0.0.1:1", "--report", "."], "cannot write --report .: it is a directory"),
    (["--server", "http://127.0.0.1:1", "--report", "/proc/refimpl-cannot-write-here/r.json"], "cannot write --report"),
    (["--server", "http://127.0.0.1:1", "--report", __file__ + "/r.json"], "is not a directory"),
])
def test_bad_flags_are_refused_before_any_request(prompts, capsys, argv, words):
    assert main(["validate", MODEL, *argv, "--prompts", str(prompts)]) == 2
    assert words in _error(capsys)


def test_mismatched_vocabulary_is_refused(prompts, capsys):
    meta = {"data": [{"id": "other.gguf", "meta": {"n_vocab": 512, "n_embd": 256}}]}
    with fake_server({"/v1/models": (200, json.dumps(meta).encode())}) as url:
        assert main(["validate", MODEL, "--server", url, "--prompts", str(prompts)]) == 2
    err = _error(capsys)
    assert "serves other.gguf that cannot be MODEL builtin:kjv" in err and "n_vocab 512 (MODEL: 2048)" in err


def _completion(tokens, draft=None):
    def answer(body):
        assert body["prompt"] == PROMPT and body["temperature"] == 0 and body["n_probs"] == 5
        assert body.get("speculative.n_max") == draft or draft == "any"
        out = {"tokens": tokens[: body["n_predict"]], "content": "x", "stop": True,
               "timings": {"draft_n": 4, "draft_n_accepted": 3}}
        return 200, json.dumps(out).encode()
    return answer


def test_identical_and_wrong_answers_in_one_table(prompts, greedy, tmp_path, capsys):
    wrong = [greedy[0], 2047] + greedy[2:]  # a token the oracle does not pick at step 1
    # no --api: each fake answers /props with llama-server's shape, so both are driven through /completion
    with fake_server({"/props": LLAMA_PROPS, "/completion": _completion(greedy, "any")}) as good, \
            fake_server({"/props": LLAMA_PROPS, "/completion": _completion(wrong, "any")}) as bad:
        report = tmp_path / "sub" / "report.json"
        rc = main(["validate", MODEL, "--server", good, "--server", bad, "--prompts", str(prompts), "-n", "6", "--emulate",
                   "--draft", "1,3", "--report", str(report)])
        out = capsys.readouterr().out
    assert rc == 1
    lines = out.splitlines()
    assert lines[-1] == "result: 4 answers: 2 identical, 0 near-tie, 2 wrong; probs outside bound: 0 → exit 1"
    header = next(line for line in lines if line.startswith("prompt"))
    assert header.split("  ")[0] == "prompt" and "A draft 1" in header and "B draft 3" in header
    row = lines[lines.index(header) + 1]
    assert row.count("identical, drafts 3/4") == 2 and row.count("wrong (step 1), drafts 3/4") == 2
    doc = json.loads(report.read_text())
    assert doc["exit_code"] == 1 and [r["verdict"] for r in doc["results"]] == ["identical"] * 2 + ["wrong"] * 2
    assert [r["draft"] for r in doc["results"]] == [1, 3, 1, 3] and doc["results"][2]["tokens"] == wrong
    assert doc["results"][0]["audit"]["verdict"] == "clean" and doc["servers"][0]["checked"] == []
    assert [s["api"] for s in doc["servers"]] == ["llama", "llama"] and not doc["servers"][0]["identity_checked"]
    assert "A: " + good + "/completion (kjv.gguf; identity not checked" in out
    assert list(report.parent.iterdir()) == [report]  # the temporary file was renamed


# ---- OpenAI-compatible servers (vLLM's shapes, made from llama-server's recorded /v1 answer) ----------------


def _vllm_answer(ids_as="token_id", token_ids=False):
    """V1C in vLLM's legacy completion shape (CompletionLogProbs): tokens "token_id:N" (return_tokens_as_token_ids),
    or text when ``ids_as`` is "text"; ``token_ids``: choices[0].token_ids (return_token_ids)."""
    content = V1C["choices"][0]["logprobs"]["content"]
    name = (lambda e: f"token_id:{e['id']}") if ids_as == "token_id" else (lambda e: e["token"])
    lp = {"text_offset": list(range(len(content))), "tokens": [name(e) for e in content],
          "token_logprobs": [e["logprob"] for e in content],
          "top_logprobs": [{name(t): t["logprob"] for t in e["top_logprobs"]} for e in content]}
    choice = {"index": 0, "text": V1C["choices"][0]["text"], "logprobs": lp, "finish_reason": "length", "stop_reason": None}
    if token_ids:
        choice["token_ids"] = [e["id"] for e in content]
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "kjv", "choices": [choice],
            "usage": {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}}


VLLM_MODELS = {"object": "list", "data": [{"id": "kjv", "object": "model", "owned_by": "vllm", "root": "/models/kjv",
                                           "max_model_len": 256}]}


def _vllm_routes(answer, seen, tokenize=True):
    def completions(body):
        seen.append(body)
        return 200, json.dumps(answer).encode()

    routes = {"/v1/models": (200, json.dumps(VLLM_MODELS).encode()), "/v1/completions": completions}
    if tokenize:  # vLLM's TokenizeResponse: count, max_model_len, tokens, token_strs
        probe = [1063, 356, 473, 289, 600, 44, 32, 49, 50, 676, 32, 302, 278, 266, 58, 417, 577, 111, 1171, 33]
        routes["/tokenize"] = (200, json.dumps({"count": 20, "max_model_len": 256, "tokens": probe, "token_strs": None}).encode())
    return routes


def test_vllm_token_id_answers_are_audited(prompts, tmp_path, capsys):
    seen = []
    with fake_server(_vllm_routes(_vllm_answer(), seen)) as url:
        report = tmp_path / "r.json"
        rc = main(["validate", MODEL, "--server", url, "--prompts", str(prompts), "-n", "8", "--emulate", "--report", str(report)])
        out = capsys.readouterr().out
    assert rc == 0, out
    assert f"A: {url}/v1/completions (kjv; agrees with MODEL on tokenization of a probe; max_model_len 256, not compared)" in out
    assert out.splitlines()[-1] == "result: 1 answer: 1 identical, 0 near-tie, 0 wrong; probs outside bound: 0 → exit 0"
    body = seen[0]  # no /props: --api auto chose the OpenAI API
    assert body["model"] == "kjv" and body["prompt"] == PROMPT and body["max_tokens"] == 8 and body["temperature"] == 0
    assert body["logprobs"] == 5 and body["return_tokens_as_token_ids"] is True and body["return_token_ids"] is True
    assert "n_probs" not in body and "speculative.n_max" not in body
    doc = json.loads(report.read_text())
    assert doc["servers"][0]["api"] == "openai" and doc["servers"][0]["max_model_len"] == 256
    probs = doc["results"][0]["audit"]["probs"]["A"]
    assert probs["verdict"] == "within bound" and probs["n_compared"] == 8 and probs["n_top_compared"] == 24


def test_vllm_token_ids_without_tokenizer_say_identity_not_checked(prompts, capsys):
    seen = []
    with fake_server(_vllm_routes(_vllm_answer("text", token_ids=True), seen, tokenize=False)) as url:
        rc = main(["validate", MODEL, "--server", url, "--prompts", str(prompts), "-n", "8", "--emulate"])
        out = capsys.readouterr().out
    assert rc == 0, out
    assert "identity not checked: it exposes nothing to compare with MODEL; its answers are judged all the same" in out
    assert "1 identical" in out.splitlines()[-1]


def test_vllm_answer_without_ids_is_refused_in_one_line(prompts, capsys):
    with fake_server(_vllm_routes(_vllm_answer("text"), [])) as url:
        assert main(["validate", MODEL, "--server", url, "--prompts", str(prompts), "-n", "8"]) == 2
    err = _error(capsys)
    assert "/v1/completions (prompt 1): the server gave its tokens as text, without ids" in err
    assert "start vLLM with --return-tokens-as-token-ids" in err
    answer = _vllm_answer("text")
    answer["choices"][0]["logprobs"] = None
    with fake_server(_vllm_routes(answer, [])) as url:
        assert main(["validate", MODEL, "--server", url, "--prompts", str(prompts), "-n", "8"]) == 2
    assert "neither log-probs nor token ids" in _error(capsys)


def test_openai_server_refuses_draft_and_picks_the_served_model(prompts, capsys):
    two = {"object": "list", "data": [{"id": "kjv"}, {"id": "kjv-lora"}]}
    seen = []
    routes = {**_vllm_routes(_vllm_answer(), seen, tokenize=False), "/v1/models": (200, json.dumps(two).encode())}
    with fake_server(routes) as url:
        assert main(["validate", MODEL, "--server", url, "--prompts", str(prompts), "--draft", "1", "--served-model", "kjv"]) == 2
        assert "is not a llama-server" in _error(capsys)  # detected, not told: refused before any prompt
        assert main(["validate", MODEL, "--server", url, "--prompts", str(prompts)]) == 2
        assert "serves 2 models; name the one to validate with --served-model NAME" in _error(capsys)
        assert main(["validate", MODEL, "--server", url, "--prompts", str(prompts), "--served-model", "other"]) == 2
        assert "--served-model other: " + url + "/v1/models does not list it (it lists: kjv, kjv-lora)" in _error(capsys)
        assert main(["validate", MODEL, "--server", url, "--prompts", str(prompts), "--served-model", "kjv-lora", "-n", "8"]) == 0
    assert seen and all(b["model"] == "kjv-lora" for b in seen)


@pytest.mark.parametrize("answer, words", [
    ((200, b"<html>oops</html>"), "/v1/completions (prompt 1): malformed response, not a completion response"),
    ((404, b"{}"), "/v1/completions: the server answered HTTP 404"),
    ((200, b'{"choices": [{"text": "x", "logprobs": {"tokens": ["token_id:x"]}}]}'), "is not 'token_id:N'"),
])
def test_openai_bad_answers_are_one_line(prompts, capsys, answer, words):
    with fake_server({"/v1/completions": answer}) as url:
        assert main(["validate", MODEL, "--server", url, "--prompts", str(prompts), "--api", "openai"]) == 2
    assert words in _error(capsys)
