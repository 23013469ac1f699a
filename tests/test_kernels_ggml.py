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
def test_act_quant_matches_libggml(ggml, qtype):
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
