"""Which libggml-cpu llama.cpp runs here, and which of its code paths the bit-exact emulation follows.

ggml-cpu picks its SIMD code at *compile* time (``#if defined(__AVX512F__)`` … in ``simd-mappings.h``,
``vec.h``, ``arch/x86/quants.c``), so the path of every op is a property of the library, not of the host:
an AVX2-only build runs its AVX2 kernels on an AVX-512 machine. ``ggml_cpu_has_<feature>()`` reports exactly
those compile-time flags (``ggml-cpu.c``), and :func:`detect` reads them from the library that
llama-cpp-python loads: ``$LLAMA_CPP_LIB_PATH`` when set (``llama_cpp/llama_cpp.py`` reads the same
variable), else the package's ``lib/`` folder.

:data:`EMULATED_PATHS` is the one table of the paths that are emulated — key, name, float32 lanes and the
compile-time features that select it; ``GgmlBuild.path``, ``describe()``, ``refimpl.model.ops`` (``Ctx.ggml``,
its report line) and ``kernels.ggml.simd`` (``lanes``, ``check_path``) all read it, and tests/test_ggml_paths_cli.py
runs every command on each entry. :class:`GgmlBuild` names the path and refuses, in one line, a library whose
kernels are not emulated — ARM NEON/SVE, AMX, RISC-V, POWER, s390x, a pre-AVX2 x86 build, or a GPU backend
beside the CPU one — rather than approximating it. ``"generic"`` is ggml's generic x86 path: a build without any
SIMD (docs/ggml-generic-x86.md).

A path can also be *named* instead of detected: ``--emulate=ggml:avx512``, ``ggml:avx2``, ``ggml:generic``
(:data:`NAMED_PATHS`, :func:`named_path`). No library is then loaded or read — the kernels of :mod:`kernels.ggml` are
numba and numpy and never call into libggml; the library only tells :func:`detect` which path to take — so an x86
machine without llama-cpp-python recomputes, bit for bit, the streams of a build it does not run (an AVX2-only
server, a generic build), and the version followed is :data:`GGML_VERSION`, the emulation's own.

The emulation follows one ggml: :data:`GGML_VERSION`, the ggml of the llama.cpp vendored in llama-cpp-python
0.3.36. :func:`detect` also reads the library's own ``ggml_version()`` and ``ggml_commit()`` (``ggml.c``, in
``libggml-base``), and :meth:`GgmlBuild.check_version` refuses a library of another version in one line unless the
user accepts it (``--ggml-version-ok``); docs/numerics.md, "When llama.cpp moves", says how a new version is checked.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: The ggml whose ggml-cpu kernels the emulation follows: ``ggml_version()`` of the llama.cpp vendored in
#: llama-cpp-python 0.3.36 (its ggml/CMakeLists.txt: GGML_VERSION_MAJOR.MINOR.PATCH). Moved only after the checks
#: of docs/numerics.md, "When llama.cpp moves".
GGML_VERSION = "0.25.3"
FOLLOWS = f"ggml {GGML_VERSION} (the llama.cpp of llama-cpp-python 0.3.36)"
#: The flag that accepts a library of another version (refimpl.cli.common.add_numerics).
VERSION_OK_FLAG = "--ggml-version-ok"

# ggml-cpu.h: every ggml_cpu_has_* the library exports (0.3.36's vendored llama.cpp)
X86_FEATURES = ("sse3", "ssse3", "avx", "avx_vnni", "avx2", "bmi2", "f16c", "fma", "avx512", "avx512_vbmi",
                "avx512_vnni", "avx512_bf16", "amx_int8")
OTHER_FEATURES = ("neon", "arm_fma", "fp16_va", "dotprod", "matmul_int8", "sve", "sme", "riscv_v", "vsx", "vxe",
                  "wasm_simd")
# a GPU or other accelerator backend in the library folder: its ops are not ggml-cpu's
GPU_BACKENDS = ("cuda", "hip", "vulkan", "metal", "sycl", "opencl", "cann", "musa", "kompute", "rpc", "webgpu")


class UnsupportedBuild(ValueError):
    """The loaded libggml takes a code path the emulation does not follow, or is another version of ggml (the
    message names it)."""


@dataclass(frozen=True)
class EmulatedPath:
    """One ggml-cpu code path that ``--emulate=ggml`` follows bit for bit."""

    key: str  # GgmlBuild.path, Ctx.ggml, the ``path`` argument of every kernels.ggml op
    name: str  # how the stderr line and the reports name it
    lanes: int | None  # float32 lanes of GGML_F32_VEC (simd-mappings.h: GGML_F32_EPR); None: no GGML_SIMD
    selected: Callable[[frozenset, bool], bool]  # (features, x86) -> whether a library with them takes this path
    when: str  # the compile-time condition, in words


#: Every emulated path, in the order :attr:`GgmlBuild.path` tries them (the first whose ``selected`` holds). A new
#: path is added here, and only here; tests/test_ggml_paths_cli.py then runs every command on it.
EMULATED_PATHS = (
    EmulatedPath("avx512", "AVX-512", 16, lambda f, x86: "avx512" in f, "__AVX512F__: 16 float lanes"),
    EmulatedPath("avx2", "AVX2", 8, lambda f, x86: {"avx2", "fma", "f16c"} <= f, "__AVX2__ with FMA and F16C: 8 lanes"),
    EmulatedPath("generic", "generic x86", None, lambda f, x86: x86 and not f & set(X86_FEATURES),
                 "x86-64 without any of X86_FEATURES: no GGML_SIMD, scalar loops, no FMA"),
    # AArch64 (the phone's CPU): NEON's float32x4_t, GGML_F32_EPR = 4 (simd-mappings.h), GCC builds
    EmulatedPath("arm64-i8mm", "AArch64 NEON i8mm", 4,
                 lambda f, x86: not x86 and {"neon", "dotprod", "fp16_va", "matmul_int8"} <= f and "sve" not in f,
                 "__ARM_NEON with __ARM_FEATURE_DOTPROD, FP16 vector arithmetic and __ARM_FEATURE_MATMUL_INT8"),
    EmulatedPath("arm64-dotprod", "AArch64 NEON dotprod", 4,
                 lambda f, x86: not x86 and {"neon", "dotprod", "fp16_va"} <= f and not f & {"matmul_int8", "sve"},
                 "__ARM_NEON with __ARM_FEATURE_DOTPROD and FP16 vector arithmetic, no i8mm"),
)
PATHS_BY_KEY = {p.key: p for p in EMULATED_PATHS}
#: ``--emulate=ggml:KEY``: each path of :data:`EMULATED_PATHS` by name, no library consulted (:func:`named_path`).
NAMED_PREFIX = "ggml:"
NAMED_PATHS = tuple(NAMED_PREFIX + p.key for p in EMULATED_PATHS)


def emulated_path(key: str) -> EmulatedPath:
    """The :data:`EMULATED_PATHS` entry of ``key``, or ValueError naming the keys."""
    if key not in PATHS_BY_KEY:
        raise ValueError(f"unknown ggml-cpu path {key!r} (expected one of {tuple(PATHS_BY_KEY)})")
    return PATHS_BY_KEY[key]


def named_path(spec: str) -> str:
    """The key of a named path: ``"ggml:avx2"`` → ``"avx2"`` (the ``ggml:`` may be left out). An unknown name is
    :class:`UnsupportedBuild` in one line listing the valid ones."""
    key = spec[len(NAMED_PREFIX):] if spec.startswith(NAMED_PREFIX) else spec
    if key not in PATHS_BY_KEY:
        valid = ", ".join(f"{NAMED_PREFIX}{p.key} ({p.name})" for p in EMULATED_PATHS)
        raise UnsupportedBuild(f"unknown ggml-cpu path {key!r}: the named paths are {valid}; "
                               "plain ggml follows the libggml llama-cpp-python loads")
    return key


def describe_named(key: str) -> str:
    """``ggml-cpu AVX2 (named, not detected), ggml 0.25.3's kernels`` — what ``--emulate=ggml:KEY`` prints: no
    library was read, so the version is the emulation's own."""
    return f"ggml-cpu {emulated_path(key).name} (named, not detected), ggml {GGML_VERSION}'s kernels"


def lib_dir() -> Path:
    """Where llama-cpp-python loads libllama and libggml* from: ``$LLAMA_CPP_LIB_PATH``, else its ``lib/``."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    try:
        import llama_cpp
    except ImportError:
        raise UnsupportedBuild("no libggml to detect the path from: llama-cpp-python is not installed (pip install "
                               "'refimpl[oracle]', or set LLAMA_CPP_LIB_PATH, or name the path: "
                               f"{', '.join('--emulate=' + n for n in NAMED_PATHS)})") from None
    return Path(llama_cpp.__file__).parent / "lib"


@dataclass(frozen=True)
class GgmlBuild:
    """One libggml-cpu: its folder and the compile-time features it reports."""

    lib_dir: Path
    features: frozenset[str]
    gpu_backends: tuple[str, ...] = ()
    x86: bool = True  # the library is x86-64 code (its ELF header's e_machine)
    version: str | None = GGML_VERSION  # ggml_version() of its libggml-base (None: the library does not say)
    commit: str | None = None  # ggml_commit(): the git commit it was built from ("unknown" outside a git checkout)

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def path(self) -> str:
        """The key of the emulated path this library takes (:data:`EMULATED_PATHS`: ``"avx512"``, ``"avx2"``,
        ``"generic"``), or :class:`UnsupportedBuild` naming what this library runs instead."""
        if self.gpu_backends:
            raise UnsupportedBuild(f"{self.lib_dir} also holds the {', '.join(self.gpu_backends)} backend of ggml; "
                                   "--emulate=ggml follows ggml-cpu only")
        other = [f for f in OTHER_FEATURES if f in self.features]
        if other:
            raise UnsupportedBuild(f"the libggml-cpu in {self.lib_dir} runs {'/'.join(other).upper()} kernels; "
                                   "--emulate=ggml follows the x86 AVX2 and AVX-512 paths only")
        if self.has("amx_int8"):
            raise UnsupportedBuild(f"the libggml-cpu in {self.lib_dir} was built with AMX, whose tile kernels "
                                   "--emulate=ggml does not follow; build llama-cpp-python with -DGGML_AMX_INT8=OFF")
        for p in EMULATED_PATHS:
            if p.selected(self.features, self.x86):
                return p.key
        have = " ".join(f for f in X86_FEATURES if f in self.features) or "no SIMD on a CPU other than x86-64"
        raise UnsupportedBuild(f"the libggml-cpu in {self.lib_dir} is built for {have}; --emulate=ggml follows "
                               "x86-64 builds with AVX2+FMA+F16C, AVX-512, or no SIMD at all")

    @property
    def lanes(self) -> int | None:
        """float32 lanes of GGML_F32_VEC (simd-mappings.h: GGML_F32_EPR); None on the generic path (no GGML_SIMD)."""
        return emulated_path(self.path).lanes

    def check_version(self, accept_other: bool = False) -> str | None:
        """None when the library is ggml :data:`GGML_VERSION`, the version the emulation follows. Another version
        (or a library that does not say) is :class:`UnsupportedBuild` in one line naming both, unless
        ``accept_other`` (``--ggml-version-ok``): then its version, for the reports to record."""
        if self.version == GGML_VERSION:
            return None
        theirs = f"ggml {self.version}" if self.version else "a ggml that does not report its version (no ggml_version())"
        if not accept_other:
            raise UnsupportedBuild(f"the libggml in {self.lib_dir} is {theirs}, but the emulation follows {FOLLOWS}, whose "
                                   f"kernels may differ; give {VERSION_OK_FLAG} if you know they do not")
        return self.version or "unknown"

    def describe(self) -> str:
        """``ggml-cpu AVX-512 (avx avx2 fma f16c avx512 …) from DIR, ggml 0.25.3 (commit C)`` — what ``--emulate=ggml``
        prints; a library of another version also says which version the emulation follows."""
        name = emulated_path(self.path).name
        have = " ".join(f for f in X86_FEATURES if f in self.features) or "no SIMD"
        version = f"ggml {self.version or '(version not reported)'} (commit {self.commit or 'not reported'}"
        version += ")" if self.version == GGML_VERSION else f"; the emulation follows ggml {GGML_VERSION}'s kernels)"
        return f"ggml-cpu {name} ({have}) from {self.lib_dir}, {version}"


def read_version(directory: Path) -> tuple[str | None, str | None]:
    """``(ggml_version(), ggml_commit())`` of the ``libggml-base.so`` in ``directory`` (ggml.c: the CMake project's
    GGML_VERSION, and ``git rev-parse --short HEAD`` of the source at configure time, ``"unknown"`` outside a git
    checkout); None for one the library does not export, or when it has no libggml-base.so. Opened by its path: a
    libggml-base of another folder already loaded in this process is not the one read."""
    so = directory / "libggml-base.so"
    if not so.is_file():
        return None, None
    try:
        base = ctypes.CDLL(str(so))
    except OSError as e:
        raise UnsupportedBuild(f"cannot open {so}: {e}") from None
    out = []
    for name in ("ggml_version", "ggml_commit"):
        fn = getattr(base, name, None)
        if fn is None:
            out.append(None)
            continue
        fn.restype, fn.argtypes = ctypes.c_char_p, []
        value = fn()
        out.append(value.decode("utf-8", "replace") if value else None)
    return out[0], out[1]


def detect(directory: Path | None = None) -> GgmlBuild:
    """The build in ``directory`` (default :func:`lib_dir`), read from its ``libggml-cpu.so`` (features, ELF
    machine) and ``libggml-base.so`` (:func:`read_version`)."""
    directory = Path(directory) if directory is not None else lib_dir()
    so = directory / "libggml-cpu.so"
    if not so.is_file():
        raise UnsupportedBuild(f"no libggml-cpu.so in {directory}: a libggml built without the CPU backend, "
                               "or a build that loads backends at run time, which --emulate=ggml does not follow")
    try:
        cpu = ctypes.CDLL(str(so))
    except OSError as e:
        raise UnsupportedBuild(f"cannot open {so}: {e}") from None
    features = frozenset(f for f in X86_FEATURES + OTHER_FEATURES
                         if hasattr(cpu, f"ggml_cpu_has_{f}") and getattr(cpu, f"ggml_cpu_has_{f}")())
    gpus = tuple(b for b in GPU_BACKENDS if any(directory.glob(f"libggml-{b}*")))
    with open(so, "rb") as f:
        elf = f.read(20)
    x86 = elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 62  # EM_X86_64
    version, commit = read_version(directory)
    return GgmlBuild(directory, features, gpus, x86, version, commit)
