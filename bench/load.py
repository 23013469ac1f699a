"""Time to first token at real size: ``refimpl run`` against llama.cpp's load and first token.

    python bench/load.py                        # builds the file once (~1.5 GB), then measures
    python bench/load.py --rounds 5 --dir /big/disk
    python bench/load.py --profile              # also: where a steady-state refimpl run spends its time

The file: a dense ``qwen35`` GGUF at Qwen3.5-0.8B's widths — E = 1024, 24 trunk layers (full attention
every 4th) + the MTP block, attention 8 heads × 256 / 2 KV heads (RoPE 64 dims, sections 11/11/10/0),
delta-net 16 key / 16 value heads of 128, conv 4, dense FFN 3584, tied embeddings — in ``bf16``
(norms, conv, ``ssm_a``, dt bias F32: ``convert --outtype bf16``), random weights drawn as the fixtures
draw them (refimpl.fixtures), and a real-size vocabulary: 248320 tokens, of which 247 800 are BPE
merges of earlier tokens (``tokenizer.ggml.merges``), built deterministically. Written once, one
tensor at a time (refimpl.fixtures.large), into ``--dir`` (default ``~/.cache/refimpl/bench``).

Measured, alternately ``--rounds`` times, each in a fresh process (the page cache is warm for both:
the file was just written or read):

* **refimpl**: the wall time of ``python -m refimpl run FILE --tokens 1,2,3 -n 1 --json`` — Python's
  start, imports, the header, the weights (memory-mapped; a plain greedy run of one token makes no packed
  copies for the lane kernels: refimpl/cli/run.py ``load_for_run``), the tokenizer (its BPE merges are read at the
  first encode, so not at all for token ids), 3 prompt positions and 1 generated token. The same with
  a text prompt (``-p``, encoded with the merges) is the second row. The first run on a
  machine also compiles numba's kernels (cached on disk afterwards, docs/performance.md "First run"):
  one run with an empty ``NUMBA_CACHE_DIR`` before the rounds, reported apart as *first run*; then
  an untimed run fills the usual cache, and the timed rounds find every kernel there.
* **llama.cpp** (llama-cpp-python 0.3.36): the wall time of a child ``python`` that imports
  ``llama_cpp``, loads the model (``llama_model_load_from_file``), makes a context (n_ctx 4096, F32
  K/V, flash attention off, as tests/llama_ref.py), decodes the 3 tokens in one batch and takes the
  argmax — and, inside that child, the seconds from before the load to the token. On a CPU that lists
  AMX the repacked layouts are switched off (``use_extra_bufts = false``, ``llama-cli -nr``): some VMs
  list AMX without enabling it, and the repacked kernels then die.

The ratio refimpl / llama.cpp is formed per round (process wall times) and its median printed, with
the host's CPU, ISA and the date. Both sides use ``--threads`` threads (default: all cores).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import MIB, cpu_description  # noqa: E402

TOKENS = "1,2,3"
PROMPT = "The quick brown fox"  # the -p row: encoded with the file's 247800 merges
N_MERGES = 247_800
FILE_NAME = "qwen35-0.8b-widths-bf16-s0.gguf"  # a change to the recipe below needs a new name


def preset():
    from refimpl.fixtures.presets import FixturePreset

    return FixturePreset(
        name="qwen35-0.8b", description="Qwen3.5-0.8B widths, dense qwen35, bf16 (bench/load.py)",
        n_vocab=248320, n_embd=1024, n_layer=24, full_attention_interval=4, context_length=262144,
        n_head=8, n_head_kv=2, head_dim=256, rope_dim=64, rope_sections=(11, 11, 10, 0), rope_freq_base=1e7,
        ssm_conv_kernel=4, ssm_group_count=16, ssm_time_step_rank=16, ssm_state_size=128, n_ff=3584,
    )


def real_size_vocab(n_vocab: int, n_merges: int = N_MERGES):
    """A byte-level BPE vocabulary of ``n_vocab`` tokens with ``n_merges`` merges: merge k joins a
    random earlier token (byte or merge) and a random byte token, skipping pairs whose text exists."""
    import numpy as np

    from refimpl.fixtures.vocab import bytes_to_unicode, vocab_from_merges

    byte_tokens = list(bytes_to_unicode().values())
    tokens, seen, merges = list(byte_tokens), set(byte_tokens), []
    rng = np.random.default_rng(0)
    while len(merges) < n_merges:
        left, right = tokens[int(rng.random() * len(tokens))], byte_tokens[int(rng.integers(256))]
        if left + right not in seen:
            seen.add(left + right)
            tokens.append(left + right)
            merges.append((left, right))
    return vocab_from_merges(merges, n_vocab)


def build(path: Path, seed: int = 0) -> Path:
    """Write the benchmark's GGUF to ``path`` (atomically: a temporary name, then a rename)."""
    import gguf
    import numpy as np

    from refimpl.fixtures.large import _shape, _Spec, _SpecDraw, tensor_groups, write_tensors_streamed
    from refimpl.fixtures.mixes import FILE_TYPES, assign_types, encode
    from refimpl.fixtures.writer import block_count, resolve_options, write_model_metadata

    p = preset()
    opts = resolve_options(p, {"arch": "qwen35", "tied": True})
    specs = {n: x for group in tensor_groups(p, _SpecDraw(seed), opts) for n, x in group.items()}
    types = assign_types({n: _shape(x) for n, x in specs.items()}, "bf16", n_expert=0, n_layer_all=block_count(p, opts))

    def data():
        t0 = time.perf_counter()
        for i, (name, x) in enumerate(specs.items()):
            values = x.values(seed) if isinstance(x, _Spec) else np.asarray(x, dtype=np.float32)
            yield name, encode(values, types[name]) if types[name] != gguf.GGMLQuantizationType.F32 else values
            if i % 16 == 0 or i == len(specs) - 1:
                print(f"\r  {path.name}: {i + 1}/{len(specs)} tensors, {time.perf_counter() - t0:4.0f} s",
                      end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        w = gguf.GGUFWriter(tmp, opts["arch"])
        write_model_metadata(w, p, name="refimpl bench: Qwen3.5-0.8B widths", file_type=FILE_TYPES["bf16"],
                             vocab=real_size_vocab(p.n_vocab), n_blocks=block_count(p, opts), mtp=True)
        write_tensors_streamed(w, {n: (_shape(x), types[n]) for n, x in specs.items()}, data())
        w.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def bench_file(directory: Path) -> Path:
    path = directory / FILE_NAME
    if not path.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} (once) …", file=sys.stderr, flush=True)
        build(path)
    return path


# ---- the two sides ------------------------------------------------------------------------------


def run_refimpl(path: Path, threads: int, numba_cache: str | None = None, prompt: str | None = None) -> tuple[float, str]:
    """(wall seconds of one ``refimpl run … -n 1`` on the token ids, or on ``prompt`` as text; its stderr); ``numba_cache``: numba's cache
    directory (``NUMBA_CACHE_DIR``; an empty one makes the run compile every kernel it calls)."""
    env = {**os.environ, "NUMBA_NUM_THREADS": str(threads), **({"NUMBA_CACHE_DIR": numba_cache} if numba_cache else {})}
    cmd = [sys.executable, "-m", "refimpl", "run", str(path), *(["-p", prompt] if prompt else ["--tokens", TOKENS]), "-n", "1", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"refimpl run failed:\n{proc.stderr[-3000:]}")
    return wall, proc.stderr


def _llama_child(path: str, threads: int, extra_bufts: bool) -> int:
    """Load, one context, decode the prompt in one batch, argmax; print the in-process seconds."""
    t0 = time.perf_counter()
    import llama_cpp as L
    import numpy as np

    t_import = time.perf_counter()
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = extra_bufts
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        return 3
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 4096, 512, 512, 1
    cp.n_threads = cp.n_threads_batch = threads
    cp.type_k = cp.type_v = L.GGML_TYPE_F32
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.no_perf = True
    ctx = L.llama_init_from_model(model, cp)
    t_loaded = time.perf_counter()
    tokens = [int(t) for t in TOKENS.split(",")]
    batch = L.llama_batch_init(len(tokens), 0, 1)
    batch.n_tokens = len(tokens)
    for i, tok in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = tok, i, 1, 0
        batch.logits[i] = int(i == len(tokens) - 1)
    if L.llama_decode(ctx, batch) != 0:
        return 4
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    token = int(np.argmax(np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, len(tokens) - 1), shape=(n_vocab,))))
    t_token = time.perf_counter()
    print(json.dumps({"import": t_import - t0, "load": t_loaded - t_import, "first_token": t_token - t_import,
                      "token": token}), flush=True)
    return 0


def run_llama(path: Path, threads: int, extra_bufts: bool) -> tuple[float, dict]:
    """(wall seconds of the llama.cpp child process, its in-process timings)."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--llama-child", str(path), str(threads), str(int(extra_bufts))],
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"llama.cpp failed (exit code {proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, json.loads(proc.stdout.strip().splitlines()[-1])


def _breakdown_child(path: str) -> int:
    """The steps of ``refimpl run`` one after another, timed (what ``_cmd_run`` and ``load_model`` do):
    one JSON line of seconds per step."""
    t = [time.perf_counter()]
    from refimpl.cli.compile_report import name_types
    from refimpl.decode.greedy import greedy
    from refimpl.io.gguf_file import GGUFFile
    from refimpl.io.load import open_model
    from refimpl.io.packing import pack_weights
    from refimpl.model.load import Model
    from refimpl.tokenizer import Tokenizer
    from refimpl.io.weights import load_weights

    t.append(time.perf_counter())
    gf = GGUFFile(path)
    name_types(gf)
    t.append(time.perf_counter())
    m = open_model(gf)
    t.append(time.perf_counter())
    weights = load_weights(m)
    t.append(time.perf_counter())
    tok = Tokenizer.from_gguf(gf)
    t.append(time.perf_counter())
    greedy(Model(file=m, weights=weights), [int(x) for x in TOKENS.split(",")], 1, eog_ids=tok.eog_ids)
    t.append(time.perf_counter())
    pack_weights(weights)
    t.append(time.perf_counter())
    tok.encode(PROMPT)
    t.append(time.perf_counter())
    steps = ("imports", "header", "config + tensor plan", "weights (mapped)", "tokenizer", "prompt + first token",
             "packing (a longer run's, at load)", "first encode (merges)")
    print(json.dumps(dict(zip(steps, (b - a for a, b in zip(t, t[1:]))))), flush=True)
    return 0


def breakdown(path: Path, threads: int) -> dict:
    """Seconds per step of a steady-state run (:func:`_breakdown_child`, in a fresh process)."""
    proc = subprocess.run([sys.executable, __file__, "--breakdown-child", str(path)], capture_output=True, text=True,
                          env={**os.environ, "NUMBA_NUM_THREADS": str(threads)})
    if proc.returncode != 0:
        raise SystemExit(f"breakdown failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def profile_refimpl(path: Path, threads: int, top: int = 25) -> None:
    """One steady-state ``refimpl run`` under cProfile (``python -m cProfile``), its top functions."""
    import pstats

    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        out = Path(tmp) / "run.prof"
        cmd = [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "refimpl", "run", str(path),
               "--tokens", TOKENS, "-n", "1", "--json"]
        subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "NUMBA_NUM_THREADS": str(threads)})
        print(f"\nprofile of one refimpl run (cumulative, top {top}):")
        pstats.Stats(str(out)).sort_stats("cumulative").print_stats(top)


def _compiled(stderr: str) -> str | None:
    """refimpl's "compiled N kernels in X s" line (refimpl.cli.compile_report), if the run compiled."""
    return next((line.removeprefix("refimpl: ") for line in stderr.splitlines() if "compiled" in line and "kernel" in line), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "refimpl" / "bench",
                    help="where the benchmark file is written once and kept (default ~/.cache/refimpl/bench)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each side (default 3)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both (default: all cores)")
    ap.add_argument("--profile", action="store_true", help="also profile one steady-state refimpl run (cProfile)")
    args = ap.parse_args()

    path = bench_file(args.dir)
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    amx = "amx_tile" in flags
    print(f"# time to first token: {path.name} ({path.stat().st_size / MIB:.0f} MiB), prompt {TOKENS}, 1 token")
    print(f"# {cpu_description()}")
    print(f"# date {datetime.date.today().isoformat()}, {args.threads} threads, load average "
          f"{os.getloadavg()[0]:.2f}; llama.cpp use_extra_bufts={'false (the CPU lists AMX: -nr)' if amx else 'true'}")

    with tempfile.TemporaryDirectory(prefix="bench-load-numba-") as empty:  # a first run: nothing cached
        first, stderr = run_refimpl(path, args.threads, numba_cache=empty)
    print(f"refimpl first run      {first:6.2f} s   ({_compiled(stderr) or 'nothing compiled'}; an empty NUMBA_CACHE_DIR)")
    run_refimpl(path, args.threads)  # fills the usual kernel cache if it is cold; warms the page cache
    ref, off, lla, inner = [], [], [], []
    for _ in range(args.rounds):  # alternately, so that both see the same machine load
        ref.append(run_refimpl(path, args.threads)[0])
        off.append(run_refimpl(path, args.threads, prompt=PROMPT)[0])
        wall, t = run_llama(path, args.threads, extra_bufts=not amx)
        lla.append(wall)
        inner.append(t)

    def fmt(xs):
        return f"{statistics.median(xs):6.2f} s   (range {min(xs):.2f}–{max(xs):.2f})"

    def ratio(xs):
        per = [x / y for x, y in zip(xs, lla)]
        return f"{statistics.median(per):5.2f}×  (per round: {', '.join(f'{r:.2f}' for r in per)})"

    print(f"refimpl run --tokens   {fmt(ref)}   {ratio(ref)} of llama.cpp")
    print(f"refimpl run -p TEXT    {fmt(off)}   {ratio(off)} of llama.cpp")
    print(f"llama.cpp process      {fmt(lla)}")
    print(f"  of which load+token  {fmt([t['first_token'] for t in inner])}   (import llama_cpp "
          f"{statistics.median(t['import'] for t in inner):.2f} s)")
    steps = breakdown(path, args.threads)
    print("refimpl's steps (one steady-state run): " + ", ".join(f"{k} {v:.2f} s" for k, v in steps.items()))
    if args.profile:
        profile_refimpl(path, args.threads)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--llama-child":
        sys.exit(_llama_child(sys.argv[2], int(sys.argv[3]), bool(int(sys.argv[4]))))
    if len(sys.argv) > 1 and sys.argv[1] == "--breakdown-child":
        sys.exit(_breakdown_child(sys.argv[2]))
    sys.exit(main())
