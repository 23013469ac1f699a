"""The fixture writer: files read back with the expected metadata, tensors, shapes and types.

Expected names and shapes are written out here from ``qwen35moe.cpp::load_arch_tensors`` (docs/gguf.md §3; not taken from the writer), and the
Q4_K_M table from ``llama-quant.cpp`` as worked out for the tiny dims (docs/fixtures.md).
"""

import hashlib
import json
import re
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader

from refimpl.errors import RefimplError
from refimpl.fixtures import PRESETS, QUANT_MIXES, predictable_successors, write_fixture
from refimpl.fixtures.layout import CONVERT_MIXES
from refimpl.fixtures.mixes_iq import LIBGGML_MIXES
from refimpl.fixtures.vocab import CHAT_TEMPLATE, build_vocab

MIXES = list(QUANT_MIXES)
ARCH = "qwen35moe"
TESTED_PRESETS = ("tiny", "predictable")  # the narrow and k presets: tests/test_fixture_layout.py
VARIANTS = [
    {"mtp": "stripped"},
    {"mtp": "extras"},
    {"tied": True},
    {"fused_gate_up": True},
    {"fused_qkv": True},
    {"recurrent_layers_key": False},
    {"layout": "legacy"},
    {"shexp_gate_1d": True},
    {"shared_head_norm": False},
]


def _id(options):
    return "-".join(f"{k}={v}" for k, v in options.items()) or "defaults"


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fields(reader):
    return {k: f.contents() for k, f in reader.fields.items()}


def _tensors(reader):
    """name → (numpy shape, qtype); the numpy shape of a block type is its element shape."""
    out = {}
    for t in reader.tensors:
        out[t.name] = (tuple(int(n) for n in reversed(t.shape)), t.tensor_type)
    return out


def expected_shapes(p, *, quant="f32", mtp="full", tied=False, fused_gate_up=False, fused_qkv=False, layout="converter",
                    shexp_gate_1d=None, shared_head_norm=None):
    """``load_arch_tensors``: every tensor of the file with its numpy shape — ``ffn_gate_inp_shexp`` as
    the converter writes it, (1, E), in the mixes it writes, and as llama-quantize writes it, (E,), in
    the others; the converter's ``nextn.shared_head_norm``."""
    E, V, H, Hkv, D = p.n_embd, p.n_vocab, p.n_head, p.n_head_kv, p.head_dim
    legacy = layout == "legacy"
    shexp = (E,) if (legacy if shexp_gate_1d is None else shexp_gate_1d) or quant not in CONVERT_MIXES else (1, E)
    head_norm = (not legacy) if shared_head_norm is None else shared_head_norm
    X, F, Fs, Hv, S = p.n_expert, p.n_ff_exp, p.n_ff_shexp, p.ssm_time_step_rank, p.ssm_state_size
    Din, C, Kc = Hv * S, 2 * p.ssm_group_count * S + Hv * S, p.ssm_conv_kernel
    s = {"token_embd.weight": (V, E), "output_norm.weight": (E,)}
    if not tied:
        s["output.weight"] = (V, E)
    n_blocks = p.n_layer + (mtp != "stripped")
    for il in range(n_blocks):
        b = f"blk.{il}."
        s.update({b + "attn_norm.weight": (E,), b + "post_attention_norm.weight": (E,)})
        if il < p.n_layer and (il + 1) % p.full_attention_interval != 0:
            s.update({b + "attn_qkv.weight": (C, E), b + "attn_gate.weight": (Din, E), b + "ssm_conv1d.weight": (C, Kc),
                      b + "ssm_dt.bias": (Hv,), b + "ssm_a": (Hv,), b + "ssm_beta.weight": (Hv, E),
                      b + "ssm_alpha.weight": (Hv, E), b + "ssm_norm.weight": (S,), b + "ssm_out.weight": (E, Din)})
        else:
            if fused_qkv:
                s[b + "attn_qkv.weight"] = (2 * H * D + 2 * Hkv * D, E)
            else:
                s.update({b + "attn_q.weight": (2 * H * D, E), b + "attn_k.weight": (Hkv * D, E), b + "attn_v.weight": (Hkv * D, E)})
            s.update({b + "attn_output.weight": (E, H * D), b + "attn_q_norm.weight": (D,), b + "attn_k_norm.weight": (D,)})
        s.update({b + "ffn_gate_inp.weight": (X, E), b + "ffn_down_exps.weight": (X, E, F), b + "ffn_gate_inp_shexp.weight": shexp,
                  b + "ffn_gate_shexp.weight": (Fs, E), b + "ffn_up_shexp.weight": (Fs, E), b + "ffn_down_shexp.weight": (E, Fs)})
        if fused_gate_up:
            s[b + "ffn_gate_up_exps.weight"] = (X, 2 * F, E)
        else:
            s.update({b + "ffn_gate_exps.weight": (X, F, E), b + "ffn_up_exps.weight": (X, F, E)})
        if il == p.n_layer:
            s.update({b + "nextn.eh_proj.weight": (E, 2 * E), b + "nextn.enorm.weight": (E,), b + "nextn.hnorm.weight": (E,)})
            if mtp == "extras":
                s.update({b + "nextn.embed_tokens.weight": (V, E), b + "nextn.shared_head_head.weight": (V, E)})
            if mtp == "extras" or head_norm:
                s[b + "nextn.shared_head_norm.weight"] = (E,)
    return s


def _always_f32(name, shape):
    return len(shape) == 1 or "ffn_gate_inp.weight" in name or "ffn_gate_inp_shexp" in name or "ssm_conv1d" in name


def expected_q4_k_m(name, shape, tied=False, stripped=False):
    """llama-quantize Q4_K_M for the tiny dims: X = 8, and use_more_bits(il, block_count) holds for
    layers 2 and 4 with block_count 5, layers 2 and 3 with block_count 4 (MTP stripped)."""
    if _always_f32(name, shape):
        return Q.F32
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return Q.Q6_K
    if name.endswith(("attn_qkv.weight", "attn_k.weight", "attn_v.weight")):
        return Q.Q8_0
    if name.endswith("attn_output.weight"):
        return Q.Q5_K
    if "ffn_down" in name and name.split(".")[1] in (("2", "3") if stripped else ("2", "4")):
        return Q.Q6_K
    return Q.Q4_K


# The IQ mixes (refimpl/fixtures/mixes_iq.py's table), per role: iq1_m, iq2_xxs, iq3_xxs.
IQ_TABLE = {
    "ffn_gate_exps": (Q.IQ1_S, Q.IQ2_XXS, Q.IQ3_XXS), "ffn_down_exps": (Q.IQ2_XXS, Q.IQ2_XS, Q.IQ3_S),
    "ffn_gate_shexp": (Q.Q4_K, Q.Q4_K, Q.IQ3_S), "ffn_down_shexp": (Q.Q6_K, Q.Q6_K, Q.Q4_K),
    "attn_q": (Q.Q4_K, Q.Q4_K, Q.IQ2_S), "attn_v": (Q.Q6_K, Q.Q6_K, Q.Q4_K), "attn_output": (Q.Q4_K, Q.Q4_K, Q.Q5_K),
    "attn_gate": (Q.Q4_K, Q.Q4_K, Q.IQ3_S), "ssm_alpha": (Q.Q8_0,) * 3, "nextn.eh_proj": (Q.Q6_K,) * 3,
    "token_embd": (Q.Q2_K, Q.Q4_K, Q.IQ3_S), "output": (Q.Q5_K, Q.Q6_K, Q.Q6_K),
}  # fmt: skip
IQ_SAME_AS = {"ffn_up_exps": "ffn_gate_exps", "ffn_gate_up_exps": "ffn_gate_exps", "ffn_up_shexp": "ffn_gate_shexp",
              "attn_k": "attn_q", "attn_qkv": "attn_v", "ssm_out": "attn_output", "ssm_beta": "ssm_alpha",
              "nextn.embed_tokens": "token_embd", "nextn.shared_head_head": "output"}


def expected_iq(quant, name, shape, tied=False, stripped=False):
    """The IQ mixes for the tiny dims: routed gate/up of iq1_m are IQ1_M in the use_more_bits layers —
    2 and 4 with block_count 5, 2 and 3 with block_count 4 (MTP stripped)."""
    if _always_f32(name, shape):
        return Q.F32
    role = re.sub(r"^blk\.\d+\.", "", name).removesuffix(".weight")  # e.g. "ffn_down_exps", "nextn.eh_proj"
    if tied and role == "token_embd":
        role = "output"
    role = IQ_SAME_AS.get(role, role)
    t = IQ_TABLE[role][["iq1_m", "iq2_xxs", "iq3_xxs"].index(quant)]
    if quant == "iq1_m" and role == "ffn_gate_exps" and name.split(".")[1] in (("2", "3") if stripped else ("2", "4")):
        t = Q.IQ1_M
    return t


def expected_ternary(quant, name, shape, tied=False):
    """llama-quantize TQ1_0 / TQ2_0 for the tiny dims (X = 8: attn_k, attn_v, GDN attn_qkv → Q8_0)."""
    if _always_f32(name, shape):
        return Q.F32
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return Q.Q6_K
    if name == "token_embd.weight":
        return Q.Q4_K
    if name.endswith(("attn_k.weight", "attn_v.weight", "attn_qkv.weight")):
        return Q.Q8_0
    return {"tq1_0": Q.TQ1_0, "tq2_0": Q.TQ2_0}[quant]


def expected_type(quant, name, shape, tied=False, stripped=False):
    if quant == "q4_k_m":
        return expected_q4_k_m(name, shape, tied, stripped)
    if quant.startswith("tq"):
        return expected_ternary(quant, name, shape, tied)
    if quant.startswith("iq"):
        return expected_iq(quant, name, shape, tied, stripped)
    if quant == "f32" or _always_f32(name, shape):
        return Q.F32
    if quant == "mxfp4":
        return Q.MXFP4 if len(shape) == 3 else Q.Q8_0
    return {"bf16": Q.BF16, "q8_0": Q.Q8_0}[quant]


@pytest.mark.parametrize("preset, quant", [(p, q) for q in MIXES for p in TESTED_PRESETS if p == "tiny" or q not in LIBGGML_MIXES])
def test_tensors_shapes_and_types(make_fixture, preset, quant):
    p = PRESETS[preset]
    reader = GGUFReader(make_fixture(preset, quant))
    got = _tensors(reader)
    want = expected_shapes(p, quant=quant, mtp=p.default_mtp)
    assert {n: s for n, (s, _) in got.items()} == want
    for name, (shape, qtype) in got.items():
        assert qtype == expected_type(quant, name, shape), name


def test_q4_k_m_has_every_k_type_and_q8_0(make_fixture):
    types = {t.tensor_type for t in GGUFReader(make_fixture("tiny", "q4_k_m")).tensors}
    assert {Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0, Q.F32} <= types


def test_iq_mixes_hold_every_codebook_type(make_fixture):
    types = set()
    for quant in ("iq1_m", "iq2_xxs", "iq3_xxs"):
        types |= {t.tensor_type for t in GGUFReader(make_fixture("tiny", quant)).tensors}
    assert {Q.IQ1_S, Q.IQ1_M, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S} <= types


@pytest.mark.parametrize(
    "quant, options",
    # every variant in f32; in q4_k_m those that change tensors (recurrent_layers_key is metadata only)
    [("f32", o) for o in VARIANTS] + [("q4_k_m", o) for o in VARIANTS if "recurrent_layers_key" not in o]
    + [("q8_0", {"layout": "legacy"}), ("bf16", {"fused_gate_up": True, "fused_qkv": True})]
    + [("iq1_m", {"mtp": "stripped"}), ("iq2_xxs", {"tied": True}), ("iq3_xxs", {"fused_gate_up": True}),
       ("iq2_xxs", {"mtp": "extras"}), ("tq1_0", {"tied": True})],
    ids=lambda v: v if isinstance(v, str) else _id(v),
)
def test_option_variants(make_fixture, options, quant):
    p = PRESETS["tiny"]
    reader = GGUFReader(make_fixture("tiny", quant, **options))
    got = _tensors(reader)
    shape_opts = {k: v for k, v in options.items() if k != "recurrent_layers_key"}
    assert {n: s for n, (s, _) in got.items()} == expected_shapes(p, quant=quant, **shape_opts)
    stripped = options.get("mtp") == "stripped"
    for name, (shape, qtype) in got.items():
        assert qtype == expected_type(quant, name, shape, tied=options.get("tied", False), stripped=stripped), name
    f = _fields(reader)
    assert f[f"{ARCH}.block_count"] == p.n_layer + (not stripped)
    assert (f"{ARCH}.nextn_predict_layers" in f) == (not stripped)
    if options.get("recurrent_layers_key", True):
        assert f[f"{ARCH}.attention.recurrent_layers"] == [True, True, True, False] + [False] * (not stripped)
    else:
        assert f"{ARCH}.attention.recurrent_layers" not in f
    assert json.loads(f["refimpl.fixture.options"])["mtp"] == options.get("mtp", "full")


@pytest.mark.parametrize("layout", ["converter", "legacy"])
def test_metadata_keys(make_fixture, layout):
    p = PRESETS["tiny"]
    legacy = layout == "legacy"
    f = _fields(GGUFReader(make_fixture("tiny", "q4_k_m", **({"layout": "legacy"} if legacy else {}))))
    a = ARCH + "."
    expect = {
        "general.architecture": ARCH, "general.file_type": 15, "general.quantization_version": 2,
        a + "block_count": 5, a + "nextn_predict_layers": 1, a + "context_length": 4096, a + "embedding_length": 256,
        a + "attention.head_count": 4, a + "attention.head_count_kv": 2,
        a + "attention.key_length": 64, a + "attention.value_length": 64, a + "rope.dimension_count": 16,
        a + "rope.dimension_sections": [3, 3, 2, 0], a + "expert_count": 8, a + "expert_used_count": 2,
        a + "expert_feed_forward_length": 256, a + "expert_shared_feed_forward_length": 256,
        a + "ssm.conv_kernel": 4, a + "ssm.inner_size": 256, a + "ssm.state_size": 64, a + "ssm.time_step_rank": 4,
        a + "ssm.group_count": 2, a + "full_attention_interval": 4,
        a + "attention.recurrent_layers": [True, True, True, False, False],
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen35", "tokenizer.ggml.add_bos_token": False,
        "refimpl.fixture.preset": "tiny", "refimpl.fixture.seed": 0, "refimpl.fixture.quant": "q4_k_m",
    }
    for key, value in expect.items():
        assert f[key] == value, key
    assert f[a + "rope.freq_base"] == pytest.approx(1e7)
    assert f[a + "attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
    vocab = build_vocab(p.n_vocab, pad_by_id=not legacy)
    assert f["tokenizer.ggml.tokens"] == list(vocab.tokens)
    assert f["tokenizer.ggml.tokens"][-1] == ("[PAD115]" if legacy else "[PAD511]")  # the converter names fillers by id
    assert f["tokenizer.ggml.token_type"] == list(vocab.token_types)
    assert f["tokenizer.ggml.merges"] == list(vocab.merges)
    assert f["tokenizer.ggml.bos_token_id"] == vocab.special_ids["<|endoftext|>"]
    assert f["tokenizer.ggml.eos_token_id"] == vocab.eos_id
    assert f["tokenizer.ggml.padding_token_id"] == vocab.special_ids["<|endoftext|>"]
    converter_only = {"general.type": "model", "general.size_label": "8x3.7M", "tokenizer.chat_template": CHAT_TEMPLATE}
    for key, value in converter_only.items():
        assert f.get(key) == (None if legacy else value), key
    assert (f.get(a + "feed_forward_length") == 512) if legacy else (a + "feed_forward_length" not in f)
    assert json.loads(f["refimpl.fixture.options"]) == {
        "layout": layout, "mtp": "full", "tied": False, "fused_gate_up": False, "fused_qkv": False, "recurrent_layers_key": True,
        "shexp_gate_1d": legacy, "shared_head_norm": not legacy}


def test_layout_keeps_the_weights(make_fixture):
    """Both layouts hold the same values per tensor; the converter's shared_head_norm is output_norm's."""
    new, old = (GGUFReader(make_fixture("tiny", "q4_k_m", **o)) for o in ({}, {"layout": "legacy"}))
    a, b = ({t.name: t.data.tobytes() for t in r.tensors} for r in (new, old))
    assert a.pop("blk.4.nextn.shared_head_norm.weight") == b["output_norm.weight"]
    assert a == b
    names = [t.name for t in new.tensors]
    assert names[:3] == ["output.weight", "output_norm.weight", "token_embd.weight"]  # llama-quantize's order
    f32 = [t.name for t in GGUFReader(make_fixture("tiny", "f32")).tensors]
    assert f32[:5] == ["output.weight", "token_embd.weight", "blk.0.attn_norm.weight", "blk.0.ssm_a", "blk.0.ssm_conv1d.weight"]


@pytest.mark.parametrize(
    "preset, quant, options",
    [("tiny", q, {}) for q in MIXES]
    + [("tiny", "f32", {"mtp": "extras", "fused_gate_up": True, "recurrent_layers_key": False}),
       ("tiny", "f32", {"layout": "legacy"}), ("tiny", "q8_0", {"arch": "qwen3next", "layout": "legacy", "ssm_in": False}),
       ("narrow", "bf16", {"fused_gate_up": True, "fused_qkv": True}),
       ("tiny", "q8_0", {"mtp": "stripped", "tied": True}),
       ("predictable", "f32", {}), ("predictable", "q8_0", {"mtp_mismatch": 0.5})],
    ids=lambda v: v if isinstance(v, str) else _id(v),
)
def test_deterministic_and_rebuildable_from_metadata(make_fixture, tmp_path, preset, quant, options):
    first = make_fixture(preset, quant, **options)
    f = _fields(GGUFReader(first))
    again = write_fixture(tmp_path / "again.gguf", preset=f["refimpl.fixture.preset"], quant=f["refimpl.fixture.quant"],
                          seed=f["refimpl.fixture.seed"], **json.loads(f["refimpl.fixture.options"]))
    assert _sha(again) == _sha(first)
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file was renamed away


def test_seed_changes_weights_not_layout(make_fixture):
    a, b = GGUFReader(make_fixture("tiny", "f32", seed=0)), GGUFReader(make_fixture("tiny", "f32", seed=1))
    assert _tensors(a) == _tensors(b)
    assert not np.array_equal(_f32(a, "token_embd.weight"), _f32(b, "token_embd.weight"))


def _f32(reader, name):
    return next(t for t in reader.tensors if t.name == name).data


def test_weight_conventions(make_fixture):
    r = GGUFReader(make_fixture("tiny", "f32"))
    a = _f32(r, "blk.0.ssm_a")
    assert np.all(a <= -1.0) and np.all(a >= -16.0)  # −exp(U(log 1, log 16))
    for name in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.3.attn_q_norm.weight", "blk.0.ssm_norm.weight"):
        w = _f32(r, name)
        assert abs(w.mean() - 1) < 0.05 and w.std() < 0.2, name  # stored as 1 + small noise
    assert np.abs(_f32(r, "blk.0.ssm_dt.bias")).max() < 1.0
    emb = _f32(r, "token_embd.weight")
    assert abs(np.sqrt((emb**2).mean()) - 1) < 0.01  # unit-RMS embedding rows


def test_fused_gate_up_is_gate_then_up(make_fixture):
    r, fused = GGUFReader(make_fixture("tiny", "f32")), GGUFReader(make_fixture("tiny", "f32", fused_gate_up=True))
    gu = _f32(fused, "blk.1.ffn_gate_up_exps.weight")
    assert np.array_equal(gu[:, :256], _f32(r, "blk.1.ffn_gate_exps.weight"))
    assert np.array_equal(gu[:, 256:], _f32(r, "blk.1.ffn_up_exps.weight"))


def test_predictable_heads_follow_the_permutations(make_fixture):
    r = GGUFReader(make_fixture("predictable", "f32"))
    pi, pi_mtp = predictable_successors(0)
    emb, out, head = (_f32(r, n) for n in ("token_embd.weight", "output.weight", "blk.4.nextn.shared_head_head.weight"))
    normal = np.nonzero(pi >= 0)[0]
    assert len(normal) == 391 and sorted(pi[normal]) == sorted(normal)  # a permutation of the normal tokens
    assert np.argmax(emb[normal] @ out.T, axis=1).tolist() == pi[normal].tolist()
    assert np.argmax(emb[normal] @ head.T, axis=1).tolist() == pi_mtp[normal].tolist()
    assert np.mean(pi_mtp[normal] != pi[normal]) == pytest.approx(0.3, abs=0.01)
    # one cycle: following pi from any normal token visits every normal token
    x, seen = normal[0], set()
    for _ in range(len(normal)):
        seen.add(int(x))
        x = pi[x]
    assert len(seen) == len(normal)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"preset": "huge"}, "unknown fixture preset 'huge' \\(valid: tiny, predictable, narrow, k\\)"),
        ({"quant": "q3_k"}, "unknown quant mix 'q3_k' \\(valid: f32, bf16, q8_0, q4_k_m, mxfp4, iq1_m, iq2_xxs, iq3_xxs, tq1_0, tq2_0\\)"),
        ({"colour": "red"}, "unknown fixture option 'colour' \\(valid: arch, layout, mtp, tied"),
        ({"layout": "old"}, "layout='old' is not one of converter, legacy"),
        ({"arch": "qwen35", "shexp_gate_1d": True}, "shexp_gate_1d needs a shared expert"),
        ({"mtp": "stripped", "shared_head_norm": True}, "shared_head_norm needs an MTP block"),
        ({"mtp": "extras", "shared_head_norm": False}, "contradicts mtp=extras"),
        ({"preset": "k", "recurrent_layers_key": False}, "layer kinds are not those of full_attention_interval 4"),
        ({"mtp": "half"}, "mtp='half' is not one of full, stripped, extras"),
        ({"tied": "yes"}, "tied='yes' must be true or false"),
        ({"seed": -1}, "seed must be an integer"),
        ({"mtp_mismatch": 0.5}, "only applies to preset 'predictable'"),
        ({"preset": "predictable", "tied": True}, "tied=true is not supported"),
        ({"preset": "predictable", "mtp_mismatch": 2}, "must be in \\[0, 1\\]"),
    ],
)
def test_bad_arguments_raise_one_line_errors(tmp_path, kwargs, match):
    with pytest.raises(RefimplError, match=match) as info:
        write_fixture(tmp_path / "x.gguf", **kwargs)
    assert "\n" not in str(info.value)
    assert not list(tmp_path.iterdir())


def test_unwritable_path_is_a_one_line_error(tmp_path):
    with pytest.raises(RefimplError, match="cannot write fixture .*missing/x.gguf"):
        write_fixture(tmp_path / "missing" / "x.gguf")


def test_libggml_mixes_say_they_need_llama_cpp(monkeypatch, tmp_path):
    from refimpl.fixtures import ggml_quant

    ggml_quant._libggml_base.cache_clear()  # forget a library loaded by an earlier test
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp now raises ImportError
    with pytest.raises(RefimplError, match=r"quantized by libggml from llama-cpp-python.*pip install 'refimpl\[oracle\]'"):
        write_fixture(tmp_path / "iq.gguf", quant="iq2_xxs")
    assert not list(tmp_path.iterdir())  # nothing left behind


def test_cli_writes_either_layout(tmp_path):
    """`refimpl fixture --layout legacy` and the finer options as --option KEY=VALUE."""
    from refimpl.cli import main

    def tensors(*args):
        out = tmp_path / f"f{len(list(tmp_path.iterdir()))}.gguf"
        assert main(["fixture", str(out), "--arch", "qwen3next", *args]) == 0
        return {t.name: [int(n) for n in t.shape] for t in GGUFReader(out).tensors}

    default, legacy = tensors(), tensors("--layout", "legacy")
    assert "blk.0.attn_qkv.weight" in default and "blk.0.ssm_in.weight" not in default
    assert default["blk.0.ffn_gate_inp_shexp.weight"] == [256, 1] and "blk.4.nextn.shared_head_norm.weight" in default
    assert "blk.0.ssm_in.weight" in legacy and legacy["blk.0.ffn_gate_inp_shexp.weight"] == [256]
    assert "blk.4.nextn.shared_head_norm.weight" not in legacy
    finer = tensors("--option", "ssm_in=true", "--option", "shexp_gate_1d=true", "--option", "shared_head_norm=false")
    assert set(finer) == set(legacy) and finer["blk.0.ffn_gate_inp_shexp.weight"] == [256]
