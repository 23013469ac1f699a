"""The column layout's AArch64 kernels: a matrix that llama.cpp's CPU_REPACK buffer takes on an ARM path — Q4_K,
Q5_K, Q6_K (``q{4,5,6}_K_8x4`` / ``_8x8_q8_K``: :mod:`kernels.ggml.repack_arm_k`) and Q4_0, IQ4_NL, MXFP4 (the 32-value
block kernels: :mod:`kernels.ggml.repack_arm`) — multiplied from :mod:`kernels.ggml.columns`'s layout, 16 outputs'
exact integer dots at a time, with the same bits as those stored-row kernels (which the op tests hold to the
libraries under qemu).

Which register lane holds what is not part of the numerics; what is, per output element, are the integers that meet
a float operation and the float operations in ggml's order. The AArch64 kernels meet the floats with:

* **Q4_K, Q5_K**: each 32-value sub-block's ``I_s = sc_s · Σ q·y`` (the layout's codes, each group's scaled dot:
  :func:`kernels.ggml.columns_ir.kq_groups`) and the mins' ``m_2k + m_2k+1`` per 64 values; **Q6_K**: the
  super-block's ``I = Σ_g sc_g · Σ (q - 32)·y`` (:func:`kernels.ggml.columns_ir.kq`'s total, the -32 through the
  bsums). Their float steps, per super-block, by :func:`kernels.ggml.repack_arm_k.super_block` — the one function
  the stored-row kernel calls too, with the path's recipe of the gemm rows (the first ``T - T % 4``) and of the gemv
  rows (:data:`kernels.ggml.repack_arm_k.GEMM_GEMV`). Activations: the AArch64 Q8_K quantizer.
* **Q4_0, IQ4_NL, MXFP4**: per 32-value block the exact integer dot of the LUT values (no sign trick on ARM: ``sdot``
  / ``smmla``), ``d = float32(d_w · d_x)``, then ``acc = fma(float(dot), d, acc)`` or ``acc + float32(d ·
  float(dot))`` (:data:`kernels.ggml.repack_arm.FUSED`). Activations: the AArch64 Q8_0 quantizer.

And a weight in a **plain buffer** (``arm64-base`` repacks nothing; ``--no-repack``; rows not a multiple of 8), whose
1-row ``vec_dot`` (``arch/arm/quants.c``: :mod:`kernels.ggml.mulmat_arm_q`) meets the floats with:

* **Q4_K, Q5_K, Q6_K**: per super-block ``sumi = Σ sc·dot`` (Q6_K with the values ``q - 32``) and ``bias = Σ
  mn·(bsum pair)``: Q4_K ``sumf = fma(-float(bias), dmin, sumf)`` then ``fma(float(sumi), d, sumf)``; Q5_K ``sumf +
  fma(float(sumi), d, -(float(bias)·dmin))``; Q6_K ``fma(d, float(sumi), sumf)`` (``d = y.d·fp16(x.d)``, ``dmin =
  y.d·fp16(x.dmin)``).
* **MXFP4, IQ4_NL**: blocks in pairs, ``sumf + fma(float(sB), dB, float(sA)·dA)`` (MXFP4) or ``sumf + fma(float(sA),
  dA, float(sB)·dB)`` (IQ4_NL), an odd last block ``fma(float(sumi), d, sumf)``.
* **Q8_0, Q4_0**: ``ggml_vdotq_s32``'s 4 int32 lanes per block (``sdot``'s bytes ``4l … 4l+3`` of each half, or
  ``arm64-base``'s ``vmull`` order; ``arm64-sve256``: ``svdot_s32``'s 8 lanes, values ``4l … 4l+3``), each lane's
  float chain (even blocks, odd blocks), their sum, an odd last block (:mod:`kernels.ggml.columns_arm_lanes`).

An element that takes an i8mm 2-row kernel (a verify batch with ``--no-repack`` on an i8mm path), Q6_K on
``arm64-sve128-clang14`` (its wrong high bits) and the other types (Q5_0, Q4_1, Q5_1, the IQ and small K-quants)
read the stored rows.

Every NaN of an output is made AArch64's default NaN (:func:`kernels.ggml.repack_arm.arm_nans`), as the stored-row
kernels do. Q8_0 has no column layout here either (its stored-row kernel reads the rows in place).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.base.block import QT
from kernels.base.flags import SERIAL_BELOW, jit, per_type
from kernels.ggml import mulmat_arm
from kernels.ggml.actquant import _quantize_rows_q8_0_arm, _quantize_rows_q8_k
from kernels.ggml.build import by_clang
from kernels.ggml.columns import TILE, Columns, _dots
from kernels.ggml.columns_arm_lanes import tile_lanes
from kernels.ggml.columns_ir import kq, kq_groups
from kernels.ggml.mulmat_k import pair_sums
from kernels.ggml.mulmat_q8 import slot_groups
from kernels.ggml.repack_arm import FUSED, KERNELS_OF, REPACK_ARM, arm_nans
from kernels.ggml.repack_arm_k import GEMM_GEMV, Q8_K_FUSED, quantize_rows_q8_k_arm, super_block
from kernels.ggml.simd import fma32

F32 = np.float32
#: The types whose AArch64 repacked kernels run from the column layout -> kernel ``kind`` (0–2: the K-quants as
#: ``repack_arm_k.KIND``; 3: a 32-value block type).
KIND = {QT.Q4_K: 0, QT.Q5_K: 1, QT.Q6_K: 2, QT.Q4_0: 3, QT.IQ4_NL: 3, QT.MXFP4: 3}
#: The types whose plain-buffer 1-row ``vec_dot`` runs from the column layout -> kernel ``kind`` (4–6: Q4_K, Q5_K,
#: Q6_K; 7: MXFP4, 8: IQ4_NL; 9: the lanes of Q8_0 and Q4_0).
PLAIN_KIND = {QT.Q4_K: 4, QT.Q5_K: 5, QT.Q6_K: 6, QT.MXFP4: 7, QT.IQ4_NL: 8, QT.Q8_0: 9, QT.Q4_0: 9}


def covers(qtype, path: str, repacked: bool = True) -> bool:
    """Whether a ``qtype`` matrix runs from the column layout here on the AArch64 ``path``: ``repacked`` (the
    CPU_REPACK buffer takes it) on the paths whose repacked kernels are emulated
    (:data:`kernels.ggml.repack_arm.KERNELS_OF`), else in a plain buffer on every emulated AArch64 path."""
    qt = QT(qtype)
    if repacked:
        return path in KERNELS_OF and qt in KIND and qt in REPACK_ARM[path]
    return (qt in PLAIN_KIND and mulmat_arm.emulated(qt, path)
            and not (qt == QT.Q6_K and path == "arm64-sve128-clang14"))  # its 1-row Q6_K's wrong high bits


@jit()
def _tile_k(kk, plain, q, d, dmin, sc, mn, c, nc, y, yd, ys, bs, recipe, rows, orow, out, oc):
    """Columns ``c … c + nc - 1`` of one tile of K-quant codes (``kk`` 0 Q4_K, 1 Q5_K, 2 Q6_K) against activation rows
    ``rows`` (``y`` (R, K) int8, ``yd`` (R, K/256), ``ys`` (R, K/32) the sums per 32 values, ``bs`` (R, K/16) the
    bsums, ``recipe`` (R,) each row's float recipe) into ``out[orow[i], oc + j]``: the repacked kernels' recipes, or
    (``plain``) a plain buffer's 1-row ``vec_dot`` (module docstring). Sub-tile by sub-tile, super-block by
    super-block, every row against the codes while they are in the cache; each element's float steps in order."""
    R = rows.shape[0]
    v = np.empty((8, 16), np.int32)  # a super-block's integers (per group, or the total) per column of a sub-tile
    isub = np.empty(8, np.int64)
    m4 = np.zeros(4, np.int64)
    acc = np.zeros((R, TILE), F32)
    for w0 in range(c - c % 16, c + nc, 16):
        cs = max(c, w0)
        n = min(c + nc, w0 + 16) - cs
        for b in range(yd.shape[1]):
            for i in range(R):
                r = rows[i]
                if kk == 2:  # columns_ir's forms (constants): 1 Q6_K's bytes, 2 Q4_K's nibbles, 0 Q5_K's bytes
                    kq(v, q, b, 0, 8, cs, n, y[r], sc, bs[r], 1, 1)  # v[0]: Σ_g sc_g · Σ (q - 32)·y
                elif plain and kk == 0:
                    kq(v, q, b, 0, 8, cs, n, y[r], sc, bs[r], 2, 1)  # v[0]: sumi
                elif plain:
                    kq(v, q, b, 0, 8, cs, n, y[r], sc, bs[r], 0, 1)
                elif kk == 0:
                    kq_groups(v, q, b, cs, n, y[r], sc, 2)  # v[s]: I_s
                else:
                    kq_groups(v, q, b, cs, n, y[r], sc, 0)
                for j in range(n):
                    cj = cs + j
                    o = cj - c
                    if plain:
                        acc[i, o] = _vec_dot_step(kk, v[0, j], mn, ys[r], b, cj, d[b, cj], dmin, yd[r, b], acc[i, o])
                        continue
                    isub[0] = v[0, j]
                    dm = F32(0.0)
                    if kk != 2:
                        for s in range(1, 8):
                            isub[s] = v[s, j]
                        for k in range(4):  # m_2k + m_2k+1
                            s0 = 8 * b + 2 * k
                            m4[k] = np.int64(mn[s0, cj]) * ys[r, s0] + np.int64(mn[s0 + 1, cj]) * ys[r, s0 + 1]
                        dm = dmin[b, cj]
                    acc[i, o] = super_block(kk, recipe[r], isub, m4, d[b, cj], dm, yd[r, b], acc[i, o])
    for i in range(R):
        for j in range(nc):
            out[orow[i], oc + j] = acc[i, j]


@jit()
def _vec_dot_step(kk, sumi, mn, ysr, b, cj, dw, dmin, yd, acc):
    """A plain buffer's 1-row ``vec_dot``, super-block ``b`` of column ``cj`` (module docstring): ``sumi`` its integer,
    the mins ``mn`` against the activation row's sums per 32 values ``ysr``, ``dw`` its ``d``."""
    db = F32(yd * dw)
    if kk == 2:  # Q6_K
        return fma32(db, F32(sumi), acc)
    bias = np.int64(0)
    for s in range(8 * b, 8 * b + 8):
        bias += np.int64(mn[s, cj]) * ysr[s]
    dm = F32(yd * dmin[b, cj])
    if kk == 0:  # Q4_K: fmsub, then fmadd
        return fma32(F32(sumi), db, fma32(-F32(bias), dm, acc))
    return acc + fma32(F32(sumi), db, -F32(F32(bias) * dm))  # Q5_K: fnmsub, then fadd


@jit()
def _tile_b32(q, d, c, nc, y, yd, fused, rows, orow, out, oc):
    """Columns ``c … c + nc - 1`` of one tile of 32-value blocks (``q`` (K/2, 2·TILE) the LUT values, ``d`` (K/32,
    TILE) the weight scales) against activation rows ``rows`` (``y`` (R, K) int8, ``yd`` (R, K/32), ``fused`` (R,)
    1 where the row's float step is one FMA) into ``out[orow[i], oc + j]``."""
    dots = np.empty(TILE, np.int32)
    acc = np.empty(TILE, F32)
    for i in range(rows.shape[0]):
        r = rows[i]
        yr = y[r]
        acc[:nc] = 0
        for b in range(yd.shape[1]):
            _dots(q, 32 * b, c, nc, yr, 32 * b, dots)  # exact: no sign trick on ARM
            for j in range(nc):
                dd = F32(d[b, c + j] * yd[r, b])  # vmulq_f32
                if fused[r]:
                    acc[j] = fma32(F32(dots[j]), dd, acc[j])  # vfmaq_f32 / fmla
                else:
                    acc[j] = acc[j] + F32(dd * F32(dots[j]))  # vmlaq_f32: fmul, fadd
        for j in range(nc):
            out[orow[i], oc + j] = acc[j]


@jit()
def _tile_b32_1(mx, q, d, c, nc, y, yd, rows, orow, out, oc):
    """The plain buffer's 1-row ``vec_dot`` of MXFP4 (``mx``) or IQ4_NL: blocks in pairs, one product rounded and the
    other fused (module docstring); ``q``, ``d`` as :func:`_tile_b32`."""
    nb = yd.shape[1]
    da = np.empty(TILE, np.int32)
    db = np.empty(TILE, np.int32)
    acc = np.empty(TILE, F32)
    for i in range(rows.shape[0]):
        r = rows[i]
        yr = y[r]
        acc[:nc] = 0
        b = 0
        while b + 1 < nb:
            _dots(q, 32 * b, c, nc, yr, 32 * b, da)
            _dots(q, 32 * b + 32, c, nc, yr, 32 * b + 32, db)
            for j in range(nc):
                fa, fb = F32(yd[r, b] * d[b, c + j]), F32(yd[r, b + 1] * d[b + 1, c + j])
                if mx:
                    acc[j] = acc[j] + fma32(F32(db[j]), fb, F32(F32(da[j]) * fa))
                else:
                    acc[j] = acc[j] + fma32(F32(da[j]), fa, F32(F32(db[j]) * fb))
            b += 2
        if b < nb:
            _dots(q, 32 * b, c, nc, yr, 32 * b, da)
            for j in range(nc):
                acc[j] = fma32(F32(da[j]), F32(yd[r, b] * d[b, c + j]), acc[j])
        for j in range(nc):
            out[orow[i], oc + j] = acc[j]


@jit()
def _chunk(kind, q, d, dmin, sc, mn, c0, c1, t, y, yd, ys, bs, recipe, rows, orow, out):
    """The outputs of ``[c0, c1)`` in tile ``t`` (``q[t]`` …) into ``out[orow[i], c - c0]``."""
    c = max(c0, TILE * t)
    nc = min(c1, TILE * t + TILE) - c
    if kind == 3:
        _tile_b32(q[t], d[t], c - TILE * t, nc, y, yd, recipe, rows, orow, out, c - c0)
    elif kind == 9:
        tile_lanes(q[t], d[t], c - TILE * t, nc, y, yd, recipe, rows, orow, out, c - c0)
    elif kind >= 7:
        _tile_b32_1(kind == 7, q[t], d[t], c - TILE * t, nc, y, yd, rows, orow, out, c - c0)
    elif kind >= 4:
        _tile_k(kind - 4, True, q[t], d[t], dmin[t], sc[t], mn[t], c - TILE * t, nc, y, yd, ys, bs, recipe, rows, orow,
                out, c - c0)
    else:
        _tile_k(kind, False, q[t], d[t], dmin[t], sc[t], mn[t], c - TILE * t, nc, y, yd, ys, bs, recipe, rows, orow,
                out, c - c0)


@jit(parallel=True)
def _tiles_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, rows, out):
    """Every tile of ``[c0, c1)``, split between threads (each output is one thread's, computed in one order)."""
    t0 = c0 // TILE
    for i in prange((c1 - 1) // TILE - t0 + 1):
        _chunk(kind, q, d, dmin, sc, mn, c0, c1, t0 + i, y, yd, ys, bs, recipe, rows, rows, out)


@jit()
def _tiles(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, rows, out):
    """:func:`_tiles_parallel` on the calling thread."""
    for t in range(c0 // TILE, (c1 - 1) // TILE + 1):
        _chunk(kind, q, d, dmin, sc, mn, c0, c1, t, y, yd, ys, bs, recipe, rows, rows, out)


@jit()
def _group(kind, q, d, dmin, sc, mn, c0, c1, t, y, yd, ys, bs, recipe, order, bounds, experts, arow, out, g):
    """Tile ``t`` of expert group ``g`` of a ``mul_mat_id``: the group's slots (their activation rows) against its
    expert's columns."""
    orow = order[bounds[g]:bounds[g + 1]]
    rows = np.empty(orow.shape[0], np.int64)
    for i in range(orow.shape[0]):
        rows[i] = arow[orow[i]]
    e = experts[g]
    _chunk(kind, q[e], d[e], dmin[e], sc[e], mn[e], c0, c1, t, y, yd, ys, bs, recipe, rows, orow, out)


@jit(parallel=True)
def _groups_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, order, bounds, experts, arow, out):
    """Every (expert group, tile) of a ``mul_mat_id`` in one parallel region."""
    t0 = c0 // TILE
    nt = (c1 - 1) // TILE - t0 + 1
    for w in prange(experts.shape[0] * nt):
        _group(kind, q, d, dmin, sc, mn, c0, c1, t0 + w % nt, y, yd, ys, bs, recipe, order, bounds, experts, arow,
               out, w // nt)


@jit()
def _groups(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, order, bounds, experts, arow, out):
    """:func:`_groups_parallel` on the calling thread."""
    for g in range(experts.shape[0]):
        for t in range(c0 // TILE, (c1 - 1) // TILE + 1):
            _group(kind, q, d, dmin, sc, mn, c0, c1, t, y, yd, ys, bs, recipe, order, bounds, experts, arow, out, g)


@jit()
def _inputs(kind, x, q8k_fused):
    """The activations ``x`` (R, K) float32 as the AArch64 kernels take them: (y (R, K) int8, yd, ys (R, K/32) int64
    the sums per 32 values, bs (R, K/16) int64 the bsums) — the Q8_K quantizer (``q8k_fused``: GCC's contracted
    ``nearest_int``) for the K-quants, the Q8_0 one (``yd`` (R, K/32); no sums) for the 32-value blocks (``kind`` as
    :data:`KIND`, :data:`PLAIN_KIND`)."""
    R, K = x.shape
    y = np.empty((R, K), np.int8)
    if kind == 3 or kind >= 7:
        yd = np.empty((R, K // 32), F32)
        _quantize_rows_q8_0_arm(x, y, yd, np.empty((R, 0), F32))
        return y, yd, np.empty((R, 0), np.int64), np.empty((R, 0), np.int64)
    yd = np.empty((R, K // 256), F32)
    b16 = np.empty((R, K // 16), np.int16)
    if kind >= 4:  # the plain buffer's from_float: quantize_row_q8_K_ref (the same recipe, libggml-base's code)
        _quantize_rows_q8_k(x, y, yd, b16, q8k_fused)
    else:
        quantize_rows_q8_k_arm(x, y, yd, b16, q8k_fused)
    return y, yd, pair_sums(b16), b16.astype(np.int64)  # vpaddq_s16 (no int16 wrap: |sum| <= 32·128)


@jit()
def _mul_mat(kind, q, d, dmin, sc, mn, c0, c1, x, q8k_fused, recipe, out):
    y, yd, ys, bs = _inputs(kind, x, q8k_fused)
    rows = np.empty(x.shape[0], np.int64)
    for t in range(x.shape[0]):
        rows[t] = t
    if x.shape[0] * (c1 - c0) * x.shape[1] >= SERIAL_BELOW:
        _tiles_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, rows, out)
    else:
        _tiles(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, rows, out)


@jit()
def _mul_mat_id(kind, q, d, dmin, sc, mn, c0, c1, x, ids, n_x, q8k_fused, recipe, out):
    y, yd, ys, bs = _inputs(kind, x, q8k_fused)
    order, bounds, experts, arow = slot_groups(ids, n_x)
    if ids.size * (c1 - c0) * x.shape[1] >= SERIAL_BELOW:
        _groups_parallel(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, order, bounds, experts, arow, out)
    else:
        _groups(kind, q, d, dmin, sc, mn, c0, c1, y, yd, ys, bs, recipe, order, bounds, experts, arow, out)


@per_type
def _kernels(qt, repacked):
    """(mul_mat, mul_mat_id) compiled for one type's kernel (``repacked`` or a plain buffer's): its ``kind`` a
    constant, so each type compiles its own code alone (kernels/base/flags.py, "One compiled copy per weight type")."""
    kind = (KIND if repacked else PLAIN_KIND)[QT(qt)]
    name = "cols_arm" if repacked else "cols_arm_plain"

    @jit(kind=qt, variant=name)
    def mul_mat(q, d, dmin, sc, mn, c0, c1, x, q8k_fused, recipe, out):
        _mul_mat(kind, q, d, dmin, sc, mn, c0, c1, x, q8k_fused, recipe, out)

    @jit(kind=qt, variant=name + "_id")
    def mul_mat_id(q, d, dmin, sc, mn, c0, c1, x, ids, n_x, q8k_fused, recipe, out):
        _mul_mat_id(kind, q, d, dmin, sc, mn, c0, c1, x, ids, n_x, q8k_fused, recipe, out)

    return mul_mat, mul_mat_id


def _recipes(qt: QT, path: str, T: int, g: int, repacked: bool = True) -> np.ndarray:
    """(T,) int64: each activation row's float recipe on the kernels of ``path`` — rows ``t < g`` the gemm's, the rest
    the gemv's (K-quants: :data:`GEMM_GEMV`; 32-value blocks: 1 where :data:`FUSED` says one FMA); a plain buffer's
    1-row kernels: one recipe (none to pass)."""
    if not repacked:  # one recipe: the lanes' kernel (its kind, arm64-base's vmull, fused) or none to pass
        if PLAIN_KIND[qt] != 9:
            return np.zeros(T, np.int64)
        lk = mulmat_arm.block32_kind(qt, path)
        fused = by_clang(path) or lk in (7, 8, 9, 10)  # as mulmat_arm_q.block32_rows: clang's fmla, SVE's svmla
        return np.full(T, lk + 16 * (path in mulmat_arm.BASE_PATHS) + 32 * fused, np.int64)
    kp = KERNELS_OF[path]
    gemm, gemv = GEMM_GEMV[(qt, kp)] if KIND[qt] < 3 else (int(f) for f in FUSED[(qt, kp)])
    return np.where(np.arange(T) < g, gemm, gemv).astype(np.int64)


def _check(cols: Columns, path: str, K: int, repacked: bool) -> None:
    if not covers(cols.qtype, path, repacked):
        where = "repacked" if repacked else "in a plain buffer"
        raise ValueError(f"column layout: {cols.qtype.name} {where} on {path} has no AArch64 kernel here")
    if cols.K != K:
        raise ValueError(f"column layout of K={cols.K} given for activations of K={K}")
    if cols.nibbles or cols.sixbit:
        raise ValueError(f"column layout: {cols.qtype.name}'s packed codes are the x86 kernels'; AArch64's read bytes")


def _q8k_fused(path: str, repacked: bool) -> bool:
    """Whether ``path``'s Q8_K quantizer contracts ``nearest_int``'s product (GCC does, clang does not)."""
    return Q8_K_FUSED[KERNELS_OF[path]] if repacked else not by_clang(path)


def mul_mat_cols_arm(cols: Columns, x: np.ndarray, path: str, repacked: bool = True) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` for a dense weight repacked on the AArch64 ``path``, from its column layout (``cols.q``
    (1, …)): ``x`` (T, K) float32 -> (T, n_cols) float32, the gemm on the first ``T - T % 4`` rows and the gemv on the
    rest (``forward_mul_mat``); not ``repacked``: the plain buffer's 1-row ``vec_dot`` for every element (the caller
    knows that no element takes an i8mm 2-row kernel: :func:`kernels.ggml.mulmat_arm.block_mask`)."""
    x = np.ascontiguousarray(x, F32)
    T, K = x.shape
    _check(cols, path, K, repacked)
    if cols.q.shape[0] != 1:
        raise ValueError(f"column layout of E={cols.q.shape[0]} matrices given for one")
    out = np.empty((T, cols.n_cols), F32)
    _kernels(cols.qtype, repacked)[0](cols.q[0], cols.d[0], cols.dmin[0], cols.sc[0], cols.mn[0], cols.c0,
                                      cols.c0 + cols.n_cols, x, _q8k_fused(path, repacked),
                                      _recipes(cols.qtype, path, T, T - T % 4, repacked), out)
    return arm_nans(out)


def mul_mat_id_cols_arm(cols: Columns, x: np.ndarray, ids: np.ndarray, path: str, repacked: bool = True) -> np.ndarray:
    """``ggml_mul_mat_id(W, x, ids)`` for a stack of experts repacked on the AArch64 ``path``, from its column layout
    (``forward_mul_mat_id``: the gemv for every routed row; not ``repacked``: the 1-row ``vec_dot``): ``x`` (T, n_x,
    K) float32, ``ids`` (T, n_used) int32 experts in range (the caller's check) -> (T, n_used, n_cols)."""
    x = np.ascontiguousarray(x, F32)
    T, n_x, K = x.shape
    _check(cols, path, K, repacked)
    out = np.empty((T, ids.shape[1], cols.n_cols), F32)
    _kernels(cols.qtype, repacked)[1](cols.q, cols.d, cols.dmin, cols.sc, cols.mn, cols.c0, cols.c0 + cols.n_cols,
                                      x.reshape(T * n_x, K), np.asarray(ids, np.int32), n_x, _q8k_fused(path, repacked),
                                      _recipes(cols.qtype, path, T * n_x, 0, repacked), out.reshape(T * ids.shape[1], -1))
    return arm_nans(out)


__all__ = ["KIND", "PLAIN_KIND", "covers", "mul_mat_cols_arm", "mul_mat_id_cols_arm"]
