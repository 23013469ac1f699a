"""Numeric and compile flags for every numba kernel in ``kernels/`` — in one place, with reasons.

Every compiled function in this package is decorated with :func:`jit` (never ``numba.njit``
directly), so the flags below are the whole story of how kernel code is compiled.

``FASTMATH = False``
    Never relaxed. ``fastmath`` lets LLVM reassociate sums (the order of a float64 row sum and of
    llama.cpp's float32 block accumulation is part of our numerics), contract ``a*b + c`` into an
    FMA (changes the rounding of the act-quant block combinations) and, with ``nnan``/``ninf``,
    assume values are finite. A kernel must give the same bits on every machine and thread count.
``ERROR_MODEL = "numpy"``
    IEEE semantics for division like C (``x/0`` is ``inf``/``nan``, no ``ZeroDivisionError``), and
    no per-division check in the hot loops. Our kernels guard their divisions the way llama.cpp does.
``CACHE = True``
    Compiled machine code is cached on disk: in each ``kernels/`` folder's ``__pycache__`` (``*.nbi``, ``*.nbc``),
    under ``NUMBA_CACHE_DIR``, or shared by every checkout of the same kernels under ``REFIMPL_KERNEL_CACHE``.
    Caching never changes results, it only skips recompilation. :mod:`kernels.base.cache` says
    where, drops the cache when any ``kernels/**/*.py`` changes (numba alone would keep a kernel of ``matmul.py``
    whose decoders, compiled into it from ``dequant.py``, changed), and makes processes that share one cache
    compile each kernel once.
One compiled copy per weight type
    A kernel that depends on the weight type is compiled once per type, for the types a model
    actually has, never for all of them: the type code ``kind`` is a compile-time constant. A
    top-level kernel (the one Python calls) is built by a factory decorated with :func:`per_type`,
    whose closure captures ``kind`` (an int, so numba's on-disk cache still finds it: the cache key
    hashes the captured values); inner kernels receive it as a literal argument and reach the
    type's own code through a :func:`by_type` switch. A runtime ``if kind == …`` chain would make
    numba compile every type's code into every kernel (minutes on the first run).
Literal arguments are constants
    A kernel called with a constant argument (an int or bool literal at the call site, as
    :func:`specialize`'s wrappers and a path's code passed down give) is compiled for that value
    (numba types it ``Literal[int](16)``), and :class:`Pipeline` makes the argument a constant in the
    kernel's code before numba prunes dead branches: ``if lanes == SVE128:`` then compiles only the branch
    taken. A path's kernel compiles its own code alone, not every path's (seconds on the first run). It
    never changes a result: the pruned branch is one that this value never takes. The other side: a helper
    compiles once per constant it is called with (and once more for each array that differs only in being
    read-only: the entry points hand their kernels :func:`read_only` views): an index or bound that selects no
    code is passed as ``np.int64(c)``, not ``c``. A constant that selects code pays where it prunes a branch;
    where it only unrolls a loop, LLVM takes longer (the delta net's ``lanes``: +0.4 s), and it stays an argument.
    A constant held in a variable (``neon = lanes == NEON or …``, ``glibc = … if neon else …``) is a runtime value
    again: test the argument where the branch is, or capture the constant in a factory's closure.
What a first run pays for
    Each ``@jit`` helper is compiled on its own (its machine code cached), and numba links its IR into
    every caller, where LLVM optimizes and emits it once more: a level of compiled calls that only passes
    arguments on costs 0.1–0.4 s (a factory's closure holds the loop itself, not a call of a kernel that
    holds it). A helper decorated ``jit(inline=True)`` is not compiled on its own: numba puts its code into
    each caller before typing it (numba's ``inline="always"``), so LLVM optimizes it once, in the kernel — the
    lane kernels' group functions (``lanes/pack.py``, ``matmul._rows_task``): a serial lane kernel's first
    compile 10.1 → 5.6 s for Q6_K. Not into a ``prange`` body: numba's parfor passes would analyse all that code
    (a parallel Q6_K lane kernel 10.7 → 19.2 s), so a parallel kernel calls the same code through one compiled
    ``*_task`` function. Not for a helper called from several places of one kernel (each place would get a
    copy — ``f16_round`` in flash attention's row: +0.5 s), nor where a runtime value selects the helper's code: each
    caller then types every branch (``_simd_dot`` under ``vec_dot_f16``: +1.0 s). A constant does prune: numba
    prunes dead branches again after it inlines (numba 0.68: a closure's constant or a literal argument passed on
    selects the inlined code's branch, as in a kernel of its own). numpy conveniences inside a kernel
    (``a.max()``, ``np.nonzero``, ``np.arange``, a slice assignment) compile numba's implementation of each
    (0.1–0.4 s): small kernels loop instead. A test Python can make (a shape's fit) is not a kernel. Per
    kernel: ``refimpl run``'s stderr on a cold cache (docs/performance.md, "First run").
``BOUNDSCHECK``
    Left at numba's default (off). Set ``NUMBA_BOUNDSCHECK=1`` to debug an out-of-range index.
Threading layer
    Left to numba (tbb, omp or workqueue). Results do not depend on it nor on
    ``numba.set_num_threads``: ``prange`` only ever splits independent output rows, and each output
    element is reduced by one thread in a fixed order.

``KERNEL_ISA`` (environment ``REFIMPL_KERNEL_ISA``: ``auto``, ``generic``, ``avx2`` or ``avx512``)
    The instruction-set level the row-lane kernels are built for (kernels/lanes/ir.py): ``auto`` (the
    default) is the best the numba target has; a lower level forces the generic twin of each
    ISA-specific path (``generic``: target-independent LLVM IR only, as an ARM64 host gets). Same bits
    at every level (tested). The level is a compile-time constant of each kernel, so numba caches
    each level's code apart.
``SERIAL_BELOW = 1 << 18``
    A product of fewer multiply-adds than this (weights × activation rows; value heads × state for
    the delta rule) runs on the calling thread instead of in a ``prange`` region: starting a parallel
    region and waiting at its barrier costs ~10 µs on an idle machine and far more when the cores are
    busy, more than a quarter-million multiply-adds take on one core (~40 µs). It never changes a
    result: serial or parallel, each output element is computed by one thread in the same order.

To run every kernel as plain Python (coverage, pdb, or to rule the compiler out), set
``NUMBA_DISABLE_JIT=1`` before importing: ``jit`` then returns the Python function unchanged and
``prange`` is ``range``. All kernel code is written to mean the same thing interpreted (explicit
``int(...)`` around byte reads, explicit ``np.float32(...)`` around every float32 operand), only
much slower.
"""

from __future__ import annotations

import functools
import os

import numba
from numba import types
from numba.core import ir
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.untyped_passes import InlineClosureLikes
from numba.extending import overload

from kernels.base import cache

FASTMATH = False
ERROR_MODEL = "numpy"
CACHE = True
#: False under ``NUMBA_DISABLE_JIT=1``: then the LLVM-IR lane kernels (kernels/lanes/pack.py), which
#: cannot run as Python, are skipped and every product takes the plain numba-or-Python path.
JIT_ENABLED = not numba.config.DISABLE_JIT
KERNEL_ISA = os.environ.get("REFIMPL_KERNEL_ISA", "auto")  # lane kernels' instruction-set level (docstring)
SERIAL_BELOW = 1 << 18  # multiply-adds under which a kernel runs on the calling thread (docstring)
cache.install(CACHE)  # numba's disk cache: located, dropped when stale, shared (kernels.base.cache)


@register_pass(mutates_CFG=False, analysis_only=False)
class LiteralArgsAsConstants(FunctionPass):
    """An argument compiled as an int or bool literal becomes that constant in the function's IR, so that
    numba's dead-branch pruning, which runs next, removes the branches it never takes (the docstring:
    "Literal arguments are constants")."""

    _name = "refimpl_literal_args_as_constants"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        changed = False
        for block in state.func_ir.blocks.values():
            for stmt in block.body:
                if not (isinstance(stmt, ir.Assign) and isinstance(stmt.value, ir.Arg)
                        and stmt.value.index < len(state.args)):
                    continue
                ty = state.args[stmt.value.index]
                if isinstance(ty, (types.IntegerLiteral, types.BooleanLiteral)):
                    const = ir.Const(ty.literal_value, loc=stmt.value.loc)
                    defs = state.func_ir._definitions[stmt.target.name]
                    defs[:] = [const if d is stmt.value else d for d in defs]
                    stmt.value = const
                    changed = True
        return changed


class Pipeline(CompilerBase):
    """numba's nopython pipeline with :class:`LiteralArgsAsConstants` before its first dead-branch pruning."""

    def define_pipelines(self):
        pm = DefaultPassBuilder.define_nopython_pipeline(self.state)
        pm.add_pass_after(LiteralArgsAsConstants, InlineClosureLikes)
        pm.finalize()
        return [pm]


def jit(*, parallel: bool = False, kind: int | None = None, variant: str = "", inline: bool = False):
    """The one decorator for compiled code in ``kernels/``: ``numba.njit`` with this module's flags.

    ``parallel=True`` only for the top-level kernels whose ``prange`` runs over independent output
    rows; every helper they call is serial. ``kind``: the type code a :func:`per_type` factory's
    kernel is built for; the kernel is then named ``<name>_<type>`` (e.g. ``matmul_lanes_q8_0``), the
    name of its cache files and of the compile report (``refimpl.cli.compile_report``); ``variant``, if
    given, is appended (``matmul_lanes_q8_0_generic``) — without ``kind`` too: a factory's twins that differ in
    what this decorator is given (``parallel``), not in what they capture, must be named apart, since numba's
    cache keys a kernel on its name, code and captured values only (``tinyblas_rows_parallel``).
    ``inline``: numba inlines the helper's code into each caller before typing it (numba's ``inline="always"``),
    so it is never compiled on its own (docstring: "What a first run pays for").
    """
    njit = numba.njit(parallel=parallel, fastmath=FASTMATH, cache=CACHE, error_model=ERROR_MODEL, pipeline_class=Pipeline,
                      inline="always" if inline else "never")
    if kind is None and not variant:
        return njit

    def named(py_func):
        from .blocks import QT

        suffix = f"_{variant}" if variant else ""
        stem = py_func.__name__ if kind is None else f"{py_func.__name__.lstrip('_')}_{QT(kind).name.lower()}"
        py_func.__name__ = py_func.__qualname__ = stem + suffix
        return njit(py_func)

    return named


def python_of(kernel):
    """The Python function of ``kernel`` (a :func:`jit` dispatcher; interpreted, the function itself): for a Python
    caller of a small helper, which calling the dispatcher would compile as a kernel of its own (~0.1 s of a first run),
    and for a second decorator over the same code (``jit(inline=True)(python_of(f))``)."""
    return getattr(kernel, "py_func", kernel)


def read_only(a):
    """``a`` as a read-only view (itself when it is one). numba compiles a kernel once per signature, and an array's
    writability is part of it. Weights come read-only from a mapped file, so an entry point hands the arrays its kernel
    only reads through this, and whoever calls (a mapped file, an array made in memory, a test's) shares one compiled
    copy (the module docstring, "Literal arguments are constants")."""
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def per_type(factory):
    """Memoise ``factory(kind) -> kernel`` per type code: a type's kernel is built the first time that
    type is multiplied (and compiled, or loaded from the cache, on its first call), once per process.
    The factory's kernel must capture nothing but ``kind`` (see the docstring: "One compiled copy per
    weight type")."""
    built = {}

    @functools.wraps(factory)
    def kernel_for(kind, *variant):
        key = (int(kind), *variant)
        if key not in built:
            built[key] = factory(*key)
        return built[key]

    return kernel_for


def by_type(table: dict):
    """Decorate ``switch(kind, *args)``, a plain function that calls ``table[kind](*args)``: in compiled
    code, where ``kind`` is a compile-time constant (a literal), the call compiles to a direct call of
    ``table[kind]`` alone. Interpreted (``NUMBA_DISABLE_JIT=1``) the plain function runs."""

    def wrap(switch):
        @overload(switch, jit_options=dict(fastmath=FASTMATH, error_model=ERROR_MODEL), prefer_literal=True)
        def _typed(kind, *args):
            if isinstance(kind, types.IntegerLiteral) and kind.literal_value in table:
                fn = table[kind.literal_value]
                return lambda kind, *args: fn(*args)
            return None  # a non-constant kind, or a type without an entry: a typing error in the caller

        return switch

    return wrap
