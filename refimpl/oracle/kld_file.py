"""llama-perplexity's KL-divergence base file, read and written byte for byte.

``llama-perplexity -m BASE.gguf -f TEXT --kl-divergence-base FILE`` saves the log-probabilities of a run
over a token corpus; ``llama-perplexity -m OTHER.gguf --kl-divergence-base FILE --kl-divergence`` scores
another model against them. The layout, as ``tools/perplexity/perplexity.cpp`` of the llama.cpp
vendored in llama-cpp-python 0.3.36 writes it (``perplexity()``, lines 466-467 and 521-523) and reads it
(``kl_divergence()``, lines 1683-1720); every number little-endian, as the x86/ARM hosts write them::

    char     magic[8]  = "_logits_"
    int32    n_ctx                      (written as int32_t, read back as uint32_t)
    int32    n_vocab
    int32    n_chunk
    int32    tokens[n_chunk * n_ctx]    the corpus as tokenized, BOS not substituted (lines 523, 564-579)
    then per chunk, n_ctx - 1 - n_ctx/2 rows (the scored positions first .. n_ctx-2, first = n_ctx/2:
    the first half of a chunk is context only, lines 540 and 608-617), each row nv uint16 words,
    nv = 2*((n_vocab + 1)/2) + 4 (lines 147, 1732):
        float32  scale                  words 0-1
        float32  min_log_prob           words 2-3
        uint16   q[n_vocab]             log p[i] ≈ scale*q[i] + min_log_prob
        uint16   0                      padding to an even count when n_vocab is odd (never written: 0)

A row is llama.cpp's ``log_softmax(n_vocab, logits, log_prob, tok)`` (lines 79-106): the log-probs are
clamped from below at max_logit - 16 (a probability below e^-16 counts as 0 in the KL sum, line 230)
and spread over 0..65535 with ``nearest_int`` (lines 72-77: round half to even). :func:`quantize_rows`
repeats it with numpy's float32 arithmetic where the C code uses float and float64 where it uses
double; it equals llama.cpp's row for the same logits up to the last code (1 step in 65535), where
llama.cpp's build contracts ``inv_scale*(x - min) + 12582912.f`` into one FMA or sums ``expf`` in
another order.

:func:`read_kld_base` checks everything before using it — magic, counts, size, vocabulary, token ids,
row headers — and refuses a damaged file in one line (:class:`RefimplError`); llama-perplexity itself
only logs some of these (a vocabulary mismatch, line 1713) and reads on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from refimpl.errors import RefimplError

MAGIC = b"_logits_"  # perplexity.cpp:466
HEADER_BYTES = len(MAGIC) + 3 * 4  # magic, n_ctx, n_vocab, n_chunk
LOG_PROB_RANGE = 16.0  # log-probs below max - 16 are clamped (perplexity.cpp:86) and left out of the KL sum (:230)
Q_MAX = 65535.0  # perplexity.cpp:93


def row_words(n_vocab: int) -> int:
    """uint16 words per row: the two float32 of the row header, then n_vocab codes padded to an even
    count (perplexity.cpp:147)."""
    return 2 * ((n_vocab + 1) // 2) + 4


def first_scored(n_ctx: int) -> int:
    """The first scored position of a chunk; the ones before it are context (perplexity.cpp:540)."""
    return n_ctx // 2


def n_scored(n_ctx: int) -> int:
    """Scored positions (rows) per chunk: first .. n_ctx-2, each predicting the next token
    (perplexity.cpp:613, ``n_ctx - 1 - first``)."""
    return n_ctx - 1 - first_scored(n_ctx)


def quantize_rows(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's ``log_softmax(n_vocab, logits, log_prob, tok)`` (perplexity.cpp:79-106) on R rows:
    (uint16 [R, nv] rows of the file, float64 [R] negative log-likelihoods of ``targets`` — the value
    it returns, summed for the "Final estimate: PPL" line)."""
    x = np.ascontiguousarray(logits, dtype=np.float32)
    rows, n_vocab = x.shape
    max_logit = x.max(axis=1)
    min_logit = np.maximum(x.min(axis=1), max_logit - np.float32(LOG_PROB_RANGE))  # :86
    sum_exp = np.exp(x - max_logit[:, None]).astype(np.float64).sum(axis=1)  # :87-90, expf summed in double
    log_sum_exp = np.log(sum_exp).astype(np.float32)  # :91, float log_sum_exp = log(sum_exp)
    min_log_prob = min_logit - max_logit - log_sum_exp  # :92
    scale = (max_logit - min_logit) / np.float32(Q_MAX)  # :93
    out = np.zeros((rows, row_words(n_vocab)), dtype=np.uint16)
    out[:, 0:2] = scale.astype("<f4")[:, None].view(np.uint16)  # :95, d[0] = scale
    out[:, 2:4] = min_log_prob.astype("<f4")[:, None].view(np.uint16)  # :96, d[1] = min_log_prob
    with np.errstate(divide="ignore", invalid="ignore"):
        inv_scale = np.where(scale != 0, np.float32(1) / scale, np.float32(0))  # :99; scale 0: all codes 0 (:104)
        codes = np.rint(inv_scale[:, None] * (x - min_logit[:, None]))  # nearest_int (:72-77): half to even
    codes = np.where(x > min_logit[:, None], codes, 0)  # :101
    out[:, 4 : 4 + n_vocab] = np.nan_to_num(codes).astype(np.int64).astype(np.uint16)  # int → uint16 as C converts
    picked = x[np.arange(rows), targets]
    nll = (max_logit + log_sum_exp - picked).astype(np.float64)  # :106, float, returned as double
    return out, nll


def dequantize(rows: np.ndarray, n_vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scale float32 [R], min_log_prob float32 [R], log p float32 [R, n_vocab]) of file rows: the
    reader's ``scale*base_log_prob[i] + min_log_prob`` (perplexity.cpp:205-208, 225)."""
    head = np.ascontiguousarray(rows[:, :4]).view("<f4")
    scale, min_log_prob = head[:, 0].astype(np.float32), head[:, 1].astype(np.float32)
    return scale, min_log_prob, scale[:, None] * rows[:, 4 : 4 + n_vocab].astype(np.float32) + min_log_prob[:, None]


def write_kld_base(f, n_ctx: int, n_vocab: int, tokens: np.ndarray) -> None:
    """Write the header and the tokens to the open binary file ``f`` (perplexity.cpp:466-467, 521-523);
    the rows follow, chunk after chunk (``f.write(rows.tobytes())``, :172)."""
    n_chunk = len(tokens) // n_ctx
    f.write(MAGIC)
    f.write(np.array([n_ctx, n_vocab, n_chunk], dtype="<i4").tobytes())
    f.write(np.asarray(tokens[: n_chunk * n_ctx], dtype="<i4").tobytes())


@dataclass(frozen=True)
class KldBase:
    """A base file, checked: ``tokens`` int32 [n_chunk * n_ctx]; ``rows`` uint16 [n_chunk, n_scored, nv],
    a read-only memory map."""

    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray
    rows: np.ndarray

    @property
    def first(self) -> int:
        return first_scored(self.n_ctx)

    @property
    def n_scored(self) -> int:
        return n_scored(self.n_ctx)

    def chunk_tokens(self, c: int) -> np.ndarray:
        return self.tokens[c * self.n_ctx : (c + 1) * self.n_ctx]

    def targets(self, c: int) -> np.ndarray:
        """The tokens chunk c's rows predict: positions first+1 .. n_ctx-1 (perplexity.cpp:1849, tokens[i+1])."""
        return self.chunk_tokens(c)[self.first + 1 :]


def read_kld_base(path: str | os.PathLike, n_vocab: int) -> KldBase:
    """The base file at ``path``, checked against a model of ``n_vocab`` tokens; a file llama-perplexity
    would not read, or would misread, is refused in one line."""
    p = Path(path)
    what = f"--kld-base {p}"
    if not p.is_file():
        raise RefimplError(f"{what}: {'is a directory' if p.is_dir() else 'no such file'}")
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError as exc:
        raise RefimplError(f"{what}: cannot read it ({exc.strerror or exc})") from None
    if head[: len(MAGIC)] != MAGIC and not MAGIC.startswith(head):
        raise RefimplError(f"{what}: not a llama-perplexity KL-divergence base file (magic {head[:8]!r}, expected {MAGIC!r})")
    if len(head) < HEADER_BYTES:
        raise RefimplError(f"{what}: truncated header ({size} bytes; the header alone has {HEADER_BYTES})")
    n_ctx, file_vocab, n_chunk = (int(v) for v in np.frombuffer(head, dtype="<i4", offset=len(MAGIC)))
    if n_ctx < 3:
        raise RefimplError(f"{what}: n_ctx {n_ctx} scores no position (a chunk scores positions n_ctx/2 .. n_ctx-2; n_ctx ≥ 3)")
    if file_vocab != n_vocab:
        raise RefimplError(f"{what}: vocabulary of {file_vocab} tokens, the model has {n_vocab} (a base file of another model)")
    if n_chunk < 1:
        raise RefimplError(f"{what}: n_chunk {n_chunk}: no chunk to score")
    nv, scored = row_words(n_vocab), n_scored(n_ctx)
    tokens_at, rows_at = HEADER_BYTES, HEADER_BYTES + 4 * n_chunk * n_ctx
    expected = rows_at + 2 * n_chunk * scored * nv  # Python integers: absurd counts cannot overflow
    if size != expected:
        raise RefimplError(f"{what}: {'truncated' if size < expected else 'trailing bytes'}: the header (n_ctx {n_ctx}, "
                           f"n_vocab {n_vocab}, n_chunk {n_chunk}) makes {expected} bytes, the file has {size}")
    try:
        data = np.memmap(p, mode="r", dtype=np.uint8)
    except (OSError, ValueError) as exc:
        raise RefimplError(f"{what}: cannot map the file ({exc})") from None
    tokens = data[tokens_at:rows_at].view("<i4")
    bad = np.flatnonzero((tokens < 0) | (tokens >= n_vocab))
    if bad.size:
        i = int(bad[0])
        raise RefimplError(f"{what}: token {i} (chunk {i // n_ctx}, position {i % n_ctx}) is {int(tokens[i])}, "
                           f"outside the vocabulary [0, {n_vocab})")
    rows = data[rows_at:].view("<u2").reshape(n_chunk, scored, nv)
    row_head = np.ascontiguousarray(rows[:, :, :4]).view("<f4")  # [n_chunk, scored, 2]: scale, min_log_prob
    scale, min_log_prob = row_head[..., 0], row_head[..., 1]
    # llama.cpp writes 0 ≤ scale ≤ 16/65535 (up to the rounding of max - 16) and a finite min_log_prob ≤ 0
    # (perplexity.cpp:86-96); a NaN or infinite row header would turn every statistic into NaN
    broken = ~(np.isfinite(scale) & np.isfinite(min_log_prob) & (scale >= 0) & (scale <= 2 * LOG_PROB_RANGE / Q_MAX)
               & (min_log_prob <= 0))
    if broken.any():
        c, r = (int(v) for v in np.argwhere(broken)[0])
        raise RefimplError(f"{what}: chunk {c}, row {r} (position {first_scored(n_ctx) + r}): scale {float(scale[c, r]):g}, "
                           f"min_log_prob {float(min_log_prob[c, r]):g} is not a row llama.cpp writes "
                           f"(0 ≤ scale ≤ 2·{LOG_PROB_RANGE:g}/{Q_MAX:g}, finite min_log_prob ≤ 0)")
    return KldBase(p, n_ctx, n_vocab, n_chunk, tokens, rows)
