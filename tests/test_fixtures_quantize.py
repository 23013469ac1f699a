"""The fixture quantizers and the per-tensor type table.

* refimpl.fixtures.quantize (Q4_K, Q5_K, Q6_K) must produce the same bytes as ggml's own
  ``quantize_row_q{4,5,6}_K_ref`` — called through ctypes in the libggml-base.so that
  llama-cpp-python ships — and round-trip through ``gguf.quants.dequantize`` with the usual error;
* gguf's Q8_0 / MXFP4 quantizers (used for the other mixes) must match ggml's too;
* ``assign_types`` must follow llama-quantize's rules, including the shape fallbacks.
"""

import ctypes
import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from conftest import require_llama_cpp
from refimpl.fixtures import PRESETS, build_tensors, resolve_options
from refimpl.fixtures.mixes import assign_types, encode
from refimpl.fixtures.quantize import nearest_int, quantize_k

K_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
REF_FUNCS = {Q.Q4_K: "quantize_row_q4_K_ref", Q.Q5_K: "quantize_row_q5_K_ref", Q.Q6_K: "quantize_row_q6_K_ref",
             Q.Q8_0: "quantize_row_q8_0_ref", Q.MXFP4: "quantize_row_mxfp4_ref"}
# relative RMS error of a round trip on N(0, 1) data (ggml's own numbers are the same, bit for bit)
MAX_REL_RMSE = {Q.Q4_K: 0.08, Q.Q5_K: 0.04, Q.Q6_K: 0.02, Q.Q8_0: 0.01, Q.MXFP4: 0.15}


def _samples():
    rng = np.random.default_rng(7)
    sparse = rng.standard_normal((64, 512)) * (rng.random((64, 512)) < 0.05)
    special = np.zeros((6, 512))
    special[1] = 1.0  # constant positive
    special[2] = -3.0  # constant negative (min = max)
    special[3, 17] = 5.0  # a single spike
    special[4] = np.linspace(-1, 2, 512)
    special[5, :256] = 1e-20  # below GROUP_MAX_EPS
    return {
        "normal": rng.standard_normal((64, 512)) * 0.02,
        "uniform": rng.uniform(-1, 1, (64, 512)),
        "heavy_tailed": rng.standard_t(2, (64, 512)),
        "sparse": sparse,
        "special": special,
    }


SAMPLES = {k: v.astype(np.float32) for k, v in _samples().items()}


@pytest.fixture(scope="module")
def ggml_ref():
    """``ref(qtype, x) -> bytes``: ggml's reference quantizer from llama-cpp-python's libggml-base."""
    llama_cpp = require_llama_cpp()
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))

    def ref(qtype, x):
        fn = getattr(lib, REF_FUNCS[qtype])
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64], None
        block, size = GGML_QUANT_SIZES[qtype]
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.zeros((x.shape[0], x.shape[1] // block * size), dtype=np.uint8)
        fn(x.ctypes.data, out.ctypes.data, x.size)
        return out

    return ref


@pytest.mark.oracle
@pytest.mark.parametrize("sample", list(SAMPLES))
@pytest.mark.parametrize("qtype", K_TYPES)
def test_k_quants_bit_exact_with_ggml(ggml_ref, qtype, sample):
    x = SAMPLES[sample]
    ours, theirs = quantize_k(x, qtype), ggml_ref(qtype, x)
    bad_rows = np.nonzero((ours != theirs).any(axis=1))[0]
    assert bad_rows.size == 0, f"{qtype.name} differs from ggml on rows {bad_rows[:8].tolist()}"


@pytest.mark.oracle
@pytest.mark.parametrize("sample", list(SAMPLES))
@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.MXFP4])
def test_gguf_quantizers_we_use_match_ggml(ggml_ref, qtype, sample):
    x = SAMPLES[sample]
    assert np.array_equal(encode(x, qtype), ggml_ref(qtype, x))


@pytest.mark.parametrize("qtype", K_TYPES + [Q.Q8_0, Q.MXFP4])
def test_round_trip_error(qtype):
    x = np.random.default_rng(3).standard_normal((32, 1024)).astype(np.float32)
    raw = encode(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (32, 1024 // GGML_QUANT_SIZES[qtype][0] * GGML_QUANT_SIZES[qtype][1])
    back = gguf.quants.dequantize(raw, qtype)
    rel = np.sqrt(np.mean((back - x) ** 2) / np.mean(x**2))
    assert rel < MAX_REL_RMSE[qtype]


@pytest.mark.parametrize("qtype", K_TYPES)
def test_known_answer_blocks(qtype):
    x = np.zeros((4, 256), dtype=np.float32)
    x[1] = 0.5  # constant: exactly representable through the min (Q4/Q5) or the scale (Q6)
    x[2, ::2] = 1.0  # two levels
    x[3] = np.arange(256) / 255
    raw = quantize_k(x, qtype)
    assert not raw[0].any()  # an all-zero block is all-zero bytes
    back = gguf.quants.dequantize(raw, qtype)
    assert np.array_equal(back[0], x[0])
    assert np.allclose(back[1], 0.5, atol=2e-3) and np.allclose(back[2], x[2], atol=2e-3)
    assert np.abs(back[3] - x[3]).max() < {Q.Q4_K: 0.04, Q.Q5_K: 0.02, Q.Q6_K: 0.02}[qtype]


def test_nearest_int_is_round_half_even():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.49, -2.51, 1e6 + 0.5], dtype=np.float32)
    assert nearest_int(v).tolist() == [0, 2, 2, 0, -2, 2, -3, 1000000]


def _types(preset, quant, **options):
    p = PRESETS[preset] if isinstance(preset, str) else preset
    opts = resolve_options(p, options)
    t = build_tensors(p, 0, opts)
    n_blocks = p.n_layer + (opts["mtp"] != "stripped")
    return assign_types({n: a.shape for n, a in t.items()}, quant, n_expert=p.n_expert, n_layer_all=n_blocks)


def test_q4_k_m_without_the_eight_expert_rule():
    """X = 4: attn_v-like tensors get Q6_K on use_more_bits(rank, 5) (ranks 2 and 4), attn_k and
    attn_output stay Q4_K."""
    p = dataclasses.replace(PRESETS["tiny"], n_expert=4)
    types = _types(p, "q4_k_m")
    assert [types[f"blk.{i}.attn_qkv.weight"] for i in range(3)] == [Q.Q4_K, Q.Q4_K, Q.Q6_K]
    assert types["blk.3.attn_v.weight"] == Q.Q4_K and types["blk.4.attn_v.weight"] == Q.Q6_K
    assert types["blk.3.attn_k.weight"] == Q.Q4_K and types["blk.3.attn_output.weight"] == Q.Q4_K


def test_q4_k_m_shape_fallbacks():
    """Rows that 256 does not divide: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0; output → Q8_0."""
    p = dataclasses.replace(PRESETS["tiny"], n_embd=160, n_ff_exp=96, head_dim=48, ssm_state_size=40)
    types = _types(p, "q4_k_m")
    assert types["output.weight"] == Q.Q8_0  # E % 256 != 0
    assert types["token_embd.weight"] == Q.Q5_0
    assert types["blk.3.attn_output.weight"] == Q.Q5_1  # Q5_K on a 192-wide row
    assert types["blk.2.ffn_down_exps.weight"] == Q.Q8_0  # Q6_K on a 96-wide row
    assert types["blk.0.ffn_down_exps.weight"] == Q.Q5_0
    assert types["blk.0.ssm_out.weight"] == Q.Q5_0  # Din = 160
    p = dataclasses.replace(PRESETS["tiny"], n_ff_exp=200)  # not even a multiple of 32
    assert _types(p, "q4_k_m")["blk.0.ffn_down_exps.weight"] == Q.F16
    assert _types(p, "q8_0")["blk.0.ffn_down_exps.weight"] == Q.F16


def test_tied_and_mxfp4_rules():
    assert _types("tiny", "q4_k_m", tied=True)["token_embd.weight"] == Q.Q6_K
    mx = _types("tiny", "mxfp4", tied=True, fused_gate_up=True)
    assert mx["token_embd.weight"] == Q.Q8_0 and mx["blk.0.ffn_gate_up_exps.weight"] == Q.MXFP4
    assert mx["blk.0.ffn_gate_shexp.weight"] == Q.Q8_0 and mx["blk.0.ffn_gate_inp.weight"] == Q.F32
    bf = _types("tiny", "bf16", mtp="extras")
    assert bf["blk.4.nextn.shared_head_head.weight"] == Q.BF16 and bf["blk.4.nextn.shared_head_norm.weight"] == Q.F32
    assert bf["blk.0.ssm_conv1d.weight"] == Q.F32 and bf["blk.0.ssm_a"] == Q.F32
