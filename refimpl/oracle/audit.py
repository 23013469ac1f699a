"""Stream audit: when two token streams (or a stream and the oracle) disagree, say who is wrong.

A C++ engine's draft-1 and draft-3 runs should produce the same greedy stream, but a batched
verify matmul is not bit-identical to single-token ones, so a flip at a *near-tie* is benign while a
broken accept/rollback path is not. ``refimpl audit`` tells them apart (docs/validating-an-engine.md):

1. Read the streams (:func:`refimpl.oracle.stream_file.read_stream`): a JSON array of ids, a JSON object with ``tokens`` (as
   ``refimpl run --json`` prints), a telemetry CSV with a ``token`` / ``token_id`` column (as
   ``refimpl run --csv`` writes), a server's response (llama-server ``/completion`` or OpenAI-style, whole or
   streamed: :mod:`refimpl.oracle.responses`; its log-probs are compared with the oracle's log-softmax,
   :mod:`refimpl.oracle.probs`), or plain text (tokenized with the model's tokenizer).
2. Run the oracle teacher-forced over prompt + the common prefix, then over each stream's own tail
   (:func:`refimpl.oracle.golden.walk`). At each position p it gives logits ℓ; ℓ* = max ℓ, and a token t's
   *deficit* is ℓ* − ℓ[t] (0 for the oracle's argmax).
3. Classify the first divergence (A has a, B has b, a ≠ b), with τ = ``threshold`` (default 0.05)::

       near-tie     deficit(a) ≤ τ·max|ℓ| and deficit(b) ≤ τ·max|ℓ|
                    (the usual case: a and b are the oracle's top-2 and their margin is ≤ τ·max|ℓ|)
       A wrong      otherwise, if the oracle's argmax is b
       B wrong      otherwise, if the oracle's argmax is a
       both wrong   otherwise

   Every other position where a stream's token is not the oracle's argmax (in the common prefix,
   or in a tail given that stream's own history) is a *departure*: a near-tie when its deficit is
   ≤ τ·max|ℓ|, else wrong. With one stream, the other is the oracle's own greedy stream: the
   first departure is the divergence (near-tie or A wrong).

Why τ = 5 % of max|ℓ| (docs/validating-an-engine.md): two correct implementations of the same
quantized model differ by up to ~2 % of max|ℓ| per logit (docs/numerics.md, refimpl vs llama.cpp),
so a margin (a difference of two logits) moves by up to ~4–5 %; the largest margin measured at a
real refimpl/llama.cpp disagreement was 3.3 %, and argmaxes agreed wherever it exceeded 5 %. With
``auto`` (``--threshold auto``, for engines whose rounding the oracle does not emulate) each stream's τ is
calibrated on its own log-probs, τ the floor, and each departure also carries the engine's own margin
(:mod:`refimpl.oracle.calibrate`).

4. A stream that carries per-round information (a telemetry CSV's ``step``/``kind``/``drafts``, or
   JSON ``rounds``) also gets the round audit of :mod:`refimpl.oracle.rounds`: its MTP rounds replayed with
   the oracle's head on the same history.

5. With ``--emulate=ggml`` (``--draft N``: the engine's batch schedule) each stream is also compared with
   llama.cpp's own stream for that schedule, predicted bit for bit (:mod:`refimpl.oracle.reproduce`): each
   event is *reproduced* (llama.cpp's batches compute that token) or *not reproduced*.

Exit status (:attr:`Report.exit_code`): 0 when nothing but near-ties was found (in the stream and
in the rounds), 1 otherwise. With a prediction (step 5) the stream part of the gate is byte identity
instead: 0 when every stream is llama.cpp's predicted stream (a reproduced wrong token included), 1 when
one is not (a near-tie included). ``refimpl audit GOLDEN STREAM`` is :mod:`refimpl.oracle.golden_audit`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from refimpl.oracle.golden import TIE_THRESHOLD, check_tau  # noqa: F401  (the near-tie rule; refimpl.oracle.audit.TIE_THRESHOLD too)
# the stream files (step 1), read by refimpl.oracle.stream_file; importable from here too
from refimpl.oracle.stream_file import Stream, check_streams, prompt_of, read_stream  # noqa: F401


# ---- the oracle's judgement of one position ---------------------------------------------------


@dataclass(frozen=True)
class Position:
    """What the oracle says at one generated step (logits are float32 values as Python floats)."""

    top_ids: list[int]  # the oracle's two best ids (ties to the lower id)
    top_logits: list[float]
    max_abs: float  # max |logit|: the scale of the threshold
    threshold: float  # τ·max|logit|
    logit: dict[int, float]  # the logit of each token involved
    rank: dict[int, int]  # 0 = the oracle's argmax

    @property
    def margin(self) -> float:
        return self.top_logits[0] - self.top_logits[1]

    def deficit(self, tok: int) -> float:
        return self.top_logits[0] - self.logit[tok]

    def close(self, tok: int) -> bool:
        return self.deficit(tok) <= self.threshold


def judge(row: np.ndarray, tokens, tau: float) -> Position:
    from refimpl.oracle.golden import top_k

    ids, logits = top_k(row, 2)
    max_abs = float(np.max(np.abs(row)))
    logit = {int(t): float(row[t]) for t in tokens}
    rank = {t: int(np.sum(row > row[t]) + np.sum(row[:t] == row[t])) for t in logit}
    return Position(ids, logits, max_abs, tau * max_abs, logit, rank)


@dataclass(frozen=True)
class Finding:
    """One position where a stream's token is not the oracle's argmax (or the streams diverge)."""

    step: int  # generated-token index (position = len(prompt) + step)
    where: str  # "A", "B", "A+B" (the common prefix) or "divergence"
    kind: str  # near-tie | wrong | A wrong | B wrong | both wrong
    tokens: dict[str, int]  # stream label → its token here
    oracle: Position
    engine: dict = field(default_factory=dict)  # --threshold auto: label → calibrate.EngineMargin (the engine's own evidence)

    @property
    def benign(self) -> bool:
        return self.kind == "near-tie"


def _departure(step: int, where: str, tok: int, pos: Position, labels, ok: bool | None = None) -> Finding:
    """``ok``: the token's closeness when judged otherwise (--threshold auto, refimpl.oracle.calibrate); else pos.close."""
    close = pos.close(tok) if ok is None else ok
    return Finding(step, where, "near-tie" if close else "wrong", {lab: tok for lab in labels}, pos)


def _divergence(step: int, a: int, b: int, pos: Position, labels=("A", "B"), ok: tuple | None = None) -> Finding:
    if (pos.close(a) and pos.close(b)) if ok is None else all(ok):
        kind = "near-tie"
    elif pos.top_ids[0] == b:
        kind = f"{labels[0]} wrong"
    elif pos.top_ids[0] == a:
        kind = f"{labels[1]} wrong"
    else:
        kind = "both wrong"
    return Finding(step, "divergence", kind, {labels[0]: a, labels[1]: b}, pos)


# ---- the audit ---------------------------------------------------------------------------------


@dataclass
class Report:
    model: str
    prompt: list[int]
    streams: list[Stream]
    tau: float
    emulate: bool
    numerics: str = ""  # Ctx.numerics(): which llama.cpp rounding points the oracle emulated
    common: int = 0  # length of the common prefix
    divergence: Finding | None = None
    findings: list[Finding] = field(default_factory=list)  # departures, in the prefix and the tails
    tails: dict[str, int] = field(default_factory=dict)  # label → tokens after the divergence
    rounds: dict = field(default_factory=dict)  # label → refimpl.oracle.rounds.RoundsReport (streams with per-round info)
    rounds_skipped: str | None = None  # why streams' rounds were not replayed
    probs: dict = field(default_factory=dict)  # label → ProbsReport (streams that carry log-probs)
    reproduce: object = None  # refimpl.oracle.reproduce.Reproduction (--emulate=ggml --draft): llama.cpp's predicted streams
    auto: bool = False  # --threshold auto: each stream judged by its calibrated threshold (refimpl.oracle.calibrate)
    samples: dict = field(default_factory=dict)  # --threshold auto: label → calibrate.Samples (the log-probs' spread)
    calibration: dict = field(default_factory=dict)  # --threshold auto: label → calibrate.Calibration
    margins: dict = field(default_factory=dict)  # label → {step: margin_step(…)}: every step the oracle saw (the HTML
    # report's margin picture, refimpl.oracle.html_report; not in as_json)

    @property
    def events(self) -> list[Finding]:
        return self.findings + ([self.divergence] if self.divergence else [])

    @property
    def n_near_ties(self) -> int:
        return sum(f.benign for f in self.events)

    @property
    def n_wrong(self) -> int:
        return sum(not f.benign for f in self.events)

    @property
    def exit_code(self) -> int:
        # with a prediction (refimpl.oracle.reproduce) the gate is byte identity with llama.cpp's predicted streams
        stream = self.reproduce.exit_code if self.reproduce is not None else 0 if self.n_wrong == 0 else 1
        return max([stream] + [r.exit_code for r in self.rounds.values()]
                   + [p.exit_code for p in self.probs.values()])

    @property
    def verdict(self) -> str:
        """The divergence's class, or "identical" / "clean" when the streams never diverge."""
        if self.divergence is not None:
            return self.divergence.kind
        return "identical" if len(self.streams) == 2 and self.streams[0].tokens == self.streams[1].tokens else "clean"

    def as_json(self) -> dict:
        def finding(f: Finding) -> dict:
            d = asdict(f)
            d["oracle"]["margin"] = f.oracle.margin
            d["oracle"]["logit"] = {str(k): v for k, v in f.oracle.logit.items()}
            d["oracle"]["rank"] = {str(k): v for k, v in f.oracle.rank.items()}
            d["deficit"] = {lab: f.oracle.deficit(t) for lab, t in f.tokens.items()}
            for lab, e in f.engine.items():  # --threshold auto (refimpl.oracle.calibrate)
                d["engine"][lab].update(moved=e.moved, close=e.close)
            if self.reproduce is not None:
                from refimpl.oracle.reproduce import event_labels

                d["reproduced"] = self.reproduce.reproduced(f.step, event_labels(f, [s.label for s in self.streams]))
            return d

        out = {"model": self.model, "prompt_tokens": self.prompt, "threshold": self.tau, "emulate": self.emulate,
                "numerics": self.numerics,  # Ctx.numerics(): with --emulate=ggml, the path and the ggml version
                "streams": [{"label": s.label, "source": s.source, "kind": s.kind, "n_tokens": len(s.tokens)} for s in self.streams],
                "common_prefix": self.common, "verdict": self.verdict,
                "divergence": finding(self.divergence) if self.divergence else None,
                "findings": [finding(f) for f in self.findings],
                "rounds": {lab: r.as_json() for lab, r in self.rounds.items()},
                "probs": {lab: p.as_json() for lab, p in self.probs.items()}, "exit_code": self.exit_code}
        if self.reproduce is not None:  # --emulate=ggml: llama.cpp's predicted streams (refimpl.oracle.reproduce)
            out["reproduce"] = self.reproduce.as_json()
        if self.auto:  # --threshold auto: "threshold" is the floor; each stream's own (refimpl.oracle.calibrate)
            out["threshold_auto"] = True
            out["calibration"] = {lab: c.as_json() for lab, c in self.calibration.items()}
        return out


def audit(model, prompt: list[int], stream_a: Stream, stream_b: Stream | None = None, *, ctx=None,
          tau: float = TIE_THRESHOLD, model_name: str = "", auto: bool = False) -> Report:
    """Audit one stream against the oracle's greedy stream, or two streams against each other (the
    module docstring). ``ctx``: the oracle's numerics (``Ctx()``, or emulation for quantized files). ``auto``
    (``--threshold auto``): each stream's departures judged by a threshold calibrated on its own log-probs,
    ``tau`` the floor (refimpl.oracle.calibrate)."""
    from refimpl.oracle.golden import start, walk
    from refimpl.model.ops import Ctx, argmax  # argmax: the greedy choice (a NaN logit passed over, as llama.cpp does)

    ctx = ctx or Ctx()
    check_tau(tau)
    streams = [stream_a] + ([stream_b] if stream_b else [])
    check_streams(streams, model.config.n_vocab)
    rep = Report(model_name, list(prompt), streams, tau, bool(ctx.act_quant), ctx.numerics(), auto=auto)
    _audit_rounds(rep, model, ctx)
    probe = _probs_probe(rep)
    cur = start(model, prompt, ctx)

    if stream_b is None:  # A against the oracle: the first departure is the divergence from its greedy stream
        a = stream_a.tokens

        def on_row(i, row):
            probe(stream_a, i, row)
            if argmax(row) != a[i]:
                pos = judge(row, (a[i], argmax(row)), tau)
                if rep.divergence is None:
                    rep.common = i
                    rep.divergence = _divergence(i, a[i], pos.top_ids[0], pos, ("A", "oracle"))
                else:
                    rep.findings.append(_departure(i, "A", a[i], pos, "A"))

        walk(model, cur, a, ctx, on_row)
        if rep.divergence is None:
            rep.common = len(a)
        else:
            rep.tails["A"] = len(a) - rep.common - 1
        return _calibrated(rep)

    a, b = stream_a.tokens, stream_b.tokens
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    rep.common = k

    def prefix_row(i, row):
        probe(stream_a, i, row)
        probe(stream_b, i, row)
        if argmax(row) != a[i]:
            rep.findings.append(_departure(i, "A+B", a[i], judge(row, (a[i],), tau), "AB"))

    cur = walk(model, cur, a[:k], ctx, prefix_row)
    if k < len(a) and k < len(b):
        rep.divergence = _divergence(k, a[k], b[k], judge(cur.row, (a[k], b[k]), tau))
    for s in (stream_a, stream_b):
        tail = s.tokens[k:]
        first = 1 if rep.divergence else 0  # the divergence itself is judged above
        rep.tails[s.label] = len(tail) - first

        def tail_row(i, row, s=s, tail=tail, first=first):
            probe(s, k + i, row)
            if i >= first and argmax(row) != tail[i]:
                rep.findings.append(_departure(k + i, s.label, tail[i], judge(row, (tail[i],), tau), s.label))

        walk(model, cur, tail, ctx, tail_row)
    return _calibrated(rep)


def _calibrated(rep: Report) -> Report:
    """--threshold auto: each stream's threshold from its own samples, the findings judged again with it
    (refimpl.oracle.calibrate; ``refimpl validate`` calibrates again per server over all its answers)."""
    if rep.auto:
        from refimpl.oracle.calibrate import calibrate

        for lab, smp in rep.samples.items():  # log-probs the probs: verdict rejects calibrate nothing
            smp.outside = int(lab in rep.probs and rep.probs[lab].verdict == "outside bound")
        rep.calibration = {lab: calibrate(smp, rep.tau) for lab, smp in rep.samples.items()}
        rejudge(rep)
    return rep


def rejudge(rep: Report) -> None:
    """Re-classify ``rep``'s findings with each stream's calibration ``rep.calibration``
    (label → Calibration): each stream's token at a departure judged by step 3, the oracle's own token
    (the argmax) always close. The findings are replaced in place, in order."""
    import dataclasses

    from refimpl.oracle.calibrate import engine_margin

    streams = {s.label: s for s in rep.streams}

    def evidence(label: str, tok: int, f) -> EngineMargin | None:
        if label == "oracle" or tok == f.oracle.top_ids[0]:
            return None
        s = streams[label]
        probs = s.response.probs if s.response is not None else None
        sp = probs[f.step] if probs is not None and f.step < len(probs) else None
        return engine_margin(rep.calibration[label], sp, tok, f.oracle)

    def again(f):
        ev = {lab: evidence(lab, tok, f) for lab, tok in f.tokens.items()}
        ok = {lab: e is None or e.close for lab, e in ev.items()}
        taus = [rep.calibration[lab].tau for lab in f.tokens if lab in rep.calibration]
        pos = dataclasses.replace(f.oracle, threshold=max(taus) * f.oracle.max_abs)
        if f.where == "divergence":
            (la, a), (lb, b) = f.tokens.items()
            g = _divergence(f.step, a, b, pos, (la, lb), ok=(ok[la], ok[lb]))
        else:
            g = _departure(f.step, f.where, next(iter(f.tokens.values())), pos, list(f.tokens), ok=all(ok.values()))
        return dataclasses.replace(g, engine={lab: e for lab, e in ev.items() if e is not None})

    rep.findings = [again(f) for f in rep.findings]
    if rep.divergence is not None:
        rep.divergence = again(rep.divergence)


def margin_step(row, tok: int) -> tuple[int, float, float, float]:
    """(the oracle's argmax, its top-1 − top-2 margin, max|logit|, ``tok``'s deficit below the top-1) at one step:
    what ``refimpl plot audit`` draws (refimpl.oracle.plot; the band is τ·max|logit|), by :func:`judge`'s
    definitions, in O(V)."""
    from refimpl.model.ops import argmax

    second, first = (float(x) for x in np.partition(np.where(np.isnan(row), -np.inf, row), -2)[-2:])  # NaN passed over, as top_k
    return argmax(row), first - second, float(np.max(np.abs(row))), first - float(row[tok])


def _probs_probe(rep: Report):
    """``probe(stream, step, row)``: compare the stream's log-probs at ``step`` (if it carries them) with the
    oracle's log-softmax of ``row``, into ``rep.probs`` (refimpl.oracle.probs); every step's :func:`margin_step`
    into ``rep.margins``."""
    from refimpl.oracle.probs import PROBS_BOUND, PROBS_BOUND_PLAIN, ProbsReport

    for s in rep.streams:
        info = s.response
        if info is not None and (info.probs is not None or info.post_sampling or info.recovered or info.unread):
            rep.probs[s.label] = ProbsReport(len(s.tokens), PROBS_BOUND if rep.emulate else PROBS_BOUND_PLAIN, info)

    if rep.auto:
        from refimpl.oracle.calibrate import Samples

        rep.samples = {s.label: Samples(has_probs=s.response is not None and s.response.probs is not None) for s in rep.streams}

    def probe(stream: Stream, step: int, row) -> None:
        rep.margins.setdefault(stream.label, {})[step] = margin_step(row, stream.tokens[step])
        if rep.auto and rep.samples[stream.label].has_probs and rep.margins[stream.label][step][0] == stream.tokens[step]:
            from refimpl.oracle.calibrate import add_samples  # the spread, at the steps not judged (the oracle's argmax)

            probs = stream.response.probs
            add_samples(rep.samples[stream.label], probs[step] if step < len(probs) else None, stream.tokens[step], row)
        pr = rep.probs.get(stream.label)
        if pr is not None and pr.info.probs is not None:
            pr.add(step, stream.tokens[step], row)

    return probe


def _audit_rounds(rep: Report, model, ctx) -> None:
    """The round audit (refimpl.oracle.rounds) of every stream that carries per-round information."""
    from refimpl.oracle.rounds import check_rounds

    with_rounds = [s for s in rep.streams if s.rounds is not None]
    if with_rounds and model.file.plan.mtp == "stripped":
        rep.rounds_skipped = "the model has no MTP block to replay the rounds with"
        return
    for s in with_rounds:
        rep.rounds[s.label] = check_rounds(model, rep.prompt, s.tokens, s.rounds, ctx=ctx, tau=rep.tau)
