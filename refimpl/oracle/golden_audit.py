"""``refimpl audit GOLDEN STREAM``: judge an engine's stream by a golden file, without the model.

A golden file (docs/golden.md) records, for every generated step of the oracle's stream, the top-5
ids with their logits and the top-1 − top-2 margin. While an engine's stream follows the golden's
ids, that record is exactly what ``refimpl audit MODEL STREAM`` would compute, so the first
divergence can be judged from it alone:

* the stream's token is in the recorded top-5: its deficit is top-1 − its logit;
* it is not: its deficit is at least top-1 − top-5 (a lower bound — it is ranked below the fifth);
* near-tie when the deficit is ≤ τ·s, else ``A wrong``. The scale s is the largest |logit| among
  the recorded top-5: the golden does not keep max |logit| over the vocabulary, and s ≤ that, so a
  golden audit is never more lenient than the model audit — at most a few borderline near-ties
  (a deficit between τ·s and τ·max|logit|) are called wrong; the report then says to rerun with
  the model.

After the divergence the stream follows a history the golden never saw: its later tokens are
**outside the golden's coverage**, and the report says from which step (also when the stream runs
past the golden's last step). The prompt is found by its ids among the golden's prompts (the
stream's ``prompt_tokens``, or ``--prompt-tokens``); a stream whose prompt ids appear nowhere is
refused — often the tokenizer differs (e.g. a generic pre-tokenizer regex instead of qwen35's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from refimpl.errors import RefimplError


def is_golden(path: str) -> bool:
    """True when ``path`` is a file whose first line is a refimpl golden header."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with open(p, encoding="utf-8") as f:
            head = json.loads(f.readline())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    from refimpl.oracle.golden_file import FORMAT

    return isinstance(head, dict) and head.get("format") == FORMAT


@dataclass(frozen=True)
class GoldenVerdict:
    golden: str
    model: str
    prompt_index: int
    prompt: list[int]
    n_tokens: int
    tau: float
    step: int | None  # first divergence from the golden's ids (None: none within coverage)
    token: int | None  # the stream's token there
    golden_token: int | None
    kind: str  # identical | near-tie | A wrong
    deficit: float | None  # top-1 − the stream token's logit (a lower bound when outside the top-5)
    exact: bool  # the deficit is exact (token in the recorded top-5)
    scale: float | None  # largest |logit| among the recorded top-5
    step_record: dict | None
    covered: int  # steps of the stream the golden can judge

    @property
    def exit_code(self) -> int:
        return int(self.kind == "A wrong")

    def as_json(self) -> dict:
        return {**self.__dict__, "threshold": None if self.scale is None else self.tau * self.scale, "exit_code": self.exit_code}


def audit_golden(golden_path: str, stream, prompt: list[int] | None, tau: float) -> GoldenVerdict:
    """Judge ``stream`` (a refimpl.oracle.audit.Stream) by the golden file (module docstring)."""
    from refimpl.oracle.golden import check_tau
    from refimpl.oracle.golden_file import read_golden

    check_tau(tau)
    g = read_golden(golden_path)
    prompt = prompt if prompt is not None else stream.prompt
    records = g.prompts
    if prompt is None:
        if len(records) != 1:
            raise RefimplError(f"{golden_path} holds {len(records)} prompts: give the stream's prompt with --prompt-tokens "
                               f"(or a JSON stream with prompt_tokens)")
        rec = records[0]
    else:
        rec = next((r for r in records if r["prompt_ids"] == list(prompt)), None)
        if rec is None:
            raise RefimplError(f"{golden_path}: no prompt with ids {list(prompt)[:8]}{'…' if len(prompt) > 8 else ''} "
                               f"({len(prompt)} ids); the golden's prompts have {[len(r['prompt_ids']) for r in records]} ids "
                               f"— if the text is the same, the tokenization differs")
    ids, steps, tokens = rec["ids"], rec["steps"], stream.tokens
    model = (g.header["model"].get("fixture") or {}).get("spec") or g.header["model"]["file"]
    k = next((i for i, (a, b) in enumerate(zip(tokens, ids)) if a != b), None)
    if k is None:
        return GoldenVerdict(str(golden_path), model, rec["index"], rec["prompt_ids"], len(tokens), tau, None, None, None,
                             "identical", None, True, None, None, min(len(tokens), len(ids)))
    s = steps[k]
    scale = max(abs(x) for x in s["top_logits"])
    tok = tokens[k]
    exact = tok in s["top_ids"]
    deficit = s["top_logits"][0] - (s["top_logits"][s["top_ids"].index(tok)] if exact else s["top_logits"][-1])
    kind = "near-tie" if exact and deficit <= tau * scale else "A wrong"
    return GoldenVerdict(str(golden_path), model, rec["index"], rec["prompt_ids"], len(tokens), tau, k, tok, ids[k], kind,
                         deficit, exact, scale, s, k + 1)


def report_lines(v: GoldenVerdict, stream) -> list[str]:
    lines = [f"audit: golden {v.golden} ({v.model}), prompt {v.prompt_index} ({len(v.prompt)} ids), near-tie threshold "
             f"{100 * v.tau:g}% of the largest recorded |logit|",
             f"  A: {stream.source} ({stream.kind}, {v.n_tokens} tokens), judged by the golden's recorded top-5 and margins, "
             f"without the model"]
    if v.step is None:
        lines.append(f"A follows the golden for all {v.covered} steps it covers")
    else:
        s = v.step_record
        lines.append(f"first divergence at step {v.step} (position {len(v.prompt) + v.step}): A {v.token}   golden {v.golden_token}")
        shown = ", ".join(f"{t} {x:.6g}" for t, x in zip(s["top_ids"], s["top_logits"]))
        where = (f"{v.deficit:.4g} below the top-1" if v.exact else f"not in the recorded top-5: at least {v.deficit:.4g} below the top-1")
        lines.append(f"  golden: top-5 {shown}; A's token {where} = {f'{100 * v.deficit / v.scale:.2f}%' if v.scale else 'n/a %'} of {v.scale:.4g} "
                     f"(near-tie threshold {v.tau * v.scale:.4g})")
        lines.append(f"  verdict: {v.kind}")
        if v.kind == "A wrong" and v.exact and v.deficit <= 2 * v.tau * v.scale:
            lines.append("  (close to the threshold: the golden's scale is the largest recorded logit, not max|logit| over "
                         "the vocabulary; rerun with the model, refimpl audit MODEL STREAM, to be sure)")
    if v.covered < v.n_tokens:
        lines.append(f"coverage: the golden judges steps 0–{v.covered - 1}; steps {v.covered}–{v.n_tokens - 1} follow a "
                     f"history it never saw — judge them with the model: refimpl audit MODEL STREAM")
    lines.append(f"result: {v.kind} → exit {v.exit_code}")
    return lines
