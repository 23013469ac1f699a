"""What the benchmarks share: byte units, this process's peak RSS, the prompt, and measuring in a
fresh child process.

bench/full.py and bench/streamer.py run every configuration in a child (``python SCRIPT --child …``)
so that its peak RSS is its own — Linux carries a parent's peak into a (v)forked child's ru_maxrss —
and read back the one JSON line the child prints last. Imported as ``bench._common`` (each script
puts the repository root on ``sys.path``).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

MIB = 1 << 20
GIB = 1 << 30


def peak_rss() -> int:
    """This process's peak RSS so far (``resource.getrusage`` ru_maxrss), bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def vm_hwm() -> int | None:
    """This process's own peak RSS (VmHWM of /proc/self/status), bytes; a cross-check of ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None


def random_prompt(n: int) -> list[int]:
    """The benchmarks' prompt: ``n`` token ids drawn from [0, 390) by a generator seeded with 1."""
    import numpy as np  # here, not at the top: a measuring parent stays small (see above)

    return [int(t) for t in np.random.default_rng(1).integers(0, 390, size=n)]


def run_child(script: str, argv: list[str], what: str) -> dict:
    """Run ``python SCRIPT --child ARGV…`` and return the JSON object on the last line of its stdout;
    exit with the tail of its stderr (naming the run as ``what``) if it fails."""
    proc = subprocess.run([sys.executable, script, "--child", *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({what}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "asimd", "sve")


def cpu_description() -> str:
    """One line for a benchmark's header: the CPU model (``/proc/cpuinfo``), its logical cores, the SIMD
    flags that matter here (AVX2, AVX-512, VNNI, AMX; ARM's ASIMD/SVE), and the level the lane kernels
    are compiled for (``kernels.lanes.ir.ISA``, of the numba target: ``NUMBA_CPU_NAME`` /
    ``NUMBA_CPU_FEATURES`` emulate another CPU's code)."""
    import os

    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "Hardware") and model == "unknown CPU":
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    from llvmlite import binding as llvm_binding

    from kernels.lanes.ir import ISA, ISA_NAMES

    model += f" (LLVM: {llvm_binding.get_host_cpu_name()})"
    have = " ".join(f for f in ISA_FLAGS if f in flags) or "none of " + "/".join(ISA_FLAGS[:4])
    target = os.environ.get("NUMBA_CPU_NAME", "host")
    return (f"cpu: {model}, {os.cpu_count()} logical cores; flags: {have}; "
            f"lane kernels: {ISA_NAMES[ISA]} (numba target {target})")
