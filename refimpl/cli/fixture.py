"""``refimpl fixture OUT.gguf``: write a seeded synthetic GGUF (refimpl.fixtures, docs/fixtures.md)."""

from __future__ import annotations

from refimpl.errors import RefimplError
from refimpl.io.output_path import writing


def add_parser(sub) -> None:
    p = sub.add_parser("fixture", help="write a seeded synthetic GGUF (qwen35moe, qwen35 or qwen3next)")
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--arch", help="architecture: qwen35moe (default), qwen35 (dense FFN) or qwen3next")
    p.add_argument("--preset", default="tiny", help="fixture preset (tiny, predictable, …)")
    p.add_argument("--quant", default="f32", help="quant mix: f32, bf16, q8_0, q4_k_m, mxfp4; iq1_m, iq2_xxs, iq3_xxs, tq1_0, tq2_0 "
                   "(quantized by libggml: need llama-cpp-python)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", choices=("converter", "legacy"),
                   help="file layout: converter (default: as convert_hf_to_gguf.py / llama-quantize write it) or legacy "
                        "(the fixtures' older layout: 1-D ffn_gate_inp_shexp, no shared_head_norm, qwen3next ssm_in, …)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="variant option: mtp=full|stripped|extras, tied=true, fused_gate_up=true, fused_qkv=true, "
                        "recurrent_layers_key=false, ssm_in=true (qwen3next: the fused ssm_in instead of attn_qkv + attn_gate), "
                        "shexp_gate_1d=true, shared_head_norm=false")
    p.set_defaults(func=cmd_fixture)


def cmd_fixture(args) -> int:
    from refimpl.fixtures import write_fixture

    options = {}
    for item in args.option or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise RefimplError(f"--option expects KEY=VALUE, got '{item}'")
        options[key] = {"true": True, "false": False}.get(value.lower(), value)
    if args.arch is not None:
        options["arch"] = args.arch
    if args.layout is not None:
        options["layout"] = args.layout
    with writing(args.out, "OUT") as out:
        path = write_fixture(out, preset=args.preset, quant=args.quant, seed=args.seed, **options)
    print(path)
    return 0
