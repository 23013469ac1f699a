"""Weights that are not finite (NaN, ±inf: a broken conversion, a bad quantization): refimpl computes
what llama.cpp computes, and never trips over its own checks (docs/numerics.md, "Non-finite weights").

* the two tracebacks the fuzz (tests/test_fuzz.py) first found: a NaN scale reaching the delta-net
  conv window (a bare AssertionError) and a vocabulary token that is not UTF-8 (a bare
  UnicodeDecodeError);
* against llama.cpp (the ``oracle`` extra): its logits and intermediates on files with a NaN or inf
  scale — judged as tests/conformance.py judges, so that the verdict does not depend on the CPU —,
  and its greedy sampler on rows with NaN and ±inf.
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

#: The bound on ``attn_gated`` in the layer-local run of the default configuration (every other value
#: there is held to ``conformance.NOISE``): fed llama.cpp's ``attn_norm``, the attention still rounds
#: its own K and V to F16 for the cache and accumulates P·V in F16, so where float noise meets one of
#: those F16 ties its output moves by a few F16 steps (tests/test_emulate_config.py allows 4 × 2⁻¹⁰;
#: measured up to 3.5e-4 here). The bound this test has always given F16 flash attention.
F16_ATTENTION_NOISE = 5e-3


def _same_nonfinite(a: np.ndarray, b: np.ndarray) -> bool:
    return (np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(np.isposinf(a), np.isposinf(b))
            and np.array_equal(np.isneginf(a), np.isneginf(b)))


def _finite_rel_rows(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """conformance.rel_rows over the entries finite on both sides: per position, max |Δ| / max |theirs|
    (0 for a row with nothing finite). [T, n] -> [T]"""
    ours = np.asarray(ours, np.float64).reshape(np.shape(theirs))
    theirs = np.asarray(theirs, np.float64)
    both = np.isfinite(ours) & np.isfinite(theirs)
    diff = np.abs(np.where(both, ours, 0) - np.where(both, theirs, 0)).max(axis=-1)
    scale = np.abs(np.where(np.isfinite(theirs), theirs, 0)).max(axis=-1)
    return diff / np.maximum(scale, 1e-30)


def _at_noise(ours: np.ndarray, theirs: np.ndarray, noise: float) -> np.ndarray:
    """[T] bool: the same NaN / ±inf entries and the finite ones within ``noise`` of the row's max."""
    ours = np.asarray(ours).reshape(np.shape(theirs))
    same = np.array([_same_nonfinite(a, b) for a, b in zip(ours, theirs)], bool)
    return same & (_finite_rel_rows(ours, theirs) <= noise)


def _crossings(block, ours: dict, theirs: dict, attention: list[int]) -> list[tuple[int, str]]:
    """tests/conformance.py's crossings with non-finite values (a NaN equals a NaN): every (position,
    site) where the two sides' rounded activation codes differ while their floats agree to float
    noise; every router that picks other experts while its logits are finite and agree to noise;
    and, for ``attention`` layers with F16 roundings inside (F16 K/V cache, flash attention), every
    position whose ``attn_pregate`` leaves float noise while its float inputs (``Qcur`` there,
    ``Kcur`` / ``Vcur`` up to there) are at noise — a crossing of one of those F16 roundings.
    Returns (position, what) pairs, sorted by position."""
    import conformance
    from kernels.base.blocks import layout

    noise = conformance.NOISE
    found = []
    for s in block.sites:
        a, b = ours[s.ours].astype(np.float32), theirs[s.theirs].astype(np.float32).reshape(ours[s.ours].shape)
        at_noise = _at_noise(a, b, noise)
        for q in conformance._rounding_types(s.weights):
            diff = np.zeros(a.shape[0], np.int64)
            for ca, cb in zip(conformance.activation_codes(a, q), conformance.activation_codes(b, q)):
                differ = (ca != cb) & ~(np.isnan(ca) & np.isnan(cb)) if np.issubdtype(ca.dtype, np.floating) else ca != cb
                diff += differ.reshape(a.shape[0], -1).sum(axis=-1)
            found += [(int(p), f"{s.theirs} ({int(diff[p])} {layout(q).vec_dot_type.name} code(s) differ for {q.name})")
                      for p in np.nonzero(at_noise & (diff > 0))[0]]
    for r in block.routers:
        mine = ours[r.ours_topk].astype(np.int64)
        lo, lt = ours[r.ours_logits], theirs[r.theirs_logits]
        finite = np.isfinite(lo).all(axis=-1) & np.isfinite(lt).all(axis=-1)
        theirs_choice = conformance._selection(theirs[r.theirs_probs], block.n_expert_used)
        flipped = finite & _at_noise(lo, lt, noise) & np.any(mine != theirs_choice, axis=-1)
        found += [(int(p), f"{r.theirs_logits} (experts {mine[p].tolist()} vs {theirs_choice[p].tolist()})")
                  for p in np.nonzero(flipped)[0]]
    for il in attention:
        q_in = _at_noise(ours[f"Qcur-{il}"], theirs[f"Qcur-{il}"], noise)
        kv_in = np.cumprod(_at_noise(ours[f"Kcur-{il}"], theirs[f"Kcur-{il}"], noise)
                           & _at_noise(ours[f"Vcur-{il}"], theirs[f"Vcur-{il}"], noise)).astype(bool)
        out = _at_noise(ours[f"attn_pregate-{il}"], theirs[f"attn_pregate-{il}"], noise)
        found += [(int(p), f"attn_pregate-{il} (an F16 rounding of the attention)") for p in np.nonzero(q_in & kv_in & ~out)[0]]
    return sorted(found)


def _routing_ties(block, ours: dict, theirs: dict) -> dict[str, np.ndarray]:
    """conformance.routing_ties for the layer-local run: refimpl name -> [T] bool, the positions
    where a router's finite logits agree to float noise and its choice still differs (those names'
    values there depend on the choice). Rows with non-finite logits are compared as they are."""
    import conformance

    skip = {}
    for r in block.routers:
        lo, lt = ours[r.ours_logits], theirs[r.theirs_logits]
        finite = np.isfinite(lo).all(axis=-1) & np.isfinite(lt).all(axis=-1)
        theirs_choice = conformance._selection(theirs[r.theirs_probs], block.n_expert_used)
        tie = finite & _at_noise(lo, lt, conformance.NOISE) & np.any(ours[r.ours_topk] != theirs_choice, axis=-1)
        for name in r.outputs:
            skip[name] = skip.get(name, np.zeros(len(tie), bool)) | tie
    return skip


@pytest.mark.oracle
@pytest.mark.parametrize("config", ["plain", "default"])  # default: F16 K/V, flash attention
@pytest.mark.parametrize("name, tensor, block, value", NONFINITE_CASES, ids=[f"{b}-{t}-{v}" for b, t, _, v in NONFINITE_CASES])
def test_nonfinite_weights_compute_what_llama_cpp_computes(bases, workdir, name, tensor, block, value, config):
    """refimpl with --emulate=CONFIG (llama.cpp's activation quantization, K/V cache and attention)
    against llama.cpp in that configuration on the same damaged file, one token per decode, with the
    verdicts of tests/conformance.py (docs/numerics.md, "Verdicts that hold on any CPU") made NaN-aware:

    * end to end: the same NaN and ±inf logits; the finite ones at float noise at every position
      before the first crossing — a rounding point where float noise (the two builds' SIMD orders)
      landed the two sides on different codes, which happens or not depending on the CPU;
    * layer-local: fed llama.cpp's own value at every rounding site and layer input, every site
      input, layer input and output has llama.cpp's NaN and ±inf entries and its finite ones at float
      noise (``attn_gated`` of the default configuration: within a few F16 steps) — on any CPU."""
    import dataclasses

    import conformance
    from conftest import require_llama_cpp
    from llama_ref import llama_run

    from refimpl.model.ops import emulation_ctx
    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward, load_model
    from refimpl.oracle.trace import Recorder

    require_llama_cpp()
    path = workdir / f"nonfinite-{name}.gguf"
    path.write_bytes(_with_scale(bases[name], tensor, block, value))
    tokens = [1, 2, 3, 4, 5]
    model = load_model(path)
    c = model.config
    ctx = emulation_ctx(config)
    blk = conformance.trunk_block(model)
    attention = [il for il in range(c.n_layer) if not c.is_recurrent[il]] if ctx.kv_f16 or ctx.flash_attn else []
    names = blk.theirs_names() + [f"{n}-{il}" for il in attention for n in ("Qcur", "Kcur", "Vcur", "attn_pregate")]
    ref = llama_run(path, tokens, defaults=config == "default", trace=names)
    theirs = {**ref.trace, "logits": ref.logits}

    def run(trace):
        return forward(model, SeqState.fresh(c), tokens, dataclasses.replace(ctx, trace=trace))

    rec = Recorder()
    run(rec)
    ours = rec.arrays()
    logits = ours["result_output"]
    if name == "kjv" and config == "plain":  # Q8_0: without emulation too, the NaN end where llama.cpp's do
        plain = forward(model, SeqState.fresh(c), tokens)[0]
        assert np.array_equal(np.isnan(plain), np.isnan(ref.logits))
    assert _same_nonfinite(logits, ref.logits)
    found = _crossings(blk, ours, theirs, attention)
    first = found[0][0] if found else len(tokens)  # positions from the first crossing on: its consequences
    err = _finite_rel_rows(logits, ref.logits)[:first]
    assert (err <= conformance.NOISE).all(), (
        f"position {int(np.argmax(err > conformance.NOISE))} is {err.max():.3g} off with no crossing at or before it "
        f"(first crossing: {'position %d: %s' % found[0] if found else 'none'})")

    patched = conformance.run_patched(run, blk, theirs, sites=True)
    ties = _routing_ties(blk, patched, theirs)
    for o, t in [(s.ours, s.theirs) for s in blk.sites] + blk.inputs + blk.outputs:
        noise = F16_ATTENTION_NOISE if attention and o.startswith("attn_gated-") else conformance.NOISE
        bad = ~_at_noise(patched[o], theirs[t], noise) & ~ties.get(o, False)
        assert not bad.any(), (f"{o} from llama.cpp's own inputs: position {int(np.argmax(bad))} "
                               f"{_finite_rel_rows(patched[o], theirs[t]).max():.3g} off or other NaN/inf entries")


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
