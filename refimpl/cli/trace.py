"""``refimpl trace``: the named intermediates of one forward pass (llama.cpp's ``cb`` names:
``attn_norm-0``, ``linear_attn_out-0``, …, ``result_output``), one NAME.npy each, for diffing against
llama.cpp's eval callback."""

from __future__ import annotations

import sys

from refimpl.cli.common import MODEL_HELP, add_numerics, check_tokens, ctx_from_args, load, parse_tokens
from refimpl.io.output_path import check_output, writing


def add_parser(sub) -> None:
    p = sub.add_parser("trace", help="dump named intermediates (llama.cpp's names) for diffing against its eval callback")
    p.add_argument("model", nargs="?", help=MODEL_HELP)
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", default="trace", help="output directory (default ./trace)")
    add_numerics(p)
    p.set_defaults(func=cmd_trace)


def cmd_trace(args) -> int:
    import numpy as np

    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward
    from refimpl.oracle.trace import Recorder

    check_output(args.out, "--out", directory=True)
    model = load(args)
    tokens = check_tokens(model, parse_tokens(args.tokens))
    rec = Recorder()
    forward(model, SeqState.fresh(model.config), tokens, ctx_from_args(args, trace=rec))
    lines = []
    with writing(args.out, "--out", directory=True) as out:
        for name, arr in rec.arrays().items():
            np.save(out / f"{name}.npy", arr)
            lines.append(f"{name:<32} {str(list(arr.shape)):<16} sum = {float(np.sum(arr, dtype=np.float64)):.6f}")
    if lines:
        print("\n".join(lines))  # after the files: a closed stdout (`| head`) is not a failure to write --out
    print(f"wrote {len(rec.arrays())} tensors to {out}/ (one NAME.npy each, first axis = position)", file=sys.stderr)
    return 0
