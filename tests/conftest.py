"""Shared test plumbing: the llama.cpp oracle gate and session-cached synthetic GGUF fixtures."""

import os
from pathlib import Path

import pytest


def require_llama_cpp():
    """Import llama_cpp (llama-cpp-python 0.3.36, the ground truth).

    Outside CI a missing package skips the test; under ``CI=true`` it fails it, because CI installs
    the ``oracle`` extra and a conformance test that silently skips there never ran.
    """
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the machine
        if os.environ.get("CI") == "true":
            pytest.fail(f"llama-cpp-python is required under CI=true but cannot be imported: {exc}")
        pytest.skip("llama-cpp-python is not installed (pip install -e '.[oracle]')")
    return llama_cpp


def require_distributed():
    """Import distributed (the ``cluster`` extra), skipping outside CI and failing under ``CI=true``
    when it is missing, as :func:`require_llama_cpp` does."""
    try:
        import distributed
    except ImportError as exc:  # pragma: no cover - depends on the machine
        if os.environ.get("CI") == "true":
            pytest.fail(f"distributed is required under CI=true but cannot be imported: {exc}")
        pytest.skip("distributed is not installed (pip install -e '.[cluster]')")
    return distributed


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
