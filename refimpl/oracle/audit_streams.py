"""``refimpl audit MODEL --streams DIR``: every stream pair of a directory, one report line each and a
summary table; exit 1 if any pair holds a wrong token.

The pairing convention (docs/validating-an-engine.md, "Many stream pairs"): in DIR,

    NAME.A.EXT and NAME.B.EXT    a pair, audited as ``refimpl audit MODEL NAME.A.EXT NAME.B.EXT``
    NAME.A.EXT alone             one stream against the oracle's greedy stream
    NAME.prompt.EXT              the pair's prompt (optional), in any stream format: a JSON array of
                                 ids, a JSON object with ``tokens``, or text (tokenized)

EXT is anything :func:`refimpl.oracle.audit.read_stream` reads (``.json``, ``.csv``, ``.txt``, a server
response such as ``.sse``: refimpl.oracle.responses). A pair's
prompt is ``--prompt`` / ``--prompt-tokens`` when given (the same for every pair), else
NAME.prompt.EXT, else the streams' ``prompt_tokens``. Names starting with ``.`` are skipped; any
other file that does not follow the convention is an error, so a misnamed stream is never silently
left out. Pairs are audited in NAME order, here, in ``--jobs`` processes or on a Dask ``--cluster``
(:func:`refimpl.oracle.golden_run.run_tasks`: each process opens the model once).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from refimpl.oracle.audit import TIE_THRESHOLD, Report, audit
from refimpl.oracle.stream_file import Stream, check_streams, prompt_of, read_stream
from refimpl.errors import RefimplError

_NAME = re.compile(r"^(?P<name>.+)\.(?P<role>A|B|prompt)\.[^.]+$")
VERDICTS = ("identical", "clean", "near-tie", "A wrong", "B wrong", "both wrong")  # the summary table's row order


@dataclass(frozen=True)
class Pair:
    name: str
    prompt: list[int]
    a: Stream
    b: Stream | None  # None: A against the oracle's greedy stream


def read_pairs(directory: str, tokenizer, n_vocab: int, prompt: list[int] | None = None) -> list[Pair]:
    """The stream pairs of ``directory`` (the module docstring), checked and with their prompts."""
    root = Path(directory)
    if not root.is_dir():
        raise RefimplError(f"--streams {directory}: not a directory")
    files: dict[str, dict[str, Path]] = {}
    for path in sorted(root.iterdir()):
        if path.name.startswith("."):
            continue
        m = _NAME.match(path.name)
        if m is None or not path.is_file():
            raise RefimplError(f"{path}: not NAME.A.EXT, NAME.B.EXT or NAME.prompt.EXT (the --streams pairing convention)")
        roles = files.setdefault(m["name"], {})
        if m["role"] in roles:
            raise RefimplError(f"{path}: a second {m['name']}.{m['role']} file (also {roles[m['role']].name})")
        roles[m["role"]] = path
    if not files:
        raise RefimplError(f"--streams {directory}: no stream files (NAME.A.EXT, NAME.B.EXT)")
    pairs = []
    for name, roles in sorted(files.items()):
        if "A" not in roles:
            raise RefimplError(f"{root / name}: {'B' if 'B' in roles else 'prompt'} file without {name}.A.EXT")
        streams = [read_stream(roles[lab], lab, tokenizer) for lab in ("A", "B") if lab in roles]
        check_streams(streams, n_vocab)
        ids = prompt
        if ids is None and "prompt" in roles:
            ids = read_stream(roles["prompt"], "prompt", tokenizer).tokens
        if ids is None:
            ids = prompt_of(streams, f"{root / name}: no prompt: add {name}.prompt.EXT, or give --prompt / --prompt-tokens")
        check_streams([Stream("prompt", str(roles.get("prompt", roles["A"])), "prompt", ids)], n_vocab)
        pairs.append(Pair(name, ids, streams[0], streams[1] if len(streams) > 1 else None))
    return pairs


def _pair_task(numerics: dict, tau: float, model_name: str, auto: bool, job, pair: Pair) -> Report:
    from refimpl.oracle.golden_run import loaded
    from refimpl.model.ops import Ctx

    ctx = Ctx(kernel=job.kernel, **numerics)
    return audit(loaded(job).model, pair.prompt, pair.a, pair.b, ctx=ctx, tau=tau, model_name=model_name, auto=auto)


def audit_pairs(path: Path, pairs: list[Pair], *, numerics: dict | None = None, kernel: str = "numba", tau: float = TIE_THRESHOLD,
                model_name: str = "", jobs: int = 1, cluster: str | None = None, cache_mb=None, auto: bool = False) -> list[Report]:
    """:func:`refimpl.oracle.audit.audit` of every pair, in order (here, in ``jobs`` processes or on a Dask ``cluster``);
    ``numerics``: the Ctx fields of the emulation (``act_quant``, ``kv_f16``, ``flash_attn``, and with --emulate=ggml
    ``ggml``, ``n_ubatch``, ``n_threads``, ``n_ctx``, ``repack``, ``ggml_accepted``, ``ggml_named``, ``announce``; default none); ``auto``:
    --threshold auto (each pair's streams calibrated on their own log-probs, refimpl.oracle.calibrate)."""
    from refimpl.fixtures.builtin import sha256_file
    from refimpl.oracle.golden_run import ModelJob, run_tasks

    if not 0 < tau < 1:
        raise RefimplError(f"--threshold must be in (0, 1), got {tau}")
    ggml = (numerics or {}).get("ggml")
    job = ModelJob(str(path), kernel, cache_mb, sha256_file(path) if cluster is not None else None,
                   ggml=(ggml, (numerics or {}).get("repack", True)) if ggml else None)
    return run_tasks(job, partial(_pair_task, numerics or {}, float(tau), model_name, auto), pairs, jobs=jobs, cluster=cluster,
                     desc="audit", unit="pair")


# ---- the report ----------------------------------------------------------------------------------


def pair_line(pair: Pair, rep: Report) -> str:
    """One line: the pair, its verdict (where it diverges), the counts, ok or WRONG."""
    files = " ".join(Path(s.source).name for s in rep.streams) + ("" if pair.b else " vs the oracle")
    d = rep.divergence
    lengths = f"{len(pair.a.tokens)}" + (f" / {len(pair.b.tokens)}" if pair.b and len(pair.b.tokens) != len(pair.a.tokens) else "")
    what = f"{d.kind} at step {d.step}" if d else f"{rep.verdict}, {lengths} tokens"
    n = rep.n_near_ties
    what += "".join(f"; probs {lab} {p.verdict}" for lab, p in rep.probs.items())
    return (f"{pair.name}: {what}; common prefix {rep.common}, {n} near-tie{'s' * (n != 1)}, {rep.n_wrong} wrong "
            f"→ {'ok' if rep.exit_code == 0 else 'WRONG'}   ({files})")


def summary_lines(reports: list[Report]) -> list[str]:
    """The summary table (pairs per verdict, and how many of them hold a wrong token) and the result."""
    pairs = Counter(r.verdict for r in reports)
    wrong = Counter(r.verdict for r in reports if r.exit_code)
    n_bad = sum(wrong.values())
    width = max(len("verdict"), *(len(v) for v in pairs))
    lines = [f"{'verdict':<{width}}  pairs  with a wrong token"]
    order = [v for v in VERDICTS if pairs[v]] + sorted(v for v in pairs if v not in VERDICTS)
    lines += [f"{v:<{width}}  {pairs[v]:>5}  {wrong[v]:>17}" for v in order]
    lines.append(f"{'total':<{width}}  {len(reports):>5}  {n_bad:>17}")
    lines.append(f"result: {n_bad} of {len(reports)} stream pair{'s' * (len(reports) != 1)} wrong → exit {int(n_bad > 0)}")
    return lines


def as_json(pairs: list[Pair], reports: list[Report]) -> dict:
    return {"pairs": [{"name": p.name, **r.as_json()} for p, r in zip(pairs, reports)],
            "summary": dict(Counter(r.verdict for r in reports)),
            "exit_code": int(any(r.exit_code for r in reports))}
