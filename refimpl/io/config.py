"""Step 2: the model's hyperparameters, derived from ``ARCH.*`` keys exactly as llama.cpp does.

Three llama.cpp architectures share one loader and one graph here (:data:`ARCHS`; docs/architecture.md,
"Three architectures"): ``qwen35moe`` (Qwen3.5/3.6-MoE), ``qwen35`` (the dense Qwen3.5/3.6 models:
a SwiGLU FFN where the MoE was) and ``qwen3next`` (Qwen3-Next: NEOX RoPE, fused ``ssm_ba`` / ``ssm_in``
delta-net projections, value heads grouped by key head). :class:`Arch` records what differs; every
other module branches on its fields, never on the name.

Sources: ``src/llama-model.cpp::llama_model_base::load_hparams`` (generic keys and defaults),
``src/models/{qwen35moe,qwen35,qwen3next}.cpp::load_arch_hparams`` (arch keys, recurrent-layer
flags), ``src/llama-hparams.cpp`` (``n_layer()`` = block_count − nextn_predict_layers); docs/gguf.md §2
lists the keys, their defaults and the layer-counting rule.

Symbols (docs/architecture.md has the full legend): E = n_embd, V = n_vocab, L = n_layer (trunk
layers), H = n_head, Hkv = n_head_kv, D = head_dim, R = n_rot, Hk = ssm_n_group (delta-net key
heads, GGUF ssm.group_count), Hv = ssm_dt_rank (value heads, ssm.time_step_rank), S = ssm_d_state (delta-net
head dim, ssm.state_size), Din = ssm_d_inner,
C = conv channels = Din + 2·Hk·S, Kc = ssm_d_conv, X = n_expert, K = n_expert_used, F = n_ff_exp,
Fs = n_ff_shexp, Ff = n_ff (the dense FFN's width, qwen35).
"""

from __future__ import annotations

from dataclasses import dataclass

from refimpl.errors import RefimplError
from refimpl.io.gguf_file import GGUFFile


@dataclass(frozen=True)
class Arch:
    """What one llama.cpp architecture does differently (``src/models/<name>.cpp``)."""

    name: str  # general.architecture, and the prefix of its metadata keys
    ffn: str  # "moe": routed experts + gated shared expert (build_moe_ffn); "dense": SwiGLU (build_ffn)
    rope: str  # "imrope": ggml_rope_multi with rope.dimension_sections; "neox": ggml_rope_ext (llama_model_rope_type)
    gdn_heads: str  # value head j reads key head "tiled": j mod Hk; "grouped": j // (Hv/Hk) (the ggml_repeat_4d in build_layer_attn_linear)
    gdn_ba: str  # "split": ssm_beta + ssm_alpha; "fused": ssm_ba, per key head [b (Hv/Hk) | a (Hv/Hk)]
    rs_rollback: bool  # llm_arch_supports_rs_rollback (src/llama-arch.cpp): partial recurrent-state rollback (n_rs_seq)


ARCHS: dict[str, Arch] = {
    "qwen35moe": Arch("qwen35moe", ffn="moe", rope="imrope", gdn_heads="tiled", gdn_ba="split", rs_rollback=True),
    "qwen35": Arch("qwen35", ffn="dense", rope="imrope", gdn_heads="tiled", gdn_ba="split", rs_rollback=True),
    "qwen3next": Arch("qwen3next", ffn="moe", rope="neox", gdn_heads="grouped", gdn_ba="fused", rs_rollback=False),
}
ARCH = "qwen35moe"  # the default (fixtures, the built-in model)


@dataclass(frozen=True)
class Config:
    arch: Arch
    name: str
    n_ctx_train: int
    n_embd: int  # E
    n_vocab: int  # V
    n_layer_all: int  # block_count: trunk layers + MTP blocks
    n_layer_nextn: int  # nextn_predict_layers (0 = no MTP block in the file)
    n_head: int  # H
    n_head_kv: int  # Hkv
    head_dim: int  # D (= key_length = value_length)
    n_rot: int  # R
    rope_sections: tuple[int, ...]  # IMRoPE sections (4 ints); () for NEOX RoPE
    rope_freq_base: float
    rope_freq_scale: float
    rms_eps: float
    n_expert: int  # X (0: dense FFN)
    n_expert_used: int  # K (0: dense)
    n_ff: int  # feed_forward_length: the dense FFN's width (qwen35); MoE archs: only a fallback for F and Fs
    n_ff_exp: int  # F (0: dense)
    n_ff_shexp: int  # Fs (0: dense)
    # The delta net's widths under the names llama.cpp's hparams give them: the GGUF keys ``{arch}.ssm.*`` were
    # Mamba's, and qwen35moe / qwen3next reuse them for other meanings (src/models/qwen35moe.cpp: num_v_heads = ssm_dt_rank,
    # num_k_heads = ssm_n_group, head_k_dim = ssm_d_state, head_v_dim = d_inner / num_v_heads = S). The letters are the code's.
    ssm_d_conv: int  # Kc: ssm.conv_kernel, the causal conv's width
    ssm_d_inner: int  # Din: ssm.inner_size = Hv·S
    ssm_d_state: int  # S: ssm.state_size, the head dimension of q, k and v (not Mamba's state size; the state is M [Hv, S, S])
    ssm_dt_rank: int  # Hv: ssm.time_step_rank, the number of value heads (not a rank)
    ssm_n_group: int  # Hk: ssm.group_count, the number of key (and query) heads
    is_recurrent: tuple[bool, ...]  # per layer index 0 … n_layer_all-1

    @property
    def n_layer(self) -> int:
        """Trunk layers the main graph runs (``llama_hparams::n_layer``); the MTP block is il = n_layer."""
        return self.n_layer_all - self.n_layer_nextn

    @property
    def has_mtp(self) -> bool:
        return self.n_layer_nextn > 0

    @property
    def conv_channels(self) -> int:
        """C = Din + 2·Hk·S: the q, k and v channels that go through the causal conv."""
        return self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state

    @property
    def is_moe(self) -> bool:
        return self.arch.ffn == "moe"

    def layer_kind(self, il: int) -> str:
        if il >= self.n_layer:
            return "mtp"
        return "deltanet" if self.is_recurrent[il] else "attention"


def _uniform(gf: GGUFFile, key: str, values: list, what: str) -> int:
    distinct = sorted(set(values))
    if len(distinct) != 1:
        raise RefimplError(f"{gf.path}: per-layer varying '{key}' ({what}) is not supported: {distinct}")
    return int(distinct[0])


LLAMA_MAX_LAYERS = 512  # src/llama-hparams.h: the per-layer arrays' size; a larger block_count is refused


def load_config(gf: GGUFFile) -> Config:
    """Build the :class:`Config` of a GGUF file, or raise a one-line :class:`RefimplError`."""
    n_split = gf.key("split.count", 1)  # gguf-split / convert_hf_to_gguf.py --split-max-*: llama.cpp opens every part
    if isinstance(n_split, int) and n_split > 1:
        raise RefimplError(f"{gf.path}: part {gf.key('split.no', 0) + 1} of a {n_split}-part split GGUF; refimpl reads one "
                           f"file — merge the parts first (llama-gguf-split --merge FIRST-PART OUT.gguf)")
    name = gf.key("general.architecture", required=True)
    if name not in ARCHS:
        raise RefimplError(f"{gf.path}: architecture '{name}' is not supported (refimpl implements {', '.join(ARCHS)})")
    arch = ARCHS[name]
    p = arch.name + "."

    def req(key):
        return gf.key(p + key, required=True)

    n_layer_all = int(req("block_count"))
    n_layer_nextn = int(gf.key(p + "nextn_predict_layers", 0))
    if not 0 < n_layer_all <= LLAMA_MAX_LAYERS:
        raise RefimplError(f"{gf.path}: '{p}block_count' must be 1 … {LLAMA_MAX_LAYERS} (llama.cpp's LLAMA_MAX_LAYERS), got {n_layer_all}")
    if n_layer_nextn > n_layer_all:
        raise RefimplError(f"{gf.path}: '{p}nextn_predict_layers' ({n_layer_nextn}) exceeds block_count ({n_layer_all})")
    if n_layer_nextn > 1:
        raise RefimplError(f"{gf.path}: '{p}nextn_predict_layers' = {n_layer_nextn}; llama.cpp's MTP graph supports exactly 1")
    n_layer = n_layer_all - n_layer_nextn
    n_embd = int(req("embedding_length"))

    # Head counts: scalar or per-layer array; n_head_kv defaults to n_head (load_hparams).
    n_head_arr = gf.key_or_arr(p + "attention.head_count", n_layer_all, 0)
    n_head_kv_arr = gf.key_or_arr(p + "attention.head_count_kv", n_layer_all) or n_head_arr
    recurrent = _recurrent_flags(gf, p, n_layer_all, n_layer)
    attn_layers = [il for il in range(n_layer_all) if il >= n_layer or not recurrent[il]]
    n_head = _uniform(gf, p + "attention.head_count", [n_head_arr[i] for i in attn_layers], "attention heads")
    n_head_kv = _uniform(gf, p + "attention.head_count_kv", [n_head_kv_arr[i] for i in attn_layers], "KV heads")
    if n_head <= 0:
        raise RefimplError(f"{gf.path}: missing required metadata key '{p}attention.head_count'")
    if n_head % max(n_head_kv, 1) != 0 or n_head_kv <= 0:
        raise RefimplError(f"{gf.path}: attention.head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")

    # Head dims default to n_embd / n_head (wrong for Qwen3.5, which always writes them).
    key_length = int(gf.key(p + "attention.key_length", n_embd // n_head))
    value_length = int(gf.key(p + "attention.value_length", n_embd // n_head))
    if key_length != value_length:
        raise RefimplError(f"{gf.path}: attention.key_length {key_length} != value_length {value_length} (the {name} graph asserts they are equal)")
    n_rot = int(gf.key(p + "rope.dimension_count", key_length))
    if n_rot > key_length or n_rot % 2:
        raise RefimplError(f"{gf.path}: rope.dimension_count {n_rot} must be even and ≤ head dim {key_length}")

    sections = []  # NEOX RoPE (qwen3next) reads no sections
    if arch.rope == "imrope":  # get_key_or_arr(LLM_KV_ROPE_DIMENSION_SECTIONS, …, 4, true) in load_arch_hparams
        sections = gf.key(p + "rope.dimension_sections", required=True)
        if not isinstance(sections, list) or len(sections) != 4:
            raise RefimplError(f"{gf.path}: '{p}rope.dimension_sections' must be an array of exactly 4 integers, got {sections!r}")

    scaling = gf.key(p + "rope.scaling.type", "linear")
    factor = float(gf.key(p + "rope.scaling.factor", gf.key(p + "rope.scale_linear", 0.0)))
    if scaling not in ("none", "linear"):
        raise RefimplError(f"{gf.path}: rope.scaling.type '{scaling}' is not supported (only none/linear)")

    n_ff = _uniform(gf, p + "feed_forward_length", gf.key_or_arr(p + "feed_forward_length", n_layer_all, 0), "FFN width")
    if arch.ffn == "moe":
        n_expert, n_expert_used, n_ff_exp, n_ff_shexp = _moe_widths(gf, p, n_layer_all, n_ff)
    else:  # qwen35.cpp::load_arch_tensors: ffn_gate/ffn_up/ffn_down of width n_ff, no experts
        n_expert, n_expert_used, n_ff_exp, n_ff_shexp = 0, 0, 0, 0
        if n_ff <= 0:
            raise RefimplError(f"{gf.path}: missing required metadata key '{p}feed_forward_length' (the dense FFN width)")

    ssm = {k: int(req("ssm." + k)) for k in ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count")}
    if ssm["inner_size"] != ssm["time_step_rank"] * ssm["state_size"]:
        raise RefimplError(
            f"{gf.path}: ssm.inner_size {ssm['inner_size']} != ssm.time_step_rank {ssm['time_step_rank']} × ssm.state_size {ssm['state_size']}"
        )
    for k, v in ssm.items():
        if v <= 0:
            raise RefimplError(f"{gf.path}: '{p}ssm.{k}' must be positive, got {v}")
    if ssm["time_step_rank"] % ssm["group_count"]:
        raise RefimplError(f"{gf.path}: ssm.time_step_rank {ssm['time_step_rank']} is not a multiple of ssm.group_count {ssm['group_count']}")

    tokens = gf.key("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if tokens is not None else None
    if not gf.tensors:
        raise RefimplError(f"{gf.path}: a vocabulary-only GGUF (no tensors; convert_hf_to_gguf.py --vocab-only) has no model to run")
    if "token_embd.weight" not in gf.tensors:
        raise RefimplError(f"{gf.path}: missing tensor 'token_embd.weight'")
    embd_rows = gf.tensors["token_embd.weight"].shape[0]
    if n_vocab is None:
        n_vocab = embd_rows

    return Config(
        arch=arch,
        name=str(gf.key("general.name", gf.path.stem)),
        n_ctx_train=int(req("context_length")),
        n_embd=n_embd,
        n_vocab=n_vocab,
        n_layer_all=n_layer_all,
        n_layer_nextn=n_layer_nextn,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=key_length,
        n_rot=n_rot,
        rope_sections=tuple(int(s) for s in sections),
        rope_freq_base=float(gf.key(p + "rope.freq_base", 10000.0)),
        rope_freq_scale=1.0 if factor == 0.0 else 1.0 / factor,
        rms_eps=float(req("attention.layer_norm_rms_epsilon")),
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        n_ff=n_ff,
        n_ff_exp=n_ff_exp,
        n_ff_shexp=n_ff_shexp,
        ssm_d_conv=ssm["conv_kernel"],
        ssm_d_inner=ssm["inner_size"],
        ssm_d_state=ssm["state_size"],
        ssm_dt_rank=ssm["time_step_rank"],
        ssm_n_group=ssm["group_count"],
        is_recurrent=tuple(recurrent),
    )


def _moe_widths(gf: GGUFFile, p: str, n_layer_all: int, n_ff: int) -> tuple[int, int, int, int]:
    """(X, K, F, Fs) of a MoE arch (``load_hparams`` + ``load_arch_hparams`` + ``load_arch_tensors``:
    F = expert_feed_forward_length or n_ff / K; Fs = expert_shared_feed_forward_length or n_ff)."""
    n_expert = int(gf.key(p + "expert_count", 0))
    n_expert_used = _uniform(gf, p + "expert_used_count", gf.key_or_arr(p + "expert_used_count", n_layer_all, 0), "experts per token")
    if n_expert <= 0 or not 0 < n_expert_used <= n_expert:
        raise RefimplError(f"{gf.path}: expert_count {n_expert} / expert_used_count {n_expert_used} must satisfy 0 < used ≤ count")
    n_ff_exp_arr = gf.key_or_arr(p + "expert_feed_forward_length", n_layer_all, 0)
    n_ff_exp = _uniform(gf, p + "expert_feed_forward_length", n_ff_exp_arr, "expert width") or n_ff // n_expert_used
    n_ff_shexp = int(gf.key(p + "expert_shared_feed_forward_length", 0)) or n_ff
    if n_ff_exp <= 0 or n_ff_shexp <= 0:
        raise RefimplError(f"{gf.path}: missing required metadata key '{p}expert_feed_forward_length' (and no feed_forward_length fallback)")
    group_count = int(gf.key(p + "expert_group_count", 0))
    if group_count > 1:
        raise RefimplError(f"{gf.path}: group-limited expert routing (expert_group_count {group_count}) is not supported")
    return n_expert, n_expert_used, n_ff_exp, n_ff_shexp


def _recurrent_flags(gf: GGUFFile, p: str, n_layer_all: int, n_layer: int) -> list[bool]:
    """Which layers are Gated DeltaNet (``load_arch_hparams``, the same code in all three archs; docs/gguf.md §2).

    ``attention.recurrent_layers`` (bool array, length block_count) decides when present; otherwise
    layer i < n_layer is recurrent unless (i + 1) is a multiple of ``full_attention_interval``
    (default 4). The MTP block is always attention.
    """
    flags = gf.key_or_arr(p + "attention.recurrent_layers", n_layer_all)
    if flags is not None:
        out = [bool(f) for f in flags]
        if any(out[n_layer:]):
            raise RefimplError(f"{gf.path}: attention.recurrent_layers marks an MTP block (il ≥ {n_layer}) as recurrent")
        return out
    interval = int(gf.key(p + "full_attention_interval", 4))
    if interval <= 0:
        raise RefimplError(f"{gf.path}: full_attention_interval must be positive, got {interval}")
    return [(i < n_layer) and ((i + 1) % interval != 0) for i in range(n_layer_all)]
