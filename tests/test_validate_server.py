"""``refimpl validate`` against the real llama-server (conftest.require_llama_tool) on 127.0.0.1: the built-in
model served plain and with MTP drafting (``--spec-type draft-mtp --spec-draft-n-max 3``, when this build has
it) → every answer identical or a near-tie, the drafts counted, exit 0; the plain server driven through its
OpenAI-compatible ``/v1/completions`` (``--api openai``) → the same, exit 0; a server with another model file
(builtin:tiny) → refused as a model mismatch, exit 2; a server with a copy of the built-in model whose layer-0
attention norm is scaled ×3 (same vocabulary, shape and tokenizer: the identity check passes) → wrong, exit 1.
The four servers start together; 15–50 s in all on 2 shared vCPUs (the oracle's audits, with --emulate, dominate)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from conftest import require_llama_tool

from refimpl.cli import main

KJV = Path(__file__).resolve().parent.parent / "refimpl" / "models" / "kjv-q8_0.gguf"
READY_S = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_servers(server: Path, configs: list[list[str]]):
    """One llama-server per argument list on free 127.0.0.1 ports, ready (/health ok) within READY_S seconds;
    their URLs. Always stopped (terminate, then kill)."""
    procs, urls = [], []
    try:
        for extra in configs:
            port = _free_port()
            # --no-repack: the batched AMX kernel dies with SIGILL on the CI guests (tests/llama_tools.py)
            procs.append(subprocess.Popen([str(server), *extra, "--host", "127.0.0.1", "--port", str(port), "-t", "2",
                                           "--no-repack", "-np", "1", "-c", "512"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + READY_S
        for proc, url in zip(procs, urls):
            while True:
                assert proc.poll() is None, f"llama-server {proc.args} exited with {proc.returncode}"
                assert time.monotonic() < deadline, f"llama-server not ready within {READY_S} s"
                try:
                    if json.loads(urllib.request.urlopen(f"{url}/health", timeout=2).read()).get("status") == "ok":
                        break
                except OSError:
                    time.sleep(0.2)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def perturbed_kjv(path: Path) -> Path:
    """A copy of the built-in model with ``blk.0.attn_norm.weight`` × 3 (one layer's RMSNorm gain off): the
    metadata, vocabulary and tokenizer are the original's, the greedy streams are not (the oracle calls tokens
    of it wrong within the first steps of each test prompt)."""
    import shutil

    import gguf

    shutil.copyfile(KJV, path)
    reader = gguf.GGUFReader(path, "r+")
    norm = next(t for t in reader.tensors if t.name == "blk.0.attn_norm.weight")
    norm.data[:] *= 3
    reader.data.flush()
    del reader, norm
    return path


def test_validate_real_llama_servers(tmp_path, capsys):
    from refimpl.fixtures.builtin import resolve_model

    server = require_llama_tool("llama-server")
    helptext = subprocess.run([str(server), "--help"], capture_output=True, text=True, timeout=30).stdout
    mtp = "draft-mtp" in helptext and "--spec-draft-n-max" in helptext
    tiny = resolve_model("builtin:tiny")
    perturbed = perturbed_kjv(tmp_path / "kjv-norm0x3.gguf")
    configs = [["-m", str(KJV)], ["-m", str(tiny)], ["-m", str(perturbed)]] + \
        ([["-m", str(KJV), "--spec-type", "draft-mtp", "--spec-draft-n-max", "3"]] if mtp else [])
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("And it came to pass\nIn the beginning\nBlessed is the man\n")
    report = tmp_path / "report.json"
    with llama_servers(server, configs) as urls:
        plain, other, wrong, drafted = urls[0], urls[1], urls[2], urls[3:]
        rc = main(["validate", "builtin:kjv", "--server", plain, *(w for u in drafted for w in ("--server", u)),
                   "--prompts", str(prompts), "-n", "24", "--emulate", "--report", str(report), "--timeout", "30"])
        out = capsys.readouterr().out
        assert rc == 0, out
        rc_other = main(["validate", "builtin:kjv", "--server", other, "--prompts", str(prompts), "--timeout", "30"])
        err = capsys.readouterr().err
        rc_openai = main(["validate", "builtin:kjv", "--server", plain, "--api", "openai", "--prompts", str(prompts), "-n", "24",
                          "--emulate", "--timeout", "30"])
        out_openai = capsys.readouterr().out
        rc_wrong = main(["validate", "builtin:kjv", "--server", wrong, "--prompts", str(prompts), "-n", "12", "--emulate",
                         "--timeout", "30"])
        out_wrong = capsys.readouterr().out
    assert rc_openai == 0, out_openai
    assert f"A: {plain}/v1/completions (" in out_openai
    assert "agrees with MODEL on n_vocab, n_embd, n_ctx_train, tokenization" in out_openai
    assert out_openai.splitlines()[-1].startswith("result: 3 answers: ") and "probs outside bound: 0 → exit 0" in out_openai
    assert rc_wrong == 1, out_wrong
    assert f"A: {wrong}/completion ({perturbed}; agrees with MODEL on n_vocab, n_embd, n_ctx_train, tokenization" in out_wrong
    assert ", 3 wrong; " in out_wrong.splitlines()[-1] and out_wrong.endswith("→ exit 1\n"), out_wrong
    assert rc_other == 2 and "cannot be MODEL builtin:kjv" in err and "n_vocab 512 (MODEL: 2048)" in err, err
    doc = json.loads(report.read_text())
    assert doc["exit_code"] == 0 and len(doc["results"]) == 3 * (1 + len(drafted))
    assert {r["verdict"] for r in doc["results"]} <= {"identical", "near-tie"}
    assert all(len(r["tokens"]) == 24 for r in doc["results"])
    for s in doc["servers"]:
        assert s["checked"] == ["n_vocab", "n_embd", "n_ctx_train", "tokenization of a probe"] and s["api"] == "llama"
    plain_rows = [r for r in doc["results"] if r["server"] == plain]
    assert all(r["draft_n"] is None and r["audit"]["probs"]["A"]["verdict"] == "within bound" for r in plain_rows)
    if drafted:
        rows = [r for r in doc["results"] if r["server"] == drafted[0]]
        assert all(r["draft_n"] > 0 and 0 <= r["draft_n_accepted"] <= r["draft_n"] for r in rows)
        assert "drafts " in out and " (oracle " in out
        # the oracle's own draft-MTP loop (n_max 3, as the server was started) beside the server's counts: the same
        # model and loop accept about as much (exact counts may differ where a near-tie draft flips)
        for r in rows:
            assert r["oracle_draft_n"] > 0 and 0 <= r["oracle_draft_n_accepted"] <= r["oracle_draft_n"]
            assert abs(r["oracle_draft_n_accepted"] - r["draft_n_accepted"]) <= 3, r
        assert all(r["oracle_draft_n"] is None for r in plain_rows)
    assert out.splitlines()[-1].endswith("→ exit 0")
