"""Random GGUF rows of any supported type, with controlled scales (for tests and benchmarks).

gguf 0.19.0 cannot quantize most K-quants, and fully random bytes make f16 scales that are often
huge, inf or NaN. :func:`random_rows` therefore draws random bytes for the quant fields and writes
every ``f16`` scale field (found by name in :mod:`kernels.base.blocks`), the MXFP4 exponent and IQ1_M's
scattered f16 scale with values from a chosen regime:

* ``"normal"``: magnitudes spread over 2**-12 .. 2**-4, either sign — typical weights;
* ``"extreme"``: a mix of 0, ±f16 subnormals, ±65504 (f16 max), tiny and huge normals, and normal
  values (for MXFP4: exponents 0, 1, 2, 127, 128, 250); still finite after dequantization;
* ``"raw"``: the random bytes as drawn (may dequantize to inf / NaN).
"""

from __future__ import annotations

import numpy as np

from kernels.base.blocks import QT, weight_layout

_EXTREME_F16 = np.array(
    [0.0, -0.0, 2.0**-24, -(2.0**-24), 3 * 2.0**-24, 2.0**-14, 65504.0, -65504.0, 1.0, -1.0, 2.0**-10, 0.5, 1e-3, -7.5],
    dtype=np.float16,
)


def random_rows(qtype, n_rows: int, n_cols: int, rng: np.random.Generator, scales: str = "normal") -> np.ndarray:
    """(n_rows, row bytes) uint8 rows of ``qtype`` (for F32/F16: float32/float16 (n_rows, n_cols))."""
    cls = weight_layout(qtype)
    if n_cols % cls.block_size:
        raise ValueError(f"n_cols={n_cols} is not a multiple of the {cls.qtype.name} block size {cls.block_size}")
    if scales not in ("normal", "extreme", "raw"):
        raise ValueError(f"scales must be 'normal', 'extreme' or 'raw', got {scales!r}")
    if cls.qtype in (QT.F32, QT.F16, QT.BF16):
        x = rng.standard_normal((n_rows, n_cols)).astype(np.float32)
        if scales == "extreme":  # wide exponents, still finite in the type (f16 max 65504)
            lo, hi = (-24, 12) if cls.qtype == QT.F16 else (-60, 60)
            x *= np.float32(2.0) ** rng.integers(lo, hi, x.shape).astype(np.float32)
        if cls.qtype == QT.F32:
            return x
        if cls.qtype == QT.F16:
            return x.astype(np.float16)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n_rows, 2 * n_cols)  # truncated

    raw = rng.integers(0, 256, (n_rows, n_cols // cls.block_size * cls.type_size), dtype=np.uint8)
    if scales != "raw":
        set_scales(raw, cls.qtype, rng, scales)
    return raw


def _f16_scales(rng: np.random.Generator, n: int, scales: str) -> np.ndarray:
    """n float16 scales of the ``scales`` regime ("normal" or "extreme")."""
    if scales == "normal":
        mag = 2.0 ** rng.uniform(-12, -4, n)
        return (mag * rng.choice([-1.0, 1.0], n)).astype(np.float16)
    return rng.choice(_EXTREME_F16, n)


def set_scales(raw: np.ndarray, qtype, rng: np.random.Generator, scales: str = "normal") -> None:
    """Overwrite, in place, the f16 scale fields (MXFP4 exponents, IQ1_M's split scale) of quantized rows ``raw``
    (uint8, C-contiguous, last axis = row bytes) with values of the ``scales`` regime."""
    cls = weight_layout(qtype)
    blocks = raw.reshape(-1, cls.type_size, copy=False)  # a view: every block of every row
    n = blocks.shape[0]
    for field in cls.fields:
        if field.ctype == "f16":
            vals = _f16_scales(rng, n, scales)
            blocks[:, field.offset : field.offset + 2] = vals.view(np.uint8).reshape(n, 2)
        elif cls.qtype == QT.IQ1_M and field.name == "scales":
            # IQ1_M keeps its f16 scale in the top nibbles of four uint16 (blocks_iq.IQ1_M): nibble k
            # of the f16 bits goes to bits 12..15 of sc[k]; the 3-bit sub-scales below stay random.
            bits = _f16_scales(rng, n, scales).view(np.uint16).astype(np.uint16)
            sc = blocks[:, field.offset : field.offset + 8].copy().view(np.uint16)  # (n, 4)
            for k in range(4):
                sc[:, k] = (sc[:, k] & np.uint16(0x0FFF)) | (((bits >> np.uint16(4 * k)) & np.uint16(15)) << np.uint16(12))
            blocks[:, field.offset : field.offset + 8] = sc.view(np.uint8)
        elif cls.qtype == QT.MXFP4 and field.name == "e":
            choices = np.arange(118, 130) if scales == "normal" else np.array([0, 1, 2, 127, 128, 250])
            blocks[:, field.offset] = rng.choice(choices, n).astype(np.uint8)
