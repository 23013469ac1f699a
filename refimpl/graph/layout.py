"""What ``--emulate=ggml`` can run, and the layout it runs it from fastest.

* :func:`check_ggml_weights`: the refusal, in one line, of a file holding a weight whose ggml-cpu kernel on the
  path is not emulated (llama.cpp's buffer choice included: ``CPU_REPACK`` takes some types by default);
* :func:`ggml_layout`: the weights with their column layout (``kernels.ggml.columns``) beside the stored rows, for
  the matrices whose kernel has one — ``load_model(ggml=(path, repack))`` builds it when ``--pack`` says so.
"""

from __future__ import annotations

import dataclasses
import weakref

from kernels.ggml.build import X86_SIMD_PATHS, is_arm64
from kernels.ggml.columns import kind_for, layout, layout_nbytes, sixbit_fast
from kernels.ggml.columns_b32 import fast as codes_fast
from kernels.ggml.columns_arm import covers
from kernels.ggml.mulmat import mul_mat_emulated, repack_emulated, repacked
from kernels.ggml.rows import GET_ROWS_TYPES
from refimpl.errors import RefimplError
from refimpl.io.packing import map_matrices, pack_targets
from refimpl.io.weights import Matrix


def layout_target(w: Matrix, path: str, repack: bool) -> bool:
    """Whether ``--emulate=ggml`` multiplies ``w`` by a kernel that has a column layout (kernels.ggml.columns): on
    x86, Q4_0 / IQ4_NL / MXFP4 / Q4_K when llama.cpp repacks the tensor, Q4_K / Q5_K / Q6_K / Q8_0 when it does not;
    on an AArch64 path, the K-quants, Q4_0, IQ4_NL and MXFP4 when it repacks them, the K-quants, MXFP4 and IQ4_NL when it
    does not (kernels.ggml.columns_arm)."""
    is_repacked = repack and repacked(w.qtype, w.stored_rows or w.shape[-2], path)
    if is_arm64(path):  # arch/arm's repacked kernels, or its plain buffer's 1-row vec_dots, from the layout
        return covers(w.qtype, path, is_repacked)
    if path not in X86_SIMD_PATHS:  # generic: its vec_dot is the generic C's, and the rows go to it
        return False
    return kind_for(w.qtype, is_repacked) is not None


def layout_bytes(weights, path: str, repack: bool, experts: bool = True) -> int:
    """Bytes :func:`ggml_layout` would add, each matrix's in the form it would take (``kernels.ggml.columns.
    layout_nbytes``: ~1.0–1.2 × the stored bytes as 4-bit or 6-bit codes, Q4_K, Q8_0's quads; 1.3–1.6 × Q5_K's and
    Q6_K's bytes; 2.1 × the 32-value types' values in pairs), which :func:`refimpl.model.load.load_model` weighs
    against its budget. (Each had been counted 2 × its stored bytes: with Q8_0's matrices laid out too, that kept
    pinned experts out of the layout at sizes where they fit.)"""
    return sum(layout_nbytes(w.qtype, w.row_bytes.shape, *_forms(w.qtype, path))
               for w in pack_targets(weights, experts) if layout_target(w, path, repack))


def _forms(qtype, path: str) -> tuple[bool, bool, bool]:
    """(nibbles, sixbit, quads): the form :func:`ggml_layout` lays ``qtype`` out in on ``path``."""
    x86 = not is_arm64(path)
    return codes_fast(qtype) and x86, sixbit_fast() and x86, x86


def ggml_layout(obj, path: str, repack: bool, experts: bool = True):
    """``--emulate=ggml``'s packing: ``obj`` (the :class:`refimpl.io.weights.Weights`, or any part of them) with every
    matrix that ggml-cpu's ``path`` multiplies by a kernel of :mod:`kernels.ggml.columns` also held in that column
    layout (``Matrix.cols``: routed experts included when pinned and ``experts``, as a stack; the embedding table left
    alone). Every product gives the same bits; a decoded token runs the exact integer dots of many outputs at once.
    On x86, Q4_0 / IQ4_NL / MXFP4 are laid out as their 4-bit codes where their vector step runs (``columns_b32.fast``:
    AVX-512 VNNI; AVX2 for Q4_0 and MXFP4), Q6_K as its six-bit codes with AVX-512 VNNI (``columns.sixbit_fast``),
    Q8_0 as its values in quads (``columns_q8``); the AArch64 kernels (kernels.ggml.columns_arm) read the values in
    pairs and the bytes."""
    def laid(m):
        return dataclasses.replace(m, cols=layout(m.row_bytes, m.qtype, *_forms(m.qtype, path)))

    return map_matrices(obj, lambda m: laid(m) if layout_target(m, path, repack) else m, experts)


def check_ggml_weights(gguf, path: str, repack: bool) -> None:
    """Refuse, in one line, a file holding a weight whose ggml-cpu kernel on ``path`` is not emulated — a table read
    by ``get_rows`` (``token_embd``, ``nextn.embed_tokens``: ``kernels.ggml.rows``), a matrix multiplied by
    ``mul_mat`` / ``mul_mat_id`` (``kernels.ggml.mulmat.mul_mat_emulated``), or, with llama.cpp's default CPU_REPACK
    buffer (``repack``), a matrix that buffer takes (``kernels.ggml.mulmat.repacked``) with repacked kernels not
    emulated. A ``token_embd`` that is also the LM head (no ``output.weight``) is both: llama.cpp loads a duplicate
    for the mul_mat. The conv kernels and norms are F32 (checked by the loader)."""
    key = (path, repack)
    if key in _CHECKED.get(gguf, ()):  # a file passes once per configuration: not on every decode step
        return
    tied = "output.weight" not in gguf.tensors

    def refuse(t, what: str):
        raise RefimplError(f"--emulate=ggml: {t.name} is {t.qtype.name}, whose {what} on ggml-cpu's {path} path is not "
                           "emulated (docs/numerics.md lists what is)")

    for t in gguf.tensors.values():
        if len(t.shape) < 2 or t.name.endswith("ssm_conv1d.weight"):
            continue
        table = t.name == "token_embd.weight" or t.name.endswith("embed_tokens.weight")
        if table and t.qtype not in GET_ROWS_TYPES:
            refuse(t, "get_rows")
        if table and not (t.name == "token_embd.weight" and tied):
            continue
        if repack and repacked(t.qtype, t.shape[-2], path):
            if not repack_emulated(t.qtype, path):
                raise RefimplError(f"--emulate=ggml: llama.cpp repacks {t.name} ({t.qtype.name}) into CPU_REPACK's "
                                   f"interleaved layout by default, whose {path} kernels are not emulated; run llama.cpp "
                                   "with --no-repack and give --no-repack here")
        elif not mul_mat_emulated(t.qtype, path):
            refuse(t, "mul_mat")
    _CHECKED.setdefault(gguf, set()).add(key)


_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # gguf file -> the configurations it passed
