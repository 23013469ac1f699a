"""Bit-exact emulation of ggml-cpu's RoPE on float32 rows: ``ggml_rope_multi`` (qwen35moe's interleaved
M-RoPE, ``GGML_ROPE_TYPE_IMROPE``; also plain ``GGML_ROPE_TYPE_MROPE``) and ``ggml_rope_ext`` with
``GGML_ROPE_TYPE_NEOX`` (qwen3next), without freq_factors and with ``ext_factor = 0`` (no YaRN ramp).

``ops.cpp: ggml_compute_forward_rope_flt<float>`` does, per token ``i2`` (one cache for all its heads):

1. ``theta_scale = powf(freq_base, -2.0f/n_dims)`` — glibc's ``powf`` (:mod:`kernels.ggml.libm`);
2. the cache (``ggml_rope_cache_init`` for NEOX, ``ggml_mrope_cache_init`` for M-RoPE): float32 angles
   that start at the token's position(s) — ``(float)p``, i.e. ``cvtsi2ss`` — and are multiplied by
   ``theta_scale`` once per pair (a running product, each step rounded); pair ``k`` takes one of the
   t/h/w/e angles (IMRoPE: ``sector = k % Σsections``, ``sector % 3`` picks h/w/t while below
   ``3·sections[1|2|0]``, else e). ``rope_yarn`` with ``ext_factor == 0``:
   ``theta = freq_scale*theta_extrap`` (``theta_extrap = theta/ff``, ff = 1), then
   ``cos = cosf(theta)*mscale``, ``sin = sinf(theta)*mscale*sin_sign`` (``mscale = attn_factor``).
   GCC turns the ``cosf``/``sinf`` pair into one glibc ``sincosf`` call (both builds' disassembly);
   glibc's ``sinf``/``cosf`` give the same bits as its ``sincosf`` (same kernel), and this module calls
   ``sinf``/``cosf`` (:mod:`kernels.ggml.libm`) — numpy's
   ``np.sin``/``np.cos`` float32 SIMD routines differ from glibc in ~25 % of the angles;
3. ``rotate_pairs(n_dims, n_dims/2, cache, src, dst)`` — NEOX pairing, dims ``k`` and ``k + n_dims/2``::

       dst[0]        = x0*cos_theta - x1*sin_theta;   // vmulss t = sin*x1;  vfmsub231ss: fma(x0, cos, -t)
       dst[n_offset] = x0*sin_theta + x1*cos_theta;   // vmulss u = cos*x1;  vfmadd132ss: fma(x0, sin, u)

   GCC contracts each line into one FMA the same way in both builds (the NEOX/M-RoPE loop is scalar in
   both; only GGML_ROPE_TYPE_NORMAL is vectorized), so **RoPE does not depend on the ISA path**
   (tested bit for bit against both). ggml's generic build (no FMA: docs/ggml-generic-x86.md) rounds each
   product: ``fl(fl(x0*cos) - fl(x1*sin))``, ``fl(fl(x0*sin) + fl(x1*cos))`` (tested against it too). Dims ``n_dims .. ne0`` are copied unchanged (bits kept).
   Thread count: rows (heads) are split between threads; each thread rebuilds the same cache.

NaN payloads follow x86's FMA rule (observed on Zen 4; QEMU models x86 the same way,
``float_3nan_prop_abc``): of ``a*b + c`` the first NaN in the order a, b, c is returned, quieted, and
not negated by ``vfmsub``. ``a`` is ``cos``/``sin`` (never NaN), ``b`` is ``x0``, ``c`` is ``t``/``u``:
an ``x0`` NaN wins over an ``x1`` NaN, and ``t``/``u`` = ``±inf·0`` gives the default NaN 0xFFC00000
(:func:`_nan_fixup`; LLVM does not promise an operand order for the compiled ``fma32``).

AArch64 (``arm64-dotprod`` / ``arm64-i8mm``, GCC 12): the same scalar loop, the same contraction —
``fmul`` t = x1·sin, u = x1·cos, ``fnmsub`` x0·cos - t, ``fmadd`` x0·sin + u — and AArch64 glibc's ``powf`` /
``sincosf`` give the host's bits on these angles (compared under qemu), so the numbers are the x86 ones; only the
NaNs follow Arm's rules (:func:`_nan_fixup_arm64`: the addend's NaN first, signalling NaNs first, ``fnmsub``
negates its addend's NaN, the default NaN is 0x7FC00000). Tested bit for bit against both AArch64 builds.
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import jit
from kernels.ggml.libm import cosf, powf, sinf
from kernels.ggml.simd import ARM_NAN, check_path, fma32, simd

F32 = np.float32
ROPE_TYPE_NEOX, ROPE_TYPE_MROPE, ROPE_TYPE_IMROPE = 2, 8, 40  # ggml.h: GGML_ROPE_TYPE_*
_MROPE_KIND = {ROPE_TYPE_MROPE: 1, ROPE_TYPE_IMROPE: 2}
DEFAULT_NAN = np.uint32(0xFFC00000)  # what x86 returns for an invalid operation (inf*0, inf-inf)
QUIET = np.uint32(0x00400000)


@jit()
def _rope_cache(pos, kind, sections, half, theta_scale, freq_scale, mscale, cos, sin):
    """``ggml_rope_cache_init`` (kind 0) / ``ggml_mrope_cache_init`` (1: MROPE, 2: IMROPE) for every
    token: pos [4, T] int32 (row 0 only for kind 0) -> cos, sin [T, half] (the first ``half`` pairs)."""
    s0, s1, s2, s3 = sections[0], sections[1], sections[2], sections[3]
    sect_dims = s0 + s1 + s2 + s3
    sec_w = s1 + s0
    for i2 in range(cos.shape[0]):
        theta_t = np.float32(pos[0, i2])  # float theta_base_t = (float) p_t
        theta_h = np.float32(pos[1, i2]) if kind else np.float32(0.0)
        theta_w = np.float32(pos[2, i2]) if kind else np.float32(0.0)
        theta_e = np.float32(pos[3, i2]) if kind else np.float32(0.0)
        for k in range(half):  # k = i0/2
            theta = theta_t
            if kind == 2:  # is_imrope: qwen3vl's interleaved sectors
                sector = k % sect_dims
                if sector % 3 == 1 and sector < 3 * s1:
                    theta = theta_h
                elif sector % 3 == 2 and sector < 3 * s2:
                    theta = theta_w
                elif sector % 3 == 0 and sector < 3 * s0:
                    theta = theta_t
                else:
                    theta = theta_e
            elif kind == 1:
                sector = k % sect_dims
                if sector >= s0 and sector < sec_w:
                    theta = theta_h
                elif sector >= sec_w and sector < sec_w + s2:
                    theta = theta_w
                elif sector >= sec_w + s2:
                    theta = theta_e
            # rope_yarn(theta/ff, ...) with ff = 1 and ext_factor == 0
            theta_interp = np.float32(np.float32(freq_scale) * theta)
            cos[i2, k] = np.float32(cosf(theta_interp) * np.float32(mscale))
            sin[i2, k] = np.float32(sinf(theta_interp) * np.float32(mscale))  # * sin_sign (1.0f, forward)
            theta_t = np.float32(theta_t * np.float32(theta_scale))
            theta_w = np.float32(theta_w * np.float32(theta_scale))
            theta_h = np.float32(theta_h * np.float32(theta_scale))
            theta_e = np.float32(theta_e * np.float32(theta_scale))


@jit()
def _rotate_rows(x, cos, sin, half, fused, y):
    """``rotate_pairs<float>(n_dims, n_dims/2, cache, src, dst)`` for x, y [T, H, ne0] (y pre-filled
    with x: the unrotated dims are copies); ``fused`` False: ggml's generic build (no FMA), each product rounded."""
    T, H = x.shape[0], x.shape[1]
    for i2 in range(T):
        for i1 in range(H):
            for k in range(half):
                c = cos[i2, k]
                s = sin[i2, k]
                x0 = x[i2, i1, k]
                x1 = x[i2, i1, k + half]
                t = np.float32(s * x1)  # vmulss
                u = np.float32(c * x1)
                if fused:
                    y[i2, i1, k] = fma32(x0, c, -t)  # vfmsub231ss: c*x0 - t, rounded once
                    y[i2, i1, k + half] = fma32(x0, s, u)  # vfmadd132ss: s*x0 + u
                else:
                    y[i2, i1, k] = np.float32(np.float32(x0 * c) - t)  # mulss, mulss, subss
                    y[i2, i1, k + half] = np.float32(np.float32(x0 * s) + u)


def _nan_fixup(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, half: int, y: np.ndarray, fused: bool = True) -> None:
    """The NaN payloads of x86's FMA operand order (module docstring), for rows holding inf or NaN; ``fused``
    False (the generic build): of ``x0·a ∓ x1·b`` the first NaN source of SSE's ``mulss`` / ``subss`` — ``x0``'s,
    or ``x0·a``'s default NaN (inf·0), then the second product's."""
    xb, yb = x.view(np.uint32), y.view(np.uint32)
    x0, x1 = x[..., :half], x[..., half:2 * half]  # [T, H, half]
    c, s = cos[:, None, :], sin[:, None, :]  # [T, 1, half]
    nan0, nan1 = np.isnan(x0), np.isnan(x1)
    q0 = xb[..., :half] | QUIET
    q1 = xb[..., half:2 * half] | QUIET
    # dst[0] adds t = s*x1, dst[n_offset] adds u = c*x1
    for out, factor, factor0 in ((yb[..., :half], s, c), (yb[..., half:2 * half], c, s)):
        prod_nan = nan1 | (np.isinf(x1) & (factor == 0))  # t (or u) is a NaN: quiet(x1), or inf*0's default NaN
        prod_bits = np.where(nan1, q1, DEFAULT_NAN)
        if not fused:  # x0·factor0 first: its inf·0 is the default NaN
            prod_nan = (np.isinf(x0) & (factor0 == 0)) | prod_nan
            prod_bits = np.where(np.isinf(x0) & (factor0 == 0), DEFAULT_NAN, prod_bits)
        out[...] = np.where(nan0, q0, np.where(prod_nan, prod_bits, out))  # fma(a=cos|sin, b=x0, c=t|u)


def _nan_fixup_arm64(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, half: int, y: np.ndarray) -> None:
    """The NaNs of GCC's AArch64 rotation (module docstring): ``t = x1*sin``, ``u = x1*cos`` (``fmul``), then
    ``dst[0] = fnmsub(x0, cos, t)`` = FPMulAdd(addend -t, x0, cos) and ``dst[n_offset] = fmadd(x0, sin, u)``.
    Arm's FPMulAdd returns the first signalling NaN of (addend, op1, op2), else the first quiet one, in that order
    — so a NaN ``t``/``u`` wins over a quiet-NaN ``x0``, a signalling ``x0`` over them — after ``FPNeg`` of the
    addend (``-t``'s NaN has its sign flipped); a quiet-NaN addend with ``op1·op2 = inf·0`` and every NaN an
    operation makes is the default NaN 0x7FC00000 (FPCR.DN = 0)."""
    xb, yb = x.view(np.uint32), y.view(np.uint32)
    x0, x1 = x[..., :half], x[..., half:2 * half]  # [T, H, half]
    b0 = xb[..., :half]
    c, s = cos[:, None, :], sin[:, None, :]  # [T, 1, half]
    snan0 = np.isnan(x0) & ((b0 & QUIET) == 0)
    for out, ofs, factor, factor0, neg in ((yb[..., :half], 0, s, c, True), (yb[..., half:2 * half], half, c, s, False)):
        prod_nan = np.isnan(x1) | (np.isinf(x1) & (factor == 0)) | ((x1 == 0) & np.isinf(factor))
        prod_bits = np.where(np.isnan(x1), xb[..., half:2 * half] | QUIET, ARM_NAN).astype(np.uint32)
        if neg:
            prod_bits ^= np.uint32(0x80000000)  # fnmsub: FPNeg(addend) before the NaN checks
        inf_zero = (np.isinf(x0) & (factor0 == 0)) | ((x0 == 0) & np.isinf(factor0))
        result_nan = np.isnan(y[..., ofs:ofs + half])
        out[...] = np.where(snan0, b0 | QUIET,
                            np.where(prod_nan, np.where(inf_zero, ARM_NAN, prod_bits),
                                     np.where(np.isnan(x0), b0, np.where(result_nan, ARM_NAN, out))))


def _rope(x, pos, n_dims, kind, sections, freq_base, freq_scale, attn_factor, ext_factor, path):
    fused = check_path(path) != "generic"  # the same on both SIMD paths; ggml's generic build has no FMA
    arm = simd(path, "ggml_rope").nan == ARM_NAN  # the AArch64 builds: the same numbers, Arm's NaN rules
    if ext_factor != 0.0:
        raise NotImplementedError("rope with ext_factor != 0 (YaRN) is not emulated")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 3:
        raise ValueError(f"rope expects x [tokens, heads, head_dim], got shape {x.shape}")
    T, _, ne0 = x.shape
    if n_dims % 2 or not 0 < n_dims <= ne0:
        raise ValueError(f"n_dims={n_dims} must be even and at most head_dim={ne0}")
    pos = np.ascontiguousarray(pos, dtype=np.int32).reshape(-1, T)  # [1 or 4, T]
    if kind and (pos.shape[0] != 4 or sum(sections) > ne0 or not any(s > 0 for s in sections[:3])):
        raise ValueError("M-RoPE needs 4 position streams and sections with a positive t/h/w entry, sum <= ne0")
    half = n_dims // 2
    theta_scale = F32(powf(freq_base, F32(-2.0) / F32(n_dims)))  # powf(freq_base, -2.0f/n_dims)
    cos = np.empty((T, half), np.float32)
    sin = np.empty((T, half), np.float32)
    sections = np.asarray(sections, np.int64)
    _rope_cache(pos, kind, sections, half, theta_scale, F32(freq_scale), F32(attn_factor), cos, sin)  # [T, half] each
    y = x.copy()  # [T, H, ne0]; dims >= n_dims: copied unchanged
    _rotate_rows(x, cos, sin, half, fused, y)
    if not np.isfinite(x[..., :n_dims]).all():
        if arm:
            _nan_fixup_arm64(x, cos, sin, half, y)
        else:
            _nan_fixup(x, cos, sin, half, y, fused)
    return y


def rope_multi(x: np.ndarray, pos: np.ndarray, n_dims: int, sections, mode: int, freq_base: float, path: str,
               freq_scale: float = 1.0, attn_factor: float = 1.0, ext_factor: float = 0.0) -> np.ndarray:
    """``ggml_rope_multi(x, pos, NULL, n_dims, sections, mode, …)``, mode IMROPE (40) or MROPE (8).

    ``x`` [T, H, head_dim] float32 (ggml ne [head_dim, H, T]); ``pos`` [4, T] int32 — the four streams
    ggml reads as ``pos[i2 + ne2*j]`` (text tokens: ``(p, p, p, 0)``, ``llm_graph_input_pos``);
    ``sections`` 4 ints (``hparams.rope_sections``). Returns [T, H, head_dim]. ISA-independent.
    """
    if mode not in _MROPE_KIND:
        raise ValueError(f"rope_multi emulates IMROPE ({ROPE_TYPE_IMROPE}) and MROPE ({ROPE_TYPE_MROPE}), not mode {mode}")
    sections = tuple(int(s) for s in sections)
    if len(sections) != 4:
        raise ValueError(f"M-RoPE takes 4 sections, got {sections}")
    return _rope(x, pos, n_dims, _MROPE_KIND[mode], sections, freq_base, freq_scale, attn_factor, ext_factor, path)


def rope_neox(x: np.ndarray, pos: np.ndarray, n_dims: int, freq_base: float, path: str,
              freq_scale: float = 1.0, attn_factor: float = 1.0, ext_factor: float = 0.0) -> np.ndarray:
    """``ggml_rope_ext(x, pos, NULL, n_dims, GGML_ROPE_TYPE_NEOX, …)``: ``x`` [T, H, head_dim],
    ``pos`` [T] int32. Returns [T, H, head_dim]. ISA-independent."""
    pos = np.asarray(pos, dtype=np.int32).reshape(1, -1)  # [1, T]
    return _rope(x, pos, n_dims, 0, (0, 0, 0, 0), freq_base, freq_scale, attn_factor, ext_factor, path)


__all__ = ["rope_multi", "rope_neox", "powf", "ROPE_TYPE_NEOX", "ROPE_TYPE_MROPE", "ROPE_TYPE_IMROPE"]
