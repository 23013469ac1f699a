"""The C library's float32 math functions that libggml-cpu calls, called the same way.

Both libggml-cpu.so builds import ``expf``, ``logf``, ``powf`` (``@GLIBC_2.27``), ``sinf``, ``cosf``, ``fmaxf``
(``@GLIBC_2.2.5``) from glibc (``objdump -T``) and call them through the PLT: GCC inlines none of them
(``-O3`` without ``-ffast-math``; ``cosf``/``sinf`` of one angle become one ``sincosf`` call, the same
kernel). So the emulation calls the same functions of the same glibc, in the same process — identical by
construction, not a re-implementation. A portable formula would not do: numpy's own ``np.exp`` on float32
differs from glibc's ``expf`` in over a third of inputs (``np.sin``/``np.cos`` in ~25 % of RoPE angles), by an ulp.
The consequence: the emulation is exact on a host whose glibc is the one llama.cpp runs with, as ggml is.

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


__all__ = ["expf", "logf", "sinf", "cosf", "powf", "fmaxf"]
