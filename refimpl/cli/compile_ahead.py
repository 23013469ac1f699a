"""The first run's second process: ``refimpl run`` on an empty numba cache compiles its kernels one after the other
(~6 for the plain numerics, ~20 with ``--emulate=ggml``: docs/performance.md, "First run"); a child process started
beside it compiles the kernels the run will meet last (:func:`refimpl.model.ahead.walk`, :func:`refimpl.graph.ahead.walk`)
into the same cache, so the two cores share the compiling. A kernel both need is compiled by one and loaded by the
other (kernels/base/cache.py ``_lock_compiles``): the run's numbers are the same with or without the child, which
only ever adds machine code to the cache.

When: ``refimpl run`` with numba's kernels (not ``--kernel numpy``); numba's cache on and holding no kernel of the
run's numerics' marker folder (:data:`MARKER`: a fresh clone, a new ``NUMBA_CACHE_DIR``, a change to ``kernels/``);
``REFIMPL_COMPILE_AHEAD`` not ``0`` (the switch: ``0`` compiles in the run alone, as before). The run names the
child in its compile report's summary line. A file of any size has one: the child loads the model's stand-in
(:func:`refimpl.io.stand_in.stand_in`: the run's decisions made for the whole file, then one trunk layer of each
kind kept and packed), its matrices mapped (their pages the run's in the page cache), so its copies are a part of the
run's own — a 40-layer Q4_K_M file's are its LM head's and a few layers'.

How: the child (``python -m refimpl.cli.compile_ahead``) is started first thing, before the run parses its flags
(:func:`spawn`: the parser's imports, numba's among them, take ~0.4 s, and the child's own ~0.9 s then run beside
them), when the words of the command line may make such a run; it imports what it needs, then reads the run's parsed
flags from its stdin (:func:`start`: or the end of it, when the flags want no child, and exits), loads the model's
stand-in while the run loads the model (both packed at load, as refimpl/cli/run.py ``load_for_run`` decides), waits
on its stdin for the prompt's length (:meth:`Helper.begin`), and walks the prompt's first ubatch and, when the run
generates more than one token, one decoded token. The run stops it when it ends (:meth:`Helper.close`):
numba writes its cache files by rename, so a child stopped in a save leaves no torn file (at worst an index entry
whose machine code it had not written yet: the next run compiles that kernel again).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path

ENV = "REFIMPL_COMPILE_AHEAD"
#: What the run's compile summary adds when a child ran (refimpl.cli.compile_report).
NOTE = f" (a second process compiled others beside it: {ENV}=0 turns it off)"
#: The folder of ``kernels`` whose cache tells a first run, per numerics: the ggml ops; for the plain numerics
#: (``--emulate``'s approximate configurations too) the lane kernels, which every matmul of theirs calls.
MARKER = {"ggml": "ggml", "plain": "lanes"}


def _model_path(args) -> str:
    """The file the run will load (:func:`refimpl.cli.common.load`'s choice, without its note; a built-in one is
    built here if missing)."""
    from refimpl.cli.common import default_model, model_given
    from refimpl.fixtures.builtin import resolve_model

    return str(resolve_model(str(default_model(model_given(args), note=False))))


def kernel_cache_dir(name: str) -> Path:
    """Where numba caches the kernels of folder ``kernels/<name>`` (``kernels.base.cache.cache_dir``), worked out
    without importing ``kernels`` (and numba: ~0.4 s the child would start later): the folder's ``__pycache__``;
    with ``NUMBA_CACHE_DIR`` numba's subfolder for it there (``UserProvidedCacheLocator``: the folder's name and the
    sha1 of its path); with ``REFIMPL_KERNEL_CACHE`` (and no ``NUMBA_CACHE_DIR``) the shared key's ``<name>`` folder
    (``kernels.base.cache.shared_key``: the kernels' hash, numba's and Python's versions)."""
    package = Path(importlib.util.find_spec("kernels").submodule_search_locations[0]).resolve()
    folder = package / name
    base = os.environ.get("NUMBA_CACHE_DIR")
    if base:
        return Path(base) / f"{folder.name}_{hashlib.sha1(str(folder).encode()).hexdigest()}"
    shared = os.environ.get("REFIMPL_KERNEL_CACHE")
    if shared:
        return Path(shared).expanduser().resolve() / _shared_key(package) / name
    return folder / "__pycache__"


@functools.cache
def _shared_key(package: Path) -> str:
    """``kernels.base.cache.shared_key`` of the ``kernels`` package at ``package``: the hash of its sources (~10 ms:
    once a process — every ``refimpl run`` asks at start, :func:`spawn`, and again once its flags are parsed,
    :func:`wanted`), numba's and Python's versions."""
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    version = f"numba{importlib.metadata.version('numba')}-py{sys.version_info[0]}{sys.version_info[1]}"
    return f"{digest.hexdigest()[:16]}-{version}"


def _switched_on(numerics: str) -> bool:
    """The switch is not ``0``, numba compiles, and no kernel of ``numerics``' :data:`MARKER` folder is cached (a first
    run)."""
    return (os.environ.get(ENV, "1") != "0" and os.environ.get("NUMBA_DISABLE_JIT") != "1"
            and not any(kernel_cache_dir(MARKER[numerics]).glob("*.nbi")))


def _numerics(args) -> str | None:
    """``"ggml"`` (``--emulate=ggml``), ``"plain"`` (the trunk of refimpl/model: the definition, ``--emulate``'s
    approximate configurations), or None (``--kernel numpy``: nothing compiles)."""
    from refimpl.cli.common import emulate_family

    if emulate_family(args) == "ggml":
        return "ggml"
    return None if getattr(args, "kernel", "numba") == "numpy" else "plain"


def wanted(args) -> str | None:
    """The model path to hand a child, or None when a run with these arguments starts none (the module docstring)."""
    numerics = _numerics(args)
    if numerics is None or not _switched_on(numerics):
        return None
    try:
        path = _model_path(args)
        os.stat(path)
    except Exception:  # a bad MODEL: the run says so, in its own words
        return None
    return path


class Helper:
    """The child process of one run: :meth:`hand` gives it the run's flags, :meth:`begin` the prompt's length,
    :meth:`close` ends it."""

    def __init__(self):
        env = dict(os.environ, **{ENV: "0"})  # the child starts no child
        self.proc = subprocess.Popen([sys.executable, "-m", "refimpl.cli.compile_ahead"], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def hand(self, flags: bytes) -> None:
        """The run's flags, pickled (:func:`start`)."""
        self._send(flags)

    def _send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except OSError:  # the child is gone: the run compiles alone
            pass

    def begin(self, n_tokens: int) -> None:
        """The run is about to compute its prompt of ``n_tokens`` tokens: the child walks it."""
        self._send(f"{n_tokens}\n".encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        try:
            self.proc.stdin.close()
        except OSError:
            pass


def spawn(argv: list[str]) -> Helper | None:
    """The child, started before the flags are parsed (the module docstring), when ``argv`` may be a first run: the
    command ``run``, the switch on and the cache of its numerics empty (:func:`_switched_on`: ``ggml``'s when a word
    names ggml — ``--emulate=ggml``, ``--emulate ggml:NAME``: every spelling has one —, else the plain numerics');
    else None. Nothing here imports numba. :func:`start` then hands it the flags or ends it."""
    if not argv or argv[0] != "run":
        return None
    if not _switched_on("ggml" if any("ggml" in word for word in argv[1:]) else "plain"):
        return None
    return Helper()


def start(args, child: Helper | None = None) -> Helper | None:
    """The :class:`Helper` of ``refimpl run`` with ``args`` — ``child`` (:func:`spawn`'s) handed the flags, or one
    started now — or None (:func:`wanted`), ``child`` then closed."""
    path = wanted(args)
    fields = {k: v for k, v in vars(args).items() if k not in ("func", "compile_ahead")}
    try:
        flags = None if path is None else pickle.dumps(dict(fields, m=None, model=path))  # the flags, the model named
    except Exception:  # a flag value pickle cannot carry: the run compiles alone
        flags = None
    if flags is None:
        if child is not None:
            child.close()
        return None
    child = child or Helper()
    child.hand(flags)
    return child


def _child(stdin) -> None:
    """The child: its imports; the run's flags (pickled: an empty ``stdin``, none, ends it) and then the prompt's
    length from ``stdin``; the run's model and ``Ctx``; the walk."""
    import argparse
    import dataclasses

    from refimpl.cli import run
    from refimpl.cli.common import ctx_from_args
    from refimpl.graph.ahead import walk as ggml_walk
    from refimpl.model.ahead import walk as plain_walk
    from refimpl.model.state import SeqState

    try:
        args = argparse.Namespace(**pickle.load(stdin))
    except EOFError:  # started by spawn() for flags that then wanted no child
        return
    ctx = dataclasses.replace(ctx_from_args(args), announce=None)
    model = run.load_for_run(args, ctx, stand_in=True)  # as cmd_run loads it, one trunk layer of each kind
    line = stdin.readline()  # the run has its prompt by now, as a rule: it loads the model less than we do
    if not line.strip():  # the run ended before its prompt
        return
    state = SeqState.fresh(model.config)
    walk = ggml_walk if _numerics(args) == "ggml" else plain_walk
    walk(model, state, min(int(line), ctx.n_ubatch), ctx, "last")  # the prompt (its first ubatch, at most 512 tokens)
    if args.n_predict > 1:
        walk(model, state, 1, ctx, "all")  # a decoded token


if __name__ == "__main__":
    import numpy as np

    with np.errstate(all="ignore"):
        _child(sys.stdin.buffer)
