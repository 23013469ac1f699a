"""llama.cpp's CPU numerics, emulated: the bit-exact ops of ggml-cpu per x86 path (``--emulate=ggml``), and
the older approximate emulation of its activation quantization, integer dots and flash attention.

Modules in reading order:

Bit-exact, per path (``"avx512"`` / ``"avx2"`` / ``"avx2-zen"`` / ``"generic"``, ggml's x86 build without SIMD;
tested byte for byte against the four x86 libggml builds, and the AArch64 paths under qemu):

* ``build`` — which path the loaded libggml-cpu takes (its compile-time ``ggml_cpu_has_*``), or a refusal;
* ``tuning`` — how GCC tuned an x86 build (for AMD Zen or not: whether a loop-carried ``s += a*b`` is one FMA), told by
  one call of its MXFP4 dot;
* ``elf`` — a shared library read, never run (an AArch64 libggml-cpu in an x86 process): the constants its
  ``ggml_cpu_has_*`` return, the compiler of its ``.comment``;
* ``isa`` — the per-path record (``simd(path)``: lanes, the SIMD and expf codes, fused, half F16 accumulation),
  ``lanes(path)``, ``check_path``, and each platform's default NaN (``nan_swap``, ``follows_nans``);
* ``simd`` — ``fma32``, bit casts, ``ggml_v_expf`` of each path, horizontal sums,
  ``GGML_F32_VEC_REDUCE``, GCC's split of an in-order dot loop;
* ``half`` — AArch64's binary16 arithmetic (``fma16``: ``vfmaq_f16`` rounded once to half);
* ``sve`` — the SVE branches of vec.h / vec.cpp at 128 and 256 bits (``arm64-sve128``, ``arm64-sve128-clang``,
  ``arm64-sve256``);
* ``libm`` — glibc's ``expf``/``logf``/``sinf``/``cosf``/``powf``/``fmaxf``, called as libggml calls them, and
  AArch64 glibc's ``expf`` (``expf_arm64``);
* ``vec`` — vec.cpp's shared functions: ``ggml_vec_dot_f32``/``_f16``, ``ggml_vec_max_f32``,
  ``ggml_vec_soft_max_f32``;
* ``vecmath`` — element-wise ops: add/sub/mul/div, scale, exp/sigmoid/softplus, silu/swiglu, soft_max,
  F16/BF16 casts (and ggml's half → float table), sum_rows, cumsum;
* ``norm`` — rms_norm (fused with the weight), l2_norm, qwen35moe's gdn l2 norm;
* ``rope`` — IMRoPE/M-RoPE (``ggml_rope_multi``) and NEOX RoPE;
* ``rows`` — get_rows of float and quantized tables, argsort/top_k (libstdc++'s sort), concat; ``rows_q``,
  ``rows_iq`` — libggml-base's ``dequantize_row_*`` that get_rows calls (Q2_K, Q3_K and the legacy 32-value
  types; the codebook types);
* ``ssm`` — ssm_conv and the fused gated delta net;
* ``flashattn_exact_tiled``, ``flashattn_exact`` — ``ggml_flash_attn_ext``: the tiled path of ≥ 64 query
  rows, and the dispatch with the one-row and split-KV paths;
* ``attn_heads`` — ``build_attn_mha`` without flash attention (F32 K/V): kq, soft_max, kqv of every head in
  one compiled call;
* ``mulmat_vec`` — float vec_dots and llamafile's float tinyBLAS; ``mulmat_q8`` — the Q8_0-activation kernels
  of Q8_0 and MXFP4 weights (vec_dot, ``tinyBLAS_Q0_AVX``) and the argument checks every ``mul_mat`` shares,
  with ``mulmat_q8_ir`` — its block dot as LLVM IR in ggml's own instructions; ``mulmat_q`` — the legacy 32-value types (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL); ``mulmat_k`` — the K-quants'
  vec_dot and tiled kernels, with ``rows_k_ir`` — Q4_K's and Q6_K's super-block integers as vector IR on the stored
  rows (also ``repack_k``'s); ``mulmat_iq`` — the codebook types; ``repack``, ``repack_k`` — weights in
  llama.cpp's CPU_REPACK buffer (Q4_0, IQ4_NL, MXFP4; Q4_K, Q2_K); ``repack_arm``, ``repack_arm_k`` — that buffer on
  the AArch64 paths (Q8_0, Q4_0, IQ4_NL, MXFP4; Q4_K, Q5_K, Q6_K; the dispatch ``mulmat`` calls); ``mulmat_arm``,
  ``mulmat_arm_q`` — the plain-buffer weights on the AArch64 paths (every type; the i8mm 2-row kernels); ``mulmat`` — ``ggml_mul_mat``/``_id``:
  the dispatch among them, with the formulas; ``mulmat_generic`` — the generic path's (the ``_ref`` activation
  quantizers, then ``actdots``' generic dots);
* ``columns``, ``columns_k``, ``columns_q4k``, ``columns_b32``, ``columns_q8`` — the column layout ``--pack`` builds for
  the SIMD paths' kernels (same bits, faster; Q4_K repacked a whole sub-tile per step; Q4_0, IQ4_NL and MXFP4 from
  their 4-bit codes on AVX-512 VNNI; Q8_0's ``vec_dot`` from its values in quads);
  ``columns_ir`` — its K-quant integer steps, 16 columns at a time, as vector IR; ``columns_arm`` — the AArch64
  paths' kernels (the CPU_REPACK ones and a plain buffer's 1-row ``vec_dot``) on the same layout, with
  ``columns_arm_lanes`` — Q8_0's and Q4_0's ``ggml_vdotq_s32`` lanes.

Approximate (llama.cpp to float-accumulation noise; path-independent):

* ``actquant`` — activation quantizers Q8_0/Q8_1/Q8_K and F16/BF16 rounding (these are bit-exact);
* ``actdots_iq``, ``actdots`` — activation-quantized integer dot products of every weight type (quants.c's generic
  C: bit-exact on ggml's generic path, where ``mulmat_generic`` uses them);
* ``flashattn`` — flash attention with the F16 accumulator (``flash_attn_f16``).

May import: ``kernels.base``, ``kernels.plain``, ``kernels.lanes``.
"""
