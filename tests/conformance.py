"""Conformance with llama.cpp whose verdict does not depend on the CPU (docs/numerics.md, "Verdicts
that hold on any CPU").

llama.cpp's float32 arithmetic between two rounding points differs from refimpl's in the last ulps
(SIMD exp, SIMD accumulation orders — per ISA). Such noise is harmless until it meets a rounding
point: llama.cpp quantizes every matmul's float input (Q8_0 / Q8_1 / Q8_K, F16/BF16 rounding), and
MoE routing picks the top-K experts. Where a float-noise difference lands the two sides on different
integer codes — a *crossing* — the results part by a full quantum, and whether that happens is a
property of the CPU. So no fixed tolerance on end-to-end logits can be right on every CPU. Instead:

* **layer-local** (:func:`patched_run`): every rounding site and every layer input is fed
  llama.cpp's own captured value (:class:`refimpl.oracle.trace.Patcher`), so each segment of refimpl
  between two rounding points runs from llama.cpp's own input and must reproduce llama.cpp's output
  to float noise (``NOISE``) everywhere — no crossing can occur, on any CPU;
* **layer inputs only** (:func:`layer_input_run`): each layer gets llama.cpp's input (its
  ``l_out-(il-1)``), recurrent and K/V state built from it; its output is at float noise except
  at and after a crossing found inside that layer;
* **end to end**: every position that leaves float noise has a crossing at or before it, found by
  :func:`crossings`: a site where quantizing llama.cpp's captured float input and refimpl's own with
  refimpl's quantizer (:func:`activation_codes`) gives different integer codes while the two
  floats differ only at float noise (or a routing choice that flips while the router logits agree
  to float noise).

A :class:`Block` lists what a part of the model (the trunk, or the MTP block) needs for this: its
rounding sites with the matrices that quantize them, its routers, the inputs to patch and the
outputs to compare, each under refimpl's trace name and llama.cpp's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

import kernels
from kernels.base.blocks import QT, layout
from refimpl.oracle.trace import Patcher
from refimpl.io.weights import DenseFFNWeights

NOISE = 1e-5  # float noise: max |Δ| of a row relative to its max |value| (issue 11's bound)
MIXES = ["f32", "bf16", "q8_0", "q4_k_m", "mxfp4", "iq1_m", "iq2_xxs", "iq3_xxs", "tq1_0", "tq2_0"]  # the tiny fixtures
PROMPT_LEN, N_GEN = 24, 32  # tests/test_trunk.py: a random prompt, then refimpl's greedy continuation
MTP_PROMPT = [11, 42, 7, 300, 5, 99, 64, 200, 13, 1, 77, 256]  # tests/test_drafts.py


def tiny_prompt(n: int = PROMPT_LEN, seed: int = 1) -> list[int]:
    """``n`` random normal (non-special) tokens of the tiny fixtures' vocabulary."""
    return [int(t) for t in np.random.default_rng(seed).integers(0, 390, size=n)]


@dataclass(frozen=True)
class Site:
    """The float input of quantized matmuls: refimpl's and llama.cpp's name, the matrices, its unit."""

    ours: str
    theirs: str
    weights: tuple  # refimpl.io.weights.Matrix objects multiplied by it
    unit: int  # the layer it belongs to (n_layer: the MTP block; -1: the trunk's output head)


@dataclass(frozen=True)
class Router:
    """A MoE router: refimpl's top-K and logits, llama.cpp's logits and probabilities."""

    unit: int
    ours_topk: str
    ours_logits: str
    theirs_logits: str
    theirs_probs: str
    outputs: tuple[str, ...]  # refimpl names whose value at a position depends on the choice there


@dataclass(frozen=True)
class Block:
    sites: list[Site]
    routers: list[Router]
    inputs: list[tuple[str, str]]  # (ours, theirs): patched in every layer-local run
    outputs: list[tuple[str, str]]  # (ours, theirs): compared in the fully patched run
    unit_results: dict[int, list[tuple[str, str]]]  # unit -> its results (ours, theirs), in the inputs-only run
    n_expert_used: int

    def theirs_names(self) -> list[str]:
        names = [s.theirs for s in self.sites] + [r.theirs_logits for r in self.routers]
        names += [r.theirs_probs for r in self.routers] + [t for _, t in self.inputs + self.outputs]
        return sorted(set(names) - {"logits"})


def _same(il: int, *names: str) -> list[tuple[str, str]]:
    """(ours, theirs) pairs for names refimpl and llama.cpp share: ``NAME-il``."""
    return [(f"{n}-{il}", f"{n}-{il}") for n in names]


def _ffn_parts(ffn, il: int, prefix: str, after: tuple[str, ...]):
    """The FFN's sites and router (None for qwen35's dense FFN); ``prefix``: the names' prefix in both
    (``mtp_`` in the MTP block, where llama.cpp's build_moe_ffn / build_ffn names carry none);
    ``after``: the names past the FFN that depend on its routing at the same position."""
    if isinstance(ffn, DenseFFNWeights):  # build_ffn: attn_post_norm -> gate, up; ffn_swiglu -> down
        return [Site(f"{prefix}attn_post_norm-{il}", f"{prefix}attn_post_norm-{il}", (ffn.ffn_gate, ffn.ffn_up), il),
                Site(f"{prefix}ffn_swiglu-{il}", f"ffn_swiglu-{il}", (ffn.ffn_down,), il)], None
    e = ffn.experts
    sites = [
        Site(f"{prefix}attn_post_norm-{il}", f"{prefix}attn_post_norm-{il}",
             (ffn.ffn_gate_inp, e.gate(0), e.up(0), ffn.ffn_gate_shexp, ffn.ffn_up_shexp), il),
        Site(f"{prefix}ffn_moe_swiglu-{il}", f"ffn_moe_swiglu-{il}", (e.down(0),), il),
        Site(f"{prefix}ffn_swiglu-{il}", f"ffn_swiglu-{il}", (ffn.ffn_down_shexp,), il),
    ]
    downstream = (f"{prefix}ffn_moe_swiglu-{il}", f"{prefix}ffn_moe_out-{il}", f"{prefix}ffn_out-{il}", *after)
    router = Router(il, f"{prefix}ffn_moe_topk-{il}", f"{prefix}ffn_moe_logits-{il}", f"ffn_moe_logits-{il}",
                    f"ffn_moe_probs-{il}", downstream)
    return sites, router


def _present(*matrices) -> tuple:
    """The matrices a layer has: split or fused Gated DeltaNet projections (the other layout's are None)."""
    return tuple(m for m in matrices if m is not None)


def trunk_block(model) -> Block:
    """The trunk: per layer the attn_norm, mixer-output, attn_post_norm and swiglu sites, then
    result_norm; layer inputs the token embedding and ``l_out-il``; logits compared. Every arch:
    qwen35's dense FFN, qwen3next's fused ``ssm_in`` / ``ssm_ba`` and its embedding's name."""
    c, w = model.config, model.weights
    sites, routers, outputs = [], [], []
    embed = "model.embed_tokens" if c.arch.name == "qwen3next" else "model.input_embed"  # qwen3next.cpp's cb name
    inputs = [("model.input_embed", embed)]
    for il, lw in enumerate(w.layers):
        m = lw.mixer
        if c.is_recurrent[il]:
            projections = _present(m.attn_qkv, m.attn_gate, m.ssm_beta, m.ssm_alpha, m.ssm_in, m.ssm_ba)
            sites += [Site(f"attn_norm-{il}", f"attn_norm-{il}", projections, il),
                      Site(f"final_output-{il}", f"final_output-{il}", (m.ssm_out,), il)]
            outputs += _same(il, "linear_attn_out")
        else:
            sites += [Site(f"attn_norm-{il}", f"attn_norm-{il}", (m.attn_q, m.attn_k, m.attn_v), il),
                      Site(f"attn_gated-{il}", f"attn_gated-{il}", (m.attn_output,), il)]
            outputs += _same(il, "attn_output")
        ffn_sites, router = _ffn_parts(lw.ffn, il, "", (f"l_out-{il}",))
        sites += ffn_sites
        routers += [router] if router else []
        outputs += _same(il, "attn_residual", "ffn_out") + (_same(il, "ffn_moe_out", "ffn_shexp") if router else [])
        inputs += _same(il, "l_out")  # layer il's output, layer il+1's input
    sites.append(Site("result_norm", "result_norm", (w.output,), -1))
    outputs.append(("result_output", "logits"))
    results = {il: _same(il, "l_out") for il in range(c.n_layer)} | {-1: [("result_output", "logits")]}
    return Block(sites, routers, inputs, outputs, results, c.n_expert_used)


def mtp_block(model, mw) -> Block:
    """The MTP block (refimpl.model.mtp.mtp_forward; llama.cpp's MTP context, tests/llama_ref.py): its
    inputs are the token rows and the hidden it is handed (given to it directly)."""
    c = model.config
    L = c.n_layer
    lw, m = mw.layer, mw.layer.mixer
    sites = [Site(f"mtp_concat-{L}", f"mtp_concat-{L}", (mw.eh_proj,), L),
             Site(f"mtp_attn_norm-{L}", f"mtp_attn_norm-{L}", (m.attn_q, m.attn_k, m.attn_v), L),
             Site(f"mtp_attn_gated-{L}", f"mtp_attn_out-{L}.src1", (m.attn_output,), L)]  # unnamed in llama.cpp
    ffn_sites, router = _ffn_parts(lw.ffn, L, "mtp_", (f"mtp_post_ffn-{L}", "h_nextn"))
    sites += ffn_sites + [Site("h_nextn", "h_nextn", (mw.shared_head_head,), L)]
    moe_outputs = ("mtp_ffn_moe_out", "mtp_ffn_shexp") if router else ()  # qwen35's dense FFN has neither
    outputs = _same(L, "mtp_eh_proj", "mtp_attn_out", "mtp_attn_residual", *moe_outputs,
                    "mtp_ffn_out", "mtp_post_ffn") + [("result_output", "result_output")]
    results = {L: [("h_nextn", "h_nextn"), ("result_output", "result_output")]}
    return Block(sites, [router] if router else [], _same(L, "mtp_tok_embd"), outputs, results, c.n_expert_used)


# ---- comparing --------------------------------------------------------------------------------


def rel_rows(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Per position: max |ours − theirs| / max |theirs| over the row. [T, n] -> [T]"""
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    ours = ours.reshape(theirs.shape)
    scale = np.maximum(np.abs(theirs).max(axis=-1), 1e-30)
    return np.abs(ours - theirs).max(axis=-1) / scale


def _rounding_types(weights) -> list:
    """The distinct activation conversions of these matrices that round (not F32)."""
    types = {layout(w.qtype).vec_dot_type: w.qtype for w in weights}
    return [q for vdt, q in types.items() if vdt != QT.F32]


def activation_codes(x: np.ndarray, qtype) -> list[np.ndarray]:
    """What a ``qtype`` matmul's activation conversion *rounds*, per row of x [T, n]: the integer
    quants, and the F16 fields (Q8_0's ``d``, Q8_1's ``d`` and ``s``) — each a rounding point —, or
    the F16 / BF16 values. Not Q8_K's ``d``: a float32 ``1/iscale``, continuous in x (a float-noise
    difference there is float noise in every product, not a crossing). Each array is [T, …]."""
    vdt = layout(qtype).vec_dot_type
    if vdt == QT.Q8_0:
        return list(kernels.quantize_q8_0(x))
    if vdt == QT.Q8_1:
        return list(kernels.quantize_q8_1(x))
    if vdt == QT.Q8_K:
        return [kernels.quantize_q8_K(x).qs]
    return [kernels.activation_values(x, qtype)]  # F16 / BF16 rounding


def _selection(probs: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # [T, K]: ggml's argsort top-k, descending


@dataclass(frozen=True)
class Crossing:
    position: int
    unit: int
    site: str  # the site's llama.cpp name, or the router's logits name
    detail: str

    def __str__(self):
        return f"position {self.position}: {self.site} ({self.detail})"


def crossings(block: Block, ours: dict, theirs: dict) -> list[Crossing]:
    """Every (position, site) where the two sides' quantized activations differ while their floats
    agree to float noise, and every router whose choice differs while its logits agree to noise."""
    found = []
    for s in block.sites:
        if s.theirs not in theirs or s.ours not in ours:
            raise KeyError(f"missing intermediate {s.ours} / {s.theirs}")
        a, b = ours[s.ours].astype(np.float32), theirs[s.theirs].astype(np.float32).reshape(ours[s.ours].shape)
        at_noise = rel_rows(a, b) <= NOISE
        for q in _rounding_types(s.weights):
            diff = np.zeros(a.shape[0], np.int64)  # [T]: rounded fields that differ
            for ca, cb in zip(activation_codes(a, q), activation_codes(b, q)):
                diff += (ca != cb).reshape(a.shape[0], -1).sum(axis=-1)
            for p in np.nonzero(at_noise & (diff > 0))[0]:
                found.append(Crossing(int(p), s.unit, s.theirs, f"{int(diff[p])} {layout(q).vec_dot_type.name} "
                                      f"code(s) differ for {q.name}, floats {rel_rows(a[p:p + 1], b[p:p + 1])[0]:.1e} apart"))
    for r in block.routers:
        mine = ours[r.ours_topk].astype(np.int64)
        their = _selection(theirs[r.theirs_probs], block.n_expert_used)
        at_noise = rel_rows(ours[r.ours_logits], theirs[r.theirs_logits]) <= NOISE
        for p in np.nonzero(at_noise & np.any(mine != their, axis=-1))[0]:
            found.append(Crossing(int(p), r.unit, r.theirs_logits, f"experts {mine[p].tolist()} vs {their[p].tolist()}"))
    return sorted(found, key=lambda x: (x.position, x.unit))


def first_crossing_at_or_before(found: list[Crossing], T: int, units=None) -> np.ndarray:
    """[T] bool: a crossing (in ``units``, default all) at or before each position."""
    hit = np.zeros(T, bool)
    for x in found:
        if units is None or x.unit in units:
            hit[x.position] = True
    return np.cumsum(hit) > 0


# ---- the layer-local runs -----------------------------------------------------------------------


def patch_values(block: Block, theirs: dict, *, sites: bool) -> dict:
    """refimpl name -> llama.cpp's rows: the block's inputs (and, with ``sites``, every rounding site)."""
    values = {o: theirs[t] for o, t in block.inputs}
    if sites:
        values.update({s.ours: theirs[s.theirs] for s in block.sites})
    return values


def run_patched(run, block: Block, theirs: dict, *, sites: bool) -> dict:
    """``run(ctx_trace)`` with a :class:`Patcher` feeding llama.cpp's values; refimpl's own values of
    every name (before substitution) are returned."""
    patcher = Patcher(patch_values(block, theirs, sites=sites))
    run(patcher)
    return patcher.arrays()


def routing_ties(block: Block, ours: dict, theirs: dict) -> dict[str, np.ndarray]:
    """refimpl name -> [T] bool: positions where a router's choice flipped on a float-noise tie
    (those names' values there depend on the choice). A flip without a tie raises AssertionError."""
    skip = {}
    for r in block.routers:
        mine = ours[r.ours_topk].astype(np.int64)
        flipped = np.any(mine != _selection(theirs[r.theirs_probs], block.n_expert_used), axis=-1)
        tie = rel_rows(ours[r.ours_logits], theirs[r.theirs_logits]) <= NOISE
        assert not np.any(flipped & ~tie), f"{r.theirs_logits}: routing differs at {np.nonzero(flipped & ~tie)[0].tolist()}"
        for name in r.outputs:
            skip[name] = flipped
    return skip


def assert_patched_at_noise(block: Block, ours: dict, theirs: dict, what: str) -> dict[str, float]:
    """Every site input, layer input and output of the fully patched run at float noise, at every
    position (but for a routing tie); returns name -> worst relative error, for reports."""
    skip = routing_ties(block, ours, theirs)
    worst = {}
    pairs = [(s.ours, s.theirs) for s in block.sites] + block.inputs + block.outputs
    for o, t in pairs:
        err = rel_rows(ours[o], theirs[t])
        err = np.where(skip.get(o, np.zeros(len(err), bool)), 0.0, err)
        worst[t] = float(err.max())
        assert err.max() <= NOISE, (f"{what}: {o} from llama.cpp's own inputs is {err.max():.2g} off at position "
                                    f"{int(err.argmax())} (float noise: {NOISE:g})")
    return worst


def assert_layers_at_noise_or_crossing(block: Block, ours: dict, theirs: dict, what: str) -> dict[int, int]:
    """Layer-inputs-only run: each unit's output at float noise at every position, except at and
    after a crossing inside that unit. Returns unit -> positions explained by a crossing."""
    found = crossings(block, ours, theirs)
    explained = {}
    for unit, results in block.unit_results.items():
        for o, t in results:
            err = rel_rows(ours[o], theirs[t])
            crossed = first_crossing_at_or_before(found, len(err), {unit})
            bad = (err > NOISE) & ~crossed
            assert not bad.any(), (f"{what}: {o} fed llama.cpp's own input is {err[bad].max():.2g} off at position "
                                   f"{int(np.nonzero(bad)[0][0])} with no crossing inside the layer up to there")
            explained[unit] = explained.get(unit, 0) + int(((err > NOISE) & crossed).sum())
    return explained


def assert_layer_local(run, block: Block, theirs: dict, what: str) -> None:
    """Both layer-local verdicts for ``run(trace)`` (refimpl over all positions with a trace hook):
    fully patched at float noise everywhere, and fed only its inputs at float noise but after a
    crossing inside a unit."""
    assert_patched_at_noise(block, run_patched(run, block, theirs, sites=True), theirs, what)
    assert_layers_at_noise_or_crossing(block, run_patched(run, block, theirs, sites=False), theirs, what)


# ---- a greedy run of refimpl next to llama.cpp's trace of the same tokens ----------------------


@dataclass(frozen=True)
class TrunkRun:
    """refimpl's greedy continuation of ``prompt`` (every position decoded and recorded) and llama.cpp
    traced on the same tokens (tests/llama_trace.py: one token per decode, F32 K/V, no flash
    attention — the setting ``ctx`` emulates)."""

    model: object
    ctx: object  # refimpl.model.ops.Ctx
    prompt: list
    gen: list
    ours: dict  # name -> [T, n]: every intermediate refimpl recorded
    theirs: dict  # name -> [T, n]: llama.cpp's, with "logits"

    @staticmethod
    def make(model, path, ctx, prompt, n_gen: int, extra_names=()) -> "TrunkRun":
        from llama_trace import llama_trace

        from refimpl.decode.greedy import greedy
        from refimpl.oracle.trace import Recorder

        rec = Recorder()
        gen = greedy(model, prompt, n_gen + 1, dataclasses.replace(ctx, trace=rec))[:n_gen]  # decodes all n_gen
        names = sorted(set(trunk_block(model).theirs_names()) | set(extra_names))
        return TrunkRun(model, ctx, list(prompt), gen, rec.arrays(), llama_trace(path, list(prompt) + gen, names))

    @property
    def tokens(self) -> list:
        return self.prompt + self.gen

    def block(self) -> Block:
        return trunk_block(self.model)

    def forward(self, trace, ctx=None):
        """refimpl over all the tokens in one batch (bit-identical to one at a time), with ``trace``."""
        from refimpl.model.trunk import forward
        from refimpl.model.state import SeqState

        ctx = dataclasses.replace(ctx or self.ctx, trace=trace)
        return forward(self.model, SeqState.fresh(self.model.config), self.tokens, ctx)

    def logit_error(self) -> np.ndarray:
        return rel_rows(self.ours["result_output"], self.theirs["logits"])

    def greedy_steps_differing(self) -> np.ndarray:
        """Generated steps where llama.cpp, fed refimpl's stream, would have picked another token
        (its greedy stream equals refimpl's iff there are none)."""
        step_pos = np.arange(len(self.prompt) - 1, len(self.tokens) - 1)  # the logits that chose each step
        return np.nonzero(np.argmax(self.theirs["logits"][step_pos], axis=-1) != np.array(self.gen))[0]

    def assert_end_to_end(self, what: str) -> list[Crossing]:
        """Every position at float noise unless a crossing happened at or before it; the greedy
        streams identical except at a step after a crossing (the logits then part by more than
        float noise, and a flip needs llama.cpp's top-2 margin below the two logits' |Δ| — a
        near-tie by construction). Returns the crossings found."""
        err = self.logit_error()
        found = crossings(self.block(), self.ours, self.theirs)
        crossed = first_crossing_at_or_before(found, len(err))
        bad = (err > NOISE) & ~crossed
        assert not bad.any(), (f"{what}: position {int(np.nonzero(bad)[0][0])} is {err[bad][0]:.3g} off with no "
                               f"crossing at or before it (first crossing: {found[0] if found else 'none'})")
        steps = [int(i) for i in self.greedy_steps_differing() if not crossed[len(self.prompt) - 1 + i]]
        assert not steps, f"{what}: greedy streams differ at generated step {steps[0]} with no crossing before it"
        return found


# ---- the figures of docs/numerics.md ------------------------------------------------------------


def summary(run: TrunkRun) -> dict:
    """What docs/numerics.md tabulates for one mix: positions at float noise, the worst position,
    the crossings, greedy steps that differ, and the layer-local runs' worst errors."""
    err = run.logit_error()
    found = crossings(run.block(), run.ours, run.theirs)
    patched = run_patched(run.forward, run.block(), run.theirs, sites=True)
    worst = assert_patched_at_noise(run.block(), patched, run.theirs, "summary")
    return {"at_noise": int((err <= NOISE).sum()), "T": len(err), "max": float(err.max()), "crossings": len(found),
            "first": str(found[0]) if found else "none", "greedy_differs": run.greedy_steps_differing().tolist(),
            "layer_local_max": max(worst.values())}


@dataclass(frozen=True)
class MTPRun:
    """llama.cpp's run of ``prompt`` with its MTP context (tests/llama_ref.py), the trunk's and the
    head's intermediates captured, next to refimpl's model and ``ctx``."""

    model: object
    ctx: object
    prompt: list
    ref: object  # llama_ref.LlamaRun: hidden, logits, mtp_logits, trace (with "logits"), mtp_trace
    trunk: Block
    head: Block

    @staticmethod
    def make(model, path, ctx, prompt) -> "MTPRun":
        from llama_ref import llama_run

        from refimpl.model.mtp import load_mtp_weights

        trunk, head = trunk_block(model), mtp_block(model, load_mtp_weights(model.file, model.weights))
        ref = llama_run(path, list(prompt), mtp=True, trace=trunk.theirs_names(), mtp_trace=head.theirs_names())
        ref.trace["logits"] = ref.logits
        return MTPRun(model, ctx, list(prompt), ref, trunk, head)

    def head_from_their_hiddens(self, trace) -> np.ndarray:
        """The head as catch-up feeds it: token p with llama.cpp's hidden of p−1. -> logits [T, V]"""
        from refimpl.decode.drafts import mtp_catchup_logits

        return mtp_catchup_logits(self.model, self.prompt, self.ref.hidden, dataclasses.replace(self.ctx, trace=trace))

    def assert_layer_local(self, what: str) -> None:
        assert_layer_local(self.head_from_their_hiddens, self.head, self.ref.mtp_trace, what)

    def own(self):
        """refimpl end to end: the trunk's hiddens and the head fed them, with both traces.
        -> (h [T, E], mtp logits [T, V], trunk trace, head trace)"""
        from refimpl.decode.drafts import mtp_catchup_logits
        from refimpl.model.trunk import forward
        from refimpl.model.state import SeqState
        from refimpl.oracle.trace import Recorder

        rec, mtp_rec = Recorder(), Recorder()
        _, h, _ = forward(self.model, SeqState.fresh(self.model.config), self.prompt, dataclasses.replace(self.ctx, trace=rec))
        mtp = mtp_catchup_logits(self.model, self.prompt, h, dataclasses.replace(self.ctx, trace=mtp_rec))
        return h, mtp, rec.arrays(), mtp_rec.arrays()

    def assert_f32_close(self, what: str, tol: float = 1e-4) -> None:
        """An f32 file (no rounding site): the trunk's hiddens and the head's logits, fed refimpl's own
        hiddens and llama.cpp's, within ``tol`` of llama.cpp; the same drafted tokens."""
        h, mtp, _, _ = self.own()
        errs = [rel_rows(h, self.ref.hidden).max(), rel_rows(mtp, self.ref.mtp_logits).max(),
                rel_rows(self.head_from_their_hiddens(None), self.ref.mtp_logits).max()]
        assert max(errs) <= tol, f"{what}: hidden, MTP logits (own h), MTP logits (their h) off by {errs}"
        assert np.array_equal(mtp.argmax(axis=1), self.ref.mtp_logits.argmax(axis=1)), f"{what}: drafted tokens differ"

    def assert_end_to_end(self, what: str) -> list[Crossing]:
        """The trunk's hiddens and the head's logits (fed refimpl's own hiddens) at float noise at every
        row but at and after a crossing (trunk rows up to p−1, head rows up to p), and the same drafted
        token wherever no crossing came before. Returns the crossings found."""
        h, mtp, ours, mtp_ours = self.own()
        h_err, mtp_err = rel_rows(h, self.ref.hidden), rel_rows(mtp, self.ref.mtp_logits)
        T = len(self.prompt)
        in_trunk = crossings(self.trunk, ours, self.ref.trace)
        in_head = crossings(self.head, mtp_ours, self.ref.mtp_trace)
        trunk_crossed = first_crossing_at_or_before(in_trunk, T)
        crossed = first_crossing_at_or_before(in_head, T) | np.concatenate([[False], trunk_crossed[:-1]])  # row p reads h of p−1
        bad = (h_err > NOISE) & ~trunk_crossed
        assert not bad.any(), f"{what}: trunk hidden {int(np.nonzero(bad)[0][0])} is {h_err[bad][0]:.3g} off with no crossing"
        bad = (mtp_err > NOISE) & ~crossed
        assert not bad.any(), f"{what}: MTP row {int(np.nonzero(bad)[0][0])} is {mtp_err[bad][0]:.3g} off with no crossing"
        flipped = mtp.argmax(axis=1) != self.ref.mtp_logits.argmax(axis=1)
        assert not np.any(flipped & ~crossed), f"{what}: drafted tokens differ at rows {np.nonzero(flipped & ~crossed)[0]} with no crossing"
        return in_trunk + in_head


def mtp_summary(model, path, ctx, prompt) -> dict:
    """The MTP block's figures (q8_0 in docs/numerics.md): its logits fed refimpl's own trunk hiddens
    against llama.cpp's MTP context, and the layer-local worst error."""
    run = MTPRun.make(model, path, ctx, prompt)
    _, mtp, ours, mtp_ours = run.own()
    err = rel_rows(mtp, run.ref.mtp_logits)
    found = crossings(run.trunk, ours, run.ref.trace) + crossings(run.head, mtp_ours, run.ref.mtp_trace)
    patched = run_patched(run.head_from_their_hiddens, run.head, run.ref.mtp_trace, sites=True)
    worst = assert_patched_at_noise(run.head, patched, run.ref.mtp_trace, "MTP summary")
    return {"at_noise": int((err <= NOISE).sum()), "T": len(err), "max": float(err.max()), "crossings": len(found),
            "first": str(min(found, key=lambda x: x.position)) if found else "none", "greedy_differs": "—",
            "layer_local_max": max(worst.values())}


def _main(mixes: list[str]) -> None:
    """``python tests/conformance.py [[ARCH:]MIX …]``: the end-to-end and layer-local figures of every
    mix (of the qwen35moe tiny fixture, or ``qwen35:q4_k_m`` / ``qwen3next:q8_0`` for a sibling arch)
    on this machine, with the ISA both sides run (the pytest header's)."""
    import tempfile
    from pathlib import Path

    import conftest
    from refimpl.fixtures import write_fixture
    from refimpl.model.trunk import load_model
    from refimpl.model.ops import Ctx

    print("\n".join(conftest.pytest_report_header(None)))
    print("| mix | at noise (≤ 1e-5) | max | crossings | first crossing | greedy steps differing | layer-local max |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for case in mixes or MIXES:
            arch, _, mix = case.rpartition(":")
            path = Path(tmp) / f"tiny-{arch or 'qwen35moe'}-{mix}.gguf"
            write_fixture(path, preset="tiny", quant=mix, seed=0, **({"arch": arch} if arch else {}))
            model = load_model(path)
            s = summary(TrunkRun.make(model, path, Ctx(act_quant=mix != "f32"), tiny_prompt(), N_GEN))
            _row(case, s)
            if mix == "q8_0":  # the MTP head of tests/test_drafts.py (tests/test_arch.py for a sibling arch)
                _row(f"{case} MTP head", mtp_summary(model, path, Ctx(act_quant=True), MTP_PROMPT))


def _row(what: str, s: dict) -> None:
    print(f"| {what} | {s['at_noise']}/{s['T']} | {s['max']:.1e} | {s['crossings']} | {s['first']} | "
          f"{s['greedy_differs'] or 'none'} | {s['layer_local_max']:.1e} |", flush=True)


if __name__ == "__main__":
    import sys

    _main(sys.argv[1:])
