"""The ggml block record every layout of :mod:`kernels.base.blocks` and :mod:`kernels.base.blocks_iq` is
declared with: :class:`Field` (one named field of a block) and :class:`Block` (the base class that takes
``block_size`` / ``type_size`` from gguf-py and checks that the fields tile the block)."""

from __future__ import annotations

from typing import NamedTuple

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

QT = GGMLQuantizationType
QK_K = 256  # values per K-quant super-block


class Field(NamedTuple):
    name: str
    offset: int  # byte offset inside the block
    nbytes: int
    ctype: str  # C type of one element, e.g. "f16", "uint8[32]"


class Block:
    """Base class: subclasses declare ``qtype``, ``fields`` and ``vec_dot_type``."""

    qtype: GGMLQuantizationType
    block_size: int
    type_size: int
    fields: tuple[Field, ...]
    vec_dot_type: GGMLQuantizationType
    weight: bool = True  # False for the activation-only formats Q8_1 and Q8_K

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.block_size, cls.type_size = GGML_QUANT_SIZES[cls.qtype]
        if cls.qtype == QT.Q8_1:
            # gguf 0.19.0 still lists Q8_1 as (32, 40), an old float layout; ggml's block_q8_1 has
            # two f16 (d, s) and is 36 bytes (sizeof(block_q8_1) in ggml-common.h).
            cls.type_size = 36
        end = 0
        for f in cls.fields:
            assert f.offset == end, f"{cls.__name__}.{f.name}: fields must tile the block"
            end += f.nbytes
        assert end == cls.type_size, f"{cls.__name__}: fields cover {end} of {cls.type_size} bytes"
