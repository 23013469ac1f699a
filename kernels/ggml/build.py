"""Which libggml-cpu llama.cpp runs here, and which of its code paths the bit-exact emulation follows.

ggml-cpu picks its SIMD code at *compile* time (``#if defined(__AVX512F__)`` … in ``simd-mappings.h``,
``vec.h``, ``arch/x86/quants.c``, ``arch/arm/quants.c``), so the path of every op is a property of the library, not
of the host: an AVX2-only build runs its AVX2 kernels on an AVX-512 machine. ``ggml_cpu_has_<feature>()`` reports
exactly those compile-time flags (``ggml-cpu.c``), and :func:`detect` reads them from the library that
llama-cpp-python loads: ``$LLAMA_CPP_LIB_PATH`` when set (``llama_cpp/llama_cpp.py`` reads the same variable), else
the package's ``lib/`` folder. An x86-64 library is asked (ctypes) — its features, and how GCC tuned it, by one
call of its own MXFP4 dot (:mod:`kernels.ggml.tuning`: a Zen-tuned build rounds MXFP4's and IQ4_NL's odd tail
twice, so ``avx2-zen`` is a path of its own) —; any other — an AArch64 build, which this x86
process cannot load — is *read*, never run (:func:`read_elf`): each ``ggml_cpu_has_*`` compiles to "return
constant" (``mov w0, #imm; ret``), taken from its ``.dynsym`` address in ``.text``; the compiler is the ELF
``.comment``'s (GCC's ``-ffp-contract=fast`` fuses products into adds where clang's ``on`` may not).

:data:`EMULATED_PATHS` is the one table of the paths that are emulated — key, name, float32 lanes, architecture and
the compile-time features that select it; ``GgmlBuild.path``, ``describe()``, ``refimpl.model.ctx`` (``Ctx.ggml``,
its report line) and ``kernels.ggml.simd`` (``lanes``, ``check_path``) all read it, and tests/test_ggml_paths_cli.py
runs every command on each entry. :class:`GgmlBuild` names the path and refuses, in one line, a library whose
kernels are not emulated — AMX, RISC-V, POWER, s390x, a pre-AVX2 x86 build, a GPU backend beside the CPU one; on
AArch64 SME, KleidiAI, llamafile's sgemm, an SVE vector length other than 128 bits, a macOS build
(Accelerate) — rather than approximating it. ``"generic"`` is ggml's generic x86 path: a build without any SIMD
(docs/ggml-generic-x86.md). The AArch64 paths (:data:`ARM64_PATHS`) are GCC builds — NEON (``armv8-a``), +dotprod+fp16,
+i8mm, and SVE with i8mm at a 128-bit vector length — and clang's builds of the same four (``arm64-i8mm-clang``,
``arm64-dotprod-clang``, ``arm64-base-clang``, ``arm64-sve128-clang``: the Android NDK's compiler, clang 14 to 19 —
and ``arm64-sve128-clang14``, clang 14 to 16's SVE build, whose Q6_K dot differs); each names its compiler (``EmulatedPath.compiler``, matched against the library's ``.comment``), since
clang fuses other products than GCC and vectorizes other reductions: a clang path is one more entry. A
kernel whose ARM C is not emulated yet raises :class:`NotEmulated` (:func:`not_emulated`), naming the op and the path.

A path can also be *named* instead of detected: ``--emulate=ggml:avx512``, ``ggml:arm64-i8mm`` …
(:data:`NAMED_PATHS`, :func:`named_path`). No library is then loaded or read — the kernels of :mod:`kernels.ggml` are
numba and numpy and never call into libggml; the library only tells :func:`detect` which path to take — so an x86
machine without llama-cpp-python recomputes, bit for bit, the streams of a build it does not run (an AVX2-only
server, a generic build, a phone), and the version followed is :data:`GGML_VERSION`, the emulation's own.

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

from kernels.ggml import elf as _elf
from kernels.ggml import tuning as _tuning
from kernels.ggml.elf import ARM64, X86_64, Elf

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
#: what an AArch64 library reports (ggml-cpu.c: __ARM_NEON, __ARM_FEATURE_FMA, _FP16_VECTOR_ARITHMETIC, _DOTPROD,
#: _MATMUL_INT8, _SVE, _SME, _SME2; GGML_USE_LLAMAFILE), and "kleidiai": GGML_USE_CPU_KLEIDIAI, whose only trace in
#: the library is its feature string (ggml-cpu.cpp: ggml_backend_cpu_get_features)
ARM64_FEATURES = ("neon", "arm_fma", "fp16_va", "dotprod", "matmul_int8", "sve", "sme", "sme2", "llamafile", "kleidiai")
# a GPU or other accelerator backend in the library folder: its ops are not ggml-cpu's
GPU_BACKENDS = ("cuda", "hip", "vulkan", "metal", "sycl", "opencl", "cann", "musa", "kompute", "rpc", "webgpu")
#: the compiler of the AArch64 paths (EmulatedPath.compiler): GCC, whose contraction (-ffp-contract=fast) the ARM
#: kernels follow; a clang build (-ffp-contract=on) fuses other products: its paths are entries of their own
#: (``arm64-i8mm-clang``, ``arm64-dotprod-clang``, ``arm64-base-clang``, ``arm64-sve128-clang``, ``-clang14``: compiler CLANG)
ARM64_COMPILER, CLANG = "GCC", "clang"
#: the clang major versions whose builds were checked against the emulation (Debian 12's clang 14 and clang 19, and the
#: clang 17 and 18 of PyPI's ziglang wheels — the Android NDK r25's to r28's LLVM majors —, every path; clang 15 and
#: 16 only where 14 and 19 differ: kernels.ggml.mulmat_arm_q.k_rows): a clang build outside them is refused unless its
#: path is named
CLANG_OLDEST, CLANG_NEWEST = 14, 19


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
    arch: str = X86_64  # the library's ELF machine: X86_64 or ARM64
    compiler: str | None = None  # an AArch64 path: the compiler whose builds take it (GgmlBuild.compiler's first word)
    versions: tuple[int, int] | None = None  # the compiler's major versions whose builds take it (None: any)
    chains: str | None = None  # an x86 FMA path: how GCC's tuning rounds a loop-carried s += a*b (kernels.ggml.tuning)
    sve_bits: int | None = None  # an SVE path: the vector length it follows (svcntb() * 8 of the CPU, read at run time)


def _avx2(f: frozenset, x86: bool) -> bool:
    """An x86 AVX2 path (either GCC tuning): AVX2 with FMA and F16C, no AVX-512."""
    return {"avx2", "fma", "f16c"} <= f and "avx512" not in f


def _arm64(need: set, without: set) -> Callable[[frozenset, bool], bool]:
    """An AArch64 path: NEON with FMA (every AArch64 compiler defines both) and ``need``, none of ``without``."""
    return lambda f, x86: not x86 and {"neon", "arm_fma"} | need <= f and not f & without


#: Every emulated path, in the order :attr:`GgmlBuild.path` tries them (the first whose ``selected`` holds). A new
#: path is added here, and only here; tests/test_ggml_paths_cli.py then runs every command on it.
EMULATED_PATHS = (
    # x86: the ISA (ggml_cpu_has_*) and GCC's tuning (kernels.ggml.tuning: probed). The AVX-512 path is a build tuned for
    # AMD Zen (-march=native on a Zen 4 EPYC), where a loop-carried s += a*b stays a product and an add ("split")
    EmulatedPath("avx512", "AVX-512", 16, lambda f, x86: "avx512" in f,
                 "__AVX512F__: 16 float lanes; GCC tuned for AMD Zen (split FMA chains)", chains=_tuning.SPLIT),
    # AVX2 with GCC's generic or an Intel tuning (-DGGML_NATIVE=OFF, as release builds; -march=native on Intel)
    EmulatedPath("avx2", "AVX2", 8, _avx2,
                 "__AVX2__ with FMA and F16C: 8 lanes; GCC's generic or an Intel tuning (fused FMA chains)",
                 chains=_tuning.FUSED),
    # AVX2 tuned for AMD Zen (-march=native on a Zen 2/3 EPYC or Ryzen): AVX2's kernels, MXFP4 / IQ4_NL's odd tail split
    EmulatedPath("avx2-zen", "AVX2 (tuned for AMD Zen)", 8, _avx2,
                 "__AVX2__ with FMA and F16C: 8 lanes; GCC tuned for AMD Zen (split FMA chains)", chains=_tuning.SPLIT),
    EmulatedPath("generic", "generic x86", None, lambda f, x86: x86 and not f & set(X86_FEATURES),
                 "x86-64 without any of X86_FEATURES: no GGML_SIMD, scalar loops, no FMA"),
    # AArch64 (the phone's CPU), GCC builds: NEON's float32x4_t, GGML_F32_EPR = 4 (simd-mappings.h)
    EmulatedPath("arm64-i8mm", "AArch64 NEON i8mm", 4,
                 _arm64({"dotprod", "fp16_va", "matmul_int8"}, {"sve"}),
                 "__ARM_NEON with __ARM_FEATURE_DOTPROD, FP16 vector arithmetic and __ARM_FEATURE_MATMUL_INT8", ARM64,
                 ARM64_COMPILER),
    EmulatedPath("arm64-dotprod", "AArch64 NEON dotprod", 4, _arm64({"dotprod", "fp16_va"}, {"matmul_int8", "sve"}),
                 "__ARM_NEON with __ARM_FEATURE_DOTPROD and FP16 vector arithmetic, no i8mm", ARM64, ARM64_COMPILER),
    EmulatedPath("arm64-base", "AArch64 NEON", 4, _arm64(set(), {"dotprod", "fp16_va", "matmul_int8", "sve"}),
                 "armv8-a: __ARM_NEON only (no dotprod: emulated by the C; F16 converted, no FP16 arithmetic)", ARM64,
                 ARM64_COMPILER),
    # SVE: the vector length is the CPU's (svcntb() at run time); simd-mappings.h's GGML_F32_EPR 8 is not what the
    # SVE loops step by (vec.h: ggml_cpu_get_sve_cnt() * 8 / 32 = 4 lanes at 128 bits)
    EmulatedPath("arm64-sve128", "AArch64 SVE-128 i8mm", 4, _arm64({"dotprod", "fp16_va", "matmul_int8", "sve"}, set()),
                 "__ARM_FEATURE_SVE with i8mm, dotprod and FP16 arithmetic, run at a 128-bit vector length", ARM64,
                 ARM64_COMPILER, sve_bits=128),
    # the same library on a 256-bit SVE CPU (Neoverse V1: Graviton3): svcntw() = 8 float lanes in vec.h's loops, the
    # 256-bit branches of quants.c's SVE vec_dot kernels and of repack.cpp's
    EmulatedPath("arm64-sve256", "AArch64 SVE-256 i8mm", 8, _arm64({"dotprod", "fp16_va", "matmul_int8", "sve"}, set()),
                 "__ARM_FEATURE_SVE with i8mm, dotprod and FP16 arithmetic, run at a 256-bit vector length", ARM64,
                 ARM64_COMPILER, sve_bits=256),
    # the i8mm build compiled by clang (the Android NDK's compiler; -ffp-contract=on): the same C, other products fused
    # (the vmlaq_f32 family) and other reductions vectorized (blocks of 8), so a path of its own
    EmulatedPath("arm64-i8mm-clang", "AArch64 NEON i8mm (clang)", 4,
                 _arm64({"dotprod", "fp16_va", "matmul_int8"}, {"sve"}),
                 "as arm64-i8mm, compiled by clang 14-19", ARM64, CLANG, (CLANG_OLDEST, CLANG_NEWEST)),
    EmulatedPath("arm64-dotprod-clang", "AArch64 NEON dotprod (clang)", 4,
                 _arm64({"dotprod", "fp16_va"}, {"matmul_int8", "sve"}), "as arm64-dotprod, compiled by clang 14-19", ARM64,
                 CLANG, (CLANG_OLDEST, CLANG_NEWEST)),
    # the armv8-a build compiled by clang: the Android guide's portable arm64-v8a build (the NDK compiles with clang)
    EmulatedPath("arm64-base-clang", "AArch64 NEON (clang)", 4, _arm64(set(), {"dotprod", "fp16_va", "matmul_int8", "sve"}),
                 "as arm64-base, compiled by clang 14-19", ARM64, CLANG, (CLANG_OLDEST, CLANG_NEWEST)),
    # the SVE build compiled by clang (GGML_CPU_ALL_VARIANTS' android_armv9.0_1: armv9-a+dotprod+i8mm+fp16+sve2): the
    # SVE intrinsics as GCC's, the NEON kernels it keeps as arm64-i8mm-clang's, and clang's own SVE choices — which
    # changed at clang 17: clang 14-16 keep the inactive byte lanes of Q6_K's `_x` operations (a wrong dot)
    EmulatedPath("arm64-sve128-clang", "AArch64 SVE-128 i8mm (clang 17+)", 4,
                 _arm64({"dotprod", "fp16_va", "matmul_int8", "sve"}, set()), "as arm64-sve128, compiled by clang 17-19",
                 ARM64, CLANG, (17, CLANG_NEWEST), sve_bits=128),
    EmulatedPath("arm64-sve128-clang14", "AArch64 SVE-128 i8mm (clang 14-16)", 4,
                 _arm64({"dotprod", "fp16_va", "matmul_int8", "sve"}, set()), "as arm64-sve128, compiled by clang 14-16",
                 ARM64, CLANG, (CLANG_OLDEST, 16), sve_bits=128),
)
PATHS_BY_KEY = {p.key: p for p in EMULATED_PATHS}
#: the keys of the x86-64 SIMD paths and of the AArch64 ones: a kernel written for the one never takes the other
X86_SIMD_PATHS = tuple(p.key for p in EMULATED_PATHS if p.arch == X86_64 and p.lanes)
ARM64_PATHS = tuple(p.key for p in EMULATED_PATHS if p.arch == ARM64)
#: the SVE builds' paths (:func:`by_sve`)
SVE_PATHS = tuple(p.key for p in EMULATED_PATHS if p.sve_bits)
#: ``--emulate=ggml:KEY``: each path of :data:`EMULATED_PATHS` by name, no library consulted (:func:`named_path`).
NAMED_PREFIX = "ggml:"
NAMED_PATHS = tuple(NAMED_PREFIX + p.key for p in EMULATED_PATHS)


def emulated_path(key: str) -> EmulatedPath:
    """The :data:`EMULATED_PATHS` entry of ``key``, or ValueError naming the keys."""
    if key not in PATHS_BY_KEY:
        raise ValueError(f"unknown ggml-cpu path {key!r} (expected one of {tuple(PATHS_BY_KEY)})")
    return PATHS_BY_KEY[key]


def is_arm64(key: str) -> bool:
    """Whether ``key`` is an AArch64 path (ValueError for an unknown key)."""
    return emulated_path(key).arch == ARM64


def by_sve(key: str) -> bool:
    """Whether ``key`` is an SVE build's path (``arm64-sve128``, ``arm64-sve128-clang``, ``-clang14``, ``arm64-sve256``):
    vec.h's SVE branches at the path's ``sve_bits``, the SVE ``vec_dot`` kernels of quants.c."""
    return key in SVE_PATHS


def by_clang(key: str) -> bool:
    """Whether ``key`` is a clang build's path (``arm64-*-clang``): clang's contraction and vectorizer."""
    return emulated_path(key).compiler == CLANG


class NotEmulated(UnsupportedBuild):
    """An op whose ggml-cpu code on a path is not emulated (yet): ``refimpl.cli.main`` says it in one line, as it
    says a refused library; raised by the kernels through :func:`not_emulated`."""


def not_emulated(op: str, key: str) -> NotEmulated:
    """The one-line error of an op whose ggml-cpu code on ``key`` is not emulated (``raise not_emulated(…)``)."""
    return NotEmulated(f"{op} on ggml-cpu's {emulated_path(key).name} path ({key}) is not emulated")


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
    library was read, so the version is the emulation's own (an AArch64 path: and a GCC build's bits)."""
    entry = emulated_path(key)
    cc = f", a {entry.compiler} build's bits" if entry.compiler else ""
    return f"ggml-cpu {entry.name} (named, not detected{cc}), ggml {GGML_VERSION}'s kernels"


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
    machine: str | None = None  # not x86: the ELF e_machine in words (ARM64 "AArch64", "RISC-V", …)
    compiler: str | None = None  # from the ELF .comment: "GCC 12.2.0", "clang 14.0.6" (None: not recorded)
    sve_bits: int | None = None  # an SVE build: the vector length of the CPU that runs it (None: not known here)
    fma_chains: str | None = None  # an x86 FMA build: "fused" or "split" (kernels.ggml.tuning.probe_fma_chains)

    def has(self, feature: str) -> bool:
        return feature in self.features

    @property
    def compiler_major(self) -> int | None:
        """The compiler's major version (``clang 14.0.6`` → 14), None where it does not say."""
        words = (self.compiler or "").split()
        head = words[1].split(".")[0] if len(words) > 1 else ""
        return int(head) if head.isdigit() else None

    @property
    def arm64(self) -> bool:
        return not self.x86 and self.machine == ARM64

    @property
    def path(self) -> str:
        """The key of the emulated path this library takes (:data:`EMULATED_PATHS`: ``"avx512"``, ``"avx2"``,
        ``"generic"``, ``"arm64-i8mm"`` …), or :class:`UnsupportedBuild` naming what this library runs instead."""
        if self.gpu_backends:
            raise UnsupportedBuild(f"{self.lib_dir} also holds the {', '.join(self.gpu_backends)} backend of ggml; "
                                   "--emulate=ggml follows ggml-cpu only")
        if self.arm64:
            return self._arm64_path()
        other = [f for f in OTHER_FEATURES if f in self.features]
        if other:
            raise UnsupportedBuild(f"the libggml-cpu in {self.lib_dir} runs {'/'.join(other).upper()} kernels; "
                                   "--emulate=ggml follows the x86-64 and AArch64 paths of its table only")
        if self.has("amx_int8"):
            raise UnsupportedBuild(f"the libggml-cpu in {self.lib_dir} was built with AMX, whose tile kernels "
                                   "--emulate=ggml does not follow; build llama-cpp-python with -DGGML_AMX_INT8=OFF")
        ours = [p for p in EMULATED_PATHS if p.selected(self.features, self.x86)]
        for p in ours:
            if p.chains is None or p.chains == self.fma_chains:
                return p.key
        if ours:  # the ISA is emulated, GCC's tuning of it not
            how = {_tuning.FUSED: "fuses a loop-carried s += a*b into an FMA (GCC's generic or an Intel tuning)",
                   _tuning.SPLIT: "keeps a loop-carried s += a*b a product and an add (GCC tuned for AMD Zen)"}
            raise UnsupportedBuild(f"the libggml-cpu in {self.lib_dir} is an {emulated_path(ours[0].key).name} build "
                                   f"that {how.get(self.fma_chains, 'rounds in a way not probed')}; --emulate=ggml "
                                   f"follows {', '.join(f'{p.key} ({p.when})' for p in ours)}")
        have = " ".join(f for f in X86_FEATURES if f in self.features) or "no SIMD on a CPU other than x86-64"
        raise UnsupportedBuild(f"the libggml-cpu in {self.lib_dir} is built for {have}; --emulate=ggml follows "
                               "x86-64 builds with AVX2+FMA+F16C, AVX-512, or no SIMD at all")

    def _arm64_path(self) -> str:
        """:attr:`path` of an AArch64 library: the one-line refusals first (what is not emulated, named), then the
        features that select one of :data:`ARM64_PATHS`."""
        lib = f"the AArch64 libggml-cpu in {self.lib_dir}"
        for feature, what, flag in (("kleidiai", "KleidiAI's microkernels", "-DGGML_CPU_KLEIDIAI=OFF"),
                                    ("sme", "SME", "a -march without +sme"), ("sme2", "SME2", "a -march without +sme2"),
                                    ("llamafile", "llamafile's sgemm (tinyBLAS on NEON)", "-DGGML_LLAMAFILE=OFF")):
            if self.has(feature):
                raise UnsupportedBuild(f"{lib} was built with {what}, which --emulate=ggml does not emulate; build it "
                                       f"with {flag}, as llama.cpp's Android guide does")
        if self.compiler is None:
            raise UnsupportedBuild(f"{lib} does not say which compiler built it (no .comment section), and GCC's and "
                                   "clang's builds differ in their bits: name the path (--emulate=ggml:arm64-…)")
        cc = self.compiler.split()[0]
        if not any(p.compiler == cc for p in EMULATED_PATHS if p.arch == ARM64):
            raise UnsupportedBuild(f"{lib} was compiled by {self.compiler}, whose floating-point contraction and "
                                   f"vectorizer are not emulated; the AArch64 paths are emulated for {ARM64_COMPILER} "
                                   f"and {CLANG} builds")
        major = self.compiler_major
        ours = [p for p in EMULATED_PATHS if p.arch == ARM64 and p.compiler == cc and p.selected(self.features, False)]
        mine = [p for p in ours if p.versions is None or (major is not None and p.versions[0] <= major <= p.versions[1])]
        if self.has("sve"):
            at = [p for p in (mine or ours) if p.sve_bits == self.sve_bits]
            if not at:
                vl = (f"the {self.sve_bits}-bit vector length of this CPU" if self.sve_bits else
                      "a vector length that is the CPU's, read at run time (svcntb()), which this host cannot tell")
                lengths = sorted({p.sve_bits for p in (mine or ours)})
                named = ", ".join(f"--emulate=ggml:{p.key} ({p.sve_bits} bits)" for p in (mine or ours))
                raise UnsupportedBuild(f"{lib} runs SVE at {vl}; --emulate=ggml follows this build's SVE at "
                                       f"{' and '.join(map(str, lengths)) or 'no vector length'} bits: for such a CPU name its path, "
                                       f"{named or '--emulate=ggml:arm64-sve128'}")
            mine = [p for p in mine if p.sve_bits == self.sve_bits]
            ours = [p for p in ours if p.sve_bits == self.sve_bits]
        if mine:
            return mine[0].key
        if ours:
            keys = " or ".join(f"--emulate=ggml:{p.key} ({p.when})" for p in ours)
            raise UnsupportedBuild(f"{lib} was compiled by {self.compiler}, a version whose builds were not checked "
                                   f"against the emulation: name the path, {keys}")
        have = " ".join(f for f in ARM64_FEATURES if f in self.features) or "no NEON"
        raise UnsupportedBuild(f"{lib} is built for {have}; --emulate=ggml follows AArch64 builds with NEON "
                               "(armv8-a), +dotprod+fp16, +i8mm, or SVE+i8mm at 128 bits (GCC: also 256)")

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
        prints; a library of another version also says which version the emulation follows. An AArch64 library
        also names its compiler (and an SVE one its vector length): ``ggml-cpu AArch64 NEON i8mm (neon … matmul_int8;
        GCC 12.2.0) from DIR, …``."""
        name = emulated_path(self.path).name
        if self.arm64:
            have = " ".join(f for f in ARM64_FEATURES if f in self.features)
            have += f" at {self.sve_bits} bits" if self.has("sve") else ""
            have += f"; {self.compiler}"
        else:
            have = " ".join(f for f in X86_FEATURES if f in self.features) or "no SIMD"
        version = f"ggml {self.version or '(version not reported)'} (commit {self.commit or 'not reported'}"
        version += ")" if self.version == GGML_VERSION else f"; the emulation follows ggml {GGML_VERSION}'s kernels)"
        return f"ggml-cpu {name} ({have}) from {self.lib_dir}, {version}"


def read_version(directory: Path) -> tuple[str | None, str | None]:
    """``(ggml_version(), ggml_commit())`` of the ``libggml-base.so`` in ``directory`` (ggml.c: the CMake project's
    GGML_VERSION, and ``git rev-parse --short HEAD`` of the source at configure time, ``"unknown"`` outside a git
    checkout); None for one the library does not export, or when it has no libggml-base.so. Opened by its path: a
    libggml-base of another folder already loaded in this process is not the one read. A library of another
    architecture is read instead (:func:`read_elf`): both functions return a string literal of its ``.rodata``."""
    so = directory / "libggml-base.so"
    if not so.is_file():
        return None, None
    elf = read_elf(so)
    if elf.machine != X86_64:
        return elf.returned_string("ggml_version"), elf.returned_string("ggml_commit")
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


def read_elf(so: Path) -> Elf:
    """:func:`kernels.ggml.elf.read_elf`, its refusal an :class:`UnsupportedBuild`."""
    try:
        return _elf.read_elf(so)
    except ValueError as e:
        raise UnsupportedBuild(f"{e}, which --emulate=ggml reads") from None


def read_features(elf: Elf) -> frozenset[str]:
    """The features a library of any architecture was compiled with, read without running it: every exported
    ``ggml_cpu_has_<feature>()`` that returns a nonzero constant, and ``kleidiai`` when its feature string is there
    (only ``#ifdef GGML_USE_CPU_KLEIDIAI`` compiles it in). A ``ggml_cpu_has_*`` that is not a constant is
    :class:`UnsupportedBuild` (not a ggml-cpu this emulation knows)."""
    features = set()
    for name in elf.symbols:
        if name.startswith("ggml_cpu_has_"):
            value = elf.returned_int(name)
            if value is None:
                raise UnsupportedBuild(f"{elf.path}: {name}() is not a compile-time constant, which --emulate=ggml "
                                       "reads the build's features from")
            if value:
                features.add(name[len("ggml_cpu_has_"):])
    if b"KLEIDIAI\0" in elf.section(".rodata"):  # "KLEIDIAI", or the buffer type's "CPU_KLEIDIAI" it may share
        features.add("kleidiai")
    return frozenset(features)


def host_sve_bits() -> int | None:
    """The SVE vector length new processes get on this machine (Linux: /proc/sys/abi/sve_default_vector_length,
    in bytes), None on a host without SVE (an x86-64 host cannot tell what CPU will run an AArch64 library)."""
    try:
        return 8 * int(Path("/proc/sys/abi/sve_default_vector_length").read_text())
    except (OSError, ValueError):
        return None


def detect(directory: Path | None = None, sve_bits: int | None = None) -> GgmlBuild:
    """The build in ``directory`` (default :func:`lib_dir`), read from its ``libggml-cpu.so`` (features, ELF
    machine, compiler) and ``libggml-base.so`` (:func:`read_version`). An x86-64 library is loaded and asked
    (``ggml_cpu_has_*()``); any other is read without running it (:func:`read_features`). ``sve_bits``: the SVE
    vector length of the CPU that runs an SVE library (default: this host's, :func:`host_sve_bits`)."""
    directory = Path(directory) if directory is not None else lib_dir()
    so = directory / "libggml-cpu.so"
    if not so.is_file():
        if (directory / "libggml-cpu.dylib").is_file():
            raise UnsupportedBuild(f"{directory} holds a macOS build of ggml (Mach-O, with Accelerate's vDSP and the "
                                   "Metal backend), which --emulate=ggml does not follow")
        raise UnsupportedBuild(f"no libggml-cpu.so in {directory}: a libggml built without the CPU backend, "
                               "or a build that loads backends at run time, which --emulate=ggml does not follow")
    elf = read_elf(so)
    x86 = elf.machine == X86_64
    chains = None  # an x86 FMA build's GCC tuning (kernels.ggml.tuning)
    if x86:
        try:
            # its own symbols first (RTLD_DEEPBIND): in a process that holds another libggml-cpu already, the probe's
            # vec_dot would otherwise be that library's (the type-traits table's pointers are interposable)
            cpu = ctypes.CDLL(str(so), mode=ctypes.RTLD_LOCAL | getattr(os, "RTLD_DEEPBIND", 0))
        except OSError as e:
            raise UnsupportedBuild(f"cannot open {so}: {e}") from None
        features = frozenset(f for f in X86_FEATURES + OTHER_FEATURES
                             if hasattr(cpu, f"ggml_cpu_has_{f}") and getattr(cpu, f"ggml_cpu_has_{f}")())
        if "fma" in features:  # asked by one MXFP4 dot
            try:
                chains = _tuning.probe_fma_chains(cpu)
            except ValueError as e:
                raise UnsupportedBuild(f"{so}: {e}, which --emulate=ggml tells GCC's tuning of it by") from None
    else:
        features = read_features(elf)
    gpus = tuple(b for b in GPU_BACKENDS if any(directory.glob(f"libggml-{b}*")))
    version, commit = read_version(directory)
    sve = (sve_bits or host_sve_bits()) if "sve" in features else None
    return GgmlBuild(directory, features, gpus, x86, version, commit, None if x86 else elf.machine, elf.compiler(), sve,
                     chains)
