"""The command line: the main job on the built-in model, outputs, and one-line errors (exit 2)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from refimpl.fixtures.builtin import TRAINED_PATH
from refimpl.decode.greedy import greedy
from refimpl.model.trunk import forward, load_model
from refimpl.model.state import SeqState
from refimpl.tokenizer import Tokenizer


def _refimpl(*args, cache, check=True):
    env = dict(os.environ, REFIMPL_CACHE=str(cache))
    proc = subprocess.run([sys.executable, "-m", "refimpl", *map(str, args)], capture_output=True, text=True, env=env, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("refimpl-cache")


def test_run_json_on_the_builtin_model_is_greedy(cache):
    proc = _refimpl("run", "-p", "Hello world", "-n", "6", "--json", cache=cache)
    out = json.loads(proc.stdout)
    assert set(out) >= {"prompt_tokens", "tokens", "text"}
    assert "built-in trained model builtin:kjv" in proc.stderr and "King James Bible" in proc.stderr
    model = load_model(TRAINED_PATH)
    tok = Tokenizer.from_gguf(model.file.gguf)
    assert out["prompt_tokens"] == tok.encode("Hello world", parse_special=True)
    assert out["tokens"] == greedy(model, out["prompt_tokens"], 6, eog_ids=tok.eog_ids)
    assert out["text"] == tok.decode(out["tokens"])


def test_run_streams_text(cache):
    proc = _refimpl("run", "builtin:tiny/f32", "--tokens", "1,2,3", "-n", "5", cache=cache)
    model = load_model(cache / "tiny-f32-s0.gguf")
    tok = Tokenizer.from_gguf(model.file.gguf)
    expected = tok.decode(greedy(model, [1, 2, 3], 5, eog_ids=tok.eog_ids))
    assert proc.stdout == expected + "\n"


def test_logits_and_trace_files(cache, tmp_path):
    model_path = cache / "tiny-f32-s0.gguf"
    _refimpl("run", "builtin:tiny/f32", "--tokens", "1", "-n", "1", cache=cache)  # make sure the fixture exists
    out = tmp_path / "l.npy"
    _refimpl("logits", model_path, "--tokens", "5,6,7", "--out", out, cache=cache)
    model = load_model(model_path)
    expected, _, _ = forward(model, SeqState.fresh(model.config), [5, 6, 7])
    assert np.array_equal(np.load(out), expected)
    tdir = tmp_path / "trace"
    proc = _refimpl("trace", model_path, "--tokens", "5,6,7", "--out", tdir, cache=cache)
    for name in ("attn_norm-0", "linear_attn_out-0", "ffn_moe_out-0", "l_out-3", "result_norm", "result_output"):
        assert (tdir / f"{name}.npy").is_file() and name in proc.stdout
    assert np.array_equal(np.load(tdir / "result_output.npy"), expected)


@pytest.mark.parametrize(
    "args, message",
    [
        (["inspect", "/nonexistent.gguf"], "no such file"),
        (["run", "--tokens", "1,2,99999", "-n", "1"], "out of range"),
        (["run", "--tokens", "1,x"], "comma-separated integers"),
        (["run", "--bogus"], "unrecognized arguments"),
        (["fixture", "OUT.gguf", "--preset", "nope"], "nope"),
        (["logits", "--tokens", "1"], "--out"),
    ],
    ids=["missing-file", "token-range", "token-syntax", "unknown-flag", "bad-preset", "missing-out"],
)
def test_bad_input_is_one_line_and_exit_2(cache, tmp_path, args, message):
    args = [str(tmp_path / a) if a == "OUT.gguf" else a for a in args]
    proc = _refimpl(*args, cache=cache, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    lines = [l for l in lines if "built-in trained model" not in l]
    assert len(lines) == 1 and lines[0].startswith("refimpl: error:") and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_not_a_gguf_exit_2(cache, tmp_path):
    p = tmp_path / "x.gguf"
    p.write_text("hello")
    proc = _refimpl("inspect", p, cache=cache, check=False)
    assert proc.returncode == 2 and "not a GGUF file" in proc.stderr and proc.stderr.count("\n") == 1


def test_logits_default_to_the_trained_model(cache, tmp_path):
    out = tmp_path / "l.npy"
    proc = _refimpl("logits", "--tokens", "5,6,7", "--out", out, cache=cache)
    assert "builtin:kjv" in proc.stderr
    model = load_model(TRAINED_PATH)
    expected, _, _ = forward(model, SeqState.fresh(model.config), [5, 6, 7])
    assert np.array_equal(np.load(out), expected)


def test_run_accepts_a_builtin_fixture_spec(cache):
    proc = _refimpl("run", "builtin:tiny/q8_0", "--tokens", "1,2,3", "-n", "3", "--json", cache=cache)
    out = json.loads(proc.stdout)
    model = load_model(cache / "tiny-q8_0-s0.gguf")
    assert out["tokens"] == greedy(model, [1, 2, 3], 3, eog_ids=Tokenizer.from_gguf(model.file.gguf).eog_ids)


@pytest.fixture(scope="module")
def unsupported_arch(make_fixture, tmp_path_factory):
    """A copy of the tiny fixture claiming another llama.cpp architecture (same-length name: every offset stays valid)."""
    raw = bytearray(make_fixture("tiny", "f32").read_bytes())
    i = raw.index(b"qwen35moe", raw.index(b"general.architecture"))
    raw[i : i + 9] = b"deepseek2"
    path = tmp_path_factory.mktemp("arch") / "deepseek2.gguf"
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("command", ["inspect", "run", "logits", "trace", "golden make", "audit", "plot audit"])
def test_every_command_refuses_an_unsupported_arch_in_one_line(unsupported_arch, tmp_path, capsys, command):
    from conftest import _require
    from refimpl.cli import main

    if command == "plot audit":
        _require("matplotlib", "matplotlib", "plot")  # plot checks for matplotlib before it opens the model
    stream, prompts = tmp_path / "s.json", tmp_path / "p.txt"
    stream.write_text("[1, 2]")
    prompts.write_text("hello\n")
    args = {
        "inspect": [], "run": ["--tokens", "1", "-n", "1"], "logits": ["--tokens", "1", "--out", tmp_path / "o.npy"],
        "trace": ["--tokens", "1", "--out", tmp_path / "o"], "golden make": ["--prompts", prompts, "--out", tmp_path / "o.jsonl"],
        "audit": [stream, "--prompt-tokens", "1"], "plot audit": [stream, "--prompt-tokens", "1", "--out", tmp_path / "o.png"],
    }[command]
    rc = main([*command.split(), str(unsupported_arch), *map(str, args)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0] == (f"refimpl: error: {unsupported_arch}: architecture 'deepseek2' is not supported "
                      "(refimpl implements qwen35moe, qwen35, qwen3next)")
    assert not any(p.name.startswith("o") for p in tmp_path.iterdir())


def test_fixture_refuses_an_unsupported_arch(tmp_path, capsys):
    from refimpl.cli import main

    rc = main(["fixture", str(tmp_path / "x.gguf"), "--arch", "llama"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["refimpl: error: unsupported arch 'llama' (supported: qwen35moe, qwen35, qwen3next)"]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("words, emulate, model", [
    (["--emulate", "plain", "m.gguf"], "plain", "m.gguf"),
    (["--emulate=plain", "m.gguf"], "plain", "m.gguf"),
    (["--emulate", "default", "m.gguf"], "default", "m.gguf"),
    (["--emulate", "m.gguf"], "default", "m.gguf"),  # a word that is not a CONFIG is MODEL
    (["m.gguf", "--emulate"], "default", "m.gguf"),
    (["--emulate", "plain"], "plain", None),
    (["--emul", "plain", "m.gguf"], "plain", "m.gguf"),  # argparse's abbreviations too
    (["--", "--emulate"], None, "--emulate"),
])
@pytest.mark.parametrize("command", ["run", "logits", "trace", "audit", "golden make", "plot audit"])
def test_emulate_takes_a_config_word_but_never_the_model(command, words, emulate, model):
    from refimpl.cli import build_parser

    required = {"logits": ["--tokens", "1", "--out", "o"], "trace": ["--tokens", "1"], "golden make": ["--prompts", "p"],
                "plot audit": ["--out", "o"]}.get(command, [])
    if command == "plot audit":  # STREAM right after MODEL (argparse takes adjacent positionals together)
        words = [*words, "m.gguf"] if model is None else words
        model = model or "m.gguf"
        at = len(words) - words[::-1].index(model)
        words = [*words[:at], "s.json", *words[at:]]
    args = build_parser().parse_args([*command.split(), *required, *words])
    assert (args.emulate, args.model) == (emulate, model)


@pytest.mark.parametrize("words, pack, model", [(["--pack", "m.gguf"], "on", "m.gguf"), (["--pack", "off", "m.gguf"], "off", "m.gguf"),
                                                (["--pack=auto"], "auto", None), ([], "auto", None)])
def test_pack_takes_a_word_but_never_the_model(words, pack, model):
    from refimpl.cli import build_parser

    args = build_parser().parse_args(["run", *words])
    assert (args.pack, args.model) == (pack, model)


def test_emulate_plain_spelled_either_way_gives_the_same_logits(fixture_cache, tmp_path, capsys):
    from refimpl.cli import main

    a, b = tmp_path / "a.npy", tmp_path / "b.npy"
    assert main(["logits", "--emulate", "plain", "builtin:tiny", "--tokens", "1,2", "--out", str(a)]) == 0
    assert main(["logits", "builtin:tiny", "--emulate=plain", "--tokens", "1,2", "--out", str(b)]) == 0
    assert np.array_equal(np.load(a), np.load(b))


def _one_error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith(("refimpl: compil", "refimpl:   ["))]
    assert len(err) == 1 and err[0].startswith("refimpl: error:"), err
    return err[0]


@pytest.mark.parametrize("command", [["logits", "--out", "o.npy"], ["trace", "--out", "t"], ["run", "-n", "1"]])
def test_emulate_with_the_numpy_kernel_is_refused_in_one_line(fixture_cache, tmp_path, capsys, monkeypatch, command):
    """llama.cpp's activation quantization is emulated by the numba kernels only (kernels/matmul.py):
    --emulate --kernel numpy used to end in matmul's ValueError."""
    from refimpl.cli import main

    monkeypatch.chdir(tmp_path)
    assert main([*command, "builtin:tiny", "--tokens", "1,2", "--emulate=plain", "--kernel", "numpy"]) == 2
    assert "--emulate=plain needs --kernel numba" in _one_error(capsys)
    assert not list(tmp_path.iterdir())
    assert main([*command, "builtin:tiny", "--tokens", "1,2", "--kernel", "numpy", "--kv-type", "f16"]) == 0  # the rest of the numerics go


def test_golden_check_of_an_emulated_golden_with_the_numpy_kernel_is_refused(fixture_cache, tmp_path, capsys):
    from refimpl.cli import main

    prompts, golden = tmp_path / "p.jsonl", tmp_path / "g.jsonl"
    prompts.write_text('{"tokens": [1, 2]}\n')
    assert main(["golden", "make", "builtin:tiny", "--prompts", str(prompts), "-n", "2", "--emulate", "--out", str(golden)]) == 0
    capsys.readouterr()
    assert main(["golden", "check", str(golden), "--kernel", "numpy"]) == 2
    assert "needs --kernel numba" in _one_error(capsys)
    assert main(["golden", "check", str(golden)]) == 0


@pytest.mark.parametrize("args, message", [
    (["run", "builtin:tiny", "-m", "builtin:tiny"], "give MODEL or -m, not both"),
    (["run", "builtin:tiny", "--ngram", "--ngram-min-match", "0"], "--ngram-min-match must be between 1 and 12"),
    (["audit", "builtin:tiny", "s.json", "--prompt-tokens", "1,x"], "--prompt-tokens expects comma-separated integers"),
])
def test_flag_findings_are_refused_in_one_line(fixture_cache, tmp_path, capsys, monkeypatch, args, message):
    """What tests/test_cli_flags.py's walk found: each used to end in a traceback, be ignored, or name the wrong flag."""
    from refimpl.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.json").write_text('{"prompt_tokens": [1, 2], "tokens": [3]}')
    assert main([*args, "--tokens", "1,2", "-n", "1"] if args[0] == "run" else args) == 2
    assert message in _one_error(capsys)
