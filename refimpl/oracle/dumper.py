"""Dumping an engine's intermediates from llama.cpp's eval callback, for ``refimpl trace --against DUMP``.

llama.cpp hands every computed graph tensor to ``llama_context_params.cb_eval``, a
``ggml_backend_sched_eval_callback``: ``bool (*)(struct ggml_tensor * t, bool ask, void * user_data)``
(ggml/include/ggml-backend.h). The scheduler first calls it with ``ask`` = true (return true to observe
that tensor), then again with ``ask`` = false once the tensor is computed (src/llama-context.cpp,
ggml/src/ggml-backend.cpp ``ggml_backend_sched_compute_splits``). Tensor names are the graph's
``cb(cur, name, il)`` names with ``-il`` appended (src/llama-graph.cpp, ``llm_graph_context::cb`` →
``ggml_format_name(cur, "%s-%d", name, il)``): ``attn_norm-0``, ``linear_attn_out-3``, ``result_output``.

* :class:`EvalCapture` — that callback for llama.cpp through llama-cpp-python: it copies the F32 tensors
  named in ``names`` (host memory, read through a ctypes mirror of ``struct ggml_tensor``,
  ggml/include/ggml.h, with its ne/nb strides); ``collect`` splits what one ``llama_decode`` produced
  into one row per position (a ubatch of U tokens: the token axis is the outermost one of a per-token
  tensor). tests/llama_trace.py and tests/llama_ref.py capture llama.cpp's intermediates with it.
* :func:`capture_llama` — llama.cpp (llama-cpp-python) on a GGUF and a token list, in the configuration
  asked for, returning ``{name: [T, n]}`` and the logits; :func:`dump_llama` writes that as the DUMP
  ``refimpl trace --against`` reads (DIR/NAME.npy, first axis = position).
* :data:`DUMP_NAMES` — the intermediates refimpl computes under llama.cpp's names and shapes, the
  default set a dumper asks for (``default_names``); ``tools/refimpl_dump.h`` is the same dumper in C
  for engines that call llama.cpp from C or C++ (docs/validating-an-engine.md, "Where an engine departs").

Which library: llama-cpp-python loads ``libllama`` (and through its run path ``libggml*``) from
``$LLAMA_CPP_LIB_PATH`` when set, else from the package's ``lib/``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: llama.cpp's ``cb`` names (without ``-il``) of the per-layer intermediates refimpl records with the same
#: meaning, shape and memory order (refimpl.model.trunk / attention / deltanet / moe), in graph order;
#: ``MODEL_NAMES`` the model-level ones. A dumper asks for these; ``refimpl trace --against`` compares them.
LAYER_NAMES = (
    "attn_norm",
    # full attention (src/models/qwen35moe.cpp build_layer_attn)
    "Qcur_full", "Qcur_normed", "Kcur_normed", "Qcur", "Kcur", "Vcur", "attn_pregate", "attn_gated", "attn_output",
    # Gated DeltaNet (build_layer_attn_linear; qwen3next's fused ssm_in / ssm_ba)
    "linear_attn_qkv_mixed", "linear_attn_mixed_qkvz", "qkv_mixed", "z", "linear_attn_mixed_ba", "beta_sigmoid", "gate",
    "conv_output_raw", "conv_output_silu", "final_output", "linear_attn_out",
    "attn_residual", "attn_post_norm",
    # MoE (src/llama-graph.cpp build_moe_ffn, then the shared expert) or qwen35's dense FFN (build_ffn)
    "ffn_moe_logits", "ffn_moe_weights_norm", "ffn_moe_swiglu", "ffn_moe_out", "ffn_swiglu", "ffn_shexp",
    "shared_expert_gate_sigmoid", "ffn_out", "l_out",
)
MODEL_NAMES = ("model.input_embed", "model.embed_tokens", "result_norm", "result_output")


def default_names(n_layer: int) -> set[str]:
    """Every name of :data:`LAYER_NAMES` for layers 0 … n_layer − 1, and :data:`MODEL_NAMES`."""
    return {f"{n}-{il}" for n in LAYER_NAMES for il in range(n_layer)} | set(MODEL_NAMES)


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


def ubatch_sizes(n_tokens: int, n_ubatch: int) -> list[int]:
    """How llama.cpp splits one decode call of a single sequence: ubatches of n_ubatch tokens, then the rest."""
    return [min(n_ubatch, n_tokens - i) for i in range(0, n_tokens, n_ubatch)]


class EvalCapture:
    """A ``cb_eval`` for one llama.cpp context that copies the F32 tensors named in ``names`` (and,
    for ``NAME.src1``, the second operand of tensor NAME — e.g. the unnamed input of a matmul) after
    each is computed. ``collect(first, sizes, per_name, per_ubatch)`` moves what one decode call
    produced (ubatches of ``sizes`` tokens starting at position ``first``) into per-position rows.
    Pass ``capture.callback`` as ``cb_eval`` (keep ``capture`` alive as long as the context)."""

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


KV_TYPES = {"f32": 0, "f16": 1}  # GGML_TYPE_F32, GGML_TYPE_F16
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # LLAMA_FLASH_ATTN_TYPE_AUTO / _DISABLED / _ENABLED
#: llama.cpp's own defaults (llama_context_default_params: F16 K/V, flash attention auto = on for the CPU backend,
#: n_ubatch 512, the CPU_REPACK buffers) — what ``refimpl trace --emulate=ggml`` emulates.
LLAMA_DEFAULTS = {"type_k": "f16", "type_v": "f16", "flash_attn": "auto", "n_batch": 512, "n_ubatch": 512,
                  "repack": True, "prompt_batch": 0}


def capture_llama(model_path, tokens: list[int], names, n_threads: int = 4, **options) -> dict[str, np.ndarray]:
    """llama.cpp on ``model_path``: ``tokens`` decoded in calls of ``n_batch`` (after a first call of
    ``prompt_batch`` tokens when > 0), in the K/V types, flash attention and n_ubatch of ``options``
    (:data:`LLAMA_DEFAULTS` for those not given). Returns ``{name: [T, n]}`` for every name of ``names``
    computed at every position, ``"logits"`` [T, V], and with n_batch or prompt_batch > 1 each ubatch's
    array as ``"NAME@P"`` (P = the ubatch's first position). Runs in this process: llama.cpp's library is
    the one llama-cpp-python loads."""
    import llama_cpp as ll

    options = {**LLAMA_DEFAULTS, **options}
    capture = EvalCapture(names)
    ll.llama_backend_init()
    mparams = ll.llama_model_default_params()
    mparams.use_extra_bufts = options["repack"]
    model = ll.llama_model_load_from_file(str(model_path).encode(), mparams)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {model_path}")
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
        ll.llama_model_free(model)
        raise RuntimeError("llama.cpp could not create a context")
    try:
        n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
        per_name: dict[str, list[np.ndarray]] = {}
        per_ubatch: dict[str, np.ndarray] = {}
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
                raise RuntimeError(f"llama_decode failed at positions {start}..{start + len(chunk) - 1}")
            for i in range(len(chunk)):
                logits.append(np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy())
            capture.collect(start, ubatch_sizes(len(chunk), options["n_ubatch"]), per_name, per_ubatch)
        ll.llama_batch_free(batch)
    finally:
        ll.llama_free(ctx)
        ll.llama_model_free(model)
    result = {n: np.stack(v) for n, v in per_name.items() if len(v) == len(tokens)}
    result["logits"] = np.stack(logits)
    if options["n_batch"] > 1 or first > 1:
        result.update(per_ubatch)
    return result


def n_layer_of(model_path) -> int:
    """The GGUF's ``ARCH.block_count`` (the trunk's layers; the MTP block is not one of them)."""
    from refimpl.io.config import load_config
    from refimpl.io.gguf_file import GGUFFile

    return load_config(GGUFFile(str(model_path))).n_layer


def dump_llama(model_path, tokens: list[int], out_dir, names=None, n_threads: int = 4, **options) -> list[str]:
    """Run llama.cpp (:func:`capture_llama`) and write each captured intermediate as OUT_DIR/NAME.npy (float32
    [T, n], first axis = position): the DUMP ``refimpl trace --against`` reads. ``names`` defaults to
    :func:`default_names` of the file's layer count. Returns the names written."""
    names = default_names(n_layer_of(model_path)) if names is None else set(names)
    arrays = capture_llama(model_path, list(tokens), names, n_threads=n_threads, **options)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = sorted(n for n in arrays if n in names)
    for name in written:
        np.save(out / f"{name}.npy", arrays[name].astype(np.float32))
    return written
