"""Step 4 (the routed experts): the expert streamer — routed expert slices read from the file on demand, through a
byte-budgeted LRU cache, with counters that say whose routing caused each read.

The C++ engine this oracle checks streams routed experts from flash because the model does not fit
in RAM; most of what its speculation costs is the wider read set of a verify batch and the MTP
head's own routing. The streamer makes those bytes visible and countable, and lets refimpl run a
model whose experts are larger than memory. It changes cost, never numbers: a streamed slice is
the same bytes the memory map holds, so logits are bit-identical for every budget (tested).

**Where things live**: the table of slices (:class:`ExpertTensor`, :func:`expert_tensors`), the LRU
cache (:class:`SliceCache`) and the counters (:class:`PhaseCounters`, :class:`StreamCounters`) in
:mod:`refimpl.io.expert_slices`; here, in dataflow order, the routing records (:class:`Routes`), the
streamer that reads slices through the cache (:class:`ExpertStreamer`), the drop-ins the MoE layers
call (:class:`StreamedExperts`, :class:`RoutedExperts`), and the load-time pieces
(:func:`cache_budget`, :func:`pin_dense`). Every name of refimpl.io.expert_slices is importable from here.

**What is read when** (docs/streamer.md has the long form):

* At load, nothing of the routed experts. :meth:`ExpertStreamer.open` builds a table of every
  routed expert tensor of the file — ``ffn_gate_exps``, ``ffn_up_exps``, ``ffn_down_exps`` or the
  fused ``ffn_gate_up_exps`` (gate rows first), in every trunk block and in the MTP block — and
  never touches their pages. Expert e's *slice* of a tensor of numpy shape (X, rows, cols) is the
  byte range ``offset + e·n … offset + (e+1)·n`` with n = rows · row_bytes(qtype, cols).
  The dense tensors (everything else) are pinned once by :func:`pin_dense` (their pages are touched
  so they are resident; they stay memory-map views).
* In :func:`refimpl.model.moe.moe_ffn`, right after routing a batch of T rows, ``w.experts.routed(sel,
  weights)`` walks the union of the selected experts in first-use order (row by row, in selection
  order) and, for each (tensor, expert) slice of that union, takes it from the cache (a *hit*) or
  reads it with one positioned read (``os.preadv`` on a file descriptor — never through the memory
  map, so expert pages never enter the process's RSS) and offers it to the cache (a *miss*; the
  batch's misses are read ``READ_THREADS`` at a time once the walk has decided them, in the
  background: moe_ffn multiplies each expert as soon as its slices are in, while the others are
  still being read). The
  batch keeps its slices until moe_ffn returns, so within one forward call every slice is read at
  most once, whatever the budget — a verify batch reads the union of its 1+N rows' experts once.
* The cache is least-recently-used over slices and never holds more than ``budget`` bytes: a new
  slice first evicts the least recently used ones until it fits; a slice larger than the whole
  budget is not kept (``--cache-mb 0`` keeps nothing: every decode reads its routed slices again).
  A hit makes the slice the most recently used.

**Whose routing caused a read.** Every read, hit and pass is counted under one *phase*:

* ``prompt`` — a trunk forward over the prompt (T > 1 at position 0);
* ``decode`` — a trunk forward of one token (the plain path);
* ``verify`` — a trunk forward of a speculative verify batch (T = 1 + N > 1 after the prompt); its
  bytes are split into those of slices the first row routes to (what a plain decode would read)
  and ``widened`` bytes, of slices only the draft rows 1 … N route to;
* ``mtp`` — the MTP head's own MoE (block n_layer), drafting and catching up alike — decided by the
  block index, so it needs no declaration;
* ``other`` — a trunk MoE run outside any declared phase (e.g. a test calling moe_ffn directly).

``refimpl.model.trunk.forward`` declares its phase with :meth:`ExpertStreamer.phase` (inferred from T
and the state's position, or given by the caller as ``forward(…, phase="verify")``), and
``refimpl.model.mtp.mtp_forward`` declares ``mtp``; both pass the batch's positions, which the route
trace records.
"""

from __future__ import annotations

import os
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import numpy as np

from refimpl.errors import RefimplError
from refimpl.io.expert_slices import (
    EXPERT_KINDS,
    PHASES,
    ExpertTensor,
    PhaseCounters,
    SliceBuffers,
    SliceCache,
    SliceKey,
    StreamCounters,
    expert_tensors,
    is_expert_tensor,
)
from refimpl.io.meminfo import mem_available
from refimpl.io.weights import Matrix

__all__ = [
    "AUTO_FALLBACK_BYTES", "AUTO_FRACTION", "AUTO_HEADROOM", "EXPERT_KINDS", "MIB", "PAGE", "PHASES", "PIN_BAR_MIN_BYTES", "READ_THREADS",
    "ExpertStreamer", "ExpertTensor", "PhaseCounters", "RoutedExperts", "Routes", "SliceBuffers", "SliceCache", "SliceKey",
    "StreamCounters", "StreamedExperts", "cache_budget", "dense_tensors", "expert_tensors", "fits_in_memory", "is_auto", "is_expert_tensor",
    "mem_available", "pin_dense",
]

MIB = 1 << 20
AUTO_FRACTION = 0.5  # --cache-mb auto = this fraction of MemAvailable (/proc/meminfo) at load
AUTO_FALLBACK_BYTES = 1 << 30  # auto budget when /proc/meminfo cannot be read
AUTO_HEADROOM = 1 << 30  # auto, file in RAM: memory left for the interpreter, kernels and one layer's batch
PIN_BAR_MIN_BYTES = 64 * MIB  # show the pinning progress bar for dense weights at least this large
PAGE = 4096
#: A batch's missing slices are read by this many threads at once: they are independent byte ranges,
#: and a disk (or the page cache) serves several positioned reads at a time far faster than one
#: after another — random 576 KiB reads on this project's VM: 0.4 GB/s alone, 2 GB/s eight at a
#: time. The bytes, the counters and the cache's order are those of the one-at-a-time walk.
READ_THREADS = 8


def _close_streamer(fd: int, pool: ThreadPoolExecutor | None) -> None:
    if pool is not None:
        pool.shutdown(wait=True)
    os.close(fd)


# ---- routing records (for --route-trace) --------------------------------------------------------


@dataclass(frozen=True)
class Routes:
    """One moe_ffn batch's routing as the streamer saw it: T rows of K experts."""

    pass_index: int  # which declared forward pass (0, 1, …); -1 outside any
    phase: str  # PHASES
    layer: int  # block index; n_layer = the MTP head
    head: bool  # True for the MTP head's MoE
    positions: np.ndarray  # [T] int: sequence position of each row, -1 where not declared
    sel: np.ndarray  # [T, K] expert ids, in selection order (descending probability)
    weights: np.ndarray  # [T, K] float32 renormalised routing weights


@dataclass(frozen=True)
class _Pass:
    index: int
    phase: str
    positions: np.ndarray | None


# ---- the streamer -------------------------------------------------------------------------------


class ExpertStreamer:
    """Routed expert slices of one GGUF file, read on demand through a :class:`SliceCache`.

    ``experts(il)`` is block il's drop-in for :class:`refimpl.io.weights.PinnedExperts`;
    ``phase(name, positions)`` declares whose routing the reads inside belong to;
    ``counters`` (a :class:`StreamCounters`) and ``cache`` are the live state; ``stats()`` and
    ``summary_lines()`` report them. ``on_route(Routes)`` (optional) is called once per moe_ffn batch.
    """

    def __init__(self, path, tensors: dict[int, tuple[ExpertTensor, ...]], *, n_layer: int, n_ff: int,
                 budget: int, on_route: Callable[[Routes], None] | None = None, arch: str = "qwen35moe"):
        self.path = path
        self.arch = arch  # general.architecture: a dense one (qwen35) has no routed experts to stream
        self.tensors = tensors  # block index → its expert tensors
        self.n_layer = n_layer  # trunk layers; block n_layer (if present) is the MTP head's
        self.n_ff = n_ff  # F: rows of gate (and of up) per expert; splits the fused gate_up slice
        self.cache = SliceCache(budget)
        self.counters = StreamCounters()
        self.on_route = on_route
        self.expert_bytes = sum(t.slice_bytes * t.shape[0] for ts in tensors.values() for t in ts)
        self.dense_bytes = 0  # set by pin_dense
        self._pass: _Pass | None = None
        self._n_passes = 0
        self._fd = os.open(path, os.O_RDONLY)
        self._pool = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="refimpl-read") if READ_THREADS > 1 else None
        self._in_flight: dict[int, tuple[_Reads, SliceKey]] = {}  # id(slice buffer) → the batch still reading it
        self._buffers = SliceBuffers()
        self._close = weakref.finalize(self, _close_streamer, self._fd, self._pool)

    @classmethod
    def open(cls, m, budget: int, on_route: Callable[[Routes], None] | None = None) -> "ExpertStreamer":
        """The streamer of a :class:`~refimpl.io.load.ModelFile` (its config gives n_layer and F)."""
        return cls(m.gguf.path, expert_tensors(m.gguf), n_layer=m.config.n_layer, n_ff=m.config.n_ff_exp,
                   budget=budget, on_route=on_route, arch=m.config.arch.name)

    def close(self) -> None:
        self._close()

    @property
    def budget(self) -> int:
        return self.cache.budget

    def experts(self, il: int) -> "StreamedExperts":
        if il not in self.tensors:
            raise RefimplError(f"{self.path}: block {il} has no routed expert tensors")
        return StreamedExperts(self, il)

    # ---- phases ---------------------------------------------------------------------------------

    @contextmanager
    def phase(self, name: str, positions=None):
        """Attribute the reads inside to phase ``name`` (PHASES); ``positions`` [T] are the
        sequence positions of the forward pass's rows (for the route trace). Counts one pass."""
        if name not in PHASES:
            raise ValueError(f"unknown streamer phase {name!r} (one of {', '.join(PHASES)})")
        outer = self._pass
        self._pass = _Pass(self._n_passes, name, None if positions is None else np.asarray(positions, dtype=np.int64))
        self._n_passes += 1
        self.counters[name].passes += 1
        try:
            yield self
        finally:
            self._pass = outer

    def _phase_of(self, il: int) -> str:
        if il >= self.n_layer:
            return "mtp"  # the head's own routing, whatever the caller declared
        return self._pass.phase if self._pass is not None else "other"

    # ---- reading --------------------------------------------------------------------------------

    def _read_into(self, t: ExpertTensor, e: int, buf: np.ndarray) -> None:
        """One positioned read of expert e's slice of t into ``buf`` [slice_bytes] uint8."""
        offset, done = t.slice_offset(e), 0
        while done < t.slice_bytes:  # preadv may return short; loop until the slice is complete
            n = os.preadv(self._fd, [buf[done:]], offset + done)
            if n == 0:
                raise RefimplError(f"{self.path}: unexpected end of file reading {t.name}[{e}]")
            done += n

    def _lookup(self, il: int, t: ExpertTensor, e: int, c: PhaseCounters, pending: list,
                into: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Expert e's slice of t from the cache (a hit), or a buffer for it that joins ``pending``
        and the cache now (a miss: the cache decides what it evicts exactly as if it were read here;
        :class:`_Reads` fills it) — ``into`` when given (a row of a batch's stack). Returns (slice bytes,
        bytes read for it)."""
        key = SliceKey(il, t.kind, e)
        buf = self.cache.get(key)
        if buf is not None:
            c.hits += 1  # (an earlier batch may still be reading it: callers ``wait`` before use)
            return buf, 0
        buf = self._buffers.take(t.slice_bytes) if into is None else into
        pending.append((key, t, e, buf))
        c.slices_read += 1
        c.bytes_read += buf.nbytes
        self.cache.put(key, buf)
        return buf, buf.nbytes

    def wait(self, buf: np.ndarray) -> None:
        """Return once the slice buffer ``buf`` holds its bytes (at once unless a batch's read into it is
        in flight); raises that batch's read error, which leaves none of its slices in the cache."""
        entry = self._in_flight.get(id(buf))
        if entry is not None:
            entry[0].wait(entry[1])

    def _fetch(self, il: int, t: ExpertTensor, e: int, c: PhaseCounters) -> tuple[np.ndarray, int]:
        """Expert e's slice of t from the cache (a hit) or the file (a miss, then cached).
        Returns (slice bytes, bytes read now)."""
        pending: list = []
        found = self._lookup(il, t, e, c, pending)
        _Reads(self, pending)
        self.wait(found[0])
        return found

    def read_union(self, il: int, sel: np.ndarray, weights: np.ndarray, *, wait: bool = True, stacked: bool = False
                   ) -> tuple[dict[tuple[str, int], np.ndarray], dict[str, np.ndarray]]:
        """Block il's routed slices for one moe_ffn batch: sel [T, K] expert ids, weights [T, K] →
        ({(tensor kind, expert): slice bytes}, stacks). ``stacked`` (the caller multiplies the batch's experts
        as one stack: ``ggml_mul_mat_id``, refimpl.graph.moe) with a budget of 0 (the cache keeps nothing):
        each tensor's slices are read straight into one array, ``stacks[kind]`` [n, slice_bytes] (row i: the
        union's i-th expert) — the read goes where the kernel reads, instead of into slices it copies together
        (581 MiB a token at full size); else ``stacks`` is empty.

        Walks the union of sel in first-use order and fetches each of the block's tensors for each
        expert once; in a verify batch, bytes of experts that row 0 does not route to are counted
        as ``widened``. Calls ``on_route`` first. The misses are read READ_THREADS at a time; with
        ``wait=False`` this returns as soon as they are started, and :meth:`wait` (a slice) waits for
        one (``RoutedExperts`` does, slice by slice, so the MoE multiplies the first experts while the
        last ones are still being read)."""
        sel = np.asarray(sel)  # [T, K]
        phase = self._phase_of(il)
        c = self.counters[phase]
        if self.on_route is not None:
            self.on_route(self._routes(il, phase, sel, weights))
        first_row: dict[int, int] = {}  # expert → the first batch row routing to it (insertion = first use)
        for t, row in enumerate(sel.tolist()):
            for e in row:
                first_row.setdefault(int(e), t)
        slices: dict[tuple[str, int], np.ndarray] = {}
        pending: list = []  # the misses, read together below
        n = len(first_row)
        stacks = {tensor.kind: self._buffers.take(n * tensor.slice_bytes).reshape(n, tensor.slice_bytes)  # [n, slice_bytes]
                  for tensor in self.tensors[il]} if stacked and self.cache.budget == 0 else {}
        for i, (e, t) in enumerate(first_row.items()):
            for tensor in self.tensors[il]:
                row = stacks[tensor.kind][i] if stacks else None
                buf, n_read = self._lookup(il, tensor, e, c, pending, into=row)
                if phase == "verify" and t > 0:
                    c.widened_bytes += n_read
                slices[tensor.kind, e] = buf
        _Reads(self, pending)
        if wait:
            for buf in slices.values():
                self.wait(buf)
        return slices, stacks

    def read_one(self, il: int, kind: str, e: int) -> np.ndarray:
        """One slice through the cache, outside a batch (``StreamedExperts.gate(e)`` etc.)."""
        tensor = next(t for t in self.tensors[il] if t.kind == kind)
        return self._fetch(il, tensor, e, self.counters[self._phase_of(il)])[0]

    def _routes(self, il: int, phase: str, sel: np.ndarray, weights: np.ndarray) -> Routes:
        p = self._pass
        T = sel.shape[0]
        positions = p.positions if p is not None and p.positions is not None and len(p.positions) == T else np.full(T, -1)
        return Routes(p.index if p is not None else -1, phase, il, il >= self.n_layer, positions, sel, np.asarray(weights))

    # ---- reporting ------------------------------------------------------------------------------

    def bytes_read(self) -> int:
        """Bytes read so far (cumulative) — the speculative loop's ``bytes_read`` hook."""
        return self.counters.total.bytes_read

    def stats(self, n_generated: int | None = None) -> dict:
        """Everything for ``run --json`` ``stats.streamer`` (docs/streamer.md defines each field).
        ``bytes_per_decode`` / ``bytes_per_token``: every byte read except the trunk's prompt pass,
        per trunk decode (decode + verify passes) / per generated token."""
        t, ph = self.counters.total, self.counters.phases
        trunk_decodes = ph["decode"].passes + ph["verify"].passes
        after_prompt = t.bytes_read - ph["prompt"].bytes_read  # decode + verify + the head's (+ other)
        out = {
            "budget_bytes": self.budget, "expert_bytes": self.expert_bytes, "dense_bytes": self.dense_bytes,
            "cache_bytes": self.cache.used, "cache_peak_bytes": self.cache.peak, "cache_slices": len(self.cache),
            "evictions": self.cache.evictions, **t.as_dict(),
            "phases": {p: c.as_dict() for p, c in ph.items()},
            "trunk_decodes": trunk_decodes,
            "bytes_per_decode": after_prompt / trunk_decodes if trunk_decodes else 0.0,
        }
        if n_generated:
            out["bytes_per_token"] = after_prompt / n_generated
        return out

    def summary_lines(self, n_generated: int | None = None, mtp: bool = False) -> list[str]:
        """The stderr summary: one ``stream:`` line, and with ``mtp`` the C++ engine's split line (a dense
        model: one line saying there is nothing to stream)."""
        s = self.stats(n_generated)
        if not self.tensors:
            return [f"stream: nothing to stream: {self.arch} is a dense model (no routed experts); "
                    f"all {self.dense_bytes / MIB:.1f} MiB of weights are pinned"]
        ph = self.counters.phases
        line = (f"stream: {s['bytes_read'] / MIB:.1f} MiB read in {s['slices_read']} slices "
                f"({s['hits']} hits, {100 * s['hit_rate']:.1f}% hit rate), cache {self.budget / MIB:.0f} MiB; "
                f"{s['bytes_per_decode'] / MIB:.2f} MiB per decode")
        if n_generated:
            line += f", {s['bytes_per_token'] / MIB:.2f} MiB per generated token"
        lines = [line]
        if mtp:
            total, head, wide = s["bytes_read"], ph["mtp"].bytes_read, ph["verify"].widened_bytes
            pct = 100 * head / total if total else 0.0
            lines.append(f"mtp: of {total / MIB:.1f} MiB streamed, {head / MIB:.1f} MiB ({pct:.0f}%) was the head's own "
                         f"routing, {wide / MIB:.1f} MiB the widened verify batch")
        return lines


class _Reads:
    """One batch's missing slices (``pending``: (key, tensor, expert, buffer) in walk order), read in
    the background by the streamer's READ_THREADS threads (or here, one after another, without a pool)
    — gate and up slices first, then down, the order moe_ffn multiplies them in. Each slice is in the
    cache already (the walk decided hits and evictions) and is handed out only after :meth:`wait`
    for it; once read it is read-only. If any read fails, waiting raises it and drops every slice of
    the batch from the cache."""

    def __init__(self, streamer: ExpertStreamer, pending: list):
        self.streamer, self.pending = streamer, pending
        self.futures: dict = {}  # key → (future, buffer)
        if streamer._pool is None or len(pending) < 2:  # read here, one after another
            try:
                for _, t, e, buf in pending:
                    self._read(t, e, buf)
            except BaseException:
                self._drop()
                raise
            return
        for key, t, e, buf in sorted(pending, key=lambda p: p[0].kind == "ffn_down_exps"):  # stable: walk order within
            self.futures[key] = streamer._pool.submit(self._read, t, e, buf), buf
            streamer._in_flight[id(buf)] = (self, key)

    def _read(self, t: ExpertTensor, e: int, buf: np.ndarray) -> None:
        self.streamer._read_into(t, e, buf)
        buf.flags.writeable = False

    def wait(self, key: SliceKey) -> None:
        future, buf = self.futures[key]
        try:
            future.result()
        except BaseException:
            self._drop()
            raise
        self.streamer._in_flight.pop(id(buf), None)

    def _drop(self) -> None:
        """After a failed read: wait for the batch's other reads, then none of its slices stays in the
        cache; a slice whose read failed stays in flight, so waiting for it again raises again."""
        for future, buf in self.futures.values():
            try:
                future.result()
                self.streamer._in_flight.pop(id(buf), None)
            except BaseException:
                pass
        for key, *_ in self.pending:
            self.streamer.cache.discard(key)


class StreamedExperts:
    """Block il's routed experts read through an :class:`ExpertStreamer` — a drop-in for
    :class:`refimpl.io.weights.PinnedExperts`: ``routed(sel, weights)`` for a moe_ffn batch, and
    ``gate(e)``, ``up(e)``, ``down(e)`` for one slice at a time."""

    def __init__(self, streamer: ExpertStreamer, il: int):
        self.streamer, self.il = streamer, il
        self._by_kind = {t.kind: t for t in streamer.tensors[il]}

    def layout(self, which: str) -> tuple[ExpertTensor, int, int | None]:
        """Where ``which`` ("gate" | "up" | "down") rows live: (tensor, first row, stop row) — its
        own tensor, or the fused gate_up tensor (gate rows first, then up)."""
        F, fused = self.streamer.n_ff, self._by_kind.get("ffn_gate_up_exps")
        if which == "down":
            return self._by_kind["ffn_down_exps"], 0, None
        if fused is not None:
            return (fused, 0, F) if which == "gate" else (fused, F, 2 * F)
        return self._by_kind[f"ffn_{which}_exps"], 0, None

    def routed(self, sel: np.ndarray, weights: np.ndarray, stacked: bool = False) -> "RoutedExperts":
        """The batch's slices, the union of sel [T, K] read once (``ExpertStreamer.read_union``; ``stacked``:
        into one stack per tensor where the cache keeps nothing, :meth:`RoutedExperts.read_stack`)."""
        return RoutedExperts(self, *self.streamer.read_union(self.il, sel, weights, wait=False, stacked=stacked))

    def _one(self, which: str, e: int) -> Matrix:
        tensor, start, stop = self.layout(which)
        return tensor.matrix(e, self.streamer.read_one(self.il, tensor.kind, e), start, stop)

    def gate(self, e: int) -> Matrix:
        return self._one("gate", e)

    def up(self, e: int) -> Matrix:
        return self._one("up", e)

    def down(self, e: int) -> Matrix:
        return self._one("down", e)


@dataclass(frozen=True)
class RoutedExperts:
    """The slices of one moe_ffn batch, read once: ``gate(e)``, ``up(e)``, ``down(e)`` for any
    expert the batch routed to."""

    layer: StreamedExperts
    slices: dict[tuple[str, int], np.ndarray]  # (tensor kind, expert) → slice bytes
    stacks: dict[str, np.ndarray]  # tensor kind → [n, slice_bytes], the union's slices in first-use order (budget 0), or {}

    def _matrix(self, which: str, e: int) -> Matrix:
        tensor, start, stop = self.layer.layout(which)
        buf = self.slices[tensor.kind, e]
        self.layer.streamer.wait(buf)  # its read may still be in flight
        return tensor.matrix(e, buf, start, stop)

    def read_stack(self, which: str, union: list[int]) -> np.ndarray | None:
        """``which``'s rows of the experts ``union`` (the batch's, in first-use order) as one array [n, rows,
        row_bytes] — the slices were read into it (``stacks``) —, or None when they were not (a cache that keeps
        slices: stack their matrices)."""
        tensor, start, stop = self.layer.layout(which)
        stack = self.stacks.get(tensor.kind)
        if stack is None:
            return None
        if [e for (kind, e) in self.slices if kind == tensor.kind] != list(union):  # read_union's walk is the union's order
            raise AssertionError("the batch's stack is not in the union's order")
        for e in union:
            self.layer.streamer.wait(self.slices[tensor.kind, e])  # reads may still be in flight
        _, rows, _ = tensor.shape
        return stack.reshape(len(union), rows, -1)[:, start:stop]  # [n, rows, row_bytes]: gate or up rows of a fused tensor

    def gate(self, e: int) -> Matrix:
        return self._matrix("gate", e)

    def up(self, e: int) -> Matrix:
        return self._matrix("up", e)

    def down(self, e: int) -> Matrix:
        return self._matrix("down", e)


# ---- budget and dense pinning -------------------------------------------------------------------


def fits_in_memory(file_bytes: int, resident_bytes: int = 0) -> bool:
    """Whether a file of ``file_bytes`` fits in MemAvailable beside ``resident_bytes`` and AUTO_HEADROOM (the page
    cache can then keep all of it)."""
    avail = mem_available()
    return avail is not None and file_bytes + resident_bytes + AUTO_HEADROOM <= avail


def is_auto(cache_mb) -> bool:
    """Whether ``--cache-mb`` is ``auto`` (any case, spaces around)."""
    return isinstance(cache_mb, str) and cache_mb.strip().lower() == "auto"


def cache_budget(cache_mb, *, file_bytes: int | None = None, resident_bytes: int = 0) -> int:
    """``--cache-mb`` in bytes: a whole number of MiB ≥ 0, or ``"auto"``: AUTO_FRACTION (half) of
    MemAvailable at the time of the call (AUTO_FALLBACK_BYTES, 1 GiB, if /proc/meminfo is missing) —
    except when the model file (``file_bytes``) fits in MemAvailable next to what the process keeps
    besides the cache (``resident_bytes``: the packed copies) and AUTO_HEADROOM: then the page cache
    holds the whole file after one pass (and across runs), and the private cache gets only what is
    left over, down to 0. A private slice would duplicate a page the page cache keeps anyway, and the
    memory it took would push other slices of the file out to the disk: on the 20.2 GiB full-size
    fixture in 24 GiB (a 2-core Sapphire Rapids VM, AVX-512 kernels), budget 0 decoded 1.43-1.48 tok/s
    and half of MemAvailable 1.14-1.34."""
    if is_auto(cache_mb):
        avail = mem_available()
        if avail is None:
            return AUTO_FALLBACK_BYTES
        half = int(AUTO_FRACTION * avail)
        if file_bytes is None or file_bytes > avail:
            return half
        return max(0, min(half, avail - file_bytes - resident_bytes - AUTO_HEADROOM))
    try:
        mb = int(cache_mb)
    except (TypeError, ValueError):
        raise RefimplError(f"--cache-mb expects a whole number of MiB or 'auto', got {cache_mb!r}") from None
    if mb < 0:
        raise RefimplError(f"--cache-mb must be ≥ 0, got {mb}")
    return mb * MIB


def dense_tensors(gguf) -> dict[str, int]:
    """Every tensor of ``gguf`` that is not a routed expert tensor → its bytes (what :func:`pin_dense` pins)."""
    return {name: t.n_bytes for name, t in gguf.tensors.items() if not is_expert_tensor(name)}


def pin_dense(gguf, progress: bool = True) -> int:
    """Touch every page of every tensor that is not a routed expert tensor, once, so the dense
    weights are resident before the first token (they stay memory-map views). A tqdm bar on stderr
    when there are at least PIN_BAR_MIN_BYTES. Returns the dense bytes."""
    from tqdm import tqdm

    dense = dense_tensors(gguf)
    total = sum(dense.values())
    with tqdm(total=total, desc="pinning dense weights", unit="B", unit_scale=True, file=sys.stderr, leave=False,
              disable=None if progress and total >= PIN_BAR_MIN_BYTES else True) as bar:
        for name in dense:
            flat = np.ascontiguousarray(gguf.raw(name)).reshape(-1).view(np.uint8)  # a view: the map is contiguous
            if flat.size:
                _ = flat[::PAGE].sum(dtype=np.uint64) + flat[-1]  # reading one byte per page faults it in
            bar.update(dense[name])
    return total
