"""Step 13: telemetry — a speculative run's counters as a CSV and as summary lines (stderr).

Laid out so a run of the C++ engine can be put next to it (docs/speculative.md, "Counters").

CSV: ``#``-prefixed ``key=value`` preamble lines, one header line, one row per generated token,
``#``-prefixed ``key=value`` trailer lines (read it with ``pandas.read_csv(path, comment="#")``)::

    # refimpl-speculative-telemetry=1
    # spec=mtp                 none | mtp | ngram | <a custom source's name>
    # spec_draft_max=3         --draft
    # ngram_min_match=3
    # mtp=1                    1 when the MTP head drafts
    # mtp_draft_max=3          --draft for the MTP source, 0 otherwise
    # mtp_p_min=0.0
    # model=/path/to/model.gguf
    # prompt_tokens=12
    i,token,piece,wall_ms,step,kind,mtp_batch,mtp_draft_ms,bytes_read,drafts
    0,41,"A",81.250,0,correction,80.900,0.350,,7 12 3
    …
    # mtp_drafted=24
    # mtp_accepted=15
    …

Per row: ``wall_ms`` = ms since generation started when the token was confirmed (a round's tokens
share it); ``step`` = the round; ``kind`` = plain | draft | correction | bonus; ``mtp_batch`` = ms of
the round's target decode and ``mtp_draft_ms`` = ms of its drafting plus the head's catch-up, both
charged to the round's first row (0 on the others); ``bytes_read`` = bytes the expert streamer read
in the round (first row; empty when no streamer is attached); ``drafts`` = the round's draft ids,
space-separated, on its first row (empty on the others and on a plain round) — with ``kind``, what
the round audit reads (refimpl.oracle.rounds). With the streamer's ``counters`` hook,
its per-round counters follow as extra columns (``stream_*``, same charging) and their totals as
trailer lines (docs/streamer.md).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Callable

from refimpl.decode.speculative import SpecStats

CSV_FORMAT_VERSION = 1
COLUMNS = ("i", "token", "piece", "wall_ms", "step", "kind", "mtp_batch", "mtp_draft_ms", "bytes_read", "drafts")
TRAILER = ("mtp_drafted", "mtp_accepted", "mtp_decodes", "drafted_steps", "n_generated", "mtp_draft_s/tok",
           "mtp_draft_s", "decode_s", "prompt_s", "n_rs_seq", "snapshot_bytes", "snapshot_ring_bytes", "bytes_read")


def preamble(stats: SpecStats, *, model: str) -> dict:
    mtp = stats.source == "mtp"
    return {
        "refimpl-speculative-telemetry": CSV_FORMAT_VERSION,
        "spec": stats.source,
        "spec_draft_max": stats.n_draft,
        "ngram_min_match": stats.ngram_min_match,
        "mtp": int(mtp),
        "mtp_draft_max": stats.n_draft if mtp else 0,
        "mtp_p_min": stats.p_min,
        "model": model,
        "prompt_tokens": stats.n_prompt,
    }


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def write_csv(path, stats: SpecStats, *, model: str, piece: Callable[[int], bytes]) -> Path:
    """Write the telemetry CSV of one run; ``piece(id)`` gives a token's bytes (the tokenizer's)."""
    path = Path(path)
    counters = stats.counters()
    with open(path, "w", newline="", encoding="utf-8") as f:
        for k, v in preamble(stats, model=model).items():
            f.write(f"# {k}={_fmt(v)}\n")
        w = csv.writer(f, lineterminator="\n")
        extra = list(stats.stream or {})  # the streamer's counters, when its hook was attached
        w.writerow(COLUMNS + tuple(extra))
        for i, r in enumerate(stats.rows):
            text = piece(r.token).decode("utf-8", errors="backslashreplace")
            w.writerow([i, r.token, text, f"{r.wall_ms:.3f}", r.step, r.kind, f"{r.mtp_batch:.3f}",
                        f"{r.mtp_draft_ms:.3f}", _fmt(r.bytes_read), " ".join(map(str, r.drafts or ())),
                        *[r.counters[k] for k in extra]])
        for k in TRAILER + tuple(extra):
            f.write(f"# {k}={_fmt(counters[k])}\n")
    return path


def read_csv(path) -> tuple[dict, list[dict], dict]:
    """(preamble, rows, trailer) of a telemetry CSV, every value a string."""
    head, tail, lines = {}, {}, []
    with open(path, encoding="utf-8", newline="") as f:
        for line in f:
            if line.startswith("# "):
                k, _, v = line[2:].rstrip("\n").partition("=")
                (tail if lines else head)[k] = v
            else:
                lines.append(line)
    return head, list(csv.DictReader(lines)), tail


def summary_lines(stats: SpecStats) -> list[str]:
    """The lines printed on stderr after a speculative run (none for plain decoding)."""
    s, n = stats, stats.n_generated
    if s.source == "none" or n == 0:
        return []
    name = s.source
    lines = [
        f"{name}: {s.n_accepted}/{s.n_drafted} drafts accepted ({100 * s.acceptance:.1f}%), "
        f"{s.tokens_per_decode:.2f} tokens per verify decode ({s.n_decodes} decodes for {n} tokens)"
    ]
    if name == "ngram":
        share = s.n_drafted_steps / s.n_decodes if s.n_decodes else 0.0
        lines.append(f"ngram: drafted on {s.n_drafted_steps} of {s.n_decodes} steps ({100 * share:.1f}%); "
                     f"the rest decoded plainly")
    else:
        effective = n / (s.decode_s + s.draft_s) if s.decode_s + s.draft_s > 0 else 0.0
        reported = n / s.decode_s if s.decode_s > 0 else 0.0
        lines.append(f"{name}: drafting costs {s.draft_s_per_token:.4f} s/token on top of decode → "
                     f"{effective:.2f} tok/s effective (vs {reported:.2f} reported)")
    lines.append(f"{name}: snapshots n_rs_seq={s.n_rs_seq}, {s.snapshot_bytes} bytes each, "
                 f"ring peak {s.snapshot_ring_bytes} bytes")
    return lines  # the streamer prints its own byte lines (docs/streamer.md)
