"""kernels.ggml.build: which ggml-cpu path a libggml takes, read from the library (never the host), and the
one-line refusals of the paths --emulate=ggml does not follow; the one table of the emulated paths and every
reader of it; the ggml version the library reports and the refusal of another one (tests/test_ggml_version.py runs
the commands on a library of another version); kernels.ggml.simd.fma32's single rounding."""

import re
from pathlib import Path

import numpy as np
import pytest
from ggml_graph import build_dir, build_info, require_build

from kernels.ggml.build import EMULATED_PATHS, GGML_VERSION, GgmlBuild, UnsupportedBuild, detect
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
    if entry.lanes is None:
        with pytest.raises(ValueError):
            simd.lanes(key)
    else:
        assert simd.lanes(key) == entry.lanes
    features = {"avx512": X86_AVX2 | {"avx512"}, "avx2": X86_AVX2, "generic": set()}.get(key)
    assert features is not None, f"a new path {key!r}: name the features that select it here"
    b = GgmlBuild(Path("/x/lib"), frozenset(features))
    assert b.path == key and b.lanes == entry.lanes and f"ggml-cpu {entry.name} (" in b.describe()


def test_another_ggml_version_is_refused_in_one_line_unless_accepted():
    b = GgmlBuild(Path("/x/lib"), frozenset(X86_AVX2), version="0.26.1", commit="abc1234")
    with pytest.raises(UnsupportedBuild) as e:
        b.check_version()
    msg = str(e.value)
    assert "\n" not in msg and "/x/lib" in msg and "ggml 0.26.1" in msg and f"ggml {GGML_VERSION}" in msg
    assert "--ggml-version-ok" in msg
    assert b.check_version(accept_other=True) == "0.26.1"
    assert b.describe().endswith(f"from /x/lib, ggml 0.26.1 (commit abc1234; the emulation follows ggml {GGML_VERSION}'s kernels)")
    silent = GgmlBuild(Path("/x/lib"), frozenset(X86_AVX2), version=None)  # a libggml-base without ggml_version()
    with pytest.raises(UnsupportedBuild, match="does not report its version"):
        silent.check_version()
    same = GgmlBuild(Path("/x/lib"), frozenset(X86_AVX2), version=GGML_VERSION, commit="unknown")
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
