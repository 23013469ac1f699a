"""``refimpl audit MODEL --kld-base FILE``: llama-perplexity's KL-divergence statistics of the oracle against
a base file, printed as llama-perplexity prints them, then the positions behind them.

:func:`report_lines` repeats ``kl_divergence()`` of ``tools/perplexity/perplexity.cpp`` (llama-cpp-python
0.3.36) with the oracle in the place of the ``-m`` model (Q): the running per-chunk table (lines
1837, 1854-1879), then — with at least 100 scored positions, as llama-perplexity (:1887) — the
perplexity, KL-divergence and token-probability statistics (:1892-1982), with its estimators:
``mean_and_uncertainty`` (:1750-1758: the mean and the standard error, 0 for ≤ 10 values),
``covariance`` (:1759-1766), ``percentile`` (:1930-1936: linear interpolation in float) and the median
(:1927). Then what llama-perplexity does not print: the positions where the base's top token is not the
oracle's, each judged by the stream audit's near-tie rule (refimpl.oracle.audit), and the worst
positions by KL divergence, named by chunk, position and text.

Exit status (:func:`exit_code`): 1 when the base's top token is *wrong* by the oracle somewhere (below
the oracle's best by more than τ·max|logit|), else 0.
"""

from __future__ import annotations

import math

import numpy as np

#: Positions listed under "worst positions by KL divergence".
N_WORST = 10

#: llama-perplexity prints its summary statistics from this many scored positions on (perplexity.cpp:1887).
MIN_SUMMARY_COUNT = 100


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """perplexity.cpp:1750-1758."""
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def covariance(suma: float, sumb: float, sumab: float, count: int) -> float:
    """perplexity.cpp:1759-1766."""
    if count < 10:
        return 0.0
    return (sumab / count - (suma / count) * (sumb / count)) / (count - 1)


def percentile(values: np.ndarray, fraction: float) -> float:
    """perplexity.cpp:1930-1936, on sorted float32 ``values``: float arithmetic throughout."""
    if fraction <= 0:
        return float(values[0])
    if fraction >= 1:
        return float(values[-1])
    p = np.float32(fraction) * np.float32(len(values) - 1)
    ip = int(p)
    p = np.float32(p - np.float32(ip))
    return float((np.float32(1) - p) * values[ip] + p * values[min(ip + 1, len(values) - 1)])


def median(values: np.ndarray) -> float:
    """perplexity.cpp:1927-1928: the middle value, or 0.5f times the sum of the two middle ones."""
    n = len(values)
    return float(np.float32(0.5) * (values[n // 2] + values[n // 2 - 1])) if n % 2 == 0 else float(values[n // 2])


class Sums:
    """The running sums of ``kl_divergence_result`` (perplexity.cpp:175-189) over the first ``n`` positions."""

    def __init__(self, s, n: int):
        nll, nll_base = s.nll[:n].astype(np.float64), s.nll_base[:n].astype(np.float64)
        p_diff2 = s.p_diff[:n].astype(np.float64) ** 2
        self.count = n
        self.nll, self.nll2 = nll.sum(), (nll * nll).sum()
        self.nll_base, self.nll_base2 = nll_base.sum(), (nll_base * nll_base).sum()
        self.nll_nll_base = (nll * nll_base).sum()
        self.kld, self.kld2 = s.kld[:n].sum(), (s.kld[:n] ** 2).sum()
        self.p_diff, self.p_diff2, self.p_diff4 = s.p_diff[:n].astype(np.float64).sum(), p_diff2.sum(), (p_diff2 * p_diff2).sum()
        self.n_same_top = int(np.sum(s.top[:n] == s.top_base[:n]))

    def log_ppl(self):
        return mean_and_uncertainty(self.nll, self.nll2, self.count)

    def log_ppl_base(self):
        return mean_and_uncertainty(self.nll_base, self.nll_base2, self.count)

    def log_ppl_cov(self) -> float:
        return covariance(self.nll, self.nll_base, self.nll_nll_base, self.count)

    def log_ppl_ratio(self) -> tuple[float, float]:
        (a, da), (b, db) = self.log_ppl(), self.log_ppl_base()
        return a - b, _sqrt(da * da + db * db - 2.0 * self.log_ppl_cov())

    def p_diff_rms(self) -> tuple[float, float]:
        mse, dmse = mean_and_uncertainty(self.p_diff2, self.p_diff4, self.count)
        rms = math.sqrt(mse)
        return rms, (0.5 / rms * dmse if rms else math.inf * dmse if dmse else math.nan)

    def same_top(self) -> tuple[float, float]:
        p = self.n_same_top / self.count
        return p, _sqrt(p * (1 - p) / (self.count - 1)) if self.count > 1 else math.nan


def _sqrt(x: float) -> float:
    """C's sqrt: NaN below 0 (a covariance larger than both variances, from rounding)."""
    return math.sqrt(x) if x >= 0 else math.nan


CHUNK_HEADER = ("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              "
                "Δp RMS            Same top p")  # perplexity.cpp:1837


def chunk_lines(s) -> list[str]:
    """The running table llama-perplexity prints after each chunk (perplexity.cpp:1854-1879)."""
    lines = [CHUNK_HEADER]
    for c in range(s.base.n_chunk):
        m = Sums(s, (c + 1) * s.base.n_scored)
        log_ppl = m.log_ppl()
        ppl = math.exp(log_ppl[0])
        ratio, kl, rms, top = m.log_ppl_ratio(), mean_and_uncertainty(m.kld, m.kld2, m.count), m.p_diff_rms(), m.same_top()
        lines.append(f"{c + 1:4d}    {ppl:9.4f} ± {ppl * log_ppl[1]:9.4f}    {ratio[0]:10.5f} ± {ratio[1]:10.5f}"
                     f"    {kl[0]:10.5f} ± {kl[1]:10.5f}    {100 * rms[0]:6.3f} ± {100 * rms[1]:6.3f} %"
                     f"    {100 * top[0]:6.3f} ± {100 * top[1]:6.3f} %")
    return lines


def summary_lines(s) -> list[str]:
    """perplexity.cpp:1892-1982, line for line."""
    m = Sums(s, s.count)
    kld, p_diff = np.sort(s.kld.astype(np.float32)), np.sort(s.p_diff)
    (lp, dlp), (lb, dlb), cov = m.log_ppl(), m.log_ppl_base(), m.log_ppl_cov()
    ppl, ppl_base = math.exp(lp), math.exp(lb)
    ppl_unc, ppl_base_unc = ppl * dlp, ppl_base * dlb
    ratio, ratio_unc = m.log_ppl_ratio()
    cor = cov / (dlp * dlb) if dlp * dlb else (math.nan if cov == 0 else math.copysign(math.inf, cov))  # C's x/0
    kl = mean_and_uncertainty(m.kld, m.kld2, m.count)
    pd = mean_and_uncertainty(m.p_diff, m.p_diff2, m.count)
    rms, (top, dtop) = m.p_diff_rms(), m.same_top()
    kl_rows = [("Maximum", float(kld[-1])), ("99.9%", percentile(kld, 0.999)), ("99.0%", percentile(kld, 0.990)),
               ("95.0%", percentile(kld, 0.950)), ("90.0%", percentile(kld, 0.900)), ("Median", median(kld)),
               ("10.0%", percentile(kld, 0.100)), (" 5.0%", percentile(kld, 0.050)), (" 1.0%", percentile(kld, 0.010)),
               (" 0.1%", percentile(kld, 0.001)), ("Minimum", float(kld[0]))]
    dp_rows = [("Maximum", float(p_diff[-1]))] + [(f"{100 * f:4.1f}%", percentile(p_diff, f))
                                                  for f in (0.999, 0.990, 0.950, 0.900, 0.750)]
    dp_rows += [("Median", median(p_diff))] + [(f"{100 * f:4.1f}%", percentile(p_diff, f)) for f in (0.250, 0.100, 0.050, 0.010, 0.001)]
    dp_rows += [("Minimum", float(p_diff[0]))]
    out = ["====== Perplexity statistics ======",
           f"Mean PPL(Q)                   : {ppl:10.6f} ± {ppl_unc:10.6f}",
           f"Mean PPL(base)                : {ppl_base:10.6f} ± {ppl_base_unc:10.6f}",
           f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * cor:6.2f}%",
           f"Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6f} ± {ratio_unc:10.6f}",
           f"Mean PPL(Q)/PPL(base)         : {math.exp(ratio):10.6f} ± {math.exp(ratio) * ratio_unc:10.6f}",
           f"Mean PPL(Q)-PPL(base)         : {ppl - ppl_base:10.6f} ± "
           f"{_sqrt(ppl_unc**2 + ppl_base_unc**2 - 2.0 * ppl * ppl_base * cov):10.6f}",
           "",
           "====== KL divergence statistics ======",
           f"Mean    KLD: {kl[0]:10.6f} ± {kl[1]:10.6f}"]
    out += [f"{name:<7} KLD: {v:10.6f}" for name, v in kl_rows]
    out += ["", "====== Token probability statistics ======", f"Mean    Δp: {100 * pd[0]:6.3f} ± {100 * pd[1]:5.3f} %"]
    out += [f"{name:<7} Δp: {100 * v:6.3f}%" for name, v in dp_rows]
    out += [f"RMS Δp    : {100 * rms[0]:6.3f} ± {100 * rms[1]:5.3f} %", f"Same top p: {100 * top:6.3f} ± {100 * dtop:5.3f} %"]
    return out


# ---- what llama-perplexity does not print: the positions -----------------------------------------


def _text(tokenizer, ids) -> str:
    return repr(tokenizer.decode([int(t) for t in ids]))


def _tok(tokenizer, t: int) -> str:
    from refimpl.oracle.golden import show_piece

    return f"{int(t)} {show_piece(tokenizer, int(t))}"


def _position(s, tokenizer, i: int) -> str:
    """Where scored position ``i`` is: chunk, position of the predicted token, the text before it."""
    c, p = s.where(i)
    before = s.base.chunk_tokens(c)[max(0, p - 6) : p]
    return f"chunk {c + 1} position {p} (corpus token {c * s.base.n_ctx + p}, after {_text(tokenizer, before)})"


def disagreement_lines(s, tokenizer, tau: float) -> list[str]:
    """The positions where the base's top token is not the oracle's, judged by the near-tie rule."""
    wrong = [(i, pos) for i, pos in s.disagreements if not pos.close(int(s.top_base[i]))]
    out = [f"top token: the base's is the oracle's at {s.count - len(s.disagreements)} of {s.count} positions; "
           f"{len(s.disagreements) - len(wrong)} near-tie, {len(wrong)} wrong (near-tie threshold {100 * tau:g}% of max|logit|)"]
    for i, pos in sorted(s.disagreements, key=lambda d: -d[1].deficit(int(s.top_base[d[0]])))[:N_WORST]:
        t = int(s.top_base[i])
        out.append(f"  {_position(s, tokenizer, i)}: base {_tok(tokenizer, t)}, oracle {_tok(tokenizer, pos.top_ids[0])}; "
                   f"{pos.deficit(t):.4g} below = {100 * pos.deficit(t) / pos.max_abs:.2f}% of max|logit|: "
                   f"{'near-tie' if pos.close(t) else 'wrong'}")
    return out


def worst_lines(s, tokenizer) -> list[str]:
    """The N_WORST positions by KL divergence."""
    out = [f"worst positions by KL divergence (of {s.count}):"]
    for i in np.argsort(-s.kld, kind="stable")[:N_WORST]:
        top = "same top" if s.top[i] == s.top_base[i] else f"top: base {_tok(tokenizer, s.top_base[i])}, oracle {_tok(tokenizer, s.top[i])}"
        out.append(f"  KLD {s.kld[i]:.6f}  {_position(s, tokenizer, int(i))}: next {_tok(tokenizer, s.target[i])} "
                   f"p base {math.exp(-float(s.nll_base[i])):.4f}, oracle {math.exp(-float(s.nll[i])):.4f}; {top}")
    return out


def n_wrong(s) -> int:
    return sum(not pos.close(int(s.top_base[i])) for i, pos in s.disagreements)


def exit_code(s) -> int:
    return int(n_wrong(s) > 0)


def report_lines(s, tokenizer, *, model: str, emulate: str, tau: float) -> list[str]:
    b = s.base
    out = [f"kld audit: Q = the oracle on {model} (emulate {emulate}), base = {b.path}",
           f"  n_ctx {b.n_ctx}, {b.n_chunk} chunks × {b.n_scored} scored positions (n_ctx/2 .. n_ctx-2) = {s.count}, "
           f"vocabulary {b.n_vocab}", ""]
    out += chunk_lines(s) + [""]
    if s.count >= MIN_SUMMARY_COUNT:
        out += summary_lines(s) + [""]
    else:
        out += [f"(fewer than {MIN_SUMMARY_COUNT} scored positions: llama-perplexity prints no summary statistics, nor does this)", ""]
    out += disagreement_lines(s, tokenizer, tau) + worst_lines(s, tokenizer)
    wrong = n_wrong(s)
    n = len(s.disagreements)
    agree = "top tokens agree" if not n else f"{n} top-token disagreement{'s' if n > 1 else ''}"
    out.append(f"result: {agree}, {wrong} wrong → exit {exit_code(s)}")
    return out


def as_json(s, *, model: str, emulate: str, tau: float) -> dict:
    """The report as one object: the statistics, and every scored position."""
    m = Sums(s, s.count)
    kl, (top, dtop) = mean_and_uncertainty(m.kld, m.kld2, m.count), m.same_top()
    wrong = {i for i, pos in s.disagreements if not pos.close(int(s.top_base[i]))}
    return {"model": model, "emulate": emulate, "base": str(s.base.path), "n_ctx": s.base.n_ctx, "n_chunk": s.base.n_chunk,
            "n_vocab": s.base.n_vocab, "count": s.count, "threshold": tau,
            "ppl": math.exp(m.log_ppl()[0]), "ppl_base": math.exp(m.log_ppl_base()[0]),
            "mean_kld": kl[0], "mean_kld_uncertainty": kl[1], "same_top": top, "same_top_uncertainty": dtop,
            "rms_p_diff": m.p_diff_rms()[0], "n_disagreements": len(s.disagreements), "n_wrong": len(wrong),
            "exit": exit_code(s),
            "positions": [{"chunk": c + 1, "position": p, "token": int(s.target[i]), "kld": float(s.kld[i]),
                           "p_diff": float(s.p_diff[i]), "nll": float(s.nll[i]), "nll_base": float(s.nll_base[i]),
                           "top": int(s.top[i]), "top_base": int(s.top_base[i]),
                           "verdict": "same top" if s.top[i] == s.top_base[i] else ("wrong" if i in wrong else "near-tie")}
                          for i, (c, p) in ((i, s.where(i)) for i in range(s.count))]}
