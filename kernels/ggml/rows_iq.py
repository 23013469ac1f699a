"""``ggml_get_rows`` of the codebook types IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, bit for bit.

ggml-cpu's ``get_rows_q`` calls ``ggml-quants.c: dequantize_row_*`` of **libggml-base**, built without ISA
flags in both builds (SSE2: no FMA contraction), so every value is rounded as written in C, left to right:

* IQ2_XXS / IQ2_XS / IQ2_S: ``db = (d·(0.5 + ls))·0.25``; value ``(db·grid[j])·(±1)``;
* IQ3_XXS: ``db = (d·(0.5 + ls))·0.5``; IQ3_S: ``db = d·float(1 + 2·ls)``; value ``(db·grid[j])·(±1)``;
* IQ1_S / IQ1_M: ``dl = d·float(2·ls + 1)``; value ``dl·(float(grid[j]) + δ)``, ``δ = ±0.125``.

``d`` is ``GGML_FP16_TO_FP32`` of the stored half (IQ1_M: the half scattered over the top nibbles of its
four scale words), converted like ggml (:data:`kernels.ggml.vecmath.F16_TO_F32`: a NaN keeps its payload and
sign), and the ±1 is a float multiply (a NaN times -1.0 keeps its sign on x86), never a sign flip. The
integers (grid values, signs, sub-block scales) come from :func:`kernels.ggml.mulmat_iq.decode_row`.
"""

from __future__ import annotations

import numpy as np

from kernels.base.block import QT
from kernels.base.flags import jit
from kernels.ggml.mulmat_iq import IQ_TYPES, KIND, decode_row


@jit()
def _deq_rows(kind, src, y, tab):
    K = y.shape[1]
    v, e = np.empty(K, np.int64), np.zeros(K, np.int64)
    sc, d = np.empty(K // 16, np.int64), np.empty(K // 256, np.float32)
    for r in range(src.shape[0]):
        decode_row(kind, src[r], v, e, sc, d, tab)
        for s in range(K // 16):
            ds = d[s // 16]
            ls = (sc[s] - 1) // 2
            if kind <= 2:
                db = (ds * (np.float32(0.5) + np.float32(ls))) * np.float32(0.25)
            elif kind == 3:
                db = (ds * (np.float32(0.5) + np.float32(ls))) * np.float32(0.5)
            else:  # IQ3_S, IQ1_S, IQ1_M: d * (1 + 2*ls), the integer formed first
                db = ds * np.float32(sc[s])
            for k in range(16 * s, 16 * s + 16):
                if kind >= 5:
                    y[r, k] = db * (np.float32(v[k]) + np.float32(0.125) * np.float32(e[k]))  # grid + ±IQ1S_DELTA
                else:
                    m = np.float32(v[k]) if v[k] >= 0 else np.float32(-v[k])  # the grid magnitude
                    y[r, k] = (db * m) * (np.float32(-1.0) if v[k] < 0 else np.float32(1.0))


def decoder(qtype):
    """``(rows [n, row bytes] uint8, y [n, K] float32, tab)`` -> fills ``y``: the decoder
    :func:`kernels.ggml.rows.get_rows` calls for an IQ1/2/3 type."""
    kind = KIND[QT(qtype)]
    return lambda src, y, tab: _deq_rows(kind, src, y, tab)


DECODERS = {t: decoder(t) for t in sorted(IQ_TYPES)}  # what kernels.ggml.rows._DECODERS takes for these types
