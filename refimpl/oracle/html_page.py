"""The pieces of the HTML report (refimpl.oracle.html_report): one self-contained page, escaped text, token
text, tables, the margin picture, and the write.

**Self-contained**: one UTF-8 file; the style sheet is inline, the pictures are ``data:image/png;base64`` URIs,
there is no script and nothing is fetched — the page opens the same from a CI run's artifacts, offline.

**Escaped**: every string that reaches the page goes through :func:`esc` (element text) or :func:`attr`
(attribute values): ``&``, ``<``, ``>`` and quotes become entities; C0/C1 control characters and the
bidirectional-override characters (which would reorder the text around them) are shown as visible
``\\xNN`` / ``\\uNNNN`` escapes; a lone surrogate (a JSON ``"\\ud800"``) becomes U+FFFD, so the file is
always valid UTF-8. A token's text (:func:`token_text`) is its bytes (``Tokenizer.piece``) decoded as UTF-8;
a token whose bytes are not UTF-8 on their own (a byte-fallback token, part of a character) is shown as its
bytes, ``\\xe4\\xb8``, as ``refimpl audit``'s text report shows it (``b'\\xe4\\xb8'``).

**The margin picture** is ``refimpl plot audit``'s (refimpl.oracle.plot.draw_audit), drawn from the numbers
the audit recorded at every step (``Report.margins``, refimpl.oracle.audit.margin_step) and inlined as a PNG.
It needs matplotlib (the optional ``plot`` extra); without it the page is written all the same, with one line
in place of the picture saying so.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re

from refimpl.io.output_path import replace_atomically, writing
from refimpl.oracle.audit_report import percent

# C0 and C1 controls, DEL, the bidi embeddings / overrides / isolates and marks: never written raw
_SPECIAL = re.compile("([\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029])")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.2em 1.6em; color: #1d1d1d; background: #fff; }
h1 { font-size: 1.45em; margin: 0 0 .3em; } h2 { font-size: 1.2em; margin: 1.6em 0 .4em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin: 1.2em 0 .3em; } .meta { color: #444; margin: .1em 0; }
table { border-collapse: collapse; margin: .4em 0 .8em; } th, td { border: 1px solid #c8c8c8; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #eef0f3; font-weight: 600; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ok { background: #cdebd0; } .tie { background: #ffe7a3; } .bad { background: #f5b5b5; } .none { background: #eee; }
.cols { display: flex; gap: 1em; align-items: stretch; } .col { flex: 1 1 0; min-width: 0; border: 1px solid #c8c8c8; padding: .4em .6em; }
.col h4 { margin: 0 0 .3em; font-size: .95em; } .toks { font-family: ui-monospace, Menlo, Consolas, monospace; white-space: pre-wrap; overflow-wrap: anywhere; }
.toks .t:nth-child(even) { background: #edf1f7; } .toks .ctx { color: #777; }
.toks .t.tie { background: #ffe7a3; } .toks .t.bad { background: #f5b5b5; } .toks .t.diff { background: #d7e3ff; }
.toks .t.div { outline: 2px solid #1d1d1d; outline-offset: 1px; } .toks .t.div.ok { background: #cdebd0; }
.esc { color: #0550ae; font-size: .85em; } .bytes { color: #8a1a8a; font-size: .85em; }
.note { color: #555; font-style: italic; } pre { white-space: pre-wrap; background: #f6f6f6; padding: .5em; font-size: .9em; }
img.margins { max-width: 100%; border: 1px solid #ddd; } details { margin: .3em 0; } summary { cursor: pointer; font-weight: 600; }
"""


def _clean(s: str) -> str:
    return _SURROGATE.sub("\ufffd", s)


def _escape_char(c: str) -> str:
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def esc(value) -> str:
    """Element text: escaped, control and bidi characters as visible escapes (the module docstring)."""
    parts = _SPECIAL.split(_clean(str(value)))
    return "".join(f'<span class="esc">{_escape_char(p)}</span>' if i % 2 else html.escape(p, quote=True)
                   for i, p in enumerate(parts))


def attr(value) -> str:
    """An attribute value (inside double quotes): escaped, control and bidi characters as plain escapes."""
    return html.escape(_SPECIAL.sub(lambda m: _escape_char(m.group(1)), _clean(str(value))), quote=True)


def token_text(tokenizer, tid: int) -> str:
    """One token's text as HTML: its UTF-8 text escaped, or its bytes when they are not UTF-8 on their own;
    a newline shown as ↵ and kept, so that a continuation reads as lines."""
    piece = tokenizer.piece(tid)
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError:
        return '<span class="bytes">' + "".join(f"\\x{b:02x}" for b in piece) + "</span>"
    if not text:
        return '<span class="esc">∅</span>'
    return "".join(p if i % 2 else esc(p) for i, p in enumerate(re.split("(\n)", text))).replace(
        "\n", '<span class="esc">↵</span>\n')


def token_label(tokenizer, tid: int) -> str:
    """``id 'text'`` as HTML (a table cell)."""
    return f"{tid} <span class=\"toks\">{token_text(tokenizer, tid)}</span>"


def verdict_class(verdict: str | None) -> str:
    """The colour of a verdict: ok (nothing wrong), tie (near-ties only), bad (a wrong token), none."""
    if verdict in ("identical", "clean", "reproduced", "within bound", "none compared", "not compared"):
        return "ok"
    if verdict == "near-tie":
        return "tie"
    return "none" if verdict is None else "bad"


def verdict_cell(verdict: str, text: str | None = None, href: str | None = None) -> str:
    """A table cell holding a verdict (``data-verdict``: the JSON report's value, for a reader or a test);
    ``href``: a link within the page (``#id``)."""
    shown = esc(text if text is not None else verdict)
    if href is not None:
        shown = f'<a href="{attr(href)}">{shown}</a>'
    return f'<td class="verdict {verdict_class(verdict)}" data-verdict="{attr(verdict)}">{shown}</td>'


def num(x, fmt: str = ".4g") -> str:
    """A number as a cell's text (a non-finite one as JSON writes it: a string)."""
    return format(x, fmt) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else esc(x)


def pct(part, whole) -> str:
    """``part`` as a percentage of ``whole``, as the text report writes it (:func:`refimpl.oracle.audit_report.percent`);
    a value the JSON holds as a string (not finite) gives "n/a %"."""
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in (part, whole))
    return percent(part, whole) if ok else "n/a %"


def table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    """``head``: plain header texts (escaped here); ``rows``: cells as HTML, ``<td …>`` or text for a plain cell."""
    def cell(c: str) -> str:
        return c if c.startswith("<td") else f"<td>{c}</td>"

    out = [f'<table class="{attr(cls)}">' if cls else "<table>", "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(cell(c) for c in r) + "</tr>" for r in rows]
    return "\n".join(out + ["</table>"])


def facts(obj: dict, skip=()) -> str:
    """A JSON object as a two-column table: scalars as they are, lists and objects in short JSON."""
    import json

    rows = []
    for k, v in obj.items():
        if k in skip:
            continue
        text = v if isinstance(v, str) else format(v, ".6g") if isinstance(v, float) else json.dumps(v)
        rows.append([esc(k), esc(text if len(text) <= 300 else text[:299] + "…")])
    return table(["field", "value"], rows, "facts")


def page(title: str, body: list[str]) -> str:
    """The whole document: one file, inline style, no script, nothing fetched."""
    return "\n".join(["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
                      '<meta name="viewport" content="width=device-width, initial-scale=1">',
                      f"<title>{esc(title)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>", *body,
                      "</body>", "</html>", ""])


def margin_picture(tokens: list[int], steps: dict, tau: float, verdict: str, title: str, piece) -> str:
    """``refimpl plot audit``'s picture of one stream as an ``<img>`` with a data: URI, from the audit's
    per-step numbers (``steps``: step → (oracle argmax, margin, max|logit|, deficit), Report.margins); one
    line instead when matplotlib is missing or the numbers are not finite."""
    from refimpl.errors import RefimplError
    from refimpl.oracle import plot

    if not tokens or sorted(steps) != list(range(len(tokens))):
        return '<p class="note">margin picture not drawn: the audit did not see every step of this stream.</p>'
    rows = [steps[i] for i in range(len(tokens))]
    bad = next((i for i, r in enumerate(rows) if not all(math.isfinite(x) for x in r[1:])), None)
    if bad is not None:
        return f'<p class="note">margin picture not drawn: the oracle\'s logits are not finite at step {bad}.</p>'
    try:
        plot._pyplot()
    except RefimplError:
        return ('<p class="note">margin picture not drawn: matplotlib is not installed (pip install \'refimpl[plot]\'); '
                "the margins at every departure are in the tables above.</p>")
    oracle = [r[0] for r in rows]
    series = plot.AuditSeries(list(tokens), oracle, [r[1] for r in rows], [tau * r[2] for r in rows], [r[3] for r in rows],
                              next((i for i, (a, o) in enumerate(zip(tokens, oracle)) if a != o), None), verdict)
    buf = io.BytesIO()
    shown = _SPECIAL.sub(lambda m: _escape_char(m.group(1)), _clean(title)).replace("$", r"\$")  # no mathtext
    plot.save(plot.draw_audit(series, title=shown, piece=piece), buf)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img class="margins" alt="{attr(title)}" src="data:image/png;base64,{data}">'


def write_page(path, text: str, what: str = "--html") -> None:
    """The page into ``path`` (refimpl.io.output_path: checked, parents made, written whole or not at all)."""
    with writing(path, what) as p:
        replace_atomically(p, text.encode("utf-8"))
