"""The fixture writer writes the converter's layout: a fixture with the config of a committed conversion
(golden/converted/, made by hf/build.py with the vendored convert_hf_to_gguf.py and llama-quantize) has
the same keys — names, value types and values, in order — and the same tensors — names, ne and ggml types,
in order — as that conversion. The exceptions are listed, each with its reason (EXCEPTIONS). Then the
layouts llama.cpp also loads (layout=legacy and the finer options) load in refimpl and in llama.cpp and
give llama.cpp's logits.
"""

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from refimpl.fixtures.vocab import TOKEN_TYPE_UNUSED

CONVERTED = Path(__file__).resolve().parents[1] / "golden" / "converted"

# (converted file, fixture preset, quant mix, fixture options): every conversion the fixture writer has a
# mix for (IQ4_XS is not one of its mixes).
CASES = [
    ("qwen35moe-narrow-f32.gguf", "narrow", "f32", {}),
    ("qwen35moe-narrow-bf16.gguf", "narrow", "bf16", {}),
    ("qwen35moe-narrow-q8_0.gguf", "narrow", "q8_0", {}),
    ("qwen35moe-narrow-bf16-fused.gguf", "narrow", "bf16", {"fused_gate_up": True, "fused_qkv": True}),
    ("qwen35-narrow-f32.gguf", "narrow", "f32", {"arch": "qwen35"}),
    ("qwen35-narrow-q8_0.gguf", "narrow", "q8_0", {"arch": "qwen35"}),
    ("qwen3next-narrow-f32.gguf", "narrow", "f32", {"arch": "qwen3next"}),
    ("qwen3next-narrow-q8_0.gguf", "narrow", "q8_0", {"arch": "qwen3next"}),
    ("qwen35moe-k-q4_k_m.gguf", "k", "q4_k_m", {}),
    ("qwen35moe-k-mxfp4_moe.gguf", "k", "mxfp4", {}),
    ("qwen35-k-q4_k_m.gguf", "k", "q4_k_m", {"arch": "qwen35"}),
    ("qwen3next-k-q4_k_m.gguf", "k", "q4_k_m", {"arch": "qwen3next"}),
]

# Keys whose values legitimately differ: they depend on the vocabulary's text (the fixtures learn their
# BPE merges from refimpl/fixtures/vocab.py's corpus, hf/build.py's tokenizer from the README) or on
# naming. Their names, positions and value types are still compared; the vocabulary's shape is checked
# on its own (test_the_vocabulary_is_padded_as_the_converter_pads_it).
EXCEPTIONS = {
    "general.name": "from the model card or directory name (the fixture's is 'refimpl fixture PRESET')",
    "tokenizer.ggml.tokens": "the vocabulary's text",
    "tokenizer.ggml.token_type": "which ids are merges, specials or fillers depends on the vocabulary",
    "tokenizer.ggml.merges": "the vocabulary's text",
    "tokenizer.ggml.eos_token_id": "the id of <|im_end|> in that vocabulary",
    "tokenizer.ggml.padding_token_id": "the id of <|endoftext|> in that vocabulary",
}
RECIPE = "refimpl.fixture."  # the fixture's own recipe (docs/fixtures.md): only in fixtures, after every other key
READER_FIELDS = {"GGUF.kv_count": "the recipe keys come on top"}  # GGUFReader's header pseudo-fields


def _keys(reader: GGUFReader) -> dict:
    """name → (value types, value), in file order; the value of an array is its list."""
    out = {}
    for name, f in reader.fields.items():
        types = tuple(GGUFValueType(t).name for t in f.types)
        out[name] = (types, f.contents())
    return out


def _tensors(reader: GGUFReader) -> list:
    return [(t.name, [int(n) for n in t.shape], t.tensor_type.name) for t in reader.tensors]


def layout_differences(fixture: Path, converted: Path) -> list[str]:
    """Every difference of keys (names, order, value types, values but EXCEPTIONS') and tensors (names,
    order, ne, types) between a fixture and a conversion, one line each."""
    a, b = GGUFReader(fixture), GGUFReader(converted)
    ka, kb = _keys(a), _keys(b)
    recipe = [k for k in ka if k.startswith(RECIPE)]
    out = []
    if list(ka)[-len(recipe):] != recipe:
        out.append(f"the recipe keys {RECIPE}* are not the fixture's last keys")
    for k in recipe:
        del ka[k]
    if ka["GGUF.kv_count"][1] - len(recipe) != kb["GGUF.kv_count"][1]:
        out.append(f"kv_count: {ka['GGUF.kv_count'][1]} - {len(recipe)} recipe keys != {kb['GGUF.kv_count'][1]}")
    only_a, only_b = [k for k in ka if k not in kb], [k for k in kb if k not in ka]
    out += [f"key only in the fixture: {k} = {ka[k][1]!r:.80}" for k in only_a]
    out += [f"key only in the conversion: {k} = {kb[k][1]!r:.80}" for k in only_b]
    common_a, common_b = [k for k in ka if k in kb], [k for k in kb if k in ka]
    if common_a != common_b:
        i = next(i for i, (x, y) in enumerate(zip(common_a, common_b)) if x != y)
        out.append(f"key order: the fixture has {common_a[i]} where the conversion has {common_b[i]} (key {i})")
    for k in common_b:
        (ta, va), (tb, vb) = ka[k], kb[k]
        if ta != tb:
            out.append(f"key {k}: value type {'/'.join(ta)} in the fixture, {'/'.join(tb)} in the conversion")
        elif k not in EXCEPTIONS and k not in READER_FIELDS and va != vb:
            out.append(f"key {k}: {va!r:.80} in the fixture, {vb!r:.80} in the conversion")
    ta, tb = _tensors(a), _tensors(b)
    names_a, names_b = [t[0] for t in ta], [t[0] for t in tb]
    out += [f"tensor only in the fixture: {n}" for n in names_a if n not in names_b]
    out += [f"tensor only in the conversion: {n}" for n in names_b if n not in names_a]
    order_a, order_b = [n for n in names_a if n in names_b], [n for n in names_b if n in names_a]
    if order_a != order_b:
        i = next(i for i, (x, y) in enumerate(zip(order_a, order_b)) if x != y)
        out.append(f"tensor order: the fixture has {order_a[i]} where the conversion has {order_b[i]} (tensor {i})")
    by_name = {t[0]: t for t in tb}
    for name, ne, qtype in ta:
        if name in by_name and (ne, qtype) != tuple(by_name[name][1:]):
            out.append(f"tensor {name}: ne {ne} {qtype} in the fixture, ne {by_name[name][1]} {by_name[name][2]} in the conversion")
    return out


@pytest.mark.parametrize("converted, preset, quant, options", CASES, ids=[c[0].removesuffix(".gguf") for c in CASES])
def test_fixture_has_the_layout_of_the_conversion(make_fixture, converted, preset, quant, options):
    diffs = layout_differences(make_fixture(preset, quant, **options), CONVERTED / converted)
    assert not diffs, f"fixture {preset}/{quant} {options} vs {converted}:\n  " + "\n  ".join(diffs)


def test_the_comparison_sees_each_kind_of_difference(make_fixture):
    """The legacy layout differs from the conversion in every way the converter layout fixed; the
    comparison names each."""
    diffs = "\n".join(layout_differences(make_fixture("narrow", "f32", layout="legacy", arch="qwen3next"),
                                         CONVERTED / "qwen3next-narrow-f32.gguf"))
    for expected in ("key only in the conversion: general.type", "key only in the conversion: general.size_label",
                     "key only in the conversion: tokenizer.chat_template", "key order:",
                     "tensor only in the fixture: blk.0.ssm_in.weight", "tensor only in the conversion: blk.0.attn_qkv.weight",
                     "tensor only in the conversion: blk.4.nextn.shared_head_norm.weight",
                     "tensor blk.0.ffn_gate_inp_shexp.weight: ne [64] F32 in the fixture, ne [64, 1] F32 in the conversion",
                     "tensor order:"):
        assert expected in diffs, expected
    diffs = layout_differences(make_fixture("narrow", "q8_0"), CONVERTED / "qwen35moe-narrow-f32.gguf")
    assert "key general.file_type: 7 in the fixture, 0 in the conversion" in diffs
    assert "tensor output.weight: ne [64, 512] Q8_0 in the fixture, ne [64, 512] F32 in the conversion" in diffs


@pytest.mark.parametrize("path", ["fixture", "qwen35moe-narrow-f32.gguf", "qwen3next-k-q4_k_m.gguf"])
def test_the_vocabulary_is_padded_as_the_converter_pads_it(make_fixture, path):
    """Config vocab_size (512) > the tokenizer's size: the ids it lacks are UNUSED tokens named [PAD<id>],
    at the end; the specials are CONTROL; EOS <|im_end|>, padding <|endoftext|>."""
    f = path if path != "fixture" else make_fixture("narrow", "f32")
    k = _keys(GGUFReader(CONVERTED / f if isinstance(f, str) else f))
    tokens, types = k["tokenizer.ggml.tokens"][1], k["tokenizer.ggml.token_type"][1]
    assert len(tokens) == len(types) == 512
    unused = [i for i, t in enumerate(types) if t == TOKEN_TYPE_UNUSED]
    assert unused and unused == list(range(unused[0], 512))
    assert all(tokens[i] == f"[PAD{i}]" for i in unused)
    assert tokens[k["tokenizer.ggml.eos_token_id"][1]] == "<|im_end|>"
    assert tokens[k["tokenizer.ggml.padding_token_id"][1]] == "<|endoftext|>"


# ---- the layouts llama.cpp loads: refimpl and llama.cpp agree on each -------------------------------

PROMPT = [72, 101, 108, 108, 111, 44, 391, 300, 33, 7]
LAYOUT_VARIANTS = [  # (arch, options) on tiny f32: the default and every older layout llama.cpp still loads
    ("qwen35moe", {}), ("qwen35moe", {"layout": "legacy"}), ("qwen35moe", {"shexp_gate_1d": True}),
    ("qwen35moe", {"shared_head_norm": False}), ("qwen35moe", {"fused_qkv": True}),
    ("qwen35", {}), ("qwen35", {"layout": "legacy"}), ("qwen35", {"shared_head_norm": False}),
    ("qwen3next", {}), ("qwen3next", {"layout": "legacy"}), ("qwen3next", {"ssm_in": True}),
    ("qwen3next", {"shexp_gate_1d": True}), ("qwen3next", {"layout": "legacy", "ssm_in": False}),
]


def _refimpl(path):
    from refimpl.decode.drafts import mtp_catchup_logits
    from refimpl.model.trunk import forward, load_model
    from refimpl.model.state import SeqState

    model = load_model(path, progress=False)
    logits, h, _ = forward(model, SeqState.fresh(model.config), PROMPT)
    return model, logits, mtp_catchup_logits(model, PROMPT, h)


@pytest.fixture(scope="module")
def default_logits(make_fixture):
    """refimpl's trunk and MTP logits of each arch's default-layout tiny f32 fixture."""
    return {arch: _refimpl(make_fixture("tiny", "f32", arch=arch))[1:] for arch in ("qwen35moe", "qwen35", "qwen3next")}


@pytest.mark.parametrize("arch, options", LAYOUT_VARIANTS, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}={x}" for k, x in v.items()) or "default")
def test_each_layout_loads_and_gives_llama_cpp_logits(make_fixture, default_logits, arch, options):
    from conformance import rel_rows
    from conftest import require_llama_cpp

    require_llama_cpp()
    from llama_ref import llama_run

    path = make_fixture("tiny", "f32", arch=arch, **options)
    model, logits, mtp = _refimpl(path)
    plan = model.file.plan
    if arch == "qwen3next":
        assert plan.ssm_in[0] == options.get("ssm_in", options.get("layout") == "legacy")
    assert plan.fused_qkv[-1] == options.get("fused_qkv", False)
    ref = llama_run(path, PROMPT, mtp=True)
    assert rel_rows(logits, ref.logits).max() <= 1e-4
    assert rel_rows(mtp, ref.mtp_logits).max() <= 1e-4
    assert np.array_equal(mtp.argmax(1), ref.mtp_logits.argmax(1))
    # the same weights in another layout: the same model (bit for bit where the sums are the same sums)
    base, base_mtp = default_logits[arch]
    if "ssm_in" in options or "fused_qkv" in options or options.get("layout") == "legacy" and arch == "qwen3next":
        assert rel_rows(logits, base).max() <= 1e-5 and rel_rows(mtp, base_mtp).max() <= 1e-5
    else:
        assert np.array_equal(logits, base) and np.array_equal(mtp, base_mtp)


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen35", "qwen3next"])
def test_the_narrow_fixture_gives_llama_cpp_logits(make_fixture, arch):
    """The preset of the conversions' config (head_dim 256 over a hidden of 64), written in their layout."""
    from conformance import rel_rows
    from conftest import require_llama_cpp

    require_llama_cpp()
    from llama_ref import llama_run

    path = make_fixture("narrow", "f32", arch=arch)
    _, logits, mtp = _refimpl(path)
    ref = llama_run(path, PROMPT, mtp=True)
    assert rel_rows(logits, ref.logits).max() <= 1e-4 and rel_rows(mtp, ref.mtp_logits).max() <= 1e-4


@pytest.mark.parametrize("quant", ["q8_0", "q4_k_m"])
def test_the_large_preset_writer_lays_files_out_as_write_fixture(make_fixture, tmp_path, monkeypatch, quant):
    """refimpl.fixtures.large (pooled blocks, one tensor at a time) writes write_fixture's layout: the same
    keys in the same order, the same tensors (names, ne, types) in the same order; refimpl loads it."""
    import dataclasses

    from refimpl.fixtures import large, presets
    from refimpl.io.load import open_model

    monkeypatch.setitem(presets.LARGE_PRESETS, "tiny", dataclasses.replace(presets.PRESETS["tiny"]))
    path = large.write_large_fixture(tmp_path / f"{quant}.gguf", preset="tiny", quant=quant)
    ours, theirs = GGUFReader(path), GGUFReader(make_fixture("tiny", quant))
    ka, kb = _keys(ours), _keys(theirs)
    assert ka.pop("refimpl.fixture.blocks")[1] == "pool"
    assert ka.pop("GGUF.kv_count")[1] == kb.pop("GGUF.kv_count")[1] + 1
    assert list(ka) == list(kb) and ka == kb
    assert _tensors(ours) == _tensors(theirs)
    assert open_model(path).plan.mtp == "present"
