"""llama.cpp's graph (refimpl/graph/, ``--emulate=ggml``) against the reference (refimpl/model/), computed apart.

On an f32 file with an F32 K/V cache and flash attention off nothing is quantized or rounded to F16 on either side:
the graph's float32 SIMD sums and the reference's exact float64 sums are then the same real numbers rounded
differently, and every position's logits, the hidden handed to the MTP head and the MTP head's own logits must
be within float noise of each other — **1e-5 of the row's max |value|**, the bound of docs/numerics.md ("Verdicts
that hold on any CPU") — with the same greedy choice. Each ggml-cpu path is named (no libggml is loaded), so the
verdict does not depend on the CPU. (Bit-identity with llama.cpp itself: tests/test_ggml_e2e.py.)
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from refimpl.fixtures.builtin import fixture_path
from refimpl.model.mtp import MTPState, load_mtp_weights, mtp_forward
from refimpl.model.ops import Ctx
from refimpl.model.state import SeqState
from refimpl.model.trunk import forward, load_model

NOISE = 1e-5  # of the row's max |value| (docs/numerics.md)
N_TOKENS = 20


@functools.cache
def reference():
    """The tiny f32 fixture, its tokens, and the reference's (logits, h_nextn, MTP logits) — computed once."""
    m = load_model(fixture_path("tiny", "f32"), pack=False)
    tokens = [int(t) for t in np.random.default_rng(0).integers(1, m.config.n_vocab, N_TOKENS)]
    return m, tokens, run(m, tokens, Ctx())


def run(m, tokens, ctx):
    """(trunk logits [T, V], h_nextn [T, E], MTP logits [T, V]: the head fed token p+1 with the trunk's hidden p)."""
    logits, h, _ = forward(m, SeqState.fresh(m.config), tokens, ctx)
    w = load_mtp_weights(m.file, m.weights)
    mtp_logits, _, _ = mtp_forward(m, w, MTPState.fresh(m.config), tokens[1:], h[:-1], ctx)
    return logits, h, mtp_logits


def assert_noise(what: str, got: np.ndarray, want: np.ndarray) -> None:
    rel = np.max(np.abs(got - want), axis=-1) / np.max(np.abs(want), axis=-1)  # per position
    assert rel.max() <= NOISE, f"{what}: position {int(rel.argmax())} is {rel.max():.2e} of its row's max off the reference"


@pytest.mark.parametrize("n_ubatch", [512, 7])  # one ubatch, or llama.cpp's ubatch loop (refimpl.graph.ops.by_ubatch)
@pytest.mark.parametrize("path", ["avx512", "avx2", "generic"])
def test_ggml_graph_within_float_noise_of_the_reference(path, n_ubatch):
    m, tokens, (ref_logits, ref_h, ref_mtp) = reference()
    ctx = Ctx(ggml=path, kv_f16=False, flash_attn=False, n_ubatch=n_ubatch, n_threads=1)
    logits, h, mtp_logits = run(m, tokens, ctx)
    assert_noise(f"{path} logits", logits, ref_logits)
    assert_noise(f"{path} h_nextn", h, ref_h)
    assert_noise(f"{path} MTP logits", mtp_logits, ref_mtp)
    assert np.array_equal(logits.argmax(-1), ref_logits.argmax(-1)) and np.array_equal(mtp_logits.argmax(-1), ref_mtp.argmax(-1))
    assert not np.array_equal(logits, ref_logits)  # two computations, not one: the sums round differently


def test_the_graph_is_chosen_by_the_ctx_alone():
    """One place chooses the numerics: the forward pass's entry hands ``Ctx(ggml=…)`` to refimpl.graph, and the
    reference's modules hold no ggml branch (no ``ctx.ggml`` below the entries, no kernels.ggml op)."""
    import ast
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "refimpl" / "model"
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text())
        reads = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "ggml"
                 and isinstance(n.value, ast.Name) and n.value.id == "ctx"]
        ggml_ops = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("kernels.ggml")
                    and n.module != "kernels.ggml.build"]  # build: the table of emulated paths Ctx checks its field against
        entries = {"trunk.py": 1, "mtp.py": 1}  # the dispatch at forward's / mtp_forward's entry
        assert len(reads) == entries.get(path.name, 0), f"{path.name} reads ctx.ggml at lines {reads}"
        assert not ggml_ops, f"{path.name} imports a kernels.ggml op at lines {ggml_ops}"
