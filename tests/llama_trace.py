"""llama.cpp's intermediates, captured with the eval callback — the layer-by-layer ground truth.

``llama_trace(model_path, tokens, names)`` runs llama.cpp (llama-cpp-python 0.3.36) in a
subprocess, decoding the tokens **one per decode call** with an F32 K/V cache and flash attention
off (the conformance setting), and returns ``{name: array [T, …]}``: for every requested graph
tensor name (``"attn_norm-0"``, ``"linear_attn_out-0"``, ``"result_norm"`` …, i.e. llama.cpp's
``cb(cur, name, il)`` name with ``-il`` appended) the values at each position, plus ``"logits"``.

How: ``llama_context_params.cb_eval`` is a ``bool (*)(struct ggml_tensor *, bool ask, void *)``.
llama.cpp first calls it with ask = true (return true to observe that tensor), then again with
ask = false once the tensor is computed. The CPU backend's tensor data is host memory, read here
through a ctypes mirror of ``struct ggml_tensor`` (ggml/include/ggml.h) using its ne/nb strides.

Run as a script it is the worker: ``python tests/llama_trace.py MODEL OUT.npz TOKENS NAMES``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def llama_trace(model_path, tokens, names, *, n_threads: int = 2, timeout: float = 600) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.npz"
        cmd = [sys.executable, __file__, str(model_path), str(out), ",".join(map(str, tokens)), ",".join(names), str(n_threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"llama.cpp trace worker failed (exit {proc.returncode}):\n{tail}")
        with np.load(out) as z:
            return {k: z[k] for k in z.files}


def _worker(model_path: str, out_path: str, tokens: list[int], names: set[str], n_threads: int) -> None:
    import ctypes

    import llama_cpp as ll

    GGML_TYPE_F32 = 0

    class ggml_tensor(ctypes.Structure):
        _fields_ = [
            ("type", ctypes.c_int),
            ("buffer", ctypes.c_void_p),
            ("ne", ctypes.c_int64 * 4),
            ("nb", ctypes.c_size_t * 4),
            ("op", ctypes.c_int),
            ("op_params", ctypes.c_int32 * 16),
            ("flags", ctypes.c_int32),
            ("src", ctypes.c_void_p * 10),
            ("view_src", ctypes.c_void_p),
            ("view_offs", ctypes.c_size_t),
            ("data", ctypes.c_void_p),
            ("name", ctypes.c_char * 64),
            ("extra", ctypes.c_void_p),
            ("padding", ctypes.c_char * 8),
        ]

    step: dict[str, np.ndarray] = {}

    def on_eval(t_ptr, ask, _user):
        t = ctypes.cast(t_ptr, ctypes.POINTER(ggml_tensor)).contents
        name = t.name.decode(errors="replace")
        if ask:
            return name in names
        if t.type != GGML_TYPE_F32 or not t.data:
            return True
        ne = [int(n) for n in t.ne]
        nb = [int(b) for b in t.nb]
        span = sum((n - 1) * b for n, b in zip(ne, nb)) + 4
        buf = (ctypes.c_char * span).from_address(t.data)
        arr = np.lib.stride_tricks.as_strided(
            np.frombuffer(buf, dtype=np.float32), shape=tuple(reversed(ne)), strides=tuple(reversed(nb))
        )
        step[name] = np.array(arr).reshape(-1)
        return True

    callback = ll.ggml_backend_sched_eval_callback(on_eval)
    ll.llama_backend_init()
    mparams = ll.llama_model_default_params()
    model = ll.llama_model_load_from_file(model_path.encode(), mparams)
    if not model:
        raise SystemExit(f"llama.cpp could not load {model_path}")
    cparams = ll.llama_context_default_params()
    cparams.n_ctx = max(64, len(tokens) + 8)
    cparams.n_batch = cparams.n_ubatch = 8
    cparams.n_threads = cparams.n_threads_batch = n_threads
    cparams.type_k = cparams.type_v = GGML_TYPE_F32
    cparams.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
    cparams.cb_eval = callback
    cparams.cb_eval_user_data = None
    ctx = ll.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))

    per_name: dict[str, list[np.ndarray]] = {n: [] for n in names}
    logits = []
    batch = ll.llama_batch_init(1, 0, 1)
    for pos, tok in enumerate(tokens):
        step.clear()
        batch.n_tokens = 1
        batch.token[0] = tok
        batch.pos[0] = pos
        batch.n_seq_id[0] = 1
        batch.seq_id[0][0] = 0
        batch.logits[0] = True
        if ll.llama_decode(ctx, batch) != 0:
            raise SystemExit(f"llama_decode failed at position {pos}")
        logits.append(np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, 0), shape=(n_vocab,)).copy())
        for n in names:
            if n in step:
                per_name[n].append(step[n])
    ll.llama_batch_free(batch)
    result = {n: np.stack(v) for n, v in per_name.items() if len(v) == len(tokens)}
    result["logits"] = np.stack(logits)
    np.savez(out_path, **result)
    ll.llama_free(ctx)
    ll.llama_model_free(model)


if __name__ == "__main__":
    _model, _out, _tokens, _names, _threads = sys.argv[1:6]
    _worker(_model, _out, [int(t) for t in _tokens.split(",")], set(filter(None, _names.split(","))), int(_threads))
