"""llama.cpp's CPU numerics, emulated: activation quantizers (``actquant``: Q8_0, Q8_1, Q8_K, F16/BF16
rounding), the activation-quantized dot products of every weight type (``actdots``, ``actdots_iq``), and
flash attention with its F16 accumulator (``flashattn``).

May import: ``kernels.base``, ``kernels.plain``, ``kernels.lanes``.
"""
