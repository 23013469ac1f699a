"""What every kernel shares: the numeric and compile flags (``flags``), numba's disk cache of the kernels
(``cache``), float16 / bfloat16 / E8M0 helpers (``floats``), and the ggml block layouts of every weight and activation type (``blocks``, with the
codebook and ternary types in ``blocks_iq``).

May import nothing else of ``kernels``.
"""
