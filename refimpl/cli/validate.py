"""``refimpl validate``: send a prompt suite to running inference servers (llama-server's native API or any
OpenAI-compatible ``/v1/completions``), greedy with log-probs, and audit every answer against the oracle
(refimpl.oracle.validate; docs/validating-an-engine.md §3e, §3f). Exit 1 when an answer has a wrong token (or
log-probs outside the bound). With --emulate=ggml each answer is also compared with llama.cpp's predicted
stream for the server's draft setting (refimpl.oracle.reproduce, §3g): exit 1 when one is not that stream."""

from __future__ import annotations

from refimpl.cli.common import (MODEL_HELP, add_numerics, add_threshold, ctx_from_args, default_model, ggml_layout,
                                load_named, threshold_auto)
from refimpl.errors import RefimplError


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="drive llama-server or OpenAI-compatible servers with a prompt suite, greedy "
                                        "with log-probs, and audit each answer against the oracle (one table)")
    p.add_argument("model", metavar="MODEL", nargs="?", help=MODEL_HELP)
    p.add_argument("--server", action="append", required=True, metavar="URL",
                   help="a server, http://HOST:PORT; repeat for several (e.g. one per --spec-draft-n-max setting: "
                        "llama-server configures drafting when it starts)")
    p.add_argument("--api", choices=("auto", "llama", "openai"), default="auto",
                   help="llama: llama-server's /completion; openai: /v1/completions (vLLM, SGLang, llama-server's /v1); "
                        "auto (default): llama when GET /props answers with llama-server's shape, else openai")
    p.add_argument("--served-model", metavar="NAME",
                   help="the model to validate when /v1/models lists several; sent as the request's 'model'")
    p.add_argument("--prompts", required=True, metavar="FILE",
                   help="one prompt per line, or JSONL with 'text' or 'tokens' (as golden make); sent as token ids")
    p.add_argument("-n", "--n-predict", type=int, default=32, metavar="N", help="tokens generated per prompt (default 32)")
    p.add_argument("--draft", metavar="N,N",
                   help="also send llama-server's per-request speculative.n_max, once per value: a column per server and "
                        "value (llama API only)")
    p.add_argument("--spec-type", default="draft-mtp", metavar="TYPE",
                   help="how the speculating servers were started (llama-server's flag; default draft-mtp): for draft-mtp "
                        "the oracle runs its own MTP loop for the acceptance expected beside each server's own")
    p.add_argument("--spec-draft-n-max", type=int, default=3, metavar="N",
                   help="likewise llama-server's --spec-draft-n-max (default 3, its default)")
    p.add_argument("--spec-draft-p-min", type=float, default=0.0, metavar="P",
                   help="likewise llama-server's --spec-draft-p-min (default 0, its default)")
    p.add_argument("--report", metavar="FILE", help="write every audit as one JSON object (atomically: a temporary file, renamed)")
    p.add_argument("--html", metavar="FILE", help="also write the report as one self-contained web page: the table, each "
                                                  "answer's divergence and margins (docs/validating-an-engine.md)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds each request may take (default 120)")
    add_threshold(p)
    add_numerics(p)
    p.set_defaults(func=cmd_validate)


def cmd_validate(args) -> int:
    import json

    from refimpl.io.output_path import check_output, replace_atomically, writing
    from refimpl.oracle import validate as v
    from refimpl.oracle.audit import Stream, audit
    from refimpl.oracle.golden import check_tau
    from refimpl.oracle.golden_file import read_prompts
    from refimpl.tokenizer import Tokenizer

    servers = [v.check_url(u) for u in args.server]
    if len(set(servers)) != len(servers):
        raise RefimplError("--server: the same URL is given twice")
    if args.n_predict < 1:
        raise RefimplError(f"-n must be ≥ 1, got {args.n_predict}")
    timeout = v.finite_positive(args.timeout, "--timeout")
    check_tau(args.threshold)
    auto = threshold_auto(args)  # --threshold auto: a threshold per server, calibrated on all its answers (below)
    drafts = v.parse_drafts(args.draft) if args.draft is not None else [None]
    if not 1 <= args.spec_draft_n_max <= 8:
        raise RefimplError(f"--spec-draft-n-max must be between 1 and 8 (the oracle's MTP loop), got {args.spec_draft_n_max}")
    if not 0.0 <= args.spec_draft_p_min <= 1.0:
        raise RefimplError(f"--spec-draft-p-min must be between 0 and 1, got {args.spec_draft_p_min}")
    if args.draft is not None and args.api == "openai":
        raise RefimplError("--draft needs --api llama: the OpenAI API takes no per-request draft length; start one server "
                           "per draft setting and name each with --server")
    if args.served_model is not None and not args.served_model.strip():
        raise RefimplError("--served-model: expected a model name, got an empty string")
    if args.report is not None:
        check_output(args.report, "--report")  # before any work (refimpl.io.output_path)
    if args.html is not None:
        check_output(args.html, "--html")
    model_name = default_model(args.model)
    model = load_named(model_name, ggml=ggml_layout(args))  # --emulate=ggml: its kernels' layout
    tok = Tokenizer.from_gguf(model.file.gguf)
    prompts = read_prompts(args.prompts, tok, model.config.n_vocab)
    ctx = ctx_from_args(args)

    idents = []
    for url in servers:  # every server checked before any prompt is sent
        ident = v.server_identity(url, timeout, args.api, args.served_model)
        if args.draft is not None and ident.api == "openai":
            raise RefimplError(f"--draft: {url} is not a llama-server (its GET /props lacks llama-server's shape), so it is "
                               "driven through /v1/completions, which takes no per-request draft length; start one server per "
                               "draft setting")
        bad = v.model_mismatches(ident, model.config, tok)
        if bad:
            raise RefimplError(f"{url} serves {ident.model or 'a model'} that cannot be MODEL {model_name}: " + "; ".join(bad))
        idents.append(ident)

    labels = [chr(ord("A") + i) if i < 26 else f"S{i}" for i in range(len(servers))]
    columns = [(lab, ident, d) for lab, ident in zip(labels, idents) for d in drafts]
    col_name = [lab if d is None else f"{lab} draft {d}" for lab, _, d in columns]
    from tqdm import tqdm

    results, expected = [], {}
    with tqdm(total=len(prompts) * len(columns), desc="validate", unit="answer", disable=None, leave=False) as bar:
        for i, pr in enumerate(prompts):
            row = []
            for (lab, ident, d), name in zip(columns, col_name):
                text, endpoint = v.completion(ident, pr.ids, args.n_predict, d, timeout)
                ids, info = v.read_answer(text, f"{endpoint} (prompt {i + 1})", ident.api, tok)
                stream = Stream(name, endpoint, "response", ids, list(pr.ids), response=info)
                rep = audit(model, pr.ids, stream, ctx=ctx, tau=float(args.threshold), model_name=str(model_name), auto=auto)
                schedule = v.schedule_of(info, d, args.spec_type, args.spec_draft_n_max) if ctx.ggml else None
                if schedule is not None and (schedule.draft == 0 or model.file.plan.mtp != "stripped"):
                    from refimpl.oracle.reproduce import reproduce  # llama.cpp's stream for the server's setting

                    reproduce(rep, model, ctx, [schedule], frozenset(tok.eog_ids))
                oracle_drafts = None  # the oracle's (accepted, drafted), or why not compared
                if info.draft_n:  # the server speculated: what the oracle's own loop accepts with its settings
                    oracle_drafts = v.expected_drafts(model, list(pr.ids), args.n_predict, ctx, args.spec_type,
                                                           args.spec_draft_n_max if d is None else min(d, 8) or 1,
                                                           args.spec_draft_p_min, frozenset(tok.eog_ids), expected)
                row.append((rep, info, oracle_drafts))
                bar.update(1)
            results.append(row)

    calibration = _calibrate_servers(results, columns, labels, float(args.threshold)) if auto else {}
    exit_code = max(rep.exit_code for row in results for rep, *_ in row)
    lines = _table(model_name, prompts, servers, labels, idents, col_name, results, rep_numerics=results[0][0][0], n=args.n_predict)
    if auto:
        from refimpl.oracle.calibrate import calibration_line

        at = 1 + len(servers)  # after the server lines
        lines[at:at] = ["  " + calibration_line(lab, cal) for lab, cal in calibration.items()]
    lines.append(_summary(results, exit_code))
    if args.report is not None or args.html is not None:
        doc = {"model": str(model_name), "n_predict": args.n_predict, "n_probs": v.N_PROBS, "threshold": float(args.threshold),
               "threshold_auto": auto, "calibration": {lab: cal.as_json() for lab, cal in calibration.items()},
               "numerics": ctx.numerics(),  # the emulation (with --emulate=ggml: its path and ggml version)
               "servers": [{"label": lab, **ident.as_json()} for lab, ident in zip(labels, idents)],
               "results": [{"prompt": i + 1, "text": pr.text, "prompt_tokens": list(pr.ids), "column": name,
                            "server": ident.url, "api": ident.api, "draft": d, "verdict": v.verdict(rep),
                            "tokens": rep.streams[0].tokens,
                            "draft_n": info.draft_n, "draft_n_accepted": info.draft_n_accepted,
                            "oracle_draft_n": oracle[1] if isinstance(oracle, tuple) else None,
                            "oracle_draft_n_accepted": oracle[0] if isinstance(oracle, tuple) else None,
                            "oracle_drafts_not_compared": oracle if isinstance(oracle, str) else None,
                            "audit": rep.as_json()}
                           for i, (pr, row) in enumerate(zip(prompts, results))
                           for (rep, info, oracle), name, (_, ident, d) in zip(row, col_name, columns)],
               "exit_code": exit_code}
    if args.report is not None:
        with writing(args.report, "--report") as path:  # refimpl.io.output_path: checked, one-line errors
            replace_atomically(path, (json.dumps(doc) + "\n").encode())
    print("\n".join(lines))
    if args.html is not None:  # the same report as a web page (refimpl.oracle.html_report), cells as in the table
        from refimpl.oracle.html_page import write_page
        from refimpl.oracle.html_report import validate_page

        write_page(args.html, validate_page(doc, [rep for row in results for rep, *_ in row],
                                            [_cell(*cell) for row in results for cell in row], tok))
    return exit_code


def _calibrate_servers(results, columns, labels, floor: float) -> dict:
    """--threshold auto: each server's threshold from the log-prob spread of all its answers (every prompt and
    draft column) whose log-probs pass the probs: verdict, those answers judged again with it (the others keep
    their own, the fixed τ: refimpl.oracle.calibrate) → label → Calibration."""
    from refimpl.oracle.audit import rejudge
    from refimpl.oracle.calibrate import Samples, calibrate

    out = {}
    for lab in labels:
        reps = [rep for row in results for (rep, *_), (col_lab, _, _) in zip(row, columns) if col_lab == lab]
        ok = [rep for rep in reps if not rep.samples[rep.streams[0].label].outside]
        pooled = Samples(has_probs=any(rep.samples[rep.streams[0].label].has_probs for rep in reps))
        for rep in ok:
            pooled.extend(rep.samples[rep.streams[0].label])
        n_out = len(reps) - len(ok)
        scope = (f"the {len(ok)} answer{'s' * (len(ok) != 1)} of server {lab}"
                 + (f" ({n_out} more outside the probs: bound, each judged with the fixed threshold)" if n_out else ""))
        out[lab] = calibrate(pooled, floor, scope)
        for rep in ok:
            rep.calibration = {rep.streams[0].label: out[lab]}
            rejudge(rep)
    return out


def _cell(rep, info, oracle) -> str:
    from refimpl.oracle.validate import verdict

    word = verdict(rep)
    if word == "reproduced":  # the first event's step, and the prediction's schedule
        word += f" (step {min(f.step for f in rep.events)}, {next(iter(rep.reproduce.predictions.values())).schedule.name})"
    elif word == "not reproduced":  # where the answer leaves llama.cpp's predicted stream
        p = next(iter(rep.reproduce.predictions.values()))
        word += f" (step {p.first_difference}, {p.schedule.name})"
    elif word != "identical":  # the first wrong token's step (near-tie: the first near-tie's)
        word += f" (step {min(f.step for f in rep.events if f.benign == (word == 'near-tie'))})"
    probs = rep.probs.get(rep.streams[0].label)
    if probs is not None and probs.exit_code:
        word += ", probs outside bound"
    if probs is not None and probs.missing:  # steps without a log-prob, by reason (refimpl.oracle.probs)
        from collections import Counter

        word += "".join(f", {n} without log-prob ({why})" for why, n in Counter(probs.why[s] for s in probs.missing).items())
    if info.unread:  # tokens the server counts and never sent (refimpl.oracle.response_align)
        word += f", {info.unread} unread"
    if info.draft_n is not None:
        word += f", drafts {info.draft_n_accepted}/{info.draft_n}"
        if isinstance(oracle, tuple):  # the oracle's own draft-MTP loop with the server's settings
            word += f" (oracle {oracle[0]}/{oracle[1]})"
        pred = next(iter(rep.reproduce.predictions.values())) if rep.reproduce is not None else None
        if pred is not None and pred.schedule.draft:  # --emulate=ggml: llama-server's own rounds, predicted
            word += f", predicted {sum(r['accepted'] for r in pred.rounds)}/{sum(r['drafted'] for r in pred.rounds)}"
    return word


def _prompt_label(pr) -> str:
    text = pr.text if pr.text is not None else "ids " + ",".join(map(str, pr.ids))
    return repr(text if len(text) <= 30 else text[:29] + "…")


def _table(model_name, prompts, servers, labels, idents, col_name, results, rep_numerics, n) -> list[str]:
    numerics = rep_numerics.numerics or ("on" if rep_numerics.emulate else "off")
    lines = [f"validate: {model_name}, {len(prompts)} prompt{'s' * (len(prompts) != 1)}, {n} tokens each, greedy with "
             f"top-5 log-probs; emulate {numerics}; near-tie threshold "
             + (f"auto per server (floor {100 * rep_numerics.tau:g}%)" if rep_numerics.auto else f"{100 * rep_numerics.tau:g}% of max|logit|")]
    for lab, url, ident in zip(labels, servers, idents):
        checked = ("agrees with MODEL on " + ", ".join(ident.checked) if ident.checked else
                   "identity not checked: it exposes nothing to compare with MODEL; its answers are judged all the same")
        api = "/v1/completions" if ident.api == "openai" else "/completion"
        extra = f"; max_model_len {ident.max_model_len}, not compared" if ident.max_model_len is not None else ""
        lines.append(f"  {lab}: {url}{api} ({ident.model or 'model not named'}; {checked}{extra})")
    rows = [["prompt", *col_name]] + [[_prompt_label(pr), *(_cell(*cell) for cell in row)]
                                      for pr, row in zip(prompts, results)]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    return lines


def _summary(results, exit_code) -> str:
    from collections import Counter

    from refimpl.oracle.validate import verdict

    counts = Counter(verdict(rep) for row in results for rep, *_ in row)
    outside = sum(1 for row in results for rep, *_ in row for p in rep.probs.values() if p.exit_code)
    total = sum(counts.values())
    predicted = "".join(f", {counts[w]} {w}" for w in ("reproduced", "not reproduced") if counts[w])
    return (f"result: {total} answer{'s' * (total != 1)}: {counts['identical']} identical, {counts['near-tie']} near-tie, "
            f"{counts['wrong']} wrong{predicted}; probs outside bound: {outside} → exit {exit_code}")
