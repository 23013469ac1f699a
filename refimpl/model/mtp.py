"""Step 9: the nextn / MTP head — ``graph_mtp`` of ``src/models/qwen35moe.cpp`` (``qwen35.cpp`` and
``qwen3next.cpp`` have the same head, with their own FFN and RoPE).

How the head is fed follows ``common/speculative.cpp::common_speculative_impl_draft_mtp`` (docs/speculative.md).

The MTP block sits at layer index il = n_layer. Row p pairs token x_p with a hidden vector h of
position p−1 and predicts x_{p+1}::

    mtp_tok_embd  e  = embed(x_p)            nextn.embed_tokens, else token_embd
    mtp_enorm        = RMSNorm(e, nextn.enorm);   mtp_hnorm = RMSNorm(h, nextn.hnorm)
    mtp_concat       = [enorm ‖ hnorm]       embedding half first               [2E]
    mtp_eh_proj   z  = W_eh · concat                                            [E]
    a gated-attention block (blk.L weights, the head's OWN KV cache), r = z + attn
    the arch's FFN (MoE + shared expert, or qwen35's dense SwiGLU) on RMSNorm(r, post_attention_norm);
    out = r + ffn
    h_nextn       h' = RMSNorm(out, nextn.shared_head_norm, else output_norm)
    result_output    = W_head · h'           nextn.shared_head_head, else output (else token_embd)

Which h is fed (``common/speculative.cpp``): while catching up on confirmed tokens, the target
trunk's ``h_nextn`` of position p−1 (zeros at p = 0); while drafting step i ≥ 1, the head's own
``h'`` from step i−1. This module only computes the head; ``refimpl.decode.drafts.MTPSource`` feeds it (catch-up rows and drafts).
Like :func:`refimpl.model.trunk.forward`, :func:`mtp_forward` hands a ``Ctx(ggml=PATH)`` to llama.cpp's graph
(:func:`refimpl.graph.mtp.mtp_forward`); below that line it is the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from refimpl.errors import RefimplError
from refimpl.graph import mtp as ggml_graph
from refimpl.io.load import ModelFile
from refimpl.io.weights import LayerWeights, Matrix, _matrix, _vector, layer_weights
from refimpl.model.attention import gated_attention
from refimpl.model.moe import ffn
from refimpl.model.ops import OUTPUTS, Ctx, ieee, mm, output_rows, rms_norm_w
from refimpl.model.state import KVCache


@dataclass(frozen=True)
class MTPWeights:
    eh_proj: Matrix  # [E, 2E]
    enorm: np.ndarray  # [E]
    hnorm: np.ndarray  # [E]
    embed_tokens: Matrix  # [V, E]: nextn.embed_tokens or token_embd
    shared_head_norm: np.ndarray  # [E]: nextn.shared_head_norm or output_norm
    shared_head_head: Matrix  # [V, E]: nextn.shared_head_head or the trunk's LM head
    layer: LayerWeights  # attention + FFN of blk.L


def require_mtp(m: ModelFile) -> None:
    """Refuse, with one line, a file whose MTP block cannot be run."""
    plan, c = m.plan, m.config
    if plan.mtp == "stripped":
        raise RefimplError(
            f"{m.gguf.path}: --mtp needs the nextn (MTP) block, but this GGUF declares none "
            f"(no {c.arch.name}.nextn_predict_layers; it was converted without MTP)"
        )


def load_mtp_weights(m: ModelFile, trunk) -> MTPWeights:
    """The MTP block's weights; ``trunk`` is the :class:`refimpl.io.weights.Weights` of the same file."""
    require_mtp(m)
    il = m.config.n_layer
    b = f"blk.{il}.nextn."
    t = m.gguf.tensors
    return MTPWeights(
        eh_proj=_matrix(m, b + "eh_proj.weight"),
        enorm=_vector(m, b + "enorm.weight"),
        hnorm=_vector(m, b + "hnorm.weight"),
        embed_tokens=_matrix(m, b + "embed_tokens.weight") if b + "embed_tokens.weight" in t else trunk.token_embd,
        shared_head_norm=_vector(m, b + "shared_head_norm.weight") if b + "shared_head_norm.weight" in t else trunk.output_norm,
        shared_head_head=_matrix(m, b + "shared_head_head.weight") if b + "shared_head_head.weight" in t else trunk.output,
        layer=layer_weights(m, il, attention=True, streamer=trunk.streamer),  # routed experts streamed like the trunk's
    )


@dataclass(frozen=True)
class MTPState:
    """The MTP context's memory: one attention layer's KV cache (no recurrent state)."""

    n_past: int
    kv: KVCache

    @staticmethod
    def fresh(c) -> "MTPState":
        return MTPState(n_past=0, kv=KVCache.empty(c.n_head_kv, c.head_dim))

    def truncate(self, n_past: int) -> "MTPState":
        """Drop positions ≥ n_past (``llama_memory_seq_rm(mem_dft, seq, n_past, -1)``)."""
        return MTPState(n_past=min(self.n_past, n_past), kv=self.kv.truncate(n_past))


@ieee  # inf/NaN weights: the IEEE values, silently, as in C
def mtp_forward(model, w: MTPWeights, state: MTPState, tokens, h: np.ndarray, ctx: Ctx = Ctx(),
                outputs: str = "all") -> tuple[np.ndarray | None, np.ndarray, MTPState]:
    """Run the head on T rows at positions n_past … n_past+T−1.

    tokens [T]; h [T, E] (row p: the hidden of position p−1). Returns (logits [T, V],
    h_nextn [T, E] — the head's own normalised hidden, fed to the next draft step —, new state).
    ``outputs`` as for :func:`refimpl.model.trunk.forward` (a catch-up needs no logits: ``"none"``).
    """
    c = model.config
    il = c.n_layer
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)  # [T]
    h = np.asarray(h, dtype=np.float32).reshape(tokens.size, c.n_embd)  # [T, E]
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs must be one of {OUTPUTS}, not {outputs!r}")
    if ctx.ggml:  # --emulate=ggml: llama.cpp's graph as ggml-cpu computes it, ubatch by ubatch (refimpl/graph/)
        return ggml_graph.mtp_forward(model, w, state, tokens, h, ctx, outputs)
    positions = state.n_past + np.arange(tokens.size, dtype=np.int32)  # [T]

    e = ctx.cb("mtp_tok_embd", il, w.embed_tokens.rows(tokens))  # [T, E]
    enorm, hnorm = ctx.cb("mtp.input_norms", il, (w.enorm, w.hnorm))
    hn = ctx.cb("mtp_hnorm", il, rms_norm_w(h, hnorm, c.rms_eps))  # [T, E]
    en = ctx.cb("mtp_enorm", il, rms_norm_w(e, enorm, c.rms_eps))  # [T, E]
    concat = ctx.cb("mtp_concat", il, np.concatenate([en, hn], axis=-1))  # [T, 2E]: ggml_concat, a bit copy
    z = ctx.cb("mtp_eh_proj", il, mm(w.eh_proj, concat, ctx))  # [T, E]

    lw = w.layer
    a = ctx.cb("mtp_attn_norm", il, rms_norm_w(z, lw.attn_norm, c.rms_eps))  # [T, E]
    attn, kv = gated_attention(lw.mixer, c, a, positions, state.kv, il, ctx, prefix="mtp_")  # [T, E]
    ctx.cb("mtp_attn_out", il, attn)
    r = ctx.cb("mtp_attn_residual", il, attn + z)  # [T, E]
    x = ctx.cb("mtp_attn_post_norm", il, rms_norm_w(r, lw.post_attention_norm, c.rms_eps))  # [T, E]
    with model.stream_phase("mtp", positions):  # the expert streamer counts these reads as the head's
        f = ffn(lw.ffn, c, x, il, ctx, prefix="mtp_")  # [T, E]
    out = ctx.cb("mtp_post_ffn", il, f + r)  # [T, E]

    h_nextn = ctx.cb("h_nextn", -1, rms_norm_w(out, w.shared_head_norm, c.rms_eps))  # [T, E]
    logits = output_rows(w.shared_head_head, h_nextn, outputs, ctx)  # [T, V], [1, V] or None
    return logits, h_nextn, MTPState(n_past=state.n_past + int(tokens.size), kv=kv)

