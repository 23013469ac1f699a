"""llama.cpp's CPU numerics, emulated: the bit-exact ops of ggml-cpu per x86 path (``--emulate=ggml``), and
the older approximate emulation of its activation quantization, integer dots and flash attention.

Modules in reading order:

Bit-exact, per path (``"avx512"`` / ``"avx2"`` / ``"generic"``, ggml's x86 build without SIMD; tested byte for byte
against the three libggml builds):

* ``build`` — which path the loaded libggml-cpu takes (its compile-time ``ggml_cpu_has_*``), or a refusal;
* ``simd`` — ``fma32``, bit casts, ``lanes(path)``, ``ggml_v_expf`` of each path, horizontal sums,
  ``GGML_F32_VEC_REDUCE``, GCC's split of an in-order dot loop;
* ``libm`` — glibc's ``expf``/``logf``/``sinf``/``cosf``/``powf``/``fmaxf``, called as libggml calls them;
* ``vec`` — vec.cpp's shared functions: ``ggml_vec_dot_f32``/``_f16``, ``ggml_vec_max_f32``,
  ``ggml_vec_soft_max_f32``;
* ``vecmath`` — element-wise ops: add/sub/mul/div, scale, exp/sigmoid/softplus, silu/swiglu, soft_max,
  F16/BF16 casts (and ggml's half → float table), sum_rows, cumsum;
* ``norm`` — rms_norm (fused with the weight), l2_norm, qwen35moe's gdn l2 norm;
* ``rope`` — IMRoPE/M-RoPE (``ggml_rope_multi``) and NEOX RoPE;
* ``rows`` — get_rows of float and quantized tables, argsort/top_k (libstdc++'s sort), concat;
* ``ssm`` — ssm_conv and the fused gated delta net;
* ``flashattn_exact_tiled``, ``flashattn_exact`` — ``ggml_flash_attn_ext``: the tiled path of ≥ 64 query
  rows, and the dispatch with the one-row and split-KV paths;
* ``mulmat_vec``, ``mulmat_k``, ``mulmat`` — ``ggml_mul_mat``/``_id``: float vec_dots and llamafile's
  tinyBLAS, the K-quant vec_dot and tiled kernels, and the dispatch (Q8_0, MXFP4 there); ``mulmat_generic`` — the
  generic path's (the ``_ref`` activation quantizers, then ``actdots``' generic dots);
* ``columns``, ``columns_k`` — the column layout ``--pack`` builds for the SIMD paths' kernels (same bits, faster).

Approximate (llama.cpp to float-accumulation noise; path-independent):

* ``actquant`` — activation quantizers Q8_0/Q8_1/Q8_K and F16/BF16 rounding (these are bit-exact);
* ``actdots_iq``, ``actdots`` — activation-quantized integer dot products of every weight type (quants.c's generic
  C: bit-exact on ggml's generic path, where ``mulmat_generic`` uses them);
* ``flashattn`` — flash attention with the F16 accumulator (``flash_attn_f16``).

May import: ``kernels.base``, ``kernels.plain``, ``kernels.lanes``.
"""
