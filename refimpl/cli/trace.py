"""``refimpl trace``: the named intermediates of one forward pass (llama.cpp's ``cb`` names:
``attn_norm-0``, ``linear_attn_out-0``, …, ``result_output``), one NAME.npy each, for diffing against
llama.cpp's eval callback; with ``--against DUMP``, an engine's own dumped intermediates compared with
them, naming per position the first that departs (refimpl.oracle.trace_against)."""

from __future__ import annotations

import json
import sys

from refimpl.cli.common import MODEL_HELP, add_numerics, check_tokens, ctx_from_args, load, parse_tokens
from refimpl.errors import RefimplError
from refimpl.io.output_path import check_output, writing


def add_parser(sub) -> None:
    p = sub.add_parser("trace", help="dump named intermediates (llama.cpp's names), or find where an engine's dump departs")
    p.add_argument("model", nargs="?", help=MODEL_HELP)
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", help="output directory (default ./trace; with --against, nothing is written unless given)")
    p.add_argument("--against", metavar="DUMP",
                   help="an engine's intermediates under llama.cpp's names: a directory of NAME.npy (first axis = "
                        "position), a GGUF of them, or llama-eval-callback's printed text (sums only); names, per "
                        "position, the first that departs from the oracle beyond the bound of the configuration "
                        "(exit 1 when one does) — docs/validating-an-engine.md, 'Where an engine departs'")
    p.add_argument("--batch", type=int, metavar="N",
                   help="forward the tokens N per call, as the engine decoded them (default: all in one call, as "
                        "one llama_decode; with --emulate=ggml the batch shape decides the bits)")
    p.add_argument("--json", action="store_true", help="with --against: the report as JSON on stdout")
    add_numerics(p)
    p.set_defaults(func=cmd_trace)


def cmd_trace(args) -> int:
    if args.against is None and (args.json or args.batch is not None):
        raise RefimplError(f"{'--json' if args.json else '--batch'} goes with --against DUMP")
    if args.batch is not None and args.batch < 1:
        raise RefimplError(f"--batch must be positive, got {args.batch}")
    if args.against is not None:
        return _against(args)
    import numpy as np

    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward
    from refimpl.oracle.trace import Recorder

    args.out = args.out or "trace"
    check_output(args.out, "--out", directory=True)
    model = load(args)
    tokens = check_tokens(model, parse_tokens(args.tokens))
    rec = Recorder()
    forward(model, SeqState.fresh(model.config), tokens, ctx_from_args(args, trace=rec))
    _write(args.out, rec.arrays())
    return 0


def _write(out_dir, arrays, quiet: bool = False) -> None:
    import numpy as np

    lines = []
    with writing(out_dir, "--out", directory=True) as out:
        for name, arr in arrays.items():
            np.save(out / f"{name}.npy", arr)
            lines.append(f"{name:<32} {str(list(arr.shape)):<16} sum = {float(np.sum(arr, dtype=np.float64)):.6f}")
    if lines and not quiet:
        print("\n".join(lines))  # after the files: a closed stdout (`| head`) is not a failure to write --out
    print(f"wrote {len(arrays)} tensors to {out}/ (one NAME.npy each, first axis = position)", file=sys.stderr)


def _against(args) -> int:
    from refimpl.oracle.dump_read import read_dump
    from refimpl.oracle.trace_against import trace_against
    from refimpl.oracle.trace_report import format_report, report_json

    if args.out is not None:
        check_output(args.out, "--out", directory=True)
    dump = read_dump(args.against)  # a bad dump is refused before the model loads
    model = load(args)
    tokens = check_tokens(model, parse_tokens(args.tokens))
    ctx = ctx_from_args(args)
    report = trace_against(model, tokens, dump, ctx, args.batch)
    if args.out is not None:
        _write(args.out, report.ours, quiet=True)  # refimpl's own values (a patched name: computed from the engine's upstream)
    if args.json:
        print(json.dumps(report_json(report), indent=1, allow_nan=False))
    else:
        print(format_report(report))
    return report.exit_code
