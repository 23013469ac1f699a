"""What the trained built-in model shows that the random ``tiny`` fixture cannot (docs/trained-model.md).

    python bench/trained.py            # all six parts, ~10 min on 2 cores; llama.cpp parts need the oracle extra,
                                       # the held-out figures the train extra

1. **continuations** — refimpl's greedy continuation of a few prompts (``-n 48``).
2. **mtp** — MTP acceptance at --draft 1 and --draft 3 over the prompts (``refimpl run --mtp --draft N``'s
   counters: accepted / drafted), next to llama.cpp's own draft-mtp loop on the same file
   (tests/llama_spec.py), which must draft and accept exactly the same tokens.
3. **near-ties** — the share of greedy steps whose top-2 logits are within the audit's 5 % band
   (margin ≤ 0.05 · max|logit|), trained model vs ``tiny`` f32 (same prompts, each model's tokenizer);
   and the trained model's share teacher-forced on held-out text (needs the train extra).
4. **streamer** — decode-phase hit rate of the expert cache at about a quarter of each model's routed-
   expert bytes (``--cache-mb``), trained model vs ``tiny`` q8_0. With routing independent of the text, an
   LRU cache holding a fraction f of the slices hits about f of the time; more than that is locality.
5. **routing locality** — where the streamer's hits come from. The same greedy runs' routing
   (``on_route``), and that of held-out text teacher-forced (4 windows × 256 tokens, replayed as if
   decoded token by token): per trunk layer, the share of a token's K experts chosen again by the next token
   (*reuse*) next to independent picks from the measured usage (*chance* = K · Σ_e f_e², K/X for uniform
   usage), and the usage entropy; then the streamer's LRU cache replayed on that routing
   (:class:`refimpl.io.streamer.SliceCache`, the streamer's walk) at a few budgets, next to the same replay
   on the routing with each layer's decode rows shuffled in time (keeps the usage skew, loses the order)
   and on uniform random top-K routing — the text-independent baseline on the model's own geometry.
6. **llama.cpp, run with its defaults, audited** (``--audit-only`` runs just this part, ~5 min) — over
   :data:`AUDIT_PROMPTS` × 64 tokens: llama.cpp's greedy stream on the q8_0 file with
   ``llama_context_default_params()`` (F16 K/V, flash attention auto), judged by ``refimpl audit`` without
   and with ``--emulate``; and its draft-mtp loop's draft-1 and draft-3 streams (same defaults, on the F32
   copy) audited as a pair. One line per prompt, then the counts.

``--model PATH`` measures another ``kjv``-style GGUF (default: the committed one); ``--no-audit`` skips part 6;
``--routing-only`` runs part 5 and the near-tie shares only (~2 min; for training experiments).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from refimpl.fixtures.builtin import TRAINED_PATH, fixture_path  # noqa: E402
from refimpl.decode.greedy import greedy  # noqa: E402
from refimpl.model.trunk import forward, load_model  # noqa: E402
from refimpl.decode.speculative import speculative_generate  # noqa: E402
from refimpl.model.state import SeqState  # noqa: E402
from refimpl.tokenizer import Tokenizer  # noqa: E402

PROMPTS = ["In the beginning", "And the LORD said unto Moses,", "The quick brown fox", "Blessed are the",
           "Then Jesus answered and said", "And it came to pass"]
N = 48
MIB = 1 << 20
AUDIT_PROMPTS = PROMPTS + [
    "And God said", "Now the serpent was", "Hear, O Israel:", "The LORD is my shepherd;", "For God so loved the world,",
    "And Moses went up", "Behold, I stand at the door", "And the king said", "Thus saith the LORD",
    "My son, hear the instruction", "Vanity of vanities,", "And David said", "I am the way", "And the woman said",
    "Let us make man", "And he went out"]
N_AUDIT = 64


def cpu() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip() + f", {os.cpu_count()} cores"
    return "unknown CPU"


def continuations(model, tok):
    print("## continuations (greedy, -n 48)")
    for p in PROMPTS:
        ids = tok.encode(p)
        print(f"{p!r} -> {tok.decode(greedy(model, ids, N, eog_ids=tok.eog_ids))!r}")


def mtp(model, tok, path):
    """llama.cpp runs on an F32 copy of the weights (train.export.dequantized_copy: refimpl's numbers on
    it are those of the q8_0 file bit for bit), because llama-cpp-python 0.3.36's draft-mtp loop dies
    with SIGILL on Q8_0 files."""
    print("\n## MTP acceptance (accepted / drafted), refimpl vs llama.cpp's draft-mtp loop (on an F32 copy)")
    path = f32_copy(path)
    try:
        from llama_spec import llama_speculative
    except ImportError:
        llama_speculative = None
    for n_draft in (1, 3):
        ours = [0, 0, 0, 0]  # drafted, accepted, decodes, generated
        theirs = [0, 0]
        same = True
        for p in PROMPTS:
            ids = tok.encode(p)
            tokens, st = speculative_generate(model, ids, N, source="mtp", n_draft=n_draft)
            ours = [a + b for a, b in zip(ours, (st.n_drafted, st.n_accepted, st.n_decodes, len(tokens)))]
            if llama_speculative is not None:
                try:
                    r = llama_speculative(path, ids, N, n_draft=n_draft)
                except Exception as exc:  # noqa: BLE001 - report and go on without llama.cpp
                    print(f"  llama.cpp: {str(exc).splitlines()[0]}")
                    llama_speculative = None
                    continue
                theirs = [theirs[0] + r.n_drafted, theirs[1] + r.n_accepted]
                same &= r.tokens == tokens and (r.n_drafted, r.n_accepted) == (st.n_drafted, st.n_accepted)
        line = (f"--draft {n_draft}: refimpl {ours[1]}/{ours[0]} = {100 * ours[1] / ours[0]:.1f}% accepted, "
                f"{ours[3] / ours[2]:.2f} tokens per trunk decode")
        if llama_speculative is not None:
            line += f"; llama.cpp {theirs[1]}/{theirs[0]} = {100 * theirs[1] / max(theirs[0], 1):.1f}% ({'identical' if same else 'DIFFERENT'})"
        print(line)


def f32_copy(path):
    """The weights dequantized into an F32 file: llama-cpp-python 0.3.36 dies with SIGILL on a Q8_0 batch
    of more than one row here (the draft-mtp loop's verify batches); refimpl's numbers are the q8_0 file's."""
    import tempfile

    from train.export import dequantized_copy

    return dequantized_copy(path, Path(tempfile.mkdtemp()) / "kjv-f32.gguf")


def audit_defaults(model, tok, path):
    from llama_ref import llama_greedy
    from llama_spec import llama_speculative

    from refimpl.oracle.audit import Stream, audit
    from refimpl.model.ops import emulation_ctx

    print(f"\n## llama.cpp with its defaults (F16 K/V, flash attention auto), audited; {len(AUDIT_PROMPTS)} prompts × {N_AUDIT}")
    f32 = f32_copy(path)
    counts: dict[str, int] = {}
    for p in AUDIT_PROMPTS:
        ids = tok.encode(p)
        greedy_stream = Stream("A", "llama.cpp greedy", "json", llama_greedy(path, ids, N_AUDIT, defaults=True)[len(ids):].tolist())
        d1, d3 = (Stream(label, f"llama.cpp --draft {n}", "json", llama_speculative(f32, ids, N_AUDIT, n_draft=n, defaults=True).tokens)
                  for label, n in (("A", 1), ("B", 3)))
        reps = {"greedy": audit(model, ids, greedy_stream), "greedy --emulate": audit(model, ids, greedy_stream, ctx=emulation_ctx("default")),
                "draft-1 vs draft-3": audit(model, ids, d1, d3)}
        parts = []
        for name, rep in reps.items():
            worst = max((100 * f.oracle.deficit(t) / f.oracle.max_abs for f in rep.events for t in f.tokens.values()), default=0.0)
            at = f" at step {rep.divergence.step}, largest deficit {worst:.3f}%" if rep.divergence is not None else ""
            parts.append(f"{name}: {rep.verdict}{at} → exit {rep.exit_code}")
            key = f"{name}: {rep.verdict}"
            counts[key] = counts.get(key, 0) + 1
        print(f"{p!r}: " + "; ".join(parts))
    for key, n in sorted(counts.items()):
        print(f"  {key}: {n} of {len(AUDIT_PROMPTS)}")


def near_ties(model, tok) -> tuple[float, int]:
    gaps = []
    for p in PROMPTS:
        ids = tok.encode(p)
        out = greedy(model, ids, N)
        logits, _, _ = forward(model, SeqState.fresh(model.config), ids + out[:-1])
        rows = logits[len(ids) - 1:]  # the rows that chose each generated token
        top2 = np.sort(rows, axis=-1)[:, -2:]
        gaps.extend((top2[:, 1] - top2[:, 0]) / np.abs(rows).max(axis=-1))
    return float(np.mean(np.asarray(gaps) <= 0.05)), len(gaps)


def held_out_near_ties(model, tok, windows: int = 8, length: int = 256) -> tuple[float, float, int]:
    """Teacher-forced on held-out text (train.corpus; needs the train extra): the near-tie share of the
    ``windows`` × ``length`` positions spread over it, and the share whose argmax is the next token."""
    from train.run import held_out_windows

    gaps, right = [], []
    for window in held_out_windows(tok, windows, length):
        logits, _, _ = forward(model, SeqState.fresh(model.config), window)  # [length, V]
        top2 = np.sort(logits, axis=-1)[:, -2:]
        gaps.extend((top2[:, 1] - top2[:, 0]) / np.abs(logits).max(axis=-1))
        right.extend(logits[:-1].argmax(-1) == np.asarray(window[1:]))
    return float(np.mean(np.asarray(gaps) <= 0.05)), float(np.mean(right)), len(gaps)


def hit_rate(path, tok, fraction: float = 0.25):
    probe = load_model(path, cache_mb=0, progress=False, pack=False)
    expert_bytes = probe.streamer.expert_bytes
    mb = max(1, round(fraction * expert_bytes / MIB))
    rates = []
    for p in PROMPTS:
        model = load_model(path, cache_mb=mb, progress=False, pack=False)
        greedy(model, tok.encode(p), N)
        rates.append(model.streamer.stats()["phases"]["decode"]["hit_rate"])
    return float(np.mean(rates)), mb, mb * MIB / expert_bytes, expert_bytes


def greedy_routes(path, tok, prompts=PROMPTS, n=N):
    """Per prompt: the streamer's routing records (:class:`refimpl.io.streamer.Routes`) of a greedy run, in
    the order the model computed them, and the streamer's slice sizes {(layer, kind): bytes}."""
    runs = []
    for p in prompts:
        recs = []
        model = load_model(path, cache_mb=1 << 14, on_route=recs.append, progress=False, pack=False)
        greedy(model, tok.encode(p), n)
        runs.append(recs)
    sizes = {(il, t.kind): t.slice_bytes for il, ts in model.streamer.tensors.items() for t in ts}
    return runs, sizes, model.streamer.expert_bytes


def replay(recs, sizes, budget: int) -> float:
    """Decode-phase hit rate of the streamer's LRU cache (``ExpertStreamer.read_union``'s walk: the batch's
    experts in first-use order, each of the layer's tensors) replayed on routing records."""
    from refimpl.io.streamer import SliceCache

    cache, hits, looked = SliceCache(budget), 0, 0
    kinds = {}
    for (il, kind) in sizes:
        kinds.setdefault(il, []).append(kind)
    for r in recs:
        for e in dict.fromkeys(int(e) for e in r.sel.reshape(-1)):
            for kind in kinds[r.layer]:
                key = (r.layer, kind, e)
                hit = cache.get(key) is not None
                if not hit:
                    cache.put(key, np.empty(sizes[r.layer, kind], dtype=np.uint8))
                if r.phase == "decode":
                    hits, looked = hits + hit, looked + 1
    return hits / looked


def shuffled(recs, rng, n_expert: int, uniform: bool):
    """The records with each layer's decode rows permuted in time (``uniform``: replaced by independent
    uniform top-K picks of the n_expert experts)."""
    import dataclasses

    out, by_layer = list(recs), {}
    for i, r in enumerate(recs):
        if r.phase == "decode":
            by_layer.setdefault(r.layer, []).append(i)
    for idx in by_layer.values():
        K = recs[idx[0]].sel.shape[1]
        sels = ([rng.choice(n_expert, K, replace=False)[None] for _ in idx] if uniform
                else [recs[j].sel for j in rng.permutation(idx)])
        for i, sel in zip(idx, sels):
            out[i] = dataclasses.replace(recs[i], sel=sel)
    return out


def held_out_routes(path, tok, windows: int = 4, length: int = 256):
    """Held-out text (train.corpus; needs the train extra) teacher-forced: ``windows`` windows of ``length``
    tokens spread over it, each one forward pass; its routing split into one record per token and layer,
    token-major — what decoding the window token by token walks (row 0 counted as the prompt)."""
    import dataclasses

    from refimpl.model.state import SeqState
    from train.run import held_out_windows

    runs = []
    for window in held_out_windows(tok, windows, length):
        recs = []
        model = load_model(path, cache_mb=1 << 14, on_route=recs.append, progress=False, pack=False)
        forward(model, SeqState.fresh(model.config), window)
        runs.append([dataclasses.replace(r, sel=r.sel[t:t + 1], weights=r.weights[t:t + 1], positions=r.positions[t:t + 1],
                                         phase="prompt" if t == 0 else "decode")
                     for t in range(len(window)) for r in recs])
    return runs


def routing(path, tok, c, fractions=(0.125, 0.25, 0.5), seeds: int = 20):
    """Part 5: reuse vs usage chance per layer, and the LRU replay (actual / time-shuffled / uniform) at
    budgets of ``fractions`` of the routed-expert bytes (the trunk's and the MTP block's, as ``--cache-mb``
    counts them; a greedy run reads only the trunk's); ``c``: the model's Config."""
    X, K = c.n_expert, c.n_expert_used
    greedy_runs, sizes, expert_bytes = greedy_routes(path, tok)
    try:
        held = held_out_routes(path, tok)
    except (ImportError, SystemExit) as exc:
        print(f"\n(held-out routing skipped: {exc})")
        held = None
    for what, runs in ((f"greedy runs of the {len(PROMPTS)} prompts × {N} tokens", greedy_runs),
                       ("held-out text teacher-forced, 4 windows × 256 tokens", held)):
        if runs is None:
            continue
        print(f"\n## routing locality: {what} (trunk layers)")
        for il in range(c.n_layer):
            same, pairs, counts = 0, 0, np.zeros(X)
            for recs in runs:
                rows = np.concatenate([r.sel for r in recs if r.layer == il])  # [tokens, K]
                counts += np.bincount(rows.reshape(-1), minlength=X)
                same += sum(len(set(a) & set(b)) for a, b in zip(rows[:-1].tolist(), rows[1:].tolist()))
                pairs += len(rows) - 1
            f = counts / counts.sum()
            reuse, chance = same / (K * pairs), K * float(np.sum(f ** 2))
            ent = -float(np.sum(f[f > 0] * np.log2(f[f > 0])))
            print(f"blk.{il}: reuse {100 * reuse:.1f}% vs usage chance {100 * chance:.1f}% ({reuse / chance:.2f}×; uniform {100 * K / X:.1f}%), "
                  f"usage entropy {ent:.2f} of {np.log2(X):.0f} bits, busiest expert {100 * f.max():.1f}% of picks")
        rng = np.random.default_rng(0)
        for frac in fractions:
            budget = int(frac * expert_bytes)
            actual = np.mean([replay(recs, sizes, budget) for recs in runs])
            shuf = np.mean([replay(shuffled(recs, rng, X, False), sizes, budget) for recs in runs for _ in range(seeds)])
            unif = np.mean([replay(shuffled(recs, rng, X, True), sizes, budget) for recs in runs for _ in range(seeds)])
            print(f"cache {budget / MIB:.2f} MiB ({100 * frac:.1f}% of {expert_bytes / MIB:.1f} MiB of experts): decode hit rate "
                  f"{100 * actual:.1f}%; decode rows shuffled in time {100 * shuf:.1f}%; uniform random routing {100 * unif:.1f}% "
                  f"({actual / unif:.2f}× uniform, {shuf / unif:.2f}× from usage skew alone)")


def main() -> int:
    print(f"# bench/trained.py — {cpu()}\n")
    argv = sys.argv[1:]
    path = Path(argv[argv.index("--model") + 1]) if "--model" in argv else TRAINED_PATH
    print(f"model: {path}\n")
    model, tok = load_model(path, pack=False), Tokenizer.from_gguf(path)
    if "--audit-only" in argv:
        audit_defaults(model, tok, path)
        return 0
    routing_only = "--routing-only" in argv
    if not routing_only:
        continuations(model, tok)
        mtp(model, tok, path)

    print("\n## near-tie share (greedy steps with top-2 margin ≤ 5 % of max|logit|)")
    tiny_path = fixture_path("tiny", "f32")
    tiny, tiny_tok = load_model(tiny_path, pack=False), Tokenizer.from_gguf(tiny_path)
    for name, m, t in (("trained", model, tok),) + (() if routing_only else (("tiny f32 (random)", tiny, tiny_tok),)):
        share, n = near_ties(m, t)
        print(f"{name}: {100 * share:.1f}% of {n} steps")
    try:
        share, top1, n = held_out_near_ties(model, tok)
        print(f"trained, held-out text teacher-forced: {100 * share:.1f}% of {n} positions (argmax = next token at {100 * top1:.1f}%)")
    except (ImportError, SystemExit) as exc:
        print(f"(held-out near-ties skipped: {exc})")
    if routing_only:
        routing(path, tok, model.config)
        return 0

    print("\n## expert cache hit rate, decode phase, cache ≈ 25 % of the routed-expert bytes")
    for name, p in (("trained (q8_0)", path), ("tiny q8_0 (random)", fixture_path("tiny", "q8_0"))):
        rate, mb, frac, eb = hit_rate(p, Tokenizer.from_gguf(p))
        print(f"{name}: --cache-mb {mb} = {100 * frac:.0f}% of {eb / MIB:.1f} MiB of experts: {100 * rate:.1f}% hits "
              f"(text-independent routing: ≈ {100 * min(frac, 1):.0f}%)")
    routing(path, tok, model.config)
    if "--no-audit" not in argv:
        audit_defaults(model, tok, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
