"""The ``refimpl`` command line. Each subcommand parses its flags here and calls one function.

Errors in the user's input (bad flags, unreadable or unsupported files) print one line,
``refimpl: error: …``, and exit with code 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys

from refimpl.errors import EXIT_BAD_INPUT, RefimplError
from refimpl.output_path import check_output, writing


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message):
        raise RefimplError(f"{self.prog}: {message}")


def _cmd_fixture(args) -> int:
    from refimpl.fixtures import write_fixture

    options = {}
    for item in args.option or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise RefimplError(f"--option expects KEY=VALUE, got '{item}'")
        options[key] = {"true": True, "false": False}.get(value.lower(), value)
    if args.arch is not None:
        options["arch"] = args.arch
    if args.layout is not None:
        options["layout"] = args.layout
    with writing(args.out, "OUT") as out:
        path = write_fixture(out, preset=args.preset, quant=args.quant, seed=args.seed, **options)
    print(path)
    return 0


def _default_model(arg: str | None) -> str:
    """MODEL as given, or ``builtin:kjv`` (the built-in trained model) with a note on stderr."""
    from refimpl.builtin import TRAINED_DESCRIPTION, TRAINED_SPEC, resolve_model

    if arg is not None:
        return arg
    print(f"refimpl: no model given; using the built-in trained model {TRAINED_SPEC}: {TRAINED_DESCRIPTION} "
          f"({resolve_model(TRAINED_SPEC)}). Name a GGUF, or builtin:tiny for the synthetic fixture.", file=sys.stderr)
    return TRAINED_SPEC


def _cmd_inspect(args) -> int:
    from refimpl.builtin import resolve_model
    from refimpl.inspect_model import describe
    from refimpl.load import open_model

    print(describe(open_model(resolve_model(_default_model(args.model)))))
    return 0


def _parse_tokens(text: str) -> list[int]:
    try:
        tokens = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise RefimplError(f"--tokens expects comma-separated integers, got '{text}'") from None
    if not tokens:
        raise RefimplError("--tokens is empty")
    return tokens


def _ctx_from_args(args, trace=None):
    import dataclasses

    from refimpl.faults import NO_FAULTS
    from refimpl.ops import emulation_ctx

    flash = None if args.flash_attn is None else args.flash_attn == "on"
    kv_f16 = None if args.kv_type is None else args.kv_type == "f16"
    ctx = emulation_ctx(args.emulate, flash_attn=flash, kv_f16=kv_f16, kernel=args.kernel, trace=trace)
    return dataclasses.replace(ctx, faults=getattr(args, "faults", NO_FAULTS))  # run --inject (refimpl.faults)


def _load(args, cache_mb=None, pack="auto"):
    """The model named by MODEL or -m, or the built-in trained model when neither is given;
    ``cache_mb`` (run's --cache-mb) streams its routed experts (refimpl.streamer); ``pack`` (run's
    --pack) also keeps its matrices in the lane kernels' layout (refimpl.model.pack_weights)."""
    from refimpl.builtin import resolve_model
    from refimpl.compile_report import name_types
    from refimpl.gguf_file import GGUFFile
    from refimpl.model import load_model

    path = resolve_model(str(_default_model(getattr(args, "m", None) or args.model)))  # a builtin:PRESET/QUANT spec is built on demand
    gf = GGUFFile(path)  # the one read of the file's header in this process
    name_types(gf)  # for the first run's "compiling kernels for …" line
    return load_model(gf, cache_mb, pack=pack)


def _check_tokens(model, tokens: list[int]) -> list[int]:
    bad = [t for t in tokens if not 0 <= t < model.config.n_vocab]
    if bad:
        raise RefimplError(f"token id {bad[0]} is out of range for this model's vocabulary [0, {model.config.n_vocab})")
    return tokens


def _cmd_run(args) -> int:
    import json

    from tqdm import tqdm

    from refimpl.generate import greedy
    from refimpl.model import PACK_FLAGS
    from refimpl.tokenizer import Tokenizer

    if args.n_predict < 0:
        raise RefimplError(f"-n must be ≥ 0, got {args.n_predict}")
    for flag, path in (("--csv", args.csv), ("--route-trace", args.route_trace)):
        if path is not None:
            check_output(path, flag)
    args.faults = _injected(args)
    model = _load(args, cache_mb=args.cache_mb, pack=PACK_FLAGS[args.pack])
    trace = _route_trace(args, model)
    tok = Tokenizer.from_gguf(model.file.gguf)
    if args.tokens is not None:
        prompt = _check_tokens(model, _parse_tokens(args.tokens))
    else:
        prompt = tok.encode(args.prompt, parse_special=True, faults=args.faults)
        if not prompt:
            raise RefimplError("the prompt encodes to no tokens")
    spec = _speculative_options(args, model)
    stream = _TextStream(tok) if not args.json else None
    bar = tqdm(total=args.n_predict, desc="generating", unit="tok", file=sys.stderr, disable=None, leave=False)
    kwargs = dict(eog_ids=frozenset(tok.eog_ids), on_token=stream.write if stream else None, progress=bar)
    if spec is None:
        out, stats = greedy(model, prompt, args.n_predict, _ctx_from_args(args), **kwargs), None
    else:
        from refimpl.speculative import speculative_generate

        out, stats = speculative_generate(model, prompt, args.n_predict, _ctx_from_args(args), **spec, **kwargs,
                                          bytes_read=model.streamer.bytes_read, counters=model.streamer.counters.columns)
    bar.close()
    if trace is not None:
        trace.close()
    if stream:
        stream.close()
    else:
        result = {"prompt_tokens": prompt, "tokens": out, "text": tok.decode(out)}
        if args.faults:
            result["faults"] = [f.name for f in args.faults]
        if stats is not None:
            result["stats"] = stats.counters()
            result["rounds"] = stats.rounds()  # the round audit's input (refimpl.rounds)
        result.setdefault("stats", {})["streamer"] = model.streamer.stats(len(out))
        result["stats"]["packed_bytes"] = model.packed_bytes  # --pack: 0 when the matrices are not packed
        print(json.dumps(result, ensure_ascii=False))
    if stats is not None:
        _report_speculative(args, model, tok, stats)
    for line in model.streamer.summary_lines(len(out), mtp=args.mtp):
        print(line, file=sys.stderr)
    if trace is not None:
        print(f"wrote {trace.path}: {trace.n_rows} routing rows (one per position and layer)", file=sys.stderr)
    return 0


def _injected(args):
    """run --inject NAME[,NAME…]: the faults to inject (refimpl.faults, docs/bug-classes.md), announced on stderr."""
    from refimpl.faults import parse_faults

    faults = parse_faults(args.inject, "mtp" if args.mtp else "ngram" if args.ngram else None)
    for f in faults:
        print(f"refimpl: injected fault {f.name} ({f.bug_class}: {f.title}); the output is wrong on purpose", file=sys.stderr)
    return faults


def _route_trace(args, model):
    """run --route-trace FILE: attach a CSV route-trace writer to the model's streamer."""
    if args.route_trace is None:
        return None
    if not model.config.is_moe:
        raise RefimplError(f"--route-trace: {model.config.arch.name} is a dense model; there is no expert routing to trace")
    from refimpl.route_trace import RouteTrace

    with writing(args.route_trace, "--route-trace") as path:
        model.streamer.on_route = RouteTrace(path, model.config.n_expert_used)
    return model.streamer.on_route


def _speculative_options(args, model) -> dict | None:
    """speculative_generate's keyword arguments from run's flags, or None for plain greedy."""
    if args.temp != 0:
        raise RefimplError(f"only greedy decoding is supported (--temp 0), got --temp {args.temp}")
    source = "mtp" if args.mtp else "ngram" if args.ngram else None
    for flag, value, needed, given in (("--draft", args.draft, "--mtp or --ngram", source),
                                       ("--mtp-p-min", args.mtp_p_min, "--mtp", args.mtp),
                                       ("--ngram-min-match", args.ngram_min_match, "--ngram", args.ngram)):
        if value is not None and not given:
            raise RefimplError(f"{flag} needs {needed}")
    if source is None and args.csv is None:
        return None
    from refimpl.speculative import MAX_DRAFT, make_source

    n_draft = 3 if args.draft is None else args.draft
    if not 1 <= n_draft <= MAX_DRAFT:
        raise RefimplError(f"--draft must be between 1 and {MAX_DRAFT}, got {n_draft}")
    p_min = args.mtp_p_min or 0.0
    min_match = 3 if args.ngram_min_match is None else args.ngram_min_match
    # build the source now: --mtp on a GGUF without nextn tensors is refused here, before generating
    src = make_source(model, source, _ctx_from_args(args), p_min=p_min, ngram_min_match=min_match)
    return dict(source=src, n_draft=n_draft, p_min=p_min, ngram_min_match=min_match)


def _report_speculative(args, model, tok, stats) -> None:
    from refimpl.telemetry import summary_lines, write_csv

    for line in summary_lines(stats):
        print(line, file=sys.stderr)
    if args.csv:
        with writing(args.csv, "--csv") as path:
            write_csv(path, stats, model=str(model.file.gguf.path), piece=tok.piece)
        print(f"wrote {args.csv}: {len(stats.rows)} token rows", file=sys.stderr)


class _TextStream:
    """Write generated text to stdout as it is produced, holding back incomplete UTF-8."""

    def __init__(self, tok):
        self.tok, self.pending = tok, b""

    def write(self, token_id: int) -> None:
        self.pending += self.tok.piece(token_id)
        # emit the longest prefix that decodes cleanly; keep a trailing partial sequence
        for cut in range(len(self.pending), max(len(self.pending) - 4, -1), -1):
            try:
                text = self.pending[:cut].decode("utf-8")
            except UnicodeDecodeError:
                continue
            sys.stdout.write(text)
            sys.stdout.flush()
            self.pending = self.pending[cut:]
            return

    def close(self) -> None:
        if self.pending:
            sys.stdout.write(self.pending.decode("utf-8", errors="replace"))
        sys.stdout.write("\n")
        sys.stdout.flush()


#: Positions per ``forward`` call of ``refimpl logits``. Larger batches decode each weight block once for
#: more rows (the lane kernels' wide path; a routed expert sees ~8 rows of 256 tokens instead of ~1 of
#: 16): medium, 256-token prompt, 2 threads, Sapphire Rapids AVX-512: 33 / 38 / 48 tok/s (q4_k_m) for
#: chunks of 16 / 64 / 256 (docs/performance.md). Memory: the chunk's logits, 256 × V float32.
LOGITS_CHUNK = 256


def _cmd_logits(args) -> int:
    import numpy as np

    from refimpl.model import forward
    from refimpl.state import SeqState

    from tqdm import tqdm

    for flag, path in (("--out", args.out), ("--mtp-out", args.mtp_out)):
        if path is not None:
            check_output(path, flag)
    model = _load(args)
    tokens = _check_tokens(model, _parse_tokens(args.tokens))
    # Chunks of LOGITS_CHUNK positions with a progress bar; forward is batch-invariant, so chunking
    # changes nothing in the numbers.
    state, rows, hs, ctx = SeqState.fresh(model.config), [], [], _ctx_from_args(args)
    if args.mtp_out:
        from refimpl.mtp import require_mtp

        require_mtp(model.file)
    with tqdm(total=len(tokens), desc="logits", unit="tok", file=sys.stderr, disable=None, leave=False) as bar:
        for i in range(0, len(tokens), LOGITS_CHUNK):
            chunk, h, state = forward(model, state, tokens[i : i + LOGITS_CHUNK], ctx)
            rows.append(chunk)
            hs.append(h)
            bar.update(len(tokens[i : i + LOGITS_CHUNK]))
    logits = np.concatenate(rows)
    with writing(args.out, "--out") as path, open(path, "wb") as f:  # the path as given (np.save would add .npy)
        np.save(f, logits.astype(np.float32))
    print(f"wrote {args.out}: logits {logits.shape[0]} x {logits.shape[1]} (row p = logits after position p)", file=sys.stderr)
    if args.mtp_out:
        from refimpl.drafts import mtp_catchup_logits

        mtp = mtp_catchup_logits(model, tokens, np.concatenate(hs), ctx)  # [T, V]
        with writing(args.mtp_out, "--mtp-out") as path, open(path, "wb") as f:
            np.save(f, mtp.astype(np.float32))
        print(f"wrote {args.mtp_out}: MTP logits {mtp.shape[0]} x {mtp.shape[1]} (row p fed token p and the "
              f"trunk's h_nextn of p-1, zeros at p = 0; predicts token p+1)", file=sys.stderr)
    return 0


def _cmd_trace(args) -> int:
    import numpy as np

    from refimpl.model import forward
    from refimpl.state import SeqState
    from refimpl.trace import Recorder

    check_output(args.out, "--out", directory=True)
    model = _load(args)
    tokens = _check_tokens(model, _parse_tokens(args.tokens))
    rec = Recorder()
    forward(model, SeqState.fresh(model.config), tokens, _ctx_from_args(args, trace=rec))
    with writing(args.out, "--out", directory=True) as out:
        for name, arr in rec.arrays().items():
            np.save(out / f"{name}.npy", arr)
            print(f"{name:<32} {str(list(arr.shape)):<16} sum = {float(np.sum(arr, dtype=np.float64)):.6f}")
    print(f"wrote {len(rec.arrays())} tensors to {out}/ (one NAME.npy each, first axis = position)", file=sys.stderr)
    return 0


def _cache_mb(args):
    """golden/audit --cache-mb: None (routed experts pinned, the default) or a budget checked here, before
    any worker opens the model with it."""
    if args.cache_mb is None:
        return None
    from refimpl.streamer import cache_budget

    cache_budget(args.cache_mb)  # RefimplError for anything but a whole number of MiB or 'auto'
    return args.cache_mb


def _cmd_golden_make(args) -> int:
    from refimpl.golden import Settings, make_golden

    source = "mtp" if args.mtp else "ngram" if args.ngram else None
    if args.draft is not None and source is None:
        raise RefimplError("--draft needs --mtp or --ngram")
    ctx = _ctx_from_args(args)
    settings = Settings(args.n_predict, source, (3 if args.draft is None else args.draft) if source else 0, ctx.act_quant,
                        kv_f16=ctx.kv_f16, flash_attn=ctx.flash_attn)
    out = make_golden(_default_model(args.model), args.prompts, settings, args.out, jobs=args.jobs, kernel=args.kernel,
                      cluster=args.cluster, cache_mb=_cache_mb(args))
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _cmd_golden_check(args) -> int:
    from refimpl.golden import check_golden

    result = check_golden(args.golden, args.model, jobs=args.jobs, kernel=args.kernel, cluster=args.cluster,
                          cache_mb=_cache_mb(args))
    print("\n".join(result.lines), file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1


def _cmd_audit(args) -> int:
    import json

    from refimpl.audit import audit, prompt_of, read_stream, report_lines
    from refimpl.builtin import resolve_model
    from refimpl.compile_report import name_types
    from refimpl.gguf_file import GGUFFile
    from refimpl.model import load_model
    from refimpl.tokenizer import Tokenizer

    golden = _audit_inputs(args)
    if args.stream_dir is not None:
        return _audit_dir(args)
    if golden:
        return _audit_golden(args)
    if args.jobs != 1 or args.cluster is not None or args.cache_mb is not None:
        raise RefimplError("--jobs, --cluster and --cache-mb go with --streams DIR")
    path = resolve_model(args.model)
    gf = GGUFFile(path)
    name_types(gf)
    model = load_model(gf)
    tok = Tokenizer.from_gguf(model.file.gguf)
    streams = [read_stream(path, label, tok) for path, label in zip(args.streams, "AB")]
    if args.prompt_tokens is not None:
        prompt = _check_tokens(model, _parse_tokens(args.prompt_tokens))
    elif args.prompt is not None:
        prompt = tok.encode(args.prompt, parse_special=True)
    else:
        prompt = _check_tokens(model, prompt_of(streams, "audit needs the prompt: --prompt TEXT or --prompt-tokens IDS"))
    if not prompt:
        raise RefimplError("the prompt encodes to no tokens")
    differs = [s for s in streams if s.prompt is not None and list(s.prompt) != list(prompt)]
    if differs:  # bug class B20: judging the stream against a shifted prompt would judge nothing
        return _prompt_differs(differs, prompt, tok, args.json)
    rep = audit(model, prompt, *streams, ctx=_ctx_from_args(args), tau=args.threshold, model_name=str(args.model))
    print(json.dumps(rep.as_json()) if args.json else "\n".join(report_lines(rep, tok)))
    return rep.exit_code


def _prompt_differs(streams, prompt: list[int], tok, as_json: bool) -> int:
    """audit: a stream's prompt_tokens are not the oracle's ids of --prompt / --prompt-tokens (a
    pre-tokenizer or template difference, docs/bug-classes.md B20): say where, exit 1, audit nothing."""
    import json

    out = []
    for s in streams:
        i = next((j for j, (a, b) in enumerate(zip(s.prompt, prompt)) if a != b), min(len(s.prompt), len(prompt)))
        word = lambda ids: repr(tok.decode(ids[i : i + 1])) if i < len(ids) else "(end)"  # noqa: E731
        out.append({"stream": s.label, "source": s.source, "index": i, "stream_prompt_len": len(s.prompt), "oracle_prompt_len": len(prompt),
                    "stream_id": s.prompt[i] if i < len(s.prompt) else None, "oracle_id": prompt[i] if i < len(prompt) else None,
                    "text": f"{s.label} ({s.source}): prompt tokenisation differs at prompt index {i}: stream "
                            f"{word(list(s.prompt))} ({len(s.prompt)} ids), oracle {word(prompt)} ({len(prompt)} ids); "
                            f"the stream is not audited (a different pre-tokenizer or template gives other prompt ids)"})
    if as_json:
        print(json.dumps({"verdict": "prompt differs", "exit": 1, "prompts": [{k: v for k, v in o.items() if k != "text"} for o in out]}))
    else:
        print("\n".join(["audit: verdict prompt differs"] + [o["text"] for o in out]))
    return 1


_AUDIT_GRAMMAR = ("refimpl audit [MODEL | GOLDEN] STREAM [STREAM]: a MODEL is a .gguf or builtin:NAME, "
                  "a GOLDEN a golden .jsonl, a STREAM a .json, .txt or .csv file")


def _audit_input_kind(arg: str) -> str | None:
    """What an audit positional is — "model", "golden" or "stream" — told by its name and, for a file
    that exists, its first bytes (GGUF magic, a golden header line); None for a missing file whose
    name says nothing."""
    from pathlib import Path

    from refimpl.golden_audit import is_golden

    path, suffix = Path(arg), Path(arg).suffix.lower()
    if arg.startswith("builtin:") or suffix == ".gguf":
        return "model"
    if suffix == ".jsonl":
        return "golden"
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(4) == b"GGUF":
                return "model"
        return "golden" if is_golden(arg) else "stream"
    return "stream" if suffix in (".json", ".txt", ".csv") else None


def _audit_inputs(args) -> bool:
    """Sort audit's positionals into args.model and args.streams by what each one is (MODEL is optional:
    builtin:kjv, as for run); True when the first is a golden file. argparse puts the first positional in
    args.model whatever it is, so a first STREAM is moved back to the streams here."""
    given = ([args.model] if args.model is not None else []) + list(args.streams)
    kinds = [_audit_input_kind(a) for a in given]
    if kinds and kinds[0] is None:
        raise RefimplError(f"{given[0]}: no such file, and its name does not say what it is ({_AUDIT_GRAMMAR})")
    first = kinds[0] if kinds else None
    head, rest = (given[0], given[1:]) if first in ("model", "golden") else (None, given)
    for arg, kind in zip(rest, kinds[len(given) - len(rest):]):
        if kind in ("model", "golden"):
            raise RefimplError(f"{arg} is a {kind.upper()}: it goes first ({_AUDIT_GRAMMAR})")
    if first != "golden" and not rest and args.stream_dir is None:
        raise RefimplError("audit needs one or two STREAM files, or --streams DIR")
    if len(rest) > 2:
        raise RefimplError(f"audit takes one or two streams, got {len(rest)}")
    if first == "golden" and args.stream_dir is not None:
        raise RefimplError("--streams DIR needs a MODEL (a golden file judges one stream: refimpl audit GOLDEN STREAM)")
    args.model, args.streams = (head if head is not None else _default_model(None)), rest
    return first == "golden"


def _audit_golden(args) -> int:
    """audit GOLDEN STREAM: judged by the golden's recorded top-5, without the model (refimpl.golden_audit)."""
    import json

    from refimpl.audit import read_stream
    from refimpl.golden_audit import audit_golden, report_lines

    if len(args.streams) != 1:
        raise RefimplError("audit GOLDEN takes one stream")
    if args.prompt is not None:
        raise RefimplError("audit GOLDEN needs the prompt as ids (--prompt-tokens): there is no model to tokenize --prompt")
    stream = read_stream(args.streams[0], "A", tokenizer=None)
    prompt = _parse_tokens(args.prompt_tokens) if args.prompt_tokens is not None else None
    v = audit_golden(args.model, stream, prompt, args.threshold)
    print(json.dumps(v.as_json()) if args.json else "\n".join(report_lines(v, stream)))
    return v.exit_code


def _cmd_plot(args) -> int:
    """plot audit|telemetry|routes … --out PNG (refimpl.plot; matplotlib, the 'plot' extra)."""
    from pathlib import Path

    from refimpl import plot

    plot._pyplot()  # one-line error now if matplotlib is missing
    check_output(args.out, "--out")
    if args.plot_command == "telemetry":
        fig = plot.draw_telemetry(plot.telemetry_series(args.csv), title=Path(args.csv).name)
    elif args.plot_command == "routes":
        fig = plot.draw_routes(*plot.route_counts(args.csv), title=f"{Path(args.csv).name}: expert selections per layer")
    else:
        from refimpl.audit import read_stream
        from refimpl.builtin import resolve_model
        from refimpl.model import load_model
        from refimpl.tokenizer import Tokenizer

        model = load_model(resolve_model(_default_model(args.model)))
        tok = Tokenizer.from_gguf(model.file.gguf)
        stream = read_stream(args.stream, "A", tok)
        prompt = _parse_tokens(args.prompt_tokens) if args.prompt_tokens is not None else stream.prompt
        if prompt is None:
            raise RefimplError("plot audit needs the prompt: --prompt-tokens IDS (or a JSON stream with prompt_tokens)")
        series = plot.audit_series(model, _check_tokens(model, prompt), stream.tokens, ctx=_ctx_from_args(args), tau=args.threshold)
        fig = plot.draw_audit(series, title=f"audit of {Path(args.stream).name}: first divergence {series.verdict}",
                              piece=lambda t: tok.decode([t]))
    with writing(args.out, "--out") as out:
        plot.save(fig, out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _audit_dir(args) -> int:
    """audit --streams DIR: every stream pair of DIR (refimpl.audit_streams), a line each, a summary table."""
    import json

    from refimpl.audit_streams import as_json, audit_pairs, pair_line, read_pairs, summary_lines
    from refimpl.builtin import resolve_model
    from refimpl.load import open_model
    from refimpl.tokenizer import Tokenizer

    if args.streams:
        raise RefimplError("give STREAM files or --streams DIR, not both")
    cache_mb = _cache_mb(args)
    path = resolve_model(args.model)
    m = open_model(path)
    tok = Tokenizer.from_gguf(m.gguf)
    prompt = None
    if args.prompt_tokens is not None:
        prompt = _parse_tokens(args.prompt_tokens)
    elif args.prompt is not None:
        prompt = tok.encode(args.prompt, parse_special=True)
    pairs = read_pairs(args.stream_dir, tok, m.config.n_vocab, prompt)
    ctx = _ctx_from_args(args)
    numerics = {"act_quant": ctx.act_quant, "kv_f16": ctx.kv_f16, "flash_attn": ctx.flash_attn}
    reports = audit_pairs(path, pairs, numerics=numerics, kernel=args.kernel, tau=args.threshold,
                          model_name=str(args.model), jobs=args.jobs, cluster=args.cluster, cache_mb=cache_mb)
    if args.json:
        print(json.dumps(as_json(pairs, reports)))
    else:
        print("\n".join([pair_line(p, r) for p, r in zip(pairs, reports)] + summary_lines(reports)))
    return int(any(r.exit_code for r in reports))


def _add_scale_out(p, what: str) -> None:
    """--jobs / --cluster (exclusive) and --cache-mb of golden make, golden check and audit --streams."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--jobs", type=int, default=1, metavar="J", help=f"{what} in J parallel processes (same output)")
    g.add_argument("--cluster", metavar="ADDRESS",
                   help=f"{what} on the workers of the Dask scheduler at ADDRESS, e.g. tcp://10.0.0.1:8786 (same "
                        "output; needs the 'cluster' extra; docs/cluster.md)")
    p.add_argument("--cache-mb", metavar="N|auto",
                   help="stream routed experts through an LRU cache of N MiB per process (default: pinned, the "
                        "memory map); docs/streamer.md, docs/cluster.md")


def _add_numerics(p) -> None:
    from refimpl.ops import EMULATIONS

    p.add_argument("--emulate", nargs="?", const="default", choices=tuple(EMULATIONS), metavar="CONFIG",
                   help="round where llama.cpp rounds: activation quantization per matmul, and the K/V cache and "
                        "attention of llama.cpp's configuration CONFIG: default (F16 K/V, flash attention, as its "
                        "CLI and server run; the default) or plain (F32 K/V, no flash attention)")
    p.add_argument("--flash-attn", choices=("on", "off"), help="emulate llama.cpp with flash attention on/off (overrides CONFIG)")
    p.add_argument("--kv-type", choices=("f16", "f32"), help="emulate llama.cpp's K/V cache type (overrides CONFIG)")
    p.add_argument("--kernel", choices=("numba", "numpy"), default="numba", help="quantized matmul implementation")


def _add_speculative(p) -> None:
    """run's self-speculative flags (docs/speculative.md)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--mtp", action="store_true", help="draft with the model's MTP (nextn) head")
    g.add_argument("--ngram", action="store_true", help="draft by n-gram lookup in the prompt and output")
    p.add_argument("--draft", type=int, metavar="N", help="most drafted tokens per round, 1..8 (default 3)")
    p.add_argument("--mtp-p-min", type=float, metavar="F", help="stop MTP drafting below this top-10 probability (default 0)")
    p.add_argument("--ngram-min-match", type=int, metavar="N", help="shortest n-gram match that drafts (default 3)")
    p.add_argument("--csv", metavar="FILE", help="write per-token speculative telemetry (CSV)")
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature; only 0 (greedy) is supported")
    p.add_argument("--inject", action="append", metavar="NAME", help=argparse.SUPPRESS)  # refimpl.faults


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="refimpl", description="Reference implementation of llama.cpp's qwen35moe, qwen35 and qwen3next inference.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("fixture", help="write a seeded synthetic GGUF (qwen35moe, qwen35 or qwen3next)")
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--arch", help="architecture: qwen35moe (default), qwen35 (dense FFN) or qwen3next")
    p.add_argument("--preset", default="tiny", help="fixture preset (tiny, predictable, …)")
    p.add_argument("--quant", default="f32", help="quant mix: f32, bf16, q8_0, q4_k_m, mxfp4; iq1_m, iq2_xxs, iq3_xxs, tq1_0, tq2_0 "
                   "(quantized by libggml: need llama-cpp-python)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", choices=("converter", "legacy"),
                   help="file layout: converter (default: as convert_hf_to_gguf.py / llama-quantize write it) or legacy "
                        "(the fixtures' older layout: 1-D ffn_gate_inp_shexp, no shared_head_norm, qwen3next ssm_in, …)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="variant option: mtp=full|stripped|extras, tied=true, fused_gate_up=true, fused_qkv=true, "
                        "recurrent_layers_key=false, ssm_in=true (qwen3next: the fused ssm_in instead of attn_qkv + attn_gate), "
                        "shexp_gate_1d=true, shared_head_norm=false")
    p.set_defaults(func=_cmd_fixture)

    p = sub.add_parser("inspect", help="print a GGUF's config, layer kinds and tensor bytes per type")
    p.add_argument("model", nargs="?", help="a .gguf (qwen35moe, qwen35, qwen3next) or builtin:… (default: the built-in trained model, builtin:kjv)")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("run", help="greedy generation (the built-in trained model when no MODEL is given)")
    p.add_argument("model", nargs="?", help="a .gguf (qwen35moe, qwen35, qwen3next) or builtin:… (default: the built-in trained model, builtin:kjv)")
    p.add_argument("-m", metavar="MODEL", help="same as the positional MODEL")
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", default="The quick brown fox", help="prompt text (special-token text is parsed)")
    src.add_argument("--tokens", help="prompt as comma-separated token ids")
    p.add_argument("-n", "--n-predict", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.add_argument("--cache-mb", default="auto", metavar="N|auto",
                   help="routed experts are read from the file through an LRU cache of N MiB (0: read every "
                        "decode; default auto = half of MemAvailable); docs/streamer.md")
    p.add_argument("--route-trace", metavar="FILE", help="write every MoE routing (position, layer, experts, weights) as CSV")
    p.add_argument("--pack", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),  # refimpl.model.PACK_FLAGS
                   help="also hold the matrices in the fast kernels' layout: same numbers, faster decoding, "
                        "+their size in RAM; default auto = when that fits in a quarter of MemAvailable "
                        "(docs/performance.md)")
    _add_numerics(p)
    _add_speculative(p)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("logits", help="write every position's logits as a (T, V) float32 .npy")
    p.add_argument("model", nargs="?", help="a .gguf (qwen35moe, qwen35, qwen3next) or builtin:… (default: the built-in trained model, builtin:kjv)")
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", required=True, help="output .npy path")
    p.add_argument("--mtp-out", metavar="FILE.npy",
                   help="also write the MTP head's (T, V) logits: row p fed token p and the trunk's h_nextn of p-1")
    _add_numerics(p)
    p.set_defaults(func=_cmd_logits)

    p = sub.add_parser("trace", help="dump named intermediates (llama.cpp's names) for diffing against its eval callback")
    p.add_argument("model", nargs="?", help="a .gguf (qwen35moe, qwen35, qwen3next) or builtin:… (default: the built-in trained model, builtin:kjv)")
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", default="trace", help="output directory (default ./trace)")
    _add_numerics(p)
    p.set_defaults(func=_cmd_trace)

    p = sub.add_parser("golden", help="golden token streams: make a golden file, or check one (docs/golden.md)")
    gsub = p.add_subparsers(dest="golden_command", required=True, parser_class=_Parser)
    p = gsub.add_parser("make", help="decode a prompts file and write a golden file")
    p.add_argument("model", metavar="MODEL", nargs="?",
                   help="a .gguf (qwen35moe, qwen35, qwen3next), builtin:kjv (the trained model, the default), or a built-in fixture: "
                        "builtin:PRESET[/QUANT][/seed=N][/KEY=VALUE…]")
    p.add_argument("--prompts", required=True, metavar="FILE", help="one prompt per line, or JSONL with 'text' or 'tokens'")
    p.add_argument("-n", "--n-predict", type=int, default=32, help="tokens to generate per prompt (default 32)")
    p.add_argument("--out", metavar="PATH", help="golden file to write (default MODEL-NAME.golden.jsonl)")
    _add_scale_out(p, "prompts decoded")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--mtp", action="store_true", help="decode with MTP drafting (tokens equal plain greedy)")
    g.add_argument("--ngram", action="store_true", help="decode with n-gram drafting (tokens equal plain greedy)")
    p.add_argument("--draft", type=int, metavar="N", help="drafts per round with --mtp/--ngram (default 3)")
    _add_numerics(p)
    p.set_defaults(func=_cmd_golden_make)
    p = gsub.add_parser("check", help="recompute a golden file and compare (exit 1 on a mismatch)")
    p.add_argument("golden", metavar="GOLDEN", help="a golden .jsonl file")
    p.add_argument("model", metavar="MODEL", nargs="?", help="the GGUF it was made from (not needed for built-in fixtures)")
    _add_scale_out(p, "prompts recomputed")
    p.add_argument("--kernel", choices=("numba", "numpy"), default="numba", help="quantized matmul implementation")
    p.set_defaults(func=_cmd_golden_check)

    p = sub.add_parser("audit", help="find and classify the first divergence of two token streams (or one vs the oracle)")
    p.add_argument("model", metavar="MODEL", nargs="?",
                   help="a .gguf (qwen35moe, qwen35, qwen3next), builtin:PRESET[/QUANT]…, or builtin:kjv (the trained model, the default); or a "
                        "golden .jsonl (judged by its recorded top-5, without the model). Told from a STREAM by file type")
    p.add_argument("streams", metavar="STREAM", nargs="*",
                   help="one or two streams (.json ids or object with 'tokens', telemetry .csv, or .txt text)")
    p.add_argument("--streams", dest="stream_dir", metavar="DIR",
                   help="audit every pair NAME.A.EXT / NAME.B.EXT in DIR (prompt: NAME.prompt.EXT); one line each and "
                        "a summary table (docs/validating-an-engine.md)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the prompt text (special-token text is parsed)")
    src.add_argument("--prompt-tokens", metavar="IDS", help="the prompt as comma-separated token ids")
    p.add_argument("--threshold", type=float, default=0.05, metavar="TAU",
                   help="near-tie when the tokens are within TAU·max|logit| of the oracle's best (default 0.05)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    _add_scale_out(p, "with --streams: pairs audited")
    _add_numerics(p)
    p.set_defaults(func=_cmd_audit)

    p = sub.add_parser("plot", help="pictures (PNG) of an audit, a telemetry CSV or a route trace (needs matplotlib)")
    psub = p.add_subparsers(dest="plot_command", required=True, parser_class=_Parser)
    p = psub.add_parser("audit", help="the oracle's margin along a stream, the near-tie band, the divergence")
    p.add_argument("model", metavar="MODEL", nargs="?",
                   help="a .gguf (qwen35moe, qwen35, qwen3next), builtin:PRESET[/QUANT]…, or builtin:kjv (the trained model, the default)")
    p.add_argument("stream", metavar="STREAM", help="JSON ids, JSON with 'tokens', telemetry CSV, or text")
    p.add_argument("--prompt-tokens", metavar="IDS", help="the prompt as comma-separated token ids")
    p.add_argument("--threshold", type=float, default=0.05, metavar="TAU", help="near-tie band, a fraction of max|logit|")
    p.add_argument("--out", required=True, metavar="PNG")
    _add_numerics(p)
    p.set_defaults(func=_cmd_plot)
    for name, what in (("telemetry", "acceptance per round and per draft position, MiB per token, hit rate (run --csv)"),
                       ("routes", "expert-use heat map per layer (run --route-trace)")):
        p = psub.add_parser(name, help=what)
        p.add_argument("csv", metavar="CSV")
        p.add_argument("--out", required=True, metavar="PNG")
        p.set_defaults(func=_cmd_plot)
    return parser


def _lone_emulate(argv: list[str]) -> list[str]:
    """``--emulate`` alone means ``--emulate=default``; spelled out so that argparse never takes the
    next word (a MODEL path) as its value."""
    return ["--emulate=default" if a == "--emulate" else a for a in argv]


def _one_line(message: str) -> str:
    """An error message as one line: a character that is not printable (a newline, a NUL, … quoted from
    a damaged file's key or name) is written as its escape, ``\\n``, ``\\x00``."""
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def main(argv: list[str] | None = None) -> int:
    import numpy as np

    try:
        args = build_parser().parse_args(_lone_emulate(sys.argv[1:] if argv is None else argv))
        with np.errstate(all="ignore"):  # IEEE arithmetic as in C: inf/NaN weights compute, silently (refimpl.ops.ieee)
            if args.func in (_cmd_fixture, _cmd_inspect):  # no kernels: numba is not even imported
                return args.func(args)
            from refimpl.compile_report import compile_report

            with compile_report():  # the first run's "compiling kernels …" lines
                return args.func(args)
    except RefimplError as exc:
        print(f"refimpl: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
