"""``ggml_mul_mat`` / ``ggml_mul_mat_id`` with the weights in a plain CPU buffer on ggml-cpu's AArch64 GCC paths
(``arm64-dotprod``: ``-march=armv8.2-a+dotprod+fp16``; ``arm64-i8mm``: ``armv8.6-a+dotprod+fp16+i8mm``; and, below,
``arm64-base``: ``armv8-a``; ``arm64-sve128`` / ``arm64-sve256``: ``armv9-a+sve2+i8mm`` at 128 / 256 bits), bit for
bit: llama.cpp's ``--no-repack``, and every type and shape the CPU_REPACK buffer does not take (:data:`REPACK_ROWS`).

Dispatch (``ggml-cpu.c: ggml_compute_forward_mul_mat``): the ARM builds have no llamafile (the Android guide's
``GGML_LLAMAFILE=OFF``) and ``tiled/tiled.cpp``'s ``ggml_tiled_supported`` is false without ``__AVX__`` — so every
element is one ``vec_dot`` (``type_traits_cpu[type].vec_dot``) on the activations converted by ``from_float``:

* ``nrows``: with ``__ARM_FEATURE_MATMUL_INT8`` the ``vec_dot`` of Q4_0, Q4_1, Q8_0, Q4_K and Q6_K takes 2 weight rows
  × 2 activation rows at a time (``smmla``; :data:`MMLA_TYPES`), a different float formula from the 1-row kernel —
  but only in a chunk where ``nr0`` (N), ``ne11`` (T) and the chunk's extents are all even; the chunks come from
  the thread count (:func:`mmla_mask`), so on ``arm64-i8mm`` (and the SVE builds) the thread count changes bits. ``mul_mat_id`` always
  runs 1 row.
* F32 (``vec.cpp: ggml_vec_dot_f32``, NEON): 4 accumulators of 4 lanes over steps of 16 (``fmla``),
  ``GGML_F32x4_REDUCE`` (``(s0+s2)+(s1+s3)`` lane-wise, then ``vaddvq_f32`` = ``faddp`` twice:
  ``(l0+l1)+(l2+l3)``) into a float; the leftovers as GCC emitted them: blocks of 4 as a vector ``fmul`` added
  one by one, the last ``rem % 4`` as ``fmadd`` (:func:`kernels.ggml.vec.vec_dot_f32` with ``lanes`` = NEON).
* F16 (``ggml_vec_dot_f16`` with ``__ARM_FEATURE_FP16_VECTOR_ARITHMETIC``): **half precision** — 4 accumulators of
  8 *half* lanes fed by ``vfmaq_f16`` (one fp16 rounding per step), reduced with half ``fadd``s, widened to float
  (``fcvtl``/``fcvtl2``), added (float) and ``faddp``'d twice, then a double; the leftovers add float products to
  the double (:func:`kernels.ggml.vec.vec_dot_f16`). A sum beyond 65504 overflows to inf, as on the phone.
* BF16: no ``__ARM_FEATURE_BF16`` branch in ``ggml_vec_dot_bf16``: the scalar loop, float products summed in a
  double (:func:`kernels.ggml.mulmat_vec.vec_dot_bf16`'s scalar loop).
* Q8_0 and the other quantized types: activations by AArch64 ``quantize_row_q8_0``
  (:func:`kernels.ggml.actquant._quantize_rows_q8_0_arm`: ``FMAX`` propagates a NaN, ``id = 1/d``, ``vcvtnq``), then
  the ``arch/arm/quants.c`` kernels of :mod:`kernels.ggml.mulmat_arm_q` (Q8_0: ``vmlaq_n_f32`` compiled *unfused*,
  two accumulators of 4 lanes, ``fmadd`` for an odd last block; the i8mm 2-row kernel one float lane per element).

NaN: a NaN made from non-NaN operands is ARM's default NaN, +0x7FC00000 (:func:`arm_default_nan`; x86's is
0xFFC00000); which NaN survives when two NaNs of different bits meet in one sum is not modelled (as on x86).

The quantized types (Q8_0, Q4_0, MXFP4, IQ4_NL with AArch64 Q8_0 activations; Q4_K, Q5_K, Q6_K, IQ4_XS with Q8_K
activations — ``quantize_row_q8_K`` is ``quantize_row_q8_K_ref`` on ARM, whose ``nearest_int(iscale*x)`` the ARM GCC
build contracts into one ``fmla``) are in :mod:`kernels.ggml.mulmat_arm_q`, with their float formulas.

``arm64-base`` (armv8-a) runs the same kernels with nrows 1 and GCC's same float choices (the float instructions of
every ``vec_dot`` read in the three builds agree up to scheduling), but ``ggml_vdotq_s32`` is emulated with
``vmull_s8`` + ``vpaddlq_s16``: the same sums, other lanes — which matters where lanes are float accumulators (Q8_0,
Q4_0, Q5_0, Q4_1, Q5_1: ``mulmat_arm_q._lanes_1row``'s ``vmull``) — and F16's dot is in float
(:func:`kernels.ggml.vec.vec_dot_f16` with ``NEON_F32C``).

``arm64-sve128`` (SVE2 at 128 bits, with i8mm): the NEON kernels of the i8mm build where its ``vec_dot`` has no SVE
code (BF16, Q4_1, Q5_0, Q5_1, MXFP4, IQ4_NL, Q5_K, IQ4_XS, the IQ1/2/3 types: the float instructions agree), the SVE
code of F32 (:func:`kernels.ggml.sve.vec_dot_f32`), Q8_0 and Q4_0 (``mulmat_arm_q.SVE128_KIND``), Q2_K (4 float lanes:
``mulmat_arm_q._q2_k_sve``), Q3_K / Q4_K / Q6_K (SVE 1-row kernels rounding as the NEON ones; fused SVE+MMLA 2-row
kernels for Q4_K and Q6_K), F16 (SVE2 FMLALB/FMLALT: :func:`kernels.ggml.sve.vec_dot_f16`), and the NEON i8mm 2-row kernels
of Q4_0, Q4_1, Q8_0.

``arm64-sve256`` (the same library on a 256-bit SVE CPU: ``svcntb()`` is read at run time, so quants.c's ``case 256``
branches run): Q8_0 and Q4_0's SVE 1-row kernels in 8 fused lanes of 4 values a block, one FADDV of 8
(``mulmat_arm_q.SVE256_KIND``), Q2_K in 8 float lanes (``mulmat_arm_q._q2_k_sve``); everything else as
``arm64-sve128`` — the NEON kernels, the i8mm 2-row ones, and the ``case 256`` code of Q3_K and of Q4_K / Q6_K (1-row
and SVE+MMLA 2-row), which forms the same exact integers in wider vectors and meets the floats with the same
operations in the same order (read in quants.c; the library agrees at both lengths). F32 and F16: vec.cpp's SVE dots
at ``svcntw()`` = 8 float lanes (:func:`kernels.ggml.sve.vec_dot_f32`, :func:`kernels.ggml.sve.vec_dot_f16` with the
code :data:`kernels.ggml.isa.SVE256`).

``arm64-i8mm-clang`` / ``arm64-dotprod-clang`` / ``arm64-base-clang`` (those builds compiled by clang 14, ``-ffp-contract=on``;
tests/test_ggml_arm64_clang.py): those paths' kernels with clang's float choices — ``vmlaq_n_f32`` / ``vmlaq_f32`` / ``vmlsq_f32`` one ``fmla`` / ``fmls`` (the
32-value blocks' lanes and 2-row kernels, Q4_K / Q6_K's 2-row kernels: ``clang`` of :mod:`kernels.ggml.mulmat_arm_q`),
Q8_K's ``nearest_int`` not fused (``_q8_k_rows(fused=False)``), F32's leftovers in blocks of 8 (vec code
:data:`kernels.ggml.isa.NEON_CLANG`), no USDOT tail for Q5_0 (GCC's miscompile).

``arm64-sve128-clang`` (the SVE build compiled by clang 17 to 19): ``arm64-sve128``'s kernels (the SVE intrinsics
compile alike; F32's SVE dot has no scalar leftovers) with clang's choices in the NEON kernels it keeps, as
``arm64-i8mm-clang``'s (``clang``), Q8_K unfused, Q5_0 without the USDOT tail. ``arm64-sve128-clang14`` (clang 14 to
16): the same, and Q6_K's SVE 1-row kernel as those compile it: ACLE's ``_x`` forms leave a predicate's inactive
lanes unspecified, and ``svand_u8_x(pg16_8, mone, …)`` (a 16-bit predicate on bytes: the odd bytes inactive) is a
merging ``and`` there, so every odd code reads its two high bits as 3 (``mulmat_arm_q.k_rows``'s ``odd_hi3``). GCC
and clang 17+ compute every lane (unpredicated ``lsl`` / ``and``).

Other weight types raise :class:`kernels.ggml.build.NotEmulated` naming the op, the type and the path (no x86 kernel
stands in).
"""

from __future__ import annotations

import numpy as np

from kernels.base.block import QT
from kernels.base.flags import read_only
from kernels.ggml import build, mulmat_arm_q
from kernels.ggml.actquant import _q8_0_rows_arm, _q8_k_rows
from kernels.ggml.isa import _has_nan, f16_code, simd
from kernels.ggml.mulmat_vec import bf16_bits_to_f32, f16_bits_to_f32, fp32_to_fp16_values, vec_dot_float_rows
from kernels.ggml.vecmath import F16_TO_F32
from kernels.ggml.vecmath import cast_bf16 as fp32_to_bf16_bits

#: the AArch64 path keys this module emulates: every one (kernels.ggml.build.ARM64_PATHS); ``arm64-base`` (armv8-a: no
#: dotprod — ``ggml_vdotq_s32`` emulated, the same integers —, no FP16 arithmetic, nothing repacked) runs the same
#: NEON kernels but F16's dot in float (:func:`kernels.ggml.vec.vec_dot_f16` with ``NEON_F32C``)
ARM_PATHS = build.ARM64_PATHS
#: the armv8-a builds: no dotprod (``ggml_vdotq_s32`` emulated by vmull + vpaddl), nothing repacked
BASE_PATHS = ("arm64-base", "arm64-base-clang")
#: paths whose ``type_traits_cpu`` has ``__ARM_FEATURE_MATMUL_INT8`` (nrows = 2 for MMLA_TYPES)
I8MM_PATHS = ("arm64-i8mm", "arm64-sve128", "arm64-sve256", "arm64-i8mm-clang", "arm64-sve128-clang",
              "arm64-sve128-clang14")
#: the 32-value block kernels that differ from ``mulmat_arm_q.BLOCK32``'s kind on a path
BLOCK32_KINDS = {"arm64-i8mm": mulmat_arm_q.I8MM_KIND, "arm64-sve128": mulmat_arm_q.SVE128_KIND,
                 "arm64-sve256": mulmat_arm_q.SVE256_KIND, "arm64-sve128-clang": mulmat_arm_q.SVE128_CLANG_KIND,
                 "arm64-sve128-clang14": mulmat_arm_q.SVE128_CLANG_KIND}
#: the SVE paths' vector length in bits (``svcntb()·8``, which quants.c's ``switch``es read): 0 elsewhere
SVE_BITS = {p.key: p.sve_bits for p in build.EMULATED_PATHS if p.sve_bits}
#: ``ggml-cpu.c: type_traits_cpu[type].nrows`` = 2 under ``__ARM_FEATURE_MATMUL_INT8``
MMLA_TYPES = frozenset({QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q6_K})
#: the weight types emulated here
TYPES = (frozenset({QT.F32, QT.F16, QT.BF16}) | frozenset(mulmat_arm_q.BLOCK32) | frozenset(mulmat_arm_q.KQUANTS)
         | frozenset(mulmat_arm_q.IQ))
#: ``repack.cpp: ggml_repack_get_optimal_repack_type`` on NEON with dotprod (and i8mm): the types CPU_REPACK takes,
#: and the row multiple it needs (ne[1] % m == 0)
REPACK_ROWS = {QT.Q4_0: 4, QT.Q8_0: 4, QT.IQ4_NL: 4, QT.MXFP4: 4, QT.Q4_K: 8, QT.Q5_K: 8, QT.Q6_K: 8}


def is_arm(path: str) -> bool:
    """Whether ``path`` is an AArch64 key (every one: :func:`compute` refuses those not emulated here)."""
    return build.is_arm64(path)


def repacked(qtype: QT, n_rows: int, path: str = "arm64-dotprod") -> bool:
    """Whether CPU_REPACK re-lays out a weight of ``qtype`` with ``n_rows`` rows on the ARM ``path`` (the chooser
    needs dotprod or i8mm: nothing on ``arm64-base``)."""
    m = REPACK_ROWS.get(qtype)
    return m is not None and n_rows % m == 0 and path not in BASE_PATHS


def emulated(qtype: QT, path: str = "arm64-dotprod") -> bool:
    """Whether plain-buffer ``mul_mat`` / ``mul_mat_id`` of ``qtype`` weights is emulated on the ARM ``path``."""
    return qtype in TYPES and path in ARM_PATHS


def not_emulated(what: str, qtype: QT, path: str) -> ValueError:
    """The one-line error (:class:`kernels.ggml.build.NotEmulated`, a ValueError) naming the op, type and path."""
    return build.not_emulated(f"{what} of {qtype.name} weights in a plain buffer", path)


# --------------------------------------------------------------------------------------------
# Which elements the i8mm 2-row kernels compute


def mmla_mask(T: int, N: int, n_threads: int, qtype: QT, path: str, ne12: int = 1):
    """(ne12·T, N) bool: the elements of ``mul_mat`` that ``ggml_compute_forward_mul_mat`` hands to a 2-row
    ``vec_dot`` (None: none); ``ne12`` > 1: a batched product (``ne11`` = T rows per batch, ``nr1`` = ne12·T rows
    chunked together, as the per-head K·Q of attention). Mirrors its chunking: ``chunk_size`` 16 (64 when N or
    nr1 is 1), re-chunked by thread when there are fewer than ``4·nth`` chunks (``nchunk0 = nth`` along the longer
    side), and a chunk takes 2 rows only when N, T and both of its extents are even."""
    nr1 = T * ne12
    if path not in I8MM_PATHS or qtype not in MMLA_TYPES or N % 2 or T % 2:
        return None
    nth = max(1, int(n_threads))
    chunk = 64 if (N == 1 or nr1 == 1) else 16
    nchunk0, nchunk1 = -(-N // chunk), -(-nr1 // chunk)
    if nchunk0 * nchunk1 < nth * 4:
        nchunk0, nchunk1 = (nth, 1) if N > nr1 else (1, nth)
    dr0, dr1 = -(-N // nchunk0), -(-nr1 // nchunk1)
    mask = np.zeros((nr1, N), np.bool_)
    for c in range(nchunk0 * nchunk1):
        r0s, r1s = dr0 * (c % nchunk0), dr1 * (c // nchunk0)
        r0e, r1e = min(r0s + dr0, N), min(r1s + dr1, nr1)
        if (r0e - r0s) % 2 == 0 and (r1e - r1s) % 2 == 0:
            mask[r1s:r1e, r0s:r0e] = True
    return mask if mask.any() else None


def block_mask(T: int, N: int, rows: int, n_threads: int, qtype: QT, path: str):
    """:func:`mmla_mask` of N rows that are a row block of a ``rows``-row tensor ggml multiplies whole (llama.cpp's
    fused ``attn_qkv``, viewed after the product). Where the whole tensor's chunks take one kernel throughout, the
    block's position does not matter; else (mixed chunks, only on small shapes) it does and is not known here:
    NotEmulated."""
    if rows == N:
        return mmla_mask(T, N, n_threads, qtype, path)
    whole = mmla_mask(T, rows, n_threads, qtype, path)
    if whole is None:
        return None
    if whole.all():
        return np.ones((T, N), np.bool_)
    raise build.not_emulated(f"mul_mat of a {N}-row block of a {rows}-row {qtype.name} tensor whose i8mm chunks "
                             f"mix 2-row and 1-row kernels ({T} rows, {n_threads} threads)", path)


# --------------------------------------------------------------------------------------------
# Float weights


# --------------------------------------------------------------------------------------------
# Entry points (called by kernels.ggml.mulmat for an ARM path)


def compute(w_bytes: np.ndarray, qtype: QT, x: np.ndarray, path: str, n_threads: int = 1, nrows: int = 0,
            tensor_rows: int | None = None, head: tuple[int, int] | None = None):
    """``ggml_mul_mat(W, x)`` on an ARM path, weights in a plain buffer: ``w_bytes`` (N, row bytes) uint8, ``x``
    (T, K) float32 -> (T, N). ``nrows`` = 1 forces the 1-row kernels (``mul_mat_id``); 0: as ``mul_mat`` chunks.
    ``tensor_rows``: ``w_bytes`` is a row block of a fused tensor of that many rows, multiplied whole by ggml (the
    chunks, so the i8mm 2-row kernels, follow the whole tensor: :func:`block_mask`). ``head`` = (h, H): ``x`` is batch
    ``h`` of a product ggml computes over H batches at once (``ne12`` = H: attention's K·Q per head)."""
    if not emulated(qtype, path):
        raise not_emulated("mul_mat", qtype, path)
    T, N = x.shape[0], w_bytes.shape[0]
    out = np.empty((T, N), np.float32)
    if qtype in (QT.F32, QT.F16, QT.BF16):
        if qtype == QT.F32:
            w, xv, kind = w_bytes.view(np.float32), x, 0
        elif qtype == QT.F16:  # ggml_cpu_fp32_to_fp16: fcvt, nearest even
            w, xv, kind = f16_bits_to_f32(w_bytes.view(np.uint16)), fp32_to_fp16_values(x), 1
        else:  # ggml_cpu_fp32_to_bf16: GGML_FP32_TO_BF16
            w, xv, kind = bf16_bits_to_f32(w_bytes.view(np.uint16)), bf16_bits_to_f32(fp32_to_bf16_bits(x)), 2
        code = simd(path, "mul_mat").code if kind == 0 else f16_code(path, "mul_mat")  # F32: the vectorizer's leftovers
        vec_dot_float_rows(w, xv, out, kind, code)  # vec.py / sve.py dots
        return arm_default_nan(out)
    if nrows == 1:
        two = None
    elif head is not None:
        if tensor_rows not in (None, N):
            raise ValueError("mul_mat emulation: a batched product of a row block is not a ggml product")
        two = mmla_mask(T, N, n_threads, qtype, path, head[1])
        two = None if two is None else two[head[0] * T:(head[0] + 1) * T]
    else:
        two = block_mask(T, N, tensor_rows or N, n_threads, qtype, path)
    two = np.zeros((0, 0), np.bool_) if two is None else two
    clang = build.by_clang(path)  # the vmlaq_f32 family fused, Q8_K's nearest_int not, no USDOT tail for Q5_0
    if qtype in mulmat_arm_q.BLOCK32:  # activations: AArch64 quantize_row_q8_0 / _q8_1
        xq, xd, xs = _q8_0_rows_arm(x, qtype in mulmat_arm_q.Q8_1_TYPES)
        raw = qtype == QT.Q8_0  # its stored bytes read in place (no decoded copy of the matrix per product)
        if raw:
            v, dw, mw = np.ascontiguousarray(w_bytes).view(np.int8), _NO_SCALES, _NO_SCALES
        else:
            v, dw, mw = mulmat_arm_q.decode_block32(w_bytes, qtype)
        v, dw, mw = read_only(v), read_only(dw), read_only(mw)  # stored or decoded: one compiled block32_rows
        mulmat_arm_q.block32_rows(block32_kind(qtype, path), v, dw, mw, xq, xd, xs if xs.size else xd, out, two,
                                  path in BASE_PATHS, clang, raw)
    elif qtype in mulmat_arm_q.IQ:  # quantize_row_q8_K_ref, its nearest_int contracted by GCC (not by clang)
        yq, yd, ybs = _q8_k_rows(x, fused=not clang)
        mulmat_arm_q.iq_rows(mulmat_arm_q.IQ[qtype], np.ascontiguousarray(w_bytes), yq, yd, ybs, out, F16_TO_F32)
    else:  # K-quants: the same activations
        yq, yd, ybs = _q8_k_rows(x, fused=not clang)
        mulmat_arm_q.k_rows(mulmat_arm_q.KQUANTS[qtype], np.ascontiguousarray(w_bytes), yq, yd, ybs.astype(np.int64),
                            out, two, F16_TO_F32, SVE_BITS.get(path, 0), clang, path == "arm64-sve128-clang14")
    return arm_default_nan(out)


_NO_SCALES = np.zeros((0, 0), np.float32)  # Q8_0's scales are read from its bytes


def block32_kind(qtype: QT, path: str) -> int:
    """The :data:`kernels.ggml.mulmat_arm_q.BLOCK32` kernel ``kind`` of a 32-value type's 1-row ``vec_dot`` on the ARM
    ``path`` (its own kind where :data:`BLOCK32_KINDS` says the path's build differs)."""
    return BLOCK32_KINDS.get(path, {}).get(qtype) or mulmat_arm_q.BLOCK32[qtype][1]


def arm_default_nan(out: np.ndarray) -> np.ndarray:
    """AArch64's default NaN is +0x7FC00000 (FPCR.DN off: an operation on non-NaN operands that has no value —
    ``0·inf``, ``inf - inf`` — makes it); x86's, which the float32 arithmetic here makes, is 0xFFC00000. Every
    such NaN in ``out`` becomes ARM's (in place). A NaN propagated from an input keeps its payload on both."""
    if not _has_nan(out):  # the common case: one reduction
        return out
    u = out.view(np.uint32)
    u[u == np.uint32(0xFFC00000)] = np.uint32(0x7FC00000)
    return out


def mul_mat_id(w_bytes: np.ndarray, qtype: QT, x: np.ndarray, ids: np.ndarray, path: str, slot_groups):
    """``ggml_mul_mat_id`` on an ARM path (checked arguments, as :func:`kernels.ggml.mulmat.mul_mat_id`): every
    routed row through the 1-row ``vec_dot`` (``ggml_compute_forward_mul_mat_id_one_chunk`` passes nrc = 1)."""
    if not emulated(qtype, path):
        raise not_emulated("mul_mat_id", qtype, path)
    T, n_x, K = x.shape
    n_used, N = ids.shape[1], w_bytes.shape[1]
    out = np.empty((T, n_used, N), np.float32)
    order, bounds, experts, arow = slot_groups(ids, n_x)
    x2, out2 = x.reshape(T * n_x, K), out.reshape(T * n_used, N)
    for g, e in enumerate(experts.tolist()):
        slots = order[bounds[g]:bounds[g + 1]]
        out2[slots] = compute(w_bytes[e], qtype, x2[arow[slots]], path, nrows=1)
    return out
