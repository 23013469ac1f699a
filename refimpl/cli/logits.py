"""``refimpl logits``: every position's logits as a (T, V) float32 .npy (and the MTP head's with
``--mtp-out``)."""

from __future__ import annotations

import sys

from refimpl.cli.common import MODEL_HELP, add_numerics, check_tokens, ctx_from_args, load, parse_tokens
from refimpl.io.output_path import check_output, writing

#: Positions per ``forward`` call of ``refimpl logits``. Larger batches decode each weight block once for
#: more rows (the lane kernels' wide path; a routed expert sees ~8 rows of 256 tokens instead of ~1 of
#: 16): medium, 256-token prompt, 2 threads, Sapphire Rapids AVX-512: 33 / 38 / 48 tok/s (q4_k_m) for
#: chunks of 16 / 64 / 256 (docs/performance.md). Memory: the chunk's logits, 256 × V float32.
LOGITS_CHUNK = 256


def add_parser(sub) -> None:
    p = sub.add_parser("logits", help="write every position's logits as a (T, V) float32 .npy")
    p.add_argument("model", nargs="?", help=MODEL_HELP)
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", required=True, help="output .npy path")
    p.add_argument("--mtp-out", metavar="FILE.npy",
                   help="also write the MTP head's (T, V) logits: row p fed token p and the trunk's h_nextn of p-1")
    add_numerics(p)
    p.set_defaults(func=cmd_logits)


def cmd_logits(args) -> int:
    import numpy as np
    from tqdm import tqdm

    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward

    for flag, path in (("--out", args.out), ("--mtp-out", args.mtp_out)):
        if path is not None:
            check_output(path, flag)
    model = load(args)
    tokens = check_tokens(model, parse_tokens(args.tokens))
    # Chunks of LOGITS_CHUNK positions with a progress bar; forward is batch-invariant, so chunking
    # changes nothing in the numbers.
    state, rows, hs, ctx = SeqState.fresh(model.config), [], [], ctx_from_args(args)
    if args.mtp_out:
        from refimpl.model.mtp import require_mtp

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
        from refimpl.decode.drafts import mtp_catchup_logits

        mtp = mtp_catchup_logits(model, tokens, np.concatenate(hs), ctx)  # [T, V]
        with writing(args.mtp_out, "--mtp-out") as path, open(path, "wb") as f:
            np.save(f, mtp.astype(np.float32))
        print(f"wrote {args.mtp_out}: MTP logits {mtp.shape[0]} x {mtp.shape[1]} (row p fed token p and the "
              f"trunk's h_nextn of p-1, zeros at p = 0; predicts token p+1)", file=sys.stderr)
    return 0
