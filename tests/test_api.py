"""The Python API at the package top (refimpl/api.py, README "Python API"): every public name on ``builtin:kjv``
computes what its command computes — ``refimpl.forward`` the rows of ``refimpl logits`` bit for bit,
``refimpl.generate`` the tokens of ``refimpl run`` (speculative ones the plain ones), ``refimpl.audit`` the report of
``refimpl audit``, ``refimpl.trace`` the arrays of ``refimpl trace`` —; ``__all__`` is the documented list; the
README's example runs as written; bad arguments are refused in one line; ``import refimpl`` stays cheap; the deep
imports the docs showed work, or CHANGELOG.md names their replacement.

Cost: 4–20 s for the module with the kernels compiled (the commands run in-process, one model load each; AMD EPYC,
Zen 4 class, AVX-512, 2 vCPUs shared with other test runs, 2026-12-04); a cold numba cache adds the ggml kernels'
compilation (~40 s, shared with tests/test_ggml_e2e.py).
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import refimpl
from refimpl.cli import main

ROOT = Path(__file__).resolve().parents[1]
TEXT = "And the LORD said unto Moses,"
N = 12

#: The API the README documents, in its order (refimpl/__init__.py).
DOCUMENTED = ["load", "forward", "generate", "audit", "trace", "Oracle", "Generation", "RefimplError"]


@pytest.fixture(scope="module")
def model():
    return refimpl.load("builtin:kjv")


@pytest.fixture(scope="module")
def prompt(model):
    return model.encode(TEXT)


@pytest.fixture(scope="module")
def plain(model, prompt):
    return refimpl.generate(model, prompt, N)


def _ids(ids) -> str:
    return ",".join(map(str, ids))


def _cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().out


# ---- the names ------------------------------------------------------------------------------------------------


def readme_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^## Python API\n(.*?)(?=^## )", text, re.S | re.M)
    assert m, "README.md has a '## Python API' section"
    return m.group(1)


def test_all_is_the_documented_list():
    assert refimpl.__all__ == DOCUMENTED
    section = readme_section()
    for name in DOCUMENTED:
        assert f"refimpl.{name}" in section, f"README's Python API section names refimpl.{name}"
        assert getattr(refimpl, name) is getattr(importlib.import_module("refimpl.api" if name != "RefimplError"
                                                                         else "refimpl.errors"), name)
    public = {n for n in vars(refimpl) if not n.startswith("_") and not isinstance(getattr(refimpl, n), type(refimpl))}
    assert public == set(DOCUMENTED), "the package top holds the documented names (and its subpackages) only"


def test_import_is_cheap():
    """``import refimpl`` imports neither numpy nor any folder below the API: a harness pays for what it calls."""
    code = ("import sys, refimpl; heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'numba', 'kernels')"
            " or m.startswith(('refimpl.model', 'refimpl.io', 'refimpl.cli', 'refimpl.oracle'))); print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_readme_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", readme_section(), re.S)
    assert len(blocks) == 1, "the Python API section holds one runnable example"
    exec(compile(blocks[0], "README.md (Python API)", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    # what its comments say the prints show: run's stream on builtin:kjv, the MTP counts, the verdict, the trace
    assert printed[0].startswith(" Take thou, and eat the bread of the burnt offering,")
    assert printed[1:] == ["19 of 37 drafts accepted", "clean 0", "91 (7, 2048)"]
    for shown in ("# 19 of 37", "# clean 0", "# 91 (7, 2048)", '# " Take thou, and eat the bread of the burnt offering, …"'):
        assert shown in blocks[0]


# ---- each name computes what its command computes -------------------------------------------------------------


def test_load(model):
    assert isinstance(model, refimpl.Oracle)
    assert model.name == "builtin:kjv" and model.ctx.numerics() == "off"
    assert model.config.arch.name == "qwen35moe" and model.config.n_vocab == model.tokenizer.n_vocab
    assert model.decode(model.encode(TEXT)) == TEXT and model.decode([]) == ""
    assert repr(model) == "Oracle('builtin:kjv': qwen35moe, 4 layers, vocabulary 2048; numerics off)"  # not the weights


@pytest.mark.parametrize("emulate", ["default", "plain", "ggml:avx2", "ggml:generic"])
def test_load_numerics_are_the_flags(emulate):
    """load(emulate=…) builds the Ctx ``--emulate`` builds (refimpl.cli.common.ctx_from_args); a named ggml path
    loads no library (llama-cpp-python not needed)."""
    import argparse

    from refimpl.cli.common import ctx_from_args

    flags = argparse.Namespace(emulate=emulate, flash_attn=None, kv_type=None, kernel="numba")
    ctx = refimpl.load("builtin:kjv", emulate=emulate).ctx
    assert ctx == ctx_from_args(flags) and ctx.act_quant and ctx.ggml == (emulate.partition(":")[2] or None)
    assert refimpl.load("builtin:kjv", emulate=emulate, flash_attn=False, kv_type="f32").ctx == ctx_from_args(
        argparse.Namespace(emulate=emulate, flash_attn="off", kv_type="f32", kernel="numba"))


def test_forward_is_refimpl_logits_bit_for_bit(model, prompt, tmp_path, capsys):
    out = tmp_path / "L.npy"
    assert _cli(capsys, "logits", "builtin:kjv", "--tokens", _ids(prompt), "--out", str(out))[0] == 0
    logits, state = refimpl.forward(model, prompt)
    assert logits.dtype == np.float32 and logits.shape == (len(prompt), model.config.n_vocab)
    assert logits.tobytes() == np.load(out).tobytes()
    assert state.n_past == len(prompt)
    last, _ = refimpl.forward(model, prompt, outputs="last")
    assert last.tobytes() == logits[-1:].tobytes()


def test_forward_state_is_explicit(model, prompt):
    """Continuing from a returned state gives the rows of one call (the definition is batch-invariant), and the
    state given is never changed: forwarding from it again gives the same bits."""
    whole, _ = refimpl.forward(model, prompt)
    head, state = refimpl.forward(model, prompt[:3])
    tail, end = refimpl.forward(model, prompt[3:], state)
    assert np.concatenate([head, tail]).tobytes() == whole.tobytes() and end.n_past == len(prompt)
    again, _ = refimpl.forward(model, prompt[3:], state)
    assert again.tobytes() == tail.tobytes()


def test_generate_is_refimpl_run(plain, capsys):
    code, out = _cli(capsys, "run", "builtin:kjv", "-p", TEXT, "-n", str(N), "--json")
    assert code == 0
    run = json.loads(out)
    assert plain.tokens == run["tokens"] and plain.text == run["text"] and plain.stats is None
    assert plain.text.startswith(" Take thou")


@pytest.mark.parametrize("draft", ["mtp", "ngram"])
def test_speculative_generate_is_plain(model, prompt, plain, draft, capsys):
    fast = refimpl.generate(model, TEXT, N, draft=draft, n_draft=3)  # the prompt as text: encoded as run -p encodes it
    assert fast.tokens == plain.tokens
    code, out = _cli(capsys, "run", "builtin:kjv", "-p", TEXT, "-n", str(N), "--json", f"--{draft}", "--draft", "3")
    run = json.loads(out)
    counters = {k: v for k, v in fast.stats.counters().items() if not k.endswith(("_s", "_s/tok")) and k != "bytes_read"}
    assert counters == {k: run["stats"][k] for k in counters}  # the same rounds as run's (timings and bytes apart)
    assert fast.stats.rounds() == run["rounds"]


@pytest.mark.parametrize("wrong", [False, True])
def test_audit_gives_the_commands_report(model, prompt, plain, tmp_path, wrong, capsys):
    tokens = list(plain.tokens)
    if wrong:  # an engine that emitted a wrong token at step 4
        tokens[4] = model.encode(" camel")[0]
    stream = tmp_path / "engine.json"
    stream.write_text(json.dumps(tokens))
    code, out = _cli(capsys, "audit", "builtin:kjv", str(stream), "--prompt", TEXT, "--json")
    cli = json.loads(out)
    rep = refimpl.audit(model, TEXT, str(stream))
    assert rep.as_json() == cli and rep.exit_code == code == (1 if wrong else 0)
    assert rep.verdict == ("A wrong" if wrong else "clean")
    from_ids = refimpl.audit(model, prompt, tokens)  # the stream as ids: the same judgement
    assert (from_ids.verdict, from_ids.common, from_ids.exit_code) == (rep.verdict, rep.common, rep.exit_code)
    both = refimpl.audit(model, prompt, plain, tokens)  # two streams: a Generation and ids
    assert both.verdict == ("B wrong" if wrong else "identical")


def test_trace_is_refimpl_trace(model, prompt, tmp_path, capsys):
    out = tmp_path / "trace"
    assert _cli(capsys, "trace", "builtin:kjv", "--tokens", _ids(prompt), "--out", str(out))[0] == 0
    arrays = refimpl.trace(model, prompt)
    files = {p.stem: np.load(p) for p in out.glob("*.npy")}
    assert set(arrays) == set(files) and {"attn_norm-0", "result_norm", "result_output"} <= set(arrays)
    for name, a in arrays.items():
        assert a.tobytes() == files[name].tobytes(), name
    logits, _ = refimpl.forward(model, prompt)
    assert arrays["result_output"].tobytes() == logits.tobytes()
    only = refimpl.trace(model, prompt, names=["attn_norm-0"])
    assert list(only) == ["attn_norm-0"]
    # activation patching: fed its own values, the pass computes the same; fed other ones, the logits move
    same = refimpl.trace(model, prompt, patch={"attn_norm-0": arrays["attn_norm-0"]})
    assert same["result_output"].tobytes() == logits.tobytes()
    moved = refimpl.trace(model, prompt, patch={"attn_norm-0": 2 * arrays["attn_norm-0"]})
    assert not np.array_equal(moved["result_output"], logits)


def test_emulate_ggml_is_refimpl_logits_emulate_ggml(prompt, plain, tmp_path, capsys):
    """load(emulate="ggml") is ``--emulate=ggml``: the libggml llama-cpp-python loads, named and checked as the
    command does, its column layout, and the same bits as ``refimpl logits --emulate=ggml``; naming that path
    (``emulate="ggml:PATH"``, no library loaded) computes the same. Its audit holds llama.cpp's predicted stream, as
    ``refimpl audit --emulate=ggml [--draft N]`` does."""
    from conftest import require_llama_cpp

    require_llama_cpp()
    out = tmp_path / "L.npy"
    assert _cli(capsys, "logits", "builtin:kjv", "--tokens", _ids(prompt), "--out", str(out), "--emulate=ggml")[0] == 0
    ggml = refimpl.load("builtin:kjv", emulate="ggml")
    assert ggml.ctx.ggml and ggml.ctx.numerics().startswith("ggml-cpu")
    logits, _ = refimpl.forward(ggml, prompt)
    assert logits.tobytes() == np.load(out).tobytes()
    named = refimpl.load("builtin:kjv", emulate=f"ggml:{ggml.ctx.ggml}")
    assert named.ctx.ggml == ggml.ctx.ggml and refimpl.forward(named, prompt)[0].tobytes() == logits.tobytes()
    stream = tmp_path / "engine.json"
    stream.write_text(json.dumps(plain.tokens))
    for schedule in (None, 2):
        flags = [] if schedule is None else ["--draft", str(schedule)]
        code, out = _cli(capsys, "audit", "builtin:kjv", str(stream), "--prompt", TEXT, "--emulate=ggml", "--json", *flags)
        rep = refimpl.audit(ggml, TEXT, str(stream), schedule=schedule)
        assert rep.reproduce is not None and rep.as_json() == json.loads(out) and rep.exit_code == code


# ---- bad arguments: one line each ------------------------------------------------------------------------------


BAD = {
    "unknown model": (lambda m, p: refimpl.load("builtin:nosuch"), "builtin"),
    "missing file": (lambda m, p: refimpl.load("/nonexistent/model.gguf"), "model.gguf"),
    "model not a path": (lambda m, p: refimpl.load(3), "load: model"),
    "emulate": (lambda m, p: refimpl.load(emulate="fast"), "emulate"),
    "kv_type": (lambda m, p: refimpl.load(kv_type="f8"), "kv_type"),
    "flash_attn": (lambda m, p: refimpl.load(flash_attn="on"), "flash_attn"),
    "ggml-only flag": (lambda m, p: refimpl.load(n_threads=2), "emulate='ggml'"),
    "unknown ggml path": (lambda m, p: refimpl.load(emulate="ggml:avx3"), "ggml:avx2"),
    "version_ok with a named path": (lambda m, p: refimpl.load(emulate="ggml:avx2", ggml_version_ok=True), "loads none"),
    "kernel numpy with emulate": (lambda m, p: refimpl.load(emulate="plain", kernel="numpy"), "numba"),
    "cache_mb": (lambda m, p: refimpl.load(cache_mb="lots"), "lots"),
    "not a model": (lambda m, p: refimpl.forward("builtin:kjv", p), "refimpl.load"),
    "empty tokens": (lambda m, p: refimpl.forward(m, []), "no tokens"),
    "token out of range": (lambda m, p: refimpl.forward(m, [1, 10**6]), "1000000"),
    "float tokens": (lambda m, p: refimpl.forward(m, [1.5]), "token ids"),
    "bad state": (lambda m, p: refimpl.forward(m, p, state={}), "state"),
    "outputs": (lambda m, p: refimpl.forward(m, p, outputs="first"), "outputs"),
    "negative n": (lambda m, p: refimpl.generate(m, p, -1), "n must"),
    "draft": (lambda m, p: refimpl.generate(m, p, 4, draft="eagle"), "draft"),
    "n_draft": (lambda m, p: refimpl.generate(m, p, 4, draft="mtp", n_draft=9), "n_draft"),
    "n_draft without draft": (lambda m, p: refimpl.generate(m, p, 4, n_draft=2), "draft="),
    "p_min with ngram": (lambda m, p: refimpl.generate(m, p, 4, draft="ngram", p_min=0.5), "p_min"),
    "threshold": (lambda m, p: refimpl.audit(m, p, [1, 2], threshold="loose"), "threshold"),
    "audit no prompt": (lambda m, p: refimpl.audit(m, None, [1, 2]), "prompt"),
    "audit stream file": (lambda m, p: refimpl.audit(m, p, "/nonexistent/engine.json"), "engine.json"),
    "audit empty stream": (lambda m, p: refimpl.audit(m, p, []), "no tokens"),
    "audit schedule without ggml": (lambda m, p: refimpl.audit(m, p, [1, 2], schedule=3), "emulate='ggml'"),
    "trace patch": (lambda m, p: refimpl.trace(m, p, patch=[1]), "patch"),
    "trace unknown name": (lambda m, p: refimpl.trace(m, p, names=["attn_nrom-0"]), "attn_nrom-0"),
    "trace unknown patch": (lambda m, p: refimpl.trace(m, p, patch={"attn_norm-99": np.zeros((len(p), 256))}), "attn_norm-99"),
    "trace patch rows": (lambda m, p: refimpl.trace(m, p, patch={"attn_norm-0": np.zeros((1, 256))}), "attn_norm-0"),
    "trace patch width": (lambda m, p: refimpl.trace(m, p, patch={"attn_norm-0": np.zeros((len(p), 3))}), "attn_norm-0"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_arguments_are_one_line(model, prompt, case):
    call, needle = BAD[case]
    with pytest.raises(refimpl.RefimplError) as e:
        call(model, prompt)
    message = str(e.value)
    assert "\n" not in message and needle in message, message


def test_mtp_on_a_model_without_its_head(capsys):
    """``draft="mtp"`` on a file without nextn tensors is refused as ``run --mtp`` refuses it."""
    stripped = refimpl.load("builtin:tiny/f32/mtp=stripped")
    with pytest.raises(refimpl.RefimplError) as e:
        refimpl.generate(stripped, [1, 2, 3], 2, draft="mtp")
    assert "\n" not in str(e.value) and "nextn" in str(e.value)


# ---- the deep imports the docs showed -------------------------------------------------------------------------


#: Python imports the README and docs/ showed (now and before the layout change of 96b6f0d): each still works, or
#: CHANGELOG.md names it with what replaces it.
DEEP_IMPORTS = [
    ("refimpl.decode.speculative", "speculative_generate"),
    ("refimpl.oracle.trace", "Patcher"),
    ("refimpl.oracle.trace", "Recorder"),
    ("refimpl.fixtures", "write_fixture"),
    ("refimpl.tokenizer", "Tokenizer"),
    ("refimpl.model.state", "SeqState"),
    ("refimpl.model.ops", "Ctx"),
    ("refimpl.model.load", "load_model"),
    ("refimpl.model.trunk", "forward"),
    ("refimpl.model", "load_model"),  # before the layout change: refimpl/model.py
    ("refimpl.speculative", "speculative_generate"),
    ("refimpl.trace", "Patcher"),
]


@pytest.mark.parametrize("module,name", DEEP_IMPORTS)
def test_deep_imports_work_or_are_in_the_changelog(module, name):
    try:
        getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        changelog = " ".join((ROOT / "CHANGELOG.md").read_text(encoding="utf-8").split())  # lines joined
        assert f"{module}.{name}" in changelog or f"from {module} import {name}" in changelog, \
            f"{module}.{name} no longer imports, and CHANGELOG.md does not say what replaces it"
