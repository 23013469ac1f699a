"""The first-run notice: say on stderr when numba compiles kernels, and how far it has got.

numba compiles each kernel of ``kernels/`` on its first call and caches the machine code on disk
(``kernels/__pycache__``), so only the first run on a machine — or the first after ``kernels/*.py``
changed — compiles, and only the kernels of the weight types the model has (kernels/base/flags.py, "One
compiled copy per weight type"). While a command runs, :class:`CompileReport` listens to numba's
compile events, which fire on actual compilation only (never for a kernel loaded from the cache):

    refimpl: compiling kernels for F32 (first run only; numba caches them for the next runs) …
    refimpl:   [1] pack_words 1.2 s
    refimpl:   [2] dequantize_rows_serial_f32 1.5 s
    …
    refimpl: compiled 12 kernels in 17.6 s

and prints nothing at all when every kernel comes from the cache. Lines go through ``tqdm.write``, so
they do not tear a progress bar. Cold and warm times: docs/performance.md ("First run").
"""

from __future__ import annotations

import sys
import time

from numba.core import event


_ACTIVE: list["CompileReport"] = []  # the reports listening now (``compile_report`` blocks)


class CompileReport(event.Listener):
    """Listener for ``numba:compile``: a header at the first compilation, one line per top-level kernel
    (one that Python called, with everything it pulled in), and :meth:`close`'s summary."""

    def __init__(self, stream=None, note: str = ""):
        self.stream = stream
        self.note = note  # the summary's last words (refimpl/cli/compile_ahead.py: a second process compiled too)
        self.types: list[str] = []  # the model's weight types, for the header (:func:`name_types`)
        self.depth = 0
        self.t0 = 0.0
        self.kernels = 0
        self.seconds = 0.0

    def _write(self, line: str) -> None:
        from tqdm import tqdm

        tqdm.write(line, file=self.stream or sys.stderr)

    def on_start(self, ev) -> None:
        if self.depth == 0:
            if self.kernels == 0:
                kinds = f" for {', '.join(self.types)}" if self.types else ""
                self._write(f"refimpl: compiling kernels{kinds} (first run only; numba caches them for the next runs) …")
            self.t0 = time.perf_counter()
        self.depth += 1

    def on_end(self, ev) -> None:
        self.depth -= 1
        if self.depth:
            return
        took = time.perf_counter() - self.t0
        self.kernels += 1
        self.seconds += took
        name = getattr(getattr(ev.data.get("dispatcher"), "py_func", None), "__name__", "kernel").lstrip("_")
        self._write(f"refimpl:   [{self.kernels}] {name} {took:.1f} s")

    def close(self) -> None:
        """The summary line, when anything was compiled."""
        if self.kernels:
            self._write(f"refimpl: compiled {self.kernels} kernel{'s' if self.kernels != 1 else ''} in {self.seconds:.1f} s"
                        + self.note)


class compile_report:
    """``with compile_report():`` — report numba compilations on stderr during the block."""

    def __init__(self, stream=None, note: str = ""):
        self.report = CompileReport(stream, note)

    def __enter__(self) -> CompileReport:
        event.register("numba:compile", self.report)
        _ACTIVE.append(self.report)
        return self.report

    def __exit__(self, *exc) -> None:
        _ACTIVE.remove(self.report)
        event.unregister("numba:compile", self.report)
        self.report.close()


def name_types(gf) -> None:
    """Name the weight types (``F32, Q8_0``, …) of ``gf`` (an opened :class:`refimpl.io.gguf_file.GGUFFile`,
    the one the model is then loaded from) in the header of the active reports. Called before the
    model is loaded: loading already compiles (packing, dequantized norms)."""
    types = list(gf.bytes_by_qtype())
    for report in _ACTIVE:
        report.types = types
