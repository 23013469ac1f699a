"""A faulty engine's answer as llama-server writes it: the confirmed tokens of refimpl's speculative loop
with injected faults (:mod:`refimpl.inject.faults`), each with the log-probabilities the faulty engine itself
computed for it, so that ``refimpl audit``'s log-prob checks (refimpl.oracle.probs, ``--threshold auto`` of
refimpl.oracle.calibrate) see what a real server with the bug would report.

Each confirmed token is paired with the verify row of its own position — the logits the engine computed
there, from whatever state the fault left (llama-server's ``completion_probabilities`` come from the row
it sampled the token from, ``server_context::populate_token_probs``); ``n_probs`` entries of that row's
log-softmax (``common_sampler``'s probabilities at temperature 0 without the sampler chain, ties to the
lower id) become ``top_logprobs``, and the token's own log-probability ``logprob``. The JSON is
``/completion``'s non-streamed shape (``to_json_non_oaicompat``, tools/server/server-task.cpp of llama.cpp
as vendored in llama-cpp-python 0.3.36), ids only (no ``token``/``bytes`` text).
"""

from __future__ import annotations

import math

import numpy as np


class _Recording:
    """A fault record that also keeps each round's verify logits (the ``loop.accept`` tap point's ``logits``) of
    the last generation."""

    def __init__(self, faults):
        self.faults, self.rows = faults, []

    def __bool__(self) -> bool:
        return True

    def tap(self, point: str, value, **info):
        value = self.faults.tap(point, value, **info)
        if point == "loop.start":  # a new generation (state-leak runs an earlier one first): its rows only
            self.rows = []
        if point == "loop.accept":  # value: the round's confirmed ids, row j the logits of the j-th
            self.rows += [np.asarray(info["logits"][j], dtype=np.float32) for j in range(len(value))]
        return value


def top_logprobs(row: np.ndarray, n_probs: int) -> list[tuple[int, float]]:
    """The ``n_probs`` most probable ids of ``row`` with their log-softmax (float64), best first, ties to the lower id."""
    r = row.astype(np.float64)
    m = float(np.max(r))
    lse = m + math.log(float(np.sum(np.exp(r - m))))
    ids = np.lexsort((np.arange(r.size), -r))[:n_probs]
    return [(int(i), float(r[i]) - lse) for i in ids]


def completion_json(prompt: list[int], tokens: list[int], rows: list[np.ndarray], n_probs: int = 5) -> dict:
    """llama-server's ``/completion`` answer for ``tokens`` with each token's row's log-probs (module docstring)."""
    probs = []
    for tok, row in zip(tokens, rows):
        top = top_logprobs(row, n_probs)
        own = dict(top).get(tok)
        if own is None:
            own = _logprob(row, tok)
        probs.append({"id": tok, "logprob": own, "top_logprobs": [{"id": i, "logprob": lp} for i, lp in top]})
    return {"index": 0, "tokens": list(tokens), "prompt": list(prompt), "stop": True, "tokens_predicted": len(tokens),
            "completion_probabilities": probs}


def _logprob(row: np.ndarray, tok: int) -> float:
    r = row.astype(np.float64)
    m = float(np.max(r))
    return float(r[tok]) - (m + math.log(float(np.sum(np.exp(r - m)))))


def faulty_answer(run, faults, prompt: list[int], n_probs: int = 5) -> dict:
    """``run(faults)`` → (tokens, stats) (e.g. refimpl.inject.fault_table.run with its case and scenario) with
    ``faults`` recorded; its answer as :func:`completion_json`."""
    rec = _Recording(faults)
    tokens, _ = run(rec)
    assert len(rec.rows) >= len(tokens), "every confirmed token has its verify row"
    return completion_json(prompt, tokens, rec.rows[: len(tokens)], n_probs)
