"""The router's softmax on held-out text: ``python -m train.router build/train`` (docs/trained-model.md).

Loads a training run's ``model.pt`` (and its ``kjv-q8_0.gguf`` for the tokenizer), runs the torch forward
pass on ``--windows`` held-out windows of SEQ_LEN tokens (spread over the held-out text as
bench/trained.py's routing part picks them) and prints, per MoE layer, the mean router entropy, the mean
top-1 / top-2 / top-3 probabilities and the mean total-variation distance between consecutive positions'
softmaxes (the quantity ``consistency_weight`` penalises). Tells a router that keeps its top-K from token to
token apart from one that went flat (TV is small between any two near-uniform softmaxes).
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np
import torch

from refimpl.tokenizer import Tokenizer
from train.config import MODEL, SEQ_LEN
from train.model import TrainedModel
from train.run import consistency_loss, held_out_windows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.router", description=__doc__.splitlines()[0])
    ap.add_argument("out", help="a train.run output directory (model.pt, kjv-q8_0.gguf)")
    ap.add_argument("--windows", type=int, default=4)
    args = ap.parse_args(argv)
    out = pathlib.Path(args.out)
    torch.set_num_threads(1)
    tok = Tokenizer.from_gguf(out / "kjv-q8_0.gguf")
    model = TrainedModel(MODEL, 0, SEQ_LEN)
    model.load_state_dict(torch.load(out / "model.pt")["params"])
    W = args.windows
    windows = np.asarray(held_out_windows(tok, W, SEQ_LEN))  # [W, SEQ_LEN]
    with torch.no_grad():
        _, _, _, routing = model(torch.from_numpy(windows))
    for il, (probs, _) in enumerate(routing):
        p = probs.view(W, SEQ_LEN, -1).double()  # [W, T, X]
        entropy = -(p * torch.log2(p.clamp_min(1e-30))).sum(-1).mean().item()
        top = torch.sort(p, -1, descending=True).values  # [W, T, X]
        tv = consistency_loss([(probs, None)], W).item()
        print(f"blk.{il}: router entropy {entropy:.2f} of {np.log2(p.shape[-1]):.0f} bits, mean top-1 / 2 / 3 probability "
              f"{top[..., 0].mean():.3f} / {top[..., 1].mean():.3f} / {top[..., 2].mean():.3f}, "
              f"TV of consecutive softmaxes {tv:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
