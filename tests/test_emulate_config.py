"""--emulate in every llama.cpp CPU configuration: F16/F32 K/V cache × flash attention on/off ×
one token per decode or batched, against llama.cpp itself.

Verdicts do not depend on the CPU: a comparison requires float noise except where the emulation
itself reports that a float-noise-sized difference can flip a rounding (an F16 accumulator value
within a few float32 ulps of an F16 tie, kernels/ggml/flashattn.py), and there it allows that one step.

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
from ggml_lib import InitParams, load_ggml, run_graph

import kernels
from refimpl.model.attention import attend
from refimpl.model.ops import Ctx, to_f16
from refimpl.model.state import KVCache

NOISE = 2e-6  # float32 accumulation-order noise, relative to max |output|
TIE_ULPS = 4  # "near an F16 tie": within 4·(1 + |s| + |M|) float32 ulps of a rounding midpoint (kernels/ggml/flashattn.py)
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


@pytest.fixture(scope="module")
def ggml_fa():
    vp, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    base, cpu = load_ggml([("base", "ggml_new_tensor_4d", vp, [vp, ctypes.c_int, i64, i64, i64, i64]),
                           ("base", "ggml_flash_attn_ext", vp, [vp, vp, vp, vp, vp, f32, f32, f32]),
                           ("base", "ggml_flash_attn_ext_set_prec", None, [vp, ctypes.c_int])])

    def flash_attn(q, k16, v16, visible, scale, n_threads):
        """ggml_flash_attn_ext(q F32 [D, T, H], k, v F16 [D, n, Hkv], mask F16 [n, T]) -> [T, H, D]."""
        T, H, D = q.shape
        n, Hkv, _ = k16.shape
        mask = np.where(visible, np.float16(0), np.float16(-np.inf)).astype(np.float16)  # [T, n]
        arrays = [np.ascontiguousarray(q.transpose(1, 0, 2), dtype=np.float32),  # ggml [D, T, H] = numpy [H, T, D]
                  np.ascontiguousarray(k16.transpose(1, 0, 2), dtype=np.float16),
                  np.ascontiguousarray(v16.transpose(1, 0, 2), dtype=np.float16), mask]
        ctx = base.ggml_init(InitParams(sum(a.nbytes for a in arrays) + 4 * T * H * D + (64 << 20), None, False))
        try:
            tq = base.ggml_new_tensor_4d(ctx, GGML_F32, D, T, H, 1)
            tk = base.ggml_new_tensor_4d(ctx, GGML_F16, D, n, Hkv, 1)
            tv = base.ggml_new_tensor_4d(ctx, GGML_F16, D, n, Hkv, 1)
            tm = base.ggml_new_tensor_4d(ctx, GGML_F16, n, T, 1, 1)
            for t, a in zip((tq, tk, tv, tm), arrays):
                ctypes.memmove(base.ggml_get_data(t), a.ctypes.data, a.nbytes)
            out = base.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, scale, 0.0, 0.0)
            base.ggml_flash_attn_ext_set_prec(out, GGML_PREC_F32)  # as build_attn_mha asks
            run_graph(base, cpu, ctx, out, n_threads)
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
    from refimpl.model.attention import _split_chunk

    c = SimpleNamespace(n_ctx_train=4096)

    def cells(n):
        return KVCache(np.zeros((n, 1, 1), np.float32), np.zeros((n, 1, 1), np.float32), np.arange(n, dtype=np.int32))

    assert _split_chunk(1, cells(256), c, Ctx(flash_attn=True)) == 0  # n_kv 256
    assert _split_chunk(1, cells(257), c, Ctx(flash_attn=True, n_threads=4)) == 128  # n_kv 512
    assert _split_chunk(2, cells(600), c, Ctx(flash_attn=True)) == 0  # two query rows: no split
    assert _split_chunk(1, cells(300), c, Ctx(flash_attn=True, n_ctx=300)) == 128  # n_ctx 300 -> kv_size 512
    assert _split_chunk(1, cells(200), c, Ctx(flash_attn=True, n_ctx=256)) == 0  # kv_size 256: never 512 cells


@pytest.mark.oracle
def test_flash_attn_vector_path_accumulates_in_f16(ggml_fa):
    """docs/numerics.md: llama.cpp asks ggml_flash_attn_ext for F32 precision (GGML_PREC_F32), yet with
    an F16 V its CPU vector path accumulates P·V in F16 — far from the exact product, unlike its own
    tiled path on the same inputs. The emulation reproduces both."""
    rng = np.random.default_rng(500)
    q, k, v, positions, visible = _random_attention(rng, 1, 500)
    theirs = ggml_fa(q, k, v, visible, 0.125, 1)
    qf = to_f16(q).astype(np.float64)  # the vector path's Q rounding is not the point here: keep it
    exact = np.empty_like(theirs, dtype=np.float64)  # float64 softmax(q16·k)·v over the same F16 K, V
    for h in range(4):
        sc = k[:, h // 2].astype(np.float64) @ qf[0, h] * 0.125
        p = np.exp(sc - sc.max())
        exact[0, h] = (p / p.sum()) @ v[:, h // 2].astype(np.float64)
    err = np.abs(theirs - exact).max() / np.abs(exact).max()
    assert err > 1e-3  # measured 5.0e-3: ~8 bits, not float32's 24
    ours = kernels.flash_attn_f16(q, k, v, visible, 0.125)
    assert np.abs(ours - theirs).max() <= 2e-5 * np.abs(exact).max()  # a few F16 crossings at most


# ---- the tiny fixtures in every configuration ---------------------------------------------------

CONFIGS = [("f32", "off"), ("f16", "off"), ("f16", "on"), ("f32", "on")]  # (K/V type, flash attention)
MIXES = ["f32", "bf16", "q8_0", "q4_k_m", "mxfp4", "llama-MXFP4_MOE", "llama-Q8_0"]
LLAMA_FTYPES = {"llama-MXFP4_MOE": 38, "llama-Q8_0": 7}  # LLAMA_FTYPE_MOSTLY_*: made by llama_model_quantize
N_TOKENS = 40


@pytest.fixture(scope="module")
def fixture_file(make_fixture, tmp_path_factory):
    """A tiny fixture: ours (``q8_0`` …) or made by llama.cpp's own quantizer from the f32 one."""
    made = {}

    def get(mix):
        if mix not in LLAMA_FTYPES:
            return make_fixture("tiny", mix)
        if mix not in made:
            require_llama_cpp()
            from llama_ref import quantize_with_llama

            made[mix] = quantize_with_llama(make_fixture("tiny", "f32"), tmp_path_factory.mktemp("llq") / f"{mix}.gguf", LLAMA_FTYPES[mix])
        return made[mix]

    return get


def _tokens(n=N_TOKENS, seed=11):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 390, size=n)]


def _trace(path, names, kv, fa, batch, tokens=None):
    """llama.cpp on ``tokens`` with K/V type ``kv``, flash attention ``fa``, ``batch`` tokens per decode."""
    from llama_trace import llama_trace

    n_ubatch = max(8, batch)
    return llama_trace(path, tokens or _tokens(), names, type_k=kv, type_v=kv, flash_attn=fa, n_batch=batch,
                       n_ubatch=n_ubatch, repack=not (batch > 1 and host_has_amx()))


def near_f16_tie(x: np.ndarray, ulps: float) -> np.ndarray:
    """Vectorised kernels.ggml.flashattn._near_f16_tie: |x| within ``ulps`` float32 ulps of an F16 midpoint."""
    a = np.abs(x.astype(np.float64))
    e = np.frexp(a)[1]
    q16 = np.ldexp(1.0, np.maximum(e - 11, -24))
    q32 = np.ldexp(1.0, np.maximum(e - 24, -149))
    mid = (np.floor(a / q16) + 0.5) * q16
    return (a > 0) & (np.abs(a - mid) <= ulps * q32)


def _attention_layer_local(path, kv, fa, batch, c):
    """llama.cpp's Qcur/Kcur/Vcur of the attention layer fed to refimpl's attention, against its
    attn_pregate. Returns (ours, theirs, near) with near > 0 where a rounding may flip."""
    il = c.is_recurrent.index(False)
    names = [f"Qcur-{il}", f"Kcur-{il}", f"Vcur-{il}", f"attn_pregate-{il}"]
    tokens = _tokens(max(N_TOKENS, batch))
    n = len(tokens)
    th = _trace(path, names, kv, fa, batch, tokens)
    H, Hkv, D = c.n_head, c.n_head_kv, c.head_dim
    q = th[names[0]].reshape(n, H, D)
    k, v = th[names[1]].reshape(n, Hkv, D), th[names[2]].reshape(n, Hkv, D)
    if kv == "f16" or fa == "on":
        k, v = to_f16(k), to_f16(v)
    theirs = th[names[3]].reshape(n, H, D)
    ours = np.empty_like(theirs)
    near = np.zeros(theirs.shape, np.int32)
    ctx = Ctx(kv_f16=kv == "f16", flash_attn=fa == "on", n_ubatch=max(8, batch))
    pos = np.arange(n, dtype=np.int32)
    for s in range(0, n, batch):
        e = min(n, s + batch)
        cache = KVCache(k[:e], v[:e], pos[:e])
        visible = pos[None, :e] <= pos[s:e, None]
        if fa == "on" and e - s < 64:  # the vector path, with its near-tie count
            ours[s:e], near[s:e] = kernels.flash_attn_f16(q[s:e], k[:e], v[:e], visible, 1 / np.sqrt(D), tie_ulps=TIE_ULPS)
            continue
        ours[s:e] = attend(q[s:e], cache, pos[s:e], c, ctx)
        if fa == "off" and kv == "f16":  # P rounded to F16: a probability near an F16 tie may flip
            for t in range(s, e):
                sc = np.einsum("nkd,kgd->kgn", k[: t + 1].astype(np.float64), to_f16(q[t]).reshape(Hkv, H // Hkv, D).astype(np.float64))
                p = np.exp(sc / np.sqrt(D) - sc.max(-1, keepdims=True) / np.sqrt(D)).astype(np.float32)
                p /= p.sum(-1, keepdims=True)
                flips = near_f16_tie(p, 8).sum(-1).reshape(H)  # probabilities float32-noisy by a few ulps
                near[t] += flips[:, None]
    return ours, theirs, near


ATTN_CASES = [(kv, fa, b) for kv, fa in CONFIGS for b in (1, 4, 70) if b < 64 or fa == "on"]  # 70 rows: the tiled path


@pytest.mark.oracle
@pytest.mark.parametrize("kv, fa, batch", ATTN_CASES, ids=[f"kv_{k}-fa_{f}-{b}" for k, f, b in ATTN_CASES])
def test_attention_layer_reproduces_llama_cpp_from_its_own_input(fixture_file, kv, fa, batch):
    """Every configuration's attention (non-flash F32 / F16, flash vector path, flash tiled path for
    a 70-token prompt ubatch) fed llama.cpp's own Q, K, V gives its output: float noise, or one F16
    step where the emulation saw an F16 rounding within float noise of a tie."""
    require_llama_cpp()
    from refimpl.model.trunk import load_model

    path = fixture_file("llama-Q8_0")
    c = load_model(path, progress=False).config
    ours, theirs, near = _attention_layer_local(path, kv, fa, batch, c)
    scale = np.abs(theirs).max()
    err = np.abs(ours - theirs) / scale
    off = err > NOISE
    assert not np.any(off & (near == 0)), f"{int(np.sum(off & (near == 0)))} elements off by up to {err[near == 0].max():.2g} with no tie nearby"
    assert off.mean() <= 0.01, f"{off.mean():.1%} of the elements off: not rare crossings"
    assert err.max() <= 4 * F16_STEP * np.abs(theirs).max() / scale  # a flip is one F16 step of one element


@pytest.mark.oracle
@pytest.mark.parametrize("batch", [1, 4, 24], ids=["fused_gdn_ar", "fused_gdn_ch-4", "fused_gdn_ch-24"])
def test_gated_delta_net_op_reproduces_llama_cpp_from_its_own_input(fixture_file, batch):
    """llama.cpp always runs the fused Gated DeltaNet op (cparams.fused_gdn_ar/ch are hard-wired on):
    one token (``fused_gdn_ar``) or a whole ubatch (``fused_gdn_ch``), the same token-by-token
    recurrence. Fed its own q, k, v, gate, beta and the state at the ubatch's start, refimpl's delta
    rule gives its output to float noise (everything is float32; no rounding point to cross)."""
    require_llama_cpp()
    from refimpl.model.deltanet import delta_rule_step
    from refimpl.model.trunk import load_model

    path = fixture_file("llama-Q8_0")
    c = load_model(path, progress=False).config
    Hk, Hv, S = c.ssm_n_group, c.ssm_dt_rank, c.ssm_d_state
    names = [f"{n}-0" for n in ("q_conv_predelta", "k_conv_predelta", "v_conv_predelta", "gate", "beta_sigmoid",
                                "state_predelta", "attn_output")]
    tokens = _tokens(48)
    th = _trace(path, names, "f16", "on", batch, tokens)
    n = len(tokens)
    q, k = th[names[0]].reshape(n, Hk, S), th[names[1]].reshape(n, Hk, S)
    v, g, beta = th[names[2]].reshape(n, Hv, S), th[names[3]].reshape(n, Hv), th[names[4]].reshape(n, Hv)
    theirs = th[names[6]].reshape(n, Hv, S)
    head = np.arange(Hv) % Hk
    ours = np.empty_like(theirs)
    for s in range(0, n, batch):  # the state is captured once per ubatch (n_ubatch >= batch here)
        M = (th[names[5]][s] if batch == 1 else th[f"{names[5]}@{s}"]).reshape(Hv, S, S)  # [Hv, S_v, S_k]: ggml's [S_k, S_v, H] memory
        for t in range(s, min(n, s + batch)):
            ours[t], M = delta_rule_step(M, q[t, head], k[t, head], v[t], np.exp(g[t]), beta[t], np.float32(1) / np.sqrt(np.float32(S)))
    err = np.abs(ours - theirs).max() / np.abs(theirs).max()
    assert err <= NOISE, f"relative error {err:.3g}"


MATMULS = [  # (llama.cpp output, its input, weight path): a dense matrix of each role
    ("linear_attn_qkv_mixed-0", "attn_norm-0", ("layers", 0, "mixer", "attn_qkv")),
    ("linear_attn_out-2", "final_output-2", ("layers", 2, "mixer", "ssm_out")),
    ("Qcur_full-3", "attn_norm-3", ("layers", 3, "mixer", "attn_q")),
    ("attn_output-3", "attn_gated-3", ("layers", 3, "mixer", "attn_output")),
    ("result_output", "result_norm", ("output",)),
]


@pytest.mark.oracle
@pytest.mark.parametrize("mix", MIXES)
def test_batched_matmuls_reproduce_llama_cpp_from_their_own_input(fixture_file, mix):
    """A 6-token batch runs llama.cpp's batched kernels (llamafile sgemm for
    F32/F16/BF16/Q8_0/Q4_0, the repacked gemm for Q4_K/IQ4_NL/MXFP4 on x86, AMX tiles where present):
    activations are quantized by the same quantizers as for one row, so the emulated product fed
    llama.cpp's input reproduces its output to float noise in every mix."""
    require_llama_cpp()
    from refimpl.model.trunk import load_model

    path = fixture_file(mix)
    model = load_model(path, progress=False)
    names = [n for m in MATMULS for n in m[:2]]
    for batch in (6,):  # one 4-row group (gemm / sgemm) and 2 rows left over (quantize_row + gemv)
        th = _trace(path, names, "f16", "on", batch)
        for out_name, in_name, where in MATMULS:
            W = model.weights
            for step in where:
                W = W[step] if isinstance(step, int) else getattr(W, step)
            y = kernels.matmul(W.raw, W.qtype, th[in_name].astype(np.float32), act_quant=True)
            rel = np.abs(y - th[out_name]).max() / np.abs(th[out_name]).max()
            assert rel <= NOISE, f"{mix} batch {batch} {out_name} ({W.qtype.name}): relative error {rel:.3g}"


@pytest.mark.oracle
@pytest.mark.parametrize("kv, fa", CONFIGS, ids=[f"kv_{k}-fa_{f}" for k, f in CONFIGS])
@pytest.mark.parametrize("batch", [1, 4], ids=["decode", "batch4"])
def test_f32_fixture_end_to_end_in_every_configuration(fixture_file, kv, fa, batch):
    """f32 weights (no activation quantization): llama.cpp in configuration (kv, fa), decoding
    ``batch`` tokens per call, equals refimpl with the same emulation to <= 1e-4 relative at every
    position, and its greedy stream is refimpl's. (Without the flash-attention emulation the
    flash configurations are ~1.5e-4 off at most positions: the F16 accumulator, checked alongside.)"""
    require_llama_cpp()
    from refimpl.decode.greedy import greedy
    from refimpl.model.trunk import forward, load_model
    from refimpl.model.state import SeqState

    path = fixture_file("f32")
    model = load_model(path, progress=False)
    ctx = Ctx(kv_f16=kv == "f16", flash_attn=fa == "on", n_ubatch=max(8, batch))
    prompt = _tokens(16, seed=5)
    gen = greedy(model, prompt, 24, ctx)
    tokens = prompt + gen

    def run(ctx):
        state, rows = SeqState.fresh(model.config), []
        for s in range(0, len(tokens), batch):
            logits, _, state = forward(model, state, tokens[s : s + batch], ctx)
            rows.append(logits)
        return np.concatenate(rows)

    theirs = _trace(path, [], kv, fa, batch, tokens)["logits"]
    ours = run(ctx)
    err = np.abs(ours - theirs).max(-1) / np.abs(theirs).max(-1)
    assert err.max() <= 1e-4, f"max relative logit error {err.max():.3g} at position {int(err.argmax())}"
    their_next = np.argmax(theirs[len(prompt) - 1 : -1], axis=-1)
    assert list(their_next) == gen, f"greedy streams differ from generated step {int(np.argmax(their_next != np.array(gen)))}"
    if fa == "on":  # the emulation is what makes it pass
        unemulated = run(Ctx(kv_f16=kv == "f16"))
        un_err = np.abs(unemulated - theirs).max(-1) / np.abs(theirs).max(-1)
        assert np.median(un_err) > 10 * np.median(err)  # measured ~1.5e-4 against ~3e-7


# ---- the command line ---------------------------------------------------------------------------


def test_emulation_presets():
    from refimpl.model.ops import emulation_ctx

    assert emulation_ctx("default") == Ctx(act_quant=True, kv_f16=True, flash_attn=True)
    assert emulation_ctx("plain") == Ctx(act_quant=True)  # what the older conformance tests meant by it
    assert emulation_ctx("default", flash_attn=False) == Ctx(act_quant=True, kv_f16=True)
    assert emulation_ctx(None, kv_f16=True) == Ctx(kv_f16=True)
    with pytest.raises(ValueError, match="unknown emulation"):
        emulation_ctx("fast")
    with pytest.raises(ValueError):
        Ctx(n_threads=0)


@pytest.mark.parametrize("flags, expect", [
    (["--emulate"], dict(act_quant=True, kv_f16=True, flash_attn=True)),
    (["--emulate=plain", "--kv-type", "f16"], dict(act_quant=True, kv_f16=True)),
    (["--flash-attn", "on"], dict(flash_attn=True)),
])
def test_cli_emulate_flags_select_the_configuration(make_fixture, tmp_path, flags, expect):
    """``--emulate`` alone (even right before MODEL) is ``default``; the fine flags override it."""
    import subprocess
    import sys

    from refimpl.model.trunk import forward, load_model
    from refimpl.model.state import SeqState

    path = make_fixture("tiny", "q8_0")
    out = tmp_path / "l.npy"
    proc = subprocess.run([sys.executable, "-m", "refimpl", "logits", *flags, str(path), "--tokens", "3,1,4,1,5", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    model = load_model(path, progress=False)
    want, _, _ = forward(model, SeqState.fresh(model.config), [3, 1, 4, 1, 5], Ctx(**expect))
    assert np.array_equal(np.load(out), want)


@pytest.mark.parametrize("flags", [["--emulate=fast"], ["--kv-type", "q8_0"]])
def test_cli_bad_emulation_flags_are_one_line_errors(make_fixture, flags):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "refimpl", "logits", str(make_fixture("tiny", "f32")), "--tokens", "1",
                           "--out", "/dev/null", *flags], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.startswith("refimpl: error:") and len(proc.stderr.strip().splitlines()) == 1


def test_flash_attn_kernel_uses_the_c_library_expf_compiled_or_not(tmp_path):
    """numba's float32 math.exp is libm expf (the function llama.cpp's flash attention calls), and the
    kernel interpreted (NUMBA_DISABLE_JIT=1, ctypes expf) gives the same bits as compiled."""
    import ctypes.util
    import subprocess
    import sys

    from kernels.ggml.flashattn import expf

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.expf.argtypes, libm.expf.restype = [ctypes.c_float], ctypes.c_float
    xs = np.random.default_rng(0).uniform(-30, 0, 2000).astype(np.float32)
    assert all(np.float32(expf(x)) == np.float32(libm.expf(float(x))) for x in xs)

    rng = np.random.default_rng(1)
    q, k, v, _, visible = _random_attention(rng, 3, 20)
    np.savez(tmp_path / "in.npz", q=q, k=k, v=v, visible=visible)
    code = ("import numpy as np, kernels; z = np.load('in.npz'); "
            "np.save('out.npy', kernels.flash_attn_f16(z['q'], z['k'], z['v'], z['visible'], 0.125))")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(tmp_path / "out.npy"), kernels.flash_attn_f16(q, k, v, visible, 0.125))


def test_llama_cpp_context_flags(tmp_path, capsys):
    """--threads / --ubatch-size / --ctx-size set the emulated llama.cpp's n_threads, n_ubatch and n_ctx (only with
    --emulate=ggml; bad values refused in one line), and a sequence longer than its n_ctx is refused, as llama.cpp
    refuses it."""
    import argparse

    from refimpl.cli import main
    from refimpl.cli.common import add_numerics, ctx_from_args
    from refimpl.fixtures.builtin import TRAINED_PATH

    p = argparse.ArgumentParser()
    add_numerics(p)
    ctx = ctx_from_args(p.parse_args(["--emulate=ggml", "--threads", "2", "--ubatch-size", "32", "--ctx-size", "300"]))
    assert (ctx.n_threads, ctx.n_ubatch, ctx.n_ctx) == (2, 32, 300)
    ctx = ctx_from_args(p.parse_args(["--emulate=ggml"]))
    assert (ctx.n_threads, ctx.n_ubatch, ctx.n_ctx) == (4, 512, None)
    out = str(tmp_path / "x.npy")
    for argv, said in ((["--threads", "2"], "--threads describes the llama.cpp that --emulate=ggml emulates"),
                       (["--emulate=ggml", "--ubatch-size", "0"], "--ubatch-size must be positive, got 0"),
                       (["--emulate=ggml", "--ctx-size", "-1"], "--ctx-size must be ≥ 0, got -1")):
        assert main(["logits", *argv, "--tokens", "1,2", "--out", out, str(TRAINED_PATH)]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
    ids = ",".join(["5"] * 257)
    assert main(["logits", "--emulate=ggml", "--ctx-size", "200", "--tokens", ids, "--out", out, str(TRAINED_PATH)]) == 2
    assert "the emulated llama.cpp context holds 256 cells (n_ctx 200); 257 tokens do not fit" in capsys.readouterr().err
