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

How: ``llama_context_params.cb_eval`` (refimpl/oracle/dumper.py: :class:`EvalCapture`, the dumper
``refimpl trace --against`` documents, and :func:`capture_llama`, the decode loop). A name ``"NAME.src1"``
captures the second operand of tensor NAME when NAME is computed — the input of a matmul llama.cpp left
unnamed (``mtp_attn_out-4.src1``, the MTP block's gated attention). tests/llama_ref.py uses
:class:`EvalCapture` on its MTP context too.

Which library: llama-cpp-python loads ``libllama`` (and through its run path ``libggml*``) from
``$LLAMA_CPP_LIB_PATH`` when set, else from the package's ``lib/``; tests/ggml_lib.py follows the
same variable. Pointing it at another build of the same source (e.g. one for AVX2 only,
docs/numerics.md "Which CPU paths were exercised") runs every conformance test against that build.

Run as a script it is the worker: ``python tests/llama_trace.py MODEL OUT.npz TOKENS NAMES``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from arm64 import ARM_SLOWDOWN, command_for

from refimpl.oracle.dumper import FLASH_ATTN, KV_TYPES, EvalCapture, capture_llama  # noqa: F401 (EvalCapture: llama_ref)

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
        python, env = command_for(os.environ.get("LLAMA_CPP_LIB_PATH"))  # an ARM build: qemu's aarch64 Python
        cmd = [*python, __file__, str(model_path), str(out), ",".join(map(str, tokens)), ",".join(names), str(n_threads),
               json.dumps(options)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * (ARM_SLOWDOWN if env else 1),
                              env=env)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"llama.cpp trace worker failed (exit {proc.returncode}):\n{tail}")
        with np.load(out) as z:
            return {k: z[k] for k in z.files}


def _worker(model_path: str, out_path: str, tokens: list[int], names: set[str], n_threads: int, options: dict) -> None:
    try:
        result = capture_llama(model_path, tokens, names, n_threads=n_threads, **options)
    except RuntimeError as e:
        raise SystemExit(str(e)) from None
    np.savez(out_path, **result)


if __name__ == "__main__":
    _model, _out, _tokens, _names, _threads = sys.argv[1:6]
    _options = {**DEFAULT_OPTIONS, **(json.loads(sys.argv[6]) if len(sys.argv) > 6 else {})}
    _worker(_model, _out, [int(t) for t in _tokens.split(",")], set(filter(None, _names.split(","))), int(_threads), _options)
