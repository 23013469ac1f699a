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

1. **Decode** with the path the settings name: :func:`refimpl.generate.greedy`, or
   :func:`refimpl.speculative.speculative_generate` with an MTP or n-gram drafter.
2. **Score** prompt + stream in one teacher-forced pass (:func:`walk`): row i holds
   the logits the oracle gives the token after prompt + ids[:i]. ``forward`` is batch-invariant, so
   these rows are bit-identical to the ones step 1 computed one token (or one verify batch) at a
   time; every generated id must be its row's argmax, which checks the decoding path for free.

Model arguments name a GGUF file or a built-in fixture (``builtin:tiny/q8_0``, see
:func:`refimpl.builtin.parse_builtin`). A file written by ``refimpl.fixtures`` carries its recipe in its metadata;
the header records it, so ``golden check`` can rebuild the model without being told where it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from refimpl.builtin import BUILTIN_PREFIX, FixtureRecipe, build_fixture, canonical_recipe, recipe_of, resolve_model, sha256_file
from refimpl.errors import RefimplError

FORMAT = "refimpl-golden"
VERSION = 1
TOP_K = 5
LOGIT_RTOL = 1e-5  # `golden check`: allowed |Δ top-k logit| / max |top-k logit| (numba and numpy agree bit for bit)
CHUNK = 32  # positions per teacher-forced forward call (batch invariance: any chunking gives the same bits)


# ---- prompts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    text: str | None  # None when the prompt was given as ids
    ids: list[int]


def read_prompts(path: str | os.PathLike, tokenizer, n_vocab: int) -> list[Prompt]:
    """A prompts file: JSON Lines with ``{"text": …}`` or ``{"tokens": [ids]}`` per line when its
    first non-blank line is a JSON object, else one text prompt per line (blank lines skipped).
    Text is tokenized as ``refimpl run -p`` does (special-token text parsed)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RefimplError(f"{path}: cannot read prompts file ({exc.__class__.__name__}: {exc})") from None
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise RefimplError(f"{path}: the prompts file holds no prompts")
    jsonl = numbered[0][1].lstrip().startswith("{")
    prompts = []
    for n, line in numbered:
        where = f"{path}:{n}"
        if not jsonl:
            prompts.append(Prompt(line, tokenizer.encode(line, parse_special=True)))
        else:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RefimplError(f"{where}: not a JSON object ({exc.msg}); a JSONL prompts file needs one per line") from None
            if not isinstance(obj, dict) or ("text" in obj) == ("tokens" in obj):
                raise RefimplError(f"{where}: expected an object with exactly one of 'text' or 'tokens'")
            if "text" in obj:
                if not isinstance(obj["text"], str):
                    raise RefimplError(f"{where}: 'text' must be a string")
                prompts.append(Prompt(obj["text"], tokenizer.encode(obj["text"], parse_special=True)))
            else:
                ids = obj["tokens"]
                if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                    raise RefimplError(f"{where}: 'tokens' must be a list of integer token ids")
                prompts.append(Prompt(None, ids))
        if not prompts[-1].ids:
            raise RefimplError(f"{where}: the prompt encodes to no tokens")
        bad = [t for t in prompts[-1].ids if not 0 <= t < n_vocab]
        if bad:
            raise RefimplError(f"{where}: token id {bad[0]} is out of range for this model's vocabulary [0, {n_vocab})")
    return prompts


# ---- the oracle's view of a stream -------------------------------------------------------------


@dataclass(frozen=True)
class Cursor:
    """The oracle part-way through a sequence: its state and the logits row [V] for the next token."""

    state: object  # refimpl.state.SeqState
    row: np.ndarray


def _feed(model, state, tokens: list[int], ctx, on_rows, chunk: int = CHUNK):
    """Forward ``tokens`` after ``state``, ``chunk`` positions per call; ``on_rows(offset, logits)``
    sees each chunk's rows. Batch invariance: any chunking gives bit-identical rows."""
    from refimpl.model import forward

    for start in range(0, len(tokens), chunk):
        logits, _, state = forward(model, state, tokens[start : start + chunk], ctx)  # [≤chunk, V]
        on_rows(start, logits)
    return state


def start(model, prompt: list[int], ctx) -> Cursor:
    """The oracle after reading the prompt."""
    from refimpl.state import SeqState

    last = []
    state = _feed(model, SeqState.fresh(model.config), list(prompt), ctx, lambda _, logits: last.append(logits[-1]))
    return Cursor(state, last[-1])


def walk(model, cur: Cursor, tokens: list[int], ctx, on_row) -> Cursor:
    """Teacher forcing: for i = 0 … len(tokens)−1 call ``on_row(i, row)`` with the logits the oracle
    gives the token after everything before tokens[i] (row 0 is ``cur.row``); return the cursor
    after all of them. Only one chunk of rows is held at a time."""
    if not tokens:
        return cur
    on_row(0, cur.row)
    last = [cur.row]

    def rows(offset, logits):
        for j in range(logits.shape[0]):
            if offset + j + 1 < len(tokens):
                on_row(offset + j + 1, logits[j])
        last[0] = logits[-1]

    state = _feed(model, cur.state, list(tokens), ctx, rows)
    return Cursor(state, last[0])


def top_k(row: np.ndarray, k: int = TOP_K) -> tuple[list[int], list[float]]:
    """The k best ids by logit, ties to the lower id (the greedy sampler's first maximum)."""
    ids = np.argsort(-row, kind="stable")[:k]
    return [int(i) for i in ids], [float(row[i]) for i in ids]


def step_record(row: np.ndarray) -> dict:
    ids, logits = top_k(row)
    return {"top_ids": ids, "top_logits": logits, "margin": logits[0] - logits[1]}


# ---- settings and one prompt -------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """Everything that decides a golden file's numbers (and nothing that does not, like --jobs)."""

    n_predict: int
    draft_source: str | None = None  # None (plain greedy), "mtp" or "ngram"
    n_draft: int = 0  # drafts per round; 0 without a source
    emulate: bool = False  # Ctx(act_quant=True, kv_f16=True)
    p_min: float = 0.0  # speculative_generate's MTP draft cut-off (its default)
    ngram_min_match: int = 3  # speculative_generate's n-gram gate (its default)

    def as_json(self) -> dict:
        draft = {"source": self.draft_source or "none", "n_draft": self.n_draft}
        if self.draft_source == "mtp":
            draft["p_min"] = self.p_min
        if self.draft_source == "ngram":
            draft["ngram_min_match"] = self.ngram_min_match
        return {"n_predict": self.n_predict, "draft": draft, "emulate": self.emulate, "top_k": TOP_K, "stop_at_eog": True}

    @classmethod
    def from_json(cls, obj: dict) -> Settings:
        d = obj["draft"]
        source = None if d["source"] == "none" else d["source"]
        return cls(int(obj["n_predict"]), source, int(d["n_draft"]), bool(obj["emulate"]),
                   float(d.get("p_min", 0.0)), int(d.get("ngram_min_match", 3)))

    def ctx(self, kernel: str = "numba"):
        from refimpl.ops import Ctx

        return Ctx(act_quant=self.emulate, kv_f16=self.emulate, kernel=kernel)

    def make_flags(self) -> list[str]:
        flags = ["-n", str(self.n_predict)]
        if self.draft_source:
            flags += [f"--{self.draft_source}", "--draft", str(self.n_draft)]
        return flags + (["--emulate"] if self.emulate else [])


@dataclass(frozen=True)
class PromptResult:
    ids: list[int]
    steps: list[dict]  # step_record per generated token
    stop: str  # "eog" or "n_predict"
    departure: int | None  # first step whose id is not its row's argmax (a decoding-path bug), or None
    draft: dict | None = None  # with a draft source: {"drafted", "accepted", "decodes"} (deterministic counters)


def decode(model, prompt: list[int], settings: Settings, ctx, eog_ids: frozenset) -> tuple[list[int], dict | None]:
    """Step 1: the stream, from the decoding path the settings name, and the drafter's counters
    (recorded so a golden made with --mtp also pins how many drafts the MTP head gets accepted)."""
    if settings.draft_source is None:
        from refimpl.generate import greedy

        return greedy(model, prompt, settings.n_predict, ctx, eog_ids=eog_ids), None
    from refimpl.speculative import speculative_generate

    tokens, stats = speculative_generate(model, prompt, settings.n_predict, ctx, source=settings.draft_source,
                                         n_draft=settings.n_draft, p_min=settings.p_min,
                                         ngram_min_match=settings.ngram_min_match, eog_ids=eog_ids)
    return [int(t) for t in tokens], {"drafted": stats.n_drafted, "accepted": stats.n_accepted, "decodes": stats.n_decodes}


def run_prompt(model, prompt: list[int], settings: Settings, ctx, eog_ids: frozenset) -> PromptResult:
    """Decode (step 1), then score the stream teacher-forced (step 2); see the module docstring."""
    ids, draft = decode(model, prompt, settings, ctx, eog_ids)
    steps = []
    walk(model, start(model, prompt, ctx), ids, ctx, lambda i, row: steps.append(step_record(row)))
    departure = next((i for i, s in enumerate(steps) if s["top_ids"][0] != ids[i]), None)
    stop = "eog" if ids and ids[-1] in eog_ids else "n_predict"
    return PromptResult(ids, steps, stop, departure, draft)


# ---- parallel runs: each worker process loads the model once ----------------------------------

_WORKER: dict = {}


def _worker_init(path: str, settings: Settings, kernel: str, threads: int | None) -> None:
    from refimpl.model import load_model
    from refimpl.tokenizer import Tokenizer

    if threads:
        import numba

        numba.set_num_threads(threads)  # thread count never changes a bit (docs/numerics.md)
    model = load_model(path)
    _WORKER.update(model=model, settings=settings, ctx=settings.ctx(kernel),
                   eog=frozenset(Tokenizer.from_gguf(model.file.gguf.reader).eog_ids))


def _worker_run(prompt: list[int]) -> PromptResult:
    w = _WORKER
    return run_prompt(w["model"], prompt, w["settings"], w["ctx"], w["eog"])


def run_all(path: Path, prompts: list[list[int]], settings: Settings, *, jobs: int = 1, kernel: str = "numba",
            desc: str = "golden") -> list[PromptResult]:
    """run_prompt for every prompt, in order; ``jobs`` > 1 spreads prompts over spawned worker
    processes (results are identical: each prompt's numbers depend only on the prompt)."""
    from tqdm import tqdm

    if jobs < 1:
        raise RefimplError(f"--jobs must be ≥ 1, got {jobs}")
    bar = tqdm(total=len(prompts), desc=desc, unit="prompt", file=sys.stderr, disable=None, leave=False)
    results: list[PromptResult | None] = [None] * len(prompts)
    try:
        if jobs == 1 or len(prompts) == 1:
            _worker_init(str(path), settings, kernel, None)
            for i, p in enumerate(prompts):
                results[i] = _worker_run(p)
                bar.update(1)
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            import numba

            threads = max(1, numba.config.NUMBA_NUM_THREADS // jobs)
            with ProcessPoolExecutor(max_workers=min(jobs, len(prompts)), mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_worker_init, initargs=(str(path), settings, kernel, threads)) as pool:
                futures = {pool.submit(_worker_run, p): i for i, p in enumerate(prompts)}
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.update(1)
    finally:
        _WORKER.clear()
        bar.close()
    return results


# ---- the file ------------------------------------------------------------------------------------


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def producer() -> dict:
    from importlib.metadata import version

    import refimpl

    return {"name": "refimpl", "version": refimpl.__version__, "numpy": np.__version__, "gguf": version("gguf")}


def write_golden(path: Path, header: dict, records: list[dict]) -> None:
    """Write header, records and the end record to a temporary file next to ``path``, then rename
    it into place: a reader sees the old file or the complete new one, never a part."""
    body = "".join(_dumps(r) + "\n" for r in [header, *records])
    end = {"record": "end", "prompts": len(records), "sha256": hashlib.sha256(body.encode("utf-8")).hexdigest()}
    data = (body + _dumps(end) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Golden:
    path: Path
    header: dict
    prompts: list[dict]

    @property
    def settings(self) -> Settings:
        return Settings.from_json(self.header["settings"])


def read_golden(path: str | os.PathLike) -> Golden:
    """Read and validate a golden file: format and version, one header first, an end record whose
    prompt count and sha256 match what precedes it (a truncated or edited file is refused)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RefimplError(f"{path}: cannot read golden file ({exc.strerror or exc})") from None
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    records = []
    for n, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise RefimplError(f"{path}:{n}: not a JSON record; not a golden file, or damaged") from None
    if not records or not isinstance(records[0], dict) or records[0].get("format") != FORMAT:
        raise RefimplError(f"{path}: not a golden file (the first record must be a '{FORMAT}' header)")
    header = records[0]
    if header.get("version") != VERSION:
        raise RefimplError(f"{path}: golden format version {header.get('version')!r}; this refimpl reads version {VERSION}")
    end = records[-1]
    if len(records) < 2 or not isinstance(end, dict) or end.get("record") != "end":
        raise RefimplError(f"{path}: incomplete golden file: no end record (truncated?); regenerate it: {header.get('regenerate', '')}")
    prompts = records[1:-1]
    if end.get("prompts") != len(prompts):
        raise RefimplError(f"{path}: incomplete golden file: the end record counts {end.get('prompts')} prompts, the file holds {len(prompts)}")
    body = data[: len(data) - len(lines[-1].encode("utf-8"))]
    if hashlib.sha256(body).hexdigest() != end.get("sha256"):
        raise RefimplError(f"{path}: golden file damaged or edited: its records do not match the end record's sha256")
    if any(not isinstance(r, dict) or r.get("record") != "prompt" for r in prompts):
        raise RefimplError(f"{path}: golden file holds a record that is not a prompt between header and end")
    return Golden(path, header, prompts)


# ---- golden make ---------------------------------------------------------------------------------


def make_golden(model_arg: str, prompts_path: str, settings: Settings, out: str | None = None, *,
                jobs: int = 1, kernel: str = "numba") -> Path:
    """``refimpl golden make``: decode and score every prompt, write the golden file; returns its path."""
    from refimpl.load import open_model
    from refimpl.tokenizer import Tokenizer

    if settings.n_predict < 1:
        raise RefimplError(f"-n must be ≥ 1, got {settings.n_predict}")
    path = resolve_model(model_arg)
    m = open_model(path)
    prompts = read_prompts(prompts_path, Tokenizer.from_gguf(m.gguf.reader), m.config.n_vocab)
    recipe = recipe_of(m.gguf)
    if out is None:
        out = (recipe.spec[len(BUILTIN_PREFIX):].replace("/", "-") if model_arg.startswith(BUILTIN_PREFIX) else path.stem) + ".golden.jsonl"
    results = run_all(path, [p.ids for p in prompts], settings, jobs=jobs, kernel=kernel)
    for i, r in enumerate(results):
        if r.departure is not None:  # cannot happen unless refimpl's decoding path is broken
            raise RuntimeError(f"refimpl bug: prompt {i}: the {settings.draft_source or 'greedy'} stream's step "
                               f"{r.departure} is not the teacher-forced argmax")
    model_json = {"file": path.name, "size": path.stat().st_size, "sha256": sha256_file(path),
                  "fixture": recipe.as_json() if recipe else None}
    header = {"record": "header", "format": FORMAT, "version": VERSION, "producer": producer(), "model": model_json,
              "settings": settings.as_json(),
              "regenerate": shlex.join(["refimpl", "golden", "make", recipe.spec if model_arg.startswith(BUILTIN_PREFIX) else model_arg,
                                        "--prompts", str(prompts_path), *settings.make_flags(), "--out", str(out)])}
    records = [{"record": "prompt", "index": i, "text": p.text, "prompt_ids": p.ids, "ids": r.ids, "stop": r.stop,
                **({"draft": r.draft} if r.draft is not None else {}), "steps": r.steps}
               for i, (p, r) in enumerate(zip(prompts, results))]
    write_golden(Path(out), header, records)
    return Path(out)


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
            from refimpl.audit import TIE_THRESHOLD

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
                 kernel: str = "numba") -> CheckResult:
    """``refimpl golden check``: recompute every prompt with the header's settings and compare."""
    from refimpl.tokenizer import Tokenizer

    g = read_golden(golden_path)
    path = _model_for_check(g, model_arg)
    tok = Tokenizer.from_gguf(path)
    settings = g.settings
    results = run_all(path, [r["prompt_ids"] for r in g.prompts], settings, jobs=jobs, kernel=kernel, desc="check")
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
                              f"draft {settings.draft_source or 'none'}, emulate {'on' if settings.emulate else 'off'})"])
