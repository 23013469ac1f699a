"""``--emulate=ggml:NAME``: a ggml-cpu path named instead of detected (kernels.ggml.build.NAMED_PATHS).

* Each named path computes what the library that takes it computes, bit for bit: ``refimpl logits
  --emulate=ggml:KEY`` equals ``refimpl logits --emulate=ggml`` run on that library (the suite's builds, chosen with
  ``LLAMA_CPP_LIB_PATH`` as tests/test_ggml_paths_cli.py does) — and a library of *another* path in
  ``LLAMA_CPP_LIB_PATH`` is not read.
* It needs no llama-cpp-python: in a process where ``import llama_cpp`` fails and ``LLAMA_CPP_LIB_PATH`` is unset,
  a named path computes the same logits, and plain ``--emulate=ggml`` is refused in one line naming the named paths.
* The AArch64 paths too (``ggml:arm64-dotprod`` …: a phone's build recomputed on an x86 host); an op not emulated
  on a path is a one-line error (``kernels.ggml.build.NotEmulated``).
* An unknown name, and ``--ggml-version-ok`` with a named path, are one-line errors (exit 2); the stderr line, the
  golden header (and its regenerate command) and the audit report record that the path was named.

Cost: 13 s for the module once the ggml kernels are compiled (AMD EPYC, Zen 4 class, AVX-512, 2 shared vCPUs,
2026-12-04), 8 s of it the golden make/check and audit of the last test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from test_ggml_paths_cli import library_for, not_yet, prompt

from kernels.ggml.build import (EMULATED_PATHS, GGML_VERSION, NAMED_PATHS, NotEmulated, describe_named, is_arm64,
                                not_emulated)
from refimpl.cli import main
from refimpl.fixtures.builtin import TRAINED_PATH

pytestmark = pytest.mark.oracle

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _logits(tmp_path, capsys, emulate: str, name: str) -> tuple[np.ndarray, str]:
    out = tmp_path / f"{name}.npy"
    rc = main(["logits", str(TRAINED_PATH), f"--emulate={emulate}", "--threads", "1",
               "--tokens", ",".join(map(str, prompt())), "--out", str(out)])
    err = capsys.readouterr().err
    if rc == 2 and "not emulated" in err:
        raise NotEmulated(err.strip())  # said in one line: not_yet's xfail for an ARM path
    assert rc == 0, err[-2000:]
    return np.load(out), err


@pytest.mark.parametrize("key", [p.key for p in EMULATED_PATHS])
def test_named_path_equals_the_detected_library(key, tmp_path, monkeypatch, capsys):
    """Also each AArch64 path against its GCC build (read, not run: both sides compute here); the SVE build is not
    detected on this x86 host (its vector length is the CPU's), its refusal names the named path. An ARM op not
    emulated yet: xfail naming it."""
    entry = next(p for p in EMULATED_PATHS if p.key == key)
    build = library_for(key)
    other = next((library_for(p.key) for p in EMULATED_PATHS if p.key != key and p.key != "avx512"), build)
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(build.lib_dir))  # (x86 libraries found first: llama_cpp loads one)
    if build.has("sve"):
        assert main(["logits", str(TRAINED_PATH), "--emulate=ggml", "--tokens", "1,2", "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "read at run time" in err and f"--emulate=ggml:{key}" in err, err
        return
    try:
        detected, err = _logits(tmp_path, capsys, "ggml", "detected")
    except (ValueError, KeyError, AssertionError) as e:  # an ARM kernel still being written
        if not is_arm64(key):
            raise
        not_yet(key, e)
    assert f"emulating ggml-cpu {entry.name} (" in err and "(named, not detected)" not in err

    # the named path, with a library of another path in LLAMA_CPP_LIB_PATH: that library is not read
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(other.lib_dir))
    named, err = _logits(tmp_path, capsys, f"ggml:{key}", "named")
    assert f"emulating {describe_named(key)}\n" in err and describe_named(key).startswith(
        f"ggml-cpu {entry.name} (named, not detected") and describe_named(key).endswith(f"ggml {GGML_VERSION}'s kernels")
    assert np.array_equal(named.view(np.uint32), detected.view(np.uint32))


def _without_llama_cpp(*argv) -> subprocess.CompletedProcess:
    """``refimpl ARGV`` in a process where ``import llama_cpp`` fails and LLAMA_CPP_LIB_PATH is unset."""
    code = "import sys; sys.modules['llama_cpp'] = None; from refimpl.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


def test_named_path_needs_no_llama_cpp_python(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(library_for("avx2").lib_dir))
    want, _ = _logits(tmp_path, capsys, "ggml", "detected")
    ids = ",".join(map(str, prompt()))
    out = tmp_path / "named.npy"
    p = _without_llama_cpp("logits", str(TRAINED_PATH), "--emulate=ggml:avx2", "--threads", "1", "--tokens", ids,
                           "--out", str(out))
    assert p.returncode == 0, p.stderr[-2000:]
    assert np.array_equal(np.load(out).view(np.uint32), want.view(np.uint32))

    p = _without_llama_cpp("logits", str(TRAINED_PATH), "--emulate=ggml", "--tokens", ids, "--out", str(out))
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("refimpl: error: ") and "llama-cpp-python is not installed" in p.stderr
    assert all(f"--emulate={n}" in p.stderr for n in NAMED_PATHS), p.stderr


@pytest.mark.parametrize("argv, says", [
    (["--emulate=ggml:avx3"], "unknown ggml-cpu path 'avx3': the named paths are ggml:avx512 (AVX-512), ggml:avx2 (AVX2), "
                              "ggml:avx2-zen (AVX2 (tuned for AMD Zen)), ggml:generic (generic x86)"),
    (["--emulate", "ggml:neon"], "unknown ggml-cpu path 'neon'"),  # taken as --emulate's value, not as MODEL
    (["--emulate=ggml:avx2", "--ggml-version-ok"], f"--ggml-version-ok accepts a loaded libggml of another ggml version; "
                                                   f"--emulate=ggml:avx2 loads none (it follows ggml {GGML_VERSION}'s kernels)"),
    (["--emulate=ggml:generic", "--kernel", "numpy"], "--kernel numpy, the plain definitions, does not apply"),
])
def test_bad_named_paths_are_one_line_errors(argv, says, capsys):
    assert main(["run", str(TRAINED_PATH), *argv, "--tokens", "1,2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("refimpl: error: ") and says in err, err


def test_an_op_not_emulated_on_the_path_is_one_line(monkeypatch, capsys):
    """An op met while computing whose ggml-cpu code on the path is not emulated (kernels.ggml.build.not_emulated):
    ``refimpl: error: --emulate=ggml: …`` and exit 2, as a refused library, no traceback."""
    import refimpl.graph.trunk

    def forward(*args, **kwargs):
        raise not_emulated("ggml_rope_multi", "arm64-base")

    monkeypatch.setattr(refimpl.graph.trunk, "forward", forward)
    assert main(["run", str(TRAINED_PATH), "--emulate=ggml:arm64-base", "--tokens", "1,2", "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert err == ("refimpl: error: --emulate=ggml: ggml_rope_multi on ggml-cpu's AArch64 NEON path (arm64-base) is "
                   "not emulated\n"), err


def test_reports_record_a_named_path(tmp_path, monkeypatch, capsys):
    """golden make records the named path (header, numerics, regenerate command) and golden check recomputes it;
    audit's report says the path was named."""
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"tokens": prompt()}) + "\n")
    golden = tmp_path / "g.golden.jsonl"
    flags = ["--emulate=ggml:generic", "--threads", "1", "--ubatch-size", "8"]
    assert main(["golden", "make", str(TRAINED_PATH), "--prompts", str(prompts), *flags, "-n", "4", "--out", str(golden)]) == 0
    header, record = (json.loads(x) for x in golden.read_text().splitlines()[:2])
    s = header["settings"]
    assert s["ggml"]["path"] == "generic" and s["ggml"]["named"] is True
    assert s["numerics"].startswith("ggml-cpu generic x86 (named, not detected) bit for bit")
    assert "--emulate=ggml:generic" in header["regenerate"]
    assert main(["golden", "check", str(golden), str(TRAINED_PATH)]) == 0
    capsys.readouterr()

    stream = tmp_path / "stream.json"
    stream.write_text(json.dumps({"prompt_tokens": prompt(), "tokens": record["ids"]}))
    assert main(["audit", str(TRAINED_PATH), str(stream), *flags, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "clean" and "(named, not detected)" in report["numerics"], report
