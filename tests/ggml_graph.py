"""One-op ggml graphs through ctypes, on a named libggml build, for the bit-exact op tests.

Two builds of the same vendored source are compared against:

* ``native``: the libggml llama-cpp-python loads (``$LLAMA_CPP_LIB_PATH`` or its ``lib/``), built for this
  host's ISA (AVX-512 on the CI hosts so far);
* ``avx2``: the AVX2-only shared libraries ``.ci/build-llama-tools`` builds with ``GGML_NATIVE=OFF`` into
  ``$LLAMA_TOOLS_DIR/ggml-avx2/lib``.

One process can hold only one of them (libggml-cpu finds libggml-base by its soname), so :func:`on_build`
runs the graph function in-process for the build this process loaded, and in a spawned worker process with
``LLAMA_CPP_LIB_PATH`` pointing at the other build's folder otherwise. Graph functions are module-level
functions (picklable) that use :class:`Graph`; they take and return numpy arrays.
"""

from __future__ import annotations

import ctypes
import functools
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

vp, i64 = ctypes.c_void_p, ctypes.c_int64
F32, F16, I32 = 0, 1, 26  # ggml.h: enum ggml_type


class InitParams(ctypes.Structure):  # ggml.h: struct ggml_init_params
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def build_dir(build: str) -> Path | None:
    """The folder of ``build``'s libraries (None: the one llama-cpp-python loads by default)."""
    if build == "native":
        return None
    if build.startswith("arm64-"):
        import arm64

        return arm64.lib_dir(build)
    root = Path(os.environ.get("LLAMA_TOOLS_DIR") or Path(__file__).resolve().parent.parent / "build" / "llama-tools")
    return root / f"ggml-{build}" / "lib"  # avx2, avx2-zen, generic: .ci/build-llama-tools


def require_build(build: str) -> None:
    """Skip (fail under ``CI=true``) when ``build``'s libraries are missing."""
    import pytest
    from conftest import require_llama_cpp

    if build.startswith("arm64-"):
        import arm64

        return arm64.require(build)

    require_llama_cpp()
    d = build_dir(build)
    if d is not None and not (d / "libggml-cpu.so").is_file():  # pragma: no cover - depends on the machine
        message = f"{d} is missing: build it with .ci/build-llama-tools"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (required under CI=true)")
        pytest.skip(message)


@functools.cache
def _libs():
    """(base, cpu) of the build this process loads: ``$LLAMA_CPP_LIB_PATH`` or llama-cpp-python's ``lib/``."""
    d = Path(os.environ["LLAMA_CPP_LIB_PATH"]) if os.environ.get("LLAMA_CPP_LIB_PATH") else _native_dir()
    base = ctypes.CDLL(str(d / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(d / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    for lib, name, res, args in [
        (base, "ggml_init", vp, [InitParams]),
        (base, "ggml_new_tensor", vp, [vp, ctypes.c_int, ctypes.c_int, ctypes.POINTER(i64)]),
        (base, "ggml_new_graph", vp, [vp]),
        (base, "ggml_build_forward_expand", None, [vp, vp]),
        (base, "ggml_get_data", vp, [vp]),
        (base, "ggml_nbytes", ctypes.c_size_t, [vp]),
        (base, "ggml_free", None, [vp]),
        (cpu, "ggml_graph_compute_with_ctx", ctypes.c_int, [vp, vp, ctypes.c_int]),
        (cpu, "ggml_cpu_init", None, []),
        (cpu, "ggml_backend_cpu_reg", vp, []),
        (base, "ggml_backend_reg_dev_get", vp, [vp, ctypes.c_size_t]),
        (base, "ggml_backend_reg_get_proc_address", vp, [vp, ctypes.c_char_p]),
        (base, "ggml_backend_buft_name", ctypes.c_char_p, [vp]),
        (base, "ggml_backend_buft_alloc_buffer", vp, [vp, ctypes.c_size_t]),
        (base, "ggml_backend_buffer_get_base", vp, [vp]),
        (base, "ggml_backend_buffer_free", None, [vp]),
        (base, "ggml_backend_tensor_alloc", ctypes.c_int, [vp, vp, vp]),
        (base, "ggml_backend_tensor_set", None, [vp, vp, ctypes.c_size_t, ctypes.c_size_t]),
    ]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    cpu.ggml_cpu_init()
    return base, cpu


@functools.cache
def repack_buffer_type():
    """The CPU backend's ``CPU_REPACK`` buffer type (``ggml-cpu.cpp: ggml_backend_cpu_get_extra_buffer_types``,
    through the registry's ``ggml_backend_dev_get_extra_bufts``), or None when this build has none."""
    base, cpu = _libs()
    reg = cpu.ggml_backend_cpu_reg()
    dev = base.ggml_backend_reg_dev_get(reg, 0)
    fn = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    if not fn:  # pragma: no cover - depends on the build
        return None
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(vp), vp)(fn)(dev)
    i = 0
    while bufts[i]:
        if base.ggml_backend_buft_name(bufts[i]) == b"CPU_REPACK":
            return bufts[i]
        i += 1
    return None  # pragma: no cover - depends on the build


class Graph:
    """A ggml context for one small graph: tensors from numpy arrays, ops by name, compute, read back.

    ``g.op("ggml_rms_norm", [vp, vp, ctypes.c_float], a, 1e-6)`` declares the function on first use (the
    context is passed first, implicitly) and returns the result tensor."""

    def __init__(self, mem: int = 64 << 20):
        self.base, self.cpu = _libs()
        self.ctx = self.base.ggml_init(InitParams(mem, None, False))
        self._meta, self._buffers = None, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for buf in self._buffers:
            self.base.ggml_backend_buffer_free(buf)
        if self._meta:
            self.base.ggml_free(self._meta)
        self.base.ggml_free(self.ctx)

    def repacked(self, a: np.ndarray, gtype: int, ne: tuple[int, ...]):
        """A weight tensor (quantized rows ``a``, ggml shape ``ne``) in the ``CPU_REPACK`` buffer, as llama.cpp
        loads a weight by default: ``ggml_backend_tensor_alloc`` runs the buffer's ``init_tensor`` (which picks
        the tensor's repack traits, ``repack.cpp: ggml_repack_get_optimal_repack_type``), and
        ``ggml_backend_tensor_set`` re-lays the rows out into interleaved blocks. A mul_mat / mul_mat_id on it
        then runs the repacked gemm/gemv (``ggml_cpu_extra_compute_forward``). Raises when this build does not
        repack ``gtype`` at this shape (nothing would be repacked: the test would prove nothing)."""
        a = np.ascontiguousarray(a)
        buft = repack_buffer_type()
        if buft is None:  # pragma: no cover - depends on the build
            raise RuntimeError("this libggml has no CPU_REPACK buffer type")
        if self._meta is None:
            self._meta = self.base.ggml_init(InitParams(1 << 20, None, True))
        t = self.base.ggml_new_tensor(self._meta, gtype, len(ne), (i64 * len(ne))(*ne))
        assert self.base.ggml_nbytes(t) == a.nbytes, (ne, a.nbytes)
        buf = self.base.ggml_backend_buft_alloc_buffer(buft, a.nbytes + 4096)
        self._buffers.append(buf)
        assert self.base.ggml_backend_tensor_alloc(buf, t, self.base.ggml_backend_buffer_get_base(buf)) == 0
        if not _tensor_extra(t):
            raise ValueError(f"CPU_REPACK does not repack ggml type {gtype} of shape {ne} on this build")
        self.base.ggml_backend_tensor_set(t, a.ctypes.data, 0, a.nbytes)
        return t

    def tensor(self, a: np.ndarray, gtype: int | None = None, ne: tuple[int, ...] | None = None):
        """A tensor holding ``a``'s bytes. ggml's ne is numpy's shape reversed (ne[0] = the last axis), unless
        ``ne`` is given (quantized rows: ``a`` is bytes); the type follows the dtype unless ``gtype`` is given."""
        a = np.ascontiguousarray(a)
        if gtype is None:
            gtype = {np.dtype(np.float32): F32, np.dtype(np.float16): F16, np.dtype(np.int32): I32}[a.dtype]
        ne = ne or tuple(reversed(a.shape)) or (1,)
        t = self.base.ggml_new_tensor(self.ctx, gtype, len(ne), (i64 * len(ne))(*ne))
        assert self.base.ggml_nbytes(t) == a.nbytes, (ne, a.nbytes)
        ctypes.memmove(self.base.ggml_get_data(t), a.ctypes.data, a.nbytes)
        return t

    def op(self, name: str, argtypes: list, *args, lib: str = "base"):
        fn = getattr(self.base if lib == "base" else self.cpu, name)
        fn.restype, fn.argtypes = vp, [vp] + list(argtypes)
        return fn(self.ctx, *args)

    def compute(self, out, shape: tuple[int, ...], dtype=np.float32, n_threads: int = 1) -> np.ndarray:
        """Compute ``out``'s graph with ``n_threads`` and return its data as a numpy array of ``shape``."""
        graph = self.base.ggml_new_graph(self.ctx)
        self.base.ggml_build_forward_expand(graph, out)
        assert self.cpu.ggml_graph_compute_with_ctx(self.ctx, graph, n_threads) == 0
        y = np.empty(shape, dtype)
        assert self.base.ggml_nbytes(out) == y.nbytes, (shape, self.base.ggml_nbytes(out))
        ctypes.memmove(y.ctypes.data, self.base.ggml_get_data(out), y.nbytes)
        return y


def _tensor_extra(t) -> int:
    """``tensor->extra`` (ggml.h: struct ggml_tensor; the repack traits when the buffer chose some)."""
    # type, buffer, ne[4], nb[4], op, op_params[16 int32], flags, src[10], view_src, view_offs, data, name[64], extra
    off = 8 + 8 + 8 * 4 + 8 * 4 + 4 + 4 * 16 + 4 + 8 * 10 + 8 + 8 + 8 + 64
    return ctypes.c_void_p.from_address(t + off).value or 0


@functools.cache
def _worker(directory: str) -> ProcessPoolExecutor:
    env = dict(os.environ)
    os.environ["LLAMA_CPP_LIB_PATH"] = directory  # inherited by the spawned worker only
    try:
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        pool.submit(int).result()  # start it now, while the variable is set
    finally:
        os.environ.clear()
        os.environ.update(env)
    return pool


def on_build(build: str, fn, *args):
    """``fn(*args)`` computed with ``build``'s libggml (``native``, ``avx2``, ``generic``, or an ARM build under
    qemu: tests/arm64.py)."""
    if build.startswith("arm64-"):
        import arm64

        return arm64.call(build, fn, *args)
    require_build(build)
    d = build_dir(build)
    if d is None:
        d = _native_dir()
    from kernels.ggml.build import lib_dir

    if Path(d).resolve() == lib_dir().resolve():
        return fn(*args)
    return _worker(str(d)).submit(fn, *args).result()


@functools.cache
def _native_dir() -> Path:
    import llama_cpp

    return Path(llama_cpp.__file__).parent / "lib"


BUILDS = ["native", "avx2"]
#: and ggml's generic x86 path (no SIMD: docs/ggml-generic-x86.md), for the ops emulated on it so far
WITH_GENERIC = BUILDS + ["generic"]
#: the AVX2 build with GCC tuned for AMD Zen (.ci/build-llama-tools: -mtune=znver3; path avx2-zen): it differs from the
#: avx2 build in MXFP4's and IQ4_NL's odd tail only (kernels.ggml.tuning), so only their tests and the path tests run it
ZEN = "avx2-zen"
X86_BUILDS = WITH_GENERIC + [ZEN]


@functools.cache
def build_info(build: str):
    """The :class:`kernels.ggml.build.GgmlBuild` of ``build``."""
    from kernels.ggml.build import detect

    require_build(build)
    if build.startswith("arm64-"):  # read, not loaded; an SVE build at the vector length qemu gives it here
        import arm64

        return detect(build_dir(build), sve_bits=arm64.sve_bits(build))
    return detect(build_dir(build) or _native_dir())


def both_paths() -> bool:
    """Whether the two builds take different ggml-cpu paths: the native one is AVX-512. On an AVX2-only host
    llama-cpp-python's native build is itself an AVX2 build (and an AVX-512 library cannot run there), so a
    comparison of the two libraries that expects different bits has nothing to compare; the emulation's own
    paths (pure software) can still be compared with each other on any host."""
    return build_info("native").lanes != build_info("avx2").lanes  # (an AVX2 native build may differ from the AVX2
    # one by GCC's tuning alone: kernels.ggml.tuning; the tests of that compare the paths themselves)


def require_both_paths() -> None:
    """Skip a test that compares the AVX-512 library with the AVX2 one on a host without AVX-512 (no
    AVX-512 libggml can run there), naming the reason."""
    if not both_paths():  # pragma: no cover - depends on the machine
        import pytest

        pytest.skip("this host's llama.cpp build is AVX2 (no AVX-512): only one ggml-cpu path can run here")
