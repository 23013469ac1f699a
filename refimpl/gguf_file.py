"""Step 1 of the dataflow: open a GGUF file and describe what is in it.

A GGUF file is a header of typed key/value metadata, a table of tensor descriptors, and the aligned
tensor data. ``gguf.GGUFReader`` memory-maps the file (it is never read whole); this module wraps it
with the two things the rest of refimpl needs:

* ``GGUFFile.key(name, …)``: a metadata value, with the scalar-or-array rule of llama.cpp's
  ``llama_model_loader::get_key_or_arr`` available as ``key_or_arr``;
* ``GGUFFile.tensors``: name → :class:`TensorInfo` (qtype, **numpy-order** shape, absolute byte
  offset of the data in the file, byte size), the table the weight loader and the expert streamer
  read from.

Shapes: ggml lists dimensions fastest-first (``ne``); numpy lists them slowest-first. A tensor with
``ne = [a, b, c]`` is numpy ``(c, b, a)`` (docs/gguf.md §1). :class:`TensorInfo` stores the numpy order, and
``ne`` is kept for messages that quote llama.cpp.

Every way a file can be unreadable ends here as a one-line :class:`~refimpl.errors.RefimplError`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from refimpl.errors import RefimplError


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


class GGUFFile:
    """A memory-mapped GGUF file: metadata keys and the tensor table.

    ``raw(name)`` returns the tensor's bytes as the reader exposes them (a read-only view into the
    memory map: float32/float16 arrays for F32/F16, uint8 rows of ``row_bytes`` for BF16 and the
    quantized types), without copying.
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
            self.reader = GGUFReader(self.path, "r")
        except Exception as exc:  # the reader raises ValueError, IndexError, … on damaged headers
            raise RefimplError(f"{self.path}: truncated or corrupt GGUF header ({_first_line(exc)})") from None
        self.tensors: dict[str, TensorInfo] = {}
        for t in self.reader.tensors:
            info = TensorInfo(
                name=t.name,
                qtype=GGMLQuantizationType(t.tensor_type),
                shape=tuple(int(n) for n in reversed(t.shape.tolist())),
                offset=int(t.data_offset),
                n_bytes=int(t.n_bytes),
            )
            if info.offset + info.n_bytes > self.file_size:
                raise RefimplError(
                    f"{self.path}: truncated file: tensor {t.name} needs bytes up to "
                    f"{info.offset + info.n_bytes} but the file has {self.file_size}"
                )
            self.tensors[t.name] = info
        self._reader_tensors = {t.name: t for t in self.reader.tensors}

    # ---- metadata -----------------------------------------------------------------------------

    def has(self, key: str) -> bool:
        return key in self.reader.fields

    def key(self, key: str, default=None, *, required: bool = False):
        """The value of a metadata key (python scalar, str, or list for arrays)."""
        field = self.reader.fields.get(key)
        if field is None:
            if required:
                raise RefimplError(f"{self.path}: missing required metadata key '{key}'")
            return default
        return field.contents()

    def key_type(self, key: str) -> GGUFValueType | None:
        field = self.reader.fields.get(key)
        return None if field is None else field.types[0]

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
            return list(value)
        return [value] * n

    # ---- tensor data --------------------------------------------------------------------------

    def raw(self, name: str) -> np.ndarray:
        """Read-only view of a tensor's data in the memory map (see the class docstring)."""
        try:
            return self._reader_tensors[name].data
        except KeyError:
            raise RefimplError(f"{self.path}: missing tensor '{name}'") from None

    def bytes_by_qtype(self) -> dict[str, tuple[int, int]]:
        """qtype name → (tensor count, total bytes), for ``refimpl inspect``."""
        out: dict[str, tuple[int, int]] = {}
        for t in self.tensors.values():
            n, b = out.get(t.qtype.name, (0, 0))
            out[t.qtype.name] = (n + 1, b + t.n_bytes)
        return dict(sorted(out.items()))
