"""Throughput of ``refimpl golden make`` with --jobs 1, --jobs 2 and a 2-worker Dask LocalCluster.

    python bench/cluster.py                                   # tiny q8_0, 8 prompts x 32 tokens, 3 rounds
    python bench/cluster.py --model builtin:predictable/q8_0 --prompts 16 --n 64 --rounds 5
    python bench/cluster.py --model MODEL.gguf --workers 1,2  # any GGUF; LocalClusters of 1 and 2 workers
    python bench/cluster.py --workers 1,2 --worker-threads 1  # 1 vs 2 single-thread workers

Every configuration makes the same golden file (same prompts, same ``--out``) through
:func:`refimpl.oracle.golden.make_golden`, the function behind the command, and the bytes are compared:

* ``--jobs 1`` — this process, numba with all ``os.cpu_count()`` threads (what the command does by
  default), and ``--jobs 1, 1 thr`` with one numba thread (``NUMBA_NUM_THREADS=1``): on small
  matrices and a busy machine a parallel region's start-up can cost more than its work;
* ``--jobs 2`` — two spawned processes, ⌊threads / 2⌋ numba threads each; every run pays their
  start-up and model load (that is what ``--jobs`` does);
* ``cluster Wx1`` — ``--cluster`` on a ``distributed.LocalCluster`` of W worker processes × 1 Dask
  thread, started once before the rounds, with ``NUMBA_NUM_THREADS`` = ⌊cores / W⌋ per worker (the
  docs/cluster.md recipe; ``--worker-threads T`` sets T instead, e.g. 1 to see process scaling
  alone). Its workers keep the model between runs (per-process cache), so after the
  untimed first run (printed as ``cold``: worker start-up is not in it, model load is) the rounds
  measure a standing cluster.

Rounds interleave the configurations (round r of each runs back to back), so they see the same
machine load; each figure is the median [min–max] over rounds of prompts/s, and the ratio to
``--jobs 1`` is formed per round. The machine may be shared: the load average before and after is
printed.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402


def write_prompts(path: Path, n_prompts: int, length: int) -> None:
    """``n_prompts`` prompts of ``length`` token ids from [0, 390), prompt i drawn by a generator seeded with i."""
    import json

    lines = [json.dumps({"tokens": [int(t) for t in np.random.default_rng(i).integers(0, 390, size=length)]})
             for i in range(n_prompts)]
    path.write_text("\n".join(lines) + "\n")


def _range(xs) -> str:
    m = statistics.median(xs)
    fmt = ".1f" if m >= 10 else ".2f" if m >= 1 else ".3f"
    return f"{m:{fmt}} [{min(xs):{fmt}}–{max(xs):{fmt}}]"


def cpu_line() -> str:
    """The CPU model and its widest x86 vector ISA, from /proc/cpuinfo (every figure names its machine)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{os.cpu_count()} cores"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name}, {isa}, {os.cpu_count()} cores"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny/q8_0", help="a GGUF or builtin:PRESET/QUANT (default builtin:tiny/q8_0)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per golden file (default 8)")
    ap.add_argument("--prompt-len", type=int, default=8)
    ap.add_argument("--n", type=int, default=32, help="tokens per prompt (default 32)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="2", help="LocalCluster sizes to time, comma-separated (default 2)")
    ap.add_argument("--worker-threads", type=int, metavar="T",
                    help="numba threads per cluster worker (default: cores // workers, the docs/cluster.md recipe)")
    args = ap.parse_args(argv)

    import distributed
    import numba

    from refimpl.oracle.golden import Settings, make_golden, resolve_model

    logging.getLogger("distributed").setLevel(logging.ERROR)  # the in-process scheduler's start/stop chatter
    cores = os.cpu_count() or 1
    settings = Settings(args.n)
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    prompts, out = work / "prompts.jsonl", work / "bench.golden.jsonl"
    write_prompts(prompts, args.prompts, args.prompt_len)
    resolve_model(args.model)  # a builtin fixture is built now, not in a timed run

    def make(threads: int = cores, **kw) -> tuple[float, bytes]:
        numba.set_num_threads(threads)  # this process's (--jobs 1); --jobs 2 gives its children cores // 2
        t = time.perf_counter()
        make_golden(args.model, str(prompts), settings, str(out), **kw)
        dt = time.perf_counter() - t
        numba.set_num_threads(cores)
        return dt, out.read_bytes()

    load0 = os.getloadavg()
    print(f"# {cpu_line()}; {args.model}, {args.prompts} prompts x {args.n} tokens (prompt {args.prompt_len} ids), "
          f"{args.rounds} rounds; load average {load0[0]:.2f}", flush=True)
    clusters, configs = [], {  # name: (make_golden's keyword arguments, numba threads per process)
        "--jobs 1": ({"jobs": 1}, cores), "--jobs 1, 1 thr": ({"jobs": 1}, 1), "--jobs 2": ({"jobs": 2}, max(1, cores // 2))}
    for w in (int(x) for x in args.workers.split(",")):
        threads = args.worker_threads or max(1, cores // w)
        clusters.append(distributed.LocalCluster(
            n_workers=w, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=logging.ERROR,
            env={"NUMBA_NUM_THREADS": str(threads), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}))
        configs[f"cluster {w}x1"] = ({"cluster": clusters[-1].scheduler_address}, threads)
    try:
        _, reference = make(jobs=1)  # warm: numba's cache loaded, pages touched
        cold = {}
        for name, (kw, _) in configs.items():
            if "cluster" in kw:
                cold[name], data = make(**kw)  # each worker opens the model on its first prompt
                assert data == reference, f"{name}: bytes differ from --jobs 1"
        times = {name: [] for name in configs}
        for r in range(args.rounds):
            for name, (kw, threads) in configs.items():
                dt, data = make(threads, **kw)
                assert data == reference, f"{name}: bytes differ from --jobs 1"
                times[name].append(dt)
            print(f"  round {r + 1}: " + ", ".join(f"{n} {args.prompts / times[n][-1]:.2f}" for n in configs) + " prompts/s",
                  file=sys.stderr, flush=True)
    finally:
        for c in clusters:
            c.close()
    print()
    hdr = (f"{'configuration':<16} | {'numba threads':>13} | {'prompts/s':>20} | {'/ --jobs 1':>20} | "
           f"{'cold first run s':>16} | same bytes")
    print(hdr)
    print("-" * len(hdr))
    for name in configs:
        rate = [args.prompts / t for t in times[name]]
        ratio = [a / b for a, b in zip(times["--jobs 1"], times[name])]
        kw, threads = configs[name]
        each = f"{threads}" + (" each" if kw.get("jobs") != 1 else "")
        first = f"{cold[name]:.1f}" if name in cold else "—"
        print(f"{name:<16} | {each:>13} | {_range(rate):>20} | {_range(ratio):>20} | {first:>16} | yes")
    load1 = os.getloadavg()
    print(f"\n# median [min–max] over rounds; ratio per round (--jobs 1 time / this time). --jobs 2 starts its processes "
          f"and loads the model every run; a cluster's workers keep it ('cold': its first run). "
          f"Load average {load0[0]:.2f} before, {load1[0]:.2f} after.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
