"""Shared test plumbing: the llama.cpp oracle gate and session-cached synthetic GGUF fixtures."""

import os
from pathlib import Path

import pytest


def _require(module: str, package: str, extra: str):
    """Import ``module`` from an optional extra. Outside CI a missing package skips the test; under
    ``CI=true`` it fails it, because CI installs the extra and a test that silently skips there
    never ran."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the machine
        if os.environ.get("CI") == "true":
            pytest.fail(f"{package} is required under CI=true but cannot be imported: {exc}")
        pytest.skip(f"{package} is not installed (pip install -e '.[{extra}]')")


def require_llama_cpp():
    """Import llama_cpp (llama-cpp-python 0.3.36, the ground truth; the ``oracle`` extra)."""
    return _require("llama_cpp", "llama-cpp-python", "oracle")


def require_llama_tool(name: str) -> Path:
    """The path of llama.cpp's command-line tool ``name`` (``llama-perplexity``, ``llama-server``), built by
    ``.ci/build-llama-tools`` into ``$LLAMA_TOOLS_DIR/bin`` (default ``build/llama-tools/bin``). Outside CI a
    missing tool skips the test; under ``CI=true`` it fails it (.ci/run builds the tools first)."""
    root = Path(os.environ.get("LLAMA_TOOLS_DIR") or Path(__file__).resolve().parent.parent / "build" / "llama-tools")
    tool = root / "bin" / name
    if not (tool.is_file() and os.access(tool, os.X_OK)):  # pragma: no cover - depends on the machine
        message = f"{tool} is missing: build it with .ci/build-llama-tools {root}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (required under CI=true)")
        pytest.skip(message)
    return tool


def stored(w):
    """Weight rows' bytes as ``kernels.matmul`` hands them to the kernels: C-contiguous uint8 (N, row bytes),
    read-only — a writable array would compile each kernel it meets once more (numba types the two apart), for
    the tests alone."""
    import numpy as np

    from kernels.base.flags import read_only

    return read_only(np.ascontiguousarray(w).view(np.uint8).reshape(len(w), -1))


def require_distributed():
    """Import distributed (Dask's, the ``cluster`` extra)."""
    return _require("distributed", "distributed", "cluster")


def pytest_configure(config):
    """Import the kernels once in the main process: a numba cache left by other kernel sources is
    cleared there (kernels/base/flags.py), before pytest-xdist's workers start and compile into it. In a
    worker, one numba thread: the workers share the cores (a parallel region's barrier then waits on
    a busy core), and the thread count never changes a bit (docs/numerics.md); the tests that vary it
    set it themselves. No first run's second process (refimpl/cli/compile_ahead.py) beside a test that calls
    ``refimpl run --emulate=ggml`` on a cold cache: tests/test_compile_ahead.py starts it where it is tested."""
    import kernels  # noqa: F401

    os.environ["REFIMPL_COMPILE_AHEAD"] = "0"

    if os.environ.get("PYTEST_XDIST_WORKER"):
        import numba

        numba.set_num_threads(1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most four (each worker holds its own fixtures and compiled
    kernels, ~1.5 GiB)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # Linux; else macOS etc.
    return max(1, min(4, cores or 1))


def pytest_report_header(config):
    """Which CPU paths this run exercises, on both sides (docs/numerics.md, "Which CPU paths were
    exercised"): refimpl's numba target and numpy's SIMD level, and the llama.cpp build under test."""
    import numba
    import numpy as np
    from llvmlite import binding

    features = np._core._multiarray_umath.__cpu_features__
    level = next((v for v in ("X86_V4", "X86_V3", "X86_V2") if features.get(v)), "baseline")
    lines = [f"refimpl: numba target {numba.config.CPU_NAME or binding.get_host_cpu_name()}, numpy SIMD {level}"]
    try:
        import llama_cpp
    except ImportError:
        return lines + ["llama.cpp: not installed"]
    from ggml_graph import build_dir
    from ggml_lib import lib_dir, llama_cpp_isa

    avx2, generic = build_dir("avx2"), build_dir("generic")
    return lines + [f"llama.cpp: {lib_dir(llama_cpp)} ({llama_cpp_isa(llama_cpp)})",
                    f"llama.cpp AVX2-only build (bit-exact op tests): {avx2 if (avx2 / 'libggml-cpu.so').is_file() else 'missing'}",
                    f"llama.cpp generic (no SIMD) build: {generic if (generic / 'libggml-cpu.so').is_file() else 'missing'}"]


@pytest.fixture(scope="session")
def make_fixture(tmp_path_factory):
    """``make_fixture(preset="tiny", quant="f32", seed=0, **options) -> Path``, cached per session."""
    cache = {}
    root = tmp_path_factory.mktemp("fixtures")

    def make(preset="tiny", quant="f32", seed=0, **options):
        key = (preset, quant, seed, tuple(sorted(options.items())))
        from refimpl.fixtures.mixes_iq import LIBGGML_MIXES

        if quant in LIBGGML_MIXES:  # written by libggml's quantizers (refimpl/fixtures/ggml_quant.py)
            require_llama_cpp()
        if key not in cache:
            from refimpl.fixtures import write_fixture

            suffix = "".join(f"-{k}={v}" for k, v in sorted(options.items()))
            path = root / f"{preset}-{quant}-s{seed}{suffix}.gguf"
            write_fixture(path, preset=preset, quant=quant, seed=seed, **options)
            cache[key] = path
        return cache[key]

    return make


@pytest.fixture(scope="module")
def fixture_cache(tmp_path_factory):
    """``$REFIMPL_CACHE`` pointed at one per-session directory while a module runs (built-in
    fixtures are built there once and shared by the golden and audit tests), and one numba thread:
    the thread count never changes a bit (docs/numerics.md), and on these tiny matrices a parallel
    region's start-up costs more than the work, badly so on a loaded machine."""
    import numba

    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    old = os.environ.get("REFIMPL_CACHE")
    os.environ["REFIMPL_CACHE"] = str(tmp_path_factory.getbasetemp() / "refimpl-cache")
    yield Path(os.environ["REFIMPL_CACHE"])
    if old is None:
        os.environ.pop("REFIMPL_CACHE")
    else:
        os.environ["REFIMPL_CACHE"] = old
    numba.set_num_threads(threads)
