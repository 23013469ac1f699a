"""The oracle and llama-perplexity's KL-divergence runs, both ways (docs/validating-an-engine.md,
"llama-perplexity").

* :func:`write_base` — the oracle as llama-perplexity's *base*: ``refimpl logits MODEL --kld-base OUT
  --text FILE`` writes the file ``llama-perplexity -m BASE.gguf -f FILE --kl-divergence-base OUT`` would,
  from the oracle's logits, so that ``llama-perplexity -m ENGINE.gguf --kl-divergence-base OUT
  --kl-divergence`` scores any llama.cpp-loadable engine file against the oracle.
* :func:`score_base` — the oracle as llama-perplexity's *Q* (its ``-m`` model): ``refimpl audit MODEL
  --kld-base FILE`` reads a base file llama.cpp (or an engine) wrote and computes, per scored position,
  what ``llama-perplexity -m MODEL --kl-divergence-base FILE --kl-divergence`` computes from llama.cpp's
  logits (:mod:`refimpl.oracle.kld_report` prints the statistics).

Both run llama-perplexity's chunking (``tools/perplexity/perplexity.cpp`` of llama-cpp-python 0.3.36):
the text is read whole with one trailing newline dropped (``common/arg.cpp:1807``), tokenized with the
special tokens added and special-token text not parsed (``common_tokenize(ctx, params.prompt, true)``,
perplexity.cpp:473; BOS only when the GGUF asks); it must give at least 2·n_ctx tokens (:478); it is cut
into n_chunk = ⌊tokens / n_ctx⌋ chunks (:491, at most ``--chunks``, :493); each chunk is a fresh sequence
(the memory cleared, :551) whose first token is replaced by BOS when the vocabulary adds one (:564-579);
positions n_ctx/2 .. n_ctx-2 are scored, each against the next token (:540, :608-617).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from refimpl.errors import RefimplError
from refimpl.oracle.golden_run import CHUNK  # positions per forward call (batch-invariant)
from refimpl.oracle.kld_file import KldBase, LOG_PROB_RANGE, dequantize, first_scored, quantize_rows, write_kld_base


#: Rows of logits handled at once: bounds the float32 temporaries at ROW_BLOCK × n_vocab (a real model's
#: 248,320-token vocabulary: 32 MB each).
ROW_BLOCK = 32


def corpus_tokens(path, tokenizer) -> list[int]:
    """The ids llama-perplexity evaluates for the text file ``path`` (``-f``): read whole, one trailing
    newline dropped (common/arg.cpp:1804-1809), tokenized with add_special = true, parse_special = false
    (perplexity.cpp:473)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise RefimplError(f"--text {p}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RefimplError(f"--text {p}: not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None
    if text.endswith("\n"):
        text = text[:-1]
    return tokenizer.encode(text, parse_special=False)


def chunking(n_tokens: int, n_ctx: int, max_chunks: int | None, source: str) -> int:
    """n_chunk for a corpus of ``n_tokens`` (perplexity.cpp:478-493), or a one-line refusal."""
    if n_ctx < 3:
        raise RefimplError(f"--ctx {n_ctx}: a chunk scores positions n_ctx/2 .. n_ctx-2, so n_ctx must be at least 3")
    if max_chunks is not None and max_chunks < 1:
        raise RefimplError(f"--chunks {max_chunks}: at least one chunk")
    if n_tokens < 2 * n_ctx:
        raise RefimplError(f"{source} tokenizes to {n_tokens} tokens; a context of {n_ctx} needs at least {2 * n_ctx} "
                           "(llama-perplexity's rule: at least two chunks)")
    n_chunk = n_tokens // n_ctx
    return n_chunk if max_chunks is None else min(max_chunks, n_chunk)


def _chunk_input(tokens: np.ndarray, tokenizer) -> list[int]:
    """A chunk's tokens as llama-perplexity decodes them: the first replaced by BOS when the vocabulary
    adds one (perplexity.cpp:564-579; the file keeps the original, :523)."""
    ids = [int(t) for t in tokens]
    if tokenizer.add_bos and tokenizer.bos_id is not None:
        ids[0] = tokenizer.bos_id
    return ids


def chunk_logits(model, tokens: np.ndarray, tokenizer, ctx):
    """Yield (row offset, logits float32 [≤ ROW_BLOCK, V]) of one chunk's scored positions (first .. n_ctx-2,
    row 0 = position first), in blocks; the chunk is a fresh sequence. The context half is run without
    the output head (refimpl.model.trunk.forward: the numbers do not depend on ``outputs``)."""
    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward

    ids, first = _chunk_input(tokens, tokenizer), first_scored(len(tokens))
    state = SeqState.fresh(model.config)
    for i in range(0, first, CHUNK):
        _, _, state = forward(model, state, ids[i : min(first, i + CHUNK)], ctx, outputs="none")
    scored = len(tokens) - 1 - first
    for i in range(first, first + scored, CHUNK):
        logits, _, state = forward(model, state, ids[i : min(first + scored, i + CHUNK)], ctx)
        for r in range(0, len(logits), ROW_BLOCK):
            yield i - first + r, logits[r : r + ROW_BLOCK]


@dataclass(frozen=True)
class BaseWritten:
    n_ctx: int
    n_chunk: int
    n_tokens: int
    nll: np.ndarray  # float64 [n_chunk * n_scored]: the oracle's negative log-likelihood at each scored position

    def final_estimate(self) -> str:
        """llama-perplexity's closing line for the base run (perplexity.cpp:641-650)."""
        count, nll = len(self.nll), float(np.mean(self.nll))
        nll2 = float(np.mean(self.nll**2)) - nll * nll
        ppl = np.exp(nll)
        if nll2 <= 0 or count < 2:
            return f"Final estimate: PPL = {ppl:.4f} (no uncertainty: the negative log-likelihoods do not vary)"
        return f"Final estimate: PPL = {ppl:.4f} +/- {np.sqrt(nll2 / (count - 1)) * ppl:.5f}"


def write_base(f, model, tokenizer, tokens: list[int], n_ctx: int, n_chunk: int, ctx, progress=None) -> BaseWritten:
    """Write llama-perplexity's base file of the oracle to the open binary file ``f``: header and tokens,
    then each chunk's rows (perplexity.cpp:521-523, 608-614)."""
    corpus = np.asarray(tokens[: n_chunk * n_ctx], dtype=np.int32)
    write_kld_base(f, n_ctx, model.config.n_vocab, corpus)
    first, nll = first_scored(n_ctx), []
    for c in range(n_chunk):
        chunk = corpus[c * n_ctx : (c + 1) * n_ctx]
        for r, logits in chunk_logits(model, chunk, tokenizer, ctx):
            rows, row_nll = quantize_rows(logits, chunk[first + 1 + r : first + 1 + r + len(logits)])
            f.write(rows.tobytes())
            nll.append(row_nll)
        if progress is not None:
            progress(c + 1)
    return BaseWritten(n_ctx, n_chunk, len(tokens), np.concatenate(nll))


# ---- the oracle as Q -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Scored:
    """Per scored position (N = n_chunk × n_scored, chunk-major), what llama-perplexity's
    ``log_softmax(n_vocab, logits, base_log_prob, tok, kld)`` (perplexity.cpp:191-252) computes with the
    oracle's logits as Q's: float32 where it uses float, float64 where it uses double."""

    base: KldBase
    target: np.ndarray  # int32 [N]: the token each position predicts
    nll: np.ndarray  # float32: Q's (the oracle's) −log p(target)
    nll_base: np.ndarray  # float32: the base file's −log p(target)
    kld: np.ndarray  # float64: Σ_i p_base(i)·(log p_base(i) − log q(i)) over p_base(i) > e^-16
    p_diff: np.ndarray  # float32: q(target) − p_base(target)
    top: np.ndarray  # int32: the oracle's argmax
    top_base: np.ndarray  # int32: the base file's argmax
    disagreements: list  # (index, refimpl.oracle.audit.Position) where top != top_base, judged by the near-tie rule

    @property
    def count(self) -> int:
        return len(self.kld)

    def where(self, i: int) -> tuple[int, int]:
        """(chunk, position in the chunk of the predicted token) of scored position ``i``."""
        c, r = divmod(int(i), self.base.n_scored)
        return c, self.base.first + 1 + r


def _kld_rows(x: np.ndarray, rows: np.ndarray, target: np.ndarray, n_vocab: int):
    """perplexity.cpp:191-252 on a block of rows: (nll, nll_base, kld, p_diff, top, top_base)."""
    max_logit, top = x.max(axis=1), x.argmax(axis=1)  # :192-199, the first maximum
    sum_exp = np.exp(x - max_logit[:, None]).astype(np.float64).sum(axis=1)  # :200-203
    log_sum_exp = np.log(sum_exp).astype(np.float32)  # :204
    scale, min_log_prob, log_p_base = dequantize(rows, n_vocab)  # :205-208 and 225, scale*q + min_log_prob
    picked = np.arange(len(x))
    nll = max_logit + log_sum_exp - x[picked, target]  # :210
    nll_base = -log_p_base[picked, target]  # :214
    shifted = max_logit + log_sum_exp  # :220
    top_base = log_p_base.argmax(axis=1)  # :224-229, the first maximum
    kept = log_p_base > np.float32(-LOG_PROB_RANGE)  # :230
    terms = np.exp(log_p_base) * (log_p_base - x + shifted[:, None])  # :231-232, float
    kld = np.where(kept, terms, np.float32(0)).astype(np.float64).sum(axis=1)  # :232, summed in double
    p_diff = np.exp(-nll) - np.exp(-nll_base)  # :242-244
    return nll, nll_base, kld, p_diff, top, top_base


def score_base(base: KldBase, model, tokenizer, ctx, tau: float, progress=None) -> Scored:
    """The oracle (on ``model``) as llama-perplexity's Q against ``base``, every scored position; where the
    two argmaxes differ, the base's top token is judged by the oracle's near-tie rule
    (:func:`refimpl.oracle.audit.judge`, τ = ``tau``)."""
    from refimpl.oracle.golden import check_tau

    check_tau(tau)
    return score_logits(base, lambda c: chunk_logits(model, base.chunk_tokens(c), tokenizer, ctx), tau, progress)


def score_logits(base: KldBase, logits_of, tau: float, progress=None) -> Scored:
    """:func:`score_base` with Q's logits from ``logits_of(chunk)``, an iterable of (row offset, logits
    [R, V]) over the chunk's scored positions — the oracle's, or any other model's (log-probabilities
    are logits too: tests/test_kld_llama.py feeds llama.cpp's own from its base file)."""
    from refimpl.oracle.audit import judge

    parts, disagreements = [], []
    for c in range(base.n_chunk):
        targets = base.targets(c)
        for r, x in logits_of(c):
            rows = np.asarray(base.rows[c, r : r + len(x)])
            vals = _kld_rows(np.asarray(x, dtype=np.float32), rows, targets[r : r + len(x)], base.n_vocab)
            for j in np.flatnonzero(vals[4] != vals[5]):
                disagreements.append((c * base.n_scored + r + int(j), judge(x[j], (int(vals[5][j]),), tau)))
            parts.append(vals)
        if progress is not None:
            progress(c + 1)
    nll, nll_base, kld, p_diff, top, top_base = (np.concatenate(v) for v in zip(*parts))
    target = np.concatenate([base.targets(c) for c in range(base.n_chunk)]).astype(np.int32)
    return Scored(base, target, nll, nll_base, kld, p_diff, top.astype(np.int32), top_base.astype(np.int32), disagreements)


def progress_bar(total: int, desc: str):
    """A tqdm bar on stderr over ``total`` chunks (hidden when stderr is not a terminal), as ``refimpl
    logits`` shows one; returns (bar, update(n_done))."""
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="chunk", file=sys.stderr, disable=None, leave=False)
    return bar, lambda done: bar.update(done - bar.n)
