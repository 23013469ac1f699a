"""``refimpl run``: greedy generation, text streamed to stdout (or ``--json``), and self-speculative
decoding with ``--mtp`` / ``--ngram`` (docs/speculative.md): the same tokens, fewer trunk decodes."""

from __future__ import annotations

import argparse
import sys

from refimpl.cli.common import MODEL_HELP, add_numerics, check_tokens, ctx_from_args, load, parse_tokens
from refimpl.errors import RefimplError
from refimpl.io.output_path import check_output, writing


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="greedy generation (the built-in trained model when no MODEL is given)")
    p.add_argument("model", nargs="?", help=MODEL_HELP)
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
    p.add_argument("--pack", nargs="?", const="on", default="auto", choices=("auto", "on", "off"),  # refimpl.model.load.PACK_FLAGS
                   help="also hold the matrices in the fast kernels' layout (with --emulate=ggml: the column layout "
                        "of its kernels): same numbers, faster decoding, +their size in RAM; default auto = when "
                        "that fits in a quarter of MemAvailable; "
                        "--pack alone = on (docs/performance.md)")
    add_numerics(p)
    _add_speculative(p)
    p.set_defaults(func=cmd_run)


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
    p.add_argument("--inject", action="append", metavar="NAME", help=argparse.SUPPRESS)  # refimpl.inject.faults


def load_for_run(args, ctx, stand_in=False):
    """The model as ``refimpl run`` with ``args`` and ``ctx`` loads it (its first run's second process too, with
    ``stand_in``: one trunk layer of each kind, :func:`refimpl.io.stand_in.stand_in`; refimpl/cli/compile_ahead.py),
    packed at load (``--pack``; with ``--emulate=ggml`` the column layout of its kernels) — except, with
    ``--pack auto``, a plain greedy run of at most one token, whose only forward pass is the prompt's (the copies pay
    off over many tokens), and plain greedy on a model of less than ``PACK_MIN_BYTES`` (refimpl.model.load).

    Which kernels a run takes depends on its model, numerics and flags, never on what the cache holds: packing after
    the first token would take the unpacked matrices' kernels for that token, and the first run on a machine would
    have to compile both sets (or pack first, and leave the unpacked set to the second run: real2 Q4_K_M,
    ``--tokens 1,2,3,4 -n 32``, *EPYC*, 20 s plain, 13 s ``--emulate=ggml``, where packing takes 0.4 s and 1.0 s)."""
    from refimpl.model.load import PACK_FLAGS, PACK_MIN_BYTES

    plain = not (args.mtp or args.ngram or args.csv)
    ggml = (ctx.ggml, ctx.repack) if ctx.ggml else None  # --emulate=ggml: --pack lays out for its kernels, no lane copies
    pack = PACK_FLAGS[args.pack]
    if plain and pack == "auto" and args.n_predict <= 1:  # the prompt's forward pass alone: no copies
        pack = False
    # --route-trace: its writer reads the streamer's routing hook (set by cmd_run), so the experts are streamed
    on_route = _no_route if args.route_trace is not None else None
    return load(args, cache_mb=args.cache_mb, pack=pack, min_pack_bytes=PACK_MIN_BYTES if plain else 0, ggml=ggml,
                on_route=on_route, stand_in=stand_in)


def cmd_run(args) -> int:
    import json

    from tqdm import tqdm

    from refimpl.decode.greedy import greedy
    from refimpl.tokenizer import Tokenizer

    if args.n_predict < 0:
        raise RefimplError(f"-n must be ≥ 0, got {args.n_predict}")
    for flag, path in (("--csv", args.csv), ("--route-trace", args.route_trace)):
        if path is not None:
            check_output(path, flag)
    args.faults = _injected(args)
    ctx = ctx_from_args(args)  # before loading: --emulate=ggml names (or refuses) the libggml it follows first
    model = load_for_run(args, ctx)
    trace = _route_trace(args, model)
    tok = Tokenizer.from_gguf(model.file.gguf)
    if args.tokens is not None:
        prompt = check_tokens(model, parse_tokens(args.tokens))
    else:
        prompt = tok.encode(args.prompt, parse_special=True, faults=args.faults)
        if not prompt:
            raise RefimplError("the prompt encodes to no tokens")
    if getattr(args, "compile_ahead", None) is not None:  # the first run's second process walks this prompt's shapes
        args.compile_ahead.begin(len(prompt))
    spec = _speculative_options(args, model, ctx)
    stream = _TextStream(tok) if not args.json else None
    bar = tqdm(total=args.n_predict, desc="generating", unit="tok", file=sys.stderr, disable=None, leave=False)
    kwargs = dict(eog_ids=frozenset(tok.eog_ids), on_token=stream.write if stream else None, progress=bar)
    if spec is None:
        out, stats = greedy(model, prompt, args.n_predict, ctx, **kwargs), None
    else:
        from refimpl.decode.speculative import speculative_generate

        s = model.streamer  # None: the routed experts memory-mapped (--emulate=ggml, auto, a file that fits in memory)
        out, stats = speculative_generate(model, prompt, args.n_predict, ctx, **spec, **kwargs,
                                          bytes_read=s.bytes_read if s else None, counters=s.counters.columns if s else None)
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
            result["rounds"] = stats.rounds()  # the round audit's input (refimpl.oracle.rounds)
        if model.streamer is not None:
            result.setdefault("stats", {})["streamer"] = model.streamer.stats(len(out))
        result.setdefault("stats", {})["packed_bytes"] = model.packed_bytes  # --pack: 0 when the matrices are not packed
        print(json.dumps(result, ensure_ascii=False))
    if stats is not None:
        _report_speculative(args, model, tok, stats)
    if model.streamer is not None:
        for line in model.streamer.summary_lines(len(out), mtp=args.mtp):
            print(line, file=sys.stderr)
    elif model.config.is_moe:
        print("stream: none — the routed experts are read from the memory map (--emulate=ggml and --cache-mb auto: the "
              "file fits in memory, whose page cache keeps it; --cache-mb N streams them)", file=sys.stderr)
    if trace is not None:
        print(f"wrote {trace.path}: {trace.n_rows} routing rows (one per position and layer)", file=sys.stderr)
    return 0


def _injected(args):
    """run --inject NAME[,NAME…]: the faults to inject (refimpl.inject.faults, docs/bug-classes.md), announced on stderr."""
    from refimpl.inject.faults import parse_faults

    faults = parse_faults(args.inject, "mtp" if args.mtp else "ngram" if args.ngram else None)
    for f in faults:
        print(f"refimpl: injected fault {f.name} ({f.bug_class}: {f.title}); the output is wrong on purpose", file=sys.stderr)
    return faults


def _no_route(routes) -> None:
    """The streamer's routing hook until :func:`_route_trace` attaches its writer."""


def _route_trace(args, model):
    """run --route-trace FILE: attach a CSV route-trace writer to the model's streamer."""
    if args.route_trace is None:
        return None
    if not model.config.is_moe:
        raise RefimplError(f"--route-trace: {model.config.arch.name} is a dense model; there is no expert routing to trace")
    from refimpl.io.route_trace import RouteTrace

    with writing(args.route_trace, "--route-trace") as path:
        model.streamer.on_route = RouteTrace(path, model.config.n_expert_used)
    return model.streamer.on_route


def _speculative_options(args, model, ctx) -> dict | None:
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
    from refimpl.decode.drafts import NGRAM_MAX_MATCH
    from refimpl.decode.speculative import MAX_DRAFT, make_source

    n_draft = 3 if args.draft is None else args.draft
    if not 1 <= n_draft <= MAX_DRAFT:
        raise RefimplError(f"--draft must be between 1 and {MAX_DRAFT}, got {n_draft}")
    p_min = args.mtp_p_min or 0.0
    min_match = 3 if args.ngram_min_match is None else args.ngram_min_match
    if not 1 <= min_match <= NGRAM_MAX_MATCH:  # llama.cpp's ngram-simple looks back at most NGRAM_MAX_MATCH tokens
        raise RefimplError(f"--ngram-min-match must be between 1 and {NGRAM_MAX_MATCH}, got {min_match}")
    # build the source now: --mtp on a GGUF without nextn tensors is refused here, before generating
    src = make_source(model, source, ctx, p_min=p_min, ngram_min_match=min_match)
    return dict(source=src, n_draft=n_draft, p_min=p_min, ngram_min_match=min_match)


def _report_speculative(args, model, tok, stats) -> None:
    from refimpl.decode.telemetry import summary_lines, write_csv

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
