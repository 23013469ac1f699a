"""``refimpl plot audit|telemetry|routes … --out PNG``: pictures of an audit, a telemetry CSV (run --csv)
and a route trace (run --route-trace); refimpl.oracle.plot, matplotlib (the 'plot' extra)."""

from __future__ import annotations

import sys

from refimpl.cli.common import Parser, add_numerics, check_tokens, ctx_from_args, default_model, parse_tokens
from refimpl.errors import RefimplError
from refimpl.io.output_path import check_output, writing


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="pictures (PNG) of an audit, a telemetry CSV or a route trace (needs matplotlib)")
    psub = p.add_subparsers(dest="plot_command", required=True, parser_class=Parser)
    p = psub.add_parser("audit", help="the oracle's margin along a stream, the near-tie band, the divergence")
    p.add_argument("model", metavar="MODEL", nargs="?",
                   help="a .gguf (qwen35moe, qwen35, qwen3next), builtin:PRESET[/QUANT]…, or builtin:kjv (the trained model, the default)")
    p.add_argument("stream", metavar="STREAM",
                   help="JSON ids, JSON with 'tokens', telemetry CSV, a server response (as refimpl audit reads), or text")
    p.add_argument("--prompt-tokens", metavar="IDS", help="the prompt as comma-separated token ids")
    p.add_argument("--threshold", type=float, default=0.05, metavar="TAU", help="near-tie band, a fraction of max|logit|")
    p.add_argument("--out", required=True, metavar="PNG")
    add_numerics(p)
    p.set_defaults(func=cmd_plot)
    for name, what in (("telemetry", "acceptance per round and per draft position, MiB per token, hit rate (run --csv)"),
                       ("routes", "expert-use heat map per layer (run --route-trace)")):
        p = psub.add_parser(name, help=what)
        p.add_argument("csv", metavar="CSV")
        p.add_argument("--out", required=True, metavar="PNG")
        p.set_defaults(func=cmd_plot)


def cmd_plot(args) -> int:
    """plot audit|telemetry|routes … --out PNG (refimpl.oracle.plot; matplotlib, the 'plot' extra)."""
    from pathlib import Path

    from refimpl.oracle import plot

    plot._pyplot()  # one-line error now if matplotlib is missing
    check_output(args.out, "--out")
    if args.plot_command == "telemetry":
        fig = plot.draw_telemetry(plot.telemetry_series(args.csv), title=Path(args.csv).name)
    elif args.plot_command == "routes":
        fig = plot.draw_routes(*plot.route_counts(args.csv), title=f"{Path(args.csv).name}: expert selections per layer")
    else:
        from refimpl.fixtures.builtin import resolve_model
        from refimpl.model.trunk import load_model
        from refimpl.oracle.audit import read_stream
        from refimpl.oracle.stream_file import check_streams
        from refimpl.tokenizer import Tokenizer

        model = load_model(resolve_model(default_model(args.model)))
        tok = Tokenizer.from_gguf(model.file.gguf)
        stream = read_stream(args.stream, "A", tok)
        check_streams([stream], model.config.n_vocab)  # ids outside the vocabulary: one line, not an IndexError
        prompt = parse_tokens(args.prompt_tokens, "--prompt-tokens") if args.prompt_tokens is not None else stream.prompt
        if prompt is None:
            raise RefimplError("plot audit needs the prompt: --prompt-tokens IDS (or a stream that carries it: a JSON "
                               "stream's prompt_tokens, a server response's echoed prompt)")
        series = plot.audit_series(model, check_tokens(model, prompt), stream.tokens, ctx=ctx_from_args(args), tau=args.threshold)
        fig = plot.draw_audit(series, title=f"audit of {Path(args.stream).name}: first divergence {series.verdict}",
                              piece=lambda t: tok.decode([t]))
    with writing(args.out, "--out") as out:
        plot.save(fig, out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
