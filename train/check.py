"""refimpl on an exported GGUF against the training framework: ``python -m train.check FILE.gguf``.

Reads every tensor of the file (dequantized for a quantized mix), puts them into ``train.model.TrainedModel``
(``ssm_a`` back to ``A_log = log(−ssm_a)``) in float64 with the token-by-token delta rule, and compares,
on held-out text, torch's trunk logits and MTP catch-up logits with refimpl's ``forward`` and
``drafts.mtp_catchup_logits`` on the file. With ``--weights model.pt`` it also checks that the file's
F32 tensors are the trained float32 values bit for bit (``ssm_a`` = −exp(A_log) rounded once).
Exit code 1 when a logit differs by more than ``--tol`` (default 1e-4) or a tensor differs.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from refimpl.decode.drafts import mtp_catchup_logits
from refimpl.model.trunk import forward, load_model
from refimpl.model.state import SeqState
from refimpl.tokenizer import Tokenizer
from train.config import MODEL, SEQ_LEN
from train.corpus import documents
from train.export import file_tensors
from train.model import A_LOG, TrainedModel, _key


def torch_model(tensors: dict[str, np.ndarray]) -> TrainedModel:
    model = TrainedModel(MODEL, 0, SEQ_LEN, chunked=False).double()
    with torch.no_grad():
        for name, value in tensors.items():
            if name.endswith("ssm_a"):
                name, value = name[: -len("ssm_a")] + A_LOG, np.log(-value.astype(np.float64))
            model.params[_key(name)].copy_(torch.from_numpy(np.asarray(value, dtype=np.float64)))
    return model


def compare_weights(tensors: dict[str, np.ndarray], weights_path) -> list[str]:
    trained = TrainedModel(MODEL, 0, SEQ_LEN)
    trained.load_state_dict(torch.load(weights_path)["params"])
    bad = []
    for name, value in trained.gguf_tensors().items():
        if not np.array_equal(tensors[name], value):
            bad.append(name)
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.check", description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("--weights", help="model.pt of the training run (then the file must hold its exact values)")
    ap.add_argument("--windows", type=int, default=3, help="held-out windows to compare (default 3)")
    ap.add_argument("--length", type=int, default=96, help="tokens per window (default 96)")
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    tensors = file_tensors(args.gguf)
    ok = True
    if args.weights:
        bad = compare_weights(tensors, args.weights)
        print(f"tensors equal to {args.weights}: {len(tensors) - len(bad)}/{len(tensors)}" + (f"; differ: {bad[:5]}" if bad else ""))
        ok &= not bad
    model = torch_model(tensors)
    ref = load_model(args.gguf, pack=False)
    tok = Tokenizer.from_gguf(args.gguf)
    ids = tok.encode(documents()[1])
    worst = worst_mtp = 0.0
    for i in range(args.windows):
        window = ids[i * 997 : i * 997 + args.length]  # spread over the held-out text
        with torch.no_grad():
            logits_t, _, mtp_t, _ = model(torch.tensor([window]))
        logits_r, h, _ = forward(ref, SeqState.fresh(ref.config), window)
        mtp_r = mtp_catchup_logits(ref, window, h)
        d, d_mtp = np.abs(logits_t[0].numpy() - logits_r).max(), np.abs(mtp_t[0].numpy() - mtp_r).max()
        scale = np.abs(logits_r).max()
        print(f"window {i}: {len(window)} tokens, max |logit| {scale:.2f}; max |torch − refimpl| trunk {d:.2e}, MTP {d_mtp:.2e}; "
              f"argmax equal {np.mean(logits_t[0].numpy().argmax(-1) == logits_r.argmax(-1)) * 100:.0f} %")
        worst, worst_mtp = max(worst, d), max(worst_mtp, d_mtp)
    ok &= worst <= args.tol and worst_mtp <= args.tol
    print(f"{'OK' if ok else 'FAIL'}: max |torch − refimpl| = {worst:.2e} (trunk), {worst_mtp:.2e} (MTP head); tolerance {args.tol:g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
