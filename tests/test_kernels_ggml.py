"""matmul(act_quant=True) against libggml itself (the CPU backend shipped with llama-cpp-python).

``ggml_mul_mat`` is run through ctypes on the same bytes: llama.cpp's real x86 activation
quantization and SIMD dot kernels. The emulation must agree to float32 accumulation noise
(≤ 5e-7 of Σ|w·x|; about 1e-7 is seen), while the plain mode differs by the activation rounding
(~1e-3) — the gap that act_quant exists to close.
"""

import ctypes

import numpy as np
import pytest
from ggml_lib import InitParams, load_ggml, run_graph
from gguf import GGMLQuantizationType as QT

import kernels
from kernels import activation_values
from kernels.testing import random_rows

TYPES = kernels.WEIGHT_TYPES


@pytest.fixture(scope="module")
def ggml():
    vp, i64 = ctypes.c_void_p, ctypes.c_int64
    base, cpu = load_ggml([("base", "ggml_new_tensor_2d", vp, [vp, ctypes.c_int, i64, i64]),
                           ("base", "ggml_mul_mat", vp, [vp, vp, vp])])

    def mul_mat(w_bytes: np.ndarray, qtype, x: np.ndarray) -> np.ndarray:
        """ggml_mul_mat(W, x): W ne [K, N] of ``qtype`` (our (N, row bytes)), x F32 ne [K, T]."""
        (N, _), (T, K) = w_bytes.shape, x.shape
        ctx = base.ggml_init(InitParams(w_bytes.nbytes + x.nbytes + 4 * N * T + (16 << 20), None, False))
        try:
            W = base.ggml_new_tensor_2d(ctx, int(qtype), K, N)  # ggml_type values = GGMLQuantizationType's
            X = base.ggml_new_tensor_2d(ctx, int(QT.F32), K, T)
            ctypes.memmove(base.ggml_get_data(W), w_bytes.ctypes.data, w_bytes.nbytes)
            ctypes.memmove(base.ggml_get_data(X), x.ctypes.data, x.nbytes)
            Y = base.ggml_mul_mat(ctx, W, X)
            run_graph(base, cpu, ctx, Y, 1)
            y = np.empty((T, N), np.float32)
            ctypes.memmove(y.ctypes.data, base.ggml_get_data(Y), y.nbytes)
            return y
        finally:
            base.ggml_free(ctx)

    return mul_mat


@pytest.mark.oracle
@pytest.mark.parametrize("qtype", TYPES, ids=[t.name for t in TYPES])
def test_act_quant_matches_libggml(ggml, qtype, monkeypatch):
    """The act-quant product equals libggml's within float noise; the plain one is far off (activations unquantized).
    The plain products run on the serial lane kernels (as tests/test_kernels_matmul.py's do: serial equals parallel,
    tests/test_perf_invariants.py), so this test compiles no kernel of its own for them."""
    from kernels.lanes import pack as lanes

    monkeypatch.setattr(lanes, "SERIAL_BELOW", 1 << 62)
    rng = np.random.default_rng([int(qtype), 21])
    w = random_rows(qtype, 48, 1024, rng)
    w_bytes = np.ascontiguousarray(w).view(np.uint8).reshape(48, -1)
    W = kernels.dequantize(w, qtype).astype(np.float64)
    for T in (1, 4, 9):  # a decode step, a short and a full verify batch (>= 8 rows: tiled path)
        x = rng.standard_normal((T, 1024)).astype(np.float32)
        y_ggml = ggml(w_bytes, qtype, x)
        mag = np.abs(activation_values(x, qtype)) @ np.abs(W).T
        act = np.abs(kernels.matmul(w, qtype, x, act_quant=True) - y_ggml) / mag
        plain = np.abs(kernels.matmul(w, qtype, x) - y_ggml) / mag
        assert act.max() <= 5e-7, f"T={T}: act_quant differs from libggml by {act.max():.3g} of Σ|w·x|"
        if qtype != QT.F32:  # F32 takes the activations unchanged: nothing to close
            assert plain.max() > 20 * act.max(), f"T={T}: plain {plain.max():.3g} vs act_quant {act.max():.3g}"


class _CpuTraits(ctypes.Structure):  # ggml-cpu.h: struct ggml_type_traits_cpu
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p), ("vec_dot_type", ctypes.c_int),
                ("nrows", ctypes.c_int64)]


@pytest.mark.oracle
def test_activation_quantizers_match_libggml_on_non_finite_and_tiny_blocks():
    """kernels.quantize_q8_0 / _q8_1 / _q8_K bit for bit against libggml's own ``from_float`` (the x86
    ``quantize_row_q8_0`` / ``_q8_1``, ``quantize_row_q8_K_ref``) on blocks holding NaN, ±inf and
    huge values, and on blocks whose max |x| is so small that 127/max overflows: ``_mm256_max_ps``
    keeps or skips a NaN by its position, ``cvtps_epi32`` gives INT_MIN (then −128) for NaN, inf and
    out-of-range values, Q8_K's ``nearest_int`` reads a NaN's bits (docs/numerics.md, "Non-finite weights")."""
    _, cpu = load_ggml([("cpu", "ggml_get_type_traits_cpu", ctypes.POINTER(_CpuTraits), [ctypes.c_int])])
    from_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    quantizers = {t: from_float(cpu.ggml_get_type_traits_cpu(int(t)).contents.from_float) for t in (QT.Q8_0, QT.Q8_1, QT.Q8_K)}

    def c_blocks(qtype, x):
        out = np.zeros(x.size // 256 * {QT.Q8_0: 8 * 34, QT.Q8_1: 8 * 36, QT.Q8_K: 292}[qtype], np.uint8)
        quantizers[qtype](x.ctypes.data, out.ctypes.data, x.size)
        return out

    def same(a, b):  # float fields compared with NaN equal to NaN
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)

    rng = np.random.default_rng(27)
    for trial in range(600):
        x = (rng.standard_normal(256) * rng.choice([1e-40, 1e-38, 1e-3, 1.0, 100.0, 1e30])).astype(np.float32)
        at = rng.integers(0, 256, rng.integers(0, 6))
        x[at] = rng.choice(np.array([np.nan, -np.nan, np.inf, -np.inf, 3e38, 0.0], np.float32), at.size)
        if trial % 7 == 0:
            x[:] = 0
            x[at] = rng.choice(np.array([np.nan, np.inf, 1e-42], np.float32), at.size)
        c = c_blocks(QT.Q8_0, x).reshape(8, 34)
        r = kernels.quantize_q8_0(x)
        assert same(c[:, :2].copy().view(np.float16).ravel(), r.d) and np.array_equal(c[:, 2:].view(np.int8), r.qs), trial
        c = c_blocks(QT.Q8_1, x).reshape(8, 36)
        r = kernels.quantize_q8_1(x)
        assert same(c[:, :2].copy().view(np.float16).ravel(), r.d) and same(c[:, 2:4].copy().view(np.float16).ravel(), r.s), trial
        assert np.array_equal(c[:, 4:].view(np.int8), r.qs), trial
        c = c_blocks(QT.Q8_K, x)
        r = kernels.quantize_q8_K(x)
        d = c[:4].view(np.float32)
        assert same(d, r.d.ravel()) and np.array_equal(c[4:260].view(np.int8), r.qs.ravel()), trial
        assert d[0] == 0 or np.array_equal(c[260:].view(np.int16), r.bsums.ravel()), trial  # bsums unset for a zero block
