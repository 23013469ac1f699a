"""Fused quantized matmul: ``y = x @ W.T`` straight from GGUF bytes, without materialising W.

``matmul(w_raw, qtype, x)`` with ``W`` (N, K) stored as N quantized rows and ``x`` (T, K) float32
returns ``y`` (T, N) float32, ``y[t, n] = W[n] · x[t]`` (ggml's ``mul_mat(W, x)``).

Precision policy of the plain mode (``act_quant=False``) — the oracle's own numerics
    The weights are dequantized exactly as ``gguf.quants.dequantize`` does (float32, see
    :mod:`kernels.plain.dequant`); each product ``w * x`` is formed in float64, where it is exact (two
    float32 significands fit in 53 bits); the K products are summed in float64 **in increasing column
    order**, starting from +0.0; the sum is rounded once to float32. Every output element is computed
    alone, the same way whatever T and N are, so a batch gives bit-identical rows to single-row calls
    and nothing depends on the thread count.

``path="numpy"`` — the definition
    ``_matmul_numpy``: that policy written out. ``gguf.quants.dequantize`` on chunks of rows (never the
    whole matrix of a big tensor), then one float64 add per column k, k increasing, for all T × n
    outputs of the chunk at once. Its numbers *are* the plain mode's; the numba path is its fast twin.
``path="numba"`` (default)
    Every type through :mod:`kernels.lanes.pack`: 16 weight rows at a time, one row's float64 sum per
    SIMD lane, weight blocks decoded once per four activation rows (once per batch from nine rows
    on). For the last N mod 16 rows (and with ``NUMBA_DISABLE_JIT=1``) ``_matmul_rows(kind)``: ``prange`` over tasks of 16 weight rows; each row
    is decoded once into a thread-local float32 buffer, widened (exactly) to float64 and dotted with
    all T activation rows, so the weights are read once per batch. Both sum in increasing column
    order from +0.0 (``_matmul_rows`` sums four rows side by side, four independent chains in the same
    order each; the lanes' ``fma`` of an exact product is the same rounded add).

The two paths are equal bit for bit, for every weight type (tests/test_kernels_matmul.py: normal,
extreme and raw scales, orders that numpy's pairwise sum would change, all-(−0) products). The one
exception is which NaN: a NaN output is a NaN on both paths, but its sign and payload are not
defined (gguf keeps a NaN scale's payload, the numba decoders make it the canonical NaN, and an add
of two NaNs keeps whichever the CPU keeps) — as for :func:`kernels.dequantize`.

``act_quant=True`` — llama.cpp's numerics (numba path only)
    Each activation row is quantized to the weight type's ``vec_dot_type`` exactly as llama.cpp's
    x86 CPU backend does (Q8_0 / Q8_1 / Q8_K, F16 or BF16 rounding), the per-block integer dots are
    exact, and the block scales are combined in float32 exactly as the generic
    ``ggml_vec_dot_*_generic`` C code does; see :mod:`kernels.ggml.actquant`. Also batch- and
    thread-count-independent. It differs from llama.cpp's SIMD kernels only in float32 accumulation
    order, and from the plain mode by the activation quantization error.

Inputs: ``w_raw`` is the (N, row bytes) uint8 array of one weight matrix as GGUFReader hands it out
(a C-contiguous slice ``raw[e]`` of a 3-D expert tensor is used without copying); for F32 / F16 it
may be the (N, K) float32 / float16 array. ``x`` is float32 (T, K), or (K,) for a single row (then
the result is (N,)), or any (..., K). Bad input raises ``ValueError`` with a one-line message.
"""

from __future__ import annotations

import numpy as np
from gguf import quants as gguf_quants
from numba import prange

from kernels.lanes import pack as lanes
from kernels.ggml.actdots import matmul_act_quant
from kernels.base.blocks import weight_layout
from kernels.plain.dequant import as_row_bytes, dequantize_row
from kernels.base.flags import JIT_ENABLED, SERIAL_BELOW, jit, per_type

ROWS_PER_TASK = 16  # weight rows per prange iteration (buffers are allocated once per task)
_NUMPY_CHUNK_VALUES = 1 << 20  # path="numpy": dequantize about this many weights at a time


# --------------------------------------------------------------------------------------------
# numba path


@jit()
def _dot_f64(w, x):
    """Σ_k w[k]*x[k] in float64, k increasing."""
    acc = 0.0
    for k in range(w.size):
        acc += w[k] * x[k]
    return acc


@jit()
def _dot4_f64(w, x):
    """The four sums ``_dot_f64(w[i], x)``, i = 0..3, side by side: four independent float64 chains,
    each in increasing k, so each result is bit-identical to ``_dot_f64``. One chain alone is bound
    by the add latency; four reach the scalar multiply/add throughput (eight measured no faster)."""
    a0 = a1 = a2 = a3 = 0.0
    for k in range(x.size):
        xk = x[k]
        a0 += w[0, k] * xk
        a1 += w[1, k] * xk
        a2 += w[2, k] * xk
        a3 += w[3, k] * xk
    return a0, a1, a2, a3


@jit(inline=True)
def _rows_task(kind, w, x64, out, task, row, rows):
    """Rows task·ROWS_PER_TASK … of ``out`` (``row``, ``rows``: float32 [K] / float64 [4, K] scratch)."""
    N = w.shape[0]
    T, K = x64.shape
    start = task * ROWS_PER_TASK
    stop = min(N, start + ROWS_PER_TASK)
    for n0 in range(start, stop, 4):
        group = min(4, stop - n0)
        for i in range(group):
            dequantize_row(kind, w[n0 + i], row)
            for k in range(K):
                rows[i, k] = row[k]
        for t in range(T):
            if group == 4:
                s0, s1, s2, s3 = _dot4_f64(rows, x64[t])
                out[t, n0] = s0
                out[t, n0 + 1] = s1
                out[t, n0 + 2] = s2
                out[t, n0 + 3] = s3
            else:
                for i in range(group):
                    out[t, n0 + i] = _dot_f64(rows[i], x64[t])


@jit()
def _rows_task_compiled(kind, w, x64, out, task, row, rows):
    """``_rows_task`` compiled on its own, for ``_matmul_rows``' prange body (``lanes.pack``: the parallel kernels'
    bodies)."""
    _rows_task(kind, w, x64, out, task, row, rows)


@per_type
def _matmul_rows(kind):
    @jit(parallel=True, kind=kind)
    def _matmul_rows(w, x64, out):
        """out[t, n] = float32(Σ_k float64(W[n, k]) * x64[t, k]) for W's rows given as bytes ``w``."""
        K = x64.shape[1]
        for task in prange((w.shape[0] + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
            _rows_task_compiled(kind, w, x64, out, np.int64(task), np.empty(K, dtype=np.float32),
                                np.empty((4, K), dtype=np.float64))

    return _matmul_rows


@per_type
def _matmul_rows_serial(kind):
    @jit(kind=kind)
    def _matmul_rows_serial(w, x64, out):
        """``_matmul_rows`` on the calling thread (small products: ``flags.SERIAL_BELOW``)."""
        K = x64.shape[1]
        row, rows = np.empty(K, dtype=np.float32), np.empty((4, K), dtype=np.float64)
        for task in range((w.shape[0] + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
            _rows_task(kind, w, x64, out, task, row, rows)

    return _matmul_rows_serial


# --------------------------------------------------------------------------------------------
# numpy path


def _matmul_numpy(w_bytes: np.ndarray, qtype, x: np.ndarray) -> np.ndarray:
    """The plain mode's definition: out[t, n] = float32(Σ_k float64(W[n, k]) · float64(x[t, k])), the
    sum from +0.0 in increasing k (module docstring). (N, row bytes), (T, K) -> (T, N)."""
    N = w_bytes.shape[0]
    T, K = x.shape
    x64 = x.astype(np.float64)  # [T, K], exact
    out = np.empty((T, N), dtype=np.float32)
    chunk = max(1, _NUMPY_CHUNK_VALUES // max(K, 1))
    for n0 in range(0, N, chunk):
        wT = gguf_quants.dequantize(w_bytes[n0 : n0 + chunk], qtype).astype(np.float64).T.copy()  # [n, K] -> [K, n], exact
        acc = np.zeros((T, wT.shape[1]))  # [T, n]: +0.0, where every sum starts
        for k in range(K):  # increasing column order
            acc += x64[:, k, None] * wT[k]  # [T, n]: exact products, one rounded float64 add each
        out[:, n0 : n0 + wT.shape[1]] = acc  # rounded once to float32
    return out


# --------------------------------------------------------------------------------------------
# Public entry point


def matmul(w_raw: np.ndarray, qtype, x: np.ndarray, *, path: str = "numba", act_quant: bool = False) -> np.ndarray:
    """``y = x @ W.T`` for the quantized matrix ``W`` (N, K) stored in ``w_raw``: float32 (T, N).

    ``x`` float32 (T, K) -> (T, N); (K,) -> (N,); any leading shape (..., K) -> (..., N).
    ``path`` is ``"numba"`` or ``"numpy"``; ``act_quant=True`` (numba only) emulates llama.cpp's
    activation quantization and integer block dots. The module docstring states the precision
    policy; the two paths give the same bits. Bad input raises ``ValueError`` (one line).
    """
    if path not in ("numba", "numpy"):
        raise ValueError(f"matmul: path must be 'numba' or 'numpy', got {path!r}")
    if act_quant and path != "numba":
        raise ValueError("matmul: act_quant=True is implemented on the numba path only")
    qtype = weight_layout(qtype).qtype
    packed = w_raw if isinstance(w_raw, lanes.PackedRows) and w_raw.ndim == 2 else None
    if isinstance(w_raw, lanes.PackedRows):
        if w_raw.qtype != qtype:
            raise ValueError(f"matmul: a {w_raw.qtype.name} packed matrix passed as {qtype.name}")
        w_raw = w_raw.raw
    w_raw = np.asarray(w_raw)
    if w_raw.ndim != 2:
        raise ValueError(f"matmul: w_raw for {qtype.name} must be 2-D (N rows x row bytes), got shape {w_raw.shape}")
    w_bytes, K = as_row_bytes(w_raw, qtype, what="matmul: w_raw")
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise ValueError(f"matmul: x must be float32, got {x.dtype}")
    if x.ndim == 0 or x.shape[-1] != K:
        raise ValueError(f"matmul: x of shape {x.shape} does not end in K={K}, the values per {qtype.name} weight row")
    x2d = np.ascontiguousarray(x.reshape(-1, K))
    N, T = w_bytes.shape[0], x2d.shape[0]

    if act_quant:
        y = matmul_act_quant(w_bytes, qtype, x2d, packed)
    elif path == "numpy":
        y = _matmul_numpy(w_bytes, qtype, x2d)
    else:
        y = np.zeros((T, N), dtype=np.float32)
        if y.size and K:
            _matmul_plain(w_bytes, qtype, x2d.astype(np.float64), y, packed)
    return y.reshape(x.shape[:-1] + (N,))


def matmul_experts(stack, qtype, ids, x: np.ndarray, rows: tuple[int, int] | None = None) -> np.ndarray:
    """``ggml_mul_mat_id`` for one activation row per selected expert: float32 [n, rows] whose row i is
    ``matmul(stack[ids[i]][r0:r1], qtype, x[i])`` bit for bit — the plain numba path's numbers.

    ``stack``: the (X, N, row bytes) expert matrices (raw, or a :class:`kernels.PackedRows` stack);
    ``ids`` [n]; ``x`` float32 [n, K]; ``rows``: (r0, r1) of each expert's N rows (default all). A packed
    stack multiplies every expert's rows in one parallel kernel call (``lanes.matmul_packed_experts``:
    one thread launch and one pass of Python per token instead of one per expert); anything else goes
    expert by expert through :func:`matmul`."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    x = np.asarray(x)
    r0, r1 = rows if rows is not None else (0, np.shape(stack)[1])
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[0] != ids.size:
        raise ValueError(f"matmul_experts: x must be float32 [n, K] with one row per id ({ids.size}), got {x.dtype} {x.shape}")
    if isinstance(stack, lanes.PackedRows) and stack.ndim == 3 and JIT_ENABLED and ids.size:
        if stack.qtype != weight_layout(qtype).qtype:
            raise ValueError(f"matmul_experts: a {stack.qtype.name} packed stack passed as {weight_layout(qtype).qtype.name}")
        if not ((0 <= ids) & (ids < stack.shape[0])).all():
            raise ValueError(f"matmul_experts: expert ids must be in [0, {stack.shape[0]}), got {ids.tolist()}")
        y = np.zeros((ids.size, r1 - r0), dtype=np.float32)
        K = as_row_bytes(stack.raw[0][:1], qtype, what="matmul_experts: stack")[1]
        if x.shape[1] == K and lanes.matmul_packed_experts(stack, ids, r0, x.astype(np.float64), y):
            return y
    if not ids.size:
        return np.zeros((0, r1 - r0), dtype=np.float32)
    return np.concatenate([matmul(stack[int(e)][r0:r1], qtype, x[i : i + 1]) for i, e in enumerate(ids)])  # [n, r1 − r0]


def _matmul_plain(w_bytes: np.ndarray, qtype, x64: np.ndarray, y: np.ndarray, packed=None) -> None:
    """The plain numba product into ``y`` (T, N): 16-row lanes where :mod:`kernels.lanes.pack` has a kernel
    for the type (bit-identical to ``_matmul_rows``; from the packed words when given),
    ``_matmul_rows`` for the rest of the rows."""
    if packed is not None and JIT_ENABLED:
        n = lanes.matmul_packed(packed, x64, y)
    elif JIT_ENABLED and lanes.supported(qtype):
        n = lanes.matmul_lanes(w_bytes, qtype, x64, y)
    else:
        n = 0
    if n < w_bytes.shape[0]:
        tail = np.zeros((y.shape[0], w_bytes.shape[0] - n), dtype=np.float32)
        rows = _matmul_rows_serial if tail.size * x64.shape[1] < SERIAL_BELOW else _matmul_rows
        rows(qtype)(w_bytes[n:], x64, tail)
        y[:, n:] = tail
