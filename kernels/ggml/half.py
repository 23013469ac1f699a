"""binary16 arithmetic of AArch64's FP16 vector instructions (``__ARM_FEATURE_FP16_VECTOR_ARITHMETIC``): NEON's
``GGML_F16_VEC`` is ``float16x8_t`` there, so ``ggml_vec_dot_f16``'s accumulators, ``ggml_vec_mad_f16`` and
``ggml_vec_scale_f16`` round every ``fmla v.8h`` / ``fadd v.8h`` / ``fmul v.8h`` to half (:mod:`kernels.ggml.vec`).
Values are held as float32 (every half is one, exactly); the arithmetic is done in float64, exact for products of
halves, and rounded once.
"""

from __future__ import annotations

import math

import numpy as np

from kernels.base.flags import jit
from kernels.ggml.simd import f16_round, f32_bits, fma32

F32 = np.float32


@jit()
def _f16_quantum(a):
    """The spacing of the binary16 values around float64 ``a`` > 0 (2**-24 below 2**-14)."""
    m, e = math.frexp(a)  # a = m·2**e, 0.5 <= m < 1: the binade [2**(e-1), 2**e) has 11-bit quantum 2**(e-11)
    return math.ldexp(1.0, max(e - 11, -24))


@jit()
def f16_round64(s):
    """float64 ``s`` rounded once to binary16 (ties to even), as float32; ±inf from 65520 up, inf and NaN kept."""
    if not np.isfinite(s):
        return F32(s)
    if abs(s) >= 65520.0:
        return F32(np.inf) if s > 0 else F32(-np.inf)
    q = _f16_quantum(abs(s)) if s != 0 else 1.0
    return F32(np.rint(s / q) * q)  # |s/q| < 2**12: exact; rint ties to even


@jit()
def fma16(a, b, c):
    """``a·b + c`` of three binary16 values (held as float32) rounded *once* to binary16 — AArch64 ``fmla v.8h``
    (``vfmaq_f16``; FPCR at its default: no flush to zero). Fast way: the float32 FMA (the product is exact in
    float32, 22 bits), then :func:`f16_round` — the same as one rounding unless the float32 result is itself a
    half midpoint (rounding is monotonic: a value on one side of a midpoint rounds to it or stays on that side),
    which goes the exact way, :func:`fma16_exact` (equal on 24M random, cancelling and subnormal triples; 4x faster)."""
    r = fma32(a, b, c)
    u = f32_bits(r) & 0x7FFFFFFF
    if u >= 0x38800000:  # |r| >= 2**-14, inf, NaN: a half midpoint has the low 13 bits 0x1000
        if u >= 0x7F800000 or (u & 0x1FFF) != 0x1000:
            return f16_round(r)
    else:  # the half subnormal range: midpoints are the odd multiples of 2**-25
        t = np.float32(r * np.float32(33554432.0))  # exact
        if t != np.floor(t) or np.floor(t) % 2 == 0:
            return f16_round(r)
    return fma16_exact(a, b, c)


@jit()
def fma16_exact(a, b, c):
    """:func:`fma16` in float64: the product is exact in float64 (22 bits); the float64 sum's rounding error is
    carried (TwoSum), so that a sum landing exactly halfway between two halves in float64 is rounded toward the
    true value."""
    p = np.float64(a) * np.float64(b)
    c64 = np.float64(c)
    s = p + c64
    if not np.isfinite(s):
        return F32(s)
    t = s - p
    err = (p - (s - t)) + (c64 - t)  # s + err == p + c exactly
    if err == 0.0 or s == 0.0:
        return f16_round64(s)
    q = _f16_quantum(abs(s))
    k = np.floor(s / q)
    if s / q - k != 0.5:  # not a midpoint: the true value rounds as s does
        return f16_round64(s)
    v = (k + 1.0) * q if err > 0 else k * q  # the neighbour on the true value's side
    if abs(v) >= 65536.0:
        return F32(np.inf) if v > 0 else F32(-np.inf)
    return F32(v)
