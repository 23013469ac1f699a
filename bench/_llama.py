"""llama.cpp for bench/decode.py: a child process (llama-cpp-python) that decodes and processes prompts on request,
in one or both of two context configurations over the same loaded model.

* ``bench`` — F32 K/V cache, flash attention off: the settings of tests/llama_ref.py (what the plain rows and the
  ``ggml`` row of bench/decode.py are compared with);
* ``defaults`` — llama.cpp's own defaults (``llama_context_default_params``: F16 K/V cache, and flash attention
  on, which its ``auto`` resolves to on the CPU backend; here set explicitly): the ``ggml-fa`` row's.

Both contexts share the weights (loaded, and repacked by CPU_REPACK, once); n_ctx 1024, n_batch = n_ubatch = 512
(llama-bench's), one sequence. ``python bench/_llama.py PATH --threads T [--no-extra-bufts]`` is the child; then
per stdin line ``{"cfg": NAME, "prompt": [...], "n": N}`` it decodes the prompt one token at a time, then N greedy
tokens (timed), and prints ``{"tok_s": …, "tokens": [...]}``; ``{"cfg": NAME, "pp": [...]}`` times one
``llama_decode`` of the whole prompt from an empty context (logits of the last position only, as ``llama-bench -p``);
``{"cfg": NAME, "verify": [...], "drafts": [...], "reps": R}`` decodes the prompt but its last token in one batch,
then times R times, alternately, a ``llama_decode`` of the last token and one of the last token and the drafts (a
1+N verify batch, the logits of every position) — each after the other, so the context grows by N + 2 a repetition
(llama.cpp's recurrent state has no rollback to a position) — and prints ``{"decode_s": [...], "verify_s": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: The context configurations: K/V cache type, flash attention.
CONFIGS = {"bench": ("F32", False), "defaults": ("F16", True)}


def label(cfg: str, extra_bufts: bool | None = True) -> str:
    """The llama.cpp configuration in a table cell, e.g. ``repack F32 K/V FA off``."""
    kv, fa = CONFIGS[cfg]
    return f"{'repack' if extra_bufts in (None, True) else 'no repack'} {kv} K/V FA {'on' if fa else 'off'}"


def _child(path: str, threads: int, extra_bufts: bool) -> int:
    import llama_cpp as L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = extra_bufts  # the repacked (and AMX) weight layouts, llama.cpp's default
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        print(json.dumps({"error": "llama_model_load_from_file returned NULL"}), flush=True)
        return 3
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(512, 0, 1)
    contexts = {}

    def context(cfg: str):
        if cfg not in contexts:  # made on first use: a context's compute buffer holds a ubatch's logits
            kv, fa = CONFIGS[cfg]
            cp = L.llama_context_default_params()
            cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 1024, 512, 512, 1
            cp.n_threads = cp.n_threads_batch = threads
            cp.type_k = cp.type_v = L.GGML_TYPE_F16 if kv == "F16" else L.GGML_TYPE_F32
            cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if fa else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
            cp.no_perf = True
            contexts[cfg] = L.llama_init_from_model(model, cp)
        return contexts[cfg]

    def decode(ctx, tok: int, pos: int) -> int:
        batch.n_tokens = 1
        batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = tok, pos, 1, 0, 1
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError(f"llama_decode failed at position {pos}")
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), shape=(n_vocab,))
        return int(np.argmax(logits))

    def batch_s(ctx, tokens: list[int], pos: int, outputs: str) -> float:
        """Seconds of one llama_decode of ``tokens`` at ``pos``… (``outputs``: "all" or "last" positions' logits)."""
        batch.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = tok, pos + i, 1, 0
            batch.logits[i] = int(outputs == "all" or i == len(tokens) - 1)
        t0 = time.perf_counter()
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError(f"llama_decode of {len(tokens)} tokens failed at position {pos}")
        return time.perf_counter() - t0

    def verify_s(ctx, prompt: list[int], drafts: list[int], reps: int) -> dict:
        pos = len(prompt) - 1
        batch_s(ctx, prompt[:-1], 0, "last")
        one, many = [], []
        for _ in range(reps + 1):  # the first pair warms up
            one.append(batch_s(ctx, prompt[-1:], pos, "all"))
            many.append(batch_s(ctx, [prompt[-1], *drafts], pos + 1, "all"))
            pos += 2 + len(drafts)
        return {"decode_s": one[1:], "verify_s": many[1:]}

    def prompt_tok_s(ctx, tokens: list[int]) -> float:
        return len(tokens) / batch_s(ctx, tokens, 0, "last")

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        ctx = context(req["cfg"])
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        if "pp" in req:
            print(json.dumps({"tok_s": prompt_tok_s(ctx, req["pp"])}), flush=True)
            continue
        if "verify" in req:
            print(json.dumps(verify_s(ctx, req["verify"], req["drafts"], req["reps"])), flush=True)
            continue
        prompt = req["prompt"]
        for pos, tok in enumerate(prompt):
            nxt = decode(ctx, tok, pos)
        out = [nxt]
        t0 = time.perf_counter()
        for i in range(req["n"]):
            out.append(decode(ctx, out[-1], len(prompt) + i))
        dt = time.perf_counter() - t0
        print(json.dumps({"tok_s": req["n"] / dt, "tokens": out[:-1]}), flush=True)
    return 0


class LlamaDecoder:
    """The llama.cpp child of one model (``with`` closes it)."""

    def __init__(self, path: Path, threads: int, extra_bufts: bool = True):
        argv = [sys.executable, __file__, str(path), "--threads", str(threads)]
        self.proc = subprocess.Popen(argv + ([] if extra_bufts else ["--no-extra-bufts"]),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        ready = json.loads(self.proc.stdout.readline() or '{"error": "llama.cpp child died while loading"}')
        if "error" in ready:
            raise RuntimeError(ready["error"])

    def run(self, prompt: list[int], n: int, cfg: str = "bench") -> dict:
        return self._ask({"cfg": cfg, "prompt": prompt, "n": n})

    def verify_times(self, prompt: list[int], drafts: list[int], reps: int, cfg: str = "bench") -> dict:
        """{"decode_s": [...], "verify_s": [...]}: llama.cpp's per-repetition times of a 1-token decode and a
        verify(1+N) batch (N = len(drafts)), timed alternately after the prompt."""
        return self._ask({"cfg": cfg, "verify": prompt, "drafts": drafts, "reps": reps})

    def prompt(self, tokens: list[int], cfg: str = "bench") -> float:
        """Prompt-processing tok/s of one batch of ``tokens`` from an empty context."""
        return self._ask({"cfg": cfg, "pp": tokens})["tok_s"]

    def _ask(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise ChildProcessError(f"the llama.cpp child died (exit status {self.proc.wait()})")
        return json.loads(line)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=60)


def llama_prompt(path: Path, threads: int, tokens: list[int], extra_bufts: bool | None,
                 cfgs: list[str]) -> tuple[dict[str, float], bool]:
    """({cfg: prompt tok/s of llama.cpp on ``tokens``}, the ``use_extra_bufts`` it ran with), in a child of its
    own that lives only for this measurement (two llama.cpp processes at once slow each other down: idle
    threads spin). Warm: each configuration's prompt is run twice, the second timed. ``extra_bufts=None``:
    llama.cpp's default (the repacked and AMX layouts), and if its batch kernels die — some VMs advertise AMX
    without enabling it (a KVM host: SIGILL on a batch of Q4_K rows) — ``use_extra_bufts = false``."""
    for flag in ([True, False] if extra_bufts is None else [extra_bufts]):
        with LlamaDecoder(path, threads, extra_bufts=flag) as llama:
            try:
                out = {}
                for cfg in cfgs:
                    llama.prompt(tokens, cfg)
                    out[cfg] = llama.prompt(tokens, cfg)
                return out, flag
            except ChildProcessError:
                if extra_bufts is not None or not flag:
                    raise
    raise AssertionError("unreachable")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="the llama.cpp child of bench/decode.py")
    ap.add_argument("path")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--no-extra-bufts", action="store_true")
    a = ap.parse_args()
    sys.exit(_child(a.path, a.threads, not a.no_extra_bufts))
