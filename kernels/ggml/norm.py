"""Bit-exact emulation of ggml-cpu's row norms: ``ggml_rms_norm`` (alone and fused with the ``ggml_mul`` by
the norm weight), ``ggml_l2_norm``, and qwen35moe's ``build_gdn_l2_norm``.

ggml-cpu computes both norms with plain scalar C (``ops.cpp: ggml_compute_forward_rms_norm_f32`` and
``ggml_compute_forward_l2_norm_f32``, "TODO: optimize"); per row of ``n = ne00`` values::

    ggml_float sum = 0.0;                                  // double
    for (i00 = 0; i00 < ne00; i00++) sum += (ggml_float)(x[i00] * x[i00]);   // float square, then widened
    rms_norm:  mean = (float)(sum/ne00);  scale = 1.0f/sqrtf(mean + eps);
    l2_norm:   scale = 1.0f/fmaxf(sqrtf((float)sum), eps);
    y = x; ggml_vec_scale_f32(ne00, y, scale);             // y[i] = scale*y[i], lane by lane
    fused RMS_NORM+MUL (ggml-cpu.c: ggml_cpu_try_fuse_ops): y[i00] = x[i00] * scale * w[i00];

GCC (``-O3``, no ``-ffast-math``) keeps the double sum sequential (a float reduction in order cannot be
vectorized on x86: the disassembly of both builds shows ``vmulss; vcvtss2sd; vaddsd`` one element at a
time), cannot contract anything into an FMA (the square is rounded to float before the widening), and
the SIMD part, ``ggml_vec_scale_f32``, multiplies element by element. So **the result does not depend
on the ISA path** (AVX-512, AVX2 and ggml's generic build agree bit for bit, tested — but for which NaN a row of
two NaN payloads shows, below), nor on the thread count (rows are split between threads, each row computed whole by
one). ``path`` is accepted and checked.

Non-finite inputs, as the instructions order their operands (``vmulps`` has the broadcast ``scale`` as
its first source, and x86 returns the first NaN source, quieted):

* a NaN anywhere in a row makes ``sum`` that NaN (the first one, quieted: ``vaddsd`` keeps ``sum``'s
  NaN), so ``scale`` is it too, and rms_norm's whole row (fused or not) is ``quiet(first NaN of x)`` — on ggml's
  generic path (no SIMD: GCC vectorizes the scale loop 4 wide, SSE2 ``mulps y, scale`` with ``y`` the first source)
  except where ``x`` itself is a NaN outside the ``n % 4`` tail, which stays itself, quieted;
  l2_norm's ``fmaxf(NaN, eps)`` is ``eps``: the row is ``x/eps``-scaled and NaNs stay in place;
* ``|x| > ~1.8e19`` squares to ``inf`` *in float32* (before the widening the C casts after), so
  ``scale = 0``: the row becomes ±0 (and ``inf*0`` = the default NaN 0xFFC00000 where ``x`` is ±inf) —
  unlike the float64 math ``x/sqrt(mean(x²)+eps)``, which is finite there.

AArch64 (``arm64-dotprod`` / ``arm64-i8mm``, GCC 12, both builds' disassembly): the same scalar sum, mean and
scale, so the same numbers; the products follow Arm's NaN rules (a signalling NaN first, then the *first*
operand's, default NaN 0x7FC00000) in GCC's operand orders (:func:`_rms_norm_rows_arm64`): a NaN ``x`` keeps its
own NaN everywhere (``fmul y, scale``); l2_norm's ``fmaxnm`` ignores the NaN as glibc's ``fmaxf`` does.
"""

from __future__ import annotations

import functools

import numpy as np

from kernels.base.flags import jit, read_only
from kernels.ggml.libm import fmaxf
from kernels.ggml.simd import ARM_NAN, bits_f32, check_path, f32_bits, nan_swap, simd

F32 = np.float32
QUIET = np.uint32(0x00400000)  # the quiet bit x86 sets on a NaN that passes through arithmetic


def _check(x: np.ndarray, path: str) -> np.ndarray:
    check_path(path)  # checked only: the same on every path, ggml's generic one included
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0:
        raise ValueError("a norm needs at least one axis")
    return x


@jit(inline=True)
def _sum_squares(x):
    """``ggml_float sum`` of one row: float32 squares widened to double, added in order."""
    s = np.float64(0.0)
    for i in range(x.size):
        s += np.float64(np.float32(x[i] * x[i]))
    return s


@jit()
def _first_nan(xb):
    """Index of the first NaN in a row of float32 bit patterns (uint32), or -1."""
    for i in range(xb.size):
        if (xb[i] & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
            return i
    return -1


@jit()
def _rms_norm_rows(x, xb, eps, w, fused, own_nan, y, yb):
    """ops.cpp: ggml_compute_forward_rms_norm_f32 over rows x [R, n] -> y [R, n] (yb: y's bits); ``own_nan``: the
    generic build, whose loop GCC vectorized 4 wide with ``mulps y, scale`` (``y[i]``'s NaN the first source) and
    a scalar tail of ``n % 4`` with ``scale`` first."""
    R, n = x.shape
    for r in range(R):
        s = _sum_squares(x[r])
        j = _first_nan(xb[r]) if s != s else -1  # a NaN x makes the sum NaN (x·x; inf·inf is not): scanned then only
        if j >= 0:  # sum, mean, scale are quiet(x[j]); vmulps(scale, ·) returns it for every element
            for i in range(n):
                own = own_nan and i < n - n % 4 and (xb[r, i] & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
                yb[r, i] = (xb[r, i] if own else xb[r, j]) | QUIET
            continue
        mean = np.float32(s / np.float64(n))  # const float mean = sum/ne00;
        scale = np.float32(1.0) / np.sqrt(np.float32(mean + np.float32(eps)))  # 1.0f/sqrtf(mean + eps)
        for i in range(n):
            t = np.float32(scale * x[r, i])  # ggml_vec_scale_f32 / fused: x[i00] * scale
            if fused:
                # fused: (x*scale) * w[i00]; a NaN t (inf*0) is vmulps' first source and wins over a NaN w
                y[r, i] = t if t != t else np.float32(t * w[i])
            else:
                y[r, i] = t


@jit()
def _l2_norm_rows(x, eps, y):
    """ops.cpp: ggml_compute_forward_l2_norm_f32 over rows x [R, n] -> y [R, n]."""
    R, n = x.shape
    for r in range(R):
        s = _sum_squares(x[r])
        root = np.sqrt(np.float32(s))  # sqrtf(sum): the double sum is rounded to float first
        scale = np.float32(1.0) / fmaxf(root, eps)  # 1.0f/fmaxf(sqrtf(sum), eps): glibc's fmaxf
        for i in range(n):
            y[r, i] = np.float32(scale * x[r, i])  # scale is never NaN: a NaN x stays itself, quieted


@jit()
def _is_nan(b):
    return (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)


@jit()
def _arm_mul(a, ab, b, bb):
    """``fmul a, b`` on AArch64 as bits (FPCR.DN = 0): a signalling NaN first (quieted), then the first operand's
    quiet NaN, then the second's; an invalid product (inf·0) is the default NaN 0x7FC00000."""
    ab, bb = np.uint32(ab), np.uint32(bb)
    if _is_nan(ab) and (ab & QUIET) == 0:
        return np.uint32(ab | QUIET)
    if _is_nan(bb) and (bb & QUIET) == 0:
        return np.uint32(bb | QUIET)
    if _is_nan(ab):
        return ab
    if _is_nan(bb):
        return bb
    p = np.float32(a * b)
    return np.uint32(ARM_NAN) if p != p else np.uint32(f32_bits(p))


#: the operand orders of the fused ``x*scale*w`` in the AArch64 builds (:func:`_rms_norm_rows_arm64`'s ``order``):
#: GCC's NEON loop, GCC's SVE loop, clang's SVE loop. clang's NEON builds are read as GCC's (theirs — ``scale·x`` in
#: the even 4-lane halves of a block of 8, ``x·scale`` in the odd, ``t·w`` — is not modelled: a NaN's payload only)
GCC_NEON, GCC_SVE, CLANG_SVE = 0, 1, 2
ORDER = {"arm64-sve128": GCC_SVE, "arm64-sve256": GCC_SVE, "arm64-sve128-clang": CLANG_SVE,
         "arm64-sve128-clang14": CLANG_SVE}


@jit()
def _rms_norm_rows_arm64(x, xb, eps, w, wb, fused, yb, order=GCC_NEON):
    """ops.cpp: ggml_compute_forward_rms_norm_f32 / _mul_fused as GCC 12 built it for AArch64 (both builds'
    disassembly): the same sum, mean and scale as x86 (``fmul s; fcvt d; fadd d`` in order, ``fdiv d``, ``fadd s``,
    ``fsqrt``, ``fdiv s``), so the same numbers; the products with Arm's NaN rules (:func:`_arm_mul`) in the
    operand orders GCC chose — plain: ``fmul y, scale`` everywhere (vec_scale_f32); fused ``(x*scale)*w``: with
    ``n`` ≤ 4 one scalar loop ``fmul scale, x`` then ``fmul w, t``; else ``fmul x, scale`` / ``fmul t, w`` on the
    4-wide part, and on the ``n % 4`` tail ``fmul scale, x`` then ``fmul t, w``, ``fmul t, w``, ``fmul w, t``.
    ``order`` GCC_SVE (``arm64-sve128``; ``arm64-sve256``, the same loop at any length): GCC's SVE loop (predicated,
    ``whilelo``) takes every element, ``fmul z, scale, x`` then ``fmul z, w, t`` — the orders of the ``n`` ≤ 4 loop, for
    any ``n``; CLANG_SVE (``arm64-sve128-clang``, ``-clang14``): ``fmul scale, x`` then ``fmul t, w`` in its vector loop
    and its scalar tail alike."""
    R, n = x.shape
    vec_end = (n & ~3) if n > 4 and order == GCC_NEON else 0
    for r in range(R):
        s = np.float64(0.0)
        sb = np.uint32(0)
        nan_sum = False
        for i in range(n):  # sum += (ggml_float)(x*x): a NaN sum keeps itself (op1, both quiet)
            if nan_sum:
                continue
            if _is_nan(xb[r, i]):
                nan_sum, sb = True, xb[r, i] | QUIET
            else:
                s += np.float64(np.float32(x[r, i] * x[r, i]))
        if nan_sum:
            scale = bits_f32(sb)
        else:
            mean = np.float32(s / np.float64(n))
            scale = np.float32(1.0) / np.sqrt(np.float32(mean + np.float32(eps)))
        scb = np.uint32(f32_bits(scale)) if scale == scale else (sb if nan_sum else np.uint32(ARM_NAN))
        for i in range(n):
            if not fused:
                yb[r, i] = _arm_mul(x[r, i], xb[r, i], scale, scb)
                continue
            if i < vec_end:
                tb = _arm_mul(x[r, i], xb[r, i], scale, scb)
            else:
                tb = _arm_mul(scale, scb, x[r, i], xb[r, i])
            t = bits_f32(tb)
            if order == CLANG_SVE:
                yb[r, i] = _arm_mul(t, tb, w[i], wb[i])
            elif vec_end == 0 or i - vec_end == 2:
                yb[r, i] = _arm_mul(w[i], wb[i], t, tb)
            else:
                yb[r, i] = _arm_mul(t, tb, w[i], wb[i])


@functools.cache
def _no_weight(n: int) -> np.ndarray:
    """The unused weight of an unfused rms_norm: zeros (n,), read-only as a mapped file's weights are, so that
    both calls share one compiled kernel."""
    w = np.zeros(n, np.float32)
    w.flags.writeable = False
    return w


def rms_norm(x: np.ndarray, eps: float, path: str, w: np.ndarray | None = None) -> np.ndarray:
    """``ggml_rms_norm(x, eps)`` over the last axis; with ``w`` [n], the RMS_NORM+MUL fusion
    ``ggml_compute_forward_rms_norm_mul_fused`` that ggml-cpu runs for ``build_norm``'s
    ``ggml_mul(ggml_rms_norm(x), w)`` (the same bits as the two ops apart for finite values).

    [..., n] -> [..., n] float32. ISA-independent (module docstring): ``path`` is only validated.
    """
    x = _check(x, path)
    n = x.shape[-1]
    x2 = read_only(x.reshape(-1, n))  # [R, n]: read-only whatever the caller's array is, one compiled kernel
    fused = w is not None
    w = np.ascontiguousarray(w, dtype=np.float32) if fused else _no_weight(n)
    if w.shape != (n,):
        raise ValueError(f"rms_norm weight must have shape ({n},), got {w.shape}")
    w = read_only(w)  # as a mapped file's weights (_no_weight)
    y = np.empty_like(x2)
    if simd(path, "ggml_rms_norm").nan == ARM_NAN:  # AArch64: the same numbers, Arm's NaNs
        _rms_norm_rows_arm64(x2, x2.view(np.uint32), F32(eps), w, w.view(np.uint32), fused, y.view(np.uint32),
                             ORDER.get(path, GCC_NEON))
    else:
        _rms_norm_rows(x2, x2.view(np.uint32), F32(eps), w, fused, path == "generic", y, y.view(np.uint32))
    return y.reshape(x.shape)


def l2_norm(x: np.ndarray, eps: float, path: str) -> np.ndarray:
    """``ggml_l2_norm(x, eps)`` over the last axis: ``x / fmaxf(sqrtf(Σx²), eps)``. [..., n] -> [..., n].
    ISA-independent (module docstring)."""
    x = _check(x, path)
    simd(path, "ggml_l2_norm")  # a path whose code is not emulated: refused, naming the op
    x2 = nan_swap(path, x.reshape(-1, x.shape[-1]))  # [R, n]; AArch64: only its default NaN differs (fmaxnm)
    y = np.empty_like(x2)
    _l2_norm_rows(x2, F32(eps), y)
    return nan_swap(path, y).reshape(x.shape)


def gdn_l2_norm(x: np.ndarray, eps: float, path: str) -> np.ndarray:
    """qwen35moe's q/k normalisation before the delta rule, ``models.h: build_gdn_l2_norm``:
    ``ggml_scale(ggml_rms_norm(x, eps/n), 1.0f/sqrtf(n))`` with ``const float n = x->ne[0]`` — *not*
    ``ggml_l2_norm``. ``ggml_scale`` with bias 0 is ``ggml_vec_scale_f32`` (``ops.cpp:
    ggml_compute_forward_scale_f32``): ``y[i] = s*y[i]``, element-wise. [..., n] -> [..., n]."""
    x = _check(x, path)
    n = F32(x.shape[-1])
    y = rms_norm(x, F32(F32(eps) / n), path)
    s = F32(F32(1.0) / np.sqrt(n))
    return (s * y).astype(np.float32)  # s is finite: the product's NaNs are y's, quieted (vmulps)


__all__ = ["rms_norm", "l2_norm", "gdn_l2_norm"]
