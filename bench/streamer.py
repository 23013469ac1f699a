"""Benchmark the expert streamer: the memory bound, and the read set widening with --draft.

    python bench/streamer.py                      # both parts (builds the wide fixture once, ~1 min)
    python bench/streamer.py --part memory --cache-mb 64 --quant q8_0
    python bench/streamer.py --part widening --n 32

**memory** — on the ``wide`` fixture (refimpl.fixtures.presets.LARGE_PRESETS: 256 experts top-8 of
width 512 in 8 trunk layers + MTP; 0.9 GiB of routed experts in q8_0 against ~6 MiB dense), each
configuration runs in a fresh subprocess that loads the model (dense weights pinned), decodes a short
prompt and ``--n`` tokens greedily, and reports its peak RSS (``resource.getrusage`` ru_maxrss).
The budget-0 run measures the *fixed overhead*: its peak RSS minus the dense bytes — the interpreter,
numpy, numba and the compiled kernels, activations and state, and one moe_ffn batch's slices (a
batch holds the union of its rows' experts until the layer is done, whatever the budget). The bound
checked is ``peak RSS(--cache-mb B) ≤ dense + B + overhead``. A pinned run (experts through the
memory map) is shown for contrast. A warm-up subprocess first fills numba's on-disk cache so no run
pays (or counts) JIT compilation.

**widening** — on the ``predictable`` fixture at ``--cache-mb 0`` (every decode reads its routed
slices), MiB read per generated token and per trunk decode with plain decoding (draft 0) and with
MTP speculation at --draft 1 and 3, split by phase: the trunk's decode / verify batches (and the
widened part: slices only the draft rows route to) and the MTP head's own routing.

The wide fixture is written by :func:`write_fixture_per_tensor`: the same bytes as
``refimpl.fixtures.write_fixture`` (tested on tiny), but one block's float32 tensors at a time
instead of the whole model, so writing it needs ~0.5 GiB rather than ~4 GiB (the one-tensor-at-a-time
writing is refimpl.fixtures.large's: ``laid_out_groups``, ``write_tensors_streamed``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import MIB, peak_rss, random_prompt, run_child, vm_hwm  # noqa: E402
from refimpl.fixtures.large import laid_out_groups, write_tensors_streamed  # noqa: E402
from refimpl.fixtures.mixes import QUANT_MIXES, assign_types, encode  # noqa: E402
from refimpl.fixtures.presets import LARGE_PRESETS, PRESETS  # noqa: E402
from refimpl.fixtures.weights import _Draw  # noqa: E402
from refimpl.fixtures.writer import block_count, fixture_file, resolve_options  # noqa: E402


# ---- the per-tensor fixture writer ------------------------------------------------------------------


class _ShapeDraw(_Draw):
    """A draw that returns zero-stride views: every tensor's name and shape, no values, no memory."""

    def normal(self, name, shape, std):
        return np.broadcast_to(np.float32(0), shape)


def write_fixture_per_tensor(path, *, preset: str, quant: str = "f32", seed: int = 0, **options) -> Path:
    """``write_fixture``'s file, written one tensor at a time (presets in PRESETS or LARGE_PRESETS;
    not ``predictable``, whose construction needs the whole model at once)."""
    p = LARGE_PRESETS.get(preset) or PRESETS[preset]
    if p.predictable:
        raise ValueError("the per-tensor writer cannot build the predictable preset")
    assert quant in QUANT_MIXES, quant
    opts = resolve_options(p, options)
    shapes = {n: a.shape for g in laid_out_groups(p, _ShapeDraw(seed), opts, quant) for n, a in g.items()}
    types = assign_types(shapes, quant, n_expert=p.n_expert, n_layer_all=block_count(p, opts))
    data = ((n, encode(a, types[n])) for g in laid_out_groups(p, _Draw(seed), opts, quant) for n, a in g.items())

    path = Path(path)
    with fixture_file(path, p, quant, seed, opts) as w:
        write_tensors_streamed(w, {n: (shape, types[n]) for n, shape in shapes.items()}, data)
    return path


def fixture(preset: str, quant: str, seed: int = 0) -> Path:
    """A fixture from the cache, written on first use (per tensor for large presets)."""
    from refimpl.fixtures.builtin import cache_dir, fixture_path

    if preset not in LARGE_PRESETS:
        return fixture_path(preset, quant, seed)
    path = cache_dir() / f"{preset}-{quant}-s{seed}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        print(f"writing {path} (once) …", file=sys.stderr, flush=True)
        write_fixture_per_tensor(path, preset=preset, quant=quant, seed=seed)
        print(f"  {path.stat().st_size / MIB:.0f} MiB in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return path


# ---- memory bound (each configuration in a fresh process) -------------------------------------------


def _child(args) -> None:
    """Load, generate, print one JSON line with the peak RSS and the streamer's figures."""
    from refimpl.decode.greedy import greedy
    from refimpl.model.trunk import load_model
    from refimpl.decode.speculative import speculative_generate

    cache_mb = None if args.cache_mb == "pinned" else args.cache_mb
    model = load_model(args.model, cache_mb, progress=False)
    rss_loaded = peak_rss()
    prompt = random_prompt(args.prompt_len)
    if args.mtp:
        s = model.streamer
        out, _ = speculative_generate(model, prompt, args.n, source="mtp", n_draft=3,
                                      bytes_read=s.bytes_read if s else None)
    else:
        out = greedy(model, prompt, args.n)
    peak = peak_rss()
    dense = sum(t.n_bytes for n, t in model.file.gguf.tensors.items() if "_exps." not in n)
    res = {"peak_rss": peak, "vm_hwm": vm_hwm(), "rss_loaded": rss_loaded, "dense_bytes": dense, "tokens": out}
    if model.streamer is not None:
        res["stats"] = model.streamer.stats(len(out))
    print(json.dumps(res))


def _run_child(model: Path, cache_mb, n: int, prompt_len: int, mtp: bool = False) -> dict:
    return run_child(__file__, ["--model", str(model), "--cache-mb", str(cache_mb), "--n", str(n),
                                "--prompt-len", str(prompt_len)] + (["--mtp"] if mtp else []), f"--cache-mb {cache_mb}")


def memory(args) -> None:
    # Linux carries a parent's peak RSS into a (v)forked child's ru_maxrss, so this process stays
    # small: the fixture is written, and everything measured, in subprocesses.
    subprocess.run([sys.executable, __file__, "--build", "wide", args.quant], check=True)
    from refimpl.fixtures.builtin import cache_dir

    model = cache_dir() / f"wide-{args.quant}-s0.gguf"
    _run_child(model, 0, 1, 2)  # warm-up: compile (or load) the kernels into numba's disk cache
    print(f"\nmemory bound: {model.name} ({model.stat().st_size / MIB:.0f} MiB file), "
          f"prompt {args.prompt_len} tokens + {args.n} generated, one fresh process per row\n")
    rows = [("0", 0, False), (str(args.cache_mb), args.cache_mb, False), (f"{args.cache_mb} --mtp --draft 3", args.cache_mb, True),
            ("256", 256, False), ("pinned (memory map)", "pinned", False)]
    results = {}
    hdr = (f"{'--cache-mb':<22} {'dense MiB':>9} {'budget MiB':>10} {'peak RSS MiB':>12} {'(VmHWM)':>8} "
           f"{'RSS-dense-budget':>16} {'read MiB':>9} {'hit rate':>8}")
    print(hdr)
    print("-" * len(hdr))
    for label, mb, mtp in rows:
        r = _run_child(model, mb, args.n, args.prompt_len, mtp)
        results[label] = r
        budget = 0 if mb == "pinned" else mb * MIB
        st = r.get("stats", {})
        print(f"{label:<22} {r['dense_bytes'] / MIB:>9.1f} {budget / MIB:>10.0f} {r['peak_rss'] / MIB:>12.1f} "
              f"{(r['vm_hwm'] or 0) / MIB:>8.1f} "
              f"{(r['peak_rss'] - r['dense_bytes'] - budget) / MIB:>16.1f} {st.get('bytes_read', 0) / MIB:>9.1f} "
              f"{100 * st.get('hit_rate', 0):>7.1f}%")
    base = results["0"]
    overhead = base["peak_rss"] - base["dense_bytes"]
    print(f"\nfixed overhead (budget-0 peak RSS − dense bytes): {overhead / MIB:.1f} MiB "
          f"(of which {(base['rss_loaded'] - base['dense_bytes']) / MIB:.1f} MiB right after load)")
    for label, mb, _ in rows[1:4]:
        r = results[label]
        bound = r["dense_bytes"] + mb * MIB + overhead
        ok = "holds" if r["peak_rss"] <= bound else "EXCEEDED"
        print(f"--cache-mb {label}: peak {r['peak_rss'] / MIB:.1f} MiB ≤ dense + {mb} MiB + overhead = {bound / MIB:.1f} MiB: {ok}")
    assert all(r["tokens"] == base["tokens"] for lbl, r in results.items() if "mtp" not in lbl), "tokens differ across budgets"


# ---- widening with --draft ----------------------------------------------------------------------------


def widening(args) -> None:
    from refimpl.model.trunk import load_model
    from refimpl.decode.speculative import speculative_generate

    path = fixture("predictable", args.widen_quant)
    prompt = [40, 41, 42, 43]
    print(f"\nread-set widening: {path.name}, --cache-mb 0, prompt {len(prompt)} tokens, {args.n} generated\n")
    hdr = (f"{'draft':>5} {'decodes':>7} {'accepted':>8} {'MiB/token':>9} {'MiB/decode':>10} {'decode':>7} {'verify':>7} "
           f"{'widened':>7} {'mtp':>7}   (MiB over generation)")
    print(hdr)
    print("-" * len(hdr))
    tokens = None
    for n_draft in (0, 1, 3):
        model = load_model(path, 0, progress=False)
        s = model.streamer
        out, st = speculative_generate(model, prompt, args.n, source="mtp" if n_draft else None, n_draft=max(n_draft, 1),
                                       bytes_read=s.bytes_read, counters=s.counters.columns)
        tokens = tokens or out
        assert out == tokens, "tokens differ across draft widths"
        c = st.stream
        print(f"{n_draft:>5} {st.n_decodes:>7} {f'{st.n_accepted}/{st.n_drafted}':>8} {c['stream_bytes'] / st.n_generated / MIB:>9.2f} "
              f"{c['stream_bytes'] / st.n_decodes / MIB:>10.2f} {c['stream_bytes_decode'] / MIB:>7.1f} "
              f"{c['stream_bytes_verify'] / MIB:>7.1f} {c['stream_bytes_verify_widened'] / MIB:>7.1f} {c['stream_bytes_mtp'] / MIB:>7.1f}")
        if n_draft:
            print("      " + s.summary_lines(st.n_generated, mtp=True)[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("memory", "widening", "all"), default="all")
    ap.add_argument("--cache-mb", default="64", help="budget of the memory-bound run (MiB)")
    ap.add_argument("--quant", default="q8_0", help="mix of the wide fixture (q8_0: 0.9 GiB of experts)")
    ap.add_argument("--widen-quant", default="q4_k_m", help="mix of the predictable fixture for the widening part")
    ap.add_argument("--n", type=int, default=16, help="tokens to generate")
    ap.add_argument("--prompt-len", type=int, default=4)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--build", nargs=2, metavar=("PRESET", "QUANT"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--mtp", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.build:
        fixture(*args.build)
        return None
    if args.child:
        args.cache_mb = args.cache_mb if args.cache_mb == "pinned" else int(args.cache_mb)
        return _child(args)
    args.cache_mb = int(args.cache_mb)
    if args.part in ("memory", "all"):
        memory(args)
    if args.part in ("widening", "all"):
        widening(args)


if __name__ == "__main__":
    main()
