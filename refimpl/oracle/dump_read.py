"""Reading an engine's dumped intermediates (``refimpl trace --against DUMP``), named by llama.cpp's graph
names (``attn_norm-0``, ``linear_attn_out-3``, ``result_output``; refimpl.oracle.dumper).

A DUMP is one of:

* a directory of ``NAME.npy`` files, first axis = position (what ``refimpl trace --out`` writes, and
  refimpl.oracle.dumper / tools/refimpl_dump.h write from llama.cpp's ``cb_eval``);
* a GGUF whose tensors are the intermediates (read with the ``gguf`` package; numpy shape [T, …], i.e.
  ggml ne = [n, T]: the token axis outermost, as llama.cpp's graph holds them);
* the text llama.cpp's ``llama-eval-callback`` prints, as is or gzip-compressed (common/debug.cpp ``common_debug_cb_eval``: per
  tensor the line ``common_debug_cb_eval: NAME = (TYPE) OP(SRC0{ne}, SRC1{ne}}) = {ne0, ne1, ne2, ne3}``,
  then ``common_debug_print_tensor``'s values — ``%12.4f``, the first and last 3 indices of each dimension
  longer than 6 — and ``sum = %f`` per i3, a float32 sum in index order). Only sums and those printed
  values can be compared; ``TextTensor`` keeps them with the indices they stand for.

Bad dumps — unreadable files, non-numeric arrays, a text without one tensor — raise :class:`RefimplError`
(one line, exit 2); names, shapes and positions are checked against the model in refimpl.oracle.trace_against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from refimpl.errors import RefimplError

PRINT_N = 3  # common_debug_print_tensor's n: the first and last 3 of each dimension longer than 2n are printed


@dataclass
class TextTensor:
    """One tensor as llama-eval-callback printed it: ggml ne (4 dims), type, the printed values
    (index tuple (i0, i1, i2, i3) → value) and the sum per i3."""

    name: str
    type: str
    ne: tuple[int, int, int, int]
    values: dict[tuple[int, int, int, int], float] = field(default_factory=dict)
    sums: list[float] = field(default_factory=list)

    @property
    def size(self) -> int:
        return int(np.prod(self.ne))


@dataclass
class Dump:
    """What a DUMP holds: ``arrays`` {name: float32 [T, n]} (npy, gguf) or ``texts`` {name: TextTensor}
    (eval-callback text; the last tensor of each name counts, as in llama.cpp a name given twice — Kcur-3 —
    is overwritten)."""

    path: Path
    format: str  # "npy", "gguf" or "eval-callback"
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    texts: dict[str, TextTensor] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.arrays or self.texts)

    @property
    def sums_only(self) -> bool:
        return self.format == "eval-callback"


def read_dump(path) -> Dump:
    """A DUMP, its format told by what it is: a directory (npy), a GGUF (by its magic), else text."""
    p = Path(path)
    if p.is_dir():
        return _read_npy_dir(p)
    if not p.is_file():
        raise RefimplError(f"--against {p}: no such file or directory")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise RefimplError(f"--against {p}: cannot read: {e.strerror or e}") from None
    if magic == b"GGUF":
        return _read_gguf(p)
    return _read_text(p, gz=magic[:2] == b"\x1f\x8b")


def _rows(name: str, arr, where: str) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype.kind not in "fiu" or arr.ndim < 1 or arr.size == 0:
        raise RefimplError(f"--against {where}: {name} is not a numeric array with a position axis "
                           f"(dtype {arr.dtype}, shape {list(arr.shape)})")
    return arr.astype(np.float32, copy=False).reshape(arr.shape[0], -1)


def _read_npy_dir(p: Path) -> Dump:
    files = sorted(p.glob("*.npy"))
    if not files:
        raise RefimplError(f"--against {p}: the directory holds no NAME.npy file")
    arrays = {}
    for f in files:
        try:
            arr = np.load(f, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise RefimplError(f"--against {f}: not a readable .npy file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        arrays[f.stem] = _rows(f.stem, arr, str(f))
    return Dump(p, "npy", arrays=arrays)


def _read_gguf(p: Path) -> Dump:
    try:
        import gguf

        reader = gguf.GGUFReader(p, "r")
        tensors = [(t.name, t.tensor_type, np.array(t.data)) for t in reader.tensors]
    except Exception as e:  # gguf raises ValueError, KeyError, struct errors on a damaged file
        raise RefimplError(f"--against {p}: not a readable GGUF ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if not tensors:
        raise RefimplError(f"--against {p}: the GGUF holds no tensor")
    arrays = {}
    for name, qtype, data in tensors:
        if qtype.name not in ("F32", "F16", "BF16", "F64"):
            raise RefimplError(f"--against {p}: tensor {name} is {qtype.name}; a dump holds F32 (or F16/BF16) values")
        if qtype.name == "BF16":  # the gguf package hands BF16 as raw uint16
            data = (data.astype(np.uint32) << 16).view(np.float32)
        arrays[name] = _rows(name, data, str(p))
    return Dump(p, "gguf", arrays=arrays)


# ---- llama-eval-callback's text --------------------------------------------------------------

_HEADER = re.compile(r"^(?:common_debug_cb_eval|ggml_debug):\s*(.+?) = \((\w+)\) .* = \{\s*(-?\d+),\s*(-?\d+),\s*(-?\d+),\s*(-?\d+)\s*\}\s*$")
_SUM = re.compile(r"^\s*sum = (\S+)\s*$")
_VALUES = re.compile(r"^\s*\[(.*)\],?\s*$")


def printed_indices(n: int) -> list[int]:
    """The indices of a dimension of size n that common_debug_print_tensor prints."""
    if n > 2 * PRINT_N:
        return list(range(PRINT_N)) + list(range(n - PRINT_N, n))
    return list(range(n))


def _float(token: str, where: str) -> float:
    try:
        return float(token)  # "nan", "-nan", "inf" too
    except ValueError:
        raise RefimplError(f"--against {where}: '{token}' is not a printed value") from None


def _read_text(p: Path, gz: bool = False) -> Dump:
    import gzip

    try:
        lines = (gzip.decompress(p.read_bytes()) if gz else p.read_bytes()).decode().splitlines()
    except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip.BadGzipFile is an OSError
        raise RefimplError(f"--against {p}: not a .npy directory, a GGUF, or llama-eval-callback's text "
                           f"({getattr(e, 'reason', None) or getattr(e, 'strerror', None) or e})") from None
    texts: dict[str, TextTensor] = {}
    cur: TextTensor | None = None
    values: list[float] = []
    for i, line in enumerate(lines, 1):
        where = f"{p}:{i}"
        if m := _HEADER.match(line):
            if cur is not None:
                _finish(cur, values, where)
            cur, values = TextTensor(m[1].strip(), m[2], tuple(int(m[k]) for k in range(3, 7))), []
            texts[cur.name] = cur
        elif cur is None:
            continue
        elif m := _SUM.match(line):
            cur.sums.append(_float(m[1], where))
        elif (m := _VALUES.match(line)) and m[1].strip():
            values += [_float(t, where) for t in (s.strip() for s in m[1].split(",")) if t and t != "..."]
    if cur is not None:
        _finish(cur, values, f"{p}:{len(lines)}")
    if not texts:
        raise RefimplError(f"--against {p}: not a .npy directory, a GGUF, or llama-eval-callback's text "
                           "(no 'common_debug_cb_eval: NAME = (TYPE) …' line)")
    return Dump(p, "eval-callback", texts=texts)


def _finish(t: TextTensor, values: list[float], where: str) -> None:
    """Pair the values printed for ``t`` with their indices (or none: a quantized tensor prints none)."""
    if not values and not t.sums:
        return
    idx = [(i0, i1, i2, i3) for i3 in range(t.ne[3]) for i2 in printed_indices(t.ne[2])
           for i1 in printed_indices(t.ne[1]) for i0 in printed_indices(t.ne[0])]
    if len(values) != len(idx) or len(t.sums) != t.ne[3]:
        raise RefimplError(f"--against {where}: tensor {t.name} {list(t.ne)} printed {len(values)} values and "
                           f"{len(t.sums)} sums, its shape gives {len(idx)} and {t.ne[3]} (a truncated text?)")
    t.values = dict(zip(idx, values))
