"""refimpl's Python API: the calls a harness makes, as the ``refimpl`` commands make them.

::

    import refimpl

    model = refimpl.load("builtin:kjv")                      # a GGUF path or builtin:NAME; emulate=… as --emulate
    ids = model.encode("And the LORD said unto Moses,")
    logits, state = refimpl.forward(model, ids)               # (T, V) float32, and the state after the T tokens
    out = refimpl.generate(model, ids, 32)                    # greedy, as `refimpl run`
    fast = refimpl.generate(model, ids, 32, draft="mtp")      # speculative: the same tokens, fewer trunk decodes
    report = refimpl.audit(model, ids, out.tokens)            # refimpl.oracle.audit.Report; .verdict, .exit_code
    acts = refimpl.trace(model, ids)                          # {"attn_norm-0": array [T, n], …}

Each function is a thin wrapper over what a command calls (no second implementation):

=====================  ==========================  ===========================================================
API                    command                     calls
=====================  ==========================  ===========================================================
:func:`load`           MODEL, ``--emulate`` …      refimpl.cli.common.ctx_from_args, .load_named; Tokenizer.from_gguf
:func:`forward`        ``refimpl logits``          refimpl.model.trunk.forward on a refimpl.model.state.SeqState
:func:`generate`       ``refimpl run [--mtp]``     refimpl.decode.greedy.greedy, refimpl.decode.speculative.speculative_generate
:func:`audit`          ``refimpl audit``           refimpl.oracle.audit.audit (streams read by refimpl.oracle.stream_file)
:func:`trace`          ``refimpl trace``           refimpl.model.trunk.forward with a refimpl.oracle.trace.Recorder / Patcher
=====================  ==========================  ===========================================================

The numerics (``emulate`` and the fine flags) are chosen once, at :func:`load`, as a llama.cpp context's
settings are; state is explicit and never changed in place: :func:`forward` takes a state and returns a new
one, the old one stays valid (roll back by keeping it). Bad arguments raise :class:`refimpl.errors.RefimplError`
with a one-line message, as the commands refuse bad flags.

Importing this module is cheap: everything heavy (numpy, numba, the model) is imported inside the functions.

May import everything below it, the commands' shared helpers (``refimpl.cli.common``) included; nothing in
refimpl imports it but the package top, ``refimpl/__init__.py`` (tests/test_layout.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from refimpl.errors import RefimplError

#: ``generate(draft=…)``: the draft sources of ``refimpl run --mtp`` / ``--ngram`` (None: plain greedy)
DRAFTS = (None, "mtp", "ngram")


@dataclass(frozen=True)
class Oracle:
    """A loaded model with its numerics and its tokenizer: what :func:`load` returns, what the other
    functions take.

    * ``name``: the model as given to :func:`load` (a path or ``builtin:NAME``), as reports name it;
    * ``model``: the :class:`refimpl.model.load.Model` (``model.config``, ``model.file``, ``model.weights``);
    * ``ctx``: the :class:`refimpl.model.ctx.Ctx` of the numerics chosen at load (``ctx.numerics()`` says which);
    * ``tokenizer``: the GGUF's :class:`refimpl.tokenizer.Tokenizer`.
    """

    name: str
    model: Any
    ctx: Any
    tokenizer: Any

    def __repr__(self) -> str:  # not the weights
        c = self.config
        return f"Oracle({self.name!r}: {c.arch.name}, {c.n_layer} layers, vocabulary {c.n_vocab}; numerics {self.ctx.numerics()})"

    @property
    def config(self):
        """The model's :class:`refimpl.io.config.Config` (``n_vocab``, ``n_layer``, ``arch``, …)."""
        return self.model.config

    def encode(self, text: str, *, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` as llama.cpp's ``llama_tokenize`` gives them (special-token text parsed, as
        ``refimpl run -p`` does)."""
        if not isinstance(text, str):
            raise RefimplError(f"encode: expected a str, got {type(text).__name__}")
        return self.tokenizer.encode(text, parse_special=parse_special)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids (``llama_detokenize``; invalid UTF-8 replaced)."""
        return self.tokenizer.decode(_ids(self, ids, "decode", text=False, empty=True))


@dataclass(frozen=True)
class Generation:
    """What :func:`generate` returns: ``tokens`` (the generated ids, an end-of-generation token included,
    as ``refimpl run --json`` prints them), ``text`` (their text) and, for a speculative run, ``stats``: the
    :class:`refimpl.decode.speculative.SpecStats` (``stats.counters()`` and ``stats.rounds()`` are
    ``run --json``'s ``stats`` and ``rounds``; ``stats.rows`` the telemetry CSV's); None for plain greedy."""

    tokens: list[int]
    text: str
    stats: Any = None


def load(model: str | os.PathLike = "builtin:kjv", *, emulate: str | None = None, flash_attn: bool | None = None,
         kv_type: str | None = None, kernel: str = "numba", repack: bool = True, n_threads: int | None = None,
         n_ubatch: int | None = None, n_ctx: int | None = None, ggml_version_ok: bool = False,
         cache_mb: int | str | None = None, pack: bool | str = "auto") -> Oracle:
    """Open ``model`` (a GGUF path, ``builtin:kjv`` — the built-in trained model, the default — or
    ``builtin:PRESET[/QUANT]``, built on first use) with the numerics of the commands' flags:

    * ``emulate``: None (the definition), ``"default"`` / ``"plain"`` (llama.cpp's rounding points, float noise
      apart), ``"ggml"`` (bit for bit as the libggml-cpu llama-cpp-python loads: ``--emulate=ggml``) or
      ``"ggml:avx512"`` / ``"ggml:avx2"`` / ``"ggml:generic"`` (that path bit for bit, named: no library loaded);
      ``flash_attn`` (bool) and ``kv_type`` (``"f16"`` | ``"f32"``) override its configuration; ``kernel``:
      ``"numba"`` or ``"numpy"`` (the plain definitions, the same bits) — docs/numerics.md;
    * with ``emulate="ggml[:PATH]"`` only: ``repack`` (False = llama.cpp's ``--no-repack``), ``n_threads``, ``n_ubatch``,
      ``n_ctx`` (llama.cpp's -t, -ub, -c) and ``ggml_version_ok`` (``--ggml-version-ok``);
    * ``cache_mb``: None (routed experts memory-mapped, the default) or a budget in MiB / ``"auto"``: streamed
      through an LRU cache (``run --cache-mb``, docs/streamer.md); ``pack``: True / False / ``"auto"``
      (``run --pack``: the fast kernels' copy of the matrices; never changes a number).
    """
    import argparse

    from kernels.ggml.build import NAMED_PATHS
    from refimpl.cli.common import ctx_from_args, load_named
    from refimpl.model.ops import EMULATIONS
    from refimpl.tokenizer import Tokenizer

    if not isinstance(model, (str, os.PathLike)):
        raise RefimplError(f"load: model is a GGUF path or builtin:NAME, got {type(model).__name__}")
    _choice("emulate", emulate, (None, *EMULATIONS, *NAMED_PATHS))
    _choice("flash_attn", flash_attn, (None, True, False))
    _choice("kv_type", kv_type, (None, "f16", "f32"))
    _choice("kernel", kernel, ("numba", "numpy"))
    _choice("pack", pack, (True, False, "auto"))
    ggml_only = {"repack": repack is not True, "n_threads": n_threads is not None, "n_ubatch": n_ubatch is not None,
                 "n_ctx": n_ctx is not None, "ggml_version_ok": ggml_version_ok is not False}
    for name, given in ggml_only.items():
        if given and not (emulate or "").startswith("ggml"):
            raise RefimplError(f"load: {name}= describes the llama.cpp that emulate='ggml' emulates; give it with emulate='ggml'")
    if ggml_version_ok and (emulate or "").startswith("ggml:"):
        raise RefimplError(f"load: ggml_version_ok= accepts a loaded libggml of another ggml version; emulate={emulate!r} loads none")
    for name, value in (("n_threads", n_threads), ("n_ubatch", n_ubatch), ("n_ctx", n_ctx)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "n_ctx" else 1)):
            raise RefimplError(f"load: {name} must be a {'whole number ≥ 0' if name == 'n_ctx' else 'positive whole number'}, got {value!r}")
    args = argparse.Namespace(  # the flags of refimpl logits / run, as the commands' parser leaves them
        emulate=emulate, flash_attn=None if flash_attn is None else "on" if flash_attn else "off", kv_type=kv_type,
        kernel=kernel, no_repack=not repack, ggml_version_ok=ggml_version_ok, threads=n_threads, ubatch_size=n_ubatch,
        ctx_size=n_ctx)
    ctx = ctx_from_args(args)  # before loading, as the commands do: emulate="ggml" names (or refuses) its libggml first
    # (the commands' messages name their flags: --no-repack is repack=False, --threads n_threads, --ggml-version-ok …)
    if cache_mb is not None:
        from refimpl.io.streamer import cache_budget

        cache_budget(cache_mb)  # RefimplError for anything but a whole number of MiB or "auto"
    loaded = load_named(os.fspath(model), cache_mb, pack=pack, ggml=(ctx.ggml, ctx.repack) if ctx.ggml else None)
    return Oracle(str(os.fspath(model)), loaded, ctx, Tokenizer.from_gguf(loaded.file.gguf))


def forward(model: Oracle, tokens, state=None, *, outputs: str = "all"):
    """Run ``tokens`` (ids, or text: encoded) at positions ``state.n_past`` … in one batch, as one
    ``llama_decode``; ``state`` None = a fresh sequence. Returns ``(logits, new_state)``: logits float32
    [T, V] (``outputs="last"``: [1, V], the last position's), row p the logits after token p — for a fresh
    state exactly the rows ``refimpl logits --tokens … --out L.npy`` writes — and the
    :class:`refimpl.model.state.SeqState` after the tokens. ``state`` itself is not changed: keep it to
    go back to it."""
    import numpy as np

    from refimpl.model.trunk import forward as trunk_forward

    _check_model(model, "forward")
    _choice("outputs", outputs, ("all", "last"))
    with np.errstate(all="ignore"):  # IEEE arithmetic as in C, as the commands run it (refimpl.cli.main)
        logits, _, new = trunk_forward(model.model, _state(model, state), _ids(model, tokens, "forward"), model.ctx,
                                       outputs=outputs)
    return logits, new


def generate(model: Oracle, prompt, n: int, *, draft: str | None = None, n_draft: int = 3, p_min: float = 0.0,
             ngram_min_match: int = 3, on_token: Callable[[int], None] | None = None) -> Generation:
    """Up to ``n`` tokens after ``prompt`` (ids, or text: encoded), greedily, stopping after an
    end-of-generation token (included) — ``refimpl run``'s tokens. ``draft``: None (plain greedy), ``"mtp"``
    (the model's MTP head drafts) or ``"ngram"`` (prompt lookup): self-speculative decoding with at most
    ``n_draft`` (1…8) drafts per round, ``p_min`` (MTP: stop drafting below this top-10 probability),
    ``ngram_min_match`` — ``run --mtp|--ngram --draft N`` (docs/speculative.md); the tokens are plain
    greedy's. ``on_token(id)`` is called as each token is produced."""
    import numpy as np

    from refimpl.decode.drafts import NGRAM_MAX_MATCH
    from refimpl.decode.greedy import greedy
    from refimpl.decode.speculative import MAX_DRAFT, speculative_generate

    _check_model(model, "generate")
    ids = _ids(model, prompt, "generate")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise RefimplError(f"generate: n must be a whole number ≥ 0, got {n!r}")
    _choice("draft", draft, DRAFTS)
    if draft is None and (n_draft, p_min, ngram_min_match) != (3, 0.0, 3):
        raise RefimplError("generate: n_draft, p_min and ngram_min_match go with draft='mtp' or draft='ngram'")
    if not isinstance(n_draft, int) or not 1 <= n_draft <= MAX_DRAFT:
        raise RefimplError(f"generate: n_draft must be between 1 and {MAX_DRAFT}, got {n_draft!r}")
    if not isinstance(ngram_min_match, int) or not 1 <= ngram_min_match <= NGRAM_MAX_MATCH:
        raise RefimplError(f"generate: ngram_min_match must be between 1 and {NGRAM_MAX_MATCH}, got {ngram_min_match!r}")
    if draft != "mtp" and p_min != 0.0:
        raise RefimplError("generate: p_min goes with draft='mtp'")
    eog = frozenset(model.tokenizer.eog_ids)
    with np.errstate(all="ignore"):
        if draft is None:
            out, stats = greedy(model.model, ids, n, model.ctx, eog_ids=eog, on_token=on_token), None
        else:
            streamer = model.model.streamer  # None when the routed experts are memory-mapped (load's cache_mb=None)
            out, stats = speculative_generate(model.model, ids, n, model.ctx, source=draft, n_draft=n_draft, p_min=p_min,
                                              ngram_min_match=ngram_min_match, eog_ids=eog, on_token=on_token,
                                              bytes_read=streamer.bytes_read if streamer else None,
                                              counters=streamer.counters.columns if streamer else None)
    return Generation(out, model.tokenizer.decode(out), stats)


def audit(model: Oracle, prompt, stream_a, stream_b=None, *, threshold: float | str = 0.05, schedule: int | str | None = None):
    """Judge an engine's stream against the oracle, or two streams against each other, as ``refimpl audit``
    does (docs/validating-an-engine.md); returns the :class:`refimpl.oracle.audit.Report` (``.verdict``:
    ``clean`` / ``identical`` / ``near-tie`` / ``A wrong`` …, ``.exit_code``: the command's, ``.as_json()``:
    ``audit --json``'s object; ``refimpl.oracle.audit_report.report_lines(report, model.tokenizer)`` its text).

    ``prompt``: ids, text (encoded), or None (the ``prompt_tokens`` the stream files carry). A stream: a list
    of ids, a :class:`Generation`, or a file ``refimpl audit`` reads (JSON, telemetry CSV, text, a server's
    response). ``threshold``: the near-tie rule's τ, or ``"auto"`` (``--threshold auto``). A stream file that
    carries other ``prompt_tokens`` than ``prompt`` is refused in one line (the command's verdict "prompt
    differs": a stream is not judged against another prompt). With a model loaded with ``emulate="ggml[:PATH]"`` the
    report also holds llama.cpp's own stream predicted for the engine's batch ``schedule`` (``audit --emulate=ggml
    --draft``: 0 or ``"plain"``, the default; 1…8, the draft-mtp loop; ``"server:N"``; ``"N,M"`` one per stream), and
    its exit code is byte identity with it (:mod:`refimpl.oracle.reproduce`)."""
    import numpy as np

    from refimpl.oracle.audit import audit as oracle_audit
    from refimpl.oracle.stream_file import Stream, prompt_of, read_stream

    _check_model(model, "audit")
    auto = threshold == "auto"
    if not auto and (not isinstance(threshold, (int, float)) or isinstance(threshold, bool)):
        raise RefimplError(f"audit: threshold is a fraction in (0, 1) or 'auto', got {threshold!r}")
    streams = []
    for label, s in zip("AB", (stream_a, stream_b)):
        if s is None:
            continue
        if isinstance(s, Generation):
            s = s.tokens
        if isinstance(s, (str, os.PathLike)):
            streams.append(read_stream(s, label, model.tokenizer))
        elif isinstance(s, Stream):
            streams.append(s)
        else:
            streams.append(Stream(label, "(python)", "json", _ids(model, s, f"audit: stream {label}", text=False)))
    ids = prompt_of(streams, "audit: give the prompt (ids or text); the streams carry none") if prompt is None \
        else _ids(model, prompt, "audit: prompt")
    for s in streams:  # as refimpl audit: a stream made from other prompt ids is not judged against these
        if s.prompt is not None and list(s.prompt) != ids:
            raise RefimplError(f"audit: stream {s.label} ({s.source}) carries other prompt ids than the prompt given "
                               f"({len(s.prompt)} ids, the prompt {len(ids)}): the tokenization differs (docs/bug-classes.md B20)")
    if schedule is not None and not model.ctx.ggml:
        raise RefimplError("audit: schedule= predicts llama.cpp's own stream for the engine's batches: it needs a model "
                           "loaded with emulate='ggml'")
    if model.ctx.ggml:  # parsed before the audit runs, as the command does
        from refimpl.oracle.reproduce import parse_schedules, reproduce

        schedules = parse_schedules("0" if schedule is None else str(schedule), len(streams))
    with np.errstate(all="ignore"):
        rep = oracle_audit(model.model, ids, *streams, ctx=model.ctx, tau=0.05 if auto else float(threshold),
                           model_name=model.name, auto=auto)
        if model.ctx.ggml:  # llama.cpp's own stream per schedule, as refimpl audit --emulate=ggml
            reproduce(rep, model.model, model.ctx, schedules, frozenset(model.tokenizer.eog_ids))
    return rep


def trace(model: Oracle, tokens, state=None, *, names=None, patch: dict | None = None) -> dict:
    """The named intermediates of one forward pass of ``tokens`` (ids, or text: encoded) after ``state``
    (None: fresh), under llama.cpp's names (``attn_norm-0``, ``linear_attn_out-0``, …, ``result_output``):
    {name: float array [T, n]}, the arrays ``refimpl trace --tokens … --out DIR`` writes. ``names``: record
    only these. ``patch``: {name: rows [T, n]} fed in place of what the pass computes for those names, the
    rest computed from them (activation patching: :class:`refimpl.oracle.trace.Patcher`). A name in ``names`` or
    ``patch`` that the pass never computes (a misspelling, a layer the model lacks) is refused, as are patch rows
    that do not fit."""
    import dataclasses

    import numpy as np

    from refimpl.model.trunk import forward as trunk_forward
    from refimpl.oracle.trace import Patcher, Recorder, tensor_name

    _check_model(model, "trace")
    if patch is not None and not isinstance(patch, dict):
        raise RefimplError(f"trace: patch is a dict of name → rows, got {type(patch).__name__}")
    names = None if names is None else {str(n) for n in ([names] if isinstance(names, str) else names)}
    rec = Recorder(names) if patch is None else Patcher({k: np.asarray(v) for k, v in patch.items()}, names)
    ids = _ids(model, tokens, "trace")

    def hook(name: str, il: int, x):
        try:
            return rec(name, il, x)
        except ValueError as e:  # patch rows of another count or size than the value they replace (Patcher)
            raise RefimplError(f"trace: patch {tensor_name(name, il)} does not fit {list(np.shape(x))}: {e}") from None

    with np.errstate(all="ignore"):
        trunk_forward(model.model, _state(model, state), ids, dataclasses.replace(model.ctx, trace=hook))
    arrays = rec.arrays()
    missing = sorted(((names or set()) | set(patch or ())) - set(arrays))
    if missing:
        raise RefimplError(f"trace: this pass computes no intermediate named {missing[0]!r} (the names: refimpl.trace(model, "
                           f"tokens) lists them, e.g. {', '.join(list(arrays)[:3])})")
    return arrays


# ---- argument checks: one line each, as the commands' ------------------------------------------


def _check_model(model, where: str) -> None:
    if not isinstance(model, Oracle):
        raise RefimplError(f"{where}: expected the model refimpl.load returns, got {type(model).__name__}")


def _choice(name: str, value, allowed: tuple) -> None:
    if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
        raise RefimplError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def _ids(model: Oracle, tokens, where: str, text: bool = True, empty: bool = False) -> list[int]:
    """Token ids from ids (any integer sequence, a 1-D array included) or, with ``text``, a str (encoded as
    ``run -p`` encodes); refused when empty, not integers, or outside the vocabulary."""
    import numpy as np

    if isinstance(tokens, str) and text:
        ids = model.encode(tokens)
    else:
        arr = np.asarray(tokens) if not isinstance(tokens, (str, bytes)) else np.asarray(None)
        if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
            raise RefimplError(f"{where}: expected token ids (a sequence of ints){' or text' if text else ''}, "
                               f"got {type(tokens).__name__}")
        ids = [int(t) for t in arr]
    if not ids and not empty:
        raise RefimplError(f"{where}: no tokens" + (" (the text encodes to none)" if isinstance(tokens, str) else ""))
    bad = [t for t in ids if not 0 <= t < model.config.n_vocab]
    if bad:
        raise RefimplError(f"{where}: token id {bad[0]} is out of range for this model's vocabulary [0, {model.config.n_vocab})")
    return ids


def _state(model: Oracle, state):
    from refimpl.model.state import SeqState

    if state is None:
        return SeqState.fresh(model.config)
    if not isinstance(state, SeqState):
        raise RefimplError(f"state must be None or the state forward returned, got {type(state).__name__}")
    return state
