"""The full-size model in 24 GiB: refimpl decoding a 40-layer Qwen3.6-35B-A3B-shaped GGUF (~20 GB).

    python bench/full.py                          # build the fixture once (~4 min, 21.7 GB), then measure
    python bench/full.py --dir /big/disk --n 32 --cache-mb 4096
    python bench/full.py --cache-mb auto          # the streamer's own budget: half of MemAvailable at load
    python bench/full.py --model FILE.gguf        # any qwen35moe GGUF instead of the fixture
    python bench/full.py --delete                 # remove the fixture afterwards (disk short)
    python bench/full.py --emulate=ggml --llama   # the bit-exact path, and llama.cpp beside it

The model is the ``full`` preset (refimpl.fixtures.presets.LARGE_PRESETS: the real widths, 40 trunk
layers + the MTP block, block_count 41) in ``q4_k_m``, written by refimpl.fixtures.large from
reference-quantized blocks without ever holding float32 weights; it is cached as
``$REFIMPL_CACHE/full-q4_k_m-s0-pool.gguf`` (or in ``--dir``). Free disk space is checked first.

Two configurations, each in a fresh child process (so its peak RSS is its own; this parent stays
small — Linux carries a parent's peak into a forked child's ru_maxrss), both with routed experts
streamed through an LRU cache of ``--cache-mb`` MiB (refimpl.io.streamer) and dense weights pinned
(``--pack auto|on|off``, load_model's pack; auto packs them for the lane kernels when the copy fits in RAM):

* plain greedy decoding of ``--n`` tokens after a ``--prompt-len``-token prompt;
* MTP speculation, ``--mtp --draft 3`` (refimpl.decode.speculative.speculative_generate);
* ``refimpl audit`` of an ``--audit-len``-token stream after an ``--audit-len``-token prompt (default 256 + 256;
  0 skips it): refimpl.oracle.audit.audit, the oracle teacher-forced over prompt + stream with every stream
  position's logits, as ``refimpl audit MODEL STREAM --prompt-tokens …`` runs it. The stream is random ids
  (seeded): the audit's work does not depend on the tokens, and it judges every position whatever its verdict.

``--emulate=ggml`` runs the same three in the bit-exact path (``refimpl run --emulate=ggml``: every op as the
libggml-cpu llama-cpp-python loads computes it, with llama.cpp's defaults: F16 K/V, flash attention, its CPU_REPACK),
the model loaded as that command loads it (the dense weights in the column layout when that fits; with ``--cache-mb
auto`` at a budget of 0 — the full fixture in 24 GiB — the routed experts memory-mapped, not streamed: refimpl.model.load), and the audit as
``refimpl audit MODEL A B --emulate=ggml --draft 3`` runs it (experts memory-mapped: that command streams none): a
stream pair (A random ids, B the same with its middle
token changed: a divergence, so both tails are walked), then llama.cpp's own draft-3 stream predicted
(refimpl.oracle.reproduce; one prediction serves both streams). ``--llama`` adds llama.cpp's own decode of the same
prompt on the same file (llama-cpp-python, its defaults, repack on; bench/_llama.py), in a child of its own after
the others (two processes mapping 20 GB at once would evict each other's pages).

Reported per configuration: generation tok/s (tokens after the first, over the time from the first
to the last, so the prompt pass is excluded), MiB read from the file per generated token and the
hit rate of the expert cache over generation (prompt pass excluded; from the streamer's phase
counters), peak RSS (ru_maxrss, VmHWM cross-check), the cache's peak, and for MTP the accepted
drafts. The two runs must produce the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import GIB, MIB, peak_rss, random_prompt, run_child, vm_hwm  # noqa: E402


def _load(args, cache_mb):
    """(the model as ``args`` ask for it — ``cache_mb`` (None: experts pinned, memory-mapped), ``--pack``,
    ``--threads``, ``--emulate`` —, its numerics, seconds to load)."""
    import numba

    from refimpl.io.malloc import reuse_freed_memory
    from refimpl.model.load import PACK_FLAGS, load_model

    numba.set_num_threads(args.threads)
    reuse_freed_memory()  # as the refimpl command does (refimpl.io.malloc)
    ctx = _ctx(args)
    t0 = time.perf_counter()
    model = load_model(args.model, cache_mb, progress=False, pack=PACK_FLAGS[args.pack],
                       ggml=(ctx.ggml, ctx.repack) if ctx.ggml else None)
    return model, ctx, time.perf_counter() - t0


def _ctx(args):
    """The numerics of the run: the definition, or with ``--emulate=ggml`` llama.cpp's defaults bit for bit."""
    from refimpl.model.ops import Ctx, emulation_ctx

    return emulation_ctx("ggml", n_threads=args.threads) if args.emulate == "ggml" else Ctx()


def _child(args) -> None:
    """Load, generate, print one JSON line."""
    from refimpl.decode.speculative import speculative_generate

    from refimpl.io.streamer import dense_tensors

    model, ctx, load_s = _load(args, args.cache_mb)
    s = model.streamer  # None: --emulate=ggml mapped the experts (auto's budget 0)
    prompt = random_prompt(args.prompt_len)
    stamps = []
    t0 = time.perf_counter()
    out, st = speculative_generate(model, prompt, args.n, ctx, source="mtp" if args.mtp else None, n_draft=3,
                                   on_token=lambda _: stamps.append(time.perf_counter()),
                                   bytes_read=s.bytes_read if s else None, counters=s.counters.columns if s else None)
    total_s = time.perf_counter() - t0
    if s is not None:
        stats = s.stats(len(out))
        gen = [c for name, c in stats["phases"].items() if name != "prompt"]
        hits, misses = sum(c["hits"] for c in gen), sum(c["misses"] for c in gen)
    else:
        dense = sum(dense_tensors(model.file.gguf).values())
        stats = {"bytes_per_token": None, "cache_peak_bytes": 0, "dense_bytes": dense,
                 "expert_bytes": sum(t.n_bytes for t in model.file.gguf.tensors.values()) - dense}
        hits = misses = 0
    print(json.dumps({
        "tokens": out, "load_s": load_s, "total_s": total_s, "prompt_and_first_s": stamps[0] - t0,
        "tok_s": (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0,
        "bytes_per_token": stats["bytes_per_token"], "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
        "peak_rss": peak_rss(), "vm_hwm": vm_hwm(),
        "cache_peak": stats["cache_peak_bytes"], "dense_bytes": stats["dense_bytes"], "expert_bytes": stats["expert_bytes"],
        "packed_bytes": model.packed_bytes, "n_decodes": st.n_decodes, "accepted": st.n_accepted, "drafted": st.n_drafted,
    }))


def _audit_child(args) -> None:
    """Load, audit a random stream after a random prompt (``--audit-len`` each), print one JSON line."""
    import numpy as np

    from refimpl.oracle.audit import Stream, audit
    from refimpl.oracle.reproduce import parse_schedules, reproduce

    # plain: streamed (--cache-mb), as before; --emulate=ggml: as `refimpl audit MODEL A B` loads it (no --cache-mb
    # there): experts memory-mapped
    model, ctx, load_s = _load(args, None if args.emulate == "ggml" else args.cache_mb)
    prompt = random_prompt(args.audit_len)
    stream = [int(t) for t in np.random.default_rng(2).integers(0, 390, size=args.audit_len)]
    streams = [Stream("A", "random ids", "json", stream)]
    if ctx.ggml:  # audit A B --draft 3: B differs from A in its middle token
        b = list(stream)
        b[len(b) // 2] = (b[len(b) // 2] + 1) % 390
        streams.append(Stream("B", "A with its middle token changed", "json", b))
    read = model.streamer.bytes_read if model.streamer is not None else (lambda: 0)
    read0 = read()
    t0 = time.perf_counter()
    report = audit(model, prompt, *streams, ctx=ctx)
    audit_s = time.perf_counter() - t0
    if ctx.ggml:  # llama.cpp's own draft-3 stream, as `refimpl audit … --emulate=ggml --draft 3` predicts it
        reproduce(report, model, ctx, parse_schedules("3", len(streams)))
    print(json.dumps({"audit_s": time.perf_counter() - t0, "walk_s": audit_s, "load_s": load_s, "verdict": report.verdict,
                      "streams": len(streams), "bytes_read": read() - read0,
                      "peak_rss": peak_rss(), "vm_hwm": vm_hwm()}))


def _llama_child(args) -> None:
    """llama.cpp's greedy decode of the same prompt (its defaults: F16 K/V, flash attention, repack on), one JSON line."""
    from bench._llama import LlamaDecoder

    prompt = random_prompt(args.prompt_len)
    with LlamaDecoder(args.model, args.threads) as llama:
        llama.run(prompt, 2, "defaults")  # warm
        r = llama.run(prompt, args.n, "defaults")
    print(json.dumps({"tok_s": r["tok_s"], "tokens": r["tokens"]}))


def _run_child(args, mode: str) -> dict:
    argv = ["--model", str(args.model), "--cache-mb", str(args.cache_mb), "--n", str(args.n), "--audit-len", str(args.audit_len),
            "--prompt-len", str(args.prompt_len), "--threads", str(args.threads), "--emulate", args.emulate]
    return run_child(__file__, argv + ([f"--{mode}"] if mode != "plain" else []) + ["--pack", args.pack], mode)


def build(args) -> Path:
    """The fixture path, written first if missing (after checking the disk has room)."""
    from refimpl.fixtures.builtin import cache_dir
    from refimpl.fixtures.large import expected_size

    directory = Path(args.dir) if args.dir else cache_dir()
    path = directory / "full-q4_k_m-s0-pool.gguf"
    if path.is_file():
        return path
    need = expected_size("full", "q4_k_m")
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    print(f"# the full fixture needs {need / GIB:.1f} GiB; {free / GIB:.1f} GiB free in {directory}", flush=True)
    if free < need + 2 * GIB:
        raise SystemExit(f"not enough disk in {directory}: pass --dir with ≥ {need / GIB + 2:.0f} GiB free")
    # written in a child, so this process's peak RSS stays small for the children it forks
    subprocess.run([sys.executable, "-c", "import sys; from refimpl.fixtures.large import large_fixture; "
                    "large_fixture('full', 'q4_k_m', directory=sys.argv[1])", str(directory)], check=True)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF to use instead of the full fixture")
    ap.add_argument("--dir", help="where the full fixture lives / is written (default $REFIMPL_CACHE)")
    ap.add_argument("--cache-mb", default="4096", help="expert cache budget in MiB, or auto (default 4096)")
    ap.add_argument("--audit-len", type=int, default=256, help="prompt and stream length of the timed audit (0 skips it)")
    ap.add_argument("--n", type=int, default=32, help="tokens to generate")
    ap.add_argument("--prompt-len", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pack", choices=("auto", "on", "off"), default="auto",
                    help="load_model's pack (default auto: the dense matrices packed when they fit in RAM)")
    ap.add_argument("--emulate", choices=("off", "ggml"), default="off",
                    help="ggml: every run in the bit-exact path, with llama.cpp's defaults (refimpl run --emulate=ggml)")
    ap.add_argument("--llama", action="store_true", help="also llama.cpp's decode of the same prompt (llama-cpp-python)")
    ap.add_argument("--delete", action="store_true", help="delete the fixture when done")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mtp", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--audit", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--llama-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from refimpl.errors import RefimplError
    from refimpl.io.streamer import cache_budget

    try:
        cache_budget(args.cache_mb)
    except RefimplError as e:
        ap.error(str(e))
    if args.audit_len < 0:
        ap.error(f"--audit-len must be ≥ 0, got {args.audit_len}")
    if args.child:
        _audit_child(args) if args.audit else _llama_child(args) if args.llama_child else _child(args)
        return 0

    fixture = not args.model
    args.model = Path(args.model) if args.model else build(args)
    size = args.model.stat().st_size
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    print(f"# {args.model.name}: {size / GIB:.1f} GiB file, {mem / GIB:.1f} GiB RAM, --cache-mb {args.cache_mb}, "
          f"{args.threads} threads, prompt {args.prompt_len} + {args.n} generated tokens"
          f", --pack {args.pack}; load average {os.getloadavg()[0]:.2f}", flush=True)
    rows = {}
    pre = "ggml " if args.emulate == "ggml" else ""
    for label, mode in ((pre + "plain", "plain"), (pre + "--mtp --draft 3", "mtp")):
        r = rows[label] = _run_child(args, mode)
        print(f"  {label}: done in {r['total_s']:.0f} s (load {r['load_s']:.0f} s)", file=sys.stderr, flush=True)
    audited = _run_child(args, "audit") if args.audit_len else None
    llama = _run_child(args, "llama-child") if args.llama else None
    print()
    hdr = (f"{'run':<21} {'tok/s':>6} {'MiB/token':>9} {'hit rate':>8} {'peak RSS MiB':>12} {'(VmHWM)':>8} "
           f"{'cache peak MiB':>14} {'dense MiB':>9} {'packed MiB':>10} {'decodes':>7} {'accepted':>9}")
    print(hdr)
    print("-" * len(hdr))
    for label, r in rows.items():
        acc = f"{r['accepted']}/{r['drafted']}" if r["drafted"] else "—"
        read = f"{r['bytes_per_token'] / MIB:9.1f}" if r["bytes_per_token"] is not None else f"{'mapped':>9}"
        print(f"{label:<21} {r['tok_s']:6.2f} {read} {100 * r['hit_rate']:7.1f}% "
              f"{r['peak_rss'] / MIB:12.0f} {(r['vm_hwm'] or 0) / MIB:8.0f} {r['cache_peak'] / MIB:14.0f} "
              f"{r['dense_bytes'] / MIB:9.0f} {r['packed_bytes'] / MIB:10.0f} {r['n_decodes']:7d} {acc:>9}")
    plain = rows[pre + "plain"]
    same = plain["tokens"] == rows[pre + "--mtp --draft 3"]["tokens"]
    if llama:
        ratio = plain["tok_s"] / llama["tok_s"]
        print(f"{'llama.cpp':<21} {llama['tok_s']:6.2f}   (its defaults: F16 K/V, flash attention, repack on; the prompt one "
              f"token per llama_decode, where refimpl's is one batch) — {pre}plain / llama.cpp = {ratio:.2f}; same tokens: "
              f"{'yes' if llama['tokens'] == plain['tokens'] else 'no'}")
    # --emulate=ggml computes llama.cpp's bits for each batch shape: a draft-3 verify batch may flip a near-tie as
    # llama.cpp's own does (the random fixture's logits are all near-ties), so there the streams need not agree
    flip = " (llama.cpp's batch shapes: not a failure with --emulate=ggml)" if pre and not same else ""
    print(f"\n# routed experts in the file: {plain['expert_bytes'] / GIB:.1f} GiB; tok/s excludes the prompt pass "
          f"(prompt + first token: {plain['prompt_and_first_s']:.1f} s plain); same tokens: {'yes' if same else 'NO'}{flip}; "
          f"load average {os.getloadavg()[0]:.2f}")
    if audited:
        what = ("a stream pair (--emulate=ggml, the draft-3 prediction included: "
                f"{audited['audit_s'] - audited['walk_s']:.0f} s of it)" if audited["streams"] == 2 else "a stream")
        print(f"# refimpl audit of {what} of {args.audit_len} tokens after a {args.audit_len}-token prompt: "
              f"{audited['audit_s']:.0f} s (+ load {audited['load_s']:.0f} s), "
              + ("experts memory-mapped, " if audited["streams"] == 2 else f"{audited['bytes_read'] / GIB:.1f} GiB read, ") +
              f"peak RSS {audited['peak_rss'] / MIB:.0f} MiB, verdict on the random stream: {audited['verdict']}")
    if args.delete and fixture:
        args.model.unlink()
        print(f"# deleted {args.model}")
    return 0 if same or pre else 1


if __name__ == "__main__":
    sys.exit(main())
