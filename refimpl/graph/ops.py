"""ggml ops on the model's tensors, as ggml-cpu computes them (``ggml-cpu/ops.cpp``, ``vec.cpp``,
``unary-ops.cpp``, ``ggml-cpu.c``), each through :mod:`kernels.ggml` on the path ``ctx.ggml`` names
(``"avx512"`` | ``"avx2"`` | ``"generic"``) with llama.cpp's ``ctx.n_threads``.

Unlike the reference's ops (:mod:`refimpl.model.ops`), these are not batch invariant: a matmul's kernel, and
with it its rounding, depends on the row count (``kernels.ggml.mulmat.kernel_for``), so a batch is computed
ubatch by ubatch as llama.cpp does (:func:`by_ubatch`).

``ctx`` is the model's ``Ctx`` (refimpl.model.ctx), read by its fields: ``ggml``, ``n_threads``, ``repack``,
``n_ubatch``, ``trace`` and its ``cb``. Shapes use the legend of docs/architecture.md.
"""

from __future__ import annotations

import numpy as np

from kernels.ggml import mulmat, norm, rows, vecmath

F32 = np.float32


def mul_mat(W, x: np.ndarray, ctx) -> np.ndarray:
    """``ggml_mul_mat(W, x)``: [T, in] -> [T, out] for a :class:`refimpl.io.weights.Matrix` W of numpy shape
    (out, in): ``kernels.ggml.mulmat.mul_mat`` — the kernel ggml-cpu picks for T rows of that type, or the
    CPU_REPACK buffer's gemm/gemv for a weight llama.cpp repacks (``ctx.repack``, its default); through the
    weight's column layout when the model was loaded with one (``W.cols``: the same bits)."""
    return mulmat.mul_mat(W.row_bytes, W.qtype, x, ctx.ggml, ctx.n_threads,  # Matrix.row_bytes: worked out once
                          repack=ctx.repack, tensor_rows=W.stored_rows, cols=W.cols)  # cols: its column layout, if built


def rms_norm_w(x: np.ndarray, w: np.ndarray, eps: float, ctx) -> np.ndarray:
    """``build_norm(x, w, LLM_NORM_RMS)``: ggml-cpu's fused RMS_NORM+MUL (``kernels.ggml.norm.rms_norm``)."""
    return norm.rms_norm(np.ascontiguousarray(x, dtype=F32), eps, ctx.ggml, w)


def l2_norm(x: np.ndarray, eps: float, ctx) -> np.ndarray:
    """``build_gdn_l2_norm`` (src/models/models.h): ``ggml_rms_norm(x, eps/n)`` then ``ggml_scale(1/sqrtf(n))``
    (``kernels.ggml.norm.gdn_l2_norm``)."""
    return norm.gdn_l2_norm(np.ascontiguousarray(x, dtype=F32), eps, ctx.ggml)


def sigmoid(x: np.ndarray, ctx) -> np.ndarray:
    """``ggml_sigmoid`` (``op_sigmoid``): 1 / (1 + expf(-x)) with glibc's ``expf``."""
    return vecmath.sigmoid(np.ascontiguousarray(x, dtype=F32), ctx.ggml)


def silu(x: np.ndarray, ctx) -> np.ndarray:
    """``ggml_silu``: the SIMD ``ggml_v_silu`` of ``ggml_vec_silu_f32`` over rows of the last axis (ggml's ne0)."""
    return vecmath.silu(np.ascontiguousarray(x, dtype=F32), ctx.ggml)


def swiglu(gate: np.ndarray, up: np.ndarray, ctx) -> np.ndarray:
    """``ggml_swiglu_split(gate, up)``: ``ggml_vec_swiglu_f32`` over rows of the last axis."""
    return vecmath.swiglu(np.ascontiguousarray(gate, dtype=F32), np.ascontiguousarray(up, dtype=F32), ctx.ggml)


def softplus(x: np.ndarray, ctx) -> np.ndarray:
    """``ggml_softplus`` (``op_softplus``): x > 20 ? x : logf(1 + expf(x)), glibc's ``expf``/``logf``."""
    return vecmath.softplus(np.ascontiguousarray(x, dtype=F32), ctx.ggml)


def soft_max(x: np.ndarray, ctx) -> np.ndarray:
    """``ggml_soft_max(x)`` (no mask, scale 1) with its SIMD ``expf`` (``kernels.ggml.vecmath.soft_max``)."""
    return vecmath.soft_max(np.ascontiguousarray(x, dtype=F32), None, 1.0, ctx.ggml)


def get_rows(table, ids: np.ndarray, ctx) -> np.ndarray:
    """``ggml_get_rows(table, ids)``: ``dequantize_row_*`` of the stored rows (``kernels.ggml.rows.get_rows``).
    [T] -> [T, E]."""
    return rows.get_rows(table.row_bytes, table.qtype, ids, ctx.ggml)  # the path: Arm's NaN bits


def by_ubatch(run, n_tokens: int, n_ubatch: int, outputs: str, state):
    """A batch of ``n_tokens`` as llama.cpp decodes it — one graph per ubatch of ``n_ubatch`` tokens (the last one
    shorter), each on the state the previous one left (``llama_context::decode``'s ubatch loop; a matmul's kernel
    and flash attention's path depend on the ubatch's row count). ``run(state, u0, u1, outputs)`` computes rows
    u0 … u1−1 and returns (logits or None, hiddens, state); each ubatch's LM head sees its output rows: all of them,
    or with ``"last"`` / ``"none"`` only those of the last ubatch.
    Returns (logits [rows, V] or None, hiddens [n_tokens, E], state)."""
    logits, hs = [], []
    starts = list(range(0, n_tokens, n_ubatch))
    for u0 in starts:
        out = outputs if outputs == "all" or u0 == starts[-1] else "none"
        lg, h, state = run(state, u0, min(u0 + n_ubatch, n_tokens), out)
        if lg is not None:
            logits.append(lg)
        hs.append(h)
    return (np.concatenate(logits) if logits else None), np.concatenate(hs), state


def output_rows(W, h: np.ndarray, outputs: str, ctx) -> np.ndarray | None:
    """``result_output = ggml_mul_mat(W, h)`` on the rows the ubatch flags for output (``inp_out_ids``,
    ``llama_batch.logits``): every row (``"all"``), the last (``"last"``) or none (``"none"``; ``outputs`` was
    checked by the entry, refimpl.model.trunk.forward). The kernel depends on the row count, so the rows are
    computed on their own, as llama.cpp does; a traced run (``ctx.trace``) also computes and records every row,
    apart from the rows returned. h [T, E] -> [T, V], [1, V], or None (the LM head skipped)."""
    traced = ctx.trace is not None
    if traced and outputs != "all":
        ctx.cb("result_output", -1, mul_mat(W, h, ctx))  # the trace's rows, computed apart from
        return None if outputs == "none" else mul_mat(W, h[-1:], ctx)  # the one row llama.cpp's LM head sees: [1, V]
    if outputs == "none":
        return None
    return ctx.cb("result_output", -1, mul_mat(W, h if outputs == "all" else h[-1:], ctx))  # [T or 1, V]
