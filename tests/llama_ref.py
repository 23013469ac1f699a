"""Run llama.cpp (llama-cpp-python 0.3.36, the ground truth) on a GGUF in a subprocess.

llama.cpp aborts the whole process on a malformed file (``GGML_ASSERT``), so every run happens in a
fresh ``python tests/llama_ref.py`` child: the parent writes a JSON request, the child writes an
``.npz`` answer, and a failure becomes :class:`LlamaRefError` carrying the tail of llama.cpp's log.

Decoding settings (chosen so the oracle is as plain as llama.cpp allows):

* one token per ``llama_decode`` call (single-row ubatches: the decode path, not prompt batching),
  positions 0, 1, 2, … in sequence 0, logits requested for every token;
* K/V cache F32 (``type_k = type_v = GGML_TYPE_F32``) and flash attention off
  (``LLAMA_FLASH_ATTN_TYPE_DISABLED``), so the only roundings are llama.cpp's matmul ones (docs/numerics.md);
  with ``defaults=True`` instead llama.cpp's own choice, ``llama_context_default_params()``'s F16 K/V
  cache and flash attention auto (on for the CPU): what an engine user gets without flags;
* ``n_threads`` threads for both decode and batch (results do not depend on it: threads split rows, docs/numerics.md);
* optional ``load_mtp``: load the nextn block's tensors as well (``llama_model_params.load_mtp``),
  which proves llama.cpp accepts them; the trunk logits do not change.
* optional ``mtp``: also run the MTP head the way ``common/speculative.cpp`` (draft-mtp) catches up
  on accepted tokens: the target context runs with ``llama_set_embeddings_nextn(ctx, true,
  masked=false)``; a second context (``ctx_type = LLAMA_CONTEXT_TYPE_MTP``, ``ctx_other`` = target)
  gets, for every position p, token x_p with the target's ``h_nextn`` of position p−1 (zeros at
  p = 0) attached via ``llama_batch_ext_set_embd_token`` (what ``common_batch`` uses; the
  ``…_set_embd_state`` entry point is an unimplemented stub in this llama.cpp) and is decoded with
  ``llama_process``. MTP row p drafts the same token as target row p, x_{p+1} (``common_speculative_impl_draft_mtp``).
* optional ``trace`` / ``mtp_trace``: llama.cpp's named intermediates of the target / MTP context at
  every position (tests/llama_trace.py's eval callback, same names, ``NAME.src1`` included).

API: :func:`llama_logits` (logits of given tokens), :func:`llama_greedy` (greedy continuation),
:func:`llama_run` (both, optionally the MTP head, plus llama.cpp's log), :func:`quantize_with_llama`
(a file made by llama.cpp's own quantizer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from arm64 import ARM_SLOWDOWN, command_for

LOG_TAIL_LINES = 25


class LlamaRefError(RuntimeError):
    """llama.cpp failed to load or run a model; the message ends with the tail of its log."""


@dataclass(frozen=True)
class LlamaRun:
    """Result of one subprocess run.

    tokens: np (T,) int32, the prompt followed by any greedily generated tokens;
    logits: np (T, V) float32, row t = logits after decoding tokens[0..t] (predicts token t+1);
    log:    everything llama.cpp printed (model loading, context setup), for diagnostics.
    """

    tokens: np.ndarray
    logits: np.ndarray
    log: str
    hidden: np.ndarray | None = None  # (T, E): target h_nextn (post output_norm) after each token
    mtp_logits: np.ndarray | None = None  # (T, V): MTP head on (tokens[t], hidden[t-1]), zeros h at t=0
    mtp_hidden: np.ndarray | None = None  # (T, E): the MTP block's own h_nextn (post shared_head_norm)
    trace: dict | None = None  # name -> (T, n): the target context's intermediates (``trace=`` names)
    mtp_trace: dict | None = None  # name -> (T, n): the MTP context's (``mtp_trace=`` names)


def llama_run(model_path, tokens, *, n_generate: int = 0, load_mtp: bool = False, mtp: bool = False,
              n_threads: int = 2, n_ctx: int | None = None, timeout: float = 600, defaults: bool = False,
              trace=(), mtp_trace=()) -> LlamaRun:
    """Decode ``tokens`` one at a time, then greedily generate ``n_generate`` more (argmax of the
    last row, ties to the lowest id), decoding each generated token too. ``mtp=True`` (implies
    ``load_mtp``) also returns the target hiddens and the MTP head's logits and hiddens; ``trace`` /
    ``mtp_trace`` name intermediates to capture in the target / MTP context."""
    tokens = [int(t) for t in tokens]
    if not tokens:
        raise ValueError("llama_run needs at least one token")
    n_total = len(tokens) + n_generate
    request = {
        "model": str(Path(model_path).resolve()),
        "tokens": tokens,
        "n_generate": int(n_generate),
        "load_mtp": bool(load_mtp or mtp),
        "mtp": bool(mtp),
        "n_threads": int(n_threads),
        "n_ctx": int(n_ctx or max(256, n_total)),
        "defaults": bool(defaults),
        "trace": list(trace),
        "mtp_trace": list(mtp_trace),
    }
    def read(out: Path) -> dict:
        with np.load(out) as z:
            return {k: z[k] for k in z.files}

    arrays, log = run_child(__file__, request, "result.npz", "llama.cpp", timeout, read)
    extra = {k: arrays[k] for k in ("hidden", "mtp_logits", "mtp_hidden") if k in arrays}
    for which in ("trace", "mtp_trace"):
        if request[which]:
            extra[which] = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith(which + ":")}
    return LlamaRun(tokens=arrays["tokens"], logits=arrays["logits"], log=log, **extra)


def run_child(script: str, request: dict, out_name: str, what: str, timeout: float, read):
    """Run ``python script request.json OUT`` in a temporary directory and return
    ``(read(OUT), log)``; a non-zero exit or a missing OUT raises :class:`LlamaRefError` with the
    tail of the child's log (shared with tests/llama_spec.py)."""
    with tempfile.TemporaryDirectory(prefix="llama_ref-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / out_name
        req.write_text(json.dumps(request))
        python, env = command_for(os.environ.get("LLAMA_CPP_LIB_PATH"))  # an ARM build: qemu's aarch64 Python
        proc = subprocess.run([*python, script, str(req), str(out)], capture_output=True, text=True,
                              errors="replace", timeout=timeout * (ARM_SLOWDOWN if env else 1), env=env)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0 or not out.exists():
            tail = "\n".join(log.strip().splitlines()[-LOG_TAIL_LINES:])
            raise LlamaRefError(f"{what} failed on {request['model']} (exit code {proc.returncode}):\n{tail}")
        return read(out), log


def llama_logits(model_path, tokens, *, load_mtp: bool = False, n_threads: int = 2) -> np.ndarray:
    """np (T, V) float32: llama.cpp's logits after each of ``tokens``, decoded one per call."""
    return llama_run(model_path, tokens, load_mtp=load_mtp, n_threads=n_threads).logits


def llama_greedy(model_path, prompt, n_generate: int, *, load_mtp: bool = False, n_threads: int = 2,
                 defaults: bool = False) -> np.ndarray:
    """np (len(prompt) + n_generate,) int32: the prompt and llama.cpp's greedy continuation."""
    return llama_run(model_path, prompt, n_generate=n_generate, load_mtp=load_mtp, n_threads=n_threads,
                     defaults=defaults).tokens


def quantize_with_llama(src, dst, ftype: int, *, timeout: float = 600, allow_requantize: bool = False) -> Path:
    """``llama_model_quantize(src, dst, ftype)`` — llama.cpp's own quantizer (what ``llama-quantize``
    runs; ``ftype`` a ``LLAMA_FTYPE_MOSTLY_*`` value, e.g. 7 = Q8_0, 38 = MXFP4_MOE), in a child
    process (``allow_requantize``: ``llama-quantize --allow-requantize``, for a quantized ``src``). Returns
    ``dst``; a failure raises :class:`LlamaRefError` with llama.cpp's log tail."""
    script = ("import sys, llama_cpp as L\n"
              "p = L.llama_model_quantize_default_params(); p.ftype = int(sys.argv[3]); p.nthread = 2\n"
              "p.allow_requantize = sys.argv[4] == '1'\n"
              "sys.exit(L.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(src), str(dst), str(int(ftype)), str(int(allow_requantize))],
                          capture_output=True, text=True, errors="replace", timeout=timeout)
    if proc.returncode != 0 or not Path(dst).exists():
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-LOG_TAIL_LINES:])
        raise LlamaRefError(f"llama_model_quantize failed on {src} (exit code {proc.returncode}):\n{tail}")
    return Path(dst)


# --------------------------------------------------------------------------------------------------
# The child process: only this part imports llama_cpp.


def _float_row(ptr, n: int) -> np.ndarray:
    """A copy of the n floats llama.cpp returned at ``ptr`` (logits or an embedding row)."""
    import ctypes

    if not ptr:
        raise RuntimeError("llama.cpp returned a NULL row")
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n,)).copy()


def _context_params(L, r, *, ctx_type=0, ctx_other=None, capture=None):
    cparams = L.llama_context_default_params()
    cparams.n_ctx = r["n_ctx"]
    cparams.n_batch = cparams.n_ubatch = 8
    cparams.n_seq_max = 1
    cparams.n_threads = cparams.n_threads_batch = r["n_threads"]
    if not r.get("defaults"):  # else llama.cpp's own: F16 K/V, flash attention auto
        cparams.type_k = cparams.type_v = L.GGML_TYPE_F32
        cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cparams.no_perf = True
    cparams.ctx_type = ctx_type
    if ctx_other is not None:
        cparams.ctx_other = ctx_other
    if capture is not None:
        cparams.cb_eval = capture.callback
        cparams.cb_eval_user_data = None
    return cparams


def _child(request_path: str, out_path: str) -> int:
    import ctypes

    import llama_cpp as L
    from llama_trace import EvalCapture

    r = json.loads(Path(request_path).read_text())
    captures = {which: EvalCapture(r[which]) if r.get(which) else None for which in ("trace", "mtp_trace")}
    traced = {which: ({}, {}) for which in captures}  # per-position rows, per-ubatch arrays (unused here)
    # src/llama-ext.h is C++ without extern "C" and unwrapped by the bindings: use the mangled names.
    lib = L.llama_cpp._lib
    set_embeddings_nextn = getattr(lib, "_Z26llama_set_embeddings_nextnP13llama_contextbb")
    set_embeddings_nextn.argtypes = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]
    set_embeddings_nextn.restype = None
    get_embeddings_nextn_ith = getattr(lib, "_Z30llama_get_embeddings_nextn_ithP13llama_contexti")
    get_embeddings_nextn_ith.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    get_embeddings_nextn_ith.restype = ctypes.POINTER(ctypes.c_float)

    def fail(msg: str, code: int) -> int:
        print(f"llama_ref: {msg}", file=sys.stderr)
        return code

    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    mparams.load_mtp = r["load_mtp"]
    model = L.llama_model_load_from_file(r["model"].encode(), mparams)
    if not model:
        return fail("llama_model_load_from_file returned NULL", 3)
    ctx = L.llama_init_from_model(model, _context_params(L, r, capture=captures["trace"]))
    if not ctx:
        return fail("llama_init_from_model returned NULL", 3)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    n_embd = L.llama_model_n_embd(model)

    ctx_mtp = batch_mtp = None
    if r["mtp"]:
        if L.llama_model_n_layer_nextn(model) != 1:
            return fail("the model has no nextn block (nextn_predict_layers != 1)", 3)
        set_embeddings_nextn(ctx, True, False)  # one h row per batch token
        ctx_mtp = L.llama_init_from_model(model, _context_params(L, r, ctx_type=L.LLAMA_CONTEXT_TYPE_MTP, ctx_other=ctx,
                                                                 capture=captures["mtp_trace"]))
        if not ctx_mtp:
            return fail("llama_init_from_model (MTP context) returned NULL", 3)
        set_embeddings_nextn(ctx_mtp, True, True)
        batch_mtp = L.llama_batch_ext_init(ctx_mtp)

    tokens = list(r["tokens"])
    n_total = len(tokens) + r["n_generate"]
    out = {"logits": np.zeros((n_total, n_vocab), dtype=np.float32)}
    if r["mtp"]:
        out["hidden"] = np.zeros((n_total, n_embd), dtype=np.float32)
        out["mtp_logits"] = np.zeros((n_total, n_vocab), dtype=np.float32)
        out["mtp_hidden"] = np.zeros((n_total, n_embd), dtype=np.float32)
    h_prev = np.zeros(n_embd, dtype=np.float32)  # the drafter's pending_h starts as zeros
    batch = L.llama_batch_init(1, 0, 1)
    for pos in range(n_total):
        if pos >= len(tokens):
            tokens.append(int(np.argmax(out["logits"][pos - 1])))
        batch.n_tokens = 1
        batch.token[0] = tokens[pos]
        batch.pos[0] = pos
        batch.n_seq_id[0] = 1
        batch.seq_id[0][0] = 0
        batch.logits[0] = 1
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            return fail(f"llama_decode returned {rc} at position {pos}", 4)
        out["logits"][pos] = _float_row(L.llama_get_logits_ith(ctx, 0), n_vocab)
        if captures["trace"]:
            captures["trace"].collect(pos, [1], *traced["trace"])
        if not r["mtp"]:
            continue
        out["hidden"][pos] = _float_row(get_embeddings_nextn_ith(ctx, 0), n_embd)
        L.llama_batch_ext_clear(batch_mtp)
        idx = L.llama_batch_ext_add_token(batch_mtp, 0, tokens[pos])
        pos4 = (L.llama_pos * 4)(pos, 0, 0, 0)
        embd = L.llama_embd(h_prev.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, n_embd)
        if idx < 0 or not (L.llama_batch_ext_set_pos(batch_mtp, idx, pos4)
                           and L.llama_batch_ext_set_embd_token(batch_mtp, idx, embd)
                           and L.llama_batch_ext_set_output_logits(batch_mtp, idx, True)):
            return fail(f"cannot build the MTP batch at position {pos}", 4)
        rc = L.llama_process(ctx_mtp, L.LLAMA_PROCESS_TYPE_DECODE, batch_mtp)
        if rc != 0:
            return fail(f"llama_process (MTP) returned {rc} at position {pos}", 4)
        out["mtp_logits"][pos] = _float_row(L.llama_get_logits_ith(ctx_mtp, 0), n_vocab)
        out["mtp_hidden"][pos] = _float_row(get_embeddings_nextn_ith(ctx_mtp, 0), n_embd)
        if captures["mtp_trace"]:
            captures["mtp_trace"].collect(pos, [1], *traced["mtp_trace"])
        h_prev = out["hidden"][pos].copy()
    L.llama_batch_free(batch)
    if ctx_mtp:
        L.llama_batch_ext_free(batch_mtp)
        L.llama_free(ctx_mtp)
    L.llama_free(ctx)
    L.llama_model_free(model)
    for which, (rows, _) in traced.items():
        out.update({f"{which}:{name}": np.stack(v) for name, v in rows.items() if len(v) == n_total})
    np.savez(out_path, tokens=np.array(tokens, dtype=np.int32), **out)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1], sys.argv[2]))
