"""Every command on every emulated path: ``refimpl run``, ``logits``, ``audit``, ``golden make`` (and ``golden
check``) and ``validate`` with ``--emulate=ggml``, once per entry of ``kernels.ggml.build.EMULATED_PATHS`` — the one
table of the paths —, each on the library the suite builds that takes that path (tests/ggml_graph.py: the
native one, llama-cpp-python's own ``lib/``; ``$LLAMA_TOOLS_DIR/ggml-avx2/lib``; ``…/ggml-generic/lib``), chosen with
``LLAMA_CPP_LIB_PATH`` as a user would. A new entry in the table is a new case here: without a library that takes
it, the case fails under ``CI=true`` (so does a missing library); without a command working on it, it fails.

Each command exits 0 and names the path and the ggml version it follows on stderr, and what it computes is that
library's: ``logits`` equals llama.cpp's logits on the same library bit for bit (tests/llama_trace.py), ``run``'s
greedy stream equals llama.cpp's (tests/llama_ref.py), ``audit`` finds that stream clean and predicts it with the
path in its report (so does ``audit --streams DIR``), the golden file records the path and holds the same stream, ``golden check`` recomputes it,
and ``validate`` judges a real llama-server (tests/test_validate_server.py) with the path in its report.

The AArch64 paths (``test_every_command_on_an_arm64_path``): each on its GCC build of ``.ci/build-llama-arm64``,
detected from ``LLAMA_CPP_LIB_PATH`` (the SVE one named: its vector length is the CPU's), ``logits``, ``run``,
``audit``, ``golden make``/``check``, llama.cpp's logits and stream computed under qemu (tests/llama_ref.py) —
no validate (no AArch64 llama-server). While the ARM kernels are being written, an op that is not emulated on a
path is an xfail naming it. ~10 s a path once the kernels are compiled (one llama.cpp child under qemu each).

Cost: 11 s for the module, 2–4 s per path (AMD EPYC, Zen 4 class, AVX-512, 2 shared vCPUs, 2026-12-04), once the
ggml kernels are compiled — their first compilation (~30 s a path) is shared with tests/test_ggml_e2e.py, which runs
first.
"""

from __future__ import annotations

import functools
import json
import os

import arm64
import numpy as np
import pytest
from conftest import require_llama_tool
from ggml_graph import X86_BUILDS, both_paths, build_info
from llama_ref import llama_run
from llama_trace import llama_trace

from kernels.ggml.build import EMULATED_PATHS, GGML_VERSION, NotEmulated, is_arm64
from refimpl.cli import main
from refimpl.fixtures.builtin import TRAINED_PATH

pytestmark = pytest.mark.oracle

TEXT = "In the beginning God created the heaven and the earth. And the earth was without form"
N_PROMPT, N_PREDICT = 8, 6
# llama_ref's context (one token per llama_decode, n_ubatch 8, 1 thread) as refimpl's flags: the same computation
LLAMA_REF = ["--threads", "1", "--ubatch-size", "8"]
X86_KEYS = [p.key for p in EMULATED_PATHS if not is_arm64(p.key)]
ARM_KEYS = [p.key for p in EMULATED_PATHS if is_arm64(p.key)]


@functools.cache
def prompt() -> list[int]:
    from refimpl.tokenizer import Tokenizer

    return Tokenizer.from_gguf(TRAINED_PATH).encode(TEXT)[:N_PROMPT]


def library_for(path: str):
    """The :class:`kernels.ggml.build.GgmlBuild` of the first library the suite builds that takes ``path`` (an
    AArch64 path: its build of .ci/build-llama-arm64, read at the vector length qemu runs it at). Every
    build is required (tests/ggml_graph.py's require_build: a failure under CI=true, a skip elsewhere); a path none
    of them takes fails, except AVX-512 on a host that cannot run an AVX-512 library (the native build is then AVX2)."""
    if is_arm64(path):
        build = next(b for b, (key, _, _) in arm64.BUILDS.items() if key == path)  # clang's: clang 14's build first
        return build_info(build)
    builds = [build_info(b) for b in X86_BUILDS]
    for b in builds:
        if b.path == path:
            return b
    if path == "avx512" and not both_paths():  # pragma: no cover - depends on the host
        pytest.skip("this host cannot run an AVX-512 libggml: the native build is an AVX2 one")
    pytest.fail(f"no library the suite builds takes the {path!r} path of kernels.ggml.build.EMULATED_PATHS "  # pragma: no cover
                f"(builds: {', '.join(f'{w} {b.path}' for w, b in zip(X86_BUILDS, builds))}): add one to "
                ".ci/build-llama-tools and tests/ggml_graph.py")


@pytest.fixture(scope="module")
def server_url():
    """A real llama-server (the native build of .ci/build-llama-tools) serving the built-in model."""
    from test_validate_server import KJV, llama_servers

    server = require_llama_tool("llama-server")
    with llama_servers(server, [["-m", str(KJV)]]) as urls:
        yield urls[0]


def said(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("emulating ")]


@pytest.mark.parametrize("key", X86_KEYS)
def test_every_command_on_the_path(key, server_url, tmp_path, monkeypatch, capsys):
    entry = next(p for p in EMULATED_PATHS if p.key == key)
    build = library_for(key)
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(build.lib_dir))
    line = f"emulating ggml-cpu {entry.name} ("
    version = f"ggml {GGML_VERSION} (commit {build.commit})"
    numerics = f"ggml-cpu {entry.name} bit for bit, ggml {GGML_VERSION}: "
    ids = ",".join(map(str, prompt()))
    import refimpl.model.trunk as trunk

    layouts, load_model = [], trunk.load_model  # what each command lays the weights out for: its kernels' layout
    monkeypatch.setattr(trunk, "load_model", lambda *a, **k: layouts.append(k.get("ggml")) or load_model(*a, **k))

    def command(*argv) -> tuple[str, str]:
        rc = main(list(argv))
        out, err = capsys.readouterr()
        assert rc == 0, f"refimpl {argv[0]} on the {key} path: exit {rc}\n{err[-2000:]}"
        names = said(err)
        assert len(names) == 1 and names[0].startswith(line) and names[0].endswith(f"from {build.lib_dir}, {version}"), err
        return out, err

    # logits: llama.cpp's own logits on this library (its defaults: F16 K/V, flash attention; the prompt as one batch)
    logits = tmp_path / "logits.npy"
    command("logits", str(TRAINED_PATH), "--emulate=ggml", "--threads", "1", "--tokens", ids, "--out", str(logits))
    want = llama_trace(TRAINED_PATH, prompt(), (), n_threads=1, n_batch=512, n_ubatch=512, type_k="f16", type_v="f16",
                       flash_attn="on")["logits"]
    got = np.load(logits)
    assert np.array_equal(got.view(np.uint32), np.ascontiguousarray(want, np.float32).reshape(got.shape).view(np.uint32))

    # run: llama.cpp's greedy stream on this library
    out, _ = command("run", str(TRAINED_PATH), "--emulate=ggml", *LLAMA_REF, "--tokens", ids, "-n", str(N_PREDICT), "--json")
    stream, out_run = json.loads(out), out
    theirs = llama_run(TRAINED_PATH, prompt(), n_generate=N_PREDICT, defaults=True, n_threads=1).tokens.tolist()
    assert stream["prompt_tokens"] + stream["tokens"] == theirs
    stream_file = tmp_path / "stream.json"
    stream_file.write_text(out)

    # audit: that stream, identical, and predicted (reproduced) by llama.cpp's own loop on this path
    out, _ = command("audit", str(TRAINED_PATH), str(stream_file), "--emulate=ggml", *LLAMA_REF, "--json")
    report = json.loads(out)
    assert report["verdict"] == "clean" and report["exit_code"] == 0, report
    assert report["numerics"].startswith(numerics) and "reproduce" in report
    pairs = tmp_path / "pairs"  # audit --streams DIR: the same stream as a pair's A, audited in the same emulation
    pairs.mkdir()
    (pairs / "p.A.json").write_text(out_run)
    out, _ = command("audit", str(TRAINED_PATH), "--streams", str(pairs), "--emulate=ggml", *LLAMA_REF, "--json")
    (pair,) = json.loads(out)["pairs"]
    assert pair["verdict"] == "clean" and pair["numerics"] == report["numerics"], pair

    # golden make: the path and its llama.cpp settings in the header, the same stream; golden check recomputes it
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"tokens": prompt()}) + "\n")
    golden = tmp_path / "g.golden.jsonl"
    command("golden", "make", str(TRAINED_PATH), "--prompts", str(prompts), "--emulate=ggml", *LLAMA_REF, "-n",
            str(N_PREDICT), "--out", str(golden))
    header, record = (json.loads(x) for x in golden.read_text().splitlines()[:2])
    assert header["settings"]["ggml"] == {"path": key, "version": GGML_VERSION, "n_ubatch": 8, "n_threads": 1,
                                          "n_ctx": None, "repack": True}
    assert header["settings"]["numerics"].startswith(numerics)
    assert "--emulate=ggml" in header["regenerate"] and record["ids"] == stream["tokens"]
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH")  # golden check follows the recorded path, whatever library is here
    assert main(["golden", "check", str(golden), str(TRAINED_PATH)]) == 0
    out, err = capsys.readouterr()
    assert f"emulate {numerics}" in out and not said(err), out
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(build.lib_dir))

    # validate: a real llama-server (the native build) judged with this path's emulation
    text_prompts = tmp_path / "prompts.txt"
    text_prompts.write_text("In the beginning\n")
    report_file = tmp_path / "validate.json"
    out, _ = command("validate", "builtin:kjv", "--server", server_url, "--prompts", str(text_prompts), "-n", str(N_PREDICT),
                     "--emulate=ggml", "--threads", "2", "--no-repack", "--ctx-size", "512", "--report", str(report_file),
                     "--timeout", "60")
    doc = json.loads(report_file.read_text())
    assert f"emulate {numerics}" in out.splitlines()[0] and doc["numerics"].startswith(numerics)
    assert [r["verdict"] for r in doc["results"]] == ["identical"] and doc["exit_code"] == 0, out
    # every command loaded the model laid out for this path's kernels (logits, run, audit, audit --streams, golden
    # make and check with llama.cpp's repack; validate --no-repack)
    assert len(layouts) >= 5 and layouts[:-1] == [(key, True)] * (len(layouts) - 1) and layouts[-1] == (key, False), layouts


def test_the_suite_builds_a_library_for_every_path_of_the_table():
    """The libraries the suite builds take paths of the table, and every path of the table is taken by one (on a
    host that runs AVX-512; elsewhere the native build is AVX2 and the AVX-512 path has no library here). The ARM
    builds: each GCC build takes its path (the clang build is refused: tests/test_arm64_harness.py)."""
    taken = {build_info(b).path for b in X86_BUILDS} | {library_for(k).path for k in ARM_KEYS}
    keys = {p.key for p in EMULATED_PATHS}
    assert taken <= keys
    assert keys - taken == (set() if both_paths() else {"avx512"}), (
        f"no library for {sorted(keys - taken)}" + (" (CI=true)" if os.environ.get("CI") == "true" else ""))


def not_yet(key: str, e: BaseException):
    """An ARM path whose kernels are still being written: an op that says it is not emulated there is the expected
    answer for now (xfail, naming it); anything else fails."""
    if isinstance(e, NotEmulated):
        pytest.xfail(f"{key}: {e}")
    if isinstance(e, ValueError) and "not emulated" in str(e):  # a kernel's own ValueError: a traceback in the CLI
        pytest.xfail(f"{key}: {e} (a ValueError, not kernels.ggml.build.NotEmulated: the CLI shows a traceback)")
    if isinstance(e, KeyError) and e.args == (key,):  # a kernel's table without the path yet: a traceback too
        pytest.xfail(f"{key}: KeyError {key!r} in the kernels (a table without the path: the CLI shows a traceback)")
    raise e


@pytest.mark.parametrize("key", ARM_KEYS)
def test_every_command_on_an_arm64_path(key, tmp_path, monkeypatch, capsys):
    """The AArch64 paths, each on its build of .ci/build-llama-arm64 (GCC's, and clang's i8mm), detected from the library in
    ``LLAMA_CPP_LIB_PATH`` (SVE: named, its vector length being the CPU's): ``logits`` (one token per ubatch) equals
    llama.cpp's logits computed under qemu on that library, ``run``'s greedy stream equals llama.cpp's, ``audit``
    finds it clean, ``golden make`` records the path and ``golden check`` recomputes it. One llama.cpp child under
    qemu per path (~10 s); validate is left out (no AArch64 llama-server). An op that is not emulated yet on the
    path: xfail naming it (:func:`not_yet`)."""
    entry = next(p for p in EMULATED_PATHS if p.key == key)
    build = library_for(key)
    named = build.has("sve")  # detect() on this x86 host cannot know the CPU's SVE vector length
    emulate = f"--emulate=ggml:{key}" if named else "--emulate=ggml"
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(build.lib_dir))
    ids = ",".join(map(str, prompt()))
    line = f"emulating {build.describe()}" if not named else f"emulating ggml-cpu {entry.name} (named, not detected"

    def command(*argv) -> str:
        try:
            rc = main(list(argv))
        except (ValueError, KeyError) as e:
            not_yet(key, e)
        out, err = capsys.readouterr()
        if rc == 2 and "not emulated" in err:
            pytest.xfail(f"{key}: {err.strip()}")
        assert rc == 0, f"refimpl {argv[0]} on the {key} path: exit {rc}\n{err[-2000:]}"
        assert [x for x in said(err) if not x.startswith(line)] == [] and len(said(err)) == 1, err
        return out

    logits = tmp_path / "logits.npy"
    command("logits", str(TRAINED_PATH), emulate, "--threads", "1", "--ubatch-size", "1", "--tokens", ids,
            "--out", str(logits))
    out = command("run", str(TRAINED_PATH), emulate, *LLAMA_REF, "--tokens", ids, "-n", str(N_PREDICT), "--json")
    stream = json.loads(out)
    theirs = llama_run(TRAINED_PATH, prompt(), n_generate=N_PREDICT, defaults=True, n_threads=1)  # under qemu
    got = np.load(logits)
    want = np.ascontiguousarray(theirs.logits[:len(prompt())], np.float32).reshape(got.shape)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{key}: logits differ from llama.cpp's"
    assert stream["prompt_tokens"] + stream["tokens"] == theirs.tokens.tolist()

    stream_file = tmp_path / "stream.json"
    stream_file.write_text(out)
    report = json.loads(command("audit", str(TRAINED_PATH), str(stream_file), emulate, *LLAMA_REF, "--json"))
    assert report["verdict"] == "clean" and report["numerics"].startswith(f"ggml-cpu {entry.name}"), report
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"tokens": prompt()}) + "\n")
    golden = tmp_path / "g.golden.jsonl"
    command("golden", "make", str(TRAINED_PATH), "--prompts", str(prompts), emulate, *LLAMA_REF, "-n", str(N_PREDICT),
            "--out", str(golden))
    header, record = (json.loads(x) for x in golden.read_text().splitlines()[:2])
    assert header["settings"]["ggml"]["path"] == key and record["ids"] == stream["tokens"]
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH")
    assert main(["golden", "check", str(golden), str(TRAINED_PATH)]) == 0, capsys.readouterr()
