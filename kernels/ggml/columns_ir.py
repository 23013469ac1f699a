"""The K-quants' integer dots in the column layout (:mod:`kernels.ggml.columns_k`), 16 output columns at a time as
vector IR: the exact integers ggml's ``vec_dot`` keeps in its 8 int32 lanes (with their float step, ``acc[l] =
fma(y.d·d, float(sumi[l]), acc[l])``), or their total (the tiled kernel's ``s1``), or each 32-value group's
scaled dot (the AArch64 repacked kernels' ``I_s``: :mod:`kernels.ggml.columns_arm`). Q4_K repacked's ``ΣI`` with
``ΣM`` and their two FMAs (:func:`q4k_fma_def`, the definition) run a whole sub-tile per step in
:mod:`kernels.ggml.columns_q4k`.

The codes are laid out in quads, each tile's sub-tiles of 16 columns one after the other: the 4 values of lane
``l`` of 32-value group ``g`` of super-block ``blk`` (values ``256·blk + 32g + 4l … + 3``) of column ``c`` at
``q[(c // 16)·K/4 + 64·blk + 8l + g, 4·(c % 16) + i]`` of the tile (:func:`quad_row`: a lane's 8 groups side by
side, as :mod:`kernels.ggml.columns_k` forms a lane for every activation row; Q4_K's nibbles group by group, at
``8g + l``) (unsigned, Q4_K 0…15, Q5_K 0…31, Q6_K 0…63), so one 64-byte load holds 4 consecutive values of 16
columns, a sub-tile's super-block is 4 KiB read in address order, and
one ``vpdpbusd`` (AVX512-VNNI: unsigned codes times signed Q8 bytes, 4 products summed per int32) forms the 16
columns' 4-value dots against the activation's 4 bytes. A 4-value dot is below 2^15 in magnitude (63·128·4), so
the sub-block scale multiplies it with one ``pmaddwd`` (the dot's low int16 times the scale, its high half times
0), added in by ``vpdpwssd``. On AVX2 (:data:`LEVEL` 1) the same integers come from ggml's AVX2 pair:
``vpmaddubsw`` (unsigned codes times signed bytes, adjacent products summed to int16, saturating — never here:
codes <= 63, so a pair is at most 63·128·2 < 2^15 in magnitude) then ``vpmaddwd`` with ones, and the scale's
multiply by ``vpmaddwd`` alone, each on the two 256-bit halves of the 16 columns. Integers are exact: only which
integers are summed matters, never in what order or register; the float operations are ggml's, element by
element. Without AVX2 (or ``REFIMPL_KERNEL_ISA`` below it) the same integers come from target-independent IR
(:data:`LEVEL` 0; every level the host runs is tested against the definitions).
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml import mulmat_q8_ir
from kernels.ggml.simd import fma32

F32 = np.float32
#: The instructions of the integer steps — 2: AVX512-VNNI, 1: AVX2, 0: target-independent IR (the same integers:
#: tests/test_ggml_columns.py) — the numba target's level (:data:`kernels.ggml.mulmat_q8_ir.LEVEL`), capped by
#: flags.KERNEL_ISA.
LEVEL = mulmat_q8_ir.LEVEL if JIT_ENABLED else 0
TILE = 64  # output columns per tile, the work item the column kernels split (a multiple of 16: its sub-tiles)
#: The codes' software prefetch (:mod:`kernels.ggml.columns_k`'s lanes, :mod:`kernels.ggml.columns_q4k`'s gemm):
#: ``AHEAD_BLOCKS`` super-blocks of a sub-tile ahead, into the cache level ``AHEAD_LOCALITY`` names (2: L2,
#: ``prefetcht1``), a lane's or a chunk's lines at a time. real2's head (32768 × 2048, six-bit Q6_K), 1 thread, Zen 4,
#: 2026-12-07, alternating: 1 row 3.0 -> 2.2-2.6 ms, 4 rows 5.7-6.6 -> 4.1-4.5 (the whole super-block's 48 lines at
#: once, into L1: 1.5-2 × slower); an 8192 × 2048 Q4_K at 4 rows (was 2048 bytes ahead into L1) 1.02-1.05 -> 0.76-0.80.
AHEAD_BLOCKS = 4
AHEAD_LOCALITY = 2


@jit(inline=True)
def tile_span(c0, c1, t):
    """(first column, count) of the columns ``[c0, c1)`` in tile ``t``."""
    c = max(c0, TILE * t)
    return c, min(c1, TILE * t + TILE) - c


@jit()
def _s8(u):
    """A stored uint8 scale byte as the int8 it holds (Q6_K)."""
    v = np.int32(u)
    return v - 256 * (v >> 7)


@jit()
def quad_row(blk, g, lane, form):
    """The quad row of a sub-tile holding lane ``lane`` of group ``g`` of super-block ``blk`` (module docstring):
    lane by lane for the byte codes (``form`` 0, 1), group by group for Q4_K's nibbles (2, two quad rows a byte)."""
    return 64 * blk + (8 * g + lane if form == 2 else 8 * lane + g)


@jit()
def kq_def(v, oj, nj, q, blk, g0, ng, c, y, sc, bs, form, total):
    """The definition. Lanes (``total`` 0, all 8 groups): ``v[l, oj + j]`` = lane ``l`` of super-block ``blk``'s
    integer dot for column ``c + j`` (``j < nj``): ``Σ_g scale(g, l) · Σ_{i<4} w(256·blk + 32g + 4l + i)·y[…]``,
    the scale the sub-block's (``form`` 1: Q6_K's int8 scale per 16 values, row ``16·blk + 2g + l // 4``; else the
    6-bit scale per 32, row ``8·blk + g``), and for Q6_K less ``32·(bs[2l]·sc[2l] + bs[2l+1]·sc[2l+1])`` of this
    super-block (``q8sclsub``). ``total`` 1: ``v[0, oj + j]`` = the sum of those lanes over groups ``g0 … g0 + ng
    - 1`` (Q6_K: all 8, with the whole ``32·Σ bs·sc``). The codes: a byte each (``form`` 0: Q5_K; 1: Q6_K), or
    Q4_K's two to a byte (``form`` 2: quad rows ``2r`` and ``2r + 1`` in the low and high nibbles of row ``r``)."""
    rows = q.shape[0] // 4  # rows of a sub-tile of 16 columns: K/4 quads, K/8 for Q4_K's nibbles (``form`` 2)
    for j in range(nj):
        cj = c + j
        for lane in range(8):
            s = np.int64(0)
            for g in range(g0, g0 + ng):
                qr = 64 * blk + 8 * g + lane  # the values' quad
                sr = quad_row(blk, g, lane, form)  # where its codes are
                dot = np.int64(0)
                for i in range(4):
                    if form == 2:  # quad rows 2r (low nibbles) and 2r + 1 (high nibbles) in one row
                        w = (np.int64(q[(cj // 16) * rows + sr // 2, 4 * (cj % 16) + i]) & 255) >> (4 * (sr % 2)) & 15
                    else:
                        w = np.int64(q[(cj // 16) * rows + sr, 4 * (cj % 16) + i])
                    dot += w * np.int64(y[4 * qr + i])
                srow = 16 * blk + 2 * g + lane // 4 if form == 1 else 8 * blk + g
                s += np.int64(_s8(sc[srow, cj])) * dot
            if form == 1:
                for h in range(2):
                    s -= 32 * np.int64(bs[16 * blk + 2 * lane + h]) * np.int64(_s8(sc[16 * blk + 2 * lane + h, cj]))
            if total:
                v[0, oj + j] = (0 if lane == 0 else v[0, oj + j]) + s
            else:
                v[lane, oj + j] = s


@jit()
def kq_groups_def(v, q, blk, c, nj, y, sc, form):
    """Per 32-value group (``form`` 0 Q5_K, 2 Q4_K's nibbles): ``v[g, j]`` = its sub-block scale times its exact dot
    with ``y`` for column ``c + j`` of super-block ``blk`` — AArch64's ``I_s`` (:mod:`kernels.ggml.columns_arm`), from
    :func:`kq_def`'s total of one group."""
    t = np.empty((8, 16), np.int32)
    no_bs = np.empty(0, np.int64)  # (the bsums only Q6_K's total reads)
    for g in range(8):
        kq_def(t, 0, nj, q, blk, g, 1, c, y, sc, no_bs, form, 1)
        for j in range(nj):
            v[g, j] = t[0, j]


@jit()
def lanes_fma_def(acc, o, v, nj, d, blk, c, yd):
    """vec_dot's float step of super-block ``blk`` for columns ``c … c + nj - 1`` (``v[l, j]`` their integer lanes):
    ``acc[l, o + j] = fma(y.d · d[blk, c + j], float(v[l, j]), acc[l, o + j])`` (``_mm256_fmadd_ps``)."""
    for j in range(nj):
        db = yd * d[blk, c + j]  # y.d * GGML_CPU_FP16_TO_FP32(x.d)
        for lane in range(8):
            acc[lane, o + j] = fma32(db, F32(v[lane, j]), acc[lane, o + j])


@jit()
def q4k_fma_def(acc, o, v, q, blk, step, c, nc, y, sc, ys, d, yd, mn, dmin):
    """Q4_K repacked (``gemv/gemm_q4_K_8x8_q8_K``), super-block ``blk`` for columns ``c … c + nc - 1``, ``step``
    groups at a time (8: the gemv, per super-block; 2: the gemm, per 64 values): ``ΣI`` (:func:`kq_def`'s total,
    into ``v`` int32 scratch) and ``ΣM = Σ mn·ys`` (``ys`` the sums per 32 values), ``acc[0, o + j] = fma(float(ΣI),
    d·y.d, …)``, ``acc[1, o + j] = fma(float(ΣM), dmin·y.d, …)``."""
    for g0 in range(0, 8, step):
        kq_def(v, 0, nc, q, blk, g0, step, c, y, sc, ys, 2, True)
        for j in range(nc):
            mi = np.int32(0)
            for s in range(8 * blk + g0, 8 * blk + g0 + step):
                mi += np.int32(mn[s, c + j]) * np.int32(ys[s])
            acc[0, o + j] = fma32(F32(v[0, j]), F32(d[blk, c + j] * yd), acc[0, o + j])
            acc[1, o + j] = fma32(F32(mi), F32(dmin[blk, c + j] * yd), acc[1, o + j])


@jit()
def first_rows(first):
    """(order, n): the indices ``0 … R-1`` of ``first`` (R,) bool, those where it holds first, then the others,
    each part in index order; ``n`` how many hold — the rows a sub-tile step takes in one kind of pass before the
    rest (columns_q4k: the gemm's; columns_b32: those free of the sign trick)."""
    R = first.shape[0]
    order = np.empty(R, np.int64)
    n = 0
    for i in range(R):
        if first[i]:
            order[n] = i
            n += 1
    m = n
    for i in range(R):
        if not first[i]:
            order[m] = i
            m += 1
    return order, n


if JIT_ENABLED:
    from llvmlite import ir
    from numba import literally, types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _i8, _i16, _i32, _i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    _V16, _B64, _W32 = ir.VectorType(_i32, 16), ir.VectorType(_i8, 64), ir.VectorType(_i16, 32)
    _F16 = ir.VectorType(ir.FloatType(), 16)
    _V8, _B32, _W16 = ir.VectorType(_i32, 8), ir.VectorType(_i8, 32), ir.VectorType(_i16, 16)  # AVX2's 256 bits

    def _splat(b, x, vt=_V16):
        return b.shuffle_vector(b.insert_element(ir.Constant(vt, None), x, ir.Constant(_i32, 0)),
                                ir.Constant(vt, None), ir.Constant(_V16, [0] * 16))

    def _x86(b, name, ret, *args):
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(ret, [a.type for a in args]), name)
        return b.call(fn, list(args))

    def _halves(b, x, vt):  # the two 256-bit halves of a 512-bit vector, as ``vt``
        w = b.bitcast(x, _V16)
        return [b.bitcast(b.shuffle_vector(w, w, ir.Constant(_V8, list(range(8 * h, 8 * h + 8)))), vt) for h in (0, 1)]

    def _join(b, lo, hi):  # <8 x i32> halves -> <16 x i32>
        return b.shuffle_vector(lo, hi, ir.Constant(_V16, list(range(16))))

    def _madd(b, x, y):  # AVX2's vpmaddwd on <16 x i16> halves
        return _x86(b, "llvm.x86.avx2.pmadd.wd", _V8, x, y)

    def _dpbusd(b, level, acc, codes, y4):
        """``acc + Σ_{i<4} codes.byte[4j + i] (unsigned) · y4.byte[4j + i] (signed)`` per int32 ``j``: ``vpdpbusd``
        (``level`` 2); per 256-bit half ``vpmaddubsw`` then ``vpmaddwd`` with ones (1; no int16 pair saturates:
        codes <= 63, |pair| <= 63·128·2 < 2^15); target-independent IR (0)."""
        if level == 2:
            return _x86(b, "llvm.x86.avx512.vpdpbusd.512", _V16, acc, codes, y4)
        if level == 1:
            ones = ir.Constant(_W16, [1] * 16)
            dots = [_madd(b, _x86(b, "llvm.x86.avx2.pmadd.ub.sw", _W16, u, w), ones)
                    for u, w in zip(_halves(b, codes, _B32), _halves(b, y4, _B32))]
            return b.add(acc, _join(b, *dots))
        w = ir.VectorType(_i32, 64)
        p = b.mul(b.zext(b.bitcast(codes, _B64), w), b.sext(b.bitcast(y4, _B64), w))
        for i in range(4):
            acc = b.add(acc, b.shuffle_vector(p, p, ir.Constant(_V16, list(range(i, 64, 4)))))
        return acc

    def _scaled(b, level, acc, dot, scale):
        """``acc + dot · scale`` per int32 (``|dot| < 2^15``; ``scale`` the sign-extended byte): ``pmaddwd`` of the
        dot's (low int16, high int16) and (scale, 0) — ``vpdpwssd`` (``level`` 2), on the halves (1) —, else a
        multiply (0)."""
        if not level:
            return b.add(acc, b.mul(dot, scale))
        lo = b.and_(scale, ir.Constant(_V16, [0xFFFF] * 16))  # (scale, 0) int16 pairs
        if level == 1:
            return b.add(acc, _join(b, *(_madd(b, u, w) for u, w in zip(_halves(b, dot, _W16), _halves(b, lo, _W16)))))
        return b.add(acc, _x86(b, "llvm.x86.avx512.pmaddw.d.512", _V16, b.bitcast(dot, _W32), b.bitcast(lo, _W32)))

    def _k(n):
        return ir.Constant(_i64, n)

    class _Args:
        """An intrinsic's codegen view of its arguments: the arrays at positions ``arrays`` (:meth:`item`: an
        element's pointer, :meth:`at`: as a pointer to ``t``) and the <16 x float> FMA."""

        def __init__(self, context, b, signature, args, arrays):
            self.context, self.b, self.ts = context, b, signature.args
            self.arr = {i: context.make_array(self.ts[i])(context, b, args[i]) for i in arrays}
            self.fma = cgutils.get_or_insert_function(b.module, ir.FunctionType(_F16, [_F16] * 3), "llvm.fma.v16f32")

        def item(self, i, idx):
            return cgutils.get_item_pointer(self.context, self.b, self.ts[i], self.arr[i], idx)

        def at(self, i, idx, t):
            return self.b.bitcast(self.item(i, idx), t.as_pointer())

    def _dot_scaled(b, level, acc, codes, y4, scale):
        """``acc + scale · (the 4-value dots of codes and y4)`` per int32 (codes unsigned <= 63, ``scale`` the
        sign-extended byte): on AVX2 (``level`` 1) ``vpmaddubsw``'s pair sums times the (scale, scale) int16 pair by one
        ``vpmaddwd`` — ggml's own AVX2 order of work, no ``vpmaddwd`` with ones (a pair is at most 2·63·128 < 2^15, a
        product with the scale 2^21); else :func:`_scaled` of :func:`_dpbusd`. The same integer either way."""
        if level != 1:
            return _scaled(b, level, acc, _dpbusd(b, level, ir.Constant(_V16, [0] * 16), codes, y4), scale)
        pair = b.or_(b.and_(scale, ir.Constant(_V16, [0xFFFF] * 16)), b.shl(scale, ir.Constant(_V16, [16] * 16)))
        dots = [_madd(b, _x86(b, "llvm.x86.avx2.pmadd.ub.sw", _W16, u, w), s)
                for u, w, s in zip(_halves(b, codes, _B32), _halves(b, y4, _B32), _halves(b, pair, _W16))]
        return b.add(acc, _join(b, *dots))

    def _sub_tiles(b, n, sub_rows, o, qr0, c, sub_tile):
        """Emit ``sub_tile(o, qr0, c)`` for ``n`` consecutive sub-tiles from the first one's accumulator offset ``o``,
        quad row ``qr0`` and column ``c`` on, each the next 16 accumulators, ``sub_rows`` quad rows and 16 columns (an
        intrinsic taking a tile's whole sub-tiles in one call: :mod:`kernels.ggml.columns_q4k`,
        :mod:`kernels.ggml.columns_k`)."""
        with cgutils.for_range(b, n) as loop:
            s16 = b.mul(loop.index, _k(16))
            sub_tile(b.add(o, s16), b.add(qr0, b.mul(loop.index, sub_rows)), b.add(c, s16))

    @jit()
    def _sub_tile_row(q, c):
        """The first quad row of column ``c``'s sub-tile in a tile ``q`` (K, 64) (its rows of 64 bytes, as the IR
        reads them)."""
        if q.shape[1] != 64:
            raise ValueError("column layout: a tile of quads has rows of 64 bytes")
        return (c // 16) * (q.shape[0] // 4)

    def _lit(x):
        return x.literal_value if isinstance(x, types.IntegerLiteral) else None

    @intrinsic
    def _kq_ir(typingctx, v, oj, q, qr0, blk, g0, c, y, sc, bs, d, yd, form, total, ng, level):
        """:func:`kq_def` for the 16 columns of a sub-tile (``c`` a multiple of 16, its quads from row ``qr0`` of ``q``
        int8 (K, 16·4)), ``y`` int8 (K,), ``sc`` uint8, ``bs`` int64 (K/16,), all C-contiguous; ``form``,
        ``total``, ``ng``, ``level`` literals. ``total`` 2: the lanes go through :func:`lanes_fma_def`'s float step
        into ``v`` float32 (8, ≥ oj + 16) (``d``, ``yd``); else ``v`` int32 (8, ≥ oj + 16) takes the integers (4: each group's, :func:`kq_groups_def`)."""
        flags = [_lit(a) for a in (form, total, ng, level)]
        arrays = (v, q, y, sc, bs, d)
        if None in flags or not (all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)
                                 and q.dtype == y.dtype == types.int8):
            return None
        fm, tot, n_g, lv = flags
        p16, nib = fm == 1, fm == 2
        if v.dtype != (types.float32 if tot == 2 else types.int32):
            return None
        i64 = types.int64
        sig = types.void(v, i64, q, i64, i64, i64, i64, y, sc, bs, d, types.float32, form, total, ng, level)

        def codegen(context, b, signature, args):
            ts = signature.args
            arr = {i: context.make_array(ts[i])(context, b, args[i]) for i in (0, 2, 7, 8, 9, 10)}
            oj, qr0, blk, g0, c = args[1], args[3], args[4], args[5], args[6]

            def at(i, idx, vt):
                return b.bitcast(cgutils.get_item_pointer(context, b, ts[i], arr[i], idx), vt.as_pointer())

            def k(n):
                return ir.Constant(_i64, n)

            def scale(row):  # the 16 columns' scale bytes of sub-block row ``row``, sign-extended
                return b.sext(b.load(at(8, [row, c], ir.VectorType(_i8, 16)), align=1), _V16)

            nsc = 16 if p16 else 8
            base = b.mul(blk, k(nsc))
            zero = ir.Constant(_V16, [0] * 16)

            qr = b.add(b.mul(blk, k(64)), b.mul(g0, k(8)))  # the first values' quad this call reads
            # its codes' row (quad_row): Q4_K two quad rows to a row of bytes, group by group; else lane by lane
            qrow = b.ashr(qr, k(1)) if nib else b.add(b.mul(blk, k(64)), g0)
            q0 = cgutils.get_item_pointer(context, b, ts[2], arr[2], [b.add(qr0, qrow), k(0)])
            y0 = b.bitcast(cgutils.get_item_pointer(context, b, ts[7], arr[7], [b.mul(qr, k(4))]), _i8.as_pointer())

            def operands(g, lane):  # lane ``lane`` of group ``g0 + g``: its codes (rows of 64 bytes), its 4 Q8 bytes splat
                r = 8 * g + lane
                codes = b.load(b.bitcast(b.gep(q0, [k(64 * (r // 2 if nib else 8 * lane + g))]), _V16.as_pointer()),
                               align=1)
                if nib:  # the low nibbles for even rows, the high ones for odd
                    cb = b.bitcast(codes, _B64)
                    cb = b.lshr(cb, ir.Constant(_B64, [4] * 64)) if r % 2 else cb
                    codes = b.bitcast(b.and_(cb, ir.Constant(_B64, [15] * 64)), _V16)
                y4 = b.load(b.bitcast(b.gep(y0, [k(4 * (8 * g + lane))]), _i32.as_pointer()), align=1)
                return codes, _splat(b, y4)

            def quad(g, lane, acc):  # acc + the 4-value dots of lane ``lane`` of group ``g0 + g``
                return _dpbusd(b, lv, acc, *operands(g, lane))

            def srow(g, lane):
                return b.add(base, k(2 * g + lane // 4) if p16 else b.add(g0, k(g)))

            def q8sclsub(lanes):  # Σ_{l in lanes} 32·(bs[2l]·sc[2l] + bs[2l+1]·sc[2l+1]) of this super-block
                s = zero
                for l2 in (2 * lane + h for lane in lanes for h in (0, 1)):
                    row = b.add(base, k(l2))
                    bsv = b.trunc(b.load(cgutils.get_item_pointer(context, b, ts[9], arr[9], [row])), _i32)
                    s = b.add(s, b.mul(scale(row), _splat(b, bsv)))
                return b.shl(s, ir.Constant(_V16, [5] * 16))

            fma = cgutils.get_or_insert_function(b.module, ir.FunctionType(_F16, [_F16] * 3), "llvm.fma.v16f32")
            ydv = _splat(b, args[11], _F16)
            def total(gs):  # Σ over groups gs of scale · (the chained dots of its lanes), the codes in address order
                acc = zero
                for lanes in ((range(8),) if nib or not p16 else (range(4), range(4, 8))):
                    dots = [zero] * len(gs)  # per group: the lanes sharing one scale
                    order = [(gi, lane) for gi in range(len(gs)) for lane in lanes]
                    for gi, lane in order if nib else sorted(order, key=lambda t: (t[1], t[0])):  # quad_row's order
                        dots[gi] = quad(gs[gi], lane, dots[gi])
                    for gi, dot in enumerate(dots):
                        acc = b.add(acc, b.mul(dot, scale(srow(gs[gi], lanes[0]))))
                return acc

            if tot == 4:  # per group: v[g, oj + j] = scale_g · (the dots of its 32 values) (Q4_K's, Q5_K's I_s)
                for g in range(8):
                    b.store(total([g]), at(0, [k(g), oj], _V16), align=4)
                return context.get_dummy_value()
            if tot == 1:
                acc = total(range(n_g))
                b.store(b.sub(acc, q8sclsub(range(8))) if p16 else acc, at(0, [k(0), oj], _V16), align=4)
                return context.get_dummy_value()
            db = b.fmul(ydv, b.load(at(10, [blk, c], _F16), align=4))  # y.d * d
            accs = [b.sub(zero, q8sclsub([lane])) if p16 else zero for lane in range(8)]
            for g in range(8):  # the codes in address order
                scales = [scale(srow(g, 0)), scale(srow(g, 4))] if p16 else [scale(srow(g, 0))] * 2
                for lane in range(8):
                    accs[lane] = _dot_scaled(b, lv, accs[lane], *operands(g, lane), scales[lane // 4])
            for lane, acc in enumerate(accs):
                if tot == 2:  # acc_l = fma(y.d·d, float(sumi_l), acc_l)
                    pf = at(0, [k(lane), oj], _F16)
                    b.store(b.call(fma, [db, b.sitofp(acc, _F16), b.load(pf, align=4)]), pf, align=4)
                else:
                    b.store(acc, at(0, [k(lane), oj], _V16), align=4)
            return context.get_dummy_value()

        return sig, codegen

    @jit()
    def kq16(v, oj, q, blk, g0, ng, c, y, sc, bs, form, total, level):
        """:func:`kq_def` for the 16 columns ``c … c + 15`` of a sub-tile (``c`` a multiple of 16) as vector IR
        (``level`` :data:`LEVEL`). The combinations the kernels use: lanes (8 groups), totals of 8 groups."""
        literally(level)
        qr0 = _sub_tile_row(q, c)
        if form == 1:  # the literals the IR is built for, one branch each
            if total:
                _kq_ir(v, oj, q, qr0, blk, g0, c, y, sc, bs, bs, F32(0), 1, 1, 8, level)
            else:
                _kq_ir(v, oj, q, qr0, blk, g0, c, y, sc, bs, bs, F32(0), 1, 0, 8, level)
        elif form == 2:
            if total:
                _kq_ir(v, oj, q, qr0, blk, g0, c, y, sc, bs, bs, F32(0), 2, 1, 8, level)
            else:
                _kq_ir(v, oj, q, qr0, blk, g0, c, y, sc, bs, bs, F32(0), 2, 0, 8, level)
        elif total:
            _kq_ir(v, oj, q, qr0, blk, g0, c, y, sc, bs, bs, F32(0), 0, 1, 8, level)
        else:
            _kq_ir(v, oj, q, qr0, blk, g0, c, y, sc, bs, bs, F32(0), 0, 0, 8, level)

    @jit()
    def kq16_groups(v, q, blk, c, y, sc, form, level):
        """:func:`kq_groups_def` for the 16 columns of a sub-tile as vector IR (``level`` as :func:`kq16`)."""
        literally(level)
        qr0 = _sub_tile_row(q, c)
        bs = np.empty(0, np.int64)
        if form == 2:
            _kq_ir(v, 0, q, qr0, blk, 0, c, y, sc, bs, bs, F32(0), 2, 4, 8, level)
        else:
            _kq_ir(v, 0, q, qr0, blk, 0, c, y, sc, bs, bs, F32(0), 0, 4, 8, level)

    @jit()
    def kq16_fma(acc, o, q, blk, c, y, sc, bs, d, yd, form, level):
        """:func:`kq_def`'s lanes for the 16 columns of a sub-tile through :func:`lanes_fma_def` into ``acc[:, o:o +
        16]`` float32, as vector IR (``level`` as :func:`kq16`)."""
        literally(level)
        qr0 = _sub_tile_row(q, c)
        if form == 1:
            _kq_ir(acc, o, q, qr0, blk, 0, c, y, sc, bs, d, F32(yd), 1, 2, 8, level)
        elif form == 2:
            _kq_ir(acc, o, q, qr0, blk, 0, c, y, sc, bs, d, F32(yd), 2, 2, 8, level)
        else:
            _kq_ir(acc, o, q, qr0, blk, 0, c, y, sc, bs, d, F32(yd), 0, 2, 8, level)

else:

    def kq16_groups(v, q, blk, c, y, sc, form, level):
        kq_groups_def(v, q, blk, c, 16, y, sc, form)

    def kq16(v, oj, q, blk, g0, ng, c, y, sc, bs, form, total, level):
        kq_def(v, oj, 16, q, blk, g0, ng, c, y, sc, bs, form, total)

    def kq16_fma(acc, o, q, blk, c, y, sc, bs, d, yd, form, level):
        w = np.empty((8, 16), np.int32)
        kq_def(w, 0, 16, q, blk, 0, 8, c, y, sc, bs, form, 0)
        lanes_fma_def(acc, o, w, 16, d, blk, c, yd)


@jit()
def kq(v, q, blk, g0, ng, c, nc, y, sc, bs, form, total):
    """:func:`kq_def` for columns ``c … c + nc - 1`` of one sub-tile into ``v[:, :nc]``: a whole sub-tile as vector
    IR (:func:`kq16`), else by the definition."""
    if nc == 16:
        kq16(v, 0, q, blk, g0, ng, c, y, sc, bs, form, total, LEVEL)
    else:
        kq_def(v, 0, nc, q, blk, g0, ng, c, y, sc, bs, form, total)


@jit()
def kq_fma(acc, o, v, q, blk, c, nc, y, sc, bs, d, yd, form):
    """vec_dot's super-block ``blk`` for columns ``c … c + nc - 1`` of one sub-tile: the lanes (:func:`kq_def`)
    through :func:`lanes_fma_def` into ``acc[:, o:o + nc]`` — a whole sub-tile in one vector IR step, else by the
    definitions (``v`` int32 (8, ≥ nc) scratch)."""
    if nc == 16:
        kq16_fma(acc, o, q, blk, c, y, sc, bs, d, yd, form, LEVEL)
    else:
        kq_def(v, 0, nc, q, blk, 0, 8, c, y, sc, bs, form, 0)
        lanes_fma_def(acc, o, v, nc, d, blk, c, yd)


@jit()
def kq_groups(v, q, blk, c, nc, y, sc, form):
    """:func:`kq_groups_def` into ``v[:, :nc]`` — a whole sub-tile as vector IR (:func:`kq16_groups`), else by the
    definition."""
    if nc == 16:
        kq16_groups(v, q, blk, c, y, sc, form, LEVEL)
    else:
        kq_groups_def(v, q, blk, c, nc, y, sc, form)


__all__ = ["LEVEL", "first_rows", "kq", "kq16", "kq16_fma", "kq16_groups", "kq_def", "kq_fma", "kq_groups", "kq_groups_def",
           "lanes_fma_def", "q4k_fma_def", "quad_row"]
