"""kernels.ggml.rope bit for bit against both libggml builds (tests/ggml_graph.py).

RoPE is ISA-independent, so no test asserts that the builds differ: the NEOX / M-RoPE loop of
``ggml_compute_forward_rope_flt<float>`` is scalar in both builds (only GGML_ROPE_TYPE_NORMAL is
vectorized), GCC contracts ``x0*cos - x1*sin`` / ``x0*sin + x1*cos`` into the same ``vfmsub231ss`` /
``vfmadd132ss`` in both, and the cache calls the same glibc ``powf`` and ``sincosf``. The tests can
still fail: the last one shows that the numpy-sin/cos cache of refimpl's rope (np.sin/np.cos are not
glibc's) and an unfused rotation give other bits on the same inputs.
"""

import ctypes

import numpy as np
import pytest
from ggml_graph import WITH_GENERIC, Graph, build_info, on_build, vp

from kernels.ggml.rope import ROPE_TYPE_IMROPE, ROPE_TYPE_MROPE, ROPE_TYPE_NEOX, rope_multi, rope_neox
from refimpl.model.attention import rope_cache, rotate_pairs

cf, ci = ctypes.c_float, ctypes.c_int
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


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def g_rope_multi(x, pos, n_dims, sections, mode, freq_base, freq_scale=1.0, attn_factor=1.0, n_threads=1):
    with Graph() as g:
        out = g.op("ggml_rope_multi", [vp, vp, vp, ci, ctypes.POINTER(ci), ci, ci, cf, cf, cf, cf, cf, cf],
                   g.tensor(x), g.tensor(np.ascontiguousarray(pos, np.int32).reshape(-1)), None, n_dims,
                   (ci * 4)(*sections), mode, 0, freq_base, freq_scale, 0.0, attn_factor, 32.0, 1.0)
        return g.compute(out, x.shape, n_threads=n_threads)


def g_rope_neox(x, pos, n_dims, freq_base, freq_scale=1.0, attn_factor=1.0, n_threads=1):
    with Graph() as g:
        out = g.op("ggml_rope_ext", [vp, vp, vp, ci, ci, ci, cf, cf, cf, cf, cf, cf],
                   g.tensor(x), g.tensor(np.ascontiguousarray(pos, np.int32)), None, n_dims, ROPE_TYPE_NEOX, 0,
                   freq_base, freq_scale, 0.0, attn_factor, 32.0, 1.0)
        return g.compute(out, x.shape, n_threads=n_threads)


def q_like(rng, T, H, D):
    """Normalized-looking q/k rows, plus NaN payloads / infinities in both halves of the rotated pairs
    (x0 and x1 alone and together: which NaN wins is the FMA's operand order) and in the copied dims."""
    x = rng.standard_normal((T, H, D)).astype(np.float32)
    x[0, 0, 0] = -0.0
    specials = np.array([0x7FC00000, 0x7F812345, 0xFFC0BEEF, 0x7F800000, 0xFF800000, 0x00000001], np.uint32)
    specials = specials.view(np.float32)  # qNaN, sNaN, -qNaN with payload, +inf, -inf, the smallest subnormal
    for h in range(min(H, 3)):
        x[1, h, rng.integers(0, 32, 4)] = rng.choice(specials, 4)  # x0 side of n_dims=64
        x[1, h, 32 + rng.integers(0, 32, 4)] = rng.choice(specials, 4)  # x1 side
    x[2, 0, 3], x[2, 0, 35] = specials[1], specials[2]  # both NaN
    x[2, 0, 4], x[2, 0, 36] = specials[0], specials[3]  # NaN and inf
    x[0, 1, 5], x[0, 1, 37] = np.inf, np.inf  # position 0: sin = 0, inf*0
    x[3, 0, D - 1] = specials[1]  # unrotated dims are copied bit for bit
    return x


def text_positions(p):
    return np.stack([p, p, p, np.zeros_like(p)]).astype(np.int32)  # llm_graph_input_pos: (p, p, p, 0)


@pytest.mark.parametrize("build", WITH_ARM)
def test_rope_multi_imrope_bit_exact(build):
    """qwen35moe's attention: head_dim 256, n_rot 64, sections (11, 11, 10, 0), base 1e7; text and
    arbitrary 4-stream positions (large ones round in cvtsi2ss), other sections, MROPE, scales ≠ 1."""
    path = path_of(build)
    rng = np.random.default_rng(2710)
    T = 24
    x = q_like(rng, T, 4, 256)
    p = np.concatenate([[0, 1, 2, 7, 1000, 262143, 16777217, 2**31 - 1], rng.integers(0, 300000, T - 8)])
    streams = rng.integers(-50, 100000, (4, T)).astype(np.int32)
    cases = [(text_positions(p), 64, (11, 11, 10, 0), ROPE_TYPE_IMROPE, 1e7, 1.0, 1.0),
             (streams, 64, (11, 11, 10, 0), ROPE_TYPE_IMROPE, 1e7, 1.0, 1.0),
             (streams, 80, (10, 12, 9, 3), ROPE_TYPE_IMROPE, 10000.0, 1.0, 1.0),  # sections wrap, e stream used
             (streams, 256, (24, 20, 20, 0), ROPE_TYPE_MROPE, 5e5, 0.25, 1.5),
             (text_positions(p), 64, (11, 11, 10, 0), ROPE_TYPE_IMROPE, 1e7, 0.5, 0.7)]
    for pos, n_dims, sections, mode, base, fs, af in cases:
        want = rope_multi(x, pos, n_dims, sections, mode, base, path, freq_scale=fs, attn_factor=af)
        got = on_build(build, g_rope_multi, x, pos, n_dims, sections, mode, base, fs, af, 2)
        assert np.array_equal(bits(got), bits(want)), (n_dims, sections, mode)


@pytest.mark.parametrize("build", WITH_ARM)
def test_rope_neox_bit_exact(build):
    """qwen3next's attention: ``ggml_rope_ext`` NEOX over the first n_rot dims."""
    path = path_of(build)
    rng = np.random.default_rng(2711)
    T = 20
    x = q_like(rng, T, 3, 128)
    p = np.concatenate([[0, 1, 5, 123456, 16777217, -3], rng.integers(0, 40000, T - 6)]).astype(np.int32)
    for n_dims, base, fs, af in ((64, 1e7, 1.0, 1.0), (128, 10000.0, 1.0, 1.0), (96, 1e6, 0.125, 1.25)):
        want = rope_neox(x, p, n_dims, base, path, freq_scale=fs, attn_factor=af)
        got = on_build(build, g_rope_neox, x, p, n_dims, base, fs, af)
        assert np.array_equal(bits(got), bits(want)), n_dims


def test_rope_differs_from_numpy_sincos_and_unfused_rotation():
    """The cases above can fail: refimpl's text-token IMRoPE (np.cos/np.sin, a*b - c*d unfused) and
    the emulation agree in value to float32 noise but not in bits."""
    rng = np.random.default_rng(2712)
    T, D, R = 64, 256, 64
    x = rng.standard_normal((T, 2, D)).astype(np.float32)
    p = rng.integers(0, 100000, T)
    ours = rope_multi(x, text_positions(p), R, (11, 11, 10, 0), ROPE_TYPE_IMROPE, 1e7, "avx512")
    theirs = np.stack([rotate_pairs(x[t], *rope_cache(int(p[t]), R, (11, 11, 10, 0), 1e7, 1.0)) for t in range(T)])
    assert np.allclose(ours, theirs, rtol=0, atol=1e-5)
    assert (bits(ours) != bits(theirs)).any()
    # ggml's generic build rounds each product of a rotation line: other bits than the fused SIMD builds'
    generic = rope_multi(x, text_positions(p), R, (11, 11, 10, 0), ROPE_TYPE_IMROPE, 1e7, "generic")
    assert np.allclose(ours, generic, rtol=0, atol=1e-5) and (bits(ours) != bits(generic)).any()
