"""The AArch64 harness itself (tests/arm64.py, tests/ggml_graph.py's ``on_build``) and the detection of every ARM
build of ``.ci/build-llama-arm64`` (``kernels.ggml.build.detect``, which *reads* an AArch64 library, never runs it).

* Detection, per build (no qemu): the features read from the library are exactly those its ``-march`` implies, its
  ggml version is read from ``libggml-base``'s ``.rodata``, its compiler from the ELF ``.comment`` (GCC 12, clang 14,
  17, 18 or 19), and it takes its path of ``kernels.ggml.build.EMULATED_PATHS`` (a clang build's are paths of their
  own; the SVE one by clang version: 14-16 or 17+) or is refused in one line: the SVE build unless the vector length
  is known (it is the CPU's, read at run time) and 128 bits; a compiler neither GCC nor clang, a clang version not
  checked, a library that does not say who compiled it (each checked on a copy of a build's record).
* Under qemu, per build: the library's own ``ggml_cpu_has_*()`` (after ``ggml_cpu_init``) and
  ``ggml_cpu_get_sve_cnt()`` say what was read, and a one-op graph (a Q8_0 ``mul_mat`` whose result is exact)
  goes through the worker and back.
* A build run on a CPU model without its features dies of SIGILL with a message that says so: the i8mm build's
  Q8_0 ``mul_mat`` on ``-cpu cortex-a76`` (ARMv8.2: dotprod, no i8mm); and a child under qemu (the Python that tests/llama_ref.py and tests/llama_trace.py start)
  loads libllama through llama-cpp-python's bindings and prints llama.cpp's own system info.

Skipped without the builds, qemu-aarch64 or the aarch64 sysroot; failed under ``CI=true``. Cost: 7 qemu Python
starts (one per build, one on cortex-a76, one llama child), ~4 s of CPU each, the rest milliseconds: 28 s of CPU,
63 s wall for the module on 2 vCPUs shared at load 8 (AMD EPYC, Zen 4 class, qemu-aarch64 7.2, 2026-12-04).
"""

from __future__ import annotations

import dataclasses
import subprocess

import arm64
import numpy as np
import pytest
from ggml_graph import Graph, build_info, vp

from kernels.ggml.build import (ARM64_PATHS, GGML_VERSION, UnsupportedBuild, detect, emulated_path, read_elf,
                                read_features)

Q8_0 = 8  # ggml.h: GGML_TYPE_Q8_0
#: build -> the features its -march implies (ggml_cpu_has_*: __ARM_NEON, __ARM_FEATURE_FMA, …)
FEATURES = {
    "arm64-base-gcc": {"neon", "arm_fma"},
    "arm64-base-clang": {"neon", "arm_fma"},
    "arm64-dotprod-clang": {"neon", "arm_fma", "dotprod", "fp16_va"},
    "arm64-dotprod-gcc": {"neon", "arm_fma", "dotprod", "fp16_va"},
    "arm64-i8mm-gcc": {"neon", "arm_fma", "dotprod", "fp16_va", "matmul_int8"},
    "arm64-i8mm-clang": {"neon", "arm_fma", "dotprod", "fp16_va", "matmul_int8"},
    "arm64-sve128-gcc": {"neon", "arm_fma", "dotprod", "fp16_va", "matmul_int8", "sve"},
    "arm64-sve256-gcc": {"neon", "arm_fma", "dotprod", "fp16_va", "matmul_int8", "sve"},
    "arm64-sve128-clang": {"neon", "arm_fma", "dotprod", "fp16_va", "matmul_int8", "sve"},
}
FEATURES.update({b + v: FEATURES[b] for b in list(FEATURES) if b.endswith("-clang") for v in ("17", "18", "19")})
HAS = ("neon", "arm_fma", "fp16_va", "dotprod", "matmul_int8", "sve", "sme", "sme2", "llamafile", "avx2", "avx512")


def test_every_arm_build_of_the_ci_has_its_features_listed_here():
    assert set(FEATURES) == set(arm64.BUILDS) == set(arm64.QEMU_CPU)
    assert {key for key, _, _ in arm64.BUILDS.values()} == set(ARM64_PATHS)


def test_the_harness_lists_the_builds_of_the_build_script():
    """tests/arm64.py's BUILDS (compiler, -march) and ALL_ONLY are .ci/build-llama-arm64's BUILDS and ALL_ONLY."""
    import re
    from pathlib import Path

    script = (Path(__file__).resolve().parent.parent / ".ci" / "build-llama-arm64").read_text()

    def listed(array):
        body = re.search(rf"^{array}=\(\n(.*?)^\)", script, re.M | re.S).group(1)
        return {name: (cc, march) for name, cc, march in re.findall(r'^\s*"(\S+) (\S+) (\S+)"', body, re.M)}

    default, all_only = listed("BUILDS"), listed("ALL_ONLY")
    assert {**default, **all_only} == {name: (cc, march) for name, (_, cc, march) in arm64.BUILDS.items()
                                       if name not in arm64.SAME_LIBRARY}  # another build's libraries on another CPU
    assert set(all_only) == arm64.ALL_ONLY and not set(default) & arm64.ALL_ONLY


@pytest.mark.parametrize("build", [pytest.param(b, marks=pytest.mark.deep) if b in arm64.ALL_ONLY else b
                                   for b in sorted(arm64.BUILDS)])
def test_each_arm_build_is_detected_without_running_it(build):
    arm64.require(build)
    key, compiler, march = arm64.BUILDS[build]
    b = detect(arm64.lib_dir(build))
    assert b.arm64 and not b.x86 and b.features == FEATURES[build], (march, sorted(b.features))
    assert (b.version, b.commit) == (GGML_VERSION, "unknown")  # an extracted sdist: no git checkout
    assert b.compiler.split()[0] == ("GCC" if compiler == "gcc" else "clang")
    # Debian 12's GCC, clang and clang-19; ziglang 0.12.0's and 0.13.0's clang
    assert b.compiler_major == {"gcc": 12, "clang": 14, "clang17": 17, "clang18": 18, "clang19": 19}[compiler]
    if compiler.startswith("clang"):
        other = dataclasses.replace(b, compiler="ICC 2024.1")
        with pytest.raises(UnsupportedBuild, match="compiled by ICC 2024.1, .* for GCC and clang builds") as e:
            other.path
        assert "\n" not in str(e.value)
        with pytest.raises(UnsupportedBuild, match="does not say which compiler built it"):
            dataclasses.replace(b, compiler=None).path
        with pytest.raises(UnsupportedBuild, match="clang 20.1.0, a version whose builds were not checked .* name the "
                                                   rf"path, .*--emulate=ggml:{key} \(") as e:
            dataclasses.replace(b, compiler="clang 20.1.0", sve_bits=128).path
        assert "\n" not in str(e.value)
        if "sve" in b.features:  # Q6_K's inactive lanes: kept by clang 14-16, computed from clang 17 on
            path_of = {v: dataclasses.replace(b, compiler=f"clang {v}.0.1", sve_bits=128).path for v in range(14, 20)}
            assert path_of == {14: "arm64-sve128-clang14", 15: "arm64-sve128-clang14", 16: "arm64-sve128-clang14",
                               17: "arm64-sve128-clang", 18: "arm64-sve128-clang", 19: "arm64-sve128-clang"}
    if "sve" in b.features:  # the vector length is the CPU's: unknown on this host, refused unless emulated (GCC's
        assert b.sve_bits is None  # build at 128 and 256 bits, clang's at 128)
        other = 512 if compiler == "gcc" else 256
        for bits, words in ((None, "read at run time"), (other, f"the {other}-bit vector length")):
            with pytest.raises(UnsupportedBuild, match=words) as e:
                detect(arm64.lib_dir(build), sve_bits=bits).path
            assert "\n" not in str(e.value) and f"--emulate=ggml:{key}" in str(e.value)
        b = build_info(build)  # as the harness runs it: qemu's vector length (arm64.QEMU_CPU)
        assert b.sve_bits == arm64.sve_bits(build) == emulated_path(key).sve_bits
    assert b.path == key and b.lanes == emulated_path(key).lanes
    assert b.describe().startswith(f"ggml-cpu {emulated_path(key).name} (neon arm_fma")
    assert f"; {b.compiler.split()[0]} {b.compiler_major}" in b.describe()
    assert f"from {arm64.lib_dir(build)}, ggml {GGML_VERSION} (commit unknown)" in b.describe()


def g_report(names):
    """Under qemu: the library's own ggml_cpu_has_<name>() for ``names`` and ggml_cpu_get_sve_cnt() (ggml_cpu_init
    has run: it reads svcntb()), and a Q8_0 mul_mat whose result is exact on every path."""
    import ctypes

    g = Graph()
    with g:
        has = {n for n in names if getattr(g.cpu, f"ggml_cpu_has_{n}")()}
        g.cpu.ggml_cpu_get_sve_cnt.restype = ctypes.c_int
        sve_cnt = g.cpu.ggml_cpu_get_sve_cnt()
    return has, sve_cnt, g_q8_0(*q8_0_case())


def q8_0_case():
    """Q8_0 weights [4 rows, 64] with scale 1 and activations [2, 64] of integers in [-127, 127] (quantized with
    scale 1, exactly): the product is the exact integer dot, whatever the kernel."""
    rng = np.random.default_rng(39)
    qw = rng.integers(-127, 128, (4, 2, 32), dtype=np.int8)
    blocks = np.zeros((4, 2, 34), np.uint8)
    blocks[:, :, :2] = np.frombuffer(np.float16(1).tobytes(), np.uint8)
    blocks[:, :, 2:] = qw.view(np.uint8)
    x = rng.integers(-127, 128, (2, 64)).astype(np.float32)
    x[:, ::32] = 127  # each block's amax: its scale is 127/127 = 1
    return blocks.reshape(4, 68), x, qw.reshape(4, 64)


def g_q8_0(w, x, _qw=None):
    with Graph() as g:
        y = g.op("ggml_mul_mat", [vp, vp], g.tensor(w, Q8_0, (64, 4)), g.tensor(x))
        return g.compute(y, (2, 4))


@pytest.mark.parametrize("build", [pytest.param(b, marks=pytest.mark.deep)
                                   if b[-2:] in ("17", "18") or b.endswith("clang19") and "sve" not in b
                                   else b for b in sorted(arm64.BUILDS)])  # clang 17, 18, and 19's NEON builds: -m deep
def test_each_arm_build_runs_a_graph_under_qemu_and_reports_what_was_read(build):
    arm64.require(build)
    has, sve_cnt, y = arm64.call(build, g_report, HAS)
    read = read_features(read_elf(arm64.lib_dir(build) / "libggml-cpu.so"))
    assert has == {f for f in read if f in HAS} == FEATURES[build]
    assert sve_cnt == (arm64.sve_bits(build) // 8 if "sve" in has else 0)
    w, x, qw = q8_0_case()
    assert np.array_equal(y, x @ qw.T.astype(np.float32))


def test_a_build_on_a_cpu_without_its_features_dies_of_sigill():
    """The i8mm build (-march=armv8.6-a+dotprod+fp16+i8mm) on cortex-a76 (ARMv8.2: dotprod, fp16; no i8mm, no
    ARMv8.4's LRCPC2) dies of SIGILL, said in one line. Not first at the i8mm kernel: GCC's armv8.6-a already emits
    ``stlur`` (LRCPC2) for an atomic store in ``ggml_threadpool_new_impl``, so any graph dies there — a CPU model
    must have every feature of the build's -march (arm64.QEMU_CPU), not only the one the path is named after. The
    same graph runs on the dotprod build on that model (the test above)."""
    build = "arm64-i8mm-gcc"
    arm64.require(build)
    with pytest.raises(RuntimeError) as e:
        arm64.call(build, g_q8_0, *q8_0_case(), cpu="cortex-a76")
    msg = str(e.value)
    assert "\n" not in msg and "died of SIGILL on qemu -cpu cortex-a76" in msg and "+i8mm" in msg, msg


def test_a_llama_child_runs_under_qemu():
    """The child of tests/llama_ref.py / llama_trace.py: qemu's aarch64 Python with llama-cpp-python's bindings
    on the build's libllama (LLAMA_CPP_LIB_PATH), whose system info names the features read from the library."""
    build = "arm64-dotprod-gcc"
    arm64.require(build)
    python, env = arm64.command_for(arm64.lib_dir(build))
    assert python[0] == "qemu-aarch64" and arm64.QEMU_CPU[build] in python
    script = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
    out = subprocess.run(python + ["-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    info = out.stdout
    for feature in ("NEON", "ARM_FMA", "FP16_VA", "DOTPROD"):
        assert f"{feature} = 1" in info, info
    assert "MATMUL_INT8" not in info and "SVE" not in info and "LLAMAFILE" not in info, info
