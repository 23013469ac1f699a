"""``ggml_mul_mat`` and ``ggml_mul_mat_id`` as ggml-cpu computes them, bit for bit, on the ``avx512`` and
``avx2`` paths (weights ``W`` of a ggml type, F32 activations, F32 out).

A weight llama.cpp loads into its CPU_REPACK buffer (``repack=True``, its default, and a type and row count that
buffer takes: :func:`repacked`) runs that buffer's gemm/gemv instead (:mod:`kernels.ggml.repack`,
:mod:`kernels.ggml.repack_k`). Otherwise the weight sits in a plain CPU buffer, and which kernel an element takes
(``ggml-cpu.c: ggml_compute_forward_mul_mat``), with ``T`` = activation rows
(``ne11``), ``N`` = weight rows (``ne01``), ``K`` = row length (``ne00``), ``L`` = 16 (avx512) or 8 (avx2):

1. ``tiled/tiled.cpp: ggml_compute_forward_mul_mat_tiled`` first: K-quant and IQ weights (Q2_K…Q6_K, IQ4_XS,
   the IQ1/2/3 types) with ``T >= 8`` (:mod:`kernels.ggml.mulmat_k`).
2. ``llamafile_sgemm`` on the F32 activations (needs ``T >= 2``): only F32 weights pass (``tinyBLAS`` with
   ``KN = L``; it declines unless ``K % KN == 0`` and ``N % 4 == 0``).
3. The activations are converted to the weight's ``vec_dot_type`` (``from_float``: F16 ``vcvtps2ph``,
   BF16 ``ggml_compute_fp32_to_bf16``, Q8_0 x86 ``quantize_row_q8_0``, Q8_K ``quantize_row_q8_K_ref`` —
   :mod:`kernels.ggml.actquant`), split across threads by whole blocks, which changes nothing.
4. ``llamafile_sgemm`` again (``T >= 2``): F16 (``tinyBLAS``, KN = L), BF16 (avx512: ``_mm512_dpbf16_ps``,
   KN = 32; avx2: KN = 8), Q8_0, Q4_0, Q5_0, IQ4_NL (``tinyBLAS_Q0_AVX``, any shape; Q4_1 / Q5_1 never).
5. Else one ``vec_dot`` per element (``nrows`` = 1 on x86): :mod:`kernels.ggml.mulmat_vec` for floats, here
   for Q8_0 and MXFP4, :mod:`kernels.ggml.mulmat_k` for the K-quants, :mod:`kernels.ggml.mulmat_q` for the
   legacy Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL.

Every element is computed by one thread in one fixed order, so the thread count changes no bit on these
paths (the chunking only decides who computes what). Q8_0 is the same formula on every path — ``vec_dot``
(``arch/x86/quants.c: ggml_vec_dot_q8_0_q8_0``) and ``tinyBLAS_Q0_AVX`` (``gemm``, ``gemm4xN``,
``gemmMx4``) both keep 8 float lanes, lane ``l`` fed the exact integer dot of bytes ``4l … 4l+3`` of each
32-value block (``_mm256_dpbusd_epi32`` on avx512, ``maddubs``+``madd`` on avx2: no int16 saturation is
reachable), ``acc[l] = fma(d_w·d_x, float(dot), acc[l])`` with ``d_w·d_x`` rounded to float32, then
``hsum_float_8``. The ``_mm256_sign_epi8`` trick computes ``|w| · (x·sign w)`` in int8, so an activation
byte of -128 against a negative weight byte counts as -128 (not +128): :func:`_sign_dot`.

``ggml_mul_mat_id`` (``ggml_compute_forward_mul_mat_id``) groups the (token, slot) pairs by expert in token
order and runs ``vec_dot`` per element (no llamafile sgemm); K-quant experts with 8 or more routed rows go
to the tiled kernel. Activation row of (token t, slot s) is ``x[t, s % n_x]``.

Emulated weight types: F32, F16, BF16, Q8_0, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, the IQ1/2/3 codebook
types (:mod:`kernels.ggml.mulmat_iq`: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), and (in a plain
buffer, :mod:`kernels.ggml.mulmat_q`) Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL (others raise: TQ1_0, TQ2_0). ``avx512`` means
the build of this host (AVX-512 F/BW/DQ/VL with VNNI and BF16): without ``__AVX512BF16__`` ggml would take
other BF16 kernels. Not modelled: which NaN survives when two NaNs of different bits meet in one sum (an
activation or fp16-scale NaN payload and the default NaN of ``inf - inf`` / ``0·inf``) — x86 keeps the first
source operand's, i.e. it follows GCC's operand order per instruction; NaN-ness and all other bits match.
"""

from __future__ import annotations

import functools

import numpy as np

from kernels.base.block import QT
from kernels.base.blocks import row_bytes
from kernels.base.floats import E8M0_HALF
from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml import mulmat_iq, mulmat_k
from kernels.ggml.actquant import _q8_0_rows, _quantize_rows_q8_0
from kernels.ggml.mulmat_vec import (
    bf16_bits_to_f32,
    f16_bits_to_f32,
    fp32_to_fp16_values,
    tinyblas_rows,
    vec_dot_float_rows,
)
from kernels.ggml.simd import PATHS, fma32, hsum_fold, lanes
from kernels.ggml.vecmath import F16_TO_F32
from kernels.ggml.vecmath import cast_bf16 as fp32_to_bf16_bits  # ggml-impl.h: ggml_compute_fp32_to_bf16
from kernels.plain.dequant import MXFP4_VALUES

FLOAT_KIND = {QT.F32: 0, QT.F16: 1, QT.BF16: 2}


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
# Dispatch


#: ``repack.cpp: ggml_repack_get_optimal_repack_type`` on x86: the weight types llama.cpp's CPU_REPACK buffer (its
#: default, ``use_extra_bufts``) re-lays out into interleaved blocks, per path, for a matrix of N % 8 == 0 rows; a
#: ``ggml_mul_mat`` / ``ggml_mul_mat_id`` on it runs that buffer's gemm/gemv (``forward_mul_mat``,
#: ``forward_mul_mat_id``): :mod:`kernels.ggml.repack` (Q4_0, IQ4_NL, MXFP4) and :mod:`kernels.ggml.repack_k` (Q4_K,
#: and Q2_K, repacked by AVX-512 builds only).
REPACKED = {"avx2": frozenset({QT.Q4_0, QT.Q4_K, QT.IQ4_NL, QT.MXFP4}),
            "avx512": frozenset({QT.Q4_0, QT.Q4_K, QT.IQ4_NL, QT.MXFP4, QT.Q2_K})}


def repacked(qtype, n_rows: int, path: str) -> bool:
    """Whether llama.cpp with its default CPU_REPACK buffer repacks a weight of ``qtype`` with ``n_rows`` rows
    (ggml's ne[1], per expert for a 3-D tensor) on ``path``."""
    return QT(qtype) in REPACKED[path] and n_rows % 8 == 0


def repack_emulated(qtype, path: str) -> bool:
    """Whether the repacked kernels of ``qtype`` on ``path`` are emulated (:data:`REPACKED` minus what is not)."""
    from kernels.ggml.repack import REPACK_Q4_B32
    from kernels.ggml.repack_k import REPACK_K

    return QT(qtype) in REPACKED[path] and QT(qtype) in (REPACK_Q4_B32 | REPACK_K)


def kernel_for(qtype, path: str, T: int, N: int, K: int, repack: bool = False) -> str:
    """Which ggml-cpu kernel computes ``ggml_mul_mat`` of this shape: "repack" (the weight sits in the CPU_REPACK
    buffer: ``repack`` is llama.cpp's ``use_extra_bufts``), "tiled", "sgemm" or "vec_dot"."""
    qtype, L = _qt(qtype), lanes(path)
    if repack and repacked(qtype, N, path):
        return "repack"
    if qtype in mulmat_k.TILED_TYPES and T >= mulmat_k.TILED_MIN_ROWS:
        return "tiled"
    if T >= 2:
        if qtype == QT.Q8_0 or qtype in _mulmat_q().SGEMM_TYPES:
            return "sgemm"
        if qtype in FLOAT_KIND:
            kn = 32 if (qtype == QT.BF16 and path == "avx512") else L
            if K % kn == 0 and N % 4 == 0:
                return "sgemm"
    return "vec_dot"


def mul_mat_emulated(qtype) -> bool:
    """Whether ``mul_mat`` / ``mul_mat_id`` of ``qtype`` weights in a plain CPU buffer is emulated (every path)."""
    qtype = _qt(qtype)
    return (qtype in FLOAT_KIND or qtype in (QT.Q8_0, QT.MXFP4) or qtype in mulmat_k.KQUANT_TYPES
            or qtype in _mulmat_q().LEGACY_TYPES or qtype in mulmat_iq.IQ_TYPES)


def _mulmat_q():
    from kernels.ggml import mulmat_q  # Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL (it imports this module's Q8_0 kernels)

    return mulmat_q


def _qt(qtype) -> QT:
    return qtype if qtype.__class__ is QT else QT(qtype)


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


def mul_mat(w_bytes: np.ndarray, qtype, x: np.ndarray, path: str, n_threads: int = 1, repack: bool = False,
            tensor_rows: int | None = None) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` as ggml-cpu's ``path`` computes it: ``w_bytes`` (N, row bytes) uint8 rows of
    ``qtype``, ``x`` (T, K) float32 -> (T, N) float32. ``repack``: W was loaded into the CPU_REPACK buffer when
    that buffer takes it (llama.cpp's default; :func:`repacked` of the stored tensor's rows: ``tensor_rows`` when
    ``w_bytes`` is a row block of a fused tensor, default N). ``n_threads`` is accepted for the record: no
    path emulated here changes a bit with it."""
    qtype = _qt(qtype)
    w_bytes, x = _check(w_bytes, qtype, x)
    if repack and repacked(qtype, w_bytes.shape[0] if tensor_rows is None else tensor_rows, path):
        return _repack_kernels(qtype, path)[0](w_bytes, qtype, x, path)
    return _compute(w_bytes, qtype, x, path, kernel_for(qtype, path, x.shape[0], w_bytes.shape[0], x.shape[1]))


def _repack_kernels(qtype: QT, path: str):
    """(mul_mat, mul_mat_id) of the emulated repacked kernels of ``qtype`` (raises for a repacked type that is
    not emulated)."""
    from kernels.ggml import repack, repack_k

    if qtype in repack.REPACK_Q4_B32:
        return repack.mul_mat_repacked, repack.mul_mat_id_repacked
    if qtype in repack_k.REPACK_K:
        return repack_k.mul_mat_repacked_k, repack_k.mul_mat_id_repacked_k
    raise ValueError(f"mul_mat emulation: the repacked {path} kernels of {qtype.name} are not emulated")


def _compute(w_bytes, qtype, x, path, how):
    """``mul_mat`` through kernel ``how`` ("tiled", "sgemm" or "vec_dot")."""
    L = lanes(path)
    out = np.empty((x.shape[0], w_bytes.shape[0]), np.float32)
    if qtype in FLOAT_KIND:
        kind = FLOAT_KIND[qtype]
        if kind == 0:
            w, xv = w_bytes.view(np.float32), x
        elif kind == 1:
            w, xv = f16_bits_to_f32(w_bytes.view(np.uint16)), fp32_to_fp16_values(x)
        else:
            w, xv = bf16_bits_to_f32(w_bytes.view(np.uint16)), bf16_bits_to_f32(fp32_to_bf16_bits(x))
        if how == "sgemm":
            dp = kind == 2 and path == "avx512"
            tinyblas_rows(w, xv, out, 32 if dp else L, L, dp)
        else:
            vec_dot_float_rows(w, xv, out, kind, L)
        return out
    if qtype == QT.Q8_0:  # x86 quantize_row_q8_0, then vec_dot / tinyBLAS_Q0_AVX (the same formula)
        q8_0_mul_mat(w_bytes.view(np.int8), x, out, F16_TO_F32)
        return out
    if qtype == QT.MXFP4:
        xq, xd, _ = _q8_0_rows(x, False)  # x86 quantize_row_q8_0; xd holds the fp16 d values
        mxfp4_rows(*_mxfp4_weights(w_bytes), xq, xd, out, path == "avx2")
        return out
    if qtype in mulmat_k.KQUANT_TYPES:
        return mulmat_k.mul_mat_k(w_bytes, qtype, x, path, how == "tiled")
    if qtype in _mulmat_q().LEGACY_TYPES:
        return _mulmat_q().mul_mat_q(w_bytes, qtype, x, path, how == "sgemm")
    if qtype in mulmat_iq.IQ_TYPES:
        return mulmat_iq.mul_mat_iq(w_bytes, qtype, x, path, how == "tiled")
    raise ValueError(f"mul_mat emulation: weight type {qtype.name} is not emulated")


def mul_mat_id(w_bytes: np.ndarray, qtype, x: np.ndarray, ids: np.ndarray, path: str, n_threads: int = 1,
               repack: bool = False, tensor_rows: int | None = None):
    """``ggml_mul_mat_id(W, x, ids)``: ``w_bytes`` (E, N, row bytes) expert weights, ``x`` (T, n_x, K) float32
    with ``n_x`` = 1 (shared by all slots) or ``n_used``, ``ids`` (T, n_used) int32 expert of each slot ->
    (T, n_used, N) float32; slot ``s`` of token ``t`` is ``W[ids[t, s]] @ x[t, s % n_x]``. ``repack`` as in
    :func:`mul_mat`; the stored tensor's rows per expert decide (``tensor_rows``: 2N when ``w_bytes`` is the gate
    or up half of a fused gate_up tensor; default N)."""
    qtype = _qt(qtype)
    x = np.ascontiguousarray(x, np.float32)
    w_bytes = _bytes(w_bytes)  # (E, N, row bytes): rows contiguous, the stack may be a strided view
    ids = np.asarray(ids, np.int32)
    E, N = w_bytes.shape[:2]
    T, n_x, K = x.shape
    n_used = ids.shape[1]
    if ids.shape[0] != T or (ids < 0).any() or (ids >= E).any():
        raise ValueError(f"ids must be (T={T}, n_used) experts in [0, {E}), got shape {ids.shape}")
    if w_bytes.ndim != 3 or w_bytes.shape[2] != _row_bytes(qtype, K):
        raise ValueError(f"weights must be (E, N, {row_bytes(qtype, K)}) bytes, got {w_bytes.shape}")
    if repack and repacked(qtype, N if tensor_rows is None else tensor_rows, path):
        return _repack_kernels(qtype, path)[1](w_bytes, qtype, x, ids, path)
    out = np.empty((T, n_used, N), np.float32)
    if qtype == QT.Q8_0:  # vec_dot per element, whatever the grouping: one compiled call
        q8_0_mul_mat_id(w_bytes.view(np.int8), ids, x, out, F16_TO_F32)
        return out
    for e in np.unique(ids).tolist():  # ggml groups the rows by expert: matrix_rows[e] = (slot, token) in token order
        t_idx, s_idx = np.nonzero(ids == e)
        rows = np.ascontiguousarray(x[t_idx, s_idx % n_x])  # (cne1, K): this expert's rows, token order
        tiled = qtype in mulmat_k.TILED_TYPES and len(t_idx) >= mulmat_k.TILED_MIN_ROWS
        out[t_idx, s_idx] = _compute(w_bytes[e], qtype, rows, path, "tiled" if tiled else "vec_dot")
    return out


__all__ = ["mul_mat", "mul_mat_id", "kernel_for", "repacked", "repack_emulated", "lanes", "PATHS", "fp32_to_bf16_bits", "fp32_to_fp16_values"]
