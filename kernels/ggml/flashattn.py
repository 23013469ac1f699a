"""llama.cpp's CPU flash attention for a few query rows: the F16 vector path, rounding for rounding.

``ggml_compute_forward_flash_attn_ext_f16_one_chunk`` (ggml-cpu/ops.cpp) is what ``auto`` flash
attention runs on the CPU for a ubatch of fewer than ``GGML_FA_TILE_Q`` = 64 query rows (decode, a
speculative verify batch, a short prompt). llama.cpp's graph (``build_attn_mha``) always hands it
F16 K and V (an F32 cache is cast to F16 first). Per query row and head, with ``k``/``v`` the
visible cells in cache order::

    Q_q = fp16(q)                                  # q_to_vec_dot: K's vec_dot_type is F16
    M = -inf; S = 0; VKQ16[:] = 0                  # VKQ16 is an F16 accumulator
    for each visible cell ic:
        s = dot(k[ic], Q_q) * scale                # ggml_vec_dot_f16, then a float32 multiply
        if s > M:  ms = expf(M_old - s); M = s; VKQ16 = fp16(VKQ16 * ms); vs = 1
        else:      ms = 1; vs = expf(s - M)
        VKQ16 = fp16(fma(v[ic], vs, VKQ16))        # ggml_vec_mad_f16: F32 FMA, stored as F16
        S = S*ms + vs
    out = float(VKQ16) * (1/S)

Every ``fp16(...)`` is a round-to-nearest-even to binary16 (``_mm*_cvtps_ph(x, 0)``), so the
accumulator carries ~11 bits; this is the rounding point that makes flash attention differ from the
non-flash path (which rounds the probabilities to F16 instead, before an F32-accumulated P·V).
``expf`` is the C library's (:mod:`kernels.ggml.libm`: a direct call of glibc's ``expf``, the function
llama.cpp calls; numpy's float32 ``exp`` differs from it in the last ulp for ~40 % of inputs). The K·Q dot
is an exact float64 sum rounded once (``dot64``'s policy) — llama.cpp sums it in float32 SIMD lanes, an
order that differs per ISA: float noise, not matched.

Split KV (``use_split_kv_path``: one query row, F16/F32 K = V type, ``n_kv >= 512``): the cells
``0 … n_kv-1`` are cut into ``n_threads`` chunks of ``ceil(n_kv / n_threads)``; each chunk runs the
loop above from scratch and leaves (M, S, float(VKQ16)); the chunks are then combined in order
(``ggml_flash_attn_ext_reduce_partials``)::

    M' = max(M, M_c); a = expf(M - M'); b = expf(M_c - M'); VKQ = VKQ*a + VKQ_c*b; S = S*a + S_c*b

so llama.cpp's result depends on its thread count there; ``chunk`` passes that split in.

Crossings. Because the K·Q order is not llama.cpp's, a value about to be rounded to F16 may differ
from llama.cpp's in its last float32 bits; when it lies that close to an F16 rounding boundary, the
two round to neighbouring F16 values and that output element differs by one F16 step of the
accumulator. ``flash_attn_f16(..., tie_ulps=n)`` also returns, per output element, how many of its
F16 roundings had their argument within ``n·(1 + |s| + |M|)`` float32 ulps of a boundary (a midpoint between two
F16 values) while depending on an ``expf`` of a score (the only inputs that carry the order noise;
``v + acc`` after a new maximum is exact on both sides, even when it is an exact tie): the elements
where such a difference is possible. Everything else must agree with
llama.cpp to float noise (tests/test_emulate_config.py).

This is x86's rounding (float dot and FMA, then F16). An AArch64 llama.cpp built with FP16 vector arithmetic
accumulates the dot and updates the accumulator in *half* precision (``vs``, ``ms`` rounded to half; the dot's half
lanes can overflow to inf): this tie model does not cover it. ``--emulate=ggml`` never calls this module — its
graph (refimpl/graph/attention.py) takes :mod:`kernels.ggml.flashattn_exact`, which follows the ARM builds bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from kernels.base.flags import SERIAL_BELOW, jit
from kernels.base.floats import round_to_f16
from kernels.ggml.libm import expf  # glibc's, as llama.cpp calls it

F32 = np.float32


@jit()
def _near_f16_tie(x, tie_ulps):
    """1 if float32 ``x`` is within ``tie_ulps`` (a float) float32 ulps of a midpoint between two F16 values."""
    a = abs(np.float64(x))
    if tie_ulps <= 0 or a == 0 or not (a < 65504.0):
        return 0
    _, e = math.frexp(a)
    q16 = math.ldexp(1.0, max(e - 11, -24))  # F16 quantum at a
    q32 = math.ldexp(1.0, max(e - 24, -149))  # float32 ulp at a
    mid = (math.floor(a / q16) + 0.5) * q16
    return 1 if abs(a - mid) <= tie_ulps * q32 else 0


@jit()
def _online_chunk(q16, k, v, visible, j, c0, c1, scale, acc, near, tie_ulps):
    """The one_chunk loop over cells c0 … c1-1 of KV head j for one query row; fills ``acc`` (the
    F16 accumulator, held as float32 values) and returns (M, S); ``near[d]`` counts element d's
    roundings that were within ``tie_ulps`` of an F16 tie."""
    D = q16.size
    M = np.float32(-np.inf)
    S = np.float32(0.0)
    for d in range(D):
        acc[d] = np.float32(0.0)
    for ic in range(c0, c1):
        if not visible[ic]:
            continue  # mask -inf: skipped
        s64 = 0.0
        for d in range(D):
            s64 += np.float64(k[ic, j, d]) * np.float64(q16[d])
        s = np.float32(np.float32(s64) * scale)
        ms = np.float32(1.0)
        vs = np.float32(1.0)
        # order noise in a score s is a few ulps of |s|, so expf(s - M) carries ~|s| + |M| ulps of it
        width = tie_ulps * (1.0 + abs(np.float64(s)) + (abs(np.float64(M)) if M != -np.inf else 0.0))
        if s > M:
            ms = expf(M - s) if M != -np.inf else np.float32(0.0)  # expf(-inf) = 0
            M = s
            for d in range(D):
                pre = np.float32(acc[d] * ms)
                near[d] += _near_f16_tie(pre, width)
                acc[d] = round_to_f16(pre)
        else:
            vs = expf(s - M)
        for d in range(D):  # fma(v, vs, acc): exact product and sum in float64, rounded to float32
            pre = np.float32(np.float64(v[ic, j, d]) * np.float64(vs) + np.float64(acc[d]))
            if vs != 1:  # vs = 1 (a new maximum): v + acc of two F16 values, exact on both sides
                near[d] += _near_f16_tie(pre, width)
            acc[d] = round_to_f16(pre)
        S = np.float32(np.float64(S) * np.float64(ms) + np.float64(vs))  # S*ms + vs, contracted to an FMA
    return M, S


def _flash_attn_rows_py(q, k, v, visible, scale, chunk, out, near, tie_ulps):
    """out [T, Hq, D] for q [T, Hq, D] (float32), k, v [n, Hkv, D] (F16 values), visible [T, n]."""
    T, Hq, D = q.shape
    n, Hkv = k.shape[0], k.shape[1]
    group = Hq // Hkv
    for r in prange(T * Hq):
        t = r // Hq
        h = r % Hq
        j = h // group  # GQA: ggml broadcast ik2 = iq2 / rk2
        q16 = np.empty(D, dtype=np.float32)
        for d in range(D):
            q16[d] = round_to_f16(q[t, h, d])
        acc = np.empty(D, dtype=np.float32)
        if chunk <= 0:  # one chunk over all cells: out = VKQ16 / S
            M, S = _online_chunk(q16, k, v, visible[t], j, 0, n, scale, acc, near[t, h], tie_ulps)
            inv = np.float32(0.0) if S == 0 else np.float32(np.float32(1.0) / S)
            for d in range(D):
                out[t, h, d] = np.float32(acc[d] * inv)
            continue
        Mf = np.float32(-np.inf)  # split KV: chunks of `chunk` cells, combined in order
        Sf = np.float32(0.0)
        vkq = np.zeros(D, dtype=np.float32)
        for c0 in range(0, n, chunk):
            Mc, Sc = _online_chunk(q16, k, v, visible[t], j, c0, min(c0 + chunk, n), scale, acc, near[t, h], tie_ulps)
            if Sc == 0:
                continue
            Mn = max(Mf, Mc)
            a = expf(Mf - Mn) if Mf != -np.inf else np.float32(0.0)
            b = expf(Mc - Mn)
            for d in range(D):
                vkq[d] = np.float32(np.float32(vkq[d] * a) + np.float32(acc[d] * b))
            Sf = np.float32(np.float32(Sf * a) + np.float32(Sc * b))
            Mf = Mn
        inv = np.float32(1.0) / Sf if Sf != 0 else np.float32(1.0)
        for d in range(D):
            out[t, h, d] = np.float32(vkq[d] * inv)


_flash_attn_rows = jit(parallel=True)(_flash_attn_rows_py)  # prange over (row, head): independent outputs
_flash_attn_rows_serial = jit()(_flash_attn_rows_py)  # small calls (flags.SERIAL_BELOW): prange is range


def flash_attn_f16(q: np.ndarray, k: np.ndarray, v: np.ndarray, visible: np.ndarray, scale: float, chunk: int = 0,
                   tie_ulps: int = 0):
    """llama.cpp's CPU flash attention (vector path) for T query rows.

    ``q`` [T, Hq, D] float32 (rounded to F16 here); ``k``, ``v`` [n, Hkv, D] float32 holding F16
    values, in cache-cell order; ``visible`` [T, n] bool (the causal mask); ``scale`` the KQ scale;
    ``chunk`` > 0: the split-KV path with chunks of that many cells. Returns [T, Hq, D] float32;
    with ``tie_ulps`` > 0, (that, near [T, Hq, D] int32) — near-tie counts, module docstring.
    """
    q = np.ascontiguousarray(q, dtype=F32)
    k = np.ascontiguousarray(k, dtype=F32)
    v = np.ascontiguousarray(v, dtype=F32)
    visible = np.ascontiguousarray(visible, dtype=np.bool_)
    T, Hq, D = q.shape
    if k.shape != v.shape or k.shape[2] != D or Hq % max(k.shape[1], 1) or visible.shape != (T, k.shape[0]):
        raise ValueError(f"flash_attn_f16: shapes q {q.shape}, k {k.shape}, v {v.shape}, visible {visible.shape} do not fit")
    out = np.zeros((T, Hq, D), dtype=F32)
    near = np.zeros((T, Hq, D), dtype=np.int32)
    if T and k.shape[0]:
        rows = _flash_attn_rows_serial if T * Hq * k.shape[0] * D < SERIAL_BELOW else _flash_attn_rows
        rows(q, k, v, visible, F32(scale), int(chunk), out, near, int(tie_ulps))
    return (out, near) if tie_ulps > 0 else out


__all__ = ["flash_attn_f16", "expf"]
