"""Stream files: the token streams ``refimpl audit`` judges, read from what engines and refimpl write.

:func:`read_stream` tells the formats apart by content: a JSON array of ids, a JSON object with ``tokens``
(as ``refimpl run --json`` prints, with ``prompt_tokens`` and ``rounds`` when present), a telemetry CSV with a
``token`` / ``token_id`` column (as ``refimpl run --csv`` writes; with ``step``/``kind``/``drafts`` its
per-round information), a server's response (llama-server ``/completion`` or OpenAI-style, whole or streamed:
:mod:`refimpl.oracle.responses`), or plain text (tokenized with the model's tokenizer).
:func:`check_streams` and :func:`prompt_of` check what was read against the model. The judgement itself is
:mod:`refimpl.oracle.audit`.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

from refimpl.errors import RefimplError
from refimpl.oracle.rounds import rounds_from_json, rounds_from_kinds


@dataclass(frozen=True)
class Stream:
    label: str  # "A", "B", or "oracle"
    source: str  # file it came from
    kind: str  # json | csv | text | oracle
    tokens: list[int]
    prompt: list[int] | None = None  # prompt_tokens, when the file carries them
    rounds: object = None  # refimpl.oracle.rounds.RoundsInfo, when the file carries per-round information
    response: object = None  # refimpl.oracle.responses.ResponseInfo: a server response (log-probs, drafts)


def _ids(value, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise RefimplError(f"{where}: expected a list of integer token ids")
    return list(value)


def read_stream(path: str | os.PathLike, label: str, tokenizer, any_source: bool = False) -> Stream:
    """One stream file → :class:`Stream` (the formats of the module docstring, tried in this order:
    JSON when the file starts with ``[`` or ``{``; CSV when its first non-``#`` line is a header
    with a ``token`` or ``token_id`` column; else UTF-8 text, one trailing newline dropped). A CSV's rounds are
    read when its drafts are the MTP head's (the round audit's), or for any draft source with ``any_source``
    (``audit --schedule``: the verify batches are what matters, not who drafted)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RefimplError(f"{path}: cannot read stream {label} ({exc.__class__.__name__}: {exc})") from None
    head = text.lstrip()
    from refimpl.oracle.responses import looks_like_response, read_response

    if looks_like_response(text):  # llama-server /completion, OpenAI-style (refimpl.oracle.responses)
        ids, prompt, info = read_response(text, f"{path}: stream {label}", tokenizer)
        if prompt is None and info.prompt_text is not None and tokenizer is not None:
            prompt = tokenizer.encode(info.prompt_text, parse_special=True)
        return Stream(label, str(path), "response", ids, prompt, response=info)
    if head.startswith(("[", "{")):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RefimplError(f"{path}: stream {label} looks like JSON but does not parse ({exc.msg}, line {exc.lineno})") from None
        if isinstance(obj, list):
            return Stream(label, str(path), "json", _ids(obj, str(path)))
        if not isinstance(obj, dict) or "tokens" not in obj:
            raise RefimplError(f"{path}: a JSON stream must be an array of ids or an object with 'tokens'")
        prompt = _ids(obj["prompt_tokens"], f"{path}: 'prompt_tokens'") if "prompt_tokens" in obj else None
        rounds = rounds_from_json(obj, str(path)) if "rounds" in obj else None
        return Stream(label, str(path), "json", _ids(obj["tokens"], f"{path}: 'tokens'"), prompt, rounds)
    body = [line for line in text.splitlines() if not line.startswith("#")]
    preamble = dict(line[1:].strip().partition("=")[::2] for line in text.splitlines() if line.startswith("#") and "=" in line)
    header = next(csv.reader(io.StringIO(body[0]))) if body else []
    column = next((c for c in ("token", "token_id") if c in [h.strip() for h in header]), None)
    if column is None and path.suffix.lower() == ".csv":
        raise RefimplError(f"{path}: CSV stream {label} has no 'token' or 'token_id' column (header: {','.join(header)})")
    if column is not None:
        tokens, steps = [], []
        for n, row in enumerate(csv.DictReader(io.StringIO("\n".join(body)), skipinitialspace=True), 2):
            value = (row.get(column) or "").strip()
            try:
                tokens.append(int(value))
            except ValueError:
                raise RefimplError(f"{path}: CSV row {n - 1}: '{column}' is {value!r}, not a token id") from None
            steps.append((row.get("step") or "", (row.get("kind") or "").strip(), row.get("drafts") or ""))
        per_round = {"step", "kind"} <= {h.strip() for h in header} and (any_source or preamble.get("spec", "mtp") == "mtp")
        return Stream(label, str(path), "csv", tokens, rounds=rounds_from_kinds(steps, preamble, str(path)) if per_round else None)
    if tokenizer is None:
        raise RefimplError(f"{path}: stream {label} is text; without a model to tokenize it, give token ids (JSON or CSV)")
    return Stream(label, str(path), "text", tokenizer.encode(text[:-1] if text.endswith("\n") else text, parse_special=True))


def check_streams(streams: list[Stream], n_vocab: int) -> None:
    """Every stream holds tokens, all in the vocabulary (RefimplError naming the file if not)."""
    for s in streams:
        bad = [t for t in s.tokens if not 0 <= t < n_vocab]
        if bad:
            raise RefimplError(f"{s.source}: stream {s.label} holds token id {bad[0]}, outside the vocabulary [0, {n_vocab})")
        if not s.tokens:
            raise RefimplError(f"{s.source}: stream {s.label} holds no tokens")
        probs = getattr(s.response, "probs", None) or ()
        bad = [t for sp in probs if sp is not None for t, _ in sp.top if not 0 <= t < n_vocab]
        if bad:
            raise RefimplError(f"{s.source}: stream {s.label}'s top_logprobs name token id {bad[0]}, outside the vocabulary [0, {n_vocab})")


def prompt_of(streams: list[Stream], missing: str) -> list[int]:
    """The prompt the streams carry (their ``prompt_tokens``, which must agree); ``missing``: the
    error when none does."""
    given = {tuple(s.prompt) for s in streams if s.prompt is not None}
    if len(given) > 1:
        raise RefimplError(f"{streams[0].source}: the streams carry different prompt_tokens; give the prompt with --prompt-tokens")
    if not given:
        raise RefimplError(missing)
    return list(given.pop())
