"""Step 4: the weights, grouped by layer, as views into the GGUF memory map.

Matrices stay in their stored format (a :class:`Matrix` is the raw bytes plus the quant type);
``refimpl.model.ops.mm`` multiplies them through ``kernels.matmul`` without dequantizing the whole
matrix. Vectors (norms, biases, ssm_a, the conv kernel) are float32 arrays — the loader has checked
they are F32. Attribute names are the GGUF tensor names without ``blk.N.`` and ``.weight``.

Conventions baked into the file by the converter (docs/gguf.md §4) are used as stored: norm weights
already include the +1 (except ``ssm_norm``), ``ssm_a`` = −exp(A_log), value heads in the order the
arch's graph reads them (tiled for qwen35moe / qwen35, grouped by key head for qwen3next).

Routed experts are :class:`PinnedExperts` (views into the map) unless a
:class:`refimpl.io.streamer.ExpertStreamer` is given, which reads each routed slice from the file on
demand instead (same ``routed``/``gate``/``up``/``down`` methods; docs/streamer.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
import numpy as np
from gguf import GGMLQuantizationType

import kernels
from refimpl.io.load import ModelFile

# ``ExpertStreamer`` in the annotations below is refimpl/io/streamer.py's, which builds on this module
# (so it is not imported here).


@dataclass(frozen=True)
class Matrix:
    """A 2-D weight used as ``y = W @ x``: numpy shape (out, in), raw rows in ``qtype``."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, int]
    raw: np.ndarray
    stored_rows: int | None = None  # a row block of a fused tensor (attn_qkv): that tensor's rows, which decide
    # whether llama.cpp repacks it (kernels.ggml.mulmat.repacked); None: the matrix is the whole tensor
    cols: object = None  # --emulate=ggml: the same weights in kernels.ggml.columns' layout (refimpl.graph.layout.
    # ggml_layout), or None: its kernels read the stored rows (the same bits either way)

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Dequantized rows (``ggml_get_rows``): [n] -> [n, in] float32."""
        return kernels.dequantize(self.raw[np.asarray(idx)], self.qtype, self.shape[1])

    @functools.cached_property
    def row_bytes(self) -> np.ndarray:
        """The stored rows as read-only uint8 bytes [..., row bytes] (a lane-packed matrix's original rows),
        what ``--emulate=ggml``'s kernels read (``refimpl.graph.ops.mul_mat``, ``get_rows``). Worked out on first use and
        kept: a view of the memory map or of ``raw`` (no copy: ``raw`` is C-contiguous), so the cache holds
        no memory of its own, and a decode step does not validate every matrix again."""
        from kernels.plain.dequant import as_row_bytes

        raw = self.raw.raw if isinstance(self.raw, kernels.PackedRows) else self.raw
        return as_row_bytes(raw, self.qtype)[0]


@dataclass(frozen=True)
class PinnedExperts:
    """Routed expert matrices read from the memory map: ``gate(e)``, ``up(e)``, ``down(e)``.

    ``gate_up`` is the fused [X, 2F, E] tensor when the file has one (gate rows first).
    """

    gate_exps: Matrix | None  # [X, F, E] viewed per expert
    up_exps: Matrix | None
    gate_up_exps: Matrix | None
    down_exps: Matrix  # [X, E, F]
    n_ff: int

    def stacked(self, which: str) -> tuple[Matrix, tuple[int, int]]:
        """The [X, out, in] stack holding every expert's ``which`` ("gate", "up", "down") matrix, and the
        rows of each expert's matrix that are it (``refimpl.model.moe.mul_mat_id``; :meth:`gate` … slice it)."""
        if which == "down":
            return self.down_exps, (0, self.down_exps.shape[1])
        if self.gate_up_exps is not None:
            return self.gate_up_exps, (0, self.n_ff) if which == "gate" else (self.n_ff, 2 * self.n_ff)
        m = self.gate_exps if which == "gate" else self.up_exps
        return m, (0, m.shape[1])

    def _slice(self, which: str, e: int) -> Matrix:
        m, (start, stop) = self.stacked(which)
        raw = m.raw[e][start:stop]
        return Matrix(f"{m.name}[{e}]", m.qtype, (raw.shape[0], m.shape[-1]), raw)

    def gate(self, e: int) -> Matrix:
        return self._slice("gate", e)

    def up(self, e: int) -> Matrix:
        return self._slice("up", e)

    def down(self, e: int) -> Matrix:
        return self._slice("down", e)

    def routed(self, sel: np.ndarray, weights: np.ndarray, stacked: bool = False) -> "PinnedExperts":
        """The experts one moe_ffn batch routed to (sel [T, K]): all of them are mapped already (as stacks),
        so this is ``self``. :class:`refimpl.io.streamer.StreamedExperts` reads them here instead."""
        return self


@dataclass(frozen=True)
class AttentionWeights:
    attn_q: Matrix  # [2HD, E]
    attn_k: Matrix  # [Hkv·D, E]
    attn_v: Matrix  # [Hkv·D, E]
    attn_output: Matrix  # [E, HD]
    attn_q_norm: np.ndarray  # [D]
    attn_k_norm: np.ndarray  # [D]


@dataclass(frozen=True)
class DeltaNetWeights:
    """The input projections come in one of two layouts each (refimpl.model.deltanet.input_projections):
    ``attn_qkv`` + ``attn_gate`` or qwen3next's fused ``ssm_in``; ``ssm_beta`` + ``ssm_alpha`` or
    qwen3next's fused ``ssm_ba``. The fields of the other layout are None."""

    attn_qkv: Matrix | None  # [C, E]
    attn_gate: Matrix | None  # [Din, E]
    ssm_in: Matrix | None  # [C + Din, E]: per key head [q ‖ k ‖ v ‖ z] (qwen3next, legacy files)
    ssm_beta: Matrix | None  # [Hv, E]
    ssm_alpha: Matrix | None  # [Hv, E]
    ssm_ba: Matrix | None  # [2Hv, E]: per key head [b ‖ a] (qwen3next)
    ssm_out: Matrix  # [E, Din]
    ssm_conv1d: np.ndarray  # [C, Kc]
    ssm_dt: np.ndarray  # [Hv] (ssm_dt.bias)
    ssm_a: np.ndarray  # [Hv] = −exp(A_log)
    ssm_norm: np.ndarray  # [S], plain weight


@dataclass(frozen=True)
class FFNWeights:
    ffn_gate_inp: Matrix  # router [X, E]
    experts: PinnedExperts  # or refimpl.io.streamer.StreamedExperts (same methods)
    ffn_gate_inp_shexp: np.ndarray  # [E]
    ffn_gate_shexp: Matrix  # [Fs, E]
    ffn_up_shexp: Matrix  # [Fs, E]
    ffn_down_shexp: Matrix  # [E, Fs]


@dataclass(frozen=True)
class DenseFFNWeights:
    """qwen35's FFN: SwiGLU ``ffn_down(silu(ffn_gate x) ⊙ ffn_up x)`` (refimpl.model.moe.swiglu, called by refimpl.model.moe.ffn)."""

    ffn_gate: Matrix  # [Ff, E]
    ffn_up: Matrix  # [Ff, E]
    ffn_down: Matrix  # [E, Ff]


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: np.ndarray  # [E]
    post_attention_norm: np.ndarray  # [E], the pre-FFN norm
    mixer: AttentionWeights | DeltaNetWeights
    ffn: FFNWeights | DenseFFNWeights


@dataclass(frozen=True)
class Weights:
    token_embd: Matrix  # [V, E]
    output_norm: np.ndarray  # [E]
    output: Matrix  # [V, E]; token_embd itself when tied
    layers: tuple[LayerWeights, ...]  # trunk layers 0 … n_layer-1
    streamer: "ExpertStreamer | None" = None  # routed experts read through it; None: pinned (memory map)


def tensor_data(m: ModelFile, name: str) -> np.ndarray:
    """A tensor's data view in the shape the plan accepted it as (``refimpl.io.tensors.conform_shapes``):
    float types as elements, block types as rows of ``row_bytes`` (a view: no copy)."""
    info = m.gguf.tensors[name]
    raw = m.gguf.raw(name)
    if raw.dtype == np.uint8:  # BF16 and the block types: the last axis is a row's bytes
        return raw.reshape(info.shape[:-1] + (kernels.row_bytes(info.qtype, info.shape[-1]),))
    return raw.reshape(info.shape)


def _matrix(m: ModelFile, name: str) -> Matrix:
    info = m.gguf.tensors[name]
    return Matrix(name, info.qtype, info.shape, tensor_data(m, name))


def _vector(m: ModelFile, name: str) -> np.ndarray:
    return np.asarray(tensor_data(m, name), dtype=np.float32)


def _optional(m: ModelFile, name: str) -> Matrix | None:
    return _matrix(m, name) if name in m.gguf.tensors else None


def _fused_qkv(m: ModelFile, il: int) -> tuple[Matrix, Matrix, Matrix]:
    """``attn_qkv`` (--fuse-qkv) as its three row blocks [Q and gate (2HD) ‖ K (Hkv·D) ‖ V (Hkv·D)] — views,
    so each row, and so each output, is the one the separate matrices give (``build_qkv`` views the
    fused product the same way)."""
    c = m.config
    whole = _matrix(m, f"blk.{il}.attn_qkv.weight")
    nq, nk = 2 * c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    parts = {"q": (0, nq), "k": (nq, nq + nk), "v": (nq + nk, nq + 2 * nk)}
    return tuple(Matrix(f"{whole.name}[{x}]", whole.qtype, (b - a, whole.shape[1]), whole.raw[a:b], whole.shape[0])
                 for x, (a, b) in parts.items())


def layer_weights(m: ModelFile, il: int, attention: bool, streamer: "ExpertStreamer | None" = None) -> LayerWeights:
    """Block il's weights; its routed experts from ``streamer`` when given, else pinned views."""
    b = f"blk.{il}."
    if attention:
        q, k, v = _fused_qkv(m, il) if m.plan.fused_qkv[il] else (_matrix(m, b + f"attn_{x}.weight") for x in "qkv")
        mixer = AttentionWeights(
            attn_q=q,
            attn_k=k,
            attn_v=v,
            attn_output=_matrix(m, b + "attn_output.weight"),
            attn_q_norm=_vector(m, b + "attn_q_norm.weight"),
            attn_k_norm=_vector(m, b + "attn_k_norm.weight"),
        )
    else:
        mixer = DeltaNetWeights(
            attn_qkv=_optional(m, b + "attn_qkv.weight"),
            attn_gate=_optional(m, b + "attn_gate.weight"),
            ssm_in=_matrix(m, b + "ssm_in.weight") if m.plan.ssm_in[il] else None,
            ssm_beta=_optional(m, b + "ssm_beta.weight"),
            ssm_alpha=_optional(m, b + "ssm_alpha.weight"),
            ssm_ba=_optional(m, b + "ssm_ba.weight"),
            ssm_out=_matrix(m, b + "ssm_out.weight"),
            ssm_conv1d=_vector(m, b + "ssm_conv1d.weight"),
            ssm_dt=_vector(m, b + "ssm_dt.bias"),
            ssm_a=_vector(m, b + "ssm_a"),
            ssm_norm=_vector(m, b + "ssm_norm.weight"),
        )
    return LayerWeights(
        attn_norm=_vector(m, b + "attn_norm.weight"),
        post_attention_norm=_vector(m, b + "post_attention_norm.weight"),
        mixer=mixer,
        ffn=_ffn_weights(m, il, streamer) if m.config.is_moe else DenseFFNWeights(
            ffn_gate=_matrix(m, b + "ffn_gate.weight"),
            ffn_up=_matrix(m, b + "ffn_up.weight"),
            ffn_down=_matrix(m, b + "ffn_down.weight"),
        ),
    )


def _ffn_weights(m: ModelFile, il: int, streamer: "ExpertStreamer | None") -> FFNWeights:
    """Block il's MoE: router, routed experts (from ``streamer`` when given, else pinned views), shared expert."""
    b = f"blk.{il}."
    experts = streamer.experts(il) if streamer is not None else PinnedExperts(
        gate_exps=_optional(m, b + "ffn_gate_exps.weight"),
        up_exps=_optional(m, b + "ffn_up_exps.weight"),
        gate_up_exps=_optional(m, b + "ffn_gate_up_exps.weight"),
        down_exps=_matrix(m, b + "ffn_down_exps.weight"),
        n_ff=m.config.n_ff_exp,
    )
    return FFNWeights(
        ffn_gate_inp=_matrix(m, b + "ffn_gate_inp.weight"),
        experts=experts,
        ffn_gate_inp_shexp=_vector(m, b + "ffn_gate_inp_shexp.weight"),
        ffn_gate_shexp=_matrix(m, b + "ffn_gate_shexp.weight"),
        ffn_up_shexp=_matrix(m, b + "ffn_up_shexp.weight"),
        ffn_down_shexp=_matrix(m, b + "ffn_down_shexp.weight"),
    )


def load_weights(m: ModelFile, streamer: "ExpertStreamer | None" = None) -> Weights:
    """The trunk's weights; routed experts through ``streamer`` (refimpl.io.streamer) when given."""
    c = m.config
    token_embd = _matrix(m, "token_embd.weight")
    return Weights(
        token_embd=token_embd,
        output_norm=_vector(m, "output_norm.weight"),
        output=token_embd if m.plan.tied else _matrix(m, "output.weight"),
        layers=tuple(layer_weights(m, il, attention=not c.is_recurrent[il], streamer=streamer) for il in range(c.n_layer)),
        streamer=streamer,
    )
