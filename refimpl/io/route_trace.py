"""``run --route-trace FILE``: every routing decision of a run, one CSV row per (position, layer).

The expert streamer (:mod:`refimpl.io.streamer`) sees each moe_ffn batch's routing before it reads a
slice and hands it to :class:`RouteTrace` as a :class:`~refimpl.io.streamer.Routes` record; each of the
batch's T rows becomes one CSV row. Columns:

=============  ===============================================================================
``pass``       index of the declared forward pass (0, 1, …, in call order); the rows of one
               verify batch, or of one MTP draft step, share it. -1 outside any declared pass
``phase``      ``prompt`` | ``decode`` | ``verify`` | ``mtp`` | ``other`` (docs/streamer.md)
``kind``       ``trunk`` or ``head`` (the MTP block's MoE)
``row``        the row within the batch (0 … T−1)
``position``   sequence position of that row (-1 if the caller declared none)
``layer``      block index il (the head is il = n_layer)
``expert_i``   i = 0 … K−1: the selected expert ids in selection order (descending probability)
``weight_i``   their renormalised routing weights, float32 printed with 9 significant digits
               (``np.float32(s)`` gives the computed value back exactly)
=============  ===============================================================================

Rows are in the order the model computed them: for each pass, layer by layer, and rows of a batch
in order. Drafting appears as ``mtp`` passes, their catch-up as one ``mtp`` pass over the batch.

    import pandas as pd; t = pd.read_csv("routes.csv")
    t[(t.kind == "trunk") & (t.layer == 0)]      # the first layer's route for every trunk row
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from refimpl.errors import RefimplError
from refimpl.io.streamer import Routes


def columns(n_used: int) -> list[str]:
    return (["pass", "phase", "kind", "row", "position", "layer"] + [f"expert_{i}" for i in range(n_used)]
            + [f"weight_{i}" for i in range(n_used)])


class RouteTrace:
    """A CSV route-trace writer; call it with a :class:`Routes` record (the streamer's ``on_route``)."""

    def __init__(self, path, n_used: int):
        self.path, self.n_used, self.n_rows = Path(path), n_used, 0
        try:
            self._f = open(self.path, "w", newline="", encoding="utf-8")
        except OSError as exc:
            raise RefimplError(f"cannot write route trace {self.path}: {exc.strerror or exc}") from None
        self._w = csv.writer(self._f, lineterminator="\n")
        self._w.writerow(columns(n_used))

    def __call__(self, r: Routes) -> None:
        kind = "head" if r.head else "trunk"
        for t in range(r.sel.shape[0]):
            ids = [int(e) for e in r.sel[t]]
            ws = [format(float(w), ".9g") for w in r.weights[t]]
            self._w.writerow([r.pass_index, r.phase, kind, t, int(r.positions[t]), r.layer, *ids, *ws])
            self.n_rows += 1

    def close(self) -> None:
        self._f.close()


def read_route_trace(path) -> list[dict]:
    """The rows of a route-trace CSV: ints for the index columns, ``experts`` (list of int) and
    ``weights`` (list of floats, each the exact float32 value written)."""
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        for rec in csv.DictReader(f):
            k = sum(1 for key in rec if key.startswith("expert_"))
            out.append({
                "pass": int(rec["pass"]), "phase": rec["phase"], "kind": rec["kind"], "row": int(rec["row"]),
                "position": int(rec["position"]), "layer": int(rec["layer"]),
                "experts": [int(rec[f"expert_{i}"]) for i in range(k)],
                "weights": [float(np.float32(rec[f"weight_{i}"])) for i in range(k)],
            })
    return out
