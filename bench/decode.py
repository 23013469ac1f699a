"""Decode speed of refimpl against llama.cpp, side by side on the same GGUF and thread count.

    python bench/decode.py                                   # tiny and medium, q4_k_m and mxfp4
    python bench/decode.py --models medium --quants mxfp4 --n 32 --rounds 5
    python bench/decode.py --models tiny --emulate           # refimpl with llama.cpp's rounding
    python bench/decode.py --models kjv --quants q8_0 --emulate=ggml --pp 0   # + --emulate=ggml beside plain

For every (model, mix), in one run:

* **decode tok/s** — greedy decoding of ``--n`` tokens after a short prompt, one token per forward
  call, by refimpl (``refimpl.model.trunk.forward``, plain numerics unless ``--emulate``) — loaded two
  ways: ``mapped`` (``load_model(path, pack=False)``: every matrix read from the memory map) and ``packed``
  (``load_model(path, pack=True)``: dense matrices also copied into the lane kernels' layout, same
  numbers) — and by llama.cpp
  (llama-cpp-python 0.3.36 in a child process: one token per ``llama_decode``, F32 K/V cache, flash
  attention off, the settings of tests/llama_ref.py), both with ``--threads`` threads. The two run
  alternately, ``--rounds`` times each (round r of refimpl right before round r of llama.cpp), so
  they see the same machine load; the ratio is formed per round and its median and range printed.
  Only the generated tokens are timed (the prompt is processed first, untimed).
* **prompt tok/s** (``--pp 256``; 0 skips it) — a prompt of that many tokens from an empty context:
  refimpl as ``refimpl run`` reads a prompt (``forward`` on chunks of ``--pp-chunk`` positions, default the
  CLI's ``LOGITS_CHUNK``, logits of the last position only: ``outputs="last"``), llama.cpp as
  ``llama-bench -p 256`` does (one ``llama_decode`` of the whole prompt, n_batch = n_ubatch = 512,
  logits of the last position only); same threads, alternating rounds, the ratio per round.
  ``--pp-all-logits`` times every position's logits instead, as ``refimpl logits`` computes them.
* **verify / decode** — refimpl's time for one verify batch of 1+3 positions (``forward`` of 4 tokens
  after the prompt: the last token and three drafts, phase ``verify``) divided by its time for one
  single-token decode from the same state; the two are timed alternately ``--verify-reps`` times and
  the medians divided. States are immutable, so every repetition starts from the same state.

* **``--emulate=ggml``** adds a third refimpl row, ``ggml``: the same greedy decode with ``Ctx.ggml`` (every op as
  the loaded libggml-cpu computes it, bit for bit: ``emulation_ctx("ggml")`` with the llama.cpp child's settings —
  F32 K/V, flash attention off —, ``n_threads`` = ``--threads``, ``repack=True``: the weights llama.cpp's default
  CPU_REPACK re-lays out take the emulated repacked gemv, as in the llama.cpp child; its tokens must be llama.cpp's
  own), loaded as ``refimpl run --emulate=ggml``
  loads (``pack="auto"`` with ``ggml``: the weights also in the column layout of its kernels,
  ``refimpl.graph.layout.ggml_layout``, when that fits in RAM). It runs in the same rounds, right after the plain
  variants, and its tok/s is also divided by each plain variant's of the same round (``ggml / plain``).
  Its prompt row is not measured. The plain rows keep ``--emulate``'s other meaning off (plain numerics).
  ``kjv`` (the built-in trained model, Q8_0: ``--quants q8_0``) is a model name here too.

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
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MIB = 1 << 20


# ---- llama.cpp: a child process that decodes on request -------------------------------------------


def _llama_child(path: str, threads: int, extra_bufts: bool = True) -> int:
    """Load the model once; then per stdin line ``{"prompt": [...], "n": N}`` decode the prompt one
    token at a time, then N greedy tokens (timed), and print ``{"tok_s": …, "tokens": [...]}``."""
    import llama_cpp as L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = extra_bufts  # the repacked (and AMX) weight layouts, llama.cpp's default
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        print(json.dumps({"error": "llama_model_load_from_file returned NULL"}), flush=True)
        return 3
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 1024, 512, 512, 1
    cp.n_threads = cp.n_threads_batch = threads
    cp.type_k = cp.type_v = L.GGML_TYPE_F32
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.no_perf = True
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(512, 0, 1)

    def decode(tok: int, pos: int) -> int:
        batch.n_tokens = 1
        batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = tok, pos, 1, 0, 1
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError(f"llama_decode failed at position {pos}")
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), shape=(n_vocab,))
        return int(np.argmax(logits))

    def prompt_tok_s(tokens: list[int]) -> float:
        """One llama_decode of the whole prompt (logits of its last position only), as llama-bench -p."""
        batch.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = tok, i, 1, 0
            batch.logits[i] = int(i == len(tokens) - 1)
        t0 = time.perf_counter()
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed on the prompt")
        return len(tokens) / (time.perf_counter() - t0)

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        if "pp" in req:
            print(json.dumps({"tok_s": prompt_tok_s(req["pp"])}), flush=True)
            continue
        prompt = req["prompt"]
        for pos, tok in enumerate(prompt):
            nxt = decode(tok, pos)
        out = [nxt]
        t0 = time.perf_counter()
        for i in range(req["n"]):
            out.append(decode(out[-1], len(prompt) + i))
        dt = time.perf_counter() - t0
        print(json.dumps({"tok_s": req["n"] / dt, "tokens": out[:-1]}), flush=True)
    return 0


class LlamaDecoder:
    """The llama.cpp child of one model (``with`` closes it)."""

    def __init__(self, path: Path, threads: int, extra_bufts: bool = True):
        argv = [sys.executable, __file__, "--llama-child", str(path), "--threads", str(threads)]
        self.proc = subprocess.Popen(argv + ([] if extra_bufts else ["--no-extra-bufts"]),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ready = json.loads(self.proc.stdout.readline() or '{"error": "llama.cpp child died while loading"}')
        if "error" in ready:
            raise RuntimeError(ready["error"])

    def run(self, prompt: list[int], n: int) -> dict:
        return self._ask({"prompt": prompt, "n": n})

    def prompt(self, tokens: list[int]) -> float:
        """Prompt-processing tok/s of one batch of ``tokens`` from an empty context."""
        return self._ask({"pp": tokens})["tok_s"]

    def _ask(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise ChildProcessError(f"the llama.cpp child died (exit status {self.proc.wait()})")
        return json.loads(line)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=60)


def llama_prompt(path: Path, threads: int, tokens: list[int], extra_bufts: bool | None) -> tuple[float, bool]:
    """(prompt tok/s of llama.cpp on ``tokens``, the ``use_extra_bufts`` it ran with), in a child of its
    own that lives only for this measurement (two llama.cpp processes at once slow each other down: idle
    threads spin). Warm: the prompt is run twice, the second timed. ``extra_bufts=None``: llama.cpp's
    default (the repacked and AMX layouts), and if its batch kernels die — some VMs advertise AMX without
    enabling it (this KVM host: SIGILL on a batch of Q4_K rows) — ``use_extra_bufts = false``."""
    for flag in ([True, False] if extra_bufts is None else [extra_bufts]):
        with LlamaDecoder(path, threads, extra_bufts=flag) as llama:
            try:
                llama.prompt(tokens)
                return llama.prompt(tokens), flag
            except ChildProcessError:
                if extra_bufts is not None or not flag:
                    raise
    raise AssertionError("unreachable")


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


def bench_one(preset: str, quant: str, args) -> list[dict]:
    """Both refimpl variants (memory-map rows, and ``load_model(pack=True)``) and llama.cpp on one file."""
    import numba

    from refimpl.model.trunk import load_model
    from refimpl.model.ops import Ctx

    numba.set_num_threads(args.threads)
    ctx = Ctx(act_quant=True) if args.emulate == "act" else Ctx()
    path = model_path(preset, quant)
    variants = {v: load_model(path, pack=(v == "packed")) for v in args.variants}  # mapped: pack=False
    ggml_ctx = ggml_model = None
    if args.emulate == "ggml":  # --emulate=ggml, loaded as `refimpl run --emulate=ggml` loads (its column layout)
        from refimpl.model.ops import emulation_ctx

        ggml_ctx = emulation_ctx("ggml", kv_f16=False, flash_attn=False, n_threads=args.threads,  # the child's settings
                                 ggml=args.ggml_path)  # None: the loaded library's path
        ggml_model = load_model(path, pack="auto", ggml=(ggml_ctx.ggml, ggml_ctx.repack))  # the column layout when it fits
        touch_pages(ggml_model)
        refimpl_decode(ggml_model, [1, 2], 2, ggml_ctx)  # compile / warm
    for model in variants.values():
        touch_pages(model)
    V = next(iter(variants.values())).config.n_vocab
    prompt = [int(t) for t in np.random.default_rng(7).integers(0, min(V, 390), size=args.prompt_len)]
    for model in variants.values():
        refimpl_decode(model, prompt, 2, ctx)  # compile / warm
    ours = {v: [] for v in variants}
    ggml_ours, ggml_tokens = [], None
    theirs, tokens = [], {}
    pp_tokens = [int(t) for t in np.random.default_rng(8).integers(0, min(V, 390), size=args.pp)]
    pp_ours, pp_theirs = {v: [] for v in variants}, []
    if args.pp:
        for model in variants.values():
            refimpl_prompt(model, pp_tokens[: 2 * args.pp_chunk], args.pp_chunk, ctx)  # compile the batch kernels
    pp_extra = None  # llama.cpp's default, unless its batch kernels die on this host (llama_prompt)
    llama = LlamaDecoder(path, args.threads)
    try:
        llama.run(prompt, 2)  # warm
        for r in range(args.rounds):
            for v, model in variants.items():
                tok_s, tokens[v] = refimpl_decode(model, prompt, args.n, ctx)
                ours[v].append(tok_s)
            if ggml_ctx is not None:
                tok_s, ggml_tokens = refimpl_decode(ggml_model, prompt, args.n, ggml_ctx)
                ggml_ours.append(tok_s)
            res = llama.run(prompt, args.n)
            theirs.append(res["tok_s"])
            line = ", ".join(f"refimpl {v} {ours[v][-1]:6.2f}" for v in variants) + f", llama.cpp {res['tok_s']:6.2f} tok/s"
            if ggml_ctx is not None:
                line = f"refimpl ggml {ggml_ours[-1]:6.2f}, " + line
            if args.pp:
                for v, model in variants.items():
                    pp_ours[v].append(refimpl_prompt(model, pp_tokens, args.pp_chunk, ctx, args.pp_all_logits))
                llama.__exit__()  # the decode child's idle threads would spin next to the prompt child's
                tok_s, pp_extra = llama_prompt(path, args.threads, pp_tokens, pp_extra)
                pp_theirs.append(tok_s)
                llama = LlamaDecoder(path, args.threads)
                llama.run(prompt, 2)
                line += ("; prompt " + ", ".join(f"refimpl {v} {pp_ours[v][-1]:6.1f}" for v in variants)
                         + f", llama.cpp {pp_theirs[-1]:6.1f} tok/s")
            print(f"  round {r + 1}: {line}", file=sys.stderr, flush=True)
    finally:
        llama.__exit__()
    pp_note = "llama.cpp defaults" if pp_extra in (None, True) else \
        "llama.cpp use_extra_bufts=false (its batch kernels died with the default repacked/AMX layouts)"
    rows = []
    for v, model in variants.items():
        assert tokens[v] == tokens[next(iter(variants))], "refimpl variants generated different tokens"
        d, vs, _, vrs = verify_ratio(model, prompt, tokens[v][:3], args.verify_reps, ctx)
        rows.append({"model": preset, "quant": quant, "variant": v, "mib": path.stat().st_size / MIB, "ours": ours[v],
                     "theirs": theirs, "ratio": [a / b for a, b in zip(ours[v], theirs)], "verify": vrs,
                     "decode_s": d, "verify_s": vs, "same_tokens": tokens[v] == res["tokens"],
                     "pp": args.pp, "pp_logits": "all" if args.pp_all_logits else "last", "pp_ours": pp_ours[v], "pp_theirs": pp_theirs, "pp_llama": pp_note,
                     "pp_ratio": [a / b for a, b in zip(pp_ours[v], pp_theirs)]})
    if ggml_ctx is not None:
        d, vs, _, vrs = verify_ratio(ggml_model, prompt, ggml_tokens[:3], args.verify_reps, ggml_ctx)
        rows.append({"model": preset, "quant": quant, "variant": "ggml", "mib": path.stat().st_size / MIB, "ours": ggml_ours,
                     "theirs": theirs, "ratio": [a / b for a, b in zip(ggml_ours, theirs)], "verify": vrs,
                     "decode_s": d, "verify_s": vs, "same_tokens": ggml_tokens == res["tokens"],
                     "vs_plain": {v: [a / b for a, b in zip(ggml_ours, ours[v])] for v in variants},
                     "ctx": ggml_ctx.numerics(), "pp": 0, "pp_ours": [], "pp_theirs": [], "pp_ratio": [], "pp_llama": pp_note})
    return rows


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
                    help="refimpl's positions per forward call on the prompt (default: refimpl.cli.LOGITS_CHUNK, as `refimpl logits`)")
    ap.add_argument("--pp-all-logits", action="store_true",
                    help="time every prompt position's logits (refimpl logits), not the last one's (refimpl run, llama-bench)")
    ap.add_argument("--emulate", nargs="?", const="act", default=None,
                    help="--emulate alone: refimpl with --emulate numerics (act_quant) instead of plain; --emulate=ggml: "
                         "plain rows as usual plus a 'ggml' row, refimpl --emulate=ggml (bit for bit libggml-cpu), "
                         "timed in the same rounds, with its ratio to each plain variant; --emulate=ggml:NAME: that row "
                         "on a named path (e.g. ggml:arm64-i8mm, a phone's path emulated on this host)")
    ap.add_argument("--variants", default="mapped,packed",
                    help="refimpl loads to time: mapped (load_model(pack=False)), packed (load_model(pack=True); what the default pack=\"auto\" picks when the copies fit in RAM)")
    ap.add_argument("--json", help="also write the raw figures to this file")
    ap.add_argument("--llama-child", help=argparse.SUPPRESS)
    ap.add_argument("--no-extra-bufts", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",")]
    args.ggml_path = None
    if args.emulate and args.emulate.startswith("ggml:"):
        from kernels.ggml.build import UnsupportedBuild, named_path

        try:
            args.emulate, args.ggml_path = "ggml", named_path(args.emulate)
        except UnsupportedBuild as e:
            ap.error(str(e))
    elif args.emulate not in (None, "act", "ggml"):
        ap.error(f"--emulate: expected act, ggml or ggml:NAME, not {args.emulate!r}")
    if args.llama_child:
        return _llama_child(args.llama_child, args.threads, not args.no_extra_bufts)

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
          f"{' + a ggml row' if args.emulate == 'ggml' else ''}; load average {load0[0]:.2f}", flush=True)
    rows = []
    for preset in args.models.split(","):
        for quant in args.quants.split(","):
            print(f"{preset}-{quant}:", file=sys.stderr, flush=True)
            rows.extend(bench_one(preset.strip(), quant.strip(), args))
    print()
    hdr = (f"{'model':<7} {'mix':<7} {'MiB':>5} {'refimpl':<7} | {'refimpl tok/s':>18} | {'llama.cpp tok/s':>18} | "
           f"{'refimpl / llama.cpp':>19} | {'verify(1+3)/decode':>18} | same tokens")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['model']:<7} {r['quant']:<7} {r['mib']:5.0f} {r['variant']:<7} | {_range(r['ours']):>18} | "
              f"{_range(r['theirs']):>18} | {_range(r['ratio']):>19} | {_range(r['verify']):>18} | "
              f"{'yes' if r['same_tokens'] else 'no'}")
    ggml_rows = [r for r in rows if r["variant"] == "ggml"]
    if ggml_rows:
        hdr = f"\n{'model':<7} {'mix':<7} | {'ggml / plain ' + '(' + ', '.join(args.variants) + ')':>40} | ggml numerics"
        print(hdr)
        print("-" * len(hdr))
        for r in ggml_rows:
            cell = ", ".join(_range(x) for x in r["vs_plain"].values())
            print(f"{r['model']:<7} {r['quant']:<7} | {cell:>40} | {r['ctx']}")
    rows_pp = [r for r in rows if r["variant"] != "ggml"]
    if args.pp:
        hdr = (f"\n{'model':<7} {'mix':<7} {'refimpl':<7} | {f'refimpl prompt tok/s ({args.pp})':>28} | "
               f"{f'llama.cpp pp{args.pp} tok/s':>22} | {'refimpl / llama.cpp':>19}")
        print(hdr)
        print("-" * len(hdr))
        for r in rows_pp:
            print(f"{r['model']:<7} {r['quant']:<7} {r['variant']:<7} | {_range(r['pp_ours']):>28} | "
                  f"{_range(r['pp_theirs']):>22} | {_range(r['pp_ratio']):>19}")
        which = "every position's logits (`refimpl logits`)" if args.pp_all_logits else "the last position's logits (`refimpl run`)"
        print(f"# prompt: refimpl forward on chunks of {args.pp_chunk} positions, {which}; "
              "llama.cpp one batch, last position's logits (`llama-bench -p`).")
        for note in sorted({r["pp_llama"] for r in rows_pp}):
            print(f"# prompt, {note}: " + ", ".join(sorted({f"{r['model']}-{r['quant']}" for r in rows_pp if r["pp_llama"] == note})))
    load1 = os.getloadavg()
    print(f"\n# median [min–max] over rounds; verify/decode: per-repetition ratios ({args.verify_reps}), "
          f"decode and verify medians in the JSON. Load average {load0[0]:.2f} before, {load1[0]:.2f} after.")
    print("# 'same tokens': refimpl's greedy tokens equal llama.cpp's (plain numerics differ from llama.cpp's "
          "by its activation quantization, so a near-tie can legitimately differ; --emulate matches its rounding).")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
