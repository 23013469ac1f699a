"""kernels.dot64 (numba == numpy bit for bit) and the delta-rule step: the compiled kernel
(``kernels.delta_rule_step``) gives the bits of its definition, the numpy form in the model's own file
(``refimpl.model.deltanet.delta_rule_step`` — kernels may not import refimpl, so the two meet here);
the order is the defined one, and nothing depends on the thread count."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

import kernels
from refimpl.model.deltanet import delta_rule_step as definition

F32 = np.float32


def assert_same_bits(got, want):
    """Equal bit for bit (+0 is not −0), NaN matching NaN."""
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def _exact_dot_rounded(a, b):
    """float32 of the exactly rounded sum of the exact products (math.fsum)."""
    return F32(math.fsum(float(x) * float(y) for x, y in zip(a, b)))


def test_dot64_sums_in_increasing_index_order():
    big = F32(2.0**30)
    # 2^60 + 1 rounds to 2^60 in float64, then − 2^60 = 0; with the 1 last the sum is exactly 1.
    a, b = np.array([big, 1, -big], F32), np.array([big, 1, big], F32)
    c = np.array([big, -big, 1], F32)
    for path in ("numba", "numpy"):
        assert kernels.dot64(a, b, path=path) == 0.0
        assert kernels.dot64(c, b[[0, 2, 1]], path=path) == 1.0


@pytest.mark.parametrize("shapes", [((5, 128), (128,)), ((3, 7, 256), (7, 256)), ((1, 2048), (1, 2048)), ((9, 1), (1,)), ((0, 4), (4,)), ((6, 33), (6, 1, 33)), ((2, 1, 4, 16), (3, 1, 16)), ((2, 3, 1, 4, 8), (4, 8))])
def test_dot64_paths_equal_bit_for_bit(shapes):
    rng = np.random.default_rng(len(shapes[0]) * 100 + shapes[0][-1])
    a = rng.standard_normal(shapes[0]).astype(F32) * F32(3)
    b = rng.standard_normal(shapes[1]).astype(F32)
    y_numba, y_numpy = kernels.dot64(a, b), kernels.dot64(a, b, path="numpy")
    assert y_numba.shape == y_numpy.shape == np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    assert y_numba.dtype == np.float32
    np.testing.assert_array_equal(y_numba, y_numpy)


def test_dot64_is_within_an_ulp_of_the_exact_sum():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 300)).astype(F32)
    b = rng.standard_normal(300).astype(F32)
    y = kernels.dot64(a, b)
    exact = np.array([_exact_dot_rounded(r, b) for r in a], F32)
    assert np.all(np.abs(y - exact) <= np.spacing(np.abs(exact)))


def test_dot64_bad_input_is_one_line():
    with pytest.raises(ValueError, match="do not share a last axis"):
        kernels.dot64(np.zeros((2, 3), F32), np.zeros(4, F32))
    with pytest.raises(ValueError, match="path must be"):
        kernels.dot64(np.zeros(3, F32), np.zeros(3, F32), path="blas")


def _step_inputs(seed, Hv=8, Sv=64, Sk=64, scale_M=0.1):
    rng = np.random.default_rng(seed)
    M = (rng.standard_normal((Hv, Sv, Sk)) * scale_M).astype(F32)
    q = rng.standard_normal((Hv, Sk)).astype(F32)
    k = rng.standard_normal((Hv, Sk)).astype(F32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((Hv, Sv)).astype(F32)
    decay = np.exp(-rng.random(Hv).astype(F32) * F32(4))
    beta = rng.random(Hv).astype(F32)
    return M, q, k, v, decay, beta, F32(1.0) / np.sqrt(F32(Sk))


@pytest.mark.parametrize("seed,Hv,Sv,Sk", [(0, 8, 64, 64), (1, 32, 128, 128), (2, 3, 12, 20), (3, 4, 6, 8), (4, 2, 3, 5)])
def test_the_kernel_gives_the_definitions_bits(seed, Hv, Sv, Sk):
    """Groups of four state rows and the Sv mod 4 rows left (6, 3); both pure."""
    args = _step_inputs(seed, Hv, Sv, Sk)
    M0 = args[0].copy()
    o1, M1 = kernels.delta_rule_step(*args)
    o2, M2 = definition(*args)
    assert_same_bits(o1, o2)
    assert_same_bits(M1, M2)
    np.testing.assert_array_equal(args[0], M0)  # pure: the input state is untouched


def test_the_kernel_gives_the_definitions_bits_on_extreme_values():
    M, q, k, v, decay, beta, scale = _step_inputs(4, scale_M=1e30)
    M[0, 0, :4] = [np.inf, -np.inf, np.nan, 0.0]
    M[3] = -0.0  # head 3: a zero state, a zero value and decay: every product ±0
    v[3], decay[3] = 0.0, 0.0
    v[1] *= F32(1e-38)
    decay[2] = 0.0
    o1, M1 = kernels.delta_rule_step(M, q, k, v, decay, beta, scale)
    o2, M2 = definition(M, q, k, v, decay, beta, scale)
    assert_same_bits(o1, o2)  # NaN in the same places, every other bit equal
    assert_same_bits(M1, M2)


def test_delta_rule_step_matches_the_math_in_float64():
    M, q, k, v, decay, beta, scale = _step_inputs(5)
    o, M_new = kernels.delta_rule_step(M, q, k, v, decay, beta, scale)
    M64 = M.astype(np.float64) * decay[:, None, None]
    u = np.einsum("hvk,hk->hv", M64, k)
    M64 = M64 + ((v - u) * beta[:, None])[:, :, None] * k[:, None, :]
    o64 = np.einsum("hvk,hk->hv", M64, q) * float(scale)
    np.testing.assert_allclose(M_new, M64, rtol=0, atol=1e-5)
    np.testing.assert_allclose(o, o64, rtol=0, atol=1e-5)


def test_ctx_kernel_numpy_runs_the_definition(make_fixture, monkeypatch):
    """``Ctx(kernel="numpy")`` steps with the model's numpy form, ``"numba"`` with the compiled kernel;
    a Gated DeltaNet layer gives the same bits either way."""
    from refimpl.model import deltanet
    from refimpl.model.ops import Ctx
    from refimpl.model.state import SeqState
    from refimpl.model.trunk import load_model

    model = load_model(make_fixture("tiny", "f32"))
    c, il = model.config, model.config.is_recurrent.index(True)
    a = np.random.default_rng(6).standard_normal((3, c.n_embd)).astype(F32)
    calls = []
    real_definition, real_kernel = deltanet.delta_rule_step, kernels.delta_rule_step
    monkeypatch.setattr(deltanet, "delta_rule_step", lambda *x: calls.append("definition") or real_definition(*x))
    monkeypatch.setattr(kernels, "delta_rule_step", lambda *x: calls.append("kernel") or real_kernel(*x))
    out = {}
    for kernel in ("numpy", "numba"):
        calls.clear()
        st = SeqState.fresh(c).layers[il]
        out[kernel] = deltanet.gated_deltanet(model.weights.layers[il].mixer, c, a, st, il, Ctx(kernel=kernel))
        assert calls == [{"numpy": "definition", "numba": "kernel"}[kernel]] * 3
    (y1, s1), (y2, s2) = out["numpy"], out["numba"]
    assert_same_bits(y1, y2)
    for t in range(3):
        assert_same_bits(s1[t].ssm, s2[t].ssm)


def test_thread_count_does_not_change_results():
    args = _step_inputs(8, Hv=16)
    a = np.random.default_rng(8).standard_normal((37, 200)).astype(F32)
    before = numba.get_num_threads()
    results = []
    try:
        for n in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(n)
            results.append((kernels.delta_rule_step(*args), kernels.dot64(a, a[::-1])))
    finally:
        numba.set_num_threads(before)
    for (o, M_new), d in results[1:]:
        np.testing.assert_array_equal(o, results[0][0][0])
        np.testing.assert_array_equal(M_new, results[0][0][1])
        np.testing.assert_array_equal(d, results[0][1])


def test_delta_rule_step_bad_shapes_are_one_line():
    M, q, k, v, decay, beta, scale = _step_inputs(9)
    with pytest.raises(ValueError, match="do not agree"):
        kernels.delta_rule_step(M, q[:, :-1], k, v, decay, beta, scale)
