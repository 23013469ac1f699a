"""The float32 primitives ggml-cpu's SIMD kernels are made of, with their exact rounding.

``fma32(a, b, c)``: ``a·b + c`` rounded once to float32 — what ``_mm256_fmadd_ps`` / ``_mm512_fmadd_ps`` (and
a C compiler contracting ``a*b + c`` under ``-ffp-contract=fast``, GCC's default) compute. Compiled, it is
LLVM's ``llvm.fma.f32`` (one instruction on every FMA host, correctly rounded in software elsewhere); with
``NUMBA_DISABLE_JIT=1`` it is computed in float64 with the error of the addition carried, so that a sum landing
exactly on a float32 midpoint is still rounded the right way (the product of two float32s is exact in float64).

``f32_bits`` / ``bits_f32``: a float32 lane as its bits and back (``_mm*_castps_si*``). ``v_expf_avx512`` /
``v_expf_avx2``: one lane of ggml-cpu/vec.h ``ggml_v_expf`` in its two x86 branches — the same Cody–Waite
reduction and coefficients, but AVX-512 rounds j ≈ e**b (the polynomial with its 1) and applies 2**n with
``_mm512_scalef_ps``, while AVX2 keeps j ≈ e**b - 1 and forms k + k·j in one FMA (k = 2**n built in the
exponent field; a two-factor scale for |n| > 126): they round differently, so SiLU, SwiGLU and soft_max
differ between the builds (the expf results in ~28 % of inputs, SiLU in ~13 %, by 1 ulp). ``reduce_add``: the
x86 horizontal sum of one register (halves folded).
"""

from __future__ import annotations

import math

import numpy as np

from kernels.base.flags import JIT_ENABLED, jit

F32 = np.float32


def fma32_exact(a, b, c):
    """float32 fma by float64 arithmetic (the definition; also the interpreted path)."""
    p = np.float64(np.float32(a)) * np.float64(np.float32(b))  # exact: 24 + 24 significant bits
    c64 = np.float64(np.float32(c))
    s = p + c64
    if not np.isfinite(s):
        return np.float32(s)
    t = s - p
    err = (p - (s - t)) + (c64 - t)  # TwoSum: s + err == p + c exactly
    r = np.float32(s)
    if err == 0.0 or np.float64(r) == s:
        return r
    toward = np.float32(np.nextafter(r, np.float32(np.inf) if s > np.float64(r) else np.float32(-np.inf)))
    if np.float64(r) + (np.float64(toward) - np.float64(r)) / 2 != s:  # not a midpoint: r is the nearest
        return r
    # s is exactly halfway between r and toward: the true value p + c lies on err's side of it
    return toward if (err > 0) == (np.float64(toward) > np.float64(r)) else r


if JIT_ENABLED:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def _llvm_fma32(typingctx, a, b, c):
        sig = types.float32(types.float32, types.float32, types.float32)

        def codegen(context, builder, signature, args):
            f32 = ir.FloatType()
            fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
            return builder.call(fn, args)

        return sig, codegen

    @jit()
    def fma32(a, b, c):
        """``a·b + c`` rounded once to float32."""
        return _llvm_fma32(np.float32(a), np.float32(b), np.float32(c))

else:
    fma32 = fma32_exact


# ---------------------------------------------------------------------------------------------------
# Bit casts (``_mm*_castps_si*`` / ``_castsi*_ps``): a float32 lane read as its uint32 bits and back.

if JIT_ENABLED:

    @intrinsic
    def _bitcast_f32_u32(typingctx, x):
        sig = types.uint32(types.float32)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(32))

        return sig, codegen

    @intrinsic
    def _bitcast_u32_f32(typingctx, u):
        sig = types.float32(types.uint32)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.FloatType())

        return sig, codegen

    @jit()
    def f32_bits(x):
        """The bits of float32 ``x`` as an int in [0, 2**32)."""
        return np.int64(_bitcast_f32_u32(np.float32(x)))

    @jit()
    def bits_f32(u):
        """The float32 whose bits are ``u mod 2**32``."""
        return _bitcast_u32_f32(np.uint32(np.int64(u) & 0xFFFFFFFF))

else:

    def f32_bits(x):
        return int(np.float32(x).view(np.uint32))

    def bits_f32(u):
        return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)


def _hexf(s: str):
    return F32(float.fromhex(s))


# ggml-cpu/vec.h: ggml_v_expf ("adapted from arm limited optimized routine") — the same constants in both
# x86 branches: x·log2(e) rounded by adding 1.5·2**23, ln 2 in two parts (Cody–Waite), a degree-5 polynomial.
EXP_R = _hexf("0x1.8p23")  # 1.5·2**23: z = x·log2e + R holds round(x·log2e) in its low mantissa bits
EXP_LOG2E = _hexf("0x1.715476p+0")
EXP_LN2_HI = _hexf("0x1.62e4p-1")
EXP_LN2_LO = _hexf("0x1.7f7d1cp-20")
EXP_C5 = _hexf("0x1.0e4020p-7")
EXP_C4 = _hexf("0x1.573e2ep-5")
EXP_C3 = _hexf("0x1.555e66p-3")
EXP_C2 = _hexf("0x1.fffdb6p-2")
EXP_C1 = _hexf("0x1.ffffecp-1")
ONE = F32(1.0)


@jit()
def _expf_reduce(x):
    """The shared first half of ggml_v_expf: (z, n, b, u) with n = round(x·log2e) and b = x - n·ln2."""
    z = fma32(x, EXP_LOG2E, EXP_R)  # _mm*_fmadd_ps(x, 0x1.715476p+0f, r)
    n = np.float32(z - EXP_R)  # _mm*_sub_ps(z, r)
    b = fma32(-n, EXP_LN2_LO, fma32(-n, EXP_LN2_HI, x))  # _mm*_fnmadd_ps(n, lo, _mm*_fnmadd_ps(n, hi, x))
    u = np.float32(b * b)
    return z, n, b, u


@jit()
def v_expf_avx512(x):
    """One lane of ggml-cpu/vec.h: ggml_v_expf (the ``__AVX512F__ && __AVX512DQ__`` branch, ``__m512``).

    j ≈ e**b by the polynomial, then ``_mm512_scalef_ps(j, n)`` = j·2**n rounded once (subnormal results
    included); lanes with |n| > 192 are 0 (n ≤ 0) or inf. The ``kortestz`` early return only skips the blend
    when no lane needs it: per lane the result is the same. A NaN lane gives x quieted (tested)."""
    x = np.float32(x)
    if x != x:
        return bits_f32(f32_bits(x) | 0x00400000)
    z, n, b, u = _expf_reduce(x)
    if abs(n) > np.float32(192):  # d = _mm512_cmp_ps_mask(_mm512_abs_ps(n), 192, _CMP_GT_OQ)
        return np.float32(0.0) if n <= np.float32(0) else np.float32(np.inf)  # blend(n <= 0, INFINITY, zero)
    j = fma32(fma32(fma32(EXP_C5, b, EXP_C4), u, fma32(EXP_C3, b, EXP_C2)), u, fma32(EXP_C1, b, ONE))
    # _mm512_scalef_ps(j, n): |n| <= 192 is an integer here, j·2**n is exact in float64, one rounding to float32
    return np.float32(math.ldexp(np.float64(j), int(n)))


@jit()
def v_expf_avx2(x):
    """One lane of ggml-cpu/vec.h: ggml_v_expf (the ``__AVX2__ && __FMA__`` branch, ``__m256``).

    k = 2**n built in the exponent field (``e = bits(z) << 23``, ``k = e + bits(1.0f)``), result
    ``fma(j, k, k)`` with j ≈ e**b - 1; for 126 < |n| <= 192 the scale is split in two factors
    (s2·(1 + j))·s1 so that neither overflows nor underflows early; for |n| > 192, s1·s1 (0 or inf).
    The ``movemask`` early return computes the c-false branch for all lanes: per lane the same.
    A NaN lane gives x quieted (tested)."""
    x = np.float32(x)
    if x != x:
        return bits_f32(f32_bits(x) | 0x00400000)
    z, n, b, u = _expf_reduce(x)
    e = (f32_bits(z) << 23) & 0xFFFFFFFF  # _mm256_slli_epi32(_mm256_castps_si256(z), 23)
    k = bits_f32(e + 0x3F800000)  # _mm256_add_epi32(e, castps_si256(1.0f))
    c = abs(n) > np.float32(126)  # _mm256_cmp_ps(andnot(-0.f, n), 126, _CMP_GT_OQ)
    j = fma32(fma32(fma32(EXP_C5, b, EXP_C4), u, fma32(EXP_C3, b, EXP_C2)), u, np.float32(EXP_C1 * b))
    if not c:
        return fma32(k, j, k)  # _mm256_fmadd_ps(k, j, k)
    g = 0x82000000 if n <= np.float32(0) else 0  # and(cmp(n, 0, _CMP_LE_OQ), 0x82000000)
    s1 = bits_f32(g + 0x7F000000)
    s2 = bits_f32(e - g)
    if abs(n) > np.float32(192):  # d
        return np.float32(s1 * s1)
    return np.float32(fma32(s2, j, s2) * s1)


@jit()
def v_expf(x, lanes):
    """ggml_v_expf of the build with ``lanes`` float lanes (16: AVX-512, 8: AVX2), one lane."""
    if lanes == 16:
        return v_expf_avx512(x)
    return v_expf_avx2(x)


@jit()
def reduce_add(v, i0, lanes, w):
    """Horizontal float32 sum of the register ``v[i0:i0+lanes]`` in the x86 order: halves folded onto each
    other (v[i] + v[i + lanes/2]) until one lane is left. AVX-512: GCC's ``_mm512_reduce_add_ps``
    (extractf64x4 → 256-bit add, extractf128 → 128-bit add, shuffle {2,3,0,1} → add, [0] + [1]); AVX2: the
    sequence in vec.cpp ggml_vec_soft_max_f32 (extractf128 + cast → add, movehl → add, movehdup → add_ss).
    ``w``: float32 scratch of ``lanes`` elements."""
    for i in range(lanes):
        w[i] = v[i0 + i]
    half = lanes // 2
    while half >= 1:  # 16 → 8 → 4 → 2 → 1 lanes (AVX2: 8 → 4 → 2 → 1)
        for i in range(half):
            w[i] = np.float32(w[i + half] + w[i])
        half //= 2
    return w[0]
