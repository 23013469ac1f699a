"""``dot64(a, b)``: exact float64 dot products in a defined summation order — the one dot product of the
reference's attention (scores K·q and the probability-weighted sum of V), MoE (the shared-expert gate) and delta
rule (the two mat-vecs of ``refimpl.model.deltanet.delta_rule_step``, which :mod:`kernels.plain.recurrent` compiles).

The same precision policy as :func:`kernels.matmul`'s plain mode: products of float32 values formed in float64
(where they are exact), summed in float64 from +0.0 **in increasing index order**, rounded once to float32.
``Σ_i a[..., i] · b[..., i]`` with numpy broadcasting of the leading axes. Two paths, equal **bit for bit**:
``path="numpy"`` (``_dot64_numpy``, the definition: one vectorized float64 add per index) and ``path="numba"``
(default; compiled loops).

Why a defined order: the first version summed with ``np.einsum``, whose float64 order is numpy's
internal business (unrolled, SIMD-dispatched by CPU); an oracle's bits should not depend on which
numpy build or CPU computed them. Increasing index order is the order of ``matmul``.
"""

from __future__ import annotations

import functools

import numpy as np

from kernels.base.flags import JIT_ENABLED, jit

F32 = np.float32
_PATHS = ("numba", "numpy")


def _dot64_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[..., n] · [..., n] -> [...], the definition: from +0.0, one float64 add per index i, i increasing."""
    acc = np.zeros(np.broadcast_shapes(a.shape[:-1], b.shape[:-1]), dtype=np.float64)  # [...]
    for i in range(a.shape[-1]):
        acc += a[..., i].astype(np.float64) * b[..., i].astype(np.float64)  # exact product, rounded sum
    return acc.astype(F32)


@jit()
def _dot64_lead3(a, b, out):
    """out[x, y, z] = float32(Σ_i float64(a[x, y, z, i]) · float64(b[x, y, z, i])), i increasing.

    ``a``, ``b`` may be broadcast views (zero strides). Four z side by side: four independent
    chains, each in the same order as one alone.
    """
    X, Y, Z = out.shape
    n = a.shape[3]
    for x in range(X):
        for y in range(Y):
            z = 0
            while z + 4 <= Z:
                s0 = s1 = s2 = s3 = 0.0
                for i in range(n):
                    s0 += np.float64(a[x, y, z, i]) * np.float64(b[x, y, z, i])
                    s1 += np.float64(a[x, y, z + 1, i]) * np.float64(b[x, y, z + 1, i])
                    s2 += np.float64(a[x, y, z + 2, i]) * np.float64(b[x, y, z + 2, i])
                    s3 += np.float64(a[x, y, z + 3, i]) * np.float64(b[x, y, z + 3, i])
                out[x, y, z], out[x, y, z + 1], out[x, y, z + 2], out[x, y, z + 3] = s0, s1, s2, s3
                z += 4
            while z < Z:
                s = 0.0
                for i in range(n):
                    s += np.float64(a[x, y, z, i]) * np.float64(b[x, y, z, i])
                out[x, y, z] = s
                z += 1


def dot64(a: np.ndarray, b: np.ndarray, *, path: str = "numba") -> np.ndarray:
    """``Σ_i a[..., i]·b[..., i]`` in float64, i increasing, rounded once: float32 [broadcast(...)].

    ``a``, ``b`` float32 (or float64) with equal last axes; leading axes broadcast like numpy's
    (broadcasting never copies: e.g. ``dot64(keys[None], q[:, None, None, :])`` scores every query
    head against every key without repeating either).
    """
    if path not in _PATHS:
        raise ValueError(f"dot64: path must be 'numba' or 'numpy', got {path!r}")
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim == 0 or b.ndim == 0 or a.shape[-1] != b.shape[-1]:
        raise ValueError(f"dot64: shapes {a.shape} and {b.shape} do not share a last axis")
    lead = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    if path == "numpy" or not JIT_ENABLED or len(lead) > 3:
        return _dot64_numpy(a, b)
    n = a.shape[-1]
    lead3 = (1,) * (3 - len(lead)) + lead  # [X, Y, Z]
    a4 = np.broadcast_to(a, lead + (n,)).reshape(lead3 + (n,))  # views: [X, Y, Z, n]
    b4 = np.broadcast_to(b, lead + (n,)).reshape(lead3 + (n,))
    out = np.empty(lead3, dtype=np.float32)  # [X, Y, Z]
    if out.size:
        _lead3_any_layout(a4.dtype, b4.dtype)(a4, b4, out)
    return out.reshape(lead)


@functools.cache
def _lead3_any_layout(a_dtype, b_dtype):
    """:func:`_dot64_lead3` compiled once for these dtypes, with its inputs typed any-layout (numba's ``A``): a
    broadcast view (strided) and a contiguous one then share one compiled kernel, where calling the dispatcher
    compiles one per combination of layouts (builtin:kjv's attention met all four: 4 × ~0.5 s of a first run). The
    compiled kernel's entry point is called directly, reading any view through its strides."""
    from numba import from_dtype, types

    a, b = (types.Array(from_dtype(np.dtype(d)), 4, "A", readonly=True) for d in (a_dtype, b_dtype))
    return _dot64_lead3.compile((a, b, types.Array(types.float32, 3, "C")))
