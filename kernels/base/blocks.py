"""ggml block layouts: one small class per type, with named fields and a byte-layout diagram.

Read next to ``ggml/src/ggml-common.h`` (the ``block_*`` structs) and gguf-py's ``gguf/quants.py``.
The codebook types IQ1_S … IQ3_S and the ternary TQ1_0 / TQ2_0 are in :mod:`kernels.base.blocks_iq`.
A quantized row of ``K`` values is ``K / block_size`` blocks stored back to back; all multi-byte
fields are little-endian; ``f16`` is IEEE binary16. The element formulas here are the *meaning*;
the exact float32 operation order of each dequantizer is in :mod:`kernels.plain.dequant`.

Every class carries

* ``qtype`` — the :class:`gguf.GGMLQuantizationType` (names only; raw ids never appear here),
* ``block_size, type_size`` — values and bytes per block, taken from ``gguf.GGML_QUANT_SIZES``,
* ``fields`` — ``(name, offset, nbytes, ctype)`` in byte order; import checks they tile the block,
* ``vec_dot_type`` — what llama.cpp's CPU ``mul_mat`` converts the activations to before the dot
  product with a weight of this type (``ggml-cpu.c::type_traits_cpu``; used by ``act_quant``).

``layout(qtype)`` returns the class, ``row_bytes(qtype, n_cols)`` the bytes of one row. Unsupported
types raise :class:`ValueError` with a one-line message naming the type.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType

from .block import QK_K, QT, Block, Field  # noqa: F401  (re-exported: the layouts' vocabulary)

# --------------------------------------------------------------------------------------------
# Plain floats (one value per "block")


class F32(Block):
    """F32 — one IEEE binary32 per value (4 bytes). GGUFReader hands out a float32 array."""

    qtype = QT.F32
    fields = (Field("x", 0, 4, "f32"),)
    vec_dot_type = QT.F32


class F16(Block):
    """F16 — one IEEE binary16 per value (2 bytes); float32 conversion is exact.

    GGUFReader hands out a float16 array. Activations are rounded to F16 (nearest even) for the dot.
    """

    qtype = QT.F16
    fields = (Field("x", 0, 2, "f16"),)
    vec_dot_type = QT.F16


class BF16(Block):
    """BF16 — the top 16 bits of a binary32: ``x = float32 bits (u16 << 16)``, exact.

    GGUFReader hands out raw uint8 (2 bytes per value). Activations are rounded to BF16 (nearest
    even, ``ggml_compute_fp32_to_bf16``) for the dot.
    """

    qtype = QT.BF16
    fields = (Field("x", 0, 2, "u16"),)
    vec_dot_type = QT.BF16


# --------------------------------------------------------------------------------------------
# 32-value blocks


class Q8_0(Block):
    """Q8_0 — 32 values in 34 bytes: ``x[j] = qs[j] * d``.

    ::

        byte  0      2                                   34
              +------+-----------------------------------+
              | d    | qs[0] qs[1] ...           qs[31]  |
              | f16  | int8 x 32                         |
              +------+-----------------------------------+
    """

    qtype = QT.Q8_0
    fields = (Field("d", 0, 2, "f16"), Field("qs", 2, 32, "int8[32]"))
    vec_dot_type = QT.Q8_0


class Q4_0(Block):
    """Q4_0 — 32 values in 18 bytes: ``x[j] = (nibble_j - 8) * d``.

    Byte ``qs[j]`` holds value ``j`` in its low nibble and value ``j + 16`` in its high nibble::

        byte  0      2                      18
              +------+----------------------+
              | d    | qs[16]               |   qs[j] = (q[j+16] << 4) | q[j]
              | f16  | uint8 x 16           |
              +------+----------------------+
    """

    qtype = QT.Q4_0
    fields = (Field("d", 0, 2, "f16"), Field("qs", 2, 16, "uint8[16]"))
    vec_dot_type = QT.Q8_0


class Q4_1(Block):
    """Q4_1 — 32 values in 20 bytes: ``x[j] = nibble_j * d + m`` (nibbles as in Q4_0).

    ::

        byte  0      2      4                      20
              +------+------+----------------------+
              | d    | m    | qs[16]               |
              | f16  | f16  | uint8 x 16           |
              +------+------+----------------------+
    """

    qtype = QT.Q4_1
    fields = (Field("d", 0, 2, "f16"), Field("m", 2, 2, "f16"), Field("qs", 4, 16, "uint8[16]"))
    vec_dot_type = QT.Q8_1


class Q5_0(Block):
    """Q5_0 — 32 values in 22 bytes: ``x[j] = ((nibble_j | bit_j(qh) << 4) - 16) * d``.

    ``qh`` is a little-endian uint32 whose bit ``j`` is the 5th bit of value ``j``::

        byte  0      2            6                      22
              +------+------------+----------------------+
              | d    | qh         | qs[16] (as in Q4_0)  |
              | f16  | uint32 LE  | uint8 x 16           |
              +------+------------+----------------------+
    """

    qtype = QT.Q5_0
    fields = (Field("d", 0, 2, "f16"), Field("qh", 2, 4, "uint8[4]"), Field("qs", 6, 16, "uint8[16]"))
    vec_dot_type = QT.Q8_0


class Q5_1(Block):
    """Q5_1 — 32 values in 24 bytes: ``x[j] = (nibble_j | bit_j(qh) << 4) * d + m``.

    ::

        byte  0      2      4            8                      24
              +------+------+------------+----------------------+
              | d    | m    | qh         | qs[16] (as in Q4_0)  |
              | f16  | f16  | uint32 LE  | uint8 x 16           |
              +------+------+------------+----------------------+
    """

    qtype = QT.Q5_1
    fields = (
        Field("d", 0, 2, "f16"),
        Field("m", 2, 2, "f16"),
        Field("qh", 4, 4, "uint8[4]"),
        Field("qs", 8, 16, "uint8[16]"),
    )
    vec_dot_type = QT.Q8_1


class MXFP4(Block):
    """MXFP4 — 32 values in 17 bytes: ``x[j] = K[nibble_j] * 2**(e - 128)``.

    ``K = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]`` is twice the E2M1 values, so
    the scale is half the E8M0 scale ``2**(e - 127)``; it is built bit-exactly, denormal for e < 2
    (``ggml-impl.h::ggml_e8m0_to_fp32_half``). Nibbles are packed as in Q4_0::

        byte  0       1                      17
              +-------+----------------------+
              | e     | qs[16]               |
              | E8M0  | uint8 x 16           |
              +-------+----------------------+
    """

    qtype = QT.MXFP4
    fields = (Field("e", 0, 1, "uint8"), Field("qs", 1, 16, "uint8[16]"))
    vec_dot_type = QT.Q8_0


class IQ4_NL(Block):
    """IQ4_NL — 32 values in 18 bytes: ``x[j] = d * KV[nibble_j]`` (nibbles as in Q4_0).

    ``KV = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]``
    (``kvalues_iq4nl``, a non-linear 16-entry table)::

        byte  0      2                      18
              +------+----------------------+
              | d    | qs[16]               |
              | f16  | uint8 x 16           |
              +------+----------------------+
    """

    qtype = QT.IQ4_NL
    fields = (Field("d", 0, 2, "f16"), Field("qs", 2, 16, "uint8[16]"))
    vec_dot_type = QT.Q8_0


# --------------------------------------------------------------------------------------------
# 256-value super-blocks (K-quants)


class Q2_K(Block):
    """Q2_K — 256 values in 84 bytes: 16 groups of 16, ``x = d*sc_g * q - dmin*m_g``, q in 0..3.

    ``scales[g]`` holds ``sc_g`` (low nibble) and ``m_g`` (high nibble). For half ``n`` (128 values)
    and shift ``s = 0, 2, 4, 6``: value ``128n + 32(s/2) + l`` is ``(qs[32n + l] >> s) & 3``, in
    group ``8n + s + l//16``::

        byte  0              16                     80     82      84
              +--------------+----------------------+------+-------+
              | scales[16]   | qs[64]               | d    | dmin  |
              | m<<4 | sc    | 4 x 2-bit per byte   | f16  | f16   |
              +--------------+----------------------+------+-------+
    """

    qtype = QT.Q2_K
    fields = (
        Field("scales", 0, 16, "uint8[16]"),
        Field("qs", 16, 64, "uint8[64]"),
        Field("d", 80, 2, "f16"),
        Field("dmin", 82, 2, "f16"),
    )
    vec_dot_type = QT.Q8_K


class Q3_K(Block):
    """Q3_K — 256 values in 110 bytes: 16 groups of 16, ``x = d*(sc_g - 32) * q``, q in -4..3.

    ``q = ((qs >> s) & 3) - (4 if the hmask bit is 0 else 0)``: value ``128n + 32(s/2) + l`` takes
    bits ``s, s+1`` of ``qs[32n + l]`` and bit ``4n + s/2`` of ``hmask[l]``. The 16 six-bit scales
    are packed in 12 bytes (low 4 bits, then 2 high bits)::

        scales byte  0..7 : low nibble = sc[0..7] low bits, high nibble = sc[8..15] low bits
        scales byte 8..11 : bits 2k..2k+1 of byte 8+i = sc[4k + i] high bits

        byte  0              32                     96              108     110
              +--------------+----------------------+---------------+-------+
              | hmask[32]    | qs[64]               | scales[12]    | d     |
              | high bits    | 4 x 2-bit per byte   | 16 x 6-bit    | f16   |
              +--------------+----------------------+---------------+-------+
    """

    qtype = QT.Q3_K
    fields = (
        Field("hmask", 0, 32, "uint8[32]"),
        Field("qs", 32, 64, "uint8[64]"),
        Field("scales", 96, 12, "uint8[12]"),
        Field("d", 108, 2, "f16"),
    )
    vec_dot_type = QT.Q8_K


_K_SCALES_DIAGRAM = """
        scales[12] packs 8 six-bit (sc, m) pairs (``get_scale_min_k4``):
          byte 0..3  : EEAAAAAA  sc[0..3] = low 6 bits; top 2 bits = high bits of sc[4..7]
          byte 4..7  : eeaaaaaa  m[0..3]  = low 6 bits; top 2 bits = high bits of m[4..7]
          byte 8..11 : eeeeEEEE  low nibble = low bits of sc[4..7], high nibble = of m[4..7]
"""


class Q4_K(Block):
    """Q4_K — 256 values in 144 bytes: 8 sub-blocks of 32, ``x = d*sc_s * q - dmin*m_s``, q in 0..15.

    For chunk ``c = 0..3``: value ``64c + l`` is ``qs[32c + l] & 15`` (sub-block ``2c``), value
    ``64c + 32 + l`` is ``qs[32c + l] >> 4`` (sub-block ``2c + 1``)::

        byte  0      2       4              16                            144
              +------+-------+--------------+-----------------------------+
              | d    | dmin  | scales[12]   | qs[128]                     |
              | f16  | f16   | 8 x (sc, m)  | two 4-bit values per byte   |
              +------+-------+--------------+-----------------------------+
    """ + _K_SCALES_DIAGRAM

    qtype = QT.Q4_K
    fields = (
        Field("d", 0, 2, "f16"),
        Field("dmin", 2, 2, "f16"),
        Field("scales", 4, 12, "uint8[12]"),
        Field("qs", 16, 128, "uint8[128]"),
    )
    vec_dot_type = QT.Q8_K


class Q5_K(Block):
    """Q5_K — 256 values in 176 bytes: as Q4_K plus a 5th bit, q in 0..31.

    Value ``64c + l`` adds ``16 * bit 2c of qh[l]``, value ``64c + 32 + l`` adds
    ``16 * bit 2c+1 of qh[l]``::

        byte  0      2       4              16           48                        176
              +------+-------+--------------+------------+-------------------------+
              | d    | dmin  | scales[12]   | qh[32]     | qs[128] (as in Q4_K)    |
              | f16  | f16   | 8 x (sc, m)  | 5th bits   |                         |
              +------+-------+--------------+------------+-------------------------+
    """ + _K_SCALES_DIAGRAM

    qtype = QT.Q5_K
    fields = (
        Field("d", 0, 2, "f16"),
        Field("dmin", 2, 2, "f16"),
        Field("scales", 4, 12, "uint8[12]"),
        Field("qh", 16, 32, "uint8[32]"),
        Field("qs", 48, 128, "uint8[128]"),
    )
    vec_dot_type = QT.Q8_K


class Q6_K(Block):
    """Q6_K — 256 values in 210 bytes: 16 groups of 16, ``x = d*sc_g * q``, q in -32..31.

    For half ``n = 0, 1`` (ql offset 64n, qh offset 32n) and ``l = 0..31``, the 6-bit values are
    ``(low 4 bits from ql) | (2 bits from qh) << 4``, minus 32:

    ====================  ====================  ==================
    value                 low 4 bits            high 2 bits
    ====================  ====================  ==================
    ``128n + l``          ``ql[64n+l] & 15``    ``qh[32n+l] >> 0``
    ``128n + l + 32``     ``ql[64n+l+32] & 15`` ``qh[32n+l] >> 2``
    ``128n + l + 64``     ``ql[64n+l] >> 4``    ``qh[32n+l] >> 4``
    ``128n + l + 96``     ``ql[64n+l+32] >> 4`` ``qh[32n+l] >> 6``
    ====================  ====================  ==================

    Group of value ``i`` is ``i // 16``. Note ``d`` comes **last**::

        byte  0                     128              192             208    210
              +---------------------+----------------+---------------+------+
              | ql[128]             | qh[64]         | scales[16]    | d    |
              | low 4 bits          | high 2 bits    | int8 x 16     | f16  |
              +---------------------+----------------+---------------+------+
    """

    qtype = QT.Q6_K
    fields = (
        Field("ql", 0, 128, "uint8[128]"),
        Field("qh", 128, 64, "uint8[64]"),
        Field("scales", 192, 16, "int8[16]"),
        Field("d", 208, 2, "f16"),
    )
    vec_dot_type = QT.Q8_K


class IQ4_XS(Block):
    """IQ4_XS — 256 values in 136 bytes: 8 sub-blocks of 32, ``x = d*(ls_s - 32) * KV[nibble]``.

    ``ls_s = (4 bits of scales_l[s//2] at 4*(s%2)) | (2 bits of scales_h at 2s) << 4``; ``KV`` is
    IQ4_NL's table; in sub-block ``s`` value ``32s + j`` is ``qs[16s + j] & 15`` and value
    ``32s + 16 + j`` is ``qs[16s + j] >> 4``::

        byte  0      2            4              8                            136
              +------+------------+--------------+----------------------------+
              | d    | scales_h   | scales_l[4]  | qs[128]                    |
              | f16  | uint16 LE  | 8 x 4 bits   | two 4-bit indices per byte |
              +------+------------+--------------+----------------------------+
    """

    qtype = QT.IQ4_XS
    fields = (
        Field("d", 0, 2, "f16"),
        Field("scales_h", 2, 2, "uint8[2]"),
        Field("scales_l", 4, 4, "uint8[4]"),
        Field("qs", 8, 128, "uint8[128]"),
    )
    vec_dot_type = QT.Q8_K


# --------------------------------------------------------------------------------------------
# Activation-only formats (what mul_mat quantizes the activations to; never stored in a GGUF here)


class Q8_1(Block):
    """Q8_1 — 32 activations in 36 bytes: ``x[j] = qs[j] * d``; ``s = d * sum(qs)`` (both f16).

    ``s`` lets the Q4_1/Q5_1 dot add the weight minimum ``m`` as ``m * s``::

        byte  0      2      4                                   36
              +------+------+-----------------------------------+
              | d    | s    | qs[32]                            |
              | f16  | f16  | int8 x 32                         |
              +------+------+-----------------------------------+
    """

    qtype = QT.Q8_1
    fields = (Field("d", 0, 2, "f16"), Field("s", 2, 2, "f16"), Field("qs", 4, 32, "int8[32]"))
    vec_dot_type = QT.Q8_1
    weight = False


class Q8_K(Block):
    """Q8_K — 256 activations in 292 bytes: ``x[j] = qs[j] * d`` with a **float32** ``d``.

    ``bsums[g]`` is the sum of ``qs`` over the 16-group ``g``; the K-quant dots use it for the
    ``dmin * m`` correction::

        byte  0      4                                   260                   292
              +------+-----------------------------------+---------------------+
              | d    | qs[256]                           | bsums[16]           |
              | f32  | int8 x 256                        | int16 x 16          |
              +------+-----------------------------------+---------------------+
    """

    qtype = QT.Q8_K
    fields = (Field("d", 0, 4, "f32"), Field("qs", 4, 256, "int8[256]"), Field("bsums", 260, 32, "int16[16]"))
    vec_dot_type = QT.Q8_K
    weight = False


# The codebook types (IQ1_S … IQ3_S) and the ternary TQ1_0 / TQ2_0 live in their own file with their
# grid tables (built on kernels/base/block.py's Block and Field, as these are).
from .blocks_iq import IQ_LAYOUTS  # noqa: E402

_LAYOUTS: dict[GGMLQuantizationType, type[Block]] = {
    cls.qtype: cls
    for cls in (
        F32, F16, BF16,
        Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, MXFP4, IQ4_NL,
        Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS,
        *IQ_LAYOUTS,
        Q8_1, Q8_K,
    )
}  # fmt: skip

#: Weight types this package can dequantize and multiply (every layout except Q8_1 / Q8_K).
WEIGHT_TYPES: tuple[GGMLQuantizationType, ...] = tuple(q for q, cls in _LAYOUTS.items() if cls.weight)


def _type_name(qtype) -> str:
    try:
        return GGMLQuantizationType(qtype).name
    except ValueError:
        return f"unknown ggml type {qtype!r}"


def layout(qtype: GGMLQuantizationType) -> type[Block]:
    """The block layout class of ``qtype``; ``ValueError`` naming the type if it is not supported."""
    try:
        return _LAYOUTS[qtype]  # a type code or either enum's member (an IntEnum hashes as its int): no enum call
    except (KeyError, TypeError):
        pass
    try:
        return _LAYOUTS[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        supported = ", ".join(q.name for q in _LAYOUTS)
        raise ValueError(f"unsupported ggml type {_type_name(qtype)} (supported: {supported})") from None


def weight_layout(qtype: GGMLQuantizationType) -> type[Block]:
    """Like :func:`layout`, but only for types that can hold weights (not Q8_1 / Q8_K)."""
    cls = layout(qtype)
    if not cls.weight:
        supported = ", ".join(q.name for q in WEIGHT_TYPES)
        raise ValueError(
            f"ggml type {cls.qtype.name} is an activation-only format, not a weight type (supported: {supported})"
        )
    return cls


def row_bytes(qtype: GGMLQuantizationType, n_cols: int) -> int:
    """Bytes of one row of ``n_cols`` values; ``ValueError`` unless ``n_cols`` is a whole number of blocks."""
    cls = layout(qtype)
    if n_cols < 0 or n_cols % cls.block_size:
        raise ValueError(
            f"a {cls.qtype.name} row must hold a multiple of {cls.block_size} values, got {n_cols}"
        )
    return n_cols // cls.block_size * cls.type_size
