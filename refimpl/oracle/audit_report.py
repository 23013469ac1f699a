"""The audit report as text (:func:`report_lines`): what ``refimpl audit`` prints for a
:class:`refimpl.oracle.audit.Report` — the header, the common prefix, the first divergence with the
oracle's top-2 and margin (and, with ``--threshold auto``, each engine's calibrated threshold and own
margin: :mod:`refimpl.oracle.calibrate`), the tails, the round, log-prob and prediction verdicts, and the
result line. The JSON form is ``Report.as_json``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from refimpl.oracle.audit import Finding, Position, Report
    from refimpl.oracle.calibrate import EngineMargin

def percent(part: float, whole: float) -> str:
    """``part`` as a percentage of ``whole`` ("n/a %" when whole is 0: every logit 0, e.g. from weights
    that are not finite)."""
    return f"{100 * part / whole:.2f}%" if whole else "n/a %"


def _tok(tokenizer, t: int) -> str:
    from refimpl.oracle.golden import show_piece

    return f"{t} {show_piece(tokenizer, t)}"


def _oracle_line(tokenizer, pos: Position) -> str:
    (t1, t2), (l1, l2) = pos.top_ids, pos.top_logits
    return (f"oracle: top-1 {_tok(tokenizer, t1)} {l1:.6g}, top-2 {_tok(tokenizer, t2)} {l2:.6g}; margin {pos.margin:.4g} "
            f"= {percent(pos.margin, pos.max_abs)} of max|logit| {pos.max_abs:.4g} (near-tie threshold {pos.threshold:.4g})")


def _finding_line(tokenizer, f: Finding) -> str:
    label, tok = next(iter(f.tokens.items()))
    who = {"A+B": "both streams have", "A": "A has", "B": "B has"}[f.where]
    engine = "".join(f"; {lab}'s own margin {'≥ ' * e.bound}{e.engine_margin:+.4g}, gap moved {'≥ ' * e.bound}"
                     f"{percent(e.moved, f.oracle.max_abs)}; threshold {100 * e.tau:.2f}%"
                     for lab, e in f.engine.items() if e.engine_margin is not None)  # --threshold auto
    return (f"step {f.step}: {who} {_tok(tokenizer, tok)} (rank {f.oracle.rank[tok]}, {f.oracle.deficit(tok):.4g} below the "
            f"oracle's {_tok(tokenizer, f.oracle.top_ids[0])} = {percent(f.oracle.deficit(tok), f.oracle.max_abs)} of max|logit|"
            f"{engine}): {f.kind}")


def _reproduced(rep: Report, f: Finding) -> str:
    """With a prediction (refimpl.oracle.reproduce): whether llama.cpp's own batches compute this token."""
    if rep.reproduce is None:
        return ""
    from refimpl.oracle.reproduce import event_labels

    return "; reproduced" if rep.reproduce.reproduced(f.step, event_labels(f, [s.label for s in rep.streams])) else "; not reproduced"


def report_lines(rep: Report, tokenizer) -> list[str]:
    s = rep.streams
    lines = [f"audit: {rep.model}, prompt {len(rep.prompt)} ids, emulate {rep.numerics or ('on' if rep.emulate else 'off')}, "
             f"near-tie threshold " + (f"auto (floor {100 * rep.tau:g}%)" if rep.auto else f"{100 * rep.tau:g}% of max|logit|")]
    lines.append("  " + "   ".join(f"{x.label}: {x.source} ({x.kind}, {len(x.tokens)} tokens)" for x in s)
                 + ("   B: the oracle's greedy stream" if len(s) == 1 else ""))
    if rep.auto:  # each stream's calibrated threshold, or why the fixed one (refimpl.oracle.calibrate)
        from refimpl.oracle.calibrate import calibration_line

        lines += ["  " + calibration_line(lab, cal) for lab, cal in rep.calibration.items()]
    prefix = [f for f in rep.findings if f.where == "A+B"]
    if len(s) == 2:
        lines.append(f"common prefix: {rep.common} tokens" + ("" if prefix else ", each the oracle's argmax"))
        lines += ["  " + _finding_line(tokenizer, f) + _reproduced(rep, f) for f in prefix]
    d = rep.divergence
    if d is None:
        if len(s) == 1:
            lines.append(f"A: all {len(s[0].tokens)} tokens are the oracle's argmax (A is the oracle's greedy stream)")
        elif len(s[0].tokens) == len(s[1].tokens):
            lines.append("the streams are identical")
        else:
            longer = max(s, key=lambda x: len(x.tokens))
            lines.append(f"no divergence: {longer.label} continues for {len(longer.tokens) - rep.common} tokens after the other ends")
    else:
        (la, ta), (lb, tb) = d.tokens.items()
        lines.append(f"first divergence at step {d.step} (position {len(rep.prompt) + d.step}): {la} {_tok(tokenizer, ta)}   "
                     f"{lb} {_tok(tokenizer, tb)}")
        lines.append("  " + _oracle_line(tokenizer, d.oracle))
        if d.engine:  # --threshold auto: the engine's own margin (refimpl.oracle.calibrate)
                lines += ["  " + margin_text(lab, e, d.oracle.max_abs) for lab, e in d.engine.items()]
        lines.append(f"  verdict: {d.kind}")
        if rep.reproduce is not None:
            from refimpl.oracle.reproduce import event_line

            lines.append("  " + event_line(rep.reproduce, d, [x.label for x in s], tokenizer))
    tails = [lab for lab in rep.tails if rep.tails[lab] > 0]
    if tails:
        lines.append("after the divergence, each stream against the oracle given its own history:" if d else
                     "after the common prefix, against the oracle given its own history:")
        for lab in tails:
            fs = [f for f in rep.findings if f.where == lab]
            ties, wrong = [f for f in fs if f.benign], [f for f in fs if not f.benign]
            if not fs:
                lines.append(f"  {lab}: {rep.tails[lab]} more tokens, each the oracle's argmax")
                continue
            lines.append(f"  {lab}: {rep.tails[lab]} more tokens, {len(ties)} near-tie, {len(wrong)} wrong")
            lines += ["    " + _finding_line(tokenizer, f) + _reproduced(rep, f) for f in (wrong[:3] + ties[:3] if wrong else ties[:3])]
    from refimpl.oracle.rounds import report_lines as round_lines

    for lab, rr in rep.rounds.items():
        lines += round_lines(rr, lab)
    if rep.rounds_skipped:
        lines.append(f"rounds: not checked ({rep.rounds_skipped})")
    from refimpl.oracle.probs import report_lines as probs_lines

    for lab, pr in rep.probs.items():
        lines += probs_lines(pr, lab)
    if rep.reproduce is not None:
        from refimpl.oracle.reproduce import report_lines as reproduce_lines

        lines += reproduce_lines(rep.reproduce, tokenizer)
    n_ties, n_wrong = rep.n_near_ties, rep.n_wrong
    rounds = "".join(f"; rounds {lab}: {r.verdict}" for lab, r in rep.rounds.items())
    rounds += "".join(f"; probs {lab}: {p.verdict}" for lab, p in rep.probs.items())
    if rep.reproduce is not None:
        rounds += "; " + ("identical to llama.cpp's prediction" if not rep.reproduce.exit_code else "not llama.cpp's prediction")
    lines.append(f"result: {rep.verdict}; {n_ties} near-tie{'s' * (n_ties != 1)}, {n_wrong} wrong{rounds} → exit {rep.exit_code}")
    return lines


def margin_text(label: str, e: EngineMargin, max_abs: float) -> str:
    """A departure's engine evidence, for the report (``max_abs``: the oracle's max|logit| there)."""
    judged = (f"the oracle's margin {e.oracle_margin:.4g} judged against {label}'s threshold {e.limit:.4g} "
              f"({100 * e.tau:.2f}% of max|logit|)")
    if e.engine_margin is None:
        return f"{label}: its log-prob of its token not given; {judged}"
    ge = "≥ " if e.bound else ""
    return (f"{label}: its own log-probs put its token {ge}{e.engine_margin:+.4g} above the oracle's (engine margin), so the "
            f"gap moved {ge}{e.moved:.4g} = {ge}{percent(e.moved, max_abs)} of max|logit|; {judged}")
