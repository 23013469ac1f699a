"""The ``refimpl`` command line: :func:`main` (pyproject's ``refimpl`` script, ``python -m refimpl``) and
:func:`build_parser`, which lists every command.

Contract (what lives in this folder):

* One module per command, each holding its subparser (``add_parser(sub)``: flags and help) next to the
  function it runs (``cmd_*(args) -> exit code``): ``fixture``, ``inspect_model`` (``refimpl inspect``),
  ``run`` (greedy and self-speculative decoding), ``logits`` (also llama-perplexity's KL-divergence base
  file), ``trace``, ``golden`` (make, check), ``audit`` (streams, goldens, KL-divergence base files), ``validate`` (llama-server endpoints
  driven with a prompt suite, each answer audited), ``plot``. ``common`` holds what they share: the parser class, MODEL and its loading,
  ``--tokens``, the numerics flags (``--emulate``, ``--flash-attn``, ``--kv-type``, ``--kernel``) and their
  ``Ctx``, the scale-out flags. ``compile_report`` prints the first run's "compiling kernels" lines;
  ``compile_ahead`` starts the process that compiles beside a first ``run --emulate=ggml``.
* A command parses flags, checks them, and calls the library; the work itself lives below. Heavy imports
  (the model, numba) stay inside the ``cmd_*`` functions.
* Every flag combination either works or is refused: bad input (bad flags, unreadable or unsupported
  files) prints one line, ``refimpl: error: …``, and exits with code 2; no traceback
  (tests/test_cli_flags.py walks the flag pairs of :func:`build_parser`). Exit code 1 is a verdict:
  ``audit`` or ``validate`` found a wrong token, ``golden check`` a mismatch.
* ``--emulate`` (and ``run --pack``) take the next argument only when it is one of their words:
  ``--emulate plain`` = ``--emulate=plain``, ``--emulate`` alone = ``--emulate=default``, and in
  ``refimpl run --emulate model.gguf`` the file is MODEL (:class:`refimpl.cli.common.Parser`).

May import everything below it: ``refimpl.errors``, ``refimpl.io``, ``refimpl.tokenizer``,
``refimpl.fixtures``, ``refimpl.model``, ``refimpl.decode``, ``refimpl.oracle``, ``refimpl.inject`` (and
``kernels`` through them). Within refimpl, only ``refimpl.__main__`` and the Python API (``refimpl.api``: ``common``'s
loading and ``Ctx``) import this folder.
"""

from __future__ import annotations

import sys

from refimpl.cli import audit, fixture, golden, inspect_model, logits, plot, run, trace, validate
from refimpl.cli.common import Parser, check_numerics
from refimpl.cli.logits import LOGITS_CHUNK  # noqa: F401  (bench/decode.py: refimpl logits' positions per forward call)
from refimpl.errors import EXIT_BAD_INPUT, RefimplError

#: The commands, in the order of ``refimpl --help``; each module adds its subparser (``add_parser``).
COMMANDS = (fixture, inspect_model, run, logits, trace, golden, audit, validate, plot)

#: Commands that never call a kernel: no compile report, numba's compile events are not listened to.
_NO_KERNELS = (fixture.cmd_fixture, inspect_model.cmd_inspect)


def build_parser() -> Parser:
    parser = Parser(prog="refimpl", description="Reference implementation of llama.cpp's qwen35moe, qwen35 and qwen3next inference.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def _one_line(message: str) -> str:
    """An error message as one line: a character that is not printable (a newline, a NUL, … quoted from
    a damaged file's key or name) is written as its escape, ``\\n``, ``\\x00``."""
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def main(argv: list[str] | None = None) -> int:
    from refimpl.cli import compile_ahead

    argv = sys.argv[1:] if argv is None else argv
    # a first run: its second process starts before the parser's imports (compile_ahead.spawn)
    child = compile_ahead.spawn(argv)
    try:
        return _main(argv, child)
    finally:
        if child is not None:
            child.close()


def _main(argv: list[str], child) -> int:
    import numpy as np

    from refimpl.cli import compile_ahead

    try:
        args = build_parser().parse_args(argv)
        check_numerics(args)  # a flag combination that cannot work is refused before any work
        with np.errstate(all="ignore"):  # IEEE arithmetic as in C: inf/NaN weights compute, silently (refimpl.model.ops.ieee)
            if args.func in _NO_KERNELS:
                return args.func(args)
            from refimpl.io.malloc import reuse_freed_memory

            reuse_freed_memory()  # the same large arrays every token: from the heap, not fresh pages
            from refimpl.cli.compile_report import compile_report

            # run on an empty numba cache: a second process compiles the kernels the run meets last
            args.compile_ahead = compile_ahead.start(args, child) if args.func is run.cmd_run else None
            try:  # the first run's "compiling kernels …" lines
                with compile_report(note=compile_ahead.NOTE if args.compile_ahead is not None else ""):
                    return args.func(args)
            finally:
                if args.compile_ahead is not None:
                    args.compile_ahead.close()
    except RefimplError as exc:
        print(f"refimpl: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValueError as exc:  # --emulate=ggml: an op whose code on the path is not emulated, met while computing
        from kernels.ggml.build import NotEmulated

        if not isinstance(exc, NotEmulated):
            raise
        print(f"refimpl: error: --emulate=ggml: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `refimpl … | head`: stdout closed early; no traceback, as a C tool would die of SIGPIPE
        import os

        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's final flush must not fail again
        except (OSError, ValueError):  # a stdout without a file descriptor (in-process callers)
            pass
        return 141


if __name__ == "__main__":
    sys.exit(main())
