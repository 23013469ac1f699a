"""Decode speed of refimpl against llama.cpp, side by side on the same GGUF and thread count.

    python bench/decode.py                                   # tiny and medium, q4_k_m and mxfp4
    python bench/decode.py --models medium --quants mxfp4 --n 32 --rounds 5
    python bench/decode.py --models tiny --emulate           # refimpl with llama.cpp's rounding
    python bench/decode.py --models kjv --quants q8_0 --emulate=ggml --pp 0   # + the ggml rows beside plain
    python bench/decode.py --models medium --quants q4_k_m --emulate=ggml --variants none --n 8 --rounds 2
                                                             # the ggml rows alone (one model in RAM), pp256 too

For every (model, mix), in one run:

* **decode tok/s** — greedy decoding of ``--n`` tokens after a short prompt, one token per forward
  call, by refimpl (``refimpl.model.trunk.forward``, plain numerics unless ``--emulate``) — loaded two
  ways (``--variants``): ``mapped`` (``load_model(path, pack=False)``: every matrix read from the memory map) and
  ``packed`` (``load_model(path, pack=True)``: dense matrices also copied into the lane kernels' layout, same
  numbers); ``none``: no plain row — and by llama.cpp (llama-cpp-python 0.3.36 in a child process,
  bench/_llama.py: one token per ``llama_decode``), both with ``--threads`` threads. The two run
  alternately, ``--rounds`` times each (round r of refimpl right before round r of llama.cpp), so
  they see the same machine load; the ratio is formed per round (printed per round, on stderr) and its median
  and range printed. Only the generated tokens are timed (the prompt is processed first, untimed).
* **the llama.cpp configuration** of every row is printed beside it (``llama.cpp`` column): its weights in the
  CPU_REPACK buffer (``repack``: llama.cpp's default), the K/V cache type, flash attention. The plain rows
  and the ``ggml`` row are compared with ``repack F32 K/V FA off`` (the settings of tests/llama_ref.py), the
  ``ggml-fa`` row with llama.cpp's defaults, ``repack F16 K/V FA on`` — one llama.cpp child, a context of each.
* **prompt tok/s** (``--pp 256``; 0 skips it) — a prompt of that many tokens from an empty context:
  plain refimpl as ``refimpl logits`` reads a prompt (``forward`` on chunks of ``--pp-chunk`` positions,
  default the CLI's ``LOGITS_CHUNK``), the ggml rows as ``refimpl run --emulate=ggml`` does (the whole prompt
  in one ``forward``: ubatches of n_ubatch = 512 positions, llama.cpp's), both with the logits of the last
  position only (``outputs="last"``); llama.cpp as ``llama-bench -p 256`` does (one ``llama_decode`` of the
  whole prompt, n_batch = n_ubatch = 512, logits of the last position only), in a child of its own per round
  (warm: each configuration's prompt run twice, the second timed); same threads, alternating rounds, the
  ratio per round and per row, against the row's llama.cpp configuration. ``--pp-all-logits`` times every
  position's logits instead, as ``refimpl logits`` computes them. If llama.cpp's batch kernels die with its
  repacked/AMX layouts (a VM advertising AMX without enabling it), its prompt runs without (``no repack``).
* **verify / decode** — refimpl's time for one verify batch of 1+3 positions (``forward`` of 4 tokens
  after the prompt: the last token and three drafts, phase ``verify``) divided by its time for one
  single-token decode from the same state; the two are timed alternately ``--verify-reps`` times and
  the medians divided. States are immutable, so every repetition starts from the same state. Beside it, llama.cpp's
  own ratio (``llama.cpp verify/decode``, the row's configuration): a ``llama_decode`` of 1 token and one of 4 (the
  last token and three of its greedy tokens, every position's logits), alternately ``--verify-reps`` times after
  the prompt — one after the other, as its recurrent state cannot be rolled back (bench/_llama.py) —, right before
  refimpl's repetitions and again right after them. ``verify ms``: the median time of one verify batch, refimpl's
  and llama.cpp's (its 2 × ``--verify-reps``), side by side.

* **``--emulate=ggml``** adds the ggml rows: the same greedy decode and prompt with ``Ctx.ggml`` (every op as the
  loaded libggml-cpu computes it, bit for bit; ``emulation_ctx("ggml")`` with ``n_threads`` = ``--threads``,
  ``repack=True``: the weights llama.cpp's default CPU_REPACK re-lays out take the emulated repacked kernels, as
  in the llama.cpp child), one row per llama.cpp configuration of ``--ggml-configs`` (default both):
  ``bench`` → row ``ggml`` (F32 K/V, flash attention off), ``defaults`` → row ``ggml-fa`` (F16 K/V, flash
  attention on: llama.cpp's defaults). Each row's tokens must be those of llama.cpp in its configuration
  (``same tokens``). The model is loaded once, as ``refimpl run --emulate=ggml`` loads it (``pack="auto"`` with
  ``ggml``: the weights also in the column layout of its kernels, ``refimpl.graph.layout.ggml_layout``, when
  that fits in RAM); the rows run in the same rounds, right after the plain variants, and their tok/s are also
  divided by each plain variant's of the same round (``ggml / plain``). ``--emulate=ggml:NAME`` emulates a
  named path instead of the loaded library's. The plain rows keep ``--emulate``'s other meaning off (plain
  numerics). ``kjv`` (the built-in trained model, Q8_0: ``--quants q8_0``) is a model name here too.

RAM: every variant is a model in memory (a medium mix: ~3 GiB mapped, as much again per copy, and a llama.cpp
child with its repacked copy); ``--variants none`` with ``--emulate=ggml`` keeps one refimpl model.

Both sides are warm before timing: llama.cpp has loaded (and repacked) its weights; refimpl has
compiled its kernels and touched every page of the memory-mapped file once (so the first tokens do
not pay page faults for experts they route to for the first time — llama.cpp's load reads the file
too). Models: ``tiny`` (refimpl.fixtures.builtin.fixture_path) and ``medium`` (the real Qwen3.6-35B-A3B
layer widths with 4 trunk layers + MTP, ~3 GiB per mix, written once into the fixture cache by
refimpl.fixtures.large); ``real2`` (the same widths, 2 trunk layers, vocabulary 32768: 1.5 GiB) on
request. Noise: the machine is shared, so each figure is printed with its range over rounds, and the
load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._llama import CONFIGS, LlamaDecoder, label, llama_prompt  # noqa: E402

MIB = 1 << 20


# ---- refimpl ----------------------------------------------------------------------------------------


def touch_pages(model) -> None:
    """Read one byte of every page of every tensor (the whole file is mapped once, as llama.cpp's load does)."""
    g = model.file.gguf
    for name in g.tensors:
        flat = np.ascontiguousarray(g.raw(name)).reshape(-1).view(np.uint8)
        if flat.size:
            _ = flat[::4096].sum(dtype=np.uint64)


def refimpl_decode(model, prompt: list[int], n: int, ctx) -> tuple[float, list[int]]:
    """Greedy decode of n tokens after the prompt (untimed); returns (tok/s of the n decodes, tokens)."""
    from refimpl.decode.greedy import argmax
    from refimpl.model.trunk import forward
    from refimpl.model.state import SeqState

    logits, _, state = forward(model, SeqState.fresh(model.config), prompt, ctx)
    out = [argmax(logits[-1])]
    t0 = time.perf_counter()
    for _ in range(n):
        logits, _, state = forward(model, state, [out[-1]], ctx)
        out.append(argmax(logits[-1]))
    return n / (time.perf_counter() - t0), out[:-1]


def refimpl_prompt(model, tokens: list[int], chunk: int, ctx, all_logits: bool = False) -> float:
    """tok/s of a prompt pass on ``tokens`` from an empty context: ``forward`` on chunks of ``chunk``
    positions, logits of the last position only (``refimpl run``'s prompt) or, with ``all_logits``,
    of every position (``refimpl logits``)."""
    from refimpl.model.trunk import forward
    from refimpl.model.state import SeqState

    state = SeqState.fresh(model.config)
    t0 = time.perf_counter()
    for i in range(0, len(tokens), chunk):
        _, _, state = forward(model, state, tokens[i : i + chunk], ctx, outputs="all" if all_logits else "last")
    return len(tokens) / (time.perf_counter() - t0)


def verify_ratio(model, prompt: list[int], drafts: list[int], reps: int, ctx) -> tuple[float, float, float, list[float]]:
    """(median decode s, median verify s, their ratio, per-rep ratios): forward of [x] vs [x, *drafts]
    from the state after the prompt, timed alternately."""
    from refimpl.model.trunk import forward
    from refimpl.model.state import SeqState

    _, _, state = forward(model, SeqState.fresh(model.config), prompt[:-1], ctx)
    x = prompt[-1]
    forward(model, state, [x], ctx)  # warm
    forward(model, state, [x, *drafts], ctx, phase="verify")
    one, batch = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        forward(model, state, [x], ctx)
        t1 = time.perf_counter()
        forward(model, state, [x, *drafts], ctx, phase="verify")
        t2 = time.perf_counter()
        one.append(t1 - t0)
        batch.append(t2 - t1)
    d, v = statistics.median(one), statistics.median(batch)
    return d, v, v / d, [b / a for a, b in zip(one, batch)]


def model_path(preset: str, quant: str) -> Path:
    from refimpl.fixtures.builtin import TRAINED_PATH, fixture_path
    from refimpl.fixtures.large import large_fixture

    if preset == "kjv":  # the built-in trained model (Q8_0 only)
        if quant != "q8_0":
            raise SystemExit("bench/decode.py: kjv is Q8_0 only (--quants q8_0)")
        return TRAINED_PATH
    if preset in ("medium", "real2", "full"):
        return large_fixture(preset, quant)
    return fixture_path(preset, quant)


def _numba_isa() -> str:
    from kernels.lanes.ir import ISA, ISA_NAMES

    return ISA_NAMES[ISA]


def _range(xs) -> str:
    m = statistics.median(xs)
    fmt = ".0f" if m >= 100 else ".1f" if m >= 10 else ".2f"
    return f"{m:{fmt}} [{min(xs):{fmt}}–{max(xs):{fmt}}]"


GGML_ROWS = {"bench": "ggml", "defaults": "ggml-fa"}  # the ggml row of each llama.cpp configuration (bench/_llama.py)


def ggml_rows(path: Path, args) -> tuple[object, dict]:
    """The model as ``refimpl run --emulate=ggml`` loads it (``pack="auto"`` with ``ggml``: its column layout
    when that fits in RAM) and {row: (ctx, llama.cpp configuration)} for ``--ggml-configs``: the
    ``emulation_ctx("ggml")`` of each configuration's K/V type and flash attention, ``n_threads`` = ``--threads``.
    The layout depends only on the path and ``repack``, so the rows share the model."""
    from refimpl.model.ops import emulation_ctx
    from refimpl.model.trunk import load_model

    ctxs = {}
    for cfg in args.ggml_configs:
        kv, fa = CONFIGS[cfg]
        ctxs[GGML_ROWS[cfg]] = (emulation_ctx("ggml", kv_f16=kv == "F16", flash_attn=fa, n_threads=args.threads,
                                              ggml=args.ggml_path), cfg)  # ggml None: the loaded library's path
    first = next(iter(ctxs.values()))[0]
    model = load_model(path, pack="auto", ggml=(first.ggml, first.repack))
    touch_pages(model)
    return model, ctxs


def bench_one(preset: str, quant: str, args) -> list[dict]:
    """The refimpl rows (plain variants: memory-map rows, ``load_model(pack=True)``; the ggml rows) and
    llama.cpp (one child, a context per configuration the rows are compared with) on one file."""
    import numba

    from refimpl.io.malloc import reuse_freed_memory
    from refimpl.model.ops import Ctx
    from refimpl.model.trunk import load_model

    numba.set_num_threads(args.threads)
    reuse_freed_memory()  # as the refimpl command does (refimpl.io.malloc)
    ctx = Ctx(act_quant=True) if args.emulate == "act" else Ctx()
    path = model_path(preset, quant)
    # {row: (model, ctx, llama.cpp configuration, prompt positions per forward call)}
    rows = {v: (load_model(path, pack=(v == "packed")), ctx, "bench", args.pp_chunk) for v in args.variants}
    for model, *_ in rows.values():
        touch_pages(model)
    if args.emulate == "ggml":  # the prompt in one forward call, as `refimpl run` hands it: ubatches of n_ubatch
        ggml_model, ctxs = ggml_rows(path, args)
        rows.update({name: (ggml_model, gctx, cfg, max(args.pp, 1)) for name, (gctx, cfg) in ctxs.items()})
    cfgs = [c for c in CONFIGS if any(cfg == c for _, _, cfg, _ in rows.values())]
    V = next(iter(rows.values()))[0].config.n_vocab
    prompt = [int(t) for t in np.random.default_rng(7).integers(0, min(V, 390), size=args.prompt_len)]
    pp_tokens = [int(t) for t in np.random.default_rng(8).integers(0, min(V, 390), size=args.pp)]
    for model, rctx, _, chunk in rows.values():  # compile / warm
        # as many tokens as a round: a kernel met only at a longer context (flash attention's one-row path threads
        # from SERIAL_BELOW multiply-adds over the visible cells: real2 at 2 threads from ~32) compiles here, not in
        # round 1 (whose ggml-fa row ran at 13-16 tok/s against 70-75 after a change to kernels/)
        refimpl_decode(model, prompt, args.n, rctx)
        if args.pp:
            refimpl_prompt(model, pp_tokens[: 2 * chunk], chunk, rctx)  # the batch kernels
    ours, tokens, pp_ours = ({name: [] for name in rows} for _ in range(3))
    theirs, their_tokens, pp_theirs = ({cfg: [] for cfg in cfgs} for _ in range(3))
    pp_extra = None  # llama.cpp's default, unless its batch kernels die on this host (llama_prompt)
    llama = LlamaDecoder(path, args.threads)
    try:
        for cfg in cfgs:
            llama.run(prompt, 2, cfg)  # warm
        for r in range(args.rounds):
            for name, (model, rctx, _, _) in rows.items():
                tok_s, tokens[name] = refimpl_decode(model, prompt, args.n, rctx)
                ours[name].append(tok_s)
            for cfg in cfgs:
                res = llama.run(prompt, args.n, cfg)
                theirs[cfg].append(res["tok_s"])
                their_tokens[cfg] = res["tokens"]
            line = _round_line(rows, ours, theirs, cfgs)
            if args.pp:
                for name, (model, rctx, _, chunk) in rows.items():
                    pp_ours[name].append(refimpl_prompt(model, pp_tokens, chunk, rctx, args.pp_all_logits))
                llama.__exit__()  # the decode child's idle threads would spin next to the prompt child's
                tok_s, pp_extra = llama_prompt(path, args.threads, pp_tokens, pp_extra, cfgs)
                for cfg in cfgs:
                    pp_theirs[cfg].append(tok_s[cfg])
                llama = LlamaDecoder(path, args.threads)
                for cfg in cfgs:
                    llama.run(prompt, 2, cfg)
                line += "\n    prompt " + _round_line(rows, pp_ours, pp_theirs, cfgs)
            print(f"  round {r + 1}: decode {line}", file=sys.stderr, flush=True)
        # each row's verify(1+3) / decode, between two runs of llama.cpp's own in the row's configuration (the drafts
        # its greedy tokens, as refimpl's are its own): each side's pairs uninterrupted, the blocks side by side, so
        # that refimpl's verify time can be set beside llama.cpp's (a pair right after a llama.cpp batch would meet its
        # threads still spinning, or, after a pause, a core waking up)
        verified = {}
        for name, (model, rctx, cfg, _) in rows.items():
            before = llama.verify_times(prompt, their_tokens[cfg][:3], args.verify_reps, cfg)
            mine = verify_ratio(model, prompt, tokens[name][:3], args.verify_reps, rctx)
            after = llama.verify_times(prompt, their_tokens[cfg][:3], args.verify_reps, cfg)
            verified[name] = (mine, {key: before[key] + after[key] for key in before})
    finally:
        llama.__exit__()
    plain = [v for v in args.variants]
    assert all(tokens[v] == tokens[plain[0]] for v in plain), "refimpl variants generated different tokens"
    out = []
    for name, (model, rctx, cfg, _) in rows.items():
        (d, vs, _, vrs), their = verified[name]
        llama_vs = statistics.median(their["verify_s"])
        row = {"model": preset, "quant": quant, "variant": name, "mib": path.stat().st_size / MIB,
               "llama": label(cfg), "ours": ours[name], "theirs": theirs[cfg],
               "ratio": [a / b for a, b in zip(ours[name], theirs[cfg])], "verify": vrs, "decode_s": d, "verify_s": vs,
               "llama_verify": [v / a for a, v in zip(their["decode_s"], their["verify_s"])],
               "llama_decode_s": statistics.median(their["decode_s"]), "llama_verify_s": llama_vs,
               "verify_vs_llama": vs / llama_vs,
               "same_tokens": tokens[name] == their_tokens[cfg],
               "pp": args.pp, "pp_logits": "all" if args.pp_all_logits else "last", "pp_llama": label(cfg, pp_extra),
               "pp_ours": pp_ours[name], "pp_theirs": pp_theirs[cfg],
               "pp_ratio": [a / b for a, b in zip(pp_ours[name], pp_theirs[cfg])]}
        if rctx.ggml:
            row["ctx"] = rctx.numerics()
            row["vs_plain"] = {v: [a / b for a, b in zip(ours[name], ours[v])] for v in plain}
        out.append(row)
    return out


def _ms_pair(r: dict) -> str:
    """'refimpl / llama.cpp' median verify(1+3) times in ms."""
    return f"{1e3 * r['verify_s']:.3g} / {1e3 * r['llama_verify_s']:.3g}"


def _round_line(rows: dict, ours: dict, theirs: dict, cfgs: list[str]) -> str:
    """One round's tok/s: per llama.cpp configuration, its rows (with their ratio to it) and llama.cpp's."""
    parts = []
    for cfg in cfgs:
        mine = [f"{name} {ours[name][-1]:.2f} ({ours[name][-1] / theirs[cfg][-1]:.2f}x)"
                for name, (_, _, c, _) in rows.items() if c == cfg]
        parts.append(", ".join(mine) + f", llama.cpp [{label(cfg)}] {theirs[cfg][-1]:.2f}")
    return "; ".join(parts) + " tok/s"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,medium", help="comma-separated presets (tiny, medium, real2)")
    ap.add_argument("--quants", default="q4_k_m,mxfp4", help="comma-separated mixes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=16, help="generated tokens timed per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=4)
    ap.add_argument("--verify-reps", type=int, default=7)
    ap.add_argument("--pp", type=int, default=256, help="prompt-processing row: prompt tokens (0: skip it)")
    ap.add_argument("--pp-chunk", type=int, default=None,
                    help="plain refimpl's positions per forward call on the prompt (default: refimpl.cli.LOGITS_CHUNK, "
                         "as `refimpl logits`); the ggml rows take the prompt in one call, as `refimpl run`")
    ap.add_argument("--pp-all-logits", action="store_true",
                    help="time every prompt position's logits (refimpl logits), not the last one's (refimpl run, llama-bench)")
    ap.add_argument("--emulate", nargs="?", const="act", default=None,
                    help="--emulate alone: refimpl with --emulate numerics (act_quant) instead of plain; --emulate=ggml: "
                         "plain rows as usual plus the ggml rows (--ggml-configs), refimpl --emulate=ggml (bit for bit "
                         "libggml-cpu), timed in the same rounds, with their ratios to llama.cpp and to each plain "
                         "variant; --emulate=ggml:NAME: those rows on a named path (e.g. ggml:arm64-i8mm, a phone's path "
                         "emulated on this host)")
    ap.add_argument("--ggml-configs", default="bench,defaults",
                    help="with --emulate=ggml: the llama.cpp configurations to emulate and compare with, comma-separated: "
                         "bench (row 'ggml': F32 K/V, flash attention off), defaults (row 'ggml-fa': llama.cpp's "
                         "defaults, F16 K/V, flash attention on)")
    ap.add_argument("--variants", default="mapped,packed",
                    help="plain refimpl loads to time: mapped (load_model(pack=False)), packed (load_model(pack=True); "
                         "what the default pack=\"auto\" picks when the copies fit in RAM); none: no plain row "
                         "(with --emulate=ggml: the ggml rows alone, one model in RAM)")
    ap.add_argument("--json", help="also write the raw figures to this file")
    args = ap.parse_args(argv)
    args.variants = [] if args.variants == "none" else [v.strip() for v in args.variants.split(",")]
    if not set(args.variants) <= {"mapped", "packed"}:
        ap.error(f"--variants: expected mapped, packed or none, not {','.join(args.variants)!r}")
    args.ggml_configs = [c.strip() for c in args.ggml_configs.split(",")]
    if not args.ggml_configs or not set(args.ggml_configs) <= set(CONFIGS):
        ap.error(f"--ggml-configs: expected {' and/or '.join(CONFIGS)}, not {','.join(args.ggml_configs)!r}")
    args.ggml_path = None
    if args.emulate and args.emulate.startswith("ggml:"):
        from kernels.ggml.build import UnsupportedBuild, named_path

        try:
            args.emulate, args.ggml_path = "ggml", named_path(args.emulate)
        except UnsupportedBuild as e:
            ap.error(str(e))
    elif args.emulate not in (None, "act", "ggml"):
        ap.error(f"--emulate: expected act, ggml or ggml:NAME, not {args.emulate!r}")
    if not args.variants and args.emulate != "ggml":
        ap.error("--variants none leaves no row to time without --emulate=ggml")
    if not 0 <= args.pp <= 512:
        ap.error("--pp must be between 0 and 512 (llama.cpp's batch)")
    if args.pp_chunk is None:
        from refimpl.cli import LOGITS_CHUNK

        args.pp_chunk = LOGITS_CHUNK
    load0 = os.getloadavg()
    from bench._common import cpu_description

    print(f"# {cpu_description()}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; numba ISA {_numba_isa()}")
    if args.emulate == "ggml":
        from kernels.ggml.build import describe_named, detect

        print(f"# --emulate=ggml follows {describe_named(args.ggml_path) if args.ggml_path else detect().describe()}")
    print(f"# {args.threads} threads (numba and llama.cpp), {args.n} tokens per round, {args.rounds} rounds, "
          f"refimpl numerics {'emulate' if args.emulate == 'act' else 'plain'}"
          f"{' + ggml rows (' + ', '.join(GGML_ROWS[c] for c in args.ggml_configs) + ')' if args.emulate == 'ggml' else ''}"
          f"; load average {load0[0]:.2f}", flush=True)
    rows = []
    for preset in args.models.split(","):
        for quant in args.quants.split(","):
            print(f"{preset}-{quant}:", file=sys.stderr, flush=True)
            rows.extend(bench_one(preset.strip(), quant.strip(), args))
    print_tables(rows, args)
    load1 = os.getloadavg()
    print(f"\n# median [min–max] over rounds of the per-round figures and ratios; verify/decode: per-repetition ratios "
          f"({args.verify_reps}; llama.cpp's: {2 * args.verify_reps}, before and after refimpl's), decode and verify medians "
          f"in the JSON; 'verify ms': the median time of one verify(1+3) batch, refimpl / llama.cpp. Load average "
          f"{load0[0]:.2f} before, {load1[0]:.2f} after.")
    print("# 'same tokens': refimpl's greedy tokens equal those of llama.cpp in the row's configuration (plain numerics "
          "differ from llama.cpp's by its activation quantization, so a near-tie can legitimately differ; --emulate "
          "matches its rounding, the ggml rows every bit).")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def print_tables(rows: list[dict], args) -> None:
    """The decode table, the ggml / plain table and the prompt table, every row with its llama.cpp configuration."""
    print()
    hdr = (f"{'model':<7} {'mix':<7} {'MiB':>5} {'refimpl':<7} | {'refimpl tok/s':>18} | {'llama.cpp':<23} | "
           f"{'llama.cpp tok/s':>18} | {'refimpl / llama.cpp':>19} | {'verify(1+3)/decode':>18} | "
           f"{'llama.cpp verify/decode':>23} | {'verify ms':>13} | same tokens")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['model']:<7} {r['quant']:<7} {r['mib']:5.0f} {r['variant']:<7} | {_range(r['ours']):>18} | "
              f"{r['llama']:<23} | {_range(r['theirs']):>18} | {_range(r['ratio']):>19} | {_range(r['verify']):>18} | "
              f"{_range(r['llama_verify']):>23} | {_ms_pair(r):>13} | {'yes' if r['same_tokens'] else 'no'}")
    ggml = [r for r in rows if "vs_plain" in r]
    if ggml and args.variants:
        hdr = f"\n{'model':<7} {'mix':<7} {'row':<7} | {'ggml / plain ' + '(' + ', '.join(args.variants) + ')':>40} | ggml numerics"
        print(hdr)
        print("-" * len(hdr))
        for r in ggml:
            cell = ", ".join(_range(x) for x in r["vs_plain"].values())
            print(f"{r['model']:<7} {r['quant']:<7} {r['variant']:<7} | {cell:>40} | {r['ctx']}")
    if not args.pp:
        return
    hdr = (f"\n{'model':<7} {'mix':<7} {'refimpl':<7} | {f'refimpl prompt tok/s ({args.pp})':>28} | {'llama.cpp':<23} | "
           f"{f'llama.cpp pp{args.pp} tok/s':>22} | {'refimpl / llama.cpp':>19}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['model']:<7} {r['quant']:<7} {r['variant']:<7} | {_range(r['pp_ours']):>28} | {r['pp_llama']:<23} | "
              f"{_range(r['pp_theirs']):>22} | {_range(r['pp_ratio']):>19}")
    which = "every position's logits (`refimpl logits`)" if args.pp_all_logits else "the last position's logits (`refimpl run`)"
    print(f"# prompt: plain refimpl forward on chunks of {args.pp_chunk} positions, the ggml rows one forward call "
          f"(ubatches of n_ubatch 512, as `refimpl run --emulate=ggml`), {which}; llama.cpp one batch, last "
          "position's logits (`llama-bench -p`).")
    if any(r["pp_llama"].startswith("no repack") for r in rows):
        print("# prompt, no repack: llama.cpp's batch kernels died with its default repacked/AMX layouts on this host, "
              "so its prompt ran with use_extra_bufts=false.")


if __name__ == "__main__":
    sys.exit(main())
