"""How to compute and what to record: :class:`Ctx`, handed to every layer function, and the named points it
passes values through (:data:`TAPS`, :meth:`Ctx.cb`).

A Ctx names one of three numerics (docs/numerics.md): the reference definition (``Ctx()``); ``--emulate``'s
approximate rounding points of llama.cpp (``act_quant``, ``kv_f16``, ``flash_attn``), computed by the same
reference code in this folder; or ``--emulate=ggml`` (``ggml``: a ggml-cpu path), which
:func:`refimpl.model.trunk.forward` hands to llama.cpp's graph in :mod:`refimpl.graph`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from kernels.ggml.build import EMULATED_PATHS, GGML_VERSION, VERSION_OK_FLAG, detect


#: The tap points: values the model and the decoding loop hand through :meth:`Ctx.cb` by a dotted
#: ``stage.value`` name, where an injected engine bug can act (refimpl/inject/faults.py's table: what each
#: carries, which faults rewrite it). Never traced: a trace holds llama.cpp's ``cb()`` names only.
TAPS = frozenset({
    "attention.q_gate", "attention.rope_dims",
    "deltanet.kv_head", "deltanet.conv_rows", "deltanet.state", "deltanet.ssm_norm",
    "moe.weights", "moe.shared_gate",
    "trunk.h_nextn",
    "mtp.input_norms", "mtp.catchup_h", "mtp.accept",
    "loop.start", "loop.prefill", "loop.decode_from", "loop.targets", "loop.accept", "loop.rollback", "loop.finish",
})


class NoFaults:
    """``Ctx.faults`` of the clean oracle: every tap point hands its value on unchanged.

    :meth:`Ctx.cb` hands each tap point's value to ``faults.tap(point, value, **info)``; a fault record
    of :mod:`refimpl.inject.faults` answers the same call with the value an engine with the bug would
    use at some of them. The model never imports that folder: the record is handed in through
    :class:`Ctx`."""

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other) -> bool:
        return not other  # the clean oracle equals any empty fault set

    def __hash__(self) -> int:
        return hash(frozenset())

    def tap(self, point: str, value, **info):
        return value


CLEAN = NoFaults()


#: Ctx.ggml: None or a key of kernels.ggml.build.EMULATED_PATHS, the one table of the emulated paths
GGML_PATHS = (None,) + tuple(p.key for p in EMULATED_PATHS)
GGML_NAMES = {p.key: p.name for p in EMULATED_PATHS}  # how Ctx.numerics() names each


class StderrOnce:
    """A line printed on stderr the first time it is called, never again: ``Ctx.announce``. A copy sent to
    another process (``pickle``: the golden and audit workers) says nothing — the command already said it."""

    def __init__(self, line: str):
        self._line = line

    def __call__(self) -> None:
        if self._line is not None:
            line, self._line = self._line, None
            print(line, file=sys.stderr, flush=True)

    def __getstate__(self) -> dict:
        return {"_line": None}


@dataclass(frozen=True)
class Ctx:
    """How to compute and what to record, passed to every layer function.

    * ``act_quant``: emulate llama.cpp's per-matmul activation quantization (Q8_0/Q8_1/Q8_K, F16/BF16
      rounding) — ``ggml-cpu.c::ggml_compute_forward_mul_mat``, docs/kernels.md, ``kernels.matmul(act_quant=True)``.
    * ``kv_f16``: emulate llama.cpp's default F16 K/V cache (K and V rounded to F16 when stored; with
      flash attention off Q is rounded to F16 for K·Q and the softmax probabilities for P·V).
    * ``flash_attn``: emulate ``ggml_flash_attn_ext`` (llama.cpp's ``auto`` on the CPU): K and V F16
      whatever the cache type, an F16 accumulator for fewer than 64 query rows per ubatch
      (refimpl/model/attention.py ``attend``). ``n_ubatch``, ``n_threads``, ``n_ctx``: the llama.cpp
      settings that choose its flash-attention path (ubatch size; the split-KV path's chunking, only
      for one query row over ≥ 512 cells; ``n_ctx`` None = the model's training context, as
      llama.cpp's n_ctx = 0). They change nothing with ``flash_attn`` off.
    * ``kernel``: ``"numba"`` (default) or ``"numpy"``: which implementation of the kernels runs —
      the quantized matmul, ``dot64`` and the delta-rule step: ``"numpy"`` runs their definitions
      (``kernels.matmul(path="numpy")``, ``kernels.dot64(path="numpy")``,
      :func:`refimpl.model.deltanet.delta_rule_step`), ``"numba"`` their compiled twins — the same bits.
    * ``trace(name, il, x)``: called with llama.cpp's intermediate names (``attn_norm``, il, …)
      — ``il`` = -1 for model-level tensors; ``None`` records nothing. A hook that returns an
      array replaces ``x`` with it from there on (activation patching: :class:`refimpl.oracle.trace.Patcher`
      feeds a layer llama.cpp's own values, tests/conformance.py); returning None changes nothing.
    * ``faults``: engine bugs injected on purpose (:mod:`refimpl.inject.faults`, docs/bug-classes.md),
      consulted at the tap points (:data:`TAPS`); empty — the clean oracle — unless asked for.
    * ``ggml``: None, or the ggml-cpu code path emulated bit for bit (a key of ``kernels.ggml.build.EMULATED_PATHS``:
      ``"avx512"`` | ``"avx2"`` | ``"generic"`` | ``"arm64-dotprod"`` …, from ``kernels.ggml.build.detect().path`` or
      named): every op is then computed as that libggml-cpu computes it
      (:mod:`kernels.ggml`), batch by ubatch of ``n_ubatch`` rows, with ``n_threads`` llama.cpp's thread
      count (``--emulate=ggml``: :func:`refimpl.model.trunk.forward` then runs llama.cpp's graph, :mod:`refimpl.graph`).
      ``repack``: whether the emulated llama.cpp runs with its default CPU_REPACK weight buffer
      (``use_extra_bufts``; ``--no-repack`` turns it off): with ``ggml``, a matrix that buffer takes is multiplied
      by its gemm/gemv (``kernels.ggml.repack``, ``kernels.ggml.repack_k``); a file holding a repacked type whose
      kernels are not emulated is refused (:func:`refimpl.graph.layout.check_ggml_weights`). The kernels are those of
      ggml ``kernels.ggml.build.GGML_VERSION``; ``ggml_accepted``: the library's own version when it is another one and
      the user accepted it (``--ggml-version-ok``), which :meth:`numerics` — every report's line — then records;
      ``ggml_named``: the path was named (``--emulate=ggml:avx2`` …), no library read, which it records too.

    * ``announce``: None, or a :class:`StderrOnce` the ggml graph calls once it has computed a ubatch — the CLI's
      ``emulating ggml-cpu …`` line, said after llama.cpp's own checks of the file and the context size and after
      the ops of that ubatch (:func:`refimpl.graph.trunk.ubatch`), so that a refusal stays one line (an op not
      emulated on the path: ``kernels.ggml.build.NotEmulated``).

    Both reach the code through one method, :meth:`cb`, called at every named point.
    """

    act_quant: bool = False
    kv_f16: bool = False
    flash_attn: bool = False
    n_ubatch: int = 512  # llama_context_default_params / common's n_ubatch
    n_threads: int = 4  # GGML_DEFAULT_N_THREADS
    n_ctx: int | None = None
    kernel: str = "numba"
    trace: Callable[[str, int, np.ndarray], None] | None = field(default=None, compare=False)
    faults: NoFaults = CLEAN  # or a refimpl.inject.faults.Faults record
    ggml: str | None = None  # the emulated ggml-cpu path: "avx512" | "avx2" | "generic" | "arm64-…" (EMULATED_PATHS)
    repack: bool = True  # llama.cpp's use_extra_bufts (its default): with ggml, weights it repacks take the repacked kernels
    ggml_accepted: str | None = None  # with ggml: the libggml's version, not GGML_VERSION, accepted with --ggml-version-ok
    ggml_named: bool = False  # with ggml: the path was named (--emulate=ggml:avx2 …), not detected from a loaded libggml
    announce: StderrOnce | None = field(default=None, compare=False)  # with ggml: the CLI's stderr line, said once

    def __post_init__(self):
        if self.ggml not in GGML_PATHS:
            raise ValueError(f"Ctx: ggml must be one of {GGML_PATHS}, got {self.ggml!r}")
        if self.ggml_accepted is not None and not self.ggml:
            raise ValueError("Ctx: ggml_accepted (a libggml version accepted with --ggml-version-ok) needs ggml")
        if self.ggml_named and (not self.ggml or self.ggml_accepted is not None):
            raise ValueError("Ctx: ggml_named (a path named, not detected) needs ggml and reads no library whose version "
                             "could be accepted (ggml_accepted)")
        if self.n_ubatch < 1 or self.n_threads < 1 or (self.n_ctx is not None and self.n_ctx < 1):
            raise ValueError(f"Ctx: n_ubatch, n_threads and n_ctx must be positive, got {self.n_ubatch}, {self.n_threads}, {self.n_ctx}")

    def numerics(self) -> str:
        """One line for reports: ``off`` or which llama.cpp rounding points are emulated."""
        if self.ggml:
            version = f"ggml {GGML_VERSION}" if self.ggml_accepted is None else \
                f"ggml {self.ggml_accepted} (not {GGML_VERSION}: accepted with {VERSION_OK_FLAG}; the kernels are {GGML_VERSION}'s)"
            named = " (named, not detected)" if self.ggml_named else ""  # --emulate=ggml:NAME: no library was read
            return (f"ggml-cpu {GGML_NAMES[self.ggml]}{named} bit for bit, {version}: {'F16' if self.kv_f16 else 'F32'} K/V, flash attention "
                    f"{'on' if self.flash_attn else 'off'}, n_ubatch {self.n_ubatch}, n_threads {self.n_threads}")
        if not (self.act_quant or self.kv_f16 or self.flash_attn):
            return "off"
        parts = (["activation quantization"] if self.act_quant else []) + [f"{'F16' if self.kv_f16 else 'F32'} K/V",
                                                                        f"flash attention {'on' if self.flash_attn else 'off'}"]
        return ("on: " if self.act_quant else "") + ", ".join(parts)

    def cb(self, name: str, il: int, x, **info):
        """A named point of the forward pass or the loop: returns the value the code goes on with.

        * llama.cpp's ``cb(cur, name, il)`` names (``attn_norm``, ``model.input_embed``, …): ``x`` is
          handed to the trace hook; returns ``x``, or the array the hook returned in its place.
        * a tap point (:data:`TAPS`: ``deltanet.state``, ``loop.rollback``, …), with ``info`` what a
          fault needs to know there: ``x`` is handed to the fault record, ``faults.tap(name, x, **info)``;
          returns ``x`` unless an injected fault rewrites it. Never traced.
        """
        if name in TAPS:
            return self.faults.tap(name, x, **info)
        if self.trace is not None:
            replaced = self.trace(name, il, x)
            if replaced is not None:
                return replaced
        return x


#: ``--emulate=NAME``: llama.cpp configurations refimpl reproduces (docs/numerics.md "Configurations").
#: All quantize activations per matmul as llama.cpp's CPU backend does; ``ggml`` computes every op as the
#: loaded libggml-cpu does, bit for bit (``Ctx.ggml``), with llama.cpp's defaults: F16 K/V, flash attention
#: on, n_ubatch 512, n_threads = GGML_DEFAULT_N_THREADS (llama_context_default_params).
EMULATIONS = {
    "default": {"kv_f16": True, "flash_attn": True},  # llama.cpp's defaults: F16 K/V cache, flash attention auto (on for CPU)
    "plain": {"kv_f16": False, "flash_attn": False},  # the conformance setting: F32 K/V cache, flash attention off
    "ggml": {"kv_f16": True, "flash_attn": True, "n_ubatch": 512, "n_threads": 4},  # + ggml = the detected path
}


def emulation_ctx(emulate: str | None = None, *, flash_attn: bool | None = None, kv_f16: bool | None = None, **fields) -> Ctx:
    """The Ctx of ``--emulate[=NAME]`` plus the fine flags: ``emulate`` None (no activation
    quantization, F32 K/V, no flash attention unless asked) or a key of :data:`EMULATIONS`;
    ``flash_attn`` / ``kv_f16`` override the preset when not None; ``fields`` (kernel, trace, n_ubatch,
    n_threads, n_ctx, ggml) pass through and override the preset. ``"ggml"`` without a ``ggml`` field
    emulates the path of the libggml llama-cpp-python loads (``kernels.ggml.build.detect()``; raises
    ``UnsupportedBuild`` for a build that is not emulated, or of another ggml version than the one followed)."""
    if emulate is not None and emulate not in EMULATIONS:
        raise ValueError(f"unknown emulation '{emulate}' (valid: {', '.join(EMULATIONS)})")
    preset = dict(EMULATIONS.get(emulate, {"kv_f16": False, "flash_attn": False}))
    kv, fa = preset.pop("kv_f16"), preset.pop("flash_attn")
    if emulate == "ggml" and fields.get("ggml") is None:
        build = detect()
        build.check_version()  # another ggml: refused (the CLI's --ggml-version-ok passes ggml and ggml_accepted)
        fields["ggml"] = build.path
    return Ctx(act_quant=emulate is not None, kv_f16=kv if kv_f16 is None else kv_f16,
               flash_attn=fa if flash_attn is None else flash_attn, **{**preset, **fields})
