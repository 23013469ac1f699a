"""Golden token streams: the oracle's greedy output for a prompt suite, with the evidence behind it.

A golden file pins what refimpl generates for a set of prompts on one exact GGUF, so later changes
(to refimpl, or to an engine gated on it) can be checked token for token. It is JSON Lines
(docs/golden.md gives every field)::

    {"record": "header", "format": "refimpl-golden", "version": 1, "producer": …, "model": …,
     "settings": …, "regenerate": "refimpl golden make …"}
    {"record": "prompt", "index": 0, "text": …, "prompt_ids": […], "ids": […], "stop": …,
     "steps": [{"top_ids": [5 ids], "top_logits": [5 logits], "margin": top-1 − top-2}, …]}
    …
    {"record": "end", "prompts": N, "sha256": <hex digest of every byte before this line>}

How one prompt's record is made (:func:`run_prompt`):

1. **Decode** with the path the settings name: :func:`refimpl.decode.greedy.greedy`, or
   :func:`refimpl.decode.speculative.speculative_generate` with an MTP or n-gram drafter.
2. **Score** prompt + stream in one teacher-forced pass (:func:`walk`): row i holds
   the logits the oracle gives the token after prompt + ids[:i]. ``forward`` is batch-invariant, so
   these rows are bit-identical to the ones step 1 computed one token (or one verify batch) at a
   time; every generated id must be its row's argmax, which checks the decoding path for free.

Model arguments name a GGUF file or a built-in fixture (``builtin:tiny/q8_0``, see
:func:`refimpl.fixtures.builtin.parse_builtin`). A file written by ``refimpl.fixtures`` carries its recipe in its metadata;
the header records it, so ``golden check`` can rebuild the model without being told where it is.

Where things live, in dataflow order: :mod:`refimpl.oracle.golden_run` (the oracle's view of a stream,
:class:`Settings`, one prompt decoded and scored, :func:`run_all` over worker processes or a Dask
cluster, :mod:`refimpl.oracle.cluster`) →
:mod:`refimpl.oracle.golden_file` (the prompts file read, the golden file written, read and validated) →
this module (``golden make`` and ``golden check``: :func:`make_golden`, :func:`check_golden` and the
comparison report). Every name of the two is importable from here too.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from refimpl.fixtures.builtin import (BUILTIN_PREFIX, FixtureRecipe, build_fixture, canonical_recipe, is_trained_spec, recipe_of, resolve_model,
                             sha256_file)
from refimpl.errors import RefimplError
from refimpl.oracle.golden_file import FORMAT, VERSION, Golden, Prompt, producer, read_golden, read_prompts, write_golden
from refimpl.io.output_path import check_output, writing
from refimpl.oracle.golden_run import (
    CHUNK,
    TOP_K,
    Cursor,
    PromptResult,
    Settings,
    decode,
    run_all,
    run_prompt,
    start,
    step_record,
    top_k,
    walk,
)

TIE_THRESHOLD = 0.05  # τ, the audit's near-tie rule: near-tie when every token involved is within τ·max|logit| of the oracle's maximum


def check_tau(tau: float) -> float:
    """``tau`` (``--threshold``) when it is a fraction in (0, 1); else one line."""
    if not 0 < tau < 1:
        raise RefimplError(f"--threshold must be in (0, 1), got {tau}")
    return tau


__all__ = [
    "CHUNK", "FORMAT", "LOGIT_RTOL", "TOP_K", "VERSION", "CheckResult", "Cursor", "Golden", "Prompt", "PromptResult",
    "Settings", "check_golden", "compare_prompt", "decode", "make_golden", "producer", "read_golden", "read_prompts",
    "run_all", "run_prompt", "show_piece", "start", "step_record", "top_k", "walk", "write_golden",
]

LOGIT_RTOL = 1e-5  # `golden check`: allowed |Δ top-k logit| / max |top-k logit| (numba and numpy agree bit for bit)


# ---- golden make ---------------------------------------------------------------------------------


def make_golden(model_arg: str, prompts_path: str, settings: Settings, out: str | None = None, *,
                jobs: int = 1, kernel: str = "numba", cluster: str | None = None, cache_mb: int | str | None = None,
                announce=None) -> Path:
    """``refimpl golden make``: decode and score every prompt, write the golden file; returns its path.
    ``jobs`` processes or a Dask ``cluster`` (scheduler address) share the prompts; ``cache_mb``
    streams routed experts (``--cache-mb``); none of the three changes a byte of the file. ``announce``:
    ``Ctx.announce``, the command's stderr line of --emulate=ggml (:func:`refimpl.oracle.golden_run.run_all`)."""
    from refimpl.io.load import open_model
    from refimpl.tokenizer import Tokenizer

    if settings.n_predict < 1:
        raise RefimplError(f"-n must be ≥ 1, got {settings.n_predict}")
    path = resolve_model(model_arg)
    m = open_model(path)
    prompts = read_prompts(prompts_path, Tokenizer.from_gguf(m.gguf), m.config.n_vocab)
    recipe = recipe_of(m.gguf)
    fixture_arg = model_arg.startswith(BUILTIN_PREFIX) and recipe is not None  # builtin:PRESET…, not builtin:kjv
    if out is None:
        out = (recipe.spec[len(BUILTIN_PREFIX):].replace("/", "-") if fixture_arg else path.stem) + ".golden.jsonl"
    check_output(out, "--out")  # before decoding (refimpl.io.output_path)
    sha = sha256_file(path)
    results = run_all(path, [p.ids for p in prompts], settings, jobs=jobs, kernel=kernel, cluster=cluster,
                      cache_mb=cache_mb, sha256=sha, announce=announce)
    for i, r in enumerate(results):
        if r.departure is not None:  # cannot happen unless refimpl's decoding path is broken
            raise RuntimeError(f"refimpl bug: prompt {i}: the {settings.draft_source or 'greedy'} stream's step "
                               f"{r.departure} is not the teacher-forced argmax")
    model_json = {"file": path.name, "size": path.stat().st_size, "sha256": sha,
                  "fixture": recipe.as_json() if recipe else None,
                  **({"builtin": model_arg} if is_trained_spec(model_arg) else {})}
    header = {"record": "header", "format": FORMAT, "version": VERSION, "producer": producer(), "model": model_json,
              "settings": settings.as_json(),
              "regenerate": shlex.join(["refimpl", "golden", "make", recipe.spec if fixture_arg else model_arg,
                                        "--prompts", str(prompts_path), *settings.make_flags(), "--out", str(out)])}
    records = [{"record": "prompt", "index": i, "text": p.text, "prompt_ids": p.ids, "ids": r.ids, "stop": r.stop,
                **({"draft": r.draft} if r.draft is not None else {}), "steps": r.steps}
               for i, (p, r) in enumerate(zip(prompts, results))]
    with writing(out, "--out") as out_path:
        write_golden(out_path, header, records)
    return out_path


# ---- golden check --------------------------------------------------------------------------------


@dataclass
class CheckResult:
    ok: bool
    lines: list[str]  # the report, one message per line


def _model_for_check(g: Golden, model_arg: str | None) -> Path:
    """The model to recompute with, its sha256 checked against the header (RefimplError if not)."""
    m = g.header["model"]
    fixture = m.get("fixture")
    hint = f"regenerate the golden file if the model changed on purpose: {g.header.get('regenerate', '')}"
    if model_arg is None and m.get("builtin"):  # the packaged trained model
        model_arg = m["builtin"]
    if model_arg is None:
        if not fixture:
            raise RefimplError(f"{g.path}: made from {m['file']}, not a built-in fixture; pass MODEL (the GGUF file)")
        recipe = canonical_recipe(FixtureRecipe(fixture["preset"], fixture["quant"], fixture["seed"], fixture["options"]))
        path = build_fixture(recipe)
        if sha256_file(path) != m["sha256"]:
            path = _rebuild(recipe, path)  # the cache may hold a file from an older generator
        sha = sha256_file(path)
        if sha != m["sha256"]:
            made_with, here = g.header["producer"].get("numpy"), np.__version__
            why = (f"fixture bytes depend on numpy's random streams (golden made with numpy {made_with}, this is {here})"
                   if made_with != here else "the fixture generator changed since the golden was made")
            raise RefimplError(f"{g.path}: rebuilt {recipe.spec} has sha256 {sha[:12]}…, the golden was made from "
                               f"{m['sha256'][:12]}…: {why}; {hint}")
        return path
    path = resolve_model(model_arg)
    if not path.is_file():
        raise RefimplError(f"{path}: no such file")
    sha = sha256_file(path)
    if sha != m["sha256"]:
        raise RefimplError(f"{path}: sha256 {sha[:12]}… differs from the golden's model {m['file']} ({m['sha256'][:12]}…); "
                           f"a golden holds only for the exact file it was made from; {hint}")
    return path


def _rebuild(recipe: FixtureRecipe, cached: Path) -> Path:
    """Write the fixture afresh next to the cached copy and replace it (used when the cached bytes
    disagree with a golden header: a stale cache is a rebuild away from the truth)."""
    from refimpl.fixtures import write_fixture

    tmp = cached.with_name(cached.name + ".rebuild.gguf")
    write_fixture(tmp, preset=recipe.preset, quant=recipe.quant, seed=recipe.seed, **recipe.options)
    os.replace(tmp, cached)
    return cached


def show_piece(tok, tid: int) -> str:
    """A token's text as a Python literal: ``' fox'``, or ``b'\\x81'`` for part of a UTF-8 character."""
    piece = tok.piece(tid)
    try:
        return repr(piece.decode("utf-8"))
    except UnicodeDecodeError:
        return repr(piece)


def _show(tok, tid: int) -> str:
    return f"{tid} {show_piece(tok, tid)}"


def _prompt_label(rec: dict) -> str:
    text = rec.get("text")
    shown = repr(text if len(text) <= 60 else text[:57] + "…") if text is not None else f"ids {rec['prompt_ids'][:8]}{'…' if len(rec['prompt_ids']) > 8 else ''}"
    return f"prompt {rec['index']} {shown} ({len(rec['prompt_ids'])} ids)"


def compare_prompt(rec: dict, now: PromptResult, tok) -> list[str]:
    """Differences between a golden record and a recomputation, as report lines (empty: equal)."""
    g_ids = rec["ids"]
    if now.departure is not None:
        return [f"{_prompt_label(rec)}: the recomputed stream departs from the teacher-forced argmax at step "
                f"{now.departure} (a bug in refimpl's decoding path, not a numerics change)"]
    n = next((i for i, (a, b) in enumerate(zip(g_ids, now.ids)) if a != b), None)
    if n is None and len(g_ids) != len(now.ids):
        n = min(len(g_ids), len(now.ids))
    if n is not None:
        lines = [f"{_prompt_label(rec)}: first divergence at generated step {n} (position {len(rec['prompt_ids']) + n})"]
        g_tok = _show(tok, g_ids[n]) if n < len(g_ids) else "end of stream"
        n_tok = _show(tok, now.ids[n]) if n < len(now.ids) else "end of stream"
        gs = rec["steps"][n] if n < len(rec["steps"]) else None
        ns = now.steps[n] if n < len(now.steps) else None
        lines.append(f"  golden token {g_tok}" + (f", margin then {gs['margin']:.6g}" if gs else ""))
        lines.append(f"  now    token {n_tok}" + (f", margin now {ns['margin']:.6g} (top-1 {ns['top_ids'][0]} "
                                                    f"{ns['top_logits'][0]:.6g}, top-2 {ns['top_ids'][1]} {ns['top_logits'][1]:.6g})" if ns else ""))
        if gs and ns:
            scale = max(abs(x) for x in gs["top_logits"] + ns["top_logits"])
            rel = max(gs["margin"], ns["margin"]) / scale
            lines.append(f"  {'a near-tie' if rel <= TIE_THRESHOLD else 'not a near-tie'}: the larger margin is {100 * rel:.2g}% "
                         f"of the largest top logit ({'a small numerics change can flip it' if rel <= TIE_THRESHOLD else 'the numbers changed materially'})")
        return lines
    if rec.get("draft") != now.draft:
        return [f"{_prompt_label(rec)}: tokens match, but the drafter's counters changed: golden {rec.get('draft')} "
                f"now {now.draft} (the draft source proposes different tokens than when the golden was made)"]
    for i, (gs, ns) in enumerate(zip(rec["steps"], now.steps)):
        scale = max(max(abs(x) for x in gs["top_logits"]), 1e-30)
        diff = max(abs(a - b) for a, b in zip(gs["top_logits"], ns["top_logits"])) / scale
        if diff > LOGIT_RTOL:
            return [f"{_prompt_label(rec)}: tokens match, but step {i}'s top-{TOP_K} logits moved by {diff:.2g} of the "
                    f"largest (allowed {LOGIT_RTOL:g}): golden {gs['top_logits']} now {ns['top_logits']}"]
    return []


def check_golden(golden_path: str | os.PathLike, model_arg: str | None = None, *, jobs: int = 1,
                 kernel: str = "numba", cluster: str | None = None, cache_mb: int | str | None = None) -> CheckResult:
    """``refimpl golden check``: recompute every prompt with the header's settings and compare
    (in ``jobs`` processes, or on a Dask ``cluster`` whose workers check the file's sha256 against the header's)."""
    from refimpl.tokenizer import Tokenizer

    g = read_golden(golden_path)
    path = _model_for_check(g, model_arg)
    tok = Tokenizer.from_gguf(path)
    settings = g.settings
    results = run_all(path, [r["prompt_ids"] for r in g.prompts], settings, jobs=jobs, kernel=kernel, desc="check",
                      cluster=cluster, cache_mb=cache_mb, sha256=g.header["model"]["sha256"])
    lines, bad = [], 0
    for rec, now in zip(g.prompts, results):
        diff = compare_prompt(rec, now, tok)
        bad += bool(diff)
        lines += diff
    n_tok = sum(len(r["ids"]) for r in g.prompts)
    what = g.header["model"]["fixture"]["spec"] if g.header["model"].get("fixture") else g.header["model"]["file"]
    if bad:
        lines.append(f"{g.path}: MISMATCH in {bad} of {len(g.prompts)} prompts ({what})")
        lines.append(f"if the change is intended, regenerate: {g.header.get('regenerate', '')}")
        return CheckResult(False, lines)
    return CheckResult(True, [f"{g.path}: ok, {len(g.prompts)} prompts, {n_tok} tokens match ({what}, "
                              f"draft {settings.draft_source or 'none'}, emulate {settings.ctx().numerics()})"])
