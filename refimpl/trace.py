"""Recording named intermediates: the oracle side of a layer-by-layer diff against llama.cpp.

``Recorder`` is a ``Ctx.trace`` hook. Each ``cb(name, il, x)`` is stored under llama.cpp's tensor
name — ``name-il`` for il ≥ 0, ``name`` for model-level tensors (``src/llama-context.cpp``
``graph_get_cb``) — as an array whose first axis is the position. When the same name is recorded
by several forward calls (one token at a time), the rows are concatenated in call order.
"""

from __future__ import annotations

import numpy as np


def tensor_name(name: str, il: int) -> str:
    return f"{name}-{il}" if il >= 0 else name


class Recorder:
    def __init__(self, names: set[str] | None = None):
        self.names = names
        self._rows: dict[str, list[np.ndarray]] = {}

    def __call__(self, name: str, il: int, x: np.ndarray) -> None:
        key = tensor_name(name, il)
        if self.names is not None and key not in self.names:
            return
        x = np.asarray(x)
        self._rows.setdefault(key, []).append(x.reshape(x.shape[0], -1).copy())

    def arrays(self) -> dict[str, np.ndarray]:
        """name -> [T, n] (each position's values flattened)."""
        return {k: np.concatenate(v) for k, v in self._rows.items()}
