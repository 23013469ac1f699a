"""The float32 primitives ggml-cpu's SIMD kernels are made of, with their exact rounding.

``fma32(a, b, c)``: ``a·b + c`` rounded once to float32 — what ``_mm256_fmadd_ps`` / ``_mm512_fmadd_ps`` (and
a C compiler contracting ``a*b + c`` under ``-ffp-contract=fast``, GCC's default) compute. Compiled, it is
LLVM's ``llvm.fma.f32`` (one instruction on every FMA host, correctly rounded in software elsewhere); with
``NUMBA_DISABLE_JIT=1`` it is computed in float64 with the error of the addition carried, so that a sum landing
exactly on a float32 midpoint is still rounded the right way (the product of two float32s is exact in float64).
"""

from __future__ import annotations

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
