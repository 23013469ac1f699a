"""The float32 primitives ggml-cpu's SIMD kernels are made of, with their exact rounding.

``fma32(a, b, c)``: ``a·b + c`` rounded once to float32 — what ``_mm256_fmadd_ps`` / ``_mm512_fmadd_ps`` (and
a C compiler contracting ``a*b + c`` under ``-ffp-contract=fast``, GCC's default) compute. Compiled, it is
LLVM's ``llvm.fma.f32`` (one instruction on every FMA host, correctly rounded in software elsewhere); with
``NUMBA_DISABLE_JIT=1`` it is computed in float64 with the error of the addition carried, so that a sum landing
exactly on a float32 midpoint is still rounded the right way (the product of two float32s is exact in float64).

``f32_bits`` / ``bits_f32``: a float32 lane as its bits and back (``_mm*_castps_si*``). ``v_expf_avx512`` /
``v_expf_avx2``: one lane of ggml-cpu/vec.h ``ggml_v_expf`` in its two x86 branches — the same Cody–Waite
reduction and coefficients, but AVX-512 rounds j ≈ e**b (the polynomial with its 1) and applies 2**n with
``_mm512_scalef_ps``, while AVX2 keeps j ≈ e**b - 1 and forms k + k·j in one FMA (k = 2**n built in the
exponent field; a two-factor scale for |n| > 126): they round differently, so SiLU, SwiGLU and soft_max
differ between the builds (the expf results in ~28 % of inputs, SiLU in ~13 %, by 1 ulp).

``lanes(path)``, the per-path record :class:`Simd` and the codes the compiled functions take (``AVX512``, ``AVX2``,
``NEON``, ``SSE2``), and the platforms' NaNs (``nan_swap``, ``follows_nans``) live in :mod:`kernels.ggml.isa`
(re-exported here). ``v_expf_neon`` is ``v_expf_avx2`` lane for lane (vec.h's NEON branch: the same FMAs, the same
two-factor scale; tested against both AArch64 builds).

Horizontal sums of one register — two genuinely different trees, so two functions: :func:`hsum_fold` (halves
folded onto each other down to one lane: GCC's ``_mm512_reduce_add_ps``, ``arch/x86/quants.c:
hsum_float_8``, llamafile's ``hsum``, the AVX2 block sum of ``ggml_vec_soft_max_f32``) and :func:`hsum_hadd8`
(``GGML_F32x8_REDUCE``'s two ``_mm_hadd_ps``: neighbours first). :func:`vec_reduce` is
``GGML_F32_VEC_REDUCE`` of the four accumulators of a vec.cpp loop, ending in the one or the other.
:func:`fold_left_unfused`: how GCC -O3 splits an in-order ``sum += a[i]*b[i]`` loop between rounded products
and FMAs.
"""

from __future__ import annotations

import numpy as np

from kernels.base.flags import JIT_ENABLED, jit

F32 = np.float32

# The paths, their records and codes, their NaN: kernels.ggml.isa (re-exported here, where the kernels look for them)
from kernels.ggml.isa import (ALL_PATHS, ARM_NAN, AVX2, AVX512, LANES, NEON, NEON_CLANG, NEON_F32C, PATHS, SIMD, SSE2,  # noqa: F401
                              SVE128, SVE256, X86_NAN, Simd, check_path, follows_nans, lanes, nan_swap, simd)
from kernels.lanes.ir import ISA, ISA_AVX2

#: Whether the code compiled here may convert float32 <-> binary16 in hardware (F16C, which the numba target's AVX2
#: and AVX-512 levels require: kernels/lanes/ir.py), capped by ``REFIMPL_KERNEL_ISA`` as the lane kernels are: the
#: generic level tests the integer twin (:func:`f16_round`).
F16C = JIT_ENABLED and ISA >= ISA_AVX2


def fma32_exact(a, b, c):
    """float32 fma by float64 arithmetic (the definition; also the interpreted path)."""
    p = np.float64(np.float32(a)) * np.float64(np.float32(b))  # exact: 24 + 24 significant bits
    c64 = np.float64(np.float32(c))
    s = p + c64
    if not np.isfinite(s):
        return np.float32(s)
    t = s - p
    err = (p - (s - t)) + (c64 - t)  # TwoSum: s + err == p + c exactly
    r = np.float32(s)
    if err == 0.0 or np.float64(r) == s:
        return r
    toward = np.float32(np.nextafter(r, np.float32(np.inf) if s > np.float64(r) else np.float32(-np.inf)))
    if np.float64(r) + (np.float64(toward) - np.float64(r)) / 2 != s:  # not a midpoint: r is the nearest
        return r
    # s is exactly halfway between r and toward: the true value p + c lies on err's side of it
    return toward if (err > 0) == (np.float64(toward) > np.float64(r)) else r


if JIT_ENABLED:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def _llvm_fma32(typingctx, a, b, c):
        sig = types.float32(types.float32, types.float32, types.float32)

        def codegen(context, builder, signature, args):
            f32 = ir.FloatType()
            fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
            return builder.call(fn, args)

        return sig, codegen

    @jit()
    def fma32(a, b, c):
        """``a·b + c`` rounded once to float32."""
        return _llvm_fma32(np.float32(a), np.float32(b), np.float32(c))

else:
    fma32 = fma32_exact


def _vfma_def(acc, j, x, y, k, lanes):
    """``acc[j, l] = fma(x[k + l], y[k + l], acc[j, l])`` for the ``lanes`` lanes (the definition)."""
    for lane in range(lanes):
        acc[j, lane] = fma32(x[k + lane], y[k + lane], acc[j, lane])


if JIT_ENABLED:
    from numba.core import cgutils

    def _vec_ptr(context, b, aty, arr, idx, vt):
        """The element ``idx`` of the array value ``arr`` (numba type ``aty``) as a pointer to the vector ``vt``."""
        a = context.make_array(aty)(context, b, arr)
        return b.bitcast(cgutils.get_item_pointer(context, b, aty, a, idx), vt.as_pointer())

    def _vfma_ir(n):
        @intrinsic
        def vfma(typingctx, acc, j, x, y, k):
            """One ``_mm*_fmadd_ps`` of ``n`` lanes: :func:`_vfma_def` as ``llvm.fma.v{n}f32`` on contiguous
            ``x[k:k+n]``, ``y[k:k+n]`` and ``acc[j, 0:n]`` (each lane rounded once, as the scalar fma)."""
            if not all(isinstance(a, types.Array) and a.dtype == types.float32 for a in (acc, x, y)):
                return None  # float32 arrays only (the pointers are read as float vectors)
            sig = types.void(acc, j, x, y, k)

            def codegen(context, b, signature, args):
                vt = ir.VectorType(ir.FloatType(), n)
                acc_t, _, x_t, y_t, _ = signature.args
                zero = ir.Constant(ir.IntType(64), 0)

                pa = _vec_ptr(context, b, acc_t, args[0], [args[1], zero], vt)
                px = _vec_ptr(context, b, x_t, args[2], [args[4]], vt)
                py = _vec_ptr(context, b, y_t, args[3], [args[4]], vt)
                fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(vt, [vt, vt, vt]), f"llvm.fma.v{n}f32")
                b.store(b.call(fn, [b.load(px, align=4), b.load(py, align=4), b.load(pa, align=4)]), pa, align=4)
                return context.get_dummy_value()

            return sig, codegen

        return vfma

    _vfma16, _vfma8, _vfma4 = _vfma_ir(16), _vfma_ir(8), _vfma_ir(4)

    @jit()
    def vfma(acc, j, x, y, k, lanes):
        """``acc[j, :lanes] = fma(x[k:k+lanes], y[k:k+lanes], acc[j, :lanes])`` lane-wise: one vector FMA
        (``x``, ``y`` contiguous; ``acc`` (…, ≥ lanes) float32, rows contiguous)."""
        if lanes == 16:
            _vfma16(acc, np.int64(j), x, y, np.int64(k))
        elif lanes == 8:
            _vfma8(acc, np.int64(j), x, y, np.int64(k))
        elif lanes == 4:
            _vfma4(acc, np.int64(j), x, y, np.int64(k))
        else:
            raise ValueError("vfma: lanes must be 16, 8 or 4")

else:
    vfma = _vfma_def


def _vfma_rows4_def(acc, w, x0, x1, x2, x3, K, lanes):
    """``vfma(acc, j, w, x_j, l0, lanes)`` for j = 0 … 3 at every ``l0`` in ``range(0, K, lanes)``, in that order
    (the definition): four accumulator rows, each its own chain of FMAs."""
    for l0 in range(0, K, lanes):
        _vfma_def(acc, 0, w, x0, l0, lanes)
        _vfma_def(acc, 1, w, x1, l0, lanes)
        _vfma_def(acc, 2, w, x2, l0, lanes)
        _vfma_def(acc, 3, w, x3, l0, lanes)


def _vfma_rows4x2_def(acc, w0, w1, x0, x1, x2, x3, K, lanes):
    """:func:`_vfma_rows4_def` of two weight rows side by side: ``acc[0:4]`` the chains of ``w0``, ``acc[4:8]``
    those of ``w1`` (each chain's FMAs in the same order: only when an element is computed changes)."""
    for l0 in range(0, K, lanes):
        for j, xj in enumerate((x0, x1, x2, x3)):
            _vfma_def(acc, j, w0, xj, l0, lanes)
            _vfma_def(acc, 4 + j, w1, xj, l0, lanes)


if JIT_ENABLED:

    def _vfma_rows4_ir(n, nw=1):
        """The intrinsic of :func:`_vfma_rows4_def` (``nw`` 1: acc, w, x0 … x3, K) or of :func:`_vfma_rows4x2_def`
        (``nw`` 2: acc, w0, w1, x0 … x3, K) with ``n`` lanes. The ``4·nw`` chains are held in registers for the
        whole loop (stack slots LLVM promotes) and written back to ``acc[0:4·nw, 0:n]`` at the end — as
        :func:`vfma` per step, they went through memory: each FMA waited for the store of the one before; two weight
        rows' chains side by side, as one row's four alone waited on the FMA's latency (real2's F32 router at 4
        rows). ``w``, ``x_j`` contiguous, ``K`` a multiple of ``n``."""

        def typed(acc, arrays, K):
            if not all(isinstance(a, types.Array) and a.dtype == types.float32 for a in (acc, *arrays)):
                return None
            return types.void(acc, *arrays, types.int64), codegen

        def codegen(context, b, signature, args):
            vt = ir.VectorType(ir.FloatType(), n)
            fma = cgutils.get_or_insert_function(b.module, ir.FunctionType(vt, [vt, vt, vt]), f"llvm.fma.v{n}f32")
            zero = ir.Constant(ir.IntType(64), 0)

            def ptr(i, idx):  # argument i's element idx as a vector pointer
                return _vec_ptr(context, b, signature.args[i], args[i], idx, vt)

            rows = [ptr(0, [context.get_constant(types.int64, j), zero]) for j in range(4 * nw)]
            slots = [cgutils.alloca_once(b, vt) for _ in range(4 * nw)]  # weight row h's chain j: slot 4h + j
            for row, slot in zip(rows, slots):
                b.store(b.load(row, align=4), slot)
            with cgutils.for_range_slice(b, zero, args[nw + 5], ir.Constant(ir.IntType(64), n)) as (l0, _):
                wv = [b.load(ptr(1 + h, [l0]), align=4) for h in range(nw)]
                for j in range(4):
                    xv = b.load(ptr(1 + nw + j, [l0]), align=4)
                    for h in range(nw):
                        slot = slots[4 * h + j]
                        b.store(b.call(fma, [wv[h], xv, b.load(slot)]), slot)
            for row, slot in zip(rows, slots):
                b.store(b.load(slot), row, align=4)
            return context.get_dummy_value()

        if nw == 1:
            @intrinsic
            def vfma_rows4(typingctx, acc, w, x0, x1, x2, x3, K):
                return typed(acc, (w, x0, x1, x2, x3), K)

            return vfma_rows4

        @intrinsic
        def vfma_rows4x2(typingctx, acc, w0, w1, x0, x1, x2, x3, K):
            return typed(acc, (w0, w1, x0, x1, x2, x3), K)

        return vfma_rows4x2

    _vfma_rows4_16, _vfma_rows4_8 = _vfma_rows4_ir(16), _vfma_rows4_ir(8)
    _vfma_rows4x2_16, _vfma_rows4x2_8 = _vfma_rows4_ir(16, 2), _vfma_rows4_ir(8, 2)

    @jit()
    def vfma_rows4(acc, w, x0, x1, x2, x3, K, lanes):
        """Four chains of :func:`vfma` along ``K`` (:func:`_vfma_rows4_def`): ``acc[j, :lanes]`` = the FMAs of
        ``w`` and ``x_j``, ``lanes`` values a step, in order from ``acc[j]``'s value (``lanes`` 16 or 8)."""
        if lanes == 16:
            _vfma_rows4_16(acc, w, x0, x1, x2, x3, np.int64(K))
        elif lanes == 8:
            _vfma_rows4_8(acc, w, x0, x1, x2, x3, np.int64(K))
        else:
            raise ValueError("vfma_rows4: lanes must be 16 or 8")

    @jit()
    def vfma_rows4x2(acc, w0, w1, x0, x1, x2, x3, K, lanes):
        """:func:`vfma_rows4` of two weight rows at once (:func:`_vfma_rows4x2_def`): ``acc[0:4, :lanes]`` the chains
        of ``w0``, ``acc[4:8, :lanes]`` those of ``w1``."""
        if lanes == 16:
            _vfma_rows4x2_16(acc, w0, w1, x0, x1, x2, x3, np.int64(K))
        elif lanes == 8:
            _vfma_rows4x2_8(acc, w0, w1, x0, x1, x2, x3, np.int64(K))
        else:
            raise ValueError("vfma_rows4x2: lanes must be 16 or 8")

else:
    vfma_rows4 = _vfma_rows4_def
    vfma_rows4x2 = _vfma_rows4x2_def


def _dot32_lanes_def(sumi, a, ao, b, bo, s0, s1):
    """``sumi[l] += s·Σ_i a[ao+4l+i]·b[bo+4l+i]`` (i < 4) for the 8 int32 lanes, ``s`` = ``s0`` for lanes 0–3
    (bytes 0–15), ``s1`` for lanes 4–7: the integer part of one 32-byte load of an ``arch/x86/quants.c`` K-quant
    ``vec_dot`` (``maddubs``, then ``madd_epi16`` by the sub-block scale: lane ``l`` holds bytes ``4l … 4l+3``).
    ``a``, ``b`` int32; exact (no product or sum leaves int32 for the values ggml's lanes hold). The definition
    (and the interpreted path)."""
    for lane in range(8):
        s = 0
        for i in range(4):
            s += a[ao + 4 * lane + i] * b[bo + 4 * lane + i]
        sumi[lane] = np.int32(sumi[lane] + (s0 if lane < 4 else s1) * s)


if JIT_ENABLED:

    @intrinsic
    def _dot32_lanes_ir(typingctx, sumi, a, ao, b, bo, s0, s1):
        """:func:`_dot32_lanes_def` as vector IR (target-independent): 32 i32 products times the scales, summed in
        fours into the 8 lanes (integers: any order)."""
        if not all(isinstance(x, types.Array) and x.dtype == types.int32 for x in (sumi, a, b)):
            return None
        sig = types.void(sumi, a, ao, b, bo, types.int32, types.int32)

        def codegen(context, bld, signature, args):
            i32 = ir.IntType(32)
            v32, v8 = ir.VectorType(i32, 32), ir.VectorType(i32, 8)

            def ptr(k, off, vt):
                arr = context.make_array(signature.args[k])(context, bld, args[k])
                return bld.bitcast(bld.gep(arr.data, [off]), vt.as_pointer())

            def pick(v, idx):
                return bld.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, len(idx)), idx))

            scale = bld.shuffle_vector(bld.insert_element(bld.insert_element(ir.Constant(ir.VectorType(i32, 2), None), args[5],
                                                                             ir.Constant(i32, 0)), args[6], ir.Constant(i32, 1)),
                                       ir.Constant(ir.VectorType(i32, 2), None), ir.Constant(v32, [0] * 16 + [1] * 16))
            prod = bld.mul(bld.mul(bld.load(ptr(1, args[2], v32), align=4), bld.load(ptr(3, args[4], v32), align=4)), scale)
            pairs = bld.add(pick(prod, list(range(0, 32, 2))), pick(prod, list(range(1, 32, 2))))  # 16 lanes
            fours = bld.add(pick(pairs, list(range(0, 16, 2))), pick(pairs, list(range(1, 16, 2))))  # 8 lanes
            ps = ptr(0, ir.Constant(ir.IntType(64), 0), v8)
            bld.store(bld.add(bld.load(ps, align=4), fours), ps, align=4)
            return context.get_dummy_value()

        return sig, codegen

    @jit()
    def dot32_lanes(sumi, a, ao, b, bo, s0, s1):
        """:func:`_dot32_lanes_def`: two vector multiplies and two pairwise adds (``sumi`` (8,), ``a``, ``b`` int32)."""
        _dot32_lanes_ir(sumi, a, np.int64(ao), b, np.int64(bo), np.int32(s0), np.int32(s1))

else:
    dot32_lanes = _dot32_lanes_def


def _cols_dot16_def(out, oj, q, k0, c, y, yo):
    """``out[oj + j] = Σ_{l < 32} w(k0 + l, c + j) · y[yo + l]`` for the 16 columns ``j``: the exact integer dots of
    a block of 32 weight values with 32 activation values (int8), for 16 outputs at once. ``q`` (K/2, 2N) int8
    holds value ``w(k, c)`` at ``q[k // 2, 2c + k % 2]`` (pairs of neighbouring values side by side, so that one
    ``pmaddwd`` / ``vpdpwssd`` takes a pair for 16 outputs); ``k0`` even. No product or sum leaves int32 for int8
    weights and Q8 activations. The definition (and the interpreted path); used by :mod:`kernels.ggml.columns`."""
    for j in range(16):
        s = 0
        for l in range(32):
            k = k0 + l
            s += np.int64(q[k // 2, 2 * (c + j) + k % 2]) * np.int64(y[yo + l])
        out[oj + j] = s


if JIT_ENABLED:

    def _pair_dot16(context, b, q_t, q_a, k0, c, y_t, y_a, yo, npairs=16):
        """The IR of :func:`_cols_dot16_def`'s 16 dots (a (16 x i32) value) over ``2·npairs`` values (32 by
        default): per pair of values, 32 weights sign-extended times the pair of activations repeated, neighbours
        added (the sign extensions from 8 and 16 bits let LLVM pick ``pmaddwd``, or AVX-512 VNNI's ``vpdpwssd``);
        two chains of additions, joined."""
        i64, i32, i16 = ir.IntType(64), ir.IntType(32), ir.IntType(16)
        v16, v32 = ir.VectorType(i32, 16), ir.VectorType(i32, 32)
        even, odd = ir.Constant(v16, list(range(0, 32, 2))), ir.Constant(v16, list(range(1, 32, 2)))
        kp0 = b.ashr(k0, ir.Constant(i64, 1))
        c2 = b.mul(c, ir.Constant(i64, 2))
        acc = [None, None]
        for lp in range(npairs):  # values 2lp, 2lp + 1 of the block
            pq = cgutils.get_item_pointer(context, b, q_t, q_a, [b.add(kp0, ir.Constant(i64, lp)), c2])
            wv = b.sext(b.load(b.bitcast(pq, ir.VectorType(ir.IntType(8), 32).as_pointer()), align=1), v32)
            py = cgutils.get_item_pointer(context, b, y_t, y_a, [b.add(yo, ir.Constant(i64, 2 * lp))])
            pair = b.load(b.bitcast(py, i16.as_pointer()), align=1)  # two int8 activations, widened to int16
            pair = b.bitcast(b.sext(b.bitcast(pair, ir.VectorType(ir.IntType(8), 2)), ir.VectorType(i16, 2)), i32)
            yb = b.shuffle_vector(b.insert_element(ir.Constant(v16, None), pair, ir.Constant(i32, 0)),
                                  ir.Constant(v16, None), ir.Constant(v16, [0] * 16))
            p = b.mul(wv, b.sext(b.bitcast(yb, ir.VectorType(i16, 32)), v32))
            p2 = b.add(b.shuffle_vector(p, p, even), b.shuffle_vector(p, p, odd))  # (16 x i32)
            acc[lp % 2] = p2 if acc[lp % 2] is None else b.add(acc[lp % 2], p2)
        return acc[0] if acc[1] is None else b.add(acc[0], acc[1])

    def _is(a, dtype, ndim):
        return isinstance(a, types.Array) and a.dtype == dtype and a.ndim == ndim and a.layout == "C"

    @intrinsic
    def _cols_dot16_ir(typingctx, out, oj, q, k0, c, y, yo):
        """:func:`_cols_dot16_def` as vector IR (target-independent: :func:`_pair_dot16`)."""
        if not (_is(out, types.int32, 1) and _is(q, types.int8, 2) and _is(y, types.int8, 1)):
            return None
        sig = types.void(out, types.int64, q, types.int64, types.int64, y, types.int64)

        def codegen(context, b, signature, args):
            out_t, _, q_t, _, _, y_t, _ = signature.args
            o_a, q_a, y_a = (context.make_array(signature.args[i])(context, b, args[i]) for i in (0, 2, 5))
            dot = _pair_dot16(context, b, q_t, q_a, args[3], args[4], y_t, y_a, args[6])
            po = cgutils.get_item_pointer(context, b, out_t, o_a, [args[1]])
            b.store(dot, b.bitcast(po, ir.VectorType(ir.IntType(32), 16).as_pointer()), align=4)
            return context.get_dummy_value()

        return sig, codegen

    @jit()
    def cols_dot16(out, oj, q, k0, c, y, yo):
        """:func:`_cols_dot16_def` (``out`` int32 1-D, ``q`` int8 (K/2, 2N), ``y`` int8, all C-contiguous)."""
        _cols_dot16_ir(out, np.int64(oj), q, np.int64(k0), np.int64(c), y, np.int64(yo))

else:
    cols_dot16 = _cols_dot16_def


# ---------------------------------------------------------------------------------------------------
# Bit casts (``_mm*_castps_si*`` / ``_castsi*_ps``): a float32 lane read as its uint32 bits and back.

if JIT_ENABLED:

    @intrinsic
    def _bitcast_f32_u32(typingctx, x):
        sig = types.uint32(types.float32)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(32))

        return sig, codegen

    @intrinsic
    def _bitcast_u32_f32(typingctx, u):
        sig = types.float32(types.uint32)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.FloatType())

        return sig, codegen

    @jit()
    def f32_bits(x):
        """The bits of float32 ``x`` as an int in [0, 2**32)."""
        return np.int64(_bitcast_f32_u32(np.float32(x)))

    @jit()
    def bits_f32(u):
        """The float32 whose bits are ``u mod 2**32``."""
        return _bitcast_u32_f32(np.uint32(np.int64(u) & 0xFFFFFFFF))

    @intrinsic
    def _f16_trip(typingctx, x):
        """float32 -> binary16 -> float32 as LLVM's ``fptrunc`` / ``fpext`` (F16C's ``vcvtps2ph`` in the nearest-even
        mode and ``vcvtph2ps``: only where the target has F16C, :data:`F16C`)."""
        sig = types.float32(types.float32)

        def codegen(context, builder, signature, args):
            return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())

        return sig, codegen

else:

    def f32_bits(x):
        return int(np.float32(x).view(np.uint32))

    def bits_f32(u):
        return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)


@jit()
def f16_round_bits(x):
    """float32 -> the nearest binary16 value (ties to even), as float32; ±inf past the largest half; NaN and
    ±inf unchanged — :func:`kernels.base.floats.round_to_f16` (checked: numpy's float16 rounding on every non-NaN
    float32, NaNs passed through; equal to ``round_to_f16`` on a sixteenth of all inputs) in integer
    arithmetic on the bits: the significand cut to 11 bits with a carry into the exponent, or below 2**-14 a
    multiple of 2**-24 — the rounding of ``|x| + 0.5``, whose float32 quantum is 2**-24 on [0.5, 1), less 0.5
    (exact). Every case computed, one chosen: no branch, so a loop of it vectorizes. :func:`f16_round` on a target
    without F16C."""
    u = f32_bits(x)
    sign = u & 0x80000000
    a = u & 0x7FFFFFFF
    b = (a + 0xFFF + ((a >> 13) & 1)) & 0x7FFFE000  # a normal half: round to nearest even at bit 13
    b = 0x7F800000 if b >= 0x47800000 else b  # 65536 and up: inf
    sub = f32_bits(np.float32(np.float32(bits_f32(a) + np.float32(0.5)) - np.float32(0.5)))  # below 2**-14
    r = a if a >= 0x7F800000 else sub if a < 0x38800000 else b  # inf, NaN: themselves
    return bits_f32(r | sign)


@jit()
def f16_round(x):
    """:func:`f16_round_bits` — the same value for every input, NaNs passed through unchanged — for the hot loops
    (flash attention's F16 accumulator): on a target with F16C (:data:`F16C`) by its two conversions (nearest even,
    as ``_mm*_cvtps_ph(x, 0)``), 2 instructions for 8 values against ~25 for 4 (real2's 16 heads, one row over 64
    cells of F16 K/V: 342 -> 140 ns a cell, *Zen 3*, 1 thread)."""
    if F16C:  # a module constant: the other branch is not compiled
        return x if x != x else _f16_trip(x)  # a NaN: unchanged (the conversion would keep 10 payload bits)
    return f16_round_bits(x)


def _hexf(s: str):
    return F32(float.fromhex(s))


# ggml-cpu/vec.h: ggml_v_expf ("adapted from arm limited optimized routine") — the same constants in both
# x86 branches: x·log2(e) rounded by adding 1.5·2**23, ln 2 in two parts (Cody–Waite), a degree-5 polynomial.
EXP_R = _hexf("0x1.8p23")  # 1.5·2**23: z = x·log2e + R holds round(x·log2e) in its low mantissa bits
EXP_LOG2E = _hexf("0x1.715476p+0")
EXP_LN2_HI = _hexf("0x1.62e4p-1")
EXP_LN2_LO = _hexf("0x1.7f7d1cp-20")
EXP_C5 = _hexf("0x1.0e4020p-7")
EXP_C4 = _hexf("0x1.573e2ep-5")
EXP_C3 = _hexf("0x1.555e66p-3")
EXP_C2 = _hexf("0x1.fffdb6p-2")
EXP_C1 = _hexf("0x1.ffffecp-1")
ONE = F32(1.0)


@jit()
def _expf_reduce(x):
    """The shared first half of ggml_v_expf: (z, n, b, u) with n = round(x·log2e) and b = x - n·ln2."""
    z = fma32(x, EXP_LOG2E, EXP_R)  # _mm*_fmadd_ps(x, 0x1.715476p+0f, r)
    n = np.float32(z - EXP_R)  # _mm*_sub_ps(z, r)
    b = fma32(-n, EXP_LN2_LO, fma32(-n, EXP_LN2_HI, x))  # _mm*_fnmadd_ps(n, lo, _mm*_fnmadd_ps(n, hi, x))
    u = np.float32(b * b)
    return z, n, b, u


@jit()
def v_expf_avx512(x):
    """One lane of ggml-cpu/vec.h: ggml_v_expf (the ``__AVX512F__ && __AVX512DQ__`` branch, ``__m512``).

    j ≈ e**b by the polynomial, then ``_mm512_scalef_ps(j, n)`` = j·2**n rounded once (subnormal results
    included); lanes with |n| > 192 are 0 (n ≤ 0) or inf. The ``kortestz`` early return only skips the blend
    when no lane needs it: per lane the result is the same. A NaN lane gives x quieted (tested)."""
    x = np.float32(x)
    if x != x:
        return bits_f32(f32_bits(x) | 0x00400000)
    z, n, b, u = _expf_reduce(x)
    if abs(n) > np.float32(192):  # d = _mm512_cmp_ps_mask(_mm512_abs_ps(n), 192, _CMP_GT_OQ)
        return np.float32(0.0) if n <= np.float32(0) else np.float32(np.inf)  # blend(n <= 0, INFINITY, zero)
    j = fma32(fma32(fma32(EXP_C5, b, EXP_C4), u, fma32(EXP_C3, b, EXP_C2)), u, fma32(EXP_C1, b, ONE))
    # _mm512_scalef_ps(j, n): |n| <= 192 is an integer here, j·2**n is exact in float64, one rounding to float32;
    # 2**n as the product of two float32 powers of two (each |exponent| <= 96), not a libm ldexp call
    ni = np.int64(n)
    h = ni >> 1
    two_n = np.float64(bits_f32((127 + h) << 23)) * np.float64(bits_f32((127 + ni - h) << 23))
    return np.float32(np.float64(j) * two_n)


@jit()
def v_expf_avx2(x):
    """One lane of ggml-cpu/vec.h: ggml_v_expf (the ``__AVX2__ && __FMA__`` branch, ``__m256``).

    k = 2**n built in the exponent field (``e = bits(z) << 23``, ``k = e + bits(1.0f)``), result
    ``fma(j, k, k)`` with j ≈ e**b - 1; for 126 < |n| <= 192 the scale is split in two factors
    (s2·(1 + j))·s1 so that neither overflows nor underflows early; for |n| > 192, s1·s1 (0 or inf).
    The ``movemask`` early return computes the c-false branch for all lanes: per lane the same.
    A NaN lane gives x quieted (tested)."""
    x = np.float32(x)
    if x != x:
        return bits_f32(f32_bits(x) | 0x00400000)
    z, n, b, u = _expf_reduce(x)
    e = (f32_bits(z) << 23) & 0xFFFFFFFF  # _mm256_slli_epi32(_mm256_castps_si256(z), 23)
    k = bits_f32(e + 0x3F800000)  # _mm256_add_epi32(e, castps_si256(1.0f))
    c = abs(n) > np.float32(126)  # _mm256_cmp_ps(andnot(-0.f, n), 126, _CMP_GT_OQ)
    j = fma32(fma32(fma32(EXP_C5, b, EXP_C4), u, fma32(EXP_C3, b, EXP_C2)), u, np.float32(EXP_C1 * b))
    if not c:
        return fma32(k, j, k)  # _mm256_fmadd_ps(k, j, k)
    g = 0x82000000 if n <= np.float32(0) else 0  # and(cmp(n, 0, _CMP_LE_OQ), 0x82000000)
    s1 = bits_f32(g + 0x7F000000)
    s2 = bits_f32(e - g)
    if abs(n) > np.float32(192):  # d
        return np.float32(s1 * s1)
    return np.float32(fma32(s2, j, s2) * s1)


@jit()
def v_expf_sse2(x):
    """One lane of ggml-cpu/vec.h: ggml_v_expf (the ``__SSE2__`` branch, ``__m128``, which ggml's generic x86 build
    takes for silu, swiglu and soft_max): :func:`v_expf_avx2`'s formula with every ``MADD128`` / ``NMADD128`` a
    product and a sum rounded apart (``_mm_add_ps(_mm_mul_ps(x, y), z)``: no FMA in that build)."""
    x = np.float32(x)
    if x != x:
        return bits_f32(f32_bits(x) | 0x00400000)
    z = np.float32(np.float32(x * EXP_LOG2E) + EXP_R)
    n = np.float32(z - EXP_R)
    b = np.float32(np.float32(x - np.float32(n * EXP_LN2_HI)) - np.float32(n * EXP_LN2_LO))
    e = (f32_bits(z) << 23) & 0xFFFFFFFF
    k = bits_f32(e + 0x3F800000)
    c = abs(n) > np.float32(126)
    u = np.float32(b * b)
    p5 = np.float32(np.float32(EXP_C5 * b) + EXP_C4)
    p3 = np.float32(np.float32(EXP_C3 * b) + EXP_C2)
    j = np.float32(np.float32(np.float32(np.float32(p5 * u) + p3) * u) + np.float32(EXP_C1 * b))
    if not c:
        return np.float32(np.float32(j * k) + k)  # MADD128(j, k, k)
    g = 0x82000000 if n <= np.float32(0) else 0
    s1 = bits_f32(g + 0x7F000000)
    s2 = bits_f32(e - g)
    if abs(n) > np.float32(192):
        return np.float32(s1 * s1)
    return np.float32(np.float32(np.float32(s2 * j) + s2) * s1)  # MADD128(s2, j, s2) * s1


#: vec.h's ``__ARM_NEON && __aarch64__`` ggml_v_expf: ``vfmaq_f32`` / ``vfmsq_f32`` where AVX2 has
#: ``_mm256_fmadd_ps`` / ``fnmadd``, j = fma(poly, u, c1·b), ``vfmaq_f32(k, j, k)``, the same two-factor scale
#: (``vclezq_f32(n)`` for n <= 0) and ``|n| > 192`` blend — one lane is :func:`v_expf_avx2`, operation for operation.
v_expf_neon = v_expf_avx2


@jit(inline=True)
def v_expf(x, code):
    """ggml_v_expf of the build whose expf code is ``code`` (:data:`AVX512`, :data:`AVX2`, :data:`NEON`, or
    :data:`SSE2` for the generic x86 build), one lane."""
    if code == AVX512:
        return v_expf_avx512(x)
    if code == AVX2 or code == NEON or code == SVE128 or code == SVE256:  # SVE's ggml_v_expf: NEON's FMAs, lane for lane
        return v_expf_avx2(x)
    if code == SSE2:
        return v_expf_sse2(x)
    raise ValueError("v_expf: unknown SIMD code")


@jit()
def expf_block(code):
    """The block width of vec.cpp's silu / swiglu / soft_max loops for expf code ``code``."""
    if code == SVE256:  # svcntw() = 8, the last block predicated
        return 8
    return 4 if code == SSE2 or code == SVE128 else code  # SVE128: svcntw() = 4, the last block predicated


def expf_lanes(path: str, op: str = "ggml_v_expf (silu, swiglu, soft_max)") -> int:
    """The expf code of ``path`` (:attr:`Simd.expf`) that vec.cpp's silu / swiglu / soft_max loops and
    :func:`v_expf` take: :func:`lanes` on the SIMD paths, :data:`SSE2` on ggml's generic x86 path, whose ``__SSE2__``
    branch (:func:`v_expf_sse2`, 4 lanes) remains where ``GGML_SIMD`` is off."""
    return simd(path, op).expf


# ---------------------------------------------------------------------------------------------------
# Horizontal sums of one register (a[o : o + lanes]) and the accumulator reduction of vec.cpp


@jit()
def hsum_fold(a, o, lanes):
    """The sum of the 16 (``lanes`` 16) or 8 float32 lanes ``a[o:o+lanes]``, halves folded: lane i + lane
    i + half, until one lane is left — ``(s0 + s2) + (s1 + s3)`` of the 4-lane half sums ``s``.

    AVX-512: GCC's ``_mm512_reduce_add_ps`` (extractf64x4 → 256-bit add, extractf128 → 128-bit add, then
    the shuffles). 8 lanes: ``arch/x86/quants.c: hsum_float_8`` (= llamafile ``hsum(__m256)``) and the AVX2
    block sum of ``vec.cpp: ggml_vec_soft_max_f32`` (extractf128 + add, movehl + add, movehdup + add_ss).
    Written out, not through a helper per lane: a helper called with the lane as a constant compiles once
    per lane (flags docstring, "Literal arguments are constants")."""
    if lanes == 16:  # 512 -> 256 bits: lane i of the 8-lane half is a[o+i] + a[o+8+i]
        h0, h1 = F32(a[o] + a[o + 8]), F32(a[o + 1] + a[o + 9])
        h2, h3 = F32(a[o + 2] + a[o + 10]), F32(a[o + 3] + a[o + 11])
        h4, h5 = F32(a[o + 4] + a[o + 12]), F32(a[o + 5] + a[o + 13])
        h6, h7 = F32(a[o + 6] + a[o + 14]), F32(a[o + 7] + a[o + 15])
    else:
        h0, h1, h2, h3 = F32(a[o]), F32(a[o + 1]), F32(a[o + 2]), F32(a[o + 3])
        h4, h5, h6, h7 = F32(a[o + 4]), F32(a[o + 5]), F32(a[o + 6]), F32(a[o + 7])
    s0, s1, s2, s3 = F32(h0 + h4), F32(h1 + h5), F32(h2 + h6), F32(h3 + h7)  # 256 -> 128 bits
    return F32(F32(s0 + s2) + F32(s1 + s3))  # 128 -> 64 -> 32 bits


@jit()
def hsum_hadd8(a, o):
    """The tail of ``simd-mappings.h: GGML_F32x8_REDUCE`` on 8 lanes ``a[o:o+8]``: the 128-bit halves added,
    then ``_mm_hadd_ps`` twice — ``(t0 + t1) + (t2 + t3)``, neighbours first (not :func:`hsum_fold`)."""
    t0, t1 = F32(a[o] + a[o + 4]), F32(a[o + 1] + a[o + 5])  # _mm_add_ps(lo128, hi128)
    t2, t3 = F32(a[o + 2] + a[o + 6]), F32(a[o + 3] + a[o + 7])
    return F32(F32(t0 + t1) + F32(t2 + t3))


@jit()
def hsum_pairwise4(a, o):
    """``vaddvq_f32`` of the 4 lanes ``a[o:o+4]``: GCC's two ``faddp`` — ``(a0 + a1) + (a2 + a3)``."""
    return F32(F32(a[o] + a[o + 1]) + F32(a[o + 2] + a[o + 3]))


@jit()
def vec_reduce(acc, lanes):
    """``GGML_F32_VEC_REDUCE`` (= ``GGML_F16_VEC_REDUCE`` on x86) of the ``GGML_F32_ARR`` = 4 accumulators
    ``acc`` (4, lanes), overwritten: ``x[0] += x[2]; x[1] += x[3]; x[0] += x[1]`` lane-wise, then the
    lanes — AVX-512 ``_mm512_reduce_add_ps`` (:func:`hsum_fold`), AVX2 two hadds (:func:`hsum_hadd8`), NEON
    ``vaddvq_f32`` (:func:`hsum_pairwise4`; GCC adds ``(x1 + x3) + (x0 + x2)``: the same sums)."""
    for i in range(lanes):
        acc[0, i] = F32(acc[0, i] + acc[2, i])
        acc[1, i] = F32(acc[1, i] + acc[3, i])
        acc[0, i] = F32(acc[0, i] + acc[1, i])
    if lanes == AVX512:
        return hsum_fold(acc[0], 0, 16)
    if lanes == AVX2:
        return hsum_hadd8(acc[0], 0)
    if lanes == NEON:
        return hsum_pairwise4(acc[0], 0)
    raise ValueError("vec_reduce: unknown SIMD code")


@jit()
def fold_left_unfused(count, lanes):
    """How many of ``count`` in-order terms ``sum += a[i]*b[i]`` GCC -O3 (no -ffast-math) computes as
    rounded products (``vmulps`` / ``fmul v.4s``) added one by one (``vaddss`` / ``fadd s``): x86, blocks of
    ``lanes`` then one of ``lanes/2`` — ``count & ~7`` (AVX-512) / ``count & ~3`` (AVX2); AArch64 NEON
    (``count`` < 16 here), blocks of 4 when ``count`` >= 4 — ``count & ~3``; the rest are scalar FMAs
    (``vfmadd231ss`` / ``fmadd``). Read from the disassembly of the builds (vec.cpp ``ggml_vec_dot_f32``'s
    leftovers; on x86 also ops.cpp ssm_conv)."""
    if lanes == NEON or lanes == NEON_F32C:  # NEON_F32C: arm64-base's F16 code, GCC's NEON
        return count & ~3
    if lanes == NEON_CLANG:  # clang 14 (interleave 2): blocks of 8 when 8 or more are left
        return count & ~7
    if lanes == AVX512 or lanes == AVX2:
        return count & ~(lanes // 2 - 1)
    raise ValueError("fold_left_unfused: unknown SIMD code")
