"""The ggml version is part of the prediction: ``--emulate=ggml`` follows ggml ``GGML_VERSION`` (the llama.cpp of
llama-cpp-python 0.3.36), refuses a libggml of another version in one line naming both, and goes on with
``--ggml-version-ok``, recorded in every report: ``logits`` and ``run`` (stderr), ``audit`` (its text report and
``--json``), ``golden make`` (the header) and ``golden check``, ``validate`` (its table and ``--report``).

The library of another version: a folder holding the native build's libraries, in which ``libggml-base.so`` is a
copy whose ``ggml_version()`` string reads ``0.99.0`` — the bytes of ``"0.25.3"`` rewritten in its read-only data,
nothing else. It is a complete, loadable libggml (llama.cpp could run on it; the refusal is decided by the version it
reports, not by its kernels, which here are still 0.25.3's — so what the override runs is checked against the
unchanged library's results). ``detect`` reads it as a user's library would be read: ``ggml_version()`` and
``ggml_commit()`` called through ctypes (an AArch64 build's, the dotprod one's: read from the library, not run). 15 s for the module (AMD EPYC, Zen 4 class, 2 shared vCPUs, 2026-12-04).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from ggml_graph import build_info

from kernels.ggml.build import GGML_VERSION, UnsupportedBuild, detect
from refimpl.cli import main
from refimpl.fixtures.builtin import TRAINED_PATH

pytestmark = pytest.mark.oracle

OTHER = "0.99.0"  # as long as GGML_VERSION: the string is rewritten in place
TOKENS = "73,110,258,1786,1247"  # "In the beginning" in the built-in model's vocabulary
ACCEPTED = f"ggml {OTHER} (not {GGML_VERSION}: accepted with --ggml-version-ok"


def other_version(src: Path, dst: Path, version: str) -> Path:
    """``dst`` with ``src``'s libggml*/libllama files, libggml-base's ``ggml_version()`` string made ``version``."""
    assert len(version) == len(GGML_VERSION)
    dst.mkdir()
    for f in src.iterdir():
        if f.name.startswith(("libggml", "libllama")) and ".so" in f.name and not f.name.startswith("libggml-base"):
            (dst / f.name).symlink_to(f)
    data = (src / "libggml-base.so").read_bytes()
    old = b"\0" + GGML_VERSION.encode() + b"\0"
    assert data.count(old) == 1, f"{src}/libggml-base.so: ggml_version()'s string is not found once"
    (dst / "libggml-base.so").write_bytes(data.replace(old, b"\0" + version.encode() + b"\0"))
    (dst / "libggml-base.so.0").symlink_to("libggml-base.so")  # the soname libggml-cpu.so needs ($ORIGIN)
    return dst


@pytest.fixture(scope="module")
def native():
    return build_info("native")


@pytest.fixture(scope="module")
def other_lib(native, tmp_path_factory):
    return other_version(native.lib_dir, tmp_path_factory.mktemp("ggml") / "lib", OTHER)


def test_detect_reads_the_version_the_library_reports(native, other_lib):
    b = detect(other_lib)
    assert (b.version, b.commit, b.path, b.features) == (OTHER, native.commit, native.path, native.features)
    assert native.version == GGML_VERSION and native.check_version() is None
    with pytest.raises(UnsupportedBuild) as e:
        b.check_version()
    assert f"is ggml {OTHER}, but the emulation follows ggml {GGML_VERSION}" in str(e.value)
    assert b.check_version(accept_other=True) == OTHER


def test_an_arm64_library_of_another_version_is_read_and_refused(tmp_path, monkeypatch, capsys):
    """An AArch64 library's version is read without running it (libggml-base's ``ggml_version`` is ``adrp`` + ``add``
    to the string): the same rewritten string, the same one-line refusal in the CLI."""
    import arm64

    arm64.require("arm64-dotprod-gcc")
    src = arm64.lib_dir("arm64-dotprod-gcc")
    assert detect(src).version == GGML_VERSION
    b = detect(other_version(src, tmp_path / "lib", OTHER))
    assert (b.version, b.commit, b.path) == (OTHER, "unknown", "arm64-dotprod")
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(b.lib_dir))
    assert main(["logits", str(TRAINED_PATH), "--emulate=ggml", "--tokens", TOKENS, "--out", str(tmp_path / "l.npy")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"is ggml {OTHER}, but the emulation follows" in err and "AArch64" not in err, err


def test_another_version_is_refused_in_one_line(other_lib, tmp_path, monkeypatch, capsys):
    from refimpl.model.ops import emulation_ctx

    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(other_lib))
    for argv in (["logits", "--tokens", TOKENS, "--out", str(tmp_path / "l.npy")], ["run", "--tokens", TOKENS, "-n", "2"]):
        assert main([argv[0], str(TRAINED_PATH), "--emulate=ggml", *argv[1:]]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1, err
        assert err[0] == (f"refimpl: error: --emulate=ggml: the libggml in {other_lib} is ggml {OTHER}, but the emulation "
                          f"follows ggml {GGML_VERSION} (the llama.cpp of llama-cpp-python 0.3.36), whose kernels may "
                          "differ; give --ggml-version-ok if you know they do not")
    with pytest.raises(UnsupportedBuild, match=f"ggml {OTHER}"):  # the Python API refuses it too
        emulation_ctx("ggml")
    assert main(["logits", str(TRAINED_PATH), "--ggml-version-ok", "--tokens", TOKENS, "--out", str(tmp_path / "l.npy")]) == 2
    assert capsys.readouterr().err.strip() == ("refimpl: error: --ggml-version-ok describes the llama.cpp that "
                                               "--emulate=ggml emulates; give it with --emulate=ggml")


def test_accepted_with_the_flag_and_recorded_in_every_report(native, other_lib, tmp_path, monkeypatch, capsys):
    """--ggml-version-ok: the same bits as on the library of the followed version (the kernels are 0.25.3's here),
    and every report says which version was accepted."""

    def refimpl(lib: Path, *argv) -> tuple[str, str]:
        monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(lib))
        rc = main(list(argv))
        out, err = capsys.readouterr()
        assert rc == 0, err[-2000:]
        return out, err

    flags = ["--emulate=ggml", "--ggml-version-ok", "--threads", "1"]
    _, err = refimpl(other_lib, "logits", str(TRAINED_PATH), *flags, "--tokens", TOKENS, "--out", str(tmp_path / "a.npy"))
    said = [line for line in err.splitlines() if line.startswith("emulating ")]
    assert said == [f"emulating {detect(other_lib).describe()}; accepted with --ggml-version-ok"]
    assert said[0].startswith("emulating ggml-cpu ") and said[0].endswith(
        f"from {other_lib}, ggml {OTHER} (commit {native.commit}; the emulation follows ggml {GGML_VERSION}'s kernels); "
        "accepted with --ggml-version-ok")
    refimpl(native.lib_dir, "logits", str(TRAINED_PATH), "--emulate=ggml", "--threads", "1", "--tokens", TOKENS,
            "--out", str(tmp_path / "b.npy"))
    assert np.array_equal(np.load(tmp_path / "a.npy").view(np.uint32), np.load(tmp_path / "b.npy").view(np.uint32))

    out, _ = refimpl(other_lib, "run", str(TRAINED_PATH), *flags, "--tokens", TOKENS, "-n", "4", "--json")
    (tmp_path / "s.json").write_text(out)
    out, _ = refimpl(other_lib, "audit", str(TRAINED_PATH), str(tmp_path / "s.json"), *flags)
    assert ACCEPTED in out.splitlines()[0], out
    out, _ = refimpl(other_lib, "audit", str(TRAINED_PATH), str(tmp_path / "s.json"), *flags, "--json")
    report = json.loads(out)
    assert ACCEPTED in report["numerics"] and report["verdict"] == "clean"

    prompts, golden = tmp_path / "p.jsonl", tmp_path / "g.golden.jsonl"
    prompts.write_text(json.dumps({"tokens": [int(t) for t in TOKENS.split(",")]}) + "\n")
    refimpl(other_lib, "golden", "make", str(TRAINED_PATH), "--prompts", str(prompts), *flags, "-n", "4", "--out", str(golden))
    header = json.loads(golden.read_text().splitlines()[0])
    assert header["settings"]["ggml"]["library_version"] == OTHER and header["settings"]["ggml"]["version"] == GGML_VERSION
    assert ACCEPTED in header["settings"]["numerics"] and "--ggml-version-ok" in header["regenerate"]
    out, _ = refimpl(native.lib_dir, "golden", "check", str(golden), str(TRAINED_PATH))
    assert ACCEPTED in out, out


def test_validate_records_the_accepted_version(other_lib, tmp_path, monkeypatch, capsys):
    """validate against a real llama-server (tests/test_validate_server.py), the emulation on the library of another
    version accepted: the table's first line and the --report say so."""
    from conftest import require_llama_tool
    from test_validate_server import KJV, llama_servers

    server = require_llama_tool("llama-server")
    prompts, report = tmp_path / "prompts.txt", tmp_path / "report.json"
    prompts.write_text("In the beginning\n")
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(other_lib))
    with llama_servers(server, [["-m", str(KJV)]]) as urls:
        rc = main(["validate", "builtin:kjv", "--server", urls[0], "--prompts", str(prompts), "-n", "4", "--emulate=ggml",
                   "--ggml-version-ok", "--threads", "2", "--no-repack", "--ctx-size", "512", "--report", str(report)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert ACCEPTED in out.splitlines()[0] and ACCEPTED in json.loads(report.read_text())["numerics"]
