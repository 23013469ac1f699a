"""Which way GCC tuned an x86-64 libggml-cpu: told by running one of its own dot products.

The ISA flags (``ggml_cpu_has_*``) do not fix every bit of an x86 build. GCC's ``-mtune`` does too: tuned for AMD
Zen (``-march=native`` on an EPYC or Ryzen, ``-mtune=znver2``/``znver3``), it will not contract a *loop-carried*
``s += a*b`` into an FMA (x86-tune.def: ``avoid_fma_chains``), where the generic and the Intel tunings do
(``-DGGML_NATIVE=OFF``, ``-march=native`` on a Xeon or Core). Compiling the vendored ggml-cpu both ways
(GCC 12.2, 2026-12-06) and comparing every function's FMAs, the ops the emulation follows differ in two places on
both ISAs: the scalar tail of ``arch/x86/quants.c``'s ``ggml_vec_dot_mxfp4_q8_0`` and ``ggml_vec_dot_iq4_nl_q8_0``
(an odd last block: ``sumf += d * (sumi1 + sumi2)``), which is one ``vfmadd231ss`` ("fused") or ``vmulss`` +
``vaddss`` ("split").

:func:`probe_fma_chains` asks the library: it calls ``ggml_get_type_traits_cpu(GGML_TYPE_MXFP4)->vec_dot`` on one
row of three blocks built so that the two roundings differ (:data:`TAIL_CASE`), and names the one the library
computed. The paths record it (``kernels.ggml.build.EmulatedPath.chains``; ``kernels.ggml.isa.Simd.split_chains``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from kernels.plain.dequant import MXFP4_VALUES  # kvalues_mxfp4: twice each FP4 value, as the integer dot takes it

GGML_TYPE_MXFP4 = 39  # ggml.h
FUSED, SPLIT = "fused", "split"

_F16_ONE, _F16_ONE_ULP = 0x3C00, 0x3C01  # fp16 1.0 and 1 + 2^-10
_E8M0_ONE = 128  # GGML_E8M0_TO_FP32_HALF(128) = 1.0: the dot is then Σ kvalues_mxfp4[c]·q exactly
_CODE_12, _CODE_1 = 7, 1  # MXFP4_VALUES[7] = 12, MXFP4_VALUES[1] = 1


@dataclass(frozen=True)
class TailCase:
    """One MXFP4 row of 3 blocks and one Q8_0 row of 3 blocks, and what ``vec_dot`` returns for each tuning."""

    mxfp4: bytes  # 3 × block_mxfp4 (e, qs[16]: element j in the low nibble of qs[j], j + 16 in the high one)
    q8_0: bytes  # 3 × block_q8_0 (fp16 d, qs[32])
    fused: np.float32
    split: np.float32


def _tail_case() -> TailCase:
    """Blocks 0 and 1 (the AVX2 pair loop) sum to S = -47371 exactly (d = 1: every product an integer, every
    partial sum exact); block 2 (the scalar tail) has d = 1 + 2^-10 and the odd integer sum s = 47371, so P = d·s
    needs 26 bits. Fused: RN(P + S) = s·2^-10 exactly; split: RN(RN(P) + S), RN(P) off by 1/4 of an ulp of 2^15."""
    w = np.zeros((3, 32), np.uint8)  # codes (block 1: all 0)
    q = np.zeros((3, 32), np.int8)
    w[0, :], q[0, :] = _CODE_12, -127  # block 0: 31 · 12 · -127 + 1 · -127 = -47371
    w[0, 31] = _CODE_1
    w[2, :], q[2, :] = _CODE_12, 127  # block 2: 31 · 12 · 127 + 1 · 127 = 47371
    w[2, 31] = _CODE_1
    mx = bytearray()
    for b in range(3):
        mx.append(_E8M0_ONE)
        mx += bytes((w[b, :16] | (w[b, 16:] << 4)).astype(np.uint8))
    q8 = bytearray()
    for b, d in enumerate((_F16_ONE, _F16_ONE, _F16_ONE_ULP)):
        q8 += int(d).to_bytes(2, "little") + q[b].tobytes()
    sums = (MXFP4_VALUES[w].astype(np.int64) * q).sum(axis=1)  # each block's integer dot
    s_pair, s_tail = int(sums[0] + sums[1]), int(sums[2])  # -47371, 47371
    d_tail = np.float64(np.array([_F16_ONE_ULP], np.uint16).view(np.float16)[0])
    p = d_tail * s_tail  # exact in float64 (26 bits)
    fused = np.float32(p + s_pair)  # one rounding of the exact value (the float64 sum is exact too)
    split = np.float32(np.float64(np.float32(p)) + s_pair)
    assert fused != split
    return TailCase(bytes(mx), bytes(q8), fused, split)


TAIL_CASE = _tail_case()

_VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class _TypeTraitsCpu(ctypes.Structure):  # ggml-cpu.h: struct ggml_type_traits_cpu
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


def probe_fma_chains(cpu: ctypes.CDLL) -> str:
    """:data:`FUSED` or :data:`SPLIT`: how the x86-64 libggml-cpu ``cpu`` (an AVX2 or AVX-512 build) rounds the scalar
    tail of its MXFP4 dot, from one call of it on :data:`TAIL_CASE`. ValueError when it computes neither, or does
    not export what is called."""
    try:
        cpu.ggml_cpu_init.restype, cpu.ggml_cpu_init.argtypes = None, []
        get = cpu.ggml_get_type_traits_cpu
    except AttributeError as e:
        raise ValueError(f"it does not export {e.args[0].split()[-1]}") from None
    get.restype, get.argtypes = ctypes.POINTER(_TypeTraitsCpu), [ctypes.c_int]
    cpu.ggml_cpu_init()
    traits = get(GGML_TYPE_MXFP4).contents
    if not traits.vec_dot:
        raise ValueError("its MXFP4 type has no vec_dot")
    x = ctypes.create_string_buffer(TAIL_CASE.mxfp4, len(TAIL_CASE.mxfp4))
    y = ctypes.create_string_buffer(TAIL_CASE.q8_0, len(TAIL_CASE.q8_0))
    s = ctypes.c_float(np.nan)
    _VEC_DOT(traits.vec_dot)(96, ctypes.byref(s), 0, ctypes.addressof(x), 0, ctypes.addressof(y), 0, 1)
    got = np.float32(s.value)
    if got == TAIL_CASE.fused:
        return FUSED
    if got == TAIL_CASE.split:
        return SPLIT
    raise ValueError(f"its MXFP4 dot computes {got!r} on the probe, neither the fused tail's {TAIL_CASE.fused!r} "
                     f"nor the split one's {TAIL_CASE.split!r}")
