"""``--threshold auto``: a near-tie threshold calibrated on the engine's own log-probabilities, for engines
whose rounding the oracle does not emulate (GPU backends, other engines; docs/validating-an-engine.md,
"GPU and other engines" and §5).

A fixed τ·max|logit| (:data:`refimpl.oracle.golden.TIE_THRESHOLD`) is sized for two CPU implementations of
llama.cpp's math. An engine that rounds differently (a CUDA build's batched kernels, another engine's
accumulation order) moves logits further, and a fixed τ then calls its normal rounding ``wrong``. When the
engine's answers carry its top-k log-probs (:class:`refimpl.oracle.responses.StepProbs`, read by
:func:`refimpl.oracle.responses.read_response`), ``auto`` measures how far they stray from the oracle's and
judges each departure by that spread and by the engine's own margin.

The method, precisely:

1. **Spread samples.** At every generated step where the engine's token is the oracle's argmax (the steps
   judged are left out: the spread is measured *elsewhere*) and the engine gives log-probs, take the
   reference entry r — the chosen token when its log-prob is given, else the engine's most probable named
   entry — and every other named entry i with a finite log-prob::

       x = | (lp_e(i) − lp_e(r)) − (lp_o(i) − lp_o(r)) | / max|ℓ_o|

   lp_e: the engine's log-prob; lp_o: the oracle's log-softmax; max|ℓ_o|: the oracle's max |logit| at the
   step, the audit's unit. A difference of two log-probs is a difference of two logits (the softmax
   normalizer cancels), so x is how far the engine moved the logit gap between two tokens it names. Not
   used: a log-prob exactly 0.0 for the chosen token (llama-server's placeholder when it computed none,
   refimpl.oracle.probs) and -inf entries.
2. **The threshold.** ``τ_engine = max(τ, FACTOR · Q(x))``, Q the :data:`QUANTILE`-quantile (numpy
   ``method="higher"``: an observed sample) of all the engine's samples — per stream in ``refimpl audit``,
   per server over all its answers in ``refimpl validate`` — and τ the fixed ``--threshold`` default (the
   floor: ``auto`` never judges tighter than the fixed rule). It is **not calibrated** — τ itself, and the
   report says why in one line — when the answer has no log-probs or fewer than :data:`MIN_SAMPLES`
   samples (llama-server's draft-mtp answers carry none after the first token), when its log-probs fail
   the ``probs:`` verdict (refimpl.oracle.probs: the audit does not accept them as a correct engine's), or
   when ``FACTOR · Q(x)`` exceeds :data:`CEILING`: log-probs that stray that far are a broken state, not
   other kernels, and their spread must not excuse tokens.
3. **A departure** (the engine's token t is not the oracle's argmax o) is a near-tie iff the oracle's
   margin m_o = ℓ_o(o) − ℓ_o(t) (the deficit of the fixed rule) is ≤ τ_engine·max|ℓ|. The report adds the
   engine's own evidence: its margin m_e = lp_e(t) − lp_e(o) between its token and the oracle's, and
   D = m_o + m_e, how far it moved the (t, o) gap; when o is not among the engine's top-k,
   lp_e(o) ≤ the smallest named log-prob, so m_e and D are lower bounds (a ``≥`` in the report).

Why these constants, measured (AMD EPYC, Zen 4 class, AVX-512, 2 vCPUs, 2026-12-04; the table is in
docs/validating-an-engine.md, "GPU and other engines"). Noise: the real llama-server (CPU build of
llama-cpp-python 0.3.36's vendored llama.cpp, ``--no-repack``) answering ``refimpl validate`` (greedy, 64
tokens, top-5 log-probs) for 10 prompts — English, code, CJK, accented Latin, Greek/Cyrillic — on each of
the three converted Q4_K_M files of golden/converted/, judged by the oracle *without* emulation, the
stand-in for an engine whose rounding the oracle does not follow. The fixed τ called 3 of qwen3next-k's
tokens wrong (oracle margins 10.35–10.83 % of max|logit|; the other two files at most 4.03 %); the
per-server Q(x) was 2.68–2.96 %, so ``FACTOR·Q(x)`` = 13.4–14.8 % and nothing is wrong. The gap moved
at a noise departure reached D = 22.8 % (oracle margin 10.80 %: an MoE routing flip), which is why D is
reported and not judged. Faults (refimpl/inject, every stream-visible class on ``tiny`` and ``kjv``, their
answers written by refimpl.inject.answer with the faulty engine's own log-probs): every one with a spread
either fails the ``probs:`` verdict or has Q(x) ≥ 9.4 % (``FACTOR·Q(x)`` ≥ 47 %, over the ceiling), so it
keeps τ; those without one (the accept-rule classes) have τ as the floor — all 33 cells the fixed rule
calls wrong keep every wrong token. :data:`QUANTILE` 0.99 rather than the maximum:
pooled over a server's answers the maximum is one routing flip (17.95 % on qwen35moe-k). :data:`FACTOR` 5:
the largest noise departure was 4.06 × its server's Q(x) with 4 prompts (3.7 × with 10). :data:`CEILING`
0.25 lies between the noise pooled per server (13.4–14.8 %) and the faults (≥ 47 % where their log-probs
pass the ``probs:`` verdict). One answer alone (about 250 samples for 64 tokens) is a rougher estimate:
llama.cpp through llama-cpp-python on the same 30 prompts gave ``FACTOR·Q(x)`` ≤ 23.6 % on 26 answers and
27–138 % on 4 (one or two routing flips among few samples), which keep τ — their departures were ≤ 1.3 %
— so calibrate per server (``refimpl validate``) where there is a choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

QUANTILE = 0.99  # which quantile of the spread samples (module docstring, step 2)
FACTOR = 5.0  # the safety factor on it
CEILING = 0.25  # the largest calibrated τ (fraction of max|logit|); beyond it: not calibrated
MIN_SAMPLES = 40  # fewer spread samples: the fixed τ, said in the report


@dataclass
class Calibration:
    """One engine's near-tie threshold under ``--threshold auto``."""

    tau: float  # the threshold used, a fraction of max|logit|
    floor: float  # the fixed τ (--threshold's default): the floor, and the fallback
    n_samples: int = 0  # spread samples it was computed from
    n_steps: int = 0  # steps that gave samples
    spread: float | None = None  # Q(x): the QUANTILE-quantile of the samples
    spread_max: float | None = None  # the largest sample
    why_fixed: str | None = None  # why τ is the fixed floor (no log-probs, too few samples, …), else None
    scope: str = "the stream"  # what the samples came from ("the 12 answers of server A" in refimpl validate)

    @property
    def calibrated(self) -> bool:
        return self.why_fixed is None

    def as_json(self) -> dict:
        return {"tau": self.tau, "calibrated": self.calibrated, "quantile": QUANTILE, "factor": FACTOR,
                "floor": self.floor, "ceiling": CEILING, "n_samples": self.n_samples, "n_steps": self.n_steps,
                "spread": self.spread, "spread_max": self.spread_max, "fixed_because": self.why_fixed,
                "scope": self.scope}


@dataclass
class Samples:
    """The spread samples of one engine (step 1), and why some steps gave none."""

    x: list = field(default_factory=list)
    n_steps: int = 0
    has_probs: bool = False  # the answers carry log-probs at all
    outside: int = 0  # answers whose log-probs fail the probs: verdict (refimpl.oracle.probs)

    def extend(self, other: "Samples") -> None:
        self.x += other.x
        self.n_steps += other.n_steps
        self.has_probs = self.has_probs or other.has_probs
        self.outside += other.outside


def _named(sp, token: int) -> dict[int, float]:
    """The engine's finite log-probs at a step by id (the chosen token's 0.0 placeholder left out)."""
    named = {int(t): float(lp) for t, lp in sp.top if math.isfinite(lp) and not (lp == 0.0 and t == token)}
    if sp.logprob is not None and math.isfinite(sp.logprob) and sp.logprob != 0.0:
        named[int(token)] = float(sp.logprob)
    return named


def _oracle_logprobs(row: np.ndarray, ids) -> dict[int, float]:
    r = row.astype(np.float64)
    m = float(np.max(r))
    lse = m + math.log(float(np.sum(np.exp(r - m))))
    return {i: float(r[i]) - lse for i in ids}


def add_samples(samples: Samples, sp, token: int, row: np.ndarray) -> None:
    """Step 1 at one step where ``token`` is the oracle's argmax of ``row``; ``sp``: the engine's StepProbs
    there (None: none given)."""
    if sp is None:
        return
    named = _named(sp, token)
    if len(named) < 2:
        return
    ref = token if token in named else max(named, key=lambda t: (named[t], -t))
    scale = float(np.max(np.abs(row)))
    if not scale:
        return
    lp_o = _oracle_logprobs(row, named)
    gap_o = {i: lp_o[i] - lp_o[ref] for i in named}
    samples.x += [abs((named[i] - named[ref]) - gap_o[i]) / scale for i in named if i != ref]
    samples.n_steps += 1


def calibrate(samples: Samples, floor: float, scope: str = "the stream") -> Calibration:
    """Step 2: the engine's threshold from its samples; the fixed ``floor`` when there are too few."""
    n = len(samples.x)
    if not samples.has_probs:
        return Calibration(floor, floor, why_fixed=f"{scope} carries no log-probs", scope=scope)
    if samples.outside:
        return Calibration(floor, floor, n, samples.n_steps, why_fixed=f"the log-probs of {scope} are outside the probs: "
                           "bound, not a correct engine's to calibrate on", scope=scope)
    if n < MIN_SAMPLES:
        return Calibration(floor, floor, n, samples.n_steps, why_fixed=f"{n} log-prob gaps in {scope}, fewer than the "
                           f"{MIN_SAMPLES} needed to calibrate", scope=scope)
    x = np.asarray(samples.x)
    q = float(np.quantile(x, QUANTILE, method="higher"))
    if FACTOR * q > CEILING:
        return Calibration(floor, floor, n, samples.n_steps, q, float(x.max()), scope=scope,
                           why_fixed=f"{FACTOR:g} × the {100 * QUANTILE:g}th percentile {100 * q:.2f}% of {n} log-prob gaps of "
                                     f"{scope} is above the {100 * CEILING:g}% ceiling: log-probs that stray this far are "
                                     "a broken state, not other rounding")
    return Calibration(max(floor, FACTOR * q), floor, n, samples.n_steps, q, float(x.max()), scope=scope)


# ---- step 3: judging a departure ----------------------------------------------------------------


@dataclass(frozen=True)
class EngineMargin:
    """One engine's evidence at a departure (token t, the oracle's argmax o)."""

    tau: float  # the engine's threshold (fraction of max|logit|)
    oracle_margin: float  # m_o = ℓ_o(o) − ℓ_o(t)
    engine_margin: float | None  # m_e = lp_e(t) − lp_e(o) (a lower bound when ``bound``); None: not given
    bound: bool  # o is not in the engine's top-k: m_e and D are lower bounds
    limit: float  # τ_engine · max|ℓ|

    @property
    def moved(self) -> float | None:
        """D = m_o + m_e: how far the engine moved the (t, o) gap (a lower bound when ``bound``)."""
        return None if self.engine_margin is None else self.oracle_margin + self.engine_margin

    @property
    def close(self) -> bool:
        """The verdict (step 3): the oracle's margin within the engine's threshold (D is reported, not judged)."""
        return self.oracle_margin <= self.limit


def engine_margin(cal: Calibration, sp, token: int, pos) -> EngineMargin:
    """Step 3 for a stream whose token ``token`` is not ``pos``'s argmax (``pos``: audit.Position); ``sp``:
    the stream's StepProbs at the step (None: none)."""
    o = pos.top_ids[0]
    m_o, limit = pos.deficit(token), cal.tau * pos.max_abs
    named = _named(sp, token) if sp is not None else {}
    if token not in named:
        return EngineMargin(cal.tau, m_o, None, False, limit)
    if o in named:
        return EngineMargin(cal.tau, m_o, named[token] - named[o], False, limit)
    top = [float(lp) for _, lp in sp.top if math.isfinite(lp)]
    if not top:
        return EngineMargin(cal.tau, m_o, None, False, limit)
    return EngineMargin(cal.tau, m_o, named[token] - min(top), True, limit)


# ---- the report ---------------------------------------------------------------------------------


def calibration_line(label: str, cal: Calibration) -> str:
    """One line: the threshold of one engine and where it came from."""
    if not cal.calibrated:
        return f"threshold auto ({label}): the fixed {100 * cal.floor:g}% of max|logit|: {cal.why_fixed}"
    how = (f"{FACTOR:g} × the {100 * QUANTILE:g}th percentile {100 * cal.spread:.2f}% of {cal.n_samples} log-prob gaps "
           f"over {cal.n_steps} steps of {cal.scope} (largest {100 * cal.spread_max:.2f}%)")
    floor = f", below the floor {100 * cal.floor:g}%" if cal.tau == cal.floor else ""
    return f"threshold auto ({label}): {100 * cal.tau:.2f}% of max|logit| from {how}{floor}"
