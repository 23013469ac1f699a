"""Routed expert slices: where each lies in the file, the byte-budgeted LRU cache that holds them,
and the counters of what reading them cost.

The data side of the expert streamer (:mod:`refimpl.io.streamer` reads the slices and is the
model-facing part; its docstring and docs/streamer.md describe what is read when). In dataflow order:

* the table of slices — :class:`ExpertTensor` (one routed expert tensor of numpy shape
  (X, rows, cols), cut into X slices), :func:`expert_tensors` (every one of a GGUF file, per block),
  :class:`SliceKey` (block, tensor kind, expert);
* the cache — :class:`SliceCache`, least-recently-used slices under a byte budget, and the
  slices' memory — :class:`SliceBuffers`, recycled once nothing refers to a slice;
* the counters — :class:`PhaseCounters` per phase (``PHASES``) and :class:`StreamCounters` over all.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType

import kernels
from refimpl.errors import RefimplError
from refimpl.io.weights import Matrix

EXPERT_KINDS = ("ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps", "ffn_down_exps")
_EXPERT_NAME = re.compile(r"^blk\.(\d+)\.(" + "|".join(EXPERT_KINDS) + r")\.weight$")
PHASES = ("prompt", "decode", "verify", "mtp", "other")


# ---- the table of slices ------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpertTensor:
    """One routed expert tensor of the file, numpy shape (X, rows, cols), cut into X slices."""

    name: str  # GGUF name, e.g. "blk.3.ffn_down_exps.weight"
    kind: str  # one of EXPERT_KINDS
    qtype: GGMLQuantizationType
    shape: tuple[int, int, int]  # (X, rows, cols): rows = F (gate, up), 2F (gate_up) or E (down)
    offset: int  # absolute file offset of expert 0's slice
    slice_bytes: int  # rows · row_bytes(qtype, cols)

    def slice_offset(self, e: int) -> int:
        return self.offset + e * self.slice_bytes

    def matrix(self, e: int, buf: np.ndarray, start: int = 0, stop: int | None = None) -> Matrix:
        """Rows [start, stop) of expert e, given its slice bytes ``buf`` [slice_bytes] uint8, typed
        as :meth:`refimpl.io.gguf_file.GGUFFile.raw` types them (float32 / float16 values for F32 /
        F16, uint8 rows of row_bytes otherwise) — the same Matrix :class:`PinnedExperts` returns."""
        _, rows, cols = self.shape
        if self.qtype == GGMLQuantizationType.F32:
            raw = buf.view(np.float32).reshape(rows, cols)
        elif self.qtype == GGMLQuantizationType.F16:
            raw = buf.view(np.float16).reshape(rows, cols)
        else:
            raw = buf.reshape(rows, -1)  # [rows, row_bytes]
        raw = raw[start:stop]
        return Matrix(f"{self.name}[{e}]", self.qtype, (raw.shape[0], cols), raw)


def is_expert_tensor(name: str) -> bool:
    """Whether a GGUF tensor name is a routed expert tensor (one of EXPERT_KINDS, in any block)."""
    return _EXPERT_NAME.match(name) is not None


def expert_tensors(gguf) -> dict[int, tuple[ExpertTensor, ...]]:
    """block index → its routed expert tensors, from a :class:`~refimpl.io.gguf_file.GGUFFile`'s table."""
    out: dict[int, list[ExpertTensor]] = {}
    for name, info in gguf.tensors.items():
        m = _EXPERT_NAME.match(name)
        if m is None:
            continue
        X, rows, cols = info.shape
        slice_bytes = rows * kernels.row_bytes(info.qtype, cols)
        if slice_bytes * X != info.n_bytes:
            raise RefimplError(f"{gguf.path}: tensor {name} holds {info.n_bytes} bytes, expected {X} slices of {slice_bytes}")
        out.setdefault(int(m.group(1)), []).append(ExpertTensor(name, m.group(2), info.qtype, (X, rows, cols), info.offset, slice_bytes))
    return {il: tuple(sorted(ts, key=lambda t: EXPERT_KINDS.index(t.kind))) for il, ts in sorted(out.items())}


class SliceKey(NamedTuple):
    il: int  # block index (n_layer = the MTP block)
    kind: str  # one of EXPERT_KINDS
    expert: int


# ---- the cache ----------------------------------------------------------------------------------


class SliceCache:
    """Least-recently-used slices, never more than ``budget`` bytes in total.

    ``get(key)`` returns the slice or None; a hit makes it the most recently used.
    ``put(key, buf)`` evicts least recently used slices until ``buf`` fits, then keeps it as the most
    recently used; a slice larger than the whole budget is not kept (budget 0 keeps nothing).
    Returns the evicted keys, oldest first.
    """

    def __init__(self, budget: int):
        if budget < 0:
            raise ValueError(f"cache budget must be ≥ 0 bytes, got {budget}")
        self.budget = budget
        self.used = 0  # bytes held now
        self.peak = 0  # most bytes ever held
        self.evictions = 0
        self._slices: OrderedDict[SliceKey, np.ndarray] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._slices)

    def __contains__(self, key) -> bool:
        return key in self._slices

    def keys(self) -> list:
        """Held keys, least recently used first (the next to go)."""
        return list(self._slices)

    def get(self, key) -> np.ndarray | None:
        buf = self._slices.get(key)
        if buf is not None:
            self._slices.move_to_end(key)
        return buf

    def discard(self, key) -> None:
        """Forget ``key`` if held (a slice whose read failed)."""
        buf = self._slices.pop(key, None)
        if buf is not None:
            self.used -= buf.nbytes

    def put(self, key, buf: np.ndarray) -> list:
        assert key not in self._slices, key
        if buf.nbytes > self.budget:
            return []
        evicted = []
        while self.used + buf.nbytes > self.budget:
            old, old_buf = self._slices.popitem(last=False)
            self.used -= old_buf.nbytes
            evicted.append(old)
        self.evictions += len(evicted)
        self._slices[key] = buf
        self.used += buf.nbytes
        self.peak = max(self.peak, self.used)
        return evicted


# ---- the slices' memory -------------------------------------------------------------------------

#: At most this many bytes of free slice buffers are kept for reuse (:class:`SliceBuffers`); beyond it a
#: freed block goes back to the allocator — so a change of slice sizes (another layer's types, a long
#: prompt's batch) cannot hold more than this on top of the cache's budget and one batch.
FREE_BYTES = 256 << 20


class _SliceBlock(np.ndarray):
    """The memory of a recycled slice buffer (:class:`SliceBuffers`). Its own type matters: numpy makes
    the base of a new view the array that owns the memory, skipping the views in between — but only
    through views of the new view's own type, so it stops at the first view of a _SliceBlock. Every
    view derived from a handed-out buffer (a Matrix's rows, a float32 view) therefore keeps that
    buffer alive, and the block is free only when all of them are gone (tested)."""


class SliceBuffers:
    """Slice buffers, recycled instead of freed: a buffer is handed out as a plain view of a
    :class:`_SliceBlock`, and when nothing refers to that view any more — neither it nor any view
    derived from it: the cache evicted it, or never kept it, and its batch is done — the block goes
    back to a free list of its size for the next read, while the free lists hold less than
    FREE_BYTES. Reading ~580 MiB a token into fresh memory (budget 0, full size) cost a page fault and
    a zeroed page every 4 KiB — 20–25 thousand faults a token, against under 600 recycled; 1.34–1.55
    against 1.50–1.67 tok/s, three runs each, alternated."""

    def __init__(self, free_bytes: int = FREE_BYTES):
        self.limit = free_bytes
        self.free_bytes = 0  # held in the free lists
        self._free: dict[int, list[np.ndarray]] = {}  # nbytes → free blocks
        self._lock = threading.Lock()  # a view may die in a reading thread

    def take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            free = self._free.get(nbytes)
            block = free.pop() if free else None
            if block is not None:
                self.free_bytes -= nbytes
        if block is None:
            block = np.ndarray.__new__(_SliceBlock, (nbytes,), np.uint8)
        view = block.view(np.ndarray)  # what the cache and the batch hold; its death returns the block
        weakref.finalize(view, self._give, block)
        return view

    def _give(self, block: np.ndarray) -> None:
        with self._lock:
            if self.free_bytes + block.nbytes <= self.limit:
                self._free.setdefault(block.nbytes, []).append(block)
                self.free_bytes += block.nbytes


# ---- counters -----------------------------------------------------------------------------------


@dataclass
class PhaseCounters:
    """What the routing of one phase cost. A miss is one positioned read of one slice."""

    bytes_read: int = 0
    slices_read: int = 0  # = misses
    hits: int = 0  # slices of a batch's union found in the cache
    passes: int = 0  # forward calls declared with this phase (0 for "other")
    widened_bytes: int = 0  # verify only: bytes of slices that only the draft rows 1 … N routed to

    @property
    def misses(self) -> int:
        return self.slices_read

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.slices_read
        return self.hits / n if n else 0.0

    def as_dict(self) -> dict:
        return {"bytes_read": self.bytes_read, "slices_read": self.slices_read, "hits": self.hits,
                "misses": self.misses, "hit_rate": self.hit_rate, "passes": self.passes,
                "widened_bytes": self.widened_bytes}


@dataclass
class StreamCounters:
    """Counters per phase (PHASES), cumulative since load; ``total`` sums them."""

    phases: dict[str, PhaseCounters] = field(default_factory=lambda: {p: PhaseCounters() for p in PHASES})

    def __getitem__(self, phase: str) -> PhaseCounters:
        return self.phases[phase]

    @property
    def total(self) -> PhaseCounters:
        t = PhaseCounters()
        for c in self.phases.values():
            t.bytes_read += c.bytes_read
            t.slices_read += c.slices_read
            t.hits += c.hits
            t.passes += c.passes
            t.widened_bytes += c.widened_bytes
        return t

    def columns(self) -> dict[str, int]:
        """Flat cumulative integers named as the per-token CSV columns (the speculative loop's
        ``counters`` hook differences two calls for a round's share): ``stream_bytes``,
        ``stream_slices``, ``stream_hits``, ``stream_misses``, and the bytes of the phases that run
        during generation — ``stream_bytes_decode``, ``stream_bytes_verify``,
        ``stream_bytes_verify_widened``, ``stream_bytes_mtp``."""
        t, ph = self.total, self.phases
        return {"stream_bytes": t.bytes_read, "stream_slices": t.slices_read, "stream_hits": t.hits,
                "stream_misses": t.misses, "stream_bytes_decode": ph["decode"].bytes_read,
                "stream_bytes_verify": ph["verify"].bytes_read,
                "stream_bytes_verify_widened": ph["verify"].widened_bytes, "stream_bytes_mtp": ph["mtp"].bytes_read}
