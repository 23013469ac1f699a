"""Train the built-in model: ``python -m train.run --out build/train`` (docs/trained-model.md).

Steps: the corpus (train/corpus.py) → a 2,048-token BPE vocabulary (train/bpe.py) → token ids with
refimpl's own tokenizer (the ids llama.cpp gives) → ``steps`` AdamW steps on random SEQ_LEN-token windows,
each window decoded from position 0 with the zero state, as refimpl runs a prompt → held-out figures →
the GGUF files (train/export.py). Everything is seeded (``--seed``); torch runs on ``--threads`` CPU
threads (default 1). Writes into ``--out``: ``train.log`` (also printed), ``summary.json``,
``model.pt`` (the weights, also every ``--save-every`` steps) and the exported GGUFs.

Losses: trunk cross-entropy of token p+1 from row p; MTP cross-entropy of token p+1 from the head's
row p, fed token p and the trunk's h_nextn of p−1 (zeros at p = 0; the hidden is detached, so the
head's loss trains the head and the shared embedding / LM head only); a load-balancing term per MoE
layer. Held-out: the chapters train/corpus.py holds out, cut into SEQ_LEN windows, perplexity of the
trunk and of the MTP head next to a unigram model of the training tokens (add-one smoothed).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import time

import numpy as np
import torch
import torch.nn.functional as F

from refimpl.tokenizer import Tokenizer, split_qwen35
from train.bpe import build_trained_vocab
from train.config import MODEL, SEQ_LEN, TrainSettings
from train.corpus import documents
from train.model import TrainedModel


def tokenizer_of(vocab) -> Tokenizer:
    """refimpl's Tokenizer on the learned vocabulary, with the special ids the GGUF will carry."""
    eot = vocab.special_ids["<|endoftext|>"]
    special = {"tokenizer.ggml.bos_token_id": eot, "tokenizer.ggml.eos_token_id": vocab.eos_id, "tokenizer.ggml.padding_token_id": eot}
    return Tokenizer(vocab.tokens, vocab.token_types, vocab.merges, special_ids=special)


def encode(tok: Tokenizer, text: str) -> np.ndarray:
    """``tok.encode(text)``, one qwen35 word at a time with a cache (words never merge across)."""
    cache: dict[str, list[int]] = {}
    ids: list[int] = []
    for word in split_qwen35(text):
        if word not in cache:
            cache[word] = tok.encode(word)
        ids.extend(cache[word])
    return np.asarray(ids, dtype=np.int64)


def held_out_windows(tok: Tokenizer, n: int, length: int) -> list[list[int]]:
    """``n`` windows of ``length`` held-out tokens (train.corpus), spread evenly over the held-out text:
    the windows bench/trained.py and train/router.py measure on."""
    ids = encode(tok, documents()[1]).tolist()
    return [ids[i * len(ids) // n:][:length] for i in range(n)]


def balance_loss(routing, n_expert: int, n_used: int) -> torch.Tensor:
    """Σ over MoE layers of X · Σ_e f_e · P_e (f_e: share of the N·K picks, P_e: mean router p)."""
    total = 0.0
    for probs, sel in routing:
        f = torch.bincount(sel.reshape(-1), minlength=n_expert).to(probs.dtype) / sel.numel()
        total = total + n_expert * torch.sum(f * probs.mean(0))
    return total


def consistency_loss(routing, batch: int) -> torch.Tensor:
    """Σ over MoE layers of the mean over consecutive positions t, t+1 of one sequence of
    TV(p_t, p_t+1) = 1 − Σ_e min(p_t,e, p_t+1,e), the total-variation distance of their router softmaxes.

    Why total variation: it is the probability mass that moves to other experts from one token to the
    next, bounded by 1 and finite however peaked the router gets (a symmetric KL explodes when one
    distribution leaves an expert ~0 that the other uses); its gradient does not fade when the two are
    already far apart (as L2's does for flat 16-way distributions), and TV = 0 forces the same top-K."""
    total = 0.0
    for probs, _ in routing:
        p = probs.view(batch, -1, probs.shape[-1])  # [B, T, X]
        total = total + (1.0 - torch.minimum(p[:, :-1], p[:, 1:]).sum(-1)).mean()
    return total


def losses(model: TrainedModel, batch: torch.Tensor, s: TrainSettings):
    logits, _, mtp_logits, routing = model(batch[:, :-1])
    target = batch[:, 1:].reshape(-1)
    V = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, V), target)
    ce_mtp = F.cross_entropy(mtp_logits.reshape(-1, V), target)
    aux = balance_loss(routing, model.p.n_expert, model.p.n_expert_used)
    return ce, ce_mtp, aux, consistency_loss(routing, batch.shape[0])


@torch.no_grad()
def evaluate(model: TrainedModel, ids: np.ndarray, batch: int) -> tuple[float, float]:
    """Mean trunk and MTP cross-entropy (nats/token) over non-overlapping SEQ_LEN+1 windows of ids."""
    n = (len(ids) - 1) // SEQ_LEN
    windows = np.stack([ids[i * SEQ_LEN : i * SEQ_LEN + SEQ_LEN + 1] for i in range(n)])
    tot = tot_mtp = 0.0
    for i in range(0, n, batch):
        b = torch.from_numpy(windows[i : i + batch])
        logits, _, mtp_logits, _ = model(b[:, :-1])
        V = logits.shape[-1]
        tot += F.cross_entropy(logits.reshape(-1, V), b[:, 1:].reshape(-1), reduction="sum").item()
        tot_mtp += F.cross_entropy(mtp_logits.reshape(-1, V), b[:, 1:].reshape(-1), reduction="sum").item()
    count = n * SEQ_LEN
    return tot / count, tot_mtp / count


def unigram_ce(train_ids: np.ndarray, held_ids: np.ndarray, V: int) -> float:
    counts = np.bincount(train_ids, minlength=V).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    n = (len(held_ids) - 1) // SEQ_LEN * SEQ_LEN  # the same targets evaluate() scores
    return float(-logp[held_ids[1 : n + 1]].mean())


def lr_at(step: int, s: TrainSettings) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    t = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr_final + 0.5 * (s.lr - s.lr_final) * (1 + math.cos(math.pi * t))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m train.run", description=__doc__.splitlines()[0])
    d = TrainSettings()
    ap.add_argument("--out", default="build/train", help="output directory (default build/train)")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--threads", type=int, default=d.threads)
    ap.add_argument("--save-every", type=int, default=250)
    ap.add_argument("--consistency-weight", type=float, default=d.consistency_weight,
                    help=f"weight of the routing-consistency term (default {d.consistency_weight}, the committed recipe; 0 drops it)")
    args = ap.parse_args(argv)
    if args.steps < 25:  # the summary's final loss is the last logged window of 25 steps
        ap.error(f"--steps must be at least 25 (the loss is logged every 25 steps), got {args.steps}")
    s = TrainSettings(seed=args.seed, steps=args.steps, threads=args.threads, consistency_weight=args.consistency_weight)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "train.log", "w")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    rng = np.random.default_rng(s.seed)
    t0 = time.time()
    train_text, held_text = documents()
    vocab = build_trained_vocab(train_text, MODEL.n_vocab)
    tok = tokenizer_of(vocab)
    train_ids, held_ids = encode(tok, train_text), encode(tok, held_text)
    log(f"settings {json.dumps(s.as_json())}")
    log(f"corpus: train {len(train_text)} chars -> {len(train_ids)} tokens, held-out {len(held_text)} chars -> {len(held_ids)} tokens, "
        f"{len(train_text) / len(train_ids):.2f} chars/token ({time.time() - t0:.1f} s)")

    model = TrainedModel(MODEL, s.seed, SEQ_LEN)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters; {MODEL.description}")
    decay = [p for n, p in model.params.items() if p.ndim >= 2 and "conv1d" not in n]
    no_decay = [p for n, p in model.params.items() if not (p.ndim >= 2 and "conv1d" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=s.lr, betas=s.betas)
    tokens_per_step = s.batch * SEQ_LEN
    t_train = time.time()
    acc = np.zeros(4)
    for step in range(s.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s)
        starts = rng.integers(0, len(train_ids) - SEQ_LEN - 1, size=s.batch)
        batch = torch.from_numpy(np.stack([train_ids[i : i + SEQ_LEN + 1] for i in starts]))  # [B, SEQ_LEN+1]
        ce, ce_mtp, aux, tv = losses(model, batch, s)
        loss = ce + s.mtp_weight * ce_mtp + s.aux_weight * aux
        if s.consistency_weight:  # never added at 0: the graph and bytes of the recipe without it
            loss = loss + s.consistency_weight * tv
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        acc += [ce.item(), ce_mtp.item(), aux.item(), tv.item()]
        if (step + 1) % 25 == 0:
            el = time.time() - t_train
            a = acc / 25
            log(f"step {step + 1:5d}  loss {a[0]:.4f}  mtp {a[1]:.4f}  balance {a[2] / (MODEL.n_layer + 1):.3f}  "
                f"consistency {a[3] / (MODEL.n_layer + 1):.3f}  "
                f"lr {lr_at(step, s):.2e}  {tokens_per_step * (step + 1) / el:.0f} tok/s  {el / 60:.1f} min")
            acc[:] = 0
        if (step + 1) % args.save_every == 0 or step + 1 == s.steps:
            torch.save({"step": step + 1, "params": model.state_dict()}, out / "model.pt")

    ce, ce_mtp = evaluate(model, held_ids, 16)
    uni = unigram_ce(train_ids, held_ids, MODEL.n_vocab)
    summary = {
        "settings": s.as_json(), "parameters": n_params, "train_tokens": int(len(train_ids)), "held_out_tokens": int(len(held_ids)),
        "steps": s.steps, "tokens_seen": s.steps * tokens_per_step, "train_minutes": round((time.time() - t_train) / 60, 1),
        "final_train_loss": round(float(ce_last(log_file_path=out / "train.log")), 4),
        "held_out": {"trunk_ce": round(ce, 4), "trunk_ppl": round(math.exp(ce), 2), "mtp_ce": round(ce_mtp, 4),
                     "mtp_ppl": round(math.exp(ce_mtp), 2), "unigram_ce": round(uni, 4), "unigram_ppl": round(math.exp(uni), 2)},
    }
    log(f"held-out ({summary['held_out_tokens']} tokens): trunk perplexity {math.exp(ce):.2f} (CE {ce:.4f}), "
        f"MTP head {math.exp(ce_mtp):.2f} (CE {ce_mtp:.4f}), unigram baseline {math.exp(uni):.2f} (CE {uni:.4f})")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    from train.export import export_all  # after training: the GGUFs from the final weights

    for path in export_all(model, vocab, out):
        log(f"wrote {path}")
    log(f"done in {(time.time() - t0) / 60:.1f} min")
    return 0


def ce_last(log_file_path) -> float:
    """The trunk loss of the last logged window of 25 steps (the 'final loss' of the summary)."""
    lines = [ln for ln in pathlib.Path(log_file_path).read_text().splitlines() if ln.startswith("step ")]
    return float(lines[-1].split()[3])


if __name__ == "__main__":
    raise SystemExit(main())
