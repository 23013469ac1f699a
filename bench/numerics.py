"""Speed of each numerics on one model: the definition, ``--emulate[=CONFIG]`` and ``--emulate=ggml[:PATH]``.

    NUMBA_NUM_THREADS=1 python bench/numerics.py none default plain ggml:avx512 ggml:avx2 ggml:generic
    NUMBA_NUM_THREADS=1 python bench/numerics.py --model builtin:tiny/q4_k_m --pp 256 none default ggml:avx2

Each argument is a value of ``--emulate`` (``none``: no ``--emulate``, the definition). The model is loaded and the
numerics chosen as ``refimpl run`` does (``refimpl.cli.common.ctx_from_args`` and ``load``, packed), then
``refimpl.model.trunk.forward`` is timed: ``--n`` single-token decode steps after a 5-token prompt (the first 5
not counted; median and minimum), and with ``--pp N`` one N-token prompt from an empty state, logits of the last
position only (median of 3). One numba thread keeps a shared machine's load out of the parallel kernels' timings.
The figures of docs/numerics.md, "Three numerics, and when to use which", come from this script.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure(model: str, emulate: str, n: int, pp: int) -> str:
    import numpy as np

    from refimpl.cli import build_parser, common
    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward

    args = build_parser().parse_args(["run", model] + ([] if emulate == "none" else [f"--emulate={emulate}"]))
    ctx = common.ctx_from_args(args)
    m = common.load(args, pack=True, ggml=(ctx.ggml, ctx.repack) if ctx.ggml else None)
    line = ""
    if pp:
        ids = [int(t) for t in np.random.default_rng(0).integers(3, m.config.n_vocab, size=pp)]
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            forward(m, SeqState.fresh(m.config), ids, ctx, outputs="last")
            times.append(time.perf_counter() - t0)
        line = f"; {pp}-token prompt {statistics.median(times):.3f} s"
    logits, _, st = forward(m, SeqState.fresh(m.config), [1, 2, 3, 4, 5], ctx)
    tok, steps = int(np.argmax(logits[-1])), []
    for _ in range(n + 5):
        t0 = time.perf_counter()
        logits, _, st = forward(m, st, [tok], ctx)
        steps.append(time.perf_counter() - t0)
        tok = int(np.argmax(logits[-1]))
    steps = steps[5:]
    return (f"{model} --emulate={emulate}: decode {1000 * statistics.median(steps):.2f} ms/token median, "
            f"{1000 * min(steps):.2f} min ({n} steps){line}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("emulate", nargs="+", help="none, or a value of --emulate (default, plain, ggml, ggml:avx2, …)")
    p.add_argument("--model", default="builtin:kjv")
    p.add_argument("--n", type=int, default=95, help="decode steps timed (default 95)")
    p.add_argument("--pp", type=int, default=0, help="also time one prompt of this many tokens (default 0: not)")
    a = p.parse_args()
    print(f"NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS', '(default)')}; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    for emulate in a.emulate:
        print(measure(a.model, emulate, a.n, a.pp), flush=True)


if __name__ == "__main__":
    main()
