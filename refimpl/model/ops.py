"""Primitive operations, each written to compute what llama.cpp's CPU op computes
(``ggml-cpu/ops.cpp``, ``vec.cpp``, ``unary-ops.cpp``; each function names its op).

All activations are float32 (as in llama.cpp). Reductions that llama.cpp accumulates in double
(RMSNorm's sum of squares, softmax's sum) are accumulated in float64 here too; dot products are
float64-accumulated and rounded once (closer to exact than ggml's float32 SIMD sums, whose order
varies by kernel). Every function treats each row (last axis) independently and identically, so a
batch of T rows gives bit-identical results to T single-row calls — the property that makes
verify batches exact in this oracle. That holds for the definition (no ``--emulate``) and for
``--emulate=plain``; not under ``--emulate`` with flash attention on (its default: one query row over a long
cache takes the split-KV path, 64 or more rows the tiled path), nor under ``--emulate=ggml``, whose ggml-cpu
kernels depend on the row count as llama.cpp's do (docs/numerics.md, "Batch invariance").

Shapes use the legend of docs/architecture.md; ``...`` is any leading batch shape.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import kernels
from kernels.ggml.build import EMULATED_PATHS, GGML_VERSION, VERSION_OK_FLAG

F32 = np.float32


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
    * ``ggml``: None, or the ggml-cpu code path emulated bit for bit (``"avx512"`` | ``"avx2"``, from
      ``kernels.ggml.build.detect().path``): every op is then computed as that libggml-cpu computes it
      (:mod:`kernels.ggml`), batch by ubatch of ``n_ubatch`` rows, with ``n_threads`` llama.cpp's thread
      count (``--emulate=ggml``; the model files follow llama.cpp's graph op for op in that mode).
      ``repack``: whether the emulated llama.cpp runs with its default CPU_REPACK weight buffer
      (``use_extra_bufts``; ``--no-repack`` turns it off): with ``ggml``, a matrix that buffer takes is multiplied
      by its gemm/gemv (``kernels.ggml.repack``, ``kernels.ggml.repack_k``); a file holding a repacked type whose
      kernels are not emulated is refused (:func:`refimpl.model.trunk.check_ggml_weights`). The kernels are those of
      ggml ``kernels.ggml.build.GGML_VERSION``; ``ggml_accepted``: the library's own version when it is another one and
      the user accepted it (``--ggml-version-ok``), which :meth:`numerics` — every report's line — then records.

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
    ggml: str | None = None  # the emulated ggml-cpu path: "avx512" | "avx2" | "generic" (kernels.ggml.build.GgmlBuild.path)
    repack: bool = True  # llama.cpp's use_extra_bufts (its default): with ggml, weights it repacks take the repacked kernels
    ggml_accepted: str | None = None  # with ggml: the libggml's version, not GGML_VERSION, accepted with --ggml-version-ok

    def __post_init__(self):
        if self.ggml not in GGML_PATHS:
            raise ValueError(f"Ctx: ggml must be one of {GGML_PATHS}, got {self.ggml!r}")
        if self.ggml_accepted is not None and not self.ggml:
            raise ValueError("Ctx: ggml_accepted (a libggml version accepted with --ggml-version-ok) needs ggml")
        if self.n_ubatch < 1 or self.n_threads < 1 or (self.n_ctx is not None and self.n_ctx < 1):
            raise ValueError(f"Ctx: n_ubatch, n_threads and n_ctx must be positive, got {self.n_ubatch}, {self.n_threads}, {self.n_ctx}")

    def numerics(self) -> str:
        """One line for reports: ``off`` or which llama.cpp rounding points are emulated."""
        if self.ggml:
            version = f"ggml {GGML_VERSION}" if self.ggml_accepted is None else \
                f"ggml {self.ggml_accepted} (not {GGML_VERSION}: accepted with {VERSION_OK_FLAG}; the kernels are {GGML_VERSION}'s)"
            return (f"ggml-cpu {GGML_NAMES[self.ggml]} bit for bit, {version}: {'F16' if self.kv_f16 else 'F32'} K/V, flash attention "
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


_GGML_NOTE: list[str] = []  # the stderr line of --emulate=ggml, said at its first computation (announce_ggml)


def announce_ggml(line: str | None) -> None:
    """Have the first ``--emulate=ggml`` forward pass print ``line`` on stderr (None: nothing pending). The
    CLI names the libggml it follows (``emulating ggml-cpu AVX-512 … from DIR``) when the emulation starts,
    not before its flags are all checked: a refusal stays one line."""
    _GGML_NOTE[:] = [line] if line else []


def said_ggml() -> None:
    """Print the pending :func:`announce_ggml` line, once (refimpl.model.trunk / mtp call it in ggml mode)."""
    if _GGML_NOTE:
        import sys

        print(_GGML_NOTE.pop(), file=sys.stderr, flush=True)


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
        from kernels.ggml.build import detect

        build = detect()
        build.check_version()  # another ggml: refused (the CLI's --ggml-version-ok passes ggml and ggml_accepted)
        fields["ggml"] = build.path
    return Ctx(act_quant=emulate is not None, kv_f16=kv if kv_f16 is None else kv_f16,
               flash_attn=fa if flash_attn is None else flash_attn, **{**preset, **fields})


def mm(W, x: np.ndarray, ctx: Ctx) -> np.ndarray:
    """``ggml_mul_mat(W, x)``: [T, in] -> [T, out] for a weight W of numpy shape (out, in). With
    ``ctx.ggml``: ``kernels.ggml.mulmat.mul_mat`` — the kernel ggml-cpu picks for T rows of that type, or the
    CPU_REPACK buffer's gemm/gemv for a weight llama.cpp repacks (``ctx.repack``, its default); through the
    weight's column layout when the model was loaded with one (``W.cols``: the same bits)."""
    if ctx.ggml:
        from kernels.ggml import mulmat

        return mulmat.mul_mat(W.row_bytes, W.qtype, x, ctx.ggml, ctx.n_threads,  # Matrix.row_bytes: worked out once
                              repack=ctx.repack, tensor_rows=W.stored_rows, cols=W.cols)  # cols: its column layout, if built
    return kernels.matmul(W.raw, W.qtype, x, path=ctx.kernel, act_quant=ctx.act_quant)


#: The positions of a batch whose logits are computed (``forward``'s and ``mtp_forward``'s ``outputs``).
OUTPUTS = ("all", "last", "none")


def by_ubatch(run, n_tokens: int, n_ubatch: int, outputs: str, state):
    """``--emulate=ggml``: a batch of ``n_tokens`` as llama.cpp decodes it — one graph per ubatch of ``n_ubatch``
    tokens (the last one shorter), each on the state the previous one left (``llama_context::decode``'s ubatch
    loop; a matmul's kernel and flash attention's path depend on the ubatch's row count). ``run(state, u0, u1,
    outputs)`` computes rows u0 … u1−1 and returns (logits or None, hiddens, state); each ubatch's LM head sees its
    output rows: all of them, or with ``"last"`` / ``"none"`` only those of the last ubatch.
    Returns (logits [rows, V] or None, hiddens [n_tokens, E], state)."""
    logits, hs = [], []
    starts = list(range(0, n_tokens, n_ubatch))
    for u0 in starts:
        out = outputs if outputs == "all" or u0 == starts[-1] else "none"
        lg, h, state = run(state, u0, min(u0 + n_ubatch, n_tokens), out)
        if lg is not None:
            logits.append(lg)
        hs.append(h)
    return (np.concatenate(logits) if logits else None), np.concatenate(hs), state


def output_rows(W, h: np.ndarray, outputs: str, ctx: Ctx) -> np.ndarray | None:
    """``result_output = W h`` on the rows a batch asks logits for: every row (``"all"``), the last
    (``"last"``: a prompt needs only its last row) or none (``"none"``: a catch-up that needs only
    the hiddens) — as llama.cpp computes only the rows its batch flags for output (``inp_out_ids``,
    ``llama_batch.logits``). Each row's logits depend on that row alone, so the rows computed have
    the same bits either way. A traced run (``ctx.trace``) computes and records every row, as a trace
    promises every position's intermediates, and returns the rows asked for (with ``ctx.ggml``, whose
    matmul kernel depends on the row count, those are computed apart, on their own rows as llama.cpp does).
    h [T, E] -> [T, V], [1, V], or None (the LM head skipped)."""
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs must be one of {OUTPUTS}, not {outputs!r}")
    traced = ctx.trace is not None
    if outputs == "none" and not traced:
        return None
    if ctx.ggml and traced and outputs != "all":  # ggml-cpu's kernel depends on the row count (kernel_for):
        ctx.cb("result_output", -1, mm(W, h, ctx))  # the trace's rows, computed apart from
        return None if outputs == "none" else mm(W, h[-1:], ctx)  # the one row llama.cpp's LM head sees: [1, V]
    logits = ctx.cb("result_output", -1, mm(W, h if outputs == "all" or traced else h[-1:], ctx))  # [T or 1, V]
    if outputs == "none":
        return None
    return logits if outputs == "all" else logits[-1:]


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """``ggml_rms_norm`` (ops.cpp ``ggml_compute_forward_rms_norm_f32``), without the weight.

    Squares are float32 products summed in double; ``mean = (float)(sum / n)``;
    ``scale = 1.0f / sqrtf(mean + eps)``; ``y = x * scale``.  [..., n] -> [..., n]
    """
    x = np.asarray(x, dtype=F32)
    ss = np.sum((x * x).astype(np.float64), axis=-1, keepdims=True)  # [..., 1]
    mean = (ss / x.shape[-1]).astype(F32)
    scale = F32(1.0) / np.sqrt(mean + F32(eps))
    return x * scale


def rms_norm_w(x: np.ndarray, w: np.ndarray, eps: float, ctx: Ctx | None = None) -> np.ndarray:
    """``build_norm(x, w, LLM_NORM_RMS)``: RMSNorm then multiply by the stored weight (already 1+w).
    With ``ctx.ggml``: ggml-cpu's fused RMS_NORM+MUL (``kernels.ggml.norm.rms_norm``)."""
    if ctx is not None and ctx.ggml:
        from kernels.ggml import norm

        return norm.rms_norm(np.ascontiguousarray(x, dtype=F32), eps, ctx.ggml, w)
    return rms_norm(x, eps) * w


def l2_norm(x: np.ndarray, eps: float, ctx: Ctx | None = None) -> np.ndarray:
    """``build_gdn_l2_norm`` (src/models/models.h): ``rms_norm(x, eps/n) * (1/sqrtf(n))``
    = x / sqrt(Σx² + eps).  [..., n] -> [..., n]"""
    if ctx is not None and ctx.ggml:
        from kernels.ggml import norm

        return norm.gdn_l2_norm(np.ascontiguousarray(x, dtype=F32), eps, ctx.ggml)
    n = x.shape[-1]
    return rms_norm(x, eps / n) * (F32(1.0) / np.sqrt(F32(n)))


def sigmoid(x: np.ndarray, ctx: Ctx | None = None) -> np.ndarray:
    """``op_sigmoid``: 1 / (1 + expf(-x)). (expf overflows to inf for x < −88.7: the result is then
    0, as in C; numpy's overflow warning is silenced.) With ``ctx.ggml``: glibc's ``expf``."""
    if ctx is not None and ctx.ggml:
        from kernels.ggml import vecmath

        return vecmath.sigmoid(np.ascontiguousarray(x, dtype=F32), ctx.ggml)
    with np.errstate(over="ignore"):
        return F32(1.0) / (F32(1.0) + np.exp(-x))


def silu(x: np.ndarray, ctx: Ctx | None = None) -> np.ndarray:
    """``ggml_vec_silu_f32``: x / (1 + exp(-x)) (−0 for x < −88.7, where expf overflows to inf).
    With ``ctx.ggml``: its SIMD ``ggml_v_silu`` over rows of the last axis (ggml's ne0)."""
    if ctx is not None and ctx.ggml:
        from kernels.ggml import vecmath

        return vecmath.silu(np.ascontiguousarray(x, dtype=F32), ctx.ggml)
    with np.errstate(over="ignore"):
        return x / (F32(1.0) + np.exp(-x))


def swiglu(gate: np.ndarray, up: np.ndarray, ctx: Ctx | None = None) -> np.ndarray:
    """``ggml_swiglu_split(gate, up)`` = silu(gate) ⊙ up (plain: :func:`silu` then a float32 multiply;
    ``ctx.ggml``: ``ggml_vec_swiglu_f32`` over rows of the last axis)."""
    if ctx is not None and ctx.ggml:
        from kernels.ggml import vecmath

        return vecmath.swiglu(np.ascontiguousarray(gate, dtype=F32), np.ascontiguousarray(up, dtype=F32), ctx.ggml)
    return silu(gate) * up


def softplus(x: np.ndarray, ctx: Ctx | None = None) -> np.ndarray:
    """``op_softplus``: x > 20 ? x : logf(1 + expf(x)). With ``ctx.ggml``: glibc's ``expf``/``logf``."""
    if ctx is not None and ctx.ggml:
        from kernels.ggml import vecmath

        return vecmath.softplus(np.ascontiguousarray(x, dtype=F32), ctx.ggml)
    with np.errstate(over="ignore"):
        return np.where(x > F32(20.0), x, np.log(F32(1.0) + np.exp(x))).astype(F32)


def softmax(x: np.ndarray, ctx: Ctx | None = None) -> np.ndarray:
    """``ggml_compute_forward_soft_max_f32``: e = exp(x - max), Σ in double, p = e * (float)(1/Σ).
    With ``ctx.ggml``: ``ggml_soft_max`` (no mask, scale 1) with its SIMD ``expf`` (``kernels.ggml.vecmath``)."""
    if ctx is not None and ctx.ggml:
        from kernels.ggml import vecmath

        return vecmath.soft_max(np.ascontiguousarray(x, dtype=F32), None, 1.0, ctx.ggml)
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    s = np.sum(e.astype(np.float64), axis=-1, keepdims=True)
    return e * (1.0 / s).astype(F32)


def ieee(fn: Callable) -> Callable:
    """Run ``fn`` with numpy's floating-point warnings off (``np.errstate(all="ignore")``). The
    forward passes compute IEEE float arithmetic as llama.cpp's C does, which never warns: on weights
    that hold inf or NaN, ``inf − inf``, ``0 · inf`` and their NaNs are the computed values
    (docs/numerics.md, "Non-finite weights"), not something to report on stderr."""

    @functools.wraps(fn)
    def silent(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return silent


def argmax(logits: np.ndarray) -> int:
    """The greedy choice of llama.cpp's greedy sampler (``llama_sampler_greedy_apply``, and the
    ``temp <= 0`` pass of ``llama_sampler_temp_impl``): starting from id 0, an id is taken when its
    logit is *greater* than the best so far — the first maximum. A NaN logit is never greater, so it
    is passed over; if logit 0 is NaN nothing compares greater and id 0 is chosen. Finite logits: the
    same id as ``np.argmax``. logits [V] -> id."""
    logits = np.asarray(logits)
    nan = np.isnan(logits)
    if not nan.any():
        return int(np.argmax(logits))
    if nan[0]:
        return 0
    return int(np.argmax(np.where(nan, -np.inf, logits)))  # a NaN that becomes -inf only ties, after the earlier ids


def dot64(a: np.ndarray, b: np.ndarray, path: str = "numba") -> np.ndarray:
    """Σ a·b over the last axis: exact float64 products summed in increasing index order, rounded
    once to float32 (``kernels.dot64``; the order is defined, not numpy's). [..., n]·[..., n] -> [...]"""
    return kernels.dot64(a, b, path=path)


def to_f16(x: np.ndarray) -> np.ndarray:
    """Round float32 to F16 (nearest even) and back, as ggml's fp32→fp16 conversion does."""
    return x.astype(np.float16).astype(F32)
