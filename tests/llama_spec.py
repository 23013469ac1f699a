"""The self-speculative MTP loop driven through llama.cpp (llama-cpp-python 0.3.36), in a subprocess.

The same rounds as :mod:`refimpl.decode.speculative`, with llama.cpp doing every decode, set up and sequenced
as ``examples/speculative-simple/speculative-simple.cpp`` and ``common/speculative.cpp``
(``common_speculative_impl_draft_mtp``) do:

* target context: ``n_rs_seq = n_draft`` (``need_n_rs_seq``), ``llama_set_embeddings_nextn(ctx, true,
  masked=false)`` so every batch row's h_nextn can be read; F32 K/V, flash attention off (as
  tests/llama_ref.py), or with ``defaults=True`` llama.cpp's own choice (F16 K/V, flash attention auto);
* MTP context: ``ctx_type = LLAMA_CONTEXT_TYPE_MTP``, ``ctx_other`` = target, ``n_rs_seq = 0``,
  masked nextn embeddings; rows carry (token, position, h) via ``llama_batch_ext_set_embd_token``;
* prompt: all but the last token in one target batch (no logits), then the MTP catch-up on it (h
  shifted right by one, zeros first);
* each round: draft with the MTP context — step 0 (id_last, P, pending_h), step i (d_i, P+i, the
  head's own h_nextn) — argmax, stop below ``p_min`` (softmax over the top-10 logits) or at the
  budget min(n_draft, n_predict − generated − 1); ``llama_memory_seq_rm(mtp, P, −1)``; one target
  batch [id_last, d_1 … d_n] with logits on every row; MTP catch-up on all n+1 rows; greedy
  acceptance as ``common_sampler_sample_and_accept_n``; pending_h ← h row n_acc;
  ``llama_memory_seq_rm(·, P + n_acc + 1, −1)`` on both contexts (the target's must succeed: that is
  the recurrent-state rollback).

An arch without partial recurrent rollback (``llm_arch_supports_rs_rollback`` false: qwen3next; the
target's ``n_rs_seq`` is clamped to 0) gets the same rounds with the rollback done by llama.cpp's own
state API instead: the recurrent state is saved before each verify batch
(``llama_state_seq_get_data_ext(…, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)``, what
``common_prompt_checkpoint::update_tgt`` does) and, after a rejection, restored, the verify batch's KV
cells dropped, and ``[id_last, d_1 … d_n_acc]`` decoded again (``rollback = "checkpoint"``,
``n_redecodes`` counts those decodes). The schedule — which positions are drafted — is the one of an
engine that can roll back; llama.cpp's own speculative-simple / server replay the accepted tokens as the
next round's "draft" instead (docs/speculative.md, "Archs without partial rollback").

The draft and accept decisions (argmax, top-10 probability) are taken here in Python from llama.cpp's
logits; every forward pass, the KV caches, the snapshots and the rollback are llama.cpp's.
API: :func:`llama_speculative` → :class:`LlamaSpecRun`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llama_ref import _context_params, _float_row, run_child


@dataclass(frozen=True)
class LlamaSpecRun:
    tokens: list[int]  # generated tokens
    n_drafted: int
    n_accepted: int
    n_decodes: int  # target decodes after the prompt
    n_drafted_steps: int
    rounds: list[dict]  # per round: pos0, drafts, targets, ids
    log: str
    rollback: str = "rs"  # "rs": n_rs_seq snapshots (seq_rm); "checkpoint": state save / restore + re-decode
    n_redecodes: int = 0  # "checkpoint": target decodes that re-advanced the state over accepted tokens


def llama_speculative(model_path, prompt, n_predict: int, *, n_draft: int = 3, p_min: float = 0.0,
                      n_threads: int = 2, timeout: float = 600, defaults: bool = False) -> LlamaSpecRun:
    """``defaults``: both contexts keep ``llama_context_default_params()``'s K/V cache type (F16) and
    flash-attention setting (auto: on for the CPU) instead of F32 K/V without flash attention — the
    numerics an engine user gets without flags."""
    request = {
        "model": str(Path(model_path).resolve()), "prompt": [int(t) for t in prompt], "n_predict": int(n_predict),
        "n_draft": int(n_draft), "p_min": float(p_min), "n_threads": int(n_threads), "defaults": bool(defaults),
        "n_ctx": max(256, len(prompt) + n_predict + n_draft + 8),
    }
    result, log = run_child(__file__, request, "result.json", "llama.cpp speculative loop", timeout,
                            lambda out: json.loads(out.read_text()))
    return LlamaSpecRun(**result, log=log)


# --------------------------------------------------------------------------------------------------
# The child process: only this part imports llama_cpp.


def _top_k_p(logits: np.ndarray, k: int = 10) -> float:
    top = np.sort(logits.astype(np.float32))[-k:]
    return float(np.float32(1.0) / np.sum(np.exp(top - top[-1]), dtype=np.float32))


def _child(request_path: str, out_path: str) -> int:  # noqa: C901 - one straight-line driver
    import ctypes

    import llama_cpp as L

    r = json.loads(Path(request_path).read_text())
    lib = L.llama_cpp._lib  # src/llama-ext.h: C++ names, not wrapped by the bindings
    set_embeddings_nextn = getattr(lib, "_Z26llama_set_embeddings_nextnP13llama_contextbb")
    set_embeddings_nextn.argtypes, set_embeddings_nextn.restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
    get_nextn_ith = getattr(lib, "_Z30llama_get_embeddings_nextn_ithP13llama_contexti")
    get_nextn_ith.argtypes, get_nextn_ith.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)

    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    mparams.load_mtp = True
    model = L.llama_model_load_from_file(r["model"].encode(), mparams)
    assert model, "llama_model_load_from_file returned NULL"
    assert L.llama_model_n_layer_nextn(model) == 1, "the model has no nextn block"
    vocab = L.llama_model_get_vocab(model)
    n_vocab, n_embd = L.llama_vocab_n_tokens(vocab), L.llama_model_n_embd(model)
    n_draft, n_batch = r["n_draft"], max(16, len(r["prompt"]))

    cp = _context_params(L, r)  # r["defaults"]: llama.cpp's own K/V type and flash-attention choice
    cp.n_batch = cp.n_ubatch = n_batch  # split_equal needs n_ubatch > n_rs_seq + 1
    cp.n_rs_seq = n_draft
    ctx = L.llama_init_from_model(model, cp)
    assert ctx and L.llama_n_rs_seq(ctx) in (n_draft, 0), "target context (n_rs_seq) not created"
    rollback = "rs" if L.llama_n_rs_seq(ctx) == n_draft else "checkpoint"  # 0: llm_arch_supports_rs_rollback is false
    set_embeddings_nextn(ctx, True, False)
    cp_mtp = _context_params(L, r, ctx_type=L.LLAMA_CONTEXT_TYPE_MTP, ctx_other=ctx)
    cp_mtp.n_batch = cp_mtp.n_ubatch = n_batch
    ctx_mtp = L.llama_init_from_model(model, cp_mtp)
    assert ctx_mtp, "MTP context not created"
    set_embeddings_nextn(ctx_mtp, True, True)
    mem, mem_mtp = L.llama_get_memory(ctx), L.llama_get_memory(ctx_mtp)
    batch = L.llama_batch_init(n_batch, 0, 1)
    batch_mtp = L.llama_batch_ext_init(ctx_mtp)

    def decode_target(tokens, pos0, logits: bool) -> tuple[np.ndarray, np.ndarray]:
        """(logits [T, V] or None, h_nextn [T, E]) of one target batch."""
        batch.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = t, pos0 + i, 1, 0
            batch.logits[i] = int(logits)
        rc = L.llama_decode(ctx, batch)
        assert rc == 0, f"llama_decode returned {rc} at position {pos0}"
        lg = np.stack([_float_row(L.llama_get_logits_ith(ctx, i), n_vocab) for i in range(len(tokens))]) if logits else None
        return lg, np.stack([_float_row(get_nextn_ith(ctx, i), n_embd) for i in range(len(tokens))])

    partial = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY

    def save_recurrent() -> bytes:
        """common_prompt_checkpoint::update_tgt: the target's recurrent state of sequence 0."""
        n = L.llama_state_seq_get_size_ext(ctx, 0, partial)
        buf = (ctypes.c_uint8 * n)()
        assert L.llama_state_seq_get_data_ext(ctx, buf, n, 0, partial) == n, "checkpoint size mismatch"
        return buf

    def restore_recurrent(buf) -> None:
        assert L.llama_state_seq_set_data_ext(ctx, buf, len(buf), 0, partial) == len(buf), "checkpoint restore failed"

    def decode_mtp(tokens, pos0, hs, output: bool):
        """One MTP batch of rows (tokens[i], pos0+i, hs[i]); (logits, h') of the last row if output."""
        L.llama_batch_ext_clear(batch_mtp)
        keep = [np.ascontiguousarray(h, dtype=np.float32) for h in hs]
        for i, (t, h) in enumerate(zip(tokens, keep)):
            idx = L.llama_batch_ext_add_token(batch_mtp, 0, int(t))
            pos4 = (L.llama_pos * 4)(pos0 + i, 0, 0, 0)
            embd = L.llama_embd(h.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, n_embd)
            ok = idx >= 0 and L.llama_batch_ext_set_pos(batch_mtp, idx, pos4) and \
                L.llama_batch_ext_set_embd_token(batch_mtp, idx, embd) and \
                L.llama_batch_ext_set_output_logits(batch_mtp, idx, output and i == len(tokens) - 1)
            assert ok, f"cannot build the MTP batch at position {pos0 + i}"
        rc = L.llama_process(ctx_mtp, L.LLAMA_PROCESS_TYPE_DECODE, batch_mtp)
        assert rc == 0, f"llama_process (MTP) returned {rc} at position {pos0}"
        if output:
            return _float_row(L.llama_get_logits_ith(ctx_mtp, len(tokens) - 1), n_vocab), _float_row(get_nextn_ith(ctx_mtp, len(tokens) - 1), n_embd)
        return None

    prompt, n_predict = list(r["prompt"]), r["n_predict"]
    pending_h = np.zeros(n_embd, dtype=np.float32)
    if len(prompt) > 1:  # prompt minus its last token, then the head's catch-up on it
        _, h = decode_target(prompt[:-1], 0, logits=False)
        decode_mtp(prompt[:-1], 0, [pending_h, *h[:-1]], output=False)
        pending_h = h[-1]
    id_last, P = prompt[-1], len(prompt) - 1
    out, rounds = [], []
    stats = dict(n_drafted=0, n_accepted=0, n_decodes=0, n_drafted_steps=0, n_redecodes=0)
    while len(out) < n_predict:
        n_max = min(n_draft, n_predict - len(out) - 1)
        drafts, tok, h = [], id_last, pending_h
        while len(drafts) < n_max:
            logits, h = decode_mtp([tok], P + len(drafts), [h], output=True)
            tok = int(np.argmax(logits))
            if _top_k_p(logits) < r["p_min"]:
                break
            drafts.append(tok)
        assert L.llama_memory_seq_rm(mem_mtp, 0, P, -1), "MTP draft-region removal failed"
        ckpt = save_recurrent() if rollback == "checkpoint" and drafts else None
        logits, h_tgt = decode_target([id_last, *drafts], P, logits=True)
        decode_mtp([id_last, *drafts], P, [pending_h, *h_tgt[:-1]], output=False)
        targets = [int(np.argmax(l)) for l in logits]
        ids = []
        for i, d in enumerate(drafts):
            ids.append(targets[i])
            if targets[i] != d or (L.llama_vocab_is_eog(vocab, targets[i]) and i + 1 < len(drafts)):
                break
        else:
            ids.append(targets[len(drafts)])
        n_acc = len(ids) - 1
        pending_h = h_tgt[min(n_acc, len(drafts))]
        n_past = P + n_acc + 1
        if n_acc < len(drafts) and rollback == "checkpoint":  # restore, drop the batch's KV cells, re-decode
            restore_recurrent(ckpt)
            assert L.llama_memory_seq_rm(mem, 0, P, -1), "target KV removal refused"
            decode_target([id_last, *drafts[:n_acc]], P, logits=False)
            stats["n_redecodes"] += 1
            assert L.llama_memory_seq_rm(mem_mtp, 0, n_past, -1), "MTP seq_rm refused"
        elif n_acc < len(drafts):
            assert L.llama_memory_seq_rm(mem, 0, n_past, -1), "target rollback (seq_rm) refused"
            assert L.llama_memory_seq_rm(mem_mtp, 0, n_past, -1), "MTP seq_rm refused"
        rounds.append(dict(pos0=P, drafts=drafts, targets=targets, ids=ids))
        stats["n_decodes"] += 1
        stats["n_drafted"] += len(drafts)
        stats["n_accepted"] += n_acc
        stats["n_drafted_steps"] += bool(drafts)
        P, id_last = n_past, ids[-1]
        for t in ids:
            out.append(t)
            if L.llama_vocab_is_eog(vocab, t) or len(out) == n_predict:
                break
        if L.llama_vocab_is_eog(vocab, out[-1]):
            break

    L.llama_batch_free(batch)
    L.llama_batch_ext_free(batch_mtp)
    L.llama_free(ctx_mtp)
    L.llama_free(ctx)
    L.llama_model_free(model)
    Path(out_path).write_text(json.dumps(dict(tokens=out, rounds=rounds, rollback=rollback, **stats)))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))
