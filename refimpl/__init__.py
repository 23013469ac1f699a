"""refimpl — a readable reference implementation of llama.cpp's ``qwen35moe`` inference (and of its
siblings ``qwen35`` and ``qwen3next``: refimpl.config.ARCHS, docs/architecture.md).

Contract (what may live in this package):

* Plain numpy, one code path per operation, written to be read next to llama.cpp's C++
  (``vendor/llama.cpp/src/models/qwen35moe.cpp``, ``qwen35.cpp``, ``qwen3next.cpp``, ``delta-net-base.cpp``,
  ``llama-graph.cpp``).
  Names follow GGUF tensor names and llama.cpp's ``cb(cur, "name", il)`` intermediate names.
* Files in dataflow order: GGUF file → config → weights → state → layers → model → drafts →
  speculative loop → telemetry → CLI.
* State is explicit: caches and recurrent matrices live in records that functions take and return.
* The only compiled code refimpl calls is the quantized matmul behind ``kernels.matmul``; that
  package's numba path is tested equal to its plain numpy path.
* Bad input raises :class:`refimpl.errors.RefimplError` with a one-line message; the CLI turns it
  into ``refimpl: error: …`` and exit code 2.
"""

__version__ = "0.1.0"
