"""The engine's log-probabilities against the oracle's log-softmax (a server response's per-token
``logprob`` and ``top_logprobs``, refimpl.oracle.responses): the largest |Δ log p| of the chosen
token and of the top-k entries, the steps where the engine's log-prob is missing or exactly 0.0, and a
``probs:`` verdict against :data:`PROBS_BOUND` (docs/validating-an-engine.md, "Server responses").

Why the bound: the verdict judges |Δ log p| / max|logit| at the position (logit errors scale with
max|logit|, docs/numerics.md). Measured (AMD EPYC, Zen 4 class, AVX-512, 2 vCPUs, 2026-12-02; not yet
on another ISA — the margin of 2–3× is there for llama.cpp's other accumulation orders) with the real llama-server (this package's vendored llama.cpp,
its defaults but ``--no-repack``; the same numbers with ``-t 2 -np 1 -c 1024``) on ``builtin:kjv``:
greedy, 64 tokens after each of "And it came to pass", "In the beginning", "And God said", "Hear, O
Israel:", "And the LORD spake unto Moses, saying,", "Blessed is the man", ``n_probs`` 10, every chosen
and top-10 entry compared: worst 3.1 % with ``--emulate`` (|Δ log p| ≤ 0.045 chosen, ≤ 0.34 top-10),
9.9 % without (≤ 0.29 chosen, ≤ 1.35 top-10). The bounds are about 3× and 2× those:
:data:`PROBS_BOUND` 10 % with emulation, :data:`PROBS_BOUND_PLAIN` 20 % without. The verdict sets the
exit status (1 outside the bound).

A log-prob exactly 0.0 is listed and left out of the maximum: llama-server writes 0.0 when it never
computed the token's probability (its placeholder ``prob = 1.0``, server-context.cpp) — with
``--spec-type draft-mtp`` for every token after the first (tests/data/responses/llama-server-mtp.json).
Missing and 0.0 log-probs are reported, not failed, each step with its reason (:data:`REASONS`):
"partial UTF-8" — after the token the text ends inside a UTF-8 character, told from the oracle's tokenizer
(refimpl.oracle.response_align.Pieces.partial_steps): llama-server held its text back and with it its
entry —, "draft-accepted 0.0" (the placeholder above, no top-k), else "not given". The steps whose ids the
answer does not name (recovered from the bytes sent after them) and the tokens it never sends are listed too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

PROBS_BOUND = 0.10  # max |Δ log p| / max|logit| of llama.cpp against the oracle with --emulate (module docstring)
PROBS_BOUND_PLAIN = 0.20  # the same without emulation
DRAFT_ZERO = "draft-accepted 0.0"  # llama-server's placeholder prob = 1.0: no distribution computed (no top-k)
#: why a step has no log-prob to compare, as the report says it
REASONS = {
    "partial UTF-8": "after this token the text ends inside a UTF-8 character: llama-server held it back and sent no entry",
    DRAFT_ZERO: "llama-server's placeholder for a token accepted from a draft: no distribution was computed",
    "exactly 0.0": "a log-prob of exactly 0.0 beside a top-k: not compared",
    "not given": "the answer has no log-prob for it",
}


@dataclass
class ProbsReport:
    n_steps: int
    bound: float
    info: object  # refimpl.oracle.responses.ResponseInfo
    n_compared: int = 0  # chosen-token log-probs compared
    n_top: int = 0  # top-k entries compared
    chosen_max: float = 0.0
    chosen_step: int | None = None
    top_max: float = 0.0
    top_step: int | None = None
    top_id: int | None = None
    missing: list = field(default_factory=list)  # steps without the chosen token's log-prob
    zero: list = field(default_factory=list)  # (step, oracle log p): the engine's log-prob exactly 0.0
    rel_max: float = 0.0  # max |Δ log p| / max|logit| at its position: what the verdict judges
    rel_step: int | None = None
    why: dict = field(default_factory=dict)  # step → reason (REASONS), for the missing and the 0.0 steps

    def add(self, step: int, token: int, row: np.ndarray) -> None:
        sp = self.info.probs[step]
        if sp is None or sp.logprob is None:
            self.missing.append(step)
            self.why[step] = dict(getattr(self.info, "missing", ())).get(step, "not given")
            if sp is None:
                return
        r = row.astype(np.float64)
        m = float(np.max(r))
        lse = m + math.log(float(np.sum(np.exp(r - m))))
        scale = float(np.max(np.abs(r)))

        def rel(d: float) -> None:
            q = d / scale if scale else (0.0 if d == 0 else math.inf)
            if not q <= self.rel_max:
                self.rel_max, self.rel_step = q, step
        if sp.logprob == 0.0:
            self.zero.append((step, float(r[token]) - lse))
            self.why[step] = DRAFT_ZERO if not sp.top else "exactly 0.0"
        elif sp.logprob is not None:
            d = _delta(sp.logprob, float(r[token]) - lse)
            self.n_compared += 1
            rel(d)
            if not d <= self.chosen_max:
                self.chosen_max, self.chosen_step = d, step
        for tid, lp in sp.top:
            if lp == 0.0 and tid == token:
                continue  # the chosen token's placeholder 0.0, listed above
            d = _delta(lp, float(r[tid]) - lse)
            self.n_top += 1
            rel(d)
            if not d <= self.top_max:
                self.top_max, self.top_step, self.top_id = d, step, tid

    @property
    def verdict(self) -> str:
        if self.info.probs is None:
            return "not compared"
        if self.n_compared + self.n_top == 0:
            return "none compared"
        return "within bound" if self.rel_max <= self.bound else "outside bound"

    @property
    def exit_code(self) -> int:
        return int(self.verdict == "outside bound")

    def as_json(self) -> dict:
        return {"format": self.info.format, "verdict": self.verdict, "bound": self.bound, "n_steps": self.n_steps,
                "n_compared": self.n_compared, "n_top_compared": self.n_top,
                "max_abs_dlogp_chosen": _num(self.chosen_max), "chosen_step": self.chosen_step,
                "max_abs_dlogp_top": _num(self.top_max), "top_step": self.top_step, "top_id": self.top_id,
                "max_rel_dlogp": _num(self.rel_max), "rel_step": self.rel_step,
                "missing_steps": self.missing, "zero_steps": [s for s, _ in self.zero],
                "zero_oracle_logp": [_num(v) for _, v in self.zero],
                "without_logprob": [{"step": st, "reason": self.why[st]} for st in sorted(self.why)],
                "recovered_steps": list(getattr(self.info, "recovered", ())), "unread_tokens": getattr(self.info, "unread", 0),
                "post_sampling": self.info.post_sampling,
                "draft_n": self.info.draft_n, "draft_n_accepted": self.info.draft_n_accepted, "exit_code": self.exit_code}


def _delta(engine: float, oracle: float) -> float:
    if engine == oracle:  # both -inf included
        return 0.0
    return abs(engine - oracle)


def _num(x: float):
    return x if math.isfinite(x) else str(x)


def _steps(steps: list[int], n: int = 8) -> str:
    return ", ".join(map(str, steps[:n])) + (f", … ({len(steps)} in all)" if len(steps) > n else "")


def report_lines(pr: ProbsReport, label: str) -> list[str]:
    info = pr.info
    lines = []
    if info.draft_n is not None:
        lines.append(f"drafts ({label}): the server drafted {info.draft_n} tokens and accepted {info.draft_n_accepted} "
                     "(timings.draft_n / draft_n_accepted)")
    lines += _id_lines(info, label)
    if info.probs is None:
        lines.append(f"probs ({label}): not compared: " + ("the response's probabilities are post-sampling "
                     "(post_sampling_probs), not the model's distribution" if info.post_sampling else "the response has none"))
        return lines
    chosen = (f"chosen {pr.chosen_max:.4g} (step {pr.chosen_step})" if pr.n_compared else "chosen: none given")
    top = (f"top-k {pr.top_max:.4g} (step {pr.top_step}, id {pr.top_id})" if pr.n_top else "top-k: none given")
    lines.append(f"probs ({label}): {pr.n_compared} chosen and {pr.n_top} top-k log-probs of {pr.n_steps} steps against the "
                 f"oracle's log-softmax; max |Δ log p| {chosen}, {top}")
    if pr.n_compared + pr.n_top:
        lines.append(f"  largest |Δ log p| / max|logit|: {100 * pr.rel_max:.2f}% (step {pr.rel_step}); bound {100 * pr.bound:g}%")
    for reason in dict.fromkeys(pr.why[s] for s in pr.missing):
        lines.append(f"  log-prob missing at step {_steps([s for s in pr.missing if pr.why[s] == reason])} "
                     f"({reason}: {REASONS.get(reason, reason)})")
    if pr.zero:
        reasons = ", ".join(dict.fromkeys(pr.why[s] for s, _ in pr.zero))
        lines.append(f"  log-prob exactly 0.0 at step {_steps([s for s, _ in pr.zero])} ({reasons}; oracle log p "
                     + ", ".join(f"{v:.4g}" for _, v in pr.zero[:8]) + "): not compared")
    skipped = len(set(pr.missing) | {s for s, _ in pr.zero})
    lines.append(f"probs: {pr.verdict}" + (f" ({skipped} of {pr.n_steps} steps without a log-prob to compare)" if skipped else ""))
    return lines


def _id_lines(info, label: str) -> list[str]:
    """The ids the answer does not name: recovered from the bytes sent after them, or never sent."""
    out = []
    recovered, unread = getattr(info, "recovered", ()), getattr(info, "unread", 0)
    if recovered:
        out.append(f"ids ({label}): step {_steps(list(recovered))}: not named by the answer (llama-server held the tokens back: "
                   "partial UTF-8); recovered from the bytes sent after them with the oracle's tokenizer")
    if unread:
        out.append(f"ids ({label}): the server counts {unread} more generated token(s) after the last one it sent: never "
                   "sent (held back when generation ended), not audited")
    return out
