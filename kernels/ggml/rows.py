"""Bit-exact emulation of ggml-cpu's row-selection ops: ``ggml_get_rows`` (token embeddings, the MoE
expert weights' rows), ``ggml_argsort`` / ``ggml_argsort_top_k`` (build_moe_ffn's expert selection),
``ggml_top_k`` and ``ggml_concat`` (the delta-net conv state, the MTP input).

None of them depends on the ISA path (comments below say why); ``path`` is not a parameter.

get_rows (``ops.cpp: ggml_compute_forward_get_rows_{q,f16,bf16,f32}``), per selected row:

* F32: ``ggml_vec_cpy_f32`` — a bit copy (signalling NaNs stay signalling);
* BF16: ``ggml_cpu_bf16_to_fp32`` — ``u16 << 16`` in every branch (AVX-512, AVX2, scalar);
* F16: ``ggml_cpu_fp16_to_fp32`` — F16C ``vcvtph2ps`` for 16/8/4-value chunks, the table
  ``ggml_table_f32_f16`` (``ggml-impl.h: ggml_compute_fp16_to_fp32``) for the tail; both are exact and
  both quiet a signalling NaN (``payload << 13 | 0x400000``, sign kept): ``vecmath.F16_TO_F32``;
* quantized: ``ggml_get_type_traits(type)->to_float``, i.e. ``ggml-quants.c: dequantize_row_*`` from
  **libggml-base**, which both builds compile without any ``-m`` ISA flag (SSE2 only: no FMA can be
  contracted, no ``vfmadd`` in either ``libggml-base.so``), so every value is rounded as written in C.
  ``kernels.plain.dequant``'s decoders compute the same float32 operations in the same order, but
  convert the f16 scales with ``f16_at``, which turns every NaN into the canonical NaN; ggml keeps the
  payload and sign. So MXFP4 (E8M0 scale, never NaN) reuses ``_deq_mxfp4``, and the f16-scaled types
  are transcribed below (Q2_K, Q3_K and the legacy Q4_0 … Q5_1, IQ4_NL in :mod:`kernels.ggml.rows_q`)
  with ggml's conversion (a NaN or inf scale is rare but can be stored).

AArch64 (``arm64-dotprod`` / ``arm64-i8mm``, ``path``): libggml-base is built with the build's ``-march`` there and
GCC contracts ``x*d + m`` into ``fmadd`` / ``fmla`` (Q4_1, Q5_1, Q4_K, Q5_K) — the same numbers (the products of a
small integer and an f16 scale are exact) but Arm's NaN rules: the addend's NaN first (``m``, or ``-m1`` negated by
``fneg``: its sign flipped), the default NaN 0x7FC00000 (:func:`kernels.ggml.rows_q.arm64_nans`). Every type bit for
bit against the AArch64 build, NaN and inf scales included.

argsort / top_k (``ops.cpp: ggml_compute_forward_argsort_f32``, ``_top_k_f32``): libstdc++'s (GCC 12,
``bits/stl_algo.h``) ``std::sort`` and ``std::partial_sort`` of the indices ``0..n-1`` with the comparator
``data[a] > data[b]`` (DESC), transcribed here line by line — introsort with median-of-three pivots,
a heap sort below depth ``2·floor(log2 n)``, and a final insertion sort over runs of 16 — so ties, -0.0
vs 0.0 (equal) and NaN (never greater, never smaller) land exactly where ggml puts them.
``ggml_argsort_top_k(a, k)`` (build_moe_ffn) is a view of the first k of the full argsort. ``ggml_top_k``
partial-sorts and then swaps its first two outputs ("emphasize that the order is not important").
"""

from __future__ import annotations

import numpy as np

from kernels.base.blocks import QT
from kernels.base.flags import jit
from kernels.ggml.mulmat_q8 import _qt
from kernels.ggml.vecmath import F16_TO_F32, fp16_at  # ggml's half -> float (F16C = the table, NaNs quieted)
from kernels.ggml import rows_iq  # IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S
from kernels.ggml.isa import ARM_NAN, simd
from kernels.ggml.rows_q import _deq_q2_k, _deq_q3_k, _legacy, arm64_nans  # Q2_K, Q3_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL
from kernels.plain.dequant import IQ4NL_F32, _deq_mxfp4, as_row_bytes, k_scale_min, q8_0_rows_numpy


# dequantize_row_* of ggml-quants.c; src: [N, row bytes] uint8, y: [N, n] float32, tab: F16_TO_F32.
def _deq_q8_0(src, y, tab):
    """In numpy (:func:`kernels.plain.dequant.q8_0_rows_numpy`, ggml's table): nothing to compile (a Q8_0 model's
    token embedding, 0.5–0.8 s of compiling a loop)."""
    q8_0_rows_numpy(src, tab, y)


@jit()
def _deq_q4_k(src, y, tab):
    for r in range(src.shape[0]):
        for i in range(y.shape[1] // 256):  # block_q4_K: d, dmin, scales[12], qs[128]
            o = 144 * i
            d = fp16_at(src[r], o, tab)
            dmin = fp16_at(src[r], o + 2, tab)
            q = o + 16
            for j in range(4):  # for (j = 0; j < QK_K; j += 64), is = 2j
                sc, m = k_scale_min(src[r], o + 4, 2 * j)  # get_scale_min_k4(is + 0, x[i].scales, &sc, &m)
                d1, m1 = np.float32(d * np.float32(sc)), np.float32(dmin * np.float32(m))
                sc, m = k_scale_min(src[r], o + 4, 2 * j + 1)
                d2, m2 = np.float32(d * np.float32(sc)), np.float32(dmin * np.float32(m))
                for l in range(32):
                    y[r, 256 * i + 64 * j + l] = np.float32(d1 * np.float32(int(src[r, q + l]) & 15)) - m1
                for l in range(32):
                    y[r, 256 * i + 64 * j + 32 + l] = np.float32(d2 * np.float32(int(src[r, q + l]) >> 4)) - m2
                q += 32


@jit()
def _deq_q5_k(src, y, tab):
    for r in range(src.shape[0]):
        for i in range(y.shape[1] // 256):  # block_q5_K: d, dmin, scales[12], qh[32], qs[128]
            o = 176 * i
            d = fp16_at(src[r], o, tab)
            dmin = fp16_at(src[r], o + 2, tab)
            ql = o + 48
            u1, u2 = 1, 2
            for j in range(4):
                sc, m = k_scale_min(src[r], o + 4, 2 * j)
                d1, m1 = np.float32(d * np.float32(sc)), np.float32(dmin * np.float32(m))
                sc, m = k_scale_min(src[r], o + 4, 2 * j + 1)
                d2, m2 = np.float32(d * np.float32(sc)), np.float32(dmin * np.float32(m))
                for l in range(32):
                    v = (int(src[r, ql + l]) & 15) + (16 if int(src[r, o + 16 + l]) & u1 else 0)
                    y[r, 256 * i + 64 * j + l] = np.float32(d1 * np.float32(v)) - m1
                for l in range(32):
                    v = (int(src[r, ql + l]) >> 4) + (16 if int(src[r, o + 16 + l]) & u2 else 0)
                    y[r, 256 * i + 64 * j + 32 + l] = np.float32(d2 * np.float32(v)) - m2
                ql += 32
                u1 <<= 2
                u2 <<= 2


@jit()
def _deq_q6_k(src, y, tab):
    sc8 = src.view(np.int8)
    for r in range(src.shape[0]):
        for i in range(y.shape[1] // 256):  # block_q6_K: ql[128], qh[64], scales[16] (int8), d
            o = 210 * i
            d = fp16_at(src[r], o + 208, tab)
            for n in range(2):  # for (n = 0; n < QK_K; n += 128)
                ql, qh, sc = o + 64 * n, o + 128 + 32 * n, o + 192 + 8 * n
                for l in range(32):
                    is_ = l // 16
                    lo, hi, h = int(src[r, ql + l]), int(src[r, ql + l + 32]), int(src[r, qh + l])
                    q1 = ((lo & 15) | (((h >> 0) & 3) << 4)) - 32  # (int8_t)(…) - 32
                    q2 = ((hi & 15) | (((h >> 2) & 3) << 4)) - 32
                    q3 = ((lo >> 4) | (((h >> 4) & 3) << 4)) - 32
                    q4 = ((hi >> 4) | (((h >> 6) & 3) << 4)) - 32
                    yo = 256 * i + 128 * n + l
                    y[r, yo] = np.float32(d * np.float32(sc8[r, sc + is_])) * np.float32(q1)  # d * sc[is + 0] * q1
                    y[r, yo + 32] = np.float32(d * np.float32(sc8[r, sc + is_ + 2])) * np.float32(q2)
                    y[r, yo + 64] = np.float32(d * np.float32(sc8[r, sc + is_ + 4])) * np.float32(q3)
                    y[r, yo + 96] = np.float32(d * np.float32(sc8[r, sc + is_ + 6])) * np.float32(q4)


@jit()
def _deq_iq4_xs(src, y, tab):
    for r in range(src.shape[0]):
        for i in range(y.shape[1] // 256):  # block_iq4_xs: d, scales_h (u16), scales_l[4], qs[128]
            o = 136 * i
            d = fp16_at(src[r], o, tab)
            scales_h = int(src[r, o + 2]) | (int(src[r, o + 3]) << 8)
            for ib in range(8):
                ls = ((int(src[r, o + 4 + ib // 2]) >> 4 * (ib % 2)) & 15) | (((scales_h >> 2 * ib) & 3) << 4)
                dl = np.float32(d * np.float32(ls - 32))
                for j in range(16):
                    byte = int(src[r, o + 8 + 16 * ib + j])
                    y[r, 256 * i + 32 * ib + j] = dl * IQ4NL_F32[byte & 15]
                    y[r, 256 * i + 32 * ib + 16 + j] = dl * IQ4NL_F32[byte >> 4]


@jit()
def _deq_mxfp4_rows(src, y, tab):
    for r in range(src.shape[0]):
        _deq_mxfp4(src[r], y[r])  # kernels.plain.dequant: d = E8M0_HALF[e]; x0*d, the same bits as ggml


_DECODERS = {QT.Q8_0: _deq_q8_0, QT.Q2_K: _deq_q2_k, QT.Q3_K: _deq_q3_k, QT.Q4_K: _deq_q4_k, QT.Q5_K: _deq_q5_k,
             QT.Q6_K: _deq_q6_k, QT.IQ4_XS: _deq_iq4_xs, QT.MXFP4: _deq_mxfp4_rows, QT.Q4_0: _legacy(0),
             QT.Q4_1: _legacy(1), QT.Q5_0: _legacy(2), QT.Q5_1: _legacy(3), QT.IQ4_NL: _legacy(4),
             **rows_iq.DECODERS}
GET_ROWS_TYPES = (QT.F32, QT.F16, QT.BF16) + tuple(_DECODERS)


def get_rows(table: np.ndarray, qtype, ids: np.ndarray, path: str | None = None) -> np.ndarray:
    """``ggml_get_rows(table, ids)`` to float32. ``table`` as :func:`kernels.plain.dequant.as_row_bytes`
    takes it — [R, row bytes] uint8, or float32 / float16 / uint16 values for F32 / F16 / BF16 — and
    ``ids`` int32 of any shape: returns ``ids.shape + (n_cols,)``. Batched (ggml's ``i11`` plane, e.g.
    build_moe_ffn's ``get_rows(probs [T, n_expert, 1], selected [T, k])``): ``table`` [B, R, ·] with
    ``ids`` [B, K] picks ``table[b, ids[b, j]]``. ``path`` decides only NaNs (None: x86's): an AArch64 path's
    libggml-base contracts some decoders into FMAs (:func:`kernels.ggml.rows_q.arm64_nans`)."""
    qtype = _qt(qtype)
    if qtype not in GET_ROWS_TYPES:
        raise ValueError(f"get_rows emulates {', '.join(t.name for t in GET_ROWS_TYPES)}, not {qtype.name}")
    rows, n_cols = as_row_bytes(table, qtype, "table")
    ids = np.asarray(ids, dtype=np.int32)
    n_rows = rows.shape[-2] if rows.ndim >= 2 else 1
    if ids.size and (ids.min() < 0 or ids.max() >= n_rows):  # GGML_ASSERT(i01 >= 0 && i01 < ne01)
        raise IndexError(f"get_rows: ids must lie in [0, {n_rows})")
    if rows.ndim == 3:  # [B, R, row bytes]: row ids[b, j] of plane b
        if ids.ndim != 2 or ids.shape[0] != rows.shape[0]:
            raise ValueError(f"batched get_rows needs ids [{rows.shape[0]}, K], got {ids.shape}")
        ids = ids + (np.arange(rows.shape[0], dtype=np.int32) * n_rows)[:, None]  # [B, K] flat row numbers
    elif rows.ndim != 2:
        raise ValueError(f"get_rows takes a table [R, ·] or [B, R, ·], got {rows.ndim} axes")
    rows = rows.reshape(-1, rows.shape[-1])  # [B*R, row bytes]
    sel = np.ascontiguousarray(rows[ids.reshape(-1)])  # [N, row bytes]
    if qtype == QT.F32:
        y = sel.view(np.float32).copy()  # ggml_vec_cpy_f32: bits kept
    elif qtype == QT.F16:
        y = F16_TO_F32[sel.view(np.uint16)]  # ggml_cpu_fp16_to_fp32
    elif qtype == QT.BF16:
        y = (sel.view(np.uint16).astype(np.uint32) << 16).view(np.float32)  # ggml_cpu_bf16_to_fp32
    else:
        y = np.empty((sel.shape[0], n_cols), np.float32)
        _DECODERS[qtype](sel, y, F16_TO_F32)
        if path is not None and simd(path, "ggml_get_rows").nan == ARM_NAN:
            arm64_nans(qtype, _DECODERS[qtype], sel, y)
    return y.reshape(ids.shape + (n_cols,))


# ---- libstdc++ std::sort / std::partial_sort on int32 indices, comp(a, b) = v[a] > v[b] ----------------
# Positions p index ``idx``; ``_gt(v, idx, p, q)`` is ``__comp(first + p, first + q)``. An index leaving
# [lo, hi) (possible only when NaNs break the strict weak order: undefined behaviour in C++) raises.
S_THRESHOLD = 16  # enum { _S_threshold = 16 }


@jit(inline=True)
def _gt(v, idx, p, q):
    return v[idx[p]] > v[idx[q]]


@jit()
def _push_heap(v, idx, first, hole, top, value):
    parent = (hole - 1) // 2
    while hole > top and v[idx[first + parent]] > v[value]:  # __comp(__first + __parent, __value)
        idx[first + hole] = idx[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    idx[first + hole] = value


@jit()
def _adjust_heap(v, idx, first, hole, length, value):
    top = hole
    second = hole
    while second < (length - 1) // 2:
        second = 2 * (second + 1)
        if _gt(v, idx, first + second, first + second - 1):
            second -= 1
        idx[first + hole] = idx[first + second]
        hole = second
    if (length & 1) == 0 and second == (length - 2) // 2:
        second = 2 * (second + 1)
        idx[first + hole] = idx[first + second - 1]
        hole = second - 1
    _push_heap(v, idx, first, hole, top, value)


@jit()
def _pop_heap(v, idx, first, last, result):
    value = idx[result]
    idx[result] = idx[first]
    _adjust_heap(v, idx, first, 0, last - first, value)


@jit()
def _partial_sort(v, idx, first, middle, last):
    """__partial_sort = __heap_select (with __make_heap) + __sort_heap."""
    length = middle - first
    if length >= 2:  # __make_heap
        parent = (length - 2) // 2
        while True:
            _adjust_heap(v, idx, first, parent, length, idx[first + parent])
            if parent == 0:
                break
            parent -= 1
    for i in range(middle, last):
        if _gt(v, idx, i, first):
            _pop_heap(v, idx, first, middle, i)
    while middle - first > 1:  # __sort_heap
        middle -= 1
        _pop_heap(v, idx, first, middle, middle)


@jit()
def _move_median_to_first(v, idx, result, a, b, c):
    if _gt(v, idx, a, b):
        if _gt(v, idx, b, c):
            m = b
        elif _gt(v, idx, a, c):
            m = c
        else:
            m = a
    elif _gt(v, idx, a, c):
        m = a
    elif _gt(v, idx, b, c):
        m = c
    else:
        m = b
    idx[result], idx[m] = idx[m], idx[result]  # std::iter_swap


@jit()
def _unguarded_partition(v, idx, first, last, pivot, lo, hi):
    while True:
        while _gt(v, idx, first, pivot):
            first += 1
            if first >= hi:
                raise IndexError("std::sort ran past the row (NaN ordering: undefined behaviour in ggml)")
        last -= 1
        while _gt(v, idx, pivot, last):
            last -= 1
            if last < lo:
                raise IndexError("std::sort ran past the row (NaN ordering: undefined behaviour in ggml)")
        if not first < last:
            return first
        idx[first], idx[last] = idx[last], idx[first]
        first += 1


@jit()
def _introsort_loop(v, idx, first, last, depth_limit, lo, hi):
    """The recursion ``__introsort_loop(cut, last, depth_limit); last = cut;`` with an explicit stack
    of the callers' continuations (LIFO: the same order of work; numba's cache mishandles recursion)."""
    stack = np.empty((depth_limit + 2, 3), np.int64)  # (first, last, depth_limit) still to do
    stack[0, 0], stack[0, 1], stack[0, 2] = first, last, depth_limit
    top = 1
    while top > 0:
        top -= 1
        first, last, depth_limit = stack[top, 0], stack[top, 1], stack[top, 2]
        while last - first > S_THRESHOLD:
            if depth_limit == 0:
                _partial_sort(v, idx, first, last, last)
                break
            depth_limit -= 1
            mid = first + (last - first) // 2  # __unguarded_partition_pivot
            _move_median_to_first(v, idx, first, first + 1, mid, last - 1)
            cut = _unguarded_partition(v, idx, first + 1, last, first, lo, hi)
            stack[top, 0], stack[top, 1], stack[top, 2] = first, cut, depth_limit  # the caller: last = cut
            top += 1
            first = cut  # the recursive call: __introsort_loop(cut, last, depth_limit)


@jit(inline=True)
def _unguarded_linear_insert(v, idx, last, lo):
    val = idx[last]
    nxt = last - 1
    while v[val] > v[idx[nxt]]:  # __val_comp_iter
        idx[last] = idx[nxt]
        last = nxt
        nxt -= 1
        if nxt < lo:
            raise IndexError("std::sort ran past the row (NaN ordering: undefined behaviour in ggml)")
    idx[last] = val


@jit(inline=True)
def _insertion_sort(v, idx, first, last, lo):
    if first == last:
        return
    for i in range(first + 1, last):
        if _gt(v, idx, i, first):
            val = idx[i]
            for j in range(i, first, -1):  # std::move_backward(first, i, i + 1)
                idx[j] = idx[j - 1]
            idx[first] = val
        else:
            _unguarded_linear_insert(v, idx, i, lo)


@jit()
def _std_sort(v, idx):
    """std::sort(idx, idx + n, comp): __introsort_loop(…, __lg(n) * 2) then __final_insertion_sort."""
    n = idx.size
    if n == 0:
        return
    lg = 0
    while (n >> (lg + 1)) > 0:  # std::__lg(n) = floor(log2 n)
        lg += 1
    _introsort_loop(v, idx, 0, n, 2 * lg, 0, n)
    if n > S_THRESHOLD:
        _insertion_sort(v, idx, 0, np.int64(S_THRESHOLD), 0)  # int64 as n below: one compiled copy, not two
        for i in range(S_THRESHOLD, n):  # __unguarded_insertion_sort
            _unguarded_linear_insert(v, idx, i, 0)
    else:
        _insertion_sort(v, idx, 0, n, 0)


@jit()
def _argsort_rows(x, out):
    for r in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[r, j] = j
        _std_sort(x[r], out[r])


@jit()
def _top_k_rows(x, k, tmp, out):
    for r in range(x.shape[0]):
        for j in range(x.shape[1]):
            tmp[j] = j
        _partial_sort(x[r], tmp, 0, k, x.shape[1])  # std::partial_sort(tmp, tmp + top_k, tmp + ne00, cmp_top_k)
        out[r, :] = tmp[:k]
        if k > 1:
            out[r, 0], out[r, 1] = tmp[1], tmp[0]  # std::swap(dst_data[0], dst_data[1])


@jit()
def _insertion_sort_rows(x, out):
    """:func:`_argsort_rows` for rows of at most :data:`S_THRESHOLD` values, where std::sort's introsort loop does
    nothing and ``__final_insertion_sort`` is one ``__insertion_sort``: the same calls, without compiling the
    introsort (a model with 16 experts or fewer: ~2 s of the first run)."""
    for r in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[r, j] = j
        _insertion_sort(x[r], out[r], 0, np.int64(x.shape[1]), 0)


def argsort_desc(x: np.ndarray) -> np.ndarray:
    """``ggml_argsort(x, GGML_SORT_ORDER_DESC)`` over the last axis: [..., n] float32 -> [..., n] int32.
    ``ggml_argsort_top_k(x, k)`` is ``argsort_desc(x)[..., :k]``."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    x2 = x.reshape(-1, x.shape[-1])  # [R, n]
    out = np.empty(x2.shape, np.int32)
    (_insertion_sort_rows if x2.shape[1] <= S_THRESHOLD else _argsort_rows)(x2, out)
    return out.reshape(x.shape)


def top_k(x: np.ndarray, k: int) -> np.ndarray:
    """``ggml_top_k(x, k)``: [..., n] float32 -> [..., k] int32 (partial sort, first two swapped)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not 1 <= k <= x.shape[-1]:
        raise ValueError(f"top_k needs 1 <= k <= {x.shape[-1]}, got {k}")
    x2 = x.reshape(-1, x.shape[-1])  # [R, n]
    out = np.empty((x2.shape[0], k), np.int32)
    _top_k_rows(x2, k, np.empty(x2.shape[1], np.int32), out)
    return out.reshape(x.shape[:-1] + (k,))


def concat(a: np.ndarray, b: np.ndarray, dim: int) -> np.ndarray:
    """``ggml_concat(a, b, dim)`` (``ops.cpp: ggml_compute_forward_concat_f32``: ``*y = *x``, a bit copy)
    along ggml dimension ``dim`` (numpy axis ``ndim - 1 - dim``)."""
    a, b = np.asarray(a), np.asarray(b)
    return np.concatenate([a, b], axis=a.ndim - 1 - dim)


__all__ = ["get_rows", "argsort_desc", "top_k", "concat", "F16_TO_F32", "GET_ROWS_TYPES"]
