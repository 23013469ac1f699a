"""The Q8_0-activation kernels of ggml-cpu's ``mul_mat`` for Q8_0 and MXFP4 weights (``vec_dot`` and llamafile's
``tinyBLAS_Q0_AVX``), bit for bit, and the argument checks every ``mul_mat`` emulation shares — split from
:mod:`kernels.ggml.mulmat` (the dispatch, which documents the formulas) so that the modules of the other weight
families (:mod:`kernels.ggml.mulmat_q`, :mod:`kernels.ggml.repack`) can use them without an import circle.
"""

from __future__ import annotations

import functools

import numpy as np

from kernels.base.block import QT
from kernels.base.blocks import row_bytes
from kernels.base.floats import E8M0_HALF
from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml.actquant import _quantize_rows_q8_0
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


def _q8_0_block_def(acc, w, wo, x, xo, d):
    """One Q8_0 block of ``ggml_vec_dot_q8_0_q8_0``: ``acc[l] = fma(d, float(dot_l), acc[l])`` for the 8 lanes,
    ``dot_l`` the exact integer dot of weight bytes ``w[wo+4l … wo+4l+3]`` (int8) and activation bytes
    ``x[xo+4l …]`` through the sign trick (:func:`_sign_dot`). The definition (and the interpreted path)."""
    for lane in range(8):
        s = 0
        for e in range(4):
            s += _sign_dot(w[wo + 4 * lane + e], x[xo + 4 * lane + e])
        acc[lane] = fma32(d, np.float32(s), acc[lane])


if JIT_ENABLED:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def _q8_0_block(typingctx, acc, w, wo, x, xo, d):
        """:func:`_q8_0_block_def` as vector IR (target-independent: LLVM picks the instructions): the 32
        bytes of each side sign-extended to i32, the activation byte -128 against a negative weight byte
        read as +128 (``_mm256_sign_epi8`` wraps: ``|w| · -(-128)`` = ``w · 128``), exact i32 products summed
        in fours (integers: any order), converted, one ``llvm.fma.v8f32`` with ``d`` broadcast. Same bits."""
        sig = types.void(acc, w, wo, x, xo, d)

        def codegen(context, b, signature, args):
            i32, f32 = ir.IntType(32), ir.FloatType()
            v32, v8f = ir.VectorType(i32, 32), ir.VectorType(f32, 8)
            acc_a, w_a, x_a = (context.make_array(signature.args[i])(context, b, args[i]) for i in (0, 1, 3))

            def bytes32(arr, off):
                ptr = b.bitcast(b.gep(arr.data, [args[off]]), ir.VectorType(ir.IntType(8), 32).as_pointer())
                return b.sext(b.load(ptr, align=1), v32)

            def splat(vt, c):
                return ir.Constant(vt, [c] * vt.count)

            def pick(v, idx):
                return b.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, len(idx)), idx))

            wv, xv = bytes32(w_a, 2), bytes32(x_a, 4)
            wraps = b.and_(b.icmp_signed("==", xv, splat(v32, -128)), b.icmp_signed("<", wv, splat(v32, 0)))
            prod = b.mul(wv, b.select(wraps, splat(v32, 128), xv))  # (32 x i32), |p| <= 16384
            pairs = b.add(pick(prod, list(range(0, 32, 2))), pick(prod, list(range(1, 32, 2))))  # 16 lanes
            dots = b.add(pick(pairs, list(range(0, 16, 2))), pick(pairs, list(range(1, 16, 2))))  # 8 lanes
            accp = b.bitcast(acc_a.data, v8f.as_pointer())
            dv = b.shuffle_vector(b.insert_element(ir.Constant(v8f, None), args[5], ir.Constant(i32, 0)),
                                  ir.Constant(v8f, None), ir.Constant(ir.VectorType(i32, 8), [0] * 8))
            fma = cgutils.get_or_insert_function(b.module, ir.FunctionType(v8f, [v8f, v8f, v8f]), "llvm.fma.v8f32")
            b.store(b.call(fma, [dv, b.sitofp(dots, v8f), b.load(accp, align=4)]), accp, align=4)
            return context.get_dummy_value()

        return sig, codegen

else:
    _q8_0_block = _q8_0_block_def


@jit()
def _q8_0_dot(wr, xr, xdr, tab, acc):
    """One element of ``ggml_vec_dot_q8_0_q8_0`` (= ``tinyBLAS_Q0_AVX``), read from the stored row: ``wr`` the
    weight row's bytes as int8 (per block: the fp16 ``d``, then 32 quants), ``xr`` / ``xdr`` one Q8_0
    activation row (int8 quants, float32 values of the fp16 scales), ``tab`` ggml's half → float table
    (``F16_TO_F32``), ``acc`` 8 float32 of scratch. No copy of the weights: each block's scale is looked up
    where it is stored."""
    for lane in range(8):
        acc[lane] = np.float32(0.0)
    for b in range(xdr.shape[0]):
        o = 34 * b
        wd = tab[(int(wr[o]) & 0xFF) | ((int(wr[o + 1]) & 0xFF) << 8)]  # GGML_CPU_FP16_TO_FP32(x.d)
        d = np.float32(wd * xdr[b])  # * GGML_CPU_FP16_TO_FP32(y.d), rounded to float32
        _q8_0_block(acc, wr, o + 2, xr, 32 * b, d)  # acc = _mm256_fmadd_ps(d, cvtepi32_ps(dot), acc)
    return hsum_fold(acc, 0, 8)  # hsum_float_8(acc)


@jit()
def q8_0_rows(w, xq, xd, out, tab):
    """``ggml_vec_dot_q8_0_q8_0`` for every element: ``w`` (N, K/32·34) the weight rows viewed as int8, ``xq``
    (T, K) int8 / ``xd`` (T, K/32) float32 the Q8_0 activations; out (T, N) (:func:`_q8_0_dot`)."""
    acc = np.empty(8, np.float32)
    for t in range(xq.shape[0]):
        for r in range(w.shape[0]):
            out[t, r] = _q8_0_dot(w[r], xq[t], xd[t], tab, acc)


@jit()
def _q8_0_quantize(x):
    """The activations converted to Q8_0 (x86 ``quantize_row_q8_0``, :mod:`kernels.ggml.actquant`): (qs, d)."""
    xq = np.empty(x.shape, np.int8)
    xd = np.empty((x.shape[0], x.shape[1] // 32), np.float32)
    _quantize_rows_q8_0(x, xq, xd, np.empty((x.shape[0], 0), np.float32))
    return xq, xd


@jit()
def q8_0_mul_mat(w, x, out, tab):
    """``ggml_mul_mat`` of Q8_0 rows ``w`` (N, K/32·34 as int8) and float32 ``x`` (T, K) -> out (T, N): ``x``
    quantized (``from_float``), then :func:`q8_0_rows` — one compiled call."""
    xq, xd = _q8_0_quantize(x)
    q8_0_rows(w, xq, xd, out, tab)


@jit()
def q8_0_mul_mat_id(w, ids, x, out, tab):
    """``ggml_mul_mat_id`` of Q8_0 experts ``w`` (E, N, K/32·34 as int8): ``x`` (T, n_x, K) float32 quantized
    once (as ggml converts all of src1 into ``wdata`` first), then slot ``s`` of token ``t`` dotted with expert
    ``ids[t, s]``: out (T, n_used, N). The grouping of rows by expert that ggml does only orders the work."""
    T, n_x, K = x.shape
    xq, xd = _q8_0_quantize(x.reshape(T * n_x, K))
    acc = np.empty(8, np.float32)
    for t in range(T):
        for s in range(ids.shape[1]):
            we = w[ids[t, s]]
            row = t * n_x + s % n_x
            for r in range(we.shape[0]):
                out[t, s, r] = _q8_0_dot(we[r], xq[row], xd[row], tab, acc)


@jit()
def mxfp4_rows(wv, we, xq, xd, out, fused_tail):
    """``arch/x86/quants.c: ggml_vec_dot_mxfp4_q8_0`` (__AVX2__ branch, both builds) for every element.

    ``wv`` (N, K) int8 the ``kvalues_mxfp4`` values, ``we`` (N, K/32) float32 ``E8M0_TO_FP32_HALF`` scales.
    Blocks go in pairs to two 8-lane accumulators (even blocks ``accum1``, odd ``accum2``); their lane-wise
    sum is reduced by ``hsum_float_8``; an odd last block is added by the scalar tail, which GCC compiled
    as ``vmulss`` + ``vaddss`` on avx512 and contracted to ``vfmadd231ss`` on avx2 (``fused_tail``).
    """
    nb = we.shape[1]
    acc = np.empty((2, 8), np.float32)
    v = np.empty(8, np.float32)
    for t in range(xq.shape[0]):
        for r in range(wv.shape[0]):
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
                v[lane] = acc[0, lane] + acc[1, lane]
            sumf = hsum_fold(v, 0, 8)  # hsum_float_8
            for b in range(ib, nb):
                d = xd[t, b] * we[r, b]
                si = 0
                for j in range(32 * b, 32 * b + 32):
                    si += np.int64(wv[r, j]) * np.int64(xq[t, j])
                if fused_tail:
                    sumf = fma32(d, np.float32(si), sumf)
                else:
                    sumf = sumf + d * np.float32(si)
            out[t, r] = sumf


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
    rows contiguous (a view when they are — the gate or up half of a fused gate_up stack: no copy of the stack)."""
    w_bytes = np.asarray(w_bytes)
    if w_bytes.dtype != np.uint8:
        w_bytes = np.ascontiguousarray(w_bytes).view(np.uint8)
    if w_bytes.ndim == 3 and w_bytes.strides[2] == 1 and w_bytes.strides[1] == w_bytes.shape[2]:
        return w_bytes
    return np.ascontiguousarray(w_bytes)


@jit()
def slot_groups(ids, n_x):
    """``ggml_mul_mat_id``'s grouping of the routed rows by expert, for a kernel that runs them in one call:
    ``ids`` (T, n_used) int32 experts (>= 0) -> (order, bounds, experts, arow): the output slots
    ``j = t·n_used + s`` sorted by expert (token order within one: a counting sort), group ``g``'s slots
    ``order[bounds[g]:bounds[g+1]]`` going through expert ``experts[g]`` (increasing), and ``arow[j]`` the
    activation row ``t·n_x + s % n_x`` of slot ``j`` (all int64)."""
    T, n_used = ids.shape
    n = T * n_used
    count = np.zeros(ids.max() + 1 if n else 1, np.int64)  # (E',): slots per expert
    for j in range(n):
        count[ids[j // n_used, j % n_used]] += 1
    experts = np.nonzero(count)[0].astype(np.int64)  # (groups,): the experts used, increasing
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
