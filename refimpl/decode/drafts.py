"""Step 11: draft sources — who proposes the tokens the trunk then verifies
(``common/speculative.cpp``; docs/speculative.md, "The draft sources").

A draft source has the four hooks of llama.cpp's ``common_speculative_impl``
(``common/speculative.cpp``), with its state made explicit — every hook takes the source's state and
returns a new one, never mutating it::

    start()                            -> state           fresh, before the prompt
    process(state, tokens, h_tgt)      -> state           the target just decoded ``tokens``
                                                          (prompt, plain step or verify batch);
                                                          h_tgt [T, E] = its h_nextn rows
    draft(state, req)                  -> (drafts, state) propose ≤ req.n_max tokens after req.id_last
    accept(state, n_accepted, n_past)  -> state           n_accepted drafts were kept; the target now
                                                          holds n_past positions

The loop (:mod:`refimpl.decode.speculative`) calls them in llama.cpp's order: draft → verify → process →
accept. Three sources live here: :class:`DraftSource` itself (drafts nothing: plain decoding through
the same loop), :class:`MTPSource` (the model's own nextn head, ``common_speculative_impl_draft_mtp``)
and :class:`NgramSource` (prompt lookup over token ids, :func:`ngram_draft`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from refimpl.model.mtp import MTPState, load_mtp_weights, mtp_forward
from refimpl.model.ops import Ctx, argmax
from refimpl.model.state import read_only

F32 = np.float32
DRAFT_TOP_K = 10  # the MTP draft sampler is top_k(10) (common_speculative_impl_draft_mtp ctor)
NGRAM_MAX_MATCH = 12  # llama.cpp's ngram-simple default lookup length (common.h, size_n = 12)


@dataclass(frozen=True)
class DraftRequest:
    """What a source may look at: ``history`` = prompt + confirmed tokens, ending with ``id_last``
    (confirmed but not yet decoded by the target, at position ``pos0 = len(history) − 1``)."""

    history: tuple[int, ...]
    n_max: int

    @property
    def id_last(self) -> int:
        return self.history[-1]

    @property
    def pos0(self) -> int:
        return len(self.history) - 1


class DraftSource:
    """Drafts nothing: every step takes the plain single-token path. Base class of the others."""

    name = "none"

    def start(self):
        return None

    def process(self, state, tokens, h_tgt: np.ndarray):
        return state

    def draft(self, state, req: DraftRequest) -> tuple[list[int], object]:
        return [], state

    def accept(self, state, n_accepted: int, n_past: int):
        return state



# --------------------------------------------------------------------------------------------------
# MTP: the nextn head drafts, one token per head call.


def top_k_p(logits: np.ndarray, k: int = DRAFT_TOP_K) -> float:
    """p of the most likely token after ``top_k(k)``: softmax over the k largest logits only
    (``llama_sampler_top_k`` then ``llama_sampler_softmax_impl``, float32: p = e^0 / Σ e^(l−max)).
    logits [V] -> float."""
    x = logits.astype(F32)  # [V]
    top = np.sort(np.partition(x, x.size - k)[-k:] if k < x.size else x)[-k:]  # [k]: the k largest, ascending
    return float(F32(1.0) / np.sum(np.exp(top - top[-1]), dtype=F32))


@dataclass(frozen=True)
class MTPDraftState:
    """The drafter's memory (``common_speculative_impl_draft_mtp``'s members, per sequence):

    * ``mtp``: the head's own KV cache (the MTP context's ``llama_memory``);
    * ``pending_h`` [E]: the target h_nextn that pairs with the next token fed to the head — the
      row of position pos0 − 1 (zeros before the first token, as the C++ constructor sets it);
    * ``verify_h`` [R, E]: the target rows of the last batch (R = 1 + drafts), kept for accept().
    """

    mtp: MTPState
    pending_h: np.ndarray
    verify_h: np.ndarray

    __post_init__ = read_only  # its arrays read-only, as every state record's (refimpl.model.state)


class MTPSource(DraftSource):
    """Drafts with the model's MTP (nextn) head, exactly as ``common_speculative_impl_draft_mtp``.

    * draft: step 0 feeds (id_last, pos0, pending_h); step i ≥ 1 feeds (d_i, pos0+i, h'_{i−1}),
      the head's own h_nextn of the step before. d_{i+1} = argmax (lowest id on ties); drafting stops
      before adding a token whose top-10 probability is < ``p_min``, or after ``req.n_max`` tokens.
      The draft-time KV entries are then dropped (``llama_memory_seq_rm(ctx_dft, pos0, −1)``): the
      returned state is the state drafting started from.
    * process: the head catches up on *every* row the target decoded — row k is fed token k and the
      target h of row k−1, row 0 gets ``pending_h`` (``process()``; for a verify batch that includes
      the rows about to be rejected, which ``accept`` then truncates, as the C++ caller's
      ``llama_memory_seq_rm(ctx_dft, n_past, −1)`` does).
    * accept: pending_h ← verify_h[min(n_accepted, R−1)]; KV truncated to n_past.
    """

    name = "mtp"

    def __init__(self, model, ctx: Ctx = Ctx(), p_min: float = 0.0):
        self.model, self.ctx, self.p_min = model, ctx, float(p_min)
        self.weights = load_mtp_weights(model.file, model.weights)  # one-line RefimplError if stripped

    def start(self) -> MTPDraftState:
        c = self.model.config
        return MTPDraftState(MTPState.fresh(c), np.zeros(c.n_embd, dtype=F32), np.zeros((0, c.n_embd), dtype=F32))

    def process(self, state: MTPDraftState, tokens, h_tgt: np.ndarray) -> MTPDraftState:
        h_in = np.concatenate([state.pending_h[None, :], h_tgt[:-1]])  # [T, E]: row k ← target row k−1
        h_in = self.ctx.cb("mtp.catchup_h", -1, h_in, h_tgt=h_tgt)
        _, _, mtp = mtp_forward(self.model, self.weights, state.mtp, tokens, h_in, self.ctx, outputs="none")
        return MTPDraftState(mtp=mtp, pending_h=h_tgt[-1], verify_h=h_tgt)

    def draft(self, state: MTPDraftState, req: DraftRequest) -> tuple[list[int], MTPDraftState]:
        return self.draft_rows(state, req)[0], state

    def draft_rows(self, state: MTPDraftState, req: DraftRequest) -> tuple[list[int], list[np.ndarray]]:
        """:meth:`draft`'s drafts and the head's logits row [V] of every step it ran (one more than
        the drafts when the p_min cut stopped it) — the round audit judges near-ties on them."""
        assert state.mtp.n_past == req.pos0, "the head must hold exactly the positions before id_last"
        mtp, tok, h = state.mtp, req.id_last, state.pending_h[None, :]  # h [1, E]
        drafts: list[int] = []
        rows: list[np.ndarray] = []
        while len(drafts) < req.n_max:
            logits, h, mtp = mtp_forward(self.model, self.weights, mtp, [tok], h, self.ctx)  # [1, V], [1, E]
            rows.append(logits[0])
            tok = argmax(logits[0])
            if top_k_p(logits[0]) < self.p_min:
                break
            drafts.append(tok)
        return drafts, rows

    def accept(self, state: MTPDraftState, n_accepted: int, n_past: int) -> MTPDraftState:
        i_h = min(n_accepted, len(state.verify_h) - 1)
        mtp = self.ctx.cb("mtp.accept", -1, state.mtp.truncate(n_past), before=state.mtp, n_past=n_past)
        return MTPDraftState(mtp=mtp, pending_h=state.verify_h[i_h], verify_h=state.verify_h)


def mtp_catchup_logits(model, tokens, h_tgt: np.ndarray, ctx: Ctx = Ctx()) -> np.ndarray:
    """The head's logits for rows p = 0 … T−1 fed as catch-up feeds them: token p and the trunk's
    h_nextn of p−1 (zeros at p = 0). tokens [T], h_tgt [T, E] -> [T, V]; row p predicts token p+1.
    (``refimpl logits --mtp-out``; tests/llama_ref.py computes the same with llama.cpp.)"""
    w = load_mtp_weights(model.file, model.weights)
    h_in = np.concatenate([np.zeros((1, h_tgt.shape[1]), dtype=F32), h_tgt[:-1]])  # [T, E]
    logits, _, _ = mtp_forward(model, w, MTPState.fresh(model.config), tokens, h_in, ctx)  # [T, V]
    return logits


# --------------------------------------------------------------------------------------------------
# n-gram (prompt lookup): copy what followed the most similar earlier context.


def ngram_draft(history, n_max: int, *, min_match: int = 3, max_match: int = NGRAM_MAX_MATCH) -> list[int]:
    """Draft up to ``n_max`` tokens by looking the end of ``history`` up earlier in ``history``.

    ``history`` = prompt + generated tokens, ending with the last confirmed token. For every earlier
    end index e (e < len − 1, so the suffix never matches itself and at least one token follows),
    let L(e) = how many tokens, read backwards, ``history[..e]`` shares with ``history[..len−1]``,
    capped at ``max_match``. Take the e with the largest L(e) — the longest suffix match; among
    equally long ones the largest e, the most recent. If that L < ``min_match``, draft nothing;
    otherwise draft ``history[e+1 : e+1+n_max]``, clipped at the end of the history (a match may
    overlap the suffix itself; its continuation then runs into the suffix).

    Worked example, min_match = 2, n_max = 3::

        index     0  1  2  3  4  5  6  7  8  9
        history   5  1  2  3  9  1  2  3  7  2  3      (len 11; suffix ends at 10: … 2 3)
        e = 3:  history[..3] = …1 2 3, suffix …7 2 3 → L = 2   (3=3, 2=2, 1≠7)
        e = 7:  history[..7] = …1 2 3, suffix …7 2 3 → L = 2   (same length, more recent: wins)
        e = 2, 6, 9: end in 2, suffix ends in 3 → L = 0
        → e = 7, draft history[8:11] = [7, 2, 3]

    With min_match = 3 the same history drafts nothing (longest L is 2).

    llama.cpp's nearest relative, ``common_ngram_simple_draft`` (common/ngram-map.cpp), differs on
    purpose: it matches one fixed length (size_n), searches ``prompt_tgt`` *without* the last token
    for the continuation (so it can never propose it), ignores a match at index 0, needs
    len > size_n + size_m + 1, and drafts nothing when fewer than size_n tokens follow the match.
    ``ngram-mod`` hashes n-grams (collisions possible) and ``ngram-cache`` votes by counts; here the
    rule is exact, stateless and written out, so the oracle's drafts are predictable.
    """
    h = list(history)
    n = len(h)
    if n_max <= 0 or n < 2:
        return []
    best_len, best_end = 0, -1
    for e in range(n - 1):  # [0, n−2]
        L = 0
        while L < max_match and L <= e and h[e - L] == h[n - 1 - L]:
            L += 1
        if L >= best_len and L > 0:  # ≥: a later e of the same length wins
            best_len, best_end = L, e
    if best_len < min_match:
        return []
    return h[best_end + 1 : best_end + 1 + n_max]


class NgramSource(DraftSource):
    """Drafts with :func:`ngram_draft` over the request's history. Stateless: process/accept are
    no-ops (as llama.cpp's ngram-simple's are)."""

    name = "ngram"

    def __init__(self, min_match: int = 3, max_match: int = NGRAM_MAX_MATCH):
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 ≤ min_match ≤ max_match, got {min_match}, {max_match}")
        self.min_match, self.max_match = int(min_match), int(max_match)

    def draft(self, state, req: DraftRequest) -> tuple[list[int], object]:
        return ngram_draft(req.history, req.n_max, min_match=self.min_match, max_match=self.max_match), state
