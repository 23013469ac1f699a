"""The ``refimpl`` command line. Each subcommand parses its flags here and calls one function.

Errors in the user's input (bad flags, unreadable or unsupported files) print one line,
``refimpl: error: …``, and exit with code 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys

from refimpl.errors import EXIT_BAD_INPUT, RefimplError


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
    path = write_fixture(args.out, preset=args.preset, quant=args.quant, seed=args.seed, **options)
    print(path)
    return 0


def _cmd_inspect(args) -> int:
    from refimpl.inspect_model import describe
    from refimpl.load import open_model

    print(describe(open_model(args.model)))
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
    from refimpl.ops import Ctx

    return Ctx(act_quant=args.emulate, kv_f16=args.emulate, kernel=args.kernel, trace=trace)


def _load(args):
    """The model named by MODEL or -m, or the built-in synthetic model when neither is given."""
    from refimpl.builtin import fixture_path
    from refimpl.model import load_model

    path = getattr(args, "m", None) or args.model
    if path is None:
        path = fixture_path()
        print(f"refimpl: no model given; using the built-in synthetic model {path}", file=sys.stderr)
    return load_model(path)


def _check_tokens(model, tokens: list[int]) -> list[int]:
    bad = [t for t in tokens if not 0 <= t < model.config.n_vocab]
    if bad:
        raise RefimplError(f"token id {bad[0]} is out of range for this model's vocabulary [0, {model.config.n_vocab})")
    return tokens


def _cmd_run(args) -> int:
    import json

    from tqdm import tqdm

    from refimpl.generate import greedy
    from refimpl.tokenizer import Tokenizer

    if args.n_predict < 0:
        raise RefimplError(f"-n must be ≥ 0, got {args.n_predict}")
    model = _load(args)
    tok = Tokenizer.from_gguf(model.file.gguf.reader)
    if args.tokens is not None:
        prompt = _check_tokens(model, _parse_tokens(args.tokens))
    else:
        prompt = tok.encode(args.prompt, parse_special=True)
        if not prompt:
            raise RefimplError("the prompt encodes to no tokens")
    stream = _TextStream(tok) if not args.json else None
    bar = tqdm(total=args.n_predict, desc="generating", unit="tok", file=sys.stderr, disable=None, leave=False)
    out = greedy(model, prompt, args.n_predict, _ctx_from_args(args), eog_ids=frozenset(tok.eog_ids),
                 on_token=stream.write if stream else None, progress=bar)
    bar.close()
    if stream:
        stream.close()
    else:
        print(json.dumps({"prompt_tokens": prompt, "tokens": out, "text": tok.decode(out)}, ensure_ascii=False))
    return 0


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


def _cmd_logits(args) -> int:
    import numpy as np

    from refimpl.model import forward
    from refimpl.state import SeqState

    from tqdm import tqdm

    model = _load(args)
    tokens = _check_tokens(model, _parse_tokens(args.tokens))
    # Chunks of 16 positions with a progress bar; forward is batch-invariant, so chunking changes
    # nothing in the numbers.
    state, rows, ctx = SeqState.fresh(model.config), [], _ctx_from_args(args)
    with tqdm(total=len(tokens), desc="logits", unit="tok", file=sys.stderr, disable=None, leave=False) as bar:
        for i in range(0, len(tokens), 16):
            chunk, _, state = forward(model, state, tokens[i : i + 16], ctx)
            rows.append(chunk)
            bar.update(len(tokens[i : i + 16]))
    logits = np.concatenate(rows)
    np.save(args.out, logits.astype(np.float32))
    print(f"wrote {args.out}: logits {logits.shape[0]} x {logits.shape[1]} (row p = logits after position p)", file=sys.stderr)
    return 0


def _cmd_trace(args) -> int:
    from pathlib import Path

    import numpy as np

    from refimpl.model import forward
    from refimpl.state import SeqState
    from refimpl.trace import Recorder

    model = _load(args)
    tokens = _check_tokens(model, _parse_tokens(args.tokens))
    rec = Recorder()
    forward(model, SeqState.fresh(model.config), tokens, _ctx_from_args(args, trace=rec))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, arr in rec.arrays().items():
        np.save(out / f"{name}.npy", arr)
        print(f"{name:<32} {str(list(arr.shape)):<16} sum = {float(np.sum(arr, dtype=np.float64)):.6f}")
    print(f"wrote {len(rec.arrays())} tensors to {out}/ (one NAME.npy each, first axis = position)", file=sys.stderr)
    return 0


def _add_numerics(p) -> None:
    p.add_argument("--emulate", action="store_true",
                   help="emulate llama.cpp rounding: activation quantization per matmul and an F16 K/V cache")
    p.add_argument("--kernel", choices=("numba", "numpy"), default="numba", help="quantized matmul implementation")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="refimpl", description="Reference implementation of llama.cpp's qwen35moe inference.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("fixture", help="write a seeded synthetic qwen35moe GGUF")
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--preset", default="tiny", help="fixture preset (tiny, predictable, …)")
    p.add_argument("--quant", default="f32", help="quant mix (f32, bf16, q8_0, q4_k_m, mxfp4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="variant option: mtp=full|stripped|extras, tied=true, fused_gate_up=true, recurrent_layers_key=false")
    p.set_defaults(func=_cmd_fixture)

    p = sub.add_parser("inspect", help="print a GGUF's config, layer kinds and tensor bytes per type")
    p.add_argument("model", help="path to a qwen35moe .gguf")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("run", help="greedy generation (the built-in synthetic model when no MODEL is given)")
    p.add_argument("model", nargs="?", help="path to a qwen35moe .gguf (default: built-in synthetic model)")
    p.add_argument("-m", metavar="MODEL", help="same as the positional MODEL")
    src = p.add_mutually_exclusive_group()
    src.add_argument("-p", "--prompt", default="The quick brown fox", help="prompt text (special-token text is parsed)")
    src.add_argument("--tokens", help="prompt as comma-separated token ids")
    p.add_argument("-n", "--n-predict", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    _add_numerics(p)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("logits", help="write every position's logits as a (T, V) float32 .npy")
    p.add_argument("model", nargs="?", help="path to a qwen35moe .gguf (default: built-in synthetic model)")
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", required=True, help="output .npy path")
    _add_numerics(p)
    p.set_defaults(func=_cmd_logits)

    p = sub.add_parser("trace", help="dump named intermediates (llama.cpp's names) for diffing against its eval callback")
    p.add_argument("model", nargs="?", help="path to a qwen35moe .gguf (default: built-in synthetic model)")
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", default="trace", help="output directory (default ./trace)")
    _add_numerics(p)
    p.set_defaults(func=_cmd_trace)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except RefimplError as exc:
        print(f"refimpl: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
