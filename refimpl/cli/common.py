"""What the commands share: the parser class (one-line usage errors; ``--emulate`` / ``--pack`` that never
take a MODEL as their value), the model argument and its loading, ``--tokens``, the numerics flags and
their :class:`refimpl.model.ops.Ctx`, and the scale-out flags.

Heavy imports (numpy, numba, the model) stay inside the functions: ``refimpl fixture`` and ``refimpl
inspect`` never import the kernels.
"""

from __future__ import annotations

import argparse
import sys

from refimpl.errors import RefimplError

#: MODEL's help, for every command that takes one.
MODEL_HELP = "a .gguf (qwen35moe, qwen35, qwen3next) or builtin:… (default: the built-in trained model, builtin:kjv)"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (:class:`RefimplError`, exit code 2), and an option whose
    value is optional and one of a few words (``--emulate [CONFIG]``, ``--pack [on|off|auto]``) takes the
    next argument only when it is one of those words: ``--emulate plain``, ``--emulate=plain`` and
    ``--emulate`` alone (= ``--emulate=default``) all work, and in ``run --emulate model.gguf`` the file
    is MODEL. (A MODEL literally named ``plain`` is then spelled ``./plain``.)"""

    def error(self, message):
        raise RefimplError(f"{self.prog}: {message}")

    def parse_known_args(self, args=None, namespace=None):
        # argparse calls this on each subcommand's parser with that subcommand's arguments
        return super().parse_known_args(self._optional_values(sys.argv[1:] if args is None else list(args)), namespace)

    def _optional_values(self, args: list[str]) -> list[str]:
        """``--opt WORD`` → ``--opt=WORD`` when WORD is one of the option's choices, else ``--opt`` →
        ``--opt=CONST``, for this parser's options with ``nargs="?"`` and choices (abbreviations included,
        as argparse accepts them); nothing after ``--``."""
        out, i = [], 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                return out + args[i:]
            action = self._optional_word_action(arg)
            if action is None:
                out.append(arg)
            elif i + 1 < len(args) and args[i + 1] in action.choices:
                out.append(f"{arg}={args[i + 1]}")
                i += 1
            else:
                out.append(f"{arg}={action.const}")
            i += 1
        return out

    def _optional_word_action(self, arg: str):
        if not arg.startswith("--") or "=" in arg:
            return None
        action = self._option_string_actions.get(arg)
        if action is None and self.allow_abbrev:
            matches = {a for opt, a in self._option_string_actions.items() if opt.startswith(arg)}
            action = matches.pop() if len(matches) == 1 else None  # ambiguous: argparse says so
        if action is not None and action.nargs == "?" and action.choices:
            return action
        return None


def default_model(arg: str | None, note: bool = True) -> str:
    """MODEL as given, or ``builtin:kjv`` (the built-in trained model) with a note on stderr (``note``)."""
    from refimpl.fixtures.builtin import TRAINED_DESCRIPTION, TRAINED_SPEC, resolve_model

    if arg is not None:
        return arg
    if note:
        print(f"refimpl: no model given; using the built-in trained model {TRAINED_SPEC}: {TRAINED_DESCRIPTION} "
              f"({resolve_model(TRAINED_SPEC)}). Name a GGUF, or builtin:tiny for the synthetic fixture.", file=sys.stderr)
    return TRAINED_SPEC


def model_given(args) -> str | None:
    """MODEL or -m (:func:`load` refuses both), None when neither is given."""
    return getattr(args, "m", None) or args.model


def load(args, cache_mb=None, pack="auto", min_pack_bytes=0, ggml=None, on_route=None, stand_in=False):
    """The model named by MODEL or -m, or the built-in trained model when neither is given;
    ``cache_mb`` (run's --cache-mb) streams its routed experts (refimpl.io.streamer); ``pack`` (run's
    --pack) also keeps its matrices in the lane kernels' layout (refimpl.io.packing.pack_weights) or, with
    ``ggml`` = (path, repack) of an ``--emulate=ggml`` run (worked out from ``args`` when not given), in the column
    layout of its kernels (refimpl.graph.layout.ggml_layout); ``min_pack_bytes``, ``on_route`` and ``stand_in`` as
    load_model's."""
    if getattr(args, "m", None) is not None and args.model is not None:
        raise RefimplError(f"give MODEL or -m, not both (got {args.model} and -m {args.m})")
    return load_named(default_model(model_given(args)), cache_mb, pack=pack, min_pack_bytes=min_pack_bytes,
                      ggml=ggml if ggml is not None else ggml_layout(args), on_route=on_route, stand_in=stand_in)


def ggml_layout(args) -> tuple[str, bool] | None:
    """With ``--emulate=ggml``: (its path, repack), what :func:`load_named` lays the weights out for (the column layout
    of its kernels, refimpl.graph.layout.ggml_layout: logits, trace, audit, validate, kld alike); else None."""
    if emulate_family(args) != "ggml":
        return None
    return ggml_path(getattr(args, "ggml_version_ok", False), named_ggml(args))[0], not getattr(args, "no_repack", False)


def load_named(spec, cache_mb=None, pack="auto", min_pack_bytes=0, ggml=None, on_route=None, stand_in=False):
    """The model ``spec`` names (a GGUF path or ``builtin:NAME``, built on demand), opened once; the
    other arguments as :func:`load`'s."""
    from refimpl.cli.compile_report import name_types
    from refimpl.fixtures.builtin import resolve_model
    from refimpl.io.gguf_file import GGUFFile
    from refimpl.model.trunk import load_model

    gf = GGUFFile(resolve_model(str(spec)))  # the one read of the file's header in this process
    name_types(gf)  # for the first run's "compiling kernels for …" line
    return load_model(gf, cache_mb, pack=pack, min_pack_bytes=min_pack_bytes, ggml=ggml, on_route=on_route,
                      stand_in=stand_in)


def add_threshold(p) -> None:
    """``--threshold TAU|auto``: the near-tie rule's τ (refimpl.oracle.golden.TIE_THRESHOLD); ``auto`` gives the
    default τ (the floor of refimpl.oracle.calibrate) marked, so that :func:`threshold_auto` tells it apart."""
    p.add_argument("--threshold", type=_threshold, default=0.05, metavar="TAU|auto",
                   help="near-tie when the tokens are within TAU·max|logit| of the oracle's best (default 0.05); auto: "
                        "a threshold per engine calibrated on its answers' own log-probs, for engines whose rounding the "
                        "oracle does not emulate (GPU backends, other engines; floor 0.05)")


class _Auto(float):
    """``--threshold auto``: the default τ as the floor, marked (threshold_auto, below)."""


def _threshold(text: str) -> float:
    if text == "auto":
        return _Auto(0.05)
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1) or 'auto', got {text!r}") from None


def threshold_auto(args) -> bool:
    """Whether ``--threshold auto`` was given (add_threshold)."""
    return isinstance(args.threshold, _Auto)


def parse_tokens(text: str, flag: str = "--tokens") -> list[int]:
    """Comma-separated token ids (``--tokens``, or ``flag``: ``--prompt-tokens``)."""
    try:
        tokens = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise RefimplError(f"{flag} expects comma-separated integers, got '{text}'") from None
    if not tokens:
        raise RefimplError(f"{flag} is empty")
    return tokens


def check_tokens(model, tokens: list[int]) -> list[int]:
    bad = [t for t in tokens if not 0 <= t < model.config.n_vocab]
    if bad:
        raise RefimplError(f"token id {bad[0]} is out of range for this model's vocabulary [0, {model.config.n_vocab})")
    return tokens


# --------------------------------------------------------------------------------------------
# numerics: --emulate[=CONFIG], --flash-attn, --kv-type, --no-repack, --ggml-version-ok, --kernel


class _EmulateChoices(tuple):
    """--emulate's words: the :data:`refimpl.model.ops.EMULATIONS` and every ``ggml:NAME``; any ``ggml:…`` is taken as
    the option's value (``--emulate ggml:avx3`` is then refused by :func:`_emulate_value`, naming the valid paths,
    rather than read as MODEL)."""

    def __contains__(self, word) -> bool:
        return tuple.__contains__(self, word) or (isinstance(word, str) and word.startswith("ggml:"))


def _emulate_value(text: str) -> str:
    """``--emulate``'s value as given; a ``ggml:NAME`` whose NAME is not an emulated path is one line naming the valid ones."""
    from kernels.ggml.build import NAMED_PREFIX, UnsupportedBuild, named_path

    if text.startswith(NAMED_PREFIX):
        try:
            named_path(text)
        except UnsupportedBuild as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


def emulate_family(args) -> str | None:
    """``args.emulate`` without a path name: ``"ggml"`` for ``ggml`` and ``ggml:NAME``, else as given (None: no --emulate)."""
    emulate = getattr(args, "emulate", None)
    return None if emulate is None else emulate.partition(":")[0]


def named_ggml(args) -> str | None:
    """The path key of ``--emulate=ggml:NAME`` (``"avx2"``), None for a detected path or no ``--emulate=ggml``."""
    emulate = getattr(args, "emulate", None) or ""
    return emulate.partition(":")[2] or None if emulate.startswith("ggml:") else None


def add_numerics(p) -> None:
    from kernels.ggml.build import EMULATED_PATHS, GGML_VERSION, NAMED_PATHS, VERSION_OK_FLAG
    from refimpl.model.ops import EMULATIONS

    paths = " or ".join(x.name for x in EMULATED_PATHS)
    named = ", ".join(f"{n} ({x.name})" for n, x in zip(NAMED_PATHS, EMULATED_PATHS))

    p.add_argument("--emulate", nargs="?", const="default", choices=_EmulateChoices((*EMULATIONS, *NAMED_PATHS)),
                   type=_emulate_value, metavar="CONFIG",
                   help="round where llama.cpp rounds: activation quantization per matmul, and the K/V cache and "
                        "attention of llama.cpp's configuration CONFIG: default (F16 K/V, flash attention, as its "
                        "CLI and server run; the default) or plain (F32 K/V, no flash attention) — llama.cpp's "
                        "rounding points, float noise apart, for any build it runs (ARM, GPU, other ggml versions), "
                        "no library needed (docs/numerics.md, 'Three numerics, and when to use which'); ggml: every op as "
                        f"the libggml-cpu that llama-cpp-python loads computes it, bit for bit (its {paths} path, "
                        f"detected; ggml {GGML_VERSION}'s kernels; llama.cpp's defaults: F16 K/V, flash attention, "
                        f"n_ubatch 512, 4 threads); {named}: that path bit for bit, named instead of detected: no "
                        "library loaded, llama-cpp-python not needed (to recompute streams made on another machine: "
                        "a phone's, from its build's -march; the AArch64 paths are GCC builds'). "
                        "--emulate CONFIG and --emulate=CONFIG are the same; a next argument that is not a CONFIG "
                        "is not taken (run --emulate model.gguf: MODEL is model.gguf). Needs --kernel numba")
    p.add_argument("--flash-attn", choices=("on", "off"), help="emulate llama.cpp with flash attention on/off (overrides CONFIG)")
    p.add_argument("--kv-type", choices=("f16", "f32"), help="emulate llama.cpp's K/V cache type (overrides CONFIG)")
    p.add_argument("--no-repack", action="store_true",
                   help="with --emulate=ggml: emulate llama.cpp run with --no-repack (no CPU_REPACK weight buffer: "
                        "Q4_0, Q4_K, IQ4_NL, MXFP4 and, on AVX-512, Q2_K matrices then take the plain kernels; on "
                        "AArch64 with dotprod also Q5_K, Q6_K and Q8_0, none on armv8-a). "
                        "Default: llama.cpp's default, the repacked gemm/gemv")
    p.add_argument(VERSION_OK_FLAG, action="store_true",
                   help=f"with --emulate=ggml: go on with a libggml of another ggml version than {GGML_VERSION}, the one "
                        "whose kernels are emulated (refused otherwise), when you know the kernels are unchanged; every "
                        "report then records it (docs/numerics.md, 'When llama.cpp moves')")
    for flag, what, default in (("--threads", "llama.cpp's thread count (-t): the split-KV flash-attention path "
                                 "divides a long cache by it", 4),
                                ("--ubatch-size", "llama.cpp's n_ubatch (-ub): a batch is computed in ubatches of "
                                 "this many tokens", 512),
                                ("--ctx-size", "llama.cpp's n_ctx (-c; 0: the model's training context): the KV "
                                 "cache size, which with --threads decides the split-KV path", 0)):
        p.add_argument(flag, type=int, metavar="N", help=f"with --emulate=ggml: {what} (default {default})")
    add_kernel(p)


def add_kernel(p) -> None:
    p.add_argument("--kernel", choices=("numba", "numpy"), default="numba",
                   help="quantized matmul implementation (numpy: the definitions — matmul, dot64, delta-rule step — in plain numpy, the same bits; without --emulate's activation quantization)")


def check_numerics(args) -> None:
    """--kernel numpy is the plain numpy twin of the matmul: llama.cpp's activation quantization
    (--emulate) is implemented on the numba kernels only (kernels/matmul.py)."""
    if getattr(args, "kernel", None) == "numpy" and emulate_family(args) == "ggml":
        raise RefimplError("--emulate=ggml computes every op with the kernels.ggml emulations of ggml-cpu (numba); "
                           "--kernel numpy, the plain definitions, does not apply to it")
    for flag in ("no_repack", "ggml_version_ok", "threads", "ubatch_size", "ctx_size"):
        value = getattr(args, flag, None)
        if value not in (None, False) and emulate_family(args) != "ggml":
            name = "--" + flag.replace("_", "-")
            raise RefimplError(f"{name} describes the llama.cpp that --emulate=ggml emulates; give it with --emulate=ggml")
        if flag not in ("no_repack", "ggml_version_ok") and value is not None and (value < 0 or (value == 0 and flag != "ctx_size")):
            raise RefimplError(f"--{flag.replace('_', '-')} must be {'≥ 0' if flag == 'ctx_size' else 'positive'}, got {value}")
    if named_ggml(args) and getattr(args, "ggml_version_ok", False):
        from kernels.ggml.build import GGML_VERSION, VERSION_OK_FLAG

        raise RefimplError(f"{VERSION_OK_FLAG} accepts a loaded libggml of another ggml version; --emulate={args.emulate} "
                           f"loads none (it follows ggml {GGML_VERSION}'s kernels)")
    if getattr(args, "kernel", None) == "numpy" and getattr(args, "emulate", None) is not None:
        raise RefimplError(f"--emulate={args.emulate} needs --kernel numba: llama.cpp's activation quantization "
                           "is emulated by the numba kernels only (--kernel numpy runs the plain definitions)")


def ggml_path(version_ok: bool = False, named: str | None = None) -> tuple[str, str | None, str]:
    """``--emulate=ggml``: (the ggml-cpu path of the libggml llama-cpp-python loads (``$LLAMA_CPP_LIB_PATH``, else
    its ``lib/``), None or the library's ggml version accepted with ``--ggml-version-ok`` = ``version_ok``). A build
    whose kernels are not emulated, or of another ggml version without the flag, is refused in one line. The build is
    named on stderr (``emulating ggml-cpu AVX-512 (…) from DIR, ggml 0.25.3 (commit …)``) when the emulation first computes,
    after every other flag has been checked: the third value is that line (``Ctx.announce``).
    ``named`` (``--emulate=ggml:NAME``, :func:`named_ggml`): that path, (NAME, None), no library loaded or read; the
    stderr line says so (``emulating ggml-cpu AVX2 (named, not detected), ggml 0.25.3's kernels``)."""
    from kernels.ggml.build import VERSION_OK_FLAG, UnsupportedBuild, describe_named, detect
    if named is not None:
        return named, None, f"emulating {describe_named(named)}"
    try:
        build = detect()
        path = build.path
        accepted = build.check_version(version_ok)
    except UnsupportedBuild as e:
        raise RefimplError(f"--emulate=ggml: {e}") from None
    return path, accepted, f"emulating {build.describe()}" + (f"; accepted with {VERSION_OK_FLAG}" if accepted else "")


def ctx_from_args(args, trace=None):
    """The :class:`refimpl.model.ops.Ctx` of the numerics flags (and run's --inject faults)."""
    import dataclasses

    from refimpl.inject.faults import NO_FAULTS
    from refimpl.model.ops import emulation_ctx

    check_numerics(args)
    flash = None if args.flash_attn is None else args.flash_attn == "on"
    kv_f16 = None if args.kv_type is None else args.kv_type == "f16"
    from refimpl.model.ctx import StderrOnce

    family, named = emulate_family(args), named_ggml(args)
    ggml, accepted, line = ggml_path(getattr(args, "ggml_version_ok", False), named) if family == "ggml" else (None, None, None)
    llama = {k: v for k, v in (("n_threads", getattr(args, "threads", None)), ("n_ubatch", getattr(args, "ubatch_size", None)),
                                ("n_ctx", getattr(args, "ctx_size", None) or None)) if v is not None}
    ctx = emulation_ctx(family, flash_attn=flash, kv_f16=kv_f16, kernel=args.kernel, trace=trace, ggml=ggml,
                        repack=not getattr(args, "no_repack", False), ggml_accepted=accepted, **llama,
                        **({"ggml_named": True} if named else {}), announce=StderrOnce(line) if line else None)
    return dataclasses.replace(ctx, faults=getattr(args, "faults", NO_FAULTS))  # run --inject (refimpl.inject.faults)


# --------------------------------------------------------------------------------------------
# scale-out: --jobs | --cluster, --cache-mb (golden make, golden check, audit --streams)


def add_scale_out(p, what: str) -> None:
    """--jobs / --cluster (exclusive) and --cache-mb of golden make, golden check and audit --streams."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--jobs", type=int, default=1, metavar="J", help=f"{what} in J parallel processes (same output)")
    g.add_argument("--cluster", metavar="ADDRESS",
                   help=f"{what} on the workers of the Dask scheduler at ADDRESS, e.g. tcp://10.0.0.1:8786 (same "
                        "output; needs the 'cluster' extra; docs/cluster.md)")
    p.add_argument("--cache-mb", metavar="N|auto",
                   help="stream routed experts through an LRU cache of N MiB per process (default: pinned, the "
                        "memory map); docs/streamer.md, docs/cluster.md")


def cache_mb(args):
    """golden/audit --cache-mb: None (routed experts pinned, the default) or a budget checked here, before
    any worker opens the model with it."""
    if args.cache_mb is None:
        return None
    from refimpl.io.streamer import cache_budget

    cache_budget(args.cache_mb)  # RefimplError for anything but a whole number of MiB or 'auto'
    return args.cache_mb
