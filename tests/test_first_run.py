"""The first run: numba compiles only the kernels of the model's own weight types, says so on stderr
with one line per kernel (refimpl/compile_report.py), and says nothing when they come from the cache.

The end-to-end test runs ``refimpl run`` on the built-in synthetic F32 model (``builtin:tiny``) twice against a fresh numba cache
directory (``NUMBA_CACHE_DIR``): the first run compiles, the second loads. How long the cold run takes
depends on the CPU, so it is measured and documented (docs/performance.md, "First run"), not asserted.
"""

import io
import os
import re
import subprocess
import sys

import numba
import numpy as np

import kernels
from kernels.blocks import QT
from refimpl.compile_report import compile_report

QUANT_TYPES = [t.name.lower() for t in (QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.MXFP4, QT.F16, QT.BF16, QT.Q5_K, QT.Q2_K)]


def _refimpl(*args, env):
    return subprocess.run([sys.executable, "-m", "refimpl", *args], capture_output=True, text=True, env=env, timeout=900)


def test_cold_then_warm_run_on_the_builtin_synthetic_model(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), REFIMPL_CACHE=str(tmp_path / "refimpl"))
    args = ("run", "builtin:tiny", "--tokens", "1,2,3", "-n", "3")  # an all-F32 file: F32's kernels alone
    cold = _refimpl(*args, env=env)
    assert cold.returncode == 0, cold.stderr
    assert "refimpl: compiling kernels for F32 (first run only" in cold.stderr
    compiled = re.findall(r"^refimpl:   \[(\d+)\] (\S+) [\d.]+ s$", cold.stderr, flags=re.M)
    assert compiled and [int(i) for i, _ in compiled] == list(range(1, len(compiled) + 1))
    names = [name for _, name in compiled]
    assert "matmul_lanes_f32" in names or "matmul_packed_f32" in names
    assert re.search(rf"^refimpl: compiled {len(names)} kernels in [\d.]+ s$", cold.stderr, flags=re.M)
    # only F32's kernels: no other type's compiled copy, neither reported nor in numba's cache directory
    cached = [f for _, _, files in os.walk(tmp_path / "numba") for f in files]
    assert any("_f32-" in f for f in cached)
    for t in QUANT_TYPES:
        assert not any(name.endswith(f"_{t}") for name in names), names
        assert not any(f"_{t}-" in f for f in cached), t

    warm = _refimpl(*args, env=env)
    assert warm.returncode == 0, warm.stderr
    assert "compil" not in warm.stderr  # everything loaded from the cache: not a word about compiling
    assert warm.stdout == cold.stdout


def test_report_only_when_something_compiles():
    @numba.njit  # a new function: never cached, so calling it compiles
    def fresh(x):
        return x + 1

    def reported(*calls, types=()):
        stream = io.StringIO()
        with compile_report(stream) as report:
            report.types = list(types)
            for x in calls:
                fresh(x)
        return stream.getvalue().splitlines()

    lines = reported(1, 2, types=["F32", "Q8_0"])  # fresh(2): compiled already, no line
    assert lines[0] == "refimpl: compiling kernels for F32, Q8_0 (first run only; numba caches them for the next runs) …"
    assert re.fullmatch(r"refimpl:   \[1\] fresh [\d.]+ s", lines[1])
    assert re.fullmatch(r"refimpl: compiled 1 kernel in [\d.]+ s", lines[2])
    assert len(lines) == 3

    lines = reported(2.5)  # a new signature: compiles; no model named, no types in the header
    assert lines[0] == "refimpl: compiling kernels (first run only; numba caches them for the next runs) …"
    assert len(lines) == 3

    assert reported(3, 3.5) == []  # nothing compiled, nothing said


def test_kernels_are_compiled_per_type():
    """A type-specific kernel is one function per type code, built on first use (its name says which);
    that it compiles that type's code only is what the cold-run test checks."""
    from kernels import lanes

    k1, k2 = lanes._matmul_lanes(QT.Q8_0), lanes._matmul_lanes(int(QT.Q8_0))
    assert k1 is k2 and k1 is not lanes._matmul_lanes(QT.Q4_K)
    assert k1.py_func.__name__ == "matmul_lanes_q8_0"
    assert lanes._matmul_packed(QT.F32).py_func.__name__ == "matmul_packed_f32"
