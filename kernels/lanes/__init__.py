"""The fast lanes: LLVM-IR row kernels that give the plain path's numbers bit for bit.

``ir`` (the IR emitter and the ISA levels) → ``exact64`` (exact float64 weight forming) → ``blocks`` /
``blocks_iq`` (per-type code decoding) → ``pack`` (the packed-row layout and its matmul) → ``act``
(the same lanes for llama.cpp's activation-quantized dot products).

May import: ``kernels.base``, ``kernels.plain``.
"""
