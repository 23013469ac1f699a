"""Row-lane kernels: the plain matmul's exact sums, 16 weight rows at a time in SIMD lanes.

The plain mode of :func:`kernels.matmul` defines every output as ::

    y[t, n] = float32( (((0 + w[n,0]·x[t,0]) + w[n,1]·x[t,1]) + …) + w[n,K-1]·x[t,K-1] )

with float32 weights ``w`` decoded exactly as :mod:`kernels.plain.dequant` does, products formed in
float64 (exact) and the sum taken strictly in increasing k. That chain cannot be vectorized along k
without changing its rounding. It *can* be vectorized across rows: here each SIMD lane holds one
weight row's running sum, so a vector instruction advances 8 or 16 independent chains by one k, each
in exactly the order above. The results are bit-identical to ``matmul._matmul_rows`` — tested for
every type, raw and packed, narrow and wide, every instruction-set level the host runs
(tests/test_kernels_lanes.py).

How one group of ``LANES`` = 16 consecutive rows is computed:

1. **Block kernel** (one LLVM-IR intrinsic per type, :mod:`kernels.lanes.blocks`,
   :mod:`kernels.lanes.blocks_iq`), per block of the rows: the block's bytes in the 16 rows are
   fetched four at a time with a *gather* (one 32-bit load per lane, at the same byte offset in each
   row) or, from :func:`pack`'s layout, a plain vector load; the scales are decoded first (f16 →
   float32 exactly, the K-quants' ``d·sc`` and ``dmin·m``, the codebook types' sub-block scales),
   then each weight is unpacked with shifts, masks and table lookups, converted and scaled in float32
   exactly as the row decoder does (same operations, same order; an explicit fma only where the
   product is exact, so it rounds as the separate operations do), widened to float64 and accumulated
   with ``acc[t] = fma(w, x[t, k], acc[t])``. The fused multiply-add rounds once, after adding the
   *exact* product (two float32 values multiply exactly in float64), so it equals the separate
   multiply and add of the plain path.
2. **Narrow path** (T < ``WIDE_FROM`` = 9): the activation rows four at a time (four accumulators per
   vector of lanes), so a verify batch of 1+3 rows decodes each weight block once.
3. **Wide path** (T ≥ 9: a prompt's batch): ``SPAN`` = 256 columns at a time, each block of the group
   decoded once into a float64 buffer [SPAN, LANES], then every activation row accumulated from it
   (``lanes_ir.fma_cols``, eight rows per pass at AVX-512): the decoding is paid once per batch
   instead of once per four rows, and each sum still runs over k in increasing order.

Instruction-set levels (:mod:`kernels.lanes.ir`): the kernels are generic LLVM IR at 8 lanes per
vector; at AVX2 two x86 instructions are added (``vpshufb`` for 16-entry value tables, ``vpgatherdd``
where LLVM would scalarize a gather) and a single activation row takes 16 lanes per vector, at AVX-512
16 lanes per vector, ``vpermps`` and ``vcvtqq2pd``.
Each level is a compile-time constant of the kernels; all give the same bits.

Why LLVM IR: numba's auto-vectorizer does not vectorize this shape (16 accumulators that live in
registers across a loop, gathered byte loads); written as numba loops it ran slower than the scalar
path. ``llvm.masked.gather`` and ``llvm.fma`` are target-independent (scalarized where the CPU has no
gather); on AVX-512 they become ``vpgather`` and ``vfmadd…pd zmm``.

Scope: every weight type, with K a multiple of the block; ``matmul`` sends the last ``N mod 16``
rows, and everything when ``NUMBA_DISABLE_JIT=1`` (intrinsics cannot run as Python), to
``_matmul_rows``. The emulated mode's lane kernels (``act_quant=True``): :mod:`kernels.lanes.act`.

Files: :mod:`kernels.lanes.ir` (constants, ISA levels, the IR vocabulary, the intrinsic factories) →
:mod:`kernels.lanes.blocks_iq`, :mod:`kernels.lanes.blocks` (one emitter per type, and the
intrinsics) → this module (the drivers over groups of rows, the packed layout :func:`pack`, the
entry points ``matmul`` calls) → :mod:`kernels.lanes.act` (act_quant).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.plain.dequant import MXFP4_VALUES
from kernels.base.flags import JIT_ENABLED, SERIAL_BELOW, jit, per_type
from kernels.base.floats import F16_TABLE
from .blocks import _block, _decode, _decode_packed, _packed
from .ir import (_Q6_K, BLOCK, CODE_SLOTS, ISA, ISA_AVX512, ISA_NAMES, LANE_TYPES, LANES, MAX_T, SLOTS, SPAN, TYPE_SIZE,
                       WIDE_FROM, fma_cols)

# --------------------------------------------------------------------------------------------
# The drivers: prange over groups of LANES rows; activation rows MAX_T at a time, or (T ≥ WIDE_FROM,
# the wide path) every block decoded once into a float64 buffer and accumulated for all T rows. Each helper is
# inlined where it is called (``jit(inline=True)``: compiled once, in its kernel; kernels/base/flags.py)


@jit(inline=True)
def _group(kind, isa, w, row0, n_blocks, acc, x, nt):
    """acc[:nt] = the sums of rows row0 … row0+LANES−1 for activation rows x[:nt] (nt ≤ MAX_T).
    (One call per literal nt: the intrinsics are specialized on it, and on the literals ``kind``, ``isa``.)"""
    acc[:] = 0.0
    for blk in range(n_blocks):
        if nt == 1:
            _block(kind, isa, acc, w, row0, blk, x, 1)
        elif nt == 2:
            _block(kind, isa, acc, w, row0, blk, x, 2)
        else:  # 4 (3 rows come padded to 4: matmul_lanes)
            _block(kind, isa, acc, w, row0, blk, x, 4)


@jit(inline=True)
def _group_packed(kind, isa, p, grp, acc, x, nt):
    """``_group`` over the packed words of group ``grp`` (p: uint32 [groups, blocks, slots, LANES])."""
    acc[:] = 0.0
    for blk in range(p.shape[1]):
        if nt == 1:
            _packed(kind, isa, acc, p, grp, blk, x, 1)
        elif nt == 2:
            _packed(kind, isa, acc, p, grp, blk, x, 2)
        else:  # 4 (3 rows come padded to 4: matmul_lanes)
            _packed(kind, isa, acc, p, grp, blk, x, 4)


@jit(inline=True)
def _narrow_group(kind, isa, w, g, x64, out, block, acc):
    """out[t, n] for the LANES rows of group g and every activation row t, MAX_T rows per pass
    (acc: scratch [MAX_T, LANES])."""
    T, K = x64.shape
    for t0 in range(0, T, MAX_T):
        nt = min(MAX_T, T - t0)
        _group(kind, isa, w, g * LANES, K // block, acc, x64[t0 : t0 + nt], nt)
        for t in range(nt):
            for i in range(LANES):
                out[t0 + t, g * LANES + i] = acc[t, i]


@jit(inline=True)
def _narrow_group_packed(kind, isa, p, g, x64, out, acc):
    """``_narrow_group`` over packed words."""
    T = x64.shape[0]
    for t0 in range(0, T, MAX_T):
        nt = min(MAX_T, T - t0)
        _group_packed(kind, isa, p, g, acc, x64[t0 : t0 + nt], nt)
        for t in range(nt):
            for i in range(LANES):
                out[t0 + t, g * LANES + i] = acc[t, i]


@jit(inline=True)
def _accumulate(isa, acc, buf, x64, c0, n):
    """acc[t] += the decoded columns buf[:n] times x64[t, c0 : c0 + n], for every t: eight rows per pass
    at AVX-512 (16 accumulator registers of 32), then (and below AVX-512) MAX_T at a time."""
    T = x64.shape[0]
    t8 = 0
    if isa == ISA_AVX512:
        for t8 in range(0, T - 7, 8):
            fma_cols(isa, acc, buf, x64, t8, 8, c0, n)
        t8 = T - T % 8
    for t0 in range(t8, T, MAX_T):
        nt = min(MAX_T, T - t0)
        if nt == 1:
            fma_cols(isa, acc, buf, x64, t0, 1, c0, n)
        elif nt == 2:
            fma_cols(isa, acc, buf, x64, t0, 2, c0, n)
        elif nt == 3:
            fma_cols(isa, acc, buf, x64, t0, 3, c0, n)
        else:
            fma_cols(isa, acc, buf, x64, t0, 4, c0, n)


@jit(inline=True)
def _store(acc, out, g):
    """out[t, g·LANES + i] = acc[t, i] (rounded to float32) for every t."""
    for t in range(acc.shape[0]):
        for i in range(LANES):
            out[t, g * LANES + i] = acc[t, i]


@jit(inline=True)
def _wide_group(kind, isa, w, g, x64, out, block, acc, buf):
    """``_narrow_group`` for T ≥ WIDE_FROM: SPAN columns at a time, each block of the group decoded once into
    ``buf`` (float64 [SPAN, LANES]) and accumulated for all T rows (acc: scratch [T, LANES]). Each sum
    still runs over k in increasing order: the same bits."""
    K = x64.shape[1]
    acc[:] = 0.0
    for c0 in range(0, K, SPAN):
        n = min(SPAN, K - c0)
        for b in range(n // block):
            _decode(kind, isa, buf, w, g * LANES, c0 // block + b, b * block)
        _accumulate(isa, acc, buf, x64, c0, n)
    _store(acc, out, g)


@jit(inline=True)
def _wide_group_packed(kind, isa, p, g, x64, out, block, acc, buf):
    """``_wide_group`` over packed words."""
    K = x64.shape[1]
    acc[:] = 0.0
    for c0 in range(0, K, SPAN):
        n = min(SPAN, K - c0)
        for b in range(n // block):
            _decode_packed(kind, isa, buf, p, g, c0 // block + b, b * block)
        _accumulate(isa, acc, buf, x64, c0, n)
    _store(acc, out, g)


# The parallel kernels' prange bodies: the group functions above compiled on their own. A serial kernel has the
# helpers inlined (one function for LLVM: half the first compile of a lane kernel); a prange body holding all that
# code would make numba's parfor passes analyse it (twice the compile), so the parallel kernels call it compiled.


@jit()
def _narrow_group_task(kind, isa, w, g, x64, out, block, acc):
    _narrow_group(kind, isa, w, g, x64, out, block, acc)


@jit()
def _narrow_group_packed_task(kind, isa, p, g, x64, out, acc):
    _narrow_group_packed(kind, isa, p, g, x64, out, acc)


@jit()
def _wide_group_task(kind, isa, w, g, x64, out, block, acc, buf):
    _wide_group(kind, isa, w, g, x64, out, block, acc, buf)


@jit()
def _group_packed_task(kind, isa, p, grp, acc, x, nt):
    _group_packed(kind, isa, p, grp, acc, x, nt)


@jit()
def _wide_group_packed_task(kind, isa, p, g, x64, out, block, acc, buf):
    _wide_group_packed(kind, isa, p, g, x64, out, block, acc, buf)


def _variant(isa: int, wide: bool, experts: bool = False) -> str:
    """The kernel-name suffix: ``wide`` for the wide path, ``experts`` for several experts' matrices at once,
    the level's name when it is not the default."""
    return "_".join(([] if isa == ISA else [ISA_NAMES[isa]]) + (["wide"] if wide else []) + (["experts"] if experts else []))


# The top-level kernels ``kernel(w, x64, out, block)``: out[t, n] for the rows of every whole group.
# The narrow (T < WIDE_FROM) and wide (T ≥ WIDE_FROM) paths are separate kernels (a model compiles the wide
# ones at its first prompt; one function holding both ran the narrow path ~20 % slower).


@per_type
def _matmul_lanes(kind, isa=ISA, wide=False):
    if wide:
        @jit(parallel=True, kind=kind, variant=_variant(isa, wide))
        def _matmul_lanes(w, x64, out, block):
            """out[t, n] for the first ``LANES·(N // LANES)`` rows of ``w``, T ≥ WIDE_FROM."""
            for g in prange(w.shape[0] // LANES):
                _wide_group_task(kind, isa, w, np.int64(g), x64, out, block, np.empty((x64.shape[0], LANES), dtype=np.float64),
                                 np.empty((SPAN, LANES), dtype=np.float64))
    else:
        @jit(parallel=True, kind=kind, variant=_variant(isa, wide))
        def _matmul_lanes(w, x64, out, block):
            """out[t, n] for the first ``LANES·(N // LANES)`` rows of ``w`` (the plain path's numbers)."""
            for g in prange(w.shape[0] // LANES):
                _narrow_group_task(kind, isa, w, np.int64(g), x64, out, block, np.empty((MAX_T, LANES), dtype=np.float64))

    return _matmul_lanes


@per_type
def _matmul_lanes_serial(kind, isa=ISA, wide=False):
    if wide:
        @jit(kind=kind, variant=_variant(isa, wide))
        def _matmul_lanes_serial(w, x64, out, block):
            """``_matmul_lanes`` on the calling thread (small products: see ``SERIAL_BELOW``), T ≥ WIDE_FROM."""
            acc, buf = np.empty((x64.shape[0], LANES), dtype=np.float64), np.empty((SPAN, LANES), dtype=np.float64)
            for g in range(w.shape[0] // LANES):
                _wide_group(kind, isa, w, g, x64, out, block, acc, buf)
    else:
        @jit(kind=kind, variant=_variant(isa, wide))
        def _matmul_lanes_serial(w, x64, out, block):
            """``_matmul_lanes`` on the calling thread (small products: see ``SERIAL_BELOW``)."""
            acc = np.empty((MAX_T, LANES), dtype=np.float64)
            for g in range(w.shape[0] // LANES):
                _narrow_group(kind, isa, w, g, x64, out, block, acc)

    return _matmul_lanes_serial


@per_type
def _matmul_packed(kind, isa=ISA, wide=False):
    if wide:
        @jit(parallel=True, kind=kind, variant=_variant(isa, wide))
        def _matmul_packed(p, x64, out, block):
            """``_matmul_lanes`` over packed words, T ≥ WIDE_FROM."""
            for g in prange(p.shape[0]):
                _wide_group_packed_task(kind, isa, p, np.int64(g), x64, out, block,
                                        np.empty((x64.shape[0], LANES), dtype=np.float64), np.empty((SPAN, LANES), dtype=np.float64))
    else:
        @jit(parallel=True, kind=kind, variant=_variant(isa, wide))
        def _matmul_packed(p, x64, out, block):
            """``_matmul_lanes`` over packed words: out[t, n] for the first ``LANES·groups`` rows."""
            for g in prange(p.shape[0]):
                _narrow_group_packed_task(kind, isa, p, np.int64(g), x64, out, np.empty((MAX_T, LANES), dtype=np.float64))

    return _matmul_packed


@per_type
def _matmul_packed_serial(kind, isa=ISA, wide=False):
    if wide:
        @jit(kind=kind, variant=_variant(isa, wide))
        def _matmul_packed_serial(p, x64, out, block):
            """``_matmul_packed`` on the calling thread (small products: see ``SERIAL_BELOW``), T ≥ WIDE_FROM."""
            acc, buf = np.empty((x64.shape[0], LANES), dtype=np.float64), np.empty((SPAN, LANES), dtype=np.float64)
            for g in range(p.shape[0]):
                _wide_group_packed(kind, isa, p, g, x64, out, block, acc, buf)
    else:
        @jit(kind=kind, variant=_variant(isa, wide))
        def _matmul_packed_serial(p, x64, out, block):
            """``_matmul_packed`` on the calling thread (small products: see ``SERIAL_BELOW``)."""
            acc = np.empty((MAX_T, LANES), dtype=np.float64)
            for g in range(p.shape[0]):
                _narrow_group_packed(kind, isa, p, g, x64, out, acc)

    return _matmul_packed_serial


@per_type
def _matmul_packed_experts(kind, isa=ISA):
    @jit(parallel=True, kind=kind, variant=_variant(isa, False, experts=True))
    def _matmul_packed_experts(p, first, x64, out):
        """out[i, j·LANES + l] = row j·LANES + l of the matrix whose groups start at ``first[i]`` in ``p``,
        times x64[i] (one activation row each): ``_narrow_group_packed``'s numbers for every (i, j),
        all the items' groups in one parallel loop (``ggml_mul_mat_id`` for a decoded token)."""
        n_groups = out.shape[1] // LANES
        n_jobs = first.shape[0] * n_groups
        n_chunks = min(n_jobs, 64)
        for c in prange(n_chunks):
            acc = np.empty((MAX_T, LANES), dtype=np.float64)
            for job in range(c * n_jobs // n_chunks, (c + 1) * n_jobs // n_chunks):
                i, j = job // n_groups, job % n_groups
                _group_packed_task(kind, isa, p, first[i] + j, acc, x64[i : i + 1], 1)
                for lane in range(LANES):
                    out[i, j * LANES + lane] = acc[0, lane]

    return _matmul_packed_experts


def matmul_packed_experts(stack: PackedRows, ids: np.ndarray, row0: int, x64: np.ndarray, out: np.ndarray,
                          isa: int = ISA) -> bool:
    """out[i] (float32 [n_rows]) = rows row0 … row0 + n_rows − 1 of expert ``ids[i]`` of the packed stack
    (X, N, row bytes) times x64[i], for every i, in one kernel call — the numbers of ``matmul_packed`` on
    each expert's matrix (the same group kernel per output). False (nothing written) when the rows are not
    whole groups of the stack, so the caller multiplies expert by expert."""
    n_rows = out.shape[1]
    per = stack.raw.shape[1] // LANES  # groups per expert
    if stack.raw.ndim != 3 or row0 % LANES or n_rows % LANES or row0 + n_rows > stack.raw.shape[1] or x64.shape[0] != len(ids):
        return False
    first = np.asarray(ids, dtype=np.int64) * per + row0 // LANES
    _matmul_packed_experts(stack.qtype, isa)(stack.words, first, x64, out)
    return True


@jit(parallel=True)
def _pack_words(w, type_size, slots, out):
    """out[g, blk, s, i] = the little-endian uint32 at byte blk·type_size + slots[s] of row g·LANES + i."""
    for g in prange(out.shape[0]):
        for i in range(LANES):  # each row read front to back; the group's words (≤ ~30 KB) stay in cache
            row = w[g * LANES + i]
            for blk in range(out.shape[1]):
                for s in range(slots.size):
                    o = blk * type_size + slots[s]
                    out[g, blk, s, i] = (np.uint32(row[o]) | (np.uint32(row[o + 1]) << np.uint32(8))
                                         | (np.uint32(row[o + 2]) << np.uint32(16)) | (np.uint32(row[o + 3]) << np.uint32(24)))


@jit()
def _put_codes(codes, out, g, blk):
    """codes int8 [k, LANES] into the first slots of out[g, blk], column-major: byte k·LANES + i is row
    i's code k (word wi = bytes 4·wi … 4·wi + 3, little-endian)."""
    u = codes.reshape(-1).view(np.uint8)
    for wi in range(u.size // 4):
        out[g, blk, wi // LANES, wi % LANES] = (np.uint32(u[4 * wi]) | (np.uint32(u[4 * wi + 1]) << np.uint32(8))
                                                | (np.uint32(u[4 * wi + 2]) << np.uint32(16)) | (np.uint32(u[4 * wi + 3]) << np.uint32(24)))


@jit(parallel=True)
def _pack_q8_0(w, out):
    """out[g, blk] for rows g·LANES … g·LANES + LANES − 1: their 32 codes column-major
    (``_put_codes``, slots 0–7), then per row d (``F16_TABLE``) as float32 bits (slot 8)."""
    for g in prange(out.shape[0]):
        codes = np.empty((32, LANES), dtype=np.int8)  # [k, row]
        d = np.empty(1, dtype=np.float32)
        for blk in range(out.shape[1]):
            o = 34 * blk
            for i in range(LANES):
                src = w[g * LANES + i]
                for k in range(32):
                    codes[k, i] = np.int8(src[o + 2 + k])
                d[0] = F16_TABLE[int(src[o]) | (int(src[o + 1]) << 8)]
                out[g, blk, 8, i] = d.view(np.uint32)[0]
            _put_codes(codes, out, g, blk)


@jit(parallel=True)
def _pack_q6_k(w, out):
    """out[g, blk] for rows g·LANES … g·LANES + LANES − 1: their 256 codes q − 32 as int8 (q as
    ``_deq_q6_k`` assembles it) column-major (``_put_codes``, slots 0–63), then per row the 16 int8
    scales (slots 64–67) and d (``F16_TABLE``) as float32 bits (68)."""
    for g in prange(out.shape[0]):
        codes = np.empty((256, LANES), dtype=np.int8)  # [k, row]
        d = np.empty(1, dtype=np.float32)
        for blk in range(out.shape[1]):
            o = 210 * blk
            for i in range(LANES):
                src = w[g * LANES + i]
                for n in range(2):
                    for l in range(32):
                        ql0 = int(src[o + 64 * n + l])
                        ql1 = int(src[o + 64 * n + l + 32])
                        qh = int(src[o + 128 + 32 * n + l])
                        codes[128 * n + l, i] = ((ql0 & 15) | ((qh & 3) << 4)) - 32
                        codes[128 * n + l + 32, i] = ((ql1 & 15) | (((qh >> 2) & 3) << 4)) - 32
                        codes[128 * n + l + 64, i] = ((ql0 >> 4) | (((qh >> 4) & 3) << 4)) - 32
                        codes[128 * n + l + 96, i] = ((ql1 >> 4) | (((qh >> 6) & 3) << 4)) - 32
                for j in range(4):
                    b0 = o + 192 + 4 * j
                    out[g, blk, 64 + j, i] = (np.uint32(src[b0]) | (np.uint32(src[b0 + 1]) << np.uint32(8))
                                              | (np.uint32(src[b0 + 2]) << np.uint32(16)) | (np.uint32(src[b0 + 3]) << np.uint32(24)))
                d[0] = F16_TABLE[int(src[o + 208]) | (int(src[o + 209]) << 8)]
                out[g, blk, 68, i] = d.view(np.uint32)[0]
            _put_codes(codes, out, g, blk)


class PackedRows:
    """A weight matrix laid out for the lane kernels, next to its original rows (see :func:`pack`).

    Behaves like the original array (N, row bytes) — or (X, N, row bytes) for a stack of experts —
    for ``shape``, ``ndim``, ``dtype``, ``nbytes`` and indexing, so code that looks rows up keeps
    working: ``packed[e]`` of a stack is expert e's PackedRows; ``packed[a:b]`` with ``a`` a multiple
    of LANES is the PackedRows of those rows; any other index gives the original bytes, as the raw
    array would. ``kernels.matmul`` recognises a 2-D PackedRows and multiplies with its words."""

    def __init__(self, raw: np.ndarray, qtype, words: np.ndarray):
        self.raw, self.qtype, self.words = raw, qtype, words  # words: uint32 [groups, blocks, slots, LANES]

    shape = property(lambda self: self.raw.shape)
    ndim = property(lambda self: self.raw.ndim)
    dtype = property(lambda self: self.raw.dtype)
    nbytes = property(lambda self: self.raw.nbytes)

    def __getitem__(self, idx):
        if self.raw.ndim == 3 and isinstance(idx, (int, np.integer)):
            per = self.raw.shape[1] // LANES  # groups per expert (a stack is packed only when whole)
            e = range(self.raw.shape[0])[idx]
            return PackedRows(self.raw[e], self.qtype, self.words[e * per : (e + 1) * per])
        if self.raw.ndim == 2 and isinstance(idx, slice) and idx.step in (None, 1):
            start, stop, _ = idx.indices(self.raw.shape[0])
            if start % LANES == 0 and stop >= start:
                return PackedRows(self.raw[start:stop], self.qtype, self.words[start // LANES : stop // LANES])
        return self.raw[idx]

    def __len__(self):
        return len(self.raw)

    def __repr__(self):
        return f"PackedRows({self.qtype.name}, {self.raw.shape[0]} rows, {self.words.nbytes >> 20} MiB packed)"


def pack(w_raw: np.ndarray, qtype):
    """``w_raw`` (N rows of ``qtype`` bytes, or a stack (X, N, row bytes) of expert matrices with N a
    multiple of LANES) as :class:`PackedRows` when N ≥ LANES and K is a whole number of the lane
    kernels' blocks; otherwise ``w_raw`` itself. Either result can be passed to ``kernels.matmul``
    in place of ``w_raw``, with identical results; the packed one skips the gathers (faster when a
    matrix is multiplied many times, e.g. every decoded token) at the cost of a copy of its bytes.

    Layout: for each group of LANES rows and each block, the 32-bit words the kernel reads
    (``SLOTS``: byte offsets within the block) of the LANES rows side by side —
    uint32 [N // LANES, blocks, slots, LANES]; for Q8_0 and Q6_K their int8 codes column by column
    instead (``_pack_q8_0``, ``_pack_q6_k``; ``lanes_ir.CODE_SLOTS``: Q8_0 36 bytes per 32 values
    instead of 34, Q6_K 276 per 256 instead of 210). Rows after the last whole group stay in ``raw``
    only.
    """
    if isinstance(w_raw, PackedRows):
        return w_raw
    from kernels.plain.dequant import as_row_bytes

    ndim = np.asarray(w_raw).ndim
    if not supported(qtype) or ndim not in (2, 3) or not JIT_ENABLED:
        return w_raw
    if ndim == 3 and w_raw.shape[1] % LANES:  # a stack of experts: only whole groups per expert
        return w_raw
    kind = int(qtype)
    w_bytes, K = as_row_bytes(np.asarray(w_raw).reshape(-1, w_raw.shape[-1]), qtype, what="pack: w_raw")
    groups = w_bytes.shape[0] // LANES
    if groups == 0 or K % BLOCK[kind]:
        return w_raw
    n_blocks = w_bytes.shape[1] // TYPE_SIZE[kind]
    if kind in CODE_SLOTS:  # int8 codes, column-major (lanes_ir.CODE_SLOTS)
        words = np.empty((groups, n_blocks, CODE_SLOTS[kind], LANES), dtype=np.uint32)
        (_pack_q6_k if kind == _Q6_K else _pack_q8_0)(w_bytes, words)
    else:
        slots = np.array(SLOTS[kind], dtype=np.int64)
        words = np.empty((groups, n_blocks, slots.size, LANES), dtype=np.uint32)
        _pack_words(w_bytes, TYPE_SIZE[kind], slots, words)
    return PackedRows(w_raw, qtype, words)


def _padded(run, x64: np.ndarray, out: np.ndarray) -> None:
    """``run(x64, out)``; a narrow pass of 3 rows (T = 3 or 7) is run as 4, the fourth row zero, so the
    kernels carry block code for 1, 2 and 4 rows only (a quarter less to compile; the extra row's
    products cost a little time, never a bit of the other rows')."""
    T = x64.shape[0]
    if T >= WIDE_FROM or T % MAX_T != 3:
        run(x64, out)
        return
    x4 = np.zeros((T + 1, x64.shape[1]), dtype=np.float64)
    x4[:T] = x64
    out4 = np.zeros((T + 1, out.shape[1]), dtype=out.dtype)
    run(x4, out4)
    out[:] = out4[:T]


def matmul_packed(p: PackedRows, x64: np.ndarray, out: np.ndarray, isa: int = ISA) -> int:
    """``matmul_lanes`` for a packed matrix: fill ``out[:, :n]``, n = LANES·groups; return n."""
    n = p.words.shape[0] * LANES
    kernel = _matmul_packed_serial if n * x64.shape[0] * x64.shape[1] < SERIAL_BELOW else _matmul_packed
    _padded(lambda x, o: kernel(p.qtype, isa, x.shape[0] >= WIDE_FROM)(p.words, x, o, BLOCK[int(p.qtype)]), x64, out)
    return n


def supported(qtype) -> bool:
    """True when ``matmul`` runs this weight type through the lane kernels."""
    return int(qtype) in TYPE_SIZE


def matmul_lanes(w_bytes: np.ndarray, qtype, x64: np.ndarray, out: np.ndarray, isa: int = ISA) -> int:
    """Fill ``out[:, :n]`` for the first n = LANES·(N // LANES) rows; return n (the caller does the rest).
    ``isa``: the instruction-set level to build the kernel for (default ``lanes_ir.ISA``; tests compare levels)."""
    kind = int(qtype)
    n = w_bytes.shape[0] // LANES * LANES
    if x64.shape[1] % BLOCK[kind]:  # F32/F16/BF16 rows whose length is not a multiple of 16
        return 0
    if w_bytes.strides[0] * LANES >= 1 << 31:  # the gathers address a group's rows with int32 offsets
        return 0
    if n:
        kernel = _matmul_lanes_serial if n * x64.shape[0] * x64.shape[1] < SERIAL_BELOW else _matmul_lanes
        _padded(lambda x, o: kernel(kind, isa, x.shape[0] >= WIDE_FROM)(w_bytes, x, o, BLOCK[kind]), x64, out)
    return n


__all__ = ["LANES", "MAX_T", "LANE_TYPES", "PackedRows", "pack", "supported", "matmul_lanes", "matmul_packed",
           "matmul_packed_experts", "MXFP4_VALUES"]
