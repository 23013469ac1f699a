"""``refimpl golden make|check``: golden token streams (refimpl.oracle.golden, docs/golden.md)."""

from __future__ import annotations

import sys

from refimpl.cli.common import (Parser, add_kernel, add_numerics, add_scale_out, cache_mb, ctx_from_args,
                                default_model)
from refimpl.errors import RefimplError


def add_parser(sub) -> None:
    p = sub.add_parser("golden", help="golden token streams: make a golden file, or check one (docs/golden.md)")
    gsub = p.add_subparsers(dest="golden_command", required=True, parser_class=Parser)

    p = gsub.add_parser("make", help="decode a prompts file and write a golden file")
    p.add_argument("model", metavar="MODEL", nargs="?",
                   help="a .gguf (qwen35moe, qwen35, qwen3next), builtin:kjv (the trained model, the default), or a built-in fixture: "
                        "builtin:PRESET[/QUANT][/seed=N][/KEY=VALUE…]")
    p.add_argument("--prompts", required=True, metavar="FILE", help="one prompt per line, or JSONL with 'text' or 'tokens'")
    p.add_argument("-n", "--n-predict", type=int, default=32, help="tokens to generate per prompt (default 32)")
    p.add_argument("--out", metavar="PATH", help="golden file to write (default MODEL-NAME.golden.jsonl)")
    add_scale_out(p, "prompts decoded")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--mtp", action="store_true", help="decode with MTP drafting (tokens equal plain greedy)")
    g.add_argument("--ngram", action="store_true", help="decode with n-gram drafting (tokens equal plain greedy)")
    p.add_argument("--draft", type=int, metavar="N", help="drafts per round with --mtp/--ngram (default 3)")
    add_numerics(p)
    p.set_defaults(func=cmd_golden_make)

    p = gsub.add_parser("check", help="recompute a golden file and compare (exit 1 on a mismatch)")
    p.add_argument("golden", metavar="GOLDEN", help="a golden .jsonl file")
    p.add_argument("model", metavar="MODEL", nargs="?", help="the GGUF it was made from (not needed for built-in fixtures)")
    add_scale_out(p, "prompts recomputed")
    add_kernel(p)
    p.set_defaults(func=cmd_golden_check)


def cmd_golden_make(args) -> int:
    from refimpl.oracle.golden import Settings, make_golden

    source = "mtp" if args.mtp else "ngram" if args.ngram else None
    if args.draft is not None and source is None:
        raise RefimplError("--draft needs --mtp or --ngram")
    ctx = ctx_from_args(args)
    ggml = dict(ggml=ctx.ggml, n_ubatch=ctx.n_ubatch, n_threads=ctx.n_threads, n_ctx=ctx.n_ctx, repack=ctx.repack,
                ggml_accepted=ctx.ggml_accepted, ggml_named=ctx.ggml_named) if ctx.ggml else {}  # --emulate=ggml: in the header
    settings = Settings(args.n_predict, source, (3 if args.draft is None else args.draft) if source else 0, ctx.act_quant,
                        kv_f16=ctx.kv_f16, flash_attn=ctx.flash_attn, **ggml)
    out = make_golden(default_model(args.model), args.prompts, settings, args.out, jobs=args.jobs, kernel=args.kernel,
                      cluster=args.cluster, cache_mb=cache_mb(args), announce=ctx.announce)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def cmd_golden_check(args) -> int:
    from refimpl.oracle.golden import check_golden
    from refimpl.oracle.golden_file import read_golden

    if args.kernel == "numpy" and read_golden(args.golden).settings.emulate:
        raise RefimplError(f"{args.golden} was made with --emulate: checking it needs --kernel numba (llama.cpp's "
                           "activation quantization is emulated by the numba kernels only)")
    result = check_golden(args.golden, args.model, jobs=args.jobs, kernel=args.kernel, cluster=args.cluster,
                          cache_mb=cache_mb(args))
    print("\n".join(result.lines), file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1
