"""Step 4: the per-sequence state record — everything a forward pass remembers between calls.

* attention layers: a :class:`KVCache` (K and V of every processed position, after RoPE);
* Gated DeltaNet layers: a :class:`DeltaNetState` — the causal-conv window (the last Kc−1 inputs
  of the conv) and the delta-rule matrix ``ssm`` [Hv, S_v, S_k];
* ``n_past``: how many positions the sequence holds.

Every record is immutable: a forward pass takes a state and returns a new one, never writing into
the arrays it was given. So a snapshot is just a kept reference and a rollback an assignment
(spec §6 describes the C++ planes these replace). A fresh sequence starts from zeros
(``build_rs`` zeroes slot ``rs_z``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

F32 = np.float32


@dataclass(frozen=True)
class KVCache:
    """K and V of one attention layer: k, v [n_kv, Hkv, D]; pos [n_kv] (int32, cache-slot order)."""

    k: np.ndarray
    v: np.ndarray
    pos: np.ndarray

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
class SeqState:
    """The whole memory of one sequence: ``layers[il]`` is a KVCache or a DeltaNetState."""

    n_past: int
    layers: tuple

    @staticmethod
    def fresh(c) -> "SeqState":
        """Empty caches and all-zero recurrent state for the n_layer trunk layers of config c."""
        layers = tuple(
            DeltaNetState.zeros(c.conv_channels, c.ssm_d_conv, c.ssm_dt_rank, c.ssm_d_state)
            if c.is_recurrent[il]
            else KVCache.empty(c.n_head_kv, c.head_dim)
            for il in range(c.n_layer)
        )
        return SeqState(n_past=0, layers=layers)

    def recurrent_nbytes(self) -> int:
        """Bytes of conv + delta-net state: the size of one rollback snapshot."""
        return sum(s.nbytes for s in self.layers if isinstance(s, DeltaNetState))
