"""numba's on-disk cache of this package's kernels: where it lives, when it is dropped, and how processes share it
(``CACHE = True`` in :mod:`kernels.base.flags`, whose docstring says why). Caching never changes a result: a kernel
loaded from the cache is the machine code its compile saved.

Where
    Each ``kernels/`` folder's ``__pycache__`` (numba's default); with ``NUMBA_CACHE_DIR`` set, numba's subfolder
    for each folder there (named after the folder's path); with ``REFIMPL_KERNEL_CACHE=DIR`` set (and no
    ``NUMBA_CACHE_DIR``), ``DIR/<key>/<folder>``, ``<key>`` the hash of every ``kernels/**/*.py`` with numba's and
    Python's versions (:func:`shared_root`): every checkout or install whose kernels are the same byte for byte
    shares one compiled copy, wherever it lies (a second clone, a new virtualenv, CI's fresh clone on a machine
    that ran the suite before). The :data:`SHARED_KEEP` most recently used keys stay; older ones are deleted.
When it is dropped
    numba invalidates a cached function only when *its own* source file changes, but a kernel in ``matmul.py`` has
    the decoders of ``dequant.py`` compiled into it: so the cache is keyed on the whole package and cleared when any
    ``kernels/**/*.py`` changes (:func:`_drop_stale_cache`; under ``REFIMPL_KERNEL_CACHE`` the key is the folder's
    name, so another key is another folder). numba's own key holds the CPU's name and features, so one cache can
    serve several machines.
Sharing
    Processes that compile into one cache at once save one at a time (:func:`_lock_cache_saves`), and compile each
    kernel once: a process about to compile a kernel that another one is compiling waits for it and loads its
    machine code from the cache (:func:`_lock_compiles`; the first run's second process,
    ``refimpl/cli/compile_ahead.py``, relies on it), or, inside :func:`skip_busy`, is told so (:class:`KernelBusy`)
    and does something else first. Each process numbers the functions it compiles from its own random start
    (:func:`_distinct_function_ids`), so two kernels compiled apart never share a symbol in a third that loads both.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import sys
import threading
from pathlib import Path

import numba
from numba.core import sigutils

#: The environment variable naming the shared cache directory (the module docstring, "Where").
SHARED_ENV = "REFIMPL_KERNEL_CACHE"
#: How many keys (kernels' versions) the shared cache directory keeps.
SHARED_KEEP = 4


PACKAGE = Path(__file__).resolve().parents[1]  # kernels/


def cache_dirs() -> list[Path]:
    """Where numba caches this package's kernels: one folder per source folder (``kernels/``, ``kernels/base/``,
    ``kernels/lanes/`` …), as the module docstring's "Where" says (:func:`cache_dir`)."""
    folders = sorted({path.parent for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts})
    return [cache_dir(folder) for folder in folders]


def cache_dir(folder: Path) -> Path:
    """Where numba caches the kernels of one source folder (:func:`cache_dirs`)."""
    if numba.config.CACHE_DIR:
        from numba.core.caching import UserProvidedCacheLocator

        return Path(numba.config.CACHE_DIR) / UserProvidedCacheLocator.get_suitable_cache_subpath(str(folder / "x.py"))
    root = shared_root()
    if root is not None:
        return root / folder.relative_to(PACKAGE)
    return folder / "__pycache__"


def _source_digest() -> str:
    """sha256 over every ``kernels/**/*.py``, names relative to the package."""
    digest = hashlib.sha256()
    for path in sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts):
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.cache
def shared_key() -> str:
    """The shared cache's folder name for this package's kernels: ``<hash>-numba<version>-py<major><minor>``, the
    hash :func:`_source_digest`'s first 16 hex digits (the kernels are read once per process)."""
    return f"{_source_digest()[:16]}-numba{numba.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"


def shared_root() -> Path | None:
    """``DIR/<key>`` (:func:`shared_key`) with ``REFIMPL_KERNEL_CACHE=DIR`` set and ``NUMBA_CACHE_DIR`` not; made if
    missing, its time of use renewed and older keys pruned (:func:`_use`). None otherwise, and where it cannot be
    made (numba then caches in each folder's ``__pycache__``)."""
    base = os.environ.get(SHARED_ENV)
    if not base or numba.config.CACHE_DIR:
        return None
    root = Path(base).expanduser().resolve() / shared_key()
    return root if _use(root) else None


@functools.cache
def _use(root: Path) -> bool:
    """Make ``root``, mark it used now, and delete all but the :data:`SHARED_KEEP` most recently used keys beside it
    (once per process). False where ``root`` cannot be made."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        os.utime(root)
    except OSError:
        return False
    key = re.compile(r"[0-9a-f]{16}-numba.+-py\d+")
    used = []  # (time of use, folder) of every key
    for path in root.parent.iterdir():
        try:
            if key.fullmatch(path.name) and path.is_dir():
                used.append((path.stat().st_mtime, path))
        except OSError:  # another process pruned it
            pass
    for _, old in sorted(used, reverse=True)[SHARED_KEEP:]:
        if old != root:
            shutil.rmtree(old, ignore_errors=True)
    return True


def _drop_stale_cache() -> None:
    """Delete numba's cached kernels (:func:`cache_dirs`) when any ``kernels/**/*.py`` changed.

    The package-wide source hash is stored next to each folder's cache files. Also with
    ``NUMBA_CACHE_DIR``: numba's own per-file invalidation would keep a kernel of ``lanes/pack.py`` whose
    IR, emitted by ``lanes/ir.py``, changed. (Under ``REFIMPL_KERNEL_CACHE`` the folder is the hash's own.) A
    read-only tree (no ``NUMBA_CACHE_DIR``) makes numba fall back to its user-wide cache directory, which is left
    to numba's per-file invalidation.
    """
    if os.environ.get("NUMBA_DISABLE_JIT") == "1":
        return
    stamp = _source_digest()
    for directory in cache_dirs():
        stamp_file = directory / "numba-kernels-source.sha256"
        try:
            if stamp_file.read_text() == stamp:
                continue
        except OSError:
            pass
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for pattern in ("*.nbi", "*.nbc"):
                for stale in directory.glob(pattern):
                    stale.unlink(missing_ok=True)
            stamp_file.write_text(stamp)
        except OSError:  # read-only tree: numba falls back to its user-wide cache directory
            pass


COMPILE_WAIT_S = 60.0  # the longest a process waits for another one's compile of a kernel before compiling it too


class KernelBusy(RuntimeError):
    """Raised, inside :func:`skip_busy`, by the call of a kernel that another process is compiling."""


_compiling = threading.local()  # .depth: compiles in progress on this thread; .skip: inside skip_busy


@contextlib.contextmanager
def skip_busy():
    """Within the block, a call from Python of a kernel whose compile lock another process holds raises
    :class:`KernelBusy` instead of waiting for it (a kernel that a compile in progress calls is waited for as
    always): the first run's second process (refimpl/cli/compile_ahead.py) then takes another step of its walk and
    meets that kernel again at its end, loaded from the cache."""
    outer = getattr(_compiling, "skip", False)
    _compiling.skip = True
    try:
        yield
    finally:
        _compiling.skip = outer


def each_unless_busy(steps) -> None:
    """Call each of ``steps`` (functions of no argument) inside :func:`skip_busy`, going on to the next where one
    meets a kernel another process is compiling (:class:`KernelBusy`): the first run's second process's walks
    (refimpl/model/ahead.py, refimpl/graph/ahead.py), whose last pass loads that kernel from the cache."""
    with skip_busy():
        for step in steps:
            try:
                step()
            except KernelBusy:
                pass


def _busy(path: str) -> bool:
    """Whether another process holds the ``flock`` on ``path`` now (tried without waiting, and let go at once)."""
    try:
        import fcntl

        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    except (ImportError, OSError):  # no flock, no lock file: nothing to wait for
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the lock where it was had


def _flock(path: str, wait_s: float | None):
    """An exclusive ``flock`` on ``path`` (created if missing), waited for at most ``wait_s`` seconds (None: as long as
    it takes): the open file descriptor (closing it releases the lock), or None when the file cannot be made, the
    system has no ``flock`` (Windows), or the wait ran out."""
    import time

    try:
        import fcntl

        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    except (ImportError, OSError):
        return None
    deadline = None if wait_s is None else time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if deadline is None else fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.005)
        except OSError:
            os.close(fd)
            return None


@contextlib.contextmanager
def _held(path: str, wait_s: float | None = None):
    """The block runs holding :func:`_flock`'s lock on ``path``, or without one where it cannot be had."""
    fd = _flock(path, wait_s)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def compile_lock(index: str, key: tuple) -> str:
    """The lock file of signature ``key`` (its argument types) of the kernel whose cache index is ``index``:
    ``<index>.<hash of the types>.compiling``, the same name in every process."""
    return f"{index}.{hashlib.sha1(repr(key).encode()).hexdigest()[:16]}.compiling"


def _threads_launched() -> None:
    """Launch numba's threading layer (once a process; then a no-op). A ``prange`` kernel's code calls the layer's
    ``numba_parallel_for``, a symbol numba hands to LLVM only when it launches the layer: compiling a parallel kernel
    launches it, a decorated ``parallel=True`` one too, but a serial kernel loaded from the cache with a parallel
    callee compiled into it (``repack_k.gemv_k_id`` -> ``repacked_k_id_parallel``) does not, and its first call jumped
    through an unresolved symbol: a segmentation fault in a process that had run no parallel kernel before."""
    from numba.np.ufunc.parallel import _launch_threads

    _launch_threads()


def _lock_compiles() -> None:
    """Make numba's ``Dispatcher.compile`` (a kernel's new signature: loaded from the cache, or compiled and saved)
    hold an exclusive ``flock`` on the signature's :func:`compile_lock` while it looks in the cache, compiles and saves.

    Two processes that need one kernel on an empty cache (two ``refimpl`` runs, the suite's workers, a run and its
    compile-ahead process) would otherwise both compile it; under the lock the second one waits and then finds the
    first one's machine code in the cache (``Dispatcher.compile`` looks there first). One lock per signature of a
    kernel: two signatures compile side by side (a helper's Q4_K and Q6_K copies in a run and its second process:
    one lock per kernel made one wait ~8 s for the other's), their saves one after the other
    (:func:`_lock_cache_saves`); the kernels call each other without cycles, so two processes each holding one
    lock while waiting for a callee's never wait for each other. A kernel already compiled in this process takes no
    lock; a kernel without a disk cache neither. After :data:`COMPILE_WAIT_S` (another process stopped while holding
    it) a process compiles the kernel itself, as it would without the lock: the same machine code."""
    from numba.core.dispatcher import Dispatcher

    compile_ = Dispatcher.compile
    if getattr(compile_, "locked", False):
        return

    @functools.wraps(compile_)  # its __wrapped__: numba's own (tests race saves without this lock)
    def locked_compile(self, sig):
        index = getattr(getattr(self._cache, "_cache_file", None), "_index_path", None)
        key = tuple(sigutils.normalize_signature(sig)[0])
        if index is None or self.overloads.get(key) is not None:
            return compile_(self, sig)
        _threads_launched()  # before its machine code may come from the cache
        lock = compile_lock(index, key)
        depth = getattr(_compiling, "depth", 0)
        if not depth and getattr(_compiling, "skip", False) and _busy(lock):
            raise KernelBusy(f"{self.py_func.__qualname__} is being compiled by another process")
        _compiling.depth = depth + 1
        try:
            with _held(lock, COMPILE_WAIT_S):
                return compile_(self, sig)
        finally:
            _compiling.depth = depth

    locked_compile.locked = True
    Dispatcher.compile = locked_compile


def _lock_cache_saves() -> None:
    """Make numba's ``IndexDataCacheFile.save`` (a compiled signature: its index entry, then its machine code) hold an
    exclusive ``flock`` on ``<index>.lock`` while it reads the index, picks a data file and writes both.

    numba picks the data file as the first number its index does not list (``<kernel>-<line>.py311.1.nbc``). Two
    processes compiling two signatures of one kernel at once on an empty cache (the suite's workers; two ``refimpl``
    runs; a read-only and a writable weight array) both read the index before either saves it, both pick ``.1``, and
    one index entry then names the other signature's machine code: the next run loads it, and crashes or computes
    with the wrong array types. Under the lock the second save reads the first one's index and takes ``.2``. Where
    the lock file cannot be made (a read-only cache) or there is no ``flock`` (Windows), numba saves as before."""
    from numba.core.caching import IndexDataCacheFile

    save = IndexDataCacheFile.save
    if getattr(save, "locked", False):
        return

    def locked_save(self, key, data):
        with _held(self._index_path + ".lock"):
            return save(self, key, data)

    locked_save.locked = True
    IndexDataCacheFile.save = locked_save


def _shared_locator():
    """numba's cache locator for this package's kernels under ``REFIMPL_KERNEL_CACHE`` (the module docstring,
    "Where"), put first in numba's list: a function outside ``kernels/``, or any with ``NUMBA_CACHE_DIR`` set or
    without ``REFIMPL_KERNEL_CACHE``, is left to numba's own locators. numba's source stamp (the hash of the
    function's file) stays part of each entry."""
    from numba.core.caching import CacheImpl, _CacheLocator, _SourceFileBackedLocatorMixin

    class SharedCacheLocator(_SourceFileBackedLocatorMixin, _CacheLocator):
        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = str(cache_dir(Path(py_file).resolve().parent))

        def get_cache_path(self):
            return self._cache_path

        @classmethod
        def from_function(cls, py_func, py_file):
            if shared_root() is None or PACKAGE not in Path(py_file).resolve().parents:
                return None
            return super().from_function(py_func, py_file)

    if not any(c.__name__ == SharedCacheLocator.__name__ for c in CacheImpl._locator_classes):
        CacheImpl._locator_classes.insert(0, SharedCacheLocator)


def _distinct_function_ids() -> None:
    """Start numba's function ids (``FunctionIdentity``'s counter, 1, 2, … in every process) at a random point of
    2**48, so that no two processes hand out the same ones.

    numba names a compiled function's symbols and its *environment* (the constants its wrapper reads, such as a
    returned array's dtype) after its qualified name, its argument types and that id. Two closures of one factory
    (``ssm._transposed_rows``'s ``gated_delta_net_t`` for arm64-base and for arm64-sve256: one name, one signature,
    another captured constant) compiled by two processes that had made the same compiles before carry the same id,
    so the same names. A third process that loads both from the cache binds the second one's environment to the
    first one's, and the second one's return then fails in numba's runtime (``NRT_adapt_ndarray_to_python``:
    ``'descr' is NULL``). The ids only name symbols: nothing computed depends on them. Idempotent: the counter is
    replaced once per process."""
    import itertools
    import secrets

    from numba.core.bytecode import FunctionIdentity

    if not getattr(FunctionIdentity, "_refimpl_distinct_ids", False):
        FunctionIdentity._unique_ids = itertools.count(1 + secrets.randbits(48))
        FunctionIdentity._refimpl_distinct_ids = True


def install(enabled: bool) -> None:
    """What :mod:`kernels.base.flags` runs on import, with its ``CACHE``: the shared locator, the drop of a stale
    cache (only where caching is ``enabled``), the two locks, and function ids no other process hands out
    (:func:`_distinct_function_ids`). Idempotent."""
    _distinct_function_ids()
    _shared_locator()
    if enabled:
        _drop_stale_cache()
    _lock_cache_saves()
    _lock_compiles()
