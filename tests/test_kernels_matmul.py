"""kernels.matmul, plain mode: both paths vs float64, numba == numpy bit for bit, batch/thread
invariance, inputs and errors.

The precision policy (kernels/matmul.py): exact float32 weights, float64 products summed from +0.0
in increasing column order, one rounding to float32 — the numpy path is that definition written
out, the numba path gives its bits. Against ``dequantize(W) @ x`` in float64 the error is at most
one float32 rounding plus ~K·2^-53 of Σ|w·x|.
"""

from pathlib import Path

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import kernels
from kernels.plain.dequant import as_row_bytes
from kernels.testing import random_rows

TYPES = kernels.WEIGHT_TYPES
IDS = [t.name for t in TYPES]
K = 512  # two Q*_K super-blocks, sixteen 32-blocks
N = 37  # odd: 2 tasks of 16 rows + a task of 5 (a group of 4 plus a single row)


def problem(qtype, seed, n_rows=N, T=9):
    rng = np.random.default_rng([int(qtype), seed])
    w = random_rows(qtype, n_rows, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[0, :7] = 0.0  # a few exact zeros and a tiny value
    x[1, 3] = np.float32(1e-30)
    return w, x


def exact_reference(w, qtype, x):
    W = kernels.dequantize(w, qtype).astype(np.float64)  # (N, K) exact
    x64 = x.astype(np.float64)
    return x64 @ W.T, np.abs(x64) @ np.abs(W).T  # (T, N) value and Σ|w·x|


@pytest.mark.parametrize("path", ["numba", "numpy"])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_matches_float64_reference(qtype, path):
    w, x = problem(qtype, 0)
    for T in range(1, 10):
        y = kernels.matmul(w, qtype, x[:T], path=path)
        assert y.shape == (T, N) and y.dtype == np.float32
        ref, mag = exact_reference(w, qtype, x[:T])
        # one float32 rounding of the result + float64 summation error (K * 2**-53 relative)
        tol = np.abs(ref) * 2.0**-24 + mag * K * 2.0**-52
        err = np.abs(y.astype(np.float64) - ref)
        assert (err <= tol).all(), f"T={T}: worst {np.max(err / mag):.3g} of Σ|w·x|"


def assert_same_bits(got, want, what):
    """Equal bit for bit, NaN matching NaN (which NaN is not defined: kernels/matmul.py)."""
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), f"{what}: NaN in other places"
    bad = (got.view(np.uint32) != want.view(np.uint32)) & ~nan
    assert not bad.any(), f"{what}: {bad.sum()} outputs differ, first at {np.argwhere(bad)[0]}"


@pytest.mark.parametrize("scales", ["normal", "extreme", "raw"])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_numba_and_numpy_paths_give_the_same_bits(qtype, scales):
    """The numpy path is the definition; the numba path (lanes and the scalar tail) gives its bits, for
    T = 1 … 9 (narrow, padded and wide lane paths), with zeros, a −0 row and non-finite weights."""
    rng = np.random.default_rng([int(qtype), 1])
    w = random_rows(qtype, N, K, rng, scales=scales)
    x = rng.standard_normal((9, K)).astype(np.float32)
    x[0, :7] = 0.0
    x[1, 3] = np.float32(1e-30)
    x[2] = -0.0  # every product ±0: the sum is +0.0 (it starts there)
    with np.errstate(all="ignore"):
        for T in (1, 2, 3, 4, 9):
            y_np = kernels.matmul(w, qtype, x[:T], path="numpy")
            assert_same_bits(kernels.matmul(w, qtype, x[:T], path="numba"), y_np, f"T={T}")
            assert_same_bits(kernels.matmul(kernels.pack(w, qtype), qtype, x[:T]), y_np, f"packed, T={T}")
    zeros = y_np[2][~np.isnan(y_np[2])]  # (a NaN or inf weight makes a NaN product)
    assert (zeros == 0).all() and not np.signbit(zeros).any()


@pytest.mark.parametrize("path", ["numba", "numpy"])
def test_the_sum_runs_in_increasing_column_order_from_plus_zero(path):
    """Designed rows whose float64 sum depends on the order: 2^60, then 1 (lost: 2^60 + 1 rounds to
    2^60), then −2^60 eight columns later gives 0 in column order, 1 in numpy's pairwise ``np.sum``
    (eight running sums, the 1 in another one than 2^60); a row of −0 products is +0."""
    w = np.zeros((3, 16), np.float32)  # F32 weights [N, K]
    x = np.zeros((1, 16), np.float32)
    w[0, [0, 1, 8]] = [2.0**30, 1.0, -(2.0**30)]
    w[1, [0, 8, 9]] = [2.0**30, -(2.0**30), 1.0]  # the 1 after −2^60: 1 in either order
    w[2] = 1.0  # with x = −0 everywhere: every product −0
    x[0, [0, 1, 8, 9]] = [2.0**30, 1.0, 2.0**30, 1.0]
    y = kernels.matmul(w, QT.F32, x, path=path)  # [1, 3]
    assert y[0, 0] == 0.0 and y[0, 1] == 1.0
    assert np.sum(w[0].astype(np.float64) * x[0]) == 1.0  # what the pairwise sum would have given
    x[0] = -0.0
    y = kernels.matmul(w, QT.F32, x, path=path)
    assert y.view(np.uint32).tolist() == [[0, 0, 0]]  # +0.0, not −0.0


@pytest.mark.parametrize("path", ["numba", "numpy"])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_batch_rows_equal_single_rows_bit_for_bit(qtype, path):
    w, x = problem(qtype, 2, T=7)
    batch = kernels.matmul(w, qtype, x, path=path)
    singles = np.stack([kernels.matmul(w, qtype, x[t], path=path) for t in range(7)])
    np.testing.assert_array_equal(batch.view(np.uint32), singles.view(np.uint32))


@pytest.mark.parametrize("act_quant", [False, True], ids=["plain", "act_quant"])
@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.MXFP4, QT.BF16, QT.F32], ids=lambda q: q.name)
def test_thread_count_does_not_change_results(qtype, act_quant):
    """1 and 2 numba threads give the same bits, on a product big enough for the parallel kernels (at least
    flags.SERIAL_BELOW multiply-adds; below it every kernel runs on the calling thread whatever the count)."""
    from kernels.base.flags import SERIAL_BELOW

    w, x = problem(qtype, 3, n_rows=131, T=5)  # 8 groups of 16 rows and a tail of 3
    assert 131 * x.shape[0] * x.shape[1] >= SERIAL_BELOW
    saved = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = kernels.matmul(w, qtype, x, act_quant=act_quant)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = kernels.matmul(w, qtype, x, act_quant=act_quant)
    finally:
        numba.set_num_threads(saved)
    np.testing.assert_array_equal(one.view(np.uint32), two.view(np.uint32))


def test_many_rows_and_a_long_batch():
    w, _ = problem(QT.Q4_K, 4, n_rows=130)
    x = np.random.default_rng(5).standard_normal((33, K)).astype(np.float32)
    y = kernels.matmul(w, QT.Q4_K, x)
    ref, mag = exact_reference(w, QT.Q4_K, x)
    assert (np.abs(y - ref) <= np.abs(ref) * 2.0**-24 + mag * 1e-12).all()


# --------------------------------------------------------------------------------------------
# Input forms


def test_vector_and_leading_shapes():
    w, x = problem(QT.Q8_0, 6, T=6)
    y = kernels.matmul(w, QT.Q8_0, x)
    np.testing.assert_array_equal(kernels.matmul(w, QT.Q8_0, x[2]), y[2])  # (K,) -> (N,)
    np.testing.assert_array_equal(kernels.matmul(w, QT.Q8_0, x.reshape(2, 3, K)), y.reshape(2, 3, N))
    assert kernels.matmul(w, QT.Q8_0, x[:0]).shape == (0, N)


def test_expert_slice_is_used_without_copy():
    rng = np.random.default_rng(7)
    experts = random_rows(QT.Q4_K, 4 * 24, K, rng).reshape(4, 24, -1)  # (X, rows, bytes)
    x = rng.standard_normal((3, K)).astype(np.float32)
    view, _ = as_row_bytes(experts[2], QT.Q4_K)
    assert np.shares_memory(view, experts)
    np.testing.assert_array_equal(kernels.matmul(experts[2], QT.Q4_K, x), kernels.matmul(experts[2].copy(), QT.Q4_K, x))


def test_f32_and_f16_weights_as_floats_or_bytes():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    for qtype, w in ((QT.F32, rng.standard_normal((5, 64)).astype(np.float32)), (QT.F16, rng.standard_normal((5, 64)).astype(np.float16))):
        y = kernels.matmul(w, qtype, x)
        np.testing.assert_array_equal(y, kernels.matmul(w.view(np.uint8), qtype, x))
        ref = (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.float32)
        np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)


def test_weights_from_a_gguf_file(tmp_path):
    """What GGUFReader hands out (memmap views, 3-D expert tensors) goes straight in."""
    from gguf import GGUFReader, GGUFWriter

    rng = np.random.default_rng(9)
    q8 = random_rows(QT.Q8_0, 16, 64, rng)
    exps = random_rows(QT.MXFP4, 3 * 8, 64, rng).reshape(3, 8, -1)
    writer = GGUFWriter(tmp_path / "t.gguf", "test")
    writer.add_tensor("q8", q8, raw_dtype=QT.Q8_0)
    writer.add_tensor("exps", exps, raw_dtype=QT.MXFP4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensors = {t.name: t for t in GGUFReader(tmp_path / "t.gguf").tensors}
    x = rng.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_array_equal(kernels.matmul(tensors["q8"].data, QT.Q8_0, x), kernels.matmul(q8, QT.Q8_0, x))
    np.testing.assert_array_equal(kernels.matmul(tensors["exps"].data[1], QT.MXFP4, x), kernels.matmul(exps[1], QT.MXFP4, x))


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.MXFP4, QT.Q6_K, QT.Q8_0, QT.F16], ids=lambda q: q.name)
def test_matmul_experts_equals_expert_by_expert(qtype):
    """``matmul_experts`` (a decoded token's experts, ``ggml_mul_mat_id``) gives every expert's row the bits
    of ``matmul`` on that expert alone: a packed stack in one kernel call, a raw stack expert by expert;
    all rows, and a fused gate_up stack's halves (rows 32…63 of 64)."""
    rng = np.random.default_rng([int(qtype), 21])
    stack = random_rows(qtype, 6 * 64, K, rng).reshape(6, 64, -1)  # (X, rows, bytes)
    packed = kernels.pack(stack, qtype)
    assert isinstance(packed, kernels.PackedRows) and packed.ndim == 3
    ids = np.array([4, 0, 5, 2])
    x = rng.standard_normal((len(ids), K)).astype(np.float32)
    x[1, :9] = 0.0
    for rows in (None, (0, 32), (32, 64), (16, 48)):
        r0, r1 = rows or (0, 64)
        want = np.concatenate([kernels.matmul(stack[e][r0:r1], qtype, x[i : i + 1]) for i, e in enumerate(ids)])
        for w in (packed, stack):
            got = kernels.matmul_experts(w, qtype, ids, x, rows)
            assert got.dtype == np.float32 and got.shape == (len(ids), r1 - r0)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (type(w).__name__, rows)
    with pytest.raises(ValueError, match="one row per id"):
        kernels.matmul_experts(packed, qtype, ids, x[:2])
    with pytest.raises(ValueError, match=r"expert ids must be in \[0, 6\)"):
        kernels.matmul_experts(packed, qtype, np.array([0, 6, 1, 2]), x)


def test_a_decoded_token_multiplies_its_experts_in_one_call(make_fixture, monkeypatch):
    """``refimpl.model.moe`` sends a decoded token's K experts through ``kernels.matmul_experts`` (gate, up, down:
    three calls) and a batch expert by expert; both give the batch's rows the same bits."""
    from refimpl.model import moe
    from refimpl.model.trunk import forward, load_model
    from refimpl.model.ops import Ctx
    from refimpl.model.state import SeqState

    model = load_model(make_fixture("tiny", "q4_k_m"), pack=True)
    stacks = [layer.ffn.experts.stacked(which)[0].raw for layer in model.weights.layers for which in ("gate", "up", "down")]
    assert all(isinstance(m, kernels.PackedRows) and m.ndim == 3 for m in stacks)  # the one-call kernel runs
    calls = []
    real = kernels.matmul_experts
    monkeypatch.setattr(moe.kernels, "matmul_experts", lambda *a, **k: calls.append(1) or real(*a, **k))
    tokens = [5, 17, 99, 3]
    batch, _, _ = forward(model, SeqState.fresh(model.config), tokens, Ctx())
    assert not calls
    state, rows = SeqState.fresh(model.config), []
    for t in tokens:
        logits, _, state = forward(model, state, [t], Ctx())
        rows.append(logits[-1])
    assert len(calls) == 3 * model.config.n_layer * len(tokens)  # gate, up, down per layer and token
    assert np.array_equal(np.stack(rows).view(np.uint32), batch.view(np.uint32))


# --------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda w, x: kernels.matmul(w, QT.Q8_0, x.astype(np.float64)), "x must be float32, got float64"),
        (lambda w, x: kernels.matmul(w, QT.Q8_0, x[:, :32]), r"does not end in K=64"),
        (lambda w, x: kernels.matmul(w[0], QT.Q8_0, x), "must be 2-D"),
        (lambda w, x: kernels.matmul(w.astype(np.float32), QT.Q8_0, x), "must be uint8, got float32"),
        (lambda w, x: kernels.matmul(w[:, :-1], QT.Q8_0, x), "not a multiple of the 34-byte block"),
        (lambda w, x: kernels.matmul(w, QT.NVFP4, x), "unsupported ggml type NVFP4"),
        (lambda w, x: kernels.matmul(w, QT.Q8_K, x), "Q8_K is an activation-only format"),
        (lambda w, x: kernels.matmul(w, QT.Q8_0, x, path="blas"), "path must be 'numba' or 'numpy'"),
        (lambda w, x: kernels.matmul(w, QT.Q8_0, x, path="numpy", act_quant=True), "numba path only"),
    ],
    ids=["x-dtype", "K-mismatch", "w-1d", "w-dtype", "w-row-bytes", "unsupported", "activation-type", "path", "numpy-act-quant"],
)
def test_errors_are_one_line_value_errors(call, message):
    w = np.zeros((3, 68), np.uint8)  # 3 rows of 64 Q8_0 values
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(ValueError, match=message) as info:
        call(w, x)
    assert "\n" not in str(info.value)


def test_interpreted_kernels_give_the_same_bits(tmp_path):
    """flags.py promises the kernel code means the same under NUMBA_DISABLE_JIT=1 (plain Python)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "run.py"
    script.write_text(
        "import sys, numpy as np, kernels\n"
        "from kernels.testing import random_rows\n"
        "out = {}\n"
        "for qt in kernels.WEIGHT_TYPES:\n"
        "    rng = np.random.default_rng(int(qt))\n"
        "    w = random_rows(qt, 3, 256, rng, scales='extreme')\n"
        "    x = rng.standard_normal((2, 256)).astype(np.float32)\n"
        "    out[qt.name + '_deq'] = kernels.dequantize(w, qt)\n"
        "    out[qt.name + '_mm'] = kernels.matmul(w, qt, x)\n"
        "    out[qt.name + '_aq'] = kernels.matmul(w, qt, x, act_quant=True)\n"
        "np.savez(sys.argv[1], **out)\n"
    )
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", PYTHONPATH=str(root))
    subprocess.run([sys.executable, str(script), str(tmp_path / "py.npz")], env=env, check=True, cwd=root)
    interpreted = np.load(tmp_path / "py.npz")
    for qt in TYPES:
        rng = np.random.default_rng(int(qt))
        w = random_rows(qt, 3, 256, rng, scales="extreme")
        x = rng.standard_normal((2, 256)).astype(np.float32)
        for key, got in (
            ("deq", kernels.dequantize(w, qt)),
            ("mm", kernels.matmul(w, qt, x)),
            ("aq", kernels.matmul(w, qt, x, act_quant=True)),
        ):
            want = interpreted[f"{qt.name}_{key}"]
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=f"{qt.name} {key}")
