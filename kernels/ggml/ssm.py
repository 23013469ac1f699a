"""Bit-exact emulation of ggml-cpu's two recurrent ops of qwen35moe: ``ggml_ssm_conv`` and the fused
``ggml_gated_delta_net`` (``GGML_OP_GATED_DELTA_NET``), for the ``"avx512"`` and ``"avx2"`` builds and ggml's
generic x86 build (``"generic"``: no SIMD, no FMA — the conv's products all rounded, the delta net's dots
``ggml_vec_dot_f32``'s double sum and its ``vec_mad`` unfused; docs/ggml-generic-x86.md §6).

Which code the library runs (vendored llama.cpp of llama-cpp-python 0.3.36, GCC -O3, -ffp-contract=fast;
read from ``objdump -d`` of both ``libggml-cpu.so``):

* ``ggml-cpu/ops.cpp: ggml_compute_forward_ssm_conv_f32`` — per channel ``sumf += s[i0]*c[i0]`` over the
  ``nc`` taps, from ``+0.0f``. GCC vectorizes this in-order ("fold-left") reduction: blocks of taps are
  multiplied with ``vmulps`` (each product rounded) and added one by one, in tap order, with ``vaddss``;
  the taps after the last block go through a scalar ``vfmadd231ss`` (one rounding). The block size is the
  compiler's choice and differs between the builds: AVX-512 takes 16/8-wide blocks (``nc & ~7`` taps
  unfused), AVX2 8/4-wide (``nc & ~3``) — as in ``ggml_vec_dot_f32``'s leftovers
  (:func:`kernels.ggml.simd.fold_left_unfused`). For qwen35moe's kernel size 4 the AVX-512 build is therefore a
  pure FMA chain and the AVX2 build four rounded products added in order — the builds differ.
* ``ops.cpp: ggml_compute_forward_gated_delta_net_one_chunk`` — per (sequence, value head) the state
  ``M [S_v rows j (value index), S_v columns i (key index)]`` (ggml's "transposed" state, the same layout
  as refimpl's ``M [vi, ki]``), then per token:
  ``ggml_vec_scale_f32(S_v*S_v, M, expf(g))`` (a float32 multiply per element; KDA gates: ``expf`` per
  column and ``ggml_vec_mul_f32`` per row); ``delta[j] = (v[j] - dot(M[j], k)) * beta``;
  ``ggml_vec_mad_f32(S_v, M[j], k, delta[j])`` (``fma(k[i], delta[j], M[j][i])`` per element — SIMD and
  the scalar tail alike are FMAs); ``out[j] = dot(M[j], q) * scale`` with ``scale = 1.0f/sqrtf(S_v)``.
  Only the dot is ISA dependent: ``vec.cpp: ggml_vec_dot_f32`` (:func:`kernels.ggml.vec.vec_dot_f32`).
* ``expf`` is glibc's, called through the PLT: :func:`kernels.ggml.libm.expf` calls the same function.

AArch64 GCC builds ``arm64-dotprod`` / ``arm64-i8mm`` / ``arm64-base`` (the same code in all three): ssm_conv's
fold-left blocks are 4 wide (``fmul v.4s`` then ``fadd s`` lane by lane: ``nc & ~3`` taps unfused, the rest
``fmadd`` — for 4 taps the AVX2 bits), the delta net's dots NEON ``ggml_vec_dot_f32`` (``lanes`` 4:
:mod:`kernels.ggml.vec`), ``expf`` AArch64 glibc's (:func:`kernels.ggml.libm.expf_on`), generated NaNs ARM's +qNaN
(:func:`kernels.ggml.simd.follows_nans`).
``arm64-sve128`` (SVE at 128 bits, GCC): ssm_conv's taps all ``fmul z`` products added in order by ``fadda`` (no
fused tail), the delta net's dots the SVE ``ggml_vec_dot_f32`` (:func:`kernels.ggml.sve.vec_dot_f32`).
``arm64-sve256`` (the same library at 256 bits): ssm_conv the same (FADDA is in order at any length), the delta net's
dots SVE's at 8 lanes (8 accumulators over steps of 64, FADDV of 8 lanes: they differ from 128 bits').
The clang builds (``arm64-*-clang``, clang 14): the same loops vectorized in blocks of 8 (``nc & ~7`` taps unfused: Qwen3.5's 4
taps all ``fmadd``), the dots' leftovers too (code :data:`kernels.ggml.isa.NEON_CLANG`); ``arm64-sve128-clang``'s
and ``-clang14``'s ssm_conv as well (two unpredicated SVE vectors a step, FADDA, then ``fmadd``), its dots the SVE
``ggml_vec_dot_f32``.

Thread count never matters: ssm_conv splits channels, the delta net (sequence, head) pairs, each computed
whole by one thread. NaN payloads: where two *different* NaNs meet in one x86 add, the result is the
first source operand's, which these functions do not track (inputs with a single NaN payload are exact).
"""

from __future__ import annotations

import functools
import inspect
import math

import numpy as np
from numba import prange

from kernels.base.flags import JIT_ENABLED, SERIAL_BELOW, jit, python_of
from kernels.ggml.libm import expf, expf_on, glibc_of  # expf: tests/test_ggml_ops_ssm.py
from kernels.ggml.build import SVE_PATHS, by_clang, not_emulated
from kernels.ggml.simd import NEON, NEON_CLANG, SIMD, SVE128, SVE256, check_path, fma32, fold_left_unfused, follows_nans, simd
from kernels.ggml import sve
from kernels.ggml.vec import vec_dot_f32, vec_dot_f32_cols, vec_dot_generic


def _path(path: str, op: str) -> str:
    """``path`` if ``op`` is emulated on it: every path whose vector code :data:`kernels.ggml.simd.SIMD` records;
    another key whose vector code is not emulated is :func:`kernels.ggml.build.not_emulated`."""
    if check_path(path) != "generic" and path not in SIMD:
        raise not_emulated(op, path)
    return path


def _op(op: str):
    """Decorator: the op's ``path`` argument checked by :func:`_path` first (before :func:`follows_nans` reads it)."""
    def deco(fn):
        at = list(inspect.signature(fn).parameters).index("path")  # where a positional ``path`` sits

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):  # no inspect.Signature.bind per call: this runs for every layer of a decode
            if "path" in kwargs or len(args) > at:  # (without one, fn's own TypeError names it)
                _path(kwargs["path"] if "path" in kwargs else args[at], op)
            return fn(*args, **kwargs)

        return wrapper

    return deco


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


@_op("ggml_ssm_conv")
@follows_nans  # AArch64: its +qNaN for generated NaNs
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
    # generic (no SIMD, no FMA: docs/ggml-generic-x86.md §6): every product rounded, added in tap order
    # SVE (arm64-sve128): GCC's predicated loop, fmul z then FADDA (strictly in order) over all taps: all unfused
    # clang (arm64-*-clang): its vectorizer's blocks of 8 → nc & ~7 (Qwen3.5's 4 taps: all fused, GCC's NEON none);
    # on SVE too (arm64-sve128-clang, -clang14: two unpredicated fmul z + FADDA a step of 2·svcntw() = 8, then fmadd)
    if path == "generic" or (path in SVE_PATHS and not by_clang(path)):
        unfused = nc
    else:
        code = NEON_CLANG if path in SVE_PATHS else simd(path, "ggml_ssm_conv").code
        unfused = python_of(fold_left_unfused)(nc, code)  # nothing compiled for a Python caller
    out = _ssm_conv(np.ascontiguousarray(sx3), c, unfused, np.empty((sx3.shape[0], n_t, c.shape[0]), np.float32))
    return out[0] if np.ndim(sx) == 2 else out  # [n_s, n_t, d_inner] or [n_t, d_inner]


# --- ggml_gated_delta_net --------------------------------------------------------------------------------
def _transposed(S_v: int, epr: int) -> bool:
    """Whether the delta net takes its transposed path (:func:`_transposed_rows`) for this build (Python: a kernel
    compiled for this one test would cost the first run 0.2 s): the SVE dot at any head size (its predicated tail
    has a twin across columns, :func:`kernels.ggml.sve.vec_dot_f32_cols`), the other SIMD dots at a whole number of
    steps (vec.cols_fit), never the generic build's."""
    if epr in (SVE128, SVE256):
        return True
    return epr != 0 and S_v % (4 * (NEON if epr == NEON_CLANG else epr)) == 0


@jit()
def _gated_delta_net(q, k, v, g, beta, state, K, epr, glibc, out, snaps):
    """ops.cpp: ggml_compute_forward_gated_delta_net_one_chunk over all rows ir = (sequence, head), where the state is not
    :func:`_transposed` (the generic build, a head size that is not a whole number of steps; else
    :func:`_transposed_rows`).
    q [nq3, T, Hq, S], k [nk3, T, Hk, S], v [n_seqs, T, H, S], g [n_seqs, T, H, 1 or S], beta [n_seqs, T, H],
    state [n_seqs, H, S, S] (row j = value index); out [n_seqs, T, H, S], snaps [K, n_seqs, H, S, S]. ``epr`` 0:
    ggml's generic build (the dots :func:`kernels.ggml.vec.vec_dot_generic`, ``ggml_vec_mad_f32`` a rounded product and sum);
    ``glibc``: the build's ``expf`` (:func:`kernels.ggml.libm.glibc_of`)."""
    n_seqs, n_tokens, H, S_v = v.shape
    kda = g.shape[3] == S_v
    rq3 = n_seqs // q.shape[0]
    rk3 = n_seqs // k.shape[0]
    scale = np.float32(np.float32(1.0) / np.float32(math.sqrt(np.float32(S_v))))  # 1.0f / sqrtf((float) S_v)
    delta = np.empty(S_v, np.float32)
    acc = np.empty((4, 16), np.float32)  # vec.dot_scratch
    generic = epr == 0
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
                    delta[i] = expf_on(g[iv3, t, iv1, i], glibc)
                for j in range(S_v):  # ggml_vec_mul_f32(S_v, M[j], M[j], delta)
                    Mj = M[j]  # a row view: the loop vectorizes
                    for i in range(S_v):
                        Mj[i] = np.float32(Mj[i] * delta[i])
            else:
                gexp = expf_on(g[iv3, t, iv1, 0], glibc)
                for j in range(S_v):  # ggml_vec_scale_f32(S_v*S_v, M, expf(g)): y[i] *= v
                    Mj = M[j]
                    for i in range(S_v):
                        Mj[i] = np.float32(Mj[i] * gexp)
            for j in range(S_v):  # delta[j] = (v[j] - dot(M[j], k)) * beta
                s = vec_dot_generic(S_v, M[j], k_d) if generic else vec_dot_f32(S_v, M[j], k_d, epr, acc)
                delta[j] = np.float32(np.float32(v_d[j] - s) * beta_val)
            for j in range(S_v):  # ggml_vec_mad_f32(S_v, M[j], k, delta[j]): M[j][i] = fma(k[i], delta[j], M[j][i])
                Mj, dj = M[j], delta[j]
                if generic:  # y[i] += x[i]*v: no FMA in that build
                    for i in range(S_v):
                        Mj[i] = np.float32(Mj[i] + np.float32(k_d[i] * dj))
                else:
                    for i in range(S_v):
                        Mj[i] = fma32(k_d[i], dj, Mj[i])
            for j in range(S_v):  # attn_out[j] = dot(M[j], q) * scale
                s = vec_dot_generic(S_v, M[j], q_d) if generic else vec_dot_f32(S_v, M[j], q_d, epr, acc)
                out[iv3, t, iv1, j] = np.float32(s * scale)
            slot = n_tokens - 1 - t  # K snapshot slots: slot 0 = the state after the last token
            if slot < K:
                _snapshot(snaps[slot, iv3, iv1], M, False)
    return out


@jit(inline=True)
def _snapshot(dst, M, transposed):
    """``dst[:] = M`` (``M.T`` when ``transposed``: :func:`_transpose_into`) element by element: an array assignment
    would compile numba's shape-mismatch error message (seconds on the first run)."""
    n = dst.shape[0]
    if transposed:
        _transpose_into(dst, M)
    else:
        for j in range(n):
            for i in range(n):
                dst[j, i] = M[j, i]


#: Tile edge of :func:`_transpose_into` (float32): 16 floats, one AVX-512 vector a row.
TILE = 16


if JIT_ENABLED:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    _ROW = ir.VectorType(ir.FloatType(), 16)  # a tile's row
    _MASK = ir.VectorType(ir.IntType(32), 16)

    @intrinsic
    def _tile_t(typingctx, dst, src, j0, i0):
        """``dst[j0 + a, i0 + b] = src[i0 + b, j0 + a]`` for ``a, b < 16`` (both float32, 2-D, C-contiguous): the
        tile's 16 rows loaded as vectors, transposed by 4 stages of two-vector shuffles (at each of the block sizes 8,
        4, 2, 1, every pair of rows swaps its off-diagonal blocks), and stored as 16 rows. Bits moved only."""
        if not all(isinstance(a, types.Array) and a.ndim == 2 and a.layout == "C" and a.dtype == types.float32
                   for a in (dst, src)):
            return None
        sig = types.void(dst, src, types.intp, types.intp)

        def codegen(context, b, signature, args):
            ad, asrc = (context.make_array(t)(context, b, a) for t, a in zip(signature.args[:2], args[:2]))
            j0, i0 = args[2], args[3]
            k = functools.partial(context.get_constant, types.intp)  # an index constant

            def row(arr, aty, r, c):  # a pointer to the 16 floats from [r, c]
                return b.bitcast(cgutils.get_item_pointer(context, b, aty, arr, [r, c]), _ROW.as_pointer())

            rows = [b.load(row(asrc, signature.args[1], b.add(i0, k(r)), j0), align=4) for r in range(16)]
            for w in (8, 4, 2, 1):  # rows r, r + w of each 2w block swap their off-diagonal w × w blocks
                new = list(rows)
                for r in (r for r in range(16) if (r // w) % 2 == 0):
                    top = [j if (j // w) % 2 == 0 else 16 + j - w for j in range(16)]
                    bottom = [j + w if (j // w) % 2 == 0 else 16 + j for j in range(16)]
                    new[r] = b.shuffle_vector(rows[r], rows[r + w], ir.Constant(_MASK, top))
                    new[r + w] = b.shuffle_vector(rows[r], rows[r + w], ir.Constant(_MASK, bottom))
                rows = new
            for r in range(16):
                b.store(rows[r], row(ad, signature.args[0], b.add(j0, k(r)), i0), align=4)
            return context.get_dummy_value()

        return sig, codegen

else:

    def _tile_t(dst, src, j0, i0):
        for jj in range(TILE):
            for ii in range(TILE):
                dst[j0 + jj, i0 + ii] = src[i0 + ii, j0 + jj]


@jit()
def _transpose_into(dst, src):
    """``dst[j, i] = src[i, j]`` for a square ``src``: whole :data:`TILE` × :data:`TILE` tiles in registers
    (:func:`_tile_t`), then the edge rows and columns one by one. The state's copy in and out of :func:`_head_t`,
    element by element down the columns, had cost more than the tokens: real2's 32 heads of 128, one token, 1 thread
    (Zen 3, 2026-12-07), the whole kernel 1.46 → 0.57 ms with 16 × 16 tiles of scalar copies (0.18 with no copy at
    all); in registers (*EPYC*, Zen 4, 2026-12-07) 32 heads' copy 0.177 → 0.085 ms, the kernel 0.50 → 0.32 ms (1 token),
    1.47 → 1.06 (4 tokens, 4 snapshots). A function of its own, not inlined: compiled once for both copies. Bits moved
    only."""
    n = src.shape[0]
    nt = n - n % TILE  # the rows and columns the whole tiles cover
    for j0 in range(0, nt, TILE):
        for i0 in range(0, nt, TILE):
            _tile_t(dst, src, j0, i0)
    for j in range(n):  # the edges: columns nt … n-1 of every row, then rows nt … n-1
        for i in range(nt, n):
            dst[j, i] = src[i, j]
    for j in range(nt, n):
        for i in range(nt):
            dst[j, i] = src[i, j]


@jit()
def _head_t(ir, q, k, v, g, beta, state, K, epr, out, snaps, scale, rq3, rk3, kda, glibc, sve_w, work, acc):
    """Row ``ir`` = (sequence, head) of :func:`_gated_delta_net` with the head's state held transposed, ``Mt[i, j] =
    M[j, i]`` (key index i, value index j), so that a token's S_v dots ``dot(M[j], k)`` and ``dot(M[j], q)`` run
    together across j (:func:`kernels.ggml.vec.vec_dot_f32_cols`, or on an SVE build — ``sve_w`` = svcntw(), a constant:
    0 elsewhere — :func:`kernels.ggml.sve.vec_dot_f32_cols`: each the same ``ggml_vec_dot_f32``). The scale, the
    per-column KDA gate and ``ggml_vec_mad_f32`` are the same operation on each element in either layout. Same bits.
    ``work`` (3, S_v) and ``acc`` (4, 16, S_v) float32: the row's scratch, made by the caller before its threads start
    (allocated here, in each thread, a 2-thread call of real2's 32 heads of 128 on the NEON code took 1.0 ms instead of
    0.38 until a call with AVX-512's lane count had run in the process — *EPYC*; the allocator's per-thread state, it
    seems: not pinned down further)."""
    n_seqs, n_tokens, H, S_v = v.shape
    delta, dots, gk = work[0], work[1], work[2]  # [S_v] each
    iv1 = ir % H  # head
    iv3 = ir // H  # sequence
    iq1 = iv1 % q.shape[2]  # value head iv1 reads q/k head iv1 % H_k (tiled broadcast)
    ik1 = iv1 % k.shape[2]
    iq3 = iv3 // rq3
    ik3 = iv3 // rk3
    Mt = np.empty((S_v, S_v), np.float32)  # [S_v (key i), S_v (value j)]: memcpy(s_out, s_in, …), transposed
    _transpose_into(Mt, state[iv3, iv1])
    for t in range(n_tokens):
        q_d = q[iq3, t, iq1]
        k_d = k[ik3, t, ik1]
        v_d = v[iv3, t, iv1]
        beta_val = np.float32(beta[iv3, t, iv1])
        if kda:
            for i in range(S_v):
                gk[i] = expf_on(g[iv3, t, iv1, i], glibc)
            for i in range(S_v):  # ggml_vec_mul_f32(S_v, M[j], M[j], exp(g)): M[j][i] *= exp(g[i])
                Mi, gi = Mt[i], gk[i]
                for j in range(S_v):
                    Mi[j] = np.float32(Mi[j] * gi)
        else:
            gexp = expf_on(g[iv3, t, iv1, 0], glibc)
            for i in range(S_v):  # ggml_vec_scale_f32(S_v*S_v, M, expf(g))
                Mi = Mt[i]
                for j in range(S_v):
                    Mi[j] = np.float32(Mi[j] * gexp)
        if sve_w:  # dots[j] = dot(M[j], k)
            sve.vec_dot_f32_cols(S_v, Mt, k_d, acc, dots, sve_w)
        else:
            vec_dot_f32_cols(S_v, Mt, k_d, epr, acc, dots)
        for j in range(S_v):  # delta[j] = (v[j] - dot(M[j], k)) * beta
            delta[j] = np.float32(np.float32(v_d[j] - dots[j]) * beta_val)
        for i in range(S_v):  # ggml_vec_mad_f32(S_v, M[j], k, delta[j]): M[j][i] = fma(k[i], delta[j], M[j][i])
            Mi, ki = Mt[i], k_d[i]
            for j in range(S_v):
                Mi[j] = fma32(ki, delta[j], Mi[j])
        if sve_w:  # attn_out[j] = dot(M[j], q) * scale
            sve.vec_dot_f32_cols(S_v, Mt, q_d, acc, dots, sve_w)
        else:
            vec_dot_f32_cols(S_v, Mt, q_d, epr, acc, dots)
        for j in range(S_v):
            out[iv3, t, iv1, j] = np.float32(dots[j] * scale)
        slot = n_tokens - 1 - t  # K snapshot slots: slot 0 = the state after the last token
        if slot < K:
            _snapshot(snaps[slot, iv3, iv1], Mt, True)


# _head_t for the serial kernel: numba puts the row's code into the kernel's loop, so LLVM compiles it once, there
# (kernels/base/flags.py, "What a first run pays for"; builtin:kjv's first run: 5.0 → 3.3 s for this kernel). A prange
# body calls the compiled _head_t instead (numba's parfor passes would analyse the inlined code).
_head_t_inline = jit(inline=True)(python_of(_head_t))


@functools.cache
def _transposed_rows(parallel: bool, glibc: int, kda: bool, sve_w: int):
    """:func:`_gated_delta_net`'s transposed path (:func:`_head_t` per row; only where :func:`_transposed`), with the
    (sequence, head) rows split between threads when ``parallel``, as ggml splits them (each row whole on one thread:
    the same bits at any thread count). A kernel apart from :func:`_gated_delta_net`, whose other path a run that
    takes this one never compiles (kernels/base/flags.py); ``glibc`` (the build's ``expf``, :func:`kernels.ggml.libm.expf_on`)
    and ``kda`` (a gate per key column, not per head) constants too: only that one compiles (``kda``: 0.2 s of a first
    run). The SIMD code ``epr`` stays an argument: as a constant LLVM unrolls its lane loops, +0.5 s; ``sve_w`` (an SVE
    build's svcntw(), else 0) is a constant, so that no other path compiles SVE's dots."""

    def gated_delta_net_t(q, k, v, g, beta, state, K, epr, out, snaps):
        n_seqs, n_tokens, H, S_v = v.shape
        scale = np.float32(np.float32(1.0) / np.float32(math.sqrt(np.float32(S_v))))  # 1.0f / sqrtf((float) S_v)
        rq3, rk3 = n_seqs // q.shape[0], n_seqs // k.shape[0]
        work = np.empty((n_seqs * H, 3, S_v), np.float32)  # [rows, 3, S_v]: each row's delta, dots, gate
        acc = np.empty((n_seqs * H, 4, 16, S_v), np.float32)  # [rows, 4, 16, S_v]: its vec_dot_f32_cols accumulators
        for ir in prange(n_seqs * H):  # range when not parallel
            if parallel:  # a constant: only one of the two calls is compiled
                # np.int64: prange's index is unsigned, and _head_t compiled for it would be a second copy
                _head_t(np.int64(ir), q, k, v, g, beta, state, K, epr, out, snaps, scale, rq3, rk3, kda, glibc, sve_w,
                        work[ir], acc[ir])
            else:
                _head_t_inline(ir, q, k, v, g, beta, state, K, epr, out, snaps, scale, rq3, rk3, kda, glibc, sve_w,
                               work[ir], acc[ir])
        return out

    return jit(parallel=parallel, variant="parallel" if parallel else "")(gated_delta_net_t)  # twins named apart


@_op("ggml_gated_delta_net")
@follows_nans
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
    snaps = np.empty((K, n_seqs, H, S, S), np.float32)  # the kernels write every slot < n_tokens, whole
    snaps[n_tokens:] = np.nan  # the slots ggml leaves unwritten
    epr = 0 if path == "generic" else simd(path, "ggml_gated_delta_net").code  # SVE128/256: kernels.ggml.sve's dot
    glibc = glibc_of(path)  # expf: the build's glibc (libm.expf_on)
    if _transposed(S, epr):  # a token's S dots together, the state transposed (:func:`_head_t`)
        # a token's rows split between threads when they are worth it on their own: medium's 32 heads of 128 (2M
        # multiply-adds a token) are, builtin:kjv's 4 heads of 64 (65k) are not, whatever the prompt's length
        parallel = n_seqs * H > 1 and n_seqs * H * S * S * 4 >= SERIAL_BELOW
        sve_w = {SVE128: 4, SVE256: 8}.get(epr, 0)  # svcntw() of an SVE build
        _transposed_rows(parallel, glibc, g.shape[3] == S, sve_w)(q, k, v, g, beta, state, K, epr, out, snaps)
    else:
        _gated_delta_net(q, k, v, g, beta, state, K, epr, glibc, out, snaps)
    st = snaps[0] if K == 1 else snaps
    if seqless:
        return out[0], (st[0] if K == 1 else st[:, 0])
    return out, st


__all__ = ["ssm_conv", "gated_delta_net", "expf"]
