"""``refimpl audit``: judge an engine's stream against the oracle (or two streams against each other, a
golden file's recorded top-5, or every pair of a directory): docs/validating-an-engine.md. Exit 1 when
a stream has a wrong token (or its prompt ids differ from the oracle's)."""

from __future__ import annotations

from refimpl.cli.common import (add_numerics, add_scale_out, add_threshold, cache_mb, check_tokens, ctx_from_args,
                                default_model, emulate_family, ggml_layout, load_named, parse_tokens, threshold_auto)
from refimpl.errors import RefimplError


def add_parser(sub) -> None:
    p = sub.add_parser("audit", help="find and classify the first divergence of two token streams (or one vs the oracle)")
    p.add_argument("model", metavar="MODEL", nargs="?",
                   help="a .gguf (qwen35moe, qwen35, qwen3next), builtin:PRESET[/QUANT]…, or builtin:kjv (the trained model, the default); or a "
                        "golden .jsonl (judged by its recorded top-5, without the model). Told from a STREAM by file type")
    p.add_argument("streams", metavar="STREAM", nargs="*",
                   help="one or two streams (.json ids or object with 'tokens', telemetry .csv, .txt text, or a server response: "
                        "llama-server /completion or OpenAI-style, whole or streamed, told apart by content)")
    p.add_argument("--streams", dest="stream_dir", metavar="DIR",
                   help="audit every pair NAME.A.EXT / NAME.B.EXT in DIR (prompt: NAME.prompt.EXT); one line each and "
                        "a summary table (docs/validating-an-engine.md)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the prompt text (special-token text is parsed)")
    src.add_argument("--prompt-tokens", metavar="IDS", help="the prompt as comma-separated token ids")
    add_threshold(p)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--html", metavar="FILE", help="also write the report as one self-contained web page: the verdict table, "
                                                  "the continuations side by side at the divergence, the margins "
                                                  "(docs/validating-an-engine.md)")
    p.add_argument("--kld-base", metavar="FILE",
                   help="instead of streams: a KL-divergence base file llama-perplexity wrote (--kl-divergence-base); "
                        "print llama-perplexity's --kl-divergence statistics with the oracle as the model, and the "
                        "worst positions (docs/validating-an-engine.md)")
    p.add_argument("--draft", metavar="N|N,N",
                   help="with --emulate=ggml: the engine's batch schedule per stream (one value for all, or one per "
                        "stream): 0 or plain = llama.cpp's plain decode (the default), 1-8 = its draft-mtp loop with "
                        "n_max N as speculative-simple runs it, server:N = as llama-server runs it (server:0 plain). "
                        "The oracle predicts llama.cpp's own stream for it, says at a divergence 'reproduced' or 'not "
                        "reproduced', and exits 1 unless every stream is its prediction (docs/validating-an-engine.md §3g)")
    p.add_argument("--schedule", metavar="FILE|FILE,FILE",
                   help="with --emulate=ggml: instead of --draft, the engine's own rounds, from a telemetry file (a "
                        "'refimpl run --csv'-style CSV with step, kind and drafts columns, or JSON with 'rounds'), one "
                        "for every stream or one per stream ('-': that stream takes --draft's schedule): each round's "
                        "1+n verify batch is rebuilt from the logged drafts and the oracle predicts what llama.cpp "
                        "computes for it")
    add_scale_out(p, "with --streams: pairs audited")
    add_numerics(p)
    p.set_defaults(func=cmd_audit)


def cmd_audit(args) -> int:
    import json

    from refimpl.oracle.audit import audit
    from refimpl.oracle.audit_report import report_lines
    from refimpl.oracle.stream_file import prompt_of, read_stream
    from refimpl.tokenizer import Tokenizer

    if args.html is not None:  # before any work (refimpl.io.output_path)
        _check_html(args)
    if args.kld_base is not None:
        return _audit_kld(args)
    golden = _audit_inputs(args)
    for flag, value in (("--draft", args.draft), ("--schedule", args.schedule)):
        if value is not None and (golden or args.stream_dir is not None):
            raise RefimplError(f"{flag} goes with MODEL STREAM [STREAM] (a prediction of each stream)")
        if value is not None and emulate_family(args) != "ggml":
            raise RefimplError(f"{flag} predicts llama.cpp's own stream for the engine's batch schedule: it needs --emulate=ggml")
    if args.stream_dir is not None:
        return _audit_dir(args)
    if golden:
        return _audit_golden(args)
    if args.jobs != 1 or args.cluster is not None or args.cache_mb is not None:
        raise RefimplError("--jobs, --cluster and --cache-mb go with --streams DIR")
    model = load_named(args.model, ggml=ggml_layout(args))  # --emulate=ggml: its kernels' layout
    tok = Tokenizer.from_gguf(model.file.gguf)
    streams = [read_stream(path, label, tok) for path, label in zip(args.streams, "AB")]
    if args.prompt_tokens is not None:
        prompt = check_tokens(model, parse_tokens(args.prompt_tokens, "--prompt-tokens"))
    elif args.prompt is not None:
        prompt = tok.encode(args.prompt, parse_special=True)
    else:
        prompt = check_tokens(model, prompt_of(streams, "audit needs the prompt: --prompt TEXT or --prompt-tokens IDS"))
    if not prompt:
        raise RefimplError("the prompt encodes to no tokens")
    differs = [s for s in streams if s.prompt is not None and list(s.prompt) != list(prompt)]
    if differs:  # bug class B20: judging the stream against a shifted prompt would judge nothing
        return _prompt_differs(differs, prompt, tok, args.json, args.html)
    ctx = ctx_from_args(args)
    if ctx.ggml:  # parsed before the audit runs: a bad --draft fails fast
        from refimpl.oracle.reproduce import parse_schedules

        schedules = parse_schedules(args.draft if args.draft is not None else "0", len(streams))
        if args.schedule is not None:
            schedules = _logged_schedules(args.schedule, schedules, tok)
    rep = audit(model, prompt, *streams, ctx=ctx, tau=float(args.threshold), model_name=str(args.model), auto=threshold_auto(args))
    if ctx.ggml:  # llama.cpp's own stream per schedule (refimpl.oracle.reproduce)
        from refimpl.oracle.reproduce import reproduce

        reproduce(rep, model, ctx, schedules, frozenset(tok.eog_ids))
    print(json.dumps(rep.as_json()) if args.json else "\n".join(report_lines(rep, tok)))
    if args.html is not None:  # the same report as a web page (refimpl.oracle.html_report)
        from refimpl.oracle.html_page import write_page
        from refimpl.oracle.html_report import audit_page

        write_page(args.html, audit_page(rep, tok))
    return rep.exit_code


def _check_html(args) -> None:
    """--html FILE: a page of a stream audit (one or two STREAMs, or --streams DIR); FILE checked before any work."""
    from refimpl.io.output_path import check_output

    if args.kld_base is not None:
        raise RefimplError("--html goes with STREAM files or --streams DIR, not --kld-base")
    first = args.model if args.model is not None else (args.streams[0] if args.streams else None)
    if first is not None and _audit_input_kind(first) == "golden":
        raise RefimplError("--html goes with a MODEL's audit (STREAM files or --streams DIR), not audit GOLDEN STREAM")
    check_output(args.html, "--html")


def _logged_schedules(text: str, schedules: list, tok) -> list:
    """``--schedule FILE[,FILE]``: per stream, the rounds a telemetry file logged (``-``: keep --draft's schedule)."""
    from refimpl.oracle.reproduce import logged_schedule
    from refimpl.oracle.stream_file import read_stream

    files = [f.strip() for f in text.split(",")]
    if len(files) == 1:
        files *= len(schedules)
    if len(files) != len(schedules) or not all(files):
        raise RefimplError(f"--schedule: one file for every stream or one per stream ({len(schedules)}), got {text!r}")
    return [sch if f == "-" else logged_schedule(f, read_stream(f, "schedule", tok, any_source=True).rounds)
            for f, sch in zip(files, schedules)]


def _prompt_differs(streams, prompt: list[int], tok, as_json: bool, html: str | None = None) -> int:
    """audit: a stream's prompt_tokens are not the oracle's ids of --prompt / --prompt-tokens (a
    pre-tokenizer or template difference, docs/bug-classes.md B20): say where, exit 1, audit nothing."""
    import json

    out = []
    for s in streams:
        i = next((j for j, (a, b) in enumerate(zip(s.prompt, prompt)) if a != b), min(len(s.prompt), len(prompt)))
        word = lambda ids: repr(tok.decode(ids[i : i + 1])) if i < len(ids) else "(end)"  # noqa: E731
        out.append({"stream": s.label, "source": s.source, "index": i, "stream_prompt_len": len(s.prompt), "oracle_prompt_len": len(prompt),
                    "stream_id": s.prompt[i] if i < len(s.prompt) else None, "oracle_id": prompt[i] if i < len(prompt) else None,
                    "text": f"{s.label} ({s.source}): prompt tokenisation differs at prompt index {i}: stream "
                            f"{word(list(s.prompt))} ({len(s.prompt)} ids), oracle {word(prompt)} ({len(prompt)} ids); "
                            f"the stream is not audited (a different pre-tokenizer or template gives other prompt ids)"})
    if as_json:
        print(json.dumps({"verdict": "prompt differs", "exit": 1, "prompts": [{k: v for k, v in o.items() if k != "text"} for o in out]}))
    else:
        print("\n".join(["audit: verdict prompt differs"] + [o["text"] for o in out]))
    if html is not None:
        from refimpl.oracle.html_page import write_page
        from refimpl.oracle.html_report import prompt_differs_page

        write_page(html, prompt_differs_page(out))
    return 1


_AUDIT_GRAMMAR = ("refimpl audit [MODEL | GOLDEN] STREAM [STREAM]: a MODEL is a .gguf or builtin:NAME, "
                  "a GOLDEN a golden .jsonl, a STREAM a .json, .txt or .csv file or a server response")


def _audit_input_kind(arg: str) -> str | None:
    """What an audit positional is — "model", "golden" or "stream" — told by its name and, for a file
    that exists, its first bytes (GGUF magic, a golden header line); None for a missing file whose
    name says nothing."""
    from pathlib import Path

    from refimpl.oracle.golden_audit import is_golden

    path, suffix = Path(arg), Path(arg).suffix.lower()
    if arg.startswith("builtin:") or suffix == ".gguf":
        return "model"
    if suffix == ".jsonl" and not path.is_file():
        return "golden"
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(4) == b"GGUF":
                return "model"
        return "golden" if is_golden(arg) else "stream" if suffix != ".jsonl" or _is_response_file(path) else "golden"
    return "stream" if suffix in (".json", ".txt", ".csv") else None


def _is_response_file(path) -> bool:
    """A JSON-lines file of server response chunks (refimpl.oracle.responses), not a golden file."""
    from refimpl.oracle.responses import looks_like_response

    try:
        return looks_like_response(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return False


def _audit_inputs(args) -> bool:
    """Sort audit's positionals into args.model and args.streams by what each one is (MODEL is optional:
    builtin:kjv, as for run); True when the first is a golden file. argparse puts the first positional in
    args.model whatever it is, so a first STREAM is moved back to the streams here."""
    given = ([args.model] if args.model is not None else []) + list(args.streams)
    kinds = [_audit_input_kind(a) for a in given]
    if kinds and kinds[0] is None:
        raise RefimplError(f"{given[0]}: no such file, and its name does not say what it is ({_AUDIT_GRAMMAR})")
    first = kinds[0] if kinds else None
    head, rest = (given[0], given[1:]) if first in ("model", "golden") else (None, given)
    for arg, kind in zip(rest, kinds[len(given) - len(rest):]):
        if kind in ("model", "golden"):
            raise RefimplError(f"{arg} is a {kind.upper()}: it goes first ({_AUDIT_GRAMMAR})")
    if first != "golden" and not rest and args.stream_dir is None:
        raise RefimplError("audit needs one or two STREAM files, or --streams DIR")
    if len(rest) > 2:
        raise RefimplError(f"audit takes one or two streams, got {len(rest)}")
    if first == "golden" and args.stream_dir is not None:
        raise RefimplError("--streams DIR needs a MODEL (a golden file judges one stream: refimpl audit GOLDEN STREAM)")
    args.model, args.streams = (head if head is not None else default_model(None)), rest
    return first == "golden"


def _audit_golden(args) -> int:
    """audit GOLDEN STREAM: judged by the golden's recorded top-5, without the model (refimpl.oracle.golden_audit)."""
    import json

    from refimpl.oracle.stream_file import read_stream
    from refimpl.oracle.golden_audit import audit_golden, report_lines

    if len(args.streams) != 1:
        raise RefimplError("audit GOLDEN takes one stream")
    if threshold_auto(args):
        raise RefimplError("--threshold auto calibrates on the engine's log-probs against the oracle's: it needs a MODEL, "
                           "not a golden file (give the model, or a fixed --threshold)")
    for flag, value, default in (("--emulate", args.emulate, None), ("--flash-attn", args.flash_attn, None),
                                 ("--kv-type", args.kv_type, None), ("--kernel", args.kernel, "numba"),
                                 ("--jobs", args.jobs, 1), ("--cluster", args.cluster, None), ("--cache-mb", args.cache_mb, None)):
        if value != default:
            raise RefimplError(f"{flag} does not apply to audit GOLDEN: the golden's recorded top-5 judge the stream, "
                               "as computed when it was made (no model runs)")
    if args.prompt is not None:
        raise RefimplError("audit GOLDEN needs the prompt as ids (--prompt-tokens): there is no model to tokenize --prompt")
    stream = read_stream(args.streams[0], "A", tokenizer=None)
    prompt = parse_tokens(args.prompt_tokens, "--prompt-tokens") if args.prompt_tokens is not None else None
    v = audit_golden(args.model, stream, prompt, args.threshold)
    print(json.dumps(v.as_json()) if args.json else "\n".join(report_lines(v, stream)))
    return v.exit_code


def _audit_dir(args) -> int:
    """audit --streams DIR: every stream pair of DIR (refimpl.oracle.audit_streams), a line each, a summary table."""
    import json

    from refimpl.fixtures.builtin import resolve_model
    from refimpl.io.load import open_model
    from refimpl.oracle.audit_streams import as_json, audit_pairs, pair_line, read_pairs, summary_lines
    from refimpl.tokenizer import Tokenizer

    if args.streams:
        raise RefimplError("give STREAM files or --streams DIR, not both")
    cache = cache_mb(args)
    path = resolve_model(args.model)
    m = open_model(path)
    tok = Tokenizer.from_gguf(m.gguf)
    prompt = None
    if args.prompt_tokens is not None:
        prompt = parse_tokens(args.prompt_tokens, "--prompt-tokens")
    elif args.prompt is not None:
        prompt = tok.encode(args.prompt, parse_special=True)
    pairs = read_pairs(args.stream_dir, tok, m.config.n_vocab, prompt)
    ctx = ctx_from_args(args)
    numerics = {k: getattr(ctx, k) for k in ("act_quant", "kv_f16", "flash_attn", "ggml", "n_ubatch", "n_threads", "n_ctx",
                                             "repack", "ggml_accepted", "ggml_named", "announce")}  # --emulate=ggml's fields too
    # (announce: the "emulating ggml-cpu …" line, said by the first pair computed here; a worker process's copy is silent)
    reports = audit_pairs(path, pairs, numerics=numerics, kernel=args.kernel, tau=args.threshold,
                          model_name=str(args.model), jobs=args.jobs, cluster=args.cluster, cache_mb=cache,
                          auto=threshold_auto(args))
    if args.json:
        print(json.dumps(as_json(pairs, reports)))
    else:
        print("\n".join([pair_line(p, r) for p, r in zip(pairs, reports)] + summary_lines(reports)))
    if args.html is not None:  # the same reports as a web page (refimpl.oracle.html_report)
        from refimpl.oracle.html_page import write_page
        from refimpl.oracle.html_report import streams_page

        write_page(args.html, streams_page(pairs, reports, tok))
    return int(any(r.exit_code for r in reports))


def _audit_kld(args) -> int:
    """audit [MODEL] --kld-base FILE: llama-perplexity's KL-divergence statistics of the oracle against a
    base file (refimpl.oracle.kld, refimpl.oracle.kld_report)."""
    import json

    from refimpl.oracle.kld import progress_bar, score_base
    from refimpl.oracle.kld_file import read_kld_base
    from refimpl.oracle.kld_report import as_json, exit_code, report_lines
    from refimpl.tokenizer import Tokenizer

    given = ([args.model] if args.model is not None else []) + list(args.streams)
    for arg in given[:1]:
        kind = _audit_input_kind(arg)
        if kind != "model":
            raise RefimplError(f"--kld-base needs a MODEL (a .gguf or builtin:NAME) or none (builtin:kjv); {arg} is "
                               f"{'a GOLDEN' if kind == 'golden' else 'not one'}")
    if len(given) > 1:
        raise RefimplError("--kld-base takes no STREAM: the base file holds the tokens and the engine's log-probabilities")
    for flag, value in (("--streams", args.stream_dir), ("--prompt", args.prompt), ("--prompt-tokens", args.prompt_tokens),
                        ("--cluster", args.cluster), ("--cache-mb", args.cache_mb)):
        if value is not None:
            raise RefimplError(f"{flag} does not go with --kld-base (the base file holds the corpus)")
    if args.jobs != 1:
        raise RefimplError("--jobs does not go with --kld-base")
    if threshold_auto(args):
        raise RefimplError("--threshold auto goes with STREAM files (server responses with log-probs): --kld-base "
                           "judges its top-token disagreements with a fixed --threshold")
    model_name = default_model(given[0] if given else None)
    model = load_named(model_name, ggml=ggml_layout(args))
    tok = Tokenizer.from_gguf(model.file.gguf)
    base = read_kld_base(args.kld_base, model.config.n_vocab)
    bar, progress = progress_bar(base.n_chunk, "kld")
    with bar:
        scored = score_base(base, model, tok, ctx_from_args(args), args.threshold, progress)
    emulate = args.emulate or "off"
    if args.json:
        print(json.dumps(as_json(scored, model=str(model_name), emulate=emulate, tau=args.threshold)))
    else:
        print("\n".join(report_lines(scored, tok, model=str(model_name), emulate=emulate, tau=args.threshold)))
    return exit_code(scored)
