"""Step 5: the per-sequence state record — everything a forward pass remembers between calls.

* attention layers: a :class:`KVCache` (K and V of every processed position, after RoPE);
* Gated DeltaNet layers: a :class:`DeltaNetState` — the causal-conv window (the last Kc−1 inputs
  of the conv) and the delta-rule matrix ``ssm`` [Hv, S_v, S_k];
* ``n_past``: how many positions the sequence holds.

Every record is immutable: a forward pass takes a state and returns a new one, never writing into
the arrays it was given. So a snapshot is just a kept reference and a rollback an assignment
(docs/speculative.md, "llama.cpp's snapshot planes", describes the C++ planes these replace). A fresh sequence starts from zeros
(``build_rs`` zeroes slot ``rs_z``).

The immutability is enforced, not a convention: a record's arrays are made read-only
(``writeable=False``, :func:`read_only`) when the record is built, without a copy. An in-place update
(``st.ssm *= decay``, ``kv.k[i] = …``, ``np.copyto``, ``out=``) raises ``ValueError`` (read-only)
instead of silently rewriting every snapshot that shares the array; new values go into new arrays
and a new record (tests/test_state.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

F32 = np.float32


def read_only(record) -> None:
    """Make every array field of the dataclass ``record`` read-only, in place and without a copy (the
    ``__post_init__`` of each state record). The arrays are the record's own from then on: whoever built
    them must not write into them either. (A view made read-only leaves its base writable: the views a
    record holds, as the conv window's rows, are of buffers no one keeps.)"""
    for f in fields(record):
        a = getattr(record, f.name)
        if isinstance(a, np.ndarray):
            a.flags.writeable = False


@dataclass(frozen=True)
class KVCache:
    """K and V of one attention layer: k, v [n_kv, Hkv, D]; pos [n_kv] (int32, cache-slot order)."""

    k: np.ndarray
    v: np.ndarray
    pos: np.ndarray

    __post_init__ = read_only

    @staticmethod
    def empty(n_head_kv: int, head_dim: int) -> "KVCache":
        z = np.zeros((0, n_head_kv, head_dim), dtype=F32)
        return KVCache(k=z, v=z, pos=np.zeros(0, dtype=np.int32))

    def append(self, k: np.ndarray, v: np.ndarray, positions: np.ndarray) -> "KVCache":
        """A new cache with T more cells: k, v [T, Hkv, D]."""
        return KVCache(
            k=np.concatenate([self.k, k.astype(F32)]),  # [n_kv + T, Hkv, D]
            v=np.concatenate([self.v, v.astype(F32)]),
            pos=np.concatenate([self.pos, np.asarray(positions, dtype=np.int32)]),
        )

    def truncate(self, n_past: int) -> "KVCache":
        """Keep the cells of positions < n_past (``llama_memory_seq_rm(seq, n_past, -1)``)."""
        keep = self.pos < n_past
        return KVCache(k=self.k[keep], v=self.v[keep], pos=self.pos[keep])

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


@dataclass(frozen=True)
class DeltaNetState:
    """conv [Kc−1, C]: the last Kc−1 conv inputs, oldest first; ssm [Hv, S_v, S_k] = M[j, vi, ki]."""

    conv: np.ndarray
    ssm: np.ndarray

    __post_init__ = read_only

    @staticmethod
    def zeros(conv_channels: int, d_conv: int, n_v_heads: int, d_state: int) -> "DeltaNetState":
        return DeltaNetState(
            conv=np.zeros((d_conv - 1, conv_channels), dtype=F32),
            ssm=np.zeros((n_v_heads, d_state, d_state), dtype=F32),
        )

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


@dataclass(frozen=True)
class Snapshot:
    """The recurrent layers' state as it was when the sequence held ``n_past`` positions.

    ``layers[il]`` is a DeltaNetState for recurrent layers and None for attention layers (their
    KV cache is rolled back by truncation instead).
    """

    n_past: int
    layers: tuple

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.layers if s is not None)


class RollbackError(ValueError):
    """A rollback deeper than the snapshot ring (or than the sequence) was asked for."""


@dataclass(frozen=True)
class SeqState:
    """The whole memory of one sequence: ``layers[il]`` is a KVCache or a DeltaNetState.

    ``n_rs_seq`` bounds how far back the sequence can be rolled back without recomputation (the
    ``n_rs_seq`` of ``llama_context_params``); ``snapshots`` is the ring of at most ``n_rs_seq``
    recurrent-state snapshots of the most recent positions, oldest first, taken by ``forward``
    while it processes a batch (``llama-memory-recurrent.cpp``; docs/speculative.md).
    """

    n_past: int
    layers: tuple
    n_rs_seq: int = 0
    snapshots: tuple = ()

    @staticmethod
    def fresh(c, n_rs_seq: int = 0) -> "SeqState":
        """Empty caches and all-zero recurrent state for the n_layer trunk layers of config c."""
        layers = tuple(
            DeltaNetState.zeros(c.conv_channels, c.ssm_d_conv, c.ssm_dt_rank, c.ssm_d_state)
            if c.is_recurrent[il]
            else KVCache.empty(c.n_head_kv, c.head_dim)
            for il in range(c.n_layer)
        )
        return SeqState(n_past=0, layers=layers, n_rs_seq=n_rs_seq)

    def recurrent_nbytes(self) -> int:
        """Bytes of conv + delta-net state: the size of one rollback snapshot."""
        return sum(s.nbytes for s in self.layers if isinstance(s, DeltaNetState))

    def snapshot_nbytes(self) -> int:
        """Bytes held by the snapshot ring right now (each snapshot = ``recurrent_nbytes()``)."""
        return sum(s.nbytes for s in self.snapshots)

    def advanced(self, n_tokens: int, layers: tuple, per_token: list[tuple]) -> "SeqState":
        """The state after a batch of ``n_tokens``: ``per_token[t]`` holds each layer's recurrent
        state after token t (None for attention layers). The ring keeps the last n_rs_seq
        positions *before* the new end (the new end itself is ``layers``)."""
        new = [Snapshot(self.n_past + t + 1, per_token[t]) for t in range(n_tokens - 1)]
        if self.n_rs_seq:
            current = Snapshot(self.n_past, tuple(s if isinstance(s, DeltaNetState) else None for s in self.layers))
            ring = (self.snapshots + (current,) + tuple(new))[-self.n_rs_seq:]
        else:
            ring = ()
        return SeqState(n_past=self.n_past + n_tokens, layers=layers, n_rs_seq=self.n_rs_seq, snapshots=ring)


def rollback(state: SeqState, r: int) -> SeqState:
    """Undo the last ``r`` positions: restore the recurrent snapshot taken when the sequence held
    n_past − r positions and truncate every KV cache to that length. Never replays tokens.

    (llama.cpp: ``llama_memory_seq_rm(mem, seq, n_past − r, −1)`` on a hybrid memory with
    ``n_rs_seq ≥ r``; ``llama_memory_recurrent::seq_rm`` then restores plane r at the next decode.)
    """
    if r == 0:
        return state
    if r < 0 or r > state.n_past:
        raise RollbackError(f"cannot roll back {r} positions of a sequence holding {state.n_past}")
    if r > state.n_rs_seq:
        raise RollbackError(f"rollback of {r} positions exceeds the snapshot ring (n_rs_seq = {state.n_rs_seq})")
    target = state.n_past - r
    snap = next((s for s in state.snapshots if s.n_past == target), None)
    if snap is None:
        raise RollbackError(f"no snapshot for position {target} in the ring (holds {[s.n_past for s in state.snapshots]})")
    layers = tuple(
        snap.layers[il] if isinstance(layer, DeltaNetState) else layer.truncate(target)
        for il, layer in enumerate(state.layers)
    )
    ring = tuple(s for s in state.snapshots if s.n_past < target)
    return SeqState(n_past=target, layers=layers, n_rs_seq=state.n_rs_seq, snapshots=ring)
