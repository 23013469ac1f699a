"""The HTML report: ``refimpl audit … --html FILE`` and ``refimpl validate … --html FILE`` write one
self-contained page an engine team can attach to a CI run (docs/validating-an-engine.md, "The report as a
web page"; the page's pieces and its escaping: :mod:`refimpl.oracle.html_page`).

The page is made from the audit reports themselves: every verdict, count, token and margin it shows is read
from ``Report.as_json()`` — the object ``--json`` prints and ``validate --report`` writes — so the page cannot
say what the JSON does not; the token ids of each stream and the oracle's per-step numbers of the margin
picture (``Report.margins``, not in the JSON) come from the same report. Each page holds:

1. the table: ``audit`` the stream(s) and the verdict; ``audit --streams DIR`` a row per pair and the summary
   table; ``validate`` prompt × server (× draft setting), each cell the text table's, linking to its answer;
2. for each audit (each pair, each answer): at the first divergence the two continuations side by side — A's
   and B's tokens as text, or, for one stream, its tokens and the oracle's argmax at each step given the
   stream's own history (teacher-forced: the oracle's greedy stream is not computed) — the divergence outlined,
   every departure coloured (amber a near-tie, red a wrong token), and the oracle's top-2, margin and
   near-tie threshold at that position, as the text report prints them; every departure in a table; the
   log-prob (``probs``), round and prediction verdicts; the margin picture of ``refimpl plot audit`` for each
   stream; and the text report itself.
"""

from __future__ import annotations

from refimpl.oracle.html_page import (attr, esc, facts, margin_picture, num, page, pct, table, token_label,
                                      token_text, verdict_cell, verdict_class)

CONTEXT = 12  # tokens of the common prefix shown before the divergence
SHOWN = 200  # tokens of each continuation shown from the divergence on


# ---- one audit ---------------------------------------------------------------------------------


def _events(j: dict) -> list[dict]:
    return j["findings"] + ([j["divergence"]] if j["divergence"] else [])


def counts(j: dict) -> tuple[int, int]:
    """(near-ties, wrong tokens) of an audit's JSON, as ``Report.n_near_ties`` / ``n_wrong`` count them."""
    ev = _events(j)
    ties = sum(e["kind"] == "near-tie" for e in ev)
    return ties, len(ev) - ties


def _marks(j: dict, label: str) -> dict[int, str]:
    """step → the CSS class of a stream's token there: a departure (tie / bad), the divergence (div). ``label``:
    the stream's role in the JSON, "A" or "B" (an answer of validate, audited alone, is "A" there)."""
    out = {f["step"]: "tie" if f["kind"] == "near-tie" else "bad" for f in j["findings"] if f["where"] in (label, "A+B")}
    d = j["divergence"]
    if d is not None and label in d["tokens"]:
        out[d["step"]] = "div " + _closeness(d, label)
    return out


def _closeness(d: dict, label: str) -> str:
    """A token at the divergence, by the divergence's verdict: bad (this stream is the wrong one), ok (the oracle's
    argmax) or tie."""
    if d["kind"] in (f"{label} wrong", "both wrong"):
        return "bad"
    return "ok" if d["deficit"][label] == 0 else "tie"


def _continuation(tok, tokens: list[int], start: int, marks: dict[int, str], oracle: list[int] | None = None) -> str:
    """Tokens from ``start - CONTEXT`` (greyed: the common prefix) to ``start + SHOWN``, one span each."""
    first, end = max(0, start - CONTEXT), min(len(tokens), start + SHOWN)
    spans = ['<span class="ctx">…</span>'] if first else []
    for s in range(first, end):
        cls = " ".join(["t"] + (["ctx"] if s < start else []) + ([marks[s]] if s in marks else []))
        title = f"step {s}, id {tokens[s]}"
        if oracle is not None and s < len(oracle) and oracle[s] != tokens[s]:
            title += f"; the oracle's argmax: id {oracle[s]}"
        spans.append(f'<span class="{cls}" title="{attr(title)}">{token_text(tok, tokens[s])}</span>')
    more = len(tokens) - end
    tail = f'<p class="note">… {more} more token{"s" * (more != 1)}</p>' if more > 0 else ""
    return f'<div class="toks">{"".join(spans)}</div>{tail}'


def _oracle_table(tok, d: dict) -> str:
    """The oracle at the divergence: its top-2, each stream's token (logit, rank, deficit), the margin."""
    o = d["oracle"]
    (t1, t2), (l1, l2) = o["top_ids"], o["top_logits"]
    rows = [["oracle top-1", token_label(tok, t1), f'<td class="num">{num(l1, ".6g")}</td>', '<td class="num">0</td>', "", ""],
            ["oracle top-2", token_label(tok, t2), f'<td class="num">{num(l2, ".6g")}</td>', '<td class="num">1</td>',
             f'<td class="num">{num(o["margin"])}</td>', pct(o["margin"], o["max_abs"])]]
    for lab, t in d["tokens"].items():
        deficit = d["deficit"][lab]
        rows.append([esc(f"{lab}'s token"), token_label(tok, t), f'<td class="num">{num(o["logit"][str(t)], ".6g")}</td>',
                     f'<td class="num">{o["rank"][str(t)]}</td>', f'<td class="num">{num(deficit)}</td>', pct(deficit, o["max_abs"])])
    return table(["", "token", "logit", "rank", "below the top-1", "of max|logit|"], rows, "oracle")


def _divergence(rep, j: dict, tok) -> list[str]:
    d = j["divergence"]
    if d is None:  # as the text report says it (refimpl.oracle.audit_report.report_lines)
        ns = [s["n_tokens"] for s in j["streams"]]
        if len(ns) == 1:
            return [f"<p>No divergence: all {ns[0]} tokens of A are the oracle's argmax (A is the oracle's greedy stream).</p>"]
        if ns[0] == ns[1]:
            return [f"<p>No divergence: the streams are identical ({ns[0]} tokens).</p>"]
        longer = max(j["streams"], key=lambda s: s["n_tokens"])
        return [f"<p>No divergence: {esc(longer['label'])} continues for {longer['n_tokens'] - j['common_prefix']} tokens "
                "after the other ends.</p>"]
    k, o = d["step"], d["oracle"]
    (la, ta), (lb, tb) = d["tokens"].items()
    out = [f"<h3>First divergence at step {k} (position {len(j['prompt_tokens']) + k}): {esc(la)} has "
           f"{token_label(tok, ta)}, {esc(lb)} {token_label(tok, tb)}</h3>"]
    a = rep.streams[0]
    cols = [(f"{a.label}: {a.source}", _continuation(tok, a.tokens, k, _marks(j, "A"),
                                                      [m[0] for _, m in sorted(rep.margins.get(a.label, {}).items())]))]
    if len(rep.streams) == 2:
        b = rep.streams[1]
        cols.append((f"{b.label}: {b.source}", _continuation(tok, b.tokens, k, _marks(j, "B"),
                                                              [m[0] for _, m in sorted(rep.margins.get(b.label, {}).items())])))
    else:  # the oracle's argmax at every step of A's history (the oracle's own greedy stream is not computed)
        steps = rep.margins.get(a.label, {})
        picks = [steps[s][0] for s in range(len(a.tokens)) if s in steps]
        if len(picks) == len(a.tokens):
            marks = {s: "diff" for s, (x, y) in enumerate(zip(picks, a.tokens)) if x != y}
            marks[k] = "div ok"  # the oracle's own choice
            cols.append(("oracle: its argmax at each step, given A's history", _continuation(tok, picks, k, marks, a.tokens)))
    out.append('<div class="cols">' + "".join(f'<div class="col"><h4>{esc(h)}</h4>{body}</div>' for h, body in cols) + "</div>")
    out.append(_oracle_table(tok, d))
    reproduced = "" if "reproduced" not in d else f"; llama.cpp's own batches {'compute' if d['reproduced'] else 'do not compute'} it"
    out.append(f"<p>Margin {num(o['margin'])} = {pct(o['margin'], o['max_abs'])} of max|logit| {num(o['max_abs'])}; "
               f"near-tie threshold {num(o['threshold'])} (τ = {num(j['threshold'], 'g')}"
               + ("; --threshold auto: the floor, each stream judged by its calibrated threshold below" if j.get("threshold_auto") else "")
               + "); "
               f"verdict <b class=\"{verdict_class(d['kind'])}\">{esc(d['kind'])}</b>{esc(reproduced)}.</p>")
    return out


def _findings(j: dict, tok) -> list[str]:
    if not j["findings"]:
        return []
    who = {"A+B": "both (common prefix)"}
    engine = any(f.get("engine") for f in j["findings"])
    rows = []
    for f in sorted(j["findings"], key=lambda f: f["step"]):
        lab, t = next(iter(f["tokens"].items()))
        o = f["oracle"]
        rows.append([f'<td class="num">{f["step"]}</td>', esc(who.get(f["where"], f["where"])), token_label(tok, t),
                     f'<td class="num">{o["rank"][str(t)]}</td>', f'<td class="num">{num(f["deficit"][lab])}</td>',
                     pct(f["deficit"][lab], o["max_abs"]), token_label(tok, o["top_ids"][0]), token_label(tok, o["top_ids"][1]),
                     f"{num(o['margin'])} ({pct(o['margin'], o['max_abs'])})", verdict_cell(f["kind"])]
                    + ([esc("reproduced" if f["reproduced"] else "not reproduced")] if "reproduced" in f else [])
                    + ([esc(_engine(f.get("engine")))] if engine else []))
    head = ["step", "stream", "token", "rank", "below the top-1", "of max|logit|", "oracle top-1", "oracle top-2",
            "oracle margin", "verdict"] + (["llama.cpp"] if "reproduced" in j["findings"][0] else []) + (
            ["the engine's own log-probs (--threshold auto)"] if engine else [])
    return ["<h3>Departures: tokens that are not the oracle's argmax (given each stream's own history)</h3>",
            table(head, rows, "findings")]


def _engine(e: dict | None) -> str:
    """--threshold auto: a finding's evidence from the engine's own log-probs, per stream (refimpl.oracle.calibrate)."""
    return "; ".join(f"{lab}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in d.items())
                     for lab, d in (e or {}).items()) or "—"


def _extras(j: dict) -> list[str]:
    """The log-prob, round, prediction and calibration results, field by field; folded unless they fail."""
    parts = [(f"Log-probs of {lab}: {p.get('verdict')}", p) for lab, p in j["probs"].items()]
    parts += [(f"Rounds of {lab}: {r.get('verdict')}", r) for lab, r in j["rounds"].items()]
    if "reproduce" in j:
        parts.append(("llama.cpp's predicted streams (--emulate=ggml)", j["reproduce"]))
    parts += [(f"Near-tie threshold of {lab} (--threshold auto): {100 * c['tau']:.3g}% of max|logit|"
               if isinstance(c.get("tau"), float) else f"Near-tie threshold of {lab} (--threshold auto)", c)
              for lab, c in (j.get("calibration") or {}).items()]  # refimpl.oracle.calibrate
    return [f'<details{" open" if obj.get("exit_code") else ""}><summary>{esc(title)}</summary>{facts(obj)}</details>'
            for title, obj in parts]


def threshold_text(j: dict) -> str:
    """The near-tie threshold as the text report states it: τ, or auto with τ the floor."""
    tau = num(100 * j["threshold"], "g")
    return f"auto per stream (floor {tau}%)" if j.get("threshold_auto") else f"{tau}% of max|logit|"


def _pictures(rep, j: dict, tok, name: str) -> list[str]:
    out = ["<h3>Margins along each stream (refimpl plot audit)</h3>"]
    for s in rep.streams:
        title = f"{name}{s.label}: {s.source}; first divergence {j['verdict']}"
        tau = ((j.get("calibration") or {}).get(s.label) or {}).get("tau", j["threshold"])  # --threshold auto: its own
        out.append(margin_picture(s.tokens, rep.margins.get(s.label, {}), tau, j["verdict"], title, lambda t: tok.decode([t])))
    return out


def audit_sections(rep, tok, name: str = "") -> list[str]:
    """Everything about one audit below its table row (the module docstring, 2.)."""
    from refimpl.oracle.audit_report import report_lines

    j = rep.as_json()
    return (_divergence(rep, j, tok) + _findings(j, tok) + _extras(j) + _pictures(rep, j, tok, name)
            + ["<details><summary>The text report</summary>", f"<pre>{esc(chr(10).join(report_lines(rep, tok)))}</pre>",
               "</details>"])


def _streams_cell(j: dict) -> str:
    lines = [f"{s['label']}: {s['source']} ({s['kind']}, {s['n_tokens']} tokens)" for s in j["streams"]]
    if len(j["streams"]) == 1:
        lines.append("B: the oracle's greedy stream")
    return "<br>".join(esc(x) for x in lines)


def _verdict_row(j: dict) -> list[str]:
    ties, wrong = counts(j)
    d = j["divergence"]
    sub = "; ".join([f"probs {lab}: {p['verdict']}" for lab, p in j["probs"].items()]
                    + [f"rounds {lab}: {r.get('verdict')}" for lab, r in j["rounds"].items()])
    return [verdict_cell(j["verdict"]), f'<td class="num">{j["common_prefix"]}</td>',
            f'<td class="num">{d["step"] if d else "—"}</td>', f'<td class="num">{ties}</td>', f'<td class="num">{wrong}</td>',
            esc(sub or "—"), f'<td class="num exit">{j["exit_code"]}</td>']


_ROW_HEAD = ["verdict", "common prefix", "divergence step", "near-ties", "wrong", "probs, rounds", "exit"]


def _meta(j: dict, tok) -> list[str]:
    emulate = "on" if j["emulate"] else "off"
    return [f'<p class="meta">model {esc(j["model"])}; emulate {esc(emulate)}; near-tie threshold {threshold_text(j)}</p>',
            f'<details><summary>prompt: {len(j["prompt_tokens"])} ids</summary><div class="toks">'
            + "".join(f'<span class="t" title="id {t}">{token_text(tok, t)}</span>' for t in j["prompt_tokens"]) + "</div></details>"]


# ---- the three pages -----------------------------------------------------------------------------


def audit_page(rep, tok) -> str:
    """``refimpl audit [MODEL] STREAM [STREAM] --html``."""
    j = rep.as_json()
    body = ["<h1>refimpl audit</h1>", *_meta(j, tok),
            table(["streams"] + _ROW_HEAD, [[_streams_cell(j)] + _verdict_row(j)], "verdicts"),
            "<h2>Where the streams depart from the oracle</h2>", *audit_sections(rep, tok)]
    return page(f"refimpl audit: {j['verdict']}", body)


def streams_page(pairs, reports, tok) -> str:
    """``refimpl audit [MODEL] --streams DIR --html``: a row per pair, the summary table, each pair's sections."""
    from collections import Counter

    from refimpl.oracle.audit_streams import VERDICTS, as_json

    doc = as_json(pairs, reports)
    rows = [[f'<a href="#pair-{i}">{esc(p["name"])}</a>', _streams_cell(p)] + _verdict_row(p) for i, p in enumerate(doc["pairs"])]
    wrong = Counter(p["verdict"] for p in doc["pairs"] if p["exit_code"])
    order = [v for v in VERDICTS if v in doc["summary"]] + sorted(v for v in doc["summary"] if v not in VERDICTS)
    summary = [[verdict_cell(v), f'<td class="num">{doc["summary"][v]}</td>', f'<td class="num">{wrong[v]}</td>'] for v in order]
    summary.append(["total", f'<td class="num">{len(doc["pairs"])}</td>', f'<td class="num">{sum(wrong.values())}</td>'])
    n_bad = sum(wrong.values())
    body = ["<h1>refimpl audit --streams</h1>", *(_meta(doc["pairs"][0], tok)[:1] if doc["pairs"] else []),
            table(["pair", "streams"] + _ROW_HEAD, rows, "verdicts"), table(["verdict", "pairs", "with a wrong token"], summary, "summary"),
            f"<p>result: {n_bad} of {len(doc['pairs'])} stream pairs wrong → exit <span class=\"exit\">{doc['exit_code']}</span></p>"]
    for i, (p, rep) in enumerate(zip(doc["pairs"], reports)):
        body += [f'<details id="pair-{i}"{"" if p["verdict"] == "identical" else " open"}><summary>{esc(p["name"])}: '
                 f'{esc(p["verdict"])}</summary>', *audit_sections(rep, tok, f"{p['name']} "), "</details>"]
    return page(f"refimpl audit --streams: exit {doc['exit_code']}", body)


def validate_page(doc: dict, reports: list, cells: list[str], tok) -> str:
    """``refimpl validate … --html``: ``doc`` is the ``--report`` object; ``reports`` and ``cells`` (the text table's
    cells) follow ``doc["results"]``."""
    servers = [[esc(s["label"]), esc(s["url"]), esc(s["api"]), esc(s["model"] or "not named"),
                esc(", ".join(s["checked"]) if s["checked"] else "identity not checked: it exposes nothing to compare")]
               for s in doc["servers"]]
    columns = list(dict.fromkeys(r["column"] for r in doc["results"]))
    by_prompt: dict[int, dict] = {}
    for i, r in enumerate(doc["results"]):
        by_prompt.setdefault(r["prompt"], {})[r["column"]] = i
    rows = []
    for n, at in by_prompt.items():
        r0 = doc["results"][next(iter(at.values()))]
        text = r0["text"] if r0["text"] is not None else "ids " + ",".join(map(str, r0["prompt_tokens"]))
        rows.append([f"{n}. {esc(text if len(text) <= 60 else text[:59] + '…')}"]
                    + [verdict_cell(doc["results"][at[c]]["verdict"], cells[at[c]], f"#answer-{at[c]}") if c in at else ""
                       for c in columns])
    from collections import Counter

    tally = Counter(r["verdict"] for r in doc["results"])
    body = ["<h1>refimpl validate</h1>",
            f'<p class="meta">model {esc(doc["model"])}; {len(by_prompt)} prompts, {doc["n_predict"]} tokens each, greedy with '
            f'top-{doc["n_probs"]} log-probs; near-tie threshold {threshold_text(doc).replace("per stream", "per server")}</p>',
            table(["server", "URL", "API", "model", "agrees with MODEL on"], servers, "servers"),
            *[f"<h3>Near-tie threshold of server {esc(lab)} (--threshold auto)</h3>\n" + facts(c)
              for lab, c in (doc.get("calibration") or {}).items()],
            table(["prompt"] + columns, rows, "verdicts"),
            "<p>result: " + esc(", ".join(f"{v} {tally[v]}" for v in tally)) + f" → exit <span class=\"exit\">{doc['exit_code']}</span></p>",
            "<h2>Answers</h2>"]
    for i, (r, rep) in enumerate(zip(doc["results"], reports)):
        body += [f'<details id="answer-{i}"{"" if r["verdict"] == "identical" else " open"}><summary>prompt {r["prompt"]}, '
                 f'{esc(r["column"])} ({esc(r["server"])}): {esc(r["verdict"])}</summary>',
                 *audit_sections(rep, tok, f"prompt {r['prompt']}, "), "</details>"]
    return page(f"refimpl validate: exit {doc['exit_code']}", body)


def prompt_differs_page(out: list[dict]) -> str:
    """``refimpl audit`` when a stream's prompt ids are not the oracle's (nothing audited, exit 1): ``out`` as
    refimpl.cli.audit._prompt_differs describes each stream."""
    rows = [[esc(o["stream"]), esc(o["source"]), verdict_cell("prompt differs"), f'<td class="num">{o["index"]}</td>', esc(o["text"])]
            for o in out]
    return page("refimpl audit: prompt differs", ["<h1>refimpl audit</h1>",
                                                  table(["stream", "source", "verdict", "prompt index", "what differs"], rows, "verdicts"),
                                                  '<p>Nothing was audited → exit <span class="exit">1</span></p>'])
