"""The three-oracle table of docs/numerics.md ("Transformers as a second oracle"), on golden/converted/.

    python tests/converted_table.py        # needs the oracle extra (llama-cpp-python); no torch

Per converted file: refimpl (plain, and emulated where llama.cpp rounds activations), llama.cpp
(F32 K/V, no flash attention: tests/llama_ref.py) and transformers (float32 and float64, recorded in
``<model>.ref.npz`` when the files were made), each pair as the worst position's max |Δ logit| /
max |logit|; the MTP head against llama.cpp's MTP context and the transformers-built MTP module; and
whether the 16-token greedy streams agree.
"""

from __future__ import annotations

import sys

import numpy as np

import test_converted as tc
from refimpl.decode.drafts import mtp_catchup_logits
from refimpl.decode.greedy import greedy
from refimpl.model.trunk import forward
from refimpl.model.ops import Ctx
from refimpl.model.state import SeqState


def row(name: str) -> str:
    ref = tc.reference(tc.model_of(name))
    T = len(ref["prompt_tokens"])
    prompt = ref["prompt_tokens"].tolist()
    model = tc.loaded(name)
    run = tc.llama(name)
    plain, h, _ = tc.own_run(name)
    rounds = "-f32" not in name  # llama.cpp rounds activations for BF16 and the block types
    ctx = Ctx(act_quant=rounds)
    emulated, he, _ = forward(model, SeqState.fresh(model.config), prompt, ctx) if rounds else (plain, h, None)
    mtp = mtp_catchup_logits(model, prompt, he, ctx)
    f = lambda a, b: f"{tc.rel(a, b).max():.1e}"
    same_weights = "logits_f64" in ref and ("-f32" in name or "-bf16" in name)  # the checkpoint's own values
    err = tc.rel(emulated, run.logits[:T])
    cells = [name, "emulated" if rounds else "plain",
             f(plain, ref["logits_f64"]) if same_weights else "—",
             f(ref["logits_f32"], ref["logits_f64"]) if same_weights else "—",
             f(run.logits[:T], ref["logits_f64"]) if same_weights else "—",
             f"{err.max():.1e} ({int((err <= 1e-5).sum())}/{T})", f(mtp, run.mtp_logits[:T])]
    ours = greedy(model, prompt, 16, ctx)
    verdict = "=" if ours == run.tokens[T:].tolist() else "≠"
    if same_weights:
        verdict += " / " + ("=" if greedy(model, prompt, 16) == ref["greedy"].tolist() else "≠")
    cells.append(verdict)
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    print("| file | refimpl | refimpl vs transformers f64 | transformers f32 vs f64 | llama.cpp vs transformers f64 "
          "| refimpl vs llama.cpp (positions ≤ 1e-5) | MTP head refimpl vs llama.cpp | greedy ×16 refimpl vs llama.cpp / vs transformers |")
    print("|---|---|---|---|---|---|---|---|")
    for name in tc.FILES:
        print(row(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
