"""Bit-exact emulation of ggml-cpu's two recurrent ops of qwen35moe: ``ggml_ssm_conv`` and the fused
``ggml_gated_delta_net`` (``GGML_OP_GATED_DELTA_NET``), for the ``"avx512"`` and ``"avx2"`` builds.

Which code the library runs (vendored llama.cpp of llama-cpp-python 0.3.36, GCC -O3, -ffp-contract=fast;
read from ``objdump -d`` of both ``libggml-cpu.so``):

* ``ggml-cpu/ops.cpp: ggml_compute_forward_ssm_conv_f32`` — per channel ``sumf += s[i0]*c[i0]`` over the
  ``nc`` taps, from ``+0.0f``. GCC vectorizes this in-order ("fold-left") reduction: blocks of taps are
  multiplied with ``vmulps`` (each product rounded) and added one by one, in tap order, with ``vaddss``;
  the taps after the last block go through a scalar ``vfmadd231ss`` (one rounding). The block size is the
  compiler's choice and differs between the builds: AVX-512 takes 16/8-wide blocks (``nc & ~7`` taps
  unfused), AVX2 8/4-wide (``nc & ~3``). For qwen35moe's kernel size 4 the AVX-512 build is therefore a
  pure FMA chain and the AVX2 build four rounded products added in order — the builds differ.
* ``ops.cpp: ggml_compute_forward_gated_delta_net_one_chunk`` — per (sequence, value head) the state
  ``M [S_v rows j (value index), S_v columns i (key index)]`` (ggml's "transposed" state, the same layout
  as refimpl's ``M [vi, ki]``), then per token:
  ``ggml_vec_scale_f32(S_v*S_v, M, expf(g))`` (a float32 multiply per element; KDA gates: ``expf`` per
  column and ``ggml_vec_mul_f32`` per row); ``delta[j] = (v[j] - dot(M[j], k)) * beta``;
  ``ggml_vec_mad_f32(S_v, M[j], k, delta[j])`` (``fma(k[i], delta[j], M[j][i])`` per element — SIMD and
  the scalar tail alike are FMAs); ``out[j] = dot(M[j], q) * scale`` with ``scale = 1.0f/sqrtf(S_v)``.
  Only the dot is ISA dependent: ``vec.cpp: ggml_vec_dot_f32`` (:func:`vec_dot_f32`).
* ``expf`` is glibc's (called through the PLT; ``sysdeps/ieee754/flt-32/e_expf.c``, the ``__expf_fma``
  ifunc variant every FMA+AVX2 host selects, glibc ≥ 2.27 — 2.36 here): :func:`expf`.

Thread count never matters: ssm_conv splits channels, the delta net (sequence, head) pairs, each computed
whole by one thread. NaN payloads: where two *different* NaNs meet in one x86 add, the result is the
first source operand's, which these functions do not track (inputs with a single NaN payload are exact).
"""

from __future__ import annotations

import math

import numpy as np

from kernels.base.flags import JIT_ENABLED, jit
from kernels.ggml.simd import fma32

F32 = np.float32

# --- glibc expf (sysdeps/ieee754/flt-32/e_expf.c, e_exp2f_data.c; x86_64 __expf_fma) ---------------------
# __exp2f_data.tab: asuint64(2^(i/32)) - (i << 47), N = 32 (EXP2F_TABLE_BITS = 5)
_EXP2F_TAB = (0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
              0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
              0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
              0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
              0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
              0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
              0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
              0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540)
# 2^(i/32): T[i] + (i << 47)
EXP2_32 = (np.array(_EXP2F_TAB, np.uint64) + (np.arange(32, dtype=np.uint64) << np.uint64(47))).view(np.float64)
INVLN2N = float.fromhex("0x1.71547652b82fep+0") * 32  # __exp2f_data.invln2_scaled
SHIFT = float.fromhex("0x1.8p+52")  # __exp2f_data.shift
C0, C1, C2 = (float.fromhex(h) / 32.0**p for h, p in (("0x1.c6af84b912394p-5", 3), ("0x1.ebfce50fac4f3p-3", 2),
                                                     ("0x1.62e42ff0c52d6p-1", 1)))  # __exp2f_data.poly_scaled
MAY_UFLOW = F32(float.fromhex("0x1.4p-75")) * F32(float.fromhex("0x1.4p-75"))  # math_errf.c: __math_may_uflowf


def fma64_exact(a, b, c):
    """float64 ``a·b + c`` rounded once (finite operands: exact rational arithmetic, then one rounding)."""
    from fractions import Fraction

    return float(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))


if JIT_ENABLED:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def _llvm_fma64(typingctx, a, b, c):
        sig = types.float64(types.float64, types.float64, types.float64)

        def codegen(context, builder, signature, args):
            f64 = ir.DoubleType()
            fn = builder.module.declare_intrinsic("llvm.fma", [f64], ir.FunctionType(f64, [f64, f64, f64]))
            return builder.call(fn, args)

        return sig, codegen

    @jit()
    def fma64(a, b, c):
        """``a·b + c`` rounded once to float64 (``vfmadd…sd``)."""
        return _llvm_fma64(np.float64(a), np.float64(b), np.float64(c))

else:
    fma64 = fma64_exact


@jit()
def expf(x):
    """glibc ``expf`` (``__expf_fma``: the ``x86_64/fpu/multiarch`` variant built with -mfma -mavx2), line by line
    as its machine code: ``x·N/ln2 = k + r``, ``2^(r/N)`` by a cubic in double, scaled by ``2^(k/N)``."""
    x = np.float32(x)
    if not abs(x) < 88.0:  # abstop >= top12(88.0f), or NaN
        if x == -np.inf:
            return np.float32(0.0)
        if not math.isfinite(x):  # abstop >= top12(INFINITY)
            return x + x
        if x > 88.72283172607422:  # 0x1.62e42ep6f: __math_oflowf(0) = 0x1p97f * 0x1p97f
            return np.float32(np.inf)
        if x < -103.97207641601562:  # -0x1.9fe368p6f: __math_uflowf(0) = 0x1p-95f * 0x1p-95f
            return np.float32(0.0)
        if x < -103.27892303466797:  # -0x1.9d1d9ep6f: __math_may_uflowf(0) = 0x1.4p-75f * 0x1.4p-75f
            return MAY_UFLOW
    xd = np.float64(x)
    kd = fma64(INVLN2N, xd, SHIFT)  # z = InvLn2N * xd; kd = z + SHIFT — contracted (vfmadd132sd)
    kd = kd - SHIFT  # round(z), an integer
    r = fma64(INVLN2N, xd, -kd)  # r = z - kd — contracted (vfmsub132sd)
    ki = int(kd)
    s = math.ldexp(EXP2_32[ki & 31], ki >> 5)  # asdouble(T[ki % N] + (ki << 47)): 2^(k/N), exact
    z = fma64(C0, r, C1)  # C[0]*r + C[1]
    r2 = r * r
    y = fma64(C2, r, 1.0)  # C[2]*r + 1
    y = fma64(z, r2, y)  # z*r2 + y
    y = y * s
    return np.float32(y)


# --- ggml_ssm_conv ---------------------------------------------------------------------------------------
@jit()
def _ssm_conv(sx, c, unfused, out):
    """ops.cpp: ggml_compute_forward_ssm_conv_f32. sx [n_s, nr, ncs], c [nr, nc] → out [n_s, n_t, nr]; the
    first ``unfused`` taps of each sum are vmulps products added by vaddss in tap order, the rest vfmadd231ss."""
    n_s, nr, _ = sx.shape
    nc = c.shape[1]
    n_t = out.shape[1]
    for i3 in range(n_s):
        for i2 in range(n_t):  # sliding window: taps i2 … i2+nc-1
            for i1 in range(nr):
                sumf = np.float32(0.0)
                for i0 in range(unfused):
                    sumf = np.float32(sumf + np.float32(sx[i3, i1, i2 + i0] * c[i1, i0]))
                for i0 in range(unfused, nc):
                    sumf = fma32(sx[i3, i1, i2 + i0], c[i1, i0], sumf)
                out[i3, i2, i1] = sumf
    return out


def ssm_conv(sx: np.ndarray, c: np.ndarray, path: str) -> np.ndarray:
    """``ggml_ssm_conv(sx, c)`` of the ``path`` build. Shapes are numpy's (ggml's ne reversed):
    sx [n_s, d_inner, d_conv-1+n_t] (qwen35moe: ``concat(conv_states, qkv_mixedᵀ)`` — per channel the
    kept inputs, oldest first, then the n_t new ones), c [d_inner, d_conv] (``ssm_conv1d``) → [n_s, n_t, d_inner].
    A 2-D sx [d_inner, d_conv-1+n_t] gives [n_t, d_inner]."""
    sx3 = np.asarray(sx, np.float32)
    sx3 = sx3[None] if sx3.ndim == 2 else sx3  # [n_s, d_inner, ncs]
    c = np.ascontiguousarray(c, np.float32)
    nc = c.shape[1]
    n_t = sx3.shape[2] - nc + 1
    assert sx3.shape[1] == c.shape[0] and n_t >= 0, (sx3.shape, c.shape)
    # GCC's blocks: AVX-512 zmm/ymm (16, 8) → nc & ~7 taps unfused; AVX2 ymm/xmm (8, 4) → nc & ~3
    unfused = nc & ~7 if _lanes(path) == 16 else nc & ~3
    out = _ssm_conv(np.ascontiguousarray(sx3), c, unfused, np.empty((sx3.shape[0], n_t, c.shape[0]), np.float32))
    return out[0] if np.ndim(sx) == 2 else out  # [n_s, n_t, d_inner] or [n_t, d_inner]


# --- ggml_vec_dot_f32 ------------------------------------------------------------------------------------
@jit()
def vec_dot_f32(n, x, y, epr):
    """vec.cpp: ggml_vec_dot_f32 (the ``GGML_SIMD`` x86 branch), ``epr`` = GGML_F32_EPR (16 AVX-512, 8 AVX2).

    GGML_F32_ARR = 4 accumulators of ``epr`` lanes over the first ``np = n & ~(4·epr - 1)`` elements
    (``GGML_F32_VEC_FMA`` = fma per lane); GGML_F32_VEC_REDUCE (simd-mappings.h): sum0+sum2, sum1+sum3, then
    their sum, then the lanes — AVX-512 ``_mm512_reduce_add_ps`` (GCC: 256-bit halves, 128-bit halves,
    ``(q0+q2) + (q1+q3)``), AVX2 ``_mm_add_ps`` of the 128-bit halves and two ``_mm_hadd_ps``:
    ``(t0+t1) + (t2+t3)``. The leftovers ``sumf += x[i]*y[i]`` are GCC's in-order vectorization: the first
    ``L & ~7`` (AVX-512) / ``L & ~3`` (AVX2) as rounded products added in order, the rest as FMAs."""
    step = 4 * epr
    np_ = n & ~(step - 1)
    acc = np.zeros((4, epr), np.float32)  # GGML_F32_VEC sum[GGML_F32_ARR]
    for i in range(0, np_, step):
        for j in range(4):
            for lane in range(epr):
                acc[j, lane] = fma32(x[i + j * epr + lane], y[i + j * epr + lane], acc[j, lane])
    for lane in range(epr):
        acc[0, lane] = np.float32(acc[0, lane] + acc[2, lane])
        acc[1, lane] = np.float32(acc[1, lane] + acc[3, lane])
    for lane in range(epr):
        acc[0, lane] = np.float32(acc[0, lane] + acc[1, lane])
    h = acc[0]
    if epr == 16:
        for lane in range(8):  # 256-bit halves
            h[lane] = np.float32(h[lane] + h[8 + lane])
    for lane in range(4):  # 128-bit halves
        h[lane] = np.float32(h[lane] + h[4 + lane])
    if epr == 16:
        sumf = np.float32(np.float32(h[0] + h[2]) + np.float32(h[1] + h[3]))  # vpermilps 0x4e, vshufps 0x55
    else:
        sumf = np.float32(np.float32(h[0] + h[1]) + np.float32(h[2] + h[3]))  # hadd, hadd
    left = n - np_
    unfused = left & ~7 if epr == 16 else left & ~3
    for i in range(np_, np_ + unfused):
        sumf = np.float32(sumf + np.float32(x[i] * y[i]))
    for i in range(np_ + unfused, n):
        sumf = fma32(x[i], y[i], sumf)
    return sumf


# --- ggml_gated_delta_net --------------------------------------------------------------------------------
@jit()
def _gated_delta_net(q, k, v, g, beta, state, K, epr, out, snaps):
    """ops.cpp: ggml_compute_forward_gated_delta_net_one_chunk over all rows ir = (sequence, head).
    q [nq3, T, Hq, S], k [nk3, T, Hk, S], v [n_seqs, T, H, S], g [n_seqs, T, H, 1 or S], beta [n_seqs, T, H],
    state [n_seqs, H, S, S] (row j = value index); out [n_seqs, T, H, S], snaps [K, n_seqs, H, S, S]."""
    n_seqs, n_tokens, H, S_v = v.shape
    kda = g.shape[3] == S_v
    rq3 = n_seqs // q.shape[0]
    rk3 = n_seqs // k.shape[0]
    scale = np.float32(np.float32(1.0) / np.float32(math.sqrt(np.float32(S_v))))  # 1.0f / sqrtf((float) S_v)
    delta = np.empty(S_v, np.float32)
    for ir in range(n_seqs * H):
        iv1 = ir % H  # head
        iv3 = ir // H  # sequence
        iq1 = iv1 % q.shape[2]  # value head iv1 reads q/k head iv1 % H_k (tiled broadcast)
        ik1 = iv1 % k.shape[2]
        iq3 = iv3 // rq3
        ik3 = iv3 // rk3
        M = state[iv3, iv1].copy()  # [S_v, S_v]: memcpy(s_out, s_in, …)
        for t in range(n_tokens):
            q_d = q[iq3, t, iq1]
            k_d = k[ik3, t, ik1]
            v_d = v[iv3, t, iv1]
            beta_val = np.float32(beta[iv3, t, iv1])
            if kda:
                for i in range(S_v):
                    delta[i] = expf(g[iv3, t, iv1, i])
                for j in range(S_v):  # ggml_vec_mul_f32(S_v, M[j], M[j], delta)
                    for i in range(S_v):
                        M[j, i] = np.float32(M[j, i] * delta[i])
            else:
                gexp = expf(g[iv3, t, iv1, 0])
                for j in range(S_v):  # ggml_vec_scale_f32(S_v*S_v, M, expf(g)): y[i] *= v
                    for i in range(S_v):
                        M[j, i] = np.float32(M[j, i] * gexp)
            for j in range(S_v):  # delta[j] = (v[j] - dot(M[j], k)) * beta
                s = vec_dot_f32(S_v, M[j], k_d, epr)
                delta[j] = np.float32(np.float32(v_d[j] - s) * beta_val)
            for j in range(S_v):  # ggml_vec_mad_f32(S_v, M[j], k, delta[j]): M[j][i] = fma(k[i], delta[j], M[j][i])
                for i in range(S_v):
                    M[j, i] = fma32(k_d[i], delta[j], M[j, i])
            for j in range(S_v):  # attn_out[j] = dot(M[j], q) * scale
                s = vec_dot_f32(S_v, M[j], q_d, epr)
                out[iv3, t, iv1, j] = np.float32(s * scale)
            slot = n_tokens - 1 - t  # K snapshot slots: slot 0 = the state after the last token
            if slot < K:
                snaps[slot, iv3, iv1] = M
    return out


def gated_delta_net(q, k, v, g, beta, state, path: str, K: int = 1):
    """``ggml_gated_delta_net(q, k, v, g, beta, state, K)`` of the ``path`` build → (out, state).

    Numpy shapes (ggml's ne reversed; the leading n_seqs axis may be left out of all of them):
    q, k [n_seqs, n_tokens, H_k, S] (not scaled: the op multiplies its output by 1/sqrt(S)); v [n_seqs,
    n_tokens, H, S]; g [n_seqs, n_tokens, H] (log-space decay, ``gate`` of qwen35moe; [..., S] for a KDA
    gate); beta [n_seqs, n_tokens, H] (after the sigmoid); state [n_seqs, H, S, S] (``M[j, i]``: value j,
    key i — refimpl's ``M [vi, ki]``). Value head h reads q/k head ``h % H_k``.

    Returns out [n_seqs, n_tokens, H, S] and, for K = 1, the final state [n_seqs, H, S, S]; for K > 1 the
    snapshot slots [K, n_seqs, H, S, S], slot s = the state after token n_tokens-1-s (slots ≥ n_tokens,
    which ggml leaves unwritten, are NaN)."""
    seqless = np.ndim(v) == 3
    f = (lambda a: np.ascontiguousarray(np.asarray(a, np.float32)[None] if seqless else a, np.float32))
    q, k, v, state = f(q), f(k), f(v), f(state)  # [n_seqs, …]
    g, beta = f(g), f(beta)
    n_seqs, n_tokens, H, S = v.shape
    g = g.reshape(n_seqs, n_tokens, H, -1)  # [n_seqs, T, H, 1 or S]
    beta = beta.reshape(n_seqs, n_tokens, H)  # [n_seqs, T, H]
    assert q.shape[1:] == k.shape[1:] and q.shape[3] == S and H % q.shape[2] == 0 and state.shape == (n_seqs, H, S, S)
    out = np.empty((n_seqs, n_tokens, H, S), np.float32)
    snaps = np.full((K, n_seqs, H, S, S), np.nan, np.float32)
    _gated_delta_net(q, k, v, g, beta, state, K, _lanes(path), out, snaps)
    st = snaps[0] if K == 1 else snaps
    if seqless:
        return out[0], (st[0] if K == 1 else st[:, 0])
    return out, st


def _lanes(path: str) -> int:
    """GGML_F32_EPR of the path (simd-mappings.h)."""
    return {"avx512": 16, "avx2": 8}[path]
