"""``refimpl inspect MODEL``: what a GGUF holds, as refimpl (and llama.cpp) will read it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from refimpl.cli.common import MODEL_HELP, default_model

if TYPE_CHECKING:
    from refimpl.io.load import ModelFile


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="print a GGUF's config, layer kinds and tensor bytes per type")
    p.add_argument("model", nargs="?", help=MODEL_HELP)
    p.set_defaults(func=cmd_inspect)


def cmd_inspect(args) -> int:
    from refimpl.fixtures.builtin import resolve_model
    from refimpl.io.load import open_model

    print(describe(open_model(resolve_model(default_model(args.model)))))
    return 0


def describe(m: ModelFile) -> str:
    c, p, gf = m.config, m.plan, m.gguf
    kinds = [c.layer_kind(il) for il in range(c.n_layer_all)]
    n_deltanet, n_attn = kinds.count("deltanet"), kinds.count("attention")
    if p.mtp == "present":
        mtp = f"present (blk.{c.n_layer}.nextn.*; extras: {', '.join(sorted(p.mtp_extras)) or 'none'})"
    else:
        mtp = "stripped (no nextn block declared; converted without MTP)"
    rope = f"IMRoPE sections {list(c.rope_sections)}" if c.arch.rope == "imrope" else "NEOX"
    lines = [
        f"file          {gf.path} ({gf.file_size:,} bytes)",
        f"model         {c.name} (arch {c.arch.name})",
        f"layers        {c.n_layer} trunk ({n_deltanet} deltanet + {n_attn} attention) + {c.n_layer_nextn} MTP (block_count {c.n_layer_all})",
        "layer kinds   " + " ".join({"deltanet": "D", "attention": "A", "mtp": "M"}[k] for k in kinds)
        + "   (D = Gated DeltaNet, A = gated attention, M = MTP block)",
        f"embedding     E={c.n_embd}  vocab V={c.n_vocab}  context {c.n_ctx_train}  rms eps {c.rms_eps:g}",
        f"attention     H={c.n_head}  Hkv={c.n_head_kv}  D={c.head_dim}  rope R={c.n_rot} {rope} base {c.rope_freq_base:g} scale {c.rope_freq_scale:g}",
        f"deltanet      Hk={c.ssm_n_group}  Hv={c.ssm_dt_rank}  S={c.ssm_d_state}  Din={c.ssm_d_inner}  conv C={c.conv_channels} Kc={c.ssm_d_conv}; "
        + _deltanet_layout(m),
        _ffn_line(m),
        f"lm head       {'tied to token_embd.weight' if p.tied else 'output.weight'}",
        f"mtp           {mtp}",
        f"tensors       {len(gf.tensors)}",
    ]
    for name, (n, b) in gf.bytes_by_qtype().items():
        lines.append(f"  {name:<8} {n:>5} tensors {b:>16,} bytes")
    return "\n".join(lines)


def _deltanet_layout(m: ModelFile) -> str:
    """How the delta-net input projections are stored and which key head a value head reads."""
    c, p = m.config, m.plan
    qkvz = "ssm_in (fused q,k,v,z per key head)" if any(p.ssm_in) else "attn_qkv + attn_gate"
    ba = "ssm_ba (fused b,a per key head)" if c.arch.gdn_ba == "fused" else "ssm_beta + ssm_alpha"
    heads = "value head j reads key head j mod Hk" if c.arch.gdn_heads == "tiled" else "value head j reads key head j // (Hv/Hk)"
    return f"{qkvz}, {ba}; {heads}"


def _ffn_line(m: ModelFile) -> str:
    c, p = m.config, m.plan
    if not c.is_moe:
        return f"ffn           dense SwiGLU, width {c.n_ff} (no experts)"
    return (f"moe           X={c.n_expert} experts, top K={c.n_expert_used}, F={c.n_ff_exp}; shared expert Fs={c.n_ff_shexp}"
            + ("; fused gate_up" if any(p.fused_gate_up) else ""))
