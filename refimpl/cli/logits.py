"""``refimpl logits``: every position's logits as a (T, V) float32 .npy (and the MTP head's with
``--mtp-out``); or, with ``--kld-base OUT --text FILE``, llama-perplexity's KL-divergence base file of the
oracle over a text corpus (refimpl.oracle.kld)."""

from __future__ import annotations

import sys

from refimpl.cli.common import MODEL_HELP, add_numerics, check_tokens, ctx_from_args, load, parse_tokens
from refimpl.errors import RefimplError
from refimpl.io.output_path import check_output, writing

#: Positions per ``forward`` call of ``refimpl logits``. Larger batches decode each weight block once for
#: more rows (the lane kernels' wide path; a routed expert sees ~8 rows of 256 tokens instead of ~1 of
#: 16): medium, 256-token prompt, 2 threads, Sapphire Rapids AVX-512: 33 / 38 / 48 tok/s (q4_k_m) for
#: chunks of 16 / 64 / 256 (docs/performance.md). Memory: the chunk's logits, 256 × V float32.
LOGITS_CHUNK = 256

#: --kld-base's default --ctx: llama-perplexity's (``params.n_ctx = 512``, tools/perplexity/perplexity.cpp:1993).
KLD_CTX = 512


def add_parser(sub) -> None:
    p = sub.add_parser("logits", help="write every position's logits as a (T, V) float32 .npy")
    p.add_argument("model", nargs="?", help=MODEL_HELP)
    p.add_argument("--tokens", help="comma-separated token ids (with --out)")
    p.add_argument("--out", help="output .npy path")
    p.add_argument("--mtp-out", metavar="FILE.npy",
                   help="also write the MTP head's (T, V) logits: row p fed token p and the trunk's h_nextn of p-1")
    kld = p.add_argument_group("llama-perplexity's KL-divergence base (docs/validating-an-engine.md)")
    kld.add_argument("--kld-base", metavar="OUT",
                     help="write the file `llama-perplexity -f FILE --kl-divergence-base OUT` writes, from the oracle's "
                          "logits; score an engine against it with `llama-perplexity -m ENGINE.gguf --kl-divergence-base OUT "
                          "--kl-divergence`")
    kld.add_argument("--text", metavar="FILE", help="with --kld-base: the corpus, a text file (llama-perplexity's -f)")
    kld.add_argument("--ctx", type=int, metavar="N",
                     help="with --kld-base: tokens per chunk (llama-perplexity's -c; default 512); positions N/2 .. N-2 "
                          "of each chunk are scored")
    kld.add_argument("--chunks", type=int, metavar="N", help="with --kld-base: at most N chunks (llama-perplexity's --chunks)")
    add_numerics(p)
    p.set_defaults(func=cmd_logits)


def _check_mode(args) -> None:
    """--tokens/--out (logits as .npy) or --kld-base/--text (a base file): one or the other, whole."""
    if args.kld_base is None:
        for flag, value in (("--text", args.text), ("--ctx", args.ctx), ("--chunks", args.chunks)):
            if value is not None:
                raise RefimplError(f"{flag} goes with --kld-base OUT")
        if args.tokens is None or args.out is None:
            raise RefimplError("logits needs --tokens IDS and --out FILE (or --kld-base OUT --text FILE)")
        return
    for flag, value in (("--tokens", args.tokens), ("--out", args.out), ("--mtp-out", args.mtp_out)):
        if value is not None:
            raise RefimplError(f"{flag} does not go with --kld-base: the corpus is --text FILE, the output the base file")
    if args.text is None:
        raise RefimplError("--kld-base needs --text FILE: the corpus llama-perplexity reads with -f")


def cmd_logits(args) -> int:
    import numpy as np
    from tqdm import tqdm

    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward

    _check_mode(args)
    if args.kld_base is not None:
        return _kld_base(args)
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


def _kld_base(args) -> int:
    """logits --kld-base OUT --text FILE: llama-perplexity's base file of the oracle (refimpl.oracle.kld)."""
    from pathlib import Path

    from refimpl.oracle.kld import chunking, corpus_tokens, progress_bar, write_base
    from refimpl.tokenizer import Tokenizer

    n_ctx = KLD_CTX if args.ctx is None else args.ctx
    check_output(args.kld_base, "--kld-base")
    if not Path(args.text).is_file():
        raise RefimplError(f"--text {args.text}: {'is a directory' if Path(args.text).is_dir() else 'no such file'}")
    chunking(2 * n_ctx, n_ctx, args.chunks, "")  # --ctx and --chunks refused before the model loads
    model = load(args)
    tok = Tokenizer.from_gguf(model.file.gguf)
    tokens = corpus_tokens(args.text, tok)
    n_chunk = chunking(len(tokens), n_ctx, args.chunks, f"--text {args.text}")
    bar, progress = progress_bar(n_chunk, "kld-base")
    with bar, writing(args.kld_base, "--kld-base") as path, open(path, "wb") as f:
        done = write_base(f, model, tok, tokens, n_ctx, n_chunk, ctx_from_args(args), progress)
    print(f"wrote {args.kld_base}: llama-perplexity KL-divergence base of the oracle, {len(tokens)} tokens, n_ctx {n_ctx}, "
          f"{n_chunk} chunks x {len(done.nll) // n_chunk} scored positions, vocabulary {model.config.n_vocab}; "
          f"{done.final_estimate()}", file=sys.stderr)
    return 0
