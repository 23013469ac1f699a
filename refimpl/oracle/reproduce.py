"""Reproduction verdict: does llama.cpp's own batch schedule compute the engine's stream? (``audit --emulate=ggml
--draft N``; docs/validating-an-engine.md §3g).

With ``--emulate=ggml`` the oracle computes ggml-cpu's logits bit for bit for every batch shape
(docs/numerics.md, "Bit-exact ggml-cpu, op by op"), so it can run llama.cpp's own loop and *predict* the
stream a ggml-based engine produces — not only judge it by a near-tie band:

* schedule ``plain`` (``--draft 0``): llama.cpp's plain decode — the prompt in one batch, then one token per
  ``llama_decode`` (:func:`refimpl.decode.greedy.greedy` under the ggml ``Ctx``);
* schedule ``draft-N``: llama.cpp's draft-mtp loop with ``n_max`` N — 1+n verify batches, MTP catch-up and
  recurrent rollback (:func:`refimpl.decode.speculative.speculative_generate`, ``source="mtp"``; equal to
  llama.cpp's loop token for token, tests/test_ggml_e2e.py). As ``speculative-simple`` runs it, the prompt but
  its last token is one batch and the last one opens the first verify batch;
* ``rounds of FILE`` (``--schedule FILE``): the engine's own rounds, replayed from its telemetry (a ``refimpl run
  --csv``-style CSV, or JSON with ``rounds``; refimpl.oracle.rounds): each round's 1+n verify batch holds the
  pending token and the n draft ids the engine logged, whoever drafted them (its MTP head, n-grams, anything),
  and llama.cpp's acceptance, rollback and the next round follow (:class:`LoggedDrafts`; the prompt but its last
  token in one batch, as speculative-simple and ``refimpl run`` run it). So the prediction does not depend on
  the engine's drafts being the oracle's: it asks what llama.cpp's batches of exactly those shapes and tokens
  compute. Rounds past the log's end decode one token each;
* ``server-plain`` / ``server-draft-N`` (``--draft server:0`` / ``server:N``; ``refimpl validate``'s): as
  llama-server runs them. Its prompt is not one batch: to checkpoint a recurrent model's state it cuts the
  prompt so that the last 4 + n_ubatch and the last 4 tokens start new batches (``server-context.cpp``,
  ``checkpoint_offsets``, with ``n_ctx_checkpoints`` > 0 by default; batches of at most n_batch = 2048); the
  first token is sampled from the last prompt batch, then it decodes one token per call, or runs the
  draft-mtp rounds from there (the MTP head catches up on the same prompt batches).

The schedules differ where a batch's row count picks another kernel: a 64-token prompt is one 64-row batch
(flash attention's tiled path) for plain decode, a 63-row one (the one-row path, F16 V·P sums) for
speculative-simple and 60 + 4 rows for llama-server — on builtin:kjv that flips the first token of some
prompts (docs/validating-an-engine.md §3g).

The prediction asks for as many tokens as the stream holds (the draft budget of the last rounds depends on
it: ``min(N, n_predict − generated − 1)``) and stops at an end-of-generation token, as llama.cpp does.

Each stream S is compared with its prediction P: ``first_difference`` = the first step where S and P differ
(None when S equals P over its length). An audit event (the divergence, a departure) at step k involving S is
**reproduced** when S[:k+1] = P[:k+1] — llama.cpp's own batches compute that token from that history — else
**not reproduced**. The gate (:attr:`Reproduction.exit_code`): 0 when every stream is its prediction (a
reproduced wrong token is then a llama.cpp-numerics flip, not an engine bug: the engine computes what
llama.cpp computes), 1 when any stream departs from its prediction — even where the stream keeps the
oracle's argmax or the departure is a near-tie: a ggml-based engine is gated on byte identity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from refimpl.decode.drafts import DraftSource
from refimpl.errors import RefimplError

MAX_DRAFT = 8


@dataclass(frozen=True)
class Schedule:
    """llama.cpp's batch schedule of one stream: 0 = plain decode, N ≥ 1 = draft-mtp with n_max N; or the
    engine's own logged rounds (``logged``: the draft ids of each round, () for a plain one; ``source`` the file)."""

    draft: int
    server: bool = False  # as llama-server runs it (its prompt batches)
    logged: tuple[tuple[int, ...], ...] | None = None
    source: str = ""

    @property
    def name(self) -> str:
        if self.logged is not None:
            return f"rounds-of-{Path(self.source).name}"
        return ("server-" if self.server else "") + ("plain" if self.draft == 0 else f"draft-{self.draft}")

    def describe(self) -> str:
        if self.logged is not None:
            n_drafted = sum(1 for d in self.logged if d)
            return (f"the engine's own {len(self.logged)} rounds from {self.source} ({n_drafted} with drafts, up to "
                    f"1+{max(map(len, self.logged), default=0)} rows), verified as llama.cpp verifies them")
        if self.server:
            return "llama-server, " + ("plain decode" if self.draft == 0 else f"draft-mtp n_max {self.draft}")
        if self.draft == 0:
            return "llama.cpp's plain decode: the prompt in one batch, then one token per call"
        return f"llama.cpp's draft-mtp loop, n_max {self.draft}, as speculative-simple runs it"


def parse_schedules(text: str, n_streams: int) -> list[Schedule]:
    """``--draft``: one value for every stream, or one per stream (``0,3``: A plain decode, B draft-3);
    each 0 or ``plain`` (plain decode), 1 … 8 (the draft-mtp loop's n_max, speculative-simple's schedule) or
    ``server:N`` (llama-server's)."""
    parts = [p.strip() for p in str(text).split(",")]
    out = []
    for p in parts:
        server = p.lower().startswith("server:")
        v = p[len("server:"):] if server else p
        n = 0 if v.lower() == "plain" else int(v) if v.isdigit() else -1
        if not 0 <= n <= MAX_DRAFT:
            raise RefimplError(f"--draft: expected 0 (or plain) … {MAX_DRAFT}, or server:N, per stream, got {p!r}")
        out.append(Schedule(n, server))
    if len(out) == 1:
        return out * n_streams
    if len(out) != n_streams:
        raise RefimplError(f"--draft: {len(out)} values for {n_streams} stream{'s' * (n_streams != 1)} (give one, or one per stream)")
    return out


def logged_schedule(path: str, rounds_info) -> Schedule:
    """``--schedule FILE``: the schedule of the rounds a telemetry file logged (refimpl.oracle.rounds.RoundsInfo, or
    None when the file has no per-round columns). Every round that verified drafts must name them: the verify
    batch is rebuilt from them."""
    if rounds_info is None or not rounds_info.rounds:
        raise RefimplError(f"--schedule {path}: no rounds in it (a telemetry CSV needs 'step' and 'kind' columns, "
                           "JSON a 'rounds' list)")
    logged = []
    for n, r in enumerate(rounds_info.rounds):
        if r.drafts is None:
            raise RefimplError(f"--schedule {path}: round {n} verified drafts but did not log their ids ('drafts'), so "
                               "its verify batch cannot be rebuilt")
        logged.append(tuple(int(t) for t in r.drafts))
    if max(map(len, logged)) > MAX_DRAFT:
        raise RefimplError(f"--schedule {path}: a round verified more than {MAX_DRAFT} drafts")
    return Schedule(max(map(len, logged)), logged=tuple(logged), source=str(path))


class LoggedDrafts(DraftSource):
    """A draft source that proposes, round by round, the draft ids an engine logged (its state: the round index,
    advanced once per round in :meth:`accept`, which every round calls — a plain round too)."""

    name = "logged"

    def __init__(self, logged: tuple[tuple[int, ...], ...]):
        self.logged = logged

    def start(self) -> int:
        return 0

    def draft(self, state: int, req) -> tuple[list[int], int]:
        return list(self.logged[state]) if state < len(self.logged) else [], state

    def accept(self, state: int, n_accepted: int, n_past: int) -> int:
        return state + 1



@dataclass
class Prediction:
    label: str
    schedule: Schedule
    tokens: list[int]  # llama.cpp's predicted stream
    stream: list[int]  # the engine's stream
    rounds: list[dict] = field(default_factory=list)  # draft-N: per round accepted/drafted/drafts (SpecStats.rounds)

    @property
    def first_difference(self) -> int | None:
        """First step where the engine's stream and the prediction differ (a shorter one ends there); None if equal."""
        k = next((i for i, (a, b) in enumerate(zip(self.stream, self.tokens)) if a != b), None)
        if k is None and len(self.stream) != len(self.tokens):
            k = min(len(self.stream), len(self.tokens))
        return k

    @property
    def identical(self) -> bool:
        return self.first_difference is None

    def reproduces(self, step: int) -> bool:
        k = self.first_difference
        return k is None or k > step

    def batch_of(self, step: int) -> str:
        """Which of llama.cpp's batches computes the token at ``step`` of the predicted stream."""
        if step == 0 and (self.schedule.draft == 0 or self.schedule.server):
            return "prompt batch"
        if self.schedule.draft == 0:
            return "decode"
        at = 0
        for r in self.rounds:
            n = r["accepted"] + 1
            if step < at + n:
                return f"1+{r['drafted']} verify" if r["drafted"] else "decode"
            at += n
        return "decode"

    def as_json(self) -> dict:
        k = self.first_difference
        return {"schedule": self.schedule.name, "tokens": self.tokens, "identical": self.identical,
                "first_difference": k,
                "engine_token": self.stream[k] if k is not None and k < len(self.stream) else None,
                "predicted_token": self.tokens[k] if k is not None and k < len(self.tokens) else None,
                "rounds": self.rounds}


def server_prompt_batches(n_tokens: int, n_batch: int = 2048, n_ubatch: int = 512) -> list[int]:
    """The sizes of llama-server's prompt batches for a recurrent model (module docstring)."""
    cuts = {n_tokens - min(n_batch, off) for off in (4 + n_ubatch, 4)}
    sizes, cur = [], 0
    for k in range(1, n_tokens + 1):
        cur += 1
        if k == n_tokens or cur == n_batch or k in cuts:
            sizes.append(cur)
            cur = 0
    return sizes


def predict(model, prompt: list[int], label: str, stream: list[int], schedule: Schedule, ctx,
            eog_ids=frozenset()) -> Prediction:
    """llama.cpp's stream for ``schedule`` under the ggml ``ctx``, as long as ``stream``."""
    n = max(1, len(stream))
    if schedule.draft and schedule.logged is None and model.file.plan.mtp == "stripped":
        raise RefimplError(f"--draft {schedule.draft}: the model has no MTP block, so llama.cpp's draft-mtp loop cannot "
                           "be predicted (use --draft 0: plain decode)")
    if schedule.logged is not None:
        tokens, rounds = _logged(model, list(prompt), n, schedule.logged, ctx, eog_ids)
        return Prediction(label, schedule, tokens, list(stream), rounds)
    if schedule.server:
        tokens, rounds = _server(model, list(prompt), n, schedule.draft, ctx, eog_ids)
        return Prediction(label, schedule, tokens, list(stream), rounds)
    if schedule.draft == 0:
        from refimpl.decode.greedy import greedy

        return Prediction(label, schedule, greedy(model, prompt, n, ctx, eog_ids=eog_ids), list(stream))
    from refimpl.decode.speculative import speculative_generate

    tokens, stats = speculative_generate(model, prompt, n, ctx, source="mtp", n_draft=schedule.draft, eog_ids=eog_ids)
    return Prediction(label, schedule, tokens, list(stream), stats.rounds())


def _logged(model, prompt: list[int], n: int, logged, ctx, eog_ids) -> tuple[list[int], list[dict]]:
    """The stream llama.cpp computes for the engine's logged rounds: the prompt but its last token in one batch
    (refimpl.decode.speculative.prefill), then one round per logged entry — the verify batch [pending token] +
    the logged drafts, greedy acceptance, the recurrent rollback — and single-token decodes past the log."""
    from refimpl.decode.speculative import prefill, step

    src = LoggedDrafts(tuple(logged))
    s, out, rounds = prefill(model, src, prompt, max(map(len, logged), default=0), ctx), [], []
    while len(out) < n and not (out and out[-1] in eog_ids):
        n_max = len(logged[len(rounds)]) if len(rounds) < len(logged) else 0
        r, s = step(model, src, s, n_max, ctx, eog_ids)
        eog = next((j for j, t in enumerate(r.ids) if t in eog_ids), None)
        out += r.ids if eog is None else r.ids[: eog + 1]
        rounds.append({"accepted": r.n_accepted, "drafted": len(r.drafts), "drafts": list(r.drafts)})
    return out, rounds


def _server(model, prompt: list[int], n: int, n_draft: int, ctx, eog_ids) -> tuple[list[int], list[dict]]:
    """llama-server's stream: its prompt batches, the first token from the last one, then plain decode
    (``n_draft`` 0) or draft-mtp rounds (refimpl.decode.speculative.step) with the server's budget."""
    from refimpl.decode.speculative import SpecState, make_source, step
    from refimpl.model.ops import argmax
    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward

    src = make_source(model, "mtp" if n_draft else None, ctx)
    target, sstate, at = SeqState.fresh(model.config, n_rs_seq=n_draft), src.start(), 0
    for size in server_prompt_batches(len(prompt), n_ubatch=ctx.n_ubatch):
        piece = prompt[at : at + size]
        logits, h, target = forward(model, target, piece, ctx, phase="prompt", outputs="all" if n_draft else "last")
        if n_draft:
            sstate = src.process(sstate, piece, h)
        at += size
    out = [argmax(logits[-1])]
    rounds = [{"accepted": 0, "drafted": 0, "drafts": []}]
    s = SpecState(target=target, source=sstate, history=tuple(prompt) + (out[0],))
    while len(out) < n and out[-1] not in eog_ids:
        r, s = step(model, src, s, min(n_draft, n - len(out) - 1), ctx, eog_ids)
        eog = next((j for j, t in enumerate(r.ids) if t in eog_ids), None)
        out += r.ids if eog is None else r.ids[: eog + 1]
        rounds.append({"accepted": r.n_accepted, "drafted": len(r.drafts), "drafts": list(r.drafts)})
    return out, rounds


@dataclass
class Reproduction:
    predictions: dict[str, Prediction]  # stream label → its prediction
    events: list[tuple[int, str, bool]] = field(default_factory=list)  # (step, where, reproduced) per audit event

    def reproduced(self, step: int, labels) -> bool:
        return all(self.predictions[lab].reproduces(step) for lab in labels if lab in self.predictions)

    @property
    def exit_code(self) -> int:
        return int(not all(p.identical for p in self.predictions.values()))

    def as_json(self) -> dict:
        return {"predictions": {lab: p.as_json() for lab, p in self.predictions.items()},
                "events": [{"step": s, "where": w, "reproduced": r} for s, w, r in self.events],
                "exit_code": self.exit_code}


def event_labels(finding, stream_labels) -> list[str]:
    """The streams an audit finding involves."""
    if finding.where == "A+B":
        return list(stream_labels)
    if finding.where == "divergence":
        return [lab for lab in finding.tokens if lab in stream_labels]
    return [finding.where]


def reproduce(rep, model, ctx, schedules: list[Schedule], eog_ids=frozenset()) -> Reproduction:
    """Predict every stream of the audit report ``rep`` (refimpl.oracle.audit.Report) under its schedule and
    mark each event reproduced or not; sets ``rep.reproduce``."""
    if not getattr(ctx, "ggml", None):
        raise RefimplError("--draft / --schedule predict llama.cpp's own stream: they need --emulate=ggml (the oracle "
                           "computing ggml-cpu's bits for each batch shape)")
    preds, done = {}, {}  # done: (schedule, length) -> a Prediction already computed (the stream pair of one --draft N)
    for s, sch in zip(rep.streams, schedules):
        key = (sch, max(1, len(s.tokens)))  # all that predict() depends on, besides the model, prompt and ctx
        if key in done:  # the same schedule asked for as many tokens: llama.cpp's stream is the same
            p = done[key]
            preds[s.label] = Prediction(s.label, sch, list(p.tokens), list(s.tokens), [dict(r) for r in p.rounds])
        else:
            preds[s.label] = done[key] = predict(model, rep.prompt, s.label, s.tokens, sch, ctx, eog_ids)
    out = Reproduction(preds)
    labels = [s.label for s in rep.streams]
    for f in rep.events:
        out.events.append((f.step, f.where, out.reproduced(f.step, event_labels(f, labels))))
    rep.reproduce = out
    return out


# ---- the report as text ----------------------------------------------------------------------------


def event_line(r: Reproduction, finding, stream_labels, tokenizer=None) -> str:
    """``reproduced: …`` / ``not reproduced: …`` for one audit event."""
    labs = [lab for lab in event_labels(finding, stream_labels) if lab in r.predictions]
    if r.reproduced(finding.step, labs):
        by = {lab: r.predictions[lab].batch_of(finding.step) for lab in labs}
        if len(set(by.values())) == 1:
            return f"reproduced: llama.cpp's {next(iter(by.values()))} computes {'this token' if len(by) == 1 else 'both tokens'}"
        first, *rest = by.items()
        return (f"reproduced: llama.cpp computes {first[0]}'s token by its {first[1]}, "
                + ", ".join(f"{lab}'s by its {b}" for lab, b in rest))
    bad = [lab for lab in labs if not r.predictions[lab].reproduces(finding.step)]
    return "not reproduced: " + "; ".join(_differs(r.predictions[lab], tokenizer) for lab in bad)


def _differs(p: Prediction, tokenizer) -> str:
    k = p.first_difference
    show = (lambda t: str(t)) if tokenizer is None else (lambda t: _piece(tokenizer, t))
    eng = show(p.stream[k]) if k < len(p.stream) else "(end)"
    pred = show(p.tokens[k]) if k < len(p.tokens) else "(end)"
    return (f"{p.label} differs from llama.cpp's predicted {p.schedule.name} stream at step {k} "
            f"({p.label} has {eng}, llama.cpp's {p.batch_of(k)} computes {pred})")


def _piece(tokenizer, t: int) -> str:
    from refimpl.oracle.golden import show_piece

    return f"{t} {show_piece(tokenizer, t)}"


def report_lines(r: Reproduction, tokenizer) -> list[str]:
    lines = ["prediction (--emulate=ggml): each stream against llama.cpp's own stream for its batch schedule:"]
    for p in r.predictions.values():
        if p.identical:
            lines.append(f"  {p.label}: identical to llama.cpp's predicted {p.schedule.name} stream ({len(p.tokens)} tokens; "
                         f"{p.schedule.describe()})")
        else:
            lines.append(f"  {_differs(p, tokenizer)}; {p.schedule.describe()}")
    n_no = sum(not ok for *_, ok in r.events)
    gate = "every stream is llama.cpp's predicted stream" if not r.exit_code else "a stream is not llama.cpp's predicted stream"
    lines.append(f"  gate: {gate}; {len(r.events) - n_no} event{'s' * (len(r.events) - n_no != 1)} reproduced, {n_no} not")
    return lines
