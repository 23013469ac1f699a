"""numba's disk cache of the kernels (kernels/base/cache.py): dropped when any kernels/**/*.py changed, saved by
processes at once without losing a signature, and shared by every checkout of the same kernels under
REFIMPL_KERNEL_CACHE. (The compile lock: tests/test_compile_ahead.py.)"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import kernels
from kernels.base import cache

ROOT = Path(kernels.__file__).parents[1]


def test_a_stale_kernel_cache_is_dropped_also_under_numba_cache_dir(tmp_path):
    """numba invalidates a cached kernel only when its own file changes, but a lanes/pack.py kernel carries
    IR that lanes/ir.py emits: kernels/base/cache.py clears the package's cache (every folder's) when any
    kernels/**/*.py changed — in NUMBA_CACHE_DIR too, where a user who sets it would otherwise run an old
    kernel after an update."""
    from numba.core.caching import UserProvidedCacheLocator

    import kernels.lanes.pack

    directory = tmp_path / UserProvidedCacheLocator.get_suitable_cache_subpath(kernels.lanes.pack.__file__)
    directory.mkdir(parents=True)
    (directory / "numba-kernels-source.sha256").write_text("an older source")
    stale = directory / "pack._matmul_packed-1.py311.nbi"
    stale.write_bytes(b"stale")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", "import kernels"], env=env, check=True, cwd=ROOT)
    assert not stale.exists()
    stamp = (directory / "numba-kernels-source.sha256").read_text()
    assert stamp != "an older source" and len(stamp) == 64


_RACE = '''
import sys, time
import kernels  # noqa: F401  (kernels.base.cache locks numba's cache saves)
from numba.core.caching import IndexDataCacheFile
from numba.core.dispatcher import Dispatcher

Dispatcher.compile = Dispatcher.compile.__wrapped__  # no compile lock: the two compiles meet at the save

save_index = IndexDataCacheFile._save_index


def slow_save_index(self, overloads):  # widen the window between reading the index and writing it
    time.sleep(1.0)
    save_index(self, overloads)


IndexDataCacheFile._save_index = slow_save_index
sys.path.insert(0, sys.argv[1])
import racing

while time.time() < float(sys.argv[3]):  # both processes compile at the same moment
    time.sleep(0.01)
print(racing.f(3 if sys.argv[2] == "int" else 2.5))
'''


def test_two_processes_caching_two_signatures_of_one_kernel_keep_both(tmp_path):
    """Two processes compile two signatures of one cached function at the same time into one empty cache
    (NUMBA_CACHE_DIR): each save reads the index, picks a data file and writes both under kernels.base.cache's
    lock, so the index keeps both signatures, each naming its own machine code, and a third process loads both
    from the cache (numba alone: both take ``.1.nbc``, one entry is lost or names the other's code). The processes
    take off the per-kernel compile lock (``_lock_compiles``), which would otherwise make the second one wait."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "racing.py").write_text("import numba\n\n\n@numba.njit(cache=True)\ndef f(x):\n    return x * 2 + 1\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    root = ROOT
    start = time.time() + 4.0
    procs = [subprocess.Popen([sys.executable, "-c", _RACE, str(tmp_path / "mod"), arg, str(start)], env=env, cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for arg in ("int", "float")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    assert [out.split() for out, _ in outs] == [["7"], ["6.0"]]
    check = ("import sys; sys.path.insert(0, sys.argv[1]); import kernels, racing; "
             "print(racing.f(3), racing.f(2.5), racing.f.stats.cache_hits.total(), racing.f.stats.cache_misses.total())")
    done = subprocess.run([sys.executable, "-c", check, str(tmp_path / "mod")], env=env, cwd=root, capture_output=True,
                          text=True, check=True)
    assert done.stdout.split() == ["7", "6.0", "2", "0"], done.stdout + done.stderr


_SHARED = '''
import kernels
from kernels.base import cache
from kernels.base.floats import round_to_f16
round_to_f16(1.0 / 3.0)
print(round_to_f16.stats.cache_hits.total(), round_to_f16.stats.cache_misses.total(), cache.shared_root())
'''


def test_checkouts_of_the_same_kernels_share_one_cache(tmp_path):
    """REFIMPL_KERNEL_CACHE: a copy of kernels/ at another path (a second clone, a new virtualenv) loads what the first
    one compiled; a copy whose kernels differ by one byte compiles into its own key's folder; the SHARED_KEEP most
    recently used keys stay, older ones go; NUMBA_CACHE_DIR, where set, is used instead."""
    for name in ("a", "b", "c"):
        shutil.copytree(ROOT / "kernels", tmp_path / name / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    changed = tmp_path / "c" / "kernels" / "base" / "block.py"
    changed.write_text(changed.read_text() + "\n")
    shared = tmp_path / "shared"
    for i in range(cache.SHARED_KEEP + 1):  # keys of older kernels, used long ago
        (shared / f"{i:016x}-numba0.1-py30").mkdir(parents=True)
        os.utime(shared / f"{i:016x}-numba0.1-py30", (1e9 + i, 1e9 + i))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}

    def run(name, **more):
        out = subprocess.run([sys.executable, "-c", _SHARED], cwd=tmp_path / name, capture_output=True, text=True,
                             env={**env, cache.SHARED_ENV: str(shared), **more})
        assert out.returncode == 0, out.stderr
        hits, misses, root = out.stdout.split()
        return int(hits), int(misses), root

    hits, misses, root_a = run("a")
    assert (hits, misses) == (0, 1) and Path(root_a).parent == shared
    assert run("b") == (1, 0, root_a)  # another path, the same kernels: loaded, not compiled
    hits, misses, root_c = run("c")
    assert (hits, misses) == (0, 1) and root_c != root_a
    left = sorted(p.name for p in shared.iterdir())
    assert len(left) == cache.SHARED_KEEP and {Path(root_a).name, Path(root_c).name} <= set(left)
    assert run("b", NUMBA_CACHE_DIR=str(tmp_path / "numba"))[1:] == (1, "None")  # NUMBA_CACHE_DIR wins: compiled there


_CLOSURES = '''
import sys
import numpy as np
import kernels  # noqa: F401  (kernels.base.cache numbers each process's functions apart)
sys.path.insert(0, sys.argv[1])
import factory

closures = [factory.make(float(c)) for c in filter(None, sys.argv[2].split(","))]  # all alive at once, as kernels are
for k in closures:
    first, second = k(np.ones(2))
    print(first.tolist(), second.dtype)
'''

_FACTORY = """import numba
import numpy as np


def make(c):
    cast = c > 2.5

    @numba.njit(cache=True)
    def k(x):
        if cast:  # this closure's environment holds two dtypes, the other one's one
            return x * c, (x * c).astype(np.int32)
        return x * c, x * c

    return k
"""


def test_closures_of_one_factory_compiled_by_two_processes_load_together(tmp_path):
    """Two processes run the same script, each compiling one closure of a factory (one name, one signature, another
    captured constant) into one cache; a third loads both. numba names a function's symbols and its environment after
    a per-process counter, equal in the first two, so without kernels.base.cache's random start the third binds
    the second closure to the first one's environment and its array return fails ('descr' is NULL): the CI fault
    of ssm._transposed_rows's arm64-base and arm64-sve256 closures."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "factory.py").write_text(_FACTORY)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run(constants):
        return subprocess.run([sys.executable, "-c", _CLOSURES, str(tmp_path / "mod"), constants], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)

    run("")  # anything `import kernels` compiled would now be cached (today: nothing), so both runs below start even
    alone = [run("2"), run("3")]
    assert [p.stdout for p in alone] == ["[2.0, 2.0] float64\n", "[3.0, 3.0] int32\n"], [p.stderr for p in alone]
    both = run("2,3")
    assert both.returncode == 0, both.stderr[-2000:]
    assert both.stdout == "[2.0, 2.0] float64\n[3.0, 3.0] int32\n"


_SERIAL_OVER_PARALLEL = """import numba
import numpy as np


@numba.njit(parallel=True, cache=True)
def inner(x):
    out = np.empty_like(x)
    for i in numba.prange(x.shape[0]):
        out[i] = 2 * x[i]
    return out


@numba.njit(cache=True)
def middle(x):
    return inner(x) + 1


@numba.njit(cache=True)
def outer(x):  # serial, with the parallel callee compiled into it a level down
    return middle(x)
"""


def test_a_cached_serial_kernel_with_a_parallel_callee_runs_first_in_a_process(tmp_path):
    """A serial kernel whose callee's callee has a prange, compiled by a process that loaded that callee from the
    cache, then loaded by a fresh process and called before any parallel kernel: numba launches its threading layer
    (and hands LLVM its ``numba_parallel_for``) when it compiles a parallel kernel or loads one whose own code it
    lowered, not here, so the loaded code called an unresolved symbol and the process died (repack_k.gemv_k_id, the
    first kernel of a compile-ahead walk on a Q4_K_M file, after the suite's two workers had compiled it and its
    callees). Fails (SIGSEGV) without kernels.base.cache._threads_launched."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "nested.py").write_text(_SERIAL_OVER_PARALLEL)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    script = ("import sys, numpy as np, kernels; sys.path.insert(0, sys.argv[1]); import nested; "
              "print(getattr(nested, sys.argv[2])(np.arange(4.0)).tolist())")
    # middle compiled and saved by one process, outer by the next (middle from the cache), then outer loaded
    for name in ("middle", "outer", "outer"):
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "mod"), name], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout == "[1.0, 3.0, 5.0, 7.0]\n"
    assert any(f.endswith(".nbi") and "outer" in f for _, _, files in os.walk(tmp_path / "cache") for f in files)
