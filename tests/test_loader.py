"""GGUF loading: config derivation, tensor plan variants, and one-line errors for bad files."""

import shutil

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter

from refimpl.io.config import load_config
from refimpl.errors import RefimplError
from refimpl.io.gguf_file import GGUFFile
from refimpl.cli.inspect_model import describe
from refimpl.io.load import open_model


def test_config_of_the_tiny_fixture(make_fixture):
    m = open_model(make_fixture("tiny", "f32"))
    c = m.config
    assert (c.n_layer_all, c.n_layer_nextn, c.n_layer) == (5, 1, 4)
    assert c.is_recurrent == (True, True, True, False, False)
    assert [c.layer_kind(il) for il in range(5)] == ["deltanet", "deltanet", "deltanet", "attention", "mtp"]
    assert (c.n_embd, c.n_vocab, c.n_head, c.n_head_kv, c.head_dim, c.n_rot) == (256, 512, 4, 2, 64, 16)
    assert (c.ssm_n_group, c.ssm_dt_rank, c.ssm_d_state, c.ssm_d_inner, c.conv_channels) == (2, 4, 64, 256, 512)
    assert (c.n_expert, c.n_expert_used, c.n_ff_exp, c.n_ff_shexp) == (8, 2, 256, 256)
    assert c.rope_sections == (3, 3, 2, 0) and c.rope_freq_base == 1e7
    assert m.plan.mtp == "present" and not m.plan.tied and not any(m.plan.fused_gate_up)


def test_recurrent_flags_fall_back_to_full_attention_interval(make_fixture):
    with_key = open_model(make_fixture("tiny", "f32")).config
    without = open_model(make_fixture("tiny", "f32", recurrent_layers_key=False)).config
    assert not GGUFFile(make_fixture("tiny", "f32", recurrent_layers_key=False)).has("qwen35moe.attention.recurrent_layers")
    assert with_key.is_recurrent == without.is_recurrent


@pytest.mark.parametrize(
    "options, check",
    [
        ({"tied": True}, lambda p: p.tied),
        ({"fused_gate_up": True}, lambda p: all(p.fused_gate_up)),
        ({"mtp": "stripped"}, lambda p: p.mtp == "stripped"),
        ({"mtp": "extras"}, lambda p: p.mtp == "present" and p.mtp_extras == {"nextn.embed_tokens.weight", "nextn.shared_head_head.weight", "nextn.shared_head_norm.weight"}),
    ],
    ids=["tied", "fused_gate_up", "mtp_stripped", "mtp_extras"],
)
def test_variants_are_recognised(make_fixture, options, check):
    m = open_model(make_fixture("tiny", "f32", **options))
    assert check(m.plan)
    if options.get("mtp") == "stripped":
        assert m.config.n_layer_nextn == 0 and m.config.n_layer == 4


@pytest.mark.parametrize("quant", ["f32", "bf16", "q8_0", "q4_k_m", "mxfp4", "iq3_xxs", "tq1_0"])
def test_inspect_reports_types_and_mtp(make_fixture, quant):
    text = describe(open_model(make_fixture("tiny", quant)))
    assert "4 trunk (3 deltanet + 1 attention) + 1 MTP" in text
    assert "D D D A M" in text and "mtp           present" in text
    expected = {"f32": ["F32"], "bf16": ["BF16"], "q8_0": ["Q8_0"], "q4_k_m": ["Q4_K", "Q5_K", "Q6_K", "Q8_0"], "mxfp4": ["MXFP4", "Q8_0"],
                "iq3_xxs": ["IQ3_XXS", "IQ3_S", "IQ2_S"], "tq1_0": ["TQ1_0"]}[quant]  # IQ3_S token_embd was refused once
    for name in expected:
        assert f"  {name} " in text


# ---- errors: each a one-line RefimplError naming the problem ---------------------------------


def _rewrite(src, dst, *, drop_keys=(), set_keys=None, drop_tensors=(), reshape=None, retype=None, pad_ne=(),
             set_tensors=None, qtypes=None):
    """Copy a GGUF with edits, through gguf's writer. ``pad_ne``: names whose ne gets trailing 1s
    (same data) — up to 4 dimensions, as a converter may write them."""
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(str(dst), arch=arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        value = field.contents()
        vtype = field.types[0]
        if (set_keys or {}).get(key) is not None:
            value = set_keys[key]
        sub = field.types[-1] if vtype.name == "ARRAY" else None
        w.add_key_value(key, value, vtype, sub_type=sub)
    for key, value in (set_keys or {}).items():
        if key not in r.fields:
            w.add_string(key, value) if isinstance(value, str) else w.add_uint32(key, value)
    for t in r.tensors:
        if t.name in drop_tensors:
            continue
        qtype = GGMLQuantizationType(t.tensor_type)
        data = np.asarray(t.data)
        if reshape and t.name in reshape:
            w.add_tensor(t.name, np.zeros(reshape[t.name], dtype=np.float32))
            continue
        if retype and t.name in retype:
            w.add_tensor(t.name, np.zeros(data.shape[:-1] + (data.shape[-1] // 32 * 34,), dtype=np.uint8),
                         raw_dtype=GGMLQuantizationType.Q8_0)
            continue
        ne = t.shape.tolist()
        if t.name in pad_ne:
            ne = ne + [1] * (4 - len(ne))
        if qtype not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):  # the writer takes a byte shape
            block, size = GGML_QUANT_SIZES[qtype]
            ne = [ne[0] // block * size] + ne[1:]
        w.add_tensor(t.name, data, raw_shape=tuple(reversed(ne)), raw_dtype=qtype)
    for name, data in (set_tensors or {}).items():  # added at the end; raw bytes in qtypes[name] when given
        qtype = (qtypes or {}).get(name)
        if qtype is None or qtype == GGMLQuantizationType.F32:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)  # a byte shape
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _error(path) -> str:
    with pytest.raises(RefimplError) as e:
        open_model(path)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"NOPE" + bytes(100))
    assert "not a GGUF file" in _error(p)


def test_missing_file(tmp_path):
    assert "no such file" in _error(tmp_path / "absent.gguf")


def test_truncated_header(make_fixture, tmp_path):
    p = tmp_path / "t.gguf"
    p.write_bytes(make_fixture("tiny", "f32").read_bytes()[:200])
    assert "truncated or corrupt GGUF header" in _error(p)


def test_truncated_tensor_data(make_fixture, tmp_path):
    p = tmp_path / "t.gguf"
    data = make_fixture("tiny", "f32").read_bytes()
    p.write_bytes(data[: len(data) - 1000])
    assert "truncated" in _error(p)


def test_wrong_architecture(make_fixture, tmp_path):
    src = make_fixture("tiny", "f32")
    r = GGUFReader(src)
    dst = tmp_path / "llama.gguf"
    # rewrite the architecture string in place: same length keeps every offset valid
    raw = bytearray(src.read_bytes())
    i = raw.index(b"qwen35moe", raw.index(b"general.architecture"))
    raw[i : i + 9] = b"deepseek2"
    dst.write_bytes(bytes(raw))
    assert r.fields["general.architecture"].contents() == "qwen35moe"
    assert _error(dst).endswith("architecture 'deepseek2' is not supported (refimpl implements qwen35moe, qwen35, qwen3next)")


def test_missing_required_key(make_fixture, tmp_path):
    dst = _rewrite(make_fixture("tiny", "f32"), tmp_path / "k.gguf", drop_keys=("qwen35moe.ssm.state_size",))
    assert _error(dst).endswith("missing required metadata key 'qwen35moe.ssm.state_size'")


def test_missing_tensor(make_fixture, tmp_path):
    dst = _rewrite(make_fixture("tiny", "f32"), tmp_path / "t.gguf", drop_tensors=("blk.1.ssm_out.weight",))
    assert _error(dst).endswith("missing tensor 'blk.1.ssm_out.weight'")


def test_shape_contradicting_config(make_fixture, tmp_path):
    dst = _rewrite(make_fixture("tiny", "f32"), tmp_path / "s.gguf", reshape={"blk.3.attn_k.weight": (64, 256)})
    msg = _error(dst)
    assert msg.endswith("tensor 'blk.3.attn_k.weight' has ne [256, 64], but llama.cpp expects ne [256, 128] "
                        "(trailing dimensions of 1 may be added or left out)")


def test_a_dimension_of_one_is_not_a_free_dimension(make_fixture, tmp_path):
    """Only *trailing* 1s are free (check_tensor_dims): a vector written as ne [1, E] is refused."""
    src = make_fixture("tiny", "f32")
    E = open_model(src).config.n_embd
    dst = _rewrite(src, tmp_path / "s.gguf", reshape={"blk.0.ffn_gate_inp_shexp.weight": (E, 1)})
    assert f"has ne [1, {E}], but llama.cpp expects ne [{E}]" in _error(dst)


@pytest.mark.parametrize("quant", ["f32", "q4_k_m"])
def test_trailing_dimensions_of_one_are_accepted_as_llama_cpp_does(make_fixture, tmp_path, quant):
    """Every tensor written with ne padded to 4 dimensions (ffn_gate_inp_shexp as ne [E, 1] is what
    convert_hf_to_gguf.py writes for HF's (1, E) shared_expert_gate) loads, with the expected shapes,
    and computes the same logits bit for bit."""
    from refimpl.model.trunk import forward, load_model
    from refimpl.model.state import SeqState

    src = make_fixture("tiny", quant)
    names = tuple(t.name for t in GGUFReader(src).tensors if len(t.shape) < 4)
    dst = _rewrite(src, tmp_path / "padded.gguf", pad_ne=names)
    padded, plain = open_model(dst), open_model(src)
    assert GGUFReader(dst).tensors[0].shape.tolist()[-1] == 1  # the rewrite really padded
    assert {n: i.shape for n, i in padded.gguf.tensors.items()} == {n: i.shape for n, i in plain.gguf.tensors.items()}
    tokens = [1, 5, 9, 2, 7, 3]
    a, b = (forward(m, SeqState.fresh(m.config), tokens)[0] for m in (load_model(dst), load_model(src)))
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_f32_only_tensor_quantized(make_fixture, tmp_path):
    dst = _rewrite(make_fixture("tiny", "f32"), tmp_path / "q.gguf", retype={"blk.0.ffn_gate_inp_shexp.weight"})
    assert "tensor 'blk.0.ffn_gate_inp_shexp.weight' must be F32" in _error(dst)


def test_unsupported_quant_type(make_fixture, tmp_path):
    src = make_fixture("tiny", "f32")
    r = GGUFReader(src)
    t = next(t for t in r.tensors if t.name == "blk.0.ffn_gate_shexp.weight")
    # patch the type id of that tensor descriptor to NVFP4, whose block (64 values, 36 bytes)
    # has a different size: the reader still parses it, the loader must refuse it
    raw = bytearray(src.read_bytes())
    name = t.name.encode()
    i = raw.index(name) + len(name)
    n_dims = int.from_bytes(raw[i : i + 4], "little")
    type_off = i + 4 + 8 * n_dims
    raw[type_off : type_off + 4] = int(GGMLQuantizationType.NVFP4).to_bytes(4, "little")
    dst = tmp_path / "iq.gguf"
    dst.write_bytes(bytes(raw))
    msg = _error(dst)
    assert "unsupported quant type NVFP4" in msg or "truncated" in msg


def test_a_declared_mtp_block_without_its_tensors_is_refused_as_llama_cpp_refuses_it(make_fixture, tmp_path):
    """llama.cpp creates the nextn tensors (unloaded) even without load_mtp: check_tensor_dims
    "tensor 'blk.4.attn_norm.weight' not found" (tests/test_fixtures_llama.py runs it)."""
    src = make_fixture("tiny", "f32")
    names = [t.name for t in GGUFReader(src).tensors if t.name.startswith("blk.4.")]
    msg = _error(_rewrite(src, tmp_path / "nomtp.gguf", drop_tensors=tuple(names)))
    assert "missing tensor 'blk.4." in msg and "declares an MTP block (qwen35moe.nextn_predict_layers = 1)" in msg


def test_a_tensor_the_graph_does_not_read_is_refused(make_fixture, tmp_path):
    """llama.cpp refuses a file with unclaimed tensors ("wrong number of tensors"); refimpl too — it
    must not silently drop, e.g., an attention bias it does not implement."""
    src = make_fixture("tiny", "f32")
    E = open_model(src).config.n_embd
    dst = _rewrite(src, tmp_path / "bias.gguf", set_tensors={"blk.3.attn_k.bias": np.zeros(E, dtype=np.float32)})
    assert "tensor 'blk.3.attn_k.bias' is not one the qwen35moe graph reads" in _error(dst)


@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_fused_qkv_attention_gives_the_same_logits(make_fixture, tmp_path, quant):
    """convert_hf_to_gguf.py --fuse-qkv: every full-attention block (trunk and nextn) holds attn_qkv,
    rows [Q and gate ‖ K ‖ V]; refimpl reads its row blocks and computes the same bits."""
    from refimpl.decode.drafts import mtp_catchup_logits
    from refimpl.model.trunk import forward, load_model
    from refimpl.model.state import SeqState

    src = make_fixture("tiny", quant)
    c = open_model(src).config
    r = GGUFReader(src)
    data = {t.name: np.asarray(t.data) for t in r.tensors}
    fused, drop = {}, []
    for il in range(c.n_layer_all):
        if il < c.n_layer and c.is_recurrent[il]:
            continue
        parts = [f"blk.{il}.attn_{x}.weight" for x in "qkv"]
        fused[f"blk.{il}.attn_qkv.weight"] = np.concatenate([data[p] for p in parts])
        drop += parts
    dst = _rewrite(src, tmp_path / "fused.gguf", drop_tensors=tuple(drop), set_tensors=fused,
                   qtypes={n: GGMLQuantizationType(next(t.tensor_type for t in r.tensors if t.name == f"blk.{n.split('.')[1]}.attn_q.weight")) for n in fused})
    a, b = load_model(dst), load_model(src)
    assert a.file.plan.fused_qkv == tuple(il >= c.n_layer or not c.is_recurrent[il] for il in range(c.n_layer_all))
    tokens = [1, 5, 9, 2, 7, 3]
    (la, ha, _), (lb, hb, _) = (forward(m, SeqState.fresh(c), tokens) for m in (a, b))
    assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))
    assert np.array_equal(mtp_catchup_logits(a, tokens, ha).view(np.uint32), mtp_catchup_logits(b, tokens, hb).view(np.uint32))


def test_a_vocabulary_only_file_is_refused_by_name(make_fixture, tmp_path):
    src = make_fixture("tiny", "f32")
    dst = _rewrite(src, tmp_path / "v.gguf", drop_tensors=tuple(t.name for t in GGUFReader(src).tensors))
    assert "a vocabulary-only GGUF (no tensors" in _error(dst)


def test_a_split_gguf_part_is_refused_with_the_merge_command(make_fixture, tmp_path):
    dst = _rewrite(make_fixture("tiny", "f32"), tmp_path / "p.gguf", set_keys={"split.count": 3})
    assert "part 1 of a 3-part split GGUF" in _error(dst) and "llama-gguf-split --merge" in _error(dst)


def test_load_config_rejects_bad_sections(make_fixture, tmp_path):
    dst = _rewrite(make_fixture("tiny", "f32"), tmp_path / "r.gguf", set_keys={"qwen35moe.rope.dimension_sections": [3, 3, 2]})
    with pytest.raises(RefimplError, match="must be an array of exactly 4 integers"):
        load_config(GGUFFile(dst))


def test_copy_is_still_loadable(make_fixture, tmp_path):
    """The rewrite helper itself produces valid files (so the error tests test the edit, not it)."""
    dst = _rewrite(make_fixture("tiny", "f32"), tmp_path / "same.gguf")
    assert open_model(dst).config == open_model(make_fixture("tiny", "f32")).config
    shutil.copy(dst, tmp_path / "again.gguf")
