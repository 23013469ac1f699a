"""The golden files on disk: the prompts file read, the golden file written and read back.

:func:`read_prompts` parses a prompts file (plain text or JSON Lines) into :class:`Prompt` ids;
:func:`write_golden` writes a golden file atomically with its end record (prompt count and sha256);
:func:`read_golden` reads one back into a :class:`Golden`, refusing a file that is not one, of another
version, truncated or edited. The record layout is in :mod:`refimpl.oracle.golden`'s docstring and
docs/golden.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from refimpl.errors import RefimplError
from refimpl.io.output_path import replace_atomically
from refimpl.oracle.golden_run import Settings

FORMAT = "refimpl-golden"
VERSION = 1


# ---- prompts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    text: str | None  # None when the prompt was given as ids
    ids: list[int]


def read_prompts(path: str | os.PathLike, tokenizer, n_vocab: int) -> list[Prompt]:
    """A prompts file: JSON Lines with ``{"text": …}`` or ``{"tokens": [ids]}`` per line when its
    first non-blank line is a JSON object, else one text prompt per line (blank lines skipped).
    Text is tokenized as ``refimpl run -p`` does (special-token text parsed)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RefimplError(f"{path}: cannot read prompts file ({exc.__class__.__name__}: {exc})") from None
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise RefimplError(f"{path}: the prompts file holds no prompts")
    jsonl = numbered[0][1].lstrip().startswith("{")
    prompts = []
    for n, line in numbered:
        where = f"{path}:{n}"
        if not jsonl:
            prompts.append(Prompt(line, tokenizer.encode(line, parse_special=True)))
        else:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RefimplError(f"{where}: not a JSON object ({exc.msg}); a JSONL prompts file needs one per line") from None
            if not isinstance(obj, dict) or ("text" in obj) == ("tokens" in obj):
                raise RefimplError(f"{where}: expected an object with exactly one of 'text' or 'tokens'")
            if "text" in obj:
                if not isinstance(obj["text"], str):
                    raise RefimplError(f"{where}: 'text' must be a string")
                prompts.append(Prompt(obj["text"], tokenizer.encode(obj["text"], parse_special=True)))
            else:
                ids = obj["tokens"]
                if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                    raise RefimplError(f"{where}: 'tokens' must be a list of integer token ids")
                prompts.append(Prompt(None, ids))
        if not prompts[-1].ids:
            raise RefimplError(f"{where}: the prompt encodes to no tokens")
        bad = [t for t in prompts[-1].ids if not 0 <= t < n_vocab]
        if bad:
            raise RefimplError(f"{where}: token id {bad[0]} is out of range for this model's vocabulary [0, {n_vocab})")
    return prompts


# ---- the file ------------------------------------------------------------------------------------


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def producer() -> dict:
    from importlib.metadata import version

    from refimpl.version import __version__

    return {"name": "refimpl", "version": __version__, "numpy": np.__version__, "gguf": version("gguf")}


def write_golden(path: Path, header: dict, records: list[dict]) -> None:
    """Write header, records and the end record to a temporary file next to ``path``, then rename
    it into place: a reader sees the old file or the complete new one, never a part."""
    body = "".join(_dumps(r) + "\n" for r in [header, *records])
    end = {"record": "end", "prompts": len(records), "sha256": hashlib.sha256(body.encode("utf-8")).hexdigest()}
    data = (body + _dumps(end) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, data)


@dataclass(frozen=True)
class Golden:
    path: Path
    header: dict
    prompts: list[dict]

    @property
    def settings(self) -> Settings:
        return Settings.from_json(self.header["settings"])


def read_golden(path: str | os.PathLike) -> Golden:
    """Read and validate a golden file: format and version, one header first, an end record whose
    prompt count and sha256 match what precedes it (a truncated or edited file is refused)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RefimplError(f"{path}: cannot read golden file ({exc.strerror or exc})") from None
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    records = []
    for n, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise RefimplError(f"{path}:{n}: not a JSON record; not a golden file, or damaged") from None
    if not records or not isinstance(records[0], dict) or records[0].get("format") != FORMAT:
        raise RefimplError(f"{path}: not a golden file (the first record must be a '{FORMAT}' header)")
    header = records[0]
    if header.get("version") != VERSION:
        raise RefimplError(f"{path}: golden format version {header.get('version')!r}; this refimpl reads version {VERSION}")
    end = records[-1]
    if len(records) < 2 or not isinstance(end, dict) or end.get("record") != "end":
        raise RefimplError(f"{path}: incomplete golden file: no end record (truncated?); regenerate it: {header.get('regenerate', '')}")
    prompts = records[1:-1]
    if end.get("prompts") != len(prompts):
        raise RefimplError(f"{path}: incomplete golden file: the end record counts {end.get('prompts')} prompts, the file holds {len(prompts)}")
    body = data[: len(data) - len(lines[-1].encode("utf-8"))]
    if hashlib.sha256(body).hexdigest() != end.get("sha256"):
        raise RefimplError(f"{path}: golden file damaged or edited: its records do not match the end record's sha256")
    if any(not isinstance(r, dict) or r.get("record") != "prompt" for r in prompts):
        raise RefimplError(f"{path}: golden file holds a record that is not a prompt between header and end")
    return Golden(path, header, prompts)
