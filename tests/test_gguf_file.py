"""refimpl/io/gguf_file.py's header parser: the same keys, types, values, tensor table and tensor views
as gguf-py's ``GGUFReader`` on every committed GGUF (the trained model, the converter-made files of
golden/converted) and the fixtures; every damaged header a one-line RefimplError; and one read of
the header per ``refimpl run``."""

import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from refimpl.fixtures.builtin import TRAINED_PATH
from refimpl.errors import RefimplError
from refimpl.fixtures import QUANT_MIXES
from refimpl.io.gguf_file import GGUFFile

VT = GGUFValueType


def assert_agrees_with_gguf_reader(path) -> None:
    """Every key (in order), its type and value, and every tensor's entry and data view are those of
    ``GGUFReader``, the reference."""
    gf, r = GGUFFile(path), GGUFReader(path)
    assert gf.keys() == list(r.fields)
    for key, field in r.fields.items():
        assert gf.key_type(key) == field.types[0], key
        if field.types[0] == VT.ARRAY and len(field.types) > 1:  # (an empty array: gguf-py records no item type)
            assert gf.item_type(key) == field.types[-1], key
        value = gf.key(key)
        assert value == field.contents() and type(value) is type(field.contents()), key
    assert list(gf.tensors) == [t.name for t in r.tensors]
    for t in r.tensors:
        info = gf.tensors[t.name]
        assert (info.qtype, info.ne, info.offset, info.n_bytes) == (t.tensor_type, tuple(t.shape.tolist()), t.data_offset, t.n_bytes)
        raw = gf.raw(t.name)
        assert (raw.dtype, raw.shape) == (t.data.dtype, t.data.shape) and not raw.flags.writeable, t.name
        assert np.array_equal(raw.view(np.uint8), t.data.view(np.uint8)), t.name


CONVERTED = Path(__file__).resolve().parents[1] / "golden" / "converted"  # convert_hf_to_gguf.py / llama-quantize output
FILES = (["kjv"] + sorted(p.name for p in CONVERTED.glob("*.gguf")) + [f"tiny/{quant}" for quant in QUANT_MIXES]
         + ["tiny/bf16/arch=qwen35", "tiny/q8_0/arch=qwen3next", "predictable/q8_0"])  # every committed GGUF; every mix and arch


@pytest.mark.parametrize("source", FILES)
def test_header_agrees_with_gguf_reader(make_fixture, source):
    if source == "kjv":
        path = TRAINED_PATH
    elif source.endswith(".gguf"):
        path = CONVERTED / source
    else:
        preset, quant, *opts = source.split("/")
        path = make_fixture(preset, quant, **dict(o.split("=") for o in opts))
    assert_agrees_with_gguf_reader(path)


# ---- hand-built headers ---------------------------------------------------------------------------


def _str(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _kv(key: bytes, vtype: VT, payload: bytes) -> bytes:
    return _str(key) + struct.pack("<I", vtype) + payload


def _array(item: VT, n: int, payload: bytes) -> bytes:
    return struct.pack("<IQ", item, n) + payload


def _tensor(name: bytes, ne: list[int], qtype: int = 0, offset: int = 0) -> bytes:
    return _str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", qtype, offset)


KVS = [
    _kv(b"general.architecture", VT.STRING, _str(b"qwen35")),
    _kv(b"a.u32", VT.UINT32, struct.pack("<I", 7)),
    _kv(b"a.f32", VT.FLOAT32, struct.pack("<f", 0.1)),
    _kv(b"a.bool", VT.BOOL, b"\x01"),
    _kv(b"a.strings", VT.ARRAY, _array(VT.STRING, 3, _str("é".encode()) + _str(b"") + _str(b"x y"))),
    _kv(b"a.ints", VT.ARRAY, _array(VT.INT32, 2, struct.pack("<2i", -1, 5))),
    _kv(b"a.empty", VT.ARRAY, _array(VT.UINT8, 0, b"")),
]
TENSORS = [_tensor(b"w", [4, 2])]  # F32, ne [4, 2]: numpy (2, 4), 32 bytes at offset 0


def _write(path, kvs=KVS, tensors=TENSORS, *, version=3, n_kv=None, n_tensors=None, data=bytes(32)):
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(tensors)
    path.write_bytes(head + bytes(-len(head) % 32) + data)
    return path


def _error(path, key=None) -> str:
    with pytest.raises(RefimplError) as e:
        gf = GGUFFile(path)
        if key is not None:
            gf.key(key)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    return msg


def test_a_hand_built_header_agrees_with_gguf_reader(tmp_path):
    path = _write(tmp_path / "ok.gguf")
    assert_agrees_with_gguf_reader(path)
    gf = GGUFFile(path)
    assert gf.key("a.strings") == ["é", "", "x y"] and gf.key("a.empty") == [] and gf.item_type("a.empty") == VT.UINT8
    assert gf.key("a.f32") == float(np.float32(0.1)) and gf.key("a.bool") is True
    assert gf.tensors["w"].shape == (2, 4) and gf.raw("w").shape == (2, 4)
    first = gf.key("a.strings")
    first.append("changed")  # each call hands out a list of its own
    assert gf.key("a.strings") == ["é", "", "x y"]


def test_every_truncation_of_a_header_is_one_line(tmp_path):
    whole = _write(tmp_path / "ok.gguf").read_bytes()
    header_end = len(whole) - 32
    for cut in range(4, header_end):
        p = tmp_path / "cut.gguf"
        p.write_bytes(whole[:cut])
        assert "truncated" in _error(p), cut


@pytest.mark.parametrize("what, kvs, tensors, counts, expected", [
    ("kv count", KVS, TENSORS, {"n_kv": 2**64 - 1}, "truncated"),
    ("tensor count", KVS, TENSORS, {"n_tensors": 2**64 - 1}, "truncated"),
    ("string length", [_kv(b"k", VT.STRING, struct.pack("<Q", 2**64 - 1))], [], {}, "truncated"),
    ("key length", [struct.pack("<Q", 2**64 - 1) + b"k"], [], {}, "truncated"),
    ("string array length", [_kv(b"k", VT.ARRAY, _array(VT.STRING, 2**64 - 1, _str(b"a")))], [], {}, "truncated"),
    ("an item's length", [_kv(b"k", VT.ARRAY, _array(VT.STRING, 2, _str(b"a") + struct.pack("<Q", 2**64 - 1)))], [], {}, "truncated"),
    ("int array length", [_kv(b"k", VT.ARRAY, _array(VT.INT64, 2**64 - 1, b""))], [], {}, "truncated"),
    ("dimension count", KVS, [_str(b"w") + struct.pack("<I", 2**32 - 1)], {}, "truncated"),
    ("a dimension", KVS, [_tensor(b"w", [2**64 - 1, 2**64 - 1])], {}, "truncated file: tensor w needs bytes"),
    ("tensor offset", KVS, [_tensor(b"w", [4, 2], offset=2**64 - 1)], {}, "truncated file: tensor w needs bytes"),
])
def test_absurd_counts_and_lengths_are_one_line(tmp_path, what, kvs, tensors, counts, expected):
    assert expected in _error(_write(tmp_path / "x.gguf", kvs, tensors, **counts))


@pytest.mark.parametrize("kvs, tensors, version, expected", [
    (KVS, TENSORS, 1, "GGUF version 1 is not supported"),
    (KVS, TENSORS, 3 << 24, "big-endian"),
    (KVS + [KVS[1]], TENSORS, 3, "duplicate metadata key 'a.u32'"),
    (KVS, TENSORS * 2, 3, "duplicate tensor 'w'"),
    ([_kv(b"k", 13, b"")], [], 3, "metadata key 'k' has unknown GGUF value type 13"),
    ([_kv(b"k", VT.ARRAY, _array(VT.ARRAY, 1, _array(VT.UINT8, 0, b"")))], [], 3, "metadata key 'k' is an array of arrays"),
    ([_kv(b"general.alignment", VT.UINT32, struct.pack("<I", 24))], [], 3, "general.alignment must be a power of two"),
    ([_kv(b"general.alignment", VT.UINT64, struct.pack("<Q", 32))], [], 3, "general.alignment must be a power of two of type UINT32"),
    (KVS, [_tensor(b"w", [4, 2], qtype=99)], 3, "tensor 'w' has unknown ggml type 99"),
    (KVS, [_tensor(b"w", [31, 2], qtype=8)], 3, "tensor 'w' of type Q8_0 has rows of 31 elements, not a multiple of the block size 32"),
    ([_kv(b"bad\xff", VT.UINT8, b"\x00")], [], 3, "metadata key 0 of 1 is not valid UTF-8"),
    (KVS, [_tensor(b"w\xc3", [4, 2])], 3, "tensor 0 of 1: its name is not valid UTF-8"),
])
def test_damaged_headers_are_one_line(tmp_path, kvs, tensors, version, expected):
    assert expected in _error(_write(tmp_path / "x.gguf", kvs, tensors, version=version))


@pytest.mark.parametrize("payload, expected", [
    (_array(VT.STRING, 3, _str(b"ok") + _str(b"\xe2\x82") + _str(b"\xac")), "string 1 of 3 is not valid UTF-8"),  # '€' cut in two
    (_array(VT.STRING, 2, _str(b"") + _str(b"\x80")), "string 1 of 2 is not valid UTF-8"),
])
def test_text_that_is_not_utf8_names_its_key(tmp_path, payload, expected):
    path = _write(tmp_path / "x.gguf", KVS + [_kv(b"tokenizer.ggml.tokens", VT.ARRAY, payload)])
    msg = _error(path, "tokenizer.ggml.tokens")
    assert "metadata key 'tokenizer.ggml.tokens'" in msg and expected in msg
    assert GGUFFile(path).key("a.strings") == ["é", "", "x y"]  # the other keys still read


def test_a_string_value_that_is_not_utf8_names_its_key(tmp_path):
    path = _write(tmp_path / "x.gguf", KVS + [_kv(b"general.name", VT.STRING, _str(b"caf\xe9"))])
    assert "metadata key 'general.name' is not valid UTF-8" in _error(path)


# ---- one read per process -------------------------------------------------------------------------


def test_refimpl_run_reads_the_header_once(make_fixture, monkeypatch, capsys):
    """``refimpl run`` opens the file once: the compile report's type names, the config, the weights and
    the tokenizer all read the same :class:`GGUFFile`, and gguf-py's slow reader is never built."""
    from refimpl.cli import main

    path = make_fixture("tiny", "q8_0")
    reads = []
    parse = GGUFFile._read_header
    monkeypatch.setattr(GGUFFile, "_read_header", lambda self: reads.append(self.path) or parse(self))
    monkeypatch.setattr(GGUFReader, "__init__", lambda self, *a, **k: reads.append("GGUFReader"))
    assert main(["run", str(path), "--tokens", "1,2,3", "-n", "1", "--json"]) == 0
    assert reads == [path]
    assert '"tokens"' in capsys.readouterr().out
