"""Bit-exact emulation of ggml-cpu's float32 element-wise ops, per path (``"avx512"``, ``"avx2"``, ggml's generic x86
path ``"generic"``: docs/ggml-generic-x86.md, and the AArch64 NEON paths ``"arm64-dotprod"``, ``"arm64-i8mm"``).

What each op computes in the vendored llama.cpp of llama-cpp-python 0.3.36, checked against both libggml
builds bit for bit (tests/test_ggml_ops_unary.py) and against their disassembly (GCC, ``-O3``,
``-ffp-contract=fast``):

* ``add``, ``sub``, ``mul``, ``div`` (binary-ops.cpp: ``apply_binary_op``): one IEEE float32 operation per
  element, ``b`` tiled over ``a`` (index ``i % ne1x`` in every dimension, ``ggml_can_repeat``). Exact, so the
  same on every path — except which payload a NaN-and-NaN element keeps (GCC's vectorized loop decides, per
  build and position; not emulated: the model's NaNs all carry the default payload).
* ``scale`` (ops.cpp: ``ggml_compute_forward_scale_f32``): ``x*s`` when ``b == 0`` (``ggml_vec_scale_f32``),
  else ``fma(x, s, b)`` (``ggml_vec_mad1_f32``: ``_mm*_fmadd_ps`` on the SIMD part, and GCC contracts the
  scalar tail ``x[i]*s + b`` into ``vfmadd132ss`` too) — one rounding on both SIMD paths; two on ggml's generic
  path (a build without FMA: docs/ggml-generic-x86.md).
* ``neg`` (unary-ops.cpp: ``op_neg``): sign flip (NaN signs included). ``clamp``: ``MAX(MIN(x, max), min)``.
* ``exp``, ``sigmoid``, ``softplus`` (unary-ops.cpp: ``op_exp``, ``op_sigmoid``, ``op_softplus``): scalar loops
  calling glibc's ``expf`` / ``logf`` (``expf@GLIBC_2.27``, ``logf@GLIBC_2.27`` in both .so); not vectorized.
  We call the same libm (:mod:`kernels.ggml.libm`). Path-independent, but as exact as the host's libm is the
  same one.
* ``silu`` (vec.cpp: ``ggml_vec_silu_f32``) and ``swiglu`` (``ggml_vec_swiglu_f32``): SIMD blocks of 16
  (AVX-512), 8 (AVX2) or 4 (ggml's generic x86 build: its ``__SSE2__`` branch, no FMA) lanes with ``x / (1 + ggml_v_expf(0 - x))`` (``* g``) — the two paths have
  *different* expf polynomials (kernels/ggml/simd.py) — and a scalar tail ``x/(1.0f + expf(-x))`` with libm.
* ``soft_max`` (ops.cpp: ``ggml_compute_forward_soft_max_f32``, max_bias 0): ``w = x*scale`` (+ mask, F32 or
  F16), ``max`` by the scalar ``MAX`` loop (``ggml_vec_max_f32``), then ``ggml_vec_soft_max_f32``
  (:mod:`kernels.ggml.vec`: ``v_expf(w - max)`` per block, each block summed across lanes in float32 and
  added to a double ``sum``; the tail with libm ``expf``); finally ``y *= (float)(1.0/sum)``.
* ``cast_f16`` / ``cast_f16_to_f32`` (ops.cpp: ``ggml_compute_forward_dup_flt``): *not* the F16C instructions —
  on x86 simd-mappings.h leaves ``GGML_CPU_FP32_TO_FP16`` = ggml-impl.h's portable ``ggml_compute_fp32_to_fp16``
  and ``GGML_CPU_FP16_TO_FP32`` = a table filled by ``ggml_compute_fp16_to_fp32``: round to nearest even, every
  NaN -> sign | 0x7E00 (payload dropped); F16 -> F32 exact, NaN quieted with its payload. (The F16
  ``from_float`` of set_rows / mul_mat, ``ggml_cpu_fp32_to_fp16``, is ``vcvtps2ph``: the same on numbers, a NaN
  keeps its top payload bits per the ISA — untested here.) ``cast_bf16``: ggml-impl.h
  ``ggml_compute_fp32_to_bf16`` (scalar bit formula). Path-independent.
* ``sum_rows`` (``ggml_vec_sum_f32``: float32 values summed in order into a double, then rounded) and
  ``cumsum`` (``ggml_vec_cumsum_f32``: float32 running sum in order). Path-independent.

AArch64 (``arm64-dotprod`` / ``arm64-i8mm``, GCC 12; tested against both builds): vec.h's NEON ``ggml_v_expf`` is
the AVX2 formula lane for lane (:data:`kernels.ggml.simd.NEON`: blocks of 4, so silu / swiglu / soft_max differ
from AVX2 only in which elements take the scalar tail), the tails call AArch64 glibc's ``expf``
(:func:`kernels.ggml.libm.expf_arm64`: 2 of 2**32 inputs differ from x86-64's), ``ggml_vec_mad1_f32``'s tail is
contracted into ``fmadd`` as on x86, the F16 casts are ggml-impl.h's portable ones (``GGML_CPU_FP32_TO_FP16`` is not
redefined for NEON; F16 -> F32 is ``fcvt``, the same bits as the table), and every other op computes the same
IEEE operations. What differs is the NaN an invalid operation returns, 0x7FC00000 (x86: 0xFFC00000): the ops
taking ``path`` follow it (:func:`kernels.ggml.simd.follows_nans`); ``add`` … ``div``, ``sum_rows``, ``cumsum``
take an optional ``path`` for it (None: x86's).
The SVE library (``arm64-sve128``, ``arm64-sve256``: expf codes :data:`kernels.ggml.simd.SVE128` / ``SVE256``): silu,
swiglu and soft_max take NEON's ``ggml_v_expf`` on *every* element (``svwhilelt`` predicates the last block: no libm
tail), in blocks of ``svcntw()`` = 4 or 8 lanes — which changes no silu / swiglu bit, and soft_max's block sums
(FADDV: :mod:`kernels.ggml.sve`).

None of these depends on the thread count: ggml splits them by rows, and every row is computed whole by
one thread. Arrays: float32 of shape (rows, n) or more dims (leading dims are rows; ne0 is the last axis).
"""

from __future__ import annotations

import functools

import numpy as np

from kernels.base.flags import jit
from kernels.ggml.libm import GLIBC_AARCH64, GLIBC_X86_64, expf_on, glibc_of, logf
from kernels.ggml.simd import NEON, SVE128, SVE256, check_path, expf_block, expf_lanes, f32_bits, fma32, follows_nans, v_expf
from kernels.ggml.vec import vec_max_f32, vec_soft_max_f32


def _rows(x) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)  # (rows, n)


def _on_rows(kernel, x, *args) -> np.ndarray:
    """``kernel(rows, *args, out)`` on x as (rows, n), the result in x's shape."""
    x = np.asarray(x, dtype=np.float32)
    rows = _rows(x)
    y = np.empty_like(rows)
    kernel(rows, *args, y)
    return y.reshape(x.shape)


# ---------------------------------------------------------------------------------------------------
# Binary ops and scale (exact IEEE operations: the same on every path)


def _tile(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``b`` repeated to ``shape`` as binary-ops.cpp reads it: element (i3, i2, i1, i0) of the result is
    b[i3 % ne13, i2 % ne12, i1 % ne11, i0 % ne10] (each of b's dims divides a's: ggml_can_repeat)."""
    b = np.asarray(b, dtype=np.float32)
    b = b.reshape((1,) * (len(shape) - b.ndim) + b.shape)
    if any(s % t for s, t in zip(shape, b.shape)):
        raise ValueError(f"ggml cannot repeat {b.shape} to {shape}")
    return np.tile(b, tuple(s // t for s, t in zip(shape, b.shape)))  # shape


@follows_nans
def _binary(ufunc, a, b, path) -> np.ndarray:
    a = np.asarray(a, dtype=np.float32)
    with np.errstate(all="ignore"):
        return ufunc(a, _tile(b, a.shape))


def add(a, b, path: str | None = None) -> np.ndarray:
    """ggml_add: binary-ops.cpp op_add, ``a[i] + b[i % ne10 …]`` in float32 (likewise sub, mul, div). The same
    numbers on every path; ``path`` decides only the NaN an invalid operation returns (None: x86's)."""
    return _binary(np.add, a, b, path)


def sub(a, b, path: str | None = None) -> np.ndarray:
    """ggml_sub: binary-ops.cpp op_sub."""
    return _binary(np.subtract, a, b, path)


def mul(a, b, path: str | None = None) -> np.ndarray:
    """ggml_mul: binary-ops.cpp op_mul."""
    return _binary(np.multiply, a, b, path)


def div(a, b, path: str | None = None) -> np.ndarray:
    """ggml_div: binary-ops.cpp op_div."""
    return _binary(np.divide, a, b, path)


def neg(x) -> np.ndarray:
    """ggml_neg: unary-ops.cpp op_neg, ``-x`` (flips the sign bit, of NaNs too)."""
    return -np.asarray(x, dtype=np.float32)


def clamp(x, lo: float, hi: float) -> np.ndarray:
    """ggml_clamp (ops.cpp ggml_compute_forward_clamp_f32): ``MAX(MIN(x, max), min)`` with the C macros
    ``MIN(a, b) = a < b ? a : b``, ``MAX(a, b) = a > b ? a : b`` — a NaN becomes ``max``."""
    x = np.asarray(x, dtype=np.float32)
    t = np.where(x < np.float32(hi), x, np.float32(hi))  # MIN(x, max)
    return np.where(t > np.float32(lo), t, np.float32(lo)).astype(np.float32)  # MAX(…, min)


@jit()
def _mad1_rows(x, s, b, y):
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            y[r, i] = fma32(x[r, i], s, b)  # ggml_vec_mad1_f32: GGML_F32_VEC_FMA(vb, x, vs); tail contracted


@follows_nans
def scale(x, s: float, b: float = 0.0, path: str = "avx512") -> np.ndarray:
    """ggml_scale (b = 0: ``x*s``, ggml_vec_scale_f32) and ggml_scale_bias (``fma(x, s, b)``,
    ggml_vec_mad1_f32; on ggml's generic path, built without FMA, ``x*s`` and ``+ b`` rounded apart). ops.cpp:
    ggml_compute_forward_scale_f32 tests ``b == 0.0f`` (so -0.0 scales too)."""
    x = np.asarray(x, dtype=np.float32)
    s, b = np.float32(s), np.float32(b)
    if b == 0 or check_path(path) == "generic":
        with np.errstate(all="ignore"):
            return x * s if b == 0 else x * s + b  # generic: vec.h's scalar ggml_vec_mad1_f32, two roundings
    return _on_rows(_mad1_rows, x, s, b)


# ---------------------------------------------------------------------------------------------------
# Unary ops on libm (unary-ops.cpp: scalar loops, the same on every path)


@functools.cache
def _unary_for(glibc: int):
    """The unary ops' kernel for one glibc (a compile-time constant: only its ``expf`` compiles)."""

    @jit()
    def unary_rows(x, op, y):
        for r in range(x.shape[0]):
            for i in range(x.shape[1]):
                v = x[r, i]
                if op == 0:  # op_exp
                    y[r, i] = expf_on(v, glibc)
                elif op == 1:  # op_sigmoid: 1.f / (1.f + expf(-x))
                    y[r, i] = np.float32(np.float32(1.0) / np.float32(np.float32(1.0) + expf_on(-v, glibc)))
                else:  # op_softplus: (x > 20.0f) ? x : logf(1.0f + expf(x))
                    y[r, i] = v if v > np.float32(20.0) else logf(np.float32(np.float32(1.0) + expf_on(v, glibc)))

    return unary_rows


def _unary(path):
    """The unary ops' kernel for ``path``'s glibc (None: the host's)."""
    return _unary_for(GLIBC_X86_64 if path is None else glibc_of(path))


@follows_nans
def exp(x, path: str | None = None) -> np.ndarray:
    """ggml_exp: libm ``expf`` per element — the glibc of ``path`` (None: the host's); the op has no SIMD code."""
    return _on_rows(_unary(path), x, 0)


@follows_nans
def sigmoid(x, path: str | None = None) -> np.ndarray:
    """ggml_sigmoid: ``1/(1 + expf(-x))`` with libm (no SIMD code)."""
    return _on_rows(_unary(path), x, 1)


@follows_nans
def softplus(x, path: str | None = None) -> np.ndarray:
    """ggml_softplus: ``x > 20 ? x : logf(1 + expf(x))`` with libm (no SIMD code)."""
    return _on_rows(_unary(path), x, 2)


# ---------------------------------------------------------------------------------------------------
# SiLU and SwiGLU (vec.cpp: SIMD blocks with ggml_v_silu, scalar tail with ggml_silu_f32)


@functools.cache
def _silu_for(lanes: int):
    """ggml_vec_silu_f32 (``has_g`` false) / ggml_vec_swiglu_f32 on each row of x (and g) with ``lanes`` a constant:
    only that path's ``v_expf`` and tail compile (one kernel for silu and swiglu, the loop in it: no level of
    compiled calls more)."""

    @jit()
    def silu_rows(x, g, has_g, y):
        width = expf_block(lanes)
        glibc = GLIBC_AARCH64 if lanes == NEON else GLIBC_X86_64  # the scalar tail's libm expf
        for r in range(x.shape[0]):
            n = x.shape[1]
            last = n + width - 1 if lanes == SVE128 or lanes == SVE256 else n  # SVE: svwhilelt_b32 predicates the last block
            i = 0
            while i + width - 1 < last:  # for (; i + 15 < n; i += 16) — AVX2: i + 7 < n, i += 8; SSE2, NEON: 4
                for lane in range(min(width, n - i)):
                    v = x[r, i + lane]
                    # ggml_v_silu: neg_x = sub(zero, x); x / add(one, ggml_v_expf(neg_x))
                    s = np.float32(v / np.float32(np.float32(1.0) + v_expf(np.float32(np.float32(0.0) - v), lanes)))
                    y[r, i + lane] = np.float32(s * g[r, i + lane]) if has_g else s  # _mm*_mul_ps(silu, g)
                i += width
            while i < n:  # the scalar tail: ggml_silu_f32(x) = x/(1.0f + expf(-x)), times g[i] for swiglu
                v = x[r, i]
                s = np.float32(v / np.float32(np.float32(1.0) + expf_on(-v, glibc)))
                y[r, i] = np.float32(s * g[r, i]) if has_g else s
                i += 1

    return silu_rows


@follows_nans
def silu(x, path: str) -> np.ndarray:
    """ggml_silu (ops.cpp ggml_compute_forward_silu_f32 → vec.cpp ggml_vec_silu_f32) on ``path``."""
    return _on_rows(_silu_for(expf_lanes(path, "ggml_silu")), x, _rows(x), False)


@follows_nans
def swiglu(a, b, path: str) -> np.ndarray:
    """ggml_swiglu_split(a, b) = silu(a)·b (ops.cpp ggml_compute_forward_swiglu_f32 → ggml_vec_swiglu_f32).
    With ``b`` None, the fused ggml_swiglu(a): x = the first half of each row of ``a``, g = the second."""
    a = np.asarray(a, dtype=np.float32)
    if b is None:
        nc = a.shape[-1] // 2
        a, b = a[..., :nc], a[..., nc : 2 * nc]  # swapped = 0: src0_p = row, src1_p = row + nc
    b = np.asarray(b, dtype=np.float32)
    if a.shape != b.shape:
        raise ValueError(f"swiglu: {a.shape} and {b.shape} differ")
    return _on_rows(_silu_for(expf_lanes(path, "ggml_swiglu")), a, _rows(b), True)


# ---------------------------------------------------------------------------------------------------
# Soft max (ops.cpp ggml_compute_forward_soft_max_f32, vec.cpp ggml_vec_soft_max_f32)


@jit()
def _soft_max_rows(x, mask, mask_of, has_mask, scale, lanes, y):
    """x, y: (B, R, n); mask: (Bm, Rm >= R, n) float32, mask_of[b] its slice for x's slice b."""
    n = x.shape[2]
    wp = np.empty(n, np.float32)  # params->wdata: the scaled, masked row
    for b in range(x.shape[0]):
        for r in range(x.shape[1]):
            for i in range(n):
                wp[i] = np.float32(x[b, r, i] * scale)  # ggml_vec_cpy_f32; ggml_vec_scale_f32(ne00, wp, scale)
            if has_mask:
                for i in range(n):  # wp[i] += slope*mp_f32[i], slope = 1 (max_bias 0): one rounding
                    wp[i] = fma32(np.float32(1.0), mask[mask_of[b], r, i], wp[i])
            mx = vec_max_f32(n, wp)
            out = y[b, r]
            total = vec_soft_max_f32(n, out, wp, mx, lanes)  # ggml_float sum
            inv = np.float32(np.float64(1.0) / total)  # sum = 1.0/sum; ggml_vec_scale_f32(ne00, dp, (float)sum)
            for i in range(n):
                out[i] = np.float32(out[i] * inv)


@functools.cache
def _soft_max_for(has_mask: bool, lanes: int):
    """:func:`_soft_max_rows` with ``has_mask`` and ``lanes`` constants: only that path's ``v_expf`` compiles."""

    @jit()
    def soft_max_rows(x, mask, mask_of, scale, y):
        _soft_max_rows(x, mask, mask_of, has_mask, scale, lanes, y)

    return soft_max_rows


@follows_nans
def soft_max(x, mask, scale: float, path: str, max_bias: float = 0.0) -> np.ndarray:
    """ggml_soft_max_ext(x, mask, scale, 0) on ``path`` (ggml_soft_max: mask None, scale 1).

    ``x``: (…, ne02, ne01, ne00) float32, up to 4 dims; ``mask``: float32 or float16 (its bits), (ne01' >= ne01,
    ne00) with optional leading dims (ne12, ne13) dividing x's: row i01 of slice (i02 % ne12, i03 % ne13)."""
    if max_bias != 0.0:
        raise NotImplementedError("soft_max: ALiBi (max_bias > 0) is not emulated")
    x = np.ascontiguousarray(x, dtype=np.float32)
    x4 = x.reshape((1,) * (4 - x.ndim) + x.shape)  # (ne03, ne02, ne01, ne00)
    ne03, ne02, ne01, ne00 = x4.shape
    xb = x4.reshape(ne03 * ne02, ne01, ne00)  # (B, R, n)
    if mask is None:
        m, mask_of = np.zeros((1, 1, 1), np.float32), np.zeros(ne03 * ne02, np.int64)
    else:
        mask = np.asarray(mask)
        m = cast_f16_to_f32(mask) if mask.dtype == np.float16 else np.ascontiguousarray(mask, dtype=np.float32)
        m4 = m.reshape((1,) * (4 - m.ndim) + m.shape)  # (ne13, ne12, ne11, ne10)
        ne13, ne12, ne11, ne10 = m4.shape
        if ne10 != ne00 or ne11 < ne01 or ne02 % ne12 or ne03 % ne13:
            raise ValueError(f"soft_max: mask {m.shape} does not fit x {x.shape}")
        m = m4.reshape(ne13 * ne12, ne11, ne10)
        i3, i2 = np.divmod(np.arange(ne03 * ne02), ne02)
        mask_of = ((i3 % ne13) * ne12 + (i2 % ne12)).astype(np.int64)  # i13*ne12 + i12
    y = np.empty_like(xb)
    _soft_max_for(mask is not None, expf_lanes(path, "ggml_soft_max"))(xb, m, mask_of, np.float32(scale), y)
    return y.reshape(x.shape)


# ---------------------------------------------------------------------------------------------------
# Type conversions (ggml-impl.h's portable F16 and BF16 conversions, on both paths)


@jit(inline=True)
def _f32_to_f16_bits(u):
    """ggml-impl.h ggml_compute_fp32_to_fp16 (float32 bits -> binary16 bits): round to nearest even, written
    here by cases instead of its float tricks; ``shl1_w > 0xFF000000`` (NaN) gives ``0x7E00``."""
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:  # NaN: the canonical quiet half NaN, sign kept, payload dropped
        return sign | 0x7E00
    if a >= 0x477FF000:  # >= 65520 (and inf): rounds to inf
        return sign | 0x7C00
    if a >= 0x38800000:  # >= 2**-14: a normal half; rebias the exponent by 127 - 15, round 13 bits off
        m = a - 0x38000000
        return sign | ((m + 0x0FFF + ((m >> 13) & 1)) >> 13)
    e = a >> 23
    if e == 0:  # float32 zero or subnormal (< 2**-126): rounds to zero
        return sign
    mant = (a & 0x7FFFFF) | 0x800000  # value = mant * 2**(e - 150) = mant * 2**(e - 126) half subnormal units
    s = 126 - e  # >= 14
    if s > 24:  # < 2**-25: below half the smallest subnormal
        return sign
    return sign | ((mant + (1 << (s - 1)) - 1 + ((mant >> s) & 1)) >> s)


@jit()
def _cast_f16_rows(u, h):
    for i in range(u.size):
        h[i] = _f32_to_f16_bits(np.int64(u[i]))


@jit()
def f16_value(x):
    """One float32 through ``ggml_compute_fp32_to_fp16`` and back: its F16 value as float32 (round to nearest even; a
    NaN becomes sign | 0x7E00) — ggml's portable conversion, as the generic build's scalar code calls it."""
    return F16_TO_F32[_f32_to_f16_bits(np.uint32(f32_bits(x)))]


def cast_f16(x) -> np.ndarray:
    """ggml_cpy/ggml_cast F32 -> F16 (ops.cpp dup_flt<float, ggml_fp16_t>: common.h f32_to_f16 =
    GGML_CPU_FP32_TO_FP16 = ggml_compute_fp32_to_fp16). Returns a float16 array (its bits are the result)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    h = np.empty(x.size, np.uint16)
    _cast_f16_rows(x.reshape(-1).view(np.uint32), h)
    return h.reshape(x.shape).view(np.float16)


def _fp16_to_fp32_bits(h) -> np.ndarray:
    """``ggml_compute_fp16_to_fp32`` of uint16 bits (any shape) -> uint32 float32 bits: exact; a NaN comes out of
    that function's multiply by 2**-112 quieted, its payload kept."""
    h = np.asarray(h, dtype=np.uint16).astype(np.uint32)
    sign, e, m = (h & 0x8000) << 16, (h >> 10) & 0x1F, h & 0x3FF
    normal = ((e + 112) << 23) | (m << 13)  # 112 = 127 - 15
    shift = np.zeros_like(m)  # subnormal m * 2**-24: normalize m to 1.xxx
    for _ in range(10):
        shift = np.where((m << shift) & 0x400, shift, shift + 1)
    sub = np.where(m == 0, 0, ((113 - shift) << 23) | (((m << shift) & 0x3FF) << 13))
    special = 0x7F800000 | (m << 13) | np.where(m != 0, 0x00400000, 0)  # inf; NaN quieted
    return (sign | np.where(e == 0, sub, np.where(e == 31, special, normal))).astype(np.uint32)


#: ``ggml_table_f32_f16``: ``ggml_compute_fp16_to_fp32`` of all 65536 halves, indexed by the bits. F16C's
#: ``vcvtph2ps`` gives the same bits for every input (a signalling NaN quieted, payload kept), so this is also
#: ``GGML_CPU_FP16_TO_FP32`` / ``ggml_cpu_fp16_to_fp32`` of every path (get_rows, mul_mat's F16 weights).
F16_TO_F32 = _fp16_to_fp32_bits(np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)).view(np.float32)


def cast_f16_to_f32(h) -> np.ndarray:
    """ggml_cpy/ggml_cast F16 -> F32 (ggml_table_f32_f16, filled by ggml_compute_fp16_to_fp32): exact; a NaN
    comes out quieted, its payload kept. A lookup in :data:`F16_TO_F32` (compiled: numpy's fancy indexing took
    ~1.4 ns a value)."""
    u = np.ascontiguousarray(h, dtype=np.float16).view(np.uint16)
    out = np.empty(u.shape, np.float32)
    _f16_lookup(u.reshape(-1), F16_TO_F32, out.reshape(-1))
    return out


@jit()
def _f16_lookup(u, tab, out):
    for i in range(u.size):
        out[i] = tab[u[i]]


@jit()
def fp16_at(src, o, tab):
    """``GGML_CPU_FP16_TO_FP32`` of the little-endian half at bytes ``src[o:o+2]`` (``tab``: F16_TO_F32)."""
    return tab[np.int64(src[o]) | (np.int64(src[o + 1]) << 8)]


def cast_bf16(x) -> np.ndarray:
    """ggml_cpy/ggml_cast F32 -> BF16 (dup_flt<float, ggml_bf16_t>: ggml-impl.h ggml_compute_fp32_to_bf16):
    NaN -> (u >> 16) | 64; else (u + 0x7fff + ((u >> 16) & 1)) >> 16. Returns the uint16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 64, (u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)


# ---------------------------------------------------------------------------------------------------
# Row sums (ggml_sum_rows: double accumulation) and running sums (ggml_cumsum: float32)


@follows_nans
def sum_rows(x, path: str | None = None) -> np.ndarray:
    """ggml_sum_rows: each row summed in order in double, rounded to float32; shape (…, 1). ``ggml_vec_sum_f32``:
    ``ggml_float sum = 0.0; sum += (ggml_float)x[i]``, ``*s = (float)sum`` — numpy's running sum (``cumsum`` adds in
    order, unlike ``sum``'s pairwise blocks), its last column, rounded once; nothing to compile."""
    x = np.asarray(x, dtype=np.float32)
    rows = _rows(x)  # [R, n]
    total = np.zeros((rows.shape[0], 1)) if rows.shape[1] == 0 else np.cumsum(rows, axis=1, dtype=np.float64)[:, -1:]
    return total.astype(np.float32).reshape(x.shape[:-1] + (1,))  # [R, 1] -> (…, 1): ne0 = 1


@jit()
def _cumsum_rows(x, y):
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):  # ggml_vec_cumsum_f32: y[0] = x[0]; y[i] = y[i - 1] + x[i]
            y[r, i] = x[r, i] if i == 0 else np.float32(y[r, i - 1] + x[r, i])


@follows_nans
def cumsum(x, path: str | None = None) -> np.ndarray:
    """ggml_cumsum along rows (float32 running sum, in order)."""
    return _on_rows(_cumsum_rows, x)
