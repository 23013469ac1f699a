"""``refimpl plot``: pictures of an audit, a telemetry CSV and a route trace (matplotlib, the
optional ``plot`` extra: ``pip install -e '.[plot]'``).

Each picture is made in two steps, so that what is drawn can be tested against its source:

1. a *series* function reads the input and returns plain numbers (:class:`AuditSeries`,
   :class:`TelemetrySeries`, :func:`route_counts`) — no matplotlib;
2. a *draw* function turns them into a Figure, one line or image per series.

* **audit** (:func:`audit_series`): along the stream, the oracle's top-1 − top-2 margin, the
  near-tie band (τ·max|logit|), and the stream token's deficit below the oracle's best; the first
  divergence marked, the stream's and the oracle's tokens written where they differ;
* **telemetry** (:func:`telemetry_series`): accepted/drafted per round, acceptance per draft
  position (rounds that accepted ≥ i+1 drafts / rounds that drafted ≥ i+1), MiB read per generated
  token per round, and the expert cache's hit rate per round (``stream_hits`` / ``stream_misses``
  columns, when the run had the streamer's counters);
* **routes** (:func:`route_counts`): how often each expert was selected, per layer — a heat map
  (trunk layers 0 … L−1, the MTP head as layer L), from ``run --route-trace``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from refimpl.errors import RefimplError

MIB = 1 << 20


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RefimplError("refimpl plot needs matplotlib: pip install 'refimpl[plot]' (or pip install matplotlib)") from None
    return plt


# ---- audit ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditSeries:
    tokens: list[int]  # the stream
    oracle: list[int]  # the oracle's argmax at each step, given the stream's history
    margin: list[float]  # top-1 − top-2
    band: list[float]  # τ·max|logit|
    deficit: list[float]  # the stream token's deficit below the top-1 (0 where it is the argmax)
    divergence: int | None  # first step the stream is not the oracle's argmax
    verdict: str


def audit_series(model, prompt: list[int], tokens: list[int], *, ctx=None, tau: float = 0.05) -> AuditSeries:
    """The oracle's view of every step of ``tokens``, teacher-forced (refimpl.oracle.golden.walk)."""
    from refimpl.oracle.audit import Stream, audit
    from refimpl.oracle.golden import start, walk
    from refimpl.model.ops import Ctx

    ctx = ctx or Ctx()
    rows: dict[str, list] = {"oracle": [], "margin": [], "band": [], "deficit": []}

    def on_row(i, row):
        top = np.sort(row)[-2:]
        rows["oracle"].append(int(np.argmax(row)))
        rows["margin"].append(float(top[1] - top[0]))
        rows["band"].append(tau * float(np.max(np.abs(row))))
        rows["deficit"].append(float(top[1] - row[tokens[i]]))

    walk(model, start(model, prompt, ctx), list(tokens), ctx, on_row)
    rep = audit(model, prompt, Stream("A", "plot", "json", list(tokens)), ctx=ctx, tau=tau)
    div = next((i for i, (a, b) in enumerate(zip(tokens, rows["oracle"])) if a != b), None)
    return AuditSeries(list(tokens), rows["oracle"], rows["margin"], rows["band"], rows["deficit"], div, rep.verdict)


def draw_audit(s: AuditSeries, title: str = "", piece=None):
    """``piece``: token id → its text (the model's tokenizer), to label the differing steps with words
    rather than ids."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(11, 3.6))
    x = np.arange(len(s.tokens))
    ax.fill_between(x, 0, s.band, color="0.85", label="near-tie band (τ·max|logit|)", step="mid")
    ax.plot(x, s.margin, "o-", ms=3, color="tab:blue", label="oracle margin (top-1 − top-2)")
    ax.plot(x, s.deficit, "x", ms=6, color="tab:red", label="stream token's deficit")
    if s.divergence is not None:
        ax.axvline(s.divergence, ymax=1 / 1.3, color="tab:red", ls="--", lw=1, label=f"first divergence: {s.verdict}")  # below the labels
    top = max(max(s.margin), max(s.deficit), max(s.band)) if s.tokens else 1.0
    label = (lambda t: repr(piece(t))) if piece is not None else str
    last, lift = -9, 0.0
    for i, (a, o) in enumerate(zip(s.tokens, s.oracle)):
        if a != o:
            lift = 0.12 if i - last <= 2 and lift == 0 else 0.0  # stagger neighbouring labels
            ax.annotate(f"{label(a)}\n({label(o)})", (i, top * (1.02 + lift)), ha="center", va="bottom", fontsize=6, color="tab:red")
            last = i
    ax.set_xlabel("generated step (stream token, with the oracle's argmax in brackets where they differ)")
    ax.set_ylabel("logits")
    ax.set_ylim(0, top * 1.3)
    ax.set_title(title or "audit: margin along the stream")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # outside: the labels need the top
    fig.tight_layout()
    return fig


# ---- telemetry -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TelemetrySeries:
    accepted: list[int]  # per round
    drafted: list[int | None]  # per round (None when the CSV cannot say: no drafts column, a correction)
    tokens: list[int]  # tokens confirmed per round
    per_position: list[float]  # [i]: rounds that accepted ≥ i+1 / rounds that drafted ≥ i+1
    mib_per_token: list[float | None]  # per round: bytes_read / tokens, in MiB
    hit_rate: list[float | None]  # per round: stream_hits / (hits + misses)


def telemetry_series(path) -> TelemetrySeries:
    """Per-round numbers from a telemetry CSV (refimpl.decode.telemetry's layout)."""
    from refimpl.decode.telemetry import read_csv

    head, rows, _ = read_csv(path)
    if not rows or "step" not in rows[0] or "kind" not in rows[0]:
        raise RefimplError(f"{path}: not a telemetry CSV (needs 'step' and 'kind' columns; refimpl run --mtp --csv FILE)")
    rounds: list[list[dict]] = []
    for r in rows:
        if not rounds or r["step"] != rounds[-1][0]["step"]:
            rounds.append([])
        rounds[-1].append(r)
    accepted, drafted, tokens, mib, hits = [], [], [], [], []
    for g in rounds:
        kinds = [r["kind"] for r in g]
        a = kinds.count("draft")
        ids = (g[0].get("drafts") or "").split()
        n = len(ids) if ids or kinds[-1] == "plain" else a if kinds[-1] == "bonus" else None
        accepted.append(a)
        drafted.append(n)
        tokens.append(len(g))
        b = g[0].get("bytes_read") or ""
        mib.append(int(b) / MIB / len(g) if b.strip() else None)
        h, m = g[0].get("stream_hits"), g[0].get("stream_misses")
        hits.append(int(h) / (int(h) + int(m)) if h and m and int(h) + int(m) > 0 else None)
    depth = max((n for n in drafted if n), default=0)
    per_pos = []
    for i in range(depth):
        tried = sum(1 for n in drafted if n is not None and n > i)
        per_pos.append(sum(1 for a, n in zip(accepted, drafted) if n is not None and n > i and a > i) / tried if tried else 0.0)
    return TelemetrySeries(accepted, drafted, tokens, per_pos, mib, hits)


def draw_telemetry(s: TelemetrySeries, title: str = ""):
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 6))
    x = np.arange(len(s.accepted))
    ax = axes[0, 0]
    ax.bar(x, [n if n is not None else 0 for n in s.drafted], color="0.8", label="drafted")
    ax.bar(x, s.accepted, color="tab:green", label="accepted")
    ax.set(title="drafts per round", xlabel="round", ylabel="tokens")
    ax.legend(fontsize=7)
    ax = axes[0, 1]
    ax.bar(np.arange(1, len(s.per_position) + 1), s.per_position, color="tab:green")
    ax.set(title="acceptance per draft position", xlabel="draft position i", ylabel="accepted / drafted", ylim=(0, 1))
    ax = axes[1, 0]
    ax.plot(x, [np.nan if v is None else v for v in s.mib_per_token], "o-", ms=3, color="tab:blue")
    ax.set(title="MiB read per generated token", xlabel="round", ylabel="MiB / token")
    ax = axes[1, 1]
    ax.plot(x, [np.nan if v is None else v for v in s.hit_rate], "o-", ms=3, color="tab:purple")
    ax.set(title="expert cache hit rate", xlabel="round", ylabel="hits / (hits + misses)", ylim=(0, 1.05))
    fig.suptitle(title or "speculative telemetry")
    fig.tight_layout()
    return fig


# ---- route trace ---------------------------------------------------------------------------------


def route_counts(path) -> tuple[np.ndarray, list[str]]:
    """counts [layers, experts]: how often each expert was selected in each layer (every row of the
    route trace: trunk layers, then the MTP head's layer), and a label per layer."""
    from refimpl.io.route_trace import read_route_trace

    rows = read_route_trace(path)
    if not rows:
        raise RefimplError(f"{path}: the route trace holds no rows")
    layers = sorted({(r["kind"] == "head", r["layer"]) for r in rows})
    n_exp = max(max(r["experts"]) for r in rows) + 1
    index = {k: i for i, k in enumerate(layers)}
    counts = np.zeros((len(layers), n_exp), dtype=np.int64)  # [layers, experts]
    for r in rows:
        for e in r["experts"]:
            counts[index[(r["kind"] == "head", r["layer"])], e] += 1
    return counts, [f"head {il}" if head else f"layer {il}" for head, il in layers]


def draw_routes(counts: np.ndarray, labels: list[str], title: str = ""):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 0.35 * counts.shape[1] + 2), 0.45 * counts.shape[0] + 1.5))
    im = ax.imshow(counts, aspect="auto", cmap="viridis")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("expert")
    ax.set_title(title or "expert use per layer (selections)")
    fig.colorbar(im, ax=ax, label="selections")
    fig.tight_layout()
    return fig


def save(fig, out) -> None:
    fig.savefig(out, dpi=90, format="png")  # PNG whatever the file is called (--out PNG)
    _pyplot().close(fig)
