"""Open a qwen35moe GGUF and check it: file → :class:`Config` → :class:`TensorPlan`.

``open_model(path)`` is the single entry point every command uses; everything it can reject is
rejected here, at the boundary, with a one-line :class:`~refimpl.errors.RefimplError`. A command
that has already opened the file (the CLI names its weight types first: refimpl.cli.compile_report)
passes the :class:`GGUFFile` instead, so a process reads a file's header once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from refimpl.io.config import Config, load_config
from refimpl.io.gguf_file import GGUFFile
from refimpl.io.tensors import TensorPlan, plan_tensors


@dataclass(frozen=True)
class ModelFile:
    gguf: GGUFFile
    config: Config
    plan: TensorPlan


def open_model(source: str | os.PathLike | GGUFFile) -> ModelFile:
    """A GGUF path (opened here) or an opened file → its checked config and tensor plan."""
    gf = source if isinstance(source, GGUFFile) else GGUFFile(source)
    config = load_config(gf)
    return ModelFile(gguf=gf, config=config, plan=plan_tensors(gf, config))
