"""Primitive operations, each written to compute what llama.cpp's CPU op computes
(``ggml-cpu/ops.cpp``, ``vec.cpp``, ``unary-ops.cpp``; each function names its op).

All activations are float32 (as in llama.cpp). Reductions that llama.cpp accumulates in double
(RMSNorm's sum of squares, softmax's sum) are accumulated in float64 here too; dot products are
float64-accumulated and rounded once (closer to exact than ggml's float32 SIMD sums, whose order
varies by kernel). Every function treats each row (last axis) independently and identically, so a
batch of T rows gives bit-identical results to T single-row calls — the property that makes
verify batches exact in this oracle. That holds for the definition (no ``--emulate``) and for
``--emulate=plain``; not under ``--emulate`` with flash attention on (its default: one query row over a long
cache takes the split-KV path, 64 or more rows the tiled path), nor under ``--emulate=ggml``, whose ggml-cpu
kernels depend on the row count as llama.cpp's do (docs/numerics.md, "Batch invariance").

Shapes use the legend of docs/architecture.md; ``...`` is any leading batch shape.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

import kernels
from refimpl.model.ctx import (CLEAN, EMULATIONS, GGML_NAMES, GGML_PATHS, TAPS, Ctx, NoFaults,  # noqa: F401
                               emulation_ctx)  # (Ctx's own module; these names were always imported from here)

F32 = np.float32


def mm(W, x: np.ndarray, ctx: Ctx) -> np.ndarray:
    """``ggml_mul_mat(W, x)``: [T, in] -> [T, out] for a weight W of numpy shape (out, in):
    ``kernels.matmul`` — float64-accumulated products of the stored weights, rounded once; with
    ``ctx.act_quant`` (``--emulate``) x first quantized per row as llama.cpp's CPU backend does."""
    return kernels.matmul(W.raw, W.qtype, x, path=ctx.kernel, act_quant=ctx.act_quant)


#: The positions of a batch whose logits are computed (``forward``'s and ``mtp_forward``'s ``outputs``).
OUTPUTS = ("all", "last", "none")


def output_rows(W, h: np.ndarray, outputs: str, ctx: Ctx) -> np.ndarray | None:
    """``result_output = W h`` on the rows a batch asks logits for: every row (``"all"``), the last
    (``"last"``: a prompt needs only its last row) or none (``"none"``: a catch-up that needs only
    the hiddens) — as llama.cpp computes only the rows its batch flags for output (``inp_out_ids``,
    ``llama_batch.logits``). Each row's logits depend on that row alone, so the rows computed have
    the same bits either way. A traced run (``ctx.trace``) computes and records every row, as a trace
    promises every position's intermediates, and returns the rows asked for.
    h [T, E] -> [T, V], [1, V], or None (the LM head skipped)."""
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs must be one of {OUTPUTS}, not {outputs!r}")
    traced = ctx.trace is not None
    if outputs == "none" and not traced:
        return None
    logits = ctx.cb("result_output", -1, mm(W, h if outputs == "all" or traced else h[-1:], ctx))  # [T or 1, V]
    if outputs == "none":
        return None
    return logits if outputs == "all" else logits[-1:]


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """``ggml_rms_norm`` (ops.cpp ``ggml_compute_forward_rms_norm_f32``), without the weight.

    Squares are float32 products summed in double; ``mean = (float)(sum / n)``;
    ``scale = 1.0f / sqrtf(mean + eps)``; ``y = x * scale``.  [..., n] -> [..., n]
    """
    x = np.asarray(x, dtype=F32)
    ss = np.sum((x * x).astype(np.float64), axis=-1, keepdims=True)  # [..., 1]
    mean = (ss / x.shape[-1]).astype(F32)
    scale = F32(1.0) / np.sqrt(mean + F32(eps))
    return x * scale


def rms_norm_w(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """``build_norm(x, w, LLM_NORM_RMS)``: RMSNorm then multiply by the stored weight (already 1+w)."""
    return rms_norm(x, eps) * w


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """``build_gdn_l2_norm`` (src/models/models.h): ``rms_norm(x, eps/n) * (1/sqrtf(n))``
    = x / sqrt(Σx² + eps).  [..., n] -> [..., n]"""
    n = x.shape[-1]
    return rms_norm(x, eps / n) * (F32(1.0) / np.sqrt(F32(n)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``op_sigmoid``: 1 / (1 + expf(-x)). (expf overflows to inf for x < −88.7: the result is then
    0, as in C; numpy's overflow warning is silenced.)"""
    with np.errstate(over="ignore"):
        return F32(1.0) / (F32(1.0) + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    """``ggml_vec_silu_f32``: x / (1 + exp(-x)) (−0 for x < −88.7, where expf overflows to inf)."""
    with np.errstate(over="ignore"):
        return x / (F32(1.0) + np.exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``ggml_swiglu_split(gate, up)`` = silu(gate) ⊙ up: :func:`silu` then a float32 multiply."""
    return silu(gate) * up


def softplus(x: np.ndarray) -> np.ndarray:
    """``op_softplus``: x > 20 ? x : logf(1 + expf(x))."""
    with np.errstate(over="ignore"):
        return np.where(x > F32(20.0), x, np.log(F32(1.0) + np.exp(x))).astype(F32)


def softmax(x: np.ndarray) -> np.ndarray:
    """``ggml_compute_forward_soft_max_f32``: e = exp(x - max), Σ in double, p = e * (float)(1/Σ)."""
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    s = np.sum(e.astype(np.float64), axis=-1, keepdims=True)
    return e * (1.0 / s).astype(F32)


def ieee(fn: Callable) -> Callable:
    """Run ``fn`` with numpy's floating-point warnings off (``np.errstate(all="ignore")``). The
    forward passes compute IEEE float arithmetic as llama.cpp's C does, which never warns: on weights
    that hold inf or NaN, ``inf − inf``, ``0 · inf`` and their NaNs are the computed values
    (docs/numerics.md, "Non-finite weights"), not something to report on stderr."""

    @functools.wraps(fn)
    def silent(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return silent


def argmax(logits: np.ndarray) -> int:
    """The greedy choice of llama.cpp's greedy sampler (``llama_sampler_greedy_apply``, and the
    ``temp <= 0`` pass of ``llama_sampler_temp_impl``): starting from id 0, an id is taken when its
    logit is *greater* than the best so far — the first maximum. A NaN logit is never greater, so it
    is passed over; if logit 0 is NaN nothing compares greater and id 0 is chosen. Finite logits: the
    same id as ``np.argmax``. logits [V] -> id."""
    logits = np.asarray(logits)
    nan = np.isnan(logits)
    if not nan.any():
        return int(np.argmax(logits))
    if nan[0]:
        return 0
    return int(np.argmax(np.where(nan, -np.inf, logits)))  # a NaN that becomes -inf only ties, after the earlier ids


def dot64(a: np.ndarray, b: np.ndarray, path: str = "numba") -> np.ndarray:
    """Σ a·b over the last axis: exact float64 products summed in increasing index order, rounded
    once to float32 (``kernels.dot64``; the order is defined, not numpy's). [..., n]·[..., n] -> [...]"""
    return kernels.dot64(a, b, path=path)


def to_f16(x: np.ndarray) -> np.ndarray:
    """Round float32 to F16 (nearest even) and back, as ggml's fp32→fp16 conversion does."""
    return x.astype(np.float16).astype(F32)
