"""kernels/ggml/ssm.py on the AArch64 builds, bit for bit: ``ggml_ssm_conv`` and ``ggml_gated_delta_net`` against
``arm64-dotprod-gcc``, ``arm64-i8mm-gcc`` and ``arm64-base-gcc`` (tests/arm64.py; the same NEON code in all three).

ssm_conv's in-order ``sumf += s*c`` is vectorized by AArch64 GCC as blocks of 4 rounded products (``fmul v.4s``)
added lane by lane, the last ``nc % 4`` taps ``fmadd`` — for qwen35moe's 4 taps, the AVX2 build's bits, not the
AVX-512 build's FMA chain. The delta net's dots are NEON ``ggml_vec_dot_f32`` (4 × 4 lanes, ``vaddvq_f32``),
its ``expf`` AArch64 glibc's (:func:`kernels.ggml.libm.expf_arm64`), its generated NaNs ARM's +qNaN.
Graphs and inputs are tests/test_ggml_ops_ssm.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
from ggml_graph import on_build
from test_ggml_ops_ssm import CASES, assert_bits, bits, gdn_graph, gdn_inputs, hard_floats, split_gdn, ssm_conv_graph

from kernels.ggml.ssm import gated_delta_net, ssm_conv

pytestmark = pytest.mark.oracle
F32 = np.float32
ARM_BUILDS = ["arm64-dotprod-gcc", "arm64-i8mm-gcc", pytest.param("arm64-i8mm-clang", marks=pytest.mark.deep), pytest.param("arm64-dotprod-clang", marks=pytest.mark.deep)]
#: armv8-a: the same NEON code for these ops (no F16 vectors here); pytest -m deep
WITH_BASE = ARM_BUILDS + [pytest.param(b, marks=pytest.mark.deep) for b in ("arm64-base-gcc", "arm64-base-clang")]


def path_of(build: str) -> str:
    import arm64

    return arm64.BUILDS[build][0]


@pytest.mark.parametrize("build", WITH_BASE)
def test_ssm_conv(build):
    path = path_of(build)
    rng = np.random.default_rng(27)
    for nc in (3, 4, 5, 8, 13):  # no block of 4, one, one and a tap, two, three and a tap
        for n_s, n_t, d_inner in [(1, 1, 37), (2, 5, 70)]:
            sx = hard_floats(rng, (n_s, d_inner, nc - 1 + n_t))
            c = hard_floats(rng, (d_inner, nc), 0.5)
            ref = on_build(build, ssm_conv_graph, sx, c, 1 + n_s % 2)
            assert_bits(ssm_conv(sx, c, path), ref, f"ssm_conv nc={nc} {n_s}x{n_t}x{d_inner} on {path}")
    # non-finite: inf·0 and inf - inf (ARM's +qNaN), a NaN tap, overflow
    sx = rng.standard_normal((1, 24, 3 + 4)).astype(F32)
    c = rng.standard_normal((24, 4)).astype(F32)
    sx[0, :8, 2], c[:4, 1], c[4:6, 2] = np.inf, 0.0, -np.inf
    sx[0, 8:12, 4] = np.nan
    sx[0, 12:16, 1], c[12:16, :] = F32(3e38), F32(3e38)
    ref = on_build(build, ssm_conv_graph, sx, c, 1)
    assert np.isnan(ref).any() and np.isinf(ref).any()
    assert_bits(ssm_conv(sx, c, path), ref, f"ssm_conv non-finite on {path}")
    # 4 taps: the AVX2 build's bits (rounded products added in order), not AVX-512's FMA chain
    sx, c = rng.standard_normal((1, 256, 3 + 4)).astype(F32), rng.standard_normal((256, 4)).astype(F32)
    same, other = ("avx512", "avx2") if "clang" in build else ("avx2", "avx512")  # clang: 4 taps all fmadd
    assert np.array_equal(bits(ssm_conv(sx, c, path)), bits(ssm_conv(sx, c, same)))
    assert (bits(ssm_conv(sx, c, path)) != bits(ssm_conv(sx, c, other))).any()


@pytest.mark.parametrize("build", ARM_BUILDS)
def test_gated_delta_net(build):
    path = path_of(build)
    for i, case in enumerate(CASES):
        n_seqs, T, H, H_k, S, K = case
        hard = i % 2 == 1
        rng = np.random.default_rng([n_seqs, T, H, S, K, hard])
        args = list(gdn_inputs(rng, n_seqs, T, H, H_k, S, hard))
        if i == 2:  # a KDA gate (one per key index): expf per column, ggml_vec_mul_f32
            args[3] = -np.abs(rng.standard_normal((n_seqs, T, H, S))).astype(F32)
        raw = on_build(build, gdn_graph, *args, K, 1 + i % 2)
        out_ref, states_ref = split_gdn(raw, args[2].shape, K)
        out, states = gated_delta_net(*args, path, K=K)
        assert_bits(out, out_ref, f"gdn output {case} on {path}")
        written = min(T, K)  # ggml writes the last min(T, K) snapshot slots
        st = states[None] if K == 1 else states
        assert_bits(st[:written], states_ref[:written], f"gdn state {case} on {path}")


@pytest.mark.parametrize("build", WITH_BASE)
def test_gated_delta_net_nonfinite(build):
    """A NaN in v, an inf in q, an inf·0 (ARM's +qNaN); and the 4-lane dots give other bits than AVX2's 8."""
    path = path_of(build)
    rng = np.random.default_rng(3)
    q, k, v, g, beta, state = gdn_inputs(rng, 1, 3, 2, 2, 24)
    v[0, 1, 0, 5] = np.nan
    q[0, 2, 1, 3] = np.inf
    state[0, 1, 2, :] = np.inf
    k[0, 0, 1, 4] = 0.0
    raw = on_build(build, gdn_graph, q, k, v, g, beta, state, 1, 1)
    out_ref, st_ref = split_gdn(raw, v.shape, 1)
    assert np.isnan(out_ref).any()
    out, st = gated_delta_net(q, k, v, g, beta, state, path)
    assert_bits(out, out_ref, f"gdn non-finite output on {path}")
    assert_bits(st, st_ref[0], f"gdn non-finite state on {path}")
    args = gdn_inputs(rng, 1, 2, 4, 2, 128)
    assert (bits(gated_delta_net(*args, path)[0]) != bits(gated_delta_net(*args, "avx2")[0])).any()
