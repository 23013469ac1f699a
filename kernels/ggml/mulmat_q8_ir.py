"""The Q8_0 ``vec_dot`` of :mod:`kernels.ggml.mulmat_q8` as LLVM IR (a numba intrinsic): ``_q8_0_tile_def``
there — ``arch/x86/quants.c: ggml_vec_dot_q8_0_q8_0`` (= llamafile ``tinyBLAS_Q0_AVX``) for a few weight rows
against a few activation rows at once, each element's operations in ggml's order — with ggml's own
instructions where the numba target has them (``_mm256_dpbusd_epi32`` on AVX-512 VNNI, ``maddubs`` + ``madd``
on AVX2) and target-independent IR elsewhere (an AArch64 host). Every level gives the same bits
(tests/test_ggml_mulmat_q8.py). The level is fixed per process (:data:`LEVEL`); numba's cache of the kernels
that use it keys on the CPU, not on ``REFIMPL_KERNEL_ISA`` — which changes instructions, never a bit.
"""

from __future__ import annotations

import functools

import numba
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.lanes.ir import ISA, ISA_AVX2, ISA_AVX512, _prefetch

#: Software prefetch distance in a weight row (bytes; 256 blocks): the hardware prefetcher alone left the
#: LM head (248320 x 2048, T = 1, one thread) at 50 ms, this at 42 ms (host memory floor ~17 ms).
AHEAD = 256 * 34


def _level() -> int:
    """The x86 instructions the Q8_0 block dot takes: 2 AVX-512 VNNI, 1 AVX2, 0 none (generic IR) — the
    numba target's (``NUMBA_CPU_FEATURES``, else the host's), capped by ``flags.KERNEL_ISA``."""
    feats = (numba.config.CPU_FEATURES or llvm_binding.get_host_cpu_features().flatten()).split(",")
    return 2 if ISA == ISA_AVX512 and "+avx512vnni" in feats else 1 if ISA >= ISA_AVX2 else 0


LEVEL = _level()
_I32, _F32 = ir.IntType(32), ir.FloatType()
_V8F = ir.VectorType(_F32, 8)


def _splat(vt, c):
    return ir.Constant(vt, [c] * vt.count)


def _block_dots(b, w8, x8, level):
    """<8 x i32>: the exact dots of the 4-byte groups of 32 weight and activation bytes (two <32 x i8>)
    through the sign trick (:func:`kernels.ggml.mulmat_q8._sign_dot`). ``level`` (:data:`LEVEL`) 2: ggml's own
    ``vpdpbusd`` of ``|w|`` and ``sign(x, w)``; 1: ``vpmaddubsw`` + ``vpmaddwd`` of the same (no int16 sum
    saturates: the module docstring of :mod:`kernels.ggml.mulmat`); 0: target-independent — both sides
    sign-extended to i32, the activation byte -128 against a negative weight byte read as +128 (``_mm256_sign_epi8`` wraps:
    ``|w| · -(-128)`` = ``w · 128``), exact products summed in fours (integers: any order). Same sums."""
    v32i8, v8 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(_I32, 8)
    if level:
        absw = b.call(_fn(b, "llvm.abs.v32i8", v32i8, [v32i8, ir.IntType(1)]), [w8, ir.Constant(ir.IntType(1), 0)])
        sx = b.call(_fn(b, "llvm.x86.avx2.psign.b", v32i8, [v32i8, v32i8]), [x8, w8])
        if level == 2:
            dp = _fn(b, "llvm.x86.avx512.vpdpbusd.256", v8, [v8, v8, v8])
            return b.call(dp, [_splat(v8, 0), b.bitcast(absw, v8), b.bitcast(sx, v8)])
        v16 = ir.VectorType(ir.IntType(16), 16)
        p16 = b.call(_fn(b, "llvm.x86.avx2.pmadd.ub.sw", v16, [v32i8, v32i8]), [absw, sx])
        return b.call(_fn(b, "llvm.x86.avx2.pmadd.wd", v8, [v16, v16]), [p16, _splat(v16, 1)])
    v32 = ir.VectorType(_I32, 32)
    wv, xv = b.sext(w8, v32), b.sext(x8, v32)
    wraps = b.and_(b.icmp_signed("==", xv, _splat(v32, -128)), b.icmp_signed("<", wv, _splat(v32, 0)))
    prod = b.mul(wv, b.select(wraps, _splat(v32, 128), xv))  # (32 x i32), |p| <= 16384

    def pick(v, idx):
        return b.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, len(idx)), idx))

    pairs = b.add(pick(prod, list(range(0, 32, 2))), pick(prod, list(range(1, 32, 2))))  # 16 lanes
    return b.add(pick(pairs, list(range(0, 16, 2))), pick(pairs, list(range(1, 16, 2))))  # 8 lanes


def _fn(b, name, ret, params):
    return cgutils.get_or_insert_function(b.module, ir.FunctionType(ret, params), name)


def _hsum_fold8(b, acc):
    """:func:`kernels.ggml.simd.hsum_fold` of 8 lanes in IR: ``(s0 + s2) + (s1 + s3)``, ``s_i = a_i + a_{i+4}``."""
    lane = [b.extract_element(acc, ir.Constant(_I32, i)) for i in range(8)]
    s = [b.fadd(lane[i], lane[i + 4]) for i in range(4)]
    return b.fadd(b.fadd(s[0], s[2]), b.fadd(s[1], s[3]))


def make_q8_0_tile(level: int):
    """The intrinsic below for instruction level ``level`` (:data:`LEVEL`; tests build each one)."""
    return intrinsic(functools.partial(_q8_0_tile_ir, level))


def _q8_0_tile_ir(level, typingctx, w, rows, xq, xd, trows, tab):
    """:func:`kernels.ggml.mulmat_q8._q8_0_tile_def` as IR: one loop over the blocks for the ``len(rows) ·
    len(trows)`` elements, each with its 8 float lanes in a register — per block the scale ``float32(tab[w.d] ·
    x.d)``, the exact integer dots (:func:`_block_dots`), one ``llvm.fma.v8f32`` with the scale broadcast —
    then ``hsum_float_8`` each: every element's operations in ggml's order; the elements side by side only
    hide the latency of each one's chain of FMAs. The rows of ``w`` (the stored bytes), ``xq`` and ``xd``
    are read from their data pointers and row strides (each row contiguous); each weight row's block
    :data:`AHEAD` bytes on is prefetched. Same bits."""
    if not (isinstance(rows, types.UniTuple) and isinstance(trows, types.UniTuple)):
        return None
    nr, nt = rows.count, trows.count
    sig = types.UniTuple(types.float32, nr * nt)(w, rows, xq, xd, trows, tab)

    def codegen(context, b, signature, args):
        i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
        wa, xa, da, ta = (context.make_array(signature.args[i])(context, b, args[i]) for i in (0, 2, 3, 5))
        rs, ts = cgutils.unpack_tuple(b, args[1], nr), cgutils.unpack_tuple(b, args[4], nt)

        def row_ptr(arr, r):  # the first byte of row r
            return b.gep(b.bitcast(arr.data, i8p), [b.mul(r, cgutils.unpack_tuple(b, arr.strides, 2)[0])])

        wrow, xrow, drow = [row_ptr(wa, r) for r in rs], [row_ptr(xa, t) for t in ts], [row_ptr(da, t) for t in ts]
        nb = cgutils.unpack_tuple(b, da.shape, 2)[1]
        fma = _fn(b, "llvm.fma.v8f32", _V8F, [_V8F] * 3)
        accp = [cgutils.alloca_once_value(b, ir.Constant(_V8F, [0.0] * 8)) for _ in range(nr * nt)]  # registers

        def bytes32(p):
            return b.load(b.bitcast(p, ir.VectorType(ir.IntType(8), 32).as_pointer()), align=1)

        with cgutils.for_range(b, nb) as loop:
            i = loop.index
            wblk = [b.gep(p, [b.mul(i, ir.Constant(i64, 34))]) for p in wrow]
            for p in wblk:
                _prefetch(b, p, AHEAD, 34)  # a later row's block: prefetch never faults
            bits = [b.load(b.bitcast(p, ir.IntType(16).as_pointer()), align=1) for p in wblk]  # fp16 d, little endian
            wd = [b.load(b.gep(ta.data, [b.zext(v, i64)])) for v in bits]  # GGML_CPU_FP16_TO_FP32(x.d)
            w8 = [bytes32(b.gep(p, [ir.Constant(i64, 2)])) for p in wblk]
            x8 = [bytes32(b.gep(p, [b.mul(i, ir.Constant(i64, 32))])) for p in xrow]
            xdv = [b.load(b.bitcast(b.gep(p, [b.mul(i, ir.Constant(i64, 4))]), _F32.as_pointer())) for p in drow]
            for ri in range(nr):
                for ti in range(nt):
                    d = b.fmul(wd[ri], xdv[ti])  # * GGML_CPU_FP16_TO_FP32(y.d), float32
                    dv = b.shuffle_vector(b.insert_element(ir.Constant(_V8F, None), d, ir.Constant(_I32, 0)),
                                          ir.Constant(_V8F, None), ir.Constant(ir.VectorType(_I32, 8), [0] * 8))
                    dots = _block_dots(b, w8[ri], x8[ti], level)
                    acc = accp[ri * nt + ti]
                    b.store(b.call(fma, [dv, b.sitofp(dots, _V8F), b.load(acc)]), acc)
        sums = [_hsum_fold8(b, b.load(acc)) for acc in accp]
        return context.make_tuple(b, signature.return_type, sums)

    return sig, codegen
