"""Injected faults: the engine bugs public engines shipped, re-created in refimpl on purpose.

``refimpl audit`` exists to tell a benign near-tie from a broken accept/rollback path. To measure how
often it catches what real engines got wrong, each documented bug class that refimpl's loop, trunk
or MTP head can express is a named :class:`Fault` here (docs/bug-classes.md: mechanism, public
references, and what the audits see). Faults are off unless asked for: ``refimpl run … --inject
NAME[,NAME…]`` (hidden from the help), or ``Ctx(faults=Faults.of("no-restore"))`` in Python.

How a fault reaches the code. The clean code computes the right value, then hands it through a named
**tap point** — through the same hook that hands llama.cpp's intermediates to the trace,
:meth:`refimpl.model.ops.Ctx.cb`, under a dotted ``stage.value`` name (:data:`refimpl.model.ops.TAPS`)::

    head = ctx.cb("deltanet.kv_head", il, kv_heads(c), Hk=Hk)

For a tap point ``Ctx.cb`` calls ``ctx.faults.tap(point, value, **info)`` (never the trace hook); with
no fault switched on that returns the value unchanged (one test of an empty set). A fault names one
tap point and a ``rewrite(value, memory, **info)`` that returns the value an engine with that bug
would have used. The tap points, in dataflow order (the tokenizer, which has no ``Ctx``, calls
``faults.tap`` itself):

=======================  ==========================================  ================================
point                    value (what the clean code passes)          faults
=======================  ==========================================  ================================
``attention.q_gate``     Qcur_full viewed [T, H, 2, D]               qg-split-flat
``attention.rope_dims``  n_rot, the rotated dims per head            rope-full-width
``tokenizer.split``      the words of a text fragment                pretok-gpt2
``deltanet.kv_head``     key head of each value head [Hv]            vk-pairing
``deltanet.conv_rows``   the window the conv states are cut from     conv-post-silu, conv-drop-newest
                         [Kc−1+T, C] (after token t: rows t+1 …)
``deltanet.state``       delta-rule state after a token              state-bf16, plain-state-f16
``deltanet.ssm_norm``    the gated norm's weight (stored plain)      ssm-norm-shifted
``moe.weights``          renormalised top-k routing weights [T, K]   topk-no-renorm
``moe.shared_gate``      sigmoid(shared-expert gate) [T]             shexp-ungated
``trunk.h_nextn``        the trunk hidden handed to the MTP head     mtp-prenorm
``mtp.input_norms``      (enorm, hnorm) weights                      mtp-norms-shifted
``mtp.catchup_h``        catch-up row k's hidden (target row k−1)    mtp-same-h
``mtp.accept``           the head's state truncated to n_past        mtp-stale-kv
``loop.start``           (fresh trunk state, fresh source state)     state-leak
``loop.prefill``         the trunk state after the prompt            prefill-as-verify
``loop.decode_from``     the trunk state a round decodes from        plain-step-stale
``loop.targets``         the verify batch's argmax per row           verify-row-late
``loop.accept``          the confirmed ids of a round                accept-unverified, …-stochastic
``loop.rollback``        the trunk state after the rollback          no-restore, conv-kept, slot-±1,
                                                                     replay-rollback
``loop.finish``          the loop's final state (nothing returned)   state-leak
=======================  ==========================================  ================================

``memory`` is a dict owned by the :class:`Faults` record: a fault that needs to remember something
across calls (the previous generation's state, a random generator) keeps it there. A record is
therefore per run: a new ``Faults.of(…)`` starts with nothing remembered.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from refimpl.errors import RefimplError
from refimpl.model.state import DeltaNetState, KVCache, SeqState

F32 = np.float32


@dataclass(frozen=True)
class Fault:
    """One bug class re-created: where it acts and what an engine with it computes."""

    name: str
    bug_class: str  # B1 … B20, the numbering of docs/bug-classes.md
    title: str  # one line
    point: str  # the tap point it rewrites
    needs: str  # "" (any run), "speculative" (--mtp or --ngram), "mtp" (--mtp)
    blind: bool  # True: greedy output unchanged by construction (only acceptance can move)
    rewrite: Callable = field(repr=False, compare=False)


# ---- state helpers for the loop faults -----------------------------------------------------------


def _recurrent_at(before: SeqState, after: SeqState, n_past: int) -> tuple:
    """The recurrent layers as they were when the sequence held ``n_past`` positions, found among
    the state before the verify batch, the state after it, and the ring the batch left."""
    if n_past == after.n_past:
        return after.layers
    if n_past == before.n_past:
        return before.layers
    snap = next(s for s in after.snapshots if s.n_past == n_past)
    return snap.layers


def _with_recurrent(state: SeqState, recurrent: tuple) -> SeqState:
    """``state`` with its Gated DeltaNet layers replaced by ``recurrent``'s (KV caches kept)."""
    layers = tuple(r if isinstance(s, DeltaNetState) else s for s, r in zip(state.layers, recurrent))
    return dataclasses.replace(state, layers=layers)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 → bfloat16 (round to nearest even) → float32."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(F32)


# ---- the rewrites, one per fault ---------------------------------------------------------------


def _no_restore(value, memory, *, before, after, r, **_):
    # B1: the rollback moves the position and truncates the KV caches, but S and conv stay post-verify
    return value if r == 0 else _with_recurrent(value, after.layers)


def _conv_kept(value, memory, *, before, after, r, **_):
    # B2: S comes back from the snapshot, the conv window stays as the verify batch left it
    if r == 0:
        return value
    layers = tuple(DeltaNetState(conv=a.conv, ssm=v.ssm) if isinstance(v, DeltaNetState) else v
                   for v, a in zip(value.layers, after.layers))
    return dataclasses.replace(value, layers=layers)


def _slot(offset: int):
    # B3: the snapshot of one position too late (+1: a rejected token absorbed) or too early (−1: an
    # accepted one missing); the KV caches and the position are right
    def rewrite(value, memory, *, before, after, r, **_):
        return value if r == 0 else _with_recurrent(value, _recurrent_at(before, after, value.n_past + offset))
    return rewrite


def _plain_step_stale(value, memory, *, drafts, last):
    # B4: a step with no drafts right after a verify that accepted k ≥ 1 drafts reads the state after
    # that batch's first row (vLLM's "block column 0"), missing the accepted drafts
    if drafts or last is None or last.n_accepted == 0:
        return value
    return _with_recurrent(value, _recurrent_at(value, value, last.pos0 + 1))


def _accept_unverified(value, memory, *, drafts, targets, logits, eog_ids):
    # B10 (lattice #243): the first draft is never compared with row 0; the walk starts at row 1
    if not drafts:
        return value
    ids = [drafts[0]]
    for i in range(1, len(drafts)):
        ids.append(targets[i])
        if targets[i] != drafts[i]:
            return ids
    return ids + [targets[len(drafts)]]


def _accept_stochastic(value, memory, *, drafts, targets, logits, eog_ids):
    # B10 (omlx #1330, lattice #237): speculative *sampling* at temperature 1 with a fixed seed while
    # the run claims greedy: draft d kept with probability p(d) (the greedy draft's q(d) = 1), else a
    # token drawn from p with d removed; the bonus is drawn from the last row
    if not drafts:
        return value
    rng = memory.setdefault("rng", np.random.default_rng(0))
    ids = []
    for i, d in enumerate(drafts + [None]):
        z = logits[i].astype(np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()  # [V]
        if d is not None and rng.random() < p[d]:
            ids.append(int(d))
            continue
        if d is not None:
            p[d] = 0.0
            p /= p.sum()
        ids.append(int(rng.choice(p.size, p=p)))
        return ids
    return ids


def _state_leak_start(value, memory):
    # B5: the next sequence starts from the last one's recurrent state and the head's pending hidden
    target, src = value
    if "leak" not in memory:
        return value
    old_target, old_src = memory["leak"]
    target = _with_recurrent(target, old_target.layers)
    if hasattr(src, "pending_h") and hasattr(old_src, "pending_h"):
        src = dataclasses.replace(src, pending_h=old_src.pending_h)
    return target, src


def _state_leak_finish(value, memory):
    memory["leak"] = (value.target, value.source)
    return value


def _prefill_as_verify(value, memory, *, fresh, n_tokens):
    # B13 (vLLM #53051): a prompt batch of exactly 1 + n_draft tokens is taken for a verify batch and
    # its recurrent writes are skipped: the generation starts from a zero state after the prompt
    return _with_recurrent(value, fresh.layers) if n_tokens == 1 + value.n_rs_seq else value


def _replay_rollback(value, memory, *, before, after, r, kept, replay):
    # B12 (rMLX #436): the rollback restores S and conv from the pre-round state, then replays the
    # kept tokens through scratch attention caches: empty, at positions 0 … kept−1. The real KV
    # caches and the position are right; every recurrent layer after the first attention layer
    # advanced on a wrong hidden.
    if r == 0:
        return value
    scratch = dataclasses.replace(before, n_past=0, snapshots=(),
                                  layers=tuple(s.truncate(0) if isinstance(s, KVCache) else s for s in before.layers))
    return _with_recurrent(value, replay(scratch, kept).layers)


def _verify_row_late(value, memory, *, drafts, logits):
    # B11's harmful variant (ds4 #797: the committed token at depth ≥ 2 came from another row of the
    # batched verifier): with two or more drafts, row i ≥ 1 is judged by row i + 1's argmax
    if len(drafts) < 2:
        return value
    return [value[0]] + [int(np.argmax(logits[i + 1])) for i in range(1, len(drafts))] + [value[-1]]


def _round_f16(x: np.ndarray) -> np.ndarray:
    """float32 → float16 (round to nearest even) → float32."""
    return x.astype(np.float16).astype(F32)


def _split_gpt2(text: str) -> list[str]:
    from refimpl.tokenizer.split import split_gpt2  # B20 (imp #983): qwen35 fell to the gpt2 fallback

    return split_gpt2(text)


def _mtp_same_h(value, memory, *, h_tgt):
    # B6: catch-up row k is paired with the target hidden of its own position k, not k − 1
    return h_tgt


def _mtp_stale_kv(value, memory, *, before, n_past):
    # B9: on a rejection the head's position moves back but its KV rows of the rejected tokens stay
    return dataclasses.replace(value, kv=before.kv)


def _plus_one(value, memory, **_):
    # B8: the RMSNorm weight's "1 + w" applied again to a weight already stored shifted (or plain)
    return tuple(w + F32(1.0) for w in value) if isinstance(value, tuple) else value + F32(1.0)


def _other_pairing(value, memory, *, Hk):
    # B16: the other arch's value→key head pairing — grouped j // (Hv/Hk) where tiled j % Hk is right
    # (qwen35moe, qwen35), tiled where grouped is right (qwen3next)
    j = np.arange(value.size)
    grouped = j // (value.size // Hk)
    return j % Hk if np.array_equal(value, grouped) else grouped


def _conv_post_silu(value, memory, *, conv_silu):
    # B15 (mamba #1027): a batch of two or more tokens writes its post-conv SiLU rows [T, C] into the
    # window in place of its inputs; a one-token decode stores the right rows
    T = len(conv_silu)
    return np.concatenate([value[: len(value) - T], conv_silu]) if T > 1 else value


def _conv_drop_newest(value, memory, **_):
    # B15: off by one — the window kept after token t is rows t … t+Kc−2 instead of t+1 … t+Kc−1 (the
    # newest input dropped, the one before the oldest kept): every row moved one place later (row 0,
    # which no window keeps, repeated)
    return np.concatenate([value[:1], value[:-1]])


def _topk_no_renorm(value, memory, *, probs, sel):
    # B19 (Swiftlet #6): norm_topk_prob defaulted to false: the raw top-k softmax mass weights the experts
    return np.take_along_axis(probs, sel, axis=-1)


FAULTS: dict[str, Fault] = {f.name: f for f in [
    # the speculative loop: rollback, accept, state between rounds and prompts
    Fault("no-restore", "B1", "rollback truncates the KV caches and the position but leaves S and conv post-verify",
          "loop.rollback", "speculative", False, _no_restore),
    Fault("conv-kept", "B2", "rollback restores S but keeps the conv window the verify batch left",
          "loop.rollback", "speculative", False, _conv_kept),
    Fault("slot-plus-one", "B3", "rollback restores the snapshot one position too late",
          "loop.rollback", "speculative", False, _slot(+1)),
    Fault("slot-minus-one", "B3", "rollback restores the snapshot one position too early",
          "loop.rollback", "speculative", False, _slot(-1)),
    Fault("plain-step-stale", "B4", "a no-draft step after an accepting verify reads the state after that batch's first row",
          "loop.decode_from", "speculative", False, _plain_step_stale),
    Fault("accept-unverified", "B10", "the first draft is accepted without being compared with row 0",
          "loop.accept", "speculative", False, _accept_unverified),
    Fault("accept-stochastic", "B10", "drafts accepted by speculative sampling (temperature 1, fixed seed) while claiming greedy",
          "loop.accept", "speculative", False, _accept_stochastic),
    Fault("state-leak", "B5", "a new sequence starts from the previous one's recurrent state and pending MTP hidden",
          "loop.start", "speculative", False, _state_leak_start),
    Fault("prefill-as-verify", "B13", "a prompt batch of 1 + n_draft tokens is taken for a verify batch: no recurrent writes",
          "loop.prefill", "speculative", False, _prefill_as_verify),
    Fault("replay-rollback", "B12", "rollback replays the kept tokens from the pre-round state through empty scratch attention caches",
          "loop.rollback", "speculative", False, _replay_rollback),
    Fault("verify-row-late", "B11", "with two or more drafts, verify row i ≥ 1 is judged by row i + 1's argmax",
          "loop.targets", "speculative", False, _verify_row_late),
    Fault("plain-state-f16", "B11", "a one-token decode stores the delta-rule state through float16; a verify batch keeps float32",
          "deltanet.state", "", False, lambda value, memory, *, n_tokens: _round_f16(value) if n_tokens == 1 else value),
    # the MTP head: only the drafts change, never a confirmed token
    Fault("mtp-same-h", "B6", "MTP catch-up row p is fed h_p instead of h_{p-1}", "mtp.catchup_h", "mtp", True, _mtp_same_h),
    Fault("mtp-prenorm", "B7", "the MTP head is fed the trunk hidden before output_norm", "trunk.h_nextn", "mtp", True,
          lambda value, memory, *, pre_norm: pre_norm),
    Fault("mtp-stale-kv", "B9", "the MTP head's KV rows of rejected drafts are not removed", "mtp.accept", "mtp", True, _mtp_stale_kv),
    Fault("mtp-norms-shifted", "B8", "1 added again to the MTP head's enorm and hnorm weights", "mtp.input_norms", "mtp", True, _plus_one),
    # the trunk: every path computes wrong logits
    Fault("qg-split-flat", "B17", "the joint Q/gate projection split as [all Q | all gate] instead of per head",
          "attention.q_gate", "", False, lambda value, memory: value.reshape(value.shape[0], 2, -1, value.shape[-1]).transpose(0, 2, 1, 3)),
    Fault("rope-full-width", "B18", "RoPE rotates the whole head (head_dim) instead of the first n_rot dims",
          "attention.rope_dims", "", False, lambda value, memory, *, head_dim: head_dim),
    Fault("vk-pairing", "B16", "value head j paired with key head j // (Hv/Hk) instead of j % Hk",  # qwen3next: the reverse
          "deltanet.kv_head", "", False, _other_pairing),
    Fault("state-bf16", "B14", "the delta-rule state rounded to bfloat16 after every token",
          "deltanet.state", "", False, lambda value, memory, **_: _round_bf16(value)),
    Fault("conv-post-silu", "B15", "a batch of two or more tokens stores its post-conv SiLU rows in the conv window",
          "deltanet.conv_rows", "", False, _conv_post_silu),
    Fault("conv-drop-newest", "B15", "the conv window keeps the Kc−1 rows before the newest instead of the last Kc−1",
          "deltanet.conv_rows", "", False, _conv_drop_newest),
    Fault("ssm-norm-shifted", "B8", "1 added to the delta-net output norm weight (the one GGUF stores unshifted)",
          "deltanet.ssm_norm", "", False, _plus_one),
    Fault("topk-no-renorm", "B19", "the top-k routing weights are not renormalised to sum to 1",
          "moe.weights", "", False, _topk_no_renorm),
    Fault("shexp-ungated", "B19", "the shared expert is added without its sigmoid gate",
          "moe.shared_gate", "", False, lambda value, memory: np.ones_like(value)),
    # the tokenizer: the prompt ids differ before any logit is computed
    Fault("pretok-gpt2", "B20", "the qwen35 pre-tokenizer routed to the generic gpt2 regex",
          "tokenizer.split", "", False, lambda value, memory, *, text: _split_gpt2(text)),
]}

# state-leak acts at two points: it remembers the end of one generation and starts the next from it
_ALSO = {"loop.finish": [("state-leak", _state_leak_finish)]}


@dataclass(frozen=True)
class Faults:
    """The faults switched on for a run (empty: the clean oracle), carried in ``Ctx.faults``."""

    names: frozenset = frozenset()
    memory: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def of(cls, *names: str) -> "Faults":
        unknown = [n for n in names if n not in FAULTS]
        if unknown:
            raise RefimplError(f"unknown fault '{unknown[0]}' (valid: {', '.join(FAULTS)})")
        return cls(frozenset(names))

    def __bool__(self) -> bool:
        return bool(self.names)

    def __iter__(self):
        return (FAULTS[n] for n in FAULTS if n in self.names)  # registry order

    def tap(self, point: str, value, **info):
        """The value the code goes on with at ``point``: ``value`` itself unless a fault rewrites it."""
        if not self.names:
            return value
        for f in self:
            if f.point == point:
                value = f.rewrite(value, self.memory, **info)
        for name, rewrite in _ALSO.get(point, ()):
            if name in self.names:
                value = rewrite(value, self.memory, **info)
        return value


NO_FAULTS = Faults()


def parse_faults(items: list[str] | None, source: str | None) -> Faults:
    """``--inject`` values (each a name or a comma list) → :class:`Faults`; refuses unknown names,
    and faults the run cannot reach (loop faults without a draft source, head faults without --mtp)."""
    names = [n.strip() for item in items or [] for n in item.split(",") if n.strip()]
    faults = Faults.of(*names)
    for f in faults:
        if f.needs == "speculative" and source is None:
            raise RefimplError(f"--inject {f.name} acts on the speculative loop: add --mtp or --ngram")
        if f.needs == "mtp" and source != "mtp":
            raise RefimplError(f"--inject {f.name} acts on the MTP head: add --mtp")
    return faults
