"""Q4_K, Q5_K and Q6_K weights in llama.cpp's CPU_REPACK buffer on the AArch64 GCC builds (``arm64-dotprod``:
``q{4,5,6}_K_8x4_q8_K``, ``arm64-i8mm`` and the SVE build at 128 and 256 bits: ``q{4,5,6}_K_8x8_q8_K``; ``ne[1] % 8
== 0``), bit for bit.

Source (vendored llama.cpp, ``ggml/src/ggml-cpu``): ``repack.cpp: forward_mul_mat`` (gemm on the first ``T - T % 4``
rows, gemv on the rest; ``forward_mul_mat_id``: gemv only), the kernels in ``arch/arm/repack.cpp``.

Activations (:func:`quantize_rows_q8_k_arm`): the gemm rows by ``ggml_quantize_mat_q8_K_4x4`` (8x4) / ``_4x8``
(8x8) — on ARM the ``_generic`` C of ``repack.cpp`` —, the gemv rows by ``from_float`` = ``quantize_row_q8_K_ref``
(``libggml-base``). Both are the reference recipe — ``amax`` the first largest ``|x|`` (a NaN is never it),
``iscale = -127/max``, ``d = 1/iscale``, ``q = nearest_int(x·iscale)`` — and GCC contracts ``x·iscale + 1.5·2^23``
of ``nearest_int`` into one ``fmadd``/``fmla`` in both (objdump), so ``q`` is the exact product rounded half to
even, read from the low mantissa bits and stored as its low byte. (The mat version lacks ref's ``MIN(127, ·)`` and
its ``amax == 0`` branch; neither changes a value: ``|x·iscale| <= 127·(1 + 2^-24)``.) bsums per 16 values.

Integers per weight row and activation row, exact in int32 (``sdot`` / ``smmla``, ``vmlaq_s32``): Q4_K / Q5_K per
32-value sub-block ``s`` ``I_s = sc_s · Σ q·y`` and ``m_s = mn_s · (bsum_{2s} + bsum_{2s+1})`` (``vpaddq_s16``,
``vmlal_s16``), ``M = Σ m_s`` per super-block; Q6_K per super-block ``I = Σ_g sc_g · Σ (q - 32)·y`` over its
16-value groups (the -32 through the bsums: the same integer). Floats: ``S = float32(fp16(d) · y.d)``, ``Dm =
float32(fp16(dmin) · y.d)`` per super-block, ``acc = +0``; GCC 12 emits ``vfmaq_f32`` as ``fmla`` but
``vmlaq_f32`` / ``vmlsq_f32`` as ``fmul`` + ``fadd`` / ``fsub`` (objdump), so (:data:`GEMM_GEMV`)::

    Q4_K, Q5_K 8x4 gemv and gemm (dotprod): per 64 values acc = fma(S, float(I_2k + I_2k+1), acc);
                                            then             acc = acc - float32(float(M) · Dm)
    Q4_K 8x8 gemv (i8mm build):             per 32 values    acc = fma(S, float(I_s), acc);  then the same
    Q5_K 8x8 gemv:                          per 32 values the FMA, and after each 64 values
                                                             acc = acc - float32(Dm · float(m_2k + m_2k+1))
    Q4_K, Q5_K 8x8 gemm (i8mm, smmla):      per super-block  acc = acc - float32(float(M) · Dm);
                                                             acc = acc + float32(float(Σ_s I_s) · S)
    Q6_K 8x4 gemv (dotprod):                per super-block  acc = fma(float(I), S, acc)   (vmulq + vaddq contracted)
    Q6_K 8x4 gemm, 8x8 gemv and gemm:       per super-block  acc = acc + float32(float(I) · S)

So the gemm rows and the gemv rows of one call differ on ``arm64-i8mm`` (Q4_K, Q5_K) and for Q6_K on
``arm64-dotprod``. The clang builds (``arm64-i8mm-clang``, ``arm64-dotprod-clang``) contract every ``vmlaq_f32`` /
``vmlsq_f32`` into ``fmla`` / ``fmls`` (:data:`FUSED_MINS`: the mins and the 8x8 gemm's step are one FMA each; Q6_K's
gemm fuses, its gemv's ``vmul(q)_f32`` + ``vaddq_f32`` do not — the 8x4 gemv's either, which GCC contracts) but not
``nearest_int``'s add (:data:`Q8_K_FUSED`). One accumulator per output: no lanes; the thread count (whole
8-column chunks) changes no bit. NaNs: every output NaN is made AArch64's default +0x7fc00000
(:func:`kernels.ggml.repack_arm.arm_nans`); a NaN weight scale's payload is not modelled.

``arm64-sve256`` (the SVE library where ``svcntb() * 8 == 256``) runs the i8mm NEON code but for
``ggml_gemm_q4_K_8x8_q8_K``'s SVE body: the same integers (``svmmla_s32``, ``svmla_s32``, the halves' ``svadd_s32``:
exact), then per super-block ``svmls_f32_m`` and ``svmla_f32_m`` — SVE's ``fmls`` / ``fmla``, one rounding each
whatever the compiler contracts —, so its Q4_K gemm rows take the clang build's recipe (``2 + FUSED_MINS``) and every
other kernel (Q4_K's gemv, Q5_K, Q6_K; the Q8_K quantizer) is GCC's i8mm one (checked against ``arm64-sve256-gcc``).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from kernels.base.block import QT
from kernels.base.flags import jit, read_only
from kernels.ggml.mulmat_q8 import _qt, slot_groups
from kernels.ggml.repack_arm import (
    ARM_PATHS,
    REPACK_ARM,
    REPACK_ARM_B32,
    ROW_TILE,
    arm_nans,
    check_arm_path,
    mul_mat_id_repacked_arm,
    mul_mat_repacked_arm,
)
from kernels.ggml.simd import fma32
from kernels.ggml.vecmath import F16_TO_F32, fp16_at
from kernels.plain.dequant import k_scale_min

F32 = np.float32
#: The K-quant types emulated here, and their kernel's ``kind``.
KIND = {QT.Q4_K: 0, QT.Q5_K: 1, QT.Q6_K: 2}
REPACK_ARM_K = frozenset(KIND)
ROW_BYTES = {QT.Q4_K: 144, QT.Q5_K: 176, QT.Q6_K: 210}  # per 256 values
#: (type, path) -> float recipe of the (gemm, gemv) rows (module docstring): 0 per 64 values fused, mins per
#: super-block; 1 per 32 values fused, mins per super-block; 2 per super-block mins then values, unfused; 3 per
#: 32 values fused, mins per 64 values; 4 Q6_K per super-block fused; 5 Q6_K per super-block unfused.
#: ``FUSED_MINS`` added: the clang build's contracted ``vmlsq_f32`` / ``vmlaq_f32`` (one rounding each).
FUSED_MINS = 8
GEMM_GEMV = {(QT.Q4_K, "arm64-dotprod"): (0, 0), (QT.Q4_K, "arm64-i8mm"): (2, 1),
             (QT.Q5_K, "arm64-dotprod"): (0, 0), (QT.Q5_K, "arm64-i8mm"): (2, 3),
             (QT.Q6_K, "arm64-dotprod"): (5, 4), (QT.Q6_K, "arm64-i8mm"): (5, 5),
             (QT.Q4_K, "arm64-sve256"): (2 + FUSED_MINS, 1),  # the SVE gemm's svmls_f32 / svmla_f32: fmls, fmla
             (QT.Q5_K, "arm64-sve256"): (2, 3), (QT.Q6_K, "arm64-sve256"): (5, 5),  # i8mm's NEON code
             (QT.Q4_K, "arm64-i8mm-clang"): (2 + FUSED_MINS, 1 + FUSED_MINS),
             (QT.Q5_K, "arm64-i8mm-clang"): (2 + FUSED_MINS, 3 + FUSED_MINS),
             (QT.Q6_K, "arm64-i8mm-clang"): (4, 5),
             (QT.Q4_K, "arm64-dotprod-clang"): (FUSED_MINS, FUSED_MINS),
             (QT.Q5_K, "arm64-dotprod-clang"): (FUSED_MINS, FUSED_MINS),
             (QT.Q6_K, "arm64-dotprod-clang"): (4, 5)}  # clang: 8x4's gemm vmlaq_f32 fused, its gemv's
#: vmulq_f32 + vaddq_f32 two statements (GCC's =fast contracts them into fmla, clang's =on does not)
#: Whether the kernels' path quantizes Q8_K with GCC's contracted nearest_int.
Q8_K_FUSED = {"arm64-dotprod": True, "arm64-i8mm": True, "arm64-i8mm-clang": False, "arm64-dotprod-clang": False,
              "arm64-sve256": True}


@jit()
def quantize_rows_q8_k_arm(x, qs, d, bsums, fused=True):
    """The AArch64 Q8_K quantizer (module docstring): x (R, K) float32 -> qs (R, K) int8, d (R, K/256) float32,
    bsums (R, K/16) int16. ``fused``: GCC's contracted ``nearest_int(x·iscale)``; clang (``-ffp-contract=on``)
    rounds the product first."""
    shifted = np.empty(256, np.float32)
    bits = shifted.view(np.int32)
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 256):
            o = 256 * b
            amax = F32(0.0)
            vmax = F32(0.0)
            for j in range(256):
                ax = abs(x[r, o + j])
                if amax < ax:
                    amax = ax
                    vmax = x[r, o + j]
            iscale = F32(-127.0) / vmax if amax != 0 else F32(0.0)
            d[r, b] = F32(1.0) / iscale if amax != 0 else F32(0.0)
            for j in range(256):
                if fused:
                    shifted[j] = fma32(x[r, o + j], iscale, F32(12582912.0))  # fmadd: x·iscale + 1.5·2^23
                else:
                    shifted[j] = F32(x[r, o + j] * iscale) + F32(12582912.0)
            for j in range(256):
                v = (np.int64(bits[j]) & 0x007FFFFF) - 0x00400000  # nearest_int
                qs[r, o + j] = ((v & 0xFF) ^ 0x80) - 0x80  # stored as int8: the low byte
            for g in range(16):
                s = 0
                for j in range(16):
                    s += np.int64(qs[r, o + 16 * g + j])
                bsums[r, 16 * b + g] = s


@jit(inline=True)
def _scales(kind, wc, b, sc, mn, d, dmin, table):
    """Super-block ``b`` of plain row ``wc``: its ``d`` / ``dmin`` and sub-block scales ``sc`` / ``mn`` (Q4_K, Q5_K:
    ``get_scale_min_k4``; Q6_K: its int8 scales, no mins); returns the super-block's byte offset."""
    if kind == 2:  # Q6_K: ql[128], qh[64], scales[16], d
        o = 210 * b
        d[b] = fp16_at(wc, o + 208, table)
        dmin[b] = 0.0
        for g in range(16):
            sc[16 * b + g] = ((np.int64(wc[o + 192 + g]) ^ 0x80) - 0x80)
        return o
    o = (144 if kind == 0 else 176) * b  # Q4_K: d, dmin, scales[12], qs[128]; Q5_K: ..., qh[32], qs[128]
    d[b] = fp16_at(wc, o, table)
    dmin[b] = fp16_at(wc, o + 2, table)
    for j in range(8):
        sc[8 * b + j], mn[8 * b + j] = k_scale_min(wc, o + 4, j)
    return o


@jit()
def _decode(kind, wc, q, sc, mn, d, dmin, table):
    """One plain row ``wc`` -> quants ``q`` (K,) int32 (Q6_K: minus 32), per sub-block ``sc`` / ``mn`` (Q4_K, Q5_K: 32
    values, ``get_scale_min_k4``; Q6_K: 16 values, int8 scales, no mins), per super-block ``d`` / ``dmin``."""
    for b in range(d.shape[0]):
        o = _scales(kind, wc, b, sc, mn, d, dmin, table)
        if kind == 2:  # Q6_K
            for n in range(2):
                ql, qh, v = o + 64 * n, o + 128 + 32 * n, 256 * b + 128 * n
                for l in range(32):
                    a, c, h = np.int64(wc[ql + l]), np.int64(wc[ql + l + 32]), np.int64(wc[qh + l])
                    q[v + l] = ((a & 15) | ((h & 3) << 4)) - 32
                    q[v + l + 32] = ((c & 15) | (((h >> 2) & 3) << 4)) - 32
                    q[v + l + 64] = ((a >> 4) | (((h >> 4) & 3) << 4)) - 32
                    q[v + l + 96] = ((c >> 4) | (((h >> 6) & 3) << 4)) - 32
            continue
        qs = o + 16 if kind == 0 else o + 48
        for j in range(4):  # 32 bytes: low nibbles = sub-block 2j, high nibbles = sub-block 2j + 1
            for l in range(32):
                v = np.int64(wc[qs + 32 * j + l])
                lo, hi = v & 15, v >> 4
                if kind == 1:  # Q5_K: bit 2j / 2j + 1 of qh[l] is the fifth bit
                    h = np.int64(wc[o + 16 + l])
                    lo += 16 * ((h >> (2 * j)) & 1)
                    hi += 16 * ((h >> (2 * j + 1)) & 1)
                q[256 * b + 64 * j + l] = lo
                q[256 * b + 64 * j + 32 + l] = hi


@jit()
def _sub_dots_bytes(kind, wc, yr, dots, sc, mn, d, dmin, table):
    """Each sub-block's exact ``Σ q·y`` of plain row ``wc`` (Q4_K: ``kind`` 0, Q6_K: 2) and one activation row ``yr``
    (int32, K) into ``dots`` (K/32 or K/16), read straight from the bytes (the codes as :func:`_decode` gives them);
    the scales, mins, ``d`` and ``dmin`` as :func:`_decode` (its integers: the same sums)."""
    for b in range(d.shape[0]):
        o = _scales(kind, wc, b, sc, mn, d, dmin, table)
        if kind == 2:  # Q6_K: value 128n + 32m + l of ql/qh half n, stream m; group (128n + 32m + l) // 16
            for n in range(2):
                ql, qh, v = o + 64 * n, o + 128 + 32 * n, 256 * b + 128 * n
                for h in range(2):  # l in [16h, 16h + 16): groups 8n + 2m + h
                    p0 = np.int64(0)
                    p1 = np.int64(0)
                    p2 = np.int64(0)
                    p3 = np.int64(0)
                    for l in range(16 * h, 16 * h + 16):
                        a, c, e = np.int32(wc[ql + l]), np.int32(wc[ql + l + 32]), np.int32(wc[qh + l])
                        p0 += (((a & 15) | ((e & 3) << 4)) - 32) * yr[v + l]
                        p1 += (((c & 15) | (((e >> 2) & 3) << 4)) - 32) * yr[v + l + 32]
                        p2 += (((a >> 4) | (((e >> 4) & 3) << 4)) - 32) * yr[v + l + 64]
                        p3 += (((c >> 4) | (((e >> 6) & 3) << 4)) - 32) * yr[v + l + 96]
                    g = 16 * b + 8 * n + h
                    dots[g], dots[g + 2], dots[g + 4], dots[g + 6] = p0, p1, p2, p3
            continue
        for j in range(4):  # Q4_K, 32 bytes: low nibbles = sub-block 2j, high nibbles = sub-block 2j + 1
            plo = np.int64(0)
            phi = np.int64(0)
            for l in range(32):
                v = np.int32(wc[o + 16 + 32 * j + l])
                plo += (v & 15) * yr[256 * b + 64 * j + l]
                phi += (v >> 4) * yr[256 * b + 64 * j + 32 + l]
            dots[8 * b + 2 * j], dots[8 * b + 2 * j + 1] = plo, phi


@jit()
def super_block(kind, recipe, isub, m4, d, dmin, yd, acc):
    """One super-block's float steps of one output element (module docstring, :data:`GEMM_GEMV`'s ``recipe``),
    after ``acc``: ``isub`` its sub-blocks' integers ``I_s`` (Q4_K, Q5_K: 8; Q6_K: ``isub[0]`` the super-block's
    ``I``), ``m4`` the mins' integers per 64 values (``m_2k + m_2k+1``), ``d`` / ``dmin`` the weight's, ``yd`` the
    activation's ``d``."""
    rec = recipe & 7
    fm = recipe >= FUSED_MINS  # clang: vmlsq_f32 / vmlaq_f32 contracted into fmls / fmla
    S = F32(d * yd)  # vmulq_f32(d, q8_d)
    if kind == 2:  # Q6_K: the super-block's integer, then one float step
        if rec == 4:
            return fma32(F32(isub[0]), S, acc)  # vmulq_f32 + vaddq_f32 contracted: fmla
        return acc + F32(F32(isub[0]) * S)  # vmlaq_f32 / vcombine'd halves: fmul, fadd
    Dm = F32(dmin * yd)  # vmulq_f32(dmin, q8_d)
    tot = np.int64(0)
    M = np.int64(0)
    for k in range(4):
        tot += isub[2 * k] + isub[2 * k + 1]
        M += m4[k]
        if rec == 0:  # 8x4: an FMA per 64 values
            acc = fma32(S, F32(isub[2 * k] + isub[2 * k + 1]), acc)
        elif rec == 1 or rec == 3:  # 8x8 gemv: an FMA per 32 values
            acc = fma32(S, F32(isub[2 * k]), acc)
            acc = fma32(S, F32(isub[2 * k + 1]), acc)
            if rec == 3:  # Q5_K: the mins of these 64 values at once (vmlsq_f32: fmul, fsub)
                acc = fma32(-F32(m4[k]), Dm, acc) if fm else acc - F32(Dm * F32(m4[k]))
    if rec == 0 or rec == 1:
        return fma32(-F32(M), Dm, acc) if fm else acc - F32(F32(M) * Dm)  # vmlsq_f32: fmul, fsub
    if rec == 2:  # 8x8 gemm: mins, then the super-block's integer (vmlsq_f32, vmlaq_f32)
        if fm:
            return fma32(F32(tot), S, fma32(-F32(M), Dm, acc))
        acc = acc - F32(F32(M) * Dm)
        return acc + F32(F32(tot) * S)
    return acc


@jit(parallel=True)
def _k_rows(kind, w, y, yd, ys, recipe, rows, out, orow, table):
    """Every element: weight rows ``w`` (N, row bytes) of ``kind`` (0 Q4_K, 1 Q5_K, 2 Q6_K) against activation
    rows ``rows`` of ``y`` (int32 (R, K)), ``yd`` (R, K/256), ``ys`` (R, K/32) bsums per 32 values, ``recipe``
    (R,) each row's float recipe (:data:`GEMM_GEMV`); the result of row ``rows[i]`` to ``out[orow[i], c]``. Each
    weight row is decoded once (int32 codes: the sub-block dots vectorize) for every activation row; the integers
    are exact in any order, the float steps are each element's, in ggml's order."""
    K = y.shape[1]
    nb = K // 256
    sub = 16 if kind == 2 else 32
    nsub = 256 // sub
    straight = rows.shape[0] == 1 and kind != 1  # one activation row: its dots straight from the bytes (Q4_K, Q6_K)
    for tile in prange((w.shape[0] + ROW_TILE - 1) // ROW_TILE):  # ROW_TILE weight rows a task, its scratch once
        q = np.empty(0 if straight else K, np.int32)  # the decoded codes
        sc = np.empty(K // sub, np.int64)
        mn = np.empty(K // sub, np.int64)
        d = np.empty(nb, np.float32)
        dmin = np.empty(nb, np.float32)
        isub = np.empty(nsub, np.int64)
        m4 = np.empty(4, np.int64)
        isub_all = np.empty(K // sub if straight else 0, np.int64)  # each sub-block's Σ q·y of the one row
        for c in range(tile * ROW_TILE, min(tile * ROW_TILE + ROW_TILE, w.shape[0])):
            if straight:
                _sub_dots_bytes(kind, w[c], y[rows[0]], isub_all, sc, mn, d, dmin, table)
            else:
                _decode(kind, w[c], q, sc, mn, d, dmin, table)
            for i in range(rows.shape[0]):
                r = rows[i]
                yr = y[r]
                acc = F32(0.0)
                for b in range(nb):
                    tot = np.int64(0)  # the super-block's integer Σ_s I_s
                    for s in range(nsub):
                        if straight:
                            isub[s] = sc[nsub * b + s] * isub_all[nsub * b + s]
                        else:
                            o = 256 * b + sub * s
                            p = np.int64(0)
                            for k in range(sub):
                                p += q[o + k] * yr[o + k]
                            isub[s] = sc[nsub * b + s] * p
                        tot += isub[s]
                    if kind == 2:
                        isub[0] = tot  # Q6_K: only the super-block's integer meets a float
                    else:
                        for k in range(4):  # the mins' integers per 64 values
                            m4[k] = (mn[8 * b + 2 * k] * ys[r, 8 * b + 2 * k]
                                     + mn[8 * b + 2 * k + 1] * ys[r, 8 * b + 2 * k + 1])
                    acc = super_block(kind, recipe[r], isub, m4, d[b], dmin[b], yd[r, b], acc)
                out[orow[i], c] = acc


def _q8_k(x, fused=True):
    """(y int32 (R, K), yd (R, K/256), ys (R, K/32) int64 bsums per 32 values) of float32 rows x (R, K)."""
    R, K = x.shape
    qs, d, bs = np.empty((R, K), np.int8), np.empty((R, K // 256), np.float32), np.empty((R, K // 16), np.int16)
    quantize_rows_q8_k_arm(x, qs, d, bs, fused)
    ys = bs.astype(np.int64).reshape(R, K // 32, 2).sum(axis=2)  # vpaddq_s16 (no int16 wrap: |sum| <= 32·128)
    return qs.astype(np.int32), d, ys


def _check(qtype, path: str) -> QT:
    qt = _qt(qtype)
    check_arm_path(path)  # (GEMM_GEMV is keyed by the kernels' path: repack_arm.KERNELS_OF)
    if qt not in REPACK_ARM[path] or qt in (QT.Q8_0, QT.Q4_0, QT.IQ4_NL, QT.MXFP4):
        raise ValueError(f"AArch64 repacked K-quant kernels: {path} does not repack {qt.name} as a K-quant")
    if qt not in REPACK_ARM_K:
        raise ValueError(f"mul_mat emulation: the repacked {path} kernels of {qt.name} "
                         f"({qt.name.lower()}_{REPACK_ARM[path][qt][1]}_q8_K) are not emulated")
    return qt


def _run(w, qt, y, yd, ys, recipe, rows, out, orow):
    _k_rows(KIND[qt], read_only(w), y, yd, ys, recipe, rows, out, orow, F16_TO_F32)


def mul_mat_repacked_arm_k(w_bytes: np.ndarray, qtype, x: np.ndarray, path: str) -> np.ndarray:
    """``ggml_mul_mat(W, x)`` with ``W`` repacked on an AArch64 ``path``: ``w_bytes`` (N, row bytes) plain rows (of a
    tensor whose rows are a multiple of 8: the caller's question), ``x`` (T, K) float32 -> (T, N) float32."""
    qt = _check(qtype, path)
    x = np.ascontiguousarray(x, np.float32)
    w = np.ascontiguousarray(w_bytes, np.uint8)
    T, K = x.shape
    rb = K // 256 * ROW_BYTES[qt]
    if w.ndim != 2 or K % 256 or w.shape[1] != rb:  # N % 8: the caller's question (repack_arm.repacked_arm)
        raise ValueError(f"weights must be (N, {rb}) bytes of {qt.name} rows of {K}, got {w.shape}")
    kp = check_arm_path(path)
    y, yd, ys = _q8_k(x, Q8_K_FUSED[kp])
    gemm, gemv = GEMM_GEMV[(qt, kp)]
    recipe = np.where(np.arange(T) < T - T % 4, gemm, gemv).astype(np.int64)
    out = np.empty((T, w.shape[0]), np.float32)
    rows = np.arange(T)
    _run(w, qt, y, yd, ys, recipe, rows, out, rows)
    return arm_nans(out)


def mul_mat_id_repacked_arm_k(w_bytes: np.ndarray, qtype, x: np.ndarray, ids: np.ndarray, path: str) -> np.ndarray:
    """``ggml_mul_mat_id(W, x, ids)`` with ``W`` (E, N, row bytes) repacked on an AArch64 ``path`` (the gemv for
    every routed row): ``x`` (T, n_x, K) float32, ``ids`` (T, n_used) -> (T, n_used, N)."""
    qt = _check(qtype, path)
    x = np.ascontiguousarray(x, np.float32)
    w = np.asarray(w_bytes, np.uint8)
    ids = np.asarray(ids, np.int32)
    T, n_x, K = x.shape
    E, N = w.shape[:2]
    if w.ndim != 3 or K % 256 or w.shape[2] != K // 256 * ROW_BYTES[qt]:
        raise ValueError(f"weights must be (E, N, {K // 256 * ROW_BYTES[qt]}) bytes of {qt.name}, got {w.shape}")
    if ids.ndim != 2 or ids.shape[0] != T or (ids < 0).any() or (ids >= E).any():
        raise ValueError(f"ids must be (T={T}, n_used) in [0, {E}), got {ids.shape}")
    kp = check_arm_path(path)
    y, yd, ys = _q8_k(x.reshape(T * n_x, K), Q8_K_FUSED[kp])
    recipe = np.full(T * n_x, GEMM_GEMV[(qt, kp)][1], np.int64)
    order, bounds, experts, arow = slot_groups(ids, n_x)
    out = np.empty((T * ids.shape[1], N), np.float32)
    for g, e in enumerate(experts.tolist()):
        slots = order[bounds[g]:bounds[g + 1]]
        _run(np.ascontiguousarray(w[e]), qt, y, yd, ys, recipe, arow[slots].astype(np.int64), out,
             slots.astype(np.int64))
    return arm_nans(out).reshape(T, ids.shape[1], N)


# --------------------------------------------------------------------------------------------
# The dispatch of a repacked weight on an ARM path (called by kernels.ggml.mulmat)


def repack_arm_emulated(qtype, path: str) -> bool:
    """Whether the repacked kernels of ``qtype`` on the AArch64 ``path`` are emulated (here or in
    :mod:`kernels.ggml.repack_arm`)."""
    qt = _qt(qtype)
    return path in ARM_PATHS and qt in REPACK_ARM[path] and qt in (REPACK_ARM_B32 | REPACK_ARM_K)


def repack_arm_kernels(qtype, path: str):
    """(mul_mat, mul_mat_id) of the emulated repacked kernels of ``qtype`` on the AArch64 ``path``, for
    :mod:`kernels.ggml.mulmat`'s dispatch of a weight that CPU_REPACK takes
    (:func:`kernels.ggml.repack_arm.repacked_arm`); ValueError naming the kernel where it is not emulated."""
    qt = _qt(qtype)
    entry = REPACK_ARM.get(path, {}).get(qt)
    if path not in ARM_PATHS or entry is None:
        raise ValueError(f"mul_mat emulation: the repacked {path} kernels of {qt.name} are not emulated")
    if qt in REPACK_ARM_B32:
        return mul_mat_repacked_arm, mul_mat_id_repacked_arm
    if qt in REPACK_ARM_K:
        return mul_mat_repacked_arm_k, mul_mat_id_repacked_arm_k
    raise ValueError(f"mul_mat emulation: the repacked {path} kernels of {qt.name} "  # pragma: no cover
                     f"({qt.name.lower()}_{entry[1]}) are not emulated")


__all__ = ["REPACK_ARM_K", "repack_arm_kernels", "repack_arm_emulated", "mul_mat_repacked_arm_k",
           "mul_mat_id_repacked_arm_k", "quantize_rows_q8_k_arm"]
