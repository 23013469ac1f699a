"""Where an engine departs: its dumped intermediates (refimpl.oracle.dump_read) against the oracle's, op by op.

``refimpl trace MODEL --tokens … --against DUMP`` runs refimpl's forward pass on the tokens with a
:class:`refimpl.oracle.trace.Recorder` and names, per position, the **first** intermediate in graph order
(the order refimpl — following src/models/qwen35moe.cpp — computes them) whose difference from the dump's
exceeds the bound of the configuration (:data:`BOUNDS`); the departing intermediates after it are
*downstream*.

Layer-local when it can be: with ``--emulate`` or without emulation, and a dump of arrays that holds every
activation-rounding site and layer input refimpl would patch (:func:`patch_names`: the inputs of the
quantized matmuls, the router logits, each layer's output), refimpl runs from the engine's own values there
(:class:`refimpl.oracle.trace.Patcher`, as tests/conformance.py's layer-local test does). Each segment then
starts from the engine's input, so a float-noise difference cannot cross a rounding point and grow into a
false departure, and the first departure is the op that computes differently. With ``--emulate=ggml`` the
two sides are equal bit for bit up to the first departure, so nothing needs patching.

Compared per position: ``max |Δ| / max |engine row|`` (float bounds) or the float32 bits (``--emulate=ggml``).
llama-eval-callback's text holds sums and a few printed values per tensor: those are compared, with the
bounds for sums, per tensor over the whole batch. refimpl.oracle.trace_report writes the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from refimpl.errors import RefimplError
from refimpl.oracle.dump_read import Dump, TextTensor
from refimpl.oracle.dumper import LAYER_NAMES, MODEL_NAMES


@dataclass(frozen=True)
class Bound:
    """A departure is a difference above ``value`` × the scale (``0``: any differing bit departs)."""

    value: float
    scale: str  # what value multiplies: "bits", "max |row|" (per position), "sum |x|" (a printed sum)
    source: str  # where the number comes from


#: configuration ("ggml": --emulate=ggml; "emulate": --emulate[=CONFIG]; "plain": no emulation) × what is compared
#: → its bound. docs/validating-an-engine.md, "Where an engine departs", prints this table.
BOUNDS: dict[tuple[str, str], Bound] = {
    ("ggml", "array"): Bound(0.0, "bits", "docs/numerics.md 'End to end: --emulate=ggml': every op as the loaded "
                                          "libggml-cpu computes it, bit for bit (tests/test_ggml_e2e.py)"),
    ("ggml", "text"): Bound(0.0, "bits", "the same float32 values, summed in the printer's order (a float32 running "
                                         "sum, common/debug.cpp) and printed with its format, print the same digits"),
    ("emulate", "array"): Bound(1e-5, "max |row|", "docs/numerics.md 'Verdicts that hold on any CPU': each segment "
                                                   "from llama.cpp's own inputs is at float noise, ≤ 1e-5 "
                                                   "(tests/conformance.py NOISE; measured ≤ 2e-6)"),
    ("emulate", "array-f16-attention"): Bound(1e-3, "max |row|", "docs/numerics.md 'Measured agreement with llama.cpp': "
                                              "single elements of the F16-rounded attention paths (F16 K/V, flash "
                                              "attention) one F16 rounding apart: 2^-11 ≈ 4.9e-4 of the element"),
    ("emulate", "array-end-to-end"): Bound(2.5e-2, "max |row|", "docs/numerics.md 'Measured agreement with llama.cpp': "
                                           "end to end, an activation-quantization crossing moves the quantized "
                                           "mixes by up to 2.2e-2 of max |logit|"),
    ("emulate", "text"): Bound(2.5e-2, "sum |x|", "the end-to-end bound above (a printed dump cannot be patched), "
                                                  "on the sum's scale"),
    ("plain", "array"): Bound(5e-2, "max |row|", "docs/numerics.md 'Measured agreement with llama.cpp': without "
                                                 "emulation the activation quantization refimpl does not do moves "
                                                 "each matmul by ≈ 1 %; 5 % is five of those"),
    ("plain", "text"): Bound(5e-2, "sum |x|", "the plain bound above, on the sum's scale"),
}
F16_ATTENTION = ("attn_pregate", "attn_gated")  # outputs of the attention over the F16 K/V / flash accumulator
ALIASES = {"model.embed_tokens": "model.input_embed"}  # qwen3next.cpp's cb name → refimpl's trace name
#: llama.cpp's names that refimpl traces under another name in some layers: the Gated DeltaNet's output is
#: ``attn_output`` in src/models/delta-net-base.cpp, ``attn_output_delta`` in refimpl.model.deltanet
LAYER_ALIASES = {"attn_output": "attn_output_delta"}
#: refimpl's trace names fed from the engine in a layer-local run: every quantized matmul's input, the router
#: logits (so the experts are the engine's), each layer's output (the next layer's input), the LM head's input.
PATCHED = ("model.input_embed", "attn_norm", "attn_gated", "final_output", "attn_post_norm", "ffn_moe_logits",
           "ffn_moe_swiglu", "ffn_swiglu", "l_out", "result_norm")
COMPARABLE = set(LAYER_NAMES) | set(MODEL_NAMES) | {"attn_output_delta"}


def configuration(ctx) -> str:
    return "ggml" if ctx.ggml else "emulate" if ctx.act_quant else "plain"


def base_name(name: str) -> str:
    head, _, il = name.rpartition("-")
    return head if head and il.isdigit() else name


def our_name(name: str, ours) -> str:
    """refimpl's trace name for the dump's ``name`` (:data:`ALIASES`, :data:`LAYER_ALIASES` where the model has
    no tensor of llama.cpp's name)."""
    name = ALIASES.get(name, name)
    base = base_name(name)
    if name not in ours and base in LAYER_ALIASES:
        other = LAYER_ALIASES[base] + name[len(base):]
        return other if other in ours else name
    return name


def other_kind(name: str, ours) -> bool:
    """A per-layer name refimpl compares, of a layer the model has, that refimpl does not trace in that layer:
    llama.cpp's name of another op there (qwen3next's attention calls its output gate ``gate``, the delta net's
    name), or a name of the other layer kind that a dumper asked for in every layer."""
    base, _, il = name.rpartition("-")
    return bool(base) and il.isdigit() and base in COMPARABLE and any(n.endswith(f"-{il}") for n in ours)


def patch_names(recorded: list[str]) -> list[str]:
    return [n for n in recorded if base_name(n) in PATCHED]


@dataclass
class Diff:
    name: str
    max_abs: float
    rel: float  # max |Δ| / max |engine row| (a text dump: over the scale of its bound)
    bound: float
    departs: bool
    detail: str = ""  # e.g. "3 of 64 elements differ"
    scale: str = "max |row|"  # what ``rel`` is relative to

    def json(self) -> dict:
        d = {"name": self.name, "max_abs": _num(self.max_abs), "relative": _num(self.rel), "scale": self.scale,
             "bound": self.bound}
        return d | ({"detail": self.detail} if self.detail else {})


@dataclass
class PositionResult:
    label: str  # "3" or "0-6" (a batch, from sums)
    diffs: list[Diff] = field(default_factory=list)  # graph order

    @property
    def departing(self) -> list[Diff]:
        return [d for d in self.diffs if d.departs]


def _num(x: float):
    return None if not np.isfinite(x) else float(x)


# ---- arrays (npy, gguf) ------------------------------------------------------------------------


def check_arrays(dump: Dump, n_tokens: int) -> dict[str, np.ndarray]:
    """The dump's arrays under refimpl's names; names refimpl does not compare and missing positions refused."""
    out = {}
    for name, arr in dump.arrays.items():
        ours = ALIASES.get(name, name)
        if base_name(ours) not in COMPARABLE | set(LAYER_ALIASES):
            raise RefimplError(f"--against {dump.path}: unknown intermediate '{name}' (refimpl compares llama.cpp's "
                               f"{', '.join(LAYER_NAMES[:4])}, … -IL and {', '.join(MODEL_NAMES)})")
        if arr.shape[0] != n_tokens:
            raise RefimplError(f"--against {dump.path}: {name} has {arr.shape[0]} positions, --tokens gives {n_tokens}")
        out[ours] = arr
    return out


def compare_arrays(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray], config: str, ctx, local: bool,
                   where) -> list[PositionResult]:
    """Per position, every intermediate both hold, in refimpl's (graph) order; the dump's names of ops refimpl
    does not trace in that layer (:func:`other_kind`) are left out (the caller lists them)."""
    theirs = {our_name(n, ours): a for n, a in theirs.items()}
    unknown = [n for n in theirs if n not in ours and not other_kind(n, ours)]
    if unknown:
        raise RefimplError(f"--against {where}: unknown intermediate '{unknown[0]}' (this model computes no such tensor)")
    T = next(iter(theirs.values())).shape[0]
    results = [PositionResult(str(t)) for t in range(T)]
    for name, mine in ours.items():
        if name not in theirs:
            continue
        eng = theirs[name]
        if eng.shape[1] != mine.shape[1]:
            raise RefimplError(f"--against {where}: {name} has {eng.shape[1]} values per position, the model's has "
                               f"{mine.shape[1]}")
        bound = bound_for(config, name, ctx, local)
        for t in range(T):
            results[t].diffs.append(_diff(name, mine[t], eng[t], bound))
    return results


def bound_for(config: str, name: str, ctx, local: bool) -> Bound:
    if config == "emulate" and not local:
        return BOUNDS[("emulate", "array-end-to-end")]
    if config == "emulate" and base_name(name) in F16_ATTENTION and (ctx.kv_f16 or ctx.flash_attn):
        return BOUNDS[("emulate", "array-f16-attention")]
    return BOUNDS[(config, "array")]


def _diff(name: str, mine: np.ndarray, eng: np.ndarray, bound: Bound) -> Diff:
    mine, eng = np.ascontiguousarray(mine, np.float32), np.ascontiguousarray(eng, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.abs(mine.astype(np.float64) - eng.astype(np.float64))
    delta[(mine == eng) | (np.isnan(mine) & np.isnan(eng))] = 0.0  # equal infinities, NaN where both have one
    max_abs = float(np.nan_to_num(delta, nan=np.inf).max(initial=0.0))  # NaN on one side only: departs
    scale = float(np.abs(eng[np.isfinite(eng)]).max(initial=0.0))  # the finite values' scale
    rel = max_abs / scale if scale > 0 and np.isfinite(max_abs) else (0.0 if max_abs == 0 else float("inf"))
    if bound.scale == "bits":
        n = int((mine.view(np.uint32) != eng.view(np.uint32)).sum())
        return Diff(name, max_abs, rel, 0.0, n > 0, f"{n} of {mine.size} values differ" if n else "")
    return Diff(name, max_abs, rel, bound.value, not rel <= bound.value)


# ---- llama-eval-callback's text: sums and printed values ----------------------------------------


def compare_texts(ours: dict[str, np.ndarray], dump: Dump, config: str, n_tokens: int) -> tuple[PositionResult, list[str]]:
    """One result for the batch: each tensor refimpl compares, in graph order; the names skipped (not
    compared by refimpl, or not F32)."""
    texts: dict[str, TextTensor] = {our_name(n, ours): t for n, t in dump.texts.items()}
    result = PositionResult("0" if n_tokens == 1 else f"0-{n_tokens - 1}")
    for name, mine in ours.items():
        t = texts.get(name)
        if t is None or base_name(name) not in COMPARABLE or t.type != "f32" or not t.sums:
            continue
        rows = t.size // mine.shape[1] if t.size % mine.shape[1] == 0 else 0
        if rows not in (n_tokens, 1):
            raise RefimplError(f"--against {dump.path}: {t.name} is {list(t.ne)} ({t.size} values); the model's is "
                               f"{mine.shape[1]} per position × {n_tokens} positions (or the last position only)")
        flat = np.ascontiguousarray(mine if rows == n_tokens else mine[-1:], np.float32).reshape(-1)
        # llama.cpp's output rows only (the last layer after inp_out_ids, result_*): computed there on 1 row,
        # here on every row — ggml's kernels may round those apart, so the float bound applies (documented)
        key = "text" if rows == n_tokens or n_tokens == 1 or config != "ggml" else None
        bound = BOUNDS[(config, "text")] if key else BOUNDS[("emulate", "text")]
        result.diffs.append(_text_diff(name, flat, t, bound))
    skipped = sorted(n for n in texts if n not in ours or base_name(n) not in COMPARABLE)  # every other printed tensor
    return result, skipped


def printed_sum(flat: np.ndarray, ne3: int) -> np.ndarray:
    """common_debug_print_tensor's sums: a float32 running sum in index order, one per i3."""
    return np.array([np.cumsum(part, dtype=np.float32)[-1] for part in flat.reshape(ne3, -1)], np.float32)


def _apart(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a − b|, 0 where both are equal (infinities) or both NaN, inf where only one is NaN."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a - b)
    d[(a == b) | (np.isnan(a) & np.isnan(b))] = 0.0
    return np.nan_to_num(d, nan=np.inf)


def _text_diff(name: str, flat: np.ndarray, t: TextTensor, bound: Bound) -> Diff:
    """A printed tensor against refimpl's values ``flat`` (its rows, in ggml's index order): the sums as the printer
    sums (:func:`printed_sum`) and the printed values. Relative: |Δsum| over Σ|x| (less the printer's float32
    rounding, n·2^-24·Σ|x|, and its 6 decimals), |Δvalue| over max|x| (less its 4 decimals); the larger counts."""
    sums = printed_sum(flat, t.ne[3])
    ne0, ne1, ne2 = t.ne[:3]
    idx = [i0 + ne0 * (i1 + ne1 * (i2 + ne2 * i3)) for (i0, i1, i2, i3) in t.values]
    printed, theirs_sums = np.array(list(t.values.values()), np.float64), np.asarray(t.sums, np.float64)
    mine_vals = flat[idx].astype(np.float64)
    absx = np.abs(flat.astype(np.float64))
    absx[~np.isfinite(absx)] = 0.0
    d_sum, d_val = _apart(sums.astype(np.float64), theirs_sums), _apart(mine_vals, printed)
    sum_scale = np.array([p.sum() for p in absx.reshape(t.ne[3], -1)])
    slack = flat.size / t.ne[3] * 2.0 ** -24 * sum_scale + 1e-6
    rel_sum = np.maximum(d_sum - slack, 0) / np.maximum(sum_scale, 1e-30)
    rel_val = np.maximum(d_val - 5e-5, 0) / max(float(absx.max(initial=0.0)), 1e-30)
    rel = float(max(rel_sum.max(initial=0.0), rel_val.max(initial=0.0)))
    max_abs = float(d_sum.max(initial=0.0))
    if bound.scale == "bits":  # the printed digits of the same float32 values, summed in the printer's order
        bad_sums = sum(f"{float(a):f}" != f"{b:f}" and not (np.isnan(a) and np.isnan(b)) for a, b in zip(sums, t.sums))
        bad_vals = sum(f"{a:.4f}" != f"{b:.4f}" and not (np.isnan(a) and np.isnan(b)) for a, b in zip(mine_vals, printed))
        n = bad_sums + bad_vals
        return Diff(name, max_abs, rel, 0.0, n > 0,
                    f"{bad_sums} of {len(sums)} sums, {bad_vals} of {len(printed)} printed values differ" if n else "",
                    TEXT_SCALE)
    return Diff(name, max_abs, rel, bound.value, not rel <= bound.value,
                f"sum {float(sums[0]):.6f} here, {t.sums[0]:.6f} printed" if t.ne[3] == 1 else "", TEXT_SCALE)


TEXT_SCALE = "Σ|x| (sums) or max |x| (printed values)"


# ---- the run and its report --------------------------------------------------------------------


@dataclass
class Report:
    dump: Dump
    config: str
    numerics: str  # Ctx.numerics()
    mode: str  # "layer-local", "end to end" or "sums"
    positions: list[PositionResult]
    patched: list[str] = field(default_factory=list)  # fed from the engine (layer-local)
    unpatched: list[str] = field(default_factory=list)  # sites the dump lacks (end to end)
    skipped: list[str] = field(default_factory=list)  # the dump's names not compared (ops refimpl does not trace there)
    ours: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # refimpl's values, [T, n] each

    @property
    def exit_code(self) -> int:
        return 1 if any(p.departing for p in self.positions) else 0


class _DumpPatcher:
    """A trace hook: refimpl's own values recorded (a Patcher), the engine's handed back at ``values``' names,
    each checked for its size first (a wrong shape is the dump's fault: one line)."""

    def __init__(self, values: dict[str, np.ndarray], where):
        from refimpl.oracle.trace import Patcher

        self.patcher, self.values, self.where = Patcher(values), values, where

    def __call__(self, name, il, x):
        from refimpl.oracle.trace import tensor_name

        key = tensor_name(name, il)
        if key in self.values:
            n = int(np.prod(np.shape(x)[1:]))
            if self.values[key].shape[1] != n:
                raise RefimplError(f"--against {self.where}: {key} has {self.values[key].shape[1]} values per position, "
                                   f"the model's has {n}")
        return self.patcher(name, il, x)

    def arrays(self):
        return self.patcher.arrays()


def trace_against(model, tokens: list[int], dump: Dump, ctx, batch: int | None = None) -> Report:
    """Run ``model`` on ``tokens`` (in forward calls of ``batch`` tokens; default all at once, as one
    ``llama_decode``) with ``ctx`` and compare its intermediates with ``dump``'s."""
    import dataclasses

    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward
    from refimpl.oracle.trace import Recorder

    config, T = configuration(ctx), len(tokens)
    theirs = {} if dump.sums_only else check_arrays(dump, T)
    values = {n: a for n, a in theirs.items() if config != "ggml" and base_name(n) in PATCHED}
    hook = _DumpPatcher(values, dump.path) if values else Recorder()
    run_ctx = dataclasses.replace(ctx, trace=hook)
    state, step = SeqState.fresh(model.config), batch or T
    for s in range(0, T, step):
        _, _, state = forward(model, state, tokens[s : s + step], run_ctx)
    ours = hook.arrays()
    if dump.sums_only:
        result, skipped = compare_texts(ours, dump, config, T)
        if not result.diffs:
            raise RefimplError(f"--against {dump.path}: none of its {len(dump.texts)} printed tensors is an F32 "
                               "intermediate refimpl compares (attn_norm-0, l_out-0, result_norm, …)")
        return Report(dump, config, ctx.numerics(), "sums", [result], skipped=skipped, ours=ours)
    unpatched = [n for n in patch_names(list(ours)) if n not in theirs] if config != "ggml" else []
    local = config != "ggml" and not unpatched
    positions = compare_arrays(ours, theirs, config, ctx, local, dump.path)
    skipped = sorted(n for n in (our_name(m, ours) for m in theirs) if n not in ours)
    if not positions[0].diffs:
        raise RefimplError(f"--against {dump.path}: none of its intermediates is one refimpl computes for this model "
                           f"({', '.join(skipped[:4])}{', …' if len(skipped) > 4 else ''})")
    mode = "bit for bit" if config == "ggml" else "layer-local" if local else "end to end"
    return Report(dump, config, ctx.numerics(), mode, positions, [n for n in ours if n in values], unpatched, skipped,
                  ours=ours)
