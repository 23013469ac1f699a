"""The report of ``refimpl trace --against`` (refimpl.oracle.trace_against): per position the first departing
intermediate with its difference and bound, the departing ones after it (downstream), a routing near-tie named as
one; as text and as JSON."""

from __future__ import annotations

import numpy as np

from refimpl.oracle.trace_against import BOUNDS, Diff, PositionResult, Report, base_name


def _fmt(x: float) -> str:
    return "inf" if not np.isfinite(x) else f"{x:.3g}"


def _describe(d: Diff) -> str:
    if d.detail and d.bound == 0:
        return f"{d.detail}, max |Δ| {_fmt(d.max_abs)} = {_fmt(d.rel)} × {d.scale}; bound 0 (bit for bit)"
    return f"max |Δ| {_fmt(d.max_abs)} = {_fmt(d.rel)} × {d.scale}; bound {d.bound:g}" + (f" ({d.detail})" if d.detail else "")


ROUTED = ("ffn_moe_weights_norm", "ffn_moe_swiglu")  # the selected experts' values: another choice, other experts


def routing_note(p: PositionResult, first: Diff) -> str:
    """When the first departure is of the selected experts while the router logits of that layer are within bound:
    the two sides chose different experts at a near-tie of the router (without emulation, end to end, likely noise)."""
    base = base_name(first.name)
    if base not in ROUTED:
        return ""
    logits = next((d for d in p.diffs if d.name == "ffn_moe_logits" + first.name[len(base):]), None)
    if logits is None or logits.departs:
        return ""
    return (f"the experts chosen differ while {logits.name} is within its bound: a routing near-tie "
            "(--emulate rounds the router's input as llama.cpp does; a layer-local array dump runs the engine's choice)")


def format_report(r: Report) -> str:
    n_names = len(r.positions[0].diffs) if r.positions else 0
    lines = [f"trace against {r.dump.path} ({r.dump.format}): {n_names} intermediates compared; numerics: {r.numerics}"]
    kinds = {"sums": ["text"], "end to end": ["array-end-to-end"], "layer-local": ["array", "array-f16-attention"]}
    bound_keys = [(r.config, k) for k in kinds.get(r.mode, ["array"]) if (r.config, k) in BOUNDS] or [(r.config, "array")]
    lines.append("bounds: " + "; ".join(f"{k[1]} {BOUNDS[k].value:g} × {BOUNDS[k].scale}" for k in bound_keys))
    if r.mode == "layer-local":
        lines.append(f"layer-local: refimpl ran from the engine's own values at {len(r.patched)} intermediates "
                     "(quantized matmuls' inputs, router logits, layer outputs)")
    elif r.mode == "end to end":
        lines.append(f"end to end: the dump lacks {len(r.unpatched)} intermediates refimpl would run from "
                     f"({', '.join(r.unpatched[:4])}{', …' if len(r.unpatched) > 4 else ''}); refimpl ran on from its own values there")
    elif r.mode == "sums":
        lines.append(f"only sums (and the values llama-eval-callback printed) were compared, per tensor over positions "
                     f"{r.positions[0].label}; {len(r.skipped)} printed tensors are not compared by refimpl")
    if r.skipped and r.mode != "sums":
        lines.append(f"not compared: {', '.join(r.skipped[:6])}{', …' if len(r.skipped) > 6 else ''} (llama.cpp's names of "
                     "ops refimpl does not trace in those layers)")
    first_any = None
    for p in r.positions:
        dep = p.departing
        if not dep:
            lines.append(f"position {p.label}: no departure ({len(p.diffs)} intermediates within bound)")
            continue
        first_any = first_any or dep[0].name
        down = [d.name for d in dep[1:]]
        note = routing_note(p, dep[0])
        lines.append(f"position {p.label}: departs at {dep[0].name}: {_describe(dep[0])}" + (f" — {note}" if note else "")
                     + (f"; downstream: {len(down)} more ({', '.join(down[:6])}{', …' if len(down) > 6 else ''})" if down else ""))
    n_dep = sum(1 for p in r.positions if p.departing)
    lines.append(f"result: {len(r.positions)} position{'s' if len(r.positions) != 1 else ''}, {n_dep} departing"
                 + (f", first at {first_any}" if first_any else "") + f" → exit {r.exit_code}")
    return "\n".join(lines)


def report_json(r: Report) -> dict:
    bounds = {k[1]: {"bound": b.value, "scale": b.scale, "source": b.source} for k, b in BOUNDS.items() if k[0] == r.config}
    return {
        "dump": str(r.dump.path), "format": r.dump.format, "numerics": r.numerics, "configuration": r.config,
        "mode": r.mode, "bounds": bounds, "patched": r.patched, "unpatched": r.unpatched, "skipped": r.skipped,
        "positions": [{"position": p.label, "compared": len(p.diffs),
                       "first": p.departing[0].json() | ({"note": routing_note(p, p.departing[0])}
                                                          if routing_note(p, p.departing[0]) else {})
                       if p.departing else None,
                       "downstream": [d.json() for d in p.departing[1:]]} for p in r.positions],
        "exit_code": r.exit_code,
    }
