"""Step 1 of the dataflow: open a GGUF file and describe what is in it.

A GGUF file is a header of typed key/value metadata, a table of tensor descriptors, and the aligned
tensor data (``ggml/src/gguf.cpp::gguf_init_from_file_impl`` reads it; docs/gguf.md). This module
memory-maps the file (it is never read whole) and gives the rest of refimpl:

* ``GGUFFile.key(name, …)``: a metadata value — a python scalar, a ``str``, or a ``list`` for an
  array — with the scalar-or-array rule of llama.cpp's ``llama_model_loader::get_key_or_arr``
  available as ``key_or_arr``;
* ``GGUFFile.tensors``: name → :class:`TensorInfo` (qtype, **numpy-order** shape, absolute byte
  offset of the data in the file, byte size), the table the weight loader and the expert streamer
  read from; ``raw(name)`` the tensor's bytes.

The header is parsed here, with gguf-py's enums and size tables (``GGUFValueType``,
``GGMLQuantizationType``, ``GGML_QUANT_SIZES``), rather than by ``gguf.GGUFReader``: the reader builds
numpy views for every element of every array, ~750 000 of them for a real Qwen3.5 vocabulary
(``tokenizer.ggml.tokens``, ``token_type``, ``merges``), which took ~10 s per open. Here an array
costs one pass over its string lengths at open, and its values are decoded in bulk when first asked
for (the tokenizer, the config's vocabulary size) and kept. Values, types, the tensor table and the
tensor views are those of ``GGUFReader`` — tests/test_gguf_file.py compares the two on the committed
files — except where llama.cpp refuses a file that the reader would take: a byte-swapped (big-endian)
file, an array of arrays.

Shapes: ggml lists dimensions fastest-first (``ne``); numpy lists them slowest-first. A tensor with
``ne = [a, b, c]`` is numpy ``(c, b, a)`` (docs/gguf.md §1). :class:`TensorInfo` stores the numpy order, and
``ne`` is kept for messages that quote llama.cpp.

Every way a file can be unreadable ends here as a one-line :class:`~refimpl.errors.RefimplError`:
a truncated header, a count or length that runs past the end of the file (checked before anything is
allocated for it), an unknown value or tensor type, a duplicate key or tensor, text that is not UTF-8
(named by its key, when that key is read).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

from refimpl.errors import RefimplError

VT = GGUFValueType
SUPPORTED_VERSIONS = (2, 3)  # gguf.cpp: v1 is refused, v2 and v3 share one layout
SCALAR_DTYPES = {  # the fixed-size value types, little-endian (GGUFReader.gguf_scalar_to_np)
    VT.UINT8: np.dtype("<u1"), VT.INT8: np.dtype("<i1"), VT.UINT16: np.dtype("<u2"), VT.INT16: np.dtype("<i2"),
    VT.UINT32: np.dtype("<u4"), VT.INT32: np.dtype("<i4"), VT.FLOAT32: np.dtype("<f4"), VT.BOOL: np.dtype("?"),
    VT.UINT64: np.dtype("<u8"), VT.INT64: np.dtype("<i8"), VT.FLOAT64: np.dtype("<f8"),
}
ELEMENT_DTYPES = {  # tensor types GGUFReader hands out as typed values; every other type is uint8 rows
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor descriptor. ``shape`` is numpy order (slowest axis first)."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the tensor data in the file
    n_bytes: int

    @property
    def ne(self) -> tuple[int, ...]:
        """The ggml (fastest-first) shape, as llama.cpp prints it."""
        return tuple(reversed(self.shape))


@dataclass
class _Field:
    """One metadata value as the header holds it. Scalars and strings are decoded at open
    (``value``); an array keeps where its items are and is decoded on first use."""

    type: GGUFValueType
    value: object = None  # the decoded value (an array's: a tuple, once decoded)
    item_type: GGUFValueType | None = None  # arrays: the type of the items
    offset: int = 0  # arrays of fixed-size items: the byte offset of the first item
    count: int = 0  # arrays: the number of items
    starts: np.ndarray | None = None  # arrays of strings: each item's first byte ([count] int64)
    lengths: np.ndarray | None = None  # … and its length in bytes ([count] int64)


class _Truncated(Exception):
    """Raised inside the parser when a read runs past the end of the file."""


class _Header:
    """A cursor over the mapped file: reads the header front to back (``gguf.cpp``'s ``gguf_reader``)."""

    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.size, self.path, self.pos = buf, len(buf), path, 0

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise _Truncated(f"{what} needs {n} bytes at offset {self.pos}, the file has {self.size - self.pos} left")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def text(self, what: str) -> str:
        """A length-prefixed UTF-8 string."""
        n = self.u64(what)
        self.need(n, what)
        start, self.pos = self.pos, self.pos + n
        return _utf8(self.buf[start : start + n], self.path, what)

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.u32(what)
        try:
            return VT(raw)
        except ValueError:
            raise RefimplError(f"{self.path}: {what} has unknown GGUF value type {raw}") from None

    def field(self, key: str) -> _Field:
        """The value of metadata key ``key`` (its type just read)."""
        vtype = self.value_type(f"metadata key '{key}'")
        if vtype == VT.STRING:
            return _Field(vtype, self.text(f"metadata key '{key}'"))
        if vtype in SCALAR_DTYPES:
            dtype = SCALAR_DTYPES[vtype]
            self.need(dtype.itemsize, f"metadata key '{key}'")
            value = np.frombuffer(self.buf, dtype, 1, self.pos).tolist()[0]  # as GGUFReader: .tolist()[0]
            self.pos += dtype.itemsize
            return _Field(vtype, value)
        item = self.value_type(f"metadata key '{key}' (array)")
        count = self.u64(f"metadata key '{key}' (array length)")
        if item == VT.ARRAY:  # gguf.cpp: "key '…' has invalid GGUF type"
            raise RefimplError(f"{self.path}: metadata key '{key}' is an array of arrays, which GGUF (gguf.cpp) does not allow")
        if item == VT.STRING:
            return _Field(vtype, item_type=item, count=count, **self.string_items(count, f"metadata key '{key}'"))
        dtype = SCALAR_DTYPES[item]
        self.need(count * dtype.itemsize, f"metadata key '{key}' ({count} × {item.name})")
        f = _Field(vtype, item_type=item, offset=self.pos, count=count)
        self.pos += count * dtype.itemsize
        return f

    def string_items(self, count: int, what: str) -> dict:
        """Walk ``count`` length-prefixed strings: their starts and lengths, nothing decoded."""
        self.need(8 * count, f"{what} ({count} strings)")  # each item has at least its 8-byte length
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        starts, lengths = [], []  # grown item by item: a corrupt count stops at the end of the file
        for i in range(count):
            if pos + 8 > size:
                raise _Truncated(f"{what}: string {i} of {count} starts past the end of the file")
            (n,) = unpack(buf, pos)
            pos += 8
            starts.append(pos)
            lengths.append(n)
            pos += n
        if pos > size:
            raise _Truncated(f"{what}: its strings run {pos - size} bytes past the end of the file")
        self.pos = pos
        return {"starts": np.array(starts, dtype=np.int64), "lengths": np.array(lengths, dtype=np.int64)}


def _utf8(data, path: Path, what: str) -> str:
    try:
        return str(data, encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RefimplError(f"{path}: {what} is not valid UTF-8 (byte {exc.start}: {bytes(data[exc.start:exc.start + 4])!r})") from None


def _decode_strings(buf: memoryview, f: _Field, path: Path, key: str) -> tuple[str, ...]:
    """An array of strings, decoded: one copy of the array's bytes, then one ``decode`` per item
    (~0.1 s for a 248320-token list). An item that is not UTF-8 is named by its key and index."""
    if f.count == 0:
        return ()
    base = int(f.starts[0])
    region = bytes(buf[base : int(f.starts[-1] + f.lengths[-1])])
    starts = (f.starts - base).tolist()
    ends = (f.starts - base + f.lengths).tolist()
    try:
        return tuple([region[a:b].decode("utf-8") for a, b in zip(starts, ends)])
    except UnicodeDecodeError:
        pass
    for i, (a, b) in enumerate(zip(starts, ends)):  # the first item that fails, for the message
        try:
            region[a:b].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RefimplError(f"{path}: metadata key '{key}': string {i} of {f.count} is not valid UTF-8 "
                               f"(byte {exc.start}: {region[a:b][exc.start : exc.start + 4]!r})") from None
    raise AssertionError("unreachable: the whole array failed to decode, no item did")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


class GGUFFile:
    """A memory-mapped GGUF file: metadata keys and the tensor table.

    ``raw(name)`` returns the tensor's bytes as ``gguf.GGUFReader`` exposes them (a read-only view
    into the memory map: float32/float16 arrays for F32/F16, uint8 rows of ``row_bytes`` for BF16 and
    the quantized types), without copying.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_file():
            raise RefimplError(f"{self.path}: no such file")
        self.file_size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise RefimplError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        try:
            self._map = np.memmap(self.path, mode="r")  # uint8 [file_size], read-only
        except (OSError, ValueError) as exc:
            raise RefimplError(f"{self.path}: cannot map the file ({_first_line(exc)})") from None
        self._buf = memoryview(self._map)
        # the same bytes as a plain ndarray: a memmap's slices are memmaps, each made through numpy.memmap's
        # __getitem__ and __array_finalize__ (~3 µs a slice: a plain-path token slices its weights hundreds of times)
        self._bytes = self._map.view(np.ndarray)
        try:
            self._fields, self.tensors, self.data_offset = self._read_header()
        except _Truncated as exc:
            raise RefimplError(f"{self.path}: truncated or corrupt GGUF header ({exc})") from None
        for t in self.tensors.values():
            if t.offset + t.n_bytes > self.file_size:
                raise RefimplError(
                    f"{self.path}: truncated file: tensor {t.name} needs bytes up to "
                    f"{t.offset + t.n_bytes} but the file has {self.file_size}"
                )

    def _read_header(self) -> tuple[dict[str, _Field], dict[str, TensorInfo], int]:
        """Parse magic, version, counts, the key/value pairs and the tensor table (gguf.cpp's order)."""
        h = _Header(self._buf, self.path)
        h.pos = 4  # the magic, checked
        version = h.u32("the version")
        if version & 0xFFFF == 0 and version:  # gguf.cpp: the other byte order reads as v3 << 24
            raise RefimplError(f"{self.path}: GGUF version {version:#x} looks byte-swapped: a big-endian file, "
                               "which llama.cpp does not read on this machine")
        if version not in SUPPORTED_VERSIONS:
            raise RefimplError(f"{self.path}: GGUF version {version} is not supported (only {SUPPORTED_VERSIONS})")
        n_tensors, n_kv = h.u64("the tensor count"), h.u64("the key/value count")
        fields = {  # GGUFReader's pseudo-keys for the header
            "GGUF.version": _Field(VT.UINT32, version),
            "GGUF.tensor_count": _Field(VT.UINT64, n_tensors),
            "GGUF.kv_count": _Field(VT.UINT64, n_kv),
        }
        for i in range(n_kv):  # each pair takes ≥ 13 bytes: a count past the end stops at the end
            key = h.text(f"metadata key {i} of {n_kv}")
            if key in fields:
                raise RefimplError(f"{self.path}: duplicate metadata key '{key}'")
            fields[key] = h.field(key)
        alignment = GGUF_DEFAULT_ALIGNMENT
        if "general.alignment" in fields:
            a = fields["general.alignment"]
            if a.type != VT.UINT32 or a.value == 0 or a.value & (a.value - 1):
                raise RefimplError(f"{self.path}: general.alignment must be a power of two of type UINT32, got "
                                   f"{a.type.name} {a.value if a.item_type is None else '[…]'}")
            alignment = a.value
        table = [self._tensor_entry(h, i, n_tensors) for i in range(n_tensors)]
        data_offset = -(-h.pos // alignment) * alignment  # GGUFReader pads even with no tensors
        tensors: dict[str, TensorInfo] = {}
        for name, qtype, shape, offset, n_bytes in table:
            if name in tensors:
                raise RefimplError(f"{self.path}: duplicate tensor '{name}'")
            tensors[name] = TensorInfo(name, qtype, shape, data_offset + offset, n_bytes)
        return fields, tensors, data_offset

    def _tensor_entry(self, h: _Header, i: int, n: int) -> tuple:
        """One tensor descriptor: (name, qtype, numpy shape, offset in the data section, bytes)."""
        name = h.text(f"tensor {i} of {n}: its name")
        n_dims = h.u32(f"tensor '{name}'")
        h.need(8 * n_dims, f"tensor '{name}' ({n_dims} dimensions)")
        ne = [h.u64(f"tensor '{name}'") for _ in range(n_dims)]
        raw_type = h.u32(f"tensor '{name}'")
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise RefimplError(f"{self.path}: tensor '{name}' has unknown ggml type {raw_type}") from None
        offset = h.u64(f"tensor '{name}'")
        block, type_size = GGML_QUANT_SIZES[qtype]
        if qtype not in ELEMENT_DTYPES and (not ne or ne[0] % block):  # gguf.cpp and GGUFReader refuse it
            raise RefimplError(f"{self.path}: tensor '{name}' of type {qtype.name} has rows of {ne[0] if ne else 0} "
                               f"elements, not a multiple of the block size {block}")
        n_elements = int(np.prod(ne, dtype=object)) if ne else 1
        return name, qtype, tuple(reversed(ne)), offset, n_elements * type_size // block

    # ---- metadata -----------------------------------------------------------------------------

    def keys(self) -> list[str]:
        """Every metadata key, in file order (after GGUFReader's ``GGUF.*`` pseudo-keys)."""
        return list(self._fields)

    def has(self, key: str) -> bool:
        return key in self._fields

    def key(self, key: str, default=None, *, required: bool = False):
        """The value of a metadata key: a python scalar, a str, or a (new) list for an array."""
        f = self._fields.get(key)
        if f is None:
            if required:
                raise RefimplError(f"{self.path}: missing required metadata key '{key}'")
            return default
        if f.item_type is None:
            return f.value
        if f.value is None:  # an array, decoded once
            if f.item_type == VT.STRING:
                f.value = _decode_strings(self._buf, f, self.path, key)
            else:
                f.value = tuple(np.frombuffer(self._buf, SCALAR_DTYPES[f.item_type], f.count, f.offset).tolist())
        return list(f.value)

    def key_type(self, key: str) -> GGUFValueType | None:
        """The key's value type (``ARRAY`` for arrays; see :meth:`item_type`), None when absent."""
        f = self._fields.get(key)
        return None if f is None else f.type

    def item_type(self, key: str) -> GGUFValueType | None:
        """The type of an array key's items (None for a scalar or an absent key)."""
        f = self._fields.get(key)
        return None if f is None else f.item_type

    def key_or_arr(self, key: str, n: int, default=None, *, required: bool = False) -> list | None:
        """llama.cpp's ``get_key_or_arr``: a scalar is broadcast to ``n`` entries; an array must
        have exactly ``n`` entries (``src/llama-model-loader.cpp``)."""
        value = self.key(key, None, required=required)
        if value is None:
            return None if default is None else [default] * n
        if isinstance(value, list):
            if len(value) != n:
                raise RefimplError(
                    f"{self.path}: metadata key '{key}' is an array of length {len(value)}, expected {n}"
                )
            return value
        return [value] * n

    # ---- tensor data --------------------------------------------------------------------------

    def will_need(self) -> bool:
        """Ask the kernel to read the whole file into the page cache in the background (``MADV_WILLNEED``): its
        pages then come in by large sequential reads instead of one fault at a time as the first tokens touch
        them. Only for a file that fits in memory (the caller's rule). Returns whether it was asked."""
        mm = getattr(self._map, "_mmap", None)
        advice = getattr(mmap, "MADV_WILLNEED", None)
        if mm is None or advice is None:
            return False
        try:
            mm.madvise(advice)
        except OSError:
            return False
        return True

    def raw(self, name: str) -> np.ndarray:
        """Read-only view of a tensor's data in the memory map (see the class docstring)."""
        try:
            t = self.tensors[name]
        except KeyError:
            raise RefimplError(f"{self.path}: missing tensor '{name}'") from None
        data = self._bytes[t.offset : t.offset + t.n_bytes]
        if t.qtype in ELEMENT_DTYPES:
            return data.view(ELEMENT_DTYPES[t.qtype]).reshape(t.shape)
        return data.reshape(quant_shape_to_byte_shape(t.shape, t.qtype))

    def bytes_by_qtype(self) -> dict[str, tuple[int, int]]:
        """qtype name → (tensor count, total bytes), for ``refimpl inspect``."""
        out: dict[str, tuple[int, int]] = {}
        for t in self.tensors.values():
            n, b = out.get(t.qtype.name, (0, 0))
            out[t.qtype.name] = (n + 1, b + t.n_bytes)
        return dict(sorted(out.items()))
