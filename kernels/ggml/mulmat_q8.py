"""The Q8_0-activation kernels of ggml-cpu's ``mul_mat`` for Q8_0 and MXFP4 weights (``vec_dot`` and llamafile's
``tinyBLAS_Q0_AVX``), bit for bit, and the argument checks every ``mul_mat`` emulation shares — split from
:mod:`kernels.ggml.mulmat` (the dispatch, which documents the formulas) so that the modules of the other weight
families (:mod:`kernels.ggml.mulmat_q`, :mod:`kernels.ggml.repack`) can use them without an import circle.

Work order (never a bit of the result): the weight row outer — a row's bytes (2 KiB at K = 2048) stay in L1 while
every activation row of the product reads them —, blocks of :data:`ROWS` weight rows (per expert of a
``mul_mat_id``) split between threads from :data:`SERIAL_BELOW` multiply-adds; each element is
computed by one thread, in ggml's order. Q8_0 elements go in tiles of 4 (four activation rows against one
weight row, or four weight rows against one activation row: :mod:`kernels.ggml.mulmat_q8_ir`), whose
independent FMA chains run side by side.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import prange

from kernels.base.block import QT
from kernels.base.blocks import row_bytes
from kernels.base.floats import E8M0_HALF
from kernels.base.flags import JIT_ENABLED, jit, read_only
from kernels.ggml.actquant import _q8_0_rows, _quantize_rows_q8_0
from kernels.ggml.simd import fma32, hsum_fold
from kernels.plain.dequant import MXFP4_VALUES


# --------------------------------------------------------------------------------------------
# Q8_0-activation weights: Q8_0 (vec_dot and tinyBLAS_Q0_AVX), MXFP4 (vec_dot)


@jit()
def _sign_dot(w, x):
    """One byte product of ``maddubs(sign(w, w), sign(x, w))`` (or ``dpbusd``): ``|w|`` (unsigned) times
    ``x`` negated when ``w < 0`` — negated in int8, so ``-(-128)`` stays -128."""
    wi = np.int64(w)
    xi = np.int64(x)
    if wi >= 0:
        return wi * xi
    sx = xi if xi == -128 else -xi  # _mm256_sign_epi8(x, w): wraps at -128
    return -wi * sx


@jit()
def _q8_0_block_def(acc, w, wo, x, xo, d):
    """One Q8_0 block of ``ggml_vec_dot_q8_0_q8_0``: ``acc[l] = fma(d, float(dot_l), acc[l])`` for the 8 lanes,
    ``dot_l`` the exact integer dot of weight bytes ``w[wo+4l … wo+4l+3]`` (int8) and activation bytes
    ``x[xo+4l …]`` through the sign trick (:func:`_sign_dot`). The definition (and the interpreted path)."""
    for lane in range(8):
        s = 0
        for e in range(4):
            s += _sign_dot(w[wo + 4 * lane + e], x[xo + 4 * lane + e])
        acc[lane] = fma32(d, np.float32(s), acc[lane])


@jit()
def _q8_0_dot(wr, xr, xdr, tab):
    """One element of ``ggml_vec_dot_q8_0_q8_0`` (= ``tinyBLAS_Q0_AVX``), read from the stored row: ``wr`` the
    weight row's bytes as int8 (per block: the fp16 ``d``, then 32 quants), ``xr`` / ``xdr`` one Q8_0
    activation row (int8 quants, float32 values of the fp16 scales), ``tab`` ggml's half → float table
    (``F16_TO_F32``). No copy of the weights: each block's scale is looked up where it is stored. The
    definition (and the interpreted path; compiled: the tests' reference)."""
    acc = np.zeros(8, np.float32)
    for b in range(xdr.shape[0]):
        o = 34 * b
        wd = tab[(int(wr[o]) & 0xFF) | ((int(wr[o + 1]) & 0xFF) << 8)]  # GGML_CPU_FP16_TO_FP32(x.d)
        d = np.float32(wd * xdr[b])  # * GGML_CPU_FP16_TO_FP32(y.d), rounded to float32
        _q8_0_block_def(acc, wr, o + 2, xr, 32 * b, d)  # acc = _mm256_fmadd_ps(d, cvtepi32_ps(dot), acc)
    return hsum_fold(acc, 0, 8)  # hsum_float_8(acc)


def _q8_0_tile_def(w, rows, xq, xd, trows, tab):
    """The elements of weight rows ``rows`` (a tuple of indices into ``w``, the stored rows as int8) and Q8_0
    activation rows ``trows`` (of ``xq`` / ``xd``): ``(out[rows[0], trows[0]], out[rows[0], trows[1]] …)``
    (:func:`_q8_0_dot`). The definition (and the interpreted path)."""
    return tuple([_q8_0_dot(w[r], xq[t], xd[t], tab) for r in rows for t in trows])


if JIT_ENABLED:
    from kernels.ggml.mulmat_q8_ir import LEVEL, make_q8_0_tile

    _q8_0_tile = make_q8_0_tile(LEVEL)  # the IR of _q8_0_tile_def: vpdpbusd (AVX-512 VNNI), maddubs (AVX2) or generic
else:
    _q8_0_tile = _q8_0_tile_def


@jit()
def _mxfp4_dot(wv, we, r, xq, xd, t, fused_tail, acc):
    """``arch/x86/quants.c: ggml_vec_dot_mxfp4_q8_0`` (__AVX2__ branch, both builds), one element (row ``r`` of
    the weights, row ``t`` of the activations; :func:`mxfp4_rows`); ``acc`` (3, 8) float32 scratch."""
    nb = we.shape[1]
    acc[:, :] = np.float32(0.0)
    ib = 0
    while ib + 1 < nb:
        for h in range(2):
            b = ib + h
            d = xd[t, b] * we[r, b]  # FP16_TO_FP32(y.d) * E8M0_TO_FP32_HALF(x.e)
            for lane in range(8):
                s = 0
                for e in range(4):
                    j = 32 * b + 4 * lane + e
                    s += _sign_dot(wv[r, j], xq[t, j])  # mul_add_epi8 + madd_epi16(ones)
                acc[h, lane] = fma32(d, np.float32(s), acc[h, lane])
        ib += 2
    for lane in range(8):
        acc[2, lane] = acc[0, lane] + acc[1, lane]
    sumf = hsum_fold(acc[2], 0, 8)  # hsum_float_8
    for b in range(ib, nb):
        d = xd[t, b] * we[r, b]
        si = 0
        for j in range(32 * b, 32 * b + 32):
            si += np.int64(wv[r, j]) * np.int64(xq[t, j])
        if fused_tail:
            sumf = fma32(d, np.float32(si), sumf)
        else:
            sumf = sumf + d * np.float32(si)
    return sumf


# --------------------------------------------------------------------------------------------
# The work split: weight rows outer (each read once for all its activation rows), blocks of ROWS between threads

ROWS = 32  # weight rows per work item
#: Products of fewer multiply-adds than this run on the calling thread. :data:`kernels.base.flags.SERIAL_BELOW`
#: (2^18) is the break-even of the float64 kernels (~40 µs of work on one core); these integer dots do 2^18 in
#: ~13 µs, about what starting and joining a prange region costs. Measured (Zen 3, 2 threads, 2026-12-06): a 2048 × 256
#: Q8_0 matrix (builtin:kjv's LM head, 2^19) 25 µs serial, 17 threaded; 4096 × 256 (2^20) 49 and 42. So from 2^20: a
#: small model's run never compiles the threaded kernel (~2 s of its first run) to save a few µs a token.
SERIAL_BELOW = 1 << 20
Q8_0_KIND, MXFP4_KIND = 0, 1  # the element formula: a literal argument, so a kernel compiles its own alone


@jit(inline=True)
def _q8_0_item(we, tab, xq, xd, slots, arow, r0, r1, out):
    """Q8_0 weight rows ``r0 … r1-1`` of ``we`` (N, row bytes) against the activation rows ``arow[s]`` of the
    slots ``s`` in ``slots`` into ``out[s, r]``, by tiles of :func:`_q8_0_tile`: four slots per weight row
    (the row read once for all), or with fewer slots four weight rows per slot."""
    n = slots.shape[0]
    if n >= 4:
        for r in range(r0, r1):
            j = 0
            while j + 4 <= n:
                s0, s1, s2, s3 = slots[j], slots[j + 1], slots[j + 2], slots[j + 3]
                out[s0, r], out[s1, r], out[s2, r], out[s3, r] = _q8_0_tile(
                    we, (r,), xq, xd, (arow[s0], arow[s1], arow[s2], arow[s3]), tab)
                j += 4
            for jj in range(j, n):
                out[slots[jj], r] = _q8_0_tile(we, (r,), xq, xd, (arow[slots[jj]],), tab)[0]
        return
    for j in range(n):
        s, t = slots[j], arow[slots[j]]
        r = r0
        while r + 4 <= r1:
            out[s, r], out[s, r + 1], out[s, r + 2], out[s, r + 3] = _q8_0_tile(we, (r, r + 1, r + 2, r + 3), xq, xd,
                                                                                (t,), tab)
            r += 4
        for rr in range(r, r1):
            out[s, rr] = _q8_0_tile(we, (rr,), xq, xd, (t,), tab)[0]


@jit()
def _item(kind, fused_tail, w, ws, tab, xq, xd, order, bounds, experts, arow, out, i, acc):
    """Work item ``i``: rows ``ROWS·c …`` of expert ``experts[g]`` (``i = g·chunks + c``) against the activation
    rows ``arow[order[j]]`` of group ``g``'s slots ``j`` into ``out[order[j], r]``; the weight row outer, so a
    row's bytes stay in L1 while every slot of the group reads them. ``kind``: the formula (:data:`Q8_0_KIND`
    …; ``fused_tail``: MXFP4's, :func:`mxfp4_rows`), ``w`` (E, N, row) int8 (Q8_0: the stored bytes; MXFP4: the
    values), ``ws`` (E, N, K/32) the MXFP4 scales (Q8_0: unused)."""
    N = w.shape[1]
    chunks = -(-N // ROWS)
    g, c = i // chunks, i % chunks
    e = experts[g]
    r0, r1 = ROWS * c, min(ROWS * c + ROWS, N)
    slots = order[bounds[g]:bounds[g + 1]]
    if kind == Q8_0_KIND:
        _q8_0_item(w[e], tab, xq, xd, slots, arow, r0, r1, out)
        return
    for r in range(r0, r1):
        for s in slots:
            out[s, r] = _mxfp4_dot(w[e], ws[e], r, xq, xd, arow[s], fused_tail, acc)


@functools.cache
def _items_for(kind: int, parallel: bool):
    """The kernel that runs every work item (:func:`_item`) of formula ``kind`` (:data:`Q8_0_KIND` …: a constant of
    the kernel, so it compiles its own code alone): split between threads (each output is one thread's, computed in
    one order), or on the calling thread. Python picks between the two (:func:`_run`): a kernel that held both, and
    the entry points that called it, would each have their callees optimized and emitted again by LLVM (~1 s of a
    first run: kernels/base/flags.py, "What a first run pays for")."""
    if parallel:
        @jit(parallel=True, variant=f"k{kind}_parallel")
        def items(fused_tail, w, ws, tab, xq, xd, order, bounds, experts, arow, out):
            for i in prange(experts.shape[0] * -(-w.shape[1] // ROWS)):
                # np.int64: prange's index is unsigned, and _item compiled for it would be a second copy
                _item(kind, fused_tail, w, ws, tab, xq, xd, order, bounds, experts, arow, out, np.int64(i),
                      np.empty((3, 8), np.float32))
    else:
        @jit(variant=f"k{kind}_serial")
        def items(fused_tail, w, ws, tab, xq, xd, order, bounds, experts, arow, out):
            acc = np.empty((3, 8), np.float32)
            for i in range(experts.shape[0] * -(-w.shape[1] // ROWS)):
                _item(kind, fused_tail, w, ws, tab, xq, xd, order, bounds, experts, arow, out, i, acc)
    return items


def _run(kind, fused_tail, w, ws, tab, xq, xd, order, bounds, experts, arow, out):
    """``out[order[j], :]`` for every slot ``j`` of every group (:func:`_item`): on the calling thread below
    :data:`SERIAL_BELOW` multiply-adds, else split between threads — the same bits. ``w`` and ``ws`` go read-only
    (:func:`kernels.base.flags.read_only`), as a mapped file's: a stack made in memory and a mapped one share one
    compiled kernel."""
    parallel = order.shape[0] * w.shape[1] * xq.shape[1] >= SERIAL_BELOW
    _items_for(kind, parallel)(fused_tail, read_only(w), read_only(ws), tab, xq, xd, order, bounds, experts, arow, out)


@jit(inline=True)
def _q8_0_quantize(x):
    """The activations converted to Q8_0 (x86 ``quantize_row_q8_0``, :mod:`kernels.ggml.actquant`): (qs, d) — inside
    a kernel (:mod:`kernels.ggml.columns`); from Python: :func:`kernels.ggml.actquant._q8_0_rows`."""
    xq = np.empty(x.shape, np.int8)
    xd = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    _quantize_rows_q8_0(x, xq, xd, np.empty((x.shape[0], 0), np.float32))
    return xq, xd


def q8_0_mul_mat(w, x, out, tab):
    """``ggml_mul_mat`` of Q8_0 rows ``w`` (N, K/32·34 as int8) and float32 ``x`` (T, K) -> out (T, N): ``x``
    quantized (``from_float``, ``xq`` (T, K) int8 / ``xd`` (T, K/32) float32), then ``ggml_vec_dot_q8_0_q8_0`` for
    every element (:func:`_q8_0_dot`) — as :func:`q8_0_mul_mat_id` of a stack of one expert that every row takes:
    its one group is every row in order, exactly ``ggml_mul_mat``'s elements, and one compiled kernel serves both."""
    q8_0_mul_mat_id(w[None], np.zeros((x.shape[0], 1), np.int32), x[:, None, :], out[:, None, :], tab)  # w: (1, N, row)


def q8_0_mul_mat_id(w, ids, x, out, tab):
    """``ggml_mul_mat_id`` of Q8_0 experts ``w`` (E, N, K/32·34 as int8, each expert's rows contiguous): ``x``
    (T, n_x, K) float32 quantized once (as ggml converts all of src1 into ``wdata`` first), then slot ``s`` of
    token ``t`` dotted with expert ``ids[t, s]``: out (T, n_used, N), the slots grouped by expert
    (:func:`slot_groups`, as ggml groups them; the grouping only orders the work)."""
    T, n_x, K = x.shape
    xq, xd, _ = _q8_0_rows(x.reshape(T * n_x, K), False)  # [T·n_x, K], [T·n_x, K/32]
    order, bounds, experts, arow = slot_groups(ids, n_x)
    ws = np.empty((w.shape[0], w.shape[1], 0), np.float32)  # [E, N, 0]: no MXFP4 scales
    _run(Q8_0_KIND, False, w, ws, tab, xq, xd, order, bounds, experts, arow,
         out.reshape(T * ids.shape[1], out.shape[2]))  # out: [T·n_used, N]


def mxfp4_rows(wv, we, xq, xd, out, fused_tail):
    """``arch/x86/quants.c: ggml_vec_dot_mxfp4_q8_0`` (__AVX2__ branch, both builds) for every element.

    ``wv`` (N, K) int8 the ``kvalues_mxfp4`` values, ``we`` (N, K/32) float32 ``E8M0_TO_FP32_HALF`` scales.
    Blocks go in pairs to two 8-lane accumulators (even blocks ``accum1``, odd ``accum2``); their lane-wise
    sum is reduced by ``hsum_float_8``; an odd last block is added by the scalar tail, which GCC tuned for AMD Zen
    compiles as ``vmulss`` + ``vaddss`` (avx512, avx2-zen) and its other tunings contract to ``vfmadd231ss`` (avx2:
    ``fused_tail``; :mod:`kernels.ggml.tuning`). Run as one matrix's stack of one expert that all ``T`` rows take.
    """
    T = xq.shape[0]
    rows = np.arange(T, dtype=np.int64)  # the one group: every row, in order
    _run(MXFP4_KIND, bool(fused_tail), wv[None], we[None], np.empty(0, np.float32), xq, xd, rows,
         np.array([0, T], np.int64), np.zeros(1, np.int64), rows, out)  # [1, N, K], [1, N, K/32]


def _mxfp4_weights(w_bytes: np.ndarray):
    """MXFP4 rows (N, K/32·17) -> values (N, K) int8 (value j = low nibble of qs[j], j+16 = high), scales."""
    N = w_bytes.shape[0]
    blocks = w_bytes.reshape(N, -1, 17)
    qs = blocks[:, :, 1:]
    vals = np.concatenate([MXFP4_VALUES[qs & 0x0F], MXFP4_VALUES[qs >> 4]], axis=2)  # (N, nb, 32)
    return np.ascontiguousarray(vals.reshape(N, -1)), E8M0_HALF[blocks[:, :, 0]]


# --------------------------------------------------------------------------------------------
# Arguments


_QT_OF = {int(q): q for q in QT}  # an enum call costs ~1 µs a matmul; a dict lookup does not


def _qt(qtype) -> QT:
    """``QT(qtype)`` (an int, or another enum of the same codes: gguf's), by lookup."""
    return qtype if qtype.__class__ is QT else _QT_OF[int(qtype)]


@functools.cache
def _row_bytes(qtype: QT, K: int) -> int:
    return row_bytes(qtype, K)


def _bytes(w_bytes) -> np.ndarray:
    """The weight rows as uint8: one matrix C-contiguous, a stack of experts (E, N, row bytes) with each expert's
    rows contiguous (a view when they are — the gate or up half of a fused gate_up stack: no copy of the stack).
    Read-only, as a mapped file's are: a mapped stack and a streamed (writable) one share one compiled kernel."""
    w_bytes = np.asarray(w_bytes)
    if w_bytes.dtype != np.uint8:
        w_bytes = np.ascontiguousarray(w_bytes).view(np.uint8)
    if not (w_bytes.ndim == 3 and w_bytes.strides[2] == 1 and w_bytes.strides[1] == w_bytes.shape[2]):
        w_bytes = np.ascontiguousarray(w_bytes)
    return read_only(w_bytes)


@jit()
def slot_groups(ids, n_x):
    """``ggml_mul_mat_id``'s grouping of the routed rows by expert, for a kernel that runs them in one call:
    ``ids`` (T, n_used) int32 experts (>= 0) -> (order, bounds, experts, arow): the output slots
    ``j = t·n_used + s`` sorted by expert (token order within one: a counting sort), group ``g``'s slots
    ``order[bounds[g]:bounds[g+1]]`` going through expert ``experts[g]`` (increasing), and ``arow[j]`` the
    activation row ``t·n_x + s % n_x`` of slot ``j`` (all int64)."""
    T, n_used = ids.shape
    n = T * n_used
    top = 0  # the largest expert id (loops, not ids.max() / np.nonzero: each compiles numpy's code, ~0.4 s)
    for j in range(n):
        top = max(top, ids[j // n_used, j % n_used])
    count = np.zeros(top + 1, np.int64)  # (E',): slots per expert
    for j in range(n):
        count[ids[j // n_used, j % n_used]] += 1
    groups = 0
    for e in range(count.shape[0]):
        if count[e] > 0:
            groups += 1
    experts = np.empty(groups, np.int64)  # (groups,): the experts used, increasing
    g = 0
    for e in range(count.shape[0]):
        if count[e] > 0:
            experts[g] = e
            g += 1
    bounds = np.zeros(experts.shape[0] + 1, np.int64)  # (groups + 1,)
    start = np.zeros(count.shape[0], np.int64)  # (E',): each used expert's first position in order
    for g in range(experts.shape[0]):
        start[experts[g]] = bounds[g]
        bounds[g + 1] = bounds[g] + count[experts[g]]
    order = np.empty(n, np.int64)  # (T·n_used,)
    arow = np.empty(n, np.int64)  # (T·n_used,)
    for j in range(n):
        t, s = j // n_used, j % n_used
        e = ids[t, s]
        order[start[e]] = j
        start[e] += 1
        arow[j] = t * n_x + s % n_x
    return order, bounds, experts, arow


def _check(w_bytes, qtype, x):
    x = np.ascontiguousarray(x, np.float32)
    if x.ndim != 2:
        raise ValueError(f"activations must be (T, K), got shape {x.shape}")
    T, K = x.shape
    w_bytes = _bytes(w_bytes)
    if w_bytes.ndim != 2 or w_bytes.shape[1] != _row_bytes(qtype, K):
        raise ValueError(f"weights must be (N, {row_bytes(qtype, K)}) bytes of {QT(qtype).name} rows of {K}, "
                         f"got {w_bytes.shape}")
    return w_bytes, x
