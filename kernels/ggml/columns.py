"""The column layout of ``--emulate=ggml``: a weight matrix re-laid out once, at load, with the output rows
innermost, so that the exact integer dots of many output elements run as one vector operation — the same bits
as the kernels that read the stored rows (:mod:`kernels.ggml.mulmat_q8`, :mod:`kernels.ggml.repack`,
:mod:`kernels.ggml.repack_k`), faster on a decode step, whose one activation row meets every weight once.

llama.cpp re-lays out these weights at load too (its CPU_REPACK buffer interleaves 8 rows' blocks: ``repack.cpp``);
which register lane holds what is not part of the numerics. What is: per output element, each block's exact
integer dot and the float operations on it, in ggml's order, which the kernels here keep element by element:

* **Q4_0, IQ4_NL, MXFP4 repacked** (``gemv/gemm_q4_b32_8x8_q8_0_lut_avx``, :mod:`kernels.ggml.repack`): one
  accumulator, ``acc = fma(float(dot_b), float32(d_w · d_x), acc)``; the gemv rows (``t >= exact_rows``) with the
  same -128 sign trick, the gemm rows exact. The nibbles are stored decoded through the kernel's LUT (values in
  pairs, every path), or on AVX-512 VNNI as the 4-bit codes themselves, half the bytes
  (:mod:`kernels.ggml.columns_b32`: ``vpshufb`` decodes them in the vector step).
* **Q4_K repacked** (``gemv/gemm_q4_K_8x8_q8_K``, :mod:`kernels.ggml.repack_k`; here
  :mod:`kernels.ggml.columns_q4k`): the 32-value sub-block dots
  times the 6-bit scales and the mins times the Q8_K sums, summed in integers, then ``acc = fma(float(ΣI),
  float32(d · y.d), acc)`` and ``accm = fma(float(ΣM), float32(dmin · y.d), accm)`` per super-block (gemv) or
  per 64 values (gemm rows), ``out = acc - accm``. The nibbles are stored as int8 values, the scales and mins
  decoded.
* **Q4_K, Q5_K, Q6_K in a plain buffer** (``vec_dot`` per element, or the tiled kernel from 8 rows:
  :mod:`kernels.ggml.mulmat_k`): :mod:`kernels.ggml.columns_k`. A Q4_K layout serves both its formulas: which one
  a product takes is whether llama.cpp repacked the tensor (:func:`kind_for`).

A :class:`Columns` holds, for ``E`` matrices of ``N`` rows of ``K`` values (``E`` = 1 for a dense weight, the
experts of a stacked tensor), the values ``q`` (E, K/2, 2N) int8 — value ``k`` of output ``c`` at ``[k // 2, 2c +
k % 2]``, two neighbouring values side by side (:func:`kernels.ggml.simd.cols_dot16`); the K-quants' codes (E, K/4,
4N) in quads, 4 neighbouring values side by side, each tile's sub-tiles of 16 outputs one after the other
(:mod:`kernels.ggml.columns_ir`) —, the per-block floats (E,
K/32 or K/256, N) float32 (the K-quants' scales and mins (E, K/32 or K/16, N) uint8: Q6_K's int8 scales as their
bytes), and the column range ``[c0, c1)`` a product
reads (a fused gate_up tensor's gate or up rows), stored tile by tile (:data:`TILE` outputs in one piece, so a
tile's weights are read in one stream). Q6_K's codes can be stored in 6 bits instead of a byte each (``sixbit``:
:func:`kernels.ggml.columns_k.pack6`, decoded in the vector step where :func:`sixbit_fast`). Bytes: ~1.1–1.2 × the
stored matrix (Q4_K, and the 32-value types as codes), ~1.0 × (Q6_K in 6 bits), ~1.3–1.6 × (Q5_K, Q6_K's bytes),
~2.1 × (the 32-value types as values).

* **Q8_0 in a plain buffer** (``vec_dot``, the same formula as ``tinyBLAS_Q0_AVX``): :mod:`kernels.ggml.columns_q8`,
  its values in quads (``quads``: the K-quants' byte layout), 8 float lanes per output and ``hsum_float_8``. Its
  values in pairs (as above) serve the AArch64 1-row ``vec_dot`` (:mod:`kernels.ggml.columns_arm`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numba
from numba import literally, prange

from kernels.base.block import QT
from kernels.base.flags import SERIAL_BELOW, jit, per_type, read_only
from kernels.ggml.columns_ir import LEVEL, TILE, tile_span
from kernels.ggml.columns_k import KQ_KIND, lay_k, sixbit_into, tile_k, unpack6
from kernels.ggml.mulmat_k import TILED_MIN_ROWS, pair_sums, q8_k_inputs
from kernels.ggml.mulmat_q8 import _q8_0_quantize, slot_groups
from kernels.ggml.repack import _blocks_m128
from kernels.ggml.repack_k import q8_k_mat_inputs
from kernels.ggml.columns_b32 import TYPES as B32_NIBBLE_TYPES, tile_b32
from kernels.ggml.columns_q4k import tiles_q4k
from kernels.ggml.columns_q8 import lay_q8_0, tile_q8_0
from kernels.ggml.simd import cols_dot16, fma32
from kernels.ggml.vecmath import F16_TO_F32

F32 = np.float32
REPACKED_KIND = {QT.Q4_0: 1, QT.IQ4_NL: 1, QT.MXFP4: 1, QT.Q4_K: 2}  # the repacked kernels' formulas (above)
#: kind 1's formula from the 4-bit codes (kernels.ggml.columns_b32), one kind per type (its LUT): 6 + its index there
NIBBLE_KIND = {t: 6 + i for i, t in enumerate(B32_NIBBLE_TYPES)}
NIBBLE_LAST = 5 + len(B32_NIBBLE_TYPES)  # the last of them
Q8_0_KIND = 10  # Q8_0's vec_dot on its quads (kernels.ggml.columns_q8)
#: Q8_0's column kernel takes a product while each weight meets fewer activation rows than this (a decoded token, a
#: verify's routed experts); from it the stored rows' kernel, whose tiles share a weight block between 4 activation
#: rows (an 8192 × 2048 matrix out of the cache, 1 thread, Zen 4, 2026-12-07: 1 / 2 / 3 / 4 rows 1.46 / 1.83 / 2.25 /
#: 1.71 ms on the rows, 0.83 / 1.19 / 1.50 / 1.79 on the columns). The same bits either way.
Q8_0_COLS_BELOW = 4
#: vec_dot / tiled of a plain buffer: the K-quants (columns_k), Q8_0 (columns_q8)
PLAIN_KIND = {**{QT[name]: k for name, k in KQ_KIND.items()}, QT.Q8_0: Q8_0_KIND}
KIND = {**PLAIN_KIND, **REPACKED_KIND}  # the types with an x86 kernel on the column layout
SIXBIT_KIND = 9  # Q6_K's formula (kind 5) on its codes in 6 bits (:func:`pack6`)
K_KINDS = (3, 4, 5, SIXBIT_KIND)  # a plain buffer's K-quants: vec_dot, or the tiled kernel from TILED_MIN_ROWS rows
#: each formula's name, the suffix of its kernels (``cols_mul_mat_q6_k``: the compile report, the cache's files)
KIND_NAME = {1: "b32", 2: "q4_k_repacked", **{k: t.name.lower() for t, k in PLAIN_KIND.items()},
             **{k: f"{t.name.lower()}_codes" for t, k in NIBBLE_KIND.items()}, SIXBIT_KIND: "q6_k_sixbit"}
#: the types with a column layout: :data:`KIND`'s (Q8_0's values in pairs: the AArch64 1-row vec_dot's lanes,
#: :mod:`kernels.ggml.columns_arm`; in quads: x86's, :mod:`kernels.ggml.columns_q8`)
LAID_OUT = frozenset(KIND)
_BLOCK = {QT.Q8_0: (34, 32), QT.Q4_0: (18, 32), QT.IQ4_NL: (18, 32), QT.MXFP4: (17, 32), QT.Q4_K: (144, 256), QT.Q5_K: (176, 256),
          QT.Q6_K: (210, 256)}  # bytes and values per block


@dataclass(frozen=True)
class Columns:
    """A weight (or a stack of expert weights) in the column layout (module docstring)."""

    qtype: QT
    q: np.ndarray  # (E, N/TILE, K/2, 2·TILE) int8: the values, neighbouring pairs side by side
    #                (the K-quants: (E, N/TILE, K, 64), quads by sub-tile of 16 outputs; ``nibbles``: (E, N/TILE,
    #                K/2, 64) the 4-bit codes, kernels.ggml.columns_b32)
    d: np.ndarray  # (E, N/TILE, K/32 or K/256, TILE) float32: d (Q4_0, IQ4_NL), E8M0_HALF[e] (MXFP4), the K-quants' d
    dmin: np.ndarray  # (E, N/TILE, K/256, TILE) float32: Q4_K's / Q5_K's dmin; (…, 0, TILE) otherwise
    sc: np.ndarray  # (E, N/TILE, K/32, TILE) uint8: 6-bit sub-block scales (Q6_K: K/16 int8 scale bytes); (…, 0, TILE) otherwise
    mn: np.ndarray  # (E, N/TILE, K/32, TILE) uint8: Q4_K's / Q5_K's 6-bit sub-block mins; (…, 0, TILE) otherwise
    n: int  # N: the matrix's rows (the tiles pad them to a multiple of TILE)
    c0: int = 0
    c1: int | None = None  # None: every column
    nibbles: bool = False  # Q4_0 / IQ4_NL / MXFP4: ``q`` (E, N/TILE, K/2, 64) their codes (kernels.ggml.columns_b32)
    sixbit: bool = False  # Q6_K: ``q`` (E, N/TILE, 3K/4, 64) uint8, its codes in 6 bits (:func:`pack6`)
    quads: bool = False  # Q8_0: ``q`` (E, N/TILE, K, 64) its values in quads (kernels.ggml.columns_q8), not in pairs

    @property
    def n_cols(self) -> int:
        return (self.n if self.c1 is None else self.c1) - self.c0

    @property
    def K(self) -> int:
        if self.sixbit:  # 4 codes in 3 bytes
            return self.q.shape[2] * 4 // 3
        return self.q.shape[2] * self.q.shape[3] // TILE * (2 if self.qtype == QT.Q4_K or self.nibbles else 1)  # 2 codes a byte

    def columns(self, start: int, stop: int) -> "Columns":
        """Outputs ``start … stop-1`` of this layout (the gate or up rows of a fused gate_up stack)."""
        return replace(self, c0=self.c0 + start, c1=self.c0 + stop)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.q, self.d, self.dmin, self.sc, self.mn))


# --------------------------------------------------------------------------------------------
# The layout, built from the stored rows


@jit()
def _lay_q4_b32(w, hdr, lut, tab, nibbles, q, d):
    """Q4_0 / IQ4_NL / MXFP4 rows (per block: ``hdr`` scale bytes, 16 nibble bytes; value ``j`` the low nibble of byte
    ``j``, value ``j + 16`` its high nibble) -> their tiles of :data:`TILE` outputs: ``d`` (nt, K/32, TILE) the scale
    through ``tab`` (fp16 bits, or the E8M0 byte), column ``c`` at ``[c // TILE, b, c % TILE]``; ``q`` — ``nibbles``:
    (nt, K/2, 64) the 4-bit codes (:mod:`kernels.ggml.columns_b32`), each sub-tile of 16 columns in one piece, per
    block 4 rows whose byte ``4j + e`` of row ``v`` holds column ``j``'s values ``4v + e`` (low nibble) and ``16 + 4v +
    e`` (high): the block's byte ``4v + e`` itself; else (nt, K/2, 2·TILE) the LUT values in pairs (value ``k`` of
    column ``c`` at ``[c // TILE, k // 2, 2(c % TILE) + k % 2]``)."""
    bs = hdr + 16
    R4 = q.shape[1] // 4  # a sub-tile's rows (nibbles)
    for c in range(w.shape[0]):
        wc, qt, dt, cc = w[c], q[c // TILE], d[c // TILE], c % TILE
        r0, j = R4 * (cc // 16), cc % 16  # the column's sub-tile and place in it
        for b in range(dt.shape[0]):
            o = bs * b
            dt[b, cc] = tab[np.int64(wc[o]) | (np.int64(wc[o + 1]) << 8)] if hdr == 2 else tab[np.int64(wc[o])]
            if nibbles:
                for i in range(16):
                    qt[r0 + 4 * b + i // 4, 4 * j + i % 4] = wc[o + hdr + i]
                continue
            for i in range(16):
                v = np.int64(wc[o + hdr + i])
                for h in range(2):  # value 32b + i, then 32b + i + 16
                    k = 32 * b + 16 * h + i
                    qt[k // 2, 2 * cc + k % 2] = lut[(v >> (4 * h)) & 15]


def _in_tiles(a: np.ndarray, nt: int) -> np.ndarray:
    """(N, R, p) -> (nt, R, TILE·p): column ``c``'s ``p`` values of row ``r`` at ``[c // TILE, r, p·(c % TILE) …]``,
    the last tile's columns past N zero."""
    N, R, p = a.shape
    padded = np.zeros((nt * TILE, R, p), a.dtype)
    padded[:N] = a
    return np.ascontiguousarray(padded.reshape(nt, TILE, R, p).transpose(0, 2, 1, 3)).reshape(nt, R, TILE * p)


def layout(w_bytes: np.ndarray, qtype, nibbles: bool = False, sixbit: bool = False, quads: bool = False) -> Columns:
    """The column layout of ``w_bytes``: (N, row bytes) stored rows of one matrix, or (E, N, row bytes) a stack of
    expert matrices, of a type in :data:`KIND`. ``nibbles``: Q4_0, IQ4_NL and MXFP4 as their 4-bit codes (the x86
    kernels of :mod:`kernels.ggml.columns_b32`, half the bytes; ``columns_b32.fast`` says where they are fast),
    not their values in pairs (every path's kernels). ``sixbit``: Q6_K's codes in 6 bits, not a byte each
    (:func:`pack6`; the x86 kernels, where :func:`sixbit_fast` says). ``quads``: Q8_0's values in quads (the x86
    kernel, :mod:`kernels.ggml.columns_q8`), not in pairs (the AArch64 ones)."""
    from kernels.ggml.repack import _TYPES

    qtype = QT(qtype)
    if qtype not in LAID_OUT:
        raise ValueError(f"column layout: {qtype.name} has none (types: {', '.join(t.name for t in LAID_OUT)})")
    w = np.asarray(w_bytes, np.uint8)
    w3 = w[None] if w.ndim == 2 else w  # (E, N, row bytes)
    E, N, rb = w3.shape
    per_block, values = _BLOCK[qtype]
    K = rb // per_block * values
    nibbles = nibbles and qtype in NIBBLE_KIND
    if rb % per_block:
        raise ValueError(f"column layout: rows of {rb} bytes are not whole {qtype.name} blocks")
    nt = -(-N // TILE)  # tiles of TILE outputs, each stored in one piece (the last padded with zeros)
    sixbit = sixbit and qtype == QT.Q6_K
    if values == 256:  # the K-quants: laid out tile by tile in one compiled step (lay_k)
        nsub, nmin = (K // 16, 0) if qtype == QT.Q6_K else (K // 32, K // 32)
        R = K // 2 if qtype == QT.Q4_K else 3 * K // 4 if sixbit else K  # Q4_K: two codes a byte; pack6's rows
        q = np.empty((E, nt, R, 64), np.uint8 if sixbit else np.int8)
        d, dmin = np.empty((E, nt, K // 256, TILE), F32), np.empty((E, nt, K // 256 if nmin else 0, TILE), F32)
        sc, mn = np.empty((E, nt, nsub, TILE), np.uint8), np.empty((E, nt, nmin, TILE), np.uint8)
        w3 = read_only(np.ascontiguousarray(w3))  # as a mapped file's rows: one compiled lay_k whoever calls
        lay_k(PLAIN_KIND[qtype] - 3, w3, q.view(np.uint8), d, dmin, sc, mn, F16_TO_F32, sixbit)
        return Columns(qtype, q, d, dmin, sc, mn, N, sixbit=sixbit)
    if qtype == QT.Q8_0 and quads:  # x86's vec_dot: the values in quads (kernels.ggml.columns_q8)
        q, d = lay_q8_0(w3, nt)
        none, none8 = np.empty((E, nt, 0, TILE), F32), np.empty((E, nt, 0, TILE), np.uint8)
        return Columns(qtype, q, d, none, none8, none8, N, quads=True)
    q = np.zeros((E, nt, K // 2, 64 if nibbles else 2 * TILE), np.uint8 if nibbles else np.int8)  # zeros: padding
    d = np.zeros((E, nt, K // 32, TILE), F32)
    for e in range(E):
        we = read_only(np.ascontiguousarray(w3[e]))  # as a mapped file's rows: one compiled kernel whoever calls
        if qtype == QT.Q8_0:  # value j of a block: byte 2 + j
            blocks = we.reshape(N, K // 32, 34)
            q[e] = _in_tiles(blocks[:, :, 2:].view(np.int8).reshape(N, K // 2, 2), nt)
            fp16 = blocks[:, :, 0].astype(np.int64) | (blocks[:, :, 1].astype(np.int64) << 8)  # (N, K/32)
            d[e] = _in_tiles(F16_TO_F32[fp16][..., None], nt)
        else:
            lut, hdr, tab = _TYPES[qtype]
            _lay_q4_b32(we, hdr, lut.astype(np.int8), tab, nibbles, q[e], d[e])
    none, none8 = np.empty((E, nt, 0, TILE), F32), np.empty((E, nt, 0, TILE), np.uint8)
    return Columns(qtype, q.view(np.int8) if nibbles else q, d, none, none8, none8, N, nibbles=nibbles)


def layout_nbytes(qtype, rows_shape: tuple, nibbles: bool = False, sixbit: bool = False, quads: bool = False) -> int:
    """The bytes :func:`layout` makes of stored rows of ``rows_shape`` ((N, row bytes) or (E, N, row bytes)) of
    ``qtype``, with its flags (as :func:`layout` takes them), without making them: what a load's memory budget
    weighs."""
    qtype = QT(qtype)
    *lead, N, rb = rows_shape
    per_block, values = _BLOCK[qtype]
    K = rb // per_block * values
    E, nt = int(np.prod(lead, dtype=np.int64)), -(-N // TILE)
    if values == 256:  # the K-quants: codes (lay_k's rows of 64 bytes), d and dmin, scales and mins a byte each
        nsub, nmin = (K // 16, 0) if qtype == QT.Q6_K else (K // 32, K // 32)
        R = K // 2 if qtype == QT.Q4_K else 3 * K // 4 if sixbit and qtype == QT.Q6_K else K
        tile = 64 * R + TILE * 4 * (K // 256) * (2 if nmin else 1) + TILE * (nsub + nmin)
    elif qtype == QT.Q8_0 and quads:
        tile = 64 * K + TILE * 4 * (K // 32)
    else:  # the values in pairs (2·TILE bytes a row of K/2), or 4-bit codes (64 bytes a row), and d
        tile = (K // 2) * (64 if nibbles and qtype in NIBBLE_KIND else 2 * TILE) + TILE * 4 * (K // 32)
    return E * nt * tile


# --------------------------------------------------------------------------------------------
# The products, one tile of output columns at a time


@jit()
def _dots(q, k0, c, nc, y, yo, out):
    """``out[j]`` = the integer dot of values ``k0 … k0 + 31`` of column ``c + j`` of ``q`` with ``y[yo …]``, for
    ``j < nc`` (:func:`kernels.ggml.simd.cols_dot16`, 16 columns at a time)."""
    j = 0
    while j + 16 <= nc:
        cols_dot16(out, j, q, k0, c + j, y, yo)
        j += 16
    for jj in range(j, nc):
        s = np.int64(0)
        for l in range(32):
            k = k0 + l
            s += np.int64(q[k // 2, 2 * (c + jj) + k % 2]) * np.int64(y[yo + l])
        out[jj] = s


@jit()
def _wrap128(q, k0, c, nc, y, yo, out):
    """The ``maddubs`` sign trick of a block whose activations hold a -128: against a negative weight ``w`` that
    byte counts ``+128·w``, not the exact ``-128·w`` (:func:`kernels.ggml.mulmat_q8._sign_dot`)."""
    for l in range(32):
        if y[yo + l] == -128:
            k = k0 + l
            for j in range(nc):
                v = np.int64(q[k // 2, 2 * (c + j) + k % 2])
                if v < 0:
                    out[j] += 256 * v


@jit()
def _tile(kind, q, d, dmin, sc, mn, c, nc, y, yd, ys, m128, gemm, rows, orow, out, oc, dots, acc):
    """Columns ``c … c + nc - 1`` of one tile (``q`` (K/2, 2·TILE), or (K/4, 4·TILE) for the K-quants, ``d`` (…,
    TILE) …) against activation rows ``rows`` (``y`` (R, K) int8, ``yd`` (R, K/32 or K/256) float32, ``ys`` (R,
    K/32) the Q8_K sums (Q4_K), ``m128`` (R, K/32) the blocks holding a -128, ``gemm`` (R,) the rows taking the
    gemm (the tiled kernel: kinds 3-5)) into ``out[orow[i], oc + j]``; ``kind`` as :data:`KIND` (3-5:
    :func:`kernels.ggml.columns_k.tile_k`; 9, Q6_K's six-bit codes: what :func:`_run` does not take in its vector
    step; kind 2 is :func:`_run`'s alone); scratch ``dots`` (≥ nc) int32, ``acc`` (≥ nc) float32."""
    literally(kind)  # compiled per kind (_mul_mat_for)
    if kind == Q8_0_KIND:
        tile_q8_0(q, d, c, nc, y, yd, rows, orow, out, oc)
        return
    if kind == SIXBIT_KIND:  # the tiled kernel's rows, or a part of a sub-tile: from the tile's byte codes
        codes = np.empty((q.shape[0] * 4 // 3, q.shape[1]), np.int8)  # (K, 64)
        unpack6(q, codes)
        tile_k(5, codes, d, dmin, sc, mn, c, nc, y, yd, ys, gemm, rows, orow, out, oc)
        return
    if 6 <= kind <= NIBBLE_LAST:
        tile_b32(kind - 6, q, d, c, nc, y, yd, ys, m128, gemm, rows, orow, out, oc)
        return
    if kind >= 3:
        tile_k(kind, q, d, dmin, sc, mn, c, nc, y, yd, ys, gemm, rows, orow, out, oc)
        return
    for i in range(rows.shape[0]):
        r = rows[i]
        yr = y[r]
        o = orow[i]
        acc[:nc] = 0  # Q4_0 / IQ4_NL / MXFP4 repacked: one accumulator
        for b in range(yd.shape[1]):
            _dots(q, 32 * b, c, nc, yr, 32 * b, dots)
            if not gemm[r] and m128[r, b]:  # the gemv's sign trick; the gemm's dot is exact
                _wrap128(q, 32 * b, c, nc, yr, 32 * b, dots)
            for j in range(nc):  # acc = _mm256_fmadd_ps(cvtepi32_ps(iacc), _mm256_mul_ps(col_scale, row_scale), acc)
                acc[j] = fma32(F32(dots[j]), F32(d[b, c + j] * yd[r, b]), acc[j])
        for j in range(nc):
            out[o, oc + j] = acc[j]


@jit()
def _any_of(flags, rows):
    """Whether ``flags[r]`` holds for a row ``r`` of ``rows``."""
    for i in range(rows.shape[0]):
        if flags[rows[i]]:
            return True
    return False


@jit()
def _chunk(kind, q, d, dmin, sc, mn, c0, c1, t, y, yd, ys, m128, gemm, rows, orow, out, dots, acc):
    """The outputs of ``[c0, c1)`` in tile ``t`` (``q[t]`` …) into ``out[orow[i], c - c0]``."""
    literally(kind)  # compiled per kind (_mul_mat_for)
    c, nc = tile_span(c0, c1, t)
    _tile(kind, q[t], d[t], dmin[t], sc[t], mn[t], c - TILE * t, nc, y, yd, ys, m128, gemm, rows, orow, out, c - c0,
          dots, acc)


@jit()
def _run(kind, q, d, dmin, sc, mn, c0, c1, ta, tb, y, yd, ys, m128, gemm, rows, orow, out):
    """Tiles ``ta … tb - 1`` of one matrix (``q[t]`` …), the outputs of ``[c0, c1)`` in them into ``out[orow[i], c -
    c0]``, for the kinds of :data:`RUN_KINDS` in one call: the scratch made once for the run, each tile's step
    inlined (per tile, the calls and their arrays had cost as much as a K = 512 expert's dots). Q4_K repacked:
    :func:`kernels.ggml.columns_q4k.tiles_q4k`; Q6_K's six-bit codes: whole sub-tiles of vec_dot rows by
    :func:`kernels.ggml.columns_k.sixbit_into`, the rest by :func:`_tile`."""
    literally(kind)  # compiled per kind (_mul_mat_for)
    if kind == 2:
        tiles_q4k(q, d, dmin, sc, mn, c0, c1, ta, tb, y, yd, ys, gemm, rows, orow, out)
        return
    acc = np.empty((rows.shape[0], 8, TILE), F32)
    dots, acc1 = _scratch()
    vec = not _any_of(gemm, rows)
    for t in range(ta, tb):
        c, nc = tile_span(c0, c1, t)
        if vec and c % 16 == 0 and nc % 16 == 0:  # c - TILE·t too
            acc[:] = 0
            sixbit_into(acc, q[t], d[t], sc[t], c - TILE * t, nc, y, yd, ys, rows, orow, out, c - c0)
        else:
            _tile(kind, q[t], d[t], dmin[t], sc[t], mn[t], c - TILE * t, nc, y, yd, ys, m128, gemm, rows, orow, out,
                  c - c0, dots, acc1)


#: the kinds :func:`_run` takes a run of tiles of in one call
RUN_KINDS = (2, SIXBIT_KIND)


@jit()
def _scratch():
    return np.empty(TILE, np.int32), np.empty(TILE, F32)


@jit(parallel=True)
def _tiles_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, m128, gemm, rows, orow, threads, out):
    """Every tile of ``[c0, c1)``, split between ``threads`` threads (each output is one work item's, computed in one
    order, whatever ``threads`` is); the kinds of :data:`RUN_KINDS` in runs of tiles, 4 a thread, one call each
    (:func:`_run`)."""
    literally(kind)  # compiled per kind (_mul_mat_for)
    t0 = c0 // TILE
    if kind == 2 or kind == SIXBIT_KIND:  # RUN_KINDS
        nt = (c1 - 1) // TILE - t0 + 1
        runs = min(nt, 4 * threads)
        per = (nt + runs - 1) // runs
        for w in prange(runs):
            ta = t0 + w * per
            _run(kind, q, d, dmin, sc, mn, c0, c1, ta, min(ta + per, t0 + nt), y, yd, ys, m128, gemm, rows, orow, out)
        return
    for i in prange((c1 - 1) // TILE - t0 + 1):
        dots, acc = _scratch()
        _chunk(kind, q, d, dmin, sc, mn, c0, c1, t0 + i, y, yd, ys, m128, gemm, rows, orow, out, dots, acc)


@jit()
def _tiles(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, m128, gemm, rows, orow, out):
    """:func:`_tiles_parallel` on the calling thread."""
    literally(kind)  # compiled per kind (_mul_mat_for)
    if kind == 2 or kind == SIXBIT_KIND:  # RUN_KINDS
        _run(kind, q, d, dmin, sc, mn, c0, c1, c0 // TILE, (c1 - 1) // TILE + 1, y, yd, ys, m128, gemm, rows, orow, out)
        return
    dots, acc = _scratch()
    for t in range(c0 // TILE, (c1 - 1) // TILE + 1):
        _chunk(kind, q, d, dmin, sc, mn, c0, c1, t, y, yd, ys, m128, gemm, rows, orow, out, dots, acc)


@jit()
def _inputs(kind, x, g):
    """The activations ``x`` (T, K) as ggml's kernel for ``kind`` takes them: (y (T, K) int8, yd, ys (T, K/32) the
    Q8_K sums per 32 values (Q4_K), m128 (T, K/32) the Q8_0 blocks holding a -128, gemm (T,)). Q4_0 / IQ4_NL
    / MXFP4: x86 ``quantize_row_q8_0`` (= ``ggml_quantize_mat_q8_0_4x8``, bit for bit); Q4_K: rows ``t < g`` by
    ``ggml_quantize_mat_q8_K_4x8`` (the gemm's), the rest by ``from_float`` = ``quantize_row_q8_K_ref``; kinds 3-5
    (a plain buffer's K-quants): every row by ``quantize_row_q8_K_ref``, ``ys`` the sums per 32 values (Q4_K, Q5_K)
    or per 16 (Q6_K), rows ``t < g`` the tiled kernel's."""
    literally(kind)  # compiled per kind (_mul_mat_for)
    T, K = x.shape
    gemm = np.zeros(T, np.bool_)
    gemm[:g] = True
    if 3 <= kind <= 5 or kind == SIXBIT_KIND:
        yq, yd, ys32, ys16 = q8_k_inputs(x)
        return yq, yd, ys32 if kind <= 4 else ys16, np.zeros((T, 0), np.bool_), gemm
    if kind == 2:
        yq, yd, bs = q8_k_mat_inputs(x, g)
        return yq, yd, pair_sums(bs), np.zeros((T, 0), np.bool_), gemm
    xq, xd = _q8_0_quantize(x)
    if 6 <= kind <= NIBBLE_LAST:  # the codes' kernel: each block's activation sum (columns_b32)
        return xq, xd, _block_sums(xq), _blocks_m128(xq), gemm
    return xq, xd, np.zeros((T, 0), np.int64), _blocks_m128(xq), gemm


@jit()
def _block_sums(xq):
    """(T, K/32) int64: the sum of each 32-value block of the Q8_0 activations ``xq`` (T, K)."""
    s = np.zeros((xq.shape[0], xq.shape[1] // 32), np.int64)
    for t in range(xq.shape[0]):
        for k in range(xq.shape[1]):
            s[t, k // 32] += xq[t, k]
    return s


@per_type
def _mul_mat_for(kind, parallel):
    """``mul_mat`` in one compiled call, for one formula ``kind`` (:data:`KIND`): ``x`` (T, K) float32 quantized
    (:func:`_inputs`, rows ``t < g`` the gemm's), then columns ``[c0, c1)`` of one matrix, tile by tile, split
    between threads or (``parallel`` False) on the calling thread; out (T, c1 - c0).

    ``kind`` and ``parallel`` are constants of the kernel, and every helper takes ``kind`` as a literal
    (``literally``): each kind compiles its own formula's code and nothing else. With ``kind`` an argument, one
    signature held every kind's code — ~50 s of a Q4_K_M file's first run (real2, *Zen 3*) in one kernel, which only
    one process could compile. (A kernel called from Python with ``literally`` re-dispatches on every call; built
    per kind, it does not.)"""

    @jit(variant=KIND_NAME[kind] + ("" if parallel else "_serial"))
    def cols_mul_mat(q, d, dmin, sc, mn, c0, c1, x, g, threads, out):
        y, yd, ys, m128, gemm = _inputs(kind, x, g)
        rows = np.arange(x.shape[0])  # (T,)
        if parallel:
            _tiles_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, m128, gemm, rows, rows, threads, out)
        else:
            _tiles(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, m128, gemm, rows, rows, out)

    return cols_mul_mat


@jit()
def _group(kind, q, d, dmin, sc, mn, c0, c1, ta, tb, y, yd, ys, m128, gemm, order, bounds, experts, arow, out, g, dots,
           acc):
    """Tiles ``ta … tb - 1`` of expert group ``g`` of a ``mul_mat_id`` (:func:`_mul_mat_id_for`): the group's rows
    (their slots' activation rows) against its expert's columns ``[c0, c1)`` in those tiles, as :func:`_chunk` takes
    them, in one call (each call a level deeper passes ~20 arrays: per tile, that had cost a K = 512 expert a fifth
    of its gemv); kinds 3-5 take the tiled kernel when the group has :data:`TILED_MIN_ROWS` rows (``gemm`` is scratch
    for that flag, one per activation row, (T,))."""
    literally(kind)  # compiled per kind (_mul_mat_for)
    e = experts[g]
    orow = order[bounds[g]:bounds[g + 1]]
    rows = np.empty(orow.shape[0], np.int64)
    for i in range(orow.shape[0]):
        rows[i] = arow[orow[i]]
    if 3 <= kind <= 5 or kind == SIXBIT_KIND:
        gemm[:] = orow.shape[0] >= TILED_MIN_ROWS
    qe, de, dme, sce, mne = q[e], d[e], dmin[e], sc[e], mn[e]
    if kind == 2 or kind == SIXBIT_KIND:  # RUN_KINDS: the run in one call
        _run(kind, qe, de, dme, sce, mne, c0, c1, ta, tb, y, yd, ys, m128, gemm, rows, orow, out)
        return
    for t in range(ta, tb):  # _chunk's steps on the expert's views
        c, nc = tile_span(c0, c1, t)
        _tile(kind, qe[t], de[t], dme[t], sce[t], mne[t], c - TILE * t, nc, y, yd, ys, m128, gemm, rows, orow, out,
              c - c0, dots, acc)


@jit(parallel=True)
def _groups_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, m128, gemm, order, bounds, experts, arow, threads,
                     out):
    """Every expert group's tiles split between ``threads`` threads in one parallel region (not one region per group:
    each opens and joins the threads), each group's tiles in as many runs as give every thread 4 work items or more (a
    decode's 8 groups: 1 run each from 2 threads; a prompt's 256: 1). Each output is one work item's, computed in one
    order, whatever ``threads`` is. (The count comes from the caller: ``numba.get_num_threads()`` inside a kernel
    embeds a ctypes pointer, and numba cannot cache such a kernel: every process would compile it again.)"""
    literally(kind)  # compiled per kind (_mul_mat_for)
    t0 = c0 // TILE
    nt = (c1 - 1) // TILE - t0 + 1
    G = experts.shape[0]
    runs = min(nt, max(1, (4 * threads + G - 1) // G))  # runs of each group's tiles
    per = (nt + runs - 1) // runs
    for w in prange(G * runs):
        dots, acc = _scratch()
        gm = gemm.copy()  # kinds 3-5 set it per group
        ta = t0 + (w % runs) * per
        _group(kind, q, d, dmin, sc, mn, c0, c1, ta, min(ta + per, t0 + nt), y, yd, ys, m128, gm, order, bounds,
               experts, arow, out, w // runs, dots, acc)


@jit()
def _groups(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, m128, gemm, order, bounds, experts, arow, out):
    """:func:`_groups_parallel` on the calling thread."""
    literally(kind)  # compiled per kind (_mul_mat_for)
    dots, acc = _scratch()
    for g in range(experts.shape[0]):
        _group(kind, q, d, dmin, sc, mn, c0, c1, c0 // TILE, (c1 - 1) // TILE + 1, y, yd, ys, m128, gemm, order, bounds,
               experts, arow, out, g, dots, acc)


@per_type
def _mul_mat_id_for(kind, parallel):
    """``mul_mat_id`` in one compiled call, for one formula ``kind`` (as :func:`_mul_mat_for`): ``x`` (T·n_x, K)
    every row through ``from_float``, the slots of ``ids`` (T, n_used) grouped by expert (:func:`slot_groups`, as
    ggml groups them), each group's rows against its expert's columns — a gemv per row (``forward_mul_mat_id``), or
    for kinds 3-5 vec_dot (the tiled kernel when the group has :data:`TILED_MIN_ROWS` rows); out (T·n_used, c1 -
    c0). The (group, tile) items split between ``threads`` threads (numba's count: it sizes the items, no bit depends
    on it), or (``parallel`` False) run on the calling thread."""

    @jit(variant=KIND_NAME[kind] + ("" if parallel else "_serial"))
    def cols_mul_mat_id(q, d, dmin, sc, mn, c0, c1, x, ids, n_x, threads, out):
        y, yd, ys, m128, gemm = _inputs(kind, x, 0)
        order, bounds, experts, arow = slot_groups(ids, n_x)
        if parallel:
            _groups_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, m128, gemm, order, bounds, experts, arow,
                             threads, out)
        else:
            _groups(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, m128, gemm, order, bounds, experts, arow, out)

    return cols_mul_mat_id


def sixbit_fast() -> bool:
    """Whether Q6_K's six-bit codes (:func:`layout` ``sixbit``) multiply faster here than its bytes: with AVX512-VNNI
    (:data:`kernels.ggml.columns_ir.LEVEL` 2), where a lane's codes are decoded in registers that hold them for all
    rows. real2's Q6_K head (32768 × 2048), 1 thread, *EPYC* (Zen 4), 2026-12-07: 1 / 4 rows 4.07–4.29 / 7.00 ms ->
    3.80–3.86 / 6.52 (libggml 2.48–2.74 / 9.54 on the stored rows), 72 -> 56 MB. The bits are the same either way."""
    return LEVEL == 2


def kind_for(qtype, repacked: bool):
    """The formula a product of ``qtype`` weights in the column layout takes (:data:`KIND`): the repacked kernels'
    when llama.cpp repacked the tensor, else the plain buffer's; None: that kernel has no column layout."""
    return (REPACKED_KIND if repacked else PLAIN_KIND).get(QT(qtype))


def takes(qtype, rows: float) -> bool:
    """Whether a product of ``qtype`` weights whose each weight meets ``rows`` activation rows (on average: a
    ``mul_mat_id``'s slots per expert) runs from the column layout: every type's, Q8_0's below
    :data:`Q8_0_COLS_BELOW`."""
    return QT(qtype) != QT.Q8_0 or rows < Q8_0_COLS_BELOW


def _kind(cols: Columns, repacked: bool) -> int:
    kind = kind_for(cols.qtype, repacked)
    if kind is None or (kind == Q8_0_KIND) != cols.quads:
        raise ValueError(f"column layout: {cols.qtype.name} {'repacked' if repacked else 'in a plain buffer'}"
                         f"{' in pairs' if kind == Q8_0_KIND else ''} has no kernel here")
    return NIBBLE_KIND[cols.qtype] if cols.nibbles else SIXBIT_KIND if cols.sixbit else kind


def mul_mat_cols(cols: Columns, x: np.ndarray, repacked: bool = True) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` for a dense weight in the column layout (``cols.q`` (1, K/2, 2N)): ``x`` (T, K)
    float32 -> (T, n_cols) float32, the bits of ggml's kernel for that type and ``T`` (module docstring), of the
    repacked tensor or (``repacked`` False) of the plain buffer's."""
    kind = _kind(cols, repacked)
    x = np.ascontiguousarray(x, F32)
    T, K = x.shape
    if cols.q.shape[0] != 1 or cols.K != K:
        raise ValueError(f"column layout of (E={cols.q.shape[0]}, K={cols.K}): not one matrix of K={K}")
    out = np.empty((T, cols.n_cols), F32)
    g = (T if T >= TILED_MIN_ROWS else 0) if kind in K_KINDS else 0 if kind == Q8_0_KIND else T - T % 4  # the rows
    # taking the tiled kernel / the gemm (Q8_0: vec_dot every row)
    parallel = T * cols.n_cols * K >= SERIAL_BELOW  # small products on the calling thread
    _mul_mat_for(kind, parallel)(cols.q[0], cols.d[0], cols.dmin[0], cols.sc[0], cols.mn[0], cols.c0,
                                 cols.c0 + cols.n_cols, x, g, numba.get_num_threads(), out)
    return out


def mul_mat_id_cols(cols: Columns, x: np.ndarray, ids: np.ndarray, repacked: bool = True) -> np.ndarray:
    """``ggml_mul_mat_id(W, x, ids)`` for a stack of experts in the column layout: ``x`` (T, n_x, K) float32,
    ``ids`` (T, n_used) in ``[0, E)`` -> (T, n_used, n_cols): slot ``s`` of token ``t`` is expert ``ids[t, s]``
    times ``x[t, s % n_x]``, every row converted by ``from_float`` (the gemv); ``repacked`` as in
    :func:`mul_mat_cols`."""
    x = np.ascontiguousarray(x, F32)
    ids = np.asarray(ids, np.int32)
    T, n_x, K = x.shape
    E = cols.q.shape[0]
    if ids.ndim != 2 or ids.shape[0] != T or (ids < 0).any() or (ids >= E).any() or cols.K != K:
        raise ValueError(f"ids must be (T={T}, n_used) experts in [0, {E}) and K = {cols.K}, got {ids.shape}, K={K}")
    return mul_mat_id_checked(cols, x, ids, repacked)


def mul_mat_id_checked(cols: Columns, x: np.ndarray, ids: np.ndarray, repacked: bool = True) -> np.ndarray:
    """:func:`mul_mat_id_cols` on arguments already checked (``kernels.ggml.mulmat.mul_mat_id`` has): ``x`` (T, n_x,
    K) C-contiguous float32, ``ids`` (T, n_used) int32 in range."""
    T, n_x, K = x.shape
    out = np.empty((T, ids.shape[1], cols.n_cols), F32)
    parallel = ids.size * cols.n_cols * K >= SERIAL_BELOW  # a decode step's 8 experts as much as a prompt's 256
    _mul_mat_id_for(_kind(cols, repacked), parallel)(cols.q, cols.d, cols.dmin, cols.sc, cols.mn, cols.c0,
                                                     cols.c0 + cols.n_cols, x.reshape(T * n_x, K), ids, n_x,
                                                     numba.get_num_threads(), out.reshape(T * ids.shape[1], -1))
    return out


__all__ = ["Columns", "KIND", "LAID_OUT", "kind_for", "layout", "layout_nbytes", "mul_mat_cols", "mul_mat_id_cols",
           "sixbit_fast", "takes"]
