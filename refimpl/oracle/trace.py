"""Recording named intermediates: the oracle side of a layer-by-layer diff against llama.cpp.

``Recorder`` is a ``Ctx.trace`` hook. Each ``cb(name, il, x)`` is stored under llama.cpp's tensor
name — ``name-il`` for il ≥ 0, ``name`` for model-level tensors (``src/llama-context.cpp``
``graph_get_cb``) — as an array whose first axis is the position. When the same name is recorded
by several forward calls (one token at a time), the rows are concatenated in call order.

``Patcher`` records the same way and also *substitutes*: for the names it is given values for, the
forward pass continues from those values instead of its own (activation patching). Fed llama.cpp's
captured intermediates (tests/llama_trace.py) at every activation-quantization site, each segment of
refimpl between two rounding points runs from llama.cpp's own input — the layer-local conformance
test of tests/conformance.py.
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


class Patcher(Recorder):
    """A :class:`Recorder` (of ``names``, or of everything) that hands back ``values[name]`` — rows
    [T, n] in position order, consumed across forward calls in call order — in place of the value
    computed for ``name``. What was computed is recorded first, so ``arrays()`` holds refimpl's own
    value of each patched name, from the patched values upstream of it."""

    def __init__(self, values: dict[str, np.ndarray], names: set[str] | None = None):
        super().__init__(None if names is None else set(names) | set(values))
        self.values = values
        self._used: dict[str, int] = {}  # name -> rows handed out so far

    def __call__(self, name: str, il: int, x: np.ndarray) -> np.ndarray | None:
        super().__call__(name, il, x)
        key = tensor_name(name, il)
        if key not in self.values:
            return None
        start, n = self._used.get(key, 0), np.shape(x)[0]
        rows = self.values[key][start : start + n]
        if rows.shape[0] != n:
            raise ValueError(f"Patcher: {key} has {self.values[key].shape[0]} rows, asked for rows {start}..{start + n - 1}")
        self._used[key] = start + n
        return np.ascontiguousarray(rows, dtype=np.asarray(x).dtype).reshape(np.shape(x))
