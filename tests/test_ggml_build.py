"""kernels.ggml.build: which ggml-cpu path a libggml takes, read from the library (never the host), and the
one-line refusals of the paths --emulate=ggml does not follow; the one table of the emulated paths and every
reader of it; the ggml version the library reports and the refusal of another one (tests/test_ggml_version.py runs
the commands on a library of another version); the AArch64 paths and their refusals (SME, KleidiAI, llamafile, clang,
SVE vector lengths), the ELF reader checked on the x86 builds (tests/test_arm64_harness.py reads the ARM builds);
kernels.ggml.simd.fma32's single rounding."""

import re
from pathlib import Path

import numpy as np
import pytest
from ggml_graph import build_dir, build_info, require_build

from kernels.ggml.build import (ARM64, ARM64_PATHS, EMULATED_PATHS, GGML_VERSION, X86_SIMD_PATHS, GgmlBuild,
                                UnsupportedBuild, describe_named, detect, is_arm64, not_emulated, read_elf,
                                read_features)
from kernels.ggml.simd import fma32, fma32_exact

X86_AVX2 = {"sse3", "ssse3", "avx", "avx2", "bmi2", "f16c", "fma"}
NEON = {"neon", "arm_fma"}
#: the AArch64 paths and the features (ggml_cpu_has_*) of a build that takes each (.ci/build-llama-arm64's -march)
ARM = {"arm64-base": NEON, "arm64-dotprod": NEON | {"dotprod", "fp16_va"},
       "arm64-i8mm": NEON | {"dotprod", "fp16_va", "matmul_int8"},
       "arm64-sve128": NEON | {"dotprod", "fp16_va", "matmul_int8", "sve"},
       "arm64-sve256": NEON | {"dotprod", "fp16_va", "matmul_int8", "sve"},  # the same build on a 256-bit CPU (SVE_BITS)
       "arm64-i8mm-clang": NEON | {"dotprod", "fp16_va", "matmul_int8"},  # compiled by clang (COMPILER)
       "arm64-base-clang": NEON, "arm64-dotprod-clang": NEON | {"dotprod", "fp16_va"},
       "arm64-sve128-clang": NEON | {"dotprod", "fp16_va", "matmul_int8", "sve"},
       "arm64-sve128-clang14": NEON | {"dotprod", "fp16_va", "matmul_int8", "sve"}}
#: the compiler of each AArch64 path's library here (the GCC paths': GCC 12)
COMPILER = {key: "clang 14.0.6" for key in ARM if key.endswith(("-clang", "-clang14"))} | {"arm64-sve128-clang": "clang 19.1.7"}
#: the SVE vector length of the CPU running each SVE path's library (the others: 128)
SVE_BITS = {"arm64-sve256": 256}


def arm_build(features, compiler="GCC 12.2.0", sve_bits=128, gpus=()):
    """An AArch64 GgmlBuild as detect() makes one (sve_bits only for an SVE build)."""
    return GgmlBuild(Path("/x/lib"), frozenset(features), gpus, x86=False, machine=ARM64, compiler=compiler,
                     sve_bits=sve_bits if "sve" in features else None)


@pytest.mark.oracle
def test_the_avx2_build_is_detected_as_avx2_whatever_the_host():
    b = build_info("avx2")
    assert b.path == "avx2" and b.lanes == 8 and not b.has("avx512")
    assert b.describe().startswith("ggml-cpu AVX2 (") and str(build_dir("avx2")) in b.describe()


@pytest.mark.oracle
def test_the_native_build_reports_its_compile_time_flags():
    import ctypes

    b = build_info("native")
    cpu = ctypes.CDLL(str(b.lib_dir / "libggml-cpu.so"))
    assert b.has("avx512") == bool(cpu.ggml_cpu_has_avx512()) and b.has("avx2") == bool(cpu.ggml_cpu_has_avx2())
    assert b.path in ("avx512", "avx2", "avx2-zen")  # CI hosts are x86-64 with AVX2 at least (the emulated paths)
    assert b.lanes == (16 if b.has("avx512") else 8)


@pytest.mark.parametrize("features, gpus, words", [
    (X86_AVX2 | {"avx512", "amx_int8"}, (), "AMX"),
    ({"neon", "arm_fma", "dotprod"}, (), "NEON"),
    ({"sse3", "ssse3", "avx"}, (), "AVX2+FMA+F16C"),
    (X86_AVX2, ("cuda",), "cuda backend"),
])
def test_paths_not_emulated_are_refused_in_one_line(features, gpus, words):
    """x86-64 libraries (an ARM feature on an x86 library is refused too)."""
    b = GgmlBuild(Path("/x/lib"), frozenset(features), gpus)
    with pytest.raises(UnsupportedBuild, match=re.escape(words)) as e:
        b.path
    assert "\n" not in str(e.value) and "/x/lib" in str(e.value)


def test_a_build_without_simd_is_generic_on_x86_only():
    assert GgmlBuild(Path("/x/lib"), frozenset()).path == "generic"
    with pytest.raises(UnsupportedBuild, match="no SIMD on a CPU other than x86-64"):
        GgmlBuild(Path("/x/lib"), frozenset(), (), x86=False).path


@pytest.mark.oracle
def test_the_generic_build_is_detected_as_generic_whatever_the_host():
    """The third CI build (.ci/build-llama-tools: every x86 extension off): ggml's generic path."""
    b = build_info("generic")
    assert b.path == "generic" and b.x86 and not (b.features & {"sse3", "avx", "avx2", "fma", "f16c", "avx512"})
    assert b.describe().startswith("ggml-cpu generic x86 (no SIMD) from") and str(build_dir("generic")) in b.describe()
    assert build_info("avx2").path == "avx2" and build_info("avx2").x86


@pytest.mark.parametrize("key", [p.key for p in EMULATED_PATHS])
def test_every_reader_of_the_path_table_knows_every_path(key):
    """A path of kernels.ggml.build.EMULATED_PATHS is a Ctx.ggml, has a report line (Ctx.numerics: the KeyError of
    issue 38 on the generic path), is an op path of kernels.ggml.simd with its lanes, and is what GgmlBuild.path
    names a library with the features that select it."""
    from kernels.ggml import simd
    from refimpl.model.ops import GGML_NAMES, GGML_PATHS, Ctx

    entry = next(p for p in EMULATED_PATHS if p.key == key)
    assert key in GGML_PATHS and GGML_NAMES[key] == entry.name and simd.check_path(key) == key
    line = Ctx(act_quant=True, kv_f16=True, flash_attn=True, ggml=key).numerics()
    assert line.startswith(f"ggml-cpu {entry.name} bit for bit, ggml {GGML_VERSION}: F16 K/V, flash attention on"), line
    try:  # the table's lanes, or — no GGML_F32_VEC, or its vector code not emulated (yet) — refused naming the path
        assert simd.lanes(key) == entry.lanes
    except ValueError as e:
        assert key in str(e), e
    features = {**{"avx512": X86_AVX2 | {"avx512"}, "avx2": X86_AVX2, "avx2-zen": X86_AVX2, "generic": set()}, **ARM}.get(key)
    assert features is not None, f"a new path {key!r}: name the features that select it here"
    b = (GgmlBuild(Path("/x/lib"), frozenset(features), fma_chains=entry.chains) if key not in ARM
         else arm_build(features, COMPILER.get(key, "GCC 12.2.0"), SVE_BITS.get(key, 128)))
    assert b.path == key and b.lanes == entry.lanes and f"ggml-cpu {entry.name} (" in b.describe()
    assert is_arm64(key) == (key in ARM) == (key in ARM64_PATHS) == (key not in X86_SIMD_PATHS + ("generic",))
    # the column layout is built for the x86 SIMD paths' kernels (kernels.ggml.columns) and every AArch64 path's
    # (kernels.ggml.columns_arm: a plain buffer's Q4_K here), never the generic path's
    from types import SimpleNamespace

    from kernels.base.blocks import QT
    from refimpl.graph.layout import layout_target

    q4_k = SimpleNamespace(qtype=QT.Q4_K, stored_rows=None, shape=(64, 256))
    assert layout_target(q4_k, key, False) == (key in X86_SIMD_PATHS or key in ARM)
    assert describe_named(key).startswith(f"ggml-cpu {entry.name} (named, not detected")


def test_gccs_tuning_of_an_x86_build_is_its_own_path():
    """The same ISA, two GCC tunings (kernels.ggml.tuning): AVX2 fused → avx2, split → avx2-zen; AVX-512 split →
    avx512 (a Zen 4 build); an AVX-512 build with fused chains (generic or Intel tuning) is refused in one line, and
    so is an FMA build whose tuning was not probed."""
    assert GgmlBuild(Path("/x/lib"), frozenset(X86_AVX2), fma_chains="fused").path == "avx2"
    assert GgmlBuild(Path("/x/lib"), frozenset(X86_AVX2), fma_chains="split").path == "avx2-zen"
    assert GgmlBuild(Path("/x/lib"), frozenset(X86_AVX2 | {"avx512"}), fma_chains="split").path == "avx512"
    for features, chains, words in ((X86_AVX2 | {"avx512"}, "fused", "an AVX-512 build that fuses a loop-carried"),
                                    (X86_AVX2, None, "an AVX2 build that rounds in a way not probed")):
        with pytest.raises(UnsupportedBuild, match=re.escape(words)) as e:
            GgmlBuild(Path("/x/lib"), frozenset(features), fma_chains=chains).path
        assert "\n" not in str(e.value) and "/x/lib" in str(e.value)


@pytest.mark.oracle
@pytest.mark.parametrize("build", ["native", "avx2"])
def test_the_probe_tells_each_builds_tuning(build):
    """kernels.ggml.tuning.probe_fma_chains on the suite's x86 builds: the AVX2 build (-DGGML_NATIVE=OFF: GCC's
    generic tuning) fuses, and whatever the native build computes is one of the two candidates, which the emulation
    of each path reproduces (mxfp4_rows with and without the fused tail on the probe's blocks)."""
    import ctypes

    from kernels.ggml import tuning
    from kernels.ggml.mulmat import mul_mat
    from kernels.base.blocks import QT

    b = build_info(build)
    chains = tuning.probe_fma_chains(ctypes.CDLL(str(b.lib_dir / "libggml-cpu.so")))
    assert chains == b.fma_chains and (build != "avx2" or chains == tuning.FUSED)
    assert b.path == {"fused": "avx2", "split": "avx512" if b.has("avx512") else "avx2-zen"}[chains]
    w = np.frombuffer(tuning.TAIL_CASE.mxfp4, np.uint8).reshape(1, -1)
    q8 = np.frombuffer(tuning.TAIL_CASE.q8_0, np.uint8).reshape(3, 34)
    d = q8[:, :2].copy().view(np.float16).astype(np.float32)  # (3, 1)
    x = (q8[:, 2:].view(np.int8).astype(np.float32) * d).reshape(1, 96)  # quantize_row_q8_0 gives the blocks back
    for path, want in (("avx2", tuning.TAIL_CASE.fused), ("avx2-zen", tuning.TAIL_CASE.split),
                       ("avx512", tuning.TAIL_CASE.split)):
        assert mul_mat(w, QT.MXFP4, x, path)[0, 0] == want, path


def test_another_ggml_version_is_refused_in_one_line_unless_accepted():
    b = GgmlBuild(Path("/x/lib"), frozenset(X86_AVX2), fma_chains="fused", version="0.26.1", commit="abc1234")
    with pytest.raises(UnsupportedBuild) as e:
        b.check_version()
    msg = str(e.value)
    assert "\n" not in msg and "/x/lib" in msg and "ggml 0.26.1" in msg and f"ggml {GGML_VERSION}" in msg
    assert "--ggml-version-ok" in msg
    assert b.check_version(accept_other=True) == "0.26.1"
    assert b.describe().endswith(f"from /x/lib, ggml 0.26.1 (commit abc1234; the emulation follows ggml {GGML_VERSION}'s kernels)")
    silent = GgmlBuild(Path("/x/lib"), frozenset(X86_AVX2), fma_chains="fused", version=None)  # a libggml-base without ggml_version()
    with pytest.raises(UnsupportedBuild, match="does not report its version"):
        silent.check_version()
    same = GgmlBuild(Path("/x/lib"), frozenset(X86_AVX2), fma_chains="fused", version=GGML_VERSION, commit="unknown")
    assert same.check_version() is None and same.describe().endswith(f"from /x/lib, ggml {GGML_VERSION} (commit unknown)")


@pytest.mark.oracle
@pytest.mark.parametrize("build", ["native", "avx2", "generic"])
def test_the_suites_libraries_are_the_ggml_the_emulation_follows(build):
    """Every library the suite builds from llama-cpp-python 0.3.36's source reports GGML_VERSION (ggml_version() of
    its libggml-base), and a commit string (pip's build of the sdist: the vendored tree's git commit; a build of the
    extracted tree alone: "unknown")."""
    b = build_info(build)
    assert b.version == GGML_VERSION and b.check_version() is None
    assert b.commit and f", ggml {GGML_VERSION} (commit {b.commit})" in b.describe()


def test_a_folder_without_libggml_cpu_is_refused(tmp_path):
    with pytest.raises(UnsupportedBuild, match="no libggml-cpu.so"):
        detect(tmp_path)


@pytest.mark.oracle
def test_llama_cpp_lib_path_chooses_the_library(monkeypatch):
    require_build("avx2")
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(build_dir("avx2")))
    assert detect().path == "avx2"


@pytest.mark.parametrize("change, words", [
    ({"add": {"kleidiai"}}, "KleidiAI"),
    ({"add": {"sme"}}, "SME"),
    ({"add": {"sme2"}}, "SME2"),
    ({"add": {"llamafile"}}, "llamafile's sgemm"),
    ({"compiler": "ICC 2024.1"}, "compiled by ICC 2024.1"),
    ({"compiler": "clang 14.0.6", "add": {"sve"}, "sve_bits": 256},
     "follows this build's SVE at 128 bits: for such a CPU name its path, --emulate=ggml:arm64-sve128-clang14 (128 bits)"),
    ({"compiler": "clang 18.1.3", "add": {"sve"}, "sve_bits": 256}, "name its path, --emulate=ggml:arm64-sve128-clang "),
    ({"compiler": "clang 13.0.1"}, "clang 13.0.1, a version whose builds were not checked against the emulation: "
                                   "name the path, --emulate=ggml:arm64-i8mm-clang"),
    ({"compiler": None}, "does not say which compiler built it"),
    ({"add": {"sve"}, "sve_bits": None}, "read at run time"),
    ({"add": {"sve"}, "sve_bits": 512}, "the 512-bit vector length of this CPU; --emulate=ggml follows this build's SVE "
                                         "at 128 and 256 bits: for such a CPU name its path, --emulate=ggml:arm64-sve128 "
                                         "(128 bits), --emulate=ggml:arm64-sve256 (256 bits)"),
    ({"remove": {"dotprod"}}, "is built for neon arm_fma fp16_va matmul_int8"),  # i8mm without dotprod
    ({"gpus": ("vulkan",)}, "vulkan backend"),
])
def test_arm64_builds_not_emulated_are_refused_in_one_line(change, words):
    """SME, KleidiAI, llamafile on ARM, a compiler neither GCC nor clang (or one that does not say), an SVE vector
    length not emulated for its compiler (GCC: 128 and 256 bits; clang: 128), or unknown (the CPU's, at run time), a
    feature set of no path, a GPU backend: one line naming it."""
    features = (ARM["arm64-i8mm"] | change.get("add", set())) - change.get("remove", set())
    b = arm_build(features, change.get("compiler", "GCC 12.2.0"), change.get("sve_bits", 128), change.get("gpus", ()))
    with pytest.raises(UnsupportedBuild, match=re.escape(words)) as e:
        b.path
    assert "\n" not in str(e.value) and "/x/lib" in str(e.value)


def test_other_architectures_are_refused_in_one_line():
    for machine, features, words in (("RISC-V", {"riscv_v"}, "RISCV_V kernels"), ("POWER", set(), "no SIMD on a CPU")):
        b = GgmlBuild(Path("/x/lib"), frozenset(features), (), x86=False, machine=machine)
        with pytest.raises(UnsupportedBuild, match=words) as e:
            b.path
        assert "\n" not in str(e.value)


def test_an_arm64_build_is_described_with_its_compiler_and_vector_length():
    b = arm_build(ARM["arm64-sve128"])
    assert b.describe() == ("ggml-cpu AArch64 SVE-128 i8mm (neon arm_fma fp16_va dotprod matmul_int8 sve at 128 bits; "
                            f"GCC 12.2.0) from /x/lib, ggml {GGML_VERSION} (commit not reported)")
    assert not_emulated("ggml_rope", "arm64-base").args == ("ggml_rope on ggml-cpu's AArch64 NEON path (arm64-base) is "
                                                            "not emulated",)


@pytest.mark.oracle
@pytest.mark.parametrize("build", ["native", "avx2", "generic"])
def test_the_elf_reader_reads_what_the_x86_library_answers(build):
    """kernels.ggml.elf reads the features without running the library (what detect does with an AArch64 one):
    on the x86 builds, which this process can load and ask, it reads exactly their answers (and llamafile, which
    the x86 detection does not ask: the x86 paths include its sgemm), and the compiler of the .comment."""
    b = build_info(build)
    elf = read_elf(b.lib_dir / "libggml-cpu.so")
    assert elf.machine == "x86-64" and read_features(elf) == b.features | {"llamafile"}
    assert elf.returned_int("ggml_cpu_get_sve_cnt") == 0 and elf.returned_int("no_such_function") is None
    assert b.compiler.startswith("GCC 12.") and b.machine is None


@pytest.mark.parametrize("machine, code, value", [
    ("x86-64", "b801000000c3", 1),  # mov eax, 1; ret
    ("x86-64", "f30f1efab801000000c3", 1),  # endbr64 first (-fcf-protection)
    ("x86-64", "31c0c3", 0),  # xor eax, eax; ret
    ("x86-64", "8b0500000000c3", None),  # a load: not a constant
    ("AArch64", "20008052c0035fd6", 1),  # mov w0, #1; ret
    ("AArch64", "00008052c0035fd6", 0),  # mov w0, #0; ret (GCC)
    ("AArch64", "e0031f2ac0035fd6", 0),  # mov w0, wzr; ret (clang)
    ("AArch64", "200600d0009c47f9000040b9c0035fd6", None),  # adrp; ldr; ldr; ret: ggml_cpu_get_sve_cnt of an SVE build
])
def test_the_elf_reader_decodes_only_constant_returns(machine, code, value):
    from kernels.ggml.elf import Elf

    body = bytes.fromhex(code) + bytes(16)
    elf = Elf(Path("x"), body, machine, {".text": (0x1000, 0, len(body))}, {"f": 0x1000})
    assert elf.returned_int("f") == value and elf.returned_int("g") is None


def test_the_elf_reader_follows_adrp_add_to_a_string():
    """``ggml_version`` on AArch64: ``adrp x0, PAGE; add x0, x0, #lo12; ret`` (the string in .rodata, 2 pages on)."""
    from kernels.ggml.elf import Elf

    text = bytes.fromhex("00000090") + bytes.fromhex("00000091") + bytes.fromhex("c0035fd6")
    adrp, add = 0x90000000 | (2 << 29), 0x91000000 | (0x123 << 10)  # immlo = 2 pages (immhi 0); imm12 = 0x123
    text = adrp.to_bytes(4, "little") + add.to_bytes(4, "little") + text[8:]
    rodata = bytes(0x123) + b"0.25.3\0"
    data = text + bytes(0x2000 - len(text)) + rodata
    elf = Elf(Path("x"), data, "AArch64", {".text": (0x10004, 0, 12), ".rodata": (0x12000, 0x2000, len(rodata))},
              {"ggml_version": 0x10004})
    assert elf.returned_string("ggml_version") == "0.25.3"


def test_a_library_that_is_not_an_elf_or_a_macos_build_is_refused(tmp_path):
    (tmp_path / "libggml-cpu.so").write_bytes(b"\xcf\xfa\xed\xfe" + bytes(60))  # Mach-O
    with pytest.raises(UnsupportedBuild, match="not a 64-bit little-endian ELF"):
        detect(tmp_path)
    mac = tmp_path / "mac"
    mac.mkdir()
    (mac / "libggml-cpu.dylib").write_bytes(b"")
    with pytest.raises(UnsupportedBuild, match="macOS build of ggml .*Accelerate"):
        detect(mac)


def test_fma32_rounds_once():
    rng = np.random.default_rng(5)
    a, b, c = (rng.standard_normal(20000).astype(np.float32) for _ in range(3))
    c[::3] = -(a[::3].astype(np.float64) * b[::3]).astype(np.float32)  # cancellation: the product's low bits show
    c[1::3] *= np.float32(2.0**-30)  # tiny addends: the sum sits near a float32 midpoint
    got = np.array([fma32(x, y, z) for x, y, z in zip(a, b, c)], np.float32)
    want = np.array([fma32_exact(x, y, z) for x, y, z in zip(a, b, c)], np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    two_roundings = (a * b + c).astype(np.float32)  # float32 multiply, then add: rounded twice
    assert (two_roundings.view(np.uint32) != got.view(np.uint32)).sum() > 1000
    # 1 + 2^-11 + 2^-24 is a float32 midpoint: the exact addend decides the direction (double rounding would not)
    x = np.float32(1 + 2.0**-12)
    for tiny, up in ((2.0**-60, True), (-(2.0**-60), False)):
        want_bits = np.float32(1 + 2.0**-11 + (2.0**-23 if up else 0)).view(np.uint32)
        assert np.float32(fma32(x, x, np.float32(tiny))).view(np.uint32) == want_bits
        assert fma32_exact(x, x, np.float32(tiny)).view(np.uint32) == want_bits
