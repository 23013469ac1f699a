"""``ggml_mul_mat`` / ``ggml_mul_mat_id`` of a weight in llama.cpp's ``CPU_REPACK`` buffer on the AArch64 GCC
builds (paths ``arm64-dotprod``, ``arm64-i8mm``, and the SVE build at 128 and 256 bits: ``arm64-sve128``,
``arm64-sve256``), bit for bit: Q8_0, Q4_0, IQ4_NL and MXFP4 (the 32-value block types, Q8_0 activations). The
K-quants, and the dispatch :mod:`kernels.ggml.mulmat` calls, are :mod:`kernels.ggml.repack_arm_k`. The weights are
taken in the plain GGUF layout: the interleaving changes no value, only where the bytes sit.

Source (vendored llama.cpp, ``ggml/src/ggml-cpu``):

* ``repack.cpp: ggml_repack_get_optimal_repack_type`` on ARM (:data:`REPACK_ARM`): with i8mm Q4_0 and Q8_0 take
  ``4x8``, with dotprod only ``4x4``; IQ4_NL and MXFP4 ``4x4`` on both; Q4_K, Q5_K, Q6_K ``8x8`` (i8mm) /
  ``8x4`` (dotprod). The 32-value types need ``ne[1] % 4 == 0`` rows, the K-quants ``% 8``. (Q1_0 too, not
  emulated; Q2_K is repacked by AVX-512 only.) ``arm64-base`` (NEON alone) repacks nothing; ``arm64-sve128`` takes
  the i8mm choices and runs the i8mm NEON code (the SVE bodies are for 256-bit vectors): :data:`KERNELS_OF`.
  ``arm64-sve256`` (the same SVE library where ``svcntb() == 32``) takes them too but for Q4_0 with ``ne[1] % 8 ==
  0``, ``q4_0_8x8`` (``ggml_cpu_get_sve_cnt() == QK8_0``), and runs the SVE bodies of ``ggml_gemv_q4_0_8x8_q8_0``,
  ``ggml_gemm_q4_0_8x8_q8_0`` and ``ggml_gemm_q8_0_4x8_q8_0`` (``svcntb() * 8 == 256``): the bits of the i8mm
  kernels, by construction (:data:`FUSED`; Q4_K's 256-bit gemm is :mod:`kernels.ggml.repack_arm_k`'s).
* ``repack.cpp: forward_mul_mat`` quantizes the activation rows in groups of four with
  ``arch/arm/repack.cpp: ggml_quantize_mat_q8_0_4x4`` / ``_4x8`` and the last ``T % 4`` rows with ``from_float``
  = ``arch/arm/quants.c: quantize_row_q8_0``. All three are one float recipe (:func:`quantize_q8_0_arm`):
  ``amax`` by ``vmaxq_f32`` / ``vmaxvq_f32`` (``fmax``: a NaN anywhere in the block makes amax NaN), ``d =
  amax/127``, ``id = d ? 1/d : 0`` (NaN is true), ``q = (int8) vcvtnq_s32_f32(x·id)`` — round half to even,
  saturated to int32 (NaN -> 0), then *truncated* to its low byte (``strb``): +inf -> -1, -inf -> 0 — and the
  stored ``d`` by ``GGML_CPU_FP32_TO_FP16`` (the bit-trick conversion, round to nearest even; NaN -> 0x7e00).
  It differs from x86's ``quantize_row_q8_0`` (``127/amax``, saturating packs, NaN -> -128, NaN skipped by
  ``_mm256_max_ps``). ``forward_mul_mat_one_chunk`` then runs the gemm on the first ``T - T % 4`` rows when
  ``T > 3`` and one gemv per remaining row; ``forward_mul_mat_id`` quantizes every row with ``from_float`` and
  runs the gemv only. Columns are chunked in whole 4-column groups: who computes what, not how.

Per output element ``(t, r)``: ``acc = +0``, then per 32-value block ``b`` in order, with ``dot_b`` the exact
integer dot (``sdot`` / ``smmla`` on int8 x int8: no wrap, no sign trick; Q4_0's nibbles enter as ``16·(n-8)``
and leave through ``vcvtq_n_f32_s32(·, 4)``, an exact /16) and ``d = float32(d_w[r, b] · d_x[t, b])``
(``vmulq_f32`` / ``vmulq_laneq_f32``; ``d_w`` the fp16 ``d``, for MXFP4 ``GGML_CPU_E8M0_TO_FP32_HALF(e)``
against ``kvalues_mxfp4``, the E2M1 values doubled)::

    fused:    acc = fma(float(dot_b), d, acc)                (vfmaq_f32, and the fmla of the Q4_0 asm)
    unfused:  acc = acc + float32(d · float(dot_b))          (vmlaq_f32: GCC 12 emits fmul + fadd)

Which one (:data:`FUSED`, read off ``aarch64-linux-gnu-objdump -d libggml-cpu.so`` of both builds): Q4_0 gemv and
gemm (4x4, 4x8) and Q8_0 gemv (4x4, 4x8) and Q8_0 gemm 4x8 (i8mm) fuse; Q8_0 gemm 4x4 (dotprod) and every IQ4_NL
and MXFP4 kernel do not; on ``arm64-sve256`` the 256-bit SVE bodies fuse as the i8mm code does — Q4_0 8x8's gemv
asm ``sdot``s the nibbles as ``16·(n-8)``, shifts the sum right by 4 (exact) and ``fmla``s it with ``fmul(d_w, d_x)``;
its gemm asm ``fmla``s ``float(16·dot)`` with ``fmul(fscale(d_w, -4), d_x)`` — ``d_w/16`` exact (an fp16 value
is >= 2^-24), the product ``float32(d_w·d_x)/16`` exactly (no float32 subnormal: ``|d_w·d_x| >= 2^-48``), so
the same FMA of the same real product —, and Q8_0 4x8's SVE gemm is ``svmla_f32`` (``fmla``) of
``svmul_lane_f32(d_w, d_x)``. So on ``arm64-dotprod`` a Q8_0 gemm row and a gemv row of the same activations differ,
and Q8_0's bits differ between the two GCC builds; the other types give the same bits on both. (The clang build,
``-ffp-contract=on``, contracts ``vmlaq_f32`` too: every kernel fuses — ``arm64-i8mm-clang`` in
:data:`KERNELS_OF`, checked against that build.) One float accumulator per output: no lanes, no horizontal sum,
and the thread count changes no bit.

NaNs: AArch64's default NaN (``0·inf``, ``inf - inf``) is +0x7fc00000, x86's -0x7fc00000 (0xffc00000), so every
NaN of an output is made +0x7fc00000 (:func:`arm_nans`) — the bits ARM gives when the NaN is generated or comes
from an activation (the quantizer's NaN ``d`` is fp16 0x7e00). Not modelled: the payload and sign of a NaN that
comes from a weight's fp16 scale (ARM propagates the quieted operand).
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from kernels.base.block import QT
from kernels.base.flags import SERIAL_BELOW, jit, per_type
from kernels.ggml.actquant import _q8_0_rows_arm, _quantize_rows_q8_0, _quantize_rows_q8_0_arm
from kernels.ggml.mulmat_q8 import _bytes, _check, _qt
from kernels.ggml.repack import _TYPES as _Q4_TYPES
from kernels.ggml.repack import _lut_words, _nibble
from kernels.ggml.simd import fma32
from kernels.ggml.vecmath import F16_TO_F32

F32 = np.float32
_DOTPROD = {QT.Q4_0: (4, "4x4"), QT.Q8_0: (4, "4x4"), QT.IQ4_NL: (4, "4x4"), QT.MXFP4: (4, "4x4"),
            QT.Q4_K: (8, "8x4"), QT.Q5_K: (8, "8x4"), QT.Q6_K: (8, "8x4")}
_I8MM = {QT.Q4_0: (4, "4x8"), QT.Q8_0: (4, "4x8"), QT.IQ4_NL: (4, "4x4"), QT.MXFP4: (4, "4x4"),
         QT.Q4_K: (8, "8x8"), QT.Q5_K: (8, "8x8"), QT.Q6_K: (8, "8x8")}
#: ``ggml_repack_get_optimal_repack_type`` on the ARM paths: type -> (rows multiple, kernel ``NB_COLSxINTER``). NEON
#: alone (``arm64-base``) repacks nothing (every ARM choice needs dotprod or i8mm); SVE at 128 bits takes the i8mm
#: choices (Q4_0's 8x8 needs ``svcntb() == 32``) and, its SVE kernel bodies being for 256 bits only, the NEON i8mm
#: code: the same bits (checked against ``arm64-sve128-gcc``).
#: ``arm64-sve256``: the i8mm choices, and Q4_0's ``8x8`` where ``ne[1] % 8 == 0`` (``svcntb() == QK8_0``; else
#: ``4x8``, rows % 4: the same bits, module docstring)
_SVE256 = {**_I8MM, QT.Q4_0: (4, "8x8")}
REPACK_ARM = {
    "arm64-base": {},
    "arm64-base-clang": {},
    "arm64-dotprod": _DOTPROD,
    "arm64-dotprod-clang": _DOTPROD,
    "arm64-i8mm": _I8MM,
    "arm64-sve128": _I8MM,
    "arm64-i8mm-clang": _I8MM,
    "arm64-sve128-clang": _I8MM,
    "arm64-sve128-clang14": _I8MM,
    "arm64-sve256": _SVE256,
}
#: The AArch64 paths whose repacked kernels are emulated -> the kernels they run. ``arm64-…-clang``: the clang
#: builds of the i8mm and dotprod kernels (``-ffp-contract=on`` contracts ``vmlaq_f32`` / ``vmlsq_f32`` into
#: ``fmla`` / ``fmls``, but not ``nearest_int``'s add). ``arm64-sve256``: its own, the SVE bodies for 256 bits
#: (here the i8mm recipes; Q4_K's gemm is not: :data:`kernels.ggml.repack_arm_k.GEMM_GEMV`).
KERNELS_OF = {"arm64-dotprod": "arm64-dotprod", "arm64-i8mm": "arm64-i8mm", "arm64-sve128": "arm64-i8mm",
              "arm64-i8mm-clang": "arm64-i8mm-clang", "arm64-dotprod-clang": "arm64-dotprod-clang",
              "arm64-sve128-clang": "arm64-i8mm-clang", "arm64-sve128-clang14": "arm64-i8mm-clang",
              "arm64-sve256": "arm64-sve256"}
ARM_PATHS = tuple(KERNELS_OF)
#: The 32-value block types emulated here.
REPACK_ARM_B32 = frozenset({QT.Q8_0, QT.Q4_0, QT.IQ4_NL, QT.MXFP4})
#: (type, kernels' path) -> (gemm fused, gemv fused): whether the kernel's float step is one FMA (module docstring).
FUSED = {
    (QT.Q8_0, "arm64-dotprod"): (False, True),  # gemm 4x4 vmlaq_f32 (fmul+fadd), gemv 4x4 vfmaq_f32
    (QT.Q8_0, "arm64-i8mm"): (True, True),  # gemm 4x8 (smmla) vfmaq_f32, gemv 4x8 vfmaq_f32
    (QT.Q8_0, "arm64-sve256"): (True, True),  # gemm 4x8 SVE svmla_f32 (fmla), gemv 4x8 vfmaq_f32
    **{(QT.Q4_0, p): (True, True) for p in ("arm64-dotprod", "arm64-i8mm")},  # gemm asm fmla, gemv vfmaq_f32
    (QT.Q4_0, "arm64-sve256"): (True, True),  # 8x8 SVE asm fmla (4x8 where ne[1] % 8: the i8mm code)
    **{(q, p): (False, False) for q in (QT.IQ4_NL, QT.MXFP4)
       for p in ("arm64-dotprod", "arm64-i8mm", "arm64-sve256")},  # vmlaq_f32 (NEON 4x4 only)
    **{(q, p): (True, True) for q in (QT.Q8_0, QT.Q4_0, QT.IQ4_NL, QT.MXFP4)
       for p in ("arm64-i8mm-clang", "arm64-dotprod-clang")},  # clang: all fmla
}


def check_arm_path(path: str) -> str:
    """The path whose repacked kernels ``path`` runs (:data:`KERNELS_OF`), else ValueError naming it."""
    if path not in KERNELS_OF:
        raise ValueError(f"AArch64 repacked kernels: path must be one of {ARM_PATHS}, got {path!r}")
    return KERNELS_OF[path]


def repacked_arm(qtype, n_rows: int, path: str) -> bool:
    """Whether llama.cpp's CPU_REPACK buffer repacks a weight of ``qtype`` with ``n_rows`` rows (ne[1], per expert)
    on the AArch64 ``path`` (a key of :data:`REPACK_ARM`)."""
    if path not in REPACK_ARM:
        raise ValueError(f"AArch64 repack choice: path must be one of {tuple(REPACK_ARM)}, got {path!r}")
    entry = REPACK_ARM[path].get(_qt(qtype))
    return entry is not None and n_rows % entry[0] == 0


# --------------------------------------------------------------------------------------------
# quantize_row_q8_0 / ggml_quantize_mat_q8_0_4x4 / _4x8 (arch/arm)


def quantize_q8_0_arm(x: np.ndarray):
    """(qs (R, K) int8, d (R, K/32) float32) of the AArch64 Q8_0 quantizer (module docstring; the one recipe of
    ``quantize_row_q8_0`` and ``ggml_quantize_mat_q8_0_4x4`` / ``_4x8``: :func:`kernels.ggml.actquant._q8_0_rows_arm`)
    for float32 rows x (R, K)."""
    qs, d, _ = _q8_0_rows_arm(np.ascontiguousarray(x, np.float32), False)
    return qs, d


# --------------------------------------------------------------------------------------------
# gemv / gemm: one accumulator per output element


#: Per type: (bytes of the block's scale, 4-bit LUT as two words (Q8_0: none), scale table).
def _constants(qt: QT):
    if qt == QT.Q8_0:
        return 2, 0, 0
    lut, hdr, _ = _Q4_TYPES[qt]
    return (hdr, *_lut_words(lut))


def _table(qt: QT):
    return F16_TO_F32 if qt == QT.Q8_0 else _Q4_TYPES[qt][2]


@intrinsic
def _dot32(typingctx, w, wo, y, yo):
    """The exact integer dot of 32 int8 weights ``w[wo:wo + 32]`` and activations ``y[yo:yo + 32]`` (1-D int8
    arrays) as target-independent IR: both sides sign-extended to i32, multiplied (``|w·y| <= 2^14``: exact) and
    summed (``llvm.vector.reduce.add``; integers: any order, the same sum as ``sdot`` /
    ``smmla``) — no sign trick, so -128 on either side is exact."""
    sig = types.int32(w, wo, y, yo)

    def codegen(context, b, signature, args):
        v8, v32 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(ir.IntType(32), 32)

        def load(i):  # 32 bytes from element args[i + 1] of array args[i]
            data = context.make_array(signature.args[i])(context, b, args[i]).data
            return b.load(b.bitcast(b.gep(data, [args[i + 1]]), v8.as_pointer()), align=1)

        p = b.mul(b.sext(load(0), v32), b.sext(load(2), v32))
        add = ir.FunctionType(ir.IntType(32), [v32])
        return b.call(cgutils.get_or_insert_function(b.module, add, "llvm.vector.reduce.add.v32i32"), [p])

    return sig, codegen


#: weight rows a task of :func:`_rows_for`'s kernel takes (each element's chain of float steps in one register, in
#: order: the same bits; the next blocks' integer dots overlap it)
ROW_TILE = 16


@per_type
def _rows_for(qt, parallel):
    """The repacked gemm/gemv of every element, compiled for one type, in one call per op: ``w`` (E, N, row bytes)
    plain rows (uint8; Q8_0's as int8) (E = 1: a ``mul_mat``; the experts of a ``mul_mat_id``), ``tab`` the scale
    table, ``x`` (R, K) float32 activations, quantized here (AArch64 ``quantize_row_q8_0``; ``x86_quant``: x86's, a
    wrong model for the tests), ``fused`` (R,) bool per activation row (module docstring); output row ``i`` = slot
    (t, s) of ``n_used`` per token is ``w[we[i]]`` against activation row ``t·n_x + s % n_x`` (a ``mul_mat``: 1, 1):
    out (S, N), every NaN made AArch64's default NaN (in the kernel, as :func:`arm_nans` does)."""
    qt = QT(qt)
    hdr, lo, hi = _constants(qt)
    q8 = qt == QT.Q8_0
    bs = 34 if q8 else hdr + 16

    @jit(parallel=parallel, kind=int(qt), variant="arm" if parallel else "arm-serial")
    def _rows(w, we, n_used, n_x, tab, x, x86_quant, fused, out):
        R, K = x.shape
        nb, N = K // 32, w.shape[1]
        xq, xd, no_s = np.empty((R, K), np.int8), np.empty((R, nb), F32), np.empty((R, 0), F32)
        if x86_quant:
            _quantize_rows_q8_0(x, xq, xd, no_s)
        else:  # quantize_mat_q8_0_4x{4,8} == quantize_row_q8_0 on ARM, bit for bit
            _quantize_rows_q8_0_arm(x, xq, xd, no_s)
        y = xq if q8 else xq.astype(np.int32)  # (R, K)
        outu = out.view(np.uint32)
        for tile in prange((N + ROW_TILE - 1) // ROW_TILE):  # independent outputs, ROW_TILE weight rows a task
            r0 = tile * ROW_TILE
            r1 = min(r0 + ROW_TILE, N)
            for i in range(we.shape[0]):
                t = (i // n_used) * n_x + (i % n_used) % n_x  # slot (t, s) reads activation row t·n_x + s % n_x
                yt, wi, fu = y[t], w[we[i]], fused[t]  # wi: Q8_0 int8 (the bytes' view), else uint8
                for r in range(r0, r1):  # each element's chain of float steps in order; the blocks' dots overlap it
                    wr = wi[r]
                    a = F32(0.0)
                    for b in range(nb):
                        o, yo, xdb = bs * b + hdr, 32 * b, xd[t, b]
                        s = np.int32(0)  # the exact integer dot (|s| <= 32·128·128)
                        if q8:
                            s = _dot32(wr, o, yt, yo)
                        else:  # value j: low nibble of byte j; value j + 16: its high nibble
                            for j in range(16):  # (a known count: the nibbles' shifts vectorize unrolled)
                                q = np.int64(wr[o + j])
                                s += np.int32(_nibble(q & 15, lo, hi)) * yt[yo + j]
                                s += np.int32(_nibble(q >> 4, lo, hi)) * yt[yo + j + 16]
                        if hdr == 2:
                            dw = tab[(np.int64(wr[o - 2]) & 255) | ((np.int64(wr[o - 1]) & 255) << 8)]  # vcvt_f16
                        else:
                            dw = tab[np.int64(wr[o - 1])]  # GGML_CPU_E8M0_TO_FP32_HALF(e)
                        d = F32(dw * xdb)  # vmulq_f32
                        if fu:
                            a = fma32(F32(s), d, a)  # vfmaq_f32 / fmla
                        else:
                            a = a + F32(d * F32(s))  # vmlaq_f32: fmul, fadd
                    if a != a:
                        outu[i, r] = ARM_DEFAULT_NAN
                    else:
                        out[i, r] = a

    return _rows


_ZEROS = np.zeros(512, np.int32)  # a mul_mat's one weight matrix, for each activation row

#: AArch64's default NaN (``inf - inf``, ``0·inf``): positive quiet, where x86's is negative (0xffc00000).
ARM_DEFAULT_NAN = 0x7FC00000


def arm_nans(out: np.ndarray) -> np.ndarray:
    """``out`` with every NaN made AArch64's default NaN (:data:`ARM_DEFAULT_NAN`), in place: the NaNs this
    emulation computes on x86 carry x86's sign; on ARM a NaN made from non-NaN operands is +0x7fc00000, and so is
    a Q8_0 activation block's NaN ``d`` (fp16 0x7e00)."""
    np.copyto(out.view(np.uint32), np.uint32(ARM_DEFAULT_NAN), where=np.isnan(out))
    return out


def _slots(w3, we, n_used: int, n_x: int, qt: QT, x, fused, x86_quant: bool = False) -> np.ndarray:
    """(S, N): output row ``i`` = ``w3[we[i]]`` (E, N, row bytes; ``we`` int32) against the activation row of slot
    ``i`` of ``x`` (R, K) float32 (:func:`_rows_for`), one compiled call."""
    S, N = we.shape[0], w3.shape[1]
    out = np.empty((S, N), np.float32)
    if S and N:
        kernel = _rows_for(qt, S * N * x.shape[1] >= SERIAL_BELOW)
        kernel(w3.view(np.int8) if qt == QT.Q8_0 else w3, we, n_used, n_x, _table(qt), x, x86_quant, fused, out)
    return out


def _run(w2d, qt: QT, x, fused, x86_quant: bool = False) -> np.ndarray:
    """(T, N): weight rows ``w2d`` (N, row bytes) against every activation row of ``x`` (T, K) (:func:`_slots`)."""
    T = x.shape[0]
    return _slots(w2d[None], _ZEROS[:T] if T <= _ZEROS.shape[0] else np.zeros(T, np.int32), 1, 1, qt, x, fused,
                  x86_quant)


def _check_type(qtype, path: str) -> QT:
    qt = _qt(qtype)
    check_arm_path(path)
    if qt not in REPACK_ARM_B32:
        raise ValueError(f"AArch64 repacked kernels: {qt.name} is not Q8_0, Q4_0, IQ4_NL or MXFP4")
    return qt


def mul_mat_repacked_arm(w_bytes: np.ndarray, qtype, x: np.ndarray, path: str) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` with ``W`` repacked on an AArch64 ``path`` (``forward_mul_mat``): ``w_bytes`` (N, row
    bytes) uint8 plain rows, ``x`` (T, K) float32 -> (T, N) float32. Whether ggml repacks the stored tensor (its rows
    a multiple of 4) is the caller's question (:func:`repacked_arm`): every element is computed alone, so ``w_bytes``
    may be a row block of a fused tensor."""
    qt = _check_type(qtype, path)
    w_bytes, x = _check(w_bytes, qt, x)
    return mul_mat_checked(w_bytes, qt, x, path)


def mul_mat_checked(w_bytes: np.ndarray, qt: QT, x: np.ndarray, path: str) -> np.ndarray:
    """:func:`mul_mat_repacked_arm` of arguments already checked (:func:`kernels.ggml.mulmat.mul_mat`'s dispatch:
    ``qt`` one of :data:`REPACK_ARM_B32`, ``path`` one of :data:`ARM_PATHS`, ``w_bytes`` and ``x`` through ``_check``)."""
    return _run(w_bytes, qt, x, _fused_rows(x.shape[0], *FUSED[(qt, KERNELS_OF[path])]))


@functools.lru_cache(maxsize=64)
def _fused_rows(T: int, gemm_fused: bool, gemv_fused: bool) -> np.ndarray:
    """(T,) bool, read-only: whether activation row ``t``'s float steps fuse — gemm on the first ``T - T % 4``
    rows, gemv on the rest (``forward_mul_mat_one_chunk``)."""
    fused = np.full(T, gemm_fused)
    fused[T - T % 4:] = gemv_fused
    fused.flags.writeable = False
    return fused


def mul_mat_id_repacked_arm(w_bytes: np.ndarray, qtype, x: np.ndarray, ids: np.ndarray, path: str) -> np.ndarray:
    """``ggml_mul_mat_id(W, x, ids)`` with ``W`` repacked on an AArch64 ``path`` (``forward_mul_mat_id``: a gemv per
    routed row): ``w_bytes`` (E, N, row bytes), ``x`` (T, n_x, K) float32, ``ids`` (T, n_used) int32 -> (T, n_used,
    N) float32; slot ``s`` of token ``t`` is ``W[ids[t, s]] @ x[t, s % n_x]``."""
    qt = _check_type(qtype, path)
    x = np.ascontiguousarray(x, np.float32)
    w_bytes = _bytes(w_bytes)
    ids = np.asarray(ids, np.int32)
    T, n_x, K = x.shape
    if w_bytes.ndim != 3:
        raise ValueError(f"weights must be (E, N, row bytes), got {w_bytes.shape}")
    E, N = w_bytes.shape[:2]
    _check(w_bytes[0], qt, x[:0, 0])  # the row length
    if ids.ndim != 2 or ids.shape[0] != T or (ids < 0).any() or (ids >= E).any():
        raise ValueError(f"ids must be (T={T}, n_used) experts in [0, {E}), got {ids.shape}")
    return mul_mat_id_checked(w_bytes, qt, x, ids, path)


def mul_mat_id_checked(w_bytes: np.ndarray, qt: QT, x: np.ndarray, ids: np.ndarray, path: str) -> np.ndarray:
    """:func:`mul_mat_id_repacked_arm` of arguments already checked (:func:`kernels.ggml.mulmat.mul_mat_id`'s
    dispatch: ``x`` (T, n_x, K) contiguous float32, ``w_bytes`` (E, N, row bytes) with rows contiguous, ``ids`` (T,
    n_used) int32 in range; ``qt``, ``path`` as :func:`mul_mat_checked`)."""
    T, n_x, K = x.shape
    N = w_bytes.shape[1]
    gemv_fused = FUSED[(qt, KERNELS_OF[path])][1]
    n_used = ids.shape[1]
    fused = _fused_rows(T * n_x, gemv_fused, gemv_fused)
    out = _slots(w_bytes, ids.reshape(-1), n_used, n_x, qt, x.reshape(T * n_x, K), fused)  # every routed row: gemv
    return out.reshape(T, n_used, N)


__all__ = ["ARM_PATHS", "REPACK_ARM", "REPACK_ARM_B32", "FUSED", "repacked_arm", "quantize_q8_0_arm",
           "mul_mat_repacked_arm", "mul_mat_id_repacked_arm"]
