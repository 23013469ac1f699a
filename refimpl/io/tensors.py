"""Step 3: which tensors a file must hold, with which shapes — checked once, here.

Mirrors ``load_arch_tensors`` of ``src/models/qwen35moe.cpp``, ``qwen35.cpp`` and ``qwen3next.cpp``
(and ``create_tensor_qkv`` / ``create_tensor_gate_up_exps`` in ``src/llama-model.cpp``); docs/gguf.md §3.
Shapes are compared as llama.cpp's ``llama_model_loader::check_tensor_dims`` compares them: the
file's ``ne`` and the expected ``ne``, both padded with 1s to ``GGML_MAX_DIMS`` = 4 dimensions, must
be equal — never by numpy rank. The converter writes HF's ``shared_expert_gate`` (a Linear of
shape (1, E)) as ``ffn_gate_inp_shexp`` with ``ne = [E, 1]``; llama.cpp expects ``{n_embd}`` and
accepts it, and so does refimpl. An accepted tensor is then given the expected (canonical) shape
in the file's tensor table (:func:`conform_shapes`), so the rest of refimpl sees one layout.
The three share the attention block, the delta-net conv / dt / a / norm / out tensors and the nextn
tensors; they differ in the FFN (routed + shared experts, or dense ``ffn_gate`` / ``ffn_up`` /
``ffn_down`` for qwen35) and in qwen3next's delta-net input projections (``ssm_ba`` instead of
``ssm_beta`` + ``ssm_alpha``; ``ssm_in`` — q, k, v and z of each key head side by side — instead of
``attn_qkv`` + ``attn_gate`` in files converted before llama.cpp split it). Shapes are numpy order
(ggml ``ne`` reversed): a matrix used as ``y = W @ x`` is ``(out, in)``.

The result, :class:`TensorPlan`, records the variants a file may come in:

* ``tied``: no ``output.weight``; the LM head is ``token_embd.weight``;
* ``fused_gate_up[il]``: layer il has ``ffn_gate_up_exps`` (gate rows first) instead of separate
  ``ffn_gate_exps`` / ``ffn_up_exps``;
* ``ssm_in[il]``: (qwen3next) delta-net layer il has the fused ``ssm_in`` instead of ``attn_qkv`` +
  ``attn_gate`` (``build_qkvz``'s "legacy" path);
* ``fused_qkv[il]``: a full-attention block (trunk or nextn) has ``attn_qkv`` — rows [Q and gate ‖ K ‖
  V] — instead of ``attn_q`` / ``attn_k`` / ``attn_v`` (``convert_hf_to_gguf.py --fuse-qkv``);
* ``mtp``: ``"present"`` (all nextn-block tensors there) or ``"stripped"`` (the file declares no
  nextn block — converted with ``--no-mtp``). A file that declares the block but lacks any of its
  tensors is refused, as llama.cpp refuses it (it creates them, unloaded, even without ``load_mtp``).
* ``mtp_extras``: which of the optional ``nextn.embed_tokens`` / ``nextn.shared_head_head`` /
  ``nextn.shared_head_norm`` are present.

Every tensor of the file must be one the graph reads: llama.cpp refuses a file with tensors nothing
claims ("wrong number of tensors"), and refimpl does too rather than ignore, say, an attention bias.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gguf import GGMLQuantizationType as Q

from kernels.base.blocks import WEIGHT_TYPES
from refimpl.io.config import Config
from refimpl.errors import RefimplError
from refimpl.io.gguf_file import GGUFFile

# Weight formats refimpl can multiply: every layout kernels/base/blocks.py (and blocks_iq.py) describes.
SUPPORTED_QTYPES = frozenset(WEIGHT_TYPES)
# Tensors the CPU graph reads as plain floats (ssm_conv asserts 4-byte elements; the others are
# vectors added or multiplied elementwise). The converter and llama-quantize keep them F32.
F32_ONLY_SUFFIXES = ("norm.weight", "ssm_conv1d.weight", "ssm_a", "ssm_dt.bias", "ffn_gate_inp_shexp.weight")

GGML_MAX_DIMS = 4  # ggml.h

MTP_EXTRAS = ("nextn.embed_tokens.weight", "nextn.shared_head_head.weight", "nextn.shared_head_norm.weight")


@dataclass(frozen=True)
class TensorPlan:
    tied: bool
    fused_gate_up: tuple[bool, ...]  # per layer index 0 … n_layer_all-1
    ssm_in: tuple[bool, ...]  # per layer index: qwen3next's fused ssm_in (q, k, v, z per key head)
    fused_qkv: tuple[bool, ...]  # per layer index: a full-attention block's attn_qkv (--fuse-qkv)
    mtp: str  # "present" | "stripped"
    mtp_extras: frozenset[str]  # subset of MTP_EXTRAS present in the file


def _attention_block(c: Config, il: int, fused_qkv: bool = False) -> dict[str, tuple[int, ...]]:
    E, H, Hkv, D = c.n_embd, c.n_head, c.n_head_kv, c.head_dim
    b = f"blk.{il}."
    if fused_qkv:  # create_tensor_qkv: attn_qkv rows [Q and gate (2HD) ‖ K (Hkv·D) ‖ V (Hkv·D)]; --fuse-qkv
        qkv = {b + "attn_qkv.weight": (2 * H * D + 2 * Hkv * D, E)}
    else:
        qkv = {
            b + "attn_q.weight": (2 * H * D, E),  # Q and output gate, per-head interleaved
            b + "attn_k.weight": (Hkv * D, E),
            b + "attn_v.weight": (Hkv * D, E),
        }
    return qkv | {
        b + "attn_output.weight": (E, H * D),
        b + "attn_q_norm.weight": (D,),
        b + "attn_k_norm.weight": (D,),
    }


def _deltanet_block(c: Config, il: int, ssm_in: bool) -> dict[str, tuple[int, ...]]:
    E, Hv, S, Din, C, Kc = c.n_embd, c.ssm_dt_rank, c.ssm_d_state, c.ssm_d_inner, c.conv_channels, c.ssm_d_conv
    b = f"blk.{il}."
    if ssm_in:  # qwen3next.cpp: per key head g, rows [q_g (S) ‖ k_g (S) ‖ v_g (Hv/Hk·S) ‖ z_g (Hv/Hk·S)]
        out = {b + "ssm_in.weight": (C + Din, E)}
    else:
        out = {
            b + "attn_qkv.weight": (C, E),  # rows [q (Hk·S) ‖ k (Hk·S) ‖ v (Hv·S)]
            b + "attn_gate.weight": (Din, E),  # z
        }
    if c.arch.gdn_ba == "fused":  # qwen3next.cpp: per key head g, rows [b_g (Hv/Hk) ‖ a_g (Hv/Hk)]
        out[b + "ssm_ba.weight"] = (2 * Hv, E)
    else:
        out[b + "ssm_beta.weight"] = (Hv, E)
        out[b + "ssm_alpha.weight"] = (Hv, E)
    return out | {
        b + "ssm_conv1d.weight": (C, Kc),
        b + "ssm_dt.bias": (Hv,),
        b + "ssm_a": (Hv,),
        b + "ssm_norm.weight": (S,),
        b + "ssm_out.weight": (E, Din),
    }


def _ffn_block(c: Config, il: int, fused: bool) -> dict[str, tuple[int, ...]]:
    E, X, F, Fs = c.n_embd, c.n_expert, c.n_ff_exp, c.n_ff_shexp
    b = f"blk.{il}."
    out = {
        b + "attn_norm.weight": (E,),
        b + "post_attention_norm.weight": (E,),  # the pre-FFN norm
    }
    if not c.is_moe:  # qwen35.cpp: dense SwiGLU of width n_ff
        return out | {
            b + "ffn_gate.weight": (c.n_ff, E),
            b + "ffn_up.weight": (c.n_ff, E),
            b + "ffn_down.weight": (E, c.n_ff),
        }
    out |= {
        b + "ffn_gate_inp.weight": (X, E),
        b + "ffn_down_exps.weight": (X, E, F),
        b + "ffn_gate_inp_shexp.weight": (E,),
        b + "ffn_gate_shexp.weight": (Fs, E),
        b + "ffn_up_shexp.weight": (Fs, E),
        b + "ffn_down_shexp.weight": (E, Fs),
    }
    if fused:
        out[b + "ffn_gate_up_exps.weight"] = (X, 2 * F, E)
    else:
        out[b + "ffn_gate_exps.weight"] = (X, F, E)
        out[b + "ffn_up_exps.weight"] = (X, F, E)
    return out


def _mtp_block(c: Config, il: int, fused: bool, fused_qkv: bool) -> dict[str, tuple[int, ...]]:
    E = c.n_embd
    b = f"blk.{il}."
    return {
        **_ffn_block(c, il, fused),
        **_attention_block(c, il, fused_qkv),
        b + "nextn.eh_proj.weight": (E, 2 * E),  # columns [0,E) embedding half, [E,2E) hidden half
        b + "nextn.enorm.weight": (E,),
        b + "nextn.hnorm.weight": (E,),
    }


def _mtp_extra_shapes(c: Config, il: int) -> dict[str, tuple[int, ...]]:
    V, E = c.n_vocab, c.n_embd
    b = f"blk.{il}."
    return {b + "nextn.embed_tokens.weight": (V, E), b + "nextn.shared_head_head.weight": (V, E), b + "nextn.shared_head_norm.weight": (E,)}


def padded_ne(ne: tuple[int, ...]) -> tuple[int, ...]:
    """``ne`` with trailing 1s up to GGML_MAX_DIMS: ggml's ``ne[4]`` (a file may list fewer dimensions)."""
    if len(ne) > GGML_MAX_DIMS:
        return tuple(ne)  # no such ggml tensor; compared as is, so it never matches a 4-D expectation
    return tuple(ne) + (1,) * (GGML_MAX_DIMS - len(ne))


def same_dims(file_ne: tuple[int, ...], expected_ne: tuple[int, ...]) -> bool:
    """``check_tensor_dims`` (src/llama-model-loader.cpp): every one of the 4 dimensions equal, a
    dimension missing on either side being 1."""
    return padded_ne(file_ne) == padded_ne(expected_ne)


def conform_shapes(gf: GGUFFile, shapes: dict[str, tuple[int, ...]]) -> None:
    """Give each accepted tensor of ``gf.tensors`` its expected numpy shape (same bytes, same ne up
    to trailing 1s); :func:`refimpl.io.weights.tensor_data` reshapes the data views to match."""
    for name, shape in shapes.items():
        info = gf.tensors[name]
        if info.shape != shape:
            gf.tensors[name] = replace(info, shape=shape)


def _and_more(names: list[str]) -> str:
    """What a one-line error about ``names[0]`` says of the rest."""
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""


def plan_tensors(gf: GGUFFile, c: Config) -> TensorPlan:
    """Check every tensor the graph reads exists with the right shape and a supported type."""
    t = gf.tensors
    fused = tuple(f"blk.{il}.ffn_gate_up_exps.weight" in t for il in range(c.n_layer_all))
    # qwen3next.cpp::build_qkvz: attn_qkv when present ("optimized path"), else the legacy ssm_in
    ssm_in = tuple(c.arch.name == "qwen3next" and f"blk.{il}.attn_qkv.weight" not in t and f"blk.{il}.ssm_in.weight" in t
                   for il in range(c.n_layer_all))
    # create_tensor_qkv: a full-attention block (trunk or nextn) with attn_qkv takes it instead of attn_q/k/v
    fused_qkv = tuple((il >= c.n_layer or not c.is_recurrent[il]) and f"blk.{il}.attn_qkv.weight" in t
                      for il in range(c.n_layer_all))

    required: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (c.n_vocab, c.n_embd),
        "output_norm.weight": (c.n_embd,),
    }
    tied = "output.weight" not in t
    if not tied:
        required["output.weight"] = (c.n_vocab, c.n_embd)
    if c.n_layer_nextn and "blk.0.attn_norm.weight" not in t and f"blk.{c.n_layer}.nextn.eh_proj.weight" in t:
        raise RefimplError(f"{gf.path}: an MTP-only draft file (convert_hf_to_gguf.py --mtp: the nextn block without the "
                           f"trunk); refimpl runs a whole model — use the file the trunk is in")
    for il in range(c.n_layer):
        attention = not c.is_recurrent[il]
        required.update(_ffn_block(c, il, fused[il]))
        required.update(_attention_block(c, il, fused_qkv[il]) if attention else _deltanet_block(c, il, ssm_in[il]))
    for il in range(c.n_layer, c.n_layer_all):
        # llama.cpp creates the nextn block's tensors without TENSOR_NOT_REQUIRED even when it does not
        # load them (src/models/qwen35moe.cpp: mtp_flags), so a file that declares the block must hold it
        required.update(_mtp_block(c, il, fused[il], fused_qkv[il]))
    missing = [name for name in required if name not in t]
    if missing:
        where = ""
        if missing[0].startswith(f"blk.{c.n_layer}.") and c.n_layer_nextn:
            where = (f"; the file declares an MTP block ({c.arch.name}.nextn_predict_layers = {c.n_layer_nextn}) "
                     f"without its tensors, which llama.cpp refuses too — convert with --no-mtp")
        raise RefimplError(f"{gf.path}: missing tensor '{missing[0]}'{_and_more(missing)}{where}")

    extras: dict[str, tuple[int, ...]] = {}
    for il in range(c.n_layer, c.n_layer_all):
        extras.update({k: v for k, v in _mtp_extra_shapes(c, il).items() if k in t})
    # qwen3next.cpp::build_qkvz takes attn_qkv when both are there; the loader still claims ssm_in
    claimed = set(required) | set(extras) | {f"blk.{il}.ssm_in.weight" for il in range(c.n_layer_all)}
    unclaimed = [name for name in t if name not in claimed]
    if unclaimed:
        raise RefimplError(f"{gf.path}: tensor '{unclaimed[0]}' is not one the {c.arch.name} graph reads (llama.cpp "
                           f"refuses such a file: \"wrong number of tensors\"){_and_more(unclaimed)}")

    expected = {**required, **extras}
    for name, shape in expected.items():
        info = t[name]
        if not same_dims(info.ne, tuple(reversed(shape))):
            raise RefimplError(
                f"{gf.path}: tensor '{name}' has ne {list(info.ne)}, but llama.cpp expects ne "
                f"{list(reversed(shape))} (trailing dimensions of 1 may be added or left out)"
            )
        if info.qtype not in SUPPORTED_QTYPES:
            raise RefimplError(f"{gf.path}: tensor '{name}' has unsupported quant type {info.qtype.name}")
        if name.endswith(F32_ONLY_SUFFIXES) and info.qtype != Q.F32:
            raise RefimplError(f"{gf.path}: tensor '{name}' must be F32 (llama.cpp reads it as floats), got {info.qtype.name}")
    conform_shapes(gf, expected)

    return TensorPlan(
        tied=tied,
        fused_gate_up=fused,
        ssm_in=ssm_in,
        fused_qkv=fused_qkv,
        mtp="stripped" if c.n_layer_nextn == 0 else "present",
        mtp_extras=frozenset(name.split(".", 2)[2] for name in extras),
    )
