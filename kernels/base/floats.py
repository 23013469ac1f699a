"""Small float conversions shared by the block decoders and the activation quantizers.

numba has no float16 type on the CPU, so half floats are handled here by value, exactly:

* ``f16_at(buf, o)`` — the binary16 stored little-endian at ``buf[o:o+2]``, as float32. Exact
  (every binary16 is a float32): ``(1024 + m) * 2**(e - 25)`` for normals, ``m * 2**-24`` for
  subnormals, ±inf, and NaN for exponent 31 (the NaN payload is not kept).
* ``round_to_f16(x)`` / ``round_to_bf16(x)`` — float32 rounded to the nearest binary16 / bfloat16
  (ties to even, overflow to ±inf), returned as the float32 of that value; matches
  ``np.float16(x)`` and ``ggml_compute_fp32_to_bf16`` (gguf's ``BF16.quantize_blocks``).
* ``E8M0_HALF[e]`` — ``2**(e - 128)`` as float32, bit-constructed like ``ggml_e8m0_to_fp32_half``
  (denormal for e < 2).
"""

from __future__ import annotations

import math

import numpy as np

from .flags import jit

#: ``F16_POW2[e] = 2**(e - 25)``: a normal binary16 with exponent field ``e`` and mantissa ``m`` is
#: ``(1024 + m) * F16_POW2[e]``; a subnormal one is ``m * F16_POW2[1]``.
F16_POW2 = np.array([2.0 ** (e - 25) for e in range(32)], dtype=np.float32)

_e = np.arange(256, dtype=np.uint32)
#: ``E8M0_HALF[e] = 2**(e - 128)`` (half the E8M0 scale), exactly as ``ggml_e8m0_to_fp32_half``.
E8M0_HALF = np.where(_e < 2, np.uint32(0x00200000) << _e, (_e - np.uint32(1)) << np.uint32(23)).astype(np.uint32).view(np.float32)
del _e


@jit()
def f16_bits_to_f32(h):
    """binary16 bit pattern ``h`` (0..65535) -> float32 value (exact)."""
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = np.float32(m) * F16_POW2[1]
    elif e == 31:
        v = np.float32(np.inf) if m == 0 else np.float32(np.nan)
    else:
        v = np.float32(m + 1024) * F16_POW2[e]
    return -v if h & 0x8000 else v


def _f16_table() -> np.ndarray:
    """float32 [65536]: ``f16_bits_to_f32(h)`` for every bit pattern h (numpy, same formula)."""
    h = np.arange(65536, dtype=np.uint32)
    e, m = (h >> 10) & 0x1F, h & 0x3FF
    v = np.where(e == 0, m.astype(np.float32) * F16_POW2[1], (m + 1024).astype(np.float32) * F16_POW2[e])
    v = np.where(e == 31, np.where(m == 0, np.float32(np.inf), np.float32(np.nan)), v).astype(np.float32)
    return np.where(h & 0x8000, -v, v).astype(np.float32)


#: ``F16_TABLE[h] = f16_bits_to_f32(h)`` for all 65536 patterns (tested equal bit for bit): one load
#: instead of a branchy conversion, for the per-block scales of the lane kernels.
F16_TABLE = _f16_table()


@jit()
def f16_at(buf, o):
    """The little-endian binary16 at ``buf[o], buf[o+1]`` (a uint8 array), as float32."""
    return f16_bits_to_f32(int(buf[o]) | (int(buf[o + 1]) << 8))


@jit()
def _round_significand(x, bits, min_exp, overflow):
    """Round float32 ``x`` to ``bits`` significant bits, ties to even, with quantum >= 2**min_exp.

    All arithmetic is float64 and exact: the quantum is a power of two, ``rint`` rounds half to even.
    ``|result| >= overflow`` becomes ±inf. NaN and ±inf pass through; the sign of zero is kept.
    """
    a = abs(np.float64(x))
    if not (a < np.inf):  # inf or nan
        return x
    _, e = math.frexp(a)  # a = f * 2**e with 0.5 <= f < 1, so the leading bit has weight 2**(e-1)
    quantum = math.ldexp(1.0, max(e - bits, min_exp))
    r = np.rint(a / quantum) * quantum
    if r >= overflow:
        r = np.inf
    return np.float32(math.copysign(r, x))


@jit()
def round_to_f16(x):
    """float32 -> nearest binary16 value (ties to even), as float32. Like ``np.float16(x)``.

    binary16: 11 significant bits, smallest quantum 2**-24 (subnormals), largest finite 65504;
    anything that rounds to 65536 or more (i.e. |x| >= 65520) becomes inf.
    """
    return _round_significand(x, 11, -24, 65536.0)


@jit()
def round_to_bf16(x):
    """float32 -> nearest bfloat16 value (ties to even), as float32. Like ``ggml_compute_fp32_to_bf16``.

    bfloat16: 8 significant bits and float32's exponent range (smallest quantum 2**-133); values that
    round to 2**128 become inf.
    """
    return _round_significand(x, 8, -133, 2.0**128)
