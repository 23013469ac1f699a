"""The built-in synthetic model: what ``refimpl run`` uses when no GGUF is given.

It is the ``tiny`` fixture (seed 0, f32), generated on first use into a cache directory
(``$REFIMPL_CACHE``, default ``~/.cache/refimpl``) and reused afterwards; generation is
deterministic, so every machine gets the same bytes.
"""

from __future__ import annotations

import os
from pathlib import Path

BUILTIN_PRESET = "tiny"
BUILTIN_QUANT = "f32"
BUILTIN_SEED = 0


def cache_dir() -> Path:
    return Path(os.environ.get("REFIMPL_CACHE") or Path.home() / ".cache" / "refimpl")


def fixture_path(preset: str = BUILTIN_PRESET, quant: str = BUILTIN_QUANT, seed: int = BUILTIN_SEED, **options) -> Path:
    """Path of a cached fixture, generating it if needed."""
    from refimpl.fixtures import write_fixture

    suffix = "".join(f"-{k}={v}" for k, v in sorted(options.items()))
    path = cache_dir() / f"{preset}-{quant}-s{seed}{suffix}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_fixture(path, preset=preset, quant=quant, seed=seed, **options)
    return path
