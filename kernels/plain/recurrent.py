"""The compiled gated delta-rule step, in a defined summation order (the exact dot product it shares with
attention and MoE, ``dot64``, is :mod:`kernels.plain.dot`).

``delta_rule_step(M, q, k, v, decay, beta, scale)``
    One token of the gated delta rule for every value head, compiled. Its definition — the math, the
    llama.cpp op it mirrors and the order of its float32 operations — is the numpy form
    ``refimpl.model.deltanet.delta_rule_step``; this kernel performs the same float32 operations in the
    same order (no fused multiply-add), with the two mat-vecs as the float64 sums of ``dot64``, and
    gives its bits (tests/test_kernels_recurrent.py; kernels cannot import refimpl, so the test holds
    the two side by side). ``prange`` over value heads: each head's numbers are computed by one thread
    in that order, so nothing depends on the thread count. ``exp`` and ``sqrt`` are not computed here:
    the caller passes ``decay = exp(g)`` and ``scale`` computed by numpy, whose float32 ``exp`` need not
    equal the C library's that compiled code would call.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.base.flags import SERIAL_BELOW, jit

F32 = np.float32


# --------------------------------------------------------------------------------------------
# the gated delta-rule step, compiled (the definition: refimpl/model/deltanet.py)


@jit()
def _delta_rule_head(M, q, k, v, decay, beta, scale, o, M_out, j):
    """The step for value head j: its state rows four side by side (four independent chains, each in
    the order of one alone), then the Sv mod 4 rows left one by one."""
    Sv, Sk = M.shape[1], M.shape[2]
    dj = decay[j]
    bj = beta[j]
    for r in range(0, Sv - Sv % 4, 4):
        # pass 1: u = (M·decay) k, and the decayed rows into M_out
        s0 = s1 = s2 = s3 = 0.0
        for i in range(Sk):
            ki = np.float64(k[j, i])
            m0 = M[j, r, i] * dj
            m1 = M[j, r + 1, i] * dj
            m2 = M[j, r + 2, i] * dj
            m3 = M[j, r + 3, i] * dj
            M_out[j, r, i] = m0
            M_out[j, r + 1, i] = m1
            M_out[j, r + 2, i] = m2
            M_out[j, r + 3, i] = m3
            s0 += np.float64(m0) * ki
            s1 += np.float64(m1) * ki
            s2 += np.float64(m2) * ki
            s3 += np.float64(m3) * ki
        d0 = (v[j, r] - np.float32(s0)) * bj
        d1 = (v[j, r + 1] - np.float32(s1)) * bj
        d2 = (v[j, r + 2] - np.float32(s2)) * bj
        d3 = (v[j, r + 3] - np.float32(s3)) * bj
        # pass 2: M' = M₁ + δ kᵀ (product rounded to float32, then the sum), o = M' q
        t0 = t1 = t2 = t3 = 0.0
        for i in range(Sk):
            kk = k[j, i]
            qi = np.float64(q[j, i])
            n0 = M_out[j, r, i] + d0 * kk
            n1 = M_out[j, r + 1, i] + d1 * kk
            n2 = M_out[j, r + 2, i] + d2 * kk
            n3 = M_out[j, r + 3, i] + d3 * kk
            M_out[j, r, i] = n0
            M_out[j, r + 1, i] = n1
            M_out[j, r + 2, i] = n2
            M_out[j, r + 3, i] = n3
            t0 += np.float64(n0) * qi
            t1 += np.float64(n1) * qi
            t2 += np.float64(n2) * qi
            t3 += np.float64(n3) * qi
        o[j, r] = np.float32(t0) * scale
        o[j, r + 1] = np.float32(t1) * scale
        o[j, r + 2] = np.float32(t2) * scale
        o[j, r + 3] = np.float32(t3) * scale
    for r in range(Sv - Sv % 4, Sv):
        _delta_rule_row(M, q, k, v, dj, bj, scale, o, M_out, j, r)


@jit()
def _delta_rule_row(M, q, k, v, dj, bj, scale, o, M_out, j, r):
    """State row r of value head j alone: the two passes of ``_delta_rule_head`` for one row."""
    Sk = M.shape[2]
    s = 0.0
    for i in range(Sk):  # pass 1: u = (M·decay) k
        m = M[j, r, i] * dj
        M_out[j, r, i] = m
        s += np.float64(m) * np.float64(k[j, i])
    d = (v[j, r] - np.float32(s)) * bj
    t = 0.0
    for i in range(Sk):  # pass 2: M' = M₁ + δ kᵀ, o = M' q
        n = M_out[j, r, i] + d * k[j, i]
        M_out[j, r, i] = n
        t += np.float64(n) * np.float64(q[j, i])
    o[j, r] = np.float32(t) * scale


@jit(parallel=True)
def _delta_rule_heads(M, q, k, v, decay, beta, scale, o, M_out):
    """The step for every value head, one thread per head."""
    for j in prange(M.shape[0]):
        _delta_rule_head(M, q, k, v, decay, beta, scale, o, M_out, j)


@jit()
def _delta_rule_heads_serial(M, q, k, v, decay, beta, scale, o, M_out):
    """``_delta_rule_heads`` on the calling thread (small states: ``flags.SERIAL_BELOW``)."""
    for j in range(M.shape[0]):
        _delta_rule_head(M, q, k, v, decay, beta, scale, o, M_out, j)


def delta_rule_step(M: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, decay: np.ndarray, beta: np.ndarray, scale) -> tuple[np.ndarray, np.ndarray]:
    """One token of the gated delta rule for all value heads, compiled; pure (``M`` is not modified).
    The bits of ``refimpl.model.deltanet.delta_rule_step``, the definition (module docstring).

    M [Hv, Sv, Sk] float32; q, k [Hv, Sk] (already mapped to value heads); v [Hv, Sv];
    decay = exp(g), beta [Hv]; scale a float32 scalar. Returns (o [Hv, Sv], M' [Hv, Sv, Sk]).
    """
    M, q, k, v, decay, beta = (np.ascontiguousarray(x, dtype=F32) for x in (M, q, k, v, decay, beta))
    scale = F32(scale)
    Hv, Sv, Sk = M.shape
    if q.shape != (Hv, Sk) or k.shape != (Hv, Sk) or v.shape != (Hv, Sv) or decay.shape != (Hv,) or beta.shape != (Hv,):
        raise ValueError(f"delta_rule_step: shapes M {M.shape}, q {q.shape}, k {k.shape}, v {v.shape}, decay {decay.shape}, beta {beta.shape} do not agree")
    o = np.empty((Hv, Sv), dtype=F32)  # [Hv, Sv]
    M_out = np.empty_like(M)  # [Hv, Sv, Sk]
    heads = _delta_rule_heads_serial if 2 * M.size < SERIAL_BELOW else _delta_rule_heads
    heads(M, q, k, v, decay, beta, scale, o, M_out)
    return o, M_out
