"""Benchmark the quantized matmul kernels: weight-GB/s per type, against gguf + numpy and memory.

    python bench/kernels.py                      # every weight type, matrices larger than L3
    python bench/kernels.py --rows 4096 --cols 2048 --threads 2 --types Q4_K,Q8_0

For each type it times, in the same run and on the same bytes:

* ``kernels.matmul`` (numba, plain mode) for T = 1 on the whole matrix, and T = 4 and T = ``--wide-t``
  (64: the lane kernels' wide path, a prompt's batch) on its first ``--sub-mib`` MiB of rows,
* the same on ``kernels.pack(matrix)`` (the lane kernels' gather-free layout) for T = 1 on the whole
  matrix — the steady state of a model loaded with ``pack=True``,
* ``kernels.matmul(act_quant=True)`` for T = 1 and T = 4 (first ``--sub-mib`` MiB),
* the baseline ``gguf.quants.dequantize`` + numpy ``x @ W.T`` (float32 BLAS) for T = 1 and 4 — on
  the first ``--baseline-mib`` MiB of rows only, since it materialises the float32 matrix,

and reports weight bytes per second (matrix bytes / time of one call; best of ``--reps``). It also
measures this machine's read bandwidth (a sum over an array larger than L3, with numpy on one
thread and with numba on ``--threads``; the larger is used) and prints the single-row (T = 1)
numba rates, raw and packed, as a percentage of it; the header names the CPU, its SIMD flags and
the level the lane kernels are compiled for (``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=…`` runs
the AVX2 code on an AVX-512 host). By default each matrix is sized just above the L3 cache (from
``/sys/devices/system/cpu/cpu0/cache``), so it streams from DRAM, with ``--cols`` = 2048 (the
35B-A3B model's hidden size).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numba  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402

import kernels  # noqa: E402
from bench._common import cpu_description  # noqa: E402
from kernels.base.blocks import weight_layout  # noqa: E402
from kernels.testing import random_rows, set_scales  # noqa: E402

MIB = 1 << 20


def l3_bytes() -> int | None:
    """Size of the largest cache level seen by cpu0 (sysfs), or None."""
    best = None
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
        value = int(size.rstrip("KMG")) * mult
        best = max(best or 0, value)
    return best


def best_time(fn, reps: int, warm: bool = False) -> float:
    if warm:
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


@numba.njit(parallel=True, cache=True)
def _parallel_sum(a):
    total = 0.0
    for i in numba.prange(a.size):
        total += a[i]
    return total


def read_bandwidth(nbytes: int, reps: int) -> tuple[float, float]:
    """(numpy 1-thread, numba n-thread) GB/s of summing a float64 array of ``nbytes``."""
    a = np.ones(nbytes // 8)
    numpy_rate = a.nbytes / best_time(lambda: a.sum(), reps, warm=True) / 1e9
    numba_rate = a.nbytes / best_time(lambda: _parallel_sum(a), reps, warm=True) / 1e9
    return numpy_rate, numba_rate


def weight_matrix(buffer: np.ndarray, qtype, cols: int, rows: int | None, rng) -> np.ndarray:
    """A (rows, row bytes) view of the shared random ``buffer``, made a plausible ``qtype`` matrix.

    Quantized types get realistic f16 scales (``kernels.testing.set_scales``); F32/F16/BF16 get
    their exponent bits forced into a normal range. Random bytes alone would hit inf/NaN/denormal
    arithmetic, which runs on slow paths.
    """
    cls = weight_layout(qtype)
    row_bytes = cols // cls.block_size * cls.type_size
    n_rows = min(rows or buffer.size // row_bytes, buffer.size // row_bytes)
    w = buffer[: n_rows * row_bytes].reshape(n_rows, row_bytes)
    if qtype == QT.F32:
        u = w.view(np.uint32)
        u &= np.uint32(0x807FFFFF)
        u |= np.uint32(124 << 23)  # |x| in [2**-3, 2**-2)
    elif qtype == QT.F16:
        u = w.view(np.uint16)
        u &= np.uint16(0x83FF)
        u |= np.uint16(12 << 10)
    elif qtype == QT.BF16:
        u = w.view(np.uint16)
        u &= np.uint16(0x807F)
        u |= np.uint16(124 << 7)
    else:
        set_scales(w, qtype, rng)
    return w


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=None, help="weight rows N (default: just above L3 in bytes)")
    p.add_argument("--cols", type=int, default=2048, help="weight columns K (default 2048)")
    p.add_argument("--threads", type=int, default=min(2, numba.config.NUMBA_NUM_THREADS))
    p.add_argument("--types", default=",".join(q.name for q in kernels.WEIGHT_TYPES), help="comma-separated type names")
    p.add_argument("--reps", type=int, default=2, help="timed calls per figure, best kept (default 2)")
    p.add_argument("--sub-mib", type=int, default=32, help="MiB of rows for T=4, the wide T and act_quant (default 32)")
    p.add_argument("--wide-t", type=int, default=64, help="activation rows of the wide-path column (default 64)")
    p.add_argument("--baseline-mib", type=int, default=4, help="MiB of rows for the gguf+numpy baseline (default 4)")
    args = p.parse_args(argv)

    numba.set_num_threads(args.threads)
    types = [QT[name.strip()] for name in args.types.split(",") if name.strip()]
    l3 = l3_bytes()
    target = int(1.1 * l3) if l3 else 512 * MIB
    rng = np.random.default_rng(0)

    np_bw, nb_bw = read_bandwidth(max(2 * (l3 or 0), 1 << 30), args.reps)
    bandwidth = max(np_bw, nb_bw)
    print(f"# {cpu_description()}")
    print(f"# numba threads {args.threads}, L3 {l3 and l3 // MIB} MiB, load average {os.getloadavg()[0]:.1f}")
    print(f"# read bandwidth: numpy sum {np_bw:.1f} GB/s (1 thread), numba sum {nb_bw:.1f} GB/s ({args.threads} threads)")
    print(f"# weight-GB/s = matrix bytes / time per call (best of {args.reps}); K = {args.cols}")
    print()
    head = (
        f"{'type':7s} {'MiB':>5s} | {'numba T=1':>9s} {'T=4':>6s} {f'T={args.wide_t}':>6s} {'packed':>6s} | {'act_q T=1':>9s} {'T=4':>6s} | "
        f"{'gguf+np T=1':>11s} {'T=4':>6s} | {'x T=1':>6s} {'x T=4':>6s} | {'T=1 %bw':>7s} {'packed':>6s}"
    )
    print(head)
    print("-" * len(head))
    n_buffer = args.rows * args.cols * 4 if args.rows else target  # F32 is the widest type
    buffer = rng.integers(0, 256, n_buffer, dtype=np.uint8)
    for qtype in types:
        w = weight_matrix(buffer, qtype, args.cols, args.rows, rng)
        nbytes = w.nbytes
        x1 = rng.standard_normal((1, args.cols)).astype(np.float32)
        x4 = rng.standard_normal((4, args.cols)).astype(np.float32)
        xw = rng.standard_normal((args.wide_t, args.cols)).astype(np.float32)
        tiny = random_rows(qtype, 8, args.cols, rng)  # compile / load from the cache off the clock
        gguf_quants.dequantize(tiny, qtype)
        kernels.matmul(tiny, qtype, x4)
        kernels.matmul(tiny, qtype, xw)
        kernels.matmul(tiny, qtype, x4, act_quant=True)
        # T=1 plain on the whole matrix (the DRAM-streaming figure); the rest on its first rows
        sub = w[: max(1, min(w.shape[0], (args.sub_mib * MIB) // w.shape[1]))]
        base = w[: max(1, min(w.shape[0], (args.baseline_mib * MIB) // w.shape[1]))]
        rate = {("nb", 1): nbytes / best_time(lambda: kernels.matmul(w, qtype, x1), args.reps, warm=True) / 1e9}
        rate["nb", 4] = sub.nbytes / best_time(lambda: kernels.matmul(sub, qtype, x4), args.reps, warm=True) / 1e9
        rate["nb", "w"] = sub.nbytes / best_time(lambda: kernels.matmul(sub, qtype, xw), args.reps, warm=True) / 1e9
        packed = kernels.pack(w, qtype)
        if isinstance(packed, kernels.PackedRows):
            rate["pk", 1] = nbytes / best_time(lambda: kernels.matmul(packed, qtype, x1), args.reps, warm=True) / 1e9
        packed = None  # free the packed copy before the next type
        for T, x in ((1, x1), (4, x4)):
            rate["aq", T] = sub.nbytes / best_time(lambda: kernels.matmul(sub, qtype, x, act_quant=True), args.reps, warm=True) / 1e9

            def baseline(x=x):
                W = gguf_quants.dequantize(base, qtype)
                return x @ W.T

            rate["gg", T] = base.nbytes / best_time(baseline, args.reps) / 1e9
        big = nbytes > (l3 or 0)
        pct = f"{100 * rate['nb', 1] / bandwidth:6.1f}%" if big else "   (L3)"
        pk = f"{rate['pk', 1]:6.2f}" if ("pk", 1) in rate else "     —"
        pk_pct = (f"{100 * rate['pk', 1] / bandwidth:5.1f}%" if big else "  (L3)") if ("pk", 1) in rate else "     —"
        print(
            f"{qtype.name:7s} {nbytes / MIB:5.0f} | {rate['nb', 1]:9.2f} {rate['nb', 4]:6.2f} {rate['nb', 'w']:6.2f} {pk} | "
            f"{rate['aq', 1]:9.2f} {rate['aq', 4]:6.2f} | {rate['gg', 1]:11.3f} {rate['gg', 4]:6.3f} | "
            f"{rate['nb', 1] / rate['gg', 1]:6.1f} {rate['nb', 4] / rate['gg', 4]:6.1f} | {pct} {pk_pct}",
            flush=True,
        )
    print()
    print("# packed: numba plain T=1 on kernels.pack(matrix) (the rate counts the original matrix bytes).")
    print(f"# T={args.wide_t}: the wide path (each block decoded once for the whole batch); multiply by {args.wide_t} for")
    print("# weight-GB/s per activation row. x T=1 / x T=4: numba plain rate / gguf+numpy rate.")
    print("# %bw: numba plain T=1 (raw, packed) / read bandwidth")
    print("# (only for matrices larger than L3; '(L3)' marks a matrix that fits in the cache).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
