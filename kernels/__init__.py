"""kernels — quantized GGUF weight formats: dequantization and fused matmuls.

Contract (what may live in this package):

* One small, readable description per ggml block layout (``kernels/base/blocks.py``), and for every type
  a numba dequantizer that is **bit-identical** to ``gguf.quants.dequantize`` (gguf 0.19.0).
* ``matmul(w_raw, qtype, x)`` computes ``y = x @ W.T`` (i.e. ``y[t] = W @ x[t]``) for 1 or more
  activation rows straight from the quantized bytes, never materialising the whole dequantized
  matrix. Two paths behind one interface: ``path="numpy"`` (the definition: plain, obvious, slow) and
  ``path="numba"`` (the default), tested equal bit for bit for every type (a NaN matches a NaN:
  ``kernels/matmul.py``); each output element is computed by one thread in a fixed order, so results
  do not depend on the thread count or on how many activation rows are in the batch.
* ``act_quant=True`` emulates llama.cpp's CPU activation quantization (Q8_0 / Q8_1 / Q8_K, F16 and
  BF16 rounding) and integer block dot products, to match llama.cpp to float-accumulation noise.
* Speed without new numbers: the numba path runs every type through ``kernels/lanes/pack.py`` (16
  weight rows per group, a SIMD lane each, LLVM IR; ``act_quant`` through ``kernels/lanes/act.py``),
  tested bit-identical to the scalar row kernels;
  ``pack(w_raw, qtype)`` returns a layout ``matmul`` accepts in place of ``w_raw`` (same results,
  no gathers). docs/performance.md.
* ``dot64`` (``kernels/plain/dot.py``) and ``delta_rule_step`` (``kernels/plain/recurrent.py``): the
  reference's float64 dot products — attention, the shared-expert gate, the delta rule — (numba and numpy
  paths, equal bit for bit) and the compiled Gated DeltaNet step, summed in increasing index order; the
  step's definition is the numpy form in ``refimpl/model/deltanet.py``, whose bits it gives
  (tests/test_kernels_recurrent.py).
* ``flash_attn_f16`` (``kernels/ggml/flashattn.py``): llama.cpp's CPU flash attention for a few query
  rows, with its F16 accumulator and the C library's ``expf``.
* Numeric flags (fastmath, caching, threading layer) live in ``kernels/base/flags.py`` only.

Folders in dataflow order, each importing only from the ones before it (tests/test_layout.py):

=================  ===========================================================================================
``base/``          flags (how everything is compiled), float16/bfloat16/E8M0 conversions, block layouts
``plain/``         the plain definition: bytes → float32 (``dequant``, ``dequant_iq``), the float64 dot, and
                   the compiled delta-rule step (``recurrent``)
``lanes/``         the fast kernels: IR vocabulary and ISA levels (``ir``, ``exact64``), per-type emitters
                   (``blocks``, ``blocks_iq``), packing and the packed matmul (``pack``), the act_quant lanes (``act``)
``ggml/``          llama.cpp's CPU numerics: the bit-exact ggml-cpu ops per x86 path (``--emulate=ggml``) on
                   shared primitives (``build``, ``simd``, ``libm``, ``vec``; ops in ``vecmath``, ``norm``,
                   ``rope``, ``rows``, ``ssm``, ``flashattn_exact``, ``mulmat``); and the approximate emulation:
                   activation quantizers (``actquant``), integer dots (``actdots``, ``actdots_iq``), flash
                   attention with the F16 accumulator (``flashattn``)
``matmul.py``      the public product: the numpy and numba row kernels, and which path runs
``testing.py``     random rows with controlled scales, for tests and ``bench/kernels.py``
=================  ===========================================================================================

Precision policy, tolerances and measured speed: ``docs/kernels.md``.
"""

from kernels.ggml.actquant import Q8_0Blocks, Q8_1Blocks, Q8_KBlocks, activation_values, quantize_q8_0, quantize_q8_1, quantize_q8_K
from kernels.base.blocks import WEIGHT_TYPES, layout, row_bytes
from kernels.plain.dequant import dequantize
from kernels.lanes.pack import PackedRows, pack
from kernels.plain.dot import dot64
from kernels.plain.recurrent import delta_rule_step
from kernels.ggml.flashattn import flash_attn_f16
from .matmul import matmul, matmul_experts

__all__ = [
    "WEIGHT_TYPES",
    "layout",
    "row_bytes",
    "dequantize",
    "matmul",
    "matmul_experts",
    "pack",
    "PackedRows",
    "dot64",
    "delta_rule_step",
    "flash_attn_f16",
    "quantize_q8_0",
    "quantize_q8_1",
    "quantize_q8_K",
    "Q8_0Blocks",
    "Q8_1Blocks",
    "Q8_KBlocks",
    "activation_values",
]
