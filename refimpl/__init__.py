"""refimpl — a readable reference implementation of llama.cpp's ``qwen35moe`` inference (and of its
siblings ``qwen35`` and ``qwen3next``: refimpl.io.config.ARCHS, docs/architecture.md).

The Python API (:mod:`refimpl.api`, README "Python API") is these names, and only these (``__all__``)::

    model = refimpl.load("builtin:kjv", emulate=None)   # Oracle: the model, its numerics, its tokenizer
    logits, state = refimpl.forward(model, ids, state=None)
    out = refimpl.generate(model, ids, 32, draft=None)  # Generation: tokens, text, stats; draft="mtp" | "ngram"
    report = refimpl.audit(model, ids, stream_a, stream_b=None, threshold=0.05)
    arrays = refimpl.trace(model, ids)                  # {llama.cpp's name: array}
    refimpl.RefimplError                                # what every bad argument raises, in one line

Importing ``refimpl`` imports none of numpy, numba or the model: :mod:`refimpl.api` imports them inside its
functions.

Contract (what may live in this package):

* Plain numpy, one code path per operation, written to be read next to llama.cpp's C++
  (``vendor/llama.cpp/src/models/qwen35moe.cpp``, ``qwen35.cpp``, ``qwen3next.cpp``, ``delta-net-base.cpp``,
  ``llama-graph.cpp``).
  Names follow GGUF tensor names and llama.cpp's ``cb(cur, "name", il)`` intermediate names.
* Folders in dataflow order, each importing only from the folders before it (tests/test_layout.py):

  ======================  ====================================================================
  ``refimpl.version``     ``__version__``, recorded in golden files
  ``refimpl.errors``      :class:`RefimplError`, the one-line error every folder raises
  ``refimpl.io``          the GGUF file, config, tensor plan, weight matrices, expert streamer
  ``refimpl.tokenizer``   llama.cpp's BPE tokenizer on the GGUF vocabulary
  ``refimpl.fixtures``    synthetic GGUFs and the ``builtin:`` models
  ``refimpl.model``       **the model**: state, ops, attention, deltanet, moe, trunk, mtp
  ``refimpl.decode``      greedy decoding, draft sources, the speculative loop, telemetry
  ``refimpl.oracle``      goldens, audits, round replay, traces, plots, the Dask cluster
  ``refimpl.inject``      engine bugs re-created on purpose, and their table
  ``refimpl.cli``         the ``refimpl`` command
  ``refimpl.api``         the Python API above, thin wrappers over what the commands call
  ``refimpl``             this file: the version, and the API's names; nothing below imports it
  ======================  ====================================================================

  Each folder's ``__init__`` states its reading order and what it may import.
* State is explicit: caches and recurrent matrices live in records that functions take and return.
* The compiled code refimpl calls lives in ``kernels``. The quantized matmul, ``dot64`` and the
  delta-rule step are each defined by a plain numpy form — ``kernels.matmul(path="numpy")``,
  ``kernels.dot64(path="numpy")``, :func:`refimpl.model.deltanet.delta_rule_step` — whose bits the
  compiled form gives (``Ctx(kernel="numpy")`` runs the definitions).
* Bad input raises :class:`refimpl.errors.RefimplError` with a one-line message; the CLI turns it
  into ``refimpl: error: …`` and exit code 2.
"""

from refimpl.version import __version__  # noqa: F401
from refimpl.errors import RefimplError
from refimpl.api import Generation, Oracle, audit, forward, generate, load, trace

__all__ = ["load", "forward", "generate", "audit", "trace", "Oracle", "Generation", "RefimplError"]
