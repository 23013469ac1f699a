"""--emulate in every llama.cpp CPU configuration: F16/F32 K/V cache × flash attention on/off ×
one token per decode or batched, against llama.cpp itself.

Verdicts do not depend on the CPU: a comparison requires float noise except where the emulation
itself reports that a float-noise-sized difference can flip a rounding (an F16 accumulator value
within a few float32 ulps of an F16 tie, kernels/flashattn.py), and there it allows that one step.

* kernel level: ``kernels.flash_attn_f16`` and ``attention.attend`` against libggml's own
  ``ggml_flash_attn_ext`` (vector, split-KV and tiled paths) on random inputs;
* layer level: llama.cpp's captured Qcur/Kcur/Vcur of the tiny fixtures fed to ``attend`` must give
  its ``attn_pregate``, and llama.cpp's captured matmul inputs its outputs, in every configuration;
* end to end: f32 fixtures ≤ 1e-4 relative and the same greedy stream in every configuration.
"""

import ctypes
import os
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import require_llama_cpp

import kernels
from refimpl.attention import attend
from refimpl.ops import Ctx, to_f16
from refimpl.state import KVCache

NOISE = 2e-6  # float32 accumulation-order noise, relative to max |output|
TIE_ULPS = 4  # "near an F16 tie": within 4·(1 + |s| + |M|) float32 ulps of a rounding midpoint (kernels/flashattn.py)
F16_STEP = 2.0**-10  # one F16 step, relative to the accumulated value


def host_has_amx() -> bool:
    """llama.cpp built with AMX puts Q8_0/K-quant matrices in its AMX layout; on a VM without AMX tile
    state its batched kernel dies with SIGILL (docs/numerics.md), so batched runs there turn the extra
    buffer types (repack) off — which changes no rounding point on x86."""
    try:
        with open("/proc/cpuinfo") as f:
            return "amx_int8" in f.read()
    except OSError:
        return False


# ---- libggml's flash attention through ctypes -------------------------------------------------

GGML_F32, GGML_F16, GGML_PREC_F32 = 0, 1, 10


class _InitParams(ctypes.Structure):  # ggml.h: struct ggml_init_params
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@pytest.fixture(scope="module")
def ggml_fa():
    llama_cpp = require_llama_cpp()
    libdir = os.environ.get("LLAMA_CPP_LIB_PATH") or os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    vp, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    for fn, res, args in [
        (base.ggml_init, vp, [_InitParams]),
        (base.ggml_new_tensor_4d, vp, [vp, ctypes.c_int, i64, i64, i64, i64]),
        (base.ggml_flash_attn_ext, vp, [vp, vp, vp, vp, vp, f32, f32, f32]),
        (base.ggml_flash_attn_ext_set_prec, None, [vp, ctypes.c_int]),
        (base.ggml_new_graph, vp, [vp]),
        (base.ggml_build_forward_expand, None, [vp, vp]),
        (base.ggml_get_data, vp, [vp]),
        (base.ggml_free, None, [vp]),
        (cpu.ggml_graph_compute_with_ctx, ctypes.c_int, [vp, vp, ctypes.c_int]),
        (cpu.ggml_cpu_init, None, []),
    ]:
        fn.restype, fn.argtypes = res, args
    cpu.ggml_cpu_init()

    def flash_attn(q, k16, v16, visible, scale, n_threads):
        """ggml_flash_attn_ext(q F32 [D, T, H], k, v F16 [D, n, Hkv], mask F16 [n, T]) -> [T, H, D]."""
        T, H, D = q.shape
        n, Hkv, _ = k16.shape
        mask = np.where(visible, np.float16(0), np.float16(-np.inf)).astype(np.float16)  # [T, n]
        arrays = [np.ascontiguousarray(q.transpose(1, 0, 2), dtype=np.float32),  # ggml [D, T, H] = numpy [H, T, D]
                  np.ascontiguousarray(k16.transpose(1, 0, 2), dtype=np.float16),
                  np.ascontiguousarray(v16.transpose(1, 0, 2), dtype=np.float16), mask]
        ctx = base.ggml_init(_InitParams(sum(a.nbytes for a in arrays) + 4 * T * H * D + (64 << 20), None, False))
        try:
            tq = base.ggml_new_tensor_4d(ctx, GGML_F32, D, T, H, 1)
            tk = base.ggml_new_tensor_4d(ctx, GGML_F16, D, n, Hkv, 1)
            tv = base.ggml_new_tensor_4d(ctx, GGML_F16, D, n, Hkv, 1)
            tm = base.ggml_new_tensor_4d(ctx, GGML_F16, n, T, 1, 1)
            for t, a in zip((tq, tk, tv, tm), arrays):
                ctypes.memmove(base.ggml_get_data(t), a.ctypes.data, a.nbytes)
            out = base.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, scale, 0.0, 0.0)
            base.ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32)  # as build_attn_mha asks
            graph = base.ggml_new_graph(ctx)
            base.ggml_build_forward_expand(graph, out)
            assert cpu.ggml_graph_compute_with_ctx(ctx, graph, n_threads) == 0
            res = np.ctypeslib.as_array(ctypes.cast(base.ggml_get_data(out), ctypes.POINTER(ctypes.c_float)), shape=(T * H * D,))
            return res.copy().reshape(T, H, D)  # ggml [D, H, T]
        finally:
            base.ggml_free(ctx)

    return flash_attn


def _random_attention(rng, T, n, H=4, Hkv=2, D=64, causal=True):
    q = (rng.standard_normal((T, H, D)) * 1.5).astype(np.float32)
    k = to_f16(rng.standard_normal((n, Hkv, D)).astype(np.float32))
    v = to_f16(rng.standard_normal((n, Hkv, D)).astype(np.float32))
    positions = np.arange(n - T, n, dtype=np.int32)  # the T newest cells are the queries
    visible = (np.arange(n)[None, :] <= positions[:, None]) if causal else np.ones((T, n), bool)
    return q, k, v, positions, visible


def assert_noise_or_tie(ours, theirs, near, what):
    """Every element at float noise, or — where the emulation saw an F16 rounding within TIE_ULPS of
    a tie — within one F16 step per such rounding."""
    scale = np.abs(theirs).max()
    err = np.abs(ours - theirs) / scale
    off = err > NOISE
    assert not np.any(off & (near == 0)), (
        f"{what}: {int(np.sum(off & (near == 0)))} elements off by up to {err[near == 0].max():.2g} with no F16 tie nearby")
    bound = near * F16_STEP * np.abs(theirs) / scale + NOISE
    assert np.all(err <= bound * 1.01), f"{what}: a near-tie element off by more than one F16 step per tie"
    return int(off.sum())


@pytest.mark.oracle
@pytest.mark.parametrize("T, n, n_threads", [(1, 1, 2), (1, 37, 2), (5, 40, 2), (8, 300, 2), (1, 600, 2), (1, 700, 3)])
def test_flash_attn_vector_path_reproduces_ggml(ggml_fa, T, n, n_threads):
    """The vector path (F16 Q, F16 accumulator, libm expf), and its split-KV form (one query row over
    >= 512 cells, chunked by ggml's thread count)."""
    rng = np.random.default_rng(T * 1000 + n)
    q, k, v, positions, visible = _random_attention(rng, T, n)
    chunk = -(-n // n_threads) if (T == 1 and n >= 512) else 0
    ours, near = kernels.flash_attn_f16(q, k, v, visible, 0.125, chunk, tie_ulps=TIE_ULPS)
    theirs = ggml_fa(q, k, v, visible, 0.125, n_threads)
    flipped = assert_noise_or_tie(ours, theirs, near, f"T={T} n={n}")
    assert flipped <= 0.01 * ours.size  # crossings are rare; a systematic error is not
    # and it is not the plain softmax: the F16 accumulator is a real rounding point
    plain = attend(q, KVCache(k, v, np.arange(n, dtype=np.int32)), positions, SimpleNamespace(n_ctx_train=4096), Ctx())
    if n > 1:
        assert np.abs(plain - theirs).max() > 10 * NOISE * np.abs(theirs).max()


@pytest.mark.oracle
def test_flash_attn_tiled_path_reproduces_ggml(ggml_fa):
    """>= 64 query rows in a ubatch: the tiled path, all float32 — attend() with nothing rounded."""
    rng = np.random.default_rng(7)
    q, k, v, positions, visible = _random_attention(rng, 70, 90)
    c = SimpleNamespace(n_ctx_train=4096)
    ours = attend(q, KVCache(k, v, np.arange(90, dtype=np.int32)), positions, c, Ctx(flash_attn=True))
    theirs = ggml_fa(q, k, v, visible, 0.125, 2)
    assert np.abs(ours - theirs).max() <= NOISE * np.abs(theirs).max()


def test_split_kv_chunking_follows_llama_cpp():
    """n_kv = min(kv_size, max(256, pad256(cells))), split when one row and n_kv >= 512, chunk = ceil(n_kv / threads)."""
    from refimpl.attention import _split_chunk

    c = SimpleNamespace(n_ctx_train=4096)

    def cells(n):
        return KVCache(np.zeros((n, 1, 1), np.float32), np.zeros((n, 1, 1), np.float32), np.arange(n, dtype=np.int32))

    assert _split_chunk(1, cells(256), c, Ctx(flash_attn=True)) == 0  # n_kv 256
    assert _split_chunk(1, cells(257), c, Ctx(flash_attn=True, n_threads=4)) == 128  # n_kv 512
    assert _split_chunk(2, cells(600), c, Ctx(flash_attn=True)) == 0  # two query rows: no split
    assert _split_chunk(1, cells(300), c, Ctx(flash_attn=True, n_ctx=300)) == 128  # n_ctx 300 -> kv_size 512
    assert _split_chunk(1, cells(200), c, Ctx(flash_attn=True, n_ctx=256)) == 0  # kv_size 256: never 512 cells
