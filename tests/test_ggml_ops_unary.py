"""kernels.ggml.vecmath against libggml's own element-wise ops, bit for bit, on both builds.

Each op runs as a one-op ggml graph (tests/ggml_graph.py) on the ``native`` (AVX-512) and the ``avx2``
libggml, and the emulation is called with that build's path. Inputs: random values at several scales plus
the hard cases (signed zeros, subnormals, huge values, ±inf, NaNs with payloads, the thresholds of the
expf branches and of softplus, exact rounding ties for the casts), in rows whose length is not a multiple
of 16 or 8 so that the scalar tails are exercised. SiLU, SwiGLU and soft_max have SIMD code: their tests
also assert that the two builds differ (and that the other path's emulation misses), so the emulation
must follow the build. The other ops are IEEE operations or scalar libm calls; their tests assert that
the builds agree.
"""

import ctypes

import numpy as np
import pytest
from ggml_graph import BUILDS, WITH_GENERIC, Graph, both_paths, build_info, on_build, require_both_paths, vp

from kernels.ggml import vecmath as vm

pytestmark = pytest.mark.oracle

#: and the AArch64 dotprod GCC build (tests/arm64.py, under qemu). arm64-i8mm-gcc runs the same machine code for
#: these ops (their disassembly, addresses aside) and passed every test here too; tests/test_ggml_ops_arm64.py keeps
#: it in the default suite (one qemu worker less here); arm64-base-gcc (armv8-a) takes the same F32 NEON code for
#: them (no F16 vectors here) and passes them too: pytest -m deep (a third qemu worker, kept out of the default suite)
WITH_ARM = WITH_GENERIC + ["arm64-dotprod-gcc", pytest.param("arm64-base-gcc", marks=pytest.mark.deep)]


def path_of(build: str) -> str:
    """The emulated path ``build``'s library takes (an ARM build's from tests/arm64.py: it cannot be loaded here)."""
    if build.startswith("arm64-"):
        import arm64

        return arm64.BUILDS[build][0]
    return build_info(build).path

F16, BF16 = 1, 30  # ggml.h: enum ggml_type
WIDTHS = (1, 5, 8, 16, 23, 37, 64 + 13)  # shorter than, equal to, and between multiples of 8 and 16 lanes


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32 if np.asarray(a).dtype.itemsize == 4 else np.uint16)


def same(a, b) -> bool:
    return np.array_equal(bits(a), bits(b))


def assert_same(emulated, libggml, what):
    bad = np.flatnonzero(bits(emulated).ravel() != bits(libggml).ravel())
    assert bad.size == 0, (f"{what}: {bad.size} of {emulated.size} differ, first at {bad[:5]}: "
                           f"{np.ravel(emulated)[bad[:5]]} vs libggml {np.ravel(libggml)[bad[:5]]}")


def f32(u):
    return np.array(u, dtype=np.uint32).view(np.float32)


def hard_values(rng, size, scale=4.0, nan=True):
    """``size`` float32s: a shuffle of special values and random ones at several magnitudes."""
    ln2 = np.log(2.0)
    special = [0.0, -0.0, 1e-45, -1e-45, 1e-40, -3e-39, 1.1754944e-38, 1e-30, 1e30, -1e30, 3.4e38, -3.4e38,
               np.inf, -np.inf, 20.0, np.nextafter(np.float32(20), np.float32(30)), -20.0, 88.72, 88.73,
               -87.33, -103.97, -104.0, 87.68, -87.68, 133.0, -133.0, 134.0, -134.0, 1e4, -1e4]
    special += [(k + 0.5) * ln2 for k in range(-200, 200, 7)]  # round(x·log2e) ties
    special = np.array(special, np.float32)
    if nan:
        special = np.concatenate([special, f32([0x7FC00000, 0xFFC00000, 0x7FC12345, 0x7F800001, 0xFFA00000])])
    wide = np.concatenate([rng.standard_normal(size) * s for s in (scale, 40.0, 1e-3)]).astype(np.float32)
    edges = np.concatenate([rng.uniform(-140, 140, size), rng.uniform(80, 105, size // 2)])  # exp branches,
    wide = np.concatenate([wide, edges.astype(np.float32), -edges.astype(np.float32)])  # overflow, subnormals
    out = np.concatenate([special, rng.choice(wide, size - len(special))]) if size > len(special) else special[:size]
    return rng.permutation(out)[:size].astype(np.float32)


def rows_of(values, width):
    """(rows, width) of ``values`` (cycled to a whole number of rows)."""
    r = -(-len(values) // width)
    return np.resize(values, (r, width)).astype(np.float32)


# ---------------------------------------------------------------------------------------------------
# graph functions (module level: picklable for the avx2 worker)


def g_unary(name, x, n_threads=1):
    with Graph() as g:
        return g.compute(g.op(name, [vp], g.tensor(x)), x.shape, n_threads=n_threads)


def g_binary(name, a, b):
    with Graph() as g:
        return g.compute(g.op(name, [vp, vp], g.tensor(a), g.tensor(b)), a.shape)


def g_scale(x, s, b):
    with Graph() as g:
        if b is None:
            out = g.op("ggml_scale", [vp, ctypes.c_float], g.tensor(x), s)
        else:
            out = g.op("ggml_scale_bias", [vp, ctypes.c_float, ctypes.c_float], g.tensor(x), s, b)
        return g.compute(out, x.shape)


def g_swiglu(a, b):
    with Graph() as g:
        if b is None:
            return g.compute(g.op("ggml_swiglu", [vp], g.tensor(a)), a.shape[:-1] + (a.shape[-1] // 2,))
        return g.compute(g.op("ggml_swiglu_split", [vp, vp], g.tensor(a), g.tensor(b)), a.shape)


def g_soft_max(x, mask, scale, n_threads=1):
    with Graph() as g:
        m = g.tensor(mask) if mask is not None else None
        out = g.op("ggml_soft_max_ext", [vp, vp, ctypes.c_float, ctypes.c_float], g.tensor(x), m, scale, 0.0)
        return g.compute(out, x.shape, n_threads=n_threads)


def g_cast(x, gtype, dtype):
    with Graph() as g:
        return g.compute(g.op("ggml_cast", [vp, ctypes.c_int], g.tensor(x), gtype), x.shape, dtype)


def g_cast_bits_to_f32(h_bits, gtype):
    with Graph() as g:
        t = g.tensor(h_bits, gtype=gtype, ne=(h_bits.shape[-1], h_bits.shape[0]))
        return g.compute(g.op("ggml_cast", [vp, ctypes.c_int], t, 0), h_bits.shape)


def g_reduce(name, x, shape):
    with Graph() as g:
        return g.compute(g.op(name, [vp], g.tensor(x)), shape)


# ---------------------------------------------------------------------------------------------------
# SIMD ops: SiLU, SwiGLU, soft_max (path-dependent)


@pytest.mark.parametrize("build", WITH_ARM)
def test_silu(build):
    path = path_of(build)
    rng = np.random.default_rng(1)
    for width in WIDTHS:
        x = rows_of(hard_values(rng, 400), width)
        assert_same(vm.silu(x, path), on_build(build, g_unary, "ggml_silu", x), f"silu width {width}")


def test_silu_differs_between_builds():
    """The two expf polynomials differ: the emulation must follow the build (and does, test_silu)."""
    require_both_paths()
    x = np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32) * 5
    native, avx2 = on_build("native", g_unary, "ggml_silu", x), on_build("avx2", g_unary, "ggml_silu", x)
    assert not same(native, avx2)
    assert not same(vm.silu(x, "avx2"), native) and not same(vm.silu(x, "avx512"), avx2)
    # and ggml's generic build (SSE2 ggml_v_expf, no FMA) differs from both
    generic = vm.silu(x, "generic")
    assert not same(generic, vm.silu(x, "avx2")) and not same(generic, vm.silu(x, "avx512"))


@pytest.mark.parametrize("build", WITH_ARM)
def test_swiglu(build):
    path = path_of(build)
    rng = np.random.default_rng(2)
    for width in WIDTHS:
        a = rows_of(hard_values(rng, 400), width)
        b = np.where(np.isnan(a), np.float32(1.5), rows_of(hard_values(rng, 400, scale=2.0, nan=False), width))
        # a NaN gate, never with a NaN x (two NaN operands: the payload is the compiler's operand order's choice)
        b[np.isfinite(a) & (rng.random(a.shape) < 0.02)] = f32(0x7FC0BEEF)
        assert_same(vm.swiglu(a, b, path), on_build(build, g_swiglu, a, b), f"swiglu_split width {width}")
    ab = rng.standard_normal((3, 2 * 37)).astype(np.float32) * 3  # fused ggml_swiglu: halves of one row
    assert_same(vm.swiglu(ab, None, path), on_build(build, g_swiglu, ab, None), "swiglu fused")
    if build == "avx2" and both_paths():
        assert not same(on_build("native", g_swiglu, ab, None), on_build("avx2", g_swiglu, ab, None))


def soft_max_cases(rng):
    """(x, mask, scale): rows shorter and longer than the lanes, F32/F16 masks, -inf, broadcast heads."""
    yield rng.standard_normal((6, 5)).astype(np.float32) * 3, None, 1.0
    yield rng.standard_normal((4, 128)).astype(np.float32) * 8, None, 1.0  # the MoE router's shape, roughly
    for n in (5, 16, 37, 100):
        x = rng.standard_normal((3, 4, n)).astype(np.float32) * 30  # (heads, rows, n): big spreads, deep exps
        x[0, 0, : n // 2] = np.linspace(-400, 0, n // 2)  # x - max deep in the |n| > 126 and > 192 branches
        causal = np.triu(np.full((6, n), -np.inf, np.float32), k=n - 5)  # 6 >= 4 mask rows (padding)
        causal[1, ::3] = -1e4
        yield x, causal, 0.125
        yield x, causal.astype(np.float16), 0.0883883
    x = rng.uniform(-140, -80, (5, 77)).astype(np.float32)  # out = v_expf(x - 0) · 1: subnormals, both branches
    x[:, 0] = 0
    yield x, None, 1.0
    x = rng.standard_normal((2, 37)).astype(np.float32)
    yield x, np.full((2, 37), -np.inf, np.float32), 1.0  # a fully masked row: NaN (-inf - -inf)


@pytest.mark.parametrize("build", WITH_ARM)
def test_soft_max(build):
    path = path_of(build)
    for k, (x, mask, scale) in enumerate(soft_max_cases(np.random.default_rng(3))):
        got = on_build(build, g_soft_max, x, mask, scale)
        assert_same(vm.soft_max(x, mask, scale, path), got, f"soft_max case {k} {x.shape}")
        if build == "avx2" and both_paths() and x.shape[-1] >= 16 and np.isfinite(got).all():  # SIMD blocks: the builds differ
            assert not same(got, on_build("native", g_soft_max, x, mask, scale)), f"case {k}: builds agree"


def test_thread_count_does_not_matter():
    """ggml splits these ops by rows and computes each row whole on one thread: 1 or 3 threads, same bits."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((7, 37)).astype(np.float32) * 9
    for build in BUILDS:
        assert same(on_build(build, g_unary, "ggml_silu", x, 3), on_build(build, g_unary, "ggml_silu", x, 1))
        assert same(on_build(build, g_soft_max, x, None, 0.5, 3), on_build(build, g_soft_max, x, None, 0.5, 1))


# ---------------------------------------------------------------------------------------------------
# Scalar / exact ops (the same on both builds: IEEE operations, or glibc's expf/logf called per element)


@pytest.mark.parametrize("build", WITH_ARM)
@pytest.mark.parametrize("op", ["exp", "sigmoid", "softplus", "neg"])
def test_libm_unary(build, op):
    path = path_of(build)
    x = rows_of(hard_values(np.random.default_rng(4), 2000), 37)
    got = on_build(build, g_unary, f"ggml_{op}", x)
    assert_same(getattr(vm, op)(x, path) if op != "neg" else vm.neg(x), got, op)
    if build == "avx2":  # no SIMD code: scalar loops (unary-ops.cpp), the same bits on both builds
        assert same(got, on_build("native", g_unary, f"ggml_{op}", x))


@pytest.mark.parametrize("build", WITH_ARM)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_binary_broadcast(build, op):
    rng = np.random.default_rng(5)
    a = hard_values(rng, 4 * 6 * 10).reshape(4, 6, 10)
    for b_shape in [(4, 6, 10), (10,), (1, 6, 10), (2, 1, 10), (2, 3, 5)]:  # ne10 = 5: tiled along rows too
        b = hard_values(rng, int(np.prod(b_shape)), nan=False).reshape(b_shape)
        got = on_build(build, g_binary, f"ggml_{op}", a, b)
        assert_same(getattr(vm, op)(a, b, path_of(build)), got, f"{op} {b_shape}")


@pytest.mark.xfail(strict=True, reason="NaN in both operands, different payloads: which one ggml returns depends on "
                   "how GCC vectorized vec_binary_op_contiguous per build (16/8/4-wide parts, scalar tail: a's or "
                   "b's, e.g. AVX2 width 15: 8×a 6×b 1×a); the emulation keeps numpy's choice. NaNs the model "
                   "makes are all the default NaN, so no result bit depends on it there")
@pytest.mark.parametrize("build", BUILDS)
def test_binary_two_nan_payloads(build):
    a, b = f32([0x7FC11111] * 15).reshape(1, 15), f32([0x7FC22222] * 15).reshape(1, 15)
    assert_same(vm.add(a, b), on_build(build, g_binary, "ggml_add", a, b), "NaN + NaN")


@pytest.mark.parametrize("build", WITH_ARM)
def test_scale_and_scale_bias(build):
    isa = path_of(build)
    rng = np.random.default_rng(6)
    for width in (37, 100):  # GGML_F32_STEP is 64 (AVX-512) / 32 (AVX2): SIMD part and scalar tail
        x = rows_of(hard_values(rng, 2000), width)
        for s, b in [(0.125, None), (-3.7, None), (1.7, 0.3), (0.9999999, -1.0000001), (1e-20, 5e-21)]:
            got = on_build(build, g_scale, x, s, b)
            assert_same(vm.scale(x, s, 0.0 if b is None else b, isa), got, f"scale s={s} b={b} width {width}")
    # ggml_vec_mad1_f32: FMA on the SIMD part, and GCC contracts the tail's x[i]*s + b into vfmadd132ss too;
    # the generic build (no FMA) rounds x*s and + b apart, everywhere
    x, s, b = rng.uniform(-2, 2, (8, 100)).astype(np.float32), np.float32(0.9999999), np.float32(-1.0000001)
    got = on_build(build, g_scale, x, float(s), float(b))
    if isa == "generic":
        assert same(got, x * s + b) and not same(got, vm.scale(x, s, b))
        return
    step = {"avx512": 64, "avx2": 32}.get(isa, 16)  # GGML_F32_STEP (16 on NEON)
    tail = slice(100 // step * step, None)
    assert not same(got[:, tail], (x * s + b)[:, tail])  # one rounding, not two, in the tail too
    if build == "avx2":  # hence the same bits on both builds
        assert same(got, on_build("native", g_scale, x, float(s), float(b)))


def g_clamp(x, lo, hi):
    with Graph() as g:
        return g.compute(g.op("ggml_clamp", [vp, ctypes.c_float, ctypes.c_float], g.tensor(x), lo, hi), x.shape)


@pytest.mark.parametrize("build", WITH_ARM)
def test_clamp(build):
    x = rows_of(hard_values(np.random.default_rng(10), 500), 37)
    for lo, hi in [(6.103515625e-5, np.inf), (-1.0, 1.0)]:  # the MoE weight-sum clamp; a finite box
        assert_same(vm.clamp(x, lo, hi), on_build(build, g_clamp, x, lo, hi), f"clamp {lo} {hi}")


# ---------------------------------------------------------------------------------------------------
# Casts and reductions


@pytest.mark.parametrize("build", WITH_ARM)
def test_cast_f32_to_f16(build):
    rng = np.random.default_rng(7)
    h = np.arange(0, 1 << 16, 7, dtype=np.uint32)
    ties = ((h << 13) + 0x38000000 + 0x1000).view(np.float32)[: 60000 // 7]  # halfway between neighbours
    x = np.concatenate([hard_values(rng, 3000), ties, f32([0x477FEFFF, 0x477FF000, 0x33000000, 0x33000001,
                                                           0x387FE000, 0x387FF000, 0x7FBFFFFF])])
    x = rows_of(x, 41)
    got = on_build(build, g_cast, x, F16, np.float16)
    assert_same(vm.cast_f16(x), got, "F32 -> F16")


@pytest.mark.parametrize("build", WITH_ARM)
def test_cast_f16_to_f32_all_patterns(build):
    h = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)
    got = on_build(build, g_cast_bits_to_f32, h, F16)
    assert_same(vm.cast_f16_to_f32(h.view(np.float16)), got, "F16 -> F32")


@pytest.mark.parametrize("build", WITH_ARM)
def test_cast_f32_to_bf16(build):
    x = rows_of(hard_values(np.random.default_rng(8), 3000), 41)
    got = on_build(build, g_cast, x, BF16, np.uint16)
    assert_same(vm.cast_bf16(x), got, "F32 -> BF16")


@pytest.mark.parametrize("build", WITH_ARM)
def test_sum_rows_and_cumsum(build):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((8, 300)) * np.exp(rng.uniform(-20, 20, (8, 300)))).astype(np.float32)
    x[1, 5], x[2, 7], x[3, 0] = np.inf, np.nan, 3e38
    x[3, 1] = 3e38  # overflows float32 cumsum, not the double sum
    path = path_of(build)
    assert_same(vm.sum_rows(x, path), on_build(build, g_reduce, "ggml_sum_rows", x, (8, 1)), "sum_rows")
    assert not same(vm.sum_rows(x[4:]), np.sum(x[4:], axis=1, keepdims=True))  # order matters: pairwise differs
    assert_same(vm.cumsum(x, path), on_build(build, g_reduce, "ggml_cumsum", x, x.shape), "cumsum")
