"""Run llama.cpp's ``llama-perplexity`` (built from llama-cpp-python 0.3.36's vendored source by
``.ci/build-llama-tools``; located by conftest.require_llama_tool) and read what it prints.

:func:`kld_statistics` parses the summary of ``--kl-divergence`` (``kl_divergence()``, lines 1892-1982 of
``tools/perplexity/perplexity.cpp``) into ``{label: (value, uncertainty or None)}`` — the same parser
reads ``refimpl audit --kld-base``'s text report, which prints those lines in the same format.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

LOG_TAIL_LINES = 25
THREADS = 2
ATTEMPTS = 10


class LlamaToolError(RuntimeError):
    """A llama.cpp tool failed; the message ends with the tail of its output."""


def run_tool(tool: Path, *args, until: str | None = None, timeout: float = 900) -> str:
    """``tool ARGS -t 2 --no-repack`` → everything it printed (stdout, then stderr); a non-zero exit raises
    :class:`LlamaToolError`.

    ``until``: text the output must contain (``"Same top p:"``, the last line of a ``--kl-divergence``
    summary). llama.cpp's logger prints from a queue on a thread that the process never joins
    (``common_log_main``, common/log.cpp:453-458: "logs may be lost if not flushed before the program
    exits", ggml-org/llama.cpp#22142), so the last lines of a run are sometimes lost; such a run is repeated,
    at most ``ATTEMPTS`` times — the numbers are the same each time, only their printing was lost.

    ``--no-repack``: llama.cpp's extra buffer types (the AMX / repacked weight layouts) stay off. On the
    Sapphire Rapids KVM guests this suite runs on, the batched AMX kernel dies with SIGILL (docs/numerics.md,
    "This machine's AMX and batched llama.cpp"), and llama-perplexity decodes whole chunks in one batch;
    the repacked layouts change no rounding point (the same section)."""
    argv = [str(tool), *map(str, args), "-t", str(THREADS), "--no-repack"]
    for _ in range(ATTEMPTS):
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=timeout)
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            tail = "\n".join(out.strip().splitlines()[-LOG_TAIL_LINES:])
            raise LlamaToolError(f"{' '.join(argv)} failed (exit code {proc.returncode}):\n{tail}")
        if until is None or until in out:
            return out
    raise LlamaToolError(f"{' '.join(argv)}: no {until!r} in its output after {ATTEMPTS} runs")


_NUMBER = r"-?(?:\d+(?:\.\d*)?|nan|inf)"
_STAT = re.compile(rf"^(?P<label>[A-Za-z0-9.%()/,\- Δ]+?)\s*:\s*(?P<value>{_NUMBER})\s*%?"
                   rf"(?:\s*±\s*(?P<unc>{_NUMBER})\s*%?)?\s*$")
_SUMMARY_START = "====== Perplexity statistics ======"


def kld_statistics(text: str) -> dict[str, tuple[float, float | None]]:
    """The labelled lines of a ``--kl-divergence`` summary: ``"Mean    KLD"`` → (value, uncertainty),
    ``"99.0%   KLD"`` → (value, None), ``"Same top p"`` → (percent, percent), …; labels keep their spacing
    (perplexity.cpp prints ``Mean    KLD`` and ``Median  KLD``)."""
    if _SUMMARY_START not in text:
        raise ValueError("no '====== Perplexity statistics ======' summary in the output")
    out = {}
    for line in text[text.index(_SUMMARY_START):].splitlines():
        m = _STAT.match(line.strip("\r"))
        if m:
            out[m["label"]] = (float(m["value"]), None if m["unc"] is None else float(m["unc"]))
    return out


def chunk_rows(text: str) -> list[list[float]]:
    """The running per-chunk table of ``--kl-divergence`` (perplexity.cpp:1854-1879): per chunk, the
    chunk number and the five value ± uncertainty pairs."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\s*(\d+)((?:\s+-?[\d.]+\s+±\s+-?[\d.]+(?:\s*%)?){5})\s*$", line)
        if m:
            rows.append([float(m[1])] + [float(v) for v in re.findall(r"-?\d+\.\d+", m[2])])
    return rows


def final_estimate(text: str) -> float:
    """The perplexity of a base run: ``Final estimate: PPL = X +/- Y`` (perplexity.cpp:647)."""
    m = re.search(r"Final estimate: PPL = ([\d.]+)", text)
    if m is None:
        raise ValueError("no 'Final estimate: PPL' line in the output")
    return float(m[1])
