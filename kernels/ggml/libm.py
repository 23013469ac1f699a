"""The C library's float32 math functions that libggml-cpu calls, called the same way.

Both libggml-cpu.so builds import ``expf``, ``logf``, ``powf`` (``@GLIBC_2.27``), ``sinf``, ``cosf``, ``fmaxf``
(``@GLIBC_2.2.5``) from glibc (``objdump -T``) and call them through the PLT: GCC inlines none of them
(``-O3`` without ``-ffast-math``; ``cosf``/``sinf`` of one angle become one ``sincosf`` call, the same
kernel). So the emulation calls the same functions of the same glibc, in the same process — identical by
construction, not a re-implementation. A portable formula would not do: numpy's own ``np.exp`` on float32
differs from glibc's ``expf`` in over a third of inputs (``np.sin``/``np.cos`` in ~25 % of RoPE angles), by an ulp.
The consequence: the emulation is exact on a host whose glibc is the one llama.cpp runs with, as ggml is. For
the AArch64 paths, whose llama.cpp runs with AArch64's glibc, :func:`expf_arm64` ports that build's ``expf``
(:func:`expf_on` picks by :func:`glibc_of`: equal to AArch64's ``expf`` on all 2**32 inputs). Its other functions
give the host's bits on numbers, compared under qemu-aarch64 (Debian 12's glibc 2.36 on both sides): ``logf`` on
every positive float, ``sinf`` / ``cosf`` on every float in [0, 2**19) and one in 61 elsewhere, ``powf`` on RoPE's
``powf(base, -2/n_dims)`` for ten bases and every even n_dims ≤ 1024 and 1.5M other pairs; only their invalid
operations differ (``logf(-1)``, ``sinf(inf)``: ARM's default NaN, :func:`kernels.ggml.isa.nan_swap`).

Compiled, each function is a ``numba.types.ExternalFunction`` (a direct call of the symbol, resolved in this
process like ``dlsym`` — the default version, the one ggml links); with ``NUMBA_DISABLE_JIT=1`` the same
symbol through ``ctypes``. Every function here is callable from Python and from jitted code, with float32
arguments and result.

* ``expf`` — unary-ops.cpp ``op_exp``/``op_sigmoid``/``op_softplus``, the scalar tails of
  ``ggml_vec_silu_f32``/``ggml_vec_soft_max_f32``, flash attention's ``ms``/``vs``, the delta net's gate;
* ``logf`` — ``op_softplus``; ``powf`` — RoPE's ``theta_scale``; ``sinf``/``cosf`` — the RoPE cache;
* ``fmaxf`` — ``ggml_compute_forward_l2_norm_f32`` and flash attention's running maximum (tiled, split-KV
  reduction): ``a > b ? a : b`` on numbers (glibc's x86_64 ``maxss``: ``fmaxf(+0, -0)`` is ``-0``), the
  other operand when one is NaN.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml.simd import f32_bits as _f32_bits

_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
_ARITY = {"expf": 1, "logf": 1, "sinf": 1, "cosf": 1, "powf": 2, "fmaxf": 2}

if JIT_ENABLED:
    from numba import types

    _f1, _f2 = types.float32(types.float32), types.float32(types.float32, types.float32)
    _expf = types.ExternalFunction("expf", _f1)
    _logf = types.ExternalFunction("logf", _f1)
    _sinf = types.ExternalFunction("sinf", _f1)
    _cosf = types.ExternalFunction("cosf", _f1)
    _powf = types.ExternalFunction("powf", _f2)
    _fmaxf = types.ExternalFunction("fmaxf", _f2)

else:  # NUMBA_DISABLE_JIT=1: the same symbols through ctypes (a float32 passes through double exactly)
    for _name, _n in _ARITY.items():
        getattr(_LIBM, _name).restype, getattr(_LIBM, _name).argtypes = ctypes.c_float, [ctypes.c_float] * _n

    def _call(name):
        fn = getattr(_LIBM, name)
        return lambda *args: np.float32(fn(*(float(np.float32(a)) for a in args)))

    _expf, _logf, _sinf, _cosf, _powf, _fmaxf = (_call(n) for n in ("expf", "logf", "sinf", "cosf", "powf", "fmaxf"))


@jit()
def expf(x):
    """glibc ``expf`` (float32)."""
    return _expf(np.float32(x))


@jit()
def logf(x):
    """glibc ``logf`` (float32)."""
    return _logf(np.float32(x))


@jit()
def sinf(x):
    """glibc ``sinf`` (float32)."""
    return _sinf(np.float32(x))


@jit()
def cosf(x):
    """glibc ``cosf`` (float32)."""
    return _cosf(np.float32(x))


@jit()
def powf(x, y):
    """glibc ``powf`` (float32)."""
    return _powf(np.float32(x), np.float32(y))


@jit()
def fmaxf(a, b):
    """glibc ``fmaxf`` (float32)."""
    return _fmaxf(np.float32(a), np.float32(b))


# ---------------------------------------------------------------------------------------------------
# AArch64 glibc (Debian 12's 2.36, the libm an AArch64 llama.cpp runs with): its expf is sysdeps/ieee754/flt-32/
# e_expf.c built with TOINT_INTRINSICS — ``roundtoint`` / ``converttoint`` are ``frinta`` / ``fcvtas``, round
# half *away from zero*, where the x86-64 build adds and subtracts 0x1.8p52 — and GCC's contraction into
# ``fmadd``: ``z = x·(32/ln 2)`` rounded by its own ``fmul``, then ``r = z - kd`` (disassembly of the sysroot's
# libm.so.6, ``expf@@GLIBC_2.27``). The two glibcs differ in exactly two of all 2**32 float32 inputs:
# 0x4202422f (32.56…) and 0xc27c65d9 (-63.10…), by 1 ulp (an exhaustive comparison of expf_arm64 with the host's;
# expf_arm64 equals AArch64's on every |x| in [2**-26, 104] — exhaustively, under qemu-aarch64 — and the two glibcs
# agree on every other input).

#: glibc's ``__exp2f_data``: ``tab[32]`` (2**(i/32) with the index bits taken out), ``invln2_scaled`` = 32/ln 2,
#: ``poly_scaled`` (read from the AArch64 libm.so.6's .rodata; the same table as glibc's e_exp2f_data.c)
EXP2F_TAB = np.array([
    0x3FF0000000000000, 0x3FEFD9B0D3158574, 0x3FEFB5586CF9890F, 0x3FEF9301D0125B51, 0x3FEF72B83C7D517B,
    0x3FEF54873168B9AA, 0x3FEF387A6E756238, 0x3FEF1E9DF51FDEE1, 0x3FEF06FE0A31B715, 0x3FEEF1A7373AA9CB,
    0x3FEEDEA64C123422, 0x3FEECE086061892D, 0x3FEEBFDAD5362A27, 0x3FEEB42B569D4F82, 0x3FEEAB07DD485429,
    0x3FEEA47EB03A5585, 0x3FEEA09E667F3BCD, 0x3FEE9F75E8EC5F74, 0x3FEEA11473EB0187, 0x3FEEA589994CCE13,
    0x3FEEACE5422AA0DB, 0x3FEEB737B0CDC5E5, 0x3FEEC49182A3F090, 0x3FEED503B23E255D, 0x3FEEE89F995AD3AD,
    0x3FEEFF76F2FB5E47, 0x3FEF199BDD85529C, 0x3FEF3720DCEF9069, 0x3FEF5818DCFBA487, 0x3FEF7C97337B9B5F,
    0x3FEFA4AFA2A490DA, 0x3FEFD0765B6E4540], dtype=np.uint64)
EXPF_OFLOW, EXPF_MAY_UFLOW = np.float32(float.fromhex("0x1.62e42ep6")), np.float32(float.fromhex("-0x1.9d1d9ep6"))
EXP2F_INVLN2N = float.fromhex("0x1.71547652b82fep+5")
EXP2F_C0, EXP2F_C1, EXP2F_C2 = (float.fromhex(h) for h in ("0x1.c6af84b912394p-20", "0x1.ebfce50fac4f3p-13",
                                                           "0x1.62e42ff0c52d6p-6"))

if JIT_ENABLED:
    from llvmlite import ir
    from numba.extending import intrinsic

    @intrinsic
    def _llvm_fma64(typingctx, a, b, c):
        sig = types.float64(types.float64, types.float64, types.float64)

        def codegen(context, builder, signature, args):
            f64 = ir.DoubleType()
            fn = builder.module.declare_intrinsic("llvm.fma", [f64], ir.FunctionType(f64, [f64, f64, f64]))
            return builder.call(fn, args)

        return sig, codegen

    @intrinsic
    def _bits_f64(typingctx, u):
        sig = types.float64(types.uint64)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.DoubleType())

        return sig, codegen

    @jit()
    def fma64(a, b, c):
        """``a·b + c`` rounded once to double (AArch64 ``fmadd d``)."""
        return _llvm_fma64(np.float64(a), np.float64(b), np.float64(c))

else:
    from fractions import Fraction

    def fma64(a, b, c):
        return np.float64(float(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))))

    def _bits_f64(u):
        return np.uint64(u).view(np.float64)


if JIT_ENABLED:

    @jit()
    def _scale_bits(ki):
        return EXP2F_TAB[ki & 31] + (np.uint64(ki & 0x1FFFF) << np.uint64(47))  # modulo 2**64, as uint64_t

else:

    def _scale_bits(ki):
        return np.uint64((int(EXP2F_TAB[ki & 31]) + (int(ki) << 47)) & 0xFFFFFFFFFFFFFFFF)


@jit()
def expf_arm64(x):
    """AArch64 glibc ``expf`` (float32): e_expf.c as compiled there. Outside the core range (|x| ≥ 88 or so, inf,
    NaN) both glibc builds take the same special cases, so this calls the host's (x86-64) ``expf`` there."""
    x = np.float32(x)
    u = np.uint32(np.int64(_f32_bits(x)))
    if ((u >> 20) & 0x7FF) >= 0x42B:  # abstop >= top12(88.0f)
        if not (x <= EXPF_OFLOW and x >= EXPF_MAY_UFLOW):  # -inf, inf/NaN, over- and underflow: the same code
            return _expf(x)
    z = np.float64(x) * EXP2F_INVLN2N  # fmul d1, d1, d3
    kd = np.floor(abs(z) + 0.5)  # frinta: round half away from zero (|z| < 2**12: exact)
    kd = kd if z >= 0 else -kd
    ki = np.int64(kd)  # fcvtas
    r = z - kd
    s = _bits_f64(_scale_bits(ki))  # t = T[ki % N] + (ki << 47): 2**(ki/32), the integer part in the exponent
    zz = fma64(EXP2F_C0, r, EXP2F_C1)  # z = C[0]*r + C[1]: fmadd
    y = fma64(EXP2F_C2, r, 1.0)  # y = C[2]*r + 1: fmadd
    y = fma64(zz, r * r, y)  # y = z*r2 + y: fmadd
    return np.float32(y * s)


#: Which glibc's float functions a path's libggml-cpu calls: the host's x86-64 one, or AArch64's.
GLIBC_X86_64, GLIBC_AARCH64 = 0, 1


def glibc_of(path: str) -> int:
    """:data:`GLIBC_AARCH64` for the AArch64 paths, :data:`GLIBC_X86_64` for the x86 ones (ValueError otherwise)."""
    from kernels.ggml.simd import check_path

    return GLIBC_AARCH64 if check_path(path).startswith("arm64-") else GLIBC_X86_64


@jit()
def expf_on(x, glibc):
    """``expf`` of the glibc :func:`glibc_of` names: the host's, or :func:`expf_arm64`."""
    return expf_arm64(x) if glibc == GLIBC_AARCH64 else _expf(np.float32(x))


__all__ = ["expf", "logf", "sinf", "cosf", "powf", "fmaxf", "expf_arm64", "expf_on", "glibc_of", "fma64",
           "GLIBC_X86_64", "GLIBC_AARCH64"]
