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
