"""The first run: numba compiles only the kernels of the model's own weight types, says so on stderr
with one line per kernel (refimpl/cli/compile_report.py), and says nothing when they come from the cache.

The end-to-end test runs ``refimpl run`` on the built-in model (``builtin:kjv``: F32 and Q8_0) twice
against a fresh numba cache directory (``NUMBA_CACHE_DIR``): the first run compiles the kernels of
those two types and of no other, the second loads them. How long the cold run takes
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
from kernels.base.blocks import QT
from refimpl.fixtures.builtin import TRAINED_SPEC, resolve_model
from refimpl.cli.compile_report import compile_report
from refimpl.io.gguf_file import GGUFFile

QUANT_TYPES = [t.name.lower() for t in (QT.F32, QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.MXFP4, QT.F16, QT.BF16, QT.Q5_K, QT.Q2_K)]


def _refimpl(*args, env):
    return subprocess.run([sys.executable, "-m", "refimpl", *args], capture_output=True, text=True, env=env, timeout=900)


def test_cold_then_warm_run_on_the_builtin_model(tmp_path):
    types = list(GGUFFile(resolve_model(TRAINED_SPEC)).bytes_by_qtype())  # the default model's: F32, Q8_0
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), REFIMPL_CACHE=str(tmp_path / "refimpl"))
    args = ("run", "--tokens", "1,2,3", "-n", "3")
    cold = _refimpl(*args, env=env)
    assert cold.returncode == 0, cold.stderr
    assert f"refimpl: compiling kernels for {', '.join(types)} (first run only" in cold.stderr
    compiled = re.findall(r"^refimpl:   \[(\d+)\] (\S+) [\d.]+ s$", cold.stderr, flags=re.M)
    assert compiled and [int(i) for i, _ in compiled] == list(range(1, len(compiled) + 1))
    names = [name for _, name in compiled]
    assert {f"matmul_lanes_{t.lower()}" for t in types} & set(names)
    assert re.search(rf"^refimpl: compiled {len(names)} kernels in [\d.]+ s$", cold.stderr, flags=re.M)
    # only the model's types' kernels: no other type's compiled copy, neither reported nor in numba's cache
    cached = [f for _, _, files in os.walk(tmp_path / "numba") for f in files]
    assert any(f"_{types[-1].lower()}-" in f for f in cached)
    for t in sorted(set(QUANT_TYPES) - {t.lower() for t in types}):
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
    from kernels.lanes import pack as lanes

    k1, k2 = lanes._matmul_lanes(QT.Q8_0), lanes._matmul_lanes(int(QT.Q8_0))
    assert k1 is k2 and k1 is not lanes._matmul_lanes(QT.Q4_K)
    assert k1.py_func.__name__ == "matmul_lanes_q8_0"
    assert lanes._matmul_packed(QT.F32).py_func.__name__ == "matmul_packed_f32"
