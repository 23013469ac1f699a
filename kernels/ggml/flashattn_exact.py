"""Bit-exact emulation of ggml-cpu's ``ggml_flash_attn_ext`` (F32 Q, F16 or F32 K/V) on the x86 paths (and ggml's
generic x86 build: the dots a double sum of rounded products, no FMA anywhere, F16 conversions the portable ones,
the tiled path's exps vec.h's SSE2 ``ggml_v_expf``; docs/ggml-generic-x86.md §5) and the AArch64 GCC builds
``arm64-dotprod`` / ``arm64-i8mm`` (NEON with FP16 vector arithmetic; below) and ``arm64-base`` (armv8-a: without).

``ggml_compute_forward_flash_attn_ext_f16`` (ggml-cpu/ops.cpp) takes one of three code paths, chosen from the
shapes alone (``use_ref`` is never set by llama.cpp); :func:`fa_kernel` names it:

* ``"split"`` — ``use_split_kv_path``: one query row (``neq1 == 1``, ``neq3 == 1``), K and V both F16 or both
  F32, ``n_kv >= 512``. The cells are cut into ``n_threads`` chunks of ``ceil(n_kv / n_threads)``; each runs
  the one-row loop below from scratch and leaves a partial ``(M, S, VKQ)``, combined in chunk order by
  ``ggml_flash_attn_ext_reduce_partials``. **The result depends on n_threads.** llama.cpp pads its KV view
  to a multiple of 256 cells (``llama_kv_cache::get_n_kv``), so decode takes this path as soon as more than
  256 cells are in use and the context has ≥ 512 cells.
* ``"tiled"`` — ``ggml_compute_forward_flash_attn_ext_tiled``: ``neq1 >= GGML_FA_TILE_Q`` (64) query rows and
  K, V both F16 or both F32 (a prompt ubatch). Emulated in :mod:`kernels.ggml.flashattn_exact_tiled`.
* ``"one_row"`` — ``ggml_compute_forward_flash_attn_ext_f16_one_chunk`` over all cells, for everything else
  (decode with ``n_kv < 512``, batches of 2 … 63 rows — a short prompt, a prompt's last partial ubatch, a
  speculative verify batch — and mixed K/V types). Rows are independent: the result does not depend on
  n_threads. This path rounds Q to F16 and accumulates V·p in F16 when V is F16: against float64 its
  error is ~1e-3 relative (~2000x the tiled path's), so the same query row gets different bits in a
  63-row and a 64-row ubatch.

The one-row loop, per (query row, head), as the C does it (``Q_q``: Q converted to K's ``vec_dot_type``)::

    Q_q = fp16(q) if K is F16 else q            # ggml_cpu_fp32_to_fp16: _mm*_cvtps_ph(x, 0), ties to even
    M = -inf; S = 0; VKQ = 0                    # VKQ is F16 (VKQ16) when V is F16, else F32 (VKQ32)
    for ic in cells:
        mv = mask[ic]; if mv == -inf: continue  # masked cells are skipped, not weighted by 0
        s = kq_vec_dot(K[ic], Q_q)              # ggml_vec_dot_f16 / ggml_vec_dot_f32 (vec.cpp), below
        s = s*scale; s = s + mv                 # two roundings (not contracted: ops.cpp l. 8978/8984)
        if s > M: ms = expf(M - s); M = s; VKQ = VKQ*ms (fp16-rounded if F16); vs = 1
        else:     vs = expf(s - M)
        VKQ = fma(V[ic], vs, VKQ)               # ggml_vec_mad_f16 (fp16-rounded) / ggml_vec_mad_f32
        S = fma(S, ms, vs)                      # "S = S*ms + vs", contracted by GCC (vfmadd132ss)
    out = float(VKQ) * (S == 0 ? 0 : 1/S)       # ggml_vec_scale_f32

``expf`` and ``fmaxf`` are the C library's (libggml calls glibc's: :mod:`kernels.ggml.libm`), so the
emulation is exact on the host it runs on, as ggml is. Everything above is elementwise except the K·Q dot,
whose SIMD accumulation order is the only ISA-dependent part of this path: ``kq_vec_dot`` is K's
``type_traits_cpu`` vec_dot, the same C functions as mul_mat's — ``ggml_vec_dot_f16`` (float SIMD part,
double tail) and ``ggml_vec_dot_f32`` (float throughout, GCC's blocked tail): :mod:`kernels.ggml.vec`.

The split-KV reduction (ops.cpp ``ggml_flash_attn_ext_reduce_partials``, per head, chunks in order, empty
chunks (``S == 0``) skipped): ``M' = fmaxf(M, Mc)``, ``a = expf(M - M')``, ``b = expf(Mc - M')``,
``VKQ = fma(VKQ, a, VKQ_c*b)``, ``S = fma(S, a, S_c*b)`` (GCC's contraction, the same in both builds), then
``VKQ * (1/S)`` if ``S != 0``.

Layouts (numpy shapes are ggml's ``ne`` reversed): ``q`` [n_head, n_q, DK] float32 (ggml ne [DK, n_q, n_head]);
``k`` [n_head_kv, n_kv, DK] and ``v`` [n_head_kv, n_kv, DV] float16 or float32; ``mask`` [n_q, n_kv] float16
(ne [n_kv, n_q], broadcast over heads) or None; output [n_q, n_head, DV] float32 (ggml's dst ne [DV, n_head,
n_q], the ``permute(0, 2, 1, 3)`` layout). Head h reads KV head ``h // (n_head // n_head_kv)`` (GQA, ops.cpp
``ik2 = iq2 / rk2``). ``max_bias = 0`` and ``logit_softcap = 0`` only (ALiBi slope 1, no tanh), no sinks.

``scale`` is used as the float32 it is in ggml's op_params (llama.cpp: ``1.0f/sqrtf(float(n_embd_head))``,
computed in float32).

Non-finite values follow the same IEEE arithmetic (inf/NaN in Q, K, V tested byte for byte; the NaNs are
the default NaN). Input NaNs with other payloads are not followed: ggml's F16 accumulator keeps 10 payload
bits in its SIMD conversion and canonicalises them in its scalar one, the emulation keeps float32 NaNs.

AArch64 (GCC 12, ``__ARM_FEATURE_FP16_VECTOR_ARITHMETIC``; read from both builds' ``objdump -d``, the same code),
``lanes`` = :data:`kernels.ggml.simd.NEON`. The one-row loop (and so each split-KV chunk) computes in *half*
precision where x86 widens to float: ``ggml_vec_dot_f16`` accumulates K·Q in 4 × 8 ``float16x8_t`` lanes
(``fmla v.8h``: each FMA rounded to binary16), reduced in half, then float (:func:`kernels.ggml.vec.vec_dot_f16`) —
so a partial sum past 65504 is inf where x86 is finite; ``ggml_vec_mad_f16`` / ``ggml_vec_scale_f16`` round ``vs`` /
``ms`` to half (``vdupq_n_f16``) and update VKQ16 by half FMAs / products on the first ``DV & ~31`` values, the rest
in float as x86 (:func:`kernels.ggml.vec.vec_mad_f16`, ``vec_scale_f16``). Q goes to F16 by the portable
``GGML_CPU_FP32_TO_FP16`` (``ggml_cpu_fp32_to_fp16`` has no NEON loop). The tiled path is x86's with NEON's
4-lane soft_max blocks, and it is taken only when ``DV % 4 == 0`` (``use_tiled &= DV % GGML_F32_EPR == 0`` off x86):
other batches of ≥ 64 rows run the one-row loop. ``fmaxf`` is inlined as ``fmaxnm`` (:func:`fmax_path`); ``expf`` is
AArch64 glibc's (:func:`kernels.ggml.libm.expf_on`); ``S = S*ms + vs`` and the split reduction contract as on x86;
a generated NaN is ARM's default +qNaN (:func:`arm_default_nan`). ``arm64-base`` (armv8-a, no FP16 vector
arithmetic: ``GGML_F16_VEC`` is ``GGML_F32Cx4``, code :data:`kernels.ggml.isa.NEON_F32C`) runs the same loops with
x86's *float* F16 code — K·Q in 4 × 4 float lanes (steps of 16, ``vaddvq_f32``, double tail), VKQ16 updated by
float FMAs / products with ``vs`` / ``ms`` in float, each rounded once to half — and AArch64's glibc, ``fmaxnm``,
portable Q conversion and NaN, so the half overflow above does not happen there.

The SVE library (``arm64-sve128``, ``arm64-sve256``: codes :data:`kernels.ggml.isa.SVE128` / ``SVE256``, the
vector length read at run time): the one-row loop as NEON's but with vec.h's SVE functions at ``svcntw()`` lanes
(:mod:`kernels.ggml.sve`: K·Q in *float* lanes by FMLALB/FMLALT, ``ggml_vec_mad_f16`` a half FMA on every element,
``ggml_vec_scale_f16`` a half product but for the values past its one leftover vector); the tiled path only where
``DV % svcntw() == 0`` (:func:`fa_kernel`), with simd-gemm.h's scalar loops (the same FMA chains) and SVE's soft_max
blocks (at 128 bits NEON's bits; at 256 8 lanes and a FADDV of 8). A path whose vector code is not emulated is
refused by :func:`fa_code`.
"""

from __future__ import annotations

import functools

import numpy as np

from numba import prange

from kernels.base.flags import SERIAL_BELOW, jit, read_only
from kernels.ggml.flashattn_exact_tiled import fmax_path, tiled_rows
from kernels.ggml.libm import GLIBC_AARCH64, GLIBC_X86_64, expf_on
from kernels.ggml.simd import f16_round as round_to_f16  # = kernels.base.floats.round_to_f16, on the bits
from kernels.ggml.build import not_emulated
from kernels.ggml.isa import NEON_CLANG, NEON_F32C, SVE128, SVE256, f16_code
from kernels.ggml.simd import AVX2, AVX512, NEON, SIMD, check_path, fma32, simd
from kernels.ggml.vec import vec_dot_f16, vec_dot_f32, vec_dot_generic, vec_mad_f16, vec_scale_f16
from kernels.ggml.vecmath import cast_f16_to_f32, f16_value

F32 = np.float32
NINF = np.float32(-np.inf)
GGML_FA_TILE_Q = 64  # ggml-cpu/common.h
SPLIT_KV_MIN = 512  # ops.cpp use_split_kv_path: nek1 >= 512


@jit(inline=True)
def _to_f16(x, fused):
    """A float32 rounded to an F16 value: F16C's ``vcvtps2ph`` (the SIMD builds) or ggml-impl.h's portable
    conversion (the generic build: a NaN becomes sign | 0x7E00)."""
    if fused:
        return round_to_f16(x)
    return f16_value(x)


@jit()
def one_chunk(q_row, k, v, mask_row, has_mask, ic_start, ic_end, scale, k_f16, v_f16, lanes, fused, dot, q_q, vkq,
              acc):
    """ggml_compute_forward_flash_attn_ext_f16_one_chunk for one (query row, head) over cells
    ``ic_start … ic_end-1`` of ``k`` [n_kv, DK], ``v`` [n_kv, DV] (float32 holding F16 values when
    ``k_f16``/``v_f16``). Leaves the unnormalised VKQ in ``vkq`` (F16 values when ``v_f16``: the VKQ16
    accumulator converted to float) and returns (M, S). ``acc``: the dot's scratch (:func:`kernels.ggml.vec.dot_scratch`).
    ``fused`` False: ggml's generic build — the dots :func:`kernels.ggml.vec.vec_dot_generic`, no FMA. ``lanes``
    :data:`kernels.ggml.simd.NEON`: the AArch64 builds — Q to F16 by the portable conversion, the F16 dot and the
    VKQ16 updates in half precision (:func:`kernels.ggml.vec.vec_dot_f16`, ``vec_mad_f16``, ``vec_scale_f16``);
    :data:`kernels.ggml.isa.NEON_F32C` (``arm64-base``): the same but the F16 code x86's float one. ``dot``: the
    code of an F32 K's ``ggml_vec_dot_f32`` — GGML_F32_VEC's, or :data:`kernels.ggml.isa.NEON_CLANG` on a clang build
    (its leftovers in blocks of 8)."""
    DK = q_row.size
    DV = vkq.size
    # neon: the AArch64 builds (NEON_F32C: arm64-base, F16 vectors float32x4_t); half: float16x8_t / svfloat16_t, FP16
    # vector arithmetic (SVE: every element). Tested where used, not held in variables: with ``lanes`` a constant
    # (flash_attn_values' kernels) numba then drops the other paths' branches (kernels/base/flags.py).
    # (``neon`` spelled out each time: a variable holding the test would be a runtime value, and ``expf_on`` and
    # ``_to_f16`` would compile both glibcs' and both conversions' code.)
    glibc = GLIBC_AARCH64 if lanes == NEON or lanes == NEON_F32C or lanes == SVE128 or lanes == SVE256 else GLIBC_X86_64
    for d in range(DK):  # q_to_vec_dot: ggml_cpu_fp32_to_fp16 (NEON: no SIMD loop, GGML_CPU_FP32_TO_FP16) / fp32
        if not k_f16:
            q_q[d] = q_row[d]
        elif lanes == NEON or lanes == NEON_F32C or lanes == SVE128 or lanes == SVE256:
            q_q[d] = _to_f16(q_row[d], False)
        else:
            q_q[d] = _to_f16(q_row[d], fused)
    S = np.float32(0.0)
    M = NINF
    for d in range(DV):
        vkq[d] = np.float32(0.0)
    for ic in range(ic_start, ic_end):
        mv = mask_row[ic] if has_mask else np.float32(0.0)  # slope*GGML_CPU_FP16_TO_FP32(mp[ic]), slope = 1
        if mv == NINF:
            continue
        if not fused:  # kq_vec_dot = type_traits_cpu[k->type].vec_dot
            s = vec_dot_generic(DK, k[ic], q_q)
        elif k_f16:
            s = vec_dot_f16(DK, k[ic], q_q, lanes, acc)
        else:
            s = vec_dot_f32(DK, k[ic], q_q, dot, acc)
        s = np.float32(s * np.float32(scale))
        s = np.float32(s + mv)
        ms = np.float32(1.0)
        vs = np.float32(1.0)
        if s > M:
            m_old = M
            M = s
            ms = expf_on(np.float32(m_old - M), glibc)
            if (lanes == NEON or lanes == SVE128 or lanes == SVE256) and v_f16:  # half products by ms rounded to half
                vec_scale_f16(DV, vkq, ms, lanes)
            else:
                for d in range(DV):  # ggml_vec_scale_f16 / ggml_vec_scale_f32 (elementwise)
                    t = np.float32(vkq[d] * ms)
                    vkq[d] = _to_f16(t, fused) if v_f16 else t
        else:
            vs = expf_on(np.float32(s - M), glibc)
        if (lanes == NEON or lanes == SVE128 or lanes == SVE256) and v_f16:  # half FMAs by vs rounded to half
            vec_mad_f16(DV, vkq, v[ic], vs, lanes)
        else:
            for d in range(DV):  # ggml_vec_mad_f16 / ggml_vec_mad_f32: fma(v, vs, y) in every lane and in the tail
                t = fma32(v[ic, d], vs, vkq[d]) if fused else np.float32(vkq[d] + np.float32(v[ic, d] * vs))
                vkq[d] = _to_f16(t, fused) if v_f16 else t
        S = fma32(S, ms, vs) if fused else np.float32(np.float32(S * ms) + vs)  # S = S*ms + vs, contracted
    return M, S


@functools.cache
def one_row_rows_for(k_f16: bool, v_f16: bool, lanes: int, fused: bool, dot: int, parallel: bool = False):
    """The non-split, non-tiled path's kernel for one (K type, V type, path code, build), compile-time constants:
    only that combination's code compiles (kernels/base/flags.py, "Literal arguments are constants"). ``parallel``:
    the (head, query row) pairs split between threads, as ggml's threads split the rows of the op
    (``ggml_compute_forward_flash_attn_ext_f16``'s chunks); every pair is computed by one thread in the same order,
    so the split never changes a bit."""

    @jit(parallel=parallel, variant="parallel" if parallel else "")
    def one_row_rows(q, k, v, mask, has_mask, scale, n_chunks, out):
        """one_chunk over all cells for every (query row, head) — rows are independent — then ``out`` [n_q, n_head,
        DV] = VKQ * (S == 0 ? 0 : 1/S); the pairs in ``n_chunks`` runs of consecutive pairs, each with its own
        scratch (ggml's per-thread wdata)."""
        n_head, n_q, DK = q.shape
        group = n_head // k.shape[0]  # rk2 = neq2/nek2 (= rv2)
        DV = v.shape[2]
        n_pairs = n_head * n_q
        per = (n_pairs + n_chunks - 1) // n_chunks
        for t in prange(n_chunks):
            q_q = np.empty(DK, np.float32)
            vkq = np.empty(DV, np.float32)
            acc = np.empty((4, 16), np.float32)  # vec.dot_scratch
            for u in range(t * per, min(n_pairs, (t + 1) * per)):
                h = u // n_q
                iq1 = u - h * n_q
                M, S = one_chunk(q[h, iq1], k[h // group], v[h // group], mask[iq1], has_mask, 0, k.shape[1], scale,
                                 k_f16, v_f16, lanes, fused, dot, q_q, vkq, acc)
                s_inv = np.float32(0.0) if S == 0 else np.float32(np.float32(1.0) / S)
                for d in range(DV):
                    out[iq1, h, d] = np.float32(vkq[d] * s_inv)

    return one_row_rows


@jit()
def split_kv_row(q, k, v, mask, has_mask, scale, k_f16, v_f16, lanes, fused, dot, n_threads, out):
    """use_split_kv_path (one query row): thread ith runs one_chunk over cells [ith*cs, min((ith+1)*cs, n_kv))
    for every head (cs = ceil(n_kv/n_threads)), then ggml_flash_attn_ext_reduce_partials combines the chunks
    of each head in order."""
    n_head, _, DK = q.shape
    group = n_head // k.shape[0]
    n_kv = k.shape[1]
    neon = lanes == NEON or lanes == NEON_F32C or lanes == SVE128 or lanes == SVE256
    glibc = GLIBC_AARCH64 if neon else GLIBC_X86_64
    DV = v.shape[2]
    cs = (n_kv + n_threads - 1) // n_threads  # chunk_size
    part_m = np.full((n_threads, n_head), NINF, np.float32)  # partials: [M, S, VKQ[DV]] per (chunk, head)
    part_s = np.zeros((n_threads, n_head), np.float32)
    part_v = np.zeros((n_threads, n_head, DV), np.float32)
    q_q = np.empty(DK, np.float32)
    acc = np.empty((4, 16), np.float32)  # vec.dot_scratch
    for ith in range(n_threads):
        ic_start = ith * cs
        if ic_start >= n_kv:
            continue  # M = -inf, S = 0
        ic_end = min(ic_start + cs, n_kv)
        for h in range(n_head):
            M, S = one_chunk(q[h, 0], k[h // group], v[h // group], mask[0], has_mask, ic_start, ic_end, scale,
                             k_f16, v_f16, lanes, fused, dot, q_q, part_v[ith, h], acc)
            part_m[ith, h] = M
            part_s[ith, h] = S
    for h in range(n_head):  # ggml_flash_attn_ext_reduce_partials
        m_final = NINF
        s_final = np.float32(0.0)
        for d in range(DV):
            out[0, h, d] = np.float32(0.0)
        for c in range(n_threads):
            if c * cs >= n_kv:
                continue
            m_chunk = part_m[c, h]
            s_chunk = part_s[c, h]
            if s_chunk == 0:
                continue
            m_new = fmax_path(m_final, m_chunk, neon)  # fmaxf: glibc's on x86, fmaxnm on AArch64
            scale_old = expf_on(np.float32(m_final - m_new), glibc)
            scale_new = expf_on(np.float32(m_chunk - m_new), glibc)
            for d in range(DV):  # VKQ_final*scale_old + VKQ_chunk*scale_new: fma(VKQ_final, so, VKQ_chunk*sn)
                if fused:
                    out[0, h, d] = fma32(out[0, h, d], scale_old, np.float32(part_v[c, h, d] * scale_new))
                else:  # the generic build: both products rounded
                    out[0, h, d] = np.float32(np.float32(out[0, h, d] * scale_old) + np.float32(part_v[c, h, d] * scale_new))
            if fused:
                s_final = fma32(s_final, scale_old, np.float32(s_chunk * scale_new))
            else:
                s_final = np.float32(np.float32(s_final * scale_old) + np.float32(s_chunk * scale_new))
            m_final = m_new
        if s_final != 0:
            s_inv = np.float32(np.float32(1.0) / s_final)
            for d in range(DV):
                out[0, h, d] = np.float32(out[0, h, d] * s_inv)


def fa_kernel(n_q: int, n_kv: int, k_dtype, v_dtype, DV: int | None = None, path: str | None = None) -> str:
    """Which code path ggml_compute_forward_flash_attn_ext_f16 takes (ops.cpp; one sequence): ``"split"``,
    ``"tiled"`` or ``"one_row"`` (module docstring). Off x86 (``path`` an ARM key; ``DV`` then needed) the tiled
    path also needs ``DV % GGML_F32_EPR == 0`` (``use_tiled &= DV % f32_epr == 0``); other batches of ≥ 64 rows
    take the one-row loop."""
    same = np.dtype(k_dtype) == np.dtype(v_dtype) and np.dtype(k_dtype) in (np.float16, np.float32)
    if same and n_q == 1 and n_kv >= SPLIT_KV_MIN:
        return "split"
    if same and n_q >= GGML_FA_TILE_Q:
        if path is not None and fa_code(path)[0] in (NEON, SVE128, SVE256) and DV % simd(path).lanes:  # SVE: svcntw()
            return "one_row"
        return "tiled"
    return "one_row"


def fa_code(path: str) -> tuple[int, bool]:
    """(the vec / expf code, whether GCC fused) of ``path`` for the kernels above. A path whose flash attention is
    not emulated — one whose vector code :data:`kernels.ggml.simd.SIMD` does not know, or a NEON record whose F16
    vectors are neither float16x8_t nor ``GGML_F32Cx4`` (``arm64-base``) — is :func:`kernels.ggml.build.not_emulated`, a one-line ValueError naming the op and the path."""
    s = SIMD.get(check_path(path))
    if (s is None or s.code not in (AVX512, AVX2, NEON, NEON_CLANG, SVE128, SVE256, None)
            or (s.code == NEON and not s.f16_half and s.f16_epr != 4)):  # NEON: float16x8_t or GGML_F32Cx4
        raise not_emulated("ggml_flash_attn_ext", path)
    return s.expf, s.fused


def flash_attn_ext(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float, path: str,
                   n_threads: int = 1) -> np.ndarray:
    """``ggml_flash_attn_ext(q, k, v, mask, scale, max_bias=0, logit_softcap=0)`` as ggml-cpu computes it on
    ``path`` ("avx512" | "avx2" | "generic" | "arm64-dotprod" | "arm64-i8mm" | "arm64-base") with ``n_threads`` threads. Layouts in
    the module docstring; returns [n_q, n_head, DV] float32."""
    fa_code(path)
    q = np.ascontiguousarray(q, dtype=F32)
    if k.dtype not in (np.float16, np.float32) or v.dtype not in (np.float16, np.float32):
        raise ValueError(f"flash_attn_ext: K/V must be float16 or float32, got {k.dtype}/{v.dtype}")
    n_head, n_q, DK = q.shape
    n_head_kv, n_kv, _ = k.shape
    if k.shape[2] != DK or v.shape[:2] != k.shape[:2] or n_head % n_head_kv or n_threads < 1:
        raise ValueError(f"flash_attn_ext: q {q.shape}, k {k.shape}, v {v.shape}, n_threads {n_threads} do not fit")
    has_mask = mask is not None
    if has_mask:
        if mask.dtype != np.float16 or mask.shape[0] < n_q or mask.shape[1] != n_kv:
            raise ValueError(f"flash_attn_ext: mask must be float16 [>= n_q, n_kv], got {mask.dtype} {mask.shape}")
        mask32 = cast_f16_to_f32(mask[:n_q])  # GGML_CPU_FP16_TO_FP32: exact
    else:
        mask32 = np.zeros((n_q, n_kv), F32)
    k_f16, v_f16 = k.dtype == np.float16, v.dtype == np.float16
    k32 = cast_f16_to_f32(k) if k_f16 else np.ascontiguousarray(k, dtype=F32)  # F16 -> F32 is exact (a table look-up)
    v32 = cast_f16_to_f32(v) if v_f16 else np.ascontiguousarray(v, dtype=F32)
    return flash_attn_values(q, k32, v32, k_f16, v_f16, mask32 if has_mask else None, scale, path, n_threads)


def flash_attn_values(q, k32, v32, k_f16: bool, v_f16: bool, mask32, scale: float, path: str, n_threads: int = 1):
    """:func:`flash_attn_ext` on its inputs as float32 values: ``k32`` / ``v32`` hold F16 values when ``k_f16`` /
    ``v_f16`` (K, V of type F16), ``mask32`` [n_q, n_kv] the F16 mask's values or None. For a caller that holds
    them so already (refimpl.model.attention: the F16 view of the KV cache); the arguments are not checked again."""
    n_head, n_q, DK = q.shape
    out = np.zeros((n_q, n_head, v32.shape[2]), F32)
    if n_q == 0:
        return out
    has_mask = mask32 is not None
    if not has_mask:
        mask32 = np.zeros((n_q, k32.shape[1]), F32)
    kind = fa_kernel(n_q, k32.shape[1], np.float16 if k_f16 else F32, np.float16 if v_f16 else F32, v32.shape[2], path)
    # K and V read-only (the cache's views as the kernels only read them): their dots then share one compiled copy
    # with the weight rows' (vec.py ``_simd_dot``, mulmat_vec's F32 rows: ~0.5 s of a first run)
    args = (np.ascontiguousarray(q, dtype=F32), read_only(k32), read_only(v32), mask32, has_mask, F32(scale))
    L, fused = fa_code(path)  # generic: vec.h's SSE2 ggml_v_expf (4 lanes), no FMA
    L16 = f16_code(path, "ggml_flash_attn_ext") if L == NEON else L  # arm64-base: NEON_F32C (float F16 vectors)
    dot = SIMD[path].code if L == NEON else L  # an F32 K's dot: NEON, or NEON_CLANG (clang's leftover blocks)
    if kind == "split":
        split_kv_row(*args, k_f16, v_f16, L16, fused, dot, int(n_threads), out)
    elif kind == "tiled":  # F32 tiles only: the same code with or without FP16 arithmetic
        # SVE: simd-gemm.h's scalar simd_gemm (off under __ARM_FEATURE_SVE) — GCC's fmadd chains in kk order, the
        # same bits as NEON's vector FMA chains —, soft_max over 64 cells: at 128 bits 16 whole blocks (FADDV =
        # vaddvq_f32: NEON's code), at 256 bits 8 blocks of 8 lanes (SVE256: kernels.ggml.sve)
        tiled_rows(*args, NEON if L == SVE128 else L, fused, int(n_threads), out)
    else:
        # threaded from SERIAL_BELOW multiply-adds (both dots of every cell the mask leaves visible; a decode step
        # of real2's 16 heads over 64 cells is above it, builtin:kjv's prompt below): the pairs in one run per thread
        parallel = n_threads > 1 and n_head * n_q > 1  # then the mask's visible cells counted
        if parallel:
            visible = int(np.count_nonzero(mask32 != NINF)) if has_mask else n_q * k32.shape[1]
            parallel = n_head * visible * (DK + v32.shape[2]) >= SERIAL_BELOW
        n_chunks = min(int(n_threads), n_head * n_q) if parallel else 1
        one_row_rows_for(bool(k_f16), bool(v_f16), int(L16), bool(fused), int(dot), parallel)(*args, n_chunks, out)
    return arm_default_nan(out) if L == NEON or L == SVE128 or L == SVE256 else out


def arm_default_nan(out: np.ndarray) -> np.ndarray:
    """AArch64's default NaN (FPCR.DN off: what ``0·inf``, ``inf - inf`` make) is +0x7FC00000, x86's — the one this
    host's arithmetic makes — 0xFFC00000: each of those in ``out`` becomes ARM's, in place (NaNs propagated from an
    input keep their payload on both)."""
    u = out.view(np.uint32)
    u[u == np.uint32(0xFFC00000)] = np.uint32(0x7FC00000)
    return out


__all__ = ["flash_attn_ext", "flash_attn_values", "fa_kernel", "fa_code", "one_chunk", "arm_default_nan"]
