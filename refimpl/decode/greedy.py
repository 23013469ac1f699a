"""Step 10: plain greedy generation — prompt in one batch, then one token per forward call.

Greedy = argmax of the logits, lowest id on ties (llama.cpp's greedy sampler keeps the first
maximum, and passes over a NaN logit: :func:`refimpl.model.ops.argmax`). Generation stops after
``n_predict`` tokens or at an end-of-generation token (which is included in the output, as llama.cpp
returns it).
"""

from __future__ import annotations

from typing import Callable, Iterable

from refimpl.model.trunk import Model, forward
from refimpl.model.ops import Ctx, argmax
from refimpl.model.state import SeqState


def greedy(
    model: Model,
    prompt: Iterable[int],
    n_predict: int,
    ctx: Ctx = Ctx(),
    *,
    eog_ids: frozenset[int] = frozenset(),
    on_token: Callable[[int], None] | None = None,
    progress=None,
) -> list[int]:
    """Generate up to ``n_predict`` tokens after ``prompt``; ``on_token(id)`` is called as each is
    produced; ``progress`` (a tqdm bar or None) is advanced once per token."""
    prompt = list(prompt)
    if not prompt:
        raise ValueError("the prompt must hold at least one token")
    out: list[int] = []
    state = SeqState.fresh(model.config)
    logits, _, state = forward(model, state, prompt, ctx, outputs="last")  # [1, V]
    while len(out) < n_predict:
        tok = argmax(logits[-1])
        out.append(tok)
        if on_token is not None:
            on_token(tok)
        if progress is not None:
            progress.update(1)
        if tok in eog_ids or len(out) == n_predict:
            break
        logits, _, state = forward(model, state, [tok], ctx)  # [1, V]
    return out
