"""The AArch64 paths of kernels.ggml's vector functions against the real ARM libggml builds, bit for bit.

``arm64-dotprod-gcc`` and ``arm64-i8mm-gcc`` (tests/arm64.py: cross-built with GCC 12, run under qemu-aarch64 on a
CPU model with exactly their features) take the same NEON code for these functions (their disassembly agrees), so
each test runs on both; ``arm64-base-gcc`` (armv8-a) too, but for the F16 dot (float lanes: its own test). The
shared vec.cpp functions are reached through one-op graphs: ``ggml_mul_mat`` of F32 (each output one
``ggml_vec_dot_f32``: no llamafile, no repack in these builds) and of F16 weights (``ggml_vec_dot_f16``, whose NEON
accumulators are *half* precision with FP16 vector arithmetic, float on armv8-a). The element-wise ops of
test_ggml_ops_unary.py / _rope / _rows run on the ARM dotprod build there (their ``build`` parameters). Also here:
AArch64 glibc's ``expf`` (2 inputs of 2**32 differ from x86-64's: ``libm.expf_arm64``), and the refusal of a key
whose vector code is not emulated.

Cost: 15 s of CPU on an AMD EPYC Zen 4 class host (2 shared vCPUs, 2026-12-04), most of it starting the two
qemu workers (about 6 s each); the graph calls themselves take 10-50 ms.
"""

import numpy as np
import pytest
from ggml_graph import Graph, on_build, vp

from kernels.ggml import simd, vec
from kernels.ggml.isa import f16_code

pytestmark = pytest.mark.oracle

ARM_BUILDS = ["arm64-dotprod-gcc", "arm64-i8mm-gcc", pytest.param("arm64-i8mm-clang", marks=pytest.mark.deep), pytest.param("arm64-dotprod-clang", marks=pytest.mark.deep)]
WITH_BASE = ARM_BUILDS + ["arm64-base-gcc", pytest.param("arm64-base-clang", marks=pytest.mark.deep)]
DEEP_BASE = ARM_BUILDS + [pytest.param(b, marks=pytest.mark.deep) for b in ("arm64-base-gcc", "arm64-base-clang")]  # pytest -m deep


def path_of(build: str) -> str:
    import arm64

    return arm64.BUILDS[build][0]


def g_mul_mat(a, b, n_threads=1):
    """ggml_mul_mat(a, b): a (M, K) F32 or F16, b (N, K) F32 -> (N, M)."""
    with Graph() as g:
        out = g.op("ggml_mul_mat", [vp, vp], g.tensor(a), g.tensor(b))
        return g.compute(out, (b.shape[0], a.shape[0]), n_threads=n_threads)


def emulated_mul_mat(a32, b32, dot, lanes):
    acc = vec.dot_scratch()
    out = np.empty((b32.shape[0], a32.shape[0]), np.float32)
    for j in range(b32.shape[0]):
        for i in range(a32.shape[0]):
            out[j, i] = dot(a32.shape[1], a32[i], b32[j], lanes, acc)
    return out


def spread(rng, shape, lo=-6, hi=6):
    """float32 values of random sign over 2**lo … 2**hi: dots whose rounding depends on the order."""
    return (rng.standard_normal(shape) * np.exp2(rng.uniform(lo, hi, shape))).astype(np.float32)


def assert_bits(got, want, what):
    bad = np.flatnonzero(got.view(np.uint32).ravel() != want.view(np.uint32).ravel())
    assert bad.size == 0, f"{what}: {bad.size} of {got.size} differ, first {got.ravel()[bad[:3]]} vs {want.ravel()[bad[:3]]}"


@pytest.mark.parametrize("build", DEEP_BASE)
def test_vec_dot_f32(build):
    """ggml_vec_dot_f32: 4 accumulators of 4 lanes, vaddvq_f32, the NEON leftovers (blocks of 4, then fmadd; clang's
    build: of 8)."""
    lanes = simd.simd(path_of(build)).code
    rng = np.random.default_rng(39)
    for k in (1, 3, 4, 5, 7, 12, 15, 16, 17, 23, 31, 64, 100):
        a, b = spread(rng, (5, k)), spread(rng, (3, k))
        got = on_build(build, g_mul_mat, a, b)
        assert_bits(emulated_mul_mat(a, b, vec.vec_dot_f32, lanes), got, f"vec_dot_f32 K={k}")
    a, b = spread(rng, (8, 100)), spread(rng, (4, 100))
    assert not np.array_equal(emulated_mul_mat(a, b, vec.vec_dot_f32, simd.AVX2), on_build(build, g_mul_mat, a, b))


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_vec_dot_f16_half_accumulators(build):
    """ggml_vec_dot_f16: float16x8_t accumulators (every FMA rounded to half), half reduction, double tail."""
    lanes = f16_code(path_of(build))
    rng = np.random.default_rng(40)
    for k in (8, 31, 32, 33, 64, 96 + 7, 256):
        a = spread(rng, (6, k), -4, 4).astype(np.float16)
        b = spread(rng, (3, k), -4, 4).astype(np.float16).astype(np.float32)  # F16 values: from_float exact
        if k == 64:
            a[0, :] = np.float16(0.0009765625)  # half subnormal products, sums across binades
            b[0, : k // 2] = np.float32(6e-05)
        got = on_build(build, g_mul_mat, a, b)
        want = emulated_mul_mat(a.astype(np.float32), b, vec.vec_dot_f16, lanes)
        assert_bits(want, got, f"vec_dot_f16 K={k}")
    a = spread(rng, (8, 128), -2, 2).astype(np.float16)
    b = spread(rng, (4, 128), -2, 2).astype(np.float16).astype(np.float32)
    x86 = emulated_mul_mat(a.astype(np.float32), b, vec.vec_dot_f16, simd.AVX2)
    assert not np.array_equal(x86, on_build(build, g_mul_mat, a, b))  # float accumulators would miss


def g_unary(name, x):
    with Graph() as g:
        return g.compute(g.op(name, [vp], g.tensor(x)), x.shape)


#: the two float32s whose AArch64 glibc expf differs from x86-64's (all 2**32 compared: libm.expf_arm64)
EXPF_DIFFER = np.array([0x4202422F, 0xC27C65D9], np.uint32).view(np.float32)


@pytest.mark.parametrize("build", WITH_BASE)
def test_glibc_expf_of_aarch64(build):
    """ggml_exp, ggml_sigmoid and silu's scalar tail call the AArch64 glibc's expf, which differs from the host's
    in two inputs (by 1 ulp): the emulation computes AArch64's (kernels.ggml.libm.expf_arm64)."""
    from kernels.ggml import libm, vecmath

    path = path_of(build)
    x = np.concatenate([EXPF_DIFFER, np.nextafter(EXPF_DIFFER, np.float32(0)), [88.5, -100.0, -103.5, 1e-9]])
    x = x.astype(np.float32).reshape(1, -1)
    got = on_build(build, g_unary, "ggml_exp", x)
    assert_bits(vecmath.exp(x, path), got, "exp")
    host = np.array([libm.expf(v) for v in EXPF_DIFFER], np.float32)
    assert not np.array_equal(host.view(np.uint32), got[0, :2].view(np.uint32))  # the host's glibc would miss
    s = np.repeat(-EXPF_DIFFER, 3).astype(np.float32).reshape(2, 3)  # 3 < 4 lanes: all in the scalar tail
    assert_bits(vecmath.silu(s, path), on_build(build, g_unary, "ggml_silu", s), "silu tail")
    assert_bits(vecmath.sigmoid(s, path), on_build(build, g_unary, "ggml_sigmoid", s), "sigmoid")


def test_base_vec_dot_f16_float_lanes():
    """arm64-base (armv8-a, no FP16 vector arithmetic): ggml_vec_dot_f16's ``GGML_F16_VEC`` is ``GGML_F32Cx4`` —
    halves widened, 4 float32x4_t accumulators over steps of 16, vaddvq_f32, double tail (code isa.NEON_F32C):
    neither the half lanes of the dotprod build nor AVX2's 8-lane order."""
    from kernels.ggml import isa

    build, code = "arm64-base-gcc", isa.f16_code("arm64-base")
    assert code == isa.NEON_F32C and isa.f16_code("arm64-dotprod") == simd.NEON
    rng = np.random.default_rng(41)
    for k in (8, 15, 16, 17, 33, 64, 96 + 7, 256):
        a = spread(rng, (6, k), -4, 4).astype(np.float16)
        b = spread(rng, (3, k), -4, 4).astype(np.float16).astype(np.float32)
        got = on_build(build, g_mul_mat, a, b)
        assert_bits(emulated_mul_mat(a.astype(np.float32), b, vec.vec_dot_f16, code), got, f"vec_dot_f16 K={k}")
    a = spread(rng, (8, 128), -2, 2).astype(np.float16)
    b = spread(rng, (4, 128), -2, 2).astype(np.float16).astype(np.float32)
    got = on_build(build, g_mul_mat, a, b)
    for other in (simd.NEON, simd.AVX2):
        assert not np.array_equal(emulated_mul_mat(a.astype(np.float32), b, vec.vec_dot_f16, other), got)


def test_a_path_without_emulated_vector_code_is_refused_naming_the_op(monkeypatch):
    """An AArch64 key whose vector code :data:`kernels.ggml.isa.SIMD` does not list (here arm64-i8mm, taken out) is
    refused in one line naming the op — never computed with another path's code."""
    from kernels.ggml import isa, norm, rope, vecmath
    from kernels.ggml.build import NotEmulated

    path = "arm64-i8mm"
    monkeypatch.delitem(isa.SIMD, path)
    monkeypatch.delitem(isa.LANES, path)
    x = np.ones((2, 8), np.float32)
    for op, call in [("ggml_silu", lambda: vecmath.silu(x, path)), ("ggml_soft_max", lambda: vecmath.soft_max(x, None, 1.0, path)),
                     ("ggml_rms_norm", lambda: norm.rms_norm(x, 1e-6, path)), ("ggml_l2_norm", lambda: norm.l2_norm(x, 1e-6, path)),
                     ("ggml_sigmoid", lambda: vecmath.sigmoid(x, path)),
                     ("ggml_rope", lambda: rope.rope_neox(x.reshape(1, 2, 8), np.zeros(1, np.int32), 8, 1e4, path))]:
        with pytest.raises(NotEmulated, match=f"{op} on .*\\({path}\\) is not emulated"):
            call()
    with pytest.raises(NotEmulated):
        simd.lanes(path)
