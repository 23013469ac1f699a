"""``refimpl trace --against DUMP``: where an engine departs, found on llama.cpp itself (llama-cpp-python 0.3.36's CPU
build) with deliberately perturbed copies of the built-in model.

llama.cpp's intermediates are dumped by refimpl.oracle.dumper (its ``cb_eval``, in a subprocess: llama.cpp's
defaults, the tokens in one ``llama_decode``) and by tools/refimpl_dump.h compiled into
tools/refimpl_dump_example.c. The unperturbed model's dump equals the oracle bit for bit with ``--emulate=ggml`` at
every intermediate (whatever CPU path the library takes: refimpl emulates the path it detects in that library);
a copy with one tensor of one layer scaled departs first at the op that multiplies by it, under every bound. The
three DUMP formats are read: the .npy directory, a GGUF of the same arrays, and llama-eval-callback's text (real
samples, tests/data/eval-callback/README.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from conftest import require_llama_cpp
from refimpl.cli import main
from refimpl.fixtures.builtin import TRAINED_PATH

pytestmark = pytest.mark.oracle

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data" / "eval-callback"
TOKENS = [1063, 258, 342, 391, 322, 693, 44]  # "And the LORD said unto Moses,"
TOKEN_ARG = ",".join(map(str, TOKENS))


def perturbed_copy(path: Path, tensor: str, factor: float) -> Path:
    """A copy of the built-in model with the F32 tensor ``tensor`` × ``factor`` (tests/test_validate_server.py's
    perturbed_kjv, for any tensor)."""
    import gguf

    shutil.copyfile(TRAINED_PATH, path)
    reader = gguf.GGUFReader(path, "r+")
    t = next(t for t in reader.tensors if t.name == tensor)
    assert t.tensor_type.name == "F32"
    t.data[:] *= factor
    reader.data.flush()
    del reader, t
    return path


def dump(model: Path, out: Path, **options) -> Path:
    """llama.cpp's intermediates of ``model`` on TOKENS, dumped by refimpl.oracle.dumper in a subprocess."""
    code = f"from refimpl.oracle.dumper import dump_llama; dump_llama({str(model)!r}, {TOKENS}, {str(out)!r}, **{options!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    require_llama_cpp()
    from test_validate_server import perturbed_kjv  # blk.0.attn_norm.weight × 3

    tmp = tmp_path_factory.mktemp("trace-against")
    return {
        "original": dump(Path(TRAINED_PATH), tmp / "original"),
        "router-2": dump(perturbed_copy(tmp / "router-2.gguf", "blk.2.ffn_gate_inp.weight", 3.0), tmp / "router-2"),
        "norm-0": dump(perturbed_kjv(tmp / "norm-0.gguf"), tmp / "norm-0"),
    }


def trace(capsys, against, *flags) -> tuple[int, dict]:
    rc = main(["trace", "builtin:kjv", "--tokens", TOKEN_ARG, "--against", str(against), "--json", *flags])
    out = capsys.readouterr().out
    return rc, (json.loads(out) if rc in (0, 1) else out)


def firsts(report: dict) -> set[str]:
    return {p["first"]["name"] for p in report["positions"] if p["first"]}


def test_unperturbed_dump_equals_the_oracle_bit_for_bit(dumps, capsys):
    rc, report = trace(capsys, dumps["original"], "--emulate=ggml")
    n_files = len(list(dumps["original"].glob("*.npy")))
    assert n_files >= 80  # every layer's named intermediates (4 layers: 3 Gated DeltaNet, 1 attention), result_*
    assert rc == 0 and report["mode"] == "bit for bit" and report["exit_code"] == 0
    assert [p["compared"] for p in report["positions"]] == [n_files] * len(TOKENS)
    assert all(p["first"] is None for p in report["positions"])


@pytest.mark.parametrize("emulate", ["--emulate=ggml", "--emulate", None])
def test_perturbed_router_departs_at_layer_2_moe(dumps, capsys, emulate):
    """blk.2.ffn_gate_inp × 3: layers 0, 1 and layer 2's mixer agree; its router logits are the first to depart."""
    rc, report = trace(capsys, dumps["router-2"], *([emulate] if emulate else []))
    assert rc == 1 and firsts(report) == {"ffn_moe_logits-2"}
    assert len([p for p in report["positions"] if p["first"]]) == len(TOKENS)
    first = report["positions"][0]["first"]
    assert first["relative"] > 0.5 and first["bound"] == {"--emulate=ggml": 0.0, "--emulate": 1e-5, None: 5e-2}[emulate]
    if emulate == "--emulate=ggml":  # end to end: everything after it departs too
        down = {d["name"] for d in report["positions"][0]["downstream"]}
        assert {"ffn_moe_out-2", "l_out-2", "attn_norm-3", "result_output"} <= down
    else:  # layer-local: refimpl runs on from llama.cpp's own router logits and layer outputs, so nothing else departs
        assert report["mode"] == "layer-local" and "ffn_moe_logits-2" in report["patched"]
        assert all(not p["downstream"] for p in report["positions"])


def test_perturbed_norm_departs_at_layer_0(dumps, capsys):
    rc, report = trace(capsys, dumps["norm-0"], "--emulate=ggml")
    assert rc == 1 and firsts(report) == {"attn_norm-0"}


def test_one_token_per_decode(tmp_path, capsys):
    """An engine that decoded one token per llama_decode: --batch 1 forwards the tokens as it did, bit for bit."""
    require_llama_cpp()
    rc, report = trace(capsys, dump(Path(TRAINED_PATH), tmp_path / "decode", n_batch=1), "--emulate=ggml", "--batch", "1")
    assert rc == 0 and report["positions"][-1]["compared"] >= 80, report


def test_end_to_end_when_the_dump_lacks_the_layer_outputs(dumps, tmp_path, capsys):
    """Without l_out-*, refimpl cannot run each layer from llama.cpp's input: --emulate then uses its end-to-end
    bound, and still names the perturbed op (and passes the original)."""
    for name in ("original", "router-2"):
        shutil.copytree(dumps[name], tmp_path / name, ignore=shutil.ignore_patterns("l_out-*"))
    rc, report = trace(capsys, tmp_path / "router-2", "--emulate")
    assert rc == 1 and report["mode"] == "end to end" and firsts(report) == {"ffn_moe_logits-2"}
    assert "l_out-0" in report["unpatched"] and report["positions"][0]["first"]["bound"] == 2.5e-2
    rc, report = trace(capsys, tmp_path / "original", "--emulate")
    assert rc == 0 and report["mode"] == "end to end", report


def to_gguf(npy_dir: Path, path: Path) -> Path:
    import gguf

    w = gguf.GGUFWriter(path, "refimpl-dump")
    for f in sorted(npy_dir.glob("*.npy")):
        w.add_tensor(f.stem, np.load(f))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_dump(dumps, tmp_path, capsys):
    rc, report = trace(capsys, to_gguf(dumps["original"], tmp_path / "original.gguf"), "--emulate=ggml")
    assert rc == 0 and report["format"] == "gguf" and report["positions"][0]["compared"] >= 80
    rc, report = trace(capsys, to_gguf(dumps["router-2"], tmp_path / "router-2.gguf"), "--emulate=ggml")
    assert rc == 1 and firsts(report) == {"ffn_moe_logits-2"}


def test_eval_callback_text(tmp_path, capsys):
    """llama-eval-callback's own output (tests/data/eval-callback, gzip-compressed: the original model and the
    router-perturbed copy, the same tokens, llama.cpp's defaults): sums and printed values, with --emulate's bound
    for sums (the samples' bits are the AVX-512 build's, so no bit-for-bit verdict here). Plain text reads too."""
    import gzip

    rc, report = trace(capsys, DATA / "kjv.txt.gz", "--emulate")
    assert rc == 0 and report["format"] == "eval-callback" and report["mode"] == "sums", report
    assert report["positions"][0]["compared"] == 86 and report["positions"][0]["position"] == f"0-{len(TOKENS) - 1}"
    assert "ffn_moe_probs-2" in report["skipped"]  # printed, not compared by refimpl
    text = tmp_path / "router-2x3.txt"
    text.write_bytes(gzip.decompress((DATA / "kjv-router-2x3.txt.gz").read_bytes()))
    rc, report = trace(capsys, text, "--emulate")
    assert rc == 1 and firsts(report) == {"ffn_moe_logits-2"}
    assert report["positions"][0]["first"]["relative"] > 1.0  # its sum tripled
    rc = main(["trace", "builtin:kjv", "--tokens", TOKEN_ARG, "--against", str(DATA / "kjv.txt.gz"), "--emulate"])
    out = capsys.readouterr().out
    assert rc == 0 and "only sums (and the values llama-eval-callback printed) were compared" in out


def test_eval_callback_reader_pairs_printed_values_with_their_indices():
    """common_debug_print_tensor prints the first and last 3 indices of a dimension longer than 6: a [256, 7] tensor
    prints rows 0, 1, 2, 4, 5, 6 of 7, each with values 0, 1, 2, 253, 254, 255."""
    from refimpl.oracle.dump_read import read_dump

    t = read_dump(DATA / "kjv.txt.gz").texts["model.input_embed"]
    assert t.ne == (256, 7, 1, 1) and len(t.values) == 6 * 6 and len(t.sums) == 1
    assert {i1 for (_, i1, _, _) in t.values} == {0, 1, 2, 4, 5, 6} and {i0 for (i0, *_) in t.values} == {0, 1, 2, 253, 254, 255}
    assert t.values[(0, 0, 0, 0)] == -0.0948 and t.sums == [1.707536]


def test_routing_near_tie_is_named():
    from refimpl.oracle.trace_against import Diff, PositionResult
    from refimpl.oracle.trace_report import routing_note

    p = PositionResult("0", [Diff("ffn_moe_logits-1", 0.01, 0.01, 0.05, False), Diff("ffn_moe_swiglu-1", 1.0, 0.5, 0.05, True)])
    assert "a routing near-tie" in routing_note(p, p.diffs[1])
    p.diffs[0].departs = True
    assert routing_note(p, p.diffs[1]) == ""


def test_c_header_dumps_what_the_python_dumper_dumps(dumps, tmp_path, capsys):
    """tools/refimpl_dump.h in tools/refimpl_dump_example.c, compiled as C99 and as C++17 against the vendored
    headers llama-cpp-python installs, linked to its libllama: the same files, bit for bit; its name list is
    refimpl.oracle.dumper's."""
    import llama_cpp

    from refimpl.oracle.dumper import LAYER_NAMES, MODEL_NAMES

    include = Path(sysconfig.get_paths()["purelib"]) / "include"
    lib = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib")
    if not (include / "llama.h").is_file() or shutil.which("gcc") is None:  # pragma: no cover - depends on the machine
        pytest.fail(f"llama.h ({include}) or gcc missing") if os.environ.get("CI") == "true" else pytest.skip("no llama.h/gcc")
    header = (ROOT / "tools" / "refimpl_dump.h").read_text()
    listed = [s.strip().strip('"') for block in header.split("REFIMPL_DUMP_NAMES[] = {")[1].split("NULL")[:1]
              for s in block.replace("\n", " ").split(",") if s.strip().startswith('"')]
    model_listed = [s.strip().strip('"') for s in header.split("REFIMPL_DUMP_MODEL_NAMES[] = {")[1].split("NULL")[0].split(",")
                    if s.strip().startswith('"')]
    assert listed == list(LAYER_NAMES) and model_listed == list(MODEL_NAMES)
    bare = tmp_path / "bare.c"  # included and not used: no warning (static inline functions)
    bare.write_text('#include "refimpl_dump.h"\nint main(void) { return 0; }\n')
    for compiler, std in (("gcc", ["-std=c99", "-x", "c"]), ("g++", ["-std=c++17", "-x", "c++"])):
        subprocess.run([compiler, *std, "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'tools'}", f"-I{include}", "-c",
                        str(bare), "-o", str(tmp_path / "bare.o")], check=True, timeout=120)
        exe = tmp_path / f"dump-{compiler}"
        subprocess.run([compiler, *std, "-O1", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'tools'}", f"-I{include}",
                        str(ROOT / "tools" / "refimpl_dump_example.c"), f"-L{lib}", "-lllama", "-lggml", "-lggml-base",
                        f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True, timeout=120)
    out = tmp_path / "c-dump"
    out.mkdir()
    proc = subprocess.run([str(exe), str(TRAINED_PATH), str(out), TOKEN_ARG], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = sorted(p.name for p in dumps["original"].glob("*.npy"))
    assert sorted(p.name for p in out.glob("*.npy")) == want
    for name in want:
        a, b = np.load(out / name), np.load(dumps["original"] / name)
        assert a.dtype == np.float32 and a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32)), name
    rc, report = trace(capsys, out, "--emulate=ggml")
    assert rc == 0, report


def _write(path: Path, arr) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.asarray(arr))


BAD = {
    "unknown name": (lambda d: _write(d / "not_an_op-0.npy", np.zeros((7, 4), np.float32)), "unknown intermediate 'not_an_op-0'"),
    "name of no such layer": (lambda d: _write(d / "l_out-9.npy", np.zeros((7, 128), np.float32)), "unknown intermediate 'l_out-9'"),
    "wrong shape": (lambda d: _write(d / "l_out-0.npy", np.zeros((7, 100), np.float32)), "l_out-0 has 100 values per position"),
    "missing positions": (lambda d: _write(d / "attn_norm-0.npy", np.zeros((5, 128), np.float32)), "attn_norm-0 has 5 positions, --tokens gives 7"),
    "unreadable npy": (lambda d: (d.mkdir(), (d / "l_out-0.npy").write_bytes(b"\x93NUMPY garbage")), "not a readable .npy file"),
    "empty directory": (lambda d: d.mkdir(), "holds no NAME.npy"),
    "damaged gguf": (lambda d: d.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20), "not a readable GGUF"),
    "not a dump": (lambda d: d.write_text("hello\nworld\n"), "no 'common_debug_cb_eval: NAME = (TYPE) …' line"),
    "truncated text": (lambda d: d.write_text("common_debug_cb_eval:   attn_norm-0 = (f32)   MUL(norm-0{128, 7, 1, 1}, "
                                             "blk.0.attn_norm.weight{128, 1, 1, 1}}) = {128, 7, 1, 1}\n"
                                             "    [\n        [\n            [  0.1000,   0.2000],\n"), "a truncated text?"),
    "binary file": (lambda d: d.write_bytes(b"\x00\xff\xfe" * 10), "not a .npy directory, a GGUF, or llama-eval-callback's text"),
    "no such path": (lambda d: None, "no such file or directory"),
    "text of another model": (lambda d: d.write_text("common_debug_cb_eval:   blk_out-0 = (f32)   ADD(a{4, 7, 1, 1}, "
                                                    "b{4, 7, 1, 1}}) = {4, 7, 1, 1}\n    [\n        [\n" + "            "
                                                    "[  0.1000,   0.2000,   0.3000,   0.4000],\n" * 6 + "        ],\n"
                                                    "    ]\n    sum = 1.000000\n"), "none of its 1 printed tensors"),
    "only names of other layer kinds": (lambda d: _write(d / "beta_sigmoid-3.npy", np.zeros((7, 16), np.float32)),
                                        "none of its intermediates is one refimpl computes"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_dump_is_one_line_exit_2(case, tmp_path, capsys):
    make, message = BAD[case]
    target = tmp_path / "dump"
    make(target)
    rc = main(["trace", "builtin:kjv", "--tokens", TOKEN_ARG, "--against", str(target)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("refimpl: error: --against ") and message in err[0], err


def test_flags_without_against(capsys):
    assert main(["trace", "builtin:kjv", "--tokens", "1,2", "--json"]) == 2
    assert "--json goes with --against DUMP" in capsys.readouterr().err
    assert main(["trace", "builtin:kjv", "--tokens", "1,2", "--against", "x", "--batch", "0"]) == 2
    assert "--batch must be positive" in capsys.readouterr().err


def test_qwen3next_names(make_fixture, tmp_path, capsys):
    """qwen3next.cpp names the token embedding model.embed_tokens and its attention's output gate 'gate' (the delta
    net's name): the first is compared as refimpl's model.input_embed, the second listed as not compared."""
    require_llama_cpp()
    path = make_fixture(quant="q8_0", arch="qwen3next")
    tokens = "11,42,7,300,5"
    code = f"from refimpl.oracle.dumper import dump_llama; dump_llama({str(path)!r}, [{tokens}], {str(tmp_path / 'd')!r})"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)
    assert (tmp_path / "d" / "model.embed_tokens.npy").is_file() and (tmp_path / "d" / "gate-3.npy").is_file()
    rc = main(["trace", str(path), "--tokens", tokens, "--against", str(tmp_path / "d"), "--emulate=ggml", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["skipped"] == ["gate-3"] and report["positions"][0]["compared"] >= 80
