"""The integer dots of Q4_K and Q6_K super-blocks read straight from the stored rows, as vector IR — the weights
llama.cpp keeps in their GGUF layout at run time: the routed experts of a model whose column layout
(:mod:`kernels.ggml.columns`) does not fit in memory, multiplied from the memory map or the streamer's slices.

What they give per super-block, all from exact integers:

* **lanes** — ``arch/x86/quants.c``'s ``vec_dot`` keeps a super-block's integer dot in 8 int32 lanes, lane ``l``
  summing bytes ``4l … 4l+3`` of each of the 8 32-value loads (``maddubs`` + ``madd_epi16`` by the sub-block
  scale): :mod:`kernels.ggml.mulmat_k`'s ``vec_dot`` takes them lane by lane into its float lanes (Q6_K's whole
  step, ``q8sclsub`` and the 8-lane FMA included, is :func:`q6_k_fma_def`);
* **total** — the sum of those lanes: ``Σ_s scale_s · Σ w·q8`` over the sub-blocks read (the tiled kernel's ``s1``);
* **block** — Q4_K's ``ΣI`` and ``ΣM`` per 64 values with the scales and mins decoded from the bytes
  (:func:`q4_k_block_def`): the repacked gemv and gemm of :mod:`kernels.ggml.repack_k`.

A 32-value load's codes (Q4_K: the low or high nibbles of 32 bytes, 0…15; Q6_K: 4 low bits and 2 high bits,
0…63) times 32 Q8 bytes, 4 products to an int32, is one ``vpdpbusd`` (``LEVEL`` 2, AVX512-VNNI: unsigned codes
times signed bytes) — exactly the lanes above —, or ggml's own AVX2 pair ``vpmaddubsw`` + ``vpmaddwd`` with ones
(``LEVEL`` 1; no int16 pair saturates: 63·128·2 < 2^15), or target-independent IR (``LEVEL`` 0). The scale
multiplies the lane (``|dot| ≤ 63·128·4``, a scale ``|s| ≤ 128``: no int32 sum of a super-block wraps). Integers
are exact: which integers are summed is ggml's, the order and register never matter; every level gives the same
bits (tests/test_ggml_rows_k.py). The float steps stay with the callers, in ggml's order (but Q6_K's FMA).

The ``*_def`` functions are the definitions (and, with ``NUMBA_DISABLE_JIT=1``, the path). The level is fixed per process (:data:`LEVEL`, as :mod:`kernels.ggml.mulmat_q8_ir`'s).
"""

from __future__ import annotations

import functools

import numpy as np

from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml import mulmat_q8_ir

#: The instructions of the integer steps (2: AVX512-VNNI, 1: AVX2, 0: target-independent IR): the numba target's,
#: capped by flags.KERNEL_ISA (:data:`kernels.ggml.mulmat_q8_ir.LEVEL`).
LEVEL = mulmat_q8_ir.LEVEL if JIT_ENABLED else 0


def q4_k_lanes_def(w, wo, y, yo, sc, so, n):
    """The 8 int32 lanes of ``n`` 64-value chunks of a Q4_K super-block: chunk ``c`` is the 32 bytes
    ``w[wo + 32c …]`` — low nibbles values ``64c + l`` (sub-block ``2c``), high nibbles ``64c + 32 + l`` (sub-block
    ``2c + 1``) —, ``y[yo + 64c …]`` their Q8 bytes, ``sc[so + 2c]``, ``sc[so + 2c + 1]`` the sub-blocks' scales.
    Lane ``l`` sums ``scale · code · y`` over bytes ``4l … 4l+3`` of each 32-value load. ``w`` uint8, ``y`` int8,
    ``sc`` int32, all 1-D; returns a tuple of 8 Python ints."""
    v = [0] * 8
    for c in range(n):
        for h in range(2):  # the low nibbles, then the high ones
            s = int(sc[so + 2 * c + h])
            for k in range(32):
                code = (int(w[wo + 32 * c + k]) >> (4 * h)) & 15
                v[k // 4] += s * code * int(y[yo + 64 * c + 32 * h + k])
    return tuple(v)


def q4_k_block_def(w, wo, y, yo, ys, so):
    """The exact integers of the Q4_K super-block at ``w[wo …]`` (144 bytes: fp16 d, dmin, ``scales[12]``,
    ``qs[128]``) against its 256 Q8 bytes ``y[yo …]`` and their sums per 32 values ``ys[so …]`` (8), per 64-value
    chunk ``c``: ``I_c = sc[2c]·Σ lo·y + sc[2c+1]·Σ hi·y`` and ``M_c = mn[2c]·ys[2c] + mn[2c+1]·ys[2c+1]`` — the
    6-bit scales and mins of ``get_scale_min_k4`` decoded from the bytes. Returns ``(I_0 … I_3, M_0 … M_3)``."""
    sc, mn = [0] * 8, [0] * 8
    q = [int(v) for v in w[wo + 4:wo + 16]]
    for j in range(8):
        if j < 4:
            sc[j], mn[j] = q[j] & 63, q[j + 4] & 63
        else:
            sc[j], mn[j] = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)
    lanes = [sum(q4_k_lanes_def(w, wo + 16 + 32 * c, y, yo + 64 * c, np.array(sc, np.int32), 2 * c, 1)) for c in range(4)]
    mins = [mn[2 * c] * int(ys[so + 2 * c]) + mn[2 * c + 1] * int(ys[so + 2 * c + 1]) for c in range(4)]
    return tuple(lanes + mins)


def q6_k_lanes_def(w, wo, y, yo, sc, so):
    """The 8 int32 lanes of the Q6_K super-block at ``w[wo …]`` (``ql[128]``, ``qh[64]``; value ``128h + 32j + l``
    of half ``h`` is ``ql[64h + l + 32(j % 2)]``'s nibble ``j // 2`` with ``qh[32h + l]``'s bits ``2j, 2j+1`` above
    it, unsigned 0…63): lane ``l`` sums ``scale · code · y`` over bytes ``4l … 4l+3`` of each 32-value load ``g``,
    the scale ``sc[so + 2g]`` for lanes 0–3 and ``sc[so + 2g + 1]`` for lanes 4–7 (a scale per 16 values), ``y[yo
    …]`` the super-block's 256 Q8 bytes. Before ggml's ``q8sclsub`` (the codes' bias of 32: the caller's)."""
    v = [0] * 8
    for g in range(8):
        h, j = divmod(g, 4)
        for k in range(32):
            low = (int(w[wo + 64 * h + k + 32 * (j % 2)]) >> (4 * (j // 2))) & 15
            high = (int(w[wo + 128 + 32 * h + k]) >> (2 * j)) & 3
            s = int(sc[so + 2 * g + k // 16])
            v[k // 4] += s * (low | high << 4) * int(y[yo + 32 * g + k])
    return tuple(v)


def q6_k_fma_def(w, wo, y, yo, bs, bo, db, acc):
    """vec_dot's step of the Q6_K super-block at ``w[wo …]`` (``ql``, ``qh``, ``scales[16]`` int8, fp16 d): lane
    ``l`` of :func:`q6_k_lanes_def` with the block's own scales, less ``q8sclsub`` = ``32·(bs[bo + 2l]·sc[2l] + bs[bo
    + 2l + 1]·sc[2l + 1])`` (``bs`` the Q8_K bsums), then ``acc[l] = fma(db, float(sumi_l), acc[l])``
    (``_mm256_fmadd_ps``; ``db`` = ``y.d · d``, ``acc`` float32 (8,))."""
    from kernels.ggml.simd import fma32

    sc = np.array([int(v) - 256 * (int(v) >> 7) for v in w[wo + 192:wo + 208]], np.int32)
    lanes = q6_k_lanes_def(w, wo, y, yo, sc, 0)
    for lane in range(8):
        s = lanes[lane] - 32 * (int(bs[bo + 2 * lane]) * int(sc[2 * lane]) + int(bs[bo + 2 * lane + 1]) * int(sc[2 * lane + 1]))
        acc[lane] = fma32(np.float32(db), np.float32(s), acc[lane])


if JIT_ENABLED:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _i8, _i16, _i32, _i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    _B32, _W16, _V8 = ir.VectorType(_i8, 32), ir.VectorType(_i16, 16), ir.VectorType(_i32, 8)

    def _call(b, name, ret, *args):
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(ret, [a.type for a in args]), name)
        return b.call(fn, list(args))

    def _udot(b, level, codes, ys):
        """<8 x i32>: lane ``l`` = ``Σ_{i<4} codes[4l + i] · ys[4l + i]`` (codes unsigned ≤ 63, ys signed), two
        <32 x i8>: ``vpdpbusd`` (``level`` 2), ``vpmaddubsw`` + ``vpmaddwd`` with ones (1), plain IR (0)."""
        if level == 2:
            zero = ir.Constant(_V8, [0] * 8)
            return _call(b, "llvm.x86.avx512.vpdpbusd.256", _V8, zero, b.bitcast(codes, _V8), b.bitcast(ys, _V8))
        if level == 1:
            pairs = _call(b, "llvm.x86.avx2.pmadd.ub.sw", _W16, codes, ys)
            return _call(b, "llvm.x86.avx2.pmadd.wd", _V8, pairs, ir.Constant(_W16, [1] * 16))
        v32 = ir.VectorType(_i32, 32)
        p = b.mul(b.zext(codes, v32), b.sext(ys, v32))
        acc = None
        for i in range(4):
            part = b.shuffle_vector(p, p, ir.Constant(_V8, list(range(i, 32, 4))))
            acc = part if acc is None else b.add(acc, part)
        return acc

    def _splat8(b, x):
        return b.shuffle_vector(b.insert_element(ir.Constant(_V8, None), x, ir.Constant(_i32, 0)),
                                ir.Constant(_V8, None), ir.Constant(_V8, [0] * 8))

    def _halves8(b, lo, hi):
        """<8 x i32>: ``lo`` in lanes 0–3, ``hi`` in lanes 4–7."""
        v = b.insert_element(b.insert_element(ir.Constant(ir.VectorType(_i32, 2), None), lo, ir.Constant(_i32, 0)),
                             hi, ir.Constant(_i32, 1))
        return b.shuffle_vector(v, v, ir.Constant(_V8, [0] * 4 + [1] * 4))

    def _vector(a, dtype):
        return isinstance(a, types.Array) and a.ndim == 1 and a.layout in "CA" and a.dtype == dtype

    def _typed(w, y, sc):
        return _vector(w, types.uint8) and _vector(y, types.int8) and _vector(sc, types.int32)

    def _ptrs(context, b, sig, args, arrays=(0, 2, 4)):
        """The pointers of the arrays at ``arrays`` of the signature, each at its offset (the argument after it): the
        weight row and Q8 row as i8*, the rest as their element type. Each a contiguous row (the callers' contract:
        their kernels check the weight stack's rows once, before their threads start)."""
        out = []
        for i in arrays:
            data = context.make_array(sig.args[i])(context, b, args[i]).data
            out.append(b.gep(b.bitcast(data, _i8.as_pointer()) if i in (0, 2) else data, [args[i + 1]]))
        return out

    def _load32(b, p, off):
        return b.load(b.bitcast(b.gep(p, [off]), _B32.as_pointer()), align=1)

    def _result(context, b, sig, acc, total):
        if total:
            return _call(b, "llvm.vector.reduce.add.v8i32", _i32, acc)
        lanes = [b.extract_element(acc, ir.Constant(_i32, i)) for i in range(8)]
        return context.make_tuple(b, sig.return_type, lanes)

    def _nibble_dots(b, level, wp, yp, wo, yo, scale_lo, scale_hi):
        """<8 x i32>: one Q4_K chunk's lanes — the 32 bytes at ``wp + wo``, low nibbles against ``yp + yo`` times
        ``scale_lo``, high nibbles against ``yp + yo + 32`` times ``scale_hi`` (i32 scalars)."""
        byte = _load32(b, wp, wo)
        acc = None
        for h, scale in enumerate((scale_lo, scale_hi)):
            codes = b.and_(b.lshr(byte, ir.Constant(_B32, [4] * 32)) if h else byte, ir.Constant(_B32, [15] * 32))
            term = b.mul(_udot(b, level, codes, _load32(b, yp, b.add(yo, ir.Constant(_i64, 32 * h)))), _splat8(b, scale))
            acc = term if acc is None else b.add(acc, term)
        return acc

    def _q4_k_ir(level, total, typingctx, w, wo, y, yo, sc, so, n):
        """:func:`q4_k_lanes_def` (``total``: the sum of its lanes, an int32) for one instruction level."""
        if not _typed(w, y, sc):
            return None
        i64 = types.int64
        ret = types.int32 if total else types.UniTuple(types.int32, 8)
        sig = ret(w, i64, y, i64, sc, i64, i64)

        def codegen(context, b, signature, args):
            wp, yp, sp = _ptrs(context, b, signature, args)
            accp = cgutils.alloca_once_value(b, ir.Constant(_V8, [0] * 8))
            with cgutils.for_range(b, args[6]) as loop:
                c = loop.index
                s_lo = b.gep(sp, [b.mul(c, ir.Constant(_i64, 2))])  # sub-blocks 2c (low nibbles), 2c + 1 (high)
                dots = _nibble_dots(b, level, wp, yp, b.mul(c, ir.Constant(_i64, 32)), b.mul(c, ir.Constant(_i64, 64)),
                                    b.load(s_lo), b.load(b.gep(s_lo, [ir.Constant(_i64, 1)])))
                b.store(b.add(b.load(accp), dots), accp)
            return _result(context, b, signature, b.load(accp), total)

        return sig, codegen

    def _q6_lanes(b, level, wp, yp, scale_of):
        """<8 x i32>: :func:`q6_k_lanes_def`'s lanes of the super-block at ``wp`` against ``yp``, ``scale_of(g)`` the
        <8 x i32> scales of load ``g`` (lanes 0–3, 4–7)."""
        def k(x):
            return ir.Constant(_i64, x)

        m4, m2 = ir.Constant(_B32, [15] * 32), ir.Constant(_B32, [3] * 32)
        acc = ir.Constant(_V8, [0] * 8)
        for h in range(2):
            ql = [_load32(b, wp, k(64 * h + 32 * i)) for i in range(2)]
            qh = _load32(b, wp, k(128 + 32 * h))
            for j in range(4):
                low = b.and_(b.lshr(ql[j % 2], ir.Constant(_B32, [4 * (j // 2)] * 32)), m4)
                high = b.shl(b.and_(b.lshr(qh, ir.Constant(_B32, [2 * j] * 32)), m2), ir.Constant(_B32, [4] * 32))
                g = 4 * h + j
                acc = b.add(acc, b.mul(_udot(b, level, b.or_(low, high), _load32(b, yp, k(32 * g))), scale_of(g)))
        return acc

    def _q6_k_ir(level, total, typingctx, w, wo, y, yo, sc, so):
        """:func:`q6_k_lanes_def` (``total``: the sum of its lanes) for one instruction level."""
        if not _typed(w, y, sc):
            return None
        i64 = types.int64
        ret = types.int32 if total else types.UniTuple(types.int32, 8)
        sig = ret(w, i64, y, i64, sc, i64)

        def codegen(context, b, signature, args):
            wp, yp, sp = _ptrs(context, b, signature, args)

            def scale_of(g):
                return _halves8(b, b.load(b.gep(sp, [ir.Constant(_i64, 2 * g)])), b.load(b.gep(sp, [ir.Constant(_i64, 2 * g + 1)])))

            return _result(context, b, signature, _q6_lanes(b, level, wp, yp, scale_of), total)

        return sig, codegen

    def _q6_k_fma_ir(level, typingctx, w, wo, y, yo, bs, bo, db, acc):
        """:func:`q6_k_fma_def` for one instruction level: the int8 scales from the block's bytes, the lanes, less
        ``q8sclsub``, then one <8 x float> FMA into ``acc``."""
        if not (_vector(w, types.uint8) and _vector(y, types.int8) and _vector(bs, types.int64)
                and _vector(acc, types.float32) and acc.layout == "C"):
            return None
        i64 = types.int64
        sig = types.void(w, i64, y, i64, bs, i64, types.float32, acc)

        def codegen(context, b, signature, args):
            wp, yp, bp = _ptrs(context, b, signature, args)
            aa = context.make_array(signature.args[7])(context, b, args[7])
            v16 = ir.VectorType(_i32, 16)
            sc = b.sext(b.load(b.bitcast(b.gep(wp, [ir.Constant(_i64, 192)]), ir.VectorType(_i8, 16).as_pointer()), align=1), v16)

            def scale_of(g):
                return b.shuffle_vector(sc, sc, ir.Constant(_V8, [2 * g] * 4 + [2 * g + 1] * 4))

            lanes = _q6_lanes(b, level, wp, yp, scale_of)
            bsv = b.trunc(b.load(b.bitcast(bp, ir.VectorType(_i64, 16).as_pointer()), align=8), v16)
            prod = b.mul(bsv, sc)  # bs[g]·sc[g], g < 16
            pairs = b.add(b.shuffle_vector(prod, prod, ir.Constant(_V8, list(range(0, 16, 2)))),
                          b.shuffle_vector(prod, prod, ir.Constant(_V8, list(range(1, 16, 2)))))
            sumi = b.sub(lanes, b.shl(pairs, ir.Constant(_V8, [5] * 8)))  # q8sclsub = (bsums · scales pairwise) << 5
            f8 = ir.VectorType(ir.FloatType(), 8)
            pa = b.bitcast(aa.data, f8.as_pointer())
            dbv = b.shuffle_vector(b.insert_element(ir.Constant(f8, None), args[6], ir.Constant(_i32, 0)),
                                   ir.Constant(f8, None), ir.Constant(_V8, [0] * 8))
            fma = cgutils.get_or_insert_function(b.module, ir.FunctionType(f8, [f8] * 3), "llvm.fma.v8f32")
            b.store(b.call(fma, [dbv, b.sitofp(sumi, f8), b.load(pa, align=4)]), pa, align=4)  # _mm256_fmadd_ps
            return context.get_dummy_value()

        return sig, codegen

    def _q4_k_block_ir(level, typingctx, w, wo, y, yo, ys, so):
        """:func:`q4_k_block_def` for one instruction level: the scales and mins decoded with vector shuffles
        from the 12 bytes, each chunk's two sub-block dots scaled and summed, the mins times the sums."""
        if not (_vector(w, types.uint8) and _vector(y, types.int8) and _vector(ys, types.int64)):
            return None
        i64 = types.int64
        sig = types.UniTuple(types.int32, 8)(w, i64, y, i64, ys, i64)

        def codegen(context, b, signature, args):
            wp, yp, sp = _ptrs(context, b, signature, args)

            def k(x):
                return ir.Constant(_i64, x)

            def const8(v):
                return ir.Constant(_V8, v)

            def pick(v, idx):
                return b.shuffle_vector(v, v, ir.Constant(_V8, idx))

            v16 = ir.VectorType(_i8, 16)
            s = b.zext(b.load(b.bitcast(b.gep(wp, [k(4)]), v16.as_pointer()), align=1), ir.VectorType(_i32, 16))
            a_ = pick(s, [0, 1, 2, 3, 8, 9, 10, 11])  # q[j] (j < 4), q[j + 4] (j >= 4)
            b_ = pick(s, [4, 5, 6, 7, 0, 1, 2, 3])  # q[j + 4] (j < 4), q[j - 4] (j >= 4)
            c_ = pick(s, [0, 1, 2, 3, 4, 5, 6, 7])  # q[j]
            first = ir.Constant(ir.VectorType(ir.IntType(1), 8), [1] * 4 + [0] * 4)
            hi2 = b.shl(b.lshr(b_, const8([6] * 8)), const8([4] * 8))
            sc = b.select(first, b.and_(a_, const8([63] * 8)), b.or_(b.and_(a_, const8([15] * 8)), hi2))
            mn = b.select(first, b.and_(b_, const8([63] * 8)),
                          b.or_(b.lshr(a_, const8([4] * 8)), b.shl(b.lshr(c_, const8([6] * 8)), const8([4] * 8))))
            ysv = b.trunc(b.load(b.bitcast(sp, ir.VectorType(_i64, 8).as_pointer()), align=8), _V8)
            mins = b.mul(mn, ysv)  # mn[s]·ys[s]
            out = []
            for c in range(4):
                scales = [b.extract_element(sc, ir.Constant(_i32, 2 * c + h)) for h in (0, 1)]
                out.append(_call(b, "llvm.vector.reduce.add.v8i32", _i32,
                                 _nibble_dots(b, level, wp, yp, k(16 + 32 * c), k(64 * c), *scales)))
            for c in range(4):
                out.append(b.add(b.extract_element(mins, ir.Constant(_i32, 2 * c)),
                                 b.extract_element(mins, ir.Constant(_i32, 2 * c + 1))))
            return context.make_tuple(b, signature.return_type, out)

        return sig, codegen

    def make(kind: str, level: int, total: bool = False):
        """The intrinsic of ``kind`` — "q4_k", "q6_k" (lanes; ``total``: their sum), "q4_k_block", "q6_k_fma" — for
        instruction level ``level`` (:data:`LEVEL`; the tests build each one)."""
        if kind == "q4_k_block":
            return intrinsic(functools.partial(_q4_k_block_ir, level))
        if kind == "q6_k_fma":
            return intrinsic(functools.partial(_q6_k_fma_ir, level))
        return intrinsic(functools.partial(_q4_k_ir if kind == "q4_k" else _q6_k_ir, level, total))

    _q4_k_lanes, _q4_k_total = make("q4_k", LEVEL), make("q4_k", LEVEL, True)
    _q6_k_lanes, _q4_k_block, _q6_k_fma = make("q6_k", LEVEL), make("q4_k_block", LEVEL), make("q6_k_fma", LEVEL)

    @jit(inline=True)
    def q4_k_lanes(w, wo, y, yo, sc, so, n):
        """:func:`q4_k_lanes_def` as vector IR: a tuple of 8 int32."""
        return _q4_k_lanes(w, np.int64(wo), y, np.int64(yo), sc, np.int64(so), np.int64(n))

    @jit(inline=True)
    def q4_k_total(w, wo, y, yo, sc, so, n):
        """The sum of :func:`q4_k_lanes_def`'s lanes (an int32) as vector IR."""
        return _q4_k_total(w, np.int64(wo), y, np.int64(yo), sc, np.int64(so), np.int64(n))

    @jit(inline=True)
    def q4_k_block(w, wo, y, yo, ys, so):
        """:func:`q4_k_block_def` as vector IR: a tuple of 8 int32."""
        return _q4_k_block(w, np.int64(wo), y, np.int64(yo), ys, np.int64(so))

    @jit(inline=True)
    def q6_k_fma(w, wo, y, yo, bs, bo, db, acc):
        """:func:`q6_k_fma_def` as vector IR."""
        _q6_k_fma(w, np.int64(wo), y, np.int64(yo), bs, np.int64(bo), np.float32(db), acc)

    @jit(inline=True)
    def q6_k_lanes(w, wo, y, yo, sc, so):
        """:func:`q6_k_lanes_def` as vector IR: a tuple of 8 int32."""
        return _q6_k_lanes(w, np.int64(wo), y, np.int64(yo), sc, np.int64(so))

else:

    def q4_k_lanes(w, wo, y, yo, sc, so, n):
        return tuple(np.int32(x) for x in q4_k_lanes_def(w, wo, y, yo, sc, so, n))

    def q4_k_total(w, wo, y, yo, sc, so, n):
        return np.int32(sum(q4_k_lanes_def(w, wo, y, yo, sc, so, n)))

    def q4_k_block(w, wo, y, yo, ys, so):
        return tuple(np.int32(x) for x in q4_k_block_def(w, wo, y, yo, ys, so))

    def q6_k_lanes(w, wo, y, yo, sc, so):
        return tuple(np.int32(x) for x in q6_k_lanes_def(w, wo, y, yo, sc, so))

    q6_k_fma = q6_k_fma_def


__all__ = ["LEVEL", "q4_k_block", "q4_k_block_def", "q4_k_lanes", "q4_k_lanes_def", "q4_k_total", "q6_k_fma",
           "q6_k_fma_def", "q6_k_lanes", "q6_k_lanes_def"]
