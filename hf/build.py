"""Build the converted test files the way real downloads are made, and transformers' reference outputs.

    pip install -e '.[hf,oracle]'          # a CPU torch, transformers, safetensors; llama-cpp-python
    python hf/build.py                      # writes golden/converted/ (GGUFs, reference .npz, MANIFEST.json)

For each of the three architectures refimpl runs, and for two widths:

1. a tiny **Hugging Face checkpoint in the real layout**, seeded: ``Qwen3_5MoeForConditionalGeneration``
   (with its vision tower), ``Qwen3_5ForConditionalGeneration``, ``Qwen3NextForCausalLM``; the real
   config fields (head_dim 256, partial_rotary_factor 0.25, interleaved mrope sections [11, 11, 10],
   full_attention_interval 4, more value heads than key heads); bf16 weights as published; sharded
   safetensors with an index; the ``mtp.*`` weights real checkpoints carry; a byte-level BPE tokenizer
   with added special tokens and a vocabulary padded by the config (the converter writes ``[PAD…]``);
2. converted by the vendored ``convert_hf_to_gguf.py`` (f32, bf16, q8_0; bf16 with experts and
   attention projections fused by ``--fuse-gate-up-exps --fuse-qkv``), then quantized by llama.cpp's own quantizer (``llama_model_quantize``,
   what ``llama-quantize`` runs: Q4_K_M, MXFP4_MOE, IQ4_XS) from the f32 conversion;
3. transformers' logits of a fixed prompt (float32 as users run it, and float64), its greedy
   continuation, and the logits of the MTP head (below), written to ``<model>.ref.npz``.

Widths: ``narrow`` (hidden 64: small float files, the transformers comparisons) and ``k`` (hidden
256, every matrix's row a multiple of 256, so llama-quantize really uses the K and IQ block types
instead of its fallbacks; two trunk layers, linear then full attention, as ``layer_types`` allows).

**The MTP module.** transformers drops ``mtp.*`` on load (``_keys_to_ignore_on_load_unexpected``), so
:class:`MTPHead` builds the block from transformers' own classes — the architecture's
``DecoderLayer`` (full attention + its FFN), ``RMSNorm`` and the model's rotary embedding — and wires
it as llama.cpp's nextn graph does (``src/models/qwen35moe.cpp: graph_mtp``; refimpl.model.mtp): row p is
token x_p with the trunk's final normed hidden state of position p−1 (zeros at p = 0),
``fc([RMSNorm_e(embed(x_p)) ‖ RMSNorm_h(h)])``, the decoder layer over its own causal context,
``norm``, the LM head. Its checkpoint weights are those of a trunk layer in the same on-disk format:
the script builds the model with one more full-attention layer and renames that layer ``mtp.layers.0``.

**One deviation from a real conversion.** The converter recognises a tokenizer by hashing its encoding
of a fixed text (``get_vocab_base_pre``); only the real 248k-token Qwen vocabularies (not downloadable
here) give the known hashes. The script runs the converter unchanged except that this one function
returns what it returns for the real files: ``qwen35`` for Qwen3.5, ``qwen2`` for Qwen3-Next. The
tokenizer's pre-tokenizer regex is the real one, so transformers' and llama.cpp's tokenization agree.

Everything is seeded; the output records sha256s, versions and the exact commands (MANIFEST.json).
CI needs none of this: the files are committed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "golden" / "converted"
SEED = 20261201
PROMPT = "In the beginning was the Word, and the Word was with God. 123 tokens: ünïcødé, ok?"
N_GREEDY = 16
VOCAB_SIZE = 512  # config vocab_size: the tokenizer has fewer; the converter pads with [PAD<id>] UNUSED tokens
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN2_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# llama.h LLAMA_FTYPE_MOSTLY_*
FTYPES = {"q4_k_m": 15, "iq4_xs": 30, "mxfp4_moe": 38}


@dataclass(frozen=True)
class Spec:
    """One checkpoint: an architecture at a width, and what is made from it."""

    arch: str  # GGUF architecture
    width: str  # "narrow" | "k"
    outtypes: tuple[str, ...]  # convert_hf_to_gguf.py --outtype, each a file
    fused: bool = False  # also convert with --fuse-gate-up-exps --fuse-qkv (bf16)
    quants: tuple[str, ...] = ()  # llama_model_quantize of the f32 conversion
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.width}"

    @property
    def hidden(self) -> int:
        return 64 if self.width == "narrow" else 256


SPECS = (
    Spec("qwen35moe", "narrow", ("f32", "bf16", "q8_0"), fused=True),
    Spec("qwen35", "narrow", ("f32", "q8_0")),
    Spec("qwen3next", "narrow", ("f32", "q8_0")),
    Spec("qwen35moe", "k", (), quants=("q4_k_m", "mxfp4_moe", "iq4_xs")),
    Spec("qwen35", "k", (), quants=("q4_k_m",)),
    Spec("qwen3next", "k", (), quants=("q4_k_m",)),
)


# ---- 1. the checkpoint ---------------------------------------------------------------------------


def text_config(spec: Spec, n_layers: int, layer_types: list[str], eos: int | None = None) -> dict:
    """The text model's config.json fields, real values where they shape the math."""
    E = spec.hidden
    narrow = spec.width == "narrow"
    cfg = dict(
        vocab_size=VOCAB_SIZE, hidden_size=E, num_hidden_layers=n_layers, layer_types=layer_types,
        num_attention_heads=2, num_key_value_heads=1, head_dim=256,
        linear_conv_kernel_dim=4, linear_num_key_heads=2, linear_num_value_heads=4,  # v-heads > k-heads
        linear_key_head_dim=32 if narrow else 64, linear_value_head_dim=32 if narrow else 64,
        rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=eos, pad_token_id=None,
    )
    rope = {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25}
    if spec.arch == "qwen3next":
        cfg |= dict(rope_parameters=rope, full_attention_interval=4, norm_topk_prob=True, decoder_sparse_step=1,
                    mlp_only_layers=[], hidden_act="silu")
    else:
        cfg["rope_parameters"] = rope | {"mrope_section": [11, 11, 10], "mrope_interleaved": True}
    if spec.arch == "qwen35":
        cfg["intermediate_size"] = 128 if narrow else 256
    else:
        cfg |= dict(num_experts=4 if narrow else 4, num_experts_per_tok=2,
                    moe_intermediate_size=64 if narrow else 256, shared_expert_intermediate_size=64 if narrow else 256)
    return cfg


def model_classes(arch: str):
    import transformers as T

    return {
        "qwen35moe": (T.Qwen3_5MoeConfig, T.Qwen3_5MoeForConditionalGeneration, T.Qwen3_5MoeTextConfig),
        "qwen35": (T.Qwen3_5Config, T.Qwen3_5ForConditionalGeneration, T.Qwen3_5TextConfig),
        "qwen3next": (T.Qwen3NextConfig, T.Qwen3NextForCausalLM, T.Qwen3NextConfig),
    }[arch]


def full_config(spec: Spec, tc: dict):
    """The checkpoint's config object (a vision tower for the two Qwen3.5 archs, as published)."""
    Config, _, _ = model_classes(spec.arch)
    if spec.arch == "qwen3next":
        return Config(**tc)
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=spec.hidden,
                  patch_size=16, spatial_merge_size=2, temporal_patch_size=2)
    return Config(text_config=tc, vision_config=vision, tie_word_embeddings=False)


def trunk_layer_types(spec: Spec) -> list[str]:
    if spec.width == "narrow":  # full_attention_interval 4: three linear layers, then full attention
        return ["linear_attention"] * 3 + ["full_attention"]
    return ["linear_attention", "full_attention"]


def randomize(model, seed: int) -> None:
    """Seeded weights with signal in every part: matrices N(0, 1/fan_in), norms around the converter's
    +1 (Qwen3.5's RMSNorm is x·(1 + w)), the gated norm around 1, A_log and dt_bias as trained models have."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1, 16, generator=g)))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif "norm" in name and p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] * (p.shape[-3] if p.ndim == 5 else 1)
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / fan_in ** 0.5))


def write_tokenizer(dirpath: Path, arch: str) -> dict[str, int]:
    """A byte-level BPE tokenizer (HF ``tokenizers``) trained on a fixed text: 256 byte tokens + merges,
    Qwen's pre-tokenizer regex, special tokens added as the Qwen tokenizers add them."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    regex = QWEN2_REGEX if arch == "qwen3next" else QWEN35_REGEX
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    corpus = [(ROOT / "README.md").read_text(), (ROOT / "docs" / "architecture.md").read_text(), PROMPT]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - 64, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens(SPECIAL)
    tok.save(str(dirpath / "tokenizer.json"))
    (dirpath / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 262144, "add_bos_token": False,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
    }, indent=1))
    return {t: tok.token_to_id(t) for t in SPECIAL}


def build_checkpoint(spec: Spec, ckpt: Path) -> None:
    """Save the checkpoint: trunk + mtp.* (one more full-attention layer, renamed), bf16, sharded."""
    import torch
    from safetensors.torch import load_file, save_file

    layers = trunk_layer_types(spec)
    n = len(layers)
    _, Model, _ = model_classes(spec.arch)
    torch.manual_seed(SEED)
    cfg = full_config(spec, text_config(spec, n + 1, layers + ["full_attention"]))
    model = Model(cfg)
    randomize(model, SEED + zlib.crc32(spec.name.encode()) % 1000)
    g = torch.Generator().manual_seed(SEED + 1)
    mtp_parts = {
        "mtp.fc.weight": torch.randn(spec.hidden, 2 * spec.hidden, generator=g) * (1.5 / (2 * spec.hidden) ** 0.5),
        "mtp.pre_fc_norm_embedding.weight": 0.1 * torch.randn(spec.hidden, generator=g),
        "mtp.pre_fc_norm_hidden.weight": 0.1 * torch.randn(spec.hidden, generator=g),
        "mtp.norm.weight": 0.1 * torch.randn(spec.hidden, generator=g),
    }
    with tempfile.TemporaryDirectory() as tmp:
        model.to(torch.bfloat16).save_pretrained(tmp)  # one shard
        state = {}
        for f in sorted(Path(tmp).glob("*.safetensors")):
            state |= load_file(f)
    prefix = "model.layers." if spec.arch == "qwen3next" else "model.language_model.layers."
    mtp_layer = f"{prefix}{n}."
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        out[("mtp.layers.0." + k[len(mtp_layer):]) if k.startswith(mtp_layer) else k] = v
    out |= {k: v.to(torch.bfloat16) for k, v in mtp_parts.items()}
    # sharded with an index, as published checkpoints are: trunk, then vision + mtp
    ckpt.mkdir(parents=True)
    shards = {"model-00001-of-00002.safetensors": {k: v for k, v in out.items() if not k.startswith(("mtp.", "model.visual."))},
              "model-00002-of-00002.safetensors": {k: v for k, v in out.items() if k.startswith(("mtp.", "model.visual."))}}
    weight_map = {}
    for fname, tensors in shards.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(ckpt / fname), metadata={"format": "pt"})
        weight_map |= {k: fname for k in tensors}
    total = sum(v.numel() * v.element_size() for v in out.values())
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    # the published config: n trunk layers, mtp_num_hidden_layers (Qwen3-Next's config has none)
    special = write_tokenizer(ckpt, spec.arch)
    final = full_config(spec, text_config(spec, n, layers, eos=special["<|im_end|>"])
                        | ({} if spec.arch == "qwen3next" else {"mtp_num_hidden_layers": 1}))
    final.dtype = "bfloat16"
    final.architectures = [Model.__name__]
    final.save_pretrained(ckpt)


# ---- 2. conversion and quantization ------------------------------------------------------------

CONVERT_RUNNER = """
import runpy, sys
llama = sys.argv[1]
pre = sys.argv[2]
sys.path.insert(0, llama)
sys.path.insert(1, llama + '/gguf-py')
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre  # see hf/build.py: the one deviation
sys.argv = [llama + '/convert_hf_to_gguf.py'] + sys.argv[3:]
runpy.run_path(llama + '/convert_hf_to_gguf.py', run_name='__main__')
"""


def llama_source(cache: Path) -> Path:
    """The vendored llama.cpp of the llama-cpp-python 0.3.36 sdist (pip download, unpacked once)."""
    tree = cache / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
    if not tree.is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "llama-cpp-python==0.3.36", "-d", str(cache)], check=True)
        shutil.unpack_archive(str(cache / "llama_cpp_python-0.3.36.tar.gz"), str(cache))
    return tree


def convert(llama: Path, ckpt: Path, out: Path, outtype: str, extra: list[str], pre: str) -> list[str]:
    args = [str(ckpt), "--outtype", outtype, "--outfile", str(out), *extra]
    proc = subprocess.run([sys.executable, "-c", CONVERT_RUNNER, str(llama), pre, *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"convert_hf_to_gguf.py failed on {ckpt.name} ({outtype}):\n" + "\n".join(proc.stderr.splitlines()[-20:]))
    return ["python", "convert_hf_to_gguf.py", ckpt.name, *args[1:3], "--outfile", out.name, *extra]


def quantize(src: Path, dst: Path, quant: str) -> list[str]:
    script = ("import sys, llama_cpp as L\n"
              "p = L.llama_model_quantize_default_params(); p.ftype = int(sys.argv[3]); p.nthread = 2\n"
              "sys.exit(L.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))\n")
    subprocess.run([sys.executable, "-c", script, str(src), str(dst), str(FTYPES[quant])], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return ["llama-quantize", src.name, dst.name, quant.upper()]


# ---- 3. transformers' reference outputs -----------------------------------------------------------


def fuse_experts(state: dict) -> dict:
    """On-disk per-expert ``mlp.experts.{e}.{gate,up,down}_proj.weight`` → the in-memory 3-D
    ``mlp.experts.gate_up_proj`` [X, 2F, E] (gate rows first) and ``down_proj`` [X, E, F] of
    transformers' ``…Experts`` modules (what ``from_pretrained``'s weight conversion does)."""
    import torch

    out = {k: v for k, v in state.items() if ".experts." not in k}
    n = len({k.split(".")[2] for k in state if k.startswith("mlp.experts.")})
    if n:
        get = lambda e, w: state[f"mlp.experts.{e}.{w}_proj.weight"]
        out["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([get(e, "gate"), get(e, "up")]) for e in range(n)])
        out["mlp.experts.down_proj"] = torch.stack([get(e, "down") for e in range(n)])
    return out


class MTPHead:
    """The checkpoint's ``mtp.*`` block, from transformers' own classes, wired as llama.cpp's nextn graph."""

    def __init__(self, spec: Spec, ckpt: Path, trunk, dtype):
        import torch
        from safetensors.torch import load_file

        mod = sys.modules[type(trunk).__module__]
        prefix = "Qwen3Next" if spec.arch == "qwen3next" else ("Qwen3_5Moe" if spec.arch == "qwen35moe" else "Qwen3_5")
        DecoderLayer, RMSNorm = getattr(mod, prefix + "DecoderLayer"), getattr(mod, prefix + "RMSNorm")
        layers = trunk_layer_types(spec)
        _, _, TextConfig = model_classes(spec.arch)
        tc = TextConfig(**text_config(spec, len(layers) + 1, layers + ["full_attention"]))
        tc._attn_implementation = "eager"
        tc._experts_implementation = "eager"
        state = {}
        for f in sorted(ckpt.glob("*.safetensors")):
            state |= {k: v for k, v in load_file(f).items() if k.startswith("mtp.")}
        E, eps = spec.hidden, tc.rms_norm_eps
        self.layer = DecoderLayer(tc, len(layers))
        self.layer.load_state_dict(fuse_experts({k[len("mtp.layers.0."):]: v for k, v in state.items()
                                                 if k.startswith("mtp.layers.0.")}))
        self.fc = torch.nn.Linear(2 * E, E, bias=False)
        self.fc.weight.data = state["mtp.fc.weight"]
        self.enorm, self.hnorm, self.norm = (RMSNorm(E, eps=eps) for _ in range(3))
        self.enorm.weight.data = state["mtp.pre_fc_norm_embedding.weight"]
        self.hnorm.weight.data = state["mtp.pre_fc_norm_hidden.weight"]
        self.norm.weight.data = state["mtp.norm.weight"]
        for m in (self.layer, self.fc, self.enorm, self.hnorm, self.norm):
            m.to(dtype)
        self.trunk = trunk

    def logits(self, tokens, h_nextn):
        """Row p: token x_p with h_nextn of p−1 (zeros at p = 0) → logits predicting x_{p+2}'s
        neighbour as llama.cpp's draft-mtp pairs them (the same token as trunk row p, x_{p+1})."""
        import torch

        lm = self.trunk.get_decoder() if hasattr(self.trunk, "get_decoder") else self.trunk.model
        T = len(tokens)
        ids = torch.tensor([tokens])
        e = lm.embed_tokens(ids)  # [1, T, E]
        h = torch.cat([torch.zeros_like(h_nextn[:, :1]), h_nextn[:, :-1]], dim=1)  # h of p−1
        z = self.fc(torch.cat([self.enorm(e), self.hnorm(h)], dim=-1))  # [1, T, E]
        pos = torch.arange(T).view(1, -1)
        pos_ids = pos if not hasattr(lm.rotary_emb, "mrope_section") else pos.view(1, 1, -1).expand(3, 1, -1)
        cos_sin = lm.rotary_emb(z, pos_ids)
        mask = torch.full((T, T), float("-inf"), dtype=z.dtype).triu(1).view(1, 1, T, T)
        out = self.layer(z, position_embeddings=cos_sin, attention_mask=mask, position_ids=pos)
        out = out[0] if isinstance(out, tuple) else out
        return self.trunk.lm_head(self.norm(out))  # [1, T, V]


def reference(spec: Spec, ckpt: Path, tokens: list[int], dtype_name: str) -> dict:
    import torch

    dtype = {"f32": torch.float32, "f64": torch.float64}[dtype_name]
    _, Model, _ = model_classes(spec.arch)
    model = Model.from_pretrained(ckpt, dtype=dtype, attn_implementation="eager", experts_implementation="eager").eval()
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        h_nextn = out.hidden_states[-1]  # the final norm's output: llama.cpp's result_norm / h_nextn
        mtp = MTPHead(spec, ckpt, model, dtype).logits(tokens, h_nextn)
        keep = np.float32 if dtype_name == "f32" else np.float64
        res = {f"logits_{dtype_name}": out.logits[0].numpy().astype(keep), f"mtp_logits_{dtype_name}": mtp[0].numpy().astype(keep)}
        if dtype_name == "f32":
            gen = model.generate(ids, max_new_tokens=N_GREEDY, do_sample=False, min_new_tokens=N_GREEDY)
            res["greedy"] = gen[0, len(tokens):].numpy().astype(np.int32)
    return res


# ---- the whole build ---------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(spec: Spec, out: Path, llama: Path, work: Path) -> dict:
    from transformers import AutoTokenizer

    ckpt = work / f"{spec.name}-hf"
    if ckpt.exists():
        shutil.rmtree(ckpt)
    build_checkpoint(spec, ckpt)
    pre = "qwen2" if spec.arch == "qwen3next" else "qwen35"
    files, commands = {}, []
    f32 = (out if "f32" in spec.outtypes else work) / f"{spec.name}-f32.gguf"  # what llama-quantize reads
    if "f32" not in spec.outtypes:
        commands.append(convert(llama, ckpt, f32, "f32", [], pre))
    for outtype in spec.outtypes:
        dst = out / f"{spec.name}-{outtype}.gguf"
        commands.append(convert(llama, ckpt, dst, outtype, [], pre))
        files[dst.name] = sha256(dst)
    if spec.fused:
        dst = out / f"{spec.name}-bf16-fused.gguf"
        commands.append(convert(llama, ckpt, dst, "bf16", ["--fuse-gate-up-exps", "--fuse-qkv"], pre))
        files[dst.name] = sha256(dst)
    for quant in spec.quants:
        dst = out / f"{spec.name}-{quant}.gguf"
        commands.append(quantize(f32, dst, quant))
        files[dst.name] = sha256(dst)
    tok = AutoTokenizer.from_pretrained(ckpt)
    tokens = tok.encode(PROMPT, add_special_tokens=False)
    ref = {"prompt_tokens": np.asarray(tokens, dtype=np.int32)}
    if spec.width == "narrow":
        ref |= reference(spec, ckpt, tokens, "f32") | reference(spec, ckpt, tokens, "f64")
    npz = out / f"{spec.name}.ref.npz"
    np.savez_compressed(npz, **ref)
    files[npz.name] = sha256(npz)
    return {"files": files, "commands": [" ".join(c) for c in commands], "prompt": PROMPT}


def main(argv=None) -> int:
    import tokenizers
    import torch
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "refimpl" / "sdist")
    ap.add_argument("--only", help="build just this spec (e.g. qwen35moe-narrow)")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    llama = llama_source(args.cache)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": {}}
    import llama_cpp

    manifest["made_with"] = {"transformers": transformers.__version__, "torch": torch.__version__,
                             "tokenizers": tokenizers.__version__, "llama-cpp-python": llama_cpp.__version__,
                             "seed": SEED, "command": "python hf/build.py"}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in SPECS:
            if args.only and spec.name != args.only:
                continue
            print(f"building {spec.name}", file=sys.stderr)
            manifest["models"][spec.name] = build(spec, args.out, llama, Path(tmp))
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
