"""A phone's draft-N flip, predicted by ``--emulate=ggml:arm64-dotprod`` and called ``reproduced`` (issue 39, item 4).

On ``builtin:kjv`` (Q8_0, llama.cpp's defaults: CPU_REPACK, F16 K/V, flash attention on) the AArch64 dotprod build
multiplies a Q8_0 weight by its 4x4 gemv for each row of a 1+1 verify batch and by its 4x4 gemm for the four rows of a
1+3 verify batch, and those round differently (the gemv fused, the gemm a separate multiply and add: docs/numerics.md,
"AArch64"). On x86 (AVX-512, AVX2) and on the i8mm build both shapes give the decode's bits. A search over 40-token
windows of tests/data/kjv-genesis-20.txt with refimpl's predictions alone (``speculative_generate`` at draft 1 and 3
under each path's ``Ctx``) found the window at token 315 ("… and said unto him, What hast thou done unto us? and
what"): on arm64-dotprod draft-1 says " a" where draft-3 says " this" at step 13 (a margin of 0.01 % of max|logit|);
on avx512, avx2 and arm64-i8mm both say " this". Then llama.cpp's own draft-mtp loops ran on the cross-built
``arm64-dotprod-gcc`` library under qemu (tests/llama_spec.py, defaults, 4 threads), and their streams are
tests/data/arm64-flip/llama-arm64-dotprod-draft{1,3}.json — the flip as predicted, token for token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refimpl.cli import main
from refimpl.fixtures.builtin import TRAINED_PATH

DATA = Path(__file__).parent / "data" / "arm64-flip"
D1, D3 = DATA / "llama-arm64-dotprod-draft1.json", DATA / "llama-arm64-dotprod-draft3.json"
STEP = 13  # the first difference of the two streams


def audit(capsys, path: str) -> tuple[int, str]:
    code = main(["audit", str(D1), str(D3), f"--emulate=ggml:{path}", "--draft", "1,3", "--threads", "4"])
    return code, capsys.readouterr().out


def test_the_recorded_streams_flip():
    d1, d3 = (json.loads(p.read_text())["tokens"] for p in (D1, D3))
    assert d1[:STEP] == d3[:STEP] and (d1[STEP], d3[STEP]) == (259, 442)


def test_the_flip_is_reproduced_on_the_phones_path(capsys):
    """``--emulate=ggml:arm64-dotprod``: both streams are llama.cpp's predicted ones, the flip is reproduced (exit 0)."""
    code, out = audit(capsys, "arm64-dotprod")
    assert "first divergence at step 13" in out
    assert "reproduced: llama.cpp computes A's token by its 1+1 verify, B's by its 1+3 verify" in out
    assert "identical to llama.cpp's predicted draft-1 stream" in out and "identical to llama.cpp's predicted draft-3 stream" in out
    assert code == 0


@pytest.mark.parametrize("path", ["avx512", "arm64-i8mm"])
def test_other_builds_do_not_make_it(capsys, path):
    """The x86 path and the i8mm phone compute " this" at step 13 in both loops: the draft-1 stream is not theirs."""
    code, out = audit(capsys, path)
    assert f"not reproduced: A differs from llama.cpp's predicted draft-1 stream at step {STEP}" in out
    assert code == 1


@pytest.mark.deep
@pytest.mark.parametrize("n_draft,recorded", [(1, D1), (3, D3)])
def test_llama_cpp_on_the_phone_makes_the_recorded_streams(n_draft, recorded, monkeypatch):
    """The recorded streams are llama.cpp's own, rerun on the cross-built dotprod library under qemu."""
    import arm64
    from llama_spec import llama_speculative

    arm64.require("arm64-dotprod-gcc")
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(arm64.lib_dir("arm64-dotprod-gcc")))
    data = json.loads(recorded.read_text())
    run = llama_speculative(TRAINED_PATH, data["prompt_tokens"], len(data["tokens"]), n_draft=n_draft, defaults=True,
                            n_threads=4)
    assert run.tokens == data["tokens"]
