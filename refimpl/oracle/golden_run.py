"""Golden records computed: the oracle's view of a stream, the settings, one prompt, and many.

What :mod:`refimpl.oracle.golden` writes for one prompt is made here, in dataflow order: the teacher-forced
walk over a sequence (:class:`Cursor`, :func:`start`, :func:`walk`, :func:`top_k`,
:func:`step_record`; also used by ``refimpl audit``), the :class:`Settings` that decide a golden
file's numbers, one prompt decoded and scored (:func:`decode`, :func:`run_prompt`, its
:class:`PromptResult`), and many tasks on one model — every prompt of a suite (:func:`run_all`),
every stream pair of ``audit --streams`` — here, in worker processes or on a Dask cluster
(:func:`run_tasks`; each process opens the model once, :func:`loaded`). The module docstring of
:mod:`refimpl.oracle.golden` describes the two steps.
"""

from __future__ import annotations

import sys
import threading
from contextlib import closing
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from refimpl.errors import RefimplError

TOP_K = 5
#: Positions per teacher-forced forward call (in the definition and with --emulate=plain, batch invariance: any
#: chunking gives the same bits; under --emulate with flash attention and --emulate=ggml the chunk is a batch shape
#: and the bits depend on it, as llama.cpp's do on its batch). As the
#: CLI's LOGITS_CHUNK: a batch reads each routed expert it uses once, so with streamed experts fewer, longer
#: chunks read less (the full fixture's audit of 256 + 256 tokens read 135 GiB in chunks of 32).
CHUNK = 256


# ---- the oracle's view of a stream -------------------------------------------------------------


@dataclass(frozen=True)
class Cursor:
    """The oracle part-way through a sequence: its state and the logits row [V] for the next token."""

    state: object  # refimpl.model.state.SeqState
    row: np.ndarray


def _feed(model, state, tokens: list[int], ctx, on_rows, chunk: int = CHUNK, outputs: str = "all"):
    """Forward ``tokens`` after ``state``, ``chunk`` positions per call; ``on_rows(offset, logits)``
    sees each chunk's rows (``outputs="last"``: its last row only). In the definition and with
    ``--emulate=plain`` any chunking gives bit-identical rows (batch invariance); under ``--emulate`` with flash
    attention and ``--emulate=ggml`` it does not (docs/numerics.md, "Batch invariance")."""
    from refimpl.model.trunk import forward

    for start in range(0, len(tokens), chunk):
        logits, _, state = forward(model, state, tokens[start : start + chunk], ctx, outputs=outputs)  # [≤chunk or 1, V]
        on_rows(start, logits)
    return state


def start(model, prompt: list[int], ctx) -> Cursor:
    """The oracle after reading the prompt."""
    from refimpl.model.state import SeqState

    last = []
    state = _feed(model, SeqState.fresh(model.config), list(prompt), ctx, lambda _, logits: last.append(logits[-1]), outputs="last")
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
    emulate: bool = False  # Ctx(act_quant=True): llama.cpp's activation quantization
    p_min: float = 0.0  # speculative_generate's MTP draft cut-off (its default)
    ngram_min_match: int = 3  # speculative_generate's n-gram gate (its default)
    kv_f16: bool | None = None  # F16 K/V cache; None: = emulate (what files from before --emulate=CONFIG mean)
    flash_attn: bool = False  # llama.cpp's flash attention
    # --emulate=ggml: the emulated ggml-cpu path (Ctx.ggml, recorded: `golden check` recomputes that path whatever
    # library it finds) and the llama.cpp settings that decide its bits; ggml_accepted: the libggml's own version when
    # it was not the one the kernels follow and --ggml-version-ok accepted it
    ggml: str | None = None
    n_ubatch: int = 512
    n_threads: int = 4
    n_ctx: int | None = None
    repack: bool = True
    ggml_accepted: str | None = None
    ggml_named: bool = False  # --emulate=ggml:PATH: the path named, not detected (regenerated on any machine)

    def as_json(self) -> dict:
        draft = {"source": self.draft_source or "none", "n_draft": self.n_draft}
        if self.draft_source == "mtp":
            draft["p_min"] = self.p_min
        if self.draft_source == "ngram":
            draft["ngram_min_match"] = self.ngram_min_match
        out = {"n_predict": self.n_predict, "draft": draft, "emulate": self.emulate, "top_k": TOP_K, "stop_at_eog": True}
        if self.kv_f16 is not None and (self.kv_f16 != self.emulate or self.flash_attn):
            out["kv_cache"] = "f16" if self.kv_f16 else "f32"  # only when it differs from the legacy meaning
        if self.flash_attn:
            out["flash_attn"] = True
        if self.ggml:
            from kernels.ggml.build import GGML_VERSION

            out["ggml"] = {"path": self.ggml, "version": GGML_VERSION, "n_ubatch": self.n_ubatch, "n_threads": self.n_threads,
                           "n_ctx": self.n_ctx, "repack": self.repack}
            if self.ggml_accepted is not None:
                out["ggml"]["library_version"] = self.ggml_accepted  # accepted with --ggml-version-ok
            if self.ggml_named:
                out["ggml"]["named"] = True  # --emulate=ggml:PATH, no library read
            out["numerics"] = self.ctx().numerics()
        return out

    @classmethod
    def from_json(cls, obj: dict) -> Settings:
        d = obj["draft"]
        source = None if d["source"] == "none" else d["source"]
        kv = obj.get("kv_cache")
        g = obj.get("ggml") or {}
        ggml = {"ggml": g["path"], "n_ubatch": int(g["n_ubatch"]), "n_threads": int(g["n_threads"]),
                "n_ctx": None if g.get("n_ctx") is None else int(g["n_ctx"]), "repack": bool(g.get("repack", True)),
                "ggml_accepted": g.get("library_version"), "ggml_named": bool(g.get("named", False))} if g else {}
        return cls(int(obj["n_predict"]), source, int(d["n_draft"]), bool(obj["emulate"]),
                   float(d.get("p_min", 0.0)), int(d.get("ngram_min_match", 3)),
                   None if kv is None else kv == "f16", bool(obj.get("flash_attn", False)), **ggml)

    def ctx(self, kernel: str = "numba"):
        from refimpl.model.ops import Ctx

        kv_f16 = self.emulate if self.kv_f16 is None else self.kv_f16
        ggml = dict(ggml=self.ggml, n_ubatch=self.n_ubatch, n_threads=self.n_threads, n_ctx=self.n_ctx, repack=self.repack,
                    ggml_accepted=self.ggml_accepted, ggml_named=self.ggml_named) if self.ggml else {}
        return Ctx(act_quant=self.emulate, kv_f16=kv_f16, flash_attn=self.flash_attn, kernel=kernel, **ggml)

    def make_flags(self) -> list[str]:
        flags = ["-n", str(self.n_predict)]
        if self.draft_source:
            flags += [f"--{self.draft_source}", "--draft", str(self.n_draft)]
        ctx = self.ctx()
        if self.ggml:  # the path is the library's: regenerated on a library that takes it
            flags += [f"--emulate=ggml:{self.ggml}" if self.ggml_named else "--emulate=ggml", "--ubatch-size", str(self.n_ubatch), "--threads", str(self.n_threads)]
            flags += (["--ctx-size", str(self.n_ctx)] if self.n_ctx else []) + ([] if self.repack else ["--no-repack"])
            flags += ["--ggml-version-ok"] if self.ggml_accepted is not None else []
            return flags + ["--kv-type", "f16" if ctx.kv_f16 else "f32", "--flash-attn", "on" if ctx.flash_attn else "off"]
        if self.emulate:
            flags += ["--emulate=plain"]
        if ctx.kv_f16:
            flags += ["--kv-type", "f16"]
        if ctx.flash_attn:
            flags += ["--flash-attn", "on"]
        return flags


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
        from refimpl.decode.greedy import greedy

        return greedy(model, prompt, settings.n_predict, ctx, eog_ids=eog_ids), None
    from refimpl.decode.speculative import speculative_generate

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


# ---- many tasks on one model: here, in worker processes, or on a Dask cluster -------------------


@dataclass(frozen=True)
class ModelJob:
    """How every task of a run opens the model; a worker process opens it once and keeps it."""

    path: str
    kernel: str = "numba"
    cache_mb: int | str | None = None  # None: routed experts pinned (memory map); else --cache-mb (refimpl.io.streamer)
    sha256: str | None = None  # checked before the first load (cluster workers: the file must be the client's)
    threads: int | None = None  # numba threads in a worker process (None: as the process was started)
    ggml: tuple[str, bool] | None = None  # --emulate=ggml: (path, repack), the weights laid out for its kernels


@dataclass(frozen=True)
class Loaded:
    model: object  # refimpl.model.trunk.Model
    eog: frozenset  # the tokenizer's end-of-generation ids


_LOADED: dict = {}  # this process's model, {(path, sha256, cache_mb, ggml): Loaded}, one entry at most
_LOAD_LOCK = threading.Lock()  # a Dask worker with --nthreads > 1 runs tasks in threads


def _check_file(job: ModelJob) -> None:
    """The file at ``job.path`` is the one the run is about (its sha256 is ``job.sha256``)."""
    from refimpl.fixtures.builtin import sha256_file
    from refimpl.oracle.cluster import SAME_FILE

    path = Path(job.path)
    if not path.is_file():
        raise RefimplError(f"{path}: no such file ({SAME_FILE})")
    sha = sha256_file(path)
    if sha != job.sha256:
        raise RefimplError(f"{path}: sha256 {sha[:12]}… on this worker, but the run is for {job.sha256[:12]}… (another "
                           f"file at the same path; {SAME_FILE})")


def loaded(job: ModelJob) -> Loaded:
    """This process's model for ``job``, opened on first use (file checked when ``job.sha256`` is set)."""
    key = (job.path, job.sha256, job.cache_mb, job.ggml)
    with _LOAD_LOCK:
        if key not in _LOADED:
            from refimpl.model.trunk import load_model
            from refimpl.tokenizer import Tokenizer

            _LOADED.clear()  # one model per process: a run for another file drops the previous one
            if job.threads:
                import numba

                numba.set_num_threads(job.threads)  # thread count never changes a bit (docs/numerics.md)
            if job.sha256 is not None:
                _check_file(job)
            model = load_model(job.path, job.cache_mb, progress=False, ggml=job.ggml)
            _LOADED[key] = Loaded(model, frozenset(Tokenizer.from_gguf(model.file.gguf).eog_ids))
        return _LOADED[key]


def _in_processes(job: ModelJob, fn, items: list, jobs: int):
    """(index, fn(job, item)) as they complete, over ``jobs`` spawned processes sharing the cores."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    import numba

    job = replace(job, threads=max(1, numba.config.NUMBA_NUM_THREADS // jobs))
    with ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(fn, job, x): i for i, x in enumerate(items)}
        for fut in as_completed(futures):
            yield futures[fut], fut.result()


def run_tasks(job: ModelJob, fn, items: list, *, jobs: int = 1, cluster: str | None = None, desc: str = "golden",
              unit: str = "prompt") -> list:
    """``[fn(job, item) for item in items]``, in order, with a tqdm bar on stderr counting items done.
    ``fn`` is a module-level function (or a partial of one): it gets the model from :func:`loaded`.
    ``jobs`` > 1 spreads items over spawned processes; ``cluster`` (a Dask scheduler address) over a
    Dask cluster's workers (:mod:`refimpl.oracle.cluster`). Results are the same whichever runs them: each
    item's numbers depend only on the item."""
    from tqdm import tqdm

    if jobs < 1:
        raise RefimplError(f"--jobs must be ≥ 1, got {jobs}")
    bar = tqdm(total=len(items), desc=desc, unit=unit, file=sys.stderr, disable=None, leave=False)
    results: list = [None] * len(items)
    try:
        if cluster is not None:
            from refimpl.oracle.cluster import run_on_cluster

            done = run_on_cluster(cluster, job, fn, items)
        elif jobs == 1 or len(items) == 1:
            done = ((i, fn(job, x)) for i, x in enumerate(items))
        else:
            done = _in_processes(job, fn, items, jobs)
        with closing(done):
            for i, r in done:
                results[i] = r
                bar.update(1)
    finally:
        _LOADED.clear()
        bar.close()
    return results


def _prompt_task(settings: Settings, announce, job: ModelJob, prompt: list[int]) -> PromptResult:
    m = loaded(job)
    ctx = replace(settings.ctx(job.kernel), announce=announce)  # Ctx.announce: not a setting, not in the file
    return run_prompt(m.model, prompt, settings, ctx, m.eog)


def run_all(path: Path, prompts: list[list[int]], settings: Settings, *, jobs: int = 1, kernel: str = "numba",
            desc: str = "golden", cluster: str | None = None, cache_mb: int | str | None = None,
            sha256: str | None = None, announce=None) -> list[PromptResult]:
    """run_prompt for every prompt, in order (:func:`run_tasks`: here, in ``jobs`` processes, or on a
    Dask ``cluster``, whose workers check that their file has ``sha256``; local processes open the
    very file the caller read). ``announce``: ``Ctx.announce`` (the CLI's stderr line of --emulate=ggml, said
    by the first prompt computed here; a worker process's copy is silent)."""
    job = ModelJob(str(path), kernel, cache_mb, sha256 if cluster is not None else None,
                   ggml=(settings.ggml, settings.repack) if settings.ggml else None)
    return run_tasks(job, partial(_prompt_task, settings, announce), prompts, jobs=jobs, cluster=cluster, desc=desc)
