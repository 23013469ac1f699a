"""The first run's second process (refimpl/cli/compile_ahead.py, refimpl/graph/ahead.py) and the lock it relies on
(kernels/base/cache.py ``_lock_compiles``): a process about to compile a kernel that another one is compiling waits
for it and loads its machine code; the child's walk compiles every kernel ``refimpl run --emulate=ggml`` calls; the
child starts only on an empty cache, for the ggml numerics, and never changes a token.

How much the child saves depends on the CPU, so it is measured (docs/performance.md, "First run"), not asserted.
"""

import os
import subprocess
import sys
from pathlib import Path

import numba
import pytest

import kernels
from conftest import require_llama_cpp
from kernels.base import cache
from refimpl.cli import compile_ahead
from refimpl.fixtures.builtin import TRAINED_PATH

ROOT = Path(kernels.__file__).parents[1]

_WAITER = '''
import sys
import kernels  # noqa: F401  (kernels.base.cache locks numba's compiles)
from numba.core import event
sys.path.insert(0, sys.argv[1])
import racing

compiled = []
event.register("numba:compile", type("L", (event.Listener,), {
    "on_start": lambda self, ev: compiled.append(ev.data["dispatcher"].py_func.__name__),
    "on_end": lambda self, ev: None})())
if sys.argv[2] == "nolock":  # a process that compiles without waiting (the lock taken by the test)
    kernels.base.cache._flock = lambda path, wait_s: None
print("calling", flush=True)
print(racing.f(3), compiled, racing.f.stats.cache_hits.total(), flush=True)
'''


def test_a_kernel_another_process_compiles_is_waited_for_and_loaded(tmp_path):
    """The test holds the lock of a cached kernel, as a process compiling it would: a second process calling it
    waits (numba alone would compile it at once); a third one, told to ignore the lock, compiles and saves it;
    once the lock is released the waiting process finds the kernel in the cache and compiles nothing."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "racing.py").write_text("import numba\n\n\n@numba.njit(cache=True)\ndef f(x):\n    return x * 2 + 1\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    where = ("import sys; sys.path.insert(0, sys.argv[1]); import kernels, racing; "
             "print(racing.f._cache._cache_file._index_path)")
    index = subprocess.run([sys.executable, "-c", where, str(tmp_path / "mod")], env=env, cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.strip()
    os.makedirs(os.path.dirname(index), exist_ok=True)
    from numba import types

    held = cache._flock(cache.compile_lock(index, (types.int64,)), 0.0)  # f(3)'s signature
    assert held is not None
    run = lambda mode: subprocess.Popen([sys.executable, "-c", _WAITER, str(tmp_path / "mod"), mode], env=env, cwd=ROOT,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        waiter = run("lock")
        assert waiter.stdout.readline().strip() == "calling", waiter.stderr.read()
        with pytest.raises(subprocess.TimeoutExpired):  # numba alone compiles f in ~0.1 s and exits
            waiter.wait(timeout=1.5)
        out, err = run("nolock").communicate(timeout=120)
        assert out.split("\n")[1] == "7 ['f'] 0", err  # compiled (and saved) beside the held lock
    finally:
        os.close(held)  # releases it
    out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, err
    assert out.strip() == "7 [] 1"  # nothing compiled: f came from the cache


def test_each_unless_busy_goes_on_past_a_busy_kernel_only():
    """The walks' step runner: a step that meets a busy kernel (KernelBusy) is left for the next, inside skip_busy;
    any other error is the walk's own and propagates."""
    ran = []

    def busy():
        ran.append(("busy", cache._compiling.skip))
        raise cache.KernelBusy("a kernel another process compiles")

    cache.each_unless_busy([busy, lambda: ran.append(("next", cache._compiling.skip))])
    assert ran == [("busy", True), ("next", True)] and not getattr(cache._compiling, "skip", False)
    with pytest.raises(ZeroDivisionError):
        cache.each_unless_busy([lambda: 1 / 0, lambda: ran.append("not reached")])
    assert ran[-1] == ("next", True)


def test_a_busy_kernel_is_skipped_inside_skip_busy(tmp_path, monkeypatch):
    """Inside cache.skip_busy, calling a kernel whose signature's compile lock another holder has raises KernelBusy
    (the compile-ahead walk then takes another step); once the lock is free the same call compiles it; a lock of
    another signature of the kernel is not waited for (one lock per signature)."""
    (tmp_path / "busy_mod.py").write_text("import numba\n\n\n@numba.njit(cache=True)\ndef g(x):\n    return x * 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import busy_mod
    from numba import types

    index = busy_mod.g._cache._cache_file._index_path
    os.makedirs(os.path.dirname(index), exist_ok=True)
    held = cache._flock(cache.compile_lock(index, (types.int64,)), 0.0)
    assert held is not None
    try:
        with cache.skip_busy():
            with pytest.raises(cache.KernelBusy):
                busy_mod.g(3)
            assert busy_mod.g(2.5) == 7.5  # another signature: its own lock, free (a kernel's lock: KernelBusy)
    finally:
        os.close(held)
    with cache.skip_busy():
        assert busy_mod.g(3) == 9


def test_the_marker_cache_folders_are_numbas(monkeypatch, tmp_path):
    """compile_ahead works out the cache folders of kernels/ggml and kernels/lanes (its first-run markers) without
    importing numba: the same folders as kernels.base.cache.cache_dir, in the tree, under NUMBA_CACHE_DIR, under
    REFIMPL_KERNEL_CACHE, and with both."""
    for numba_dir, shared in ((None, None), (str(tmp_path / "numba"), None), (None, str(tmp_path / "shared")),
                              (str(tmp_path / "numba"), str(tmp_path / "shared"))):
        for name, value in (("NUMBA_CACHE_DIR", numba_dir), (cache.SHARED_ENV, shared)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        monkeypatch.setattr(numba.config, "CACHE_DIR", numba_dir or "")
        assert set(compile_ahead.MARKER.values()) == {"ggml", "lanes"}
        for name in compile_ahead.MARKER.values():
            assert compile_ahead.kernel_cache_dir(name) == cache.cache_dir(cache.PACKAGE / name)
    assert cache.cache_dir(cache.PACKAGE / "ggml").parent == tmp_path / "numba"  # NUMBA_CACHE_DIR wins


def _args(*argv):
    from refimpl.cli import build_parser

    return build_parser().parse_args(list(argv))


def test_the_child_starts_only_for_a_first_run(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(compile_ahead.ENV, "1")
    ggml = _args("run", str(TRAINED_PATH), "--emulate=ggml", "--tokens", "1,2")
    plain = _args("run", str(TRAINED_PATH), "--tokens", "1,2")
    assert compile_ahead.wanted(ggml) == str(TRAINED_PATH)  # an empty cache
    assert compile_ahead.wanted(plain) == str(TRAINED_PATH)  # the plain numerics too
    assert compile_ahead.wanted(_args("run", str(TRAINED_PATH), "--tokens", "1,2", "--emulate")) == str(TRAINED_PATH)
    assert compile_ahead.wanted(_args("run", str(TRAINED_PATH), "--tokens", "1,2", "--kernel", "numpy")) is None
    assert compile_ahead.wanted(_args("run", str(tmp_path / "missing.gguf"), "--emulate=ggml")) is None  # the run says why
    import refimpl.io.meminfo as meminfo

    monkeypatch.setattr(meminfo, "mem_available", lambda: os.path.getsize(TRAINED_PATH) // 2)
    assert compile_ahead.wanted(ggml) == str(TRAINED_PATH)  # a file of any size: the child loads its stand-in
    monkeypatch.undo()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(compile_ahead.ENV, "0")
    assert compile_ahead.wanted(ggml) is None  # turned off
    monkeypatch.setenv(compile_ahead.ENV, "1")
    ggml_dir = compile_ahead.kernel_cache_dir("ggml")
    ggml_dir.mkdir(parents=True)
    (ggml_dir / "mulmat_q8.q8_0_mul_mat-244.py311.nbi").write_bytes(b"")
    assert compile_ahead.wanted(ggml) is None  # not a first run of the ggml numerics
    assert compile_ahead.wanted(plain) == str(TRAINED_PATH)  # each numerics by its own marker
    lanes_dir = compile_ahead.kernel_cache_dir("lanes")
    lanes_dir.mkdir(parents=True)
    (lanes_dir / "pack.matmul_lanes_q8_0-500.py311.nbi").write_bytes(b"")
    assert compile_ahead.wanted(plain) is None


def test_a_run_packs_at_load_whatever_the_cache_holds(monkeypatch, tmp_path, make_fixture):
    """``run.load_for_run`` packs (lays out) at load, on an empty cache and a full one alike: which kernels a run takes
    never depends on what is cached (a run that packed after its first token took the unpacked matrices' kernels for
    that token, which a first run that packed first left to the second run); plain greedy of at most one token makes
    no copies (the prompt's forward pass is its only one), nor does plain greedy on a model under ``PACK_MIN_BYTES``;
    ``--pack on`` and a speculative run pack whatever the length; ``cmd_run`` decodes the model so loaded."""
    from refimpl.cli import common, main, run
    from refimpl.model import load as model_load

    def loaded(*argv, path=TRAINED_PATH, n=2):
        args = _args("run", str(path), "--tokens", "1,2", "-n", str(n), *argv)
        return run.load_for_run(args, common.ctx_from_args(args)).packed_bytes > 0

    for cache in ("empty", "full"):
        monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / cache))
        if cache == "full":
            for numerics in ("ggml", "lanes"):
                folder = compile_ahead.kernel_cache_dir(numerics)
                folder.mkdir(parents=True)
                (folder / "kernel-1.py311.nbi").write_bytes(b"")
        assert not loaded()  # builtin:kjv: too small to pay off
        with monkeypatch.context() as m:
            m.setattr(model_load, "PACK_MIN_BYTES", 0)
            assert loaded() and loaded("--mtp") and loaded("--mtp", n=1) and loaded("--pack", "on", n=1)
            assert not loaded(n=1) and not loaded(n=0) and not loaded("--pack", "off")
    monkeypatch.delenv("NUMBA_CACHE_DIR")

    require_llama_cpp()  # --emulate=ggml follows the installed libggml; CI=true: a failure
    q4_k_m = make_fixture("tiny", "q4_k_m")  # its Q4_K and Q6_K matrices laid out (builtin:kjv's Q8_0: no layout here)
    assert loaded("--emulate=ggml", path=q4_k_m) and not loaded("--emulate=ggml", path=q4_k_m, n=1)
    seen = []
    load_for_run = run.load_for_run
    monkeypatch.setattr(run, "load_for_run", lambda *a, **kw: seen.append(load_for_run(*a, **kw)) or seen[-1])
    decoded = []
    import refimpl.decode.greedy as greedy_module

    monkeypatch.setattr(greedy_module, "greedy", lambda model, *a, **kw: decoded.append(model) or [1])
    assert main(["run", str(q4_k_m), "--emulate=ggml", "--tokens", "1,2", "-n", "2", "--json"]) == 0
    assert len(seen) == 1 and decoded == seen and seen[0].packed_bytes > 0


def test_the_child_is_spawned_before_the_flags_are_parsed(monkeypatch, tmp_path):
    """compile_ahead.spawn starts the child from the command line's words alone (before the parser's imports), for a
    ``run`` on an empty cache of its numerics (ggml's when a word names it); start() then hands it the parsed flags,
    or ends it when they want no child; a child whose stdin ends before any flags exits quietly; main() never leaves
    one behind."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(compile_ahead.ENV, "1")
    ggml = ["run", str(TRAINED_PATH), "--emulate", "ggml", "--tokens", "1,2"]
    lanes_dir = compile_ahead.kernel_cache_dir("lanes")
    lanes_dir.mkdir(parents=True)
    (lanes_dir / "pack.matmul_lanes_q8_0-500.py311.nbi").write_bytes(b"")
    assert compile_ahead.spawn(["run", str(TRAINED_PATH), "--tokens", "1,2"]) is None  # the plain numerics: cached
    assert compile_ahead.spawn(["audit", str(TRAINED_PATH), "--emulate=ggml"]) is None  # not run
    assert compile_ahead.spawn([]) is None
    monkeypatch.setenv(compile_ahead.ENV, "0")
    assert compile_ahead.spawn(ggml) is None  # turned off
    monkeypatch.setenv(compile_ahead.ENV, "1")

    child = compile_ahead.spawn(ggml)
    assert child is not None
    try:
        child.proc.stdin.close()  # no flags: the child's imports, then the end of its stdin
        assert child.proc.wait(timeout=120) == 0
    finally:
        child.close()

    numpy = ["run", str(TRAINED_PATH), "-p", "ggml", "--kernel", "numpy"]
    child = compile_ahead.spawn(numpy)
    assert child is not None  # a word names ggml (the prompt), but the flags want numpy's definitions: no kernel
    assert compile_ahead.start(_args(*numpy), child) is None
    assert child.proc.poll() is not None  # ended by start()

    child = compile_ahead.spawn(ggml)
    try:
        assert compile_ahead.start(_args(*ggml), child) is child  # handed the flags
        assert child.proc.poll() is None  # loading the model, then waiting for the prompt's length
    finally:
        child.close()

    from refimpl.cli import main

    spawned = []
    spawn = compile_ahead.spawn
    monkeypatch.setattr(compile_ahead, "spawn", lambda argv: spawned.append(spawn(argv)) or spawned[-1])
    assert main([*ggml, "--threads", "0"]) == 2  # refused after the spawn
    assert main([*ggml, "--frobnicate"]) == 2
    assert len(spawned) == 2 and all(c is not None and c.proc.poll() is not None for c in spawned)


def test_a_child_that_failed_is_closed_quietly():
    helper = compile_ahead.Helper()
    helper.hand(b"not a pickle")
    helper.proc.wait(timeout=120)  # the child says why on its stderr (not kept) and exits
    helper.begin(5)
    helper.close()
    assert helper.proc.returncode not in (None, 0)


_WALK_THEN_RUN = '''
import io, json, pickle, sys
from numba.core import sigutils
from numba.core.dispatcher import Dispatcher
from refimpl.cli import build_parser, compile_ahead, main

met = []
compile_ = Dispatcher.compile


def recorded(self, sig):
    key = tuple(sigutils.normalize_signature(sig)[0])
    if self.overloads.get(key) is None:
        met.append(self.py_func.__qualname__ + str(key))
    return compile_(self, sig)


Dispatcher.compile = recorded
argv = json.loads(sys.argv[1])
fields = {k: v for k, v in vars(build_parser().parse_args(argv)).items() if k != "func"}
compile_ahead._child(io.BytesIO(pickle.dumps(fields) + b"5\\n"))
walked = len(met)
assert main(argv) == 0
print(json.dumps({"walked": walked, "then": met[walked:]}))
'''


@pytest.mark.parametrize("numerics, model, n", [
    (["--emulate=ggml"], "kjv", 3), (["--emulate=ggml"], "q4_k_m", 3), (["--emulate=ggml"], "q4_k_m", 1),
    (["--emulate=ggml", "--route-trace", "{tmp}/routes.csv"], "q4_k_m", 3),
    ([], "kjv", 3), ([], "q4_k_m", 3), (["--emulate"], "kjv", 3)],
    ids=["ggml", "ggml-q4_k_m", "ggml-q4_k_m-one", "ggml-q4_k_m-route-trace", "plain", "plain-q4_k_m", "emulate"])
def test_the_walk_compiles_every_kernel_of_the_run(numerics, model, n, make_fixture, tmp_path):
    """In one new process: the child's walk (the run's flags, a 5-token prompt) and then ``refimpl run`` with that
    prompt: the run meets no kernel signature the walk has not compiled or loaded (a kernel added to the trunk or the
    graph but not reached by its walk fails this) — for the ggml graph, the plain trunk and --emulate's; on a Q4_K_M
    file too, whose four layers' stand-in is three (refimpl/io/stand_in.py) and whose ggml decode takes the column
    layout's kernels (one per weight kind and threading: kernels.ggml.columns) beside builtin:kjv's Q8_0 rows, plain
    packed (``PACK_MIN_BYTES`` lowered to 0 in both processes); with ``-n 1`` the prompt alone, not laid out; with
    ``--route-trace`` the streamed experts' kernels (the run streams them to see their routing)."""
    numerics = [word.format(tmp=tmp_path) for word in numerics]
    if "--emulate=ggml" in numerics:
        require_llama_cpp()  # --emulate=ggml follows the installed libggml (refimpl.cli.common.ggml_path); CI=true: a failure
    import json

    path = TRAINED_PATH if model == "kjv" else make_fixture("tiny", model)
    argv = ["run", str(path), *numerics, "--tokens", "1,2,3,4,5", "-n", str(n), "--json"]
    script = _WALK_THEN_RUN if model == "kjv" else "import refimpl.model.load as M; M.PACK_MIN_BYTES = 0\n" + _WALK_THEN_RUN
    done = subprocess.run([sys.executable, "-c", script, json.dumps(argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["walked"] > 0 and result["then"] == []


@pytest.mark.deep
@pytest.mark.parametrize("numerics", [["--emulate=ggml"], []], ids=["ggml", "plain"])
def test_a_first_run_with_its_child_prints_what_the_warm_run_prints(tmp_path, numerics):
    """``refimpl run`` (``--emulate=ggml`` and plain) on an empty cache starts the child (its report says so), prints
    what the warm run then prints from the cache, and leaves no child behind."""
    if numerics:
        require_llama_cpp()
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), **{compile_ahead.ENV: "1"})
    argv = [sys.executable, "-m", "refimpl", "run", str(TRAINED_PATH), *numerics, "-p", "In the beginning", "-n", "16"]
    cold = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert cold.returncode == 0, cold.stderr
    assert "(a second process compiled others beside it: REFIMPL_COMPILE_AHEAD=0 turns it off)" in cold.stderr
    children = []  # a child of this run: compile_ahead's module, this test's numba cache in its environment
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (b"refimpl.cli.compile_ahead" in (proc / "cmdline").read_bytes()
                    and f"NUMBA_CACHE_DIR={tmp_path / 'numba'}\0".encode() in (proc / "environ").read_bytes()):
                children.append(proc.name)
        except OSError:  # a process that ended meanwhile
            pass
    assert children == []
    warm = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert warm.returncode == 0 and "compil" not in warm.stderr, warm.stderr
    assert warm.stdout == cold.stdout and cold.stdout.strip()
