"""The real llama-server (built from llama-cpp-python 0.3.36's vendored llama.cpp, conftest.require_llama_tool)
on 127.0.0.1 with the built-in model: a greedy /completion with n_probs, saved and audited by refimpl —
the same ids, and log-probs within the documented bound (refimpl.oracle.probs)."""

import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from conftest import require_llama_tool

from refimpl.cli import main

MODEL = Path(__file__).resolve().parent.parent / "refimpl" / "models" / "kjv-q8_0.gguf"
PROMPT = [1063, 356, 473, 289, 600]  # "And it came to pass"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: dict, timeout: float) -> bytes:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def test_llama_server_completion_audits_clean(tmp_path, capsys):
    server = require_llama_tool("llama-server")
    port = _free_port()
    # --no-repack: the batched AMX kernel dies with SIGILL on the CI guests (tests/llama_tools.py, docs/numerics.md)
    proc = subprocess.Popen([str(server), "-m", str(MODEL), "--host", "127.0.0.1", "--port", str(port), "-t", "2",
                             "--no-repack", "-np", "1", "-c", "512"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    try:
        while True:
            assert proc.poll() is None, f"llama-server exited with {proc.returncode}"
            assert time.monotonic() < deadline, "llama-server not ready within 60 s"
            try:
                if json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()).get("status") == "ok":
                    break
            except OSError:
                time.sleep(0.2)
        body = {"prompt": PROMPT, "n_predict": 32, "n_probs": 5, "temperature": 0, "return_tokens": True, "cache_prompt": False}
        whole = _post(port, body, max(1.0, deadline - time.monotonic()))
        streamed = _post(port, {**body, "stream": True}, max(1.0, deadline - time.monotonic()))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    (tmp_path / "r.json").write_bytes(whole)
    (tmp_path / "r.sse").write_bytes(streamed)
    ids = json.loads(whole)["tokens"]
    assert len(ids) == 32

    assert main(["audit", str(tmp_path / "r.json"), str(tmp_path / "r.sse"), "--emulate", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["verdict"] == "identical" and rep["prompt_tokens"] == PROMPT  # the prompt: the response's echo, tokenized
    assert main(["audit", str(tmp_path / "r.json"), "--emulate", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["verdict"] == "clean" and rep["streams"][0]["n_tokens"] == 32
    probs = rep["probs"]["A"]
    assert probs["verdict"] == "within bound" and probs["n_compared"] == 32 and probs["n_top_compared"] == 32 * 5
    assert probs["max_rel_dlogp"] <= probs["bound"] == 0.10
    assert probs["missing_steps"] == [] and probs["zero_steps"] == []
