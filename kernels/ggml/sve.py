"""The ``__ARM_FEATURE_SVE`` branches of ggml-cpu's shared vector code, at the vector length of the CPU that runs
the library: ``arm64-sve128`` (code :data:`kernels.ggml.isa.SVE128`, ``svcntw()`` = 4 float lanes) and
``arm64-sve256`` (:data:`kernels.ggml.isa.SVE256`, 8 lanes: Neoverse V1, Graviton3) — one GCC 12 build
(``-march=armv9-a+sve2+i8mm+dotprod+fp16``), which reads the length at run time (``svcntw()``, ``svcnth()``,
``ggml_cpu_get_sve_cnt()``), so every function here takes it, ``w`` = ``svcntw()`` (:func:`svcntw` of the code).
Where they differ from NEON's:

vec.h / vec.cpp's SVE loops have ``w`` float lanes, ``2·w`` half lanes, and a *predicated* last block
(``svwhilelt``) where NEON has a scalar tail:

* ``ggml_vec_soft_max_f32`` (:func:`vec_soft_max_f32`): ``ggml_v_expf(pg, x - max)`` — NEON's formula, FMA for
  FMA — on every element, the last block too; each block's ``svaddv_f32(pg, val)`` (FADDV, :func:`faddv`)
  added to the double sum. (silu / swiglu: :mod:`kernels.ggml.vecmath` with the same predicated last block: their
  lanes never meet, so the length changes no bit there.)
* ``ggml_vec_dot_f16`` (:func:`vec_dot_f16`): *float* accumulators, unlike NEON's half ones —
  ``ggml_sve_f16_fma_widened``: SVE2's ``svmlalb_f32`` / ``svmlalt_f32`` (FMLALB/FMLALT) add the exact products of
  the even / odd halves of each ``2·w``-half vector to ``acc_lo`` / ``acc_hi`` (``w`` lanes each), one rounding;
  4 such pairs over steps of ``8 · svcnth()`` = ``16·w`` halves (vector j of a step into pair j % 4), the leftover
  vectors into pair 1, the predicated last one (zeros beyond n: products +0.0) too; then ``sum1 + sum2``,
  ``sum3 + sum4``, their sum (lo and hi apart), ``svaddv(lo) + svaddv(hi)`` in float. No scalar tail.
* ``ggml_vec_mad_f16`` / ``ggml_vec_scale_f16`` (:func:`vec_mad_f16`, :func:`vec_scale_f16`): ``svdup_n_f16(v)``
  rounds ``v`` to half once, then every element (the predicated tail too) is one half FMA ``fma16(x, vh, y)`` /
  one half product ``y·vh`` — NEON computes its tail in float. Element-wise, but ``ggml_vec_scale_f16``'s
  leftover is a single predicated vector after steps of two: up to ``2·w - 1`` values past the last step stay
  unscaled, which values depending on the length (:func:`vec_scale_f16`).
* ``ggml_vec_dot_f32`` (:func:`vec_dot_f32`): 8 fused accumulators of ``w`` lanes over steps of ``8·w``
  (``ggml_f32_epr = ggml_cpu_get_sve_cnt() * 8 / 32``), the leftover whole vectors into ``sum1``, a predicated
  tail, ``GGML_F32xt_REDUCE``, FADDV; many of them side by side (:func:`vec_dot_f32_cols`: the F32-cache
  attention's K·Q and P·V, :mod:`kernels.ggml.attn_heads`).

FADDV (``svaddv_f32``) is the architecture's recursive pairwise ``Reduce``: the low half's sum plus the high
half's, down to single lanes, inactive lanes +0.0 — ``(v0 + v1) + (v2 + v3)`` at 128 bits,
``((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))`` at 256 (qemu's ``sve_faddv`` computes the same tree).

:mod:`kernels.ggml.vec`'s functions take these for the codes ``SVE128`` and ``SVE256``. Other vector lengths
are refused (kernels.ggml.build: each SVE path's ``sve_bits``).
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import jit
from kernels.ggml.half import f16_round64, fma16
from kernels.ggml.isa import SVE128, SVE256
from kernels.ggml.simd import f16_round, fma32, v_expf_avx2

F32 = np.float32


@jit()
def svcntw(code):
    """``svcntw()`` — float lanes of an SVE vector — on the path whose vec code is ``code``: 4 (:data:`SVE128`),
    8 (:data:`SVE256`); any other code raises (never a lane count guessed for a code that is not SVE's)."""
    if code == SVE128:
        return 4
    if code == SVE256:
        return 8
    raise ValueError("svcntw: not an SVE code")


@jit()
def faddv(a, o, w):
    """FADDV (``svaddv_f32``) of the ``w`` (4 or 8) float lanes ``a[o:o+w]``: Reduce(low half) + Reduce(high half),
    recursively — ``(a0 + a1) + (a2 + a3)``, and at 8 lanes that plus ``(a4 + a5) + (a6 + a7)``."""
    lo = F32(F32(a[o] + a[o + 1]) + F32(a[o + 2] + a[o + 3]))
    if w == 4:
        return lo
    return F32(lo + F32(F32(a[o + 4] + a[o + 5]) + F32(a[o + 6] + a[o + 7])))


@jit()
def vec_soft_max_f32(n, y, x, mx, w=4):
    """vec.cpp ggml_vec_soft_max_f32, the SVE branch with ``w`` = svcntw() lanes: ``y[i] = ggml_v_expf(x[i] - max)``
    for all i, the double sum of each ``w``-lane block's FADDV (the last block predicated: absent lanes +0.0)."""
    total = np.float64(0.0)
    v = np.zeros(w, np.float32)
    for i in range(0, n, w):
        for lane in range(w):
            if i + lane < n:
                v[lane] = v_expf_avx2(F32(x[i + lane] - mx))  # svsub_f32_x, ggml_v_expf(pg, …): NEON's FMAs
                y[i + lane] = v[lane]
            else:
                v[lane] = F32(0.0)
        total += np.float64(faddv(v, 0, w))
    return total


@jit()
def _reduce8(acc, lane):
    """GGML_F32xt_REDUCE's additions in one lane of the 8 accumulators ``acc`` (8, w): ``(1+2) + (3+4)``,
    ``(5+6) + (7+8)``, their sum (svadd_f32_m, lane-wise)."""
    a12, a34 = F32(acc[0, lane] + acc[1, lane]), F32(acc[2, lane] + acc[3, lane])
    a56, a78 = F32(acc[4, lane] + acc[5, lane]), F32(acc[6, lane] + acc[7, lane])
    return F32(F32(a12 + a34) + F32(a56 + a78))


@jit()
def vec_dot_f32(n, x, y, w=4):
    """vec.cpp ggml_vec_dot_f32, the SVE branch with ``w`` = svcntw() lanes: 8 accumulators of ``w`` lanes over
    steps of ``8·w`` (``svmad``: fused), the leftover whole vectors into ``sum1``, the last ``n % w`` values by a
    predicated ``svmla_f32_m`` into ``sum1``'s first lanes (the others keep theirs); ``GGML_F32xt_REDUCE``:
    ``(1+2) + (3+4)``, ``(5+6) + (7+8)``, their sum, lane-wise, then FADDV; a float."""
    step = 8 * w  # ggml_f32_step
    np1 = n - n % step
    acc = np.zeros((8, w), np.float32)
    for i in range(n):
        j = ((i % step) // w) if i < np1 else 0
        acc[j, i % w] = fma32(x[i], y[i], acc[j, i % w])
    r = np.empty(w, np.float32)
    for lane in range(w):
        r[lane] = _reduce8(acc, lane)
    return faddv(r, 0, w)


@jit()
def vec_dot_f32_cols(n, xt, y, acc, out, w=4):
    """``out[c] = vec_dot_f32(n, xt[:, c], y, w)`` for every column ``c`` of ``xt`` (n, m) at once, any ``n``: each
    column's 8 × ``w`` accumulators fed the same fused products in the same order (the leftovers into ``sum1``), then
    the same tree and FADDV — every operation lane-wise across the columns. ``acc`` (4, ≥ 2·w, ≥ m) float32 scratch
    (accumulator ``j``, lane ``l`` in ``acc[j // 2, w * (j % 2) + l]``). Same bits as :func:`vec_dot_f32` per column
    (tests/test_ggml_kernel_parts.py)."""
    m = xt.shape[1]
    step = 8 * w
    np1 = n - n % step
    for j in range(4):
        for lane in range(2 * w):
            acc[j, lane, :m] = F32(0.0)
    for i in range(n):
        j = ((i % step) // w) if i < np1 else 0
        a, yi, row = acc[j // 2, w * (j % 2) + i % w], y[i], xt[i]
        for c in range(m):
            a[c] = fma32(row[c], yi, a[c])
    for c in range(m):
        for lane in range(w):  # GGML_F32xt_REDUCE, lane-wise: (1+2) + (3+4), (5+6) + (7+8), their sum
            a12 = F32(acc[0, lane, c] + acc[0, w + lane, c])
            a34 = F32(acc[1, lane, c] + acc[1, w + lane, c])
            a56 = F32(acc[2, lane, c] + acc[2, w + lane, c])
            a78 = F32(acc[3, lane, c] + acc[3, w + lane, c])
            acc[0, lane, c] = F32(F32(a12 + a34) + F32(a56 + a78))
        out[c] = faddv(acc[0, :w, c], 0, w)


@jit()
def vec_dot_f16(n, x, y, w=4):
    """vec.cpp ggml_vec_dot_f16, the SVE branch with ``w`` = svcntw() (``x``, ``y``: F16 values as float32): float
    accumulators by FMLALB / FMLALT (module docstring); returns the float32 result."""
    lo = np.zeros((4, w), np.float32)  # sum1_lo … sum4_lo: the even halves of each vector
    hi = np.zeros((4, w), np.float32)  # sum1_hi … sum4_hi: the odd halves
    epr = 2 * w  # ggml_f16_epr = svcnth()
    np1 = n - n % (8 * epr)  # ggml_f16_step = 8 * svcnth()
    for i in range(0, n, epr):
        j = (i // epr) % 4 if i < np1 else 0  # the leftover vectors (and the predicated last one) into sum1
        for lane in range(w):
            e, o = i + 2 * lane, i + 2 * lane + 1
            pe = F32(x[e] * y[e]) if e < n else F32(0.0)  # exact: halves' products fit float32
            po = F32(x[o] * y[o]) if o < n else F32(0.0)
            lo[j, lane] = F32(lo[j, lane] + pe)
            hi[j, lane] = F32(hi[j, lane] + po)
    for lane in range(w):
        lo[0, lane] = F32(F32(lo[0, lane] + lo[1, lane]) + F32(lo[2, lane] + lo[3, lane]))
        hi[0, lane] = F32(F32(hi[0, lane] + hi[1, lane]) + F32(hi[2, lane] + hi[3, lane]))
    return F32(faddv(lo[0], 0, w) + faddv(hi[0], 0, w))  # ggml_sve_sum_f32x2: float, then (ggml_float), then *s = (float)


@jit()
def vec_mad_f16(n, y, x, v):
    """vec.h ggml_vec_mad_f16, SVE: ``y[i] = fma16(x[i], half(v), y[i])`` on every element (``y``, ``x``: F16
    values as float32), at any vector length."""
    vh = f16_round(v)
    for i in range(n):
        y[i] = fma16(x[i], vh, y[i])


@jit()
def vec_scale_f16(n, y, v, w=4):
    """vec.h ggml_vec_scale_f16, SVE with ``w`` = svcntw(): ``y[i] = half(y[i] · half(v))`` (one rounding: the
    product of two halves is exact in double) over steps of two vectors (``2 · svcnth()`` = ``4·w`` halves), then
    *one* predicated vector (``svwhilelt_b16(np, n)``: ``2·w`` halves at most) — so where ``n % (4·w)`` exceeds
    ``2·w`` the last ``n % (4·w) - 2·w`` values are left unscaled (llama.cpp's leftover handles one vector of the
    two a step may leave: at 128 bits ``n % 16 > 8``, at 256 ``n % 32 > 16``, e.g. flash attention's VKQ16 of
    DV = 20)."""
    vh = f16_round(v)
    np_ = n - n % (4 * w)  # ggml_f16_step = 2 * ggml_f16_epr
    for i in range(min(n, np_ + 2 * w)):
        y[i] = f16_round64(np.float64(y[i]) * np.float64(vh))
