"""Which libggml-cpu llama.cpp runs here, and which of its code paths the bit-exact emulation follows.

ggml-cpu picks its SIMD code at *compile* time (``#if defined(__AVX512F__)`` … in ``simd-mappings.h``,
``vec.h``, ``arch/x86/quants.c``), so the path of every op is a property of the library, not of the host:
an AVX2-only build runs its AVX2 kernels on an AVX-512 machine. ``ggml_cpu_has_<feature>()`` reports exactly
those compile-time flags (``ggml-cpu.c``), and :func:`detect` reads them from the library that
llama-cpp-python loads: ``$LLAMA_CPP_LIB_PATH`` when set (``llama_cpp/llama_cpp.py`` reads the same
variable), else the package's ``lib/`` folder.

:class:`GgmlBuild` names the path (``path``: ``"avx512"``, ``"avx2"``) and refuses, in one line, a library
whose kernels are not emulated — ARM NEON/SVE, AMX, RISC-V, POWER, s390x, a pre-AVX2 x86 build, or a GPU
backend beside the CPU one — rather than approximating it. ``"generic"`` is ggml's generic x86 path: a build
without any SIMD (docs/ggml-generic-x86.md).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from kernels.ggml.simd import lanes

# ggml-cpu.h: every ggml_cpu_has_* the library exports (0.3.36's vendored llama.cpp)
X86_FEATURES = ("sse3", "ssse3", "avx", "avx_vnni", "avx2", "bmi2", "f16c", "fma", "avx512", "avx512_vbmi",
                "avx512_vnni", "avx512_bf16", "amx_int8")
OTHER_FEATURES = ("neon", "arm_fma", "fp16_va", "dotprod", "matmul_int8", "sve", "sme", "riscv_v", "vsx", "vxe",
                  "wasm_simd")
# a GPU or other accelerator backend in the library folder: its ops are not ggml-cpu's
GPU_BACKENDS = ("cuda", "hip", "vulkan", "metal", "sycl", "opencl", "cann", "musa", "kompute", "rpc", "webgpu")


class UnsupportedBuild(ValueError):
    """The loaded libggml takes a code path the emulation does not follow (the message names it)."""


def lib_dir() -> Path:
    """Where llama-cpp-python loads libllama and libggml* from: ``$LLAMA_CPP_LIB_PATH``, else its ``lib/``."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    try:
        import llama_cpp
    except ImportError:
        raise UnsupportedBuild("--emulate=ggml follows the libggml that llama-cpp-python loads, and llama-cpp-python "
                               "is not installed (pip install 'refimpl[oracle]', or set LLAMA_CPP_LIB_PATH)") from None
    return Path(llama_cpp.__file__).parent / "lib"


@dataclass(frozen=True)
class GgmlBuild:
    """One libggml-cpu: its folder and the compile-time features it reports."""

    lib_dir: Path
    features: frozenset[str]
    gpu_backends: tuple[str, ...] = ()
    x86: bool = True  # the library is x86-64 code (its ELF header's e_machine)

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def path(self) -> str:
        """The emulated path — ``"avx512"`` (``__AVX512F__``: 16 float lanes), ``"avx2"`` (``__AVX2__`` with
        FMA and F16C: 8 lanes) or ``"generic"`` (x86-64 without any of :data:`X86_FEATURES`: no ``GGML_SIMD``,
        scalar loops, no FMA) — or :class:`UnsupportedBuild` naming what this library runs instead."""
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
        if self.has("avx512"):
            return "avx512"
        if self.has("avx2") and self.has("fma") and self.has("f16c"):
            return "avx2"
        if self.x86 and not any(f in self.features for f in X86_FEATURES):
            return "generic"
        have = " ".join(f for f in X86_FEATURES if f in self.features) or "no SIMD on a CPU other than x86-64"
        raise UnsupportedBuild(f"the libggml-cpu in {self.lib_dir} is built for {have}; --emulate=ggml follows "
                               "x86-64 builds with AVX2+FMA+F16C, AVX-512, or no SIMD at all")

    @property
    def lanes(self) -> int:
        """float32 lanes of GGML_F32_VEC (simd-mappings.h: GGML_F32_EPR): :func:`kernels.ggml.simd.lanes`."""
        return lanes(self.path)

    def describe(self) -> str:
        """``ggml-cpu AVX-512 (avx avx2 fma f16c avx512 …) from DIR`` — what ``--emulate=ggml`` prints."""
        name = {"avx512": "AVX-512", "avx2": "AVX2", "generic": "generic x86"}[self.path]
        have = " ".join(f for f in X86_FEATURES if f in self.features) or "no SIMD"
        return f"ggml-cpu {name} ({have}) from {self.lib_dir}"


def detect(directory: Path | None = None) -> GgmlBuild:
    """The build in ``directory`` (default :func:`lib_dir`), read from its ``libggml-cpu.so``."""
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
    return GgmlBuild(directory, features, gpus, x86)
