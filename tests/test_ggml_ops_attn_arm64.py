"""Attention on the AArch64 builds, bit for bit: kernels.ggml.flashattn_exact and kernels.ggml.attn_heads against
``arm64-dotprod-gcc`` and ``arm64-i8mm-gcc`` (tests/arm64.py: GCC 12, qemu-aarch64 on a CPU with exactly their
features; both take the same NEON code for these ops, so every test runs on both) and, for the one-row and split
paths, ``arm64-base-gcc`` (armv8-a: the F16 vectors float32x4_t).

``ggml_flash_attn_ext`` on its three code paths — one-row (< 64 query rows), tiled (>= 64), split-KV (one row,
n_kv >= 512, n_threads dependent) — with F16 K/V (llama.cpp's default) and F32 K/V, and ``build_attn_mha``
without flash attention (F32 K/V: ``mul_mat`` by ``ggml_vec_dot_f32``, ``soft_max_ext``, ``mul_mat``).
What is ARM's own: with FP16 vector arithmetic the one-row path's ``ggml_vec_dot_f16`` accumulates K·Q in *half*
precision lanes, and ``ggml_vec_mad_f16`` / ``ggml_vec_scale_f16`` update the F16 accumulator with ``vs`` / ``ms``
rounded to half; the half accumulators of the dot overflow to inf where x86's float ones do not
(:func:`test_f16_dot_overflows_on_arm`); the tiled path's soft_max runs NEON blocks of 4; ``fmaxf`` is ``fmaxnm``;
generated NaNs are positive. Cost: ~12 s for the module with warm numba caches (2 shared vCPUs; of it ~7 s per build
the qemu worker's start, shared with the other ARM modules of the process); a cold compile adds ~30 s.
"""

import ctypes
from dataclasses import replace

import numpy as np
import pytest
from ggml_graph import Graph, on_build, vp
from test_ggml_ops_attn import attn_graph, causal_mask, make
from test_ggml_ops_attn import check as check_path

from kernels.ggml import simd
from kernels.ggml.attn_heads import attend_f32
from kernels.ggml.flashattn_exact import fa_code, fa_kernel, flash_attn_ext

pytestmark = pytest.mark.oracle

ARM_BUILDS = ["arm64-dotprod-gcc", "arm64-i8mm-gcc", pytest.param("arm64-i8mm-clang", marks=pytest.mark.deep), pytest.param("arm64-dotprod-clang", marks=pytest.mark.deep)]
#: arm64-base-gcc (armv8-a): F16 vectors float32x4_t (GGML_F32Cx4) — the one-row loop's F16 code is x86's float one
WITH_BASE = ARM_BUILDS + ["arm64-base-gcc", pytest.param("arm64-base-clang", marks=pytest.mark.deep)]
DEEP_BASE = ARM_BUILDS + [pytest.param(b, marks=pytest.mark.deep) for b in ("arm64-base-gcc", "arm64-base-clang")]  # pytest -m deep


def path_of(build: str) -> str:
    import arm64

    return arm64.BUILDS[build][0]


def check(build, q, k, v, m, scale, n_threads=1):
    """Byte comparison of the ARM library and the emulation of its path (test_ggml_ops_attn.check); returns the
    library's output."""
    return check_path(build, q, k, v, m, scale, n_threads, path=path_of(build))


# (n_head, n_head_kv, n_q, n_kv, D): 1 … 63 query rows, head dims with every tail of the half dot (32 halves a
# step) and of vec_mad_f16 / vec_scale_f16, n_kv on both sides of 256, just below the split threshold, and above it
# with 2 rows
ONE_ROW = [(4, 2, 1, 1, 64), (4, 1, 1, 37, 128), (8, 2, 1, 256, 128), (2, 1, 1, 511, 64), (4, 2, 4, 40, 80),
           (2, 2, 63, 100, 64), (2, 1, 3, 257, 100), (2, 1, 2, 19, 40), (2, 2, 8, 255, 256), (1, 1, 2, 9, 17),
           (2, 1, 2, 600, 64)]  # 2 rows of >= 512 cells: not split


@pytest.mark.parametrize("build", WITH_BASE)
@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
def test_one_row_path(build, kv_dtype):
    rng = np.random.default_rng(1)
    for i, shape in enumerate(ONE_ROW):
        assert fa_kernel(shape[2], shape[3], kv_dtype, kv_dtype) == "one_row"
        # amp 4: sharp softmax, many new maxima, vs far below half's normal range (rounded to half on ARM)
        check(build, *make(rng, *shape, kv_dtype, amp=4.0 if i % 2 else 1.0), n_threads=1 + i % 2)
    q, k, v, m, scale = make(rng, 4, 2, 3, 50, 128, np.float16)  # mixed types: a float or a half accumulator
    check(build, q, k, v.astype(np.float32), m, scale)
    check(build, q, k.astype(np.float32), v, m, scale)


@pytest.mark.parametrize("build", ARM_BUILDS)
@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
def test_tiled_path(build, kv_dtype):
    """64 and 65 rows, 1 and 2 threads, DV = 68 (simd_gemm's one-vector columns). Off x86 the tiled path also needs
    DV % GGML_F32_EPR == 0: 64 rows of DV = 66 take the one-row loop (half precision for F16 K/V)."""
    rng = np.random.default_rng(3)
    path = path_of(build)
    for shape, n_threads in [((2, 1, 64, 64, 64), 1), ((4, 2, 65, 130, 128), 2), ((2, 1, 65, 100, 68), 1),
                             ((2, 2, 64, 130, 80), 2)]:
        assert fa_kernel(shape[2], shape[3], kv_dtype, kv_dtype, shape[4], path) == "tiled"
        check(build, *make(rng, *shape, kv_dtype), n_threads=n_threads)
    check(build, *make(rng, 2, 1, 64, 96, 64, kv_dtype, amp=5.0), n_threads=2)
    assert fa_kernel(64, 70, kv_dtype, kv_dtype, 66, path) == "one_row"
    assert fa_kernel(64, 70, kv_dtype, kv_dtype, 66, "avx2") == "tiled"
    check(build, *make(rng, 2, 1, 64, 70, 66, kv_dtype), n_threads=2)


@pytest.mark.parametrize("build", DEEP_BASE)
@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
def test_split_kv_path(build, kv_dtype):
    rng = np.random.default_rng(4)
    q, k, v, m, scale = make(rng, 4, 2, 1, 600, 128, kv_dtype)
    m[:, 520:] = -np.inf  # llama.cpp's padded cells: a whole chunk may be masked
    assert fa_kernel(1, 600, kv_dtype, kv_dtype) == "split"
    outs = [check(build, q, k, v, m, scale, n_threads=t) for t in (1, 2, 3)]
    assert any((o.view(np.uint32) != outs[0].view(np.uint32)).any() for o in outs[1:])  # depends on n_threads
    check(build, *make(rng, 2, 1, 1, 512, 64, kv_dtype, amp=3.0), n_threads=2)


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_hard_inputs(build):
    rng = np.random.default_rng(5)
    for n_q in (2, 64):  # masked cells in the middle, one row that sees nothing (its output 0), huge scores
        q, k, v, m, scale = make(rng, 2, 1, n_q, 80, 64, np.float16, amp=20.0)
        m[:, 10:30:3] = -np.inf
        m[1] = -np.inf
        check(build, q, k, v, m, scale)
    # identical keys: score ties (s > M false), every probability 1 — vs = 1 exactly
    q, k, v, m, scale = make(rng, 2, 1, 4, 48, 64, np.float16)
    k[:] = k[:, :1]
    check(build, q, k, v, m, scale)
    # zeros, signed zeros and subnormal halves in Q, K, V (the half FMAs keep subnormals: FPCR.FZ16 off)
    q, k, v, m, scale = make(rng, 2, 1, 3, 40, 80, np.float16, amp=3.0)
    q[:, :, ::3] = -0.0
    k[:, ::2, ::5] = np.float16(2.0**-24) * rng.integers(-3, 4, k[:, ::2, ::5].shape)
    v[:, 1::3] = -0.0
    v[:, ::4, ::7] = np.float16(-2.0**-20)
    v[:, 2::5] = (rng.integers(-1023, 1024, v[:, 2::5].shape) * 2.0**-24).astype(np.float16)  # all subnormal
    check(build, q, k, v, m, scale)
    check(build, q[:, :1], k, v, m[:1], scale)
    # V near half's top: the F16 accumulator overflows to inf on both ISAs (inf - inf = NaN after a rescale)
    q, k, v, m, scale = make(rng, 2, 1, 2, 40, 64, np.float16, amp=0.1)
    v[:] = np.float16(40000.0) * np.sign(v)
    want = check(build, q, k, v, m, scale)
    assert np.isinf(want).any() or np.isnan(want).any()
    # inf in V: 0·inf = NaN in the tiled path's padding and in the one-row accumulator; ARM's NaN is +qNaN
    for n_q in (1, 64):
        q, k, v, m, scale = make(rng, 2, 1, n_q, 70, 64, np.float16)
        v[0, 3, 5] = np.inf
        want = check(build, q, k, v, m, scale)
        assert np.isnan(want).any() or np.isinf(want).any()


@pytest.mark.parametrize("build", WITH_BASE)
def test_f16_dot_overflows_on_arm(build):
    """K·Q of large halves: the NEON ``ggml_vec_dot_f16``'s half lanes overflow to inf (8 products of 8100 per
    lane at D = 256) where x86's float lanes hold 2.1e6. Two cells with an infinite score: the second's
    ``expf(inf - inf)`` is NaN — ARM's output NaN, x86's finite. arm64-base (no FP16 vector arithmetic: float
    lanes) stays finite, as x86 does."""
    rng = np.random.default_rng(9)
    q, k, v, m, scale = make(rng, 2, 1, 2, 20, 256, np.float16)
    q[:] = np.float32(90.0)
    k[:, [4, 9]] = np.float16(90.0)
    want = check(build, q, k, v, m, scale)
    assert np.isfinite(want).all() if "base" in build else np.isnan(want).all()
    x86 = flash_attn_ext(q, k, v, m, scale, "avx2")
    assert np.isfinite(x86).all()


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_aarch64_glibc_expf(build):
    """``vs = expf(s - M)`` is AArch64 glibc's: at s - M = -63.0994606 (0xC27C65D9, the one float in [-104, 0] where
    it differs from x86-64 glibc's — its ``z = x·32/ln 2`` a half-integer) the output is that expf's bits. Cell 0
    scores 0 with V = 0, cell 1 scores x with V = 1: VKQ = vs, S = 1 + vs = 1, out = vs (F32 K/V: no half rounding)."""
    from kernels.ggml.libm import expf, expf_arm64

    x = np.uint32(0xC27C65D9).view(np.float32)
    assert expf_arm64(x) != expf(x)
    q = np.zeros((1, 1, 16), np.float32)
    q[0, 0, 0] = 1.0
    k = np.zeros((1, 2, 16), np.float32)
    k[0, 1, 0] = x
    v = np.zeros((1, 2, 16), np.float32)
    v[0, 1] = 1.0
    want = check(build, q, k, v, None, np.float32(1.0))
    assert want[0, 0, 0] == expf_arm64(x)
    assert flash_attn_ext(q, k, v, None, np.float32(1.0), "avx2")[0, 0, 0] == expf(x)


@pytest.mark.parametrize("build", ARM_BUILDS[:1])
def test_arm_differs_from_x86(build):
    """The ARM bits are not x86's: the half-precision one-row path (F16 K/V) and the tiled path's NEON soft_max."""
    rng = np.random.default_rng(6)
    for case in (make(rng, 4, 2, 2, 60, 80, np.float16), make(rng, 2, 1, 64, 128, 64, np.float16)):
        arm = check(build, *case)
        for path in ("avx2", "avx512"):
            assert (arm.view(np.uint32) != flash_attn_ext(*case, path).view(np.uint32)).any(), path


def test_other_arm_paths_refused(monkeypatch):
    """flash attention on a NEON record whose F16 vectors are neither float16x8_t nor float32x4_t (GGML_F32Cx4): a
    one-line ValueError naming op and path (arm64-sve128: tests/test_ggml_ops_sve128.py)."""
    monkeypatch.setitem(simd.SIMD, "arm64-dotprod", replace(simd.SIMD["arm64-dotprod"], f16_half=False))
    with pytest.raises(ValueError, match="ggml_flash_attn_ext on .*arm64-dotprod"):
        fa_code("arm64-dotprod")


# --- build_attn_mha without flash attention, F32 K/V (kernels.ggml.attn_heads) ------------------------------
@pytest.mark.parametrize("build", WITH_BASE + ["arm64-sve256-gcc"] + [pytest.param(b, marks=pytest.mark.deep) for b in
                                                ("arm64-sve128-gcc", "arm64-sve128-clang", "arm64-sve128-clang19")])
def test_attention_without_flash(build):
    """K·Q and P·V as ggml_vec_dot_f32 (NEON: 4 × 4 lanes, vaddvq, blocks-of-4 leftovers; SVE: its loop, one dot at
    a time), soft_max's NEON or SVE blocks;
    D and n_kv multiples of 16 (the products across columns) and not (one by one); through
    :func:`kernels.ggml.attn_heads.attend_f32` as the graph calls it. NaNs (the 3rd shape): made (K·Q = +inf, then
    inf - inf: ARM's +qNaN) and given (x86's default NaN in Q, ARM's and one with a payload in V)."""
    rng = np.random.default_rng(7)
    shapes = [(1, 4, 2, 256, 64), (3, 2, 1, 37, 80), (5, 4, 4, 100, 19), (2, 2, 1, 512, 128)]
    if build == "arm64-sve256-gcc":  # tails of 8 and 64 lanes
        shapes[3] = (2, 2, 1, 131, 72)
    for T, H, Hkv, n_kv, D in shapes:
        q = (rng.standard_normal((T, H, D)) * 2).astype(np.float32)
        k = (rng.standard_normal((Hkv, n_kv, D)) * 2).astype(np.float32)
        v = rng.standard_normal((Hkv, n_kv, D)).astype(np.float32)
        if D == 19:
            q[:, 0, 5], k[0, 40, 5] = 1.5, np.inf  # head 0: K·Q = +inf at cell 40, max - x = inf - inf
            q.view(np.uint32)[2, 1, 7] = 0xFFC00000  # head 1: x86's default NaN as an input
            v.view(np.uint32)[2, 50, 3], v.view(np.uint32)[3, 60, 4] = 0x7FC00000, 0x7FC01234  # heads 2, 3: in V
        mask = causal_mask(T, n_kv, n_kv - T)
        mask[0, : n_kv // 3] = -np.inf
        scale = np.float32(1.0) / np.sqrt(np.float32(D))
        want = on_build(build, attn_graph, q, k, np.ascontiguousarray(v.transpose(0, 2, 1)), mask, float(scale))
        assert D != 19 or np.isnan(want).any()
        for n_threads in (1, 3):  # the heads split between threads from SERIAL_BELOW multiply-adds (the 4th shape)
            got = attend_f32(q, k, v, n_kv, mask, scale, path_of(build), n_threads)
            bad = want.view(np.uint32) != got.view(np.uint32)
            assert not bad.any(), f"{bad.sum()} of {bad.size} differ (T {T}, n_kv {n_kv}, D {D}, {n_threads} threads)"
        if build == "arm64-sve256-gcc" and D == 64:  # SVE's 8-lane dots and soft_max blocks: not 128 bits' numbers
            assert (attend_f32(q, k, v, n_kv, mask, scale, "arm64-sve128").view(np.uint32) != want.view(np.uint32)).any()
