"""libggml (the CPU backend shipped with llama-cpp-python) through ctypes, for single-op tests.

``load_ggml(extra)`` opens ``libggml-base`` and ``libggml-cpu`` (from ``$LLAMA_CPP_LIB_PATH`` when
set, as llama-cpp-python itself does, else the package's ``lib/``: :func:`lib_dir`), declares the functions every
single-op graph needs plus ``extra`` (``[(library "base"|"cpu", name, restype, argtypes)]``), calls
``ggml_cpu_init`` and returns ``(base, cpu)``. ``run_graph(base, cpu, ctx, out, n_threads)`` builds
the forward graph of ``out`` and computes it.
"""

from __future__ import annotations

import ctypes
import os

from conftest import require_llama_cpp


class InitParams(ctypes.Structure):  # ggml.h: struct ggml_init_params
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def lib_dir(llama_cpp) -> str:
    """Where llama-cpp-python loads libllama and libggml* from: ``$LLAMA_CPP_LIB_PATH`` or its ``lib/``."""
    return os.environ.get("LLAMA_CPP_LIB_PATH") or os.path.join(os.path.dirname(llama_cpp.__file__), "lib")


ISA_FLAGS = ["avx", "avx2", "fma", "f16c", "avx_vnni", "avx512", "avx512_vnni", "avx512_bf16", "amx_int8"]


def llama_cpp_isa(llama_cpp) -> str:
    """The x86 instruction sets that libggml-cpu was compiled for (``ggml_cpu_has_*``: compile-time
    flags, so they name the kernels llama.cpp runs), e.g. ``"avx avx2 fma f16c"``."""
    cpu = ctypes.CDLL(os.path.join(lib_dir(llama_cpp), "libggml-cpu.so"))
    return " ".join(f for f in ISA_FLAGS if getattr(cpu, f"ggml_cpu_has_{f}")())


def load_ggml(extra=()):
    libdir = lib_dir(require_llama_cpp())
    libs = {"base": ctypes.CDLL(os.path.join(libdir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL),
            "cpu": ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)}
    vp = ctypes.c_void_p
    for lib, name, res, args in [
        ("base", "ggml_init", vp, [InitParams]),
        ("base", "ggml_new_graph", vp, [vp]),
        ("base", "ggml_build_forward_expand", None, [vp, vp]),
        ("base", "ggml_get_data", vp, [vp]),
        ("base", "ggml_free", None, [vp]),
        ("cpu", "ggml_graph_compute_with_ctx", ctypes.c_int, [vp, vp, ctypes.c_int]),
        ("cpu", "ggml_cpu_init", None, []),
        *extra,
    ]:
        fn = getattr(libs[lib], name)
        fn.restype, fn.argtypes = res, args
    libs["cpu"].ggml_cpu_init()
    return libs["base"], libs["cpu"]


def run_graph(base, cpu, ctx, out, n_threads: int) -> None:
    graph = base.ggml_new_graph(ctx)
    base.ggml_build_forward_expand(graph, out)
    assert cpu.ggml_graph_compute_with_ctx(ctx, graph, n_threads) == 0
