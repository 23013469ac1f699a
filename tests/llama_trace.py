"""llama.cpp's intermediates, captured with the eval callback — the layer-by-layer ground truth.

``llama_trace(model_path, tokens, names)`` runs llama.cpp (llama-cpp-python 0.3.36) in a
subprocess, decoding the tokens **one per decode call** with an F32 K/V cache and flash attention
off (the conformance setting), and returns ``{name: array [T, …]}``: for every requested graph
tensor name (``"attn_norm-0"``, ``"linear_attn_out-0"``, ``"result_norm"`` …, i.e. llama.cpp's
``cb(cur, name, il)`` name with ``-il`` appended) the values at each position, plus ``"logits"``.

Keyword options select other llama.cpp configurations (defaults = the conformance setting above):

* ``type_k`` / ``type_v``: ``"f32"`` or ``"f16"`` — the K/V cache types (llama.cpp's default: F16);
* ``flash_attn``: ``"off"``, ``"on"`` or ``"auto"`` (``llama_context_params.flash_attn_type``;
  llama.cpp's default ``auto`` resolves to on for the CPU backend);
* ``n_batch``: tokens per ``llama_decode`` call (1: the decode path; more: a batched prompt or
  verify, split by llama.cpp into ubatches of ``n_ubatch`` tokens). A captured tensor of a ubatch
  of U tokens is split into U rows, so the result keeps one row per position; with ``n_batch`` > 1
  each ubatch's array is also returned whole as ``"NAME@P"`` (P = the ubatch's first position), for
  tensors that are not per token (``state_predelta-0``, the recurrent state at the ubatch's start);
* ``prompt_batch``: when > 0, the first ``llama_decode`` call takes this many tokens (a prompt), the rest go in
  calls of ``n_batch``;
* ``repack``: ``llama_model_params.use_extra_bufts`` (llama.cpp's default True: the CPU_REPACK and,
  on AMX machines, AMX weight layouts).

How: ``llama_context_params.cb_eval`` is a ``bool (*)(struct ggml_tensor *, bool ask, void *)``.
llama.cpp first calls it with ask = true (return true to observe that tensor), then again with
ask = false once the tensor is computed. The CPU backend's tensor data is host memory, read here
through a ctypes mirror of ``struct ggml_tensor`` (ggml/include/ggml.h) using its ne/nb strides.
A name ``"NAME.src1"`` captures the second operand of tensor NAME when NAME is computed — the input
of a matmul llama.cpp left unnamed (``mtp_attn_out-4.src1``, the MTP block's gated attention).
:class:`EvalCapture` is that callback; tests/llama_ref.py uses it on its MTP context too.

Which library: llama-cpp-python loads ``libllama`` (and through its run path ``libggml*``) from
``$LLAMA_CPP_LIB_PATH`` when set, else from the package's ``lib/``; tests/ggml_lib.py follows the
same variable. Pointing it at another build of the same source (e.g. one for AVX2 only,
docs/numerics.md "Which CPU paths were exercised") runs every conformance test against that build.

Run as a script it is the worker: ``python tests/llama_trace.py MODEL OUT.npz TOKENS NAMES``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

KV_TYPES = {"f32": 0, "f16": 1}  # GGML_TYPE_F32, GGML_TYPE_F16
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # LLAMA_FLASH_ATTN_TYPE_AUTO / _DISABLED / _ENABLED
DEFAULT_OPTIONS = {"type_k": "f32", "type_v": "f32", "flash_attn": "off", "n_batch": 1, "n_ubatch": 8, "repack": True,
                   "prompt_batch": 0}


def llama_trace(model_path, tokens, names, *, n_threads: int = 2, timeout: float = 600, type_k: str = "f32",
                type_v: str = "f32", flash_attn: str = "off", n_batch: int = 1, n_ubatch: int = 8,
                repack: bool = True, prompt_batch: int = 0) -> dict[str, np.ndarray]:
    if type_k not in KV_TYPES or type_v not in KV_TYPES:
        raise ValueError(f"llama_trace: type_k/type_v must be one of {sorted(KV_TYPES)}")
    if flash_attn not in FLASH_ATTN:
        raise ValueError(f"llama_trace: flash_attn must be one of {sorted(FLASH_ATTN)}")
    if n_batch < 1 or n_ubatch < 1:
        raise ValueError("llama_trace: n_batch and n_ubatch must be >= 1")
    options = {"type_k": type_k, "type_v": type_v, "flash_attn": flash_attn, "n_batch": int(n_batch),
               "n_ubatch": int(n_ubatch), "repack": bool(repack), "prompt_batch": int(prompt_batch)}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.npz"
        cmd = [sys.executable, __file__, str(model_path), str(out), ",".join(map(str, tokens)), ",".join(names), str(n_threads),
               json.dumps(options)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"llama.cpp trace worker failed (exit {proc.returncode}):\n{tail}")
        with np.load(out) as z:
            return {k: z[k] for k in z.files}


def _ubatch_sizes(n_tokens: int, n_ubatch: int) -> list[int]:
    """How llama.cpp splits one decode call of a single sequence: ubatches of n_ubatch tokens, then the rest."""
    return [min(n_ubatch, n_tokens - i) for i in range(0, n_tokens, n_ubatch)]


def _ggml_tensor_struct():
    """A ctypes mirror of ``struct ggml_tensor`` (ggml/include/ggml.h)."""
    import ctypes

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

    return ggml_tensor


SRC1 = ".src1"  # "NAME.src1": the second operand of tensor NAME (a matmul's activation input), read when NAME is computed


class EvalCapture:
    """A ``cb_eval`` for one llama.cpp context that copies the F32 tensors named in ``names`` (and,
    for ``NAME.src1``, the second operand of tensor NAME — e.g. the unnamed input of a matmul) after
    each is computed. ``collect(first, sizes, per_name, per_ubatch)`` moves what one decode call
    produced (ubatches of ``sizes`` tokens starting at position ``first``) into per-position rows."""

    def __init__(self, names):
        import ctypes

        import llama_cpp as ll

        self.names = set(names)
        self._src1 = {n[: -len(SRC1)] for n in self.names if n.endswith(SRC1)}
        self._tensor = _ggml_tensor_struct()
        self._ctypes = ctypes
        self.step: dict[str, list[np.ndarray]] = {}  # name -> one flat array per ubatch of the current call
        self.callback = ll.ggml_backend_sched_eval_callback(self._on_eval)

    def _array(self, t) -> np.ndarray | None:
        if t.type != 0 or not t.data:  # GGML_TYPE_F32 only
            return None
        ne = [int(n) for n in t.ne]
        nb = [int(b) for b in t.nb]
        span = sum((n - 1) * b for n, b in zip(ne, nb)) + 4
        buf = (self._ctypes.c_char * span).from_address(t.data)
        arr = np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=np.float32), shape=tuple(reversed(ne)),
                                              strides=tuple(reversed(nb)))
        return np.array(arr).reshape(-1)

    def _on_eval(self, t_ptr, ask, _user):
        t = self._ctypes.cast(t_ptr, self._ctypes.POINTER(self._tensor)).contents
        name = t.name.decode(errors="replace")
        if ask:
            return name in self.names or name in self._src1
        if name in self.names and (a := self._array(t)) is not None:
            self.step.setdefault(name, []).append(a)
        if name in self._src1 and t.src[1]:
            src = self._ctypes.cast(t.src[1], self._ctypes.POINTER(self._tensor)).contents
            if (a := self._array(src)) is not None:
                self.step.setdefault(name + SRC1, []).append(a)
        return True

    def collect(self, first: int, sizes: list[int], per_name: dict, per_ubatch: dict) -> None:
        for n in self.names:
            parts = self.step.get(n, [])
            if not parts or len(parts) % len(sizes):
                continue  # not computed for every ubatch (e.g. a tensor of the output rows only)
            per_u = len(parts) // len(sizes)  # a name given twice in a graph (Kcur-3): the last one counts
            start = first
            for i, u in enumerate(sizes):
                part = parts[(i + 1) * per_u - 1]
                per_ubatch[f"{n}@{start}"] = part  # as computed for the ubatch starting at position `start`
                start += u
                if part.size % u == 0:  # a per-token tensor: the token axis is the outermost one
                    per_name.setdefault(n, []).extend(part.reshape(u, -1))
        self.step.clear()


def _worker(model_path: str, out_path: str, tokens: list[int], names: set[str], n_threads: int, options: dict) -> None:
    import llama_cpp as ll

    capture = EvalCapture(names)
    ll.llama_backend_init()
    mparams = ll.llama_model_default_params()
    mparams.use_extra_bufts = options["repack"]
    model = ll.llama_model_load_from_file(model_path.encode(), mparams)
    if not model:
        raise SystemExit(f"llama.cpp could not load {model_path}")
    cparams = ll.llama_context_default_params()
    cparams.n_ctx = max(64, len(tokens) + 8)
    cparams.n_ubatch = options["n_ubatch"]
    cparams.n_batch = max(options["n_ubatch"], options["n_batch"], options["prompt_batch"])
    cparams.n_threads = cparams.n_threads_batch = n_threads
    cparams.type_k = KV_TYPES[options["type_k"]]
    cparams.type_v = KV_TYPES[options["type_v"]]
    cparams.flash_attn_type = FLASH_ATTN[options["flash_attn"]]
    cparams.cb_eval = capture.callback
    cparams.cb_eval_user_data = None
    ctx = ll.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))

    per_name: dict[str, list[np.ndarray]] = {}
    per_ubatch_arrays: dict[str, np.ndarray] = {}
    logits = []
    n_batch, first = options["n_batch"], min(options["prompt_batch"], len(tokens))
    starts = ([0] if first else []) + list(range(first, len(tokens), n_batch))
    batch = ll.llama_batch_init(max(n_batch, first), 0, 1)
    for start in starts:
        chunk = tokens[start : (first if start == 0 and first else start + n_batch)]
        batch.n_tokens = len(chunk)
        for i, tok in enumerate(chunk):
            batch.token[i] = tok
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        if ll.llama_decode(ctx, batch) != 0:
            raise SystemExit(f"llama_decode failed at positions {start}..{start + len(chunk) - 1}")
        for i in range(len(chunk)):
            logits.append(np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy())
        capture.collect(start, _ubatch_sizes(len(chunk), options["n_ubatch"]), per_name, per_ubatch_arrays)
    ll.llama_batch_free(batch)
    result = {n: np.stack(v) for n, v in per_name.items() if len(v) == len(tokens)}
    result["logits"] = np.stack(logits)
    if options["n_batch"] > 1 or first > 1:
        result.update(per_ubatch_arrays)
    np.savez(out_path, **result)
    ll.llama_free(ctx)
    ll.llama_model_free(model)


if __name__ == "__main__":
    _model, _out, _tokens, _names, _threads = sys.argv[1:6]
    _options = {**DEFAULT_OPTIONS, **(json.loads(sys.argv[6]) if len(sys.argv) > 6 else {})}
    _worker(_model, _out, [int(t) for t in _tokens.split(",")], set(filter(None, _names.split(","))), int(_threads), _options)
