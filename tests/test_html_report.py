"""``refimpl audit … --html`` and ``refimpl validate … --html`` (refimpl/oracle/html_report.py): the page renders
in a real headless browser (Debian's ``chromium``), its tables hold the verdicts of the JSON report of the same
run, a screenshot of it is not blank, nothing in it points outside the file, and token text, file names and
prompts that hold ``<``, ``&``, quotes, control bytes, a bidi override, invalid UTF-8 and a lone surrogate are
shown as text. The streams are builtin:kjv's own greedy run and a copy with such tokens put in; validate's
servers are the small local HTTP servers of tests/test_validate.py.

``chromium`` (``apt-get install chromium``; .ci/run installs it) is found on PATH or at $CHROMIUM. Outside CI a
missing browser skips the browser tests; under ``CI=true`` it fails them, like conftest's required tools."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from test_validate import LLAMA_PROPS, fake_server

MODEL = "builtin:kjv"
PROMPT = [1063, 356, 473, 289, 600]  # "And it came to pass"
#: tokens whose text must be escaped: < & " ' BEL NUL newline ESC, a lone UTF-8 lead byte (0xe4), "</think>"
ODD = [60, 38, 34, 39, 7, 0, 10, 27, 228, 2047]
ODD_TEXT = ["<", "&", '"', "'", "\\x07", "\\x00", "↵\n", "\\x1b", "\\xe4", "</think>"]
#: a file name with markup, an entity, quotes, a right-to-left override and a byte that is not UTF-8 (a surrogate)
ODD_NAME = "B<u>x&amp;\"'\u202e" + os.fsdecode(b"\xe4") + ".json"
ODD_PROMPT = 'And it came to pass <script>alert("x")</script> & \'q\' \ufffd'
WRONG_BG = (0xF5, 0xB5, 0xB5)  # html_page.STYLE's .bad background: a wrong verdict's cell


def require_chromium() -> str:
    path = os.environ.get("CHROMIUM") or shutil.which("chromium")
    if path is None:  # pragma: no cover - depends on the machine
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is required under CI=true (.ci/run installs it: apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return path


def _chromium(page: Path, tmp: Path, *args) -> subprocess.CompletedProcess:
    cmd = [require_chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp / 'profile'}", *args,
           page.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done


def _run(argv) -> tuple[int, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        rc = main(argv)
    return rc, out.getvalue()


# ---- a small DOM and a small PNG reader (stdlib and numpy) ---------------------------------------------------


class Node:
    def __init__(self, tag: str, attrs, parent=None):
        self.tag, self.attrs, self.parent, self.children = tag, dict(attrs), parent, []

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def iter(self):
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.iter()

    def find_all(self, tag: str, cls: str | None = None) -> list:
        return [n for n in self.iter() if n.tag == tag and (cls is None or cls in (n.attrs.get("class") or "").split())]


class _Tree(HTMLParser):
    VOID = {"meta", "br", "img", "hr", "input", "link", "area", "base", "col", "embed", "source", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = self.cur = Node("#document", {})

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.cur)
        self.cur.children.append(node)
        if tag not in self.VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, attrs, self.cur))

    def handle_endtag(self, tag):
        node = self.cur
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.cur = node.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def dom(text: str) -> Node:
    parser = _Tree()
    parser.feed(text)
    parser.close()
    return parser.root


def png_pixels(data: bytes) -> np.ndarray:
    """An 8-bit RGB or RGBA, non-interlaced PNG (what chromium and matplotlib write) → [h, w, channels]."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, [], None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", data[pos + 8:pos + 8 + n])
        elif kind == b"IDAT":
            idat.append(data[pos + 8:pos + 8 + n])
        pos += 12 + n
    w, h, depth, color, _, _, interlace = head
    assert depth == 8 and color in (2, 6) and interlace == 0, head
    bpp = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8).reshape(h, 1 + w * bpp)
    out, prev = np.zeros((h, w * bpp), np.uint8), np.zeros(w * bpp, np.int64)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int64)
        if f == 0:
            cur = line
        elif f == 1:  # Sub: a running sum per channel
            cur = (np.cumsum(line.reshape(w, bpp), axis=0) & 255).reshape(-1)
        elif f == 2:  # Up
            cur = (line + prev) & 255
        else:  # Average, Paeth: byte by byte
            cur, b = line.tolist(), prev.tolist()
            for x in range(w * bpp):
                a = cur[x - bpp] if x >= bpp else 0
                if f == 3:
                    cur[x] = (cur[x] + ((a + b[x]) >> 1)) & 255
                else:
                    c = b[x - bpp] if x >= bpp else 0
                    p = a + b[x] - c
                    pa, pb, pc = abs(p - a), abs(p - b[x]), abs(p - c)
                    cur[x] = (cur[x] + (a if pa <= pb and pa <= pc else b[x] if pb <= pc else c)) & 255
            cur = np.array(cur, np.int64)
        out[y], prev = cur, cur
    return out.reshape(h, w, bpp)


def _not_blank(pixels: np.ndarray) -> None:
    rgb = pixels[..., :3].reshape(-1, 3)
    assert len(np.unique(rgb, axis=0)) > 1, "every pixel has one colour"


# ---- the runs ----------------------------------------------------------------------------------------------------


def _completion(tokens):
    def answer(body):
        out = {"tokens": tokens[: body["n_predict"]], "content": "x", "stop": True}
        return 200, json.dumps(out).encode()
    return answer


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fixture_cache):
    """Every page, with the JSON and stdout of the same commands: audit of two streams (builtin:kjv's greedy run,
    and a copy with ODD from step 3, under ODD_NAME), audit --streams of a directory of two pairs, validate of one
    prompt on two fake llama-servers (the greedy answer, the ODD one)."""
    root = tmp_path_factory.mktemp("html")
    rc, out = _run(["run", MODEL, "--tokens", ",".join(map(str, PROMPT)), "-n", "16", "--json"])
    assert rc == 0
    greedy = json.loads(out)["tokens"]
    odd = greedy[:3] + ODD + greedy[3 + len(ODD):]
    a, b = root / "A.json", root / ODD_NAME
    a.write_text(json.dumps({"prompt_tokens": PROMPT, "tokens": greedy}))
    b.write_text(json.dumps({"prompt_tokens": PROMPT, "tokens": odd}))
    r = {"greedy": greedy, "odd": odd, "root": root}

    r["audit_json"] = json.loads(_run(["audit", MODEL, str(a), str(b), "--json"])[1])
    r["audit_plain"] = _run(["audit", MODEL, str(a), str(b)])
    r["audit_html"] = _run(["audit", MODEL, str(a), str(b), "--html", str(root / "pages" / "audit.html")])

    d = root / "streams"
    d.mkdir()
    (d / "p0.A.json").write_text(a.read_text())
    (d / "p0.B.json").write_text(a.read_text())
    (d / "p1.A.json").write_text(b.read_text())
    r["streams_json"] = json.loads(_run(["audit", MODEL, "--streams", str(d), "--json"])[1])
    r["streams_html"] = _run(["audit", MODEL, "--streams", str(d), "--html", str(root / "pages" / "streams.html")])

    prompts = root / "prompts.jsonl"
    prompts.write_text(json.dumps({"text": ODD_PROMPT}) + "\n")
    from refimpl.fixtures.builtin import resolve_model
    from refimpl.tokenizer import Tokenizer

    ids = Tokenizer.from_gguf(resolve_model(MODEL)).encode(ODD_PROMPT, parse_special=True)
    rc, out = _run(["run", MODEL, "--tokens", ",".join(map(str, ids)), "-n", "8", "--json"])
    answer = json.loads(out)["tokens"]
    with fake_server({"/props": LLAMA_PROPS, "/completion": _completion(answer)}) as good, \
            fake_server({"/props": LLAMA_PROPS, "/completion": _completion(answer[:2] + ODD)}) as bad:
        argv = ["validate", MODEL, "--server", good, "--server", bad, "--prompts", str(prompts), "-n", "8"]
        r["validate_plain"] = _run(argv)
        r["validate_html"] = _run(argv + ["--report", str(root / "report.json"), "--html", str(root / "pages" / "validate.html")])
    r["validate_json"] = json.loads((root / "report.json").read_text())
    r["pages"] = {name: root / "pages" / f"{name}.html" for name in ("audit", "streams", "validate")}
    return r


@pytest.fixture(scope="module")
def rendered(runs, tmp_path_factory):
    """Each page's DOM as headless chromium builds it (--dump-dom), parsed."""
    tmp = tmp_path_factory.mktemp("chromium")
    return {name: dom(_chromium(page, tmp, "--dump-dom").stdout.decode("utf-8")) for name, page in runs["pages"].items()}


# ---- the tests -------------------------------------------------------------------------------------------------


def test_html_changes_neither_stdout_nor_the_exit_code(runs):
    assert runs["audit_html"] == runs["audit_plain"] and runs["audit_plain"][0] == 1
    assert runs["validate_html"] == runs["validate_plain"] and runs["validate_plain"][0] == 1
    assert runs["streams_html"][0] == runs["streams_json"]["exit_code"] == 1


def test_audit_page_holds_the_json_verdicts(runs, rendered):
    j, page = runs["audit_json"], rendered["audit"]
    (table,) = page.find_all("table", "verdicts")
    (cell,) = table.find_all("td", "verdict")
    assert cell.attrs["data-verdict"] == cell.text() == j["verdict"] == "B wrong"
    events = j["findings"] + [j["divergence"]]
    ties = sum(e["kind"] == "near-tie" for e in events)
    cells = [td.text() for td in table.find_all("td")]
    assert cells[2:7] == [str(j["common_prefix"]), str(j["divergence"]["step"]), str(ties), str(len(events) - ties), "—"]
    assert table.find_all("td", "exit")[0].text() == str(j["exit_code"])
    (findings,) = page.find_all("table", "findings")
    shown = [(int(tr.find_all("td")[0].text()), tr.find_all("td", "verdict")[0].attrs["data-verdict"]) for tr in findings.find_all("tr")[1:]]
    assert shown == sorted((f["step"], f["kind"]) for f in j["findings"])
    # the oracle at the divergence, as the JSON has it (top-2 ids, margin)
    (oracle,) = page.find_all("table", "oracle")
    rows = [[td.text() for td in tr.find_all("td")] for tr in oracle.find_all("tr")[1:]]
    o = j["divergence"]["oracle"]
    assert [int(r[1].split()[0]) for r in rows[:2]] == o["top_ids"] and rows[1][4] == format(o["margin"], ".4g")
    assert [r[0] for r in rows[2:]] == ["A's token", "B's token"]


def test_streams_and_validate_pages_hold_the_json_verdicts(runs, rendered):
    j = runs["streams_json"]
    (table,) = rendered["streams"].find_all("table", "verdicts")
    assert [td.attrs["data-verdict"] for td in table.find_all("td", "verdict")] == [p["verdict"] for p in j["pairs"]] == ["identical", "A wrong"]
    assert [td.text() for td in table.find_all("td", "exit")] == [str(p["exit_code"]) for p in j["pairs"]]
    (summary,) = rendered["streams"].find_all("table", "summary")
    assert {td.attrs["data-verdict"]: int(td.parent.find_all("td")[1].text()) for td in summary.find_all("td", "verdict")} == j["summary"]

    doc = runs["validate_json"]
    (table,) = rendered["validate"].find_all("table", "verdicts")
    verdicts = [td.attrs["data-verdict"] for td in table.find_all("td", "verdict")]
    assert verdicts == [r["verdict"] for r in doc["results"]] == ["identical", "wrong"]
    # each cell is the text table's cell, and links to its answer's section
    out = runs["validate_plain"][1]
    for td in table.find_all("td", "verdict"):
        assert td.text() in out
        assert rendered["validate"].find_all("details") and any(n.attrs.get("id") == td.find_all("a")[0].attrs["href"][1:]
                                                                for n in rendered["validate"].find_all("details"))


def test_a_screenshot_is_not_blank(runs, tmp_path):
    shot = tmp_path / "audit.png"
    _chromium(runs["pages"]["audit"], tmp_path, f"--screenshot={shot}", "--window-size=1100,900", "--hide-scrollbars")
    pixels = png_pixels(shot.read_bytes())
    assert pixels.shape[:2] == (900, 1100)
    _not_blank(pixels)
    assert (pixels[..., :3].reshape(-1, 3) == WRONG_BG).all(axis=1).any(), "the wrong verdict's cell is not drawn"


def test_the_margin_picture_is_inline(runs, rendered):
    from conftest import _require

    _require("matplotlib", "matplotlib", "plot")
    imgs = rendered["audit"].find_all("img", "margins")
    assert len(imgs) == 2  # one per stream
    for img in imgs:
        prefix = "data:image/png;base64,"
        assert img.attrs["src"].startswith(prefix)
        _not_blank(png_pixels(base64.b64decode(img.attrs["src"][len(prefix):])))
    assert len(rendered["validate"].find_all("img", "margins")) == 2  # one per answer


def test_without_matplotlib_the_page_says_so_in_one_line(runs, tmp_path, monkeypatch):
    from refimpl.errors import RefimplError
    from refimpl.oracle import plot

    def missing():
        raise RefimplError("refimpl plot needs matplotlib")

    monkeypatch.setattr(plot, "_pyplot", missing)
    page = tmp_path / "p.html"
    a = str(runs["root"] / "A.json")
    assert _run(["audit", MODEL, a, "--html", str(page)]) == _run(["audit", MODEL, a])
    tree = dom(page.read_text(encoding="utf-8"))
    assert not tree.find_all("img")
    notes = [p.text() for p in tree.find_all("p", "note")]
    assert any(n.startswith("margin picture not drawn: matplotlib is not installed") for n in notes), notes


def test_nothing_points_outside_the_page(runs, rendered):
    for name, page in rendered.items():
        raw = runs["pages"][name].read_text(encoding="utf-8")
        assert "url(" not in raw and "@import" not in raw, name
        for node in page.iter():
            assert node.tag not in ("script", "link", "iframe", "object", "embed", "base", "frame"), (name, node.tag)
            assert not (node.tag == "meta" and "http-equiv" in node.attrs), name
            for key in ("src", "href", "srcset", "action", "data", "poster", "background"):
                value = node.attrs.get(key)
                assert value is None or value.startswith(("data:image/png;base64,", "#")), (name, node.tag, key, value[:80])
            assert not any(k.startswith("on") for k in node.attrs), (name, node.tag)
    audit = re.sub("data:image/png;base64,[A-Za-z0-9+/=]*", "", runs["pages"]["audit"].read_text(encoding="utf-8"))
    assert "http:" not in audit and "https:" not in audit and "//" not in audit  # no URL at all where no server is named


def test_odd_text_is_shown_as_text(runs, rendered):
    for name, path in runs["pages"].items():
        raw = path.read_bytes().decode("utf-8")  # strict: valid UTF-8, the surrogate replaced
        assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202e\ud800-\udfff]", raw), name
    page = rendered["audit"]
    assert not page.find_all("u") and not page.find_all("think") and not page.find_all("script")
    # B's continuation: from the divergence on, each ODD token's text, escaped
    cols = page.find_all("div", "col")
    assert cols[1].find_all("h4")[0].text().endswith("B<u>x&amp;\"'\\u202e\ufffd.json")
    spans = [s for s in cols[1].find_all("span", "t") if "ctx" not in s.attrs["class"].split()]
    assert [s.text() for s in spans[: len(ODD)]] == ODD_TEXT
    assert "div" in spans[0].attrs["class"].split() and "bad" in spans[0].attrs["class"].split()
    streams = page.find_all("table", "verdicts")[0].find_all("td")[0].text()
    assert "B: " + str(runs["root"] / "B<u>x&amp;\"'\\u202e\ufffd.json") + " (json, 16 tokens)" in streams
    # validate: the prompt's markup is text; the wrong answer's ODD tokens likewise
    page = rendered["validate"]
    assert not page.find_all("script") and not page.find_all("think")
    row = page.find_all("table", "verdicts")[0].find_all("tr")[1]
    assert row.find_all("td")[0].text() == "1. " + ODD_PROMPT
    answers = [[s for s in col.find_all("span", "t") if "ctx" not in s.attrs["class"].split()] for col in page.find_all("div", "col")]
    (wrong,) = [spans for spans in answers if [s.text() for s in spans[:3]] == ODD_TEXT[:3]]
    assert {"div", "bad"} <= set(wrong[0].attrs["class"].split())  # an answer audited alone is "A" in the JSON


@pytest.mark.parametrize("command", ["audit", "validate"])
@pytest.mark.parametrize("where", ["directory", "proc", "file parent"])
def test_html_path_is_checked_before_any_work(command, where, runs, tmp_path, capsys):
    (tmp_path / "plain").write_text("a file")
    out = {"directory": tmp_path, "proc": "/proc/refimpl-cannot-write-here/r.html", "file parent": tmp_path / "plain" / "r.html"}[where]
    argv = (["audit", MODEL, str(runs["root"] / "A.json")] if command == "audit"
            else ["validate", MODEL, "--server", "http://127.0.0.1:1", "--prompts", str(runs["root"] / "prompts.jsonl")])
    before = sorted(tmp_path.rglob("*"))
    assert main(argv + ["--html", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"refimpl: error: cannot write --html {out}"), err  # not "cannot reach"
    assert sorted(tmp_path.rglob("*")) == before


def test_html_is_refused_where_no_stream_audit_runs(runs, tmp_path, capsys):
    golden = tmp_path / "g.jsonl"
    for argv, words in ((["audit", "--kld-base", str(tmp_path / "base.kld")], "--html goes with STREAM files or --streams DIR, not --kld-base"),
                        (["audit", str(golden), str(runs["root"] / "A.json")], "not audit GOLDEN STREAM")):
        assert main(argv + ["--html", str(tmp_path / "p.html")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "p.html").exists()


def test_the_log_prob_verdict_is_on_the_page(tmp_path):
    """A server response's ``probs`` result (llama-server's recorded /v1 answer, tests/data/responses) as the JSON
    has it, in the table and in its own folded section."""
    answer = str(Path(__file__).parent / "data" / "responses" / "llama-server-v1c.json")
    argv = ["audit", MODEL, answer, "--prompt-tokens", ",".join(map(str, PROMPT))]
    j = json.loads(_run(argv + ["--json"])[1])
    assert _run(argv + ["--html", str(tmp_path / "p.html")])[0] == j["exit_code"]
    tree = dom((tmp_path / "p.html").read_text(encoding="utf-8"))
    verdict = j["probs"]["A"]["verdict"]
    assert tree.find_all("table", "verdicts")[0].find_all("td")[6].text() == f"probs A: {verdict}"
    assert f"Log-probs of A: {verdict}" in [s.text() for s in tree.find_all("summary")]


def test_a_prompt_that_differs_gets_a_page_too(runs, tmp_path):
    """The stream's prompt_tokens are not --prompt-tokens: nothing is audited, exit 1, and the page says why."""
    argv = ["audit", MODEL, str(runs["root"] / "A.json"), "--prompt-tokens", "1063,356,473"]
    assert _run(argv + ["--html", str(tmp_path / "p.html")]) == _run(argv)
    j = json.loads(_run(argv + ["--json"])[1])
    (cell,) = dom((tmp_path / "p.html").read_text(encoding="utf-8")).find_all("td", "verdict")
    assert cell.attrs["data-verdict"] == j["verdict"] == "prompt differs" and j["exit"] == 1
