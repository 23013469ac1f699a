"""kernels/ggml/ssm.py against libggml itself: ``ggml_ssm_conv`` and ``ggml_gated_delta_net``, bit for bit, on
both builds (tests/ggml_graph.py: the native AVX-512 libggml and the AVX2 one).

Both ops are ISA dependent, each test proves it: ssm_conv through GCC's choice of vector blocks (kernel size 4
is an FMA chain on AVX-512, rounded products added in order on AVX2), the delta net through
``ggml_vec_dot_f32``'s lane count. ``expf`` is glibc's, the one libggml-cpu calls on this host.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from ggml_graph import BUILDS, WITH_GENERIC, Graph, build_info, i64, on_build, require_both_paths, vp

from kernels.ggml.ssm import expf, gated_delta_net, ssm_conv

pytestmark = pytest.mark.oracle
F32 = np.float32


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, F32).view(np.uint32)


def assert_bits(emu: np.ndarray, ref: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(bits(emu) != bits(ref))
    assert bad.size == 0, (f"{what}: {bad.size}/{ref.size} differ, "
                           f"first at {bad[0]}: {emu.flat[bad[0]]!r} vs {ref.flat[bad[0]]!r}")


# --- graphs (module level: run in the other build's worker process) ---------------------------------------
def ssm_conv_graph(sx: np.ndarray, c: np.ndarray, n_threads: int) -> np.ndarray:
    """ggml_ssm_conv: sx [n_s, d_inner, ncs], c [d_inner, nc] → [n_s, n_t, d_inner]."""
    n_s, d_inner, ncs = sx.shape
    with Graph() as g:
        out = g.op("ggml_ssm_conv", [vp, vp], g.tensor(sx), g.tensor(c))
        return g.compute(out, (n_s, ncs - c.shape[1] + 1, d_inner), n_threads=n_threads)


def gdn_graph(q, k, v, g_, beta, state, K: int, n_threads: int) -> np.ndarray:
    """ggml_gated_delta_net → its whole output [n_seqs·T + K·S·n_seqs, S·H] (attention rows, then K states)."""
    n_seqs, T, H, S = v.shape
    with Graph() as g:
        out = g.op("ggml_gated_delta_net", [vp] * 6 + [i64], *(g.tensor(a) for a in (q, k, v, g_, beta, state)), K)
        return g.compute(out, (n_seqs * T + K * S * n_seqs, S * H), n_threads=n_threads)


def split_gdn(raw: np.ndarray, v_shape, K: int):
    n_seqs, T, H, S = v_shape
    flat = raw.ravel()
    n_attn = n_seqs * T * H * S
    return flat[:n_attn].reshape(n_seqs, T, H, S), flat[n_attn:].reshape(K, n_seqs, H, S, S)


# --- inputs -----------------------------------------------------------------------------------------------
def hard_floats(rng, shape, scale=1.0) -> np.ndarray:
    """Random normals salted with zeros of both signs, subnormals, values one ulp off round numbers (ties in
    sums of short-mantissa values) and large magnitudes; no inf/NaN."""
    x = (rng.standard_normal(shape) * scale).astype(F32)
    flat = x.reshape(-1)
    n = flat.size
    pick = rng.choice(n, size=n // 3, replace=False)
    kinds = rng.integers(0, 6, size=pick.size)
    short = (rng.integers(-64, 64, size=pick.size) / 16).astype(F32)  # 3-bit mantissas: exact ties in sums
    sub = (rng.integers(1, 1 << 20, size=pick.size).astype(np.uint32)).view(F32)
    off = np.nextafter(short, F32(np.inf))
    big = (rng.standard_normal(pick.size) * 1e18).astype(F32)
    sign = np.where(rng.random(pick.size) < 0.5, -1, 1).astype(F32)
    flat[pick] = np.select([kinds == 0, kinds == 1, kinds == 2, kinds == 3, kinds == 4],
                           [F32(0.0), F32(-0.0), sub * sign, short, off], big)
    return x


# --- ssm_conv ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", WITH_GENERIC)
@pytest.mark.parametrize("nc", [4, 3, 5, 8, 12, 17])
def test_ssm_conv_bit_exact(build, nc):
    path = build_info(build).path
    rng = np.random.default_rng([nc, 27])
    for n_s, n_t, d_inner in [(1, 1, 37), (2, 5, 70)]:  # a decode step, a prompt ubatch of 2 sequences
        sx = hard_floats(rng, (n_s, d_inner, nc - 1 + n_t))
        c = hard_floats(rng, (d_inner, nc), 0.5)
        ref = on_build(build, ssm_conv_graph, sx, c, 2)
        assert_bits(ssm_conv(sx, c, path), ref, f"ssm_conv nc={nc} {n_s}x{n_t}x{d_inner} on {path}")


@pytest.mark.parametrize("build", WITH_GENERIC)
def test_ssm_conv_nonfinite(build):
    """inf in one tap (inf·0 and inf−inf make the x86 default NaN) and a NaN tap in other channels."""
    path = build_info(build).path
    rng = np.random.default_rng(5)
    sx = rng.standard_normal((1, 24, 3 + 4)).astype(F32)
    c = rng.standard_normal((24, 4)).astype(F32)
    sx[0, :8, 2], c[:4, 1], c[4:6, 2] = np.inf, 0.0, -np.inf  # inf·0, inf + (−inf)
    sx[0, 8:12, 4] = np.nan  # a NaN with numpy's payload, alone in its channels
    sx[0, 12:16, 1] = F32(3e38)  # overflow of a product / of the sum
    c[12:16, :] = F32(3e38)
    ref = on_build(build, ssm_conv_graph, sx, c, 1)
    assert np.isnan(ref).any() and np.isinf(ref).any()
    assert_bits(ssm_conv(sx, c, path), ref, f"ssm_conv non-finite on {path}")


def test_ssm_conv_builds_differ():
    """Kernel size 4 (qwen35moe): FMA chain on AVX-512, rounded products summed in order on AVX2."""
    require_both_paths()
    rng = np.random.default_rng(9)
    sx = rng.standard_normal((1, 512, 3 + 4)).astype(F32)
    c = rng.standard_normal((512, 4)).astype(F32)
    ref = {b: on_build(b, ssm_conv_graph, sx, c, 1) for b in BUILDS}
    paths = {build_info(b).path for b in BUILDS}
    assert paths == {"avx512", "avx2"}, paths
    assert (bits(ref["native"]) != bits(ref["avx2"])).any()
    assert (bits(ssm_conv(sx, c, "avx512")) != bits(ssm_conv(sx, c, "avx2"))).any()


# --- expf -------------------------------------------------------------------------------------------------
def test_expf_matches_libm():
    """ssm's expf (kernels.ggml.libm: compiled, a direct call of the ``expf`` symbol) against this host's libm
    expf through ctypes (what libggml-cpu calls), on edges and a sweep: the compiled call resolves to the same
    glibc function. (It replaced a line-by-line emulation of glibc's ``__expf_fma``, which agreed on all 2^32.)"""
    libm = ctypes.CDLL("libm.so.6")
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    rng = np.random.default_rng(1)
    edges = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-30, 88.0, 88.72283, 88.722839, 89.0, -87.9, -88.0, -103.2789,
                      -103.27893, -103.5, -103.972, -103.97208, -104.0, -150.0, np.inf, -np.inf, np.nan], F32)
    x = np.concatenate([edges, (rng.standard_normal(20000) * 30).astype(F32), -rng.exponential(3.0, 20000).astype(F32),
                        rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32).view(F32)])
    emu = np.array([expf(v) for v in x], F32)
    ref = np.array([libm.expf(float(v)) for v in x], F32)
    assert_bits(emu, ref, "expf")


# --- gated_delta_net --------------------------------------------------------------------------------------
def gdn_inputs(rng, n_seqs, T, H, H_k, S, hard=False):
    """As qwen35moe feeds the op: q, k L2-normalized per head, v from SiLU, g = softplus(·)·ssm_a ≤ 0,
    beta = sigmoid(·); the state from earlier tokens. ``hard`` salts them with edge values."""
    def l2(x):
        return (x / np.sqrt((x.astype(np.float64) ** 2).sum(-1, keepdims=True) + 1e-6)).astype(F32)

    q = l2(rng.standard_normal((n_seqs, T, H_k, S)))  # [n_seqs, T, H_k, S]
    k = l2(rng.standard_normal((n_seqs, T, H_k, S)))
    v = (rng.standard_normal((n_seqs, T, H, S)) * 0.7).astype(F32)  # [n_seqs, T, H, S]
    g = (-np.log1p(np.exp(rng.standard_normal((n_seqs, T, H, 1)))) * rng.uniform(0.01, 8, (1, 1, H, 1))).astype(F32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((n_seqs, T, H, 1))))).astype(F32)  # [n_seqs, T, H, 1]
    state = (rng.standard_normal((n_seqs, H, S, S)) * 0.05).astype(F32)  # [n_seqs, H, S(value j), S(key i)]
    if hard:
        v = hard_floats(rng, v.shape, 0.7)
        state = hard_floats(rng, state.shape, 0.05)
        q.reshape(-1)[rng.choice(q.size, q.size // 8, replace=False)] = F32(0.0)
        edges = np.array([0.0, -0.0, -90.0, -103.5, -1e-30, -np.inf], F32)  # e^g: 1, 1, subnormal, may-uflow, 1, 0
        g.flat[:edges.size] = edges[: g.size]
        beta.flat[:3] = F32(0.0), F32(1.0), F32(1e-40)
    return q, k, v, g, beta, state


CASES = [  # (n_seqs, T, H, H_k, S, K): decode, prompt ubatch, tails of the dot, rollback snapshots
    (1, 1, 4, 2, 128, 1),
    (2, 6, 4, 2, 128, 1),
    (1, 3, 2, 1, 45, 1),
    (1, 2, 3, 3, 100, 1),
    (2, 4, 2, 2, 7, 3),
    (1, 2, 2, 1, 17, 4),
]


@pytest.mark.parametrize("build", WITH_GENERIC)
@pytest.mark.parametrize("case", CASES, ids=[f"s{c[0]}t{c[1]}h{c[2]}k{c[3]}S{c[4]}K{c[5]}" for c in CASES])
@pytest.mark.parametrize("hard", [False, True], ids=["random", "hard"])
def test_gated_delta_net_bit_exact(build, case, hard):
    path = build_info(build).path
    n_seqs, T, H, H_k, S, K = case
    rng = np.random.default_rng([n_seqs, T, H, S, K, hard])
    args = gdn_inputs(rng, n_seqs, T, H, H_k, S, hard)
    raw = on_build(build, gdn_graph, *args, K, 2)
    out_ref, states_ref = split_gdn(raw, args[2].shape, K)
    out, states = gated_delta_net(*args, path, K=K)
    assert_bits(out, out_ref, f"gdn output {case} on {path}")
    written = min(T, K)  # ggml writes the last min(T, K) snapshot slots
    st = states[None] if K == 1 else states
    assert_bits(st[:written], states_ref[:written], f"gdn state {case} on {path}")
    assert np.isnan(st[written:]).all(), "the slots ggml leaves unwritten are NaN"


@pytest.mark.parametrize("build", WITH_GENERIC)
def test_gated_delta_net_nonfinite(build):
    """A NaN in v (its row of the state and every later output of the head turn NaN) and an inf in q."""
    path = build_info(build).path
    rng = np.random.default_rng(3)
    q, k, v, g, beta, state = gdn_inputs(rng, 1, 3, 2, 2, 24)
    v[0, 1, 0, 5] = np.nan
    q[0, 2, 1, 3] = np.inf
    raw = on_build(build, gdn_graph, q, k, v, g, beta, state, 1, 1)
    out_ref, st_ref = split_gdn(raw, v.shape, 1)
    assert np.isnan(out_ref).any()
    out, st = gated_delta_net(q, k, v, g, beta, state, path)
    assert_bits(out, out_ref, f"gdn non-finite output on {path}")
    assert_bits(st, st_ref[0], f"gdn non-finite state on {path}")


def test_gated_delta_net_builds_differ():
    """The dot products of the delta rule are 16-lane on AVX-512, 8-lane on AVX2: the outputs differ."""
    require_both_paths()
    rng = np.random.default_rng(11)
    args = gdn_inputs(rng, 1, 2, 4, 2, 128)
    outs = {b: split_gdn(on_build(b, gdn_graph, *args, 1, 1), args[2].shape, 1)[0] for b in BUILDS}
    assert (bits(outs["native"]) != bits(outs["avx2"])).any()
    assert (bits(gated_delta_net(*args, "avx512")[0]) != bits(gated_delta_net(*args, "avx2")[0])).any()


def test_generic_build_differs_from_avx2():
    """ggml's generic build (no FMA, double-sum dots) is a third set of bits for both ops: the generic tests above
    compare with a computation the AVX2 emulation would fail."""
    rng = np.random.default_rng(12)
    args = gdn_inputs(rng, 1, 2, 4, 2, 128)
    out = split_gdn(on_build("generic", gdn_graph, *args, 1, 1), args[2].shape, 1)[0]
    assert (bits(out) != bits(gated_delta_net(*args, "avx2")[0])).any()
    sx = rng.standard_normal((1, 512, 3 + 4)).astype(F32)
    c = rng.standard_normal((512, 4)).astype(F32)
    sx6, c6 = rng.standard_normal((1, 256, 5 + 6)).astype(F32), rng.standard_normal((256, 6)).astype(F32)
    assert (bits(ssm_conv(sx6, c6, "generic")) != bits(ssm_conv(sx6, c6, "avx2"))).any()  # AVX2: taps 5, 6 fused
    assert np.array_equal(bits(ssm_conv(sx, c, "generic")), bits(ssm_conv(sx, c, "avx2")))  # 4 taps: both unfused


def test_gated_delta_net_seqless_shapes():
    """Without the n_seqs axis: the same numbers as with a sequence axis of 1."""
    rng = np.random.default_rng(2)
    args = gdn_inputs(rng, 1, 2, 2, 1, 16)
    out, st = gated_delta_net(*args, "avx2")
    out1, st1 = gated_delta_net(*(a[0] for a in args), "avx2")
    assert_bits(out1, out[0], "seqless out")
    assert_bits(st1, st[0], "seqless state")


@pytest.mark.parametrize("path", ["avx512", "arm64-sve256"])
def test_gated_delta_net_threads(path):
    """The (sequence, head) rows split between threads (``_transposed_rows(True, …)``) give the serial kernel's bits
    at 1, 2 and 3 threads — odd head counts included; on an SVE path too (its dots at svcntw() lanes, any head
    size: 120 is not a whole number of its steps)."""
    import numba

    from kernels.ggml import ssm
    from kernels.ggml.simd import simd

    S = 128 if path == "avx512" else 120
    rng = np.random.default_rng(5)
    q, k, v, g, beta, state = gdn_inputs(rng, 1, 3, 5, 1, S, hard=True)
    g = g.reshape(1, 3, 5, 1)
    ref = np.empty_like(v)
    snaps = np.full((1, 1, 5, S, S), np.nan, F32)
    epr, sve_w = simd(path).code, (8 if path == "arm64-sve256" else 0)
    ssm._transposed_rows(False, ssm.glibc_of(path), False, sve_w)(q, k, v, g, beta.reshape(1, 3, 5), state, 1, epr,
                                                                   ref, snaps)
    before = numba.get_num_threads()
    try:
        for n in (1, 2, 3):
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
            out, st = gated_delta_net(q, k, v, g, beta, state, path)
            assert_bits(out, ref, f"gdn output, {n} threads")
            assert_bits(st, snaps[0], f"gdn state, {n} threads")
    finally:
        numba.set_num_threads(before)
