"""Round audit: the MTP head's drafts and acceptance, round by round, against the oracle's head.

Four MTP bug classes (the head fed h_p instead of h_{p−1}, the pre-norm hidden, stale head KV rows,
input norms shifted twice) can never change a greedy stream: the target still decides every token.
They change only which drafts are made, so only acceptance shows them — 2–30 points low in the
engines that shipped them (docs/bug-classes.md). When a stream comes with per-round information,
``refimpl audit`` therefore also replays the speculative rounds with the oracle's own MTP head on the
**same history** and compares, round by round, how many drafts were accepted, and the draft ids when
the engine logs them (docs/validating-an-engine.md, "Rounds").

Per-round information (:func:`rounds_from_csv`, :func:`rounds_from_json`):

* a telemetry CSV in refimpl's layout (``refimpl run --mtp --csv``): rows grouped by ``step``,
  ``kind`` ∈ plain | draft | correction | bonus, optional ``drafts`` on a round's first row
  (space-separated ids), preamble ``spec=mtp``, ``spec_draft_max=``, ``mtp_p_min=``;
* JSON: ``{"prompt_tokens": […], "tokens": […], "spec_draft_max": 3, "mtp_p_min": 0.0,
  "rounds": [{"accepted": k, "drafted": n, "drafts": [ids]}, …]}`` — ``drafted`` and ``drafts``
  optional (``refimpl run --mtp --json`` prints this form).

The replay (:func:`check_rounds`), with the stream's tokens x and rounds r = 0, 1, …: the oracle's
trunk reads prompt + x teacher-forced once (the hidden h_nextn of every position); its head catches up
on the prompt, then per round at position P (id_last = x_P, the round confirmed k_e + 1 tokens):

1. the head drafts with n_max = the engine's drafted count (from ``drafted``/``drafts``, or from the
   kinds: a round ending in ``bonus`` drafted k_e; else the budget min(spec_draft_max, tokens left − 1)),
   stopping early below ``mtp_p_min`` as refimpl's drafter does;
2. the oracle's accepted count k_o = how many leading drafts equal the stream's next tokens;
3. the round **matches** when k_o = k_e and (if logged) the draft ids are equal. Otherwise, at the
   first draft index i where they part (the two heads agree on everything before i), the oracle's
   head logits ℓ at step i judge it as the stream audit judges a token: a **near-tie** when the
   engine's choice there (its logged draft; else the stream token it must have drafted when
   k_e > k_o; else — k_e < k_o — any runner-up) is within τ·max|ℓ| of the head's best, else **wrong**;
4. the head catches up on the round's confirmed tokens (x_P … x_{P+k_e}, paired with h_{P−1} …).

Tolerance: exit status 1 when any round is wrong; near-tie rounds are reported, not failed (τ is
the stream audit's ``--threshold``, default 5 % of max|logit|). An engine's head computed with
other kernels legitimately flips near-ties; a head fed the wrong input leaves the band.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from refimpl.errors import RefimplError

DEFAULT_DRAFT_MAX = 3  # refimpl run's --draft default, for a log that does not say


@dataclass(frozen=True)
class RoundLog:
    """What the engine logged for one round."""

    accepted: int  # k_e: accepted drafts
    n_tokens: int  # tokens the round confirmed (k_e + 1, fewer only if generation ended inside it)
    drafted: int | None = None  # drafts verified, when known
    drafts: tuple[int, ...] | None = None  # the draft ids, when logged


@dataclass(frozen=True)
class RoundsInfo:
    rounds: list[RoundLog]
    draft_max: int
    p_min: float
    source: str  # "mtp" (only MTP rounds are replayed)


def _budget(info: RoundsInfo, log: RoundLog, left: int) -> int:
    if log.drafts is not None:
        return len(log.drafts)
    if log.drafted is not None:
        return log.drafted
    return min(info.draft_max, left - 1)


def rounds_from_kinds(steps: list[tuple[str, str, str]], head: dict, where: str) -> RoundsInfo:
    """Rounds from per-token (step, kind, drafts) triples, in stream order (the telemetry CSV's columns)."""
    rounds: list[RoundLog] = []
    groups: list[list[tuple[str, str, str]]] = []
    for row in steps:
        if not groups or row[0] != groups[-1][0][0]:
            groups.append([])
        groups[-1].append(row)
    for n, g in enumerate(groups):
        kinds = [k for _, k, _ in g]
        bad = [k for k in kinds if k not in ("plain", "draft", "correction", "bonus")]
        if bad:
            raise RefimplError(f"{where}: round {n}: kind {bad[0]!r} (expected plain, draft, correction or bonus)")
        accepted = kinds.count("draft")
        drafts = tuple(int(t) for t in g[0][2].split()) if g[0][2].strip() else None
        drafted = 0 if kinds[-1] == "plain" else accepted if kinds[-1] == "bonus" else None
        rounds.append(RoundLog(accepted, len(g), drafted, drafts if drafts is not None or drafted != 0 else ()))
    return RoundsInfo(rounds, int(head.get("spec_draft_max") or DEFAULT_DRAFT_MAX), float(head.get("mtp_p_min") or 0.0),
                      head.get("spec", "mtp"))


def rounds_from_json(obj: dict, where: str) -> RoundsInfo:
    """Rounds from the documented JSON form (module docstring)."""
    meta = {**(obj.get("stats") or {}), **obj}  # refimpl run --json keeps spec_draft_max, mtp_p_min in "stats"
    if not isinstance(obj["rounds"], list):
        raise RefimplError(f"{where}: 'rounds' must be a list of objects")
    rounds = []
    for n, r in enumerate(obj["rounds"]):
        if not isinstance(r, dict) or not isinstance(r.get("accepted"), int):
            raise RefimplError(f"{where}: rounds[{n}] must be an object with an integer 'accepted'")
        drafts = r.get("drafts")
        if drafts is not None and (not isinstance(drafts, list) or not all(isinstance(t, int) for t in drafts)):
            raise RefimplError(f"{where}: rounds[{n}].drafts must be a list of token ids")
        rounds.append(RoundLog(r["accepted"], r["accepted"] + 1, r.get("drafted"), tuple(drafts) if drafts is not None else None))
    return RoundsInfo(rounds, int(meta.get("spec_draft_max", DEFAULT_DRAFT_MAX)), float(meta.get("mtp_p_min", 0.0)),
                      meta.get("spec", "mtp"))


# ---- the replay -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundCheck:
    """One round: the engine's and the oracle's accepted counts and drafts, and the verdict."""

    index: int
    pos0: int
    engine_accepted: int
    oracle_accepted: int
    oracle_drafts: list[int]
    engine_drafts: list[int] | None
    kind: str  # match | near-tie | wrong
    at: int | None = None  # first draft index where they part
    margin: float | None = None  # the oracle head's top-1 − top-2 there
    deficit: float | None = None  # how far below the head's best the engine's choice was (when known)
    threshold: float | None = None  # τ·max|logit| of that row


@dataclass
class RoundsReport:
    tau: float
    checks: list[RoundCheck] = field(default_factory=list)
    n_tokens_checked: int = 0

    @property
    def first(self) -> RoundCheck | None:
        return next((c for c in self.checks if c.kind != "match"), None)

    @property
    def exit_code(self) -> int:
        return int(any(c.kind == "wrong" for c in self.checks))

    def totals(self) -> dict:
        c = self.checks
        return {"rounds": len(c), "engine_accepted": sum(x.engine_accepted for x in c),
                "oracle_accepted": sum(x.oracle_accepted for x in c), "oracle_drafted": sum(len(x.oracle_drafts) for x in c),
                "differ": sum(x.kind != "match" for x in c), "near_tie": sum(x.kind == "near-tie" for x in c),
                "wrong": sum(x.kind == "wrong" for x in c)}

    @property
    def verdict(self) -> str:
        f = self.first
        return "match" if f is None else f.kind

    def as_json(self) -> dict:
        return {"verdict": self.verdict, "threshold": self.tau, "totals": self.totals(),
                "first": None if self.first is None else self.first.__dict__, "exit_code": self.exit_code,
                "rounds": [c.__dict__ for c in self.checks]}


def _hidden(model, tokens: list[int], ctx) -> np.ndarray:
    """The trunk's h_nextn [T, E] for every position of ``tokens``, teacher-forced (``golden_run.CHUNK``
    positions per call, as the stream audit: with streamed experts a chunk reads each expert it uses once)."""
    from refimpl.oracle.golden_run import CHUNK
    from refimpl.model.trunk import forward
    from refimpl.model.state import SeqState

    state, hs = SeqState.fresh(model.config), []
    for i in range(0, len(tokens), CHUNK):
        _, h, state = forward(model, state, tokens[i:i + CHUNK], ctx, outputs="none")  # [≤CHUNK, E]
        hs.append(h)
    return np.concatenate(hs)


def _judge(index, pos0, k_e, k_o, drafts, rows, eng_drafts, stream_next, tau) -> RoundCheck:
    """Verdict of one round (module docstring, step 3)."""
    if eng_drafts is not None:
        i = next((j for j, (a, b) in enumerate(zip(eng_drafts, drafts)) if a != b), None)
        if i is None and len(eng_drafts) != len(drafts):
            i = min(len(eng_drafts), len(drafts))
        if i is None and k_e == k_o:
            return RoundCheck(index, pos0, k_e, k_o, drafts, eng_drafts, "match")
    else:
        if k_e == k_o:
            return RoundCheck(index, pos0, k_e, k_o, drafts, eng_drafts, "match")
        i = min(k_e, k_o)
    if i is None or i >= len(rows):  # one side drafted further than the head ran (a p_min cut or a budget)
        return RoundCheck(index, pos0, k_e, k_o, drafts, eng_drafts, "wrong", i)
    row = rows[i]
    top = np.sort(row)[-2:]
    margin, best, thr = float(top[1] - top[0]), float(top[1]), tau * float(np.max(np.abs(row)))
    if eng_drafts is not None and i < len(eng_drafts):
        deficit = best - float(row[eng_drafts[i]])
    elif k_e > k_o:
        deficit = best - float(row[stream_next[i]])  # the engine drafted the stream's token here
    else:
        deficit = margin  # the engine drafted something other than the head's best: at best its runner-up
    kind = "near-tie" if deficit <= thr else "wrong"
    return RoundCheck(index, pos0, k_e, k_o, drafts, eng_drafts, kind, i, margin, deficit, thr)


@dataclass(frozen=True)
class Replayed:
    """The oracle head's side of one round: what it drafts at position P and how many of those the
    stream's next tokens confirm."""

    pos0: int  # P: the position of id_last
    drafts: list[int]
    rows: list[np.ndarray]  # the head's logits [V] at each draft step
    following: list[int]  # the stream's tokens from this round on
    oracle_accepted: int  # k_o


def replay_rounds(model, prompt: list[int], tokens: list[int], info: RoundsInfo, *, ctx=None) -> tuple[RoundsInfo, list[Replayed]]:
    """Steps 1, 2 and 4 of the module docstring: the oracle's head on the stream's history, round by
    round. Returns ``info`` (its last round cut where an end-of-generation token falls inside it) and
    one :class:`Replayed` per round. The replay reads only the rounds' sizes (confirmed tokens and
    draft budget), never the engine's draft ids, so one replay serves any judgement of the same rounds."""
    from refimpl.decode.drafts import DraftRequest, MTPSource
    from refimpl.model.ops import Ctx

    ctx = ctx or Ctx()
    total = sum(r.n_tokens for r in info.rounds)
    if info.rounds and total > len(tokens) and total - info.rounds[-1].n_tokens < len(tokens):  # an end-of-generation
        last = info.rounds[-1]                                                                 # token inside the last round
        info = RoundsInfo(info.rounds[:-1] + [RoundLog(last.accepted, last.n_tokens - (total - len(tokens)), last.drafted,
                                                       last.drafts)], info.draft_max, info.p_min, info.source)
    elif total != len(tokens):
        raise RefimplError(f"the rounds confirm {total} tokens, the stream holds {len(tokens)}")
    src = MTPSource(model, ctx, info.p_min)  # one-line RefimplError on a file without the MTP block
    seq = list(prompt) + list(tokens)
    h = _hidden(model, seq, ctx)  # [T, E]
    state = src.start()
    if len(prompt) > 1:
        state = src.process(state, prompt[:-1], h[: len(prompt) - 1])
    out: list[Replayed] = []
    g = 0  # tokens confirmed so far
    for log in info.rounds:
        P = len(prompt) - 1 + g
        n_max = _budget(info, log, len(tokens) - g)
        drafts, rows = src.draft_rows(state, DraftRequest(tuple(seq[: P + 1]), n_max)) if n_max > 0 else ([], [])
        following = tokens[g:]
        k_o = next((i for i, d in enumerate(drafts) if i >= len(following) or d != following[i]), len(drafts))
        out.append(Replayed(P, drafts, rows, following, k_o))
        k = log.n_tokens - 1  # the trunk decoded id_last and the accepted drafts: positions P … P+k
        state = src.process(state, seq[P : P + k + 1], h[P : P + k + 1])
        g += log.n_tokens
    return info, out


def judge_rounds(info: RoundsInfo, replayed: list[Replayed], tau: float = 0.05) -> RoundsReport:
    """Step 3 of the module docstring for every round of ``info`` (as :func:`replay_rounds` returned it)."""
    rep = RoundsReport(tau)
    for j, (log, r) in enumerate(zip(info.rounds, replayed, strict=True)):
        eng = list(log.drafts) if log.drafts is not None else None
        rep.checks.append(_judge(j, r.pos0, log.accepted, r.oracle_accepted, r.drafts, r.rows, eng, r.following, tau))
    rep.n_tokens_checked = sum(log.n_tokens for log in info.rounds)
    return rep


def without_ids(info: RoundsInfo) -> RoundsInfo:
    """The same rounds as a log that keeps only the accepted and drafted counts (the drafted count
    from the ids where they were logged, as :func:`_budget` reads them)."""
    rounds = [RoundLog(r.accepted, r.n_tokens, len(r.drafts) if r.drafts is not None else r.drafted) for r in info.rounds]
    return RoundsInfo(rounds, info.draft_max, info.p_min, info.source)


def check_rounds(model, prompt: list[int], tokens: list[int], info: RoundsInfo, *, ctx=None, tau: float = 0.05) -> RoundsReport:
    """Replay the stream's rounds with the oracle's MTP head and judge each (module docstring)."""
    info, replayed = replay_rounds(model, prompt, tokens, info, ctx=ctx)
    return judge_rounds(info, replayed, tau)


def report_lines(rep: RoundsReport, label: str = "A") -> list[str]:
    t = rep.totals()
    lines = [f"rounds ({label}): {t['rounds']} rounds replayed with the oracle's MTP head on the stream's history; "
             f"accepted: engine {t['engine_accepted']}, oracle {t['oracle_accepted']} of {t['oracle_drafted']} drafted"]
    f = rep.first
    if f is None:
        lines.append("  every round matches (accepted counts" + (", draft ids" if any(c.engine_drafts is not None for c in rep.checks) else "") + ")")
    else:
        lines.append(f"  first differing round {f.index} (position {f.pos0}): engine accepted {f.engine_accepted}, oracle "
                     f"{f.oracle_accepted}; oracle drafts {f.oracle_drafts}"
                     + (f", engine drafts {f.engine_drafts}" if f.engine_drafts is not None else ""))
        if f.margin is not None:
            lines.append(f"  at draft {f.at}: head margin {f.margin:.4g}, engine's choice {f.deficit:.4g} below the head's best "
                         f"(near-tie threshold {f.threshold:.4g}): {f.kind}")
        else:
            lines.append(f"  at draft {f.at}: beyond the drafts the oracle's head made: {f.kind}")
        lines.append(f"  {t['differ']} of {t['rounds']} rounds differ: {t['near_tie']} near-tie, {t['wrong']} wrong")
    lines.append(f"rounds result: {rep.verdict} → exit {rep.exit_code}")
    return lines

