"""kernels.ggml.build: which ggml-cpu path a libggml takes, read from the library (never the host), and the
one-line refusals of the paths --emulate=ggml does not follow; kernels.ggml.simd.fma32's single rounding."""

import re
from pathlib import Path

import numpy as np
import pytest
from ggml_graph import build_dir, build_info, require_build

from kernels.ggml.build import GgmlBuild, UnsupportedBuild, detect
from kernels.ggml.simd import fma32, fma32_exact

X86_AVX2 = {"sse3", "ssse3", "avx", "avx2", "bmi2", "f16c", "fma"}


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
    assert b.path in ("avx512", "avx2")  # CI hosts are x86-64 with AVX2 at least (the emulated paths)
    assert b.lanes == (16 if b.has("avx512") else 8)


@pytest.mark.parametrize("features, gpus, words", [
    (X86_AVX2 | {"avx512", "amx_int8"}, (), "AMX"),
    ({"neon", "arm_fma", "dotprod"}, (), "NEON"),
    ({"sse3", "ssse3", "avx"}, (), "AVX2+FMA+F16C"),
    (X86_AVX2, ("cuda",), "cuda backend"),
])
def test_paths_not_emulated_are_refused_in_one_line(features, gpus, words):
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


def test_a_folder_without_libggml_cpu_is_refused(tmp_path):
    with pytest.raises(UnsupportedBuild, match="no libggml-cpu.so"):
        detect(tmp_path)


@pytest.mark.oracle
def test_llama_cpp_lib_path_chooses_the_library(monkeypatch):
    require_build("avx2")
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(build_dir("avx2")))
    assert detect().path == "avx2"


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
