"""Step 12: the self-speculative loop — draft, verify in one batch, accept, roll back (docs/speculative.md, "The loop").

One round, with the target holding positions 0 … P−1 and ``id_last`` = x_P confirmed but not decoded::

    drafts d_1 … d_n        = source.draft(history, n_max)           (n = 0: the plain path)
    logits, h, target       = forward(target, [x_P, d_1, …, d_n])    one batch, every row's logits
    source                  = source.process([x_P, d_1, …, d_n], h)  MTP catch-up on all n+1 rows
    t_i                     = argmax(logits[i])                      the target's own choices
    ids = accept_greedy(d, t)   t_0 … t_{n_acc}: the drafts equal to the target's choice, then the
                                target's next token (a correction, or the bonus when all matched)
    source                  = source.accept(n_acc, P + n_acc + 1)
    target                  = rollback(target, n − n_acc)            snapshot restore, never replay
    history += ids;  id_last = ids[−1]

Sources: ``examples/speculative-simple/speculative-simple.cpp`` (the round), ``common/sampling.cpp::
common_sampler_sample_and_accept_n`` (acceptance), ``common/speculative.cpp`` (the MTP drafter),
``tools/server/server-context.cpp::get_n_draft_max`` (the draft budget). The prompt is decoded the
speculative-simple way: all but its last token in one batch, the last one as the first round's x_P.

The ``ctx.cb("loop.…", -1, value, …)`` calls are the loop's named tap points (:data:`refimpl.model.ops.TAPS`):
the value goes on unchanged unless an engine bug is injected on purpose (:mod:`refimpl.inject.faults`,
docs/bug-classes.md) — where the loop starts, after the prompt, the state a round decodes from, the
verify rows' argmax, the accepted ids, the rollback, the end.

Because refimpl's ``forward`` gives bit-identical rows for a batch and for single tokens in the definition
(and with ``--emulate=plain``), the tokens generated here then equal :func:`refimpl.decode.greedy.greedy`'s for
every source and draft width (docs/speculative.md says why a batched C++ engine need not). Under ``--emulate``
with flash attention and under ``--emulate=ggml`` a 1+N verify batch rounds as llama.cpp's does, differently
from single tokens, so the two loops may part at a near-tie, as llama.cpp's own do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from refimpl.decode.drafts import DraftRequest, DraftSource, MTPSource, NgramSource
from refimpl.errors import RefimplError
from refimpl.model.trunk import Model, forward
from refimpl.model.ops import Ctx, argmax
from refimpl.model.state import SeqState, rollback

MAX_DRAFT = 8


def accept_greedy(drafts: list[int], targets: list[int], eog_ids=frozenset()) -> list[int]:
    """``common_sampler_sample_and_accept_n`` with a greedy sampler. targets[i] = argmax of verify
    row i (len(drafts) + 1 rows). Walk the drafts: take targets[i]; stop when it differs from
    drafts[i] — or is an end-of-generation token that is not the last draft. If every draft matched,
    also take targets[n] (the bonus). Returns n_acc + 1 tokens, n_acc = accepted drafts."""
    ids: list[int] = []
    for i, d in enumerate(drafts):
        ids.append(targets[i])
        if targets[i] != d or (targets[i] in eog_ids and i + 1 < len(drafts)):
            return ids
    ids.append(targets[len(drafts)])
    return ids


@dataclass(frozen=True)
class SpecState:
    """The loop's whole memory: the trunk's state, the source's state, ``history`` = prompt +
    confirmed tokens, whose last token (id_last) the trunk has not decoded yet, and the previous
    :class:`Round` (None before the first)."""

    target: SeqState
    source: object
    history: tuple[int, ...]
    last: "Round | None" = None


@dataclass(frozen=True)
class Round:
    """What one round did (a row of the table in docs/speculative.md)."""

    pos0: int  # position of id_last
    drafts: list[int]  # d_1 … d_n (empty: the plain path)
    targets: list[int]  # argmax of each verify row, n + 1 of them
    ids: list[int]  # confirmed tokens: accepted drafts + the target's next token
    draft_s: float  # drafting + the source's catch-up
    decode_s: float  # the target's decode (and rollback)
    ring_bytes: int  # snapshot ring right after the verify decode

    @property
    def n_accepted(self) -> int:
        return len(self.ids) - 1

    @property
    def rollback(self) -> int:
        return len(self.drafts) - self.n_accepted


def prefill(model: Model, source: DraftSource, prompt: list[int], n_rs_seq: int, ctx: Ctx = Ctx()) -> SpecState:
    """Decode all but the last prompt token on the target (no logits needed) and let the source
    process them; the last prompt token becomes id_last."""
    fresh = SeqState.fresh(model.config, n_rs_seq=n_rs_seq)
    target, src = ctx.cb("loop.start", -1, (fresh, source.start()))
    if len(prompt) > 1:
        _, h, target = forward(model, target, prompt[:-1], ctx, phase="prompt", outputs="none")  # h [N−1, E]
        target = ctx.cb("loop.prefill", -1, target, fresh=fresh, n_tokens=len(prompt) - 1)
        src = source.process(src, prompt[:-1], h)
    return SpecState(target=target, source=src, history=tuple(prompt))


def step(model: Model, source: DraftSource, s: SpecState, n_max: int, ctx: Ctx = Ctx(), eog_ids=frozenset()) -> tuple[Round, SpecState]:
    """One round (module docstring). ``n_max`` = draft budget; 0 skips drafting (plain path)."""
    P, id_last = s.target.n_past, s.history[-1]
    t0 = time.perf_counter()
    drafts, src = source.draft(s.source, DraftRequest(s.history, n_max)) if n_max > 0 else ([], s.source)
    drafts = [int(d) for d in drafts][:n_max]
    t1 = time.perf_counter()
    batch = [id_last] + drafts
    phase = "verify" if drafts else "decode"  # for the expert streamer's counters (docs/streamer.md)
    before = ctx.cb("loop.decode_from", -1, s.target, drafts=drafts, last=s.last)
    logits, h, target = forward(model, before, batch, ctx, phase=phase)  # [1+n, V], [1+n, E]
    ring_bytes = target.snapshot_nbytes()
    t2 = time.perf_counter()
    src = source.process(src, batch, h)
    targets = ctx.cb("loop.targets", -1, [argmax(row) for row in logits], drafts=drafts, logits=logits)  # greedy: first maximum
    ids = ctx.cb("loop.accept", -1, accept_greedy(drafts, targets, eog_ids), drafts=drafts, targets=targets,
                 logits=logits, eog_ids=eog_ids)
    n_acc = len(ids) - 1
    src = source.accept(src, n_acc, P + n_acc + 1)
    t3 = time.perf_counter()
    r_back = len(drafts) - n_acc
    target = ctx.cb("loop.rollback", -1, rollback(target, r_back), before=before, after=target, r=r_back,
                    kept=batch[: n_acc + 1], replay=lambda st, toks: forward(model, st, toks, ctx, outputs="none")[2])
    t4 = time.perf_counter()
    r = Round(P, drafts, targets, ids, draft_s=(t1 - t0) + (t3 - t2), decode_s=(t2 - t1) + (t4 - t3), ring_bytes=ring_bytes)
    return r, SpecState(target=target, source=src, history=s.history + tuple(ids), last=r)


@dataclass(frozen=True)
class TokenRow:
    """One generated token's telemetry; a round's costs are charged to its first token."""

    token: int
    wall_ms: float  # since generation started, when the token was confirmed
    step: int  # which round produced it
    kind: str  # plain | draft (an accepted draft) | correction | bonus
    mtp_batch: float  # ms of the round's target decode (first row of the round; 0 after)
    mtp_draft_ms: float  # ms of the round's drafting + source catch-up (first row; 0 after)
    bytes_read: int | None  # bytes the round read (first row), None without a streamer
    counters: dict[str, int] | None = None  # the round's share of the ``counters`` hook (first row; zeros after)
    drafts: tuple[int, ...] | None = None  # the round's drafts d_1 … d_n (first row; None after)


@dataclass
class SpecStats:
    """Counters of one generation (docs/speculative.md defines each)."""

    source: str
    n_draft: int
    p_min: float
    ngram_min_match: int
    n_prompt: int
    n_generated: int = 0
    n_drafted: int = 0  # draft tokens sent to verification
    n_accepted: int = 0  # of those, accepted
    n_decodes: int = 0  # target decodes after the prompt (verify or plain)
    n_drafted_steps: int = 0  # rounds that verified at least one draft
    accepted_per_pos: list[int] = field(default_factory=list)  # [i]: rounds that accepted ≥ i+1 drafts
    prompt_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    bytes_read: int | None = None
    stream: dict[str, int] | None = None  # totals of the ``counters`` hook over generation (docs/streamer.md)
    snapshot_bytes: int = 0  # one recurrent snapshot
    snapshot_ring_bytes: int = 0  # largest ring held (≤ n_rs_seq · snapshot_bytes)
    n_rs_seq: int = 0
    rows: list[TokenRow] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def tokens_per_decode(self) -> float:
        return self.n_generated / self.n_decodes if self.n_decodes else 0.0

    @property
    def draft_s_per_token(self) -> float:
        return self.draft_s / self.n_generated if self.n_generated else 0.0

    def record(self, r: Round, emitted: list[int], wall_ms: float, read: int | None, counted: dict | None) -> None:
        """Add one round: its counters, and a row per emitted token (its costs on the first row)."""
        self.n_decodes += 1
        self.n_drafted += len(r.drafts)
        self.n_accepted += r.n_accepted
        self.n_drafted_steps += bool(r.drafts)
        for i in range(r.n_accepted):
            self.accepted_per_pos[i] += 1
        self.decode_s += r.decode_s
        self.draft_s += r.draft_s
        self.snapshot_ring_bytes = max(self.snapshot_ring_bytes, r.ring_bytes)
        if read is not None:
            self.bytes_read = (self.bytes_read or 0) + read
        if counted is not None:
            self.stream = {k: (self.stream or {}).get(k, 0) + v for k, v in counted.items()}
        for j, tok in enumerate(emitted):
            kind = "plain" if not r.drafts else "draft" if j < r.n_accepted else "bonus" if r.rollback == 0 else "correction"
            if j == 0:
                row = TokenRow(tok, wall_ms, self.n_decodes - 1, kind, r.decode_s * 1e3, r.draft_s * 1e3, read, counted,
                               tuple(r.drafts))
            else:
                row = TokenRow(tok, wall_ms, self.n_decodes - 1, kind, 0.0, 0.0, None if read is None else 0,
                               None if counted is None else dict.fromkeys(counted, 0))
            self.rows.append(row)
        self.n_generated += len(emitted)

    def rounds(self) -> list[dict]:
        """Per round: accepted and drafted counts and the draft ids — the ``rounds`` of ``run --json``,
        the form the round audit reads (refimpl.oracle.rounds)."""
        firsts = [r for r in self.rows if r.drafts is not None]
        accepted = [0] * len(firsts)
        for r in self.rows:
            accepted[r.step] += r.kind == "draft"
        return [{"accepted": a, "drafted": len(r.drafts), "drafts": list(r.drafts)} for a, r in zip(accepted, firsts)]

    def counters(self) -> dict:
        """The counters as the CSV trailer and ``--json`` ``stats`` name them."""
        return {
            "spec": self.source, "spec_draft_max": self.n_draft, "mtp_p_min": self.p_min,
            "ngram_min_match": self.ngram_min_match, "n_prompt": self.n_prompt, "n_generated": self.n_generated,
            "mtp_drafted": self.n_drafted, "mtp_accepted": self.n_accepted, "mtp_decodes": self.n_decodes,
            "drafted_steps": self.n_drafted_steps, "accepted_per_pos": list(self.accepted_per_pos),
            "acceptance": self.acceptance, "tokens_per_decode": self.tokens_per_decode,
            "prompt_s": self.prompt_s, "decode_s": self.decode_s, "mtp_draft_s": self.draft_s,
            "mtp_draft_s/tok": self.draft_s_per_token, "bytes_read": self.bytes_read,
            "n_rs_seq": self.n_rs_seq, "snapshot_bytes": self.snapshot_bytes,
            "snapshot_ring_bytes": self.snapshot_ring_bytes, **(self.stream or {}),
        }


def make_source(model: Model, source, ctx: Ctx = Ctx(), *, p_min: float = 0.0, ngram_min_match: int = 3) -> DraftSource:
    """None → :class:`~refimpl.decode.drafts.DraftSource` (drafts nothing), "mtp", "ngram", or a
    DraftSource instance as is."""
    if source is None:
        return DraftSource()
    if isinstance(source, DraftSource):
        return source
    if source == "mtp":
        return MTPSource(model, ctx, p_min)
    if source == "ngram":
        return NgramSource(min_match=ngram_min_match)
    raise RefimplError(f"unknown draft source {source!r} (expected None, 'mtp', 'ngram' or a DraftSource)")


def speculative_generate(
    model: Model,
    prompt,
    n_predict: int,
    ctx: Ctx = Ctx(),
    *,
    source=None,
    n_draft: int = 3,
    p_min: float = 0.0,
    ngram_min_match: int = 3,
    eog_ids=frozenset(),
    on_token: Callable[[int], None] | None = None,
    progress=None,
    bytes_read: Callable[[], int] | None = None,
    counters: Callable[[], dict[str, int]] | None = None,
) -> tuple[list[int], SpecStats]:
    """Generate up to ``n_predict`` tokens greedily with speculative rounds; returns (tokens, stats).

    ``source``: None (no drafting), "mtp", "ngram", or a :class:`~refimpl.decode.drafts.DraftSource`.
    ``n_draft`` (1 … 8): the most drafts per round; the target keeps ``n_rs_seq = n_draft``
    snapshots (llama.cpp's ``need_n_rs_seq``). A round drafts at most
    min(n_draft, n_predict − generated − 1) tokens, so no round confirms more than is left
    (``server_slot::get_n_draft_max``); at 0 it takes the plain path. ``p_min``: MTP drafting stops at
    a draft whose top-10 probability is below it. ``ngram_min_match``: the n-gram source's gate.
    ``bytes_read``: the expert streamer's hook — a callable returning bytes read so far (cumulative);
    each round's difference is charged to its first row. ``counters``: more cumulative integer
    counters (the streamer's ``counters.columns``), charged the same way per key (``TokenRow.counters``,
    extra CSV columns) and summed into ``SpecStats.stream``. ``on_token(id)`` / ``progress`` as in
    :func:`refimpl.decode.greedy.greedy`; generation stops after an end-of-generation token (included).
    """
    if not 1 <= n_draft <= MAX_DRAFT:
        raise RefimplError(f"--draft must be between 1 and {MAX_DRAFT}, got {n_draft}")
    if not 0.0 <= p_min <= 1.0:
        raise RefimplError(f"--mtp-p-min must be between 0 and 1, got {p_min}")
    if ngram_min_match < 1:
        raise RefimplError(f"--ngram-min-match must be ≥ 1, got {ngram_min_match}")
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("the prompt must hold at least one token")
    src = make_source(model, source, ctx, p_min=p_min, ngram_min_match=ngram_min_match)
    stats = SpecStats(source=src.name, n_draft=n_draft, p_min=float(p_min), ngram_min_match=ngram_min_match,
                      n_prompt=len(prompt), n_rs_seq=n_draft, accepted_per_pos=[0] * n_draft)

    t_start = time.perf_counter()
    s = prefill(model, src, prompt, n_draft, ctx)
    stats.prompt_s = time.perf_counter() - t_start
    stats.snapshot_bytes = s.target.recurrent_nbytes()
    out: list[int] = []
    t_gen = time.perf_counter()
    read0 = bytes_read() if bytes_read is not None else None
    count0 = counters() if counters is not None else None
    while len(out) < n_predict:
        r, s = step(model, src, s, min(n_draft, n_predict - len(out) - 1), ctx, eog_ids)
        wall_ms = (time.perf_counter() - t_gen) * 1e3
        read = counted = None
        if bytes_read is not None:
            read1 = bytes_read()
            read, read0 = read1 - read0, read1
        if counters is not None:
            count1 = counters()
            counted, count0 = {k: count1[k] - count0[k] for k in count1}, count1
        eog_at = next((j for j, t in enumerate(r.ids) if t in eog_ids), None)
        emitted = r.ids if eog_at is None else r.ids[: eog_at + 1]  # an EOG ends generation, included
        assert len(out) + len(emitted) <= n_predict, "the draft budget keeps every round within n_predict"
        stats.record(r, emitted, wall_ms, read, counted)
        for tok in emitted:
            out.append(tok)
            if on_token is not None:
                on_token(tok)
            if progress is not None:
                progress.update(1)
        if eog_at is not None:
            break
    ctx.cb("loop.finish", -1, s)
    return out, stats
