"""The codebook ("i-quant") block layouts IQ1_S … IQ3_S, the ternary TQ1_0 / TQ2_0, and their tables.

Read next to ``ggml/src/ggml-common.h`` (``block_iq2_xxs`` … ``block_iq1_m``, ``block_tq1_0``,
``block_tq2_0``, the grid tables ``iq2xxs_grid`` … ``iq1s_grid``, ``ksigns_iq2xs``) and
``ggml-quants.c::dequantize_row_iq*`` / ``dequantize_row_tq*``. All are 256-value super-blocks.

The IQ types store, per group of 8 (or 4) values, an *index into a grid* of magnitude patterns
instead of one integer per value; signs, when separate, are per-value bits. A grid entry is 8 (IQ2,
IQ1) or 4 (IQ3) small integers:

============  ========  ===================================  ===========================
grid          entries   values of one entry                  used by
============  ========  ===================================  ===========================
iq2xxs_grid   256 × 8   {8, 25, 43}                          IQ2_XXS
iq2xs_grid    512 × 8   {8, 25, 43}                          IQ2_XS
iq2s_grid     1024 × 8  {8, 25, 43}                          IQ2_S
iq3xxs_grid   256 × 4   {4, 12, 20, 28, 36, 44, 52, 62}      IQ3_XXS
iq3s_grid     512 × 4   {1, 3, 5, 7, 9, 11, 13, 15}          IQ3_S
iq1s_grid     2048 × 8  {−1, 0, +1}                          IQ1_S, IQ1_M
============  ========  ===================================  ===========================

The grids come from gguf-py's packed copies (``gguf.quants.<TYPE>.grid_hex``, decoded with
``init_grid``), which are ggml's tables re-encoded; ``KSIGNS`` is ``ksigns_iq2xs``: 7 stored sign
bits → 8 sign bits, the eighth making the number of minus signs even. Sign bit j set means value j
is negated (``kmask_iq2xs[j] = 1 << j``).

Every layout here has ``vec_dot_type`` Q8_K (``ggml-cpu.c::type_traits_cpu``).
"""

from __future__ import annotations

import numpy as np
from gguf import quants as gguf_quants

from .block import QT, Block, Field


def _grid(cls) -> np.ndarray:
    """gguf's decoded grid of ``cls`` as float32 (entries, 8 or 4) — the values, not the codes."""
    cls.init_grid()
    return np.ascontiguousarray(cls.grid.reshape(cls.grid_shape), dtype=np.float32)


GRID_IQ2XXS = _grid(gguf_quants.IQ2_XXS)  # (256, 8)
GRID_IQ2XS = _grid(gguf_quants.IQ2_XS)  # (512, 8)
GRID_IQ2S = _grid(gguf_quants.IQ2_S)  # (1024, 8)
GRID_IQ3XXS = _grid(gguf_quants.IQ3_XXS)  # (256, 4)
GRID_IQ3S = _grid(gguf_quants.IQ3_S)  # (512, 4)
GRID_IQ1S = _grid(gguf_quants.IQ1_S)  # (2048, 8), values -1, 0, 1
#: ``ksigns_iq2xs``: a 7-bit sign index → the 8 sign bits (bit j set: value j is negative).
KSIGNS = np.frombuffer(gguf_quants.IQ2_XXS.ksigns, dtype=np.uint8).copy()
#: ``IQ1S_DELTA`` = ``IQ1M_DELTA``: the ±shift added to every IQ1 grid value before scaling.
IQ1_DELTA = np.float32(0.125)


class IQ2_XXS(Block):
    """IQ2_XXS — 256 values in 66 bytes (2.06 bits/value): 8 sub-blocks of 32.

    Sub-block ``s`` is the 8 bytes at ``2 + 8s``: four grid indices ``g[0..3]`` (one byte each), then
    a little-endian uint32 ``a`` holding four 7-bit sign indices and a 4-bit scale::

        a = sign_idx0 | sign_idx1 << 7 | sign_idx2 << 14 | sign_idx3 << 21 | scale << 28

    Value ``32s + 8l + j`` = ``d · (0.5 + scale) · 0.25 · iq2xxs_grid[g[l]][j] · (−1 if bit j of
    KSIGNS[sign_idx_l])``::

        byte  0      2                                                          66
              +------+-----------------------------------------------------------+
              | d    | 8 x ( g[4] uint8 | a uint32 LE )                          |
              | f16  | grid indices, then 4 x 7-bit sign index + 4-bit scale     |
              +------+-----------------------------------------------------------+
    """

    qtype = QT.IQ2_XXS
    fields = (Field("d", 0, 2, "f16"), Field("qs", 2, 64, "uint16[32]"))
    vec_dot_type = QT.Q8_K


class IQ2_XS(Block):
    """IQ2_XS — 256 values in 74 bytes (2.31 bits/value): 8 sub-blocks of 32, two scales each.

    ``qs[4s + l]`` (uint16, l = 0..3) = 9-bit index into iq2xs_grid | 7-bit sign index << 9, for
    values ``32s + 8l .. +7``. ``scales[s]``: low nibble for l = 0, 1, high nibble for l = 2, 3.
    Value = ``d · (0.5 + nibble) · 0.25 · grid[j] · sign``::

        byte  0      2                                  66            74
              +------+----------------------------------+-------------+
              | d    | qs[32]                           | scales[8]   |
              | f16  | uint16: grid 9 bits | sign 7 bits| 2 x 4 bits  |
              +------+----------------------------------+-------------+
    """

    qtype = QT.IQ2_XS
    fields = (Field("d", 0, 2, "f16"), Field("qs", 2, 64, "uint16[32]"), Field("scales", 66, 8, "uint8[8]"))
    vec_dot_type = QT.Q8_K


class IQ2_S(Block):
    """IQ2_S — 256 values in 82 bytes (2.56 bits/value): 8 sub-blocks of 32, explicit sign bytes.

    For sub-block ``s`` and group ``l`` (values ``32s + 8l .. +7``): grid index =
    ``qs[4s + l] | ((qh[s] >> 2l) & 3) << 8`` (10 bits into iq2s_grid); sign bits =
    ``signs[4s + l]`` (bit j: value j negative); scale nibble of ``scales[s]`` as in IQ2_XS.
    Value = ``d · (0.5 + nibble) · 0.25 · grid[j] · sign``::

        byte  0      2              34             66        74          82
              +------+--------------+--------------+---------+-----------+
              | d    | qs[32]       | signs[32]    | qh[8]   | scales[8] |
              | f16  | grid low 8   | 8 sign bits  | 4 x 2   | 2 x 4 bits|
              +------+--------------+--------------+---------+-----------+
    """

    qtype = QT.IQ2_S
    fields = (
        Field("d", 0, 2, "f16"),
        Field("qs", 2, 32, "uint8[32]"),
        Field("signs", 34, 32, "uint8[32]"),
        Field("qh", 66, 8, "uint8[8]"),
        Field("scales", 74, 8, "uint8[8]"),
    )
    vec_dot_type = QT.Q8_K


class IQ3_XXS(Block):
    """IQ3_XXS — 256 values in 98 bytes (3.06 bits/value): 8 sub-blocks of 32, grid of 4-value entries.

    ``qs[8s + 2l]`` and ``qs[8s + 2l + 1]`` index iq3xxs_grid for values ``32s + 8l + 0..3`` and
    ``+ 4..7``; the uint32 ``a_s`` at ``66 + 4s`` packs the four 7-bit sign indices and the scale as
    in IQ2_XXS. Value = ``d · (0.5 + scale) · 0.5 · grid[j] · sign``::

        byte  0      2                              66                        98
              +------+------------------------------+-------------------------+
              | d    | qs[64] grid indices          | a[8] uint32 LE          |
              | f16  | uint8                        | 4 x 7-bit signs | scale |
              +------+------------------------------+-------------------------+
    """

    qtype = QT.IQ3_XXS
    fields = (Field("d", 0, 2, "f16"), Field("qs", 2, 64, "uint8[64]"), Field("scales_signs", 66, 32, "uint32[8]"))
    vec_dot_type = QT.Q8_K


class IQ3_S(Block):
    """IQ3_S — 256 values in 110 bytes (3.44 bits/value): 8 sub-blocks of 32, explicit sign bytes.

    For sub-block ``s``, group ``l``: values ``32s + 8l + 0..3`` use grid index
    ``qs[8s + 2l] | ((qh[s] >> 2l) & 1) << 8`` and ``+ 4..7`` use ``qs[8s + 2l + 1] |
    ((qh[s] >> (2l + 1)) & 1) << 8`` (9 bits into iq3s_grid); sign bits ``signs[4s + l]``; scale
    nibble ``(scales[s // 2] >> 4·(s % 2)) & 15``. Value = ``d · (1 + 2·nibble) · grid[j] · sign``::

        byte  0      2                      66       74              106        110
              +------+----------------------+--------+---------------+----------+
              | d    | qs[64]               | qh[8]  | signs[32]     | scales[4]|
              | f16  | grid low 8 bits      | 9th    | 8 sign bits   | 2 x 4    |
              +------+----------------------+--------+---------------+----------+
    """

    qtype = QT.IQ3_S
    fields = (
        Field("d", 0, 2, "f16"),
        Field("qs", 2, 64, "uint8[64]"),
        Field("qh", 66, 8, "uint8[8]"),
        Field("signs", 74, 32, "uint8[32]"),
        Field("scales", 106, 4, "uint8[4]"),
    )
    vec_dot_type = QT.Q8_K


class IQ1_S(Block):
    """IQ1_S — 256 values in 50 bytes (1.56 bits/value): 8 sub-blocks of 32, ternary grid + shift.

    ``qh[s]`` (uint16) = three 3-bit high index parts (bits 3l..3l+2 for group l) | 3-bit scale << 12
    | shift sign << 15. Grid index of group l = ``qs[4s + l] | ((qh[s] >> 3l) & 7) << 8`` (11 bits into
    iq1s_grid). Value = ``d · (2·scale + 1) · (grid[j] + δ)`` with ``δ = −0.125`` if bit 15 is set,
    else ``+0.125``::

        byte  0      2                      34                          50
              +------+----------------------+---------------------------+
              | d    | qs[32]               | qh[8] uint16 LE           |
              | f16  | grid low 8 bits      | 4x3 index | scale | sign  |
              +------+----------------------+---------------------------+
    """

    qtype = QT.IQ1_S
    fields = (Field("d", 0, 2, "f16"), Field("qs", 2, 32, "uint8[32]"), Field("qh", 34, 16, "uint16[8]"))
    vec_dot_type = QT.Q8_K


class IQ1_M(Block):
    """IQ1_M — 256 values in 56 bytes (1.75 bits/value): 16 groups of 16, no separate ``d`` field.

    The f16 super-block scale is spread over the top nibbles of the four uint16 ``sc[0..3]``:
    ``d = f16(sc[0] >> 12 | (sc[1] >> 8) & 0xF0 | (sc[2] >> 4) & 0xF00 | sc[3] & 0xF000)``
    (``iq1m_scale_t``). Their low 12 bits are sixteen 3-bit scales: for sub-block ``s`` (32 values)
    the first 16 values use ``(sc[s//2] >> 6·(s%2)) & 7``, the next 16 ``(sc[s//2] >> 6·(s%2)+3) & 7``.
    Group ``l`` (values ``32s + 8l .. +7``) reads byte ``qh[2s + l//2]``, nibble ``l % 2``: bits 0–2
    = high index bits (index ``qs[4s + l] | bits << 8`` into iq1s_grid), bit 3 = shift sign.
    Value = ``d · (2·scale + 1) · (grid[j] ± 0.125)``::

        byte  0                      32             48                 56
              +----------------------+--------------+------------------+
              | qs[32]               | qh[16]       | scales[8]        |
              | grid low 8 bits      | 2 x (3+1)    | 4 x u16: 4x3 bits|
              |                      | bits         | + d nibble       |
              +----------------------+--------------+------------------+
    """

    qtype = QT.IQ1_M
    fields = (Field("qs", 0, 32, "uint8[32]"), Field("qh", 32, 16, "uint8[16]"), Field("scales", 48, 8, "uint16[4]"))
    vec_dot_type = QT.Q8_K


class TQ1_0(Block):
    """TQ1_0 — 256 ternary values in 54 bytes (1.69 bits/value): base-3 digits, 5 per byte.

    A byte ``b`` holding digits t0..t4 (value ``Σ t_n 3^(4−n)``, stored scaled as ``⌈b·256/243⌉``)
    yields digit n as ``((uint8)(b · 3^n) · 3) >> 8``; value = ``(digit − 1) · d``. Order
    (``dequantize_row_tq1_0``): ``qs[0..31]`` give values 0..159 (digit n of byte m → value
    ``32n + m``), ``qs[32..47]`` give values 160..239 (``160 + 16n + m``), and ``qh[0..3]`` give
    values 240..255 with 4 digits each (digit n of byte m → ``240 + 4n + m``)::

        byte  0                              48        52      54
              +------------------------------+---------+-------+
              | qs[48]                       | qh[4]   | d     |
              | 5 base-3 digits per byte     | 4 each  | f16   |
              +------------------------------+---------+-------+
    """

    qtype = QT.TQ1_0
    fields = (Field("qs", 0, 48, "uint8[48]"), Field("qh", 48, 4, "uint8[4]"), Field("d", 52, 2, "f16"))
    vec_dot_type = QT.Q8_K


class TQ2_0(Block):
    """TQ2_0 — 256 ternary values in 66 bytes (2.06 bits/value): 2 bits per value, ``(q − 1) · d``.

    For chunk ``c = 0, 1`` (32 bytes each) and shift ``l = 0..3``: value ``128c + 32l + m`` is
    ``(qs[32c + m] >> 2l) & 3``, minus 1 (so 0, 1, 2 → −1, 0, +1; 3 would be +2)::

        byte  0                                           64      66
              +-------------------------------------------+-------+
              | qs[64]                                    | d     |
              | 4 x 2-bit per byte                        | f16   |
              +-------------------------------------------+-------+
    """

    qtype = QT.TQ2_0
    fields = (Field("qs", 0, 64, "uint8[64]"), Field("d", 64, 2, "f16"))
    vec_dot_type = QT.Q8_K


#: The layouts of this module, in the order ``kernels.base.blocks`` lists them.
IQ_LAYOUTS = (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, TQ1_0, TQ2_0)
