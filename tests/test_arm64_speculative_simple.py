"""llama.cpp's own draft-mtp loop as a user runs it on the phone: the cross-built ``llama-speculative-simple`` binary
(examples/speculative-simple, ``--spec-type draft-mtp``) on the AArch64 i8mm build under qemu, against
``refimpl run --mtp --draft N --emulate=ggml:arm64-i8mm`` on this x86 host.

The binary is built by ``.ci/build-llama-arm64`` into ``$LLAMA_TOOLS_DIR/arm64-i8mm-gcc/spec/bin`` with its own
libllama / libggml (the same flags as the i8mm build's) beside it. It samples greedily (``--temp 0``), drafts with
llama.cpp's defaults (n_max N, n_min 0, p_min 0) and runs llama.cpp's defaults (F16 K/V, flash attention) on one
thread (tests/test_ggml_e2e.py's N_THREADS). It prints the prompt and the generated text on stdout.

Its budget is not refimpl's near the end (speculative-simple drafts a full round when fewer tokens remain, and may
generate past ``-n``: docs/speculative.md), so the last rounds' verify batches may be shaped differently; the text
of every token before that — each computed by a verify batch of the same shape on both sides — is compared.

On builtin:kjv every path writes that text (refimpl plain and the x86 emulation too): the bits of each round are
compared by tests/test_ggml_e2e_arm64.py, whose llama.cpp loop is tests/llama_spec.py. What this test adds is the
binary itself — llama.cpp's argument parsing, sampler, speculative module and loop as built for the phone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from arm64 import ARM_SLOWDOWN, QEMU_CPU, lib_dir, require, sysroot, tools_root
from refimpl.fixtures.builtin import TRAINED_PATH
from test_ggml_e2e import N_THREADS

BUILD = "arm64-i8mm-gcc"
PROMPT = "And God said, Let there be light"
N_PREDICT = 24
#: the tokens at the end whose rounds speculative-simple budgets otherwise (module docstring)
TAIL = 4


def binary():
    return tools_root() / BUILD / "spec" / "bin" / "llama-speculative-simple"


def speculative_simple(n_draft: int, prompt: str = PROMPT, build: str = BUILD) -> tuple[str, str]:
    """(stdout, stderr) of the binary under qemu on ``build``'s CPU model with ``build``'s libggml-cpu: the binary's own
    (the i8mm build's) or, for another build, that build's libraries ahead of its RUNPATH (``LD_LIBRARY_PATH``: only
    libggml-cpu is compiled for a -march; libllama, libggml and llama-common are the same code in every build)."""
    require(BUILD)
    require(build)
    if not binary().exists():  # pragma: no cover - depends on the machine
        why = f"{binary()} is missing: build it with .ci/build-llama-arm64"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (required under CI=true)")
        pytest.skip(why)
    argv = ["qemu-aarch64", "-L", str(sysroot()), "-cpu", QEMU_CPU[build], str(binary()), "-m", str(TRAINED_PATH),
            "-p", prompt, "-n", str(N_PREDICT), "--spec-type", "draft-mtp", "--spec-draft-n-max", str(n_draft),
            "--spec-draft-n-min", "0", "--temp", "0", "-t", str(N_THREADS), "-tb", str(N_THREADS), "-c", "256"]
    env = dict(os.environ, LD_LIBRARY_PATH=str(lib_dir(build))) if build != BUILD else None
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60 * ARM_SLOWDOWN, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout, run.stderr


def refimpl_run(n_draft: int) -> dict:
    argv = [sys.executable, "-m", "refimpl", "run", str(TRAINED_PATH), "-p", PROMPT, "-n", str(N_PREDICT), "--mtp",
            "--draft", str(n_draft), "--emulate=ggml:arm64-i8mm", "--threads", str(N_THREADS), "--json"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.mark.oracle
@pytest.mark.parametrize("n_draft", [pytest.param(1, marks=pytest.mark.deep), 3])
def test_speculative_simple_binary_writes_refimpls_text(n_draft):
    """The binary's text is refimpl's, token for token up to the last rounds, and its MTP head drafted and had drafts
    accepted (its own counters, on stderr)."""
    import re

    from refimpl.tokenizer.vocab import Tokenizer

    out, err = speculative_simple(n_draft)
    ours = refimpl_run(n_draft)
    tok = Tokenizer.from_gguf(TRAINED_PATH)
    prompt_text = tok.decode(ours["prompt_tokens"])
    assert out.lstrip("\n").startswith(prompt_text), (out[:200], prompt_text)
    theirs = out.lstrip("\n")[len(prompt_text):]
    assert len(ours["tokens"]) == N_PREDICT
    want = tok.decode(ours["tokens"][:N_PREDICT - TAIL])
    assert theirs.startswith(want), f"speculative-simple wrote {theirs!r}, refimpl {ours['text']!r}"
    counts = {k: int(v) for k, v in re.findall(r"\b(n_predict|n_drafted|n_accept) += (\d+)", err)}
    assert counts.keys() == {"n_predict", "n_drafted", "n_accept"}, err[-2000:]
    assert counts["n_predict"] >= N_PREDICT and 0 < counts["n_accept"] <= counts["n_drafted"], counts


def test_the_phones_binary_makes_the_predicted_flip():
    """The flip of tests/test_audit_reproduce_arm64.py made by the binary a user runs: on the dotprod build the
    draft-1 and draft-3 texts of the window at token 315 part at step 13 (" a" / " this"), each the recorded stream
    that ``refimpl audit --emulate=ggml:arm64-dotprod`` calls llama.cpp's predicted one (up to the last rounds:
    module docstring). The streams were recorded at 4 threads; the dotprod build's Q8_0 kernels split rows, not sums,
    between threads, and 1 thread gives them too (4 spinning threads crawl under qemu on 2 cores)."""
    from refimpl.tokenizer.vocab import Tokenizer
    from test_audit_reproduce_arm64 import D1, D3, STEP

    tok = Tokenizer.from_gguf(TRAINED_PATH)
    recorded = {n: json.loads(path.read_text()) for n, path in ((1, D1), (3, D3))}
    prompt = tok.decode(recorded[1]["prompt_tokens"])
    assert tok.encode(prompt) == recorded[1]["prompt_tokens"] == recorded[3]["prompt_tokens"]
    texts = {}
    for n in (1, 3):
        out, _ = speculative_simple(n, prompt, "arm64-dotprod-gcc")
        assert out.lstrip("\n").startswith(prompt), out[:200]
        texts[n] = out.lstrip("\n")[len(prompt):]
        assert texts[n].startswith(tok.decode(recorded[n]["tokens"][:N_PREDICT - TAIL])), (n, texts[n])
    before = tok.decode(recorded[1]["tokens"][:STEP])
    assert texts[1][len(before):].startswith(" a ") and texts[3][len(before):].startswith(" this ")
