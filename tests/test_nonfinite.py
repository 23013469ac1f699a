"""Weights that are not finite (NaN, ±inf: a broken conversion, a bad quantization): refimpl computes
what llama.cpp computes, and never trips over its own checks (docs/numerics.md, "Non-finite weights").

* the two tracebacks the fuzz (tests/test_fuzz.py) first found: a NaN scale reaching the delta-net
  conv window (a bare AssertionError) and a vocabulary token that is not UTF-8 (a bare
  UnicodeDecodeError);
* against llama.cpp (the ``oracle`` extra): its logits on files with a NaN or inf scale, and its greedy
  sampler on rows with NaN and ±inf.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz import _SCALES, Base, _put, bases, call, commands, verdict  # noqa: F401  (bases: the fixture)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("nonfinite")



def _tensor(base: Base, name: str):
    return next(t for t in base.tensors if t[0] == name)


def _with_scale(base: Base, name: str, block: int, value: float, field: int = 0) -> bytes:
    """The base with scale ``field`` of block ``block`` of tensor ``name`` (an F32 tensor: element
    ``block``) set to ``value``."""
    _, qtype, offset, _ = _tensor(base, name)
    at, dtype = _SCALES[qtype][field]
    data = bytearray(base.data)
    _put(data, offset + block * GGML_QUANT_SIZES[qtype][1] + at, np.array([value], dtype).tobytes())
    return bytes(data)


def test_nan_weights_give_nan_logits_not_an_assertion(bases, workdir):
    """A NaN scale in the first delta-net projection of the Q4_K_M fixture used to end in a bare
    AssertionError (the conv window built twice and compared: NaN ≠ NaN). Now: exit 0, NaN logits."""
    path = workdir / "nan.gguf"
    path.write_bytes(_with_scale(bases["tiny-q4_k_m"], "blk.0.attn_qkv.weight", 0, np.nan))
    out = workdir / "nan.npy"
    rc, _, stderr, caught = call(["logits", str(path), "--tokens", "1,2,3", "--out", str(out)])
    assert verdict("logits", rc, stderr, caught) is None and rc == 0, (rc, stderr)
    assert np.isnan(np.load(out)).all()


def test_a_token_that_is_not_utf8_is_refused_in_one_line(bases, workdir):
    """Token 5 of the built-in model made invalid UTF-8: one line naming the token, exit 2 — through
    the CLI and through a ``gguf.GGUFReader`` handed to the tokenizer."""
    from gguf import GGUFReader

    from refimpl.errors import RefimplError
    from refimpl.tokenizer import Tokenizer

    base = bases["kjv"]
    token5 = [s for s in base.slots if s.kind == "token"][5]
    data = bytearray(base.data)
    data[token5.offset] = 0xFF
    path = workdir / "utf8.gguf"
    path.write_bytes(data)
    for command, argv in commands(path, workdir).items():
        rc, _, stderr, caught = call(argv)
        assert verdict(command, rc, stderr, caught) is None and rc == 2, (command, rc, stderr)
        assert "not valid UTF-8" in stderr and ("token 5 " in stderr or "string 5 " in stderr), stderr
    with pytest.raises(RefimplError, match=r"tokenizer token 5 is not valid UTF-8"):
        Tokenizer.from_gguf(GGUFReader(path))


#: (base, tensor, block, value): non-finite scales whose effect llama.cpp's logits show — everything
#: NaN, one vocabulary column NaN, the positions after a token NaN, nothing (an expert never routed),
#: and on the K-quant fixture NaN activations that llama.cpp's Q8_K quantization turns into finite numbers.
NONFINITE_CASES = [
    ("kjv", "blk.0.attn_qkv.weight", 0, np.nan),
    ("kjv", "output.weight", 40, np.nan),
    ("kjv", "token_embd.weight", 24, np.nan),
    ("kjv", "blk.0.ffn_down_exps.weight", 0, np.nan),
    ("tiny-q4_k_m", "blk.0.attn_qkv.weight", 0, np.nan),
    ("tiny-q4_k_m", "blk.0.ssm_conv1d.weight", 7, np.nan),
    ("tiny-q4_k_m", "blk.3.attn_q_norm.weight", 2, np.inf),
]


@pytest.mark.oracle
@pytest.mark.parametrize("config, noise", [("plain", 1e-4), ("default", 5e-3)])  # default: F16 K/V, flash attention
@pytest.mark.parametrize("name, tensor, block, value", NONFINITE_CASES, ids=[f"{b}-{t}-{v}" for b, t, _, v in NONFINITE_CASES])
def test_nonfinite_weights_compute_what_llama_cpp_computes(bases, workdir, name, tensor, block, value, config, noise):
    """refimpl with --emulate=CONFIG (llama.cpp's activation quantization, K/V cache and attention)
    against llama.cpp's logits in that configuration on the same damaged file: the same NaN and ±inf
    entries, the finite ones to float noise (F16 flash attention's, for the default configuration)."""
    from conftest import require_llama_cpp
    from llama_ref import llama_run

    from refimpl.model.trunk import forward, load_model
    from refimpl.model.ops import emulation_ctx
    from refimpl.model.state import SeqState

    require_llama_cpp()
    path = workdir / f"nonfinite-{name}.gguf"
    path.write_bytes(_with_scale(bases[name], tensor, block, value))
    tokens = [1, 2, 3, 4, 5]
    ref = llama_run(path, tokens, defaults=config == "default").logits
    model = load_model(path)
    ours = forward(model, SeqState.fresh(model.config), tokens, emulation_ctx(config))[0]
    if name == "kjv" and config == "plain":  # Q8_0: without emulation too, the NaN end where llama.cpp's do
        plain = forward(model, SeqState.fresh(model.config), tokens)[0]
        assert np.array_equal(np.isnan(plain), np.isnan(ref))
    assert np.array_equal(np.isnan(ours), np.isnan(ref)) and np.array_equal(np.isposinf(ours), np.isposinf(ref))
    assert np.array_equal(np.isneginf(ours), np.isneginf(ref))
    finite = np.isfinite(ref)
    if finite.any():
        scale = max(float(np.abs(ref[finite]).max()), 1e-30)
        assert float(np.abs(ours[finite] - ref[finite]).max()) <= noise * scale


@pytest.mark.oracle
@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(logits=st.lists(st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 2.0, -3.5]) | st.floats(width=32),
                       min_size=1, max_size=12))
def test_greedy_choice_is_llama_cpps_greedy_sampler(logits):
    """refimpl.model.ops.argmax against llama.cpp's own greedy sampler (``llama_sampler_init_greedy``, in
    this process through llama-cpp-python) on logits with NaN and ±inf."""
    import ctypes

    from conftest import require_llama_cpp

    from refimpl.model.ops import argmax

    L = require_llama_cpp()
    row = np.array(logits, np.float32)
    data = (L.llama_token_data * len(row))(*[L.llama_token_data(i, float(v), 0.0) for i, v in enumerate(row)])
    cur = L.llama_token_data_array(data=data, size=len(row), selected=-1, sorted=False)
    sampler = L.llama_sampler_init_greedy()
    try:
        L.llama_sampler_apply(sampler, ctypes.byref(cur))
    finally:
        L.llama_sampler_free(sampler)
    assert argmax(row) == data[cur.selected].id
