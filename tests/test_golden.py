"""Golden token streams: the committed files pass `golden check`, the format refuses truncated or
edited files, --jobs changes nothing, and a mismatch is reported with everything needed to act."""

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from refimpl.fixtures import builtin as B
from refimpl.oracle import golden as G
from refimpl.cli import main
from refimpl.errors import RefimplError

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_DIR = ROOT / "golden"
GOLDEN_FILES = sorted(p for p in GOLDEN_DIR.glob("*.jsonl") if p.name != "prompts.jsonl")


pytestmark = pytest.mark.usefixtures("fixture_cache")  # conftest: shared fixture cache, one numba thread


# ---- the committed golden files ---------------------------------------------------------------


def test_the_golden_set_is_complete():
    names = {p.name for p in GOLDEN_FILES}
    expected = {f"tiny-{q}.jsonl" for q in ("f32", "bf16", "q8_0", "q4_k_m", "mxfp4")}
    expected |= {"tiny-q4_k_m-emulate.jsonl", "predictable-q8_0.jsonl", "predictable-q8_0-mtp3.jsonl"}
    expected |= {"kjv-q8_0.jsonl", "kjv-q8_0-mtp3.jsonl"}  # the built-in trained model
    assert names == expected


def test_regenerate_script_makes_exactly_the_committed_files():
    """golden/regenerate.sh is the one documented command; each header's hint is one of its lines."""
    script = (GOLDEN_DIR / "regenerate.sh").read_text()
    loop = re.search(r"for q in ([^;]+); do\n\s*(.+)\ndone", script)
    lines = [loop.group(2).replace("$q", q) for q in loop.group(1).split()]
    lines += [ln.strip() for ln in script[loop.end():].splitlines() if ln.strip().startswith("$REFIMPL")]
    commands = {re.sub(r"\s+--jobs \$JOBS", "", ln).replace("$REFIMPL", "refimpl").replace("$P", "golden/prompts.jsonl")
                .replace("$N", "24") for ln in lines}
    hints = {G.read_golden(p).header["regenerate"] for p in GOLDEN_FILES}
    assert hints == commands


def _check_or_skip_on_numpy(path, **kw):
    try:
        return G.check_golden(path, **kw)
    except RefimplError as exc:
        made_with = G.read_golden(path).header["producer"]["numpy"]
        if made_with != np.__version__ and "numpy" in str(exc):
            pytest.skip(f"fixture bytes differ under numpy {np.__version__} (golden made with {made_with}): {exc}")
        raise


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=lambda p: p.stem)
def test_committed_golden_file_checks(path):
    result = _check_or_skip_on_numpy(path)
    assert result.ok, "\n".join(result.lines)


def test_committed_golden_files_are_meaningful():
    """Enough tokens to be a net; the MTP golden accepts drafts; predictable follows its permutation."""
    from refimpl.fixtures import predictable_successors

    pi, _ = predictable_successors()
    for path in GOLDEN_FILES:
        g = G.read_golden(path)
        assert len(g.prompts) >= 4 and all(16 <= len(r["ids"]) <= 32 or r["stop"] == "eog" for r in g.prompts)
        assert sum(len(r["ids"]) for r in g.prompts) >= 64
        for r in g.prompts:
            assert len(r["steps"]) == len(r["ids"])
            assert all(s["top_ids"][0] == t for s, t in zip(r["steps"], r["ids"]))
        if path.name.startswith("predictable"):
            for r in g.prompts:
                seq = r["prompt_ids"] + r["ids"]
                assert all(pi[x] == y for x, y in zip(seq[len(r["prompt_ids"]) - 1 :], r["ids"]))
        if "mtp" in path.name:
            assert g.settings.draft_source == "mtp" and g.settings.n_draft == 3
            assert all(0 < r["draft"]["accepted"] < r["draft"]["drafted"] for r in g.prompts)


# ---- a small golden made here -----------------------------------------------------------------


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text('{"text": "Hello world"}\n{"tokens": [5, 6, 7]}\n{"text": "a"}\n')
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory, prompts_file):
    """(bytes with --jobs 1, bytes with --jobs 2) of the same small golden, made in two directories."""
    out = []
    for jobs in (1, 2):
        d = tmp_path_factory.mktemp(f"jobs{jobs}")
        cwd = os.getcwd()
        os.chdir(d)
        try:
            assert main(["golden", "make", "builtin:tiny", "--prompts", str(prompts_file), "-n", "6", "--out", "g.jsonl",
                         "--jobs", str(jobs)]) == 0
        finally:
            os.chdir(cwd)
        out.append(d / "g.jsonl")
    return out


def test_jobs_do_not_change_the_output(small):
    one, two = small
    assert one.read_bytes() == two.read_bytes()


def test_small_golden_contents(small, fixture_cache):
    from refimpl.decode.greedy import greedy
    from refimpl.model.trunk import load_model
    from refimpl.tokenizer import Tokenizer

    g = G.read_golden(small[0])
    h = g.header
    assert (h["format"], h["version"]) == ("refimpl-golden", 1)
    assert h["model"]["fixture"] == {"spec": "builtin:tiny/f32", "preset": "tiny", "quant": "f32", "seed": 0, "options": {}}
    model_path = fixture_cache / "tiny-f32-s0.gguf"
    assert h["model"]["sha256"] == B.sha256_file(model_path) and h["model"]["size"] == model_path.stat().st_size
    assert h["settings"] == {"n_predict": 6, "draft": {"source": "none", "n_draft": 0}, "emulate": False, "top_k": 5,
                             "stop_at_eog": True}
    assert h["regenerate"].startswith("refimpl golden make builtin:tiny/f32 --prompts ")
    assert h["producer"]["version"] and h["producer"]["numpy"] == np.__version__
    model = load_model(model_path)
    tok = Tokenizer.from_gguf(model_path)
    assert [r["text"] for r in g.prompts] == ["Hello world", None, "a"]
    assert g.prompts[1]["prompt_ids"] == [5, 6, 7]
    for r in g.prompts:
        assert r["ids"] == greedy(model, r["prompt_ids"], 6, eog_ids=frozenset(tok.eog_ids))
        for s in r["steps"]:
            assert len(s["top_ids"]) == 5 and s["top_logits"] == sorted(s["top_logits"], reverse=True)
            assert s["margin"] == s["top_logits"][0] - s["top_logits"][1] >= 0
    assert os.stat(small[0]).st_mode & 0o044  # readable by others, like any file the user writes


def _rewrite(src: Path, dst: Path, edit) -> Path:
    g = G.read_golden(src)
    header, prompts = json.loads(json.dumps(g.header)), json.loads(json.dumps(g.prompts))
    edit(header, prompts)
    G.write_golden(dst, header, prompts)
    return dst


def test_check_passes_and_cli_exit_0(small, capsys):
    assert main(["golden", "check", str(small[0])]) == 0
    assert "ok, 3 prompts, 18 tokens match" in capsys.readouterr().out


def test_check_reports_the_first_divergence(small, tmp_path, capsys):
    def edit(header, prompts):
        r = prompts[0]
        r["ids"][3] = r["steps"][3]["top_ids"][1]  # as if the golden had the runner-up at step 3
    bad = _rewrite(small[0], tmp_path / "bad.jsonl", edit)
    assert main(["golden", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "prompt 0 'Hello world'" in err and "first divergence at generated step 3" in err
    assert "golden token" in err and "now    token" in err and "margin now" in err and "margin then" in err
    assert "MISMATCH in 1 of 3 prompts" in err
    assert "regenerate: refimpl golden make builtin:tiny/f32" in err


def test_check_reports_logit_drift(small, tmp_path):
    def edit(header, prompts):
        prompts[2]["steps"][1]["top_logits"][0] += 1e-3
    result = G.check_golden(_rewrite(small[0], tmp_path / "drift.jsonl", edit))
    assert not result.ok
    assert "prompt 2" in result.lines[0] and "step 1's top-5 logits moved" in result.lines[0]


def test_check_refuses_a_different_model(small, capsys):
    assert main(["golden", "check", str(small[0]), "builtin:tiny/q8_0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "sha256" in err and "differs from the golden's model tiny-f32-s0.gguf" in err


def test_check_rebuilds_a_stale_cached_fixture(small, fixture_cache):
    cached = fixture_cache / "tiny-f32-s0.gguf"
    data = bytearray(cached.read_bytes())
    data[-1] ^= 0xFF  # a cache left behind by an older generator
    cached.write_bytes(bytes(data))
    assert G.check_golden(small[0]).ok
    assert B.sha256_file(cached) == G.read_golden(small[0]).header["model"]["sha256"]


def test_check_refuses_a_fixture_that_rebuilds_differently(small, tmp_path, capsys):
    def edit(header, prompts):
        header["model"]["sha256"] = "0" * 64
        header["producer"]["numpy"] = "0.0.1"
    path = _rewrite(small[0], tmp_path / "other-numpy.jsonl", edit)
    assert main(["golden", "check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "numpy 0.0.1" in err and "regenerate" in err


def test_check_without_model_needs_a_fixture_recipe(small, tmp_path, capsys):
    def edit(header, prompts):
        header["model"]["fixture"] = None
    path = _rewrite(small[0], tmp_path / "nofixture.jsonl", edit)
    assert main(["golden", "check", str(path)]) == 2
    assert "not a built-in fixture; pass MODEL" in capsys.readouterr().err
    model = os.environ["REFIMPL_CACHE"] + "/tiny-f32-s0.gguf"
    assert main(["golden", "check", str(path), model]) == 0


# ---- the file format refuses partial and edited files ------------------------------------------


def test_truncated_or_edited_files_are_refused(small, tmp_path):
    data = small[0].read_bytes()
    lines = data.splitlines(keepends=True)
    cases = {
        "no end record": b"".join(lines[:-1]),
        "cut mid-record": data[: len(data) // 2],
        "a prompt record lost": b"".join(lines[:2] + lines[3:]),
        "edited": data.replace(b'"text": "a"', b'"text": "b"'),
        "empty": b"",
        "not a golden": b'{"hello": 1}\n',
        "future version": data.replace(b'"version": 1', b'"version": 2', 1),
    }
    messages = {}
    for name, blob in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(blob)
        with pytest.raises(RefimplError) as exc:
            G.read_golden(path)
        messages[name] = str(exc.value)
        assert "\n" not in messages[name]
    assert "incomplete golden file: no end record" in messages["no end record"]
    assert "not a JSON record" in messages["cut mid-record"]
    assert "counts 3 prompts, the file holds 2" in messages["a prompt record lost"]
    assert "damaged or edited" in messages["edited"]
    assert "not a golden file" in messages["empty"] and "not a golden file" in messages["not a golden"]
    assert "version 2" in messages["future version"]


def test_a_failed_write_leaves_the_old_file(small, tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_bytes(small[0].read_bytes())
    g = G.read_golden(path)
    with pytest.raises(TypeError):
        G.write_golden(path, g.header, [{"record": "prompt", "bad": object()}])
    assert path.read_bytes() == small[0].read_bytes()
    assert [p.name for p in tmp_path.iterdir()] == ["g.jsonl"]  # no temporary left behind


# ---- model specs and prompts files --------------------------------------------------------------


def test_builtin_specs():
    p = B.parse_builtin
    assert p("builtin:") == B.FixtureRecipe("tiny", "f32", 0, {})
    assert p("builtin:tiny/q8_0").spec == "builtin:tiny/q8_0"
    assert p("builtin:predictable/q4_k_m/seed=2/mtp_mismatch=0.5").options == {"mtp_mismatch": 0.5}
    assert p("builtin:tiny/bf16/mtp=full/tied=false").spec == "builtin:tiny/bf16"  # defaults dropped
    assert p("builtin:tiny/f32/tied=true/mtp=stripped").spec == "builtin:tiny/f32/mtp=stripped/tied=true"
    for bad, msg in [("builtin:huge", "unknown fixture preset"), ("builtin:tiny/q3", "unknown quant mix"),
                     ("builtin:tiny/f32/seed=x", "seed must be an integer"), ("builtin:tiny//f32", "empty segment"),
                     ("builtin:tiny/f32/tied=true/bf16", "expected builtin:PRESET"),
                     ("builtin:tiny/f32/colour=red", "unknown fixture option")]:
        with pytest.raises(RefimplError, match=msg):
            p(bad)


def test_recipe_is_read_back_from_fixture_metadata(make_fixture):
    from refimpl.io.gguf_file import GGUFFile

    path = make_fixture("predictable", "q8_0", seed=3, mtp_mismatch=0.5)
    assert B.recipe_of(GGUFFile(path)).spec == "builtin:predictable/q8_0/seed=3/mtp_mismatch=0.5"


def test_a_large_fixture_has_no_builtin_recipe():
    """medium / full / wide files record their preset too, but are not builtin: specs: golden make on
    one records no fixture (and does not fail on the unknown preset)."""
    keys = {"refimpl.fixture.preset": "medium", "refimpl.fixture.quant": "q4_k_m", "refimpl.fixture.seed": 0}

    class Metadata:
        def key(self, name, default=None):
            return keys.get(name, default)

    assert B.recipe_of(Metadata()) is None


def test_prompts_files(tmp_path):
    from refimpl.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(G.resolve_model("builtin:tiny"))
    text = tmp_path / "p.txt"
    text.write_text("Hello world\n\n<|im_start|>user\n")
    got = G.read_prompts(text, tok, 512)
    assert [(p.text, p.ids) for p in got] == [("Hello world", tok.encode("Hello world", parse_special=True)),
                                              ("<|im_start|>user", tok.encode("<|im_start|>user", parse_special=True))]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"text": "x"}\n{"tokens": [1, 2]}\n')
    assert [(p.text, p.ids) for p in G.read_prompts(jsonl, tok, 512)] == [("x", tok.encode("x")), (None, [1, 2])]
    for body, msg in [('{"text": "x"}\nnot json\n', r"p\.jsonl:2: not a JSON object"),
                      ('{"text": "x", "tokens": [1]}\n', "exactly one of 'text' or 'tokens'"),
                      ('{"tokens": [1, "2"]}\n', "list of integer token ids"),
                      ('{"tokens": [600]}\n', "token id 600 is out of range"),
                      ('{"tokens": []}\n', "encodes to no tokens"), ("\n\n", "holds no prompts")]:
        jsonl.write_text(body)
        with pytest.raises(RefimplError, match=msg):
            G.read_prompts(jsonl, tok, 512)


def test_make_errors_are_one_line(tmp_path, prompts_file, capsys):
    for argv, msg in [(["builtin:tiny", "--prompts", str(prompts_file), "-n", "0"], "-n must be ≥ 1"),
                      (["builtin:tiny", "--prompts", str(prompts_file), "--draft", "2"], "--draft needs --mtp or --ngram"),
                      (["builtin:tiny", "--prompts", str(tmp_path / "none")], "cannot read prompts file"),
                      (["builtin:tiny/f32/mtp=stripped", "--prompts", str(prompts_file), "--mtp", "-n", "2",
                        "--out", str(tmp_path / "x.jsonl")], "MTP"),
                      ([str(tmp_path / "missing.gguf"), "--prompts", str(prompts_file)], "no such file")]:
        assert main(["golden", "make", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and msg in err, err
