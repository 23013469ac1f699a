"""The bug-class table of docs/bug-classes.md, measured: each injected fault run on each model, its
stream audited against the oracle, its acceptance compared with the clean loop's.

One function measures one (model, fault) cell (:func:`measure`); :func:`measure_all` fills the
table; :func:`markdown` prints it. tests/test_bug_classes.py asserts the table's claims from the
same measurements and that docs/bug-classes.md holds exactly this table, so the page and the test
cannot drift apart. Regenerate the page's table with::

    python -m refimpl.inject.fault_table --write docs/bug-classes.md

Every run is the speculative loop at ``--draft 3`` for 64 tokens (:data:`N_PREDICT`) after the
model's prompt; :data:`SCENARIOS` names the few faults that need another run to be reached at all.
A new model is one more entry in :data:`MODELS`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from refimpl.inject.faults import FAULTS, Faults

N_PREDICT = 64  # tokens generated per run: "flagged within 64 tokens"
N_DRAFT = 3



@dataclass(frozen=True)
class Case:
    """A model of the table: its MODEL argument, the prompt every run decodes, and the prompt a
    state-leak run decodes first in the same process. The prompt has 5 ids: the prompt batch is then
    4 = 1 + N_DRAFT tokens long, the length that reaches prefill-as-verify."""

    spec: str
    prompt: list[int]
    earlier: tuple[int, ...]


MODELS: dict[str, Case] = {
    "kjv": Case("builtin:kjv", [1063, 356, 473, 289, 600],  # "And it came to pass"
                (73, 110, 258, 1786, 1247, 390, 279, 556, 282)),  # "In the beginning God created"
    "tiny": Case("builtin:tiny", [11, 42, 7, 300, 5], (3, 4, 5, 6)),
    "predictable": Case("builtin:predictable", [41, 212, 197, 248, 60], (3, 4, 5, 6)),
}


@dataclass(frozen=True)
class Scenario:
    """How a fault's run is made: the draft source and its gate, and whether the model's earlier
    prompt is decoded first in the same process (for state-leak)."""

    source: str = "mtp"
    ngram_min_match: int = 3
    after_earlier: bool = False

    @property
    def flags(self) -> str:
        f = f"--{self.source} --draft {N_DRAFT}" + (f" --ngram-min-match {self.ngram_min_match}" if self.source == "ngram" else "")
        return f + ("; the model's earlier prompt decoded first" if self.after_earlier else "")


# The faults the table measures: every one but pretok-gpt2 (B20), which acts on prompt text before
# any id exists; tests/test_bug_classes.py checks that the audit refuses its stream's prompt ids.
TABLE_FAULTS = [name for name, f in FAULTS.items() if f.point != "tokenizer.split"]

DEFAULT = Scenario()
SCENARIOS: dict[str, Scenario] = {
    # needs a step that drafts nothing right after one that accepted: the n-gram source drafts only
    # where the last token recurs (MTP always drafts, and tiny's head is never right)
    "plain-step-stale": Scenario(source="ngram", ngram_min_match=1),
    # needs a second sequence in the same process
    "state-leak": Scenario(after_earlier=True),
    # acts on one-token decodes only: the n-gram source leaves rounds without drafts (MTP has none)
    "plain-state-f16": Scenario(source="ngram", ngram_min_match=1),
}


@dataclass
class Cell:
    """One fault on one model."""

    fault: str
    model: str
    flags: str
    changed: bool  # the stream differs from the clean loop's
    first_divergence: int | None  # first step where it differs
    verdict: str  # refimpl audit's verdict at the first divergence from the oracle (clean, near-tie, A wrong)
    first_wrong: int | None  # first step the audit calls wrong (divergence or later departure)
    exit_code: int  # refimpl audit's exit status
    accepted: tuple[int, int]  # (accepted, drafted) with the fault
    accepted_clean: tuple[int, int]  # (accepted, drafted) of the clean loop, same scenario
    extra: dict = field(default_factory=dict)  # more columns (the round audit's)

    @property
    def flagged(self) -> bool:
        return self.exit_code != 0


def _acceptance(stats) -> tuple[int, int]:
    return stats.n_accepted, stats.n_drafted


def run(model, case: Case, faults: Faults, scenario: Scenario = DEFAULT):
    """(tokens, stats) of the speculative loop on ``case.prompt`` with ``faults`` (a fresh record per
    call)."""
    from refimpl.model.ops import Ctx
    from refimpl.decode.speculative import speculative_generate

    ctx = Ctx(faults=faults)
    kw = dict(source=scenario.source, n_draft=N_DRAFT, ngram_min_match=scenario.ngram_min_match)
    if scenario.after_earlier:
        speculative_generate(model, list(case.earlier), 16, ctx, **kw)
    return speculative_generate(model, case.prompt, N_PREDICT, ctx, **kw)


def audit_stream(model, prompt: list[int], tokens: list[int]):
    """``refimpl audit MODEL STREAM``: the stream against the oracle's greedy stream."""
    from refimpl.oracle.audit import Stream, audit

    return audit(model, prompt, Stream("A", "run", "json", list(tokens)))


def first_wrong(rep) -> int | None:
    events = rep.findings + ([rep.divergence] if rep.divergence else [])
    return min((f.step for f in events if not f.benign), default=None)


def measure(model, model_name: str, case: Case, fault: str | None, clean_runs: dict | None = None,
            memo: dict | None = None) -> Cell:
    """One cell; ``fault`` None measures the clean loop itself. ``clean_runs`` caches the clean loop's
    run per scenario; ``memo`` the audits of streams already judged (many faults leave the run unchanged)."""
    scenario, prompt = SCENARIOS.get(fault, DEFAULT), case.prompt
    clean_runs = {} if clean_runs is None else clean_runs
    memo = {} if memo is None else memo
    if scenario not in clean_runs:
        clean_runs[scenario] = run(model, case, Faults(), scenario)
    clean, clean_stats = clean_runs[scenario]
    tokens, stats = run(model, case, Faults.of(fault) if fault else Faults(), scenario)
    div = next((i for i, (a, b) in enumerate(zip(tokens, clean)) if a != b), None)
    if div is None and len(tokens) != len(clean):
        div = min(len(tokens), len(clean))
    key = (tuple(prompt), tuple(tokens))
    if key not in memo:
        memo[key] = audit_stream(model, prompt, tokens)
    rep = memo[key]
    cell = Cell(fault or "(clean loop)", model_name, scenario.flags, tokens != clean, div, rep.verdict, first_wrong(rep),
                rep.exit_code, _acceptance(stats), _acceptance(clean_stats))
    rounds = stats.rounds()
    key = (tuple(prompt), tuple(tokens), repr(rounds))
    if scenario.source == "mtp" and key not in memo:
        memo[key] = rounds_cells(model, prompt, tokens, rounds)
    cell.extra["rounds: ids"], cell.extra["rounds: counts"] = memo[key] if scenario.source == "mtp" else ("—", "—")
    return cell


def rounds_cells(model, prompt: list[int], tokens: list[int], rounds: list[dict]) -> tuple[str, str]:
    """The round audit (refimpl.oracle.rounds) of one run's rounds, with the draft ids logged and with only the
    accepted/drafted counts (one replay judged twice): ``verdict, wrong/differing of rounds → exit``."""
    from refimpl.oracle.rounds import judge_rounds, replay_rounds, rounds_from_json, without_ids

    info, replayed = replay_rounds(model, prompt, tokens, rounds_from_json({"rounds": rounds, "spec_draft_max": N_DRAFT}, "run"))
    return tuple(_rounds_text(judge_rounds(i, replayed)) for i in (info, without_ids(info)))


def _rounds_text(rr) -> str:
    t = rr.totals()
    verdict = f"**{rr.verdict}**" if rr.verdict == "wrong" else rr.verdict
    return f"{verdict}, {t['wrong']}/{t['differ']} of {t['rounds']} → {rr.exit_code}"


def measure_all(models: dict | None = None, faults=None, progress=None) -> list[Cell]:
    """Every fault (and the clean loop, first) on every model."""
    from refimpl.fixtures.builtin import resolve_model
    from refimpl.model.trunk import load_model

    cells = []
    for name, case in (models or MODELS).items():
        model, clean_runs, memo = load_model(resolve_model(case.spec)), {}, {}
        for fault in [None] + list(faults or TABLE_FAULTS):
            cells.append(measure(model, name, case, fault, clean_runs, memo))
            if progress:
                progress(cells[-1])
    return cells


# ---- the table -----------------------------------------------------------------------------------


def _pct(acc: tuple[int, int]) -> str:
    return f"{100 * acc[0] / acc[1]:.1f} %" if acc[1] else "—"


def columns(c: Cell) -> list[str]:
    """The cell's three columns: the stream against the clean loop's, the audit, the acceptance."""
    stream = f"changed at {c.first_divergence}" if c.changed else "unchanged"
    audit = f"**{c.verdict}**" if c.verdict == "A wrong" else c.verdict
    if c.first_wrong is not None and c.verdict != "A wrong":
        audit += f", wrong at {c.first_wrong}"
    audit += f" → {c.exit_code}"
    acc = _pct(c.accepted) if c.accepted == c.accepted_clean else f"{_pct(c.accepted_clean)} → {_pct(c.accepted)}"
    return [stream, audit, acc] + [str(v) for v in c.extra.values()]


def markdown(cells: list[Cell]) -> str:
    """The tables, one per model: one row per fault with the stream, the audit's verdict and exit
    status, the acceptance (and any extra columns)."""
    by = {(c.fault, c.model): c for c in cells}
    faults = list(dict.fromkeys(c.fault for c in cells))
    head = ["fault", "class", "run", "stream", "audit → exit", "acceptance"] + list(cells[0].extra)
    out = []
    for m in dict.fromkeys(c.model for c in cells):
        case = MODELS.get(m)
        about = f" (`{case.spec}`, prompt {','.join(map(str, case.prompt))}; earlier prompt {','.join(map(str, case.earlier))})" if case else ""
        out += [f"**`{m}`**{about}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for f in faults:
            c = by[(f, m)]
            cls = FAULTS[f].bug_class if f in FAULTS else "—"
            out.append(f"| `{f}` | {cls} | `{c.flags}` | " + " | ".join(columns(c)) + " |")
        out.append("")
    return "\n".join(out).rstrip("\n")


BEGIN, END = "<!-- bug-class table: begin (python -m refimpl.inject.fault_table --write docs/bug-classes.md) -->", "<!-- bug-class table: end -->"


def table_in(text: str) -> str:
    """The generated table held in a page between the BEGIN and END markers."""
    start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:stop].strip("\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m refimpl.inject.fault_table", description=__doc__.splitlines()[0])
    p.add_argument("--write", metavar="PAGE", help="replace the table between the markers in PAGE (else print it)")
    args = p.parse_args(argv)
    import numba

    numba.set_num_threads(1)  # tiny matrices: threads cost more than they save, and never change a bit
    cells = measure_all(progress=lambda c: print(f"{c.model:12s} {c.fault:20s} {' | '.join(columns(c))}", file=sys.stderr))
    table = markdown(cells)
    if args.write:
        page = Path(args.write)
        text = page.read_text(encoding="utf-8")
        start, stop = text.index(BEGIN) + len(BEGIN), text.index(END)
        page.write_text(text[:start] + "\n" + table + "\n" + text[stop:], encoding="utf-8")
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
