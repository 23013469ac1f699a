"""Every file a command writes is handled one way (refimpl/io/output_path.py, README "Output files"):
missing parent directories are created; a location that cannot be written is refused with one line
``refimpl: error: cannot write …`` and exit code 2, before any work — for every option that names an
output file, and for the cache of ``builtin:`` fixtures.

The commands run in-process (``refimpl.cli.main``): an uncaught exception — a traceback — fails the test.
Tests run as root in CI, where a ``chmod``-read-only directory is still writable; the locations that
really cannot be written are a directory under /proc, and a path whose parent is a regular file.
"""

import os
import stat

import numpy as np
import pytest

from refimpl.cli import main

PROC = "/proc/refimpl-cannot-write-here"  # procfs: creating anything fails, for root too


@pytest.fixture(scope="module")
def env(fixture_cache, tmp_path_factory):
    """The inputs the commands read, shared by the module: the tiny fixture (built once), a prompts
    file, a telemetry CSV and a route trace of one run, a token stream."""
    from refimpl.fixtures.builtin import fixture_path

    inputs = tmp_path_factory.mktemp("inputs")
    (inputs / "prompts.txt").write_text("The quick brown fox\n")
    (inputs / "stream.json").write_text('{"prompt_tokens": [1, 2], "tokens": [3, 4, 5]}')
    model = fixture_path()
    assert main(["run", str(model), "--tokens", "1,2", "-n", "3", "--ngram", "--csv", str(inputs / "t.csv"),
                 "--route-trace", str(inputs / "r.csv")]) == 0
    return dict(model=model, prompts=inputs / "prompts.txt", csv=inputs / "t.csv", routes=inputs / "r.csv",
                stream=inputs / "stream.json")


# option id → (argv with {out} for the output, the output is a directory)
OPTIONS = {
    "logits --out": (["logits", "{model}", "--tokens", "1,2,3", "--out", "{out}"], False),
    "logits --mtp-out": (["logits", "{model}", "--tokens", "1,2,3", "--out", "{tmp}/l.npy", "--mtp-out", "{out}"], False),
    "run --csv": (["run", "{model}", "--tokens", "1,2", "-n", "2", "--ngram", "--csv", "{out}"], False),
    "run --route-trace": (["run", "{model}", "--tokens", "1,2", "-n", "2", "--route-trace", "{out}"], False),
    "trace --out": (["trace", "{model}", "--tokens", "1,2", "--out", "{out}"], True),
    "golden make --out": (["golden", "make", "{model}", "--prompts", "{prompts}", "-n", "2", "--out", "{out}"], False),
    "fixture OUT": (["fixture", "{out}"], False),
    "plot telemetry --out": (["plot", "telemetry", "{csv}", "--out", "{out}"], False),
    "plot routes --out": (["plot", "routes", "{routes}", "--out", "{out}"], False),
    "plot audit --out": (["plot", "audit", "{model}", "{stream}", "--out", "{out}"], False),
}


def _argv(option, out, env, tmp_path):
    if option.startswith("plot") and os.environ.get("CI") != "true":
        pytest.importorskip("matplotlib")  # CI installs the 'plot' extra: there, without it, the test fails
    argv, _ = OPTIONS[option]
    return [a.format(out=out, tmp=tmp_path, **env) for a in argv]


def _flag(option):
    return option.split()[-1]


def _refused(capsys, code, option, out):
    """Exit 2 and exactly one stderr line naming the option and the path."""
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"refimpl: error: cannot write {_flag(option)} {out}"), err
    return err


@pytest.mark.parametrize("option", OPTIONS)
def test_missing_parent_directories_are_created(option, env, tmp_path, capsys):
    out = tmp_path / "a" / "b" / ("out" if OPTIONS[option][1] else "out.file")
    assert main(_argv(option, out, env, tmp_path)) == 0, capsys.readouterr().err
    if OPTIONS[option][1]:
        assert out.is_dir() and (out / "result_output.npy").is_file()
    else:
        assert out.is_file() and out.stat().st_size > 0
    if option.startswith("logits"):
        assert np.load(out).dtype == np.float32


@pytest.mark.parametrize("option", OPTIONS)
def test_a_location_under_proc_is_refused_before_any_work(option, env, tmp_path, capsys):
    out = f"{PROC}/x" if OPTIONS[option][1] else f"{PROC}/x.out"
    before = sorted(tmp_path.rglob("*"))
    err = _refused(capsys, main(_argv(option, out, env, tmp_path)), option, out)
    assert "/proc" in err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, no directory made (logits --out's either)


@pytest.mark.parametrize("option", OPTIONS)
def test_a_parent_that_is_a_file_is_refused(option, env, tmp_path, capsys):
    (tmp_path / "plain").write_text("a file, not a directory")
    out = tmp_path / "plain" / "sub" / "x"
    err = _refused(capsys, main(_argv(option, out, env, tmp_path)), option, out)
    assert "is not a directory" in err


@pytest.mark.parametrize("option", OPTIONS)
def test_the_wrong_kind_of_existing_path_is_refused(option, env, tmp_path, capsys):
    """A file output that names a directory; the directory output (trace --out) that names a file."""
    out = tmp_path / "taken"
    if OPTIONS[option][1]:
        out.write_text("a file")
    else:
        out.mkdir()
    _refused(capsys, main(_argv(option, out, env, tmp_path)), option, out)


@pytest.mark.parametrize("option", OPTIONS)
def test_a_read_only_directory_is_refused_unless_this_user_may_write_it(option, env, tmp_path, capsys):
    """Mode 0555: refused for an ordinary user; root may write there (os.access says so), and then the
    file is written — the rule follows what the operating system allows, not the mode bits."""
    ro = tmp_path / "read-only"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        out = ro / "new" / "x"
        code = main(_argv(option, out, env, tmp_path))
        if os.access(ro, os.W_OK):
            assert code == 0, capsys.readouterr().err
            assert out.exists()
        else:
            _refused(capsys, code, option, out)
    finally:
        ro.chmod(stat.S_IRWXU)


def test_an_unwritable_fixture_cache_is_refused(tmp_path, monkeypatch, capsys):
    """A ``builtin:`` fixture is written into $REFIMPL_CACHE, under the same rule."""
    monkeypatch.setenv("REFIMPL_CACHE", f"{PROC}/cache")
    code = main(["run", "builtin:tiny", "--tokens", "1", "-n", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines()[-1].startswith("refimpl: error: cannot write the fixture cache"), err
    monkeypatch.setenv("REFIMPL_CACHE", str(tmp_path / "new" / "cache"))
    assert main(["logits", "builtin:tiny", "--tokens", "1", "--out", str(tmp_path / "l.npy")]) == 0
    assert (tmp_path / "new" / "cache" / "tiny-f32-s0.gguf").is_file()
