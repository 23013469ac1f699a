"""``ggml_mul_mat`` and ``ggml_mul_mat_id`` as ggml-cpu computes them, bit for bit, on the ``avx512`` and
``avx2`` paths (weights ``W`` of a ggml type, F32 activations, F32 out) — and on ggml's generic x86 path
(``"generic"``: :mod:`kernels.ggml.mulmat_generic`).

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

The AArch64 paths (``arm64-dotprod``, ``arm64-i8mm``: GCC builds without llamafile, where no tiled kernel exists)
take :mod:`kernels.ggml.mulmat_arm` — ``vec_dot`` per element, AArch64 activation quantizers, and on i8mm the 2-row
``smmla`` kernels of Q4_0, Q4_1, Q8_0, Q4_K, Q6_K in every chunk with even extents, so there the thread count,
a fused tensor's whole row count (``tensor_rows``) and a batched product (``head``) change bits; repacked ARM weights
take :mod:`kernels.ggml.repack_arm` / :mod:`kernels.ggml.repack_arm_k`, or from their column layout (``cols``)
:mod:`kernels.ggml.columns_arm` (the same bits); other ARM keys are refused.

Emulated weight types: F32, F16, BF16, Q8_0, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, the IQ1/2/3 codebook
types (:mod:`kernels.ggml.mulmat_iq`: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), and (in a plain
buffer, :mod:`kernels.ggml.mulmat_q`) Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL (others raise: TQ1_0, TQ2_0). ``avx512`` means
the build of this host (AVX-512 F/BW/DQ/VL with VNNI and BF16): without ``__AVX512BF16__`` ggml would take
other BF16 kernels. Not modelled: which NaN survives when two NaNs of different bits meet in one sum (an
activation or fp16-scale NaN payload and the default NaN of ``inf - inf`` / ``0·inf``) — x86 keeps the first
source operand's, i.e. it follows GCC's operand order per instruction; NaN-ness and all other bits match.
"""

from __future__ import annotations

import numpy as np

from kernels.base.block import QT
from kernels.base.flags import SERIAL_BELOW, read_only
from kernels.base.blocks import row_bytes
from kernels.ggml import columns, mulmat_arm, mulmat_generic, mulmat_iq, mulmat_k, mulmat_q, repack, repack_k
from kernels.ggml import columns_arm, repack_arm, repack_arm_k
from kernels.ggml.actquant import _q8_0_rows
from kernels.ggml.mulmat_vec import (
    bf16_bits_to_f32,
    f16_bits_to_f32,
    fp32_to_fp16_values,
    tinyblas_rows,
    tinyblas_rows_parallel,
    vec_dot_float_rows,
)
from kernels.ggml.mulmat_q8 import (  # Q8_0 and MXFP4 kernels, the argument checks
    _bytes,
    _check,
    _mxfp4_weights,
    _qt,
    _row_bytes,
    _sign_dot,  # noqa: F401 - kernels.ggml.mulmat._sign_dot, as docs and kernels cite it
    mxfp4_rows,
    q8_0_mul_mat,
    q8_0_mul_mat_id,
    slot_groups,
)
from kernels.ggml.build import X86_SIMD_PATHS
from kernels.ggml.simd import PATHS, check_path, lanes, simd
from kernels.ggml.vecmath import F16_TO_F32
from kernels.ggml.vecmath import cast_bf16 as fp32_to_bf16_bits  # ggml-impl.h: ggml_compute_fp32_to_bf16

FLOAT_KIND = {QT.F32: 0, QT.F16: 1, QT.BF16: 2}


# --------------------------------------------------------------------------------------------
# Dispatch


#: ``repack.cpp: ggml_repack_get_optimal_repack_type`` on x86: the weight types llama.cpp's CPU_REPACK buffer (its
#: default, ``use_extra_bufts``) re-lays out into interleaved blocks, per path, for a matrix of N % 8 == 0 rows; a
#: ``ggml_mul_mat`` / ``ggml_mul_mat_id`` on it runs that buffer's gemm/gemv (``forward_mul_mat``,
#: ``forward_mul_mat_id``): :mod:`kernels.ggml.repack` (Q4_0, IQ4_NL, MXFP4) and :mod:`kernels.ggml.repack_k` (Q4_K,
#: and Q2_K, repacked by AVX-512 builds only).
#: The chooser reads the ISA only (ggml_cpu_has_avx2 / _avx512), never GCC's tuning.
REPACKED = {**{p: frozenset({QT.Q4_0, QT.Q4_K, QT.IQ4_NL, QT.MXFP4} | ({QT.Q2_K} if lanes(p) == 16 else set()))
               for p in X86_SIMD_PATHS},
            "generic": frozenset()}  # without AVX2 the repack chooser picks nothing


def repacked(qtype, n_rows: int, path: str) -> bool:
    """Whether llama.cpp with its default CPU_REPACK buffer repacks a weight of ``qtype`` with ``n_rows`` rows
    (ggml's ne[1], per expert for a 3-D tensor) on ``path`` (the ARM paths: :data:`mulmat_arm.REPACK_ROWS`)."""
    if mulmat_arm.is_arm(path):
        return mulmat_arm.repacked(_qt(qtype), n_rows, path)
    return _qt(qtype) in REPACKED[path] and n_rows % 8 == 0


def repack_emulated(qtype, path: str) -> bool:
    """Whether the repacked kernels of ``qtype`` on ``path`` are emulated (:data:`REPACKED` minus what is not)."""
    if mulmat_arm.is_arm(path):
        return repack_arm_k.repack_arm_emulated(qtype, path)
    return QT(qtype) in REPACKED[path] and QT(qtype) in (repack.REPACK_Q4_B32 | repack_k.REPACK_K)


def kernel_for(qtype, path: str, T: int, N: int, K: int) -> str:
    """Which ggml-cpu kernel computes ``ggml_mul_mat`` of this shape on a weight in a plain CPU buffer: "tiled",
    "sgemm" or "vec_dot" (a repacked weight: :func:`mul_mat`'s ``repack``)."""
    if check_path(path) == "generic" or mulmat_arm.is_arm(path):  # no sgemm, no tiled kernel: docs/ggml-generic-x86.md
        return "vec_dot"  # §2; the ARM builds: no llamafile, tiled.cpp needs __AVX__ (kernels.ggml.mulmat_arm)
    qtype, L = _qt(qtype), lanes(path)
    if qtype in mulmat_k.TILED_TYPES and T >= mulmat_k.TILED_MIN_ROWS:
        return "tiled"
    if T >= 2:
        if qtype == QT.Q8_0 or qtype in mulmat_q.SGEMM_TYPES:
            return "sgemm"
        if qtype in FLOAT_KIND:
            kn = 32 if (qtype == QT.BF16 and path == "avx512") else L
            if K % kn == 0 and N % 4 == 0:
                return "sgemm"
    return "vec_dot"


def mul_mat_emulated(qtype, path: str | None = None) -> bool:
    """Whether ``mul_mat`` / ``mul_mat_id`` of ``qtype`` weights in a plain CPU buffer is emulated (on both SIMD
    paths; with ``path`` "generic", on ggml's generic x86 path: :data:`kernels.ggml.mulmat_generic.TYPES`)."""
    qtype = _qt(qtype)
    if path == "generic":
        return qtype in mulmat_generic.TYPES
    if path is not None and mulmat_arm.is_arm(path):
        return mulmat_arm.emulated(qtype, path)
    return (qtype in FLOAT_KIND or qtype in (QT.Q8_0, QT.MXFP4) or qtype in mulmat_k.KQUANT_TYPES
            or qtype in mulmat_q.LEGACY_TYPES or qtype in mulmat_iq.IQ_TYPES)


def mul_mat(w_bytes: np.ndarray, qtype, x: np.ndarray, path: str, n_threads: int = 1, repack: bool = False,
            tensor_rows: int | None = None, cols=None, head: tuple[int, int] | None = None) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` as ggml-cpu's ``path`` computes it: ``w_bytes`` (N, row bytes) uint8 rows of
    ``qtype``, ``x`` (T, K) float32 -> (T, N) float32. ``repack``: W was loaded into the CPU_REPACK buffer when
    that buffer takes it (llama.cpp's default; :func:`repacked` of the stored tensor's rows: ``tensor_rows`` when
    ``w_bytes`` is a row block of a fused tensor, default N). ``cols``: the same weights in the column layout
    (:mod:`kernels.ggml.columns`), or None; taken where that layout has the kernel ggml runs (Q4_0, IQ4_NL, MXFP4
    and Q4_K repacked; Q4_K, Q5_K and Q6_K in a plain buffer), the same bits as the stored rows'. ``n_threads`` is
    accepted for the record: no x86 path changes a bit with it — on ``arm64-i8mm`` it decides which elements take the
    2-row kernels (:func:`kernels.ggml.mulmat_arm.mmla_mask`), and so does ``head`` = (h, H): ``x`` is batch ``h`` of
    H that ggml multiplies in one product (attention's K·Q of head h), chunked together."""
    qtype = _qt(qtype)
    w_bytes, x = _check(w_bytes, qtype, x)
    if check_path(path) == "generic":
        return mulmat_generic.mul_mat(w_bytes, qtype, x)
    if mulmat_arm.is_arm(path):
        if repack and repacked(qtype, tensor_rows or w_bytes.shape[0], path):  # kernels.ggml.repack_arm, repack_arm_k
            if _columns_apply_arm(cols, qtype, w_bytes.shape[0], path):
                return columns_arm.mul_mat_cols_arm(cols, x, path)
            if qtype in repack_arm.REPACK_ARM_B32 and path in repack_arm.KERNELS_OF:  # checked above: no second check
                return repack_arm.mul_mat_checked(w_bytes, qtype, x, path)
            return repack_arm_k.repack_arm_kernels(qtype, path)[0](w_bytes, qtype, x, path)
        if (_columns_apply_arm(cols, qtype, w_bytes.shape[0], path, False) and head is None
                and mulmat_arm.block_mask(x.shape[0], w_bytes.shape[0], tensor_rows or w_bytes.shape[0], n_threads,
                                          qtype, path) is None):  # every element the 1-row vec_dot
            return columns_arm.mul_mat_cols_arm(cols, x, path, repacked=False)
        return mulmat_arm.compute(w_bytes, qtype, x, path, n_threads, tensor_rows=tensor_rows, head=head)
    if repack and repacked(qtype, tensor_rows or w_bytes.shape[0], path):
        if _columns_apply(cols, qtype, w_bytes.shape[0]):
            return columns.mul_mat_cols(cols, x)
        return _repack_kernels(qtype, path)[0](w_bytes, qtype, x, path)
    plain_cols = qtype in columns.PLAIN_KIND and _columns_apply(cols, qtype, w_bytes.shape[0])
    if plain_cols and columns.takes(qtype, x.shape[0]):
        return columns.mul_mat_cols(cols, x, repacked=False)
    return _compute(w_bytes, qtype, x, path, kernel_for(qtype, path, x.shape[0], w_bytes.shape[0], x.shape[1]))


def _columns_apply(cols, qtype: QT, n: int) -> bool:
    """Whether ``cols`` is a column layout of these weights (type and rows; None: there is none)."""
    if cols is None:
        return False
    if cols.qtype != qtype or cols.n_cols != n:
        raise ValueError(f"column layout of {cols.qtype.name} × {cols.n_cols} rows given for {qtype.name} × {n} rows")
    return True


def _columns_apply_arm(cols, qtype: QT, n: int, path: str, repacked: bool = True) -> bool:
    """:func:`_columns_apply` on an AArch64 ``path``, for a weight that CPU_REPACK takes (``repacked``) or one in a
    plain buffer: a layout that :mod:`kernels.ggml.columns_arm` runs, else ValueError."""
    if not _columns_apply(cols, qtype, n):
        return False
    if not columns_arm.covers(qtype, path, repacked):
        where = "" if repacked else " in a plain buffer"
        raise ValueError(f"mul_mat emulation: a column layout of {qtype.name}{where} given on the {path} path, which "
                         "has no kernel for it")
    return True


def _repack_kernels(qtype: QT, path: str):
    """(mul_mat, mul_mat_id) of the emulated repacked kernels of ``qtype`` (raises for a repacked type that is
    not emulated)."""
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
        w = read_only(w)  # F16 / BF16 widened here: read-only as F32's mapped rows, one compiled kernel for all
        if how == "sgemm":
            dp = kind == 2 and path == "avx512"
            big = x.shape[0] * w.shape[0] * w.shape[1] >= SERIAL_BELOW  # flags.SERIAL_BELOW: threads, same bits
            (tinyblas_rows_parallel if big else tinyblas_rows)(w, xv, out, 32 if dp else L, L, dp)
        else:
            vec_dot_float_rows(w, xv, out, kind, L)
        return out
    if qtype == QT.Q8_0:  # x86 quantize_row_q8_0, then vec_dot / tinyBLAS_Q0_AVX (the same formula)
        q8_0_mul_mat(w_bytes.view(np.int8), x, out, F16_TO_F32)
        return out
    if qtype == QT.MXFP4:
        xq, xd, _ = _q8_0_rows(x, False)  # x86 quantize_row_q8_0; xd holds the fp16 d values
        mxfp4_rows(*_mxfp4_weights(w_bytes), xq, xd, out, not simd(path).split_chains)  # the odd tail: tuning.py
        return out
    if qtype in mulmat_k.KQUANT_TYPES:
        return mulmat_k.mul_mat_k(w_bytes, qtype, x, path, how == "tiled")
    if qtype in mulmat_q.LEGACY_TYPES:
        return mulmat_q.mul_mat_q(w_bytes, qtype, x, path, how == "sgemm")
    if qtype in mulmat_iq.IQ_TYPES:
        return mulmat_iq.mul_mat_iq(w_bytes, qtype, x, path, how == "tiled")
    raise ValueError(f"mul_mat emulation: weight type {qtype.name} is not emulated")


def mul_mat_id(w_bytes: np.ndarray, qtype, x: np.ndarray, ids: np.ndarray, path: str, n_threads: int = 1,
               repack: bool = False, tensor_rows: int | None = None, cols=None):
    """``ggml_mul_mat_id(W, x, ids)``: ``w_bytes`` (E, N, row bytes) expert weights, ``x`` (T, n_x, K) float32
    with ``n_x`` = 1 (shared by all slots) or ``n_used``, ``ids`` (T, n_used) int32 expert of each slot ->
    (T, n_used, N) float32; slot ``s`` of token ``t`` is ``W[ids[t, s]] @ x[t, s % n_x]``. ``repack`` as in
    :func:`mul_mat`; the stored tensor's rows per expert decide (``tensor_rows``: 2N when ``w_bytes`` is the gate
    or up half of a fused gate_up tensor; default N); ``cols`` as in :func:`mul_mat` (the stack's, (E, ...))."""
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
    if check_path(path) == "generic":
        return mulmat_generic.mul_mat_id(w_bytes, qtype, x, ids)
    if mulmat_arm.is_arm(path):
        if repack and repacked(qtype, tensor_rows or N, path):  # kernels.ggml.repack_arm, repack_arm_k
            if _columns_apply_arm(cols, qtype, N, path):
                return columns_arm.mul_mat_id_cols_arm(cols, x, ids, path)
            if qtype in repack_arm.REPACK_ARM_B32 and path in repack_arm.KERNELS_OF:  # checked above: no second check
                return repack_arm.mul_mat_id_checked(w_bytes, qtype, x, ids, path)
            return repack_arm_k.repack_arm_kernels(qtype, path)[1](w_bytes, qtype, x, ids, path)
        if _columns_apply_arm(cols, qtype, N, path, False):  # every routed row the 1-row vec_dot
            return columns_arm.mul_mat_id_cols_arm(cols, x, ids, path, repacked=False)
        return mulmat_arm.mul_mat_id(w_bytes, qtype, x, ids, path, slot_groups)
    if repack and repacked(qtype, tensor_rows or N, path):
        if _columns_apply(cols, qtype, N):
            return columns.mul_mat_id_checked(cols, x, ids)
        return _repack_kernels(qtype, path)[1](w_bytes, qtype, x, ids, path)
    plain_cols = qtype in columns.PLAIN_KIND and _columns_apply(cols, qtype, N)
    if plain_cols and columns.takes(qtype, ids.size / len(np.unique(ids))):  # slots per expert
        return columns.mul_mat_id_checked(cols, x, ids, repacked=False)
    if qtype in mulmat_k.KQUANT_TYPES:  # vec_dot of every small group in one compiled call, split between threads
        return mulmat_k.mul_mat_id_k(w_bytes, qtype, x, ids, path)
    out = np.empty((T, n_used, N), np.float32)
    if qtype == QT.Q8_0:  # vec_dot per element, whatever the grouping: one compiled call
        q8_0_mul_mat_id(w_bytes.view(np.int8), ids, x, out, F16_TO_F32)
        return out
    order, bounds, experts, arow = slot_groups(ids, n_x)  # ggml groups the rows by expert, token order within one
    x2, out2 = x.reshape(T * n_x, K), out.reshape(T * n_used, N)
    for g, e in enumerate(experts.tolist()):
        slots = order[bounds[g]:bounds[g + 1]]  # (cne1,): this expert's (token, slot)s
        tiled = qtype in mulmat_k.TILED_TYPES and len(slots) >= mulmat_k.TILED_MIN_ROWS
        out2[slots] = _compute(w_bytes[e], qtype, x2[arow[slots]], path, "tiled" if tiled else "vec_dot")  # (cne1, N)
    return out


__all__ = ["mul_mat", "mul_mat_id", "kernel_for", "repacked", "repack_emulated", "lanes", "PATHS", "fp32_to_bf16_bits", "fp32_to_fp16_values"]
