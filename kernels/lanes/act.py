"""Row-lane kernels for ``act_quant=True`` (``--emulate``): llama.cpp's integer dots, 16 weight rows at a time.

The emulated product (:mod:`kernels.ggml.actdots`) of a weight row and an activation row quantized to
Q8_0 or Q8_K is, per block, an exact integer sum of products, combined with the block scales by a
fixed sequence of float32 operations — the generic C code's (``ggml_vec_dot_<type>_generic``). Here
each SIMD lane holds one weight row: the integer sums are formed lane by lane (exact: no order can
change an integer), and every float32 operation of the transcription in :mod:`kernels.ggml.actdots` is
applied to the vector of lanes in the same order — so every output has the same bits as
``actdots.matmul_act_quant`` (tested for every type here, tests/test_kernels_lanes.py). Unlike the C
code, which decodes the weight row once per activation row, the integer work per weight is a few
integer operations, about a third of the plain kernels' float64 work.

Types: Q8_0 and MXFP4 (Q8_0 activations: ``sumf += float32(sumi)·(dx·dy)``, ``sumf += (dy·dx)·sumi``),
Q4_K, Q5_K and Q6_K (Q8_K activations: eight float lanes ``sums[l] += (dx·dy)·aux32[l]``, aux32[l]
the integer sum over the values ≡ l mod 8 of a super-block, and for Q4_K/Q5_K the ``dmin``
correction; the lanes added at the end). The state of one (weight row, activation row) pair — sumf,
or sums[0..7] and sumf — lives in a float32 array [slots, LANES] across the blocks of a row.
Other types, and the last N mod 16 rows, keep :mod:`kernels.ggml.actdots`' scalar kernels.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core.extending import intrinsic

from kernels.plain.dequant import MXFP4_VALUES
from kernels.base.flags import jit, per_type
from .blocks import _k_scale_min, _mxfp4_int, _q6_k_codes
from .ir import (_MXFP4, _Q4_K, _Q5_K, _Q6_K, _Q8_0, BLOCK, CODE_SLOTS, ISA, ISA_GENERIC, ISA_NAMES, LANES, TYPE_SIZE,
                       PREFETCH_BYTES, _Emit, _f32, _i8, _i16, _i32, _i64, _ir_loop, _over_halves, _PackedEmit, _prefetch,
                       vector_lanes)
from .ir import SLOTS as PACK_SLOTS

#: Float32 state slots per (weight row, activation row): sumf; or sums[0..7] and sumf (slot 8).
SLOTS = {_Q8_0: 1, _MXFP4: 1, _Q4_K: 9, _Q5_K: 9, _Q6_K: 9}
ACT_LANE_TYPES = tuple(SLOTS)


class _Act:
    """The activation rows and the state, for an act emitter: ``q(t, j)`` the int8 quant of column j of
    this block in activation row t (as int32 lanes), ``d(t, i)`` its scale i (float32 lanes),
    ``bsum(t, g)`` the Q8_K block sum of the 16 values of group g of this block, ``add(t, s, v)`` /
    ``sub`` state slot s of row t += / −= v. ``nt``: the activation rows of this pass."""

    def __init__(self, e: _Emit, yq, yd, yx, K, n_d, n_x, t0, nt, k0, state_ptr, slots, lane0):
        self.e, self.yq, self.yd, self.yx, self.k0, self.state, self.lane0 = e, yq, yd, yx, k0, state_ptr, lane0
        self.K, self.n_d, self.n_x, self.t0, self.nt, self.slots = K, n_d, n_x, t0, nt, slots

    def _row(self, t: int, width):
        return self.e.b.mul(self.e.b.add(self.t0, ir.Constant(_i64, t)), width)

    def q(self, t: int, j):
        b = self.e.b
        k = b.add(b.add(self._row(t, self.K), self.k0), j if not isinstance(j, int) else ir.Constant(_i64, j))
        return self.e.splat(b.sext(b.load(b.gep(self.yq, [k])), _i32), _i32)

    def d(self, t: int, index):
        b = self.e.b
        return self.e.splat(b.load(b.gep(self.yd, [b.add(self._row(t, self.n_d), index)])), _f32)

    def bsum(self, t: int, g: int):
        b = self.e.b
        k = b.add(b.add(self._row(t, self.n_x), b.udiv(self.k0, ir.Constant(_i64, 16))), ir.Constant(_i64, g))
        return self.e.splat(b.sext(b.load(b.gep(self.yx, [k])), _i32), _i32)

    def _slot(self, t: int, s: int):
        b = self.e.b
        at = b.add(ir.Constant(_i64, (t * self.slots + s) * LANES), self.lane0)
        return b.bitcast(b.gep(self.state, [at]), self.e.vec(_f32).as_pointer())

    def add(self, t: int, s: int, v) -> None:
        p = self._slot(t, s)
        self.e.b.store(self.e.b.fadd(self.e.b.load(p, align=4), v), p, align=4)

    def sub(self, t: int, s: int, v) -> None:
        p = self._slot(t, s)
        self.e.b.store(self.e.b.fsub(self.e.b.load(p, align=4), v), p, align=4)


# --------------------------------------------------------------------------------------------
# Emitters: one block of a weight type against the activation row (kernels/ggml/actdots.py, same order)


def _act_q8_0(e: _Emit, A: _Act, blk):
    """``_dot_q8_0_q8_0``: sumi = Σ qs[j]·y[j]; sumf += float32(sumi) * (d * yd[blk])."""
    b = e.b
    d = e.f16(e.dwords(0)[0], high=False)
    sumi = [e.const(0)] * A.nt
    for j4, dw in enumerate(e.dwords(2, 8)):
        for k in range(4):
            w = e.sbyte(dw, k)
            sumi = [b.add(sumi[t], b.mul(w, A.q(t, 4 * j4 + k))) for t in range(A.nt)]
    for t in range(A.nt):
        A.add(t, 0, b.fmul(e.i2f(sumi[t]), b.fmul(d, A.d(t, blk))))


def _act_mxfp4(e: _Emit, A: _Act, blk):
    """``_dot_mxfp4_q8_0``: d = yd[blk] * E8M0_HALF[e]; sumi = Σ y·K[nibble]; sumf += d * float32(sumi)."""
    b = e.b
    ex = e.byte(e.dwords(0)[0], 0)
    half = b.bitcast(b.select(b.icmp_unsigned("<", ex, e.const(2)), b.shl(e.const(0x00200000), ex),
                              b.shl(b.sub(ex, e.const(1)), e.const(23))), e.vec(_f32))
    dws = e.dwords(1, 4)
    sumi = [e.const(0)] * A.nt
    for high in (0, 1):
        for j4, dw in enumerate(dws):
            if e.isa != ISA_GENERIC:
                looked_up = e.byte_table16(MXFP4_VALUES, b.and_(b.lshr(dw, e.const(4)) if high else dw, e.const(0x0F0F0F0F)))
            for k in range(4):
                j = 4 * j4 + k
                value = e.sbyte(looked_up, k) if e.isa != ISA_GENERIC else _mxfp4_int(e, e.bits(dw, 8 * k + 4 * high, 4))
                sumi = [b.add(sumi[t], b.mul(value, A.q(t, 16 * high + j))) for t in range(A.nt)]
    for t in range(A.nt):
        A.add(t, 0, b.fmul(b.fmul(A.d(t, blk), half), e.i2f(sumi[t])))


def _lanes8(e: _Emit, A: _Act, blk, aux, d_dword: int, d_high: bool):
    """``_add_lanes``: sums[l] += (d · yd[blk]) * float32(aux[t][l]) for l = 0..7 and each row t (d the
    f16 in the low or high half of the dword at byte ``d_dword``)."""
    b = e.b
    d = e.f16(e.dwords(d_dword)[0], high=d_high)
    for t in range(A.nt):
        dd = b.fmul(d, A.d(t, blk))
        for l in range(8):
            A.add(t, l, b.fmul(dd, e.i2f(aux[8 * t + l])))


def _act_q45_k(e: _Emit, A: _Act, blk, five_bits: bool):
    """``_dot_q45_k_q8_k``: aux[l] = Σ_{p ≡ l mod 8} sc·a_p·y_p, ``_add_lanes``, then
    sumf −= (dmin · yd) * float32(Σ_g bsums[g]·m[g // 2]) (slot 8)."""
    b = e.b
    qs_at = 48 if five_bits else 16
    pairs = _k_scale_min(e, e.dwords(4, 3))  # (sc, m) of the 8 sub-blocks
    summs = [e.const(0)] * A.nt
    for t in range(A.nt):
        for c in range(4):
            summs[t] = b.add(summs[t], b.mul(b.add(A.bsum(t, 4 * c), A.bsum(t, 4 * c + 1)), pairs[2 * c][1]))
            summs[t] = b.add(summs[t], b.mul(b.add(A.bsum(t, 4 * c + 2), A.bsum(t, 4 * c + 3)), pairs[2 * c + 1][1]))
    sc_table = e.table([sc for sc, _ in pairs])

    def chunk(c, aux):
        dws = e.dwords(qs_at, 8, dyn=b.mul(c, e.const64(32)))
        qh = e.dwords(16, 8) if five_bits else None
        for high in (0, 1):
            sc = e.pick(sc_table, b.add(b.mul(c, e.const64(2)), e.const64(high)))
            for j4 in range(8):
                for k in range(4):
                    a = e.bits(dws[j4], 8 * k + 4 * high, 4)
                    if five_bits:
                        shift = b.trunc(b.add(b.mul(c, e.const64(2)), e.const64(8 * k + high)), _i32)
                        a = b.or_(a, b.shl(b.and_(b.lshr(qh[j4], e.splat(shift, _i32)), e.const(1)), e.const(4)))
                    p = 32 * high + 4 * j4 + k
                    w = b.mul(sc, a)
                    col = b.add(b.mul(c, e.const64(64)), e.const64(p))
                    for t in range(A.nt):
                        aux[8 * t + p % 8] = b.add(aux[8 * t + p % 8], b.mul(w, A.q(t, col)))
        return aux

    aux = _ir_loop(b, 4, [e.const(0)] * (8 * A.nt), chunk)
    _lanes8(e, A, blk, aux, 0, False)
    dmin = e.f16(e.dwords(0)[0], high=True)
    for t in range(A.nt):
        A.sub(t, 8, b.fmul(b.fmul(dmin, A.d(t, blk)), e.i2f(summs[t])))


def _act_q45_k_packed(e: _PackedEmit, A: _Act, blk, five_bits: bool):
    """``_act_q45_k`` from packed words, residue by residue: aux[l] over the 32 values ≡ l mod 8 (bytes
    l % 4 of the words 8c + (l + 8m) // 4 of chunk c, both nibbles), then that lane's sums[l] update —
    so only ``nt`` integer accumulators are live (the words are plain loads, re-read per residue)."""
    b = e.b
    qs_at = 48 if five_bits else 16
    pairs = _k_scale_min(e, e.dwords(4, 3))
    d = e.f16(e.dwords(0)[0], high=False)
    dd = [b.fmul(d, A.d(t, blk)) for t in range(A.nt)]
    for l in range(8):
        def chunk(c, aux, l=l):
            for high in (0, 1):
                for m in range(4):
                    l32 = l + 8 * m
                    dw = e.dwords(qs_at + 4 * (l32 // 4), dyn=b.mul(c, e.const64(32)))[0]
                    a = e.bits(dw, 8 * (l % 4) + 4 * high, 4)
                    if five_bits:
                        qh = e.dwords(16 + 4 * (l32 // 4))[0]
                        shift = b.trunc(b.add(b.mul(c, e.const64(2)), e.const64(8 * (l % 4) + high)), _i32)
                        a = b.or_(a, b.shl(b.and_(b.lshr(qh, e.splat(shift, _i32)), e.const(1)), e.const(4)))
                    col = b.add(b.mul(c, e.const64(64)), e.const64(32 * high + l32))
                    w = b.mul(e.pick(sc_table, b.add(b.mul(c, e.const64(2)), e.const64(high))), a)
                    aux = [b.add(aux[t], b.mul(w, A.q(t, col))) for t in range(A.nt)]
            return aux

        sc_table = e.table([sc for sc, _ in pairs])
        aux = _ir_loop(b, 4, [e.const(0)] * A.nt, chunk)
        for t in range(A.nt):
            A.add(t, l, b.fmul(dd[t], e.i2f(aux[t])))
    dmin = e.f16(e.dwords(0)[0], high=True)
    for t in range(A.nt):
        summs = e.const(0)
        for c in range(4):
            summs = b.add(summs, b.mul(b.add(A.bsum(t, 4 * c), A.bsum(t, 4 * c + 1)), pairs[2 * c][1]))
            summs = b.add(summs, b.mul(b.add(A.bsum(t, 4 * c + 2), A.bsum(t, 4 * c + 3)), pairs[2 * c + 1][1]))
        A.sub(t, 8, b.fmul(b.fmul(dmin, A.d(t, blk)), e.i2f(summs)))


def _act_q4_k(e, A, blk):
    (_act_q45_k_packed if isinstance(e, _PackedEmit) else _act_q45_k)(e, A, blk, False)


def _act_q5_k(e, A, blk):
    (_act_q45_k_packed if isinstance(e, _PackedEmit) else _act_q45_k)(e, A, blk, True)


def _act_q6_k(e: _Emit, A: _Act, blk):
    """``_dot_q6_k_q8_k``: aux[l] = Σ_{p ≡ l mod 8} sc[g]·(q_p − 32)·y_p (the codes of ``_q6_k_codes``),
    then ``_add_lanes``."""
    b = e.b
    sw = e.dwords(192, 4)
    sc = [e.sbyte(sw[g // 4], g % 4) for g in range(16)]
    aux = [e.const(0)] * (8 * A.nt)
    for p, g, q32 in _q6_k_codes(e):
        w = b.mul(sc[g], q32)
        for t in range(A.nt):
            aux[8 * t + p % 8] = b.add(aux[8 * t + p % 8], b.mul(w, A.q(t, p)))
    _lanes8(e, A, blk, aux, 206, True)  # d: bytes 208, 209


def _act_q8_0_codes(e: _PackedEmit, A: _Act, blk):
    """``_act_q8_0`` from the packed codes (``lanes._pack_q8_0``: column j's int8 codes side by side, d as
    the float32 of its f16 — the value ``f16_at`` gives)."""
    b = e.b
    d = b.bitcast(e.words(8)[0], e.vec(_f32))
    sumi = [e.const(0)] * A.nt
    for j in range(32):
        w = b.sext(e.codes(e.const64(j)), e.vec(_i32))
        sumi = [b.add(sumi[t], b.mul(w, A.q(t, j))) for t in range(A.nt)]
    for t in range(A.nt):
        A.add(t, 0, b.fmul(e.i2f(sumi[t]), b.fmul(d, A.d(t, blk))))


def _act_q6_k_codes(e: _PackedEmit, A: _Act, blk):
    """``_act_q6_k`` from the packed codes (``lanes._pack_q6_k``: the codes q − 32 as int8 column by column,
    the 16 int8 scales, d as float32), residue by residue (any column is one load here): aux[l] over the
    values p = l, l + 8, …, then that lane's sums[l] update, ``nt`` integer accumulators live."""
    b = e.b
    sw = e.words(64, 4)
    sc = [e.sbyte(sw[g // 4], g % 4) for g in range(16)]
    d = b.bitcast(e.words(68)[0], e.vec(_f32))
    dd = [b.fmul(d, A.d(t, blk)) for t in range(A.nt)]
    for l in range(8):
        aux = [e.const(0)] * A.nt
        for p in range(l, 256, 8):
            w = b.mul(sc[p // 16], b.sext(e.codes(e.const64(p)), e.vec(_i32)))
            aux = [b.add(aux[t], b.mul(w, A.q(t, p))) for t in range(A.nt)]
        for t in range(A.nt):
            A.add(t, l, b.fmul(dd[t], e.i2f(aux[t])))


ACT_EMITTERS = {_Q8_0: _act_q8_0, _MXFP4: _act_mxfp4, _Q4_K: _act_q4_k, _Q5_K: _act_q5_k, _Q6_K: _act_q6_k}
#: From :func:`kernels.lanes.pack.pack`'s layout: the same, except the column-major code layouts.
ACT_PACKED_EMITTERS = {**ACT_EMITTERS, _Q8_0: _act_q8_0_codes, _Q6_K: _act_q6_k_codes}


#: Activation rows per pass from raw rows: the integer accumulators of a pass stay in registers — one
#: per row for Q8_0 / MXFP4, eight (the residues mod 8) per row for the K-quants, which therefore take
#: one row per pass there. From packed words (plain loads) every type takes four: the K-quants go
#: residue by residue, re-reading the words.
ACT_ROWS = {_Q8_0: 4, _MXFP4: 4, _Q4_K: 1, _Q5_K: 1, _Q6_K: 1}


@intrinsic
def _act_block(typingctx, kind, isa, state, w, g, blk, yq, yd, yx, t0, nt):
    """Block ``blk`` of the LANES rows of group ``g`` (rows g·LANES …) of type ``kind`` against the
    quantized activation rows t0 … t0 + nt − 1, the state float32 [rows, slots, LANES] updated as the C
    code updates sumf / sums[] for that block. ``w``: the raw rows (uint8 [N, row bytes]), or
    :func:`kernels.lanes.pack.pack`'s words (uint32 [groups, blocks, slots, LANES]; the emitters of
    ``ACT_PACKED_EMITTERS`` read them) — told apart by the array's rank when the call is typed. yq int8
    [T, K], yd float32 [T, K / block], yx int16 [T, K / 16] (Q8_K's bsums; unused for Q8_0).
    ``kind``, ``isa``, ``nt``: literals."""
    if not all(isinstance(v, types.IntegerLiteral) for v in (kind, isa, nt)):
        return None
    packed = w.ndim == 4
    emitters = ACT_PACKED_EMITTERS if packed else ACT_EMITTERS
    if kind.literal_value not in emitters:
        return None
    k, level, NT = kind.literal_value, isa.literal_value, nt.literal_value
    emit, n = emitters[k], vector_lanes(level)
    n_slots = CODE_SLOTS[k] if packed and k in CODE_SLOTS else len(PACK_SLOTS.get(k, ()))
    sig = types.void(kind, isa, state, w, g, blk, yq, yd, yx, t0, nt)

    def codegen(context, b, signature, args):
        st_a, w_a, yq_a, yd_a, yx_a = (context.make_array(signature.args[i])(context, b, args[i]) for i in (2, 3, 6, 7, 8))
        g_v, blk_v, t0_v = args[4], args[5], args[9]
        if packed:
            first = b.mul(b.add(b.mul(g_v, b.extract_value(w_a.shape, 1)), blk_v), ir.Constant(_i64, n_slots * LANES))
            group_block = b.gep(b.bitcast(w_a.data, _i32.as_pointer()), [first])
            block_bytes = 4 * n_slots * LANES
            _prefetch(b, group_block, -(-PREFETCH_BYTES // block_bytes) * block_bytes, block_bytes)
        else:
            row_stride = b.extract_value(w_a.strides, 0)
            first = b.add(b.ptrtoint(w_a.data, _i64),
                          b.add(b.mul(b.mul(g_v, ir.Constant(_i64, LANES)), row_stride), b.mul(blk_v, ir.Constant(_i64, TYPE_SIZE[k]))))
        k0 = b.mul(blk_v, ir.Constant(_i64, BLOCK[k]))
        widths = [b.extract_value(a.shape, 1) for a in (yq_a, yd_a, yx_a)]
        yq_p = b.bitcast(yq_a.data, _i8.as_pointer())
        yx_p = b.bitcast(yx_a.data, _i16.as_pointer())

        def half(lane0):
            if packed:
                e = _PackedEmit(b, n, level, group_block, lane0, PACK_SLOTS.get(k, ()))
            else:
                e = _Emit(b, n, level, base=first)
                lane = b.add(e.splat(b.trunc(lane0, _i32), _i32), ir.Constant(e.vec(_i32), list(range(n))))
                e.offsets = b.mul(lane, e.splat(b.trunc(row_stride, _i32), _i32))
            emit(e, _Act(e, yq_p, yd_a.data, yx_p, *widths, t0_v, NT, k0, st_a.data, SLOTS[k], lane0), blk_v)

        _over_halves(b, n, half)
        return context.get_dummy_value()

    return sig, codegen


SLOTS_OF = np.zeros(64, dtype=np.int64)
for _k, _v in SLOTS.items():
    SLOTS_OF[_k] = _v


@jit()
def _act_final(kind, state, t, i):
    """The output of lane i, row t, from its state: sumf (Q8_0, MXFP4); sumf + sums[0] + … + sums[7]
    (Q4_K, Q5_K: sumf holds the dmin terms); 0 + sums[0] + … + sums[7] (Q6_K: slot 8 stays 0)."""
    if SLOTS_OF[kind] == 1:
        return state[t, 0, i]
    s = state[t, 8, i]
    for l in range(8):
        s += state[t, l, i]
    return s


@jit()
def _act_store(kind, state, out, g, t0, nt):
    for t in range(nt):
        for i in range(LANES):
            out[t0 + t, g * LANES + i] = _act_final(kind, state, t, i)


@jit()
def _act_group1(kind, isa, w, g, yq, yd, yx, out, state):
    """out[t, g·LANES + i] for every activation row t, one per pass (state: scratch [1, slots, LANES])."""
    n_blocks = yq.shape[1] // (256 if SLOTS_OF[kind] == 9 else 32)
    for t0 in range(yq.shape[0]):
        state[:] = 0.0
        for blk in range(n_blocks):
            _act_block(kind, isa, state, w, g, blk, yq, yd, yx, t0, 1)
        _act_store(kind, state, out, g, t0, 1)


@jit()
def _rows_per_pass(T, t0):
    """Activation rows of the next pass of ``_act_group4``: 4, 2 or 1 (3 rows as 2 + 1)."""
    nt = min(4, T - t0)
    return 2 if nt == 3 else nt


@jit()
def _act_group4(kind, isa, w, g, yq, yd, yx, out, state):
    """``_act_group1`` with up to four activation rows per pass (state [4, slots, LANES]); ``w`` raw rows
    or packed words (``_act_block``)."""
    T = yq.shape[0]
    t0 = 0
    while t0 < T:
        nt = _rows_per_pass(T, t0)
        state[:] = 0.0
        for blk in range(yq.shape[1] // (256 if SLOTS_OF[kind] == 9 else 32)):
            if nt == 1:
                _act_block(kind, isa, state, w, g, blk, yq, yd, yx, t0, 1)
            elif nt == 2:
                _act_block(kind, isa, state, w, g, blk, yq, yd, yx, t0, 2)
            else:
                _act_block(kind, isa, state, w, g, blk, yq, yd, yx, t0, 4)
        _act_store(kind, state, out, g, t0, nt)
        t0 += nt


@per_type
def _matmul_act_lanes(kind, isa=ISA, packed=False):
    variant = "_".join(([] if isa == ISA else [ISA_NAMES[isa]]) + (["packed"] if packed else []))
    if not packed and ACT_ROWS[kind] == 1:
        @jit(parallel=True, kind=kind, variant=variant)
        def _matmul_act_lanes(w, yq, yd, yx, out):
            """out[t, n] for the first LANES·(N // LANES) rows: llama.cpp's generic dot of each with activation t."""
            for g in prange(w.shape[0] // LANES):
                _act_group1(kind, isa, w, np.int64(g), yq, yd, yx, out, np.empty((1, SLOTS_OF[kind], LANES), dtype=np.float32))
    else:
        @jit(parallel=True, kind=kind, variant=variant)
        def _matmul_act_lanes(w, yq, yd, yx, out):
            """The same, four activation rows per pass; ``w`` raw rows, or with ``packed`` the packed words
            (uint32 [groups, blocks, slots, LANES])."""
            n_groups = w.shape[0] if packed else w.shape[0] // LANES
            for g in prange(n_groups):
                _act_group4(kind, isa, w, np.int64(g), yq, yd, yx, out, np.empty((4, SLOTS_OF[kind], LANES), dtype=np.float32))

    return _matmul_act_lanes


def matmul_act_lanes(w_bytes: np.ndarray, qtype, yq, yd, yx, out: np.ndarray, isa: int = ISA, packed=None) -> int:
    """Fill ``out[:, :n]`` (n = LANES·(N // LANES)) for a type of ``ACT_LANE_TYPES``; return n. yq/yd/yx:
    the activation rows quantized (actquant ``_q8_0_rows`` / ``_q8_k_rows``; yx the Q8_K bsums, or any
    int16 (T, ·) array for Q8_0 activations). ``packed``: the matrix's :class:`kernels.lanes.pack.PackedRows`,
    if it has one (its words are read instead of gathering ``w_bytes``: the same numbers)."""
    if packed is not None:
        _matmul_act_lanes(int(qtype), isa, True)(packed.words, yq, yd, yx, out)
        return packed.words.shape[0] * LANES
    n = w_bytes.shape[0] // LANES * LANES
    if n == 0 or w_bytes.strides[0] * LANES >= 1 << 31:
        return 0
    _matmul_act_lanes(int(qtype), isa, False)(w_bytes, yq, yd, yx, out)
    return n
