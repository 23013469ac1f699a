"""Every flag combination either works or is refused in one line, with exit 2 (refimpl/cli/__init__.py).

The flags come from :func:`refimpl.cli.build_parser`, so a new flag is walked without touching this file:
for every command (``golden make``, ``plot audit``, … each leaf of the parser), every value of every flag
alone, then every pair of flags (each with one of its representative values, in turn), on the tiny
built-in fixture with ``-n 2``. Each command line runs in this process (``refimpl.cli.main``) and must
end in

* exit 0, or
* exit 2 with exactly one line on stderr, ``refimpl: error: …`` (besides the notes a command prints
  before its error: the first run's compile report, "no model given", "injected fault"), or
* exit 1 where it is a verdict (``audit``: a wrong token; ``golden check``: a mismatch),

and never in an exception (a traceback). Representative values: each choice; for ``nargs="?"`` the bare
flag, ``--flag WORD`` and ``--flag=WORD``; for numbers a valid one, 0 and a negative one (floats also
NaN); for strings and positionals the table of :func:`strings` (a flag missing there gets ``1`` and ``x``).
Flags go before the positionals, so a bare ``--emulate`` or ``--pack`` meets MODEL. A line refused for want
of another flag ("--mtp-p-min needs --mtp") is tried again with it (:data:`NEEDS`).

Runtime: ~35 s for ~650 command lines (one numba thread, the ``fixture_cache`` fixture).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import re
import traceback

import pytest

from refimpl.cli import build_parser, main

MODEL = "builtin:tiny"

#: Leading words of stderr lines a command may print before its one error line.
NOTES = ("refimpl: compiling kernels", "refimpl:   [", "refimpl: compiled ", "refimpl: no model given",
         "refimpl: injected fault")

#: Commands whose exit 1 is a verdict (README, refimpl/cli/__init__.py).
VERDICT_EXIT_1 = {"audit", "golden check"}


def _leaves(parser, words=()):
    """(command words, parser) of every leaf command of ``parser``."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(words), parser
    for a in subs:
        for name, sub in a.choices.items():
            yield from _leaves(sub, (*words, name))


LEAVES = dict(_leaves(build_parser()))


@pytest.fixture(scope="module")
def files(fixture_cache, tmp_path_factory):
    """Inputs the commands read (absolute paths), made once: a prompts file (the prompt 1,2), the stream the
    oracle decodes from it, a stream directory, a plain and an emulated golden file of it, a telemetry CSV
    and a route trace. Relative outputs land in the same scratch directory."""
    d = tmp_path_factory.mktemp("flags")
    f = argparse.Namespace(dir=d)
    f.prompts = d / "prompts.jsonl"
    f.prompts.write_text('{"tokens": [1, 2]}\n')
    f.stream, f.stream_dir = d / "stream.json", d / "streams"
    f.golden, f.golden_emulated = d / "plain.golden.jsonl", d / "emulated.golden.jsonl"
    f.telemetry, f.routes = d / "telemetry.csv", d / "routes.csv"
    cwd = os.getcwd()
    os.chdir(d)  # golden make's default --out and the like land here
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["run", MODEL, "--tokens", "1,2", "-n", "2", "--json"]) == 0
        f.stream.write_text(json.dumps({k: v for k, v in json.loads(out.getvalue()).items() if k in ("prompt_tokens", "tokens")}))
        f.stream_dir.mkdir()
        (f.stream_dir / "x.A.json").write_text(f.stream.read_text())
        (f.stream_dir / "x.B.json").write_text(json.dumps({"prompt_tokens": [1, 2], "tokens": [3, 4]}))
        for argv in (["golden", "make", MODEL, "--prompts", f.prompts, "-n", "2", "--out", f.golden],
                     ["golden", "make", MODEL, "--prompts", f.prompts, "-n", "2", "--out", f.golden_emulated, "--emulate"],
                     ["run", MODEL, "--tokens", "1,2", "-n", "2", "--mtp", "--csv", f.telemetry, "--route-trace", f.routes]):
            assert main([str(a) for a in argv]) == 0
    finally:
        os.chdir(cwd)
    return f


def strings(f) -> dict:
    """Representative values of the string flags and positionals: ``dest`` or ``(command, dest)`` → values
    (each a list of argv words; a positional's list may hold several words, or none)."""
    from refimpl.inject.faults import FAULTS

    fault = {fault.needs: name for name, fault in reversed(FAULTS.items())}  # the first fault of each kind
    return {
        "model": [[MODEL]],
        ("audit", "model"): [[MODEL], [str(f.golden)]],
        ("audit", "streams"): [[str(f.stream)], [str(f.stream), str(f.stream)]],
        ("plot audit", "stream"): [[str(f.stream)]],
        ("plot telemetry", "csv"): [[str(f.telemetry)]],
        ("plot routes", "csv"): [[str(f.routes)]],
        ("golden check", "golden"): [[str(f.golden)], [str(f.golden_emulated)]],
        ("golden check", "model"): [[], [MODEL]],
        ("fixture", "out"): [["o/fixture.gguf"], ["."]],
        "m": [MODEL],
        "tokens": ["1,2", "3", "1,x", "99999"],
        "prompt": ["In the beginning", ""],
        "prompt_tokens": ["1,2", "1,x"],
        "prompts": [str(f.prompts), "missing.txt"],
        "stream_dir": [str(f.stream_dir), "missing"],
        "cache_mb": ["0", "auto", "x"],
        "cluster": ["nope://x"],  # a scheduler that is reachable, or one that times out, is docs/cluster.md's business
        "csv": ["o/telemetry.csv", "."],
        "route_trace": ["o/routes.csv", "."],
        "mtp_out": ["o/mtp.npy", "."],
        "out": ["o/out.npy", "."],
        ("trace", "out"): ["o/trace", str(f.prompts)],
        ("golden make", "out"): ["o/g.golden.jsonl", "."],
        ("plot audit", "out"): ["o/p.png", "."],
        ("plot telemetry", "out"): ["o/p.png"],
        ("plot routes", "out"): ["o/p.png"],
        "inject": [fault[""], fault["mtp"], fault["speculative"], "nope"],
        "option": ["mtp=stripped", "tied=true", "x"],
        "arch": ["qwen35", "qwen3next", "llama"],
        "preset": ["predictable", "nope"],
        "quant": ["q8_0", "nope"],  # the IQ mixes take seconds each (libggml's quantizers)
        "jobs": ["1", "2", "0", "-1"],
    }


def values(command: str, action, table: dict) -> list[list[str]]:
    """The representative argv words of one flag (or positional)."""
    if not action.option_strings:  # a positional: words from the table, as given
        return table.get((command, action.dest), table.get(action.dest, [[]]))
    opt = max(action.option_strings, key=len)
    if action.nargs == 0:
        return [[opt]]
    if action.choices:
        words = [[opt, str(c)] for c in action.choices]
        return ([[opt], [f"{opt}={action.choices[0]}"]] if action.nargs == "?" else []) + words
    if action.type is int:
        given = ["2", "0", "-1"]
    elif action.type is float:
        given = ["0.5", "0", "-1", "nan"]
    else:
        given = table.get((command, action.dest), table.get(action.dest, ["1", "x"]))
    return [[opt, v] for v in given]


#: Inputs that make each command runnable; a flag of the same dest or of the same mutually exclusive group
#: replaces them.
BASE = {
    "run": {"n_predict": ["-n", "2"], "tokens": ["--tokens", "1,2"]},
    "logits": {"tokens": ["--tokens", "1,2"], "out": ["--out", "o/l.npy"]},
    "trace": {"tokens": ["--tokens", "1,2"], "out": ["--out", "o/trace"]},
    "golden make": {"prompts": ["--prompts", "{prompts}"], "n_predict": ["-n", "2"], "out": ["--out", "o/g.golden.jsonl"]},
    "plot audit": {"out": ["--out", "o/p.png"]},
    "plot telemetry": {"out": ["--out", "o/p.png"]},
    "plot routes": {"out": ["--out", "o/p.png"]},
}
#: Flags that stand for a positional: audit --streams DIR for the STREAMs, run -m for MODEL (giving both is
#: refused, and walked with the base's positional alone).
REPLACES = {("audit", "stream_dir"): "streams", ("run", "m"): "model"}


def cases(command: str, parser, f) -> list[tuple[str, ...]]:
    """Command lines: the base, each value of each flag alone, then each pair of flags."""
    table = strings(f)
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    positionals = [a for a in actions if not a.option_strings]
    group = {a.dest: g for g in parser._mutually_exclusive_groups for a in g._group_actions}
    flags = {a.dest: values(command, a, table) for a in actions
             if a.option_strings or len(values(command, a, table)) > 1}
    base = {k: [w.format(prompts=f.prompts) for w in v] for k, v in BASE.get(command, {}).items()}

    def argv(chosen: dict) -> list[str]:
        given = {k: v for k, v in base.items()
                 if not any(k == d or (d in group and group.get(k) is group[d]) for d in chosen)}
        dropped = {REPLACES[(command, d)] for d in chosen if (command, d) in REPLACES}
        given.update(chosen)
        words = [w for dest, ws in given.items() if dest not in {p.dest for p in positionals} for w in ws]
        for p in positionals:  # after the flags: a bare --emulate / --pack meets MODEL
            if p.dest not in dropped or p.dest in chosen:
                words += given.get(p.dest, values(command, p, table)[0])
        return [*command.split(), *words]

    out = [argv({})]
    for dest, vals in flags.items():
        out += [argv({dest: v}) for v in vals]
    turn = {dest: itertools.cycle(vals) for dest, vals in flags.items()}
    for a, b in itertools.combinations(flags, 2):
        out.append(argv({a: next(turn[a]), b: next(turn[b])}))
    return list(dict.fromkeys(map(tuple, out)))


def run(argv, capsys) -> tuple[int | str, list[str]]:
    """``refimpl ARGV`` in this process: (exit code, or "raised …" for an exception, stderr lines)."""
    try:
        rc = main(list(argv))
    except BaseException as exc:  # noqa: BLE001 - a traceback is the finding
        where = traceback.extract_tb(exc.__traceback__)[-1]
        capsys.readouterr()
        return f"raised {''.join(traceback.format_exception_only(exc)).strip()} at {where.filename}:{where.lineno}", []
    return rc, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def verdict(command: str, rc, err: list[str]) -> str | None:
    """None when the outcome is exit 0, a verdict's exit 1, or a one-line refusal; else what went wrong."""
    if isinstance(rc, str):
        return rc
    if rc == 0 or (rc == 1 and command in VERDICT_EXIT_1):
        return None if not any("Traceback" in line for line in err) else "a traceback on stderr"
    if rc != 2:
        return f"exit {rc}: {err[-3:]}"
    errors = [line for line in err if not line.startswith(NOTES)]
    if len(errors) != 1 or not errors[0].startswith("refimpl: error:"):
        return f"exit 2 without one error line: {errors[:4]}"
    return None


#: A refusal for want of another flag ("--draft needs --mtp or --ngram", "… add --mtp"): the walk retries
#: the command line with that flag, so a flag that only works with another is also walked where it works.
NEEDS = re.compile(r"(?:needs|add) (--[a-z][\w-]*)")


@pytest.mark.parametrize("command", list(LEAVES))
def test_every_flag_pair_works_or_is_refused_in_one_line(command, files, capsys, monkeypatch):
    if command.startswith("plot"):
        from conftest import _require

        _require("matplotlib", "matplotlib", "plot")  # without it every plot is refused in one line: nothing to walk
    monkeypatch.chdir(files.dir)
    parser = LEAVES[command]
    bare = {opt for a in parser._actions if a.nargs == 0 for opt in a.option_strings}
    todo, seen, bad = list(cases(command, parser, files)), set(), []
    while todo:
        argv = todo.pop(0)
        if argv in seen:
            continue
        seen.add(argv)
        rc, err = run(argv, capsys)
        problem = verdict(command, rc, err)
        if problem:
            bad.append(f"refimpl {' '.join(argv)}: {problem}")
        elif rc == 2 and (m := NEEDS.search(err[-1])) and m[1] in bare and m[1] not in argv:
            todo.append((*argv[: len(command.split())], m[1], *argv[len(command.split()):]))
    assert not bad, f"{len(bad)} command lines neither work nor are refused in one line:\n" + "\n".join(bad)


def test_the_walk_sees_every_flag():
    """The walk derives its flags from the parser: every option of every command appears in its cases."""
    f = argparse.Namespace(dir=".", prompts="p", stream="s", stream_dir="d", golden="g", golden_emulated="e",
                           telemetry="t", routes="r")
    for command, parser in LEAVES.items():
        options = {max(a.option_strings, key=len) for a in parser._actions
                   if a.option_strings and not isinstance(a, argparse._HelpAction)}
        walked = {w.partition("=")[0] for argv in cases(command, parser, f) for w in argv}
        assert options <= walked, (command, options - walked)
